//! The elector's settings: a builder with safe defaults, and validation that refuses settings
//! that cannot be safe.

use std::time::Duration;

use deadpool_postgres::Pool;

use crate::error::Error;

/// The lease duration unless set.
pub const DEFAULT_TTL: Duration = Duration::from_secs(10);
/// The shortest lease this library accepts: shorter ones leave no room for a round trip.
pub const MIN_TTL: Duration = Duration::from_millis(100);
/// The longest lease the store accepts.
pub const MAX_TTL: Duration = fencing_schema::MAX_TTL;
/// Renewals are jittered down to this fraction of the interval, never later than it.
pub const RENEW_JITTER: f64 = 0.2;
/// The longest key or owner the store accepts.
const MAX_NAME_CHARS: usize = 256;
/// The smallest safety margin at all: scheduling delays alone can reach tens of milliseconds.
pub const MIN_SAFETY_MARGIN: Duration = Duration::from_millis(50);
/// The shortest renew and retry intervals: shorter ones only load the store.
pub const MIN_INTERVAL: Duration = Duration::from_millis(10);
/// How much the store's clock and this host's may differ in rate unless configured.
pub const DEFAULT_CLOCK_RATE_TOLERANCE: f64 = 0.01;

/// A configured elector for one lease key; [`Elector::start`] runs it.
#[derive(Debug, Clone)]
pub struct Elector {
    pub(crate) pool: Pool,
    pub(crate) key: String,
    pub(crate) owner: String,
    pub(crate) ttl: Duration,
    pub(crate) renew_interval: Duration,
    pub(crate) retry_interval: Duration,
    pub(crate) safety_margin: Duration,
    pub(crate) query_timeout: Duration,
    pub(crate) acquire_timeout: Duration,
    pub(crate) shutdown_grace: Duration,
    pub(crate) clock_rate_tolerance: f64,
    /// The value attached to the lease at the start of each period (JSON text), if any.
    pub(crate) value: Option<String>,
    /// What wakes the elector when its lease changes (a release, a handover request), if any.
    pub(crate) wakeups: Option<crate::watch::Wakeups>,
}

impl Elector {
    /// Starts configuring an elector for `key`, using connections from `pool`.
    pub fn builder(pool: Pool, key: impl Into<String>) -> ElectorBuilder {
        ElectorBuilder {
            pool,
            key: key.into(),
            owner: None,
            ttl: DEFAULT_TTL,
            renew_interval: None,
            retry_interval: None,
            safety_margin: None,
            query_timeout: None,
            acquire_timeout: None,
            shutdown_grace: None,
            clock_rate_tolerance: None,
            value: None,
            wakeups: None,
        }
    }

    /// The lease key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The owner identity this elector acquires as.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// The lease duration asked of the store.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// How often the leader renews (before jitter).
    pub fn renew_interval(&self) -> Duration {
        self.renew_interval
    }

    /// The longest a follower waits between attempts to acquire.
    pub fn retry_interval(&self) -> Duration {
        self.retry_interval
    }

    /// What is taken off the store's `remaining_ms` to make the local deadline.
    pub fn safety_margin(&self) -> Duration {
        self.safety_margin
    }

    /// The longest one acquire, renew or release may take.
    pub fn query_timeout(&self) -> Duration {
        self.query_timeout
    }

    /// The longest one acquire may take (it waits out the grants of the old period).
    pub fn acquire_timeout(&self) -> Duration {
        self.acquire_timeout
    }
}

/// Settings for an [`Elector`]; unset ones take defaults derived from the ttl.
#[derive(Debug, Clone)]
#[must_use]
pub struct ElectorBuilder {
    pool: Pool,
    key: String,
    owner: Option<String>,
    ttl: Duration,
    renew_interval: Option<Duration>,
    retry_interval: Option<Duration>,
    safety_margin: Option<Duration>,
    query_timeout: Option<Duration>,
    acquire_timeout: Option<Duration>,
    shutdown_grace: Option<Duration>,
    clock_rate_tolerance: Option<f64>,
    value: Option<String>,
    wakeups: Option<crate::watch::Wakeups>,
}

impl ElectorBuilder {
    /// A small JSON value (at most 4096 bytes as text: its address, its version) attached to
    /// the lease at the start of each of this process's leadership periods (proclaim), for
    /// others to find the leader with [`crate::observe`]. A new period starts with no value
    /// until its holder sets one, so no reader takes the last leader's for the new one's.
    /// [`crate::ElectorHandle::set_value`] changes it during a period.
    pub fn value(mut self, value: &serde_json::Value) -> Self {
        self.value = Some(value.to_string());
        self
    }

    /// Wake-ups of changes of the lease ([`crate::watch::Wakeups::listen`]): a follower then
    /// tries to acquire as soon as the lease is released or handed over to it, instead of at
    /// its next retry, and a leader renews at once when a handover is requested of it, instead
    /// of at its next renewal. Without them both wait for their timers.
    pub fn wakeups(mut self, wakeups: crate::watch::Wakeups) -> Self {
        self.wakeups = Some(wakeups);
        self
    }

    /// A prefix of the owner identity: the elector appends `#` and a random part of its own,
    /// so two electors configured with one owner (two processes, or one restarted) are still
    /// distinct owners and never share a leadership period (S1). Default: host name and
    /// process id, then the random part.
    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = Some(owner.into());
        self
    }

    /// The lease duration asked of the store. Default 10 s.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How often the leader renews, before jitter (renewals come up to 20% early). Default ttl/3.
    pub fn renew_interval(mut self, interval: Duration) -> Self {
        self.renew_interval = Some(interval);
        self
    }

    /// The longest a follower waits between attempts to acquire, and the cap of its backoff
    /// after errors. Default: the renew interval.
    pub fn retry_interval(mut self, interval: Duration) -> Self {
        self.retry_interval = Some(interval);
        self
    }

    /// What is taken off the store's remaining time to make the local deadline: it covers the
    /// delay between the deadline passing and leader work noticing. Default ttl/10.
    pub fn safety_margin(mut self, margin: Duration) -> Self {
        self.safety_margin = Some(margin);
        self
    }

    /// The longest one acquire, renew or release may take, connection included. Default ttl/5.
    pub fn query_timeout(mut self, timeout: Duration) -> Self {
        self.query_timeout = Some(timeout);
        self
    }

    /// The longest one acquire may take. A new period of a lease whose resources a gateway held
    /// grants on starts only once those grants have ended: the store waits them out inside the
    /// acquire, up to the longest grant (never longer than the previous holder's ttl).
    /// Default: the query timeout plus the ttl.
    pub fn acquire_timeout(mut self, timeout: Duration) -> Self {
        self.acquire_timeout = Some(timeout);
        self
    }

    /// How much the store's clock and this host's boot clock may differ in rate, as a fraction.
    /// Each acquire and renewal compares them: a leader whose clock disagrees with the store's
    /// beyond this (a step of the store's wall clock, or a clock running fast or slow) steps
    /// down, since its deadline, counted on its own clock, may then end after the store's
    /// expiry; and the elector leads only once the two have agreed. Default 0.01.
    pub fn clock_rate_tolerance(mut self, tolerance: f64) -> Self {
        self.clock_rate_tolerance = Some(tolerance);
        self
    }

    /// How long `ElectorHandle::shutdown` waits for leader work before releasing. Default ttl/2.
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = Some(grace);
        self
    }

    /// Checks the settings and returns the elector, or the first setting that cannot be safe.
    pub fn build(self) -> Result<Elector, Error> {
        if let Some(prefix) = &self.owner {
            check_name("owner", prefix)?;
        }
        let ttl = self.ttl;
        let renew_interval = self.renew_interval.unwrap_or(ttl / 3);
        let elector = Elector {
            owner: self.owner.map_or_else(default_owner, |prefix| unique_owner(&prefix)),
            retry_interval: self.retry_interval.unwrap_or(renew_interval),
            safety_margin: self.safety_margin.unwrap_or(ttl / 10),
            query_timeout: self.query_timeout.unwrap_or(ttl / 5),
            acquire_timeout: self.acquire_timeout.unwrap_or(self.query_timeout.unwrap_or(ttl / 5) + ttl),
            shutdown_grace: self.shutdown_grace.unwrap_or(ttl / 2),
            clock_rate_tolerance: self.clock_rate_tolerance.unwrap_or(DEFAULT_CLOCK_RATE_TOLERANCE),
            value: self.value,
            wakeups: self.wakeups,
            renew_interval,
            ttl,
            key: self.key,
            pool: self.pool,
        };
        validate(&elector)?;
        Ok(elector)
    }
}

fn invalid(message: String) -> Result<(), Error> {
    Err(Error::InvalidSetting(message))
}

fn check_name(what: &str, value: &str) -> Result<(), Error> {
    if value.is_empty() {
        return invalid(format!("{what} must not be empty"));
    }
    if value.chars().count() > MAX_NAME_CHARS {
        return invalid(format!("{what} must be at most {MAX_NAME_CHARS} characters"));
    }
    Ok(())
}

/// Refuses settings under which a leader could act after its lease expired at the store, or
/// could not renew before its own deadline: as client-go checks
/// LeaseDuration > RenewDeadline > RetryPeriod.
fn validate(elector: &Elector) -> Result<(), Error> {
    check_name("lease key", &elector.key)?;
    check_name("owner", &elector.owner)?;
    if let Some(value) = &elector.value
        && value.len() > fencing_schema::store::MAX_LEASE_VALUE_BYTES
    {
        return invalid(format!(
            "the lease value is at most {} bytes of JSON, got {}",
            fencing_schema::store::MAX_LEASE_VALUE_BYTES,
            value.len()
        ));
    }
    let ttl = elector.ttl;
    if ttl < MIN_TTL || ttl > MAX_TTL {
        return invalid(format!("ttl must be between {MIN_TTL:?} and {MAX_TTL:?}, got {ttl:?}"));
    }
    for (what, value) in [
        ("renew interval", elector.renew_interval),
        ("retry interval", elector.retry_interval),
        ("safety margin", elector.safety_margin),
        ("query timeout", elector.query_timeout),
        ("acquire timeout", elector.acquire_timeout),
    ] {
        if value.is_zero() {
            return invalid(format!("{what} must be positive"));
        }
    }
    if !(0.0..=0.5).contains(&elector.clock_rate_tolerance) {
        return invalid(format!(
            "clock rate tolerance ({}) must be a fraction between 0 and 0.5",
            elector.clock_rate_tolerance
        ));
    }
    let margin_floor = MIN_SAFETY_MARGIN.max(ttl / 1000);
    if elector.safety_margin < margin_floor {
        return invalid(format!(
            "safety margin ({:?}) must be at least {margin_floor:?} (50 ms, or ttl/1000 when more): it covers scheduling \
             delays between the deadline passing and leader work noticing",
            elector.safety_margin
        ));
    }
    for (what, value) in [("renew interval", elector.renew_interval), ("retry interval", elector.retry_interval)] {
        if value < MIN_INTERVAL {
            return invalid(format!("{what} ({value:?}) must be at least {MIN_INTERVAL:?}"));
        }
    }
    if elector.shutdown_grace.is_zero() || elector.shutdown_grace > ttl {
        return invalid(format!(
            "shutdown grace ({:?}) must be positive and at most the ttl ({ttl:?}): leader work that outlives it keeps \
             the lease from being released",
            elector.shutdown_grace
        ));
    }
    if elector.safety_margin >= ttl / 2 {
        return invalid(format!(
            "safety margin ({:?}) must be less than half the ttl ({ttl:?}), or the leader would hardly lead",
            elector.safety_margin
        ));
    }
    // A renewal must be sent and answered well before the local deadline (ttl - margin):
    // within two thirds of it, leaving a third for scheduling delays.
    let usable = ttl - elector.safety_margin;
    let needed = elector.renew_interval + elector.query_timeout;
    if needed * 3 > usable * 2 {
        return invalid(format!(
            "renew interval ({:?}) plus query timeout ({:?}) must be at most two thirds of ttl minus safety margin \
             ({usable:?}), so a renewal completes well before the deadline",
            elector.renew_interval, elector.query_timeout
        ));
    }
    if elector.retry_interval > ttl {
        return invalid(format!(
            "retry interval ({:?}) must not exceed the ttl ({ttl:?}), or followers take over late",
            elector.retry_interval
        ));
    }
    Ok(())
}

/// Host name, process id and a random part: one value per process incarnation.
fn default_owner() -> String {
    let host =
        kernel_host_name().or_else(|| std::env::var("HOSTNAME").ok()).unwrap_or_else(|| "unknown-host".to_owned());
    unique_owner(&format!("{host}-{}", std::process::id()))
}

/// The host name the kernel reports, when it has one.
pub(crate) fn kernel_host_name() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
}

/// `prefix`, `#`, and a random part: one value per elector incarnation.
fn unique_owner(prefix: &str) -> String {
    // Keep the whole within the store's 256 characters.
    let prefix: String = prefix.chars().take(MAX_NAME_CHARS - 17).collect();
    format!("{prefix}#{:016x}", rand::random::<u64>())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use deadpool_postgres::{Manager, Pool};
    use tokio_postgres::NoTls;

    use crate::{Elector, Error};

    /// A pool that never connects: building an elector does not touch the database.
    fn pool() -> Pool {
        let config: tokio_postgres::Config = "host=127.0.0.1 port=1 user=nobody".parse().expect("valid config");
        Pool::builder(Manager::new(config, NoTls)).max_size(1).build().expect("pool builds without connecting")
    }

    fn check(builder: crate::ElectorBuilder, expected: &str) {
        match builder.build() {
            Err(Error::InvalidSetting(message)) => {
                assert!(message.contains(expected), "message {message:?} lacks {expected:?}")
            }
            other => panic!("expected a refusal naming {expected:?}, got {other:?}"),
        }
    }

    #[test]
    fn defaults_are_derived_from_the_ttl_and_valid() {
        let elector = Elector::builder(pool(), "jobs").build().expect("defaults are valid");
        assert_eq!(elector.ttl(), Duration::from_secs(10));
        assert_eq!(elector.renew_interval(), Duration::from_secs(10) / 3);
        assert_eq!(elector.retry_interval(), elector.renew_interval());
        assert_eq!(elector.safety_margin(), Duration::from_secs(1));
        assert_eq!(elector.query_timeout(), Duration::from_secs(2));
        let pid = std::process::id().to_string();
        assert!(elector.owner().contains(&pid), "owner {} names the pid", elector.owner());
        let other = Elector::builder(pool(), "jobs").build().expect("valid");
        assert_ne!(elector.owner(), other.owner(), "each elector is a distinct owner");
    }

    #[test]
    fn invalid_settings_are_refused_with_the_setting_named() {
        let ms = Duration::from_millis;
        check(Elector::builder(pool(), ""), "lease key must not be empty");
        check(Elector::builder(pool(), "k".repeat(257)), "lease key must be at most 256");
        check(Elector::builder(pool(), "k").owner(""), "owner must not be empty");
        let same = || Elector::builder(pool(), "k").owner("node-a").build().expect("valid");
        assert_ne!(same().owner(), same().owner(), "one configured owner, two distinct incarnations");
        assert!(same().owner().starts_with("node-a#"));
        check(Elector::builder(pool(), "k").ttl(ms(50)), "ttl must be between");
        check(Elector::builder(pool(), "k").ttl(Duration::from_secs(7200)), "ttl must be between");
        check(Elector::builder(pool(), "k").renew_interval(Duration::ZERO), "renew interval must be positive");
        check(Elector::builder(pool(), "k").query_timeout(Duration::ZERO), "query timeout must be positive");
        check(Elector::builder(pool(), "k").safety_margin(Duration::ZERO), "safety margin must be positive");
        check(Elector::builder(pool(), "k").safety_margin(Duration::from_secs(5)), "less than half the ttl");
        // Renewing every 8 s of a 10 s lease cannot complete before the 9 s deadline comfortably.
        check(Elector::builder(pool(), "k").renew_interval(Duration::from_secs(8)), "two thirds of ttl");
        // Nor can a query allowed to take as long as the lease.
        check(Elector::builder(pool(), "k").query_timeout(Duration::from_secs(9)), "two thirds of ttl");
        check(Elector::builder(pool(), "k").retry_interval(Duration::from_secs(11)), "retry interval");
        check(Elector::builder(pool(), "k").safety_margin(ms(10)), "must be at least 50ms");
        check(
            Elector::builder(pool(), "k").ttl(Duration::from_secs(3600)).safety_margin(ms(1000)),
            "must be at least 3.6s",
        );
        check(Elector::builder(pool(), "k").renew_interval(ms(5)), "renew interval (5ms) must be at least");
        check(Elector::builder(pool(), "k").retry_interval(ms(1)), "retry interval (1ms) must be at least");
        check(Elector::builder(pool(), "k").shutdown_grace(Duration::ZERO), "shutdown grace");
        check(Elector::builder(pool(), "k").shutdown_grace(Duration::from_secs(20)), "shutdown grace");
    }
}
