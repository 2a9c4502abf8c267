//! What leader code sees: the state, the events, and one [`Leadership`] per term.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::clock::BootInstant;
use crate::error::Error;

/// A period's deadline on two clocks: `boot` (`CLOCK_BOOTTIME`) decides whether the period
/// lasts; `wake` (tokio's clock) only schedules wake-ups and is what [`Leadership::deadline`]
/// shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Deadline {
    pub(crate) wake: Instant,
    pub(crate) boot: BootInstant,
}

/// Whether this process leads, watchable through [`crate::ElectorHandle::state`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaderState {
    /// Not leading: acquiring, backing off, or shut down.
    Follower,
    /// Leading with `term` until `deadline` on this process's monotonic clock, unless renewed.
    /// Readers must still compare `deadline` with the current instant: the state is replaced
    /// when the elector task runs, and a paused process resumes with stale state.
    Leader {
        /// The fencing token of this leadership period.
        term: i64,
        /// When this process stops acting as leader unless a renewal extends it.
        deadline: Instant,
    },
}

impl LeaderState {
    /// The term, when leading and the deadline has not passed.
    pub fn current_term(&self) -> Option<i64> {
        match *self {
            LeaderState::Leader { term, deadline } if Instant::now() < deadline => Some(term),
            _ => None,
        }
    }
}

/// Why a leadership period ended for this process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LossReason {
    /// The store refused the renewal: the lease expired or another owner holds it.
    RenewRefused {
        /// The holder the store named, if any.
        holder: Option<String>,
    },
    /// The renewal failed (connection lost, store error).
    RenewFailed {
        /// What went wrong.
        error: String,
    },
    /// The renewal did not answer within the query timeout or before the deadline.
    RenewTimedOut,
    /// The local deadline passed without a successful renewal.
    DeadlinePassed,
    /// The store's clock and this host's boot clock disagreed (a step of the store's wall clock,
    /// or a clock running fast or slow): a deadline counted on this host's clock may not end
    /// before the store's expiry.
    ClockDisagreement,
    /// The elector was shut down.
    Shutdown,
    /// A handover was requested of this term (`fencing.request_resign`, `admin handover`,
    /// `POST /v1/leases/{key}/resign-request`): the elector stopped leader work, drained it and
    /// released the lease, and waits a ttl before it tries to lead again.
    Resigned,
}

impl LossReason {
    /// A short label for logs and metrics.
    pub fn as_label(&self) -> &'static str {
        match self {
            LossReason::RenewRefused { .. } => "renew_refused",
            LossReason::RenewFailed { .. } => "renew_failed",
            LossReason::RenewTimedOut => "renew_timed_out",
            LossReason::DeadlinePassed => "deadline_passed",
            LossReason::Resigned => "resigned",
            LossReason::ClockDisagreement => "clock_disagreement",
            LossReason::Shutdown => "shutdown",
        }
    }
}

/// A change of leadership, from [`crate::ElectorHandle::events`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// This process now leads with `term`.
    Elected {
        /// The fencing token of the new period.
        term: i64,
    },
    /// This process stopped leading `term`.
    Lost {
        /// The term that ended.
        term: i64,
        /// Why.
        reason: LossReason,
    },
    /// While a follower, the holder the store reports changed.
    HolderChanged {
        /// The valid holder, or `None` when nobody holds the lease.
        holder: Option<String>,
        /// The term of the holder's period (or the last one).
        term: Option<i64>,
    },
}

/// The term to present on a fenced write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FencingToken(i64);

impl FencingToken {
    /// The request header the gateway reads the token from.
    pub const HEADER: &'static str = "Fencing-Token";

    pub(crate) fn new(term: i64) -> FencingToken {
        FencingToken(term)
    }

    /// The term.
    pub fn term(self) -> i64 {
        self.0
    }

    /// The header's value: the term in decimal.
    pub fn header_value(self) -> String {
        self.0.to_string()
    }
}

/// One leadership period of this process: its term, its cancellation token (cancelled the
/// instant the period ends), and its deadline (which renewals extend).
#[derive(Debug, Clone)]
pub struct Leadership {
    key: Arc<str>,
    term: i64,
    token: CancellationToken,
    deadline: watch::Receiver<Deadline>,
    /// The period's work and sends under way ([`Leadership::run`], [`Leadership::run_send`]):
    /// a handover waits for them to stop before it releases.
    work: tokio_util::task::TaskTracker,
}

impl Leadership {
    pub(crate) fn new(
        key: Arc<str>,
        term: i64,
        token: CancellationToken,
        deadline: watch::Receiver<Deadline>,
        work: tokio_util::task::TaskTracker,
    ) -> Self {
        Leadership { key, term, token, deadline, work }
    }

    /// The term of this period: the fencing token.
    pub fn term(&self) -> i64 {
        self.term
    }

    /// The current local deadline, on tokio's clock; renewals move it later. Whether the period
    /// lasts is decided on the boot clock ([`Leadership::is_valid`]), which keeps counting
    /// while the host is suspended.
    pub fn deadline(&self) -> Instant {
        self.deadline.borrow().wake
    }

    /// Cancelled the instant this period ends. Hand it to leader-only work.
    pub fn cancellation_token(&self) -> &CancellationToken {
        &self.token
    }

    /// True while this period lasts: not ended by the elector and the deadline not passed on
    /// the boot clock. Check it immediately before any action others can see.
    pub fn is_valid(&self) -> bool {
        !self.token.is_cancelled() && BootInstant::now() < self.deadline.borrow().boot
    }

    /// The term while this period lasts, else [`Error::NotLeader`].
    pub fn check(&self) -> Result<i64, Error> {
        if self.is_valid() { Ok(self.term) } else { Err(self.not_leader()) }
    }

    /// The token to stamp a write with while this period lasts, else [`Error::NotLeader`].
    pub fn fencing_token(&self) -> Result<FencingToken, Error> {
        self.check().map(FencingToken)
    }

    /// Resolves when this period ends: cancelled by the elector (or its deadline watchdog), or
    /// the deadline passed.
    pub async fn ended(&self) {
        let mut deadline = self.deadline.clone();
        loop {
            if !self.is_valid() {
                return;
            }
            let until = deadline.borrow_and_update().wake;
            tokio::select! {
                biased;
                () = self.token.cancelled() => return,
                () = tokio::time::sleep_until(until) => {
                    // The boot clock decides; it never lags the timer's clock by more than a
                    // rounding, so this loops at most once more.
                    if self.is_valid() {
                        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                    }
                }
                changed = deadline.changed() => {
                    if changed.is_err() {
                        // The elector dropped the period's deadline: the period is over.
                        return;
                    }
                }
            }
        }
    }

    /// Runs `work` while this period lasts: it is dropped (stopped at its next await) the
    /// instant the period ends, and [`Error::NotLeader`] is returned instead of its output. The
    /// period is checked on every poll of `work`, not only when a timer fires.
    pub async fn run<F: Future>(&self, work: F) -> Result<F::Output, Error> {
        self.guard(work, Leadership::not_leader).await
    }

    /// Runs a fenced send while this period lasts, checking the period on every poll. When the
    /// period ends before the send was first polled, nothing was sent: [`Error::NotLeader`].
    /// When it ends after, the send may have reached its destination (a request handed to a
    /// connection task goes on when its future is dropped): [`Error::OutcomeUnknown`].
    pub async fn run_send<F: Future>(&self, send: F) -> Result<F::Output, Error> {
        self.guard(send, Leadership::outcome_unknown).await
    }

    async fn guard<F: Future>(&self, work: F, after_start: fn(&Leadership) -> Error) -> Result<F::Output, Error> {
        if !self.is_valid() {
            return Err(self.not_leader());
        }
        let started = AtomicBool::new(false);
        let mut work = std::pin::pin!(work);
        let guarded = std::future::poll_fn(|cx| {
            if !self.is_valid() {
                return Poll::Ready(Err(()));
            }
            started.store(true, Ordering::Relaxed);
            work.as_mut().poll(cx).map(Ok)
        });
        let outcome = self
            .work
            .track_future(async {
                tokio::select! {
                    biased;
                    () = self.ended() => Err(()),
                    output = guarded => output,
                }
            })
            .await;
        outcome.map_err(|()| if started.load(Ordering::Relaxed) { after_start(self) } else { self.not_leader() })
    }

    fn outcome_unknown(&self) -> Error {
        Error::OutcomeUnknown { key: self.key.to_string() }
    }

    fn not_leader(&self) -> Error {
        Error::NotLeader { key: self.key.to_string() }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use tokio::sync::watch;
    use tokio::time::Instant;
    use tokio_util::sync::CancellationToken;

    use crate::clock::BootInstant;
    use crate::state::{Deadline, Leadership};

    /// S7 across a suspend: tokio's clock (CLOCK_MONOTONIC) stops while the host sleeps, the
    /// boot clock does not. Here the timer deadline lies far ahead, as a stopped monotonic clock
    /// would make it, while the boot-clock deadline passes: the period is over.
    #[test]
    fn validity_is_decided_on_the_boot_clock_not_on_the_timer_clock() {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("a runtime");
        runtime.block_on(async {
            let deadline = Deadline {
                wake: Instant::now() + Duration::from_secs(3600),
                boot: BootInstant::now() + Duration::from_millis(50),
            };
            let (_sender, receiver) = watch::channel(deadline);
            let leadership = Leadership::new(Arc::from("k"), 1, CancellationToken::new(), receiver, Default::default());
            assert!(leadership.is_valid());
            std::thread::sleep(Duration::from_millis(80));
            assert!(!leadership.is_valid(), "still valid by the timer clock after the boot-clock deadline");
            assert!(leadership.check().is_err());
        });
    }
}
