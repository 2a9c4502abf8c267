//! The fenced log over HTTP (schema version 16), so leaders and followers in any language can
//! append and tail:
//!
//! - `POST /v1/streams/{stream}/entries` with `Fencing-Token: <term>` and `{"entries": [...]}`:
//!   the leader's append (`fencing.append`), 409 for a term that does not lead the stream's lease;
//! - `GET /v1/streams/{stream}/entries?after=<seq>&limit=<n>&wait=<duration>`: the entries after
//!   `after`, in order, waiting up to `wait` for the first when there is none (a long poll, woken
//!   by the append's notification); 410 when retention removed some of them;
//! - `PUT /v1/streams/{stream}/followers/{follower}` with `{"applied": <seq>}`: a follower's
//!   position (its durable cursor and retention's bound), answered with its lag;
//! - `GET /v1/streams/{stream}`: the stream, its retention and its followers.
//!
//! Appending and reporting need the stream's lease in the client's lease globs; reading needs
//! the read permission.

use std::time::Duration;

use axum::Extension;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use fencing_election::watch::Wake;
use fencing_schema::log::{self as store, Entry};
use serde::{Deserialize, Serialize};
use serde_json::json;
use serde_json::value::RawValue;
use tokio::time::Instant;

use crate::control::extract::*;
use crate::control::state::ControlState;
use crate::control::watch::parse_wait;
use crate::problem::Problem;
use crate::proxy::route::single;
use crate::proxy::{FENCING_TOKEN, parse_token};
use crate::security::auth::Caller;

/// The most entries one append carries, as `fencing.append` allows.
const MAX_APPEND: usize = 1000;

/// The most entries one read answers.
const MAX_READ: i32 = 1000;

/// The entries as the client sent them: passed to Postgres as text, so no number is rounded.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AppendRequest {
    entries: Vec<Box<RawValue>>,
}

/// One entry as answered: the payload as Postgres prints it, never parsed again.
#[derive(Debug, Serialize)]
struct EntryOut<'a> {
    seq: i64,
    term: i64,
    appended_at: String,
    payload: &'a RawValue,
}

/// A read's answer.
#[derive(Debug, Serialize)]
struct ReadOut<'a> {
    stream: &'a str,
    entries: Vec<EntryOut<'a>>,
    last_seq: i64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PositionRequest {
    applied: i64,
}

fn no_such_stream(stream: &str) -> Problem {
    Problem::new(
        StatusCode::NOT_FOUND,
        "no-such-stream",
        "No such stream",
        "no stream of this name exists; create it with fencing.create_stream(stream, lease_key)",
    )
    .with("stream", json!(stream))
}

fn compacted(stream: &str, after: i64, first_seq: i64) -> Problem {
    Problem::new(
        StatusCode::GONE,
        "compacted",
        "Compacted",
        &format!(
            "retention removed entries {} to {}: take a snapshot of the state up to sequence {}, report it as \
             applied, then read after it (resnapshot from sequence {first_seq})",
            after + 1,
            first_seq - 1,
            first_seq - 1
        ),
    )
    .with("stream", json!(stream))
    .with("first_seq", json!(first_seq))
}

/// The stream's lease, or 404; then 403 unless `caller` may use it.
async fn lease_of(state: &ControlState, caller: &Caller, stream: &str) -> Result<String, Problem> {
    let name = stream.to_owned();
    let status = state
        .side_call(|client| async move {
            let result = match store::status(&**client, &name).await {
                Err(fencing_schema::Error::NoStream { .. }) => Ok(None),
                other => other.map(Some),
            };
            (client, result)
        })
        .await?;
    let lease = status.and_then(|status| status.lease_key).ok_or_else(|| no_such_stream(stream))?;
    may_use(caller, &lease)?;
    Ok(lease)
}

/// A refusal of the store (`ZF409`) as the proxy's 409 for the same outcome.
fn refused(stream: &str, term: i64, outcome: Option<&str>, current: Option<i64>) -> Problem {
    let (kind, title, what) = match outcome {
        Some("stale") => ("stale-term", "Stale term", "a newer term has appended to this stream or leads its lease"),
        Some("future_term") => {
            ("future-term", "Future term", "the presented term is above the current term of the stream's lease")
        }
        _ => (
            "not-leader",
            "Not the leader",
            "the stream's lease is not held at the presented term (expired or released)",
        ),
    };
    Problem::new(
        StatusCode::CONFLICT,
        kind,
        title,
        &format!("{what}: this writer's period is over, it must stop acting as leader; nothing was appended"),
    )
    .with("stream", json!(stream))
    .with("presented_term", json!(term))
    .with("current_term", json!(current))
    .current_term(current)
}

pub(super) async fn append(
    State(state): State<ControlState>,
    Extension(caller): Extension<Caller>,
    Path(stream): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let checked = json_body(&headers).and_then(|()| {
        let token = single(&headers, &FENCING_TOKEN).map_err(|rejection| rejection.problem())?.ok_or_else(|| {
            Problem::new(
                StatusCode::PRECONDITION_REQUIRED,
                "missing-token",
                "Fencing token required",
                "an append carries the leader's term in the Fencing-Token header",
            )
        })?;
        let term = parse_token(token).map_err(|rejection| rejection.problem())?;
        let request: AppendRequest = parse(&body)?;
        if request.entries.is_empty() || request.entries.len() > MAX_APPEND {
            return Err(Problem::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid-argument",
                "Invalid argument",
                &format!("entries must hold 1 to {MAX_APPEND} JSON values, got {}", request.entries.len()),
            ));
        }
        Ok((term, request))
    });
    let (term, request) = match may_read(&caller).and(checked) {
        Ok(checked) => checked,
        Err(problem) => return problem.into_response(),
    };
    if let Err(problem) = lease_of(&state, &caller, &stream).await {
        return problem.into_response();
    }
    let texts: Vec<String> = request.entries.iter().map(|entry| entry.get().to_owned()).collect();
    let count = texts.len() as i64;
    let name = stream.clone();
    let answer = state
        .side_call(|client| async move {
            let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
            let result = match store::append(&**client, &name, term, &texts).await {
                Err(fencing_schema::Error::Refused { outcome, current_term, .. }) => Ok(Err((outcome, current_term))),
                other => other.map(Ok),
            };
            (client, result)
        })
        .await;
    match answer {
        Ok(Ok(first)) => {
            metrics::counter!(crate::metrics::LOG_APPENDS, "outcome" => "admitted").increment(1);
            axum::Json(json!({
                "stream": stream,
                "term": term,
                "first_seq": first,
                "last_seq": first + count - 1,
            }))
            .into_response()
        }
        Ok(Err((outcome, current))) => {
            let problem = refused(&stream, term, outcome.as_deref(), current);
            metrics::counter!(crate::metrics::LOG_APPENDS, "outcome" => "refused").increment(1);
            problem.into_response()
        }
        // Sent and not answered: it may have committed. Say so (a retry may append it twice).
        Err(problem) if problem.status() == StatusCode::SERVICE_UNAVAILABLE => Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "fence-store-unavailable",
            "Fence store unavailable",
            "the append's outcome is unknown: it may have committed; read the stream before appending it again",
        )
        .with("stream", json!(stream))
        .retry_after(1)
        .into_response(),
        Err(problem) => problem.into_response(),
    }
}

/// `after`, `limit` and `wait`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ReadQuery {
    after: i64,
    limit: i32,
    wait: Duration,
}

impl ReadQuery {
    fn parse(query: Option<&str>) -> Result<ReadQuery, Problem> {
        let bad = |detail: String| Problem::new(StatusCode::BAD_REQUEST, "invalid-query", "Invalid query", &detail);
        let (mut after, mut limit, mut wait) = (None, None, None);
        for pair in query.unwrap_or_default().split('&').filter(|pair| !pair.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            match name {
                "after" if after.is_none() => {
                    after =
                        Some(value.parse::<i64>().ok().filter(|after| *after >= 0).ok_or_else(|| {
                            bad(format!("after must be a sequence number of at least 0, got {value:?}"))
                        })?);
                }
                "limit" if limit.is_none() => {
                    limit = Some(
                        value
                            .parse::<i32>()
                            .ok()
                            .filter(|limit| (1..=MAX_READ).contains(limit))
                            .ok_or_else(|| bad(format!("limit must be 1 to {MAX_READ}, got {value:?}")))?,
                    );
                }
                "wait" if wait.is_none() => wait = Some(parse_wait(value)?),
                "after" | "limit" | "wait" => return Err(bad(format!("{name} is given twice"))),
                other => {
                    return Err(bad(format!(
                        "unknown query parameter {other:?}: only after, limit and wait are known"
                    )));
                }
            }
        }
        Ok(ReadQuery { after: after.unwrap_or(0), limit: limit.unwrap_or(100), wait: wait.unwrap_or_default() })
    }
}

/// The answer to a read: `None` when a payload is not JSON (never: Postgres printed it).
fn read_answer(stream: &str, entries: &[Entry], last_seq: i64) -> Option<Response> {
    let entries = entries
        .iter()
        .map(|entry| {
            let payload: &RawValue = serde_json::from_str(&entry.payload).ok()?;
            Some(EntryOut { seq: entry.seq, term: entry.term, appended_at: rfc3339(entry.appended_at), payload })
        })
        .collect::<Option<Vec<_>>>()?;
    Some(axum::Json(ReadOut { stream, entries, last_seq }).into_response())
}

pub(super) async fn read(
    State(state): State<ControlState>,
    Extension(caller): Extension<Caller>,
    Path(stream): Path<String>,
    request: axum::extract::Request,
) -> Response {
    let query = match may_read(&caller).and_then(|()| ReadQuery::parse(request.uri().query())) {
        Ok(query) => query,
        Err(problem) => return problem.into_response(),
    };
    // A wait holds a watcher's place (bounded per client and per gateway), and ends at the
    // configured longest wait or the gateway's shutdown.
    let slot = if query.wait.is_zero() {
        None
    } else {
        match state.watchers.enter(&caller, &state.config.control) {
            Ok(slot) => Some(slot),
            Err(problem) => return problem.into_response(),
        }
    };
    let until = Instant::now() + query.wait.min(state.config.control.watch_max_wait);
    let topic = format!("log:{stream}");
    loop {
        let mut wakes = state.wakeups.subscribe();
        let name = stream.clone();
        let read = state
            .side_call(|client| async move {
                let result = match store::read(&**client, &name, query.after, query.limit).await {
                    Err(fencing_schema::Error::Compacted { first_seq, .. }) => Ok(Err(Some(first_seq))),
                    Err(fencing_schema::Error::NoStream { .. }) => Ok(Err(None)),
                    other => other.map(Ok),
                };
                (client, result)
            })
            .await;
        let entries = match read {
            Ok(Ok(entries)) => entries,
            Ok(Err(Some(first_seq))) => return compacted(&stream, query.after, first_seq).into_response(),
            Ok(Err(None)) => return no_such_stream(&stream).into_response(),
            Err(problem) => return problem.into_response(),
        };
        if !entries.is_empty() || slot.is_none() || Instant::now() >= until {
            let last = entries.last().map_or(query.after, |entry| entry.seq);
            return read_answer(&stream, &entries, last)
                .unwrap_or_else(|| unavailable("the store answered a payload that is not JSON").into_response());
        }
        // Read again at the poll even without a wake-up (a lost notification, a listening
        // connection that is down), as every watch does.
        let poll = if state.wakeups.listening() {
            fencing_election::watch::POLL_LISTENING
        } else {
            fencing_election::watch::POLL_NOT_LISTENING
        };
        let read_again = until.min(Instant::now() + poll);
        loop {
            tokio::select! {
                biased;
                () = state.shutdown.cancelled() => break,
                () = tokio::time::sleep_until(read_again) => break,
                wake = wakes.recv() => match wake {
                    Ok(Wake::Topic(name)) if *name != *topic.as_str() => continue,
                    _ => break,
                },
            }
        }
        if state.shutdown.is_cancelled() {
            // Answered at once with what there is (nothing): the caller asks again elsewhere.
            return axum::Json(json!({"stream": stream, "entries": [], "last_seq": query.after})).into_response();
        }
    }
}

pub(super) async fn report_position(
    State(state): State<ControlState>,
    Extension(caller): Extension<Caller>,
    Path((stream, follower)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let request =
        match may_read(&caller).and_then(|()| json_body(&headers)).and_then(|()| parse::<PositionRequest>(&body)) {
            Ok(request) => request,
            Err(problem) => return problem.into_response(),
        };
    if let Err(problem) = lease_of(&state, &caller, &stream).await {
        return problem.into_response();
    }
    let (name, who) = (stream.clone(), follower.clone());
    let reported = state
        .side_call(|client| async move {
            let result = match store::report_position(&**client, &name, &who, request.applied).await {
                Err(fencing_schema::Error::Compacted { first_seq, .. }) => Ok(Err(first_seq)),
                other => other.map(Ok),
            };
            (client, result)
        })
        .await;
    match reported {
        Ok(Err(first_seq)) => compacted(&stream, request.applied, first_seq).into_response(),
        Ok(Ok(reported)) => axum::Json(json!({
            "stream": stream,
            "follower": follower,
            "applied": request.applied,
            "head": reported.head,
            "lag_entries": (reported.head - request.applied).max(0),
            "lag_ms": millis(reported.lag),
        }))
        .into_response(),
        Err(problem) => problem.into_response(),
    }
}

pub(super) async fn get_stream(
    State(state): State<ControlState>,
    Extension(caller): Extension<Caller>,
    Path(stream): Path<String>,
) -> Response {
    if let Err(problem) = may_read(&caller) {
        return problem.into_response();
    }
    let name = stream.clone();
    let answer = state
        .side_call(|client| async move {
            let result = async {
                let status = match store::status(&**client, &name).await {
                    Err(fencing_schema::Error::NoStream { .. }) => return Ok(None),
                    other => other?,
                };
                let followers = store::followers(&**client, &name).await?;
                Ok(Some((status, followers)))
            }
            .await;
            (client, result)
        })
        .await;
    match answer {
        Ok(Some((status, followers))) => axum::Json(json!({
            "stream": stream,
            "lease_key": status.lease_key,
            "max_term": status.max_term,
            "head": status.head,
            "first_seq": status.first_seq,
            "retention": {
                "keep_count": status.retention.keep_count,
                "keep_age_ms": status.retention.keep_age.map(millis),
                "max_entries": status.retention.max_entries,
            },
            "followers": followers.iter().map(|f| json!({
                "follower": f.follower,
                "applied": f.applied,
                "lag_entries": f.lag_entries,
                "lag_ms": f.lag.map(millis),
                "reported_ms_ago": millis(f.reported_ago),
            })).collect::<Vec<_>>(),
        }))
        .into_response(),
        Ok(None) => no_such_stream(&stream).into_response(),
        Err(problem) => problem.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::ReadQuery;

    #[test]
    fn read_queries_parse_or_are_refused() {
        let parsed = |query: &str| ReadQuery::parse(Some(query));
        assert_eq!(parsed("").ok(), Some(ReadQuery { after: 0, limit: 100, wait: Duration::ZERO }));
        assert_eq!(
            parsed("after=7&limit=3&wait=2s").ok(),
            Some(ReadQuery { after: 7, limit: 3, wait: Duration::from_secs(2) })
        );
        for bad in ["after=-1", "after=x", "limit=0", "limit=1001", "wait=3", "after=1&after=2", "since=3"] {
            assert_eq!(parsed(bad).err().map(|p| p.status().as_u16()), Some(400), "{bad}");
        }
    }
}
