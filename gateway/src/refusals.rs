//! The record of refused writes: each fence rejection (resource, route, outcome, presented and
//! current term) is written to `fencing.refusals` in the background, in batches, so an incident
//! review can prove what was stopped. It never delays a response and never costs a WAL flush.

use std::time::{Duration, SystemTime};

use deadpool_postgres::Pool;
use fencing_schema::store::{self, Refusal};
use tokio::sync::mpsc;
use tokio::time::timeout;
use tracing::warn;

use crate::metrics as names;

/// Refusals waiting to be written; beyond this, new ones are dropped (and counted).
const QUEUE: usize = 10_000;
/// The most refusals one write carries.
const BATCH: usize = 500;
/// How many refusals `fencing.refusals` keeps.
pub const KEEP: i32 = 10_000;

/// Where the proxy reports refusals.
#[derive(Debug, Clone)]
pub struct RefusalLog {
    queue: mpsc::Sender<Refusal>,
}

impl RefusalLog {
    /// Starts the background writer on the current runtime.
    pub fn start(pool: Pool) -> RefusalLog {
        let (queue, pending) = mpsc::channel(QUEUE);
        tokio::spawn(write_batches(pool, pending));
        RefusalLog { queue }
    }

    /// Reports one refusal; never waits.
    pub fn record(
        &self,
        resource: &str,
        route: &str,
        outcome: &str,
        presented_term: Option<i64>,
        current_term: Option<i64>,
    ) {
        let refusal = Refusal {
            at: SystemTime::now(),
            resource: resource.to_owned(),
            route: Some(route.to_owned()),
            outcome: outcome.to_owned(),
            presented_term,
            current_term,
            gateway: None,
        };
        if self.queue.try_send(refusal).is_err() {
            metrics::counter!(names::REFUSALS_DROPPED).increment(1);
        }
    }
}

async fn write_batches(pool: Pool, mut pending: mpsc::Receiver<Refusal>) {
    let gateway = format!(
        "{}-{}",
        std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_owned()).unwrap_or_default(),
        std::process::id()
    );
    let mut batch = Vec::with_capacity(BATCH);
    while pending.recv_many(&mut batch, BATCH).await > 0 {
        let written = timeout(Duration::from_secs(5), async {
            let client = pool.get().await.map_err(|error| error.to_string())?;
            store::record_refusals(&**client, &batch, &gateway, KEEP).await.map_err(|error| error.to_string())
        })
        .await;
        match written {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                warn!(%error, refusals = batch.len(), "could not record refused writes");
                metrics::counter!(names::REFUSALS_DROPPED).increment(batch.len() as u64);
            }
            Err(_) => {
                warn!(refusals = batch.len(), "recording refused writes timed out");
                metrics::counter!(names::REFUSALS_DROPPED).increment(batch.len() as u64);
            }
        }
        batch.clear();
    }
}
