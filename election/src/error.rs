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

    /// A follower of a fenced log is behind its retention: the entries after `applied` up to
    /// `first_seq - 1` are gone. Take a snapshot of the state up to `first_seq - 1`, report that
    /// position, and follow again.
    #[error("stream {stream:?} is compacted: entries after {applied} up to {} are gone; resnapshot from sequence {first_seq}", first_seq - 1)]
    Compacted {
        /// The stream.
        stream: String,
        /// The follower's last applied sequence.
        applied: i64,
        /// The stream's first kept entry.
        first_seq: i64,
    },

    /// A follower's `apply` failed on an entry (not reported as applied: it is applied again).
    #[error("stream {stream:?}: applying entry {seq} failed: {message}")]
    Apply {
        /// The stream.
        stream: String,
        /// The entry's sequence number.
        seq: i64,
        /// What `apply` said.
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
