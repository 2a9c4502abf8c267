//! The upstream stage: an admitted write waits out its settle wait, gets the gateway's headers
//! (`Fencing-Token`, `Fencing-Resource`, `Forwarded`, the request id) and is sent under its
//! deadline on the client connection's own upstream connection; an unfenced read is sent as it
//! came, bodiless. The answer streams back, cleaned of hop-by-hop headers and of any
//! `Fencing-Current-Term` the upstream sent.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Body;
use bytes::Bytes;
use http::header::{CONTENT_LENGTH, HOST};
use http::uri::PathAndQuery;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, Uri};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use tokio::time::{Instant, sleep_until, timeout_at};
use tracing::debug;

use crate::config::Config;
use crate::fence::Decision;
use crate::metrics::RouteMetrics;
use crate::proxy::headers::{
    FENCING_LEASE, FENCING_OWNER, FENCING_READ_FROM, FENCING_READ_HOPS, FENCING_RESOURCE, FENCING_TOKEN, FORWARDED,
    REQUEST_ID, RequestId, client_claim_header,
};
use crate::proxy::reads::{Choice, ReadRouter, Served};

/// A read that went through this many gateways is refused (508 `read-loop`).
const MAX_READ_HOPS: u8 = 3;
use crate::proxy::rejection::Rejection;
use crate::proxy::route::{Write, strip_hop_by_hop};
use crate::proxy::upstream::{Failure, Peer, REUSE_WRITE_BODY_MAX, UpstreamConnector, WriteBound, host_header};

/// Where a request goes and for whom: its route (an index in `config.routes`) and that route's
/// metric handles, the client connection, the request id.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    /// The route, in `config.routes`.
    pub index: usize,
    /// The route's metric handles.
    pub metrics: &'a RouteMetrics,
    /// The client connection (its address, its upstream connections).
    pub peer: &'a Peer,
    /// The request's id.
    pub request_id: &'a RequestId,
}

/// Where a request is sent: an upstream's URL (scheme, authority, optional base path) and the
/// `Host` it is sent with.
#[derive(Debug)]
pub struct Destination {
    /// The upstream.
    pub uri: Uri,
    /// Its `Host` header.
    pub host: HeaderValue,
}

impl Destination {
    /// `uri` as a destination; `None` when it has no authority.
    pub fn new(uri: Uri) -> Option<Destination> {
        let host = host_header(&uri)?;
        Some(Destination { uri, host })
    }
}

/// Sends requests to their routes' upstreams.
#[derive(Debug)]
pub struct Forwarder {
    config: Arc<Config>,
    connector: UpstreamConnector,
    /// Each route's upstream, in the order of `config.routes`.
    route_upstreams: Vec<Option<Destination>>,
}

impl Forwarder {
    /// A forwarder for `config`'s routes, connecting through `connector`.
    pub fn new(config: Arc<Config>, connector: UpstreamConnector) -> Forwarder {
        let route_upstreams = config.routes.iter().map(|route| Destination::new(route.upstream.clone())).collect();
        Forwarder { config, connector, route_upstreams }
    }

    /// An unfenced request, which the route stage found bodiless: forwarded as is (less
    /// hop-by-hop and fencing headers) with an empty body, no Postgres, to the route's upstream.
    pub async fn pass_through(&self, target: Target<'_>, request: Request<Incoming>) -> Response<Body> {
        let parts = self.unfenced_parts(request);
        let Some(destination) = self.route_upstreams.get(target.index).and_then(Option::as_ref) else {
            return Rejection::UpstreamUnreachable.problem().into_response();
        };
        let deadline = Instant::now() + self.config.upstream.forward_timeout;
        match self.forward(target, destination, parts, Body::empty(), deadline, None).await {
            Ok(response) => response,
            Err(rejection) => rejection.problem().into_response(),
        }
    }

    /// An unfenced request of a route with `[routes.reads]`: a safe method (GET, HEAD, OPTIONS)
    /// to a follower within the bound, else to the leader (and to the leader when its follower
    /// could not be reached); any other unfenced method to the leader. The answer says who served
    /// it (`Fencing-Read-From`, also on the gateway's own 502, 503 and 504).
    pub async fn read(&self, target: Target<'_>, router: &ReadRouter, request: Request<Incoming>) -> Response<Body> {
        // How many gateways this read went through (read before the fencing headers go).
        let hops = request
            .headers()
            .get(FENCING_READ_HOPS)
            .and_then(|value| value.to_str().ok())
            .and_then(|text| text.parse::<u8>().ok())
            .unwrap_or(0);
        if request.headers().contains_key(FENCING_READ_HOPS) && hops == 0 || hops >= MAX_READ_HOPS {
            return Rejection::ReadLoop.problem().into_response();
        }
        let mut parts = self.unfenced_parts(request);
        parts.headers.insert(FENCING_READ_HOPS, HeaderValue::from(u16::from(hops) + 1));
        let deadline = Instant::now() + self.config.upstream.forward_timeout;
        let choice = if parts.method.is_safe() {
            router.choose()
        } else {
            router.leader().map_or(Choice::NoReader, Choice::Leader)
        };
        let (destination, parts) = match choice {
            Choice::Follower(name, destination) => {
                let from = HeaderValue::from_str(&format!("follower {name}"))
                    .unwrap_or_else(|_| HeaderValue::from_static("follower"));
                let again = clone_parts(&parts);
                match self.forward(target, &destination, parts, Body::empty(), deadline, None).await {
                    Ok(response) => {
                        router.served(Served::Follower);
                        return with_read_from(response, from);
                    }
                    // A safe method may be sent again (RFC 9110, 9.2.2): a follower that cannot be
                    // reached (gone since the poll) costs the client nothing but a second try.
                    Err(Rejection::UpstreamUnreachable) => match router.leader() {
                        Some(leader) => (leader, again),
                        None => {
                            router.served(Served::None);
                            return with_read_from(Rejection::NoReader.problem().into_response(), from);
                        }
                    },
                    Err(rejection) => {
                        router.served(Served::Follower);
                        return with_read_from(rejection.problem().into_response(), from);
                    }
                }
            }
            Choice::Leader(destination) => (destination, parts),
            Choice::NoReader => {
                router.served(Served::None);
                return Rejection::NoReader.problem().into_response();
            }
        };
        router.served(Served::Leader);
        let from = HeaderValue::from_static("leader");
        match self.forward(target, &destination, parts, Body::empty(), deadline, None).await {
            Ok(response) => with_read_from(response, from),
            Err(rejection) => with_read_from(rejection.problem().into_response(), from),
        }
    }

    /// An unfenced request's head as it is sent: no fencing or hop-by-hop headers, no
    /// `Content-Length` (its body is empty), no credential for this gateway.
    fn unfenced_parts(&self, mut request: Request<Incoming>) -> http::request::Parts {
        remove_fencing_headers(request.headers_mut());
        // The body is empty whatever `Content-Length: 0` spelling the client chose.
        request.headers_mut().remove(CONTENT_LENGTH);
        if self.config.clients.enabled() {
            // A client's credential for this gateway is never an upstream's to see.
            request.headers_mut().remove(http::header::AUTHORIZATION);
        }
        // The body is empty (the route stage refused any other): no byte of the client's
        // connection is relayed.
        request.into_parts().0
    }

    /// An admitted write of `term`: settled, stamped and forwarded.
    pub async fn send(
        &self,
        target: Target<'_>,
        write: Write,
        decision: &Decision,
        term: i64,
    ) -> Result<Response<Body>, Rejection> {
        let gate = &decision.gate;
        // S5. The store decided at some instant between `asked` and `answered`, and said: wait
        // a length from that instant, which `gate.wait` is on this gateway's clock, stretched by
        // the clock-rate allowance (`fence::settles`). So start no earlier than `answered + wait`
        // plus the settle margin (lower-term writes through any replica may be sent until then,
        // and their bytes be on their way), and end no later than `asked` plus the store's own
        // length and the forward timeout, unstretched: the next term settles behind that length
        // stretched on its own clock, so a clock of this gateway's that runs slow within the
        // allowance is covered once, not twice.
        let rho = self.config.database.clock_rate_tolerance;
        let store_wait = gate.wait.mul_f64((1.0 - rho) / (1.0 + rho));
        let deadline = decision.asked + store_wait + self.config.upstream.forward_timeout;
        if !gate.wait.is_zero() {
            debug!(wait = ?gate.wait, "settling behind the previous term");
            sleep_until(decision.answered + gate.wait + self.config.upstream.settle_margin).await;
        }
        // The wait and the deadline were counted on this gateway's clock: if it has since been
        // seen to disagree with the store's, neither stands, and the write is not sent.
        if !decision.clocks.holds() {
            return Err(Rejection::ClocksDisagree);
        }
        let Write { mut parts, body, resource, .. } = write;
        let headers = &mut parts.headers;
        remove_fencing_headers(headers);
        if self.config.clients.enabled() {
            // The client's credential for this gateway, not for the upstream.
            headers.remove(http::header::AUTHORIZATION);
        }
        headers.insert(FENCING_TOKEN, HeaderValue::from(term));
        let resource_value = HeaderValue::from_str(&resource)
            .map_err(|_| Rejection::Malformed("resource is not a header value".to_owned()))?;
        headers.insert(FENCING_RESOURCE, resource_value);
        headers.remove(http::header::TRANSFER_ENCODING);
        if body.is_empty() && self.config.routes[target.index].body_methods.contains(&parts.method) {
            // A method that carries content says it has none (IIS and others answer 411 to a
            // bodiless POST or PUT without a length); hyper frames every other body itself.
            headers.insert(CONTENT_LENGTH, HeaderValue::from_static("0"));
        } else {
            headers.remove(CONTENT_LENGTH);
        }
        let Some(destination) = self.route_upstreams.get(target.index).and_then(Option::as_ref) else {
            return Err(Rejection::UpstreamUnreachable);
        };
        self.forward(target, destination, parts, Body::from(body), deadline, Some(term)).await
    }

    /// Sends the request to `destination` and streams the answer back, on the client
    /// connection's own connection to that upstream (see [`crate::proxy::upstream`]). Everything
    /// the gateway sends of it (head and body) and the upstream's response head must pass before
    /// `deadline`; else the request is aborted and its upstream connection reset (SO_LINGER 0:
    /// no byte of it goes out after the deadline, not even a retransmission).
    async fn forward(
        &self,
        target: Target<'_>,
        destination: &Destination,
        mut parts: http::request::Parts,
        body: Body,
        deadline: Instant,
        term: Option<i64>,
    ) -> Result<Response<Body>, Rejection> {
        let Target { metrics, peer, request_id, .. } = target;
        parts.uri = outbound_uri(&destination.uri, parts.uri.path_and_query())?;
        let claims = |name: &HeaderName| {
            client_claim_header(name.as_str()) || self.config.proxy.client_claim_headers.contains(name)
        };
        if !self.config.proxy.trusted_proxies.contains(&peer.remote.ip()) && parts.headers.keys().any(claims) {
            // Who the client is comes from the gateway, not from what the client says.
            let claimed: Vec<HeaderName> = parts.headers.keys().filter(|name| claims(name)).cloned().collect();
            for name in claimed {
                parts.headers.remove(name);
            }
        }
        let original_host = parts.headers.insert(HOST, destination.host.clone());
        add_forwarded(&mut parts.headers, peer.remote, original_host.as_ref(), self.config.proxy.tls.is_some());
        parts.headers.insert(REQUEST_ID, request_id.0.clone());
        let outbound = Request::from_parts(parts, body);
        if Instant::now() >= deadline {
            return Err(Rejection::UpstreamTimeout);
        }
        if let Some(term) = term {
            // For whoever checks that no byte of a write goes out after its deadline (the fault
            // suite does): the deadline in real time, logged only where this target is enabled.
            tracing::trace!(
                target: "fencing_gateway::forward_deadline",
                request_id = request_id.as_str(),
                term,
                deadline_unix_us = unix_us(deadline),
                "forward deadline"
            );
        }
        // A write's deadline holds for its answer's body too: the connection may still be sending
        // the write while an early answer streams back (`Streamed`).
        let reuse = http_body::Body::size_hint(outbound.body()).upper().is_some_and(|n| n <= REUSE_WRITE_BODY_MAX);
        let write = term.map(|_| WriteBound { deadline, reuse });
        let exchange = peer.upstreams.send(&self.connector, &destination.uri, outbound, write);
        let response = match timeout_at(deadline, exchange).await {
            Ok(Ok(response)) => response,
            Ok(Err(failure)) => return Err(upstream_failure(metrics, &failure)),
            Err(_) => {
                metrics.upstream_error("timeout");
                return Err(Rejection::UpstreamTimeout);
            }
        };
        let (mut parts, mut body) = response.into_parts();
        if parts.status == http::StatusCode::SWITCHING_PROTOCOLS {
            body.discard();
            // The gateway never forwards Upgrade, so an upstream's 101 was not asked for.
            metrics.upstream_error("request");
            return Err(Rejection::UpstreamUnreachable);
        }
        strip_hop_by_hop(&mut parts.headers);
        // Only the gateway says which term a write was admitted for (and which term a refused
        // writer lost to): an upstream's `Fencing-*` headers never reach the client, so a read's
        // answer cannot pass for an admitted write's.
        remove_fencing_headers(&mut parts.headers);
        if let Some(term) = term {
            parts.headers.insert(FENCING_TOKEN, HeaderValue::from(term));
        }
        Ok(Response::from_parts(parts, Body::new(body.map_err(axum::Error::new))))
    }
}

/// A copy of an unfenced request's head (its extensions are not carried: the proxy sets none).
fn clone_parts(parts: &http::request::Parts) -> http::request::Parts {
    let mut request = Request::new(());
    *request.method_mut() = parts.method.clone();
    *request.uri_mut() = parts.uri.clone();
    *request.version_mut() = parts.version;
    *request.headers_mut() = parts.headers.clone();
    request.into_parts().0
}

/// `response` with `Fencing-Read-From` (who served the read: `follower <name>` or `leader`).
fn with_read_from(mut response: Response<Body>, from: HeaderValue) -> Response<Body> {
    response.headers_mut().insert(FENCING_READ_FROM, from);
    response
}

/// `deadline` as microseconds since the Unix epoch on the real-time clock.
fn unix_us(deadline: Instant) -> i64 {
    let remaining = deadline.saturating_duration_since(Instant::now());
    std::time::SystemTime::now()
        .checked_add(remaining)
        .and_then(|at| at.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |since| i64::try_from(since.as_micros()).unwrap_or(i64::MAX))
}

fn upstream_failure(metrics: &RouteMetrics, failure: &Failure) -> Rejection {
    let kind = match failure {
        Failure::Connect(_) => "connect",
        Failure::Request(_) => "request",
    };
    metrics.upstream_error(kind);
    debug!(error = %crate::error_chain(failure.error()), kind, "upstream failed");
    Rejection::UpstreamUnreachable
}

/// Removes every `Fencing-*` header a client or an upstream sent: only the gateway says which
/// term and resource a write was admitted for (and what a refused one lost to).
fn remove_fencing_headers(headers: &mut HeaderMap) {
    for name in [FENCING_TOKEN, FENCING_RESOURCE, FENCING_LEASE, FENCING_OWNER] {
        headers.remove(name);
    }
    if headers.keys().any(|name| name.as_str().starts_with("fencing-")) {
        let others: Vec<HeaderName> =
            headers.keys().filter(|name| name.as_str().starts_with("fencing-")).cloned().collect();
        for name in others {
            headers.remove(name);
        }
    }
}

/// The request target sent upstream (origin-form): the upstream's base path, then the
/// request's path and query. The request's own authority and Host are never used.
fn outbound_uri(upstream: &Uri, path_and_query: Option<&PathAndQuery>) -> Result<Uri, Rejection> {
    let cannot = || Rejection::Malformed("the request target cannot be forwarded".to_owned());
    let base = upstream.path().trim_end_matches('/');
    let mut parts = http::uri::Parts::default();
    parts.path_and_query = Some(match path_and_query {
        // No base path: the request's own path and query, as parsed (no copy, no second parse).
        Some(tail) if base.is_empty() => tail.clone(),
        tail => {
            let tail = tail.map_or("/", PathAndQuery::as_str);
            PathAndQuery::from_maybe_shared(Bytes::from(format!("{base}{tail}"))).map_err(|_| cannot())?
        }
    });
    Uri::from_parts(parts).map_err(|_| cannot())
}

fn add_forwarded(headers: &mut HeaderMap, remote: SocketAddr, host: Option<&HeaderValue>, tls: bool) {
    use std::fmt::Write as _;
    let proto = if tls { "https" } else { "http" };
    let mut element = String::with_capacity(128);
    let _ = write!(element, "for=\"{remote}\";proto={proto}");
    // Only a Host that is a valid authority goes in (check_host refused the others already);
    // it then has no character that could break the quoted-string.
    if let Some(host) = host
        .and_then(|value| value.to_str().ok())
        .filter(|text| text.parse::<http::uri::Authority>().is_ok() && !text.contains(['"', '\\']))
    {
        let _ = write!(element, ";host=\"{host}\"");
    }
    if let Ok(value) = HeaderValue::from_maybe_shared(Bytes::from(element)) {
        headers.append(FORWARDED, value);
    }
}
