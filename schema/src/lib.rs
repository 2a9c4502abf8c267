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
//! - [`Error`] is this crate's one error type.

mod error;
mod migrations;
pub mod store;

pub use error::Error;
pub use migrations::{
    ADVISORY_LOCK_KEY, FUNCTIONS, LATEST_VERSION, MIGRATIONS, Migration, MigrationReport, Repeatable,
    check_schema_version, migrate, schema_version,
};

/// The SQLSTATE every refused write raises (class `ZF`, implementation-defined: "fencing").
///
/// Raised by `fencing.admit` and the `fencing.guard` trigger when a term is lower than the
/// resource's maximum, when a bound resource is written with a term other than its lease's
/// current term or while that lease is not held, and when a guarded write presents no term.
pub const SQLSTATE_REFUSED: &str = "ZF409";

/// The SQLSTATE every invalid argument raises (`invalid_parameter_value`).
pub const SQLSTATE_INVALID_ARGUMENT: &str = "22023";

/// The longest lease ttl the SQL functions accept (`fencing.max_ttl()`).
pub const MAX_TTL: std::time::Duration = std::time::Duration::from_secs(3600);
