//! Who may talk to the gateway, and over what: clients and their bearer tokens (`auth`), the
//! `Host` check both listeners make (`host`), rustls for the listeners and `https://` upstreams
//! (`tls`), and the Postgres connection with libpq's `sslmode` (`database`).
//!
//! It knows nothing of routes, fences or the proxy: the configuration and both listeners use it.

pub mod auth;
pub mod database;
pub mod host;
pub mod tls;
