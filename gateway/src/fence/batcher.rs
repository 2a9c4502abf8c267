//! The batcher: decisions are sent like a group commit. While a lane's calls of
//! `fencing.gate_many` are out, the decisions of newly arrived writes queue up, and the lane's
//! next call takes them all.

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use fencing_election::clock::{BootInstant, ClockSample};
use fencing_schema::store::{GATE_MANY_SQL, Gate};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio::time::{Instant, timeout_at};
use tracing::{debug, warn};

use crate::fence::clock::StoreClock;
use crate::fence::decision::{Presented, Undecided};
use crate::fence::pool::discard;
use crate::metrics as names;

/// One decision waiting to be sent.
#[derive(Debug)]
pub(super) struct Pending {
    resource: String,
    presented: Presented,
    bind_lease: Option<String>,
    reply: oneshot::Sender<Result<Gate, Undecided>>,
}

impl Pending {
    /// A decision to send, and where its answer arrives.
    pub(super) fn new(
        resource: &str,
        presented: &Presented,
        bind_lease: Option<&str>,
    ) -> (Pending, oneshot::Receiver<Result<Gate, Undecided>>) {
        let (reply, answer) = oneshot::channel();
        let pending = Pending {
            resource: resource.to_owned(),
            presented: presented.clone(),
            bind_lease: bind_lease.map(str::to_owned),
            reply,
        };
        (pending, answer)
    }
}

/// Sends queued decisions to Postgres, many per round trip.
#[derive(Debug)]
pub(super) struct Batcher {
    pub(super) pool: Pool,
    pub(super) check_timeout: Duration,
    pub(super) forward_ms: i64,
    pub(super) grant_ms: i64,
    pub(super) in_flight: Arc<Semaphore>,
    pub(super) max_batch: usize,
    /// Each round trip is a sample of the store's clock.
    pub(super) clock: Arc<StoreClock>,
}

impl Batcher {
    pub(super) async fn run(self, mut pending: mpsc::UnboundedReceiver<Pending>) {
        let batcher = Arc::new(self);
        while let Some(first) = pending.recv().await {
            // While every permit is out, decisions accumulate in the queue.
            let Ok(permit) = Arc::clone(&batcher.in_flight).acquire_owned().await else { return };
            let mut batch = vec![first];
            while batch.len() < batcher.max_batch {
                match pending.try_recv() {
                    Ok(next) => batch.push(next),
                    Err(_) => break,
                }
            }
            tokio::spawn(Arc::clone(&batcher).send(batch, permit));
        }
    }

    async fn send(self: Arc<Self>, mut batch: Vec<Pending>, _permit: OwnedSemaphorePermit) {
        // A decision whose writer gave up (timed out) is not sent at all.
        batch.retain(|item| !item.reply.is_closed());
        if batch.is_empty() {
            return;
        }
        // One lock order for every batch of every replica: no deadlock between batches.
        batch.sort_by(|a, b| a.resource.cmp(&b.resource));
        metrics::histogram!(names::BATCH_SIZE).record(batch.len() as f64);
        match self.call(&batch, Instant::now() + self.check_timeout).await {
            Ok(gates) => {
                for (item, gate) in batch.into_iter().zip(gates) {
                    let _ = item.reply.send(Ok(gate));
                }
            }
            Err(error) => {
                for item in batch {
                    let _ = item.reply.send(Err(error.clone()));
                }
            }
        }
    }

    async fn call(&self, batch: &[Pending], deadline: Instant) -> Result<Vec<Gate>, Undecided> {
        let client = match fencing_election::pool::connection_by(&self.pool, deadline).await {
            Some(Ok(client)) => client,
            Some(Err(error)) => {
                return Err(Undecided::Failed(format!("get a connection: {}", crate::error_chain(&error))));
            }
            None => return Err(Undecided::TimedOut),
        };
        let resources: Vec<&str> = batch.iter().map(|item| item.resource.as_str()).collect();
        let mut terms: Vec<Option<i64>> = Vec::with_capacity(batch.len());
        let mut lease_keys: Vec<Option<&str>> = Vec::with_capacity(batch.len());
        let mut owners: Vec<Option<&str>> = Vec::with_capacity(batch.len());
        for item in batch {
            match &item.presented {
                Presented::Token(term) => {
                    terms.push(Some(*term));
                    lease_keys.push(None);
                    owners.push(None);
                }
                Presented::Lease { key, owner } => {
                    terms.push(None);
                    lease_keys.push(Some(key));
                    owners.push(Some(owner));
                }
            }
        }
        let bind_leases: Vec<Option<&str>> = batch.iter().map(|item| item.bind_lease.as_deref()).collect();
        let sent = BootInstant::now();
        let answer = timeout_at(deadline, async {
            let statement = client.prepare_cached(GATE_MANY_SQL).await?;
            client
                .query(
                    &statement,
                    &[&resources, &terms, &lease_keys, &owners, &bind_leases, &self.forward_ms, &self.grant_ms],
                )
                .await
        })
        .await;
        let received = BootInstant::now();
        if let Ok(Ok(rows)) = &answer
            && let Some(store_secs) = rows.first().and_then(|row| row.try_get::<_, f64>("store_clock").ok())
        {
            self.clock.observe(ClockSample { sent, received, store_secs });
        }
        match answer {
            Ok(Ok(rows)) if rows.len() == batch.len() => rows
                .iter()
                .map(|row| Gate::from_row(row).map_err(|error| Undecided::Failed(error.to_string())))
                .collect(),
            Ok(Ok(rows)) => Err(Undecided::Failed(format!(
                "fencing.gate_many answered {} rows for {} decisions",
                rows.len(),
                batch.len()
            ))),
            Ok(Err(error)) => {
                let failure = fencing_schema::Error::from(error);
                if failure.is_store_failure() {
                    discard(client);
                }
                debug!(error = %crate::error_chain(&failure), "fence decision failed");
                Err(Undecided::Failed(crate::error_chain(&failure)))
            }
            Err(_) => {
                warn!(timeout = ?self.check_timeout, decisions = batch.len(), "fence decision timed out");
                discard(client);
                Err(Undecided::TimedOut)
            }
        }
    }
}
