//! The control listener: the lease API for leaders in any language, fences, metrics, health.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use bytes::Bytes;
use deadpool_postgres::Object;
use fencing_schema::store::{self, LeaseReply};
use metrics_exporter_prometheus::PrometheusHandle;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::time::{Instant, timeout_at};
use tracing::warn;

use crate::auth::{Caller, check_host};
use crate::config::{CONTROL_BODY_LIMIT_BYTES, Config};
use crate::fence::{FenceStore, discard};
use crate::metrics as names;
use crate::problem::{Problem, forbidden, unauthenticated};

/// What the control handlers share.
#[derive(Debug, Clone)]
pub struct ControlState {
    /// The configuration (ttl bounds, timeouts).
    pub config: Arc<Config>,
    /// The fence store.
    pub fences: Arc<FenceStore>,
    /// The control API's own connections (`database.control_pool_size`).
    pub pool: deadpool_postgres::Pool,
    /// Renders `/metrics`.
    pub metrics: PrometheusHandle,
    /// The last term this gateway granted per key, to count leadership transitions.
    pub granted_terms: Arc<Mutex<HashMap<String, i64>>>,
    /// The lease keys counted under their own name in `fencing_lease_transitions_total`.
    pub named_keys: Arc<std::collections::BTreeSet<String>>,
    /// `/readyz`'s answer: one query at a time, shared by the callers that wait for it.
    pub readiness: Arc<Cached<Result<i32, Problem>>>,
    /// The count of refusals inside Postgres for `/metrics`, likewise.
    pub sql_refusals: Arc<Cached<Option<i64>>>,
    /// Membership calls in flight at once: at most all but one of the control pool's
    /// connections, so heartbeats can never take the connection a lease renewal needs.
    pub membership_calls: Arc<tokio::sync::Semaphore>,
}

/// A value computed by one caller at a time: callers that arrive while a computation is under
/// way wait for it and share its result, so a flood of probes or scrapes (no token or only a
/// read permission needed) holds at most one of the connections that renewals need.
#[derive(Debug)]
pub struct Cached<T> {
    value: tokio::sync::Mutex<Option<T>>,
    finished: std::sync::atomic::AtomicU64,
}

impl<T> Default for Cached<T> {
    fn default() -> Self {
        Cached { value: tokio::sync::Mutex::new(None), finished: std::sync::atomic::AtomicU64::new(0) }
    }
}

impl<T: Clone> Cached<T> {
    async fn get<F: Future<Output = T>>(&self, compute: impl FnOnce() -> F) -> T {
        use std::sync::atomic::Ordering;
        let finished_before = self.finished.load(Ordering::SeqCst);
        let mut slot = match self.value.try_lock() {
            Ok(slot) => slot,
            Err(_) => {
                let slot = self.value.lock().await;
                // The computation that was under way when this caller came has finished.
                if self.finished.load(Ordering::SeqCst) > finished_before
                    && let Some(value) = slot.as_ref()
                {
                    return value.clone();
                }
                slot
            }
        };
        let value = compute().await;
        *slot = Some(value.clone());
        self.finished.fetch_add(1, Ordering::SeqCst);
        value
    }
}

/// The control API's routes.
pub fn router(state: ControlState) -> Router {
    let guarded = axum::middleware::from_fn_with_state(state.clone(), guard);
    Router::new()
        .route("/v1/leases/{key}/acquire", post(acquire))
        .route("/v1/leases/{key}/renew", post(renew))
        .route("/v1/leases/{key}/release", post(release))
        .route("/v1/leases/{key}", get(get_lease))
        .route("/v1/fences/{resource}", get(get_fence))
        .route("/v1/clusters/{cluster}/nodes", get(list_nodes))
        .route("/v1/clusters/{cluster}/nodes/{node}/heartbeat", post(heartbeat))
        .route("/v1/clusters/{cluster}/nodes/{node}/leave", post(leave))
        .route("/v1/clusters/{cluster}/nodes/{node}/assignments", post(assignments))
        .route("/v1/clusters/{cluster}/nodes/{node}/assignments/{daemon}/ack", post(ack_assignment))
        .route("/v1/clusters/{cluster}/nodes/{node}/assignments/{daemon}/stopped", post(stopped_assignment))
        .route("/v1/clusters/{cluster}/daemons", get(list_daemons))
        .route("/v1/clusters/{cluster}/reconcile", post(reconcile))
        .route("/metrics", get(render_metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .fallback(not_found)
        .layer(guarded)
        .with_state(state)
}

/// Every request: `Host` checked, then, with clients configured, the bearer token (but for the
/// health probes); the caller goes to the handlers as an extension.
async fn guard(State(state): State<ControlState>, mut request: Request, next: Next) -> Response {
    if let Err(problem) = check_host(request.headers(), request.version(), &state.config.control.hosts) {
        return problem.into_response();
    }
    let path = request.uri().path();
    let caller = if path == "/healthz" || path == "/readyz" {
        Caller::Nobody
    } else {
        match state.config.clients.authenticate(request.headers()) {
            Ok(caller) => caller,
            Err(reason) => return unauthenticated(reason).into_response(),
        }
    };
    request.extensions_mut().insert(caller);
    next.run(request).await
}

/// 403 unless the caller may use lease `key` (a key longer than any the store accepts is 422,
/// before any pattern is matched against it).
fn may_use(caller: &Caller, key: &str) -> Result<(), Problem> {
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
fn may_call(caller: &Caller, key: &str, headers: &HeaderMap, op: &'static str) -> Result<(), Problem> {
    may_use(caller, key).inspect_err(|_| ControlState::count(op, "forbidden"))?;
    json_body(headers).inspect_err(|_| ControlState::count(op, "invalid"))
}

/// 403 unless the caller may read.
fn may_read(caller: &Caller) -> Result<(), Problem> {
    if caller.may_read() {
        return Ok(());
    }
    Err(forbidden(&format!("client {:?} has no read permission", caller.name())))
}

/// 415 unless the body is declared JSON: a browser's cross-site "simple" request can only send
/// text/plain, form or multipart bodies, so this also keeps web pages out.
fn json_body(headers: &HeaderMap) -> Result<(), Problem> {
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

fn rfc3339(time: SystemTime) -> String {
    humantime::format_rfc3339_millis(time).to_string()
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// Reads a control request's whole body: at most [`CONTROL_BODY_LIMIT_BYTES`] (413), with no
/// pause longer than `pause` (408).
pub async fn read_body(body: hyper::body::Incoming, pause: Duration) -> Result<Bytes, Problem> {
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
fn parse<T: DeserializeOwned>(body: &Bytes) -> Result<T, Problem> {
    serde_json::from_slice(body).map_err(|error| match error.classify() {
        serde_json::error::Category::Data => {
            Problem::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid-body", "Invalid request body", &error.to_string())
        }
        _ => Problem::new(StatusCode::BAD_REQUEST, "malformed-json", "Malformed JSON", &error.to_string()),
    })
}

fn unavailable(detail: &str) -> Problem {
    Problem::new(StatusCode::SERVICE_UNAVAILABLE, "fence-store-unavailable", "Fence store unavailable", detail)
        .retry_after(1)
}

fn store_problem(error: fencing_schema::Error) -> Problem {
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
    async fn with_client<T, F, Fut>(&self, call: F) -> Result<T, Problem>
    where
        F: FnOnce(Object) -> Fut,
        Fut: Future<Output = (Object, Result<T, fencing_schema::Error>)>,
    {
        let deadline = Instant::now() + self.config.database.fence_check_timeout;
        let client = match timeout_at(deadline, self.pool.get()).await {
            Ok(Ok(client)) => client,
            Ok(Err(error)) => {
                // The cause (a refused connection, a failed TLS handshake with the names it
                // expected) goes to the log, not to unauthenticated callers of /readyz.
                warn!(error = %crate::error_chain(&error), "control API: no database connection");
                return Err(unavailable("the fence store cannot be reached; the gateway's log says why"));
            }
            Err(_) => return Err(unavailable("the fence store did not answer in time")),
        };
        match timeout_at(deadline, call(client)).await {
            Ok((client, Err(error))) => {
                if error.is_store_failure() {
                    discard(client, self.fences.tls());
                }
                Err(store_problem(error))
            }
            Ok((_, Ok(value))) => Ok(value),
            Err(_) => Err(unavailable("the fence store did not answer in time")),
        }
    }

    fn check_ttl(&self, ttl_ms: u64) -> Result<Duration, Problem> {
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

    fn count(op: &'static str, result: &'static str) {
        metrics::counter!(names::LEASE_OPERATIONS, "op" => op, "result" => result).increment(1);
    }

    fn note_grant(&self, key: &str, term: i64) {
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

fn lease_json(key: &str, owner: &str, reply: &LeaseReply, ttl: Duration) -> Value {
    json!({
        "key": key,
        "owner": owner,
        "term": reply.term,
        "expires_at": reply.expires_at.map(rfc3339),
        "remaining_ms": millis(reply.remaining),
        "ttl_ms": millis(ttl),
    })
}

fn held_elsewhere(key: &str, reply: &LeaseReply, detail: &str) -> Problem {
    Problem::new(StatusCode::CONFLICT, "lease-held", "Lease held by another owner", detail)
        .with("key", json!(key))
        .with("holder", json!(reply.holder))
        .with("term", json!(reply.term))
        .with("expires_at", json!(reply.expires_at.filter(|_| reply.holder.is_some()).map(rfc3339)))
}

async fn acquire(
    State(state): State<ControlState>,
    Extension(caller): Extension<Caller>,
    Path(key): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    lease_call(state, &caller, key, &headers, body, "acquire").await
}

async fn renew(
    State(state): State<ControlState>,
    Extension(caller): Extension<Caller>,
    Path(key): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    lease_call(state, &caller, key, &headers, body, "renew").await
}

async fn lease_call(
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

async fn release(
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

async fn get_lease(
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

async fn get_fence(
    State(state): State<ControlState>,
    Extension(caller): Extension<Caller>,
    Path(resource): Path<String>,
) -> Response {
    if let Err(problem) = may_read(&caller) {
        return problem.into_response();
    }
    let call_resource = resource.clone();
    let row = state
        .with_client(|client| async move {
            let result = store::get_fence(&**client, &call_resource).await;
            (client, result)
        })
        .await;
    match row {
        Ok(Some(row)) => axum::Json(json!({
            "resource": row.resource,
            "max_term": row.max_term,
            "lease_key": row.lease_key,
            "updated_at": rfc3339(row.updated_at),
        }))
        .into_response(),
        Ok(None) => Problem::new(
            StatusCode::NOT_FOUND,
            "no-such-fence",
            "No such fence",
            "no write was ever admitted for this resource",
        )
        .with("resource", json!(resource))
        .into_response(),
        Err(problem) => problem.into_response(),
    }
}

async fn render_metrics(State(state): State<ControlState>, Extension(caller): Extension<Caller>) -> Response {
    if let Err(problem) = may_read(&caller) {
        return problem.into_response();
    }
    // Refusals inside Postgres roll back with their transactions: the store counts them in a
    // sequence, read here (bounded) so the dashboard sees them whichever client was refused.
    let count = state
        .sql_refusals
        .get(|| async {
            state
                .with_client(|client| async move {
                    let result = store::sql_refusal_count(&**client).await;
                    (client, result)
                })
                .await
                .ok()
        })
        .await;
    if let Some(count) = count {
        metrics::counter!(names::SQL_REFUSALS).absolute(u64::try_from(count).unwrap_or(0));
    }
    let mut response = state.metrics.render().into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"));
    response
}

async fn healthz() -> Response {
    (StatusCode::OK, "ok\n").into_response()
}

async fn readyz(State(state): State<ControlState>) -> Response {
    let version = state
        .readiness
        .get(|| async {
            state
                .with_client(|client| async move {
                    let result = fencing_schema::check_schema_version(&**client).await;
                    (client, result)
                })
                .await
        })
        .await;
    match version {
        Ok(version) => axum::Json(json!({ "status": "ready", "schema_version": version })).into_response(),
        Err(problem) => problem.into_response(),
    }
}

async fn not_found() -> Response {
    Problem::new(StatusCode::NOT_FOUND, "not-found", "Not found", "no such control endpoint").into_response()
}

/// The shortest registration ttl a node may ask for over HTTP: a heartbeat per 100 ms would
/// only load the store.
const MIN_NODE_TTL: Duration = Duration::from_secs(1);

/// Counts one membership call (`fencing_member_operations_total{op,result}`).
fn count_member(op: &'static str, result: &'static str) {
    metrics::counter!(names::MEMBER_OPERATIONS, "op" => op, "result" => result).increment(1);
}

/// A membership or daemon call refused before the store (403 forbidden, else invalid),
/// counted under `op`.
fn refused(op: &'static str, problem: Problem) -> Response {
    count_member(op, if problem.status() == StatusCode::FORBIDDEN { "forbidden" } else { "invalid" });
    problem.into_response()
}

/// 422 for a name the store cannot take: empty, longer than 256 characters, or with a NUL.
fn check_member_name(what: &str, value: &str) -> Result<(), Problem> {
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

impl ControlState {
    /// Runs one membership call within the membership share of the control pool (503 when
    /// no share frees up within the fence-check timeout), counting it.
    async fn member_call<T, F, Fut>(&self, op: &'static str, call: F) -> Result<T, Problem>
    where
        F: FnOnce(Object) -> Fut,
        Fut: Future<Output = (Object, Result<T, fencing_schema::Error>)>,
    {
        let wait = self.config.database.fence_check_timeout;
        let Ok(Ok(_permit)) = tokio::time::timeout(wait, Arc::clone(&self.membership_calls).acquire_owned()).await
        else {
            count_member(op, "error");
            return Err(unavailable("too many membership calls at once; retry"));
        };
        let answer = self.with_client(call).await;
        match &answer {
            Ok(_) => {}
            Err(problem) if problem.status() == StatusCode::UNPROCESSABLE_ENTITY => count_member(op, "invalid"),
            Err(_) => count_member(op, "error"),
        }
        answer
    }
}

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

/// A cluster's checks: the caller may use it (the clients' lease globs name clusters too; 403)
/// and its name fits (422).
fn may_use_cluster(caller: &Caller, cluster: &str) -> Result<(), Problem> {
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
fn check_incarnation(caller: &Caller, incarnation: &str) -> Result<(), Problem> {
    if incarnation.is_empty() {
        return check_member_name("incarnation", incarnation);
    }
    check_member_name("incarnation (with the client's name and a slash)", &caller.store_owner(incarnation))
}

/// A membership POST's checks, in order: the cluster (403, 422), the JSON content type (415),
/// the body (400, 422), the node id and `check` (422); a refusal is counted under `op`.
fn member_post<T: DeserializeOwned>(
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

fn member_json(member: &store::Member) -> Value {
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

async fn heartbeat(
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

async fn leave(
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

async fn list_nodes(
    State(state): State<ControlState>,
    Extension(caller): Extension<Caller>,
    Path(cluster): Path<String>,
) -> Response {
    let members =
        cluster_read(&state, &caller, &cluster, "list", async |client, cluster| store::members(client, cluster).await);
    match members.await {
        Ok(members) => {
            axum::Json(json!({ "cluster": cluster, "nodes": members.iter().map(member_json).collect::<Vec<_>>() }))
                .into_response()
        }
        Err(response) => response,
    }
}

/// A read of one cluster through the membership share of the control pool: the cluster's checks
/// first (403, 422), then `read`; counted under `op`.
async fn cluster_read<T>(
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
const MAX_OFFERED_DAEMONS: usize = 100;

fn assignment_moved(cluster: &str, node: &str, daemon: &str, generation: i64) -> Response {
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

async fn assignments(
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

async fn ack_assignment(
    State(state): State<ControlState>,
    Extension(caller): Extension<Caller>,
    Path((cluster, node, daemon)): Path<(String, String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    assignment_step(&state, &caller, (cluster, node, daemon), &headers, &body, "ack").await
}

async fn stopped_assignment(
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
async fn assignment_step(
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

async fn reconcile(
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

async fn list_daemons(
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
