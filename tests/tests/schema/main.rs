//! The fencing SQL schema against a real PostgreSQL: migrations, invariants S1-S4, the guard
//! trigger and bad input. One test binary, so one cluster serves every test; each test gets its
//! own fresh database.

#![allow(clippy::unwrap_used)]

mod audit;
mod bad_input;
mod binding;
mod clock_steps;
mod daemons;
mod decide_on_one_version;
mod drivers;
mod durability;
mod failover;
mod grants;
mod guard;
mod guard_coverage;
mod handover;
mod harness;
mod isolation;
mod lease_values;
mod lock_delay;
mod log;
mod members;
mod migrations;
mod plants;
mod s1_lease_exclusion;
mod s2_lease_model;
mod s3_admitted_terms;
mod s4_bound_resource;
mod s5_gate;
mod watch;
