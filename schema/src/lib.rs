//! The fencing SQL schema and the Rust side of its surface.
//!
//! Everything that decides lives in SQL, in `schema/functions/*.sql`: the lease functions
//! (`fencing.acquire`, `fencing.renew`, `fencing.release`), the fence decision
//! (`fencing.try_admit`, `fencing.admit`, `fencing.bind`) and the trigger a DBA attaches to an
//! existing table (`fencing.guard`, `fencing.protect`). This crate embeds those same files and
//! applies them ([`migrate`]), and gives Rust callers typed calls of the functions
//! ([`store`]). It never repeats a decision in Rust.
//!
//! # Layout
//!
//! - [`migrate`] applies the pending migrations in order, each in its own transaction, under a
//!   transaction-scoped advisory lock, so several replicas may run it at once.
//! - [`schema_version`] and [`check_schema_version`] tell whether a database is at the version this
//!   binary expects.
//! - [`store`] calls the SQL functions and decodes their rows.
//! - [`log`] calls the fenced log's functions (schema version 16): streams, appends, reads,
//!   followers' positions and retention.
//! - [`Error`] is this crate's one error type.

mod error;
pub mod log;
mod migrations;
pub mod store;

pub use error::{Error, SQLSTATE_COMPACTED, SQLSTATE_INVALID_ARGUMENT, SQLSTATE_NO_STREAM, SQLSTATE_REFUSED};
pub use migrations::{
    ADVISORY_LOCK_KEY, FUNCTIONS, LATEST_VERSION, MIGRATIONS, Migration, MigrationReport, Repeatable,
    check_schema_version, migrate, schema_version,
};

/// The longest lease ttl the SQL functions accept (`fencing.max_ttl()`).
pub const MAX_TTL: std::time::Duration = std::time::Duration::from_secs(3600);
