//! What a decision is: what the write presented, what the store (or a grant) said, and the
//! verdict on the write.

use std::sync::Arc;
use std::time::Duration;

use fencing_election::clock::BootInstant;
use fencing_schema::store::{Gate, Outcome};
use tokio::time::Instant;

use crate::fence::clock::StoreClock;

/// A decision, with the two instants S5 anchors on: the store decided at some instant between
/// `asked` and `answered` and said to wait `gate.wait` from it. So the write is sent no earlier
/// than `answered + wait` (plus the settle margin) and no later than `asked + wait + forward
/// timeout` (the store's horizon covers no later deadline).
#[derive(Debug, Clone)]
pub struct Decision {
    /// What the store (or a grant) decided.
    pub gate: Gate,
    /// No later than the instant of the decision.
    pub asked: Instant,
    /// No earlier than the instant of the decision.
    pub answered: Instant,
    /// The clocks' agreement the decision was made under.
    pub clocks: ClockTicket,
}

/// The clocks' agreement a decision was made under: the write's settle wait and forward
/// deadline are counted on this gateway's monotonic clock, so they stand only while that still
/// agrees with the store's (no disagreement seen since the decision) and has not fallen behind
/// the boot clock (the host was not suspended meanwhile: the monotonic clock stops then).
#[derive(Debug, Clone)]
pub struct ClockTicket {
    clock: Arc<StoreClock>,
    generation: u64,
    made: Instant,
    made_boot: BootInstant,
}

/// How far the monotonic clock may fall behind the boot clock before the host counts as
/// having been suspended.
const SUSPEND: Duration = Duration::from_millis(10);

impl ClockTicket {
    /// Under `generation` of `clock`'s agreement, both read before the decision was asked for at
    /// `asked` (on the monotonic and the boot clock): a suspend from then on is seen.
    pub(super) fn new(clock: &Arc<StoreClock>, generation: u64, asked: (Instant, BootInstant)) -> ClockTicket {
        ClockTicket { clock: Arc::clone(clock), generation, made: asked.0, made_boot: asked.1 }
    }

    /// The agreement's generation.
    pub(super) fn generation(&self) -> u64 {
        self.generation
    }

    /// Whether the clocks have agreed since the decision, and the host was not suspended: what
    /// was counted since on this gateway's clock may be acted on (the write sent, a settle
    /// marked over).
    pub fn holds(&self) -> bool {
        let suspended =
            BootInstant::now().saturating_duration_since(self.made_boot) > self.made.elapsed().saturating_add(SUSPEND);
        self.clock.trusted() && self.clock.generation() == self.generation && !suspended
    }
}

/// What a fenced write presents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Presented {
    /// Verify mode: `Fencing-Token`.
    Token(i64),
    /// Stamp mode: `Fencing-Lease` and `Fencing-Owner`.
    Lease {
        /// The lease key.
        key: String,
        /// The owner claiming to hold it.
        owner: String,
    },
}

/// What a decision says of the write that presented `presented`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Admitted: forward it with this term.
    Admitted(i64),
    /// Refused: stale, not the leader, a future term.
    Refused(Refusal),
    /// Admitted without a term, which the store never answers: not forwarded.
    Unanswered,
}

/// A refused write, as the fence saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Why (never `Admitted`).
    pub outcome: Outcome,
    /// The term presented (in stamp mode the lease's term, `None` when no term applies).
    pub presented_term: Option<i64>,
    /// The term the writer lost to.
    pub current_term: Option<i64>,
}

impl Decision {
    /// The verdict on the write that presented `presented`.
    pub fn verdict(&self, presented: &Presented) -> Verdict {
        let gate = &self.gate;
        match gate.outcome {
            Outcome::Admitted => gate.term.map_or(Verdict::Unanswered, Verdict::Admitted),
            outcome => Verdict::Refused(Refusal {
                outcome,
                presented_term: match presented {
                    Presented::Token(term) => Some(*term),
                    Presented::Lease { .. } => gate.term,
                },
                current_term: gate.current_term(),
            }),
        }
    }
}

/// Why a decision could not be made.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Undecided {
    /// No answer within the fence-check timeout.
    #[error("the fence check timed out")]
    TimedOut,
    /// The store failed or could not be reached.
    #[error("the fence store failed: {0}")]
    Failed(String),
    /// This gateway's clock and the store's disagree (or have not agreed long enough yet): its
    /// waits and deadlines cannot be trusted, so it admits nothing.
    #[error("this gateway's clock and the fence store's disagree; nothing is admitted until they agree again")]
    ClocksDisagree,
}
