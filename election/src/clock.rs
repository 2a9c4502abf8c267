//! The clock that decides whether a leadership period still lasts: `CLOCK_BOOTTIME`.
//!
//! Rust's and tokio's `Instant` read `CLOCK_MONOTONIC`, which stops while the host or VM is
//! suspended: after a resume a holder would believe its lease still runs while the store's
//! clock moved on. `CLOCK_BOOTTIME` keeps counting through a suspend, so a deadline on it passes
//! when it should (S7). tokio's timers are still used to wake up; they never decide validity.

use std::ops::Add;
use std::time::Duration;

use nix::time::{ClockId, clock_gettime};

/// An instant on `CLOCK_BOOTTIME`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BootInstant(Duration);

impl BootInstant {
    /// Now, on `CLOCK_BOOTTIME` (on `CLOCK_MONOTONIC` where the system has no boot clock).
    pub fn now() -> BootInstant {
        let read = clock_gettime(ClockId::CLOCK_BOOTTIME).or_else(|_| clock_gettime(ClockId::CLOCK_MONOTONIC));
        match read {
            Ok(spec) => BootInstant(Duration::new(
                u64::try_from(spec.tv_sec()).unwrap_or(0),
                u32::try_from(spec.tv_nsec()).unwrap_or(0),
            )),
            // Both clocks exist on every Linux; were they missing, time stands still at zero
            // and every deadline in the future stays in the future: callers also stop on the
            // tokio timer, so nothing waits forever.
            Err(_) => BootInstant(Duration::ZERO),
        }
    }

    /// How long since the clock's zero (the boot).
    pub fn since_boot(self) -> Duration {
        self.0
    }

    /// How long after `earlier` this is, or zero.
    pub fn saturating_duration_since(self, earlier: BootInstant) -> Duration {
        self.0.saturating_sub(earlier.0)
    }

    /// This minus `duration`, or `None` before the clock's zero.
    pub fn checked_sub(self, duration: Duration) -> Option<BootInstant> {
        self.0.checked_sub(duration).map(BootInstant)
    }
}

impl Add<Duration> for BootInstant {
    type Output = BootInstant;

    fn add(self, duration: Duration) -> BootInstant {
        BootInstant(self.0.saturating_add(duration))
    }
}

/// One round trip to the store: sent and answered on this host's boot clock, and the store's
/// wall clock as the store read it in between (in seconds since the Unix epoch).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClockSample {
    /// When the call was sent.
    pub sent: BootInstant,
    /// When its answer came.
    pub received: BootInstant,
    /// The store's clock, read while it handled the call.
    pub store_secs: f64,
}

/// What a [`ClockWatch`] made of one more sample.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ClockVerdict {
    /// Not enough yet to tell (the first sample, or one that overlaps the reference).
    Unknown,
    /// The store's clock moved as much as this host's boot clock did, within the tolerance, over
    /// at least `span` (between the reference's answer and this sample's sending).
    Agrees {
        /// How long a span the agreement covers at least.
        span: Duration,
        /// How much longer the span may have been (the two round trips' widths): the rate the
        /// agreement vouches for is known only to within (`uncertainty` + slack) / `span`.
        uncertainty: Duration,
    },
    /// The store's clock moved `store_secs` while this host's moved between `local_min_secs` and
    /// `local_max_secs`, beyond the tolerance: a step of either clock (the difference is
    /// sudden), or clocks that run at different rates.
    Disagrees {
        /// How far the store's clock moved.
        store_secs: f64,
        /// How far this host's boot clock moved at least (between the reference's answer and
        /// this sample's sending).
        local_min_secs: f64,
        /// How far it moved at most (between the reference's sending and this sample's answer).
        local_max_secs: f64,
    },
}

/// Compares the store's clock with this host's boot clock, round trip by round trip.
///
/// Between a reference sample and a new one, the store's clock must have moved as far as this
/// host's did, within the bounds the two round trips leave (the store read its clock somewhere
/// inside each), stretched by the clock-rate tolerance, plus `slack` for rounding. Anything else
/// is a disagreement: a step of the store's wall clock, or a clock (either) that runs fast or
/// slow. Neither side can tell which; the callers stop relying on timing that needs both clocks to
/// agree (grants, a leadership period). The reference moves forward every `window`, so a rate
/// error shows over long spans and a step shows once.
#[derive(Debug, Clone)]
pub struct ClockWatch {
    tolerance: f64,
    slack: Duration,
    window: Duration,
    reference: Option<ClockSample>,
}

impl ClockWatch {
    /// A watch that allows the clocks to differ in rate by `tolerance` (a fraction) and readings
    /// by `slack`; the reference moves forward every `window`.
    pub fn new(tolerance: f64, slack: Duration, window: Duration) -> ClockWatch {
        ClockWatch { tolerance, slack, window, reference: None }
    }

    /// Forgets the reference: the next sample starts afresh.
    pub fn reset(&mut self) {
        self.reference = None;
    }

    /// Makes `sample` (one that agreed) the reference when its round trip was narrower: spans
    /// measured from it vouch for a rate sooner (a disagreement seen on a slow round trip would
    /// otherwise widen every comparison until the reference moves on).
    pub fn prefer_narrower(&mut self, sample: ClockSample) {
        let width = |s: &ClockSample| s.received.saturating_duration_since(s.sent);
        if self.reference.is_some_and(|reference| width(&sample) < width(&reference)) {
            self.reference = Some(sample);
        }
    }

    /// Takes one more sample.
    pub fn observe(&mut self, sample: ClockSample) -> ClockVerdict {
        let Some(reference) = self.reference else {
            self.reference = Some(sample);
            return ClockVerdict::Unknown;
        };
        if sample.sent < reference.received {
            // The two calls overlapped: no lower bound on the time between them.
            return ClockVerdict::Unknown;
        }
        let local_min = sample.sent.saturating_duration_since(reference.received).as_secs_f64();
        let local_max = sample.received.saturating_duration_since(reference.sent).as_secs_f64();
        let store = sample.store_secs - reference.store_secs;
        let slack = self.slack.as_secs_f64();
        let agrees =
            store >= local_min * (1.0 - self.tolerance) - slack && store <= local_max * (1.0 + self.tolerance) + slack;
        if !agrees {
            self.reference = Some(sample);
            return ClockVerdict::Disagrees { store_secs: store, local_min_secs: local_min, local_max_secs: local_max };
        }
        let span = sample.sent.saturating_duration_since(reference.received);
        let uncertainty = Duration::from_secs_f64((local_max - local_min).max(0.0));
        if span >= self.window {
            self.reference = Some(sample);
        }
        ClockVerdict::Agrees { span, uncertainty }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::clock::{BootInstant, ClockSample, ClockVerdict, ClockWatch};

    /// A sample of a call sent `at` seconds after `zero`, taking `rtt` seconds, the store reading
    /// `store` seconds.
    fn sample(zero: BootInstant, at: f64, rtt: f64, store: f64) -> ClockSample {
        ClockSample {
            sent: zero + Duration::from_secs_f64(at),
            received: zero + Duration::from_secs_f64(at + rtt),
            store_secs: 1_000_000.0 + store,
        }
    }

    #[test]
    fn clocks_that_agree_within_the_tolerance_agree_and_steps_or_other_rates_do_not() {
        let zero = BootInstant::now();
        let watch = || ClockWatch::new(0.01, Duration::from_millis(5), Duration::from_secs(10));
        // The store reads its clock in the middle of each call, at the real rate.
        let mut w = watch();
        assert_eq!(w.observe(sample(zero, 0.0, 0.002, 0.001)), ClockVerdict::Unknown);
        for n in 1..50 {
            let at = f64::from(n) * 0.2;
            assert!(matches!(w.observe(sample(zero, at, 0.002, at + 0.001)), ClockVerdict::Agrees { .. }), "{at}");
        }
        // A slow round trip is no disagreement: the store read somewhere inside it.
        assert!(matches!(w.observe(sample(zero, 10.2, 0.5, 10.6)), ClockVerdict::Agrees { .. }));
        // The store's clock steps forward 60 s, then back 120 s: each seen once.
        assert!(matches!(w.observe(sample(zero, 11.0, 0.002, 71.001)), ClockVerdict::Disagrees { .. }));
        assert!(matches!(w.observe(sample(zero, 11.2, 0.002, 71.201)), ClockVerdict::Agrees { .. }));
        assert!(matches!(w.observe(sample(zero, 11.4, 0.002, -48.599)), ClockVerdict::Disagrees { .. }));
        // This host's clock runs at half the store's rate: seen on the next call.
        let mut slow = watch();
        slow.observe(sample(zero, 0.0, 0.002, 0.001));
        assert!(matches!(slow.observe(sample(zero, 0.1, 0.002, 0.2)), ClockVerdict::Disagrees { .. }));
        // Or at twice it (the store's half).
        let mut fast = watch();
        fast.observe(sample(zero, 0.0, 0.002, 0.001));
        assert!(matches!(fast.observe(sample(zero, 0.2, 0.002, 0.1)), ClockVerdict::Disagrees { .. }));
        // 2 % off over a 10 s span, beyond a 1 % tolerance.
        let mut drift = watch();
        drift.observe(sample(zero, 0.0, 0.002, 0.001));
        assert!(matches!(drift.observe(sample(zero, 9.0, 0.002, 9.0 * 1.02)), ClockVerdict::Disagrees { .. }));
        // Overlapping calls tell nothing.
        let mut overlap = watch();
        overlap.observe(sample(zero, 0.0, 0.5, 0.2));
        assert_eq!(overlap.observe(sample(zero, 0.1, 0.1, 500.0)), ClockVerdict::Unknown);
    }

    #[test]
    fn the_boot_clock_moves_forward_with_real_time() {
        let before = BootInstant::now();
        std::thread::sleep(Duration::from_millis(20));
        let after = BootInstant::now();
        assert!(after.saturating_duration_since(before) >= Duration::from_millis(20));
        assert!(after > before + Duration::from_millis(19));
    }
}
