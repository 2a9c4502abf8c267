//! The fence decision, bounded by the fence-check timeout, and a cache of maxima that may refuse
//! a stale term on its own but never admit one.
//!
//! Decisions are batched like a group commit: while a lane's calls of `fencing.gate_many` are
//! out, the decisions of newly arrived writes queue up, and the lane's next call takes them all.
//! Under load that is one round trip for several writes; at low load a write's decision goes
//! out at once, alone. Either way each write costs at most one round trip.
//!
//! With `database.grant_ms` above zero, an admitted decision also brings a grant (see
//! `schema/functions/grants.sql`): until the grant's local deadline, writes of the same term to
//! the same resource (and, in stamp mode, from the same lease and owner) are admitted here
//! without a round trip. The deadline is the instant the decision was asked for plus the
//! remaining time the store reported, minus the settle margin, on `CLOCK_BOOTTIME` and on the
//! monotonic clock both (S6, S7). While writes flow, one renewal per grant goes out once half of
//! it is left; if it fails, the grant simply ends and writes go back to asking.
//!
//! There are two lanes. Writes presenting the resource's cached maximum, the common case that
//! `fencing.gate` answers with one read, share the fast lane: one call out at a time, so its
//! batches are as large as the load makes them. Every other decision (a new term, stamp mode, a
//! resource not seen yet) may wait for a row lock, so it takes the general lane, with
//! `max_batches_in_flight` calls out at once, where it cannot hold up the common case.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod};
use fencing_election::clock::BootInstant;
use fencing_schema::store::{GATE_MANY_SQL, Gate, Outcome};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio::time::{Instant, timeout_at};
use tokio_postgres_rustls::MakeRustlsConnect;
use tracing::{debug, warn};

use crate::metrics as names;

/// Beyond this many cached resources the cache starts over: it is only an optimisation.
const CACHE_CAPACITY: usize = 100_000;
/// The most decisions one round trip carries.
const MAX_BATCH: usize = 128;

/// A decision, with the two instants S5 anchors on: the store decided at some instant between
/// `asked` and `answered` and said to wait `gate.wait` from it. So the write is sent no earlier
/// than `answered + wait` (plus the settle margin) and no later than `asked + wait + forward
/// timeout` (the store's horizon covers no later deadline).
#[derive(Debug, Clone)]
pub struct Decision {
    /// What the store (or a grant) decided.
    pub gate: Gate,
    /// No later than the instant of the decision.
    pub asked: Instant,
    /// No earlier than the instant of the decision.
    pub answered: Instant,
}

/// What a fenced write presents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Presented {
    /// Verify mode: `Fencing-Token`.
    Token(i64),
    /// Stamp mode: `Fencing-Lease` and `Fencing-Owner`.
    Lease {
        /// The lease key.
        key: String,
        /// The owner claiming to hold it.
        owner: String,
    },
}

/// Why a decision could not be made.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Undecided {
    /// No answer within the fence-check timeout.
    #[error("the fence check timed out")]
    TimedOut,
    /// The store failed or could not be reached.
    #[error("the fence store failed: {0}")]
    Failed(String),
}

/// The fence store as the proxy uses it.
#[derive(Debug)]
pub struct FenceStore {
    pool: Pool,
    /// How the pool connects (its TLS connector cancels a query that ran past its time).
    database: crate::tls::Database,
    check_timeout: Duration,
    /// The highest maximum seen per resource. Maxima never decrease, so a term below it is
    /// stale for sure; a term at or above it still goes to Postgres.
    cache: Mutex<HashMap<String, i64>>,
    /// Decisions of writes presenting the cached maximum.
    fast_lane: mpsc::UnboundedSender<Pending>,
    /// Every other decision.
    general_lane: mpsc::UnboundedSender<Pending>,
    /// With grants: decisions that may raise a verify-mode term, one per round trip.
    raise_lane: Option<mpsc::UnboundedSender<Pending>>,
    /// How long a grant is asked for (zero: no grants, every write asks Postgres).
    grant: Duration,
    /// Taken off every grant's deadline (the settle margin).
    grant_margin: Duration,
    /// The grants this gateway holds, by fence name.
    grants: Arc<Mutex<HashMap<String, Grant>>>,
    /// The runtime the store was made on (the gateway's shared one): grant renewals run there,
    /// whichever proxy thread sent them, so none is dropped with a proxy thread's runtime.
    runtime: tokio::runtime::Handle,
    /// Metric handles, resolved once: a decision records through them without a registry lookup.
    granted_writes: metrics::Counter,
    cached_refusals: metrics::Counter,
    check_duration: metrics::Histogram,
}

/// A grant this gateway holds on one fence: writes matching it are admitted without asking.
#[derive(Debug, Clone)]
struct Grant {
    /// The term it covers.
    term: i64,
    /// The route's bound lease the decision was made under.
    bind_lease: Option<String>,
    /// In stamp mode, the lease and owner it was decided for; `None` in verify mode.
    stamp: Option<(String, String)>,
    /// The end of the grant on the boot clock, and on the monotonic clock: both must be ahead.
    boot_deadline: BootInstant,
    deadline: Instant,
    /// The decision that granted it: asked, answered, and the settle wait it said (S5).
    asked: Instant,
    answered: Instant,
    wait: Duration,
    /// From here on, the next write sends a renewal.
    renew_after: Instant,
    /// A renewal is out.
    renewing: bool,
}

impl Grant {
    fn covers(&self, presented: &Presented, bind_lease: Option<&str>) -> bool {
        if self.bind_lease.as_deref() != bind_lease {
            return false;
        }
        match (presented, &self.stamp) {
            (Presented::Token(term), None) => *term == self.term,
            (Presented::Lease { key, owner }, Some((grant_key, grant_owner))) => {
                key == grant_key && owner == grant_owner
            }
            _ => false,
        }
    }

    fn lasts(&self, now: Instant, boot_now: BootInstant) -> bool {
        now < self.deadline && boot_now < self.boot_deadline
    }
}

/// One decision waiting to be sent.
#[derive(Debug)]
struct Pending {
    resource: String,
    presented: Presented,
    bind_lease: Option<String>,
    reply: oneshot::Sender<Result<Gate, Undecided>>,
}

impl Pending {
    /// A decision to send, and where its answer arrives.
    fn new(
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

/// Builds a connection pool of `size` to `database` (TLS as its `sslmode` says). Its sessions
/// run at READ COMMITTED whatever the database's default: fence decisions, new terms and
/// releases decide on the newest rows (the functions refuse an older snapshot).
pub fn pool(database: &crate::tls::Database, size: usize) -> Result<Pool, String> {
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

impl FenceStore {
    /// A fence store on `pool`, with its batcher running on the current Tokio runtime.
    pub fn new(
        pool: Pool,
        database: crate::tls::Database,
        check_timeout: Duration,
        forward_timeout: Duration,
        max_batches_in_flight: usize,
        grant: Duration,
        grant_margin: Duration,
    ) -> FenceStore {
        let lane = |in_flight: usize, max_batch: usize| {
            let (queue, pending) = mpsc::unbounded_channel();
            let batcher = Batcher {
                pool: pool.clone(),
                database: database.clone(),
                check_timeout,
                forward_ms: i64::try_from(forward_timeout.as_millis()).unwrap_or(i64::MAX),
                grant_ms: i64::try_from(grant.as_millis()).unwrap_or(0),
                in_flight: Arc::new(Semaphore::new(in_flight.max(1))),
                max_batch,
            };
            tokio::spawn(batcher.run(pending));
            queue
        };
        let fast_lane = lane(1, MAX_BATCH);
        let general_lane = lane(max_batches_in_flight, MAX_BATCH);
        // With grants, a raise waits inside its decision until the grants on the lower term have
        // ended, holding its fence row; in a batch, the rows of the items after it would go on
        // being renewed meanwhile, and their raises would wait one grant after another. So a
        // token above the cached maximum goes alone (a resource not seen yet, after a restart
        // for one, is batched as before: a raise among those may wait longer, up to the
        // fence-check timeout, which fails closed).
        let raise_lane = (!grant.is_zero()).then(|| lane(max_batches_in_flight, 1));
        FenceStore {
            pool,
            database,
            check_timeout,
            cache: Mutex::new(HashMap::new()),
            fast_lane,
            general_lane,
            raise_lane,
            grant,
            grant_margin,
            grants: Arc::new(Mutex::new(HashMap::new())),
            runtime: tokio::runtime::Handle::current(),
            granted_writes: metrics::counter!(names::GRANTED_WRITES),
            cached_refusals: metrics::counter!(names::CACHED_REFUSALS),
            check_duration: metrics::histogram!(names::CHECK_DURATION),
        }
    }

    /// The pool, for the control API.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The connector of the pool's connections (TLS as `sslmode` says).
    pub fn tls(&self) -> &MakeRustlsConnect {
        &self.database.tls
    }

    /// The highest maximum this gateway has seen for `resource`.
    fn cached_max(&self, resource: &str) -> Option<i64> {
        self.cache.lock().ok()?.get(resource).copied()
    }

    fn remember(&self, resource: &str, max_term: Option<i64>) {
        let Some(max_term) = max_term else { return };
        if let Ok(mut grants) = self.grants.lock()
            && grants.get(resource).is_some_and(|grant| grant.term < max_term)
        {
            grants.remove(resource);
        }
        let Ok(mut cache) = self.cache.lock() else { return };
        if cache.len() >= CACHE_CAPACITY && !cache.contains_key(resource) {
            cache.clear();
        }
        let entry = cache.entry(resource.to_owned()).or_insert(max_term);
        *entry = (*entry).max(max_term);
    }

    /// Decides one fenced write: admitted (with how long to wait before forwarding) or refused.
    /// A stale token below the cached maximum is refused without a round trip.
    pub async fn decide(
        &self,
        resource: &str,
        presented: &Presented,
        bind_lease: Option<&str>,
    ) -> Result<Decision, Undecided> {
        if !self.grant.is_zero()
            && let Some(decision) = self.admit_under_grant(resource, presented, bind_lease)
        {
            self.granted_writes.increment(1);
            return Ok(decision);
        }
        let cached = self.cached_max(resource);
        if let (Presented::Token(term), Some(max)) = (presented, cached)
            && *term < max
        {
            self.cached_refusals.increment(1);
            let now = Instant::now();
            let gate = Gate {
                outcome: Outcome::Stale,
                term: Some(*term),
                max_term: Some(max),
                lease_key: None,
                lease_term: None,
                wait: Duration::ZERO,
                grant: Duration::ZERO,
            };
            return Ok(Decision { gate, asked: now, answered: now });
        }
        let started = Instant::now();
        let boot_started = BootInstant::now();
        let (pending, answer) = Pending::new(resource, presented, bind_lease);
        let lane = match (presented, cached, &self.raise_lane) {
            (Presented::Token(term), Some(max), _) if *term == max => &self.fast_lane,
            (Presented::Token(term), Some(max), Some(raise_lane)) if *term > max => raise_lane,
            _ => &self.general_lane,
        };
        let result = if lane.send(pending).is_err() {
            Err(Undecided::Failed("the fence batcher stopped".to_owned()))
        } else {
            match timeout_at(started + self.check_timeout, answer).await {
                Ok(Ok(result)) => result,
                Ok(Err(_)) => Err(Undecided::Failed("the fence batcher dropped the decision".to_owned())),
                Err(_) => Err(Undecided::TimedOut),
            }
        };
        let answered = Instant::now();
        self.check_duration.record(answered.duration_since(started).as_secs_f64());
        match &result {
            Ok(gate) => {
                self.remember(resource, gate.max_term);
                // A grant of a term below a maximum seen since cannot be of use (and has ended).
                let current = self.cached_max(resource).is_none_or(|max| gate.term >= Some(max));
                if !self.grant.is_zero() && (current || !gate.is_admitted()) {
                    let key = GrantKey { resource, presented, bind_lease };
                    install(&self.grants, &key, gate, (started, boot_started, answered), self.grant, self.grant_margin);
                }
            }
            Err(Undecided::TimedOut) => metrics::counter!(names::STORE_ERRORS, "kind" => "timeout").increment(1),
            Err(Undecided::Failed(_)) => metrics::counter!(names::STORE_ERRORS, "kind" => "error").increment(1),
        }
        result.map(|gate| Decision { gate, asked: started, answered })
    }
}

impl FenceStore {
    /// Admits a write under a grant this gateway holds, if one covers it and lasts; sends its
    /// renewal once half of it is left.
    fn admit_under_grant(&self, resource: &str, presented: &Presented, bind_lease: Option<&str>) -> Option<Decision> {
        let now = Instant::now();
        let boot_now = BootInstant::now();
        let mut grants = self.grants.lock().ok()?;
        let grant = grants.get_mut(resource)?;
        if !grant.covers(presented, bind_lease) {
            return None;
        }
        if !grant.lasts(now, boot_now) {
            grants.remove(resource);
            return None;
        }
        // S5 for a write admitted now under a grant: sent no earlier than the granting answer
        // plus its wait, and no later than the later of (its asking plus its wait) and now,
        // plus the forward timeout; the store's horizon covers both (ARCHITECTURE.md, Grants).
        // As a decision at `answered = now`: wait what is left of the settle wait, and let
        // `asked + wait` be that later instant.
        let settle = grant.answered + grant.wait;
        let wait = settle.saturating_duration_since(now);
        let latest_start = (grant.asked + grant.wait).max(now);
        let gate = Gate {
            outcome: Outcome::Admitted,
            term: Some(grant.term),
            max_term: Some(grant.term),
            lease_key: grant.stamp.as_ref().map(|(key, _)| key.clone()).or_else(|| grant.bind_lease.clone()),
            lease_term: None,
            wait,
            grant: grant.deadline.saturating_duration_since(now),
        };
        let decision = Decision { gate, asked: latest_start.checked_sub(wait).unwrap_or(now).min(now), answered: now };
        let renew = now >= grant.renew_after && !grant.renewing;
        grant.renewing |= renew;
        // The renewal wakes the shared runtime: never while holding the lock every proxy thread
        // takes per write (a thread preempted by the woken one would stall them all).
        drop(grants);
        if renew
            && !self.renew(resource, presented, bind_lease)
            && let Ok(mut grants) = self.grants.lock()
            && let Some(held) = grants.get_mut(resource)
        {
            held.renewing = false;
        }
        Some(decision)
    }

    /// Sends one decision for `resource` that no writer waits for: its answer renews the grant.
    /// False when it could not be sent.
    fn renew(&self, resource: &str, presented: &Presented, bind_lease: Option<&str>) -> bool {
        let (pending, answer) = Pending::new(resource, presented, bind_lease);
        let started = Instant::now();
        let boot_started = BootInstant::now();
        if self.fast_lane.send(pending).is_err() {
            return false;
        }
        let grants = Arc::clone(&self.grants);
        let (grant, margin, check_timeout) = (self.grant, self.grant_margin, self.check_timeout);
        let (resource, presented, bind_lease) = (resource.to_owned(), presented.clone(), bind_lease.map(str::to_owned));
        self.runtime.spawn(async move {
            let key = GrantKey { resource: &resource, presented: &presented, bind_lease: bind_lease.as_deref() };
            let result = match timeout_at(started + check_timeout, answer).await {
                Ok(Ok(Ok(gate))) => {
                    let granted = gate.is_admitted() && !gate.grant.is_zero();
                    install(&grants, &key, &gate, (started, boot_started, Instant::now()), grant, margin);
                    if granted { "ok" } else { "refused" }
                }
                _ => "failed",
            };
            metrics::counter!(names::GRANT_RENEWALS, "result" => result).increment(1);
            // A failed renewal leaves the grant to end at its deadline; the next write after
            // that asks Postgres, and a write before it may send the renewal again.
            if let Ok(mut grants) = grants.lock()
                && let Some(held) = grants.get_mut(&resource)
            {
                held.renewing = false;
            }
        });
        true
    }
}

/// What a grant is held for.
struct GrantKey<'a> {
    resource: &'a str,
    presented: &'a Presented,
    bind_lease: Option<&'a str>,
}

/// Records the grant an answer carries (or drops the one held, when the answer refused the write).
/// `(started, boot_started, answered)`: when the decision was asked for, on both clocks, and when
/// its answer came. `asked`: the grant length asked for.
fn install(
    grants: &Mutex<HashMap<String, Grant>>,
    key: &GrantKey<'_>,
    gate: &Gate,
    (started, boot_started, answered): (Instant, BootInstant, Instant),
    asked: Duration,
    margin: Duration,
) {
    let Ok(mut grants) = grants.lock() else { return };
    let (true, Some(term), Some(lasts)) =
        (gate.is_admitted(), gate.term, gate.grant.checked_sub(margin).filter(|lasts| !lasts.is_zero()))
    else {
        if !gate.is_admitted() {
            grants.remove(key.resource);
        }
        return;
    };
    let stamp = match key.presented {
        Presented::Token(_) => None,
        Presented::Lease { key, owner } => Some((key.clone(), owner.clone())),
    };
    let grant = Grant {
        term,
        bind_lease: key.bind_lease.map(str::to_owned),
        stamp,
        boot_deadline: boot_started + lasts,
        deadline: started + lasts,
        asked: started,
        answered,
        wait: gate.wait,
        // Renew once half of the asked-for grant is left: the store renews a grant only when
        // less than three quarters of it remain. An answer that did not extend it (another
        // replica's renewal held the row) is tried again a sixteenth of a grant later.
        renew_after: (started + lasts).checked_sub(asked / 2).unwrap_or(started).max(answered + asked / 16),
        renewing: false,
    };
    if grants.len() >= CACHE_CAPACITY && !grants.contains_key(key.resource) {
        grants.clear();
    }
    match grants.get(key.resource) {
        // Never replace a lasting grant by one of a lower term (answers may arrive out of order).
        Some(held) if held.term > term && held.lasts(Instant::now(), BootInstant::now()) => {}
        _ => {
            grants.insert(key.resource.to_owned(), grant);
        }
    }
}

/// Sends queued decisions to Postgres, many per round trip.
#[derive(Debug)]
struct Batcher {
    pool: Pool,
    database: crate::tls::Database,
    check_timeout: Duration,
    forward_ms: i64,
    grant_ms: i64,
    in_flight: Arc<Semaphore>,
    max_batch: usize,
}

impl Batcher {
    async fn run(self, mut pending: mpsc::UnboundedReceiver<Pending>) {
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
        let client = match timeout_at(deadline, self.pool.get()).await {
            Ok(Ok(client)) => client,
            Ok(Err(error)) => {
                return Err(Undecided::Failed(format!("get a connection: {}", crate::error_chain(&error))));
            }
            Err(_) => return Err(Undecided::TimedOut),
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
                    discard(client, &self.database.tls);
                }
                debug!(error = %crate::error_chain(&failure), "fence decision failed");
                Err(Undecided::Failed(crate::error_chain(&failure)))
            }
            Err(_) => {
                warn!(timeout = ?self.check_timeout, decisions = batch.len(), "fence decision timed out");
                discard(client, &self.database.tls);
                Err(Undecided::TimedOut)
            }
        }
    }
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
