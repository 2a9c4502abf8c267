//! The election library against a real PostgreSQL: in-process electors, and the example
//! elector as real processes that are killed, paused, cut off from the store and shut down.

#![allow(clippy::unwrap_used)]

mod daemons;
mod in_process;
mod log;
mod membership;
mod processes;
