//! Daemons: a node's assignments, its acknowledgements and stops, the leader's pass, and the
//! cluster's daemons (the same SQL as `fencing_election::daemons`).

use std::sync::Arc;
use std::time::Duration;

use axum::Extension;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use fencing_schema::store::{self};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::control::extract::*;
use crate::control::state::ControlState;
use crate::problem::Problem;
use crate::security::auth::Caller;

/// A node's offer and read of its assignments.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AssignmentsRequest {
    incarnation: String,
    daemons: Vec<String>,
}

/// A node's acknowledgement of an assignment, or its report that the instance stopped.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AssignmentRequest {
    incarnation: String,
    generation: i64,
}

/// The leader's pass over a cluster's daemons.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReconcileRequest {
    lease: String,
    owner: String,
    term: i64,
    ack_timeout_ms: u64,
    drain_timeout_ms: u64,
}

/// The most daemons one node offers (as `fencing.assignments` allows).
pub(super) const MAX_OFFERED_DAEMONS: usize = 100;

pub(super) fn assignment_moved(cluster: &str, node: &str, daemon: &str, generation: i64) -> Response {
    Problem::new(
        StatusCode::CONFLICT,
        "assignment-moved",
        "Assignment moved on",
        "this node's incarnation does not hold this generation of the daemon in a state that allows it (the \
         deadline passed, the leader moved it, or the node is not live as this incarnation); do not run it",
    )
    .with("cluster", json!(cluster))
    .with("node_id", json!(node))
    .with("daemon", json!(daemon))
    .with("generation", json!(generation))
    .into_response()
}

pub(super) async fn assignments(
    State(state): State<ControlState>,
    Extension(caller): Extension<Caller>,
    Path((cluster, node)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let request =
        match member_post("assignments", &caller, (&cluster, &node), &headers, &body, |request: &AssignmentsRequest| {
            check_incarnation(&caller, &request.incarnation)?;
            if request.daemons.len() > MAX_OFFERED_DAEMONS {
                return Err(Problem::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "invalid-argument",
                    "Invalid argument",
                    &format!("a node offers at most {MAX_OFFERED_DAEMONS} daemons"),
                ));
            }
            request.daemons.iter().try_for_each(|daemon| check_member_name("a daemon name", daemon))
        }) {
            Ok(request) => request,
            Err(problem) => return problem.into_response(),
        };
    let incarnation = caller.store_owner(&request.incarnation);
    let (call_cluster, call_node) = (cluster.clone(), node.clone());
    let listed = state
        .member_call("assignments", |client| async move {
            let offered: Vec<&str> = request.daemons.iter().map(String::as_str).collect();
            let result = store::assignments(&**client, (&call_cluster, &call_node, &incarnation), &offered).await;
            (client, result)
        })
        .await;
    match listed {
        Ok(list) => {
            count_member("assignments", "ok");
            let list: Vec<Value> = list
                .iter()
                .map(|a| {
                    json!({
                        "daemon": a.daemon,
                        "generation": a.generation,
                        "state": a.state,
                        "remaining_ms": a.remaining.map(millis),
                    })
                })
                .collect();
            axum::Json(json!({ "cluster": cluster, "node_id": node, "assignments": list })).into_response()
        }
        Err(problem) => problem.into_response(),
    }
}

pub(super) async fn ack_assignment(
    State(state): State<ControlState>,
    Extension(caller): Extension<Caller>,
    Path((cluster, node, daemon)): Path<(String, String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    assignment_step(&state, &caller, (cluster, node, daemon), &headers, &body, "ack").await
}

pub(super) async fn stopped_assignment(
    State(state): State<ControlState>,
    Extension(caller): Extension<Caller>,
    Path((cluster, node, daemon)): Path<(String, String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    assignment_step(&state, &caller, (cluster, node, daemon), &headers, &body, "stopped").await
}

/// An acknowledgement (`ack`: 200 with the fencing token, start the daemon) or a stop report
/// (`stopped`: 204, the assignment ended); 409 assignment-moved when the store refused it.
pub(super) async fn assignment_step(
    state: &ControlState,
    caller: &Caller,
    (cluster, node, daemon): (String, String, String),
    headers: &HeaderMap,
    body: &Bytes,
    op: &'static str,
) -> Response {
    let request = match member_post(op, caller, (&cluster, &node), headers, body, |request: &AssignmentRequest| {
        check_incarnation(caller, &request.incarnation)?;
        check_member_name("a daemon name", &daemon)?;
        if request.generation < 1 {
            return Err(Problem::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid-argument",
                "Invalid argument",
                "generation must be an integer >= 1",
            ));
        }
        Ok(())
    }) {
        Ok(request) => request,
        Err(problem) => return problem.into_response(),
    };
    let incarnation = caller.store_owner(&request.incarnation);
    let generation = request.generation;
    let (call_cluster, call_node, call_daemon) = (cluster.clone(), node.clone(), daemon.clone());
    let answer = state
        .member_call(op, |client| async move {
            let key = (call_cluster.as_str(), call_node.as_str(), incarnation.as_str());
            let result = if op == "ack" {
                store::ack_daemon(&**client, key, &call_daemon, generation).await
            } else {
                store::daemon_stopped(&**client, key, &call_daemon, generation)
                    .await
                    .map(|ended| if ended { Some(Duration::ZERO) } else { None })
            };
            (client, result)
        })
        .await;
    match answer {
        Ok(Some(waited)) => {
            count_member(op, "ok");
            if op == "ack" {
                axum::Json(json!({
                    "cluster": cluster,
                    "node_id": node,
                    "daemon": daemon,
                    "generation": generation,
                    "state": "active",
                    "fencing_token": generation,
                    "waited_ms": millis(waited),
                }))
                .into_response()
            } else {
                StatusCode::NO_CONTENT.into_response()
            }
        }
        Ok(None) => {
            count_member(op, "conflict");
            assignment_moved(&cluster, &node, &daemon, generation)
        }
        Err(problem) => problem.into_response(),
    }
}

pub(super) async fn reconcile(
    State(state): State<ControlState>,
    Extension(caller): Extension<Caller>,
    Path(cluster): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let checked = may_use_cluster(&caller, &cluster).and_then(|()| json_body(&headers)).and_then(|()| {
        let request: ReconcileRequest = parse(&body)?;
        may_use(&caller, &request.lease)?;
        check_member_name("a lease key", &request.lease)?;
        check_incarnation(&caller, &request.owner)?;
        for (what, ms) in [("ack_timeout_ms", request.ack_timeout_ms), ("drain_timeout_ms", request.drain_timeout_ms)] {
            if !(1_000..=3_600_000).contains(&ms) {
                return Err(Problem::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "invalid-argument",
                    "Invalid argument",
                    &format!("{what} must be 1000 to 3600000, got {ms}"),
                ));
            }
        }
        Ok(request)
    });
    let request = match checked {
        Ok(request) => request,
        Err(problem) => return refused("reconcile", problem),
    };
    let owner = caller.store_owner(&request.owner);
    let (call_cluster, lease, term) = (cluster.clone(), request.lease.clone(), request.term);
    let (ack, drain) = (Duration::from_millis(request.ack_timeout_ms), Duration::from_millis(request.drain_timeout_ms));
    let refused = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = Arc::clone(&refused);
    let answer = state
        .member_call("reconcile", |client| async move {
            let result = store::reconcile_daemons(&**client, &call_cluster, (&lease, &owner, term), ack, drain).await;
            // A refusal is the caller's answer (409), not a store failure.
            let result = match result {
                Err(fencing_schema::Error::Refused { .. }) => {
                    seen.store(true, std::sync::atomic::Ordering::Relaxed);
                    Ok(Vec::new())
                }
                other => other,
            };
            (client, result)
        })
        .await;
    if refused.load(std::sync::atomic::Ordering::Relaxed) {
        count_member("reconcile", "conflict");
        return Problem::new(
            StatusCode::CONFLICT,
            "not-leader",
            "Not the leader",
            "this owner does not hold the lease at this term, or the lease expired, or a later term took over; \
             nothing changed",
        )
        .with("cluster", json!(cluster))
        .with("lease", json!(request.lease))
        .with("presented_term", json!(term))
        .into_response();
    }
    match answer {
        Ok(changes) => {
            count_member("reconcile", "ok");
            let changes: Vec<Value> = changes
                .iter()
                .map(|c| {
                    json!({
                        "daemon": c.daemon,
                        "generation": c.generation,
                        "state": c.state,
                        "node_id": c.node_id,
                        "reason": c.reason,
                    })
                })
                .collect();
            axum::Json(json!({ "cluster": cluster, "term": term, "changes": changes })).into_response()
        }
        Err(problem) => problem.into_response(),
    }
}

pub(super) async fn list_daemons(
    State(state): State<ControlState>,
    Extension(caller): Extension<Caller>,
    Path(cluster): Path<String>,
) -> Response {
    let daemons = cluster_read(&state, &caller, &cluster, "daemons", async |client, cluster| {
        store::daemon_states(client, cluster).await
    });
    match daemons.await {
        Ok(daemons) => {
            let daemons: Vec<Value> = daemons
                .iter()
                .map(|d| {
                    json!({
                        "daemon": d.daemon,
                        "state": d.state,
                        "generation": d.generation,
                        "node_id": d.node_id,
                        "term": d.term,
                        "reason": d.reason,
                        "changed_at": rfc3339(d.changed_at),
                        "remaining_ms": d.remaining.map(millis),
                    })
                })
                .collect();
            axum::Json(json!({ "cluster": cluster, "daemons": daemons })).into_response()
        }
        Err(response) => response,
    }
}
