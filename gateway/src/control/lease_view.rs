//! The gateway's own view of each configured lease, exported as metrics: the dashboard then
//! shows who leads, with which term and how much time is left, whatever language the leaders are
//! written in (the election library's `election_*` series exist only in Rust leaders).

use std::collections::BTreeSet;
use std::time::Duration;

use deadpool_postgres::Pool;
use fencing_schema::store;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::metrics as names;

/// How often the store is read.
const EVERY: Duration = Duration::from_secs(1);

/// Reads the configured leases every second until `shutdown`, each read bounded by `timeout`.
/// A key without a row, or a store that does not answer, shows no holder.
pub async fn watch(pool: Pool, keys: BTreeSet<String>, timeout: Duration, shutdown: CancellationToken) {
    if keys.is_empty() {
        return;
    }
    loop {
        for key in &keys {
            let read = tokio::time::timeout(timeout, async {
                let client = pool.get().await.map_err(|error| error.to_string())?;
                store::get_lease(&**client, key).await.map_err(|error| error.to_string())
            })
            .await;
            // The lock-delay stays at the last value known when the store does not answer.
            let (held, term, remaining, delay) = match read {
                Ok(Ok(Some(lease))) => {
                    // Terms stay far below 2^53: exact as a gauge value.
                    let held = !lease.remaining.is_zero();
                    (held, lease.term as f64, lease.remaining.as_secs_f64(), Some(lease.lock_delay.as_secs_f64()))
                }
                Ok(Ok(None)) => (false, 0.0, 0.0, Some(0.0)),
                Ok(Err(error)) => {
                    debug!(%key, %error, "lease view: read failed");
                    (false, 0.0, 0.0, None)
                }
                Err(_) => (false, 0.0, 0.0, None),
            };
            if let Some(delay) = delay {
                metrics::gauge!(names::LEASE_LOCK_DELAY, "key" => key.clone()).set(delay);
            }
            let label = key.clone();
            metrics::gauge!(names::LEASE_HELD, "key" => label.clone()).set(if held { 1.0 } else { 0.0 });
            // The term stays at the last one known when the store does not answer.
            if term > 0.0 {
                metrics::gauge!(names::LEASE_TERM, "key" => label.clone()).set(term);
            }
            metrics::gauge!(names::LEASE_REMAINING, "key" => label).set(remaining);
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(EVERY) => {}
        }
    }
}
