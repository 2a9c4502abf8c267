//! A model of the fencing protocol, checked exhaustively with [`stateright`].
//!
//! The protocol is spread over the SQL functions (`schema/functions/*.sql`), the gateway's fence
//! store (`gateway/src/fence/`, `gateway/src/proxy/forward.rs`) and the elector
//! (`election/src/runtime.rs`). This crate states it once, as one state machine
//! ([`Protocol`], a [`stateright::Model`]) at the granularity at which the real code can
//! interleave: each SQL statement that reads, locks or writes is one step, a transaction that
//! sleeps holding a lock spans real time, a gateway's decision, its grant and its send are
//! separate steps, and every clock is its own (the store's wall clock, which may be stepped; each
//! gateway's boot clock, which may drift by a bounded amount; real time, which the store's sleep
//! timer follows).
//!
//! The properties are the contract's S1-S5 and S7 (`docs/CONTRACT.md`), checked on ghost variables the
//! transitions keep ([`Ghost`]); S5's timing assumption (no pause between a gateway's last check
//! and its send) is a switch of the model ([`Config::pause_assumption`]).
//!
//! # Layout
//!
//! - [`config`]: what is checked (sizes, time, faults), the planted bugs ([`Plant`]) and the
//!   timing abstraction ([`Timing`]).
//! - [`state`]: the state: the store's tables and open transactions, gateways, electors, ghosts.
//! - [`protocol`]: the transitions ([`Action`]) and the properties.
//! - [`mirrors`]: which SQL function or Rust function each transition mirrors, so that a test can
//!   check that they still exist.
//! - [`symmetry`]: one representative per renaming of gateways, electors and bound resources.
//! - [`check`]: runs the breadth-first checker and reports states, time and counterexamples.
//! - [`history`]: a counterexample as a readable, numbered history.

pub mod check;
pub mod config;
pub mod history;
pub mod mirrors;
pub mod protocol;
pub mod state;
pub mod symmetry;

pub use check::{Report, check};
pub use config::{Config, Plant, Timing};
pub use protocol::{Action, Invariant, Protocol, Witness};
pub use state::{Ghost, State};
