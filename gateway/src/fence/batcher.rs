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
    /// Whether it asks for a grant (on a lane with grants).
    grant: bool,
    reply: oneshot::Sender<Result<Gate, Undecided>>,
}

impl Pending {
    /// A decision to send, and where its answer arrives.
    pub(super) fn new(
        resource: &str,
        presented: &Presented,
        bind_lease: Option<&str>,
        grant: bool,
    ) -> (Pending, oneshot::Receiver<Result<Gate, Undecided>>) {
        let (reply, answer) = oneshot::channel();
        let pending = Pending {
            resource: resource.to_owned(),
            presented: presented.clone(),
            bind_lease: bind_lease.map(str::to_owned),
            grant,
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
        let deadline = Instant::now() + self.check_timeout;
        // Only the decisions that want a grant ask for one: with both kinds in the batch, two
        // statements, pipelined on one connection.
        let (granted, plain): (Vec<Pending>, Vec<Pending>) =
            batch.into_iter().partition(|item| item.grant && self.grant_ms > 0);
        let client = match fencing_election::pool::connection_by(&self.pool, deadline).await {
            Some(Ok(client)) => client,
            failed => {
                let error = match failed {
                    Some(Err(error)) => Undecided::Failed(format!("get a connection: {}", crate::error_chain(&error))),
                    _ => Undecided::TimedOut,
                };
                for item in granted.into_iter().chain(plain) {
                    let _ = item.reply.send(Err(error.clone()));
                }
                return;
            }
        };
        let (with_grants, without) = tokio::join!(
            self.gate_many(&client, &granted, self.grant_ms, deadline),
            self.gate_many(&client, &plain, 0, deadline)
        );
        let spoilt = [&with_grants, &without].iter().any(|answer| matches!(answer, Err((_, true))));
        for (items, answer) in [(granted, with_grants), (plain, without)] {
            match answer {
                Ok(gates) => {
                    for (item, gate) in items.into_iter().zip(gates) {
                        let _ = item.reply.send(Ok(gate));
                    }
                }
                Err((error, _)) => {
                    for item in items {
                        let _ = item.reply.send(Err(error.clone()));
                    }
                }
            }
        }
        if spoilt {
            discard(client);
        }
    }

    /// One call of `fencing.gate_many` for `batch` (none when it is empty), asking for grants of
    /// `grant_ms`. An error says whether the connection must be discarded.
    async fn gate_many(
        &self,
        client: &deadpool_postgres::Object,
        batch: &[Pending],
        grant_ms: i64,
        deadline: Instant,
    ) -> Result<Vec<Gate>, (Undecided, bool)> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        // Per statement (each its own transaction): a batch with both kinds counts twice.
        metrics::histogram!(names::BATCH_SIZE).record(batch.len() as f64);
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
                    &[&resources, &terms, &lease_keys, &owners, &bind_leases, &self.forward_ms, &grant_ms],
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
                .map(|row| Gate::from_row(row).map_err(|error| (Undecided::Failed(error.to_string()), false)))
                .collect(),
            Ok(Ok(rows)) => Err((
                Undecided::Failed(format!(
                    "fencing.gate_many answered {} rows for {} decisions",
                    rows.len(),
                    batch.len()
                )),
                false,
            )),
            Ok(Err(error)) => {
                let failure = fencing_schema::Error::from(error);
                debug!(error = %crate::error_chain(&failure), "fence decision failed");
                Err((Undecided::Failed(crate::error_chain(&failure)), failure.is_store_failure()))
            }
            Err(_) => {
                warn!(timeout = ?self.check_timeout, decisions = batch.len(), "fence decision timed out");
                Err((Undecided::TimedOut, true))
            }
        }
    }
}
