//! Leases: acquire, renew, release and read a lease, for leaders in any language (the same SQL
//! as the Rust library).

use std::time::Duration;

use axum::Extension;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use fencing_election::watch;
use fencing_schema::store::{self, LeaseReply};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::control::extract::*;
use crate::control::state::ControlState;
use crate::control::watch::{self as control_watch, WatchQuery};
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
    /// The holder's value, set for the term this call holds (absent: unchanged; a new term
    /// starts with none; JSON null clears it).
    #[serde(default, deserialize_with = "present")]
    value: Option<Value>,
}

/// A member that is present, even as JSON null (absent is `None` through `default`).
fn present<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(deserializer).map(Some)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ValueRequest {
    owner: String,
    term: i64,
    /// JSON null clears it.
    value: Value,
}

/// The value as the store will keep it: its JSON text, at most [`store::MAX_LEASE_VALUE_BYTES`]
/// (422 beyond, before anything is asked of the store).
fn value_text(value: &Value) -> Result<String, Problem> {
    let text = value.to_string();
    if text.len() > store::MAX_LEASE_VALUE_BYTES {
        return Err(Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "value-too-large",
            "Lease value too large",
            &format!("a lease value is at most {} bytes of JSON, got {}", store::MAX_LEASE_VALUE_BYTES, text.len()),
        ));
    }
    Ok(text)
}

/// A stored value's JSON text as JSON (the store only keeps valid JSON).
fn stored_value(text: Option<&str>) -> Value {
    text.and_then(|text| serde_json::from_str(text).ok()).unwrap_or(Value::Null)
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
        "resign_requested": reply.resign_requested,
    })
}

pub(super) fn held_elsewhere(key: &str, reply: &LeaseReply, detail: &str) -> Problem {
    Problem::new(StatusCode::CONFLICT, "lease-held", "Lease held by another owner", detail)
        .with("key", json!(key))
        .with("holder", json!(reply.holder))
        .with("term", json!(reply.term))
        .with("expires_at", json!(reply.expires_at.filter(|_| reply.holder.is_some()).map(rfc3339)))
}

/// 409 for an acquire while the key's lock-delay runs: the last period ended without a release.
fn in_lock_delay(key: &str, reply: &LeaseReply) -> Problem {
    Problem::new(
        StatusCode::CONFLICT,
        "lock-delay",
        "Lease in its lock-delay",
        "the last period of this lease ended without a release (it expired, or was force-released): no new term \
         until its lock-delay has passed, so the old holder's last writes to resources that cannot check a token \
         can land first",
    )
    .with("key", json!(key))
    .with("holder", Value::Null)
    .with("term", json!(reply.term))
    .with("lock_delay_remaining_ms", json!(millis(reply.lock_delay)))
    .retry_after(u32::try_from(reply.lock_delay.as_millis().div_ceil(1000)).unwrap_or(u32::MAX).max(1))
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
    let checked = parse::<LeaseRequest>(&body).and_then(|request| {
        let ttl = state.check_ttl(request.ttl_ms)?;
        let value = request.value.as_ref().map(value_text).transpose()?;
        Ok((request, ttl, value))
    });
    let (request, ttl, value) = match checked {
        Ok(checked) => checked,
        Err(problem) => {
            ControlState::count(op, "invalid");
            return problem.into_response();
        }
    };
    // The store's owner is the client's: another client cannot renew or stamp with it.
    let (call_key, owner) = (key.clone(), caller.store_owner(&request.owner));
    let reply = state
        .with_client(|mut client| async move {
            let result = match value {
                None => if op == "acquire" {
                    store::acquire(&**client, &call_key, &owner, ttl).await
                } else {
                    store::renew(&**client, &call_key, &owner, ttl).await
                }
                .map(|reply| (reply, None)),
                // The call and the value for the term it holds in one transaction: a value the
                // store refuses (larger as Postgres prints it, or text Postgres does not take as
                // JSON) leaves the lease as it was.
                Some(value) => {
                    async {
                        let tx = client.transaction().await?;
                        let reply = if op == "acquire" {
                            store::acquire(&*tx, &call_key, &owner, ttl).await?
                        } else {
                            store::renew(&*tx, &call_key, &owner, ttl).await?
                        };
                        let set = match (reply.ok, reply.term) {
                            (true, Some(term)) => {
                                store::set_lease_value(&*tx, &call_key, &owner, term, &value).await?.then_some(value)
                            }
                            _ => None,
                        };
                        tx.commit().await?;
                        Ok((reply, set))
                    }
                    .await
                }
            };
            (client, result)
        })
        .await;
    match reply {
        Ok((reply, set)) if reply.ok => {
            ControlState::count(op, "ok");
            if let Some(term) = reply.term {
                state.note_grant(&key, term);
            }
            let mut answer = lease_json(&key, &request.owner, &reply, ttl);
            if request.value.is_some() {
                answer["value"] = stored_value(set.as_deref());
            }
            axum::Json(answer).into_response()
        }
        Ok((reply, _)) => {
            ControlState::count(op, "conflict");
            if op == "renew" {
                let label = if state.named_keys.contains(&key) { key.clone() } else { names::OTHER_KEY.to_owned() };
                metrics::counter!(names::LEASE_RENEW_FAILURES, "key" => label).increment(1);
            }
            if op == "acquire" && !reply.lock_delay.is_zero() {
                return in_lock_delay(&key, &reply).into_response();
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

/// `GET /v1/leases/{key}`, and with `?wait=30s&after=<revision>` a watch: answered as soon as
/// the lease's revision differs from `after` (control/watch.rs).
pub(super) async fn get_lease(
    State(state): State<ControlState>,
    Extension(caller): Extension<Caller>,
    Path(key): Path<String>,
    RawQuery(query): RawQuery,
) -> Response {
    if let Err(problem) = may_read(&caller) {
        return problem.into_response();
    }
    let query = match WatchQuery::parse(query.as_deref()) {
        Ok(query) => query,
        Err(problem) => return problem.into_response(),
    };
    let _slot = match query.waits().then(|| state.watchers.enter(&caller, &state.config.control)).transpose() {
        Ok(slot) => slot,
        Err(problem) => return problem.into_response(),
    };
    // A watch's reads share the budget of membership calls: they never take the connection a
    // renewal needs.
    let waits = query.waits();
    let read = || {
        let (state, call_key) = (&state, key.clone());
        async move {
            let call = |client: deadpool_postgres::Object| async move {
                let result = store::observe_lease(&**client, &call_key).await;
                (client, result)
            };
            let read = if waits { state.side_call(call).await } else { state.with_client(call).await };
            read.map(watch::lease_observed)
        }
    };
    let topic = watch::lease_topic(&key);
    let until = control_watch::until(&query, &state.config.control);
    let observed = tokio::select! {
        observed = watch::wait_for_change(&state.wakeups, &topic, query.after, until, read) => observed,
        // Stopping: the state as it is now, without waiting.
        () = state.shutdown.cancelled() => watch::wait_for_change(&state.wakeups, &topic, None, until, read).await,
    };
    let (revision, row) = match observed {
        Ok(observed) => (observed.revision, observed.state),
        Err(problem) => return problem.into_response(),
    };
    match row {
        Some(observed) => {
            let row = &observed.lease;
            axum::Json(json!({
            "key": row.key,
            "owner": row.owner,
            "term": row.term,
            "expires_at": rfc3339(row.expires_at),
            "remaining_ms": millis(row.remaining),
            "ttl_ms": millis(row.expires_at.duration_since(row.renewed_at).unwrap_or_default()),
            "value": stored_value(row.value.as_deref()),
            "lock_delay_remaining_ms": millis(row.lock_delay),
            "revision": revision,
            "resign_requested": observed.resign_requested,
            "successor": observed.successor,
            "reserved_ms": millis(observed.reserved),
            }))
            .into_response()
        }
        None => Problem::new(StatusCode::NOT_FOUND, "no-such-lease", "No such lease", "nobody ever acquired this key")
            .with("key", json!(key))
            .with("revision", json!(revision))
            .into_response(),
    }
}

/// `PUT /v1/leases/{key}/value`: the holder attaches a value to its lease at its term (proclaim).
/// 409 not-holder when the owner does not hold the lease at that term (a zombie's old term, or a
/// lease that ended), nothing changed.
pub(super) async fn set_value(
    State(state): State<ControlState>,
    Extension(caller): Extension<Caller>,
    Path(key): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    const OP: &str = "value";
    if let Err(problem) = may_call(&caller, &key, &headers, OP) {
        return problem.into_response();
    }
    let checked = parse::<ValueRequest>(&body).and_then(|request| Ok((value_text(&request.value)?, request)));
    let (value, request) = match checked {
        Ok(checked) => checked,
        Err(problem) => {
            ControlState::count(OP, "invalid");
            return problem.into_response();
        }
    };
    let (call_key, owner, term) = (key.clone(), caller.store_owner(&request.owner), request.term);
    let set = state
        .with_client(|client| async move {
            let result = store::set_lease_value(&**client, &call_key, &owner, term, &value).await;
            (client, result)
        })
        .await;
    match set {
        Ok(true) => {
            ControlState::count(OP, "ok");
            axum::Json(json!({"key": key, "term": term, "value": request.value})).into_response()
        }
        Ok(false) => {
            ControlState::count(OP, "conflict");
            Problem::new(
                StatusCode::CONFLICT,
                "not-holder",
                "Not the holder",
                "the owner does not hold this lease at this term (expired, released or taken over): the value is unchanged",
            )
            .with("key", json!(key))
            .with("term", json!(term))
            .into_response()
        }
        Err(problem) => {
            ControlState::count(OP, "error");
            problem.into_response()
        }
    }
}
