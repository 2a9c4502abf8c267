//! The fencing gateway: the binary's library.
//!
//! Today this holds the `migrate` command; the proxy and control listeners come next
//! (see `ARCHITECTURE.md`).
//!
//! # Layout
//!
//! - [`cli`] parses the command line.
//! - [`migrate`] connects to a database and applies the embedded schema migrations.
//! - [`Error`] is this crate's one error type.

pub mod cli;
mod error;
pub mod migrate;

pub use error::Error;
