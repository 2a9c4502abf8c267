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
}
