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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::clock::BootInstant;

    #[test]
    fn the_boot_clock_moves_forward_with_real_time() {
        let before = BootInstant::now();
        std::thread::sleep(Duration::from_millis(20));
        let after = BootInstant::now();
        assert!(after.saturating_duration_since(before) >= Duration::from_millis(20));
        assert!(after > before + Duration::from_millis(19));
    }
}
