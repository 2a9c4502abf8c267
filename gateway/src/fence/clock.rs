//! The store's clock, watched from this gateway. Every decision round trip is a sample: sent
//! and answered on this host's boot clock, and the store's wall clock as it read it in between.
//! A gateway counts grants, settle waits and forward deadlines on its own clocks; they stand for
//! the store's lengths only while the two clocks run at the same rate. So the gateway admits
//! nothing (503) until the clocks have agreed over a span of `trust_after` at least, and long
//! enough that the round trips' widths vouch for their rates within the tolerance, and again
//! after any disagreement (the store's clock stepped, or one of the clocks runs fast or slow
//! beyond the tolerance): a disagreement is logged and counted
//! (`fencing_clock_disagreements_total`), drops every grant, and ends the trust until a fresh
//! span of agreement earns it back.
//!
//! A gateway whose own clock runs slow or fast by more than twice the tolerance therefore never
//! admits, and one whose clock starts to misbehave stops admitting at its next round trip (the
//! store's clock is read every second besides the decisions); a step of the store's clock costs
//! each gateway that span of 503s (0.1 to 1 s with round trips on loopback).

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
    /// The watch, and when the last sample (from any reader) was answered.
    watch: Mutex<(ClockWatch, Option<BootInstant>)>,
    /// The clocks agreed over a span of `trust_after` at least, with no disagreement since.
    trusted: AtomicBool,
    /// Counts the disagreements: a grant is used only under the generation it was given in.
    generation: AtomicU64,
    /// How long they must have agreed before grants are used.
    trust_after: Duration,
    /// The rate the agreement must vouch for before it is trusted: (uncertainty + slack) / span
    /// at most this (the tolerance, or 0.001 when it is zero), so a trusted clock runs within
    /// twice the tolerance of the store's, whatever the round trips' widths.
    certainty: f64,
    /// The last disagreement logged (nanoseconds on the boot clock): one line per 10 s at most.
    last_logged: AtomicU64,
    disagreements: metrics::Counter,
    /// Wakes [`earn_trust`] when the trust is lost.
    lost: Notify,
}

/// What the store's clock and this host's may differ by for rounding.
const SLACK: Duration = Duration::from_millis(1);
/// How often the store's clock is read while the clocks are trusted: no reference grows old
/// between writes, so a rate that changes shows within seconds.
const KEEP_WATCHING: Duration = Duration::from_secs(1);
/// A store that did not answer this reader for longer than this is watched afresh.
const STALE: Duration = Duration::from_secs(10);

fn nanos(instant: BootInstant) -> u64 {
    u64::try_from(instant.since_boot().as_nanos()).unwrap_or(u64::MAX)
}

impl StoreClock {
    /// A watch with the clock-rate tolerance `tolerance`; the clocks are trusted once they agreed
    /// for `trust_after` at least, over a span long enough to vouch for their rates within the
    /// tolerance.
    pub(super) fn new(tolerance: f64, trust_after: Duration) -> StoreClock {
        StoreClock {
            // The store's clock comes as microseconds: 1 ms for rounding. The reference moves
            // every 10 s, so a rate error shows over spans up to that long.
            watch: Mutex::new((ClockWatch::new(tolerance, SLACK, Duration::from_secs(10)), None)),
            trusted: AtomicBool::new(false),
            generation: AtomicU64::new(0),
            trust_after,
            certainty: tolerance.max(0.001),
            last_logged: AtomicU64::new(0),
            disagreements: metrics::counter!(names::CLOCK_DISAGREEMENTS),
            lost: Notify::new(),
        }
    }

    /// Takes one round trip's sample; false when the clocks disagree (grants must go).
    pub(super) fn observe(&self, sample: ClockSample) -> bool {
        let Ok(mut guard) = self.watch.lock() else { return false };
        let (watch, last) = &mut *guard;
        // No answer for longer than the window: a reference that old would hide a rate that
        // changed meanwhile in the tolerance of the whole span. Start afresh, untrusted.
        if last.is_some_and(|last| sample.sent.saturating_duration_since(last) > STALE) {
            watch.reset();
            self.trusted.store(false, Ordering::Release);
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
        *last = Some(last.map_or(sample.received, |last| last.max(sample.received)));
        match watch.observe(sample) {
            ClockVerdict::Unknown => true,
            ClockVerdict::Agrees { span, uncertainty } => {
                // A short span between wide round trips agrees with clocks far apart in rate
                // (10 ms of width over 100 ms lets x0.9 through): trust needs a span that vouches
                // for the rate within the tolerance.
                if span >= self.trust_after
                    && (uncertainty + SLACK).as_secs_f64() <= self.certainty * span.as_secs_f64()
                {
                    self.trusted.store(true, Ordering::Release);
                } else if !self.trusted() {
                    watch.prefer_narrower(sample);
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
                         again; see docs/operations.md, \"Clocks disagree\""
                    );
                }
                false
            }
        }
    }

    /// Whether writes may be admitted and grants used: the clocks have agreed over a span of
    /// `trust_after` at least that vouches for their rates, with no disagreement since.
    pub(super) fn trusted(&self) -> bool {
        self.trusted.load(Ordering::Acquire)
    }

    /// How many disagreements there have been: a grant given under one generation is of no use
    /// under the next.
    pub(super) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }
}

/// For as long as the gateway runs, reads the store's clock: every 50 ms while the clocks are not
/// trusted (from start-up, and after each disagreement; every 500 ms while the store does not
/// answer), so writes are admitted again as soon as
/// a span of agreement vouches for them, not only once decisions have spanned it; every second
/// while they are, and at once when a disagreement ends the trust, so that the reference the
/// round trips are measured against is never old (after an idle hour, a clock that ran fast for
/// the last five seconds would hide in an hour's tolerance).
pub(super) async fn earn_trust(pool: Pool, clock: std::sync::Weak<StoreClock>, check_timeout: Duration) {
    const READ: &str = "SELECT extract(epoch FROM clock_timestamp())::float8";
    let mut was_trusted = false;
    // Until the fence store that owns the clock is dropped.
    while let Some(clock) = clock.upgrade() {
        let read = tokio::time::timeout(check_timeout, async {
            let client = pool.get().await.ok()?;
            // Timed around the query alone: a wait for a connection would only widen the sample.
            let sent = BootInstant::now();
            let store_secs = client.query_one(READ, &[]).await.ok()?.try_get::<_, f64>(0).ok()?;
            Some(ClockSample { sent, received: BootInstant::now(), store_secs })
        })
        .await;
        let answered = matches!(read, Ok(Some(_)));
        if let Ok(Some(sample)) = read {
            clock.observe(sample);
        }
        let trusted = clock.trusted();
        if trusted && !was_trusted {
            info!("the store's clock and this host's boot clock agree: writes are admitted");
        }
        was_trusted = trusted;
        if trusted {
            // A permit stored by an earlier disagreement is taken at once, and reads again.
            tokio::select! {
                () = clock.lost.notified() => {}
                () = tokio::time::sleep(KEEP_WATCHING) => {}
            }
        } else {
            drop(clock);
            // A store that does not answer is asked again less often (it may be restarting).
            tokio::time::sleep(Duration::from_millis(if answered { 50 } else { 500 })).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use fencing_election::clock::{BootInstant, ClockSample};

    use super::StoreClock;

    /// A sample sent `at` seconds after `zero`, its round trip `rtt` long, the store's clock
    /// reading `rate` times as far as this host's in the middle of it.
    fn sample(zero: BootInstant, at: f64, rtt: f64, rate: f64) -> ClockSample {
        ClockSample {
            sent: zero + Duration::from_secs_f64(at),
            received: zero + Duration::from_secs_f64(at + rtt),
            store_secs: 1_000_000.0 + (at + rtt / 2.0) * rate,
        }
    }

    #[test]
    fn trust_needs_a_span_that_vouches_for_the_rate_not_only_one_that_agrees() {
        let zero = BootInstant::now();
        // Round trips of 10 ms: over 110 ms, a clock at 0.9 the rate still agrees within the
        // tolerance and the widths, but the span cannot vouch for 1%: not trusted.
        for rate in [0.9, 1.1] {
            let clock = StoreClock::new(0.01, Duration::from_millis(100));
            assert!(clock.observe(sample(zero, 0.0, 0.01, rate)));
            clock.observe(sample(zero, 0.11, 0.01, rate));
            assert!(!clock.trusted(), "x{rate} trusted over 110 ms of 10 ms round trips");
            // Over longer spans it disagrees, and never earns trust.
            for n in 2..40 {
                clock.observe(sample(zero, 0.11 * f64::from(n), 0.01, rate));
                assert!(!clock.trusted(), "x{rate} trusted after {n} samples");
            }
        }
        // The right rate, the same round trips: trusted once the span vouches for 1% (about
        // 2.1 s of 10 ms round trips), not before.
        let clock = StoreClock::new(0.01, Duration::from_millis(100));
        clock.observe(sample(zero, 0.0, 0.01, 1.0));
        clock.observe(sample(zero, 1.0, 0.01, 1.0));
        assert!(!clock.trusted());
        clock.observe(sample(zero, 2.2, 0.01, 1.0));
        assert!(clock.trusted());
        // Round trips of 0.5 ms on loopback: trusted after about 0.2 s.
        let clock = StoreClock::new(0.01, Duration::from_millis(100));
        clock.observe(sample(zero, 0.0, 0.0005, 1.0));
        clock.observe(sample(zero, 0.25, 0.0005, 1.0));
        assert!(clock.trusted());
        // A step of the store's clock ends the trust at once.
        let generation = clock.generation();
        let mut stepped = sample(zero, 0.5, 0.0005, 1.0);
        stepped.store_secs += 60.0;
        assert!(!clock.observe(stepped));
        assert!(!clock.trusted());
        assert_eq!(clock.generation(), generation + 1);
    }

    /// A watch that trusts the clocks after 0.3 s of loopback round trips from `zero`.
    fn trusted(zero: BootInstant) -> StoreClock {
        let clock = StoreClock::new(0.01, Duration::from_millis(100));
        clock.observe(sample(zero, 0.0, 0.0005, 1.0));
        clock.observe(sample(zero, 0.3, 0.0005, 1.0));
        assert!(clock.trusted());
        clock
    }

    #[test]
    fn a_disagreement_seen_on_a_slow_round_trip_does_not_keep_trust_away_for_long() {
        let zero = BootInstant::now();
        let clock = trusted(zero);
        // The store's clock steps 60 s; the step is seen on a round trip of 200 ms (a raise that
        // waited out a grant): that sample becomes the reference.
        let mut stepped = sample(zero, 0.5, 0.2, 1.0);
        stepped.store_secs += 60.0;
        assert!(!clock.observe(stepped));
        // Narrow round trips every 50 ms from then on: trusted again within a second, not only
        // once the reference moves on (10 s), as a 200 ms-wide reference would need.
        let mut at = 0.75;
        while !clock.trusted() {
            let mut next = sample(zero, at, 0.0005, 1.0);
            next.store_secs += 60.0;
            clock.observe(next);
            at += 0.05;
            assert!(at < 1.75, "not trusted again within a second of the step");
        }
    }

    #[test]
    fn a_store_that_did_not_answer_for_ten_seconds_is_watched_afresh() {
        let zero = BootInstant::now();
        let clock = trusted(zero);
        let generation = clock.generation();
        // 60 s later: this clock ran 1.5% slow for the last 20 s, hidden in 1% of 60 s; the gap
        // itself ends the trust, which the next samples earn again.
        clock.observe(sample(zero, 60.0, 0.0005, 1.0));
        assert!(!clock.trusted());
        assert_eq!(clock.generation(), generation + 1);
        clock.observe(sample(zero, 60.3, 0.0005, 1.0));
        assert!(clock.trusted());
    }
}
