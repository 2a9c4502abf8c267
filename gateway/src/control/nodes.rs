//! Clusters and their nodes: heartbeat, leave and the live members (the same SQL as
//! `fencing_election::membership`).

use std::time::Duration;

use axum::Extension;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use fencing_election::watch;
use fencing_schema::store::{self};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::control::extract::*;
use crate::control::state::ControlState;
use crate::control::watch::{self as control_watch, WatchQuery};
use crate::problem::Problem;
use crate::security::auth::Caller;

/// The shortest registration ttl a node may ask for over HTTP: a heartbeat per 100 ms would
/// only load the store.
pub(super) const MIN_NODE_TTL: Duration = Duration::from_secs(1);

/// A node's heartbeat through the control API: its process's incarnation (kept by the store as
/// `<client>/<incarnation>` with clients, like a lease owner), how long it stays live, and
/// what others see of it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HeartbeatRequest {
    incarnation: String,
    ttl_ms: u64,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    metadata: Option<serde_json::Map<String, Value>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LeaveRequest {
    incarnation: String,
}

pub(super) fn member_json(member: &store::Member) -> Value {
    json!({
        "node_id": member.node_id,
        "name": member.name,
        "started_at": rfc3339(member.started_at),
        "heartbeat_at": rfc3339(member.heartbeat_at),
        "expires_at": rfc3339(member.expires_at),
        "remaining_ms": millis(member.remaining),
        "metadata": serde_json::from_str::<Value>(&member.metadata).unwrap_or(Value::Null),
    })
}

pub(super) async fn heartbeat(
    State(state): State<ControlState>,
    Extension(caller): Extension<Caller>,
    Path((cluster, node)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let request =
        match member_post("heartbeat", &caller, (&cluster, &node), &headers, &body, |request: &HeartbeatRequest| {
            check_incarnation(&caller, &request.incarnation)?;
            check_member_name("a node name", request.name.as_deref().unwrap_or(&node))
        }) {
            Ok(request) => request,
            Err(problem) => return problem.into_response(),
        };
    let ttl = match state.check_ttl(request.ttl_ms).and_then(|ttl| {
        if ttl < MIN_NODE_TTL {
            return Err(Problem::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "ttl-out-of-bounds",
                "ttl out of bounds",
                &format!("a node's ttl_ms must be at least {}, got {}", millis(MIN_NODE_TTL), request.ttl_ms),
            ));
        }
        Ok(ttl)
    }) {
        Ok(ttl) => ttl,
        Err(problem) => {
            count_member("heartbeat", "invalid");
            return problem.into_response();
        }
    };
    let metadata = Value::Object(request.metadata.unwrap_or_default()).to_string();
    let name = request.name.unwrap_or_else(|| node.clone());
    let incarnation = caller.store_owner(&request.incarnation);
    let (call_cluster, call_node) = (cluster.clone(), node.clone());
    let beat = state
        .member_call("heartbeat", |client| async move {
            let result =
                store::heartbeat(&**client, (&call_cluster, &call_node, &incarnation), &name, ttl, &metadata).await;
            (client, result)
        })
        .await;
    match &beat {
        Ok(beat) if beat.ok => count_member("heartbeat", "ok"),
        Ok(_) => count_member("heartbeat", "conflict"),
        Err(_) => {}
    }
    match beat {
        Ok(beat) if beat.ok => axum::Json(json!({
            "cluster": cluster,
            "node_id": node,
            "started_at": rfc3339(beat.started_at),
            "expires_at": rfc3339(beat.expires_at),
            "remaining_ms": millis(beat.remaining),
            "ttl_ms": millis(ttl),
        }))
        .into_response(),
        Ok(beat) => Problem::new(
            StatusCode::CONFLICT,
            "node-id-in-use",
            "Node id in use",
            "another live process holds this node id; it joins once that one leaves or expires",
        )
        .with("cluster", json!(cluster))
        .with("node_id", json!(node))
        .with("expires_at", json!(rfc3339(beat.expires_at)))
        .into_response(),
        Err(problem) => problem.into_response(),
    }
}

pub(super) async fn leave(
    State(state): State<ControlState>,
    Extension(caller): Extension<Caller>,
    Path((cluster, node)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let request = match member_post("leave", &caller, (&cluster, &node), &headers, &body, |request: &LeaveRequest| {
        check_incarnation(&caller, &request.incarnation)
    }) {
        Ok(request) => request,
        Err(problem) => return problem.into_response(),
    };
    let incarnation = caller.store_owner(&request.incarnation);
    let (call_cluster, call_node) = (cluster.clone(), node.clone());
    let left = state
        .member_call("leave", |client| async move {
            let result = store::leave(&**client, &call_cluster, &call_node, &incarnation).await;
            (client, result)
        })
        .await;
    match &left {
        Ok(true) => count_member("leave", "ok"),
        Ok(false) => count_member("leave", "conflict"),
        Err(_) => {}
    }
    match left {
        Ok(true) => StatusCode::NO_CONTENT.into_response(),
        Ok(false) => Problem::new(
            StatusCode::CONFLICT,
            "not-member",
            "Not this node's incarnation",
            "the node is not live under this incarnation (it left, expired, or another process holds it)",
        )
        .with("cluster", json!(cluster))
        .with("node_id", json!(node))
        .into_response(),
        Err(problem) => problem.into_response(),
    }
}

/// `GET /v1/clusters/{cluster}/nodes`: the live nodes and their revision; with
/// `?wait=30s&after=<revision>` a watch, answered as soon as the revision differs from `after`
/// (a join, a leave, a change, an expiry; control/watch.rs).
pub(super) async fn list_nodes(
    State(state): State<ControlState>,
    Extension(caller): Extension<Caller>,
    Path(cluster): Path<String>,
    RawQuery(query): RawQuery,
) -> Response {
    const OP: &str = "list";
    if let Err(problem) = may_use_cluster(&caller, &cluster) {
        return refused(OP, problem);
    }
    let query = match WatchQuery::parse(query.as_deref()) {
        Ok(query) => query,
        Err(problem) => return refused(OP, problem),
    };
    let _slot = match query.waits().then(|| state.watchers.enter(&caller, &state.config.control)).transpose() {
        Ok(slot) => slot,
        Err(problem) => return problem.into_response(),
    };
    let read = || {
        let (state, call_cluster) = (&state, cluster.clone());
        async move {
            state
                .member_call(OP, |client| async move {
                    // One call: the members live at the instant the revision is of, so a change
                    // shows as a later revision, never as a missed one.
                    let result = store::observe_members(&**client, &call_cluster).await.map(|(revision, members)| {
                        watch::Observed {
                            revision: revision.revision,
                            next_expiry: revision.next_expiry,
                            state: members,
                        }
                    });
                    (client, result)
                })
                .await
        }
    };
    let topic = watch::nodes_topic(&cluster);
    let until = control_watch::until(&query, &state.config.control);
    let observed = tokio::select! {
        observed = watch::wait_for_change(&state.wakeups, &topic, query.after, until, read) => observed,
        // Stopping: the members as they are now, without waiting.
        () = state.shutdown.cancelled() => watch::wait_for_change(&state.wakeups, &topic, None, until, read).await,
    };
    match observed {
        Ok(observed) => {
            count_member(OP, "ok");
            axum::Json(json!({
                "cluster": cluster,
                "nodes": observed.state.iter().map(member_json).collect::<Vec<_>>(),
                "revision": observed.revision,
            }))
            .into_response()
        }
        Err(problem) => problem.into_response(),
    }
}
