//! Every 4xx and 5xx the gateway itself produces is a [`Problem`]: `application/problem+json`
//! (RFC 9457). The proxy's refusals map onto it in `proxy::rejection`, the control API's in
//! `control`.

use axum::body::Body;
use http::header::{CONTENT_TYPE, RETRY_AFTER, WWW_AUTHENTICATE};
use http::{HeaderValue, Response, StatusCode};
use serde_json::{Value, json};

/// The header that tells a refused writer the term it lost to.
pub const FENCING_CURRENT_TERM: &str = "fencing-current-term";

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

/// 401: no valid bearer token. Says why (`detail`), never which clients exist.
pub fn unauthenticated(detail: &str) -> Problem {
    let mut problem = Problem::new(StatusCode::UNAUTHORIZED, "unauthenticated", "Authentication required", detail);
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

    /// Its `detail`.
    pub fn detail(&self) -> Option<&str> {
        self.body.get("detail").and_then(Value::as_str)
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
