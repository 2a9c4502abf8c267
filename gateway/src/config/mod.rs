//! The gateway's configuration: a TOML file, overridden by environment variables, parsed and
//! checked section by section. Every bad key is reported, with the reason, before anything
//! starts.
//!
//! - `raw`: the file as serde reads it; `environment`: the `FENCING_*` overrides;
//! - `store`: `[database]` and `[upstream]`; `listeners`: `[proxy]` and `[control]`;
//!   `routes`: `[[routes]]`; `clients`: `[[clients]]` and development mode.
//!
//! It knows nothing of the proxy: resource names and paths follow [`crate::names`].

mod checks;
mod clients;
mod environment;
mod listeners;
pub mod model;
mod raw;
mod routes;
mod store;

use crate::config::checks::Checks;
use crate::config::environment::apply_environment;
use crate::config::raw::RawFile;
use crate::security::auth::Clients;
use crate::security::tls::upstream_client_config;

pub use crate::config::environment::{Environment, ProcessEnvironment};
pub use crate::config::model::{
    CONTROL_BODY_LIMIT_BYTES, Config, ConfigError, ControlConfig, DEFAULT_EMBEDDED_DATA_DIR, DatabaseConfig,
    ProxyConfig, Reads, ResourceNaming, Route, StandbyCheck, UpstreamConfig,
};

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
}

/// Checks every section, in the order they depend on each other: the upstream and the store
/// (a grant must fit both), the listeners (proxy threads depend on grants), the routes, then
/// the clients (checked against the routes, and deciding development mode).
fn validate(raw: RawFile) -> Result<Config, ConfigError> {
    let mut checks = Checks::default();
    let upstream = store::upstream(raw.upstream, &mut checks);
    let database = store::database(raw.database, &upstream, &mut checks);
    let mut proxy = listeners::proxy(raw.proxy, &database, &mut checks);
    let mut control = listeners::control(raw.control, &proxy, &mut checks);
    let shutdown_grace =
        checks.positive_ms("shutdown.grace_period_ms", raw.shutdown.grace_period_ms, model::DEFAULT_SHUTDOWN_GRACE);
    let (routes, mut warnings) = routes::routes(raw.routes, &mut checks.problems);
    let any_https = routes.iter().any(|route| route.upstream.scheme_str() == Some("https"));
    if let Err(error) = upstream_client_config(upstream.ca_file.as_deref(), any_https) {
        checks.push(format!("upstream.ca_file: {error}"));
    }
    let clients = clients::clients(raw.clients, &routes, &mut checks.problems, &mut warnings);
    if clients.is_empty() {
        clients::development_mode(
            [("proxy.listen", proxy.listen), ("control.listen", control.listen)],
            &mut checks.problems,
        );
        listeners::loopback_names(&mut proxy.hosts, proxy.listen);
        listeners::loopback_names(&mut control.hosts, control.listen);
    }
    if !checks.problems.is_empty() {
        return Err(ConfigError { problems: checks.problems });
    }
    Ok(Config { proxy, control, database, upstream, shutdown_grace, routes, clients: Clients::new(clients), warnings })
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
    fn the_contract_example_parses_with_the_longest_prefix_first() {
        let config = Config::parse(EXAMPLE, &env(&[])).expect("valid");
        let prefixes: Vec<&str> = config.routes.iter().map(|route| route.prefix.as_str()).collect();
        assert_eq!(prefixes, ["/ledger/special", "/ledger"], "the proxy takes the first match as the longest");
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
        assert!(!config.proxy.client_request_ids);
        let config = Config::parse(EXAMPLE, &env(&[("FENCING_PROXY_CLIENT_REQUEST_IDS", "true")])).expect("valid");
        assert!(config.proxy.client_request_ids);
    }

    #[test]
    fn prefixes_that_differ_only_in_case_or_trailing_dots_are_one() {
        let text = r#"
            [[routes]]
            prefix = "/ledger"
            upstream = "http://127.0.0.1:9000"
            resource = { segment = 2 }
            [[routes]]
            prefix = "/LEDGER/"
            upstream = "http://127.0.0.1:9001"
            resource = { segment = 2 }
        "#;
        let error = Config::parse(text, &env(&[])).expect_err("one prefix twice");
        assert!(error.problems.join("\n").contains("is configured twice"), "{error}");
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
            [[routes]]
            prefix = "/jobs"
            upstream = "http://127.0.0.1:9000"
            resource = { fixed = "jobs" }
            body_methods = ["GET", "post"]
            [[routes]]
            prefix = "/x_job"
            upstream = "http://127.0.0.1:9000"
            resource = { header = "X_Job" }
            [[routes]]
            prefix = "/a@b"
            upstream = "http://127.0.0.1:9000"
            resource = { header = "Fencing-Token" }
            [[routes]]
            prefix = "/Jobs."
            upstream = "http://127.0.0.1:9000"
            resource = { fixed = "job." }
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
            "routes[1].body_methods: GET is unfenced on this route",
            "routes[1].body_methods: \"post\" is not an upper-case method",
            "routes[2].resource: a resource header's name is made of a-z 0-9 - only",
            "routes[3].resource: \"Fencing-Token\" is a header the gateway sets",
            "routes[3].prefix: a route prefix is made of / and A-Z a-z 0-9 . _ ~ - only",
            "routes[4].prefix: a route prefix has no segment ending with a dot",
            "routes[4].resource: a resource name does not end with a dot",
        ] {
            assert!(all.contains(expected), "{expected:?} missing from:\n{all}");
        }
    }

    #[test]
    fn reads_from_followers_are_checked_and_default_to_loopback_hosts() {
        let route = |reads: &str| {
            format!(
                "[[routes]]\nprefix = \"/orders\"\nupstream = \"http://127.0.0.1:9000\"\nresource = {{ fixed = \"o\" }}\n\
                 [routes.reads]\n{reads}"
            )
        };
        let config = Config::parse(&route("cluster = \"readers\"\nstream = \"orders\"\nmax_lag_ms = 500"), &env(&[]))
            .expect("valid");
        let reads = config.routes[0].reads.clone().expect("reads");
        assert_eq!((reads.cluster.as_str(), reads.stream.as_str()), ("readers", "orders"));
        assert_eq!(reads.max_lag, std::time::Duration::from_millis(500));
        assert_eq!(reads.leader_lease, None);
        assert_eq!(reads.allow_hosts, ["127.0.0.1", "[::1]", "localhost"]);
        let bad = route(&format!(
            "cluster = \"\"\nstream = \"{}\"\nmax_lag_ms = 0\nleader_lease = \"\"\n\
             allow_hosts = [\"10.0.0.1:80\", \"user@host\"]",
            "s".repeat(245)
        ));
        let all = Config::parse(&bad, &env(&[])).expect_err("invalid").problems.join("\n");
        for expected in [
            "routes[0].reads.cluster: must be 1 to 256 characters",
            "routes[0].reads.stream: must be 1 to 244 characters",
            "routes[0].reads.leader_lease: must be 1 to 256 characters",
            "routes[0].reads.max_lag_ms: must be 1 to 3600000, got 0",
            "routes[0].reads.allow_hosts: \"10.0.0.1:80\" is not a host name or address (no port)",
            "routes[0].reads.allow_hosts: \"user@host\" is not a host name or address (no port)",
        ] {
            assert!(all.contains(expected), "{expected:?} missing from:\n{all}");
        }
        let empty = route("cluster = \"c\"\nstream = \"s\"\nmax_lag_ms = 1\nallow_hosts = []");
        let all = Config::parse(&empty, &env(&[])).expect_err("no host").problems.join("\n");
        assert!(all.contains("allow_hosts: must name at least one host"), "{all}");
        let unknown = route("cluster = \"c\"\nstream = \"s\"\nmax_lag_ms = 1\nmax_lag = 5");
        assert!(Config::parse(&unknown, &env(&[])).is_err(), "an unknown key of [routes.reads] is refused");
    }

    #[test]
    fn unknown_keys_and_wrong_types_are_refused() {
        let error = Config::parse("[proxy]\nlisten_on = \"x\"", &env(&[])).expect_err("unknown key");
        assert!(error.to_string().contains("listen_on"), "{error}");
        let error = Config::parse("[database]\npool_size = \"many\"", &env(&[])).expect_err("wrong type");
        assert!(error.to_string().contains("pool_size"), "{error}");
    }

    #[test]
    fn the_standby_check_warns_by_default_and_takes_only_warn_or_off() {
        use crate::config::StandbyCheck;
        let parse = |text: &str| Config::parse(text, &env(&[]));
        assert_eq!(parse("").expect("default").database.standby_check, StandbyCheck::Warn);
        assert_eq!(
            parse("[database]\nstandby_check = \"warn\"").expect("warn").database.standby_check,
            StandbyCheck::Warn
        );
        assert_eq!(
            parse("[database]\nstandby_check = \"off\"").expect("off").database.standby_check,
            StandbyCheck::Off
        );
        let error = parse("[database]\nstandby_check = \"quiet\"").expect_err("unknown value");
        assert!(error.to_string().contains("database.standby_check"), "{error}");
    }

    #[test]
    fn proxy_threads_default_to_the_shared_runtime_without_grants_and_one_per_cpu_with() {
        let parse = |text: &str| Config::parse(text, &env(&[]));
        assert_eq!(parse("[database]\ngrant_ms = 0").expect("no grants").proxy.threads, 0);
        let cpus = std::thread::available_parallelism()
            .map_or(1, std::num::NonZeroUsize::get)
            .min(crate::config::model::MAX_PROXY_THREADS);
        assert_eq!(parse("[database]\ngrant_ms = 400").expect("grants").proxy.threads, cpus);
        assert_eq!(parse("").expect("default: grants").proxy.threads, cpus);
        assert_eq!(parse("[proxy]\nthreads = 3\n[database]\ngrant_ms = 400").expect("explicit").proxy.threads, 3);
        assert_eq!(parse("[proxy]\nthreads = 0\n[database]\ngrant_ms = 400").expect("shared").proxy.threads, 0);
        // Pinned by default when each thread can have a CPU of its own.
        let fits = cpus <= crate::cpus::allowed().len();
        assert_eq!(parse("[database]\ngrant_ms = 400").expect("grants").proxy.pin_threads, fits);
        assert!(
            !parse("[database]\ngrant_ms = 0").expect("no grants").proxy.pin_threads,
            "no proxy threads, nothing to pin"
        );
        assert!(!parse("[proxy]\nthreads = 64").expect("more than CPUs").proxy.pin_threads || cpus >= 64);
        assert!(!parse("[proxy]\nthreads = 2\npin_threads = false").expect("off").proxy.pin_threads);
        assert!(parse("[proxy]\nthreads = 2\npin_threads = true").expect("on").proxy.pin_threads);
        let error = parse("[proxy]\nthreads = 65").expect_err("too many");
        assert!(error.to_string().contains("proxy.threads"), "{error}");
    }

    #[test]
    fn a_grant_must_fit_in_a_fence_decision_and_outlast_the_margin() {
        let parse = |database: &str| Config::parse(&format!("[database]\n{database}"), &env(&[]));
        // The default grant: 400 ms, at most half the check timeout, none below the floor.
        assert_eq!(parse("").expect("default").database.grant.as_millis(), 400);
        assert_eq!(parse("fence_check_timeout_ms = 500").expect("a short check").database.grant.as_millis(), 250);
        assert_eq!(parse("fence_check_timeout_ms = 300").expect("too short for one").database.grant.as_millis(), 0);
        let margin = Config::parse("[upstream]\nsettle_margin_ms = 60", &env(&[])).expect("a wide margin");
        assert_eq!(margin.database.grant.as_millis(), 0, "8 x 60 ms = 480 ms floor > 400: none");
        assert_eq!(parse("grant_ms = 0").expect("off").database.grant.as_millis(), 0);
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
