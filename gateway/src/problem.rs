//! Every 4xx and 5xx the gateway itself produces: `application/problem+json` (RFC 9457), and
//! the one place that maps an outcome to its status, body and metric label.

use axum::body::Body;
use http::header::{CONTENT_TYPE, RETRY_AFTER, WWW_AUTHENTICATE};
use http::{HeaderValue, Response, StatusCode};
use serde_json::{Value, json};

/// The header that tells a refused writer the term it lost to.
pub const FENCING_CURRENT_TERM: &str = "fencing-current-term";

/// The label of `fencing_writes_total{outcome}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Admitted and forwarded (whatever the upstream answered).
    Admitted,
    /// The term is lower than the resource's maximum or its lease's current term.
    Stale,
    /// Stamp mode: the owner does not hold the lease; or the bound lease is not held.
    NotLeader,
    /// A bound resource was written with a term above its lease's current term.
    FutureTerm,
    /// A fenced write presented no token and no lease.
    MissingToken,
    /// The request was malformed (token, headers, body size, resource).
    Malformed,
    /// The fence decision could not be made.
    Unavailable,
    /// Admitted, but the upstream could not be reached or timed out.
    UpstreamError,
    /// No valid bearer token (401), or the client may not use the lease (403).
    Unauthorized,
}

impl Outcome {
    /// The metric label.
    pub fn as_label(self) -> &'static str {
        match self {
            Outcome::Admitted => "admitted",
            Outcome::Stale => "stale",
            Outcome::NotLeader => "not_leader",
            Outcome::FutureTerm => "future_term",
            Outcome::MissingToken => "missing_token",
            Outcome::Malformed => "malformed",
            Outcome::Unavailable => "unavailable",
            Outcome::UpstreamError => "upstream_error",
            Outcome::Unauthorized => "unauthorized",
        }
    }
}

/// Why the gateway answered a request itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rejection {
    /// No route matches the path.
    NoRoute,
    /// CONNECT, or another method the proxy never forwards.
    MethodNotAllowed,
    /// A fence decision refused the write.
    Fenced {
        /// Stale, NotLeader or FutureTerm.
        outcome: Outcome,
        /// The resource written.
        resource: String,
        /// The fence the decision was made on (the resource, or `<prefix>/<resource>` for an
        /// unbound route).
        fence: String,
        /// The term presented (`None` in stamp mode when no term applies).
        presented_term: Option<i64>,
        /// The term the writer lost to.
        current_term: Option<i64>,
    },
    /// A fenced write with neither `Fencing-Token` nor `Fencing-Lease`.
    MissingToken,
    /// Malformed input; the detail says what.
    Malformed(String),
    /// The body is over the limit.
    BodyTooLarge {
        /// The limit in bytes.
        limit: u64,
    },
    /// The fence store did not decide in time or failed.
    Unavailable,
    /// The upstream could not be reached.
    UpstreamUnreachable,
    /// The upstream did not answer before the write's forward deadline.
    UpstreamTimeout,
    /// Clients are configured and the write carries no valid bearer token.
    Unauthenticated(crate::auth::Unauthenticated),
    /// The authenticated client may not write under this lease; the detail says which.
    Forbidden(String),
    /// `Host` is missing, repeated or malformed (400), or not one of the configured names
    /// (421); the problem says which.
    BadHost(Problem),
}

impl Rejection {
    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            Rejection::NoRoute => StatusCode::NOT_FOUND,
            Rejection::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Rejection::Fenced { .. } => StatusCode::CONFLICT,
            Rejection::MissingToken => StatusCode::PRECONDITION_REQUIRED,
            Rejection::Malformed(_) => StatusCode::BAD_REQUEST,
            Rejection::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Rejection::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Rejection::UpstreamUnreachable => StatusCode::BAD_GATEWAY,
            Rejection::UpstreamTimeout => StatusCode::GATEWAY_TIMEOUT,
            Rejection::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            Rejection::Forbidden(_) => StatusCode::FORBIDDEN,
            Rejection::BadHost(problem) => problem.status,
        }
    }

    /// The `outcome` label, for rejections of writes on a route.
    pub fn outcome(&self) -> Outcome {
        match self {
            Rejection::Fenced { outcome, .. } => *outcome,
            Rejection::MissingToken => Outcome::MissingToken,
            Rejection::NoRoute
            | Rejection::MethodNotAllowed
            | Rejection::Malformed(_)
            | Rejection::BodyTooLarge { .. }
            | Rejection::BadHost(_) => Outcome::Malformed,
            Rejection::Unauthenticated(_) | Rejection::Forbidden(_) => Outcome::Unauthorized,
            Rejection::Unavailable => Outcome::Unavailable,
            Rejection::UpstreamUnreachable | Rejection::UpstreamTimeout => Outcome::UpstreamError,
        }
    }

    /// The problem document.
    pub fn problem(&self) -> Problem {
        let status = self.status();
        match self {
            Rejection::NoRoute => Problem::new(status, "no-route", "No route", "no configured route matches this path"),
            Rejection::MethodNotAllowed => Problem::new(
                status,
                "method-not-allowed",
                "Method not allowed",
                "the gateway forwards only to configured upstreams; CONNECT and TRACE are refused",
            ),
            Rejection::Fenced { outcome, resource, fence, presented_term, current_term } => {
                let (kind, title, detail) = match outcome {
                    Outcome::FutureTerm => (
                        "future-term",
                        "Future term",
                        format!(
                            "resource {resource:?} is bound to a lease whose current term is lower than the presented term"
                        ),
                    ),
                    Outcome::NotLeader => (
                        "not-leader",
                        "Not the leader",
                        format!(
                            "the lease that resource {resource:?} needs is not held by this writer: its owner does not \
                             hold it (stamp mode), it has expired or been released, or the resource is bound to another \
                             lease than this route's"
                        ),
                    ),
                    _ => (
                        "stale-term",
                        "Stale term",
                        format!(
                            "a term newer than the presented one exists for resource {resource:?} (admitted for it, or granted to the \
                             lease it is bound to): this writer's period is over; it must stop acting as leader"
                        ),
                    ),
                };
                Problem::new(status, kind, title, &detail)
                    .with("resource", json!(resource))
                    .with("fence", json!(fence))
                    .with("presented_term", json!(presented_term))
                    .with("current_term", json!(current_term))
                    .current_term(*current_term)
            }
            Rejection::MissingToken => Problem::new(
                status,
                "missing-token",
                "Fencing token required",
                "a fenced write must present Fencing-Token, or Fencing-Lease with Fencing-Owner",
            ),
            Rejection::Malformed(detail) => Problem::new(status, "malformed-request", "Malformed request", detail),
            Rejection::BodyTooLarge { limit } => Problem::new(
                status,
                "body-too-large",
                "Request body too large",
                &format!("the request body is over the limit of {limit} bytes"),
            ),
            Rejection::Unavailable => Problem::new(
                status,
                "fence-store-unavailable",
                "Fence store unavailable",
                "the fence decision could not be made; the write was not forwarded",
            )
            .retry_after(1),
            Rejection::UpstreamUnreachable => Problem::new(
                status,
                "upstream-unreachable",
                "Upstream unreachable",
                "the write was admitted but the upstream could not be reached",
            ),
            Rejection::UpstreamTimeout => Problem::new(
                status,
                "upstream-timeout",
                "Upstream timed out",
                "the write was admitted but the upstream did not answer before its forward deadline; it was aborted",
            ),
            Rejection::Unauthenticated(reason) => unauthenticated(*reason),
            Rejection::Forbidden(detail) => forbidden(detail),
            Rejection::BadHost(problem) => problem.clone(),
        }
    }
}

/// An RFC 9457 problem document and the headers that go with it.
#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    status: StatusCode,
    body: serde_json::Map<String, Value>,
    retry_after: Option<u32>,
    current_term: Option<i64>,
    bearer_challenge: bool,
}

impl Eq for Problem {}

/// 401: no valid bearer token. Says why, never which clients exist.
pub fn unauthenticated(reason: crate::auth::Unauthenticated) -> Problem {
    let mut problem =
        Problem::new(StatusCode::UNAUTHORIZED, "unauthenticated", "Authentication required", &reason.to_string());
    problem.bearer_challenge = true;
    problem
}

/// 403: an authenticated client that may not do this.
pub fn forbidden(detail: &str) -> Problem {
    Problem::new(StatusCode::FORBIDDEN, "forbidden", "Forbidden", detail)
}

impl Problem {
    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// A problem with `type`, `title`, `status` and `detail`.
    pub fn new(status: StatusCode, kind: &str, title: &str, detail: &str) -> Problem {
        let mut body = serde_json::Map::new();
        body.insert("type".to_owned(), json!(format!("urn:fencing-gateway:problem:{kind}")));
        body.insert("title".to_owned(), json!(title));
        body.insert("status".to_owned(), json!(status.as_u16()));
        body.insert("detail".to_owned(), json!(detail));
        Problem { status, body, retry_after: None, current_term: None, bearer_challenge: false }
    }

    /// Adds a member.
    pub fn with(mut self, name: &str, value: Value) -> Problem {
        self.body.insert(name.to_owned(), value);
        self
    }

    /// Adds a `Retry-After` header.
    pub fn retry_after(mut self, seconds: u32) -> Problem {
        self.retry_after = Some(seconds);
        self
    }

    /// Adds the `Fencing-Current-Term` header.
    pub fn current_term(mut self, term: Option<i64>) -> Problem {
        self.current_term = term;
        self
    }

    /// The response.
    pub fn into_response(self) -> Response<Body> {
        let bytes = serde_json::to_vec(&Value::Object(self.body)).unwrap_or_default();
        let mut response = Response::new(Body::from(bytes));
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
        if let Some(seconds) = self.retry_after {
            headers.insert(RETRY_AFTER, HeaderValue::from(seconds));
        }
        if let Some(term) = self.current_term {
            headers.insert(FENCING_CURRENT_TERM, HeaderValue::from(term));
        }
        if self.bearer_challenge {
            headers.insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"fencing-gateway\""));
        }
        response
    }
}

impl axum::response::IntoResponse for Problem {
    fn into_response(self) -> axum::response::Response {
        Problem::into_response(self)
    }
}
