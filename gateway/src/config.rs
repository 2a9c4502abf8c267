//! The gateway's configuration: a TOML file, overridden by environment variables, parsed and
//! checked in one place. Every bad key is reported, with the reason, before anything starts.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use http::{Method, Uri};
use serde::Deserialize;

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
    pub clients: crate::auth::Clients,
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
    /// Peers whose `Forwarded`, `X-Forwarded-*` and `X-Real-IP` are passed on; from anyone
    /// else they are removed.
    pub trusted_proxies: Vec<std::net::IpAddr>,
    /// TLS on this listener.
    pub tls: Option<crate::tls::ListenerTls>,
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
    pub tls: Option<crate::tls::ListenerTls>,
}

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
}

impl Route {
    /// The name of the fence a write to `resource` through this route is decided on: the
    /// resource itself when the route is bound to a lease (so a protected table bound to the
    /// same lease shares it), else `<prefix>/<resource>`, the route's own namespace, so an
    /// unbound route can never create, raise or poison a fence another route or a table uses
    /// (S8). Resource names never contain `/`, so no two routes' namespaces meet.
    pub fn fence_name(&self, resource: &str) -> String {
        match &self.lease {
            Some(_) => resource.to_owned(),
            None => format!("{}/{resource}", self.prefix.trim_end_matches('/')),
        }
    }

    /// True when `path` falls under this route's prefix.
    pub fn matches(&self, path: &str) -> bool {
        let prefix = self.prefix.trim_end_matches('/');
        prefix.is_empty() || path == prefix || path.strip_prefix(prefix).is_some_and(|rest| rest.starts_with('/'))
    }
}

/// A bad configuration: every problem found, each naming its key.
#[derive(Debug, thiserror::Error)]
#[error("{}", problems.join("\n"))]
pub struct ConfigError {
    /// One line per bad key: `key: reason`.
    pub problems: Vec<String>,
}

/// Where environment overrides come from: the process environment, or a map in tests.
pub trait Environment {
    /// Every variable, name and value.
    fn vars(&self) -> Vec<(String, String)>;
}

/// The process environment.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessEnvironment;

impl Environment for ProcessEnvironment {
    fn vars(&self) -> Vec<(String, String)> {
        std::env::vars_os()
            .filter_map(|(name, value)| Some((name.into_string().ok()?, value.into_string().ok()?)))
            .collect()
    }
}

impl Environment for BTreeMap<String, String> {
    fn vars(&self) -> Vec<(String, String)> {
        self.iter().map(|(name, value)| (name.clone(), value.clone())).collect()
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawFile {
    proxy: RawProxy,
    control: RawControl,
    database: RawDatabase,
    upstream: RawUpstream,
    shutdown: RawShutdown,
    routes: Vec<RawRoute>,
    clients: Vec<RawClient>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawClient {
    name: String,
    token_sha256: String,
    #[serde(default)]
    leases: Vec<String>,
    #[serde(default)]
    read: bool,
    #[serde(default)]
    routes: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawProxy {
    listen: Option<String>,
    body_limit_bytes: Option<u64>,
    max_header_bytes: Option<u64>,
    header_read_timeout_ms: Option<u64>,
    body_read_timeout_ms: Option<u64>,
    max_connections: Option<u64>,
    threads: Option<u64>,
    pin_threads: Option<bool>,
    write_timeout_ms: Option<u64>,
    hosts: Option<Vec<String>>,
    trusted_proxies: Option<Vec<String>>,
    tls: Option<RawTls>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTls {
    cert: String,
    key: String,
    client_ca: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawControl {
    listen: Option<String>,
    min_ttl_ms: Option<u64>,
    max_ttl_ms: Option<u64>,
    hosts: Option<Vec<String>>,
    tls: Option<RawTls>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawDatabase {
    url: Option<String>,
    pool_size: Option<u64>,
    control_pool_size: Option<u64>,
    max_batches_in_flight: Option<u64>,
    fence_check_timeout_ms: Option<u64>,
    grant_ms: Option<u64>,
    data_dir: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawUpstream {
    connect_timeout_ms: Option<u64>,
    forward_timeout_ms: Option<u64>,
    settle_margin_ms: Option<u64>,
    ca_file: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawShutdown {
    grace_period_ms: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoute {
    prefix: String,
    upstream: String,
    resource: RawResource,
    lease: Option<String>,
    unfenced_methods: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "lowercase")]
enum RawResource {
    Fixed(String),
    Header(String),
    Segment(i64),
}

/// The environment variables that override a key, and the key: `FENCING_<SECTION>_<KEY>`,
/// plus `DATABASE_URL` for `database.url`.
const SECTIONS: [&str; 5] = ["proxy", "control", "database", "upstream", "shutdown"];

impl Config {
    /// Parses `text` (TOML) with the overrides of `env`, and checks every value.
    pub fn parse(text: &str, env: &dyn Environment) -> Result<Config, ConfigError> {
        let mut table: toml::Table =
            toml::from_str(text).map_err(|error| ConfigError { problems: vec![format!("config file: {error}")] })?;
        apply_environment(&mut table, env).map_err(|problems| ConfigError { problems })?;
        let raw: RawFile = toml::Value::Table(table)
            .try_into()
            .map_err(|error: toml::de::Error| ConfigError { problems: vec![format!("config: {error}")] })?;
        validate(raw)
    }

    /// Reads and parses the file at `path` (or only the environment when `None`).
    pub fn load(path: Option<&std::path::Path>, env: &dyn Environment) -> Result<Config, ConfigError> {
        let text = match path {
            Some(path) => std::fs::read_to_string(path)
                .map_err(|error| ConfigError { problems: vec![format!("--config {}: {error}", path.display())] })?,
            None => String::new(),
        };
        Config::parse(&text, env)
    }

    /// The route for `path`: the longest matching prefix.
    pub fn route(&self, path: &str) -> Option<&Route> {
        self.route_index(path).map(|index| &self.routes[index])
    }

    /// The index in `routes` of the route for `path` (see [`Config::route`]).
    pub fn route_index(&self, path: &str) -> Option<usize> {
        self.routes.iter().position(|route| route.matches(path))
    }
}

fn apply_environment(table: &mut toml::Table, env: &dyn Environment) -> Result<(), Vec<String>> {
    // (priority, section, key, value): FENCING_DATABASE_URL wins over DATABASE_URL. A secret
    // may come from a file instead: `DATABASE_URL_FILE`, `FENCING_DATABASE_URL_FILE`.
    let mut overrides: Vec<(u8, String, String, String)> = Vec::new();
    let mut problems = Vec::new();
    let vars = env.vars();
    for (name, value) in &vars {
        let priority = match name.as_str() {
            "DATABASE_URL_FILE" => 0,
            "FENCING_DATABASE_URL_FILE" => 1,
            _ => continue,
        };
        let plain = name.trim_end_matches("_FILE");
        if vars.iter().any(|(other, _)| other == plain) {
            problems.push(format!("{name}: set {plain} or {name}, not both"));
            continue;
        }
        match std::fs::read_to_string(value) {
            Ok(text) => overrides.push((priority, "database".to_owned(), "url".to_owned(), text.trim().to_owned())),
            Err(error) => problems.push(format!("{name}: {value}: {error}")),
        }
    }
    for (name, value) in vars {
        if name == "DATABASE_URL" {
            overrides.push((0, "database".to_owned(), "url".to_owned(), value));
            continue;
        }
        if name.ends_with("_FILE") {
            continue;
        }
        let Some(rest) = name.strip_prefix("FENCING_") else {
            continue;
        };
        let rest = rest.to_ascii_lowercase();
        for section in SECTIONS {
            if let Some(key) = rest.strip_prefix(section).and_then(|k| k.strip_prefix('_')) {
                overrides.push((1, section.to_owned(), key.to_owned(), value.clone()));
            }
        }
    }
    overrides.sort_by_key(|(priority, ..)| *priority);
    for (_, section, key, value) in overrides {
        let entry = table.entry(section).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        if let toml::Value::Table(section) = entry {
            let typed = match value.parse::<i64>() {
                Ok(number) => toml::Value::Integer(number),
                Err(_) => toml::Value::String(value),
            };
            section.insert(key, typed);
        }
    }
    if problems.is_empty() { Ok(()) } else { Err(problems) }
}

fn ms(value: u64) -> Duration {
    Duration::from_millis(value)
}

fn validate(raw: RawFile) -> Result<Config, ConfigError> {
    let mut problems = Vec::new();
    let mut positive_ms = |key: &str, value: Option<u64>, default: Duration| -> Duration {
        match value {
            Some(0) => {
                problems.push(format!("{key}: must be positive"));
                default
            }
            Some(value) => ms(value),
            None => default,
        }
    };
    let header_read_timeout =
        positive_ms("proxy.header_read_timeout_ms", raw.proxy.header_read_timeout_ms, DEFAULT_HEADER_READ_TIMEOUT);
    let body_read_timeout =
        positive_ms("proxy.body_read_timeout_ms", raw.proxy.body_read_timeout_ms, DEFAULT_BODY_READ_TIMEOUT);
    let write_timeout = positive_ms("proxy.write_timeout_ms", raw.proxy.write_timeout_ms, DEFAULT_WRITE_TIMEOUT);
    let min_ttl = positive_ms("control.min_ttl_ms", raw.control.min_ttl_ms, DEFAULT_MIN_TTL);
    let max_ttl = positive_ms("control.max_ttl_ms", raw.control.max_ttl_ms, DEFAULT_MAX_TTL);
    let fence_check_timeout = positive_ms(
        "database.fence_check_timeout_ms",
        raw.database.fence_check_timeout_ms,
        DEFAULT_FENCE_CHECK_TIMEOUT,
    );
    let grant = Duration::from_millis(raw.database.grant_ms.unwrap_or(0));
    let connect_timeout =
        positive_ms("upstream.connect_timeout_ms", raw.upstream.connect_timeout_ms, DEFAULT_UPSTREAM_CONNECT_TIMEOUT);
    let forward_timeout =
        positive_ms("upstream.forward_timeout_ms", raw.upstream.forward_timeout_ms, DEFAULT_FORWARD_TIMEOUT);
    let shutdown_grace = positive_ms("shutdown.grace_period_ms", raw.shutdown.grace_period_ms, DEFAULT_SHUTDOWN_GRACE);

    let mut address = |key: &str, value: Option<String>, default: &str| -> SocketAddr {
        let text = value.unwrap_or_else(|| default.to_owned());
        text.parse().unwrap_or_else(|error| {
            problems.push(format!("{key}: {text:?} is not an IP address and port: {error}"));
            SocketAddr::from(([127, 0, 0, 1], 0))
        })
    };
    let proxy_listen = address("proxy.listen", raw.proxy.listen, DEFAULT_PROXY_LISTEN);
    let control_listen = address("control.listen", raw.control.listen, DEFAULT_CONTROL_LISTEN);
    if proxy_listen == control_listen && proxy_listen.port() != 0 {
        problems.push(format!("control.listen: must differ from proxy.listen ({proxy_listen})"));
    }
    if min_ttl > max_ttl {
        problems.push(format!("control.min_ttl_ms: {min_ttl:?} is above control.max_ttl_ms {max_ttl:?}"));
    }
    if max_ttl > fencing_schema::MAX_TTL {
        problems.push(format!("control.max_ttl_ms: at most {} ms", fencing_schema::MAX_TTL.as_millis()));
    }
    if forward_timeout > Duration::from_secs(3600) {
        problems.push("upstream.forward_timeout_ms: at most 3600000".to_owned());
    }
    let settle_margin = match raw.upstream.settle_margin_ms {
        None => DEFAULT_SETTLE_MARGIN,
        Some(ms) if ms <= 10_000 => Duration::from_millis(ms),
        Some(_) => {
            problems.push("upstream.settle_margin_ms: at most 10000".to_owned());
            DEFAULT_SETTLE_MARGIN
        }
    };
    if !grant.is_zero() {
        // A new term waits up to one grant inside its decision; the gateway renews a grant with
        // half of it left, and the store renews only under three quarters: the margin and a round
        // trip must fit in that quarter.
        let floor = Duration::from_millis(100).max(settle_margin * 8);
        if grant < floor {
            problems.push(format!(
                "database.grant_ms: 0 (no grants) or at least {} ms (8 x upstream.settle_margin_ms, and 100)",
                floor.as_millis()
            ));
        }
        if grant * 2 > fence_check_timeout {
            problems.push(format!(
                "database.grant_ms: at most half of database.fence_check_timeout_ms ({} ms): a new term waits up to one grant inside its fence decision",
                fence_check_timeout.as_millis()
            ));
        }
        if grant > Duration::from_secs(60) {
            problems.push("database.grant_ms: at most 60000".to_owned());
        }
    }

    let body_limit_bytes = raw.proxy.body_limit_bytes.unwrap_or(DEFAULT_BODY_LIMIT_BYTES);
    let max_header_bytes = match raw.proxy.max_header_bytes.map(usize::try_from) {
        None => DEFAULT_MAX_HEADER_BYTES,
        Some(Ok(bytes)) if bytes >= 8192 => bytes,
        Some(_) => {
            problems.push("proxy.max_header_bytes: must be at least 8192".to_owned());
            DEFAULT_MAX_HEADER_BYTES
        }
    };
    let max_connections = match raw.proxy.max_connections.map(usize::try_from) {
        None => DEFAULT_MAX_CONNECTIONS,
        Some(Ok(n)) if n > 0 => n,
        Some(_) => {
            problems.push("proxy.max_connections: must be positive".to_owned());
            DEFAULT_MAX_CONNECTIONS
        }
    };
    // Without grants every write waits for a batched decision on the shared runtime, where
    // work stealing keeps that hop short; with grants a write stays on its thread.
    let threads = match raw.proxy.threads.map(usize::try_from) {
        None if grant.is_zero() => 0,
        None => std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get).min(MAX_PROXY_THREADS),
        Some(Ok(n)) if n <= MAX_PROXY_THREADS => n,
        Some(_) => {
            problems.push(format!("proxy.threads: 0 (the shared runtime) to {MAX_PROXY_THREADS}"));
            0
        }
    };
    // Per-CPU runtimes, one on each CPU: no thread is moved onto another's CPU (where the two
    // would take turns, a scheduler tick each, while the other CPU runs something else).
    let pin_threads = raw.proxy.pin_threads.unwrap_or(threads > 0 && threads <= crate::server::allowed_cpus().len());
    let pool_size = match raw.database.pool_size.map(usize::try_from) {
        None => DEFAULT_POOL_SIZE,
        Some(Ok(n)) if (1..=1000).contains(&n) => n,
        Some(_) => {
            problems.push("database.pool_size: must be between 1 and 1000".to_owned());
            DEFAULT_POOL_SIZE
        }
    };
    let control_pool_size = match raw.database.control_pool_size.map(usize::try_from) {
        None => DEFAULT_CONTROL_POOL_SIZE,
        Some(Ok(n)) if (1..=100).contains(&n) => n,
        Some(_) => {
            problems.push("database.control_pool_size: must be between 1 and 100".to_owned());
            DEFAULT_CONTROL_POOL_SIZE
        }
    };
    let max_batches_in_flight = match raw.database.max_batches_in_flight.map(usize::try_from) {
        None => DEFAULT_MAX_BATCHES_IN_FLIGHT.min(pool_size),
        Some(Ok(n)) if n >= 1 && n <= pool_size => n,
        Some(_) => {
            problems.push(format!(
                "database.max_batches_in_flight: must be between 1 and database.pool_size ({pool_size})"
            ));
            1
        }
    };
    let url = raw.database.url.filter(|url| !url.is_empty());
    if let Some(url) = &url
        && let Err(error) = crate::tls::Database::parse(url)
    {
        problems.push(error);
    }
    let mut listener_tls = |key: &str, raw: Option<RawTls>| -> Option<crate::tls::ListenerTls> {
        let tls = crate::tls::ListenerTls {
            cert: PathBuf::from(raw.as_ref()?.cert.clone()),
            key: PathBuf::from(raw.as_ref()?.key.clone()),
            client_ca: raw.as_ref()?.client_ca.clone().map(PathBuf::from),
        };
        match crate::tls::server_config(&tls) {
            Ok(_) => Some(tls),
            Err(error) => {
                problems.push(format!("{key}: {error}"));
                None
            }
        }
    };
    let proxy_tls = listener_tls("proxy.tls", raw.proxy.tls);
    let control_tls = listener_tls("control.tls", raw.control.tls);
    let ca_file = raw.upstream.ca_file.map(PathBuf::from);

    let mut routes = Vec::new();
    for (index, route) in raw.routes.into_iter().enumerate() {
        if let Some(route) = validate_route(index, route, &mut problems) {
            routes.push(route);
        }
    }
    for (i, a) in routes.iter().enumerate() {
        if routes[..i].iter().any(|b| b.prefix.trim_end_matches('/') == a.prefix.trim_end_matches('/')) {
            problems.push(format!("routes[{i}].prefix: {:?} is configured twice", a.prefix));
        }
    }
    // Longest prefix first, so the first match is the longest.
    routes.sort_by_key(|route| std::cmp::Reverse(route.prefix.trim_end_matches('/').len()));
    let warnings = check_bindings(&routes, &mut problems);
    let any_https = routes.iter().any(|route| route.upstream.scheme_str() == Some("https"));
    if let Err(error) = crate::tls::upstream_client_config(ca_file.as_deref(), any_https) {
        problems.push(format!("upstream.ca_file: {error}"));
    }
    let clients = validate_clients(raw.clients, &mut problems);
    let mut warnings = warnings;
    for (index, client) in clients.iter().enumerate() {
        for route in &client.routes {
            match routes.iter().find(|r| r.prefix.trim_end_matches('/') == route.trim_end_matches('/')) {
                None => problems.push(format!("clients[{index}].routes: {route:?} is no configured route prefix")),
                Some(r) if r.lease.is_some() => problems.push(format!(
                    "clients[{index}].routes: {route:?} is bound to a lease: allow the lease in `leases` instead"
                )),
                Some(_) => {}
            }
        }
        for other in &clients[index + 1..] {
            let shared = client
                .leases
                .iter()
                .find(|a| other.leases.iter().any(|b| crate::auth::glob_match(a, b) || crate::auth::glob_match(b, a)));
            if let Some(pattern) = shared {
                warnings.push(format!(
                    "clients {:?} and {:?} may both use lease keys matching {pattern:?}: either can write under \
                     such a lease with its current term (only renew, release and stamp mode are the acquirer's own)",
                    client.name, other.name
                ));
            }
        }
    }
    if clients.is_empty() {
        // Development mode: nobody authenticates, so nobody off this host may connect.
        for (key, addr) in [("proxy.listen", proxy_listen), ("control.listen", control_listen)] {
            if !addr.ip().is_loopback() {
                problems.push(format!(
                    "{key}: {addr} is not a loopback address; listening beyond this host needs [[clients]] \
                     (bearer tokens), see the README's security model"
                ));
            }
        }
    }
    let hosts = |key: &str, names: Option<Vec<String>>, problems: &mut Vec<String>| -> Vec<String> {
        let names = names.unwrap_or_default();
        for name in &names {
            let bracketed_v6 = name.starts_with('[') && name.ends_with(']');
            if name.is_empty() || name.contains(['/', ' ', '@']) || (name.contains(':') && !bracketed_v6) {
                problems.push(format!("{key}: {name:?} must be a host name without port"));
            }
        }
        names.into_iter().map(|name| name.to_ascii_lowercase()).collect()
    };
    let mut proxy_hosts = hosts("proxy.hosts", raw.proxy.hosts, &mut problems);
    let mut control_hosts = hosts("control.hosts", raw.control.hosts, &mut problems);
    if clients.is_empty() {
        // Development mode: nobody authenticates, so a web page that rebinds its own name to
        // 127.0.0.1 must not reach the listeners: only loopback names are served.
        for (names, listen) in [(&mut proxy_hosts, proxy_listen), (&mut control_hosts, control_listen)] {
            if names.is_empty() {
                names.extend(["localhost", "127.0.0.1", "[::1]"].map(str::to_owned));
                let ip = match listen.ip() {
                    std::net::IpAddr::V6(v6) => format!("[{v6}]"),
                    std::net::IpAddr::V4(v4) => v4.to_string(),
                };
                if !names.contains(&ip) {
                    names.push(ip);
                }
            }
        }
    }
    let trusted_proxies = raw
        .proxy
        .trusted_proxies
        .unwrap_or_default()
        .iter()
        .filter_map(|text| match text.parse::<std::net::IpAddr>() {
            Ok(ip) => Some(ip),
            Err(_) => {
                problems.push(format!("proxy.trusted_proxies: {text:?} is not an IP address"));
                None
            }
        })
        .collect();

    if !problems.is_empty() {
        return Err(ConfigError { problems });
    }
    Ok(Config {
        proxy: ProxyConfig {
            listen: proxy_listen,
            body_limit_bytes,
            max_header_bytes,
            header_read_timeout,
            body_read_timeout,
            max_connections,
            threads,
            pin_threads,
            write_timeout,
            hosts: proxy_hosts,
            trusted_proxies,
            tls: proxy_tls,
        },
        control: ControlConfig { listen: control_listen, min_ttl, max_ttl, hosts: control_hosts, tls: control_tls },
        database: DatabaseConfig {
            url,
            pool_size,
            control_pool_size,
            fence_check_timeout,
            max_batches_in_flight,
            grant,
            data_dir: PathBuf::from(raw.database.data_dir.unwrap_or_else(|| DEFAULT_EMBEDDED_DATA_DIR.to_owned())),
        },
        upstream: UpstreamConfig { connect_timeout, forward_timeout, settle_margin, ca_file },
        shutdown_grace,
        routes,
        clients: crate::auth::Clients::new(clients),
        warnings,
    })
}

fn validate_clients(raw: Vec<RawClient>, problems: &mut Vec<String>) -> Vec<crate::auth::Client> {
    let mut clients: Vec<crate::auth::Client> = Vec::new();
    for (index, client) in raw.into_iter().enumerate() {
        let key = |name: &str| format!("clients[{index}].{name}");
        let before = problems.len();
        if !crate::auth::valid_client_name(&client.name) {
            problems.push(format!("{}: {:?} must be 1 to 64 of A-Z a-z 0-9 . _ -", key("name"), client.name));
        }
        if clients.iter().any(|c| c.name == client.name) {
            problems.push(format!("{}: {:?} is configured twice", key("name"), client.name));
        }
        let hash = crate::auth::parse_sha256_hex(&client.token_sha256.to_ascii_lowercase());
        if hash.is_none() {
            problems.push(format!(
                "{}: must be 64 hex digits, the SHA-256 of the token (never the token itself; \
                 `fencing-gateway token` makes one)",
                key("token_sha256")
            ));
        }
        if let Some(hash) = hash
            && clients.iter().any(|c| c.token_sha256 == hash)
        {
            problems.push(format!("{}: two clients share one token", key("token_sha256")));
        }
        for pattern in &client.leases {
            if pattern.is_empty() || pattern.chars().count() > 256 {
                problems.push(format!("{}: {pattern:?} must be 1 to 256 characters", key("leases")));
            }
        }
        if problems.len() == before
            && let Some(hash) = hash
        {
            clients.push(crate::auth::Client {
                name: client.name,
                token_sha256: hash,
                leases: client.leases,
                read: client.read,
                routes: client.routes,
            });
        }
    }
    clients
}

/// Two routes bound to different leases that can name one resource would fight over its
/// binding (a write never rebinds, so the second route's writes would all be refused): the same
/// fixed name is a configuration error; a route that names resources by header or segment can
/// name anything, so beside another lease it is a warning.
fn check_bindings(routes: &[Route], problems: &mut Vec<String>) -> Vec<String> {
    let mut warnings = Vec::new();
    for (i, a) in routes.iter().enumerate() {
        for b in &routes[i + 1..] {
            let (Some(lease_a), Some(lease_b)) = (&a.lease, &b.lease) else { continue };
            if lease_a == lease_b {
                continue;
            }
            match (&a.resource, &b.resource) {
                (ResourceNaming::Fixed(x), ResourceNaming::Fixed(y)) if x == y => problems.push(format!(
                    "routes {:?} and {:?} bind the resource {x:?} to different leases ({lease_a:?}, {lease_b:?})",
                    a.prefix, b.prefix
                )),
                (ResourceNaming::Fixed(_), ResourceNaming::Fixed(_)) => {}
                _ => warnings.push(format!(
                    "routes {:?} (lease {lease_a:?}) and {:?} (lease {lease_b:?}) can name the same resource; \
                     a resource stays bound to the lease that first wrote it, and the other route's writes to it \
                     are refused (rebinding is `fencing-gateway admin rebind`)",
                    a.prefix, b.prefix
                )),
            }
        }
    }
    warnings
}

fn validate_route(index: usize, raw: RawRoute, problems: &mut Vec<String>) -> Option<Route> {
    let key = |name: &str| format!("routes[{index}].{name}");
    let before = problems.len();
    if !raw.prefix.starts_with('/') {
        problems.push(format!("{}: {:?} must start with /", key("prefix"), raw.prefix));
    }
    let upstream = match raw.upstream.parse::<Uri>() {
        Ok(uri)
            if matches!(uri.scheme_str(), Some("http" | "https"))
                && uri.authority().is_some()
                && uri.query().is_none() =>
        {
            Some(uri)
        }
        Ok(_) => {
            problems.push(format!(
                "{}: {:?} must be an http:// or https:// URL with a host and no query",
                key("upstream"),
                raw.upstream
            ));
            None
        }
        Err(error) => {
            problems.push(format!("{}: {:?}: {error}", key("upstream"), raw.upstream));
            None
        }
    };
    let resource = match raw.resource {
        RawResource::Fixed(name) => match crate::proxy::check_resource_name(&name) {
            Ok(()) => Some(ResourceNaming::Fixed(name)),
            Err(reason) => {
                problems.push(format!("{}: {reason}", key("resource")));
                None
            }
        },
        RawResource::Header(name) => match http::HeaderName::from_bytes(name.as_bytes()) {
            Ok(header) => Some(ResourceNaming::Header(header)),
            Err(_) => {
                problems.push(format!("{}: {name:?} is not a header name", key("resource")));
                None
            }
        },
        RawResource::Segment(n) if n >= 1 => usize::try_from(n).ok().map(ResourceNaming::Segment),
        RawResource::Segment(n) => {
            problems.push(format!("{}: segment must be 1 or more, got {n}", key("resource")));
            None
        }
    };
    if let Some(lease) = &raw.lease
        && (lease.is_empty() || lease.chars().count() > 256)
    {
        problems.push(format!("{}: a lease key must be 1 to 256 characters", key("lease")));
    }
    let unfenced_methods = match raw.unfenced_methods {
        None => vec![Method::GET, Method::HEAD, Method::OPTIONS],
        Some(names) => names
            .iter()
            .filter_map(|name| match Method::from_bytes(name.as_bytes()) {
                Ok(method)
                    if method != Method::CONNECT
                        && method != Method::TRACE
                        && !name.bytes().any(|b| b.is_ascii_lowercase()) =>
                {
                    Some(method)
                }
                _ => {
                    problems.push(format!(
                        "{}: {name:?} is not an upper-case method the proxy forwards",
                        key("unfenced_methods")
                    ));
                    None
                }
            })
            .collect(),
    };
    if raw.prefix.starts_with('/') && crate::proxy::check_path(&raw.prefix).is_err() {
        problems.push(format!(
            "{}: {:?} must be a plain path (no dot or empty segments, no ; or \\, no needless percent-encoding)",
            key("prefix"),
            raw.prefix
        ));
    }
    if problems.len() > before {
        return None;
    }
    Some(Route { prefix: raw.prefix, upstream: upstream?, resource: resource?, lease: raw.lease, unfenced_methods })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use crate::config::{Config, ResourceNaming};

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    const EXAMPLE: &str = r#"
        [proxy]
        listen = "127.0.0.1:8080"
        [control]
        listen = "127.0.0.1:9090"
        [database]
        url = "postgres://user@127.0.0.1:5432/app"
        [[routes]]
        prefix = "/ledger"
        upstream = "http://127.0.0.1:9000"
        resource = { segment = 2 }
        lease = "ledger-writer"
        [[routes]]
        prefix = "/ledger/special"
        upstream = "http://127.0.0.1:9001"
        resource = { fixed = "special" }
    "#;

    #[test]
    fn the_contract_example_parses_and_the_longest_prefix_wins() {
        let config = Config::parse(EXAMPLE, &env(&[])).expect("valid");
        assert_eq!(config.route("/ledger/special/x").map(|r| r.prefix.as_str()), Some("/ledger/special"));
        assert_eq!(config.route("/ledger/acct-7/entries").map(|r| r.prefix.as_str()), Some("/ledger"));
        assert_eq!(config.route("/ledger").map(|r| r.prefix.as_str()), Some("/ledger"));
        assert!(config.route("/ledgers").is_none(), "prefixes match at segment boundaries");
        assert!(config.route("/other").is_none());
        assert_eq!(config.routes[1].resource, ResourceNaming::Segment(2));
    }

    #[test]
    fn environment_overrides_the_file() {
        let config = Config::parse(
            EXAMPLE,
            &env(&[
                ("DATABASE_URL", "postgres://a@127.0.0.1/one"),
                ("FENCING_DATABASE_URL", "postgres://b@127.0.0.1/two"),
                ("FENCING_PROXY_LISTEN", "127.0.0.1:18080"),
                ("FENCING_UPSTREAM_FORWARD_TIMEOUT_MS", "2500"),
            ]),
        )
        .expect("valid");
        assert_eq!(config.database.url.as_deref(), Some("postgres://b@127.0.0.1/two"));
        assert_eq!(config.proxy.listen.port(), 18080);
        assert_eq!(config.upstream.forward_timeout.as_millis(), 2500);
    }

    #[test]
    fn every_bad_key_is_reported_with_its_reason() {
        let text = r#"
            [proxy]
            listen = "nowhere"
            header_read_timeout_ms = 0
            [control]
            min_ttl_ms = 5000
            max_ttl_ms = 1000
            [[routes]]
            prefix = "ledger"
            upstream = "ftp://x"
            resource = { segment = 0 }
            unfenced_methods = ["CONNECT"]
        "#;
        let error = Config::parse(text, &env(&[])).expect_err("invalid");
        let all = error.problems.join("\n");
        for expected in [
            "proxy.listen",
            "proxy.header_read_timeout_ms: must be positive",
            "control.min_ttl_ms",
            "routes[0].prefix",
            "routes[0].upstream",
            "routes[0].resource: segment must be 1 or more",
            "routes[0].unfenced_methods",
        ] {
            assert!(all.contains(expected), "{expected:?} missing from:\n{all}");
        }
    }

    #[test]
    fn unknown_keys_and_wrong_types_are_refused() {
        let error = Config::parse("[proxy]\nlisten_on = \"x\"", &env(&[])).expect_err("unknown key");
        assert!(error.to_string().contains("listen_on"), "{error}");
        let error = Config::parse("[database]\npool_size = \"many\"", &env(&[])).expect_err("wrong type");
        assert!(error.to_string().contains("pool_size"), "{error}");
    }

    #[test]
    fn proxy_threads_default_to_the_shared_runtime_without_grants_and_one_per_cpu_with() {
        let parse = |text: &str| Config::parse(text, &env(&[]));
        assert_eq!(parse("").expect("default").proxy.threads, 0);
        let cpus =
            std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get).min(super::MAX_PROXY_THREADS);
        assert_eq!(parse("[database]\ngrant_ms = 400").expect("grants").proxy.threads, cpus);
        assert_eq!(parse("[proxy]\nthreads = 3\n[database]\ngrant_ms = 400").expect("explicit").proxy.threads, 3);
        assert_eq!(parse("[proxy]\nthreads = 0\n[database]\ngrant_ms = 400").expect("shared").proxy.threads, 0);
        // Pinned by default when each thread can have a CPU of its own.
        let fits = cpus <= crate::server::allowed_cpus().len();
        assert_eq!(parse("[database]\ngrant_ms = 400").expect("grants").proxy.pin_threads, fits);
        assert!(!parse("").expect("default").proxy.pin_threads, "no proxy threads, nothing to pin");
        assert!(!parse("[proxy]\nthreads = 64").expect("more than CPUs").proxy.pin_threads || cpus >= 64);
        assert!(!parse("[proxy]\nthreads = 2\npin_threads = false").expect("off").proxy.pin_threads);
        assert!(parse("[proxy]\nthreads = 2\npin_threads = true").expect("on").proxy.pin_threads);
        let error = parse("[proxy]\nthreads = 65").expect_err("too many");
        assert!(error.to_string().contains("proxy.threads"), "{error}");
    }

    #[test]
    fn a_grant_must_fit_in_a_fence_decision_and_outlast_the_margin() {
        let parse = |database: &str| Config::parse(&format!("[database]\n{database}"), &env(&[]));
        assert_eq!(parse("").expect("default").database.grant.as_millis(), 0);
        assert_eq!(parse("grant_ms = 400").expect("valid").database.grant.as_millis(), 400);
        // Longer than half the decision timeout: a raise waiting for it would time out.
        let error = parse("grant_ms = 600").expect_err("too long for the check timeout");
        assert!(error.to_string().contains("half of database.fence_check_timeout_ms"), "{error}");
        assert!(parse("grant_ms = 600\nfence_check_timeout_ms = 1200").is_ok());
        // Too short for the renewal to come back in time with the margin taken off.
        let error = parse("grant_ms = 50").expect_err("too short");
        assert!(error.to_string().contains("database.grant_ms"), "{error}");
        let error = Config::parse("[database]\ngrant_ms = 150\n[upstream]\nsettle_margin_ms = 25", &env(&[]))
            .expect_err("< 8 x margin");
        assert!(error.to_string().contains("8 x upstream.settle_margin_ms"), "{error}");
        let error = parse("grant_ms = 61000\nfence_check_timeout_ms = 200000").expect_err("over a minute");
        assert!(error.to_string().contains("at most 60000"), "{error}");
    }
}
