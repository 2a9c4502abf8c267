//! The control listener: the lease API for leaders in any language, fences, clusters and their
//! nodes, daemons, the fenced log's streams, metrics and health; one file per resource, sharing the checks and answers of
//! [`extract`].
//!
//! Every request is checked first (`Host`, then with clients the bearer token, but for the
//! health probes), its body read whole within limits, then routed.

mod daemons;
mod extract;
mod fences;
mod handover;
mod health;
pub mod lease_view;
mod leases;
mod nodes;
mod state;
mod streams;
pub mod watch;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use axum::routing::{get, post, put};

use crate::config::Config;
use crate::listener::{Connection, Handler};
use crate::security::auth::Caller;
use crate::security::host::check_host;

pub(crate) use crate::control::handover::forced_reason;
pub use crate::control::state::{Cached, ControlState};

/// The control API's routes.
pub fn router(state: ControlState) -> Router {
    let guarded = axum::middleware::from_fn_with_state(state.clone(), guard);
    Router::new()
        .route("/v1/leases/{key}/acquire", post(leases::acquire))
        .route("/v1/leases/{key}/renew", post(leases::renew))
        .route("/v1/leases/{key}/release", post(leases::release))
        .route("/v1/leases/{key}/value", put(leases::set_value))
        .route("/v1/leases/{key}/resign-request", post(handover::resign_request))
        .route("/v1/leases/{key}", get(leases::get_lease))
        .route("/v1/fences/{resource}", get(fences::get_fence))
        .route("/v1/clusters/{cluster}/nodes", get(nodes::list_nodes))
        .route("/v1/clusters/{cluster}/nodes/{node}/heartbeat", post(nodes::heartbeat))
        .route("/v1/clusters/{cluster}/nodes/{node}/leave", post(nodes::leave))
        .route("/v1/clusters/{cluster}/nodes/{node}/assignments", post(daemons::assignments))
        .route("/v1/clusters/{cluster}/nodes/{node}/assignments/{daemon}/ack", post(daemons::ack_assignment))
        .route("/v1/clusters/{cluster}/nodes/{node}/assignments/{daemon}/stopped", post(daemons::stopped_assignment))
        .route("/v1/clusters/{cluster}/daemons", get(daemons::list_daemons))
        .route("/v1/clusters/{cluster}/reconcile", post(daemons::reconcile))
        .route("/v1/streams/{stream}/entries", post(streams::append).get(streams::read))
        .route("/v1/streams/{stream}/followers/{follower}", put(streams::report_position))
        .route("/v1/streams/{stream}", get(streams::get_stream))
        .route("/metrics", get(health::render_metrics))
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .fallback(health::not_found)
        .layer(guarded)
        .with_state(state)
}

/// The control listener's handler: who it is first (a client without a valid token sends no
/// body to anyone), then the whole body, bounded in size and in time, then the router.
pub fn handler(router: Router, config: &Config) -> Handler {
    let body_read_timeout = config.proxy.body_read_timeout;
    let clients = config.clients.clone();
    let hosts = Arc::new(config.control.hosts.clone());
    let connection: Connection = Arc::new(move |request: http::Request<hyper::body::Incoming>| {
        let router = router.clone();
        let clients = clients.clone();
        let hosts = Arc::clone(&hosts);
        Box::pin(async move {
            use tower::ServiceExt;
            if let Err(problem) = check_host(request.headers(), request.version(), &hosts) {
                return problem.into_response();
            }
            let path = request.uri().path();
            if path != "/healthz"
                && path != "/readyz"
                && let Err(reason) = clients.authenticate(request.headers())
            {
                return reason.problem().into_response();
            }
            let (parts, body) = request.into_parts();
            let body = match extract::read_body(body, body_read_timeout).await {
                Ok(body) => body,
                Err(problem) => return problem.into_response(),
            };
            let request = http::Request::from_parts(parts, axum::body::Body::from(body));
            match router.oneshot(request).await {
                Ok(response) => response,
                Err(infallible) => match infallible {},
            }
        })
    });
    Arc::new(move |_remote: SocketAddr| Arc::clone(&connection))
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
            Err(reason) => return reason.problem().into_response(),
        }
    };
    request.extensions_mut().insert(caller);
    next.run(request).await
}
