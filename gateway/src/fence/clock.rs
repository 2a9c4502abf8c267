//! The store's clock, watched from this gateway. Every decision round trip is a sample: sent
//! and answered on this host's boot clock, and the store's wall clock as it read it in between.
//! A gateway counts grants, settle waits and forward deadlines on its own clocks; they stand for
//! the store's lengths only while the two clocks run at the same rate. So the gateway admits
//! nothing (503) until the clocks have agreed over a span of `trust_after`, and again after any
//! disagreement (the store's clock stepped, or one of the clocks runs fast or slow beyond the
//! tolerance): a disagreement is logged and counted (`fencing_clock_disagreements_total`),
//! drops every grant, and ends the trust until a fresh span of agreement earns it back.
//!
//! A gateway whose own clock runs slow or fast therefore never admits, and one whose clock
//! starts to misbehave stops admitting at its next round trip; a step of the store's clock costs
//! each gateway about `trust_after` of 503s.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use deadpool_postgres::Pool;
use fencing_election::clock::{BootInstant, ClockSample, ClockVerdict, ClockWatch};
use tokio::sync::Notify;
use tracing::{info, warn};

use crate::metrics as names;

/// What this gateway makes of the store's clock.
#[derive(Debug)]
pub(super) struct StoreClock {
    watch: Mutex<ClockWatch>,
    /// The clocks agreed over a span of `trust_after` at least, with no disagreement since.
    trusted: AtomicBool,
    /// Counts the disagreements: a grant is used only under the generation it was given in.
    generation: AtomicU64,
    /// How long they must have agreed before grants are used.
    trust_after: Duration,
    /// The last disagreement logged (nanoseconds on the boot clock): one line per 10 s at most.
    last_logged: AtomicU64,
    disagreements: metrics::Counter,
    /// Wakes [`earn_trust`] when the trust is lost.
    lost: Notify,
}

fn nanos(instant: BootInstant) -> u64 {
    u64::try_from(instant.since_boot().as_nanos()).unwrap_or(u64::MAX)
}

impl StoreClock {
    /// A watch with the clock-rate tolerance `tolerance`; grants are trusted after the clocks
    /// agreed for `trust_after`.
    pub(super) fn new(tolerance: f64, trust_after: Duration) -> StoreClock {
        StoreClock {
            // 5 ms for rounding; the reference moves every 10 s, so a rate error shows over spans
            // up to that long.
            watch: Mutex::new(ClockWatch::new(tolerance, Duration::from_millis(5), Duration::from_secs(10))),
            trusted: AtomicBool::new(false),
            generation: AtomicU64::new(0),
            trust_after,
            last_logged: AtomicU64::new(0),
            disagreements: metrics::counter!(names::CLOCK_DISAGREEMENTS),
            lost: Notify::new(),
        }
    }

    /// Takes one round trip's sample; false when the clocks disagree (grants must go).
    pub(super) fn observe(&self, sample: ClockSample) -> bool {
        let Ok(mut watch) = self.watch.lock() else { return false };
        match watch.observe(sample) {
            ClockVerdict::Unknown => true,
            ClockVerdict::Agrees { span } => {
                if span >= self.trust_after {
                    self.trusted.store(true, Ordering::Release);
                }
                true
            }
            ClockVerdict::Disagrees { store_secs, local_min_secs, local_max_secs } => {
                self.trusted.store(false, Ordering::Release);
                self.generation.fetch_add(1, Ordering::AcqRel);
                self.disagreements.increment(1);
                self.lost.notify_one();
                let now = nanos(BootInstant::now());
                let last = self.last_logged.load(Ordering::Acquire);
                if now.saturating_sub(last) >= 10_000_000_000
                    && self.last_logged.compare_exchange(last, now, Ordering::AcqRel, Ordering::Acquire).is_ok()
                {
                    warn!(
                        store_secs,
                        local_min_secs,
                        local_max_secs,
                        "the store's clock and this host's boot clock disagree (a step of the store's wall clock, or \
                         a clock running fast or slow): writes get 503 and grants are dropped until they agree \
                         again; see the README's runbook, \"Clocks disagree\""
                    );
                }
                false
            }
        }
    }

    /// Whether grants may be used: the clocks have agreed over a span of `trust_after` at least,
    /// with no disagreement since.
    pub(super) fn trusted(&self) -> bool {
        self.trusted.load(Ordering::Acquire)
    }

    /// How long a span of agreement makes the clocks trusted.
    pub(super) fn trust_after(&self) -> Duration {
        self.trust_after
    }

    /// How many disagreements there have been: a grant given under one generation is of no use
    /// under the next.
    pub(super) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }
}

/// For as long as the gateway runs: whenever the clocks are not trusted (from start-up, and after
/// each disagreement), reads the store's clock twice, `trust_after` apart (and again shortly when
/// they disagree or the store cannot be reached), so that writes are admitted again within about
/// `trust_after` of the clocks agreeing, not only once decisions have spanned it.
pub(super) async fn earn_trust(pool: Pool, clock: std::sync::Arc<StoreClock>, check_timeout: Duration) {
    const READ: &str = "SELECT extract(epoch FROM clock_timestamp())::float8";
    let mut earned_before = false;
    loop {
        if !clock.trusted() {
            while !clock.trusted() {
                for round in 0..2 {
                    if round > 0 {
                        tokio::time::sleep(clock.trust_after() + Duration::from_millis(10)).await;
                    }
                    let sent = BootInstant::now();
                    let read = tokio::time::timeout(check_timeout, async {
                        let client = pool.get().await.ok()?;
                        client.query_one(READ, &[]).await.ok()?.try_get::<_, f64>(0).ok()
                    })
                    .await;
                    let Ok(Some(store_secs)) = read else { break };
                    clock.observe(ClockSample { sent, received: BootInstant::now(), store_secs });
                }
                if !clock.trusted() {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
            if earned_before {
                info!("the store's clock and this host's boot clock agree again: writes are admitted again");
            }
        }
        earned_before = true;
        // Until the next disagreement (a permit stored by an earlier one is taken at once, and
        // finds the clocks trusted).
        clock.lost.notified().await;
    }
}
