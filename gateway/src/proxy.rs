//! The proxy listener's handler: route, decide, wait, forward, stream back.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::body::Body;
use bytes::{Bytes, BytesMut};
use fencing_schema::store::{Gate, Outcome as StoreOutcome};
use http::header::{CONNECTION, CONTENT_LENGTH, HOST};
use http::uri::PathAndQuery;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, Uri};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use tokio::time::{Instant, sleep_until, timeout_at};
use tracing::{Instrument, debug, debug_span, field, warn};

use crate::config::{Config, ResourceNaming, Route};
use crate::fence::{FenceStore, Presented, Undecided};
use crate::metrics as names;
use crate::metrics::RouteMetrics;
use crate::problem::{Outcome, Rejection};
use crate::refusals::RefusalLog;
use crate::server::Peer;
use crate::upstream::{Failure, UpstreamConnector, host_header};

/// `Fencing-Token`: the term, presented by a leader (verify mode) and stamped by the gateway.
pub const FENCING_TOKEN: HeaderName = HeaderName::from_static("fencing-token");
/// `Fencing-Resource`: the resource, stamped by the gateway (or read, when a route says so).
pub const FENCING_RESOURCE: HeaderName = HeaderName::from_static("fencing-resource");
/// `Fencing-Lease`: the lease key, presented in stamp mode.
pub const FENCING_LEASE: HeaderName = HeaderName::from_static("fencing-lease");
/// `Fencing-Owner`: the lease owner, presented in stamp mode; never forwarded.
pub const FENCING_OWNER: HeaderName = HeaderName::from_static("fencing-owner");
/// The request id, taken from the client when it sends a sane one, else made up.
pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
const FORWARDED: HeaderName = HeaderName::from_static("forwarded");

/// A request's id: the header value sent on to the upstream and back to the client, made once.
#[derive(Debug, Clone)]
pub struct RequestId(HeaderValue);

impl RequestId {
    /// The id as text (always visible ASCII).
    pub fn as_str(&self) -> &str {
        self.0.to_str().unwrap_or("-")
    }
}

/// The headers in which a client could claim another address; removed unless the peer is one
/// of `proxy.trusted_proxies`.
const CLIENT_ADDRESS_HEADERS: [HeaderName; 8] = [
    FORWARDED,
    HeaderName::from_static("x-forwarded-for"),
    HeaderName::from_static("x-forwarded-host"),
    HeaderName::from_static("x-forwarded-proto"),
    HeaderName::from_static("x-forwarded-port"),
    HeaderName::from_static("x-forwarded-prefix"),
    HeaderName::from_static("x-forwarded-server"),
    HeaderName::from_static("x-real-ip"),
];

/// Headers with which a client asks an upstream to apply another method than the request's
/// (Rails, Symfony, ASP.NET, Google's APIs and many more honour one of them). On an unfenced
/// method they would turn a read into a write nobody fenced, so they are refused there.
const METHOD_OVERRIDE_HEADERS: [HeaderName; 3] = [
    HeaderName::from_static("x-http-method-override"),
    HeaderName::from_static("x-method-override"),
    HeaderName::from_static("x-http-method"),
];

/// Headers with which a client asks an upstream (IIS, Symfony, Zend) to act on another path than
/// the request's: removed from every request, so the upstream acts on the path that was fenced.
const URL_REWRITE_HEADERS: [HeaderName; 2] =
    [HeaderName::from_static("x-original-url"), HeaderName::from_static("x-rewrite-url")];

/// The hop-by-hop headers of RFC 9110 section 7.6.1, and the old ones proxies still see.
const HOP_BY_HOP: [HeaderName; 9] = [
    CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    http::header::PROXY_AUTHENTICATE,
    http::header::PROXY_AUTHORIZATION,
    http::header::TE,
    http::header::TRAILER,
    http::header::TRANSFER_ENCODING,
    http::header::UPGRADE,
];

/// Everything a proxied request needs.
#[derive(Debug)]
pub struct Proxy {
    config: Arc<Config>,
    fences: Arc<FenceStore>,
    connector: UpstreamConnector,
    next_request_id: AtomicU64,
    request_id_prefix: u32,
    refusals: RefusalLog,
    /// Each route's metric handles, in the order of `config.routes`.
    route_metrics: Vec<RouteMetrics>,
    /// Each route's upstream `Host`, in the order of `config.routes`.
    route_hosts: Vec<Option<HeaderValue>>,
    inflight_writes: metrics::Gauge,
}

impl Proxy {
    /// A proxy for `config`'s routes, deciding through `fences`.
    pub fn new(
        config: Arc<Config>,
        fences: Arc<FenceStore>,
        connector: UpstreamConnector,
        refusals: RefusalLog,
    ) -> Proxy {
        Proxy {
            fences,
            connector,
            next_request_id: AtomicU64::new(1),
            request_id_prefix: rand::random(),
            refusals,
            route_metrics: config.routes.iter().map(|route| RouteMetrics::new(&route.prefix)).collect(),
            route_hosts: config.routes.iter().map(|route| host_header(&route.upstream)).collect(),
            inflight_writes: metrics::gauge!(names::INFLIGHT_WRITES),
            config,
        }
    }

    /// The metric handles of `route`, one of `config.routes`.
    fn metrics_of(&self, route: &Route) -> Option<&RouteMetrics> {
        self.route_metrics.get(self.index_of(route)?)
    }

    fn index_of(&self, route: &Route) -> Option<usize> {
        self.config.routes.iter().position(|known| std::ptr::eq(known, route))
    }

    /// Handles one request from `peer`.
    ///
    /// Its span is at debug level: at the default level it costs nothing per request, and the
    /// few events of the request path that an operator sees (warnings) name the request id.
    pub async fn handle(self: Arc<Self>, request: Request<Incoming>, peer: Arc<Peer>) -> Response<Body> {
        let id = RequestId(self.request_id(request.headers()));
        let span = debug_span!(
            "request",
            request_id = id.as_str(),
            method = request.method().as_str(),
            route = field::Empty,
            resource = field::Empty,
            term = field::Empty,
        );
        let mut response = self.route(request, &peer, &id).instrument(span).await;
        response.headers_mut().insert(REQUEST_ID, id.0);
        response
    }

    /// The client's request id when it is sane (1 to 64 visible ASCII characters), else a new one.
    fn request_id(&self, headers: &HeaderMap) -> HeaderValue {
        let sane = |value: &&HeaderValue| {
            let id = value.as_bytes();
            !id.is_empty() && id.len() <= 64 && id.iter().all(u8::is_ascii_graphic)
        };
        if let Some(id) = headers.get(&REQUEST_ID).filter(sane) {
            return id.clone();
        }
        let id = format!("{:08x}-{}", self.request_id_prefix, self.next_request_id.fetch_add(1, Ordering::Relaxed));
        // Hex digits, a dash and decimal digits: always a valid header value.
        HeaderValue::from_maybe_shared(Bytes::from(id)).unwrap_or_else(|_| HeaderValue::from_static("-"))
    }

    async fn route(&self, mut request: Request<Incoming>, peer: &Peer, request_id: &RequestId) -> Response<Body> {
        if let Err(problem) = crate::auth::check_host(request.headers(), request.version(), &self.config.proxy.hosts) {
            return problem.into_response();
        }
        if let Err(rejection) = check_method(request.method()) {
            return rejection.problem().into_response();
        }
        if request.uri().scheme().is_some() || request.uri().authority().is_some() {
            return Rejection::Malformed(
                "absolute-form request targets are not accepted: send origin-form (a path)".to_owned(),
            )
            .problem()
            .into_response();
        }
        // S8: one spelling per resource. A path an upstream could read another way is refused,
        // never normalised, so the upstream receives exactly the path that was fenced.
        if let Err(rejection) = check_path(request.uri().path()) {
            return rejection.problem().into_response();
        }
        let Some(index) = self.config.route_index(request.uri().path()) else {
            return Rejection::NoRoute.problem().into_response();
        };
        let (route, route_metrics) = (&self.config.routes[index], &self.route_metrics[index]);
        tracing::Span::current().record("route", route.prefix.as_str());
        if let Err(rejection) = check_header_names(request.headers_mut(), route) {
            return rejection.problem().into_response();
        }
        if route.unfenced_methods.contains(request.method()) {
            if let Err(rejection) = check_unfenced(&request) {
                return rejection.problem().into_response();
            }
            strip_hop_by_hop(request.headers_mut());
            route_metrics.passthrough();
            return self.pass_through(route, request, peer, request_id).await;
        }
        strip_hop_by_hop(request.headers_mut());

        let started = Instant::now();
        self.inflight_writes.increment(1.0);
        let response = match self.fenced(route, request, peer, request_id).await {
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

    /// An unfenced request, which `check_unfenced` found bodiless: forwarded as is (less
    /// hop-by-hop and fencing headers) with an empty body, no Postgres.
    async fn pass_through(
        &self,
        route: &Route,
        mut request: Request<Incoming>,
        peer: &Peer,
        request_id: &RequestId,
    ) -> Response<Body> {
        remove_fencing_headers(request.headers_mut());
        if self.config.clients.enabled() {
            // A client's credential for this gateway is never an upstream's to see.
            request.headers_mut().remove(http::header::AUTHORIZATION);
        }
        let deadline = Instant::now() + self.config.upstream.forward_timeout;
        // The body is empty (`check_unfenced`): no byte of the client's connection is relayed.
        let (parts, _body) = request.into_parts();
        match self.forward(route, parts, Body::empty(), peer, request_id, deadline, None).await {
            Ok(response) => response,
            Err(rejection) => rejection.problem().into_response(),
        }
    }

    async fn fenced(
        &self,
        route: &Route,
        request: Request<Incoming>,
        peer: &Peer,
        request_id: &RequestId,
    ) -> Result<Response<Body>, Rejection> {
        // With clients configured, a fenced write is a client's: authenticated, and under a
        // lease the client may use. Its stamp-mode owner is the client's (see `auth`).
        let caller = self.config.clients.authenticate(request.headers()).map_err(Rejection::Unauthenticated)?;
        let forbidden =
            |key: &str| Rejection::Forbidden(format!("client {:?} may not write under lease {key:?}", caller.name()));
        match &route.lease {
            Some(key) if !caller.may_use(key) => return Err(forbidden(key)),
            None if !caller.may_write_unbound(&route.prefix) => {
                return Err(Rejection::Forbidden(format!(
                    "client {:?} may not write through the unbound route {:?} (add it to the client's routes)",
                    caller.name(),
                    route.prefix
                )));
            }
            _ => {}
        }
        let limit = self.config.proxy.body_limit_bytes;
        if let Some(length) = content_length(request.headers())?
            && length > limit
        {
            return Err(Rejection::BodyTooLarge { limit });
        }
        let mut presented = presented(request.headers())?;
        if let Presented::Lease { key, owner } = &mut presented {
            if !caller.may_use(key) {
                return Err(forbidden(key));
            }
            *owner = caller.store_owner(owner);
            if owner.chars().count() > 256 {
                return Err(Rejection::Malformed(format!(
                    "Fencing-Owner is too long: with the client's name it must be at most 256 characters, got {}",
                    owner.chars().count()
                )));
            }
        }
        let resource = resource(route, &request)?;
        let fence = route.fence_name(&resource);
        tracing::Span::current().record("resource", resource.as_str());

        // The whole body before the decision: a malformed, oversized or abandoned body is
        // refused before any fence changes, and nothing of the write waits on the client once
        // the write has a deadline.
        let (mut parts, body) = request.into_parts();
        let body = read_body(body, limit, self.config.proxy.body_read_timeout).await?;

        let decision = self.fences.decide(&fence, &presented, route.lease.as_deref()).await.map_err(|error| {
            let request_id = request_id.as_str();
            warn!(request_id, %fence, %error, "fence decision could not be made; refusing the write");
            match error {
                Undecided::TimedOut | Undecided::Failed(_) => Rejection::Unavailable,
            }
        })?;
        let gate = &decision.gate;
        let term = admitted_term(gate, &resource, &fence, &presented).inspect_err(|rejection| {
            if let Rejection::Fenced { fence, outcome, presented_term, current_term, .. } = rejection {
                self.refusals.record(&crate::refusals::Refused {
                    resource: fence,
                    route: &route.prefix,
                    outcome: outcome.as_label(),
                    presented_term: *presented_term,
                    current_term: *current_term,
                    client: peer.remote,
                    request_id: request_id.as_str(),
                    lease: match &presented {
                        Presented::Lease { key, owner } => Some((key.as_str(), owner.as_str())),
                        Presented::Token(_) => None,
                    },
                    caller: caller.name(),
                });
            }
        })?;
        tracing::Span::current().record("term", term);

        // S5. The store decided at some instant between `asked` and `answered`, and said: wait
        // `gate.wait` from that instant. So start no earlier than `answered + wait` plus the
        // settle margin (lower-term writes through any replica may be sent until then, and
        // their bytes be on their way), and end no later than `asked + wait + forward_timeout`
        // (the store's horizon covers no later deadline).
        let deadline = decision.asked + gate.wait + self.config.upstream.forward_timeout;
        if !gate.wait.is_zero() {
            debug!(wait = ?gate.wait, "settling behind the previous term");
            sleep_until(decision.answered + gate.wait + self.config.upstream.settle_margin).await;
        }
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
        headers.remove(CONTENT_LENGTH);
        headers.remove(http::header::TRANSFER_ENCODING);
        self.forward(route, parts, Body::from(body), peer, request_id, deadline, Some(term)).await
    }

    /// Sends the request to the route's upstream and streams the answer back, on the client
    /// connection's own connection to that upstream (see [`crate::upstream`]). Everything the
    /// gateway sends of it (head and body) and the upstream's response head must pass before
    /// `deadline`; else the request is aborted and its upstream connection reset (SO_LINGER 0:
    /// no byte of it goes out after the deadline, not even a retransmission).
    #[allow(clippy::too_many_arguments)]
    async fn forward(
        &self,
        route: &Route,
        mut parts: http::request::Parts,
        body: Body,
        peer: &Peer,
        request_id: &RequestId,
        deadline: Instant,
        term: Option<i64>,
    ) -> Result<Response<Body>, Rejection> {
        parts.uri = outbound_uri(&route.upstream, parts.uri.path_and_query())?;
        if !self.config.proxy.trusted_proxies.contains(&peer.remote.ip()) {
            // Who the client is comes from the gateway, not from what the client says.
            for name in CLIENT_ADDRESS_HEADERS {
                parts.headers.remove(name);
            }
        }
        let original_host = match self.index_of(route).and_then(|index| self.route_hosts[index].clone()) {
            Some(host) => parts.headers.insert(HOST, host),
            None => return Err(Rejection::UpstreamUnreachable),
        };
        add_forwarded(&mut parts.headers, peer.remote, original_host.as_ref(), self.config.proxy.tls.is_some());
        parts.headers.insert(REQUEST_ID, request_id.0.clone());
        let outbound = Request::from_parts(parts, body);
        if Instant::now() >= deadline {
            return Err(Rejection::UpstreamTimeout);
        }
        let exchange = peer.upstreams.send(&self.connector, &route.upstream, outbound);
        let response = match timeout_at(deadline, exchange).await {
            Ok(Ok(response)) => response,
            Ok(Err(failure)) => return Err(self.upstream_failure(route, &failure)),
            Err(_) => {
                self.metrics_of(route).inspect(|m| m.upstream_error("timeout"));
                return Err(Rejection::UpstreamTimeout);
            }
        };
        let (mut parts, mut body) = response.into_parts();
        if parts.status == http::StatusCode::SWITCHING_PROTOCOLS {
            body.discard();
            // The gateway never forwards Upgrade, so an upstream's 101 was not asked for.
            self.metrics_of(route).inspect(|m| m.upstream_error("request"));
            return Err(Rejection::UpstreamUnreachable);
        }
        strip_hop_by_hop(&mut parts.headers);
        // Only the gateway says which term a refused writer lost to.
        parts.headers.remove(crate::problem::FENCING_CURRENT_TERM);
        if let Some(term) = term {
            parts.headers.insert(FENCING_TOKEN, HeaderValue::from(term));
        }
        Ok(Response::from_parts(parts, Body::new(body.map_err(axum::Error::new))))
    }

    fn upstream_failure(&self, route: &Route, failure: &Failure) -> Rejection {
        let kind = match failure {
            Failure::Connect(_) => "connect",
            Failure::Request(_) => "request",
        };
        self.metrics_of(route).inspect(|m| m.upstream_error(kind));
        debug!(error = %crate::error_chain(failure.error()), kind, "upstream failed");
        Rejection::UpstreamUnreachable
    }
}

/// The term to stamp on an admitted write, or the refusal.
fn admitted_term(gate: &Gate, resource: &str, fence: &str, presented: &Presented) -> Result<i64, Rejection> {
    let presented_term = match presented {
        Presented::Token(term) => Some(*term),
        Presented::Lease { .. } => gate.term,
    };
    let outcome = match gate.outcome {
        StoreOutcome::Admitted => {
            return gate.term.ok_or(Rejection::Unavailable);
        }
        StoreOutcome::Stale => Outcome::Stale,
        StoreOutcome::FutureTerm => Outcome::FutureTerm,
        StoreOutcome::NotLeader | StoreOutcome::WrongLease => Outcome::NotLeader,
    };
    Err(Rejection::Fenced {
        outcome,
        resource: resource.to_owned(),
        fence: fence.to_owned(),
        presented_term,
        current_term: gate.current_term(),
    })
}

/// S8: header names with `_`. WSGI, CGI and many frameworks read `Fencing_Token` as
/// `Fencing-Token`, so a name with `_` could forge a header the gateway sets, strips or reads. A
/// name that reads as one of those is refused (400); any other name with `_` is removed, as
/// nginx does by default (`underscores_in_headers off`). The URL-rewrite headers are removed too.
fn check_header_names(headers: &mut HeaderMap, route: &Route) -> Result<(), Rejection> {
    for name in &URL_REWRITE_HEADERS {
        headers.remove(name);
    }
    if !headers.keys().any(|name| name.as_str().contains('_')) {
        return Ok(());
    }
    let mut dropped = Vec::new();
    for name in headers.keys().filter(|name| name.as_str().contains('_')) {
        let dashed = name.as_str().replace('_', "-");
        if gateway_owned(&dashed, route) {
            return Err(Rejection::Malformed(format!(
                "the header name {name:?} reads as {dashed:?} to many upstreams: header names with _ are refused"
            )));
        }
        dropped.push(name.clone());
    }
    for name in dropped {
        headers.remove(name);
    }
    Ok(())
}

/// Whether `name` (lower case, with `-`) is a header the gateway sets, strips or reads.
fn gateway_owned(name: &str, route: &Route) -> bool {
    let known = [FENCING_TOKEN, FENCING_RESOURCE, FENCING_LEASE, FENCING_OWNER, REQUEST_ID, HOST, CONTENT_LENGTH];
    known.iter().any(|owned| owned == name)
        || name.starts_with("fencing-")
        || name == http::header::AUTHORIZATION
        || CLIENT_ADDRESS_HEADERS.iter().any(|owned| owned == name)
        || HOP_BY_HOP.iter().any(|owned| owned == name)
        || METHOD_OVERRIDE_HEADERS.iter().any(|owned| owned == name)
        || URL_REWRITE_HEADERS.iter().any(|owned| owned == name)
        || name.starts_with("x-forwarded-")
        || matches!(&route.resource, ResourceNaming::Header(header) if header == name)
}

/// S8: an unfenced request carries no write. It has no body (a body on GET is read by many
/// upstreams as the next request on the connection, unfenced), so neither `Transfer-Encoding`
/// nor a `Content-Length` above 0; and no method-override header.
fn check_unfenced(request: &Request<Incoming>) -> Result<(), Rejection> {
    let headers = request.headers();
    let method = request.method();
    if headers.contains_key(http::header::TRANSFER_ENCODING) {
        return Err(Rejection::Malformed(format!(
            "{method} is not fenced on this route, so it may not carry a body (Transfer-Encoding)"
        )));
    }
    if content_length(headers)?.is_some_and(|length| length > 0) || !http_body::Body::is_end_stream(request.body()) {
        return Err(Rejection::Malformed(format!("{method} is not fenced on this route, so it may not carry a body")));
    }
    if let Some(name) = METHOD_OVERRIDE_HEADERS.iter().find(|name| headers.contains_key(*name)) {
        return Err(Rejection::Malformed(format!(
            "{name} is refused on {method}, which is not fenced on this route: send the write as the method it is"
        )));
    }
    Ok(())
}

/// Removes the hop-by-hop headers, including every header the `Connection` header names.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    if headers.contains_key(CONNECTION) {
        let named: Vec<HeaderName> = headers
            .get_all(CONNECTION)
            .iter()
            .filter_map(|value| value.to_str().ok())
            .flat_map(|value| value.split(','))
            .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
            .collect();
        for name in named {
            headers.remove(name);
        }
    }
    for name in &HOP_BY_HOP {
        headers.remove(name);
    }
}

fn remove_fencing_headers(headers: &mut HeaderMap) {
    for name in [FENCING_TOKEN, FENCING_RESOURCE, FENCING_LEASE, FENCING_OWNER] {
        headers.remove(name);
    }
}

fn content_length(headers: &HeaderMap) -> Result<Option<u64>, Rejection> {
    let mut values = headers.get_all(CONTENT_LENGTH).iter();
    let Some(first) = values.next() else {
        return Ok(None);
    };
    let parse = |value: &HeaderValue| value.to_str().ok().and_then(|text| text.trim().parse::<u64>().ok());
    let length = parse(first).ok_or_else(|| Rejection::Malformed("Content-Length is not a number".to_owned()))?;
    if values.any(|value| parse(value) != Some(length)) {
        return Err(Rejection::Malformed("conflicting Content-Length headers".to_owned()));
    }
    Ok(Some(length))
}

/// The single value of `name`, or `None`; a repeated header is malformed.
fn single<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Result<Option<&'a str>, Rejection> {
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(Rejection::Malformed(format!("{name} must appear at most once")));
    }
    let text = value.to_str().map_err(|_| Rejection::Malformed(format!("{name} is not visible ASCII")))?;
    Ok(Some(text.trim()))
}

/// Parses a `Fencing-Token`: a decimal integer in 1..=2^63-1, nothing else.
pub fn parse_token(text: &str) -> Result<i64, Rejection> {
    let malformed = || {
        Rejection::Malformed(format!("Fencing-Token must be a decimal integer in 1..9223372036854775807, got {text:?}"))
    };
    if text.is_empty() || text.len() > 19 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(malformed());
    }
    match text.parse::<i64>() {
        Ok(term) if term >= 1 => Ok(term),
        _ => Err(malformed()),
    }
}

fn presented(headers: &HeaderMap) -> Result<Presented, Rejection> {
    let token = single(headers, &FENCING_TOKEN)?;
    let lease = single(headers, &FENCING_LEASE)?;
    let owner = single(headers, &FENCING_OWNER)?;
    match (token, lease, owner) {
        // A Fencing-Owner beside a token is not a mode of its own: it is removed, never forwarded.
        (Some(token), None, _) => Ok(Presented::Token(parse_token(token)?)),
        (None, Some(key), Some(owner)) => {
            for (name, value) in [("Fencing-Lease", key), ("Fencing-Owner", owner)] {
                if value.is_empty() || value.chars().count() > 256 {
                    return Err(Rejection::Malformed(format!("{name} must be 1 to 256 characters")));
                }
            }
            Ok(Presented::Lease { key: key.to_owned(), owner: owner.to_owned() })
        }
        (None, None, None) => Err(Rejection::MissingToken),
        (Some(_), _, _) => Err(Rejection::Malformed(
            "present either Fencing-Token or Fencing-Lease with Fencing-Owner, not both".to_owned(),
        )),
        (None, _, _) => Err(Rejection::Malformed("Fencing-Lease and Fencing-Owner go together".to_owned())),
    }
}

fn resource(route: &Route, request: &Request<Incoming>) -> Result<String, Rejection> {
    let name = match &route.resource {
        ResourceNaming::Fixed(name) => name.clone(),
        ResourceNaming::Header(header) => single(request.headers(), header)?
            .ok_or_else(|| Rejection::Malformed(format!("this route names the resource by the {header} header")))?
            .to_owned(),
        ResourceNaming::Segment(n) => request
            .uri()
            .path()
            .split('/')
            .filter(|segment| !segment.is_empty())
            .nth(n - 1)
            .ok_or_else(|| {
                Rejection::Malformed(format!("this route names the resource by path segment {n}, which is missing"))
            })?
            .to_owned(),
    };
    check_resource_name(&name).map_err(Rejection::Malformed)?;
    Ok(name)
}

/// The one character set of resource names, from a path segment, a header or the
/// configuration: `A-Z a-z 0-9 . _ ~ -`, 1 to 256 of them, not `.` or `..`. So a name has one
/// spelling: nothing in it can be percent-encoded, split, or read as a list.
pub fn check_resource_name(name: &str) -> Result<(), String> {
    let allowed = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'~' | b'-');
    if name.is_empty() || name.len() > 256 {
        return Err(format!("a resource name must be 1 to 256 characters, got {}", name.len()));
    }
    if name == "." || name == ".." || !name.bytes().all(allowed) {
        return Err(format!("a resource name is made of A-Z a-z 0-9 . _ ~ - only (and is not . or ..), got {name:?}"));
    }
    Ok(())
}

/// S8: methods. CONNECT and TRACE are never forwarded (405); a method that is not an upper-case
/// token is refused (400), because frameworks that upper-case methods would apply `post` as a
/// POST although it is not one of the route's unfenced methods.
fn check_method(method: &Method) -> Result<(), Rejection> {
    if *method == Method::CONNECT || *method == Method::TRACE {
        return Err(Rejection::MethodNotAllowed);
    }
    if method.as_str().bytes().any(|b| b.is_ascii_lowercase()) {
        return Err(Rejection::Malformed(format!("the method must be an upper-case token, got {:?}", method.as_str())));
    }
    Ok(())
}

/// S8: one spelling per path. Refuses dot segments, empty segments (a trailing slash aside),
/// `;` parameters, backslashes, bytes outside visible ASCII, and percent-encoding of an
/// unreserved character, of `/`, `\` or `;`, or of a control character (NUL included): an
/// upstream that normalises any of them would act on another resource than the fenced one. Its
/// decoded form must be UTF-8 (so no overlong dot) with no `%` and two hex digits left in it (an
/// upstream that decodes twice would read `%252e` as a dot).
pub fn check_path(path: &str) -> Result<(), Rejection> {
    let refuse =
        |why: &str| Err(Rejection::Malformed(format!("the path {path:?} {why}; send it in its one plain spelling")));
    if !path.starts_with('/') {
        return refuse("does not start with /");
    }
    if !path.bytes().all(|b| b.is_ascii_graphic()) {
        return refuse("has a byte that is not visible ASCII (percent-encode it)");
    }
    if path.contains(';') {
        return refuse("has ; parameters");
    }
    if path.contains('\\') {
        return refuse("has a backslash");
    }
    let segments: Vec<&str> = path[1..].split('/').collect();
    for (index, segment) in segments.iter().enumerate() {
        if segment.is_empty() && index + 1 < segments.len() {
            return refuse("has an empty segment");
        }
        if *segment == "." || *segment == ".." {
            return refuse("has a dot segment");
        }
    }
    if !path.contains('%') {
        return Ok(());
    }
    let bytes = path.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while let Some(&byte) = bytes.get(index) {
        if byte != b'%' {
            decoded.push(byte);
            index += 1;
            continue;
        }
        let hex = bytes.get(index + 1..index + 3).and_then(|pair| std::str::from_utf8(pair).ok());
        let Some(value) = hex.and_then(|pair| u8::from_str_radix(pair, 16).ok()) else {
            return refuse("has a malformed percent-encoding");
        };
        if value.is_ascii_alphanumeric() || matches!(value, b'-' | b'.' | b'_' | b'~' | b'/' | b'\\' | b';') {
            return refuse("percent-encodes a character that needs no encoding (or / \\ ;)");
        }
        if value.is_ascii_control() {
            return refuse("percent-encodes a control character (NUL included)");
        }
        decoded.push(value);
        index += 3;
    }
    let Ok(decoded) = String::from_utf8(decoded) else {
        return refuse("decodes to bytes that are not UTF-8 (an overlong or partial sequence)");
    };
    let twice = decoded.as_bytes();
    if twice.windows(3).any(|w| w[0] == b'%' && w[1].is_ascii_hexdigit() && w[2].is_ascii_hexdigit()) {
        return refuse("decodes to another percent-encoding (an upstream that decodes twice reads another path)");
    }
    Ok(())
}

/// Reads a fenced write's whole body, at most `limit` bytes, each piece within `pause` of the
/// last: 413 over the limit, 400 for a body that is malformed, cut off or too slow.
///
/// Each frame is awaited under its own timeout, which arms a timer only when the frame is not
/// there yet (a small body arrives with its head), and reading stops at the body's end.
async fn read_body(mut body: Incoming, limit: u64, pause: Duration) -> Result<Bytes, Rejection> {
    let mut first: Option<Bytes> = None;
    let mut joined: Option<BytesMut> = None;
    let mut length: u64 = 0;
    while !http_body::Body::is_end_stream(&body) {
        let frame = match tokio::time::timeout(pause, body.frame()).await {
            Ok(Some(Ok(frame))) => frame,
            Ok(None) => break,
            Ok(Some(Err(error))) => {
                return Err(Rejection::Malformed(format!(
                    "the request body could not be read ({error}); nothing was decided"
                )));
            }
            Err(_) => {
                return Err(Rejection::Malformed(format!(
                    "the request body paused for longer than {} ms; nothing was decided",
                    pause.as_millis()
                )));
            }
        };
        // Trailers are not forwarded: the gateway sends the body with its length.
        let Ok(data) = frame.into_data() else { continue };
        length = length.saturating_add(data.len() as u64);
        if length > limit {
            return Err(Rejection::BodyTooLarge { limit });
        }
        match (&first, &mut joined) {
            (None, _) => first = Some(data),
            (Some(_), Some(joined)) => joined.extend_from_slice(&data),
            (Some(head), None) => {
                let mut both = BytesMut::with_capacity(head.len() + data.len());
                both.extend_from_slice(head);
                both.extend_from_slice(&data);
                joined = Some(both);
            }
        }
    }
    Ok(match (joined, first) {
        (Some(joined), _) => joined.freeze(),
        (None, Some(only)) => only,
        (None, None) => Bytes::new(),
    })
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

/// A body for a small response the gateway makes itself.
pub fn bytes_body(bytes: impl Into<Bytes>) -> Body {
    Body::from(bytes.into())
}

#[cfg(test)]
mod tests {
    use http::{HeaderMap, HeaderValue};

    use crate::problem::Rejection;
    use crate::proxy::{check_path, parse_token, strip_hop_by_hop};

    fn check_spelling(path: &str, accepted: bool) {
        match (check_path(path), accepted) {
            (Ok(()), true) | (Err(Rejection::Malformed(_)), false) => {}
            (other, _) => panic!("{path:?}: got {other:?}, expected accepted = {accepted}"),
        }
    }

    #[test]
    fn a_path_has_one_spelling_decoded_once_or_twice() {
        for plain in
            ["/", "/ledger/acct-7/e", "/ledger/acct-7/", "/a%20b", "/caf%C3%A9", "/100%25", "/q%3Fx", "/%E2%82%AC"]
        {
            check_spelling(plain, true);
        }
        for other in [
            "ledger",
            "/a/../b",
            "/a/./b",
            "/a//b",
            "/a;b",
            "/a\\b",
            "/a%2Fb",
            "/a%5cb",
            "/a%3Bb",
            "/acct%2D7",
            "/a%zz",
            "/a%2",
            "/a%00b",
            "/a%0Ab",
            "/a%7F",
            "/a%C0%AE",
            "/a%E0%80%AE",
            "/a%ED%A0%80",
            "/a%FF",
            "/caf%E9",
            "/a%252e",
            "/a%252F",
            "/a%2541",
            "/caf\u{e9}",
            "/a b",
            "/a\tb",
        ] {
            check_spelling(other, false);
        }
    }

    fn check_token(text: &str, expected: Option<i64>) {
        match (parse_token(text), expected) {
            (Ok(term), Some(expected)) => assert_eq!(term, expected, "{text:?}"),
            (Err(Rejection::Malformed(_)), None) => {}
            (other, _) => panic!("{text:?}: got {other:?}, expected {expected:?}"),
        }
    }

    #[test]
    fn tokens_are_decimal_integers_from_1_to_i64_max() {
        check_token("1", Some(1));
        check_token("42", Some(42));
        check_token("9223372036854775807", Some(i64::MAX));
        check_token("0007", Some(7));
        for bad in [
            "",
            "0",
            "-1",
            "+1",
            "1.5",
            "1e3",
            "0x10",
            "abc",
            "9223372036854775808",
            "99999999999999999999",
            "1 2",
            "١",
        ] {
            check_token(bad, None);
        }
    }

    #[test]
    fn hop_by_hop_headers_and_those_named_in_connection_are_removed() {
        let mut headers = HeaderMap::new();
        headers.insert("connection", HeaderValue::from_static("keep-alive, x-secret, fencing-token"));
        headers.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        headers.insert("x-secret", HeaderValue::from_static("1"));
        headers.insert("te", HeaderValue::from_static("trailers"));
        headers.insert("fencing-token", HeaderValue::from_static("7"));
        headers.insert("accept", HeaderValue::from_static("*/*"));
        strip_hop_by_hop(&mut headers);
        assert_eq!(headers.len(), 1, "{headers:?}");
        assert!(headers.contains_key("accept"));
    }
}
