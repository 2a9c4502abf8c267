//! The record of refused writes: each fence rejection (resource, route, outcome, presented and
//! current term, client address, request id) is written to `fencing.refusals` in the
//! background, in batches, so an incident review can prove what was stopped and find who sent
//! it. It never delays a response and never costs a WAL flush. Each refusal is also logged at
//! warn, at most [`WARN_PER_SECOND`] lines a second (the lines left out are counted in the next).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use deadpool_postgres::Pool;
use fencing_schema::store::{self, Refusal};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio::time::timeout;
use tracing::warn;

use crate::metrics as names;

/// Refusals waiting to be written; beyond this, new ones are dropped (and counted).
const QUEUE: usize = 10_000;
/// The most refusals one write carries.
const BATCH: usize = 500;
/// How many refusals `fencing.refusals` keeps.
pub const KEEP: i32 = 10_000;

/// The most refusal lines logged per second; the rest are counted in the next line.
pub const WARN_PER_SECOND: u32 = 10;

/// One refused write, as the proxy saw it.
#[derive(Debug, Clone, Copy)]
pub struct Refused<'a> {
    /// The resource written.
    pub resource: &'a str,
    /// The route's prefix.
    pub route: &'a str,
    /// stale, not_leader or future_term.
    pub outcome: &'a str,
    /// The term presented (none in stamp mode when no term applies).
    pub presented_term: Option<i64>,
    /// The term it lost to.
    pub current_term: Option<i64>,
    /// Who sent it.
    pub client: SocketAddr,
    /// Its request id.
    pub request_id: &'a str,
    /// Stamp mode: the lease and the owner, as the store keeps it (with clients,
    /// `<client>/<owner>`).
    pub lease: Option<(&'a str, &'a str)>,
    /// The lease the resource is bound to, as the decision found it (verify mode's lease).
    pub bound_lease: Option<&'a str>,
    /// The authenticated client's name (`-` without clients).
    pub caller: &'a str,
}

/// Where the proxy reports refusals.
#[derive(Debug, Clone)]
pub struct RefusalLog {
    queue: mpsc::Sender<Refusal>,
    /// The current second of the warn log and how many lines it logged and left out.
    warned: Arc<Mutex<(Instant, u32, u64)>>,
}

impl RefusalLog {
    /// Starts the background writer on the current runtime.
    pub fn start(pool: Pool) -> RefusalLog {
        let (queue, pending) = mpsc::channel(QUEUE);
        tokio::spawn(write_batches(pool, pending));
        RefusalLog { queue, warned: Arc::new(Mutex::new((Instant::now(), 0, 0))) }
    }

    /// Reports one refusal: a warn line (rate-limited) and a row of `fencing.refusals`; never
    /// waits.
    pub fn record(&self, refused: &Refused<'_>) {
        self.warn(refused);
        let refusal = Refusal {
            at: SystemTime::now(),
            resource: refused.resource.to_owned(),
            route: Some(refused.route.to_owned()),
            outcome: refused.outcome.to_owned(),
            presented_term: refused.presented_term,
            current_term: refused.current_term,
            gateway: None,
            client_addr: Some(refused.client.to_string()),
            request_id: Some(refused.request_id.to_owned()),
            lease_key: refused.lease.map(|(key, _)| key).or(refused.bound_lease).map(str::to_owned),
            owner: refused.lease.map(|(_, owner)| owner.to_owned()),
            caller: Some(refused.caller).filter(|caller| *caller != "-").map(str::to_owned),
        };
        if self.queue.try_send(refusal).is_err() {
            metrics::counter!(names::REFUSALS_DROPPED).increment(1);
        }
    }

    fn warn(&self, refused: &Refused<'_>) {
        let suppressed = {
            let Ok(mut warned) = self.warned.lock() else { return };
            let (since, logged, left_out) = &mut *warned;
            if since.elapsed() >= Duration::from_secs(1) {
                *since = Instant::now();
                *logged = 0;
            }
            if *logged >= WARN_PER_SECOND {
                *left_out += 1;
                return;
            }
            *logged += 1;
            std::mem::take(left_out)
        };
        let (lease, owner) = refused.lease.unzip();
        let lease = lease.or(refused.bound_lease);
        warn!(
            client = %refused.client,
            caller = refused.caller,
            request_id = refused.request_id,
            route = refused.route,
            resource = refused.resource,
            outcome = refused.outcome,
            presented_term = refused.presented_term,
            current_term = refused.current_term,
            lease,
            owner,
            suppressed_since_last = suppressed,
            "write refused by the fence: the writer believes it leads but does not"
        );
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
