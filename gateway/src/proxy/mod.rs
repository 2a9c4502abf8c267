//! The proxy listener's handler. A request walks its rooms once each, in order:
//!
//! 1. `security`: the `Host`, and who is asking (enforced for fenced writes only);
//! 2. [`route`]: which route, the request rules of S8, and for a fenced write what the fence
//!    decides on (the presented term or lease, the resource, the whole body);
//! 3. `fence`: the decision (a grant this gateway holds, or `fencing.gate_many`);
//! 4. [`forward`]: the settle wait, the stamped headers, the send under the write's deadline on
//!    the client connection's own upstream connection ([`upstream`]), the answer streamed back;
//!    or, for a refused write, `fence::refusals`, the record of the refusal.
//!
//! [`rejection`] maps every refusal to its status, problem and metric label.

pub mod forward;
pub mod headers;
pub mod reads;
pub mod rejection;
pub mod route;
pub mod upstream;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::body::Body;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response};
use hyper::body::Incoming;
use tokio::time::Instant;
use tracing::{Instrument, debug, debug_span, field, warn};

use crate::config::Config;
use crate::fence::refusals::{RefusalLog, Refused};
use crate::fence::{FenceStore, Presented, Undecided, Verdict};
use crate::listener::{Connection, Handler};
use crate::metrics as names;
use crate::metrics::RouteMetrics;
use crate::proxy::forward::{Forwarder, Target};
use crate::proxy::headers::{REQUEST_ID, RequestId, named_in_connection};
use crate::proxy::reads::ReadRouter;
use crate::proxy::rejection::{Outcome, Rejection};
use crate::proxy::route::Routed;
use crate::proxy::upstream::{Peer, UpstreamConnector};
use crate::security::host::check_host;

pub use crate::proxy::headers::{FENCING_LEASE, FENCING_OWNER, FENCING_RESOURCE, FENCING_TOKEN};
pub use crate::proxy::route::{parse_token, strip_hop_by_hop};

/// Everything a proxied request needs.
#[derive(Debug)]
pub struct Proxy {
    config: Arc<Config>,
    fences: Arc<FenceStore>,
    forwarder: Forwarder,
    next_request_id: AtomicU64,
    request_id_prefix: u32,
    refusals: RefusalLog,
    /// Each route's metric handles, in the order of `config.routes`.
    route_metrics: Vec<RouteMetrics>,
    /// Each route's reads from followers, in the order of `config.routes` (`None`: to its
    /// upstream).
    reads: Arc<Vec<Option<Arc<ReadRouter>>>>,
    inflight_writes: metrics::Gauge,
}

impl Proxy {
    /// A proxy for `config`'s routes, deciding through `fences`.
    pub fn new(
        config: Arc<Config>,
        fences: Arc<FenceStore>,
        connector: UpstreamConnector,
        refusals: RefusalLog,
        reads: Arc<Vec<Option<Arc<ReadRouter>>>>,
    ) -> Proxy {
        Proxy {
            reads,
            fences,
            forwarder: Forwarder::new(Arc::clone(&config), connector),
            next_request_id: AtomicU64::new(1),
            request_id_prefix: rand::random(),
            refusals,
            route_metrics: config.routes.iter().map(|route| RouteMetrics::new(&route.prefix)).collect(),
            inflight_writes: metrics::gauge!(names::INFLIGHT_WRITES),
            config,
        }
    }

    /// The listener's handler: each connection gets its [`Peer`] (the client's address and its
    /// own upstream connections), and each of its requests is [`Proxy::handle`]d.
    pub fn handler(self: Arc<Self>) -> Handler {
        Arc::new(move |remote: SocketAddr| -> Connection {
            let proxy = Arc::clone(&self);
            let peer = Arc::new(Peer::new(remote));
            Arc::new(move |request| Box::pin(Arc::clone(&proxy).handle(request, Arc::clone(&peer))))
        })
    }

    /// Handles one request from `peer`.
    ///
    /// Its span is at debug level: at the default level it costs nothing per request, and the
    /// few events of the request path that an operator sees (warnings) name the request id.
    pub async fn handle(self: Arc<Self>, request: Request<Incoming>, peer: Arc<Peer>) -> Response<Body> {
        let id = RequestId(self.request_id(request.headers(), &peer));
        let span = debug_span!(
            "request",
            request_id = id.as_str(),
            method = request.method().as_str(),
            route = field::Empty,
            resource = field::Empty,
            term = field::Empty,
        );
        let mut response = self.walk(request, &peer, &id).instrument(span).await;
        response.headers_mut().insert(REQUEST_ID, id.0);
        response
    }

    /// The request id a trusted proxy (or, with `proxy.client_request_ids`, any client) sent
    /// when it is sane (1 to 64 visible ASCII characters), else a new one: any other client
    /// could make its refusals carry another request's id.
    fn request_id(&self, headers: &HeaderMap, peer: &Peer) -> HeaderValue {
        let sane = |value: &&HeaderValue| {
            let id = value.as_bytes();
            !id.is_empty() && id.len() <= 64 && id.iter().all(u8::is_ascii_graphic)
        };
        if (self.config.proxy.client_request_ids || self.config.proxy.trusted_proxies.contains(&peer.remote.ip()))
            && let Some(id) = headers.get(&REQUEST_ID).filter(sane)
        {
            return id.clone();
        }
        let id = format!("{:08x}-{}", self.request_id_prefix, self.next_request_id.fetch_add(1, Ordering::Relaxed));
        // Hex digits, a dash and decimal digits: always a valid header value.
        HeaderValue::from_maybe_shared(Bytes::from(id)).unwrap_or_else(|_| HeaderValue::from_static("-"))
    }

    /// The rooms in order: security, route, then a read goes to the upstream, a write to the
    /// fence and then to the upstream or the refusal record.
    async fn walk(&self, request: Request<Incoming>, peer: &Peer, request_id: &RequestId) -> Response<Body> {
        if let Err(problem) = check_host(request.headers(), request.version(), &self.config.proxy.hosts) {
            return problem.into_response();
        }
        // Who is asking: with clients configured, a fenced write must be a client's (an
        // unfenced read passes without a token, as it would without the gateway).
        // A token in a header that `Connection` names is hop-by-hop: removed, never read.
        let caller = if named_in_connection(request.headers(), &http::header::AUTHORIZATION) {
            self.config.clients.authenticate(&HeaderMap::new())
        } else {
            self.config.clients.authenticate(request.headers())
        };
        let (index, request) = match route::route(&self.config.routes, request) {
            Ok(Routed::Read { index, request }) => {
                tracing::Span::current().record("route", self.config.routes[index].prefix.as_str());
                let metrics = &self.route_metrics[index];
                metrics.passthrough();
                let target = Target { index, metrics, peer, request_id };
                return match self.reads.get(index).and_then(Option::as_ref) {
                    Some(router) => self.forwarder.read(target, router, request).await,
                    None => self.forwarder.pass_through(target, request).await,
                };
            }
            Ok(Routed::Write { index, request }) => (index, request),
            Err(rejection) => return rejection.problem().into_response(),
        };
        let (route, route_metrics) = (&self.config.routes[index], &self.route_metrics[index]);
        tracing::Span::current().record("route", route.prefix.as_str());

        let started = Instant::now();
        self.inflight_writes.increment(1.0);
        // The write as the fence sees it, the decision, then the send or the record of the
        // refusal.
        let written = async {
            let write = route::write(&self.config.proxy, route, request, caller).await?;
            let decision =
                self.fences.decide(&write.fence, &write.presented, route.lease.as_deref()).await.map_err(|error| {
                    let (request_id, fence) = (request_id.as_str(), &write.fence);
                    if matches!(error, Undecided::ClocksDisagree) {
                        // Logged (once per 10 s) where the clocks were seen to disagree.
                        debug!(request_id, %fence, %error, "refusing the write");
                        return Rejection::ClocksDisagree;
                    }
                    warn!(request_id, %fence, %error, "fence decision could not be made; refusing the write");
                    Rejection::Unavailable
                })?;
            let term = match decision.verdict(&write.presented) {
                Verdict::Admitted(term) => term,
                Verdict::Unanswered => return Err(Rejection::Unavailable),
                Verdict::Refused(refusal) => {
                    let stamp = matches!(write.presented, Presented::Lease { .. });
                    let rejection = Rejection::fenced(&refusal, &write.resource, &write.fence, stamp);
                    self.refusals.record(&Refused {
                        resource: &write.fence,
                        route: &route.prefix,
                        outcome: rejection.outcome().as_label(),
                        presented_term: refusal.presented_term,
                        current_term: refusal.current_term,
                        client: peer.remote,
                        request_id: request_id.as_str(),
                        lease: match &write.presented {
                            Presented::Lease { key, owner } => Some((key.as_str(), owner.as_str())),
                            Presented::Token(_) => None,
                        },
                        // A refusal from the cache has no lease: a bound route's is its own.
                        bound_lease: decision.gate.lease_key.as_deref().or(route.lease.as_deref()),
                        caller: write.caller.name(),
                    });
                    return Err(rejection);
                }
            };
            tracing::Span::current().record("term", term);
            let target = Target { index, metrics: route_metrics, peer, request_id };
            self.forwarder.send(target, write, &decision, term).await
        };
        let response = match written.await {
            Ok(response) => {
                route_metrics.write(Outcome::Admitted.as_label());
                response
            }
            Err(rejection) => {
                let outcome = rejection.outcome();
                route_metrics.write(outcome.as_label());
                if outcome == Outcome::UpstreamError {
                    let (request_id, route) = (request_id.as_str(), route.prefix.as_str());
                    warn!(request_id, route, ?rejection, "admitted write not answered by the upstream");
                } else {
                    debug!(?rejection, "write refused");
                }
                rejection.problem().into_response()
            }
        };
        self.inflight_writes.decrement(1.0);
        route_metrics.write_duration(started.elapsed().as_secs_f64());
        response
    }
}

/// A body for a small response the gateway makes itself.
pub fn bytes_body(bytes: impl Into<Bytes>) -> Body {
    Body::from(bytes.into())
}
