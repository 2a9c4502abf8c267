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

    /// The store did not answer a call other than the elector's own (a value's, a read's) in
    /// time, or failed it; the message says which.
    #[error("lease {key:?}: the store failed: {message}")]
    Store {
        /// The lease key.
        key: String,
        /// What failed.
        message: String,
    },

    /// The leadership ended while a fenced send was in flight: it may or may not have reached
    /// its destination. Treat the write as indeterminate.
    #[error("leadership of lease {key:?} ended while a fenced send was in flight; its outcome is unknown")]
    OutcomeUnknown {
        /// The lease key.
        key: String,
    },
}
