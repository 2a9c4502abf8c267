//! The `[database]` and `[upstream]` sections: the fence store's connections and timeouts, the
//! grant length, and how upstreams are contacted. A grant must fit the fence-check timeout and
//! outlast the settle margin, so the two sections are checked together.

use std::path::PathBuf;
use std::time::Duration;

use crate::config::checks::Checks;
use crate::config::model::{
    DEFAULT_CLOCK_RATE_TOLERANCE, DEFAULT_CONTROL_POOL_SIZE, DEFAULT_EMBEDDED_DATA_DIR, DEFAULT_FENCE_CHECK_TIMEOUT,
    DEFAULT_FORWARD_TIMEOUT, DEFAULT_GRANT, DEFAULT_MAX_BATCHES_IN_FLIGHT, DEFAULT_POOL_SIZE, DEFAULT_SETTLE_MARGIN,
    DEFAULT_UPSTREAM_CONNECT_TIMEOUT, DatabaseConfig, StandbyCheck, UpstreamConfig,
};
use crate::config::raw::{RawDatabase, RawUpstream};
use crate::security::database::Database;

/// The `[upstream]` section.
pub(super) fn upstream(raw: RawUpstream, checks: &mut Checks) -> UpstreamConfig {
    let connect_timeout =
        checks.positive_ms("upstream.connect_timeout_ms", raw.connect_timeout_ms, DEFAULT_UPSTREAM_CONNECT_TIMEOUT);
    let forward_timeout =
        checks.positive_ms("upstream.forward_timeout_ms", raw.forward_timeout_ms, DEFAULT_FORWARD_TIMEOUT);
    if forward_timeout > Duration::from_secs(3600) {
        checks.push("upstream.forward_timeout_ms: at most 3600000".to_owned());
    }
    let settle_margin = match raw.settle_margin_ms {
        None => DEFAULT_SETTLE_MARGIN,
        Some(ms) if ms <= 10_000 => Duration::from_millis(ms),
        Some(_) => {
            checks.push("upstream.settle_margin_ms: at most 10000".to_owned());
            DEFAULT_SETTLE_MARGIN
        }
    };
    UpstreamConfig { connect_timeout, forward_timeout, settle_margin, ca_file: raw.ca_file.map(PathBuf::from) }
}

/// The `[database]` section; the grant is checked against `upstream`'s settle margin.
pub(super) fn database(raw: RawDatabase, upstream: &UpstreamConfig, checks: &mut Checks) -> DatabaseConfig {
    let fence_check_timeout =
        checks.positive_ms("database.fence_check_timeout_ms", raw.fence_check_timeout_ms, DEFAULT_FENCE_CHECK_TIMEOUT);
    // Unset: the default grant, fitted to this configuration's check timeout and margin (a
    // default never makes a configuration invalid; it is none when it cannot fit).
    let floor = Duration::from_millis(100).max(upstream.settle_margin * 8);
    let grant = match raw.grant_ms {
        Some(ms) => Duration::from_millis(ms),
        None => Some(DEFAULT_GRANT.min(fence_check_timeout / 2)).filter(|grant| *grant >= floor).unwrap_or_default(),
    };
    if raw.grant_ms.is_some() && !grant.is_zero() {
        // A new term waits up to one grant inside its decision; the gateway renews a grant with
        // half of it left, and the store renews only under three quarters: the margin and a round
        // trip must fit in that quarter.
        if grant < floor {
            checks.push(format!(
                "database.grant_ms: 0 (no grants) or at least {} ms (8 x upstream.settle_margin_ms, and 100)",
                floor.as_millis()
            ));
        }
        if grant * 2 > fence_check_timeout {
            checks.push(format!(
                "database.grant_ms: at most half of database.fence_check_timeout_ms ({} ms): a new term waits up to one grant inside its fence decision",
                fence_check_timeout.as_millis()
            ));
        }
        if grant > Duration::from_secs(60) {
            checks.push("database.grant_ms: at most 60000".to_owned());
        }
    }
    let pool_size = match raw.pool_size.map(usize::try_from) {
        None => DEFAULT_POOL_SIZE,
        Some(Ok(n)) if (1..=1000).contains(&n) => n,
        Some(_) => {
            checks.push("database.pool_size: must be between 1 and 1000".to_owned());
            DEFAULT_POOL_SIZE
        }
    };
    let control_pool_size = match raw.control_pool_size.map(usize::try_from) {
        None => DEFAULT_CONTROL_POOL_SIZE,
        Some(Ok(n)) if (1..=100).contains(&n) => n,
        Some(_) => {
            checks.push("database.control_pool_size: must be between 1 and 100".to_owned());
            DEFAULT_CONTROL_POOL_SIZE
        }
    };
    let max_batches_in_flight = match raw.max_batches_in_flight.map(usize::try_from) {
        None => DEFAULT_MAX_BATCHES_IN_FLIGHT.min(pool_size),
        Some(Ok(n)) if n >= 1 && n <= pool_size => n,
        Some(_) => {
            checks.push(format!(
                "database.max_batches_in_flight: must be between 1 and database.pool_size ({pool_size})"
            ));
            1
        }
    };
    let clock_rate_tolerance = match raw.clock_rate_tolerance {
        None => DEFAULT_CLOCK_RATE_TOLERANCE,
        Some(rho) if (0.0..=0.5).contains(&rho) => rho,
        Some(rho) => {
            checks.push(format!("database.clock_rate_tolerance: a fraction between 0 and 0.5, got {rho}"));
            DEFAULT_CLOCK_RATE_TOLERANCE
        }
    };
    let standby_check = match raw.standby_check.as_deref() {
        None | Some("warn") => StandbyCheck::Warn,
        Some("off") => StandbyCheck::Off,
        Some(other) => {
            checks.push(format!("database.standby_check: \"warn\" or \"off\", got {other:?}"));
            StandbyCheck::Warn
        }
    };
    let url = raw.url.filter(|url| !url.is_empty());
    if let Some(url) = &url
        && let Err(error) = Database::parse(url)
    {
        checks.push(error);
    }
    DatabaseConfig {
        url,
        pool_size,
        control_pool_size,
        fence_check_timeout,
        max_batches_in_flight,
        grant,
        clock_rate_tolerance,
        standby_check,
        data_dir: PathBuf::from(raw.data_dir.unwrap_or_else(|| DEFAULT_EMBEDDED_DATA_DIR.to_owned())),
    }
}
