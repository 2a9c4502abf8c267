//! The checked configuration: what every other part of the gateway reads, with the defaults.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use http::{Method, Uri};

use crate::security::auth::Clients;
use crate::security::tls::ListenerTls;

/// Where the proxy listens unless configured.
pub const DEFAULT_PROXY_LISTEN: &str = "127.0.0.1:8080";

/// Where the control API listens unless configured.
pub const DEFAULT_CONTROL_LISTEN: &str = "127.0.0.1:9090";

/// The largest request body a fenced or unfenced request may carry.
pub const DEFAULT_BODY_LIMIT_BYTES: u64 = 1024 * 1024;

/// The largest request head (request line and headers).
pub const DEFAULT_MAX_HEADER_BYTES: usize = 16 * 1024;

/// How long a client may take to send its request head.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a client may pause between pieces of its request body.
pub const DEFAULT_BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a write to a client may stay blocked before the connection is closed.
pub const DEFAULT_WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections to Postgres kept for the control API, so proxy load cannot starve renewals.
pub const DEFAULT_CONTROL_POOL_SIZE: usize = 2;

/// The largest control API request body.
pub const CONTROL_BODY_LIMIT_BYTES: usize = 64 * 1024;

/// How many client connections each listener holds at once.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;

/// The most threads `proxy.threads` may ask for.
pub const MAX_PROXY_THREADS: usize = 64;

/// Connections to Postgres.
pub const DEFAULT_POOL_SIZE: usize = 16;

/// Fence-decision round trips out at once; more decisions wait and go in the next batch.
pub const DEFAULT_MAX_BATCHES_IN_FLIGHT: usize = 2;

/// How long a fence decision may take before the write is refused with 503 (S6).
pub const DEFAULT_FENCE_CHECK_TIMEOUT: Duration = Duration::from_secs(1);

/// Added to a new term's settle wait for lower-term bytes still in flight on loopback or a LAN.
pub const DEFAULT_SETTLE_MARGIN: Duration = Duration::from_millis(25);

/// The grant a gateway asks for when `database.grant_ms` is not set: writes of a fence's current
/// term are admitted without Postgres for up to this long after a decision. Capped at half of
/// `database.fence_check_timeout_ms`, and none when that leaves less than the grant floor.
pub const DEFAULT_GRANT: Duration = Duration::from_millis(400);

/// How long connecting to an upstream may take.
pub const DEFAULT_UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// How long an admitted write may take, from admission to the upstream's response head; it is
/// aborted then, and the next term's writes wait for it (S5).
pub const DEFAULT_FORWARD_TIMEOUT: Duration = Duration::from_secs(5);

/// The lease ttl bounds of the control API.
pub const DEFAULT_MIN_TTL: Duration = Duration::from_millis(100);

/// See [`DEFAULT_MIN_TTL`].
pub const DEFAULT_MAX_TTL: Duration = fencing_schema::MAX_TTL;

/// How long shutdown waits for in-flight requests.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// How much two clocks may differ in rate (see [`DatabaseConfig::clock_rate_tolerance`]).
pub const DEFAULT_CLOCK_RATE_TOLERANCE: f64 = 0.01;
/// Where the embedded Postgres keeps its data when no database URL is configured.
pub const DEFAULT_EMBEDDED_DATA_DIR: &str = ".fencing-gateway/pgdata";

/// The whole configuration, checked.
#[derive(Debug, Clone)]
pub struct Config {
    /// The proxy listener: leader writes in, fenced writes out.
    pub proxy: ProxyConfig,
    /// The control listener: the lease API, fences, metrics, health.
    pub control: ControlConfig,
    /// The fence store.
    pub database: DatabaseConfig,
    /// How upstreams are contacted.
    pub upstream: UpstreamConfig,
    /// How long shutdown waits for in-flight requests.
    pub shutdown_grace: Duration,
    /// The routes, longest prefix first.
    pub routes: Vec<Route>,
    /// Who may call the control API and write through the proxy; empty: development mode,
    /// loopback listeners only.
    pub clients: Clients,
    /// What is allowed but worth saying at start-up (logged as warnings).
    pub warnings: Vec<String>,
}

/// See [`Config::proxy`].
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// The address to listen on.
    pub listen: SocketAddr,
    /// Requests with a larger body get 413; the body is never forwarded past this.
    pub body_limit_bytes: u64,
    /// Request heads larger than this get 431.
    pub max_header_bytes: usize,
    /// A client that has not sent its whole request head by then is disconnected.
    pub header_read_timeout: Duration,
    /// A client that pauses longer than this inside its body has its request aborted.
    pub body_read_timeout: Duration,
    /// Connections held at once, per listener; one more is answered 503 and closed.
    pub max_connections: usize,
    /// Threads serving the proxy listener, each a single-threaded runtime; 0 serves it on the
    /// gateway's shared multi-threaded runtime. Default: 0 without grants, else one per CPU the
    /// process may use.
    pub threads: usize,
    /// Each proxy thread stays on one CPU of those the process may use (thread i on the i-th).
    /// Default: on when there are proxy threads and no more of them than such CPUs.
    pub pin_threads: bool,
    /// A write to a client blocked this long closes its connection (both listeners).
    pub write_timeout: Duration,
    /// When not empty, the only names `Host` may carry (without the port).
    pub hosts: Vec<String>,
    /// Peers whose claims about the client (`Forwarded`, `X-Forwarded-*`, `X-Real-IP`, the
    /// scheme, TLS and identity headers of proxies and frameworks) are passed on; from anyone
    /// else they are removed.
    pub trusted_proxies: Vec<std::net::IpAddr>,
    /// More header names (lower case) removed from requests of peers outside
    /// `trusted_proxies`, for what an upstream of one's own trusts.
    pub client_claim_headers: Vec<http::HeaderName>,
    /// A sane `X-Request-Id` (1 to 64 visible ASCII characters) is kept from any client, not
    /// only from `trusted_proxies` (default off: the gateway makes its own, so a client cannot
    /// make its refusals carry another request's id).
    pub client_request_ids: bool,
    /// TLS on this listener.
    pub tls: Option<ListenerTls>,
}

/// See [`Config::control`].
#[derive(Debug, Clone)]
pub struct ControlConfig {
    /// The address to listen on.
    pub listen: SocketAddr,
    /// The shortest ttl the lease API accepts.
    pub min_ttl: Duration,
    /// The longest ttl the lease API accepts.
    pub max_ttl: Duration,
    /// When not empty, the only names `Host` may carry (without the port).
    pub hosts: Vec<String>,
    /// TLS on this listener.
    pub tls: Option<ListenerTls>,
    /// The longest `wait` of a watch (`GET ...?wait=&after=`); a longer one is cut to it.
    pub watch_max_wait: Duration,
    /// Watches waiting at once on this gateway; past it, 429.
    pub max_watchers: usize,
    /// Watches waiting at once per client (per token; all anonymous callers share one count).
    pub max_watchers_per_client: usize,
}

/// The default longest `wait` of a watch.
pub const DEFAULT_WATCH_MAX_WAIT: Duration = Duration::from_secs(60);
/// The default cap on watches waiting at once on a gateway (each holds a connection of the
/// control listener, which has `proxy.max_connections`: at most half of them).
pub const DEFAULT_MAX_WATCHERS: usize = 500;
/// The default cap on watches waiting at once per client.
pub const DEFAULT_MAX_WATCHERS_PER_CLIENT: usize = 100;

/// See [`Config::database`].
#[derive(Debug, Clone)]
pub struct DatabaseConfig {
    /// The fence store; `None` starts an embedded local Postgres under `data_dir`.
    pub url: Option<String>,
    /// Connections to Postgres.
    pub pool_size: usize,
    /// Connections to Postgres of the control API's own, beside `pool_size`.
    pub control_pool_size: usize,
    /// A fence decision not made within this is refused with 503 (S6).
    pub fence_check_timeout: Duration,
    /// Fence-decision round trips out at once (at most `pool_size`); decisions arriving while
    /// they are all out wait and share the next round trip.
    pub max_batches_in_flight: usize,
    /// Where the embedded Postgres keeps its data.
    pub data_dir: PathBuf,
    /// How long a grant is asked for (zero: none, every fenced write asks Postgres). While it
    /// holds a grant on a resource, the gateway admits writes of its current term without a
    /// round trip; a new term for the resource waits until every grant on the old one ended.
    pub grant: Duration,
    /// How much two clocks (this gateway's, the store's, another gateway's) may differ in rate,
    /// as a fraction: a grant's local length is shortened by it and a settle wait stretched by it,
    /// and a clock seen to differ by more drops this gateway's grants.
    pub clock_rate_tolerance: f64,
    /// Whether `serve` warns while the store is a primary without a synchronous standby.
    pub standby_check: StandbyCheck,
}

/// See [`DatabaseConfig::standby_check`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StandbyCheck {
    /// Warn at start, and again when it changes, while a failover could lose answered decisions.
    Warn,
    /// Say nothing: this Postgres never fails over (or its HA is checked elsewhere).
    Off,
}

/// See [`Config::upstream`].
#[derive(Debug, Clone)]
pub struct UpstreamConfig {
    /// Connecting to an upstream may take this long.
    pub connect_timeout: Duration,
    /// An admitted write must have its response head within this of its admission.
    pub forward_timeout: Duration,
    /// Added to a new term's settle wait: bytes of a lower-term write that its gateway sent
    /// just before its deadline may still be on their way to the upstream (S5).
    pub settle_margin: Duration,
    /// The CAs `https://` upstreams are verified against; `None`: the system's roots.
    pub ca_file: Option<PathBuf>,
}

/// How a route names the resource a write changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResourceNaming {
    /// Every write of the route changes this one resource.
    Fixed(String),
    /// The resource is the value of this request header.
    Header(http::HeaderName),
    /// The resource is the Nth path segment, counting from 1.
    Segment(usize),
}

/// One configured route.
#[derive(Debug, Clone)]
pub struct Route {
    /// The path prefix, matched at segment boundaries; also the route's metric label.
    pub prefix: String,
    /// The upstream's scheme and authority, and an optional base path.
    pub upstream: Uri,
    /// How the resource is named.
    pub resource: ResourceNaming,
    /// When set, the route's resources are bound to this lease key (S4).
    pub lease: Option<String>,
    /// The methods that pass straight through, unfenced; every other method is fenced (S8).
    pub unfenced_methods: Vec<Method>,
    /// The fenced methods that may carry a body (default POST, PUT, PATCH); a write of another
    /// method with a body is refused (S8: an upstream that reads no body for that method would
    /// read it as the next request).
    pub body_methods: Vec<Method>,
    /// Where the route's unfenced requests go when set: to the cluster's followers within the
    /// lag bound, else to the leader. Unset: to `upstream`.
    pub reads: Option<Reads>,
}

/// A route's reads from followers (`[routes.reads]`): an unfenced request goes to a live member
/// of `cluster` that follows `stream` and whose reported lag is within `max_lag`, else to the
/// leader (the holder of `leader_lease`, at the `read_url` of its value; without it, the route's
/// upstream).
#[derive(Debug, Clone)]
pub struct Reads {
    /// The membership cluster whose nodes announce `{"read_url", "follower"}` in their metadata.
    pub cluster: String,
    /// The fenced log the followers tail; its follower reports give their lag.
    pub stream: String,
    /// The staleness a follower's read may have: its lag in time and the age of its last report
    /// must both be within it.
    pub max_lag: Duration,
    /// The lease whose holder is the leader (its value's `read_url`); `None`: the route's upstream.
    pub leader_lease: Option<String>,
    /// The hosts (as written in a `read_url`) reads may be sent to; default the loopback names.
    pub allow_hosts: Vec<String>,
}

/// The hosts a route's reads may go to unless `allow_hosts` says otherwise.
pub const DEFAULT_READ_HOSTS: [&str; 3] = ["127.0.0.1", "[::1]", "localhost"];

/// The largest `max_lag_ms`: an hour.
pub const MAX_READ_LAG_MS: u64 = 3_600_000;

/// A bad configuration: every problem found, each naming its key.
#[derive(Debug, thiserror::Error)]
#[error("{}", problems.join("\n"))]
pub struct ConfigError {
    /// One line per bad key: `key: reason`.
    pub problems: Vec<String>,
}
