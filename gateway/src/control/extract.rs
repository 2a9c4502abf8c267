//! What the control API's handlers share: the permission checks (403), the body's type (415),
//! size and pace (413, 408) and shape (400, 422), the store call under the fence-check timeout
//! (503), and the counters of lease and membership calls.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use deadpool_postgres::Object;
use serde::de::DeserializeOwned;
use serde_json::json;
use tokio::time::{Instant, timeout_at};
use tracing::warn;

use crate::config::CONTROL_BODY_LIMIT_BYTES;
use crate::control::state::ControlState;
use crate::fence::discard;
use crate::metrics as names;
use crate::problem::{Problem, forbidden};
use crate::security::auth::Caller;

/// 403 unless the caller may use lease `key` (a key longer than any the store accepts is 422,
/// before any pattern is matched against it).
pub(super) fn may_use(caller: &Caller, key: &str) -> Result<(), Problem> {
    if key.chars().count() > 256 {
        return Err(Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid-argument",
            "Invalid argument",
            "a lease key must be 1 to 256 characters",
        ));
    }
    if caller.may_use(key) {
        return Ok(());
    }
    Err(forbidden(&format!("client {:?} may not use lease {key:?}", caller.name())).with("key", json!(key)))
}

/// A lease call's checks before its body is parsed: the key (403) and the content type (415).
pub(super) fn may_call(caller: &Caller, key: &str, headers: &HeaderMap, op: &'static str) -> Result<(), Problem> {
    may_use(caller, key).inspect_err(|_| ControlState::count(op, "forbidden"))?;
    json_body(headers).inspect_err(|_| ControlState::count(op, "invalid"))
}

/// 403 unless the caller may read.
pub(super) fn may_read(caller: &Caller) -> Result<(), Problem> {
    if caller.may_read() {
        return Ok(());
    }
    Err(forbidden(&format!("client {:?} has no read permission", caller.name())))
}

/// 415 unless the body is declared JSON: a browser's cross-site "simple" request can only send
/// text/plain, form or multipart bodies, so this also keeps web pages out.
pub(super) fn json_body(headers: &HeaderMap) -> Result<(), Problem> {
    let declared = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .map(|essence| essence.trim().eq_ignore_ascii_case("application/json"));
    if declared == Some(true) {
        return Ok(());
    }
    Err(Problem::new(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported-media-type",
        "JSON required",
        "the body must be sent with Content-Type: application/json",
    ))
}

pub(super) fn rfc3339(time: SystemTime) -> String {
    humantime::format_rfc3339_millis(time).to_string()
}

pub(super) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// Reads a control request's whole body: at most [`CONTROL_BODY_LIMIT_BYTES`] (413), with no
/// pause longer than `pause` (408).
pub(super) async fn read_body(body: hyper::body::Incoming, pause: Duration) -> Result<Bytes, Problem> {
    use http_body_util::BodyExt;
    let limited =
        http_body_util::Limited::new(tower_http::timeout::TimeoutBody::new(pause, body), CONTROL_BODY_LIMIT_BYTES);
    match limited.collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if error.is::<http_body_util::LengthLimitError>() => Err(Problem::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body-too-large",
            "Request body too large",
            &format!("a control request body is at most {CONTROL_BODY_LIMIT_BYTES} bytes"),
        )),
        Err(error) if error.is::<tower_http::timeout::TimeoutError>() => Err(Problem::new(
            StatusCode::REQUEST_TIMEOUT,
            "body-timeout",
            "Request body timed out",
            "the client paused too long inside its request body",
        )),
        Err(_) => Err(Problem::new(
            StatusCode::BAD_REQUEST,
            "body-incomplete",
            "Request body incomplete",
            "the request body could not be read whole",
        )),
    }
}

/// Parses a JSON body: 400 when it is not JSON, 422 when it is the wrong shape.
pub(super) fn parse<T: DeserializeOwned>(body: &Bytes) -> Result<T, Problem> {
    serde_json::from_slice(body).map_err(|error| match error.classify() {
        serde_json::error::Category::Data => {
            Problem::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid-body", "Invalid request body", &error.to_string())
        }
        _ => Problem::new(StatusCode::BAD_REQUEST, "malformed-json", "Malformed JSON", &error.to_string()),
    })
}

pub(super) fn unavailable(detail: &str) -> Problem {
    Problem::new(StatusCode::SERVICE_UNAVAILABLE, "fence-store-unavailable", "Fence store unavailable", detail)
        .retry_after(1)
}

pub(super) fn store_problem(error: fencing_schema::Error) -> Problem {
    match error {
        fencing_schema::Error::InvalidArgument { message } => {
            Problem::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid-argument", "Invalid argument", &message)
        }
        error @ (fencing_schema::Error::SchemaOutdated { .. } | fencing_schema::Error::SchemaTooNew { .. }) => {
            unavailable(&error.to_string())
        }
        other => {
            warn!(error = %crate::error_chain(&other), "control API store call failed");
            unavailable("the fence store failed; nothing was decided")
        }
    }
}

impl ControlState {
    /// Runs one store call with a pooled connection, bounded by the fence-check timeout.
    pub(super) async fn with_client<T, F, Fut>(&self, call: F) -> Result<T, Problem>
    where
        F: FnOnce(Object) -> Fut,
        Fut: Future<Output = (Object, Result<T, fencing_schema::Error>)>,
    {
        let deadline = Instant::now() + self.config.database.fence_check_timeout;
        let client = match fencing_election::pool::connection_by(&self.pool, deadline).await {
            Some(Ok(client)) => client,
            Some(Err(error)) => {
                // The cause (a refused connection, a failed TLS handshake with the names it
                // expected) goes to the log, not to unauthenticated callers of /readyz.
                warn!(error = %crate::error_chain(&error), "control API: no database connection");
                return Err(unavailable("the fence store cannot be reached; the gateway's log says why"));
            }
            None => return Err(unavailable("the fence store did not answer in time")),
        };
        match timeout_at(deadline, call(client)).await {
            Ok((client, Err(error))) => {
                if error.is_store_failure() {
                    discard(client);
                }
                Err(store_problem(error))
            }
            Ok((_, Ok(value))) => Ok(value),
            Err(_) => Err(unavailable("the fence store did not answer in time")),
        }
    }

    /// A call that is no lease call (membership, a watch's reads): at most all but one of the
    /// control pool's connections at once (`membership_calls`), so they can never take the
    /// connection a lease renewal needs; 503 when none is free within the check timeout.
    pub(super) async fn side_call<T, F, Fut>(&self, call: F) -> Result<T, Problem>
    where
        F: FnOnce(Object) -> Fut,
        Fut: Future<Output = (Object, Result<T, fencing_schema::Error>)>,
    {
        let wait = self.config.database.fence_check_timeout;
        let Ok(Ok(_permit)) = tokio::time::timeout(wait, Arc::clone(&self.membership_calls).acquire_owned()).await
        else {
            return Err(unavailable("too many membership calls and watch reads at once; retry"));
        };
        self.with_client(call).await
    }

    pub(super) fn check_ttl(&self, ttl_ms: u64) -> Result<Duration, Problem> {
        let ttl = Duration::from_millis(ttl_ms);
        let (min, max) = (self.config.control.min_ttl, self.config.control.max_ttl);
        if ttl < min || ttl > max {
            return Err(Problem::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "ttl-out-of-bounds",
                "ttl out of bounds",
                &format!("ttl_ms must be between {} and {}, got {ttl_ms}", millis(min), millis(max)),
            ));
        }
        Ok(ttl)
    }

    pub(super) fn count(op: &'static str, result: &'static str) {
        metrics::counter!(names::LEASE_OPERATIONS, "op" => op, "result" => result).increment(1);
    }

    /// Runs one membership call within the membership share of the control pool (503 when
    /// no share frees up within the fence-check timeout), counting it.
    pub(super) async fn member_call<T, F, Fut>(&self, op: &'static str, call: F) -> Result<T, Problem>
    where
        F: FnOnce(Object) -> Fut,
        Fut: Future<Output = (Object, Result<T, fencing_schema::Error>)>,
    {
        let answer = self.side_call(call).await;
        match &answer {
            Ok(_) => {}
            Err(problem) if problem.status() == StatusCode::UNPROCESSABLE_ENTITY => count_member(op, "invalid"),
            Err(_) => count_member(op, "error"),
        }
        answer
    }
}

/// Counts one membership call (`fencing_member_operations_total{op,result}`).
pub(super) fn count_member(op: &'static str, result: &'static str) {
    metrics::counter!(names::MEMBER_OPERATIONS, "op" => op, "result" => result).increment(1);
}

/// A membership or daemon call refused before the store (403 forbidden, else invalid),
/// counted under `op`.
pub(super) fn refused(op: &'static str, problem: Problem) -> Response {
    count_member(op, if problem.status() == StatusCode::FORBIDDEN { "forbidden" } else { "invalid" });
    problem.into_response()
}

/// 422 for a name the store cannot take: empty, longer than 256 characters, or with a NUL.
pub(super) fn check_member_name(what: &str, value: &str) -> Result<(), Problem> {
    if value.is_empty() || value.chars().count() > 256 || value.contains('\0') {
        return Err(Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid-argument",
            "Invalid argument",
            &format!("{what} must be 1 to 256 characters, without NUL"),
        ));
    }
    Ok(())
}

/// A cluster's checks: the caller may use it (the clients' lease globs name clusters too; 403)
/// and its name fits (422).
pub(super) fn may_use_cluster(caller: &Caller, cluster: &str) -> Result<(), Problem> {
    check_member_name("a cluster name", cluster)?;
    if caller.may_use(cluster) {
        return Ok(());
    }
    Err(forbidden(&format!(
        "client {:?} may not use cluster {cluster:?} (a client's lease globs name the clusters it may use)",
        caller.name()
    ))
    .with("cluster", json!(cluster)))
}

/// 422 unless the incarnation, as the store keeps it (`<client>/<incarnation>` with clients),
/// is 1 to 256 characters without NUL.
pub(super) fn check_incarnation(caller: &Caller, incarnation: &str) -> Result<(), Problem> {
    if incarnation.is_empty() {
        return check_member_name("incarnation", incarnation);
    }
    check_member_name("incarnation (with the client's name and a slash)", &caller.store_owner(incarnation))
}

/// A membership POST's checks, in order: the cluster (403, 422), the JSON content type (415),
/// the body (400, 422), the node id and `check` (422); a refusal is counted under `op`.
pub(super) fn member_post<T: DeserializeOwned>(
    op: &'static str,
    caller: &Caller,
    (cluster, node): (&str, &str),
    headers: &HeaderMap,
    body: &Bytes,
    check: impl FnOnce(&T) -> Result<(), Problem>,
) -> Result<T, Problem> {
    let checked = may_use_cluster(caller, cluster).and_then(|()| json_body(headers)).and_then(|()| {
        let request = parse(body)?;
        check_member_name("a node id", node)?;
        check(&request)?;
        Ok(request)
    });
    checked.inspect_err(|problem| {
        count_member(op, if problem.status() == StatusCode::FORBIDDEN { "forbidden" } else { "invalid" });
    })
}

/// A read of one cluster through the membership share of the control pool: the cluster's checks
/// first (403, 422), then `read`; counted under `op`.
pub(super) async fn cluster_read<T>(
    state: &ControlState,
    caller: &Caller,
    cluster: &str,
    op: &'static str,
    read: impl AsyncFnOnce(&tokio_postgres::Client, &str) -> Result<T, fencing_schema::Error>,
) -> Result<T, Response> {
    if let Err(problem) = may_use_cluster(caller, cluster) {
        return Err(refused(op, problem));
    }
    let call_cluster = cluster.to_owned();
    let answer = state
        .member_call(op, |client| async move {
            let result = read(&**client, &call_cluster).await;
            (client, result)
        })
        .await;
    answer.inspect(|_| count_member(op, "ok")).map_err(IntoResponse::into_response)
}
