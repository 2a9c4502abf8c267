//! The one error type of `fencing-election`.

/// What can go wrong when configuring an elector or acting as leader.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A setting cannot be safe; the message names it and the bound it breaks.
    #[error("invalid elector setting: {0}")]
    InvalidSetting(String),

    /// This process does not lead (or its leadership ended before the action started).
    #[error("not the leader of lease {key:?}")]
    NotLeader {
        /// The lease key.
        key: String,
    },

    /// The leadership ended while a fenced send was in flight: it may or may not have reached
    /// its destination. Treat the write as indeterminate.
    #[error("leadership of lease {key:?} ended while a fenced send was in flight; its outcome is unknown")]
    OutcomeUnknown {
        /// The lease key.
        key: String,
    },
}
