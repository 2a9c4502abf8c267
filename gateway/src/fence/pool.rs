//! The fence store's connections: the pool, and how a connection whose call ran past its time
//! leaves it.
//!
//! A call that ran past its time is never cancelled. PostgreSQL answers a cancel of a commit
//! that waits for its synchronous standby with success ("committed locally, but might not have
//! been replicated"): the decision becomes visible on the primary though the standby lacks it,
//! a later read admits its term, and a failover then admits a lower one (S3;
//! `tests/tests/schema/failover.rs`). Instead, every session carries `statement_timeout`: the
//! server ends a statement that runs too long (a lock wait, a grant's wait) before it commits,
//! and leaves a commit's wait for the standby alone, so a decision nobody heard of either
//! commits on both or dies with the primary.

use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod};

use crate::security::database::Database;

/// Builds a connection pool of `size` to `database` (TLS as its `sslmode` says). Its sessions
/// run at READ COMMITTED whatever the database's default: fence decisions, new terms and
/// releases decide on the newest rows (the functions refuse an older snapshot). The server ends
/// any of their statements that runs longer than `statement_timeout`.
///
/// A new connection is made inside a call bounded by that same timeout, so each host of a
/// multi-host URL gets at most half of it to accept one: a primary that went down without a
/// word (its packets dropped) costs half a call, and the next host, the promoted standby, is
/// reached within the call (the URL's own `connect_timeout` applies when shorter).
pub fn pool(database: &Database, size: usize, statement_timeout: Duration) -> Result<Pool, String> {
    let mut config = database.config.clone();
    let half = (statement_timeout / 2).max(Duration::from_millis(50));
    if config.get_connect_timeout().is_none_or(|given| *given > half) {
        config.connect_timeout(half);
    }
    let ms = statement_timeout.as_millis().max(1);
    let settings = format!(r"-c default_transaction_isolation=read\ committed -c statement_timeout={ms}");
    let options = match config.get_options() {
        Some(given) if !given.is_empty() => format!("{given} {settings}"),
        _ => settings,
    };
    config.options(&options);
    let manager =
        Manager::from_config(config, database.tls.clone(), ManagerConfig { recycling_method: RecyclingMethod::Fast });
    Pool::builder(manager).max_size(size).build().map_err(|error| format!("database pool: {error}"))
}

/// Removes the connection from the pool and closes it, without cancelling what it runs (see the
/// module's notes): the server's `statement_timeout` ends a statement still running.
pub fn discard(client: Object) {
    drop(Object::take(client));
}
