//! Leases: acquire, renew, release and read a lease, for leaders in any language (the same SQL
//! as the Rust library).

use std::time::Duration;

use axum::Extension;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use fencing_schema::store::{self, LeaseReply};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::control::extract::*;
use crate::control::state::ControlState;
use crate::metrics as names;
use crate::problem::Problem;
use crate::security::auth::Caller;

impl ControlState {
    pub(super) fn note_grant(&self, key: &str, term: i64) {
        let Ok(mut granted) = self.granted_terms.lock() else {
            return;
        };
        if granted.len() > 10_000 {
            granted.clear();
        }
        let previous = granted.insert(key.to_owned(), term);
        if previous.is_none_or(|previous| previous < term) {
            let label = if self.named_keys.contains(key) { key.to_owned() } else { names::OTHER_KEY.to_owned() };
            metrics::counter!(names::LEASE_TRANSITIONS, "key" => label).increment(1);
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LeaseRequest {
    owner: String,
    ttl_ms: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReleaseRequest {
    owner: String,
}

pub(super) fn lease_json(key: &str, owner: &str, reply: &LeaseReply, ttl: Duration) -> Value {
    json!({
        "key": key,
        "owner": owner,
        "term": reply.term,
        "expires_at": reply.expires_at.map(rfc3339),
        "remaining_ms": millis(reply.remaining),
        "ttl_ms": millis(ttl),
    })
}

pub(super) fn held_elsewhere(key: &str, reply: &LeaseReply, detail: &str) -> Problem {
    Problem::new(StatusCode::CONFLICT, "lease-held", "Lease held by another owner", detail)
        .with("key", json!(key))
        .with("holder", json!(reply.holder))
        .with("term", json!(reply.term))
        .with("expires_at", json!(reply.expires_at.filter(|_| reply.holder.is_some()).map(rfc3339)))
}

pub(super) async fn acquire(
    State(state): State<ControlState>,
    Extension(caller): Extension<Caller>,
    Path(key): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    lease_call(state, &caller, key, &headers, body, "acquire").await
}

pub(super) async fn renew(
    State(state): State<ControlState>,
    Extension(caller): Extension<Caller>,
    Path(key): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    lease_call(state, &caller, key, &headers, body, "renew").await
}

pub(super) async fn lease_call(
    state: ControlState,
    caller: &Caller,
    key: String,
    headers: &HeaderMap,
    body: Bytes,
    op: &'static str,
) -> Response {
    if let Err(problem) = may_call(caller, &key, headers, op) {
        return problem.into_response();
    }
    let request: LeaseRequest = match parse(&body) {
        Ok(request) => request,
        Err(problem) => {
            ControlState::count(op, "invalid");
            return problem.into_response();
        }
    };
    let ttl = match state.check_ttl(request.ttl_ms) {
        Ok(ttl) => ttl,
        Err(problem) => {
            ControlState::count(op, "invalid");
            return problem.into_response();
        }
    };
    // The store's owner is the client's: another client cannot renew or stamp with it.
    let (call_key, owner) = (key.clone(), caller.store_owner(&request.owner));
    let reply = state
        .with_client(|client| async move {
            let result = if op == "acquire" {
                store::acquire(&**client, &call_key, &owner, ttl).await
            } else {
                store::renew(&**client, &call_key, &owner, ttl).await
            };
            (client, result)
        })
        .await;
    match reply {
        Ok(reply) if reply.ok => {
            ControlState::count(op, "ok");
            if let Some(term) = reply.term {
                state.note_grant(&key, term);
            }
            axum::Json(lease_json(&key, &request.owner, &reply, ttl)).into_response()
        }
        Ok(reply) => {
            ControlState::count(op, "conflict");
            if op == "renew" {
                let label = if state.named_keys.contains(&key) { key.clone() } else { names::OTHER_KEY.to_owned() };
                metrics::counter!(names::LEASE_RENEW_FAILURES, "key" => label).increment(1);
            }
            let detail = if op == "acquire" {
                "another owner holds this lease"
            } else {
                "the owner does not hold this lease (expired, released or taken over)"
            };
            held_elsewhere(&key, &reply, detail).into_response()
        }
        Err(problem) => {
            ControlState::count(op, "error");
            problem.into_response()
        }
    }
}

pub(super) async fn release(
    State(state): State<ControlState>,
    Extension(caller): Extension<Caller>,
    Path(key): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Err(problem) = may_call(&caller, &key, &headers, "release") {
        return problem.into_response();
    }
    let request: ReleaseRequest = match parse(&body) {
        Ok(request) => request,
        Err(problem) => {
            ControlState::count("release", "invalid");
            return problem.into_response();
        }
    };
    let call_key = key.clone();
    let released = state
        .with_client(|client| async move {
            let result = store::release(&**client, &call_key, &caller.store_owner(&request.owner)).await;
            (client, result)
        })
        .await;
    match released {
        Ok(true) => {
            ControlState::count("release", "ok");
            StatusCode::NO_CONTENT.into_response()
        }
        Ok(false) => {
            ControlState::count("release", "conflict");
            Problem::new(StatusCode::CONFLICT, "not-holder", "Not the holder", "the owner does not hold this lease")
                .with("key", json!(key))
                .into_response()
        }
        Err(problem) => {
            ControlState::count("release", "error");
            problem.into_response()
        }
    }
}

pub(super) async fn get_lease(
    State(state): State<ControlState>,
    Extension(caller): Extension<Caller>,
    Path(key): Path<String>,
) -> Response {
    if let Err(problem) = may_read(&caller) {
        return problem.into_response();
    }
    let call_key = key.clone();
    let row = state
        .with_client(|client| async move {
            let result = store::get_lease(&**client, &call_key).await;
            (client, result)
        })
        .await;
    match row {
        Ok(Some(row)) => axum::Json(json!({
            "key": row.key,
            "owner": row.owner,
            "term": row.term,
            "expires_at": rfc3339(row.expires_at),
            "remaining_ms": millis(row.remaining),
            "ttl_ms": millis(row.expires_at.duration_since(row.renewed_at).unwrap_or_default()),
        }))
        .into_response(),
        Ok(None) => {
            Problem::new(StatusCode::NOT_FOUND, "no-such-lease", "No such lease", "nobody ever acquired this key")
                .with("key", json!(key))
                .into_response()
        }
        Err(problem) => problem.into_response(),
    }
}
