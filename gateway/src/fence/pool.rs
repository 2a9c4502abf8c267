//! The fence store's connections: the pool, and how a connection whose call ran past its time
//! leaves it.

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod};
use tokio_postgres_rustls::MakeRustlsConnect;
use tracing::debug;

use crate::security::database::Database;

/// Builds a connection pool of `size` to `database` (TLS as its `sslmode` says). Its sessions
/// run at READ COMMITTED whatever the database's default: fence decisions, new terms and
/// releases decide on the newest rows (the functions refuse an older snapshot).
pub fn pool(database: &Database, size: usize) -> Result<Pool, String> {
    let mut config = database.config.clone();
    let isolation = r"-c default_transaction_isolation=read\ committed";
    let options = match config.get_options() {
        Some(given) if !given.is_empty() => format!("{given} {isolation}"),
        _ => isolation.to_owned(),
    };
    config.options(&options);
    let manager =
        Manager::from_config(config, database.tls.clone(), ManagerConfig { recycling_method: RecyclingMethod::Fast });
    Pool::builder(manager).max_size(size).build().map_err(|error| format!("database pool: {error}"))
}

/// Cancels whatever the connection is running and removes it from the pool. The cancel request
/// goes the way the connection did (over TLS when `sslmode` asks for it), so the server acts on
/// it and a decision that timed out does not commit later.
pub fn discard(client: Object, tls: &MakeRustlsConnect) {
    let cancel = client.cancel_token();
    drop(Object::take(client));
    let tls = tls.clone();
    tokio::spawn(async move {
        if let Err(error) = cancel.cancel_query(tls).await {
            debug!(error = %crate::error_chain(&error), "could not cancel a query that ran past its time");
        }
    });
}
