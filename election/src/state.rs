//! What leader code sees: the state, the events, and one [`Leadership`] per term.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::Error;

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
    /// The elector was shut down.
    Shutdown,
}

impl LossReason {
    /// A short label for logs and metrics.
    pub fn as_label(&self) -> &'static str {
        match self {
            LossReason::RenewRefused { .. } => "renew_refused",
            LossReason::RenewFailed { .. } => "renew_failed",
            LossReason::RenewTimedOut => "renew_timed_out",
            LossReason::DeadlinePassed => "deadline_passed",
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
    deadline: watch::Receiver<Instant>,
}

impl Leadership {
    pub(crate) fn new(key: Arc<str>, term: i64, token: CancellationToken, deadline: watch::Receiver<Instant>) -> Self {
        Leadership { key, term, token, deadline }
    }

    /// The term of this period: the fencing token.
    pub fn term(&self) -> i64 {
        self.term
    }

    /// The current local deadline; renewals move it later.
    pub fn deadline(&self) -> Instant {
        *self.deadline.borrow()
    }

    /// Cancelled the instant this period ends. Hand it to leader-only work.
    pub fn cancellation_token(&self) -> &CancellationToken {
        &self.token
    }

    /// True while this period lasts: not ended by the elector and the deadline not passed.
    /// Check it immediately before any action others can see.
    pub fn is_valid(&self) -> bool {
        !self.token.is_cancelled() && Instant::now() < self.deadline()
    }

    /// The term while this period lasts, else [`Error::NotLeader`].
    pub fn check(&self) -> Result<i64, Error> {
        if self.is_valid() { Ok(self.term) } else { Err(self.not_leader()) }
    }

    /// The token to stamp a write with while this period lasts, else [`Error::NotLeader`].
    pub fn fencing_token(&self) -> Result<FencingToken, Error> {
        self.check().map(FencingToken)
    }

    /// Resolves when this period ends: cancelled by the elector, or the deadline passed.
    pub async fn ended(&self) {
        let mut deadline = self.deadline.clone();
        loop {
            let until = *deadline.borrow_and_update();
            if Instant::now() >= until {
                return;
            }
            tokio::select! {
                biased;
                () = self.token.cancelled() => return,
                () = tokio::time::sleep_until(until) => {}
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
    /// instant the period ends, and [`Error::NotLeader`] is returned instead of its output.
    pub async fn run<F: Future>(&self, work: F) -> Result<F::Output, Error> {
        if !self.is_valid() {
            return Err(self.not_leader());
        }
        tokio::select! {
            biased;
            () = self.ended() => Err(self.not_leader()),
            output = work => Ok(output),
        }
    }

    fn not_leader(&self) -> Error {
        Error::NotLeader { key: self.key.to_string() }
    }
}
