//! The gateway's metric names, in one list, with their help text.
//!
//! Label values come from configuration (route prefixes, lease keys) or fixed enums, never from
//! raw paths or resource names, so label sets stay bounded.

use metrics::Unit;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Counter `{route, outcome}`: fenced writes by outcome.
pub const WRITES: &str = "fencing_writes_total";
/// Histogram `{route}`: fenced writes, from arrival to the upstream's response head or rejection.
pub const WRITE_DURATION: &str = "fencing_write_duration_seconds";
/// Histogram: one fence decision in Postgres.
pub const CHECK_DURATION: &str = "fencing_check_duration_seconds";
/// Counter `{op, result}`: lease API operations.
pub const LEASE_OPERATIONS: &str = "fencing_lease_operations_total";
/// Counter `{op, result}`: membership calls through the control API (heartbeat, leave, list).
pub const MEMBER_OPERATIONS: &str = "fencing_member_operations_total";
/// Counter `{key}`: new leadership periods granted through this gateway's lease API.
pub const LEASE_TRANSITIONS: &str = "fencing_lease_transitions_total";
/// Counter `{kind}`: fence decisions that could not be made (timeout, error).
pub const STORE_ERRORS: &str = "fencing_store_errors_total";
/// Gauge: fenced writes being decided or forwarded.
pub const INFLIGHT_WRITES: &str = "fencing_inflight_writes";
/// Counter `{route, kind}`: admitted writes the upstream did not answer (connect, timeout, body).
pub const UPSTREAM_ERRORS: &str = "fencing_upstream_errors_total";
/// Counter `{route}`: unfenced requests passed straight through.
pub const PASSTHROUGH: &str = "fencing_passthrough_requests_total";
/// Counter: refusals decided from the gateway's cache of maxima, without a round trip.
pub const CACHED_REFUSALS: &str = "fencing_cached_refusals_total";
/// Counter: writes admitted under a grant this gateway holds, without a round trip.
pub const GRANTED_WRITES: &str = "fencing_granted_writes_total";
/// Counter `{result}`: grant renewals sent ahead of a grant's end (ok, refused, failed).
pub const GRANT_RENEWALS: &str = "fencing_grant_renewals_total";
/// Gauge: the grants this gateway holds (ended ones are dropped every second).
pub const GRANTS_HELD: &str = "fencing_grants_held";
/// Gauge: the memory the grants this gateway holds take, estimated.
pub const GRANT_TABLE_BYTES: &str = "fencing_grant_table_bytes";
/// Gauge: resources of bound routes this gateway has had a decision for at their lease's term,
/// which its lease grants cover (one entry each; no grant row of their own).
pub const GRANT_COVERED: &str = "fencing_grant_covered_resources";
/// Counter: round trips in which the store's clock and this host's boot clock disagreed (a
/// step of the store's wall clock, or a clock running fast or slow): grants are dropped.
pub const CLOCK_DISAGREEMENTS: &str = "fencing_clock_disagreements_total";
/// Counter: refused writes that could not be written to `fencing.refusals`.
pub const REFUSALS_DROPPED: &str = "fencing_refusal_records_dropped_total";
/// Histogram: fence decisions carried by one round trip to Postgres.
pub const BATCH_SIZE: &str = "fencing_check_batch_size";
/// Counter: writes Postgres itself refused (`fencing.admit`, the SQL guard), read from the
/// store at each scrape; their transactions rolled back, so no other record has them.
pub const SQL_REFUSALS: &str = "fencing_sql_refusals_total";

/// Gauge `{key}`: 1 while the configured lease `key` has an unexpired holder, by the store.
pub const LEASE_HELD: &str = "fencing_lease_held";
/// Gauge `{key}`: the configured lease's current term, by the store.
pub const LEASE_TERM: &str = "fencing_lease_term";
/// Gauge `{key}`: the configured lease's time left, by the store.
pub const LEASE_REMAINING: &str = "fencing_lease_remaining_seconds";
/// Gauge, label `key`: what is left of a configured lease's lock-delay (no new term before).
pub const LEASE_LOCK_DELAY: &str = "fencing_lease_lock_delay_remaining_seconds";
/// Counter `{key}`: renewals through the control API that were refused (the owner no longer
/// held the lease): a leader in any language that lost its lease.
pub const LEASE_RENEW_FAILURES: &str = "fencing_lease_renew_failures_total";

/// Gauge: watches (`GET ...?wait=&after=`) waiting for a change on this gateway.
pub const WATCHERS: &str = "fencing_watchers";
/// Counter `{limit}`: watches refused with 429 because a cap was reached (`client`, `gateway`).
pub const WATCH_REFUSALS: &str = "fencing_watch_refusals_total";
/// Appends to the fenced log through the control API, by outcome (`admitted`, `refused`).
pub const LOG_APPENDS: &str = "fencing_log_appends_total";
/// Gauge: 1 while this gateway's connection listening for changes (LISTEN fencing_watch) is up;
/// 0 while watchers fall back to polling every second.
pub const WATCH_LISTENING: &str = "fencing_watch_listening";

/// Counter `{listener}`: connections answered 503 and closed because the listener was at its cap.
pub const CONNECTIONS_REFUSED: &str = "fencing_connections_refused_total";

const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0];

const LATENCY_BUCKETS: &[f64] = &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// Installs the Prometheus recorder for this process and describes every metric.
pub fn install() -> Result<PrometheusHandle, String> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".to_owned()), LATENCY_BUCKETS)
        .map_err(|error| error.to_string())?
        .set_buckets_for_metric(Matcher::Full(BATCH_SIZE.to_owned()), BATCH_BUCKETS)
        .map_err(|error| error.to_string())?
        .install_recorder()
        .map_err(|error| error.to_string())?;
    describe();
    Ok(handle)
}

fn describe() {
    metrics::describe_counter!(WRITES, "Fenced writes by route and outcome");
    metrics::describe_histogram!(WRITE_DURATION, Unit::Seconds, "Fenced writes, from arrival to response head");
    metrics::describe_histogram!(CHECK_DURATION, Unit::Seconds, "Fence decisions in Postgres");
    metrics::describe_counter!(LEASE_OPERATIONS, "Lease API operations by operation and result");
    metrics::describe_counter!(MEMBER_OPERATIONS, "Membership calls through the control API by operation and result");
    metrics::describe_counter!(LEASE_TRANSITIONS, "New leadership periods granted through this gateway");
    metrics::describe_counter!(STORE_ERRORS, "Fence decisions that could not be made, by kind");
    metrics::describe_gauge!(INFLIGHT_WRITES, "Fenced writes being decided or forwarded");
    metrics::describe_counter!(UPSTREAM_ERRORS, "Admitted writes the upstream did not answer, by kind");
    metrics::describe_counter!(PASSTHROUGH, "Unfenced requests passed straight through, by route");
    metrics::describe_counter!(REFUSALS_DROPPED, "Refused writes that could not be written to fencing.refusals");
    metrics::describe_histogram!(
        BATCH_SIZE,
        "Fence decisions carried by one call of fencing.gate_many (one transaction)"
    );
    metrics::describe_counter!(
        SQL_REFUSALS,
        "Writes refused inside Postgres (fencing.admit, the SQL guard) since the schema was installed, all clients"
    );
    metrics::describe_counter!(CACHED_REFUSALS, "Stale writes refused from the cached maximum, without Postgres");
    metrics::describe_counter!(GRANTED_WRITES, "Writes admitted under a grant this gateway holds, without Postgres");
    metrics::describe_counter!(GRANT_RENEWALS, "Grant renewals sent ahead of a grant's end, by result");
    metrics::describe_gauge!(
        GRANTS_HELD,
        "Grants this gateway holds (one per bound lease, one per unbound fence it admits writes of without Postgres)"
    );
    metrics::describe_gauge!(GRANT_TABLE_BYTES, "Memory the grants this gateway holds take, estimated");
    metrics::describe_gauge!(
        GRANT_COVERED,
        "Resources of bound routes decided at their lease's term, which the lease's grant covers"
    );
    metrics::describe_counter!(
        CLOCK_DISAGREEMENTS,
        "Round trips in which the store's clock and the gateway's boot clock disagreed (grants dropped)"
    );
    metrics::describe_counter!(CONNECTIONS_REFUSED, "Connections answered 503 because the listener was at its cap");
    metrics::describe_gauge!(LEASE_HELD, "1 while the configured lease has an unexpired holder, by the store");
    metrics::describe_gauge!(LEASE_TERM, "The configured lease's current term, by the store");
    metrics::describe_gauge!(LEASE_REMAINING, Unit::Seconds, "The configured lease's time left, by the store");
    metrics::describe_gauge!(
        LEASE_LOCK_DELAY,
        Unit::Seconds,
        "What is left of the configured lease's lock-delay: no new term before it has passed"
    );
    metrics::describe_gauge!(WATCHERS, "Watches waiting for a change on this gateway");
    metrics::describe_counter!(WATCH_REFUSALS, "Watches refused with 429 because a cap was reached, by cap");
    metrics::describe_counter!(
        LOG_APPENDS,
        "Appends to the fenced log through the control API, by outcome (admitted, refused with 409)"
    );
    metrics::describe_gauge!(
        WATCH_LISTENING,
        "1 while the connection listening for changes is up; 0 while watchers poll every second"
    );
    metrics::describe_counter!(
        LEASE_RENEW_FAILURES,
        "Renewals through the control API refused because the owner no longer held the lease"
    );
}

/// Every `outcome` label of [`WRITES`].
pub const WRITE_OUTCOMES: [&str; 9] = [
    "admitted",
    "stale",
    "not_leader",
    "future_term",
    "missing_token",
    "malformed",
    "unavailable",
    "upstream_error",
    "unauthorized",
];

/// The `key` label of [`LEASE_TRANSITIONS`] for keys the configuration does not name: clients
/// choose lease keys, so counting each would let them grow the series without bound.
pub const OTHER_KEY: &str = "other";

/// The lease keys the configuration names (routes' leases and clients' globs without `*`),
/// each its own `key` label; every other key is counted as [`OTHER_KEY`].
pub fn named_keys(config: &crate::config::Config) -> std::collections::BTreeSet<String> {
    let routes = config.routes.iter().filter_map(|route| route.lease.clone());
    let clients = config.clients.lease_patterns().filter(|pattern| !pattern.contains('*')).map(str::to_owned);
    routes.chain(clients).collect()
}

/// The `kind` labels of [`UPSTREAM_ERRORS`].
pub const UPSTREAM_ERROR_KINDS: [&str; 3] = ["connect", "request", "timeout"];

/// One route's metric handles, resolved once when the proxy starts: a request records through
/// them without building label sets or looking series up in the registry. Creating them
/// exports each series at 0.
#[derive(Clone)]
pub struct RouteMetrics {
    writes: [metrics::Counter; WRITE_OUTCOMES.len()],
    upstream_errors: [metrics::Counter; UPSTREAM_ERROR_KINDS.len()],
    passthrough: metrics::Counter,
    write_duration: metrics::Histogram,
}

impl std::fmt::Debug for RouteMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RouteMetrics")
    }
}

impl RouteMetrics {
    /// The handles of the route with `prefix`.
    pub fn new(prefix: &str) -> RouteMetrics {
        let route = prefix.to_owned();
        let writes =
            WRITE_OUTCOMES.map(|outcome| metrics::counter!(WRITES, "route" => route.clone(), "outcome" => outcome));
        let upstream_errors = UPSTREAM_ERROR_KINDS
            .map(|kind| metrics::counter!(UPSTREAM_ERRORS, "route" => route.clone(), "kind" => kind));
        let passthrough = metrics::counter!(PASSTHROUGH, "route" => route.clone());
        for counter in writes.iter().chain(&upstream_errors).chain([&passthrough]) {
            counter.absolute(0);
        }
        RouteMetrics {
            writes,
            upstream_errors,
            passthrough,
            write_duration: metrics::histogram!(WRITE_DURATION, "route" => route),
        }
    }

    /// Counts one fenced write with `outcome` (a label of [`WRITE_OUTCOMES`]).
    pub fn write(&self, outcome: &str) {
        if let Some(index) = WRITE_OUTCOMES.iter().position(|known| *known == outcome) {
            self.writes[index].increment(1);
        }
    }

    /// Counts one upstream failure of `kind` (a label of [`UPSTREAM_ERROR_KINDS`]).
    pub fn upstream_error(&self, kind: &str) {
        if let Some(index) = UPSTREAM_ERROR_KINDS.iter().position(|known| *known == kind) {
            self.upstream_errors[index].increment(1);
        }
    }

    /// Counts one unfenced request passed through.
    pub fn passthrough(&self) {
        self.passthrough.increment(1);
    }

    /// Records one fenced write's duration.
    pub fn write_duration(&self, seconds: f64) {
        self.write_duration.record(seconds);
    }
}

/// Exports every series whose labels are known in advance at 0 from start-up, so a dashboard
/// shows 0, not "No data", until something happens.
pub fn register_known(config: &crate::config::Config) {
    for route in &config.routes {
        RouteMetrics::new(&route.prefix);
    }
    for kind in ["timeout", "error", "clock"] {
        metrics::counter!(STORE_ERRORS, "kind" => kind).absolute(0);
    }
    for op in ["acquire", "renew", "release", "value", "resign"] {
        for result in ["ok", "conflict", "invalid", "forbidden", "error"] {
            metrics::counter!(LEASE_OPERATIONS, "op" => op, "result" => result).absolute(0);
        }
    }
    for op in ["heartbeat", "leave", "list", "assignments", "ack", "stopped", "reconcile", "daemons"] {
        for result in ["ok", "conflict", "invalid", "forbidden", "error"] {
            metrics::counter!(MEMBER_OPERATIONS, "op" => op, "result" => result).absolute(0);
        }
    }
    for key in named_keys(config).into_iter().chain([OTHER_KEY.to_owned()]) {
        metrics::counter!(LEASE_TRANSITIONS, "key" => key.clone()).absolute(0);
        metrics::counter!(LEASE_RENEW_FAILURES, "key" => key).absolute(0);
    }
    for result in ["ok", "refused", "failed"] {
        metrics::counter!(GRANT_RENEWALS, "result" => result).absolute(0);
    }
    for name in [CACHED_REFUSALS, GRANTED_WRITES, REFUSALS_DROPPED, SQL_REFUSALS, CLOCK_DISAGREEMENTS] {
        metrics::counter!(name).absolute(0);
    }
    metrics::gauge!(INFLIGHT_WRITES).set(0.0);
    metrics::gauge!(GRANTS_HELD).set(0.0);
    metrics::gauge!(GRANT_TABLE_BYTES).set(0.0);
    metrics::gauge!(GRANT_COVERED).set(0.0);
    metrics::gauge!(WATCHERS).set(0.0);
    metrics::gauge!(WATCH_LISTENING).set(0.0);
    for limit in ["client", "gateway"] {
        metrics::counter!(WATCH_REFUSALS, "limit" => limit).absolute(0);
    }
    for outcome in ["admitted", "refused"] {
        metrics::counter!(LOG_APPENDS, "outcome" => outcome).absolute(0);
    }
    for listener in ["proxy", "control"] {
        metrics::counter!(CONNECTIONS_REFUSED, "listener" => listener).absolute(0);
    }
}
