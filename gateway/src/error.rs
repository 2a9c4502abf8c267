//! The one error type of the gateway crate.

/// What can stop a gateway command.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The database could not be reached.
    #[error("connect to the database")]
    Connect(#[source] tokio_postgres::Error),

    /// The schema could not be migrated or is at the wrong version.
    #[error(transparent)]
    Schema(#[from] fencing_schema::Error),

    /// Something the gateway needs could not be set up (pool, recorder, embedded Postgres).
    #[error("{0}")]
    Setup(String),

    /// What the command line names is not there or cannot be used as given.
    #[error("{0}")]
    Usage(String),

    /// `verify` was pointed at a lease or a resource that someone else uses.
    #[error("{0} (run with --yes to use it all the same)")]
    InUse(String),
}

/// An error and its sources on one line (`a: b: c`), for logs and messages: a failed TLS
/// handshake says why, not only that it failed.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.ends_with(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}
