//! The fencing gateway: an HTTP proxy that every leader write passes through, which admits a
//! write only when its term is current for the resource it changes, and a control API.
//!
//! # Layout
//!
//! A fenced write walks the rooms in this order: [`listener`] (the connection) -> [`security`]
//! (Host, who is asking) -> [`proxy`] (route, request rules, the write as the fence sees it) ->
//! [`fence`] (the decision) -> [`proxy::upstream`] (the send) or [`fence::refusals`] (the
//! record of a refusal).
//!
//! - [`app`]: the wiring: the fence store, the control API and the proxy on their listeners.
//! - [`proxy`]: the proxy listener's handler: route, request rules, forward, stream back.
//! - [`fence`]: the fence store: decisions batched to `fencing.gate_many`, grants, the cache of
//!   maxima, the refusal record. It knows nothing of HTTP.
//! - [`control`]: the control listener: leases, fences, clusters and nodes, daemons, health,
//!   metrics; one file per resource.
//! - [`listener`]: the accept loop both listeners share (timeouts, limits, proxy threads, drain).
//! - [`security`]: clients and bearer tokens, the Host check, rustls, the Postgres connection.
//! - [`config`]: the configuration file and its environment overrides, checked section by
//!   section. It knows nothing of the proxy.
//! - [`names`]: the one spelling of resource names and paths (S8), for config and proxy.
//! - [`problem`]: problem+json, the shape of every answer the gateway makes itself.
//! - [`metrics`]: metric names, help and per-route handles.
//! - [`cpus`]: the CPUs this process may run on.
//! - [`ops`]: the operator's commands: `serve`, `demo`, `inspect`, `admin`, `migrate`,
//!   `token`, the embedded Postgres. Nothing but `main.rs` uses it.
//!
//! Imports run one way, down this list read from the bottom up: `ops` may use everything;
//! `control` and `proxy` use `fence`, `security`, `config`; `fence` uses `metrics` and
//! `security::database` only.

pub mod app;
pub mod config;
pub mod control;
pub mod cpus;
mod error;
pub mod fence;
pub mod listener;
pub mod metrics;
pub mod names;
pub mod ops;
pub mod problem;
pub mod proxy;
pub mod security;

pub use error::{Error, error_chain};
