//! Graceful handover: `POST /v1/leases/{key}/resign-request` asks the holder to step down
//! (`fencing.request_resign`, audited), optionally naming the owner that leads next; the holder
//! hears it from its renewal (`"resign_requested": true`) or its watch. With `force_after_ms`,
//! the call waits that long for the holder to step down and otherwise ends its period
//! (`fencing.force_handover`: never a later term's).
//!
//! With `[[clients]]`, a client asks only a holder among its own owners (`<client>/...`) and
//! names a successor among them: a client never ends or takes another client's lease (an
//! operator does that with `admin handover`). The wait takes a watcher's slot.

use std::time::Duration;

use axum::Extension;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use fencing_election::watch;
use fencing_schema::store;
use serde::Deserialize;
use serde_json::json;
use tokio::time::Instant;

use crate::control::extract::*;
use crate::control::state::ControlState;
use crate::problem::Problem;
use crate::security::auth::Caller;

/// The longest `force_after_ms`.
const MAX_FORCE_AFTER: Duration = Duration::from_secs(600);

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResignRequest {
    /// Why: kept in the admin audit.
    reason: String,
    /// The owner that should lead next, as `GET` shows owners.
    #[serde(default)]
    successor: Option<String>,
    /// Wait this long for the holder to step down, then end its period.
    #[serde(default)]
    force_after_ms: Option<u64>,
}

pub(super) async fn resign_request(
    State(state): State<ControlState>,
    Extension(caller): Extension<Caller>,
    Path(key): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    const OP: &str = "resign";
    if let Err(problem) = may_call(&caller, &key, &headers, OP) {
        return problem.into_response();
    }
    let checked = parse::<ResignRequest>(&body).and_then(|request| {
        check_member_name("a reason", &request.reason)?;
        if let Some(successor) = &request.successor {
            check_member_name("a successor", successor)?;
        }
        let force_after = request.force_after_ms.map(Duration::from_millis);
        if force_after.is_some_and(|wait| wait > MAX_FORCE_AFTER) {
            return Err(Problem::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid-argument",
                "Invalid argument",
                &format!("force_after_ms is at most {}", MAX_FORCE_AFTER.as_millis()),
            ));
        }
        Ok((request, force_after))
    });
    let (request, force_after) = match checked {
        Ok(checked) => checked,
        Err(problem) => {
            ControlState::count(OP, "invalid");
            return problem.into_response();
        }
    };
    let actor = format!("control API client {}", caller.name());
    // The owners of this client only: the holder asked, and the successor named.
    let holder_prefix = match &caller {
        Caller::Client(_) => Some(caller.store_owner("")),
        Caller::Anyone | Caller::Nobody => None,
    };
    let successor = request.successor.as_deref().map(|successor| caller.store_owner(successor));
    let (call_key, call_actor, reason, call_successor) =
        (key.clone(), actor.clone(), request.reason.clone(), successor.clone());
    let asked = state
        .with_client(|client| async move {
            let result = store::request_resign(
                &**client,
                &call_key,
                (&call_actor, &reason),
                call_successor.as_deref(),
                holder_prefix.as_deref(),
            )
            .await;
            (client, result)
        })
        .await;
    let term = match asked {
        Ok(Some(term)) => term,
        Ok(None) => {
            ControlState::count(OP, "conflict");
            return Problem::new(
                StatusCode::CONFLICT,
                "not-held",
                "Lease not held",
                "nobody holds this lease (or, with clients, none of this client's owners): there is nothing to hand \
                 over",
            )
            .with("key", json!(key))
            .into_response();
        }
        Err(problem) => {
            ControlState::count(OP, "error");
            return problem.into_response();
        }
    };
    let answer = |outcome: &str| json!({"key": key, "term": term, "successor": successor, "outcome": outcome});
    let Some(force_after) = force_after else {
        ControlState::count(OP, "ok");
        return (StatusCode::ACCEPTED, axum::Json(answer("requested"))).into_response();
    };
    // Waiting holds a connection of the control listener, as a watch does: within its caps.
    let _slot = match state.watchers.enter(&caller, &state.config.control) {
        Ok(slot) => slot,
        Err(problem) => {
            ControlState::count(OP, "error");
            return problem.with("term", json!(term)).into_response();
        }
    };
    match stepped_down(&state, &key, term, Instant::now() + force_after).await {
        Ok(true) => {
            ControlState::count(OP, "ok");
            return axum::Json(answer("stepped_down")).into_response();
        }
        Ok(false) => {}
        Err(problem) => {
            ControlState::count(OP, "error");
            return problem.into_response();
        }
    }
    let reason = forced_reason(&request.reason, force_after);
    let call_key = key.clone();
    let forced = state
        .with_client(|client| async move {
            let result = store::force_handover(&**client, &call_key, term, &actor, &reason).await;
            (client, result)
        })
        .await;
    match forced {
        Ok(forced) => {
            ControlState::count(OP, "ok");
            // Not forced: the term ended just before (stepped down, or expired).
            axum::Json(answer(if forced { "forced" } else { "stepped_down" })).into_response()
        }
        Err(problem) => {
            ControlState::count(OP, "error");
            problem.into_response()
        }
    }
}

/// The audit's reason for a forced end: the request's, and why, within the store's 256
/// characters.
pub(crate) fn forced_reason(reason: &str, force_after: Duration) -> String {
    let why = format!(" (did not step down within {} ms)", force_after.as_millis());
    let kept = 256usize.saturating_sub(why.chars().count());
    reason.chars().take(kept).chain(why.chars()).collect()
}

/// Waits until `term` no longer holds `key` (released, expired, or a later term), or `until`;
/// whether it ended.
async fn stepped_down(state: &ControlState, key: &str, term: i64, until: Instant) -> Result<bool, Problem> {
    let topic = watch::lease_topic(key);
    let read = || {
        let call_key = key.to_owned();
        async move {
            state
                .side_call(|client| async move {
                    let result = store::observe_lease(&**client, &call_key).await;
                    (client, result)
                })
                .await
                .map(watch::lease_observed)
        }
    };
    let mut after = None;
    loop {
        let stopping = || unavailable("the gateway is stopping: the request stands, the holder was not forced");
        let observed = tokio::select! {
            biased;
            () = state.shutdown.cancelled() => return Err(stopping()),
            observed = watch::wait_for_change(&state.wakeups, &topic, after, until, read) => observed?,
        };
        let ended = observed.state.as_ref().is_none_or(|row| row.lease.term != term || row.lease.remaining.is_zero());
        if ended {
            return Ok(true);
        }
        if state.shutdown.is_cancelled() {
            return Err(stopping());
        }
        if Instant::now() >= until {
            return Ok(false);
        }
        after = Some(observed.revision);
    }
}
