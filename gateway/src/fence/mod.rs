//! The fence decision, bounded by the fence-check timeout, and a cache of maxima that may refuse
//! a stale term on its own but never admit one.
//!
//! Decisions are batched like a group commit: while a lane's calls of `fencing.gate_many` are
//! out, the decisions of newly arrived writes queue up, and the lane's next call takes them all.
//! Under load that is one round trip for several writes; at low load a write's decision goes
//! out at once, alone. Either way each write costs at most one round trip.
//!
//! With `database.grant_ms` above zero, an admitted decision may also bring a grant (see
//! `schema/functions/grants.sql`): until the grant's local deadline, writes of the same term to
//! the same resource (and, in stamp mode, from the same lease and owner) are admitted here
//! without a round trip. The deadline is the instant the decision was asked for plus the
//! remaining time the store reported, minus the settle margin, on `CLOCK_BOOTTIME` and on the
//! monotonic clock both (S6, S7). While writes flow, one renewal per grant goes out once half of
//! it is left; if it fails, the grant simply ends and writes go back to asking.
//!
//! There are two lanes (three with grants). Writes presenting the resource's cached maximum, the
//! common case that `fencing.gate` answers with one read, share the fast lane: one call out at a
//! time, so its batches are as large as the load makes them. Every other decision (a new term,
//! stamp mode, a resource not seen yet) may wait for a row lock, so it takes the general lane,
//! with `max_batches_in_flight` calls out at once, where it cannot hold up the common case; with
//! grants, a term above the cached maximum goes alone on the raise lane. On an unbound route
//! a decision asks for one only when it and the two decisions of the resource before it each
//! came within a grant of the one before: a batch
//! with both kinds is two statements, pipelined on one connection.

mod batcher;
mod clock;
mod decision;
mod grants;
mod pool;
pub mod refusals;
mod settles;
pub mod standby;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_postgres::Pool;
use fencing_election::clock::BootInstant;
use fencing_schema::store::{Gate, Outcome};
use tokio::sync::{Semaphore, mpsc};
use tokio::time::{Instant, timeout_at};

use crate::fence::batcher::{Batcher, Pending};
use crate::fence::clock::StoreClock;
use crate::fence::grants::{GrantKey, Grants};
use crate::fence::settles::Settles;
use crate::metrics as names;

pub use crate::fence::decision::{ClockTicket, Decision, Presented, Refusal, Undecided, Verdict};
pub use crate::fence::pool::{discard, pool};

/// Beyond this many cached resources the cache starts over: it is only an optimisation (a
/// resource it forgot asks its next decision without a grant).
const CACHE_CAPACITY: usize = 100_000;
/// The most decisions one round trip carries.
const MAX_BATCH: usize = 128;

/// What a gateway knows of a resource it asked the store about.
#[derive(Debug, Clone, Copy)]
struct Seen {
    /// The highest maximum the store answered.
    max: i64,
    /// When the last answered decision was asked for.
    asked: Instant,
    /// Whether it was asked for within a grant of the one before.
    again: bool,
}

/// The fence store as the proxy uses it.
#[derive(Debug)]
pub struct FenceStore {
    pool: Pool,
    check_timeout: Duration,
    /// The highest maximum seen per resource. Maxima never decrease, so a term below it is
    /// stale for sure; a term at or above it still goes to Postgres.
    cache: Mutex<HashMap<String, Seen>>,
    /// Decisions of writes presenting the cached maximum.
    fast_lane: mpsc::UnboundedSender<Pending>,
    /// With grants: the grant length. A decision of an unbound route's resource asks for a grant
    /// only when this gateway's last two decisions of it were each asked less than this after the
    /// one before.
    hot_within: Duration,
    /// Every other decision.
    general_lane: mpsc::UnboundedSender<Pending>,
    /// With grants: decisions that may raise a verify-mode term, one per round trip.
    raise_lane: Option<mpsc::UnboundedSender<Pending>>,
    /// The grants this gateway holds (none when grants are off).
    grants: Grants,
    /// The settles this gateway has seen (S5 waits, as lengths).
    settles: Settles,
    /// The store's clock as this gateway sees it: nothing is admitted while it is not trusted.
    clock: Arc<StoreClock>,
    /// Metric handles, resolved once: a decision records through them without a registry lookup.
    granted_writes: metrics::Counter,
    cached_refusals: metrics::Counter,
    /// `fencing_store_errors_total{kind="clock"}`: writes refused while the clocks disagree.
    clock_refusals: metrics::Counter,
    check_duration: metrics::Histogram,
}

/// How a fence store decides: its timeouts, its grants, its allowances.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// A decision not made within this fails (S6).
    pub check_timeout: Duration,
    /// This gateway's forward timeout, which the store records (S5).
    pub forward_timeout: Duration,
    /// Decision round trips out at once on the general lane.
    pub max_batches_in_flight: usize,
    /// How long a grant is asked for (zero: no grants).
    pub grant: Duration,
    /// Taken off every grant and added to every settle: bytes may still be on their way.
    pub margin: Duration,
    /// How much two clocks may differ in rate, as a fraction.
    pub clock_rate_tolerance: f64,
}

impl FenceStore {
    /// A fence store on `pool`, with its batcher running on the current Tokio runtime.
    pub fn new(pool: Pool, settings: Settings) -> FenceStore {
        let Settings {
            check_timeout,
            forward_timeout,
            max_batches_in_flight,
            grant,
            margin: grant_margin,
            clock_rate_tolerance: rho,
        } = settings;
        // Writes are admitted (and grants used) once the store's clock has agreed with this host's
        // over a span of half a grant at least (a tenth of a second at least, a second at most:
        // with the settle margin off every grant, a clock off by more than the tolerance shows
        // within that) that also vouches for their rates (`clock`), and never while they
        // disagree.
        let trust_after = (grant / 2).clamp(Duration::from_millis(100), Duration::from_secs(1));
        let clock = Arc::new(StoreClock::new(rho, trust_after));
        tokio::spawn(clock::earn_trust(pool.clone(), Arc::downgrade(&clock), check_timeout));
        let lane = |in_flight: usize, max_batch: usize| {
            let (queue, pending) = mpsc::unbounded_channel();
            let batcher = Batcher {
                pool: pool.clone(),
                check_timeout,
                forward_ms: i64::try_from(forward_timeout.as_millis()).unwrap_or(i64::MAX),
                grant_ms: i64::try_from(grant.as_millis()).unwrap_or(0),
                in_flight: Arc::new(Semaphore::new(in_flight.max(1))),
                max_batch,
                clock: Arc::clone(&clock),
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
        let settles = Settles::new(pool.clone(), grant_margin, rho, check_timeout);
        FenceStore {
            pool,
            check_timeout,
            cache: Mutex::new(HashMap::new()),
            fast_lane,
            hot_within: grant,
            general_lane,
            raise_lane,
            grants: Grants::new(grant, grant_margin, rho, check_timeout, Arc::clone(&clock)),
            settles,
            clock,

            granted_writes: metrics::counter!(names::GRANTED_WRITES),
            cached_refusals: metrics::counter!(names::CACHED_REFUSALS),
            clock_refusals: metrics::counter!(names::STORE_ERRORS, "kind" => "clock"),
            check_duration: metrics::histogram!(names::CHECK_DURATION),
        }
    }

    /// The pool, for the control API.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Whether this gateway's clock and the store's agree (have agreed over a span, with no
    /// disagreement since): while not, nothing is admitted.
    pub fn clocks_agree(&self) -> bool {
        self.clock.trusted()
    }

    /// The highest maximum this gateway has seen for `resource`, and when it last asked.
    fn seen(&self, resource: &str) -> Option<Seen> {
        self.cache.lock().ok()?.get(resource).copied()
    }

    /// The highest maximum this gateway has seen for `resource`.
    fn cached_max(&self, resource: &str) -> Option<i64> {
        self.seen(resource).map(|seen| seen.max)
    }

    /// Remembers a maximum the store answered for `resource` to a decision asked at `asked`.
    fn remember(&self, resource: &str, max_term: Option<i64>, asked: Instant) {
        let Some(max_term) = max_term else { return };
        self.grants.drop_below(resource, max_term);
        let Ok(mut cache) = self.cache.lock() else { return };
        if cache.len() >= CACHE_CAPACITY && !cache.contains_key(resource) {
            cache.clear();
        }
        let entry = cache.entry(resource.to_owned()).or_insert(Seen { max: max_term, asked, again: false });
        entry.max = entry.max.max(max_term);
        if asked > entry.asked {
            entry.again = asked.duration_since(entry.asked) < self.hot_within;
            entry.asked = asked;
        }
    }

    /// Decides one fenced write: admitted (with how long to wait before forwarding) or refused.
    /// A stale token below the cached maximum is refused without a round trip.
    pub async fn decide(
        &self,
        resource: &str,
        presented: &Presented,
        bind_lease: Option<&str>,
    ) -> Result<Decision, Undecided> {
        if self.grants.enabled()
            && let Some(decision) = self.grants.admit(resource, presented, bind_lease, &self.fast_lane, &self.settles)
        {
            self.granted_writes.increment(1);
            return Ok(decision);
        }
        let seen = self.seen(resource);
        let cached = seen.map(|seen| seen.max);
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
                epoch: None,
                settle_id: None,
            };
            return Ok(Decision {
                gate,
                asked: now,
                answered: now,
                clocks: ClockTicket::new(&self.clock, self.clock.generation(), (now, BootInstant::now())),
            });
        }
        // Waits and deadlines counted on a clock that disagrees with the store's stand for
        // nothing: no decision is even asked for (a refusal above changes nothing, and is sure).
        let generation = self.clock.generation();
        if !self.clock.trusted() {
            self.clock_refusals.increment(1);
            return Err(Undecided::ClocksDisagree);
        }
        let started = Instant::now();
        let boot_started = BootInstant::now();
        // A grant on an unbound route covers one resource, and costs the store more to give than
        // a plain decision costs it to make (it takes the advisory locks and reads the row
        // again; a plain decision at the current term is one read). So a decision asks for one
        // only when it and this gateway's two decisions of the resource before it each came
        // within a grant of the one before (a grant would have covered those writes): at
        // 10,000 resources written at random, a grant asked with every decision halved the
        // throughput against no grants at all, and one asked whenever the last decision was
        // within a grant (about a third of them) still cost about a third. Bound routes always
        // ask (one lease grant covers every resource of the lease).
        let grant = bind_lease.is_some()
            || seen.is_some_and(|seen| seen.again && started.saturating_duration_since(seen.asked) < self.hot_within);
        let (pending, answer) = Pending::new(resource, presented, bind_lease, grant);
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
        let clocks = ClockTicket::new(&self.clock, generation, (started, boot_started));
        if let Ok(gate) = &result
            && gate.is_admitted()
            && !clocks.holds()
        {
            // The clocks disagreed during the round trip (perhaps on its very sample): the
            // store's answer stands (its maximum is remembered), but this gateway's counting of
            // its settle wait does not, so neither that nor a grant is kept, and the write is
            // not admitted here.
            self.remember(resource, gate.max_term, started);
            self.clock_refusals.increment(1);
            return Err(Undecided::ClocksDisagree);
        }
        let mut result = result;
        if let Ok(gate) = &mut result
            && let (true, Some(term)) = (gate.is_admitted(), gate.term)
        {
            // The settle, as this gateway counts it (`settles`).
            gate.wait = self.settles.wait(resource, term, gate, (answered, &clocks));
        }
        match &result {
            Ok(gate) => {
                self.remember(resource, gate.max_term, started);
                // A grant of a term below a maximum seen since cannot be of use (and has ended).
                let current = self.cached_max(resource).is_none_or(|max| gate.term >= Some(max));
                if self.grants.enabled() && (current || !gate.is_admitted()) {
                    let key = GrantKey { resource, presented, bind_lease };
                    self.grants.record(&key, gate, (started, boot_started, answered), &clocks);
                }
            }
            Err(Undecided::TimedOut) => metrics::counter!(names::STORE_ERRORS, "kind" => "timeout").increment(1),
            Err(Undecided::Failed(_)) => metrics::counter!(names::STORE_ERRORS, "kind" => "error").increment(1),
            Err(Undecided::ClocksDisagree) => self.clock_refusals.increment(1),
        }
        result.map(|gate| Decision { gate, asked: started, answered, clocks })
    }
}
