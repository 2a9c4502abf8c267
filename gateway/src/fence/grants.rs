//! Grants: with `database.grant_ms` above zero, an admitted decision also brings a grant (see
//! `schema/functions/grants.sql`): until the grant's local deadline, writes of the same term to
//! the same resource (and, in stamp mode, from the same lease and owner) are admitted here
//! without a round trip. The deadline is the instant the decision was asked for plus the
//! remaining time the store reported, minus the settle margin, on `CLOCK_BOOTTIME` and on the
//! monotonic clock both (S6, S7). While writes flow, one renewal per grant goes out once half of
//! it is left; if it fails, the grant simply ends and writes go back to asking.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fencing_election::clock::BootInstant;
use fencing_schema::store::{Gate, Outcome};
use tokio::time::{Instant, timeout_at};

use tokio::sync::mpsc;

use crate::fence::batcher::Pending;
use crate::fence::clock::StoreClock;
use crate::fence::decision::{ClockTicket, Decision, Presented};
use crate::fence::settles::Settles;
use crate::metrics as names;

/// Beyond this many grants the table starts over (the grants simply end: writes ask again).
const CAPACITY: usize = 100_000;

/// The grants this gateway holds, by fence name, and how it asks for and keeps them.
#[derive(Debug)]
pub(super) struct Grants {
    table: Arc<Mutex<HashMap<String, Grant>>>,
    /// How long a grant is asked for (zero: no grants, every write asks Postgres).
    length: Duration,
    /// Taken off every grant's deadline (the settle margin).
    margin: Duration,
    /// The clock-rate allowance: a grant's local length is shortened by this fraction, since this
    /// gateway's clock may run slower than the store's.
    rho: f64,
    /// A renewal's answer is awaited this long.
    check_timeout: Duration,
    /// The store's clock as this gateway sees it: grants are used only while it agrees with this
    /// host's boot clock.
    clock: Arc<StoreClock>,
    /// The runtime the store was made on (the gateway's shared one): grant renewals run there,
    /// whichever proxy thread sent them, so none is dropped with a proxy thread's runtime.
    runtime: tokio::runtime::Handle,
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
    /// The store clock's generation it was given under ([`StoreClock::generation`]).
    generation: u64,
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

impl Grants {
    /// No grant held yet; `length` zero: grants are off.
    pub(super) fn new(
        length: Duration,
        margin: Duration,
        rho: f64,
        check_timeout: Duration,
        clock: Arc<StoreClock>,
    ) -> Grants {
        let table: Arc<Mutex<HashMap<String, Grant>>> = Arc::default();
        if !length.is_zero() {
            tokio::spawn(sweep(Arc::downgrade(&table)));
        }
        Grants { table, length, margin, rho, check_timeout, clock, runtime: tokio::runtime::Handle::current() }
    }

    /// Whether this gateway asks for grants.
    pub(super) fn enabled(&self) -> bool {
        !self.length.is_zero()
    }

    /// Drops the grant on `resource` when a higher maximum than its term was seen.
    pub(super) fn drop_below(&self, resource: &str, max_term: i64) {
        if let Ok(mut grants) = self.table.lock()
            && grants.get(resource).is_some_and(|grant| grant.term < max_term)
        {
            grants.remove(resource);
        }
    }

    /// Admits a write under a grant this gateway holds, if one covers it and lasts; sends its
    /// renewal on `lane` once half of it is left.
    pub(super) fn admit(
        &self,
        resource: &str,
        presented: &Presented,
        bind_lease: Option<&str>,
        lane: &mpsc::UnboundedSender<Pending>,
        settles: &Settles,
    ) -> Option<Decision> {
        let now = Instant::now();
        let boot_now = BootInstant::now();
        // The clocks must agree, and have since the grant was given.
        if !self.clock.trusted() {
            return None;
        }
        let generation = self.clock.generation();
        let mut grants = self.table.lock().ok()?;
        let grant = grants.get_mut(resource)?;
        if grant.generation != generation {
            grants.remove(resource);
            return None;
        }
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
        let decision = Decision {
            gate,
            asked: latest_start.checked_sub(wait).unwrap_or(now).min(now),
            answered: now,
            clocks: ClockTicket::new(&self.clock, generation, (now, boot_now)),
        };
        let renew = now >= grant.renew_after && !grant.renewing;
        grant.renewing |= renew;
        // The renewal wakes the shared runtime: never while holding the lock every proxy thread
        // takes per write (a thread preempted by the woken one would stall them all).
        drop(grants);
        if renew
            && !self.renew(resource, presented, bind_lease, lane, settles)
            && let Ok(mut grants) = self.table.lock()
            && let Some(held) = grants.get_mut(resource)
        {
            held.renewing = false;
        }
        Some(decision)
    }

    /// Sends one decision for `resource` that no writer waits for: its answer renews the grant.
    /// False when it could not be sent.
    fn renew(
        &self,
        resource: &str,
        presented: &Presented,
        bind_lease: Option<&str>,
        lane: &mpsc::UnboundedSender<Pending>,
        settles: &Settles,
    ) -> bool {
        let (pending, answer) = Pending::new(resource, presented, bind_lease);
        // The agreement the renewal is asked under: its grant and settle are counted from here.
        let generation = self.clock.generation();
        let started = Instant::now();
        let boot_started = BootInstant::now();
        if lane.send(pending).is_err() {
            return false;
        }
        let grants = Arc::clone(&self.table);
        let settles = settles.clone();
        let clock = Arc::clone(&self.clock);
        let (grant, margin, rho, check_timeout) = (self.length, self.margin, self.rho, self.check_timeout);
        let (resource, presented, bind_lease) = (resource.to_owned(), presented.clone(), bind_lease.map(str::to_owned));
        self.runtime.spawn(async move {
            let key = GrantKey { resource: &resource, presented: &presented, bind_lease: bind_lease.as_deref() };
            let result = match timeout_at(started + check_timeout, answer).await {
                Ok(Ok(Ok(mut gate))) => {
                    let answered = Instant::now();
                    let clocks = ClockTicket::new(&clock, generation, (started, boot_started));
                    let granted = gate.is_admitted() && !gate.grant.is_zero();
                    // Under clocks that disagreed since the renewal was asked, neither its settle
                    // nor its grant is counted; a refusal drops the grant held all the same.
                    if let (true, Some(term), true) = (gate.is_admitted(), gate.term, clocks.holds()) {
                        let lease_key = gate.lease_key.clone();
                        gate.wait = settles.wait(&resource, term, lease_key.as_deref(), gate.wait, (answered, &clocks));
                    }
                    if !gate.is_admitted() || clocks.holds() {
                        install(
                            &grants,
                            &key,
                            &gate,
                            (started, boot_started, answered),
                            (grant, margin, rho),
                            generation,
                        );
                    }
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

/// How often ended grants are dropped and the grant gauges set.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// Every [`SWEEP_EVERY`], for as long as the table lives: drops the grants that have ended (a
/// write finds them ended and drops them too, but a resource no longer written would keep its row)
/// and sets `fencing_grants_held` and `fencing_grant_table_bytes`, so what the grants cost this
/// gateway is on its dashboard: rows held, and memory per row.
async fn sweep(table: std::sync::Weak<Mutex<HashMap<String, Grant>>>) {
    let held = metrics::gauge!(names::GRANTS_HELD);
    let bytes = metrics::gauge!(names::GRANT_TABLE_BYTES);
    loop {
        tokio::time::sleep(SWEEP_EVERY).await;
        let Some(table) = table.upgrade() else { return };
        let Ok(mut grants) = table.lock() else { return };
        let (now, boot_now) = (Instant::now(), BootInstant::now());
        grants.retain(|_, grant| grant.lasts(now, boot_now));
        // After a burst of resources, give back what the table no longer needs.
        let len = grants.len();
        if grants.capacity() > 4 * len.max(1024) {
            grants.shrink_to(2 * len);
        }
        held.set(grants.len() as f64);
        bytes.set(table_bytes(&grants) as f64);
    }
}

/// The memory the table takes, estimated: its slots (key and grant, by capacity) and the strings
/// they own.
fn table_bytes(grants: &HashMap<String, Grant>) -> usize {
    let slot = std::mem::size_of::<(String, Grant)>() + 1;
    let owned: usize = grants
        .iter()
        .map(|(resource, grant)| {
            resource.capacity()
                + grant.bind_lease.as_ref().map_or(0, String::capacity)
                + grant.stamp.as_ref().map_or(0, |(key, owner)| key.capacity() + owner.capacity())
        })
        .sum();
    grants.capacity() * slot + owned
}

/// What a grant is held for.
pub(super) struct GrantKey<'a> {
    pub(super) resource: &'a str,
    pub(super) presented: &'a Presented,
    pub(super) bind_lease: Option<&'a str>,
}

impl Grants {
    /// Records the grant a decision's answer carries (or drops the one held, when the answer
    /// refused the write). `anchors`: when the decision was asked for, on both clocks, and when
    /// its answer came.
    pub(super) fn record(
        &self,
        key: &GrantKey<'_>,
        gate: &Gate,
        anchors: (Instant, BootInstant, Instant),
        clocks: &ClockTicket,
    ) {
        // Clocks that disagreed since the decision was asked give no grant; a refusal drops the
        // one held all the same.
        if !gate.is_admitted() || clocks.holds() {
            install(&self.table, key, gate, anchors, (self.length, self.margin, self.rho), clocks.generation());
        }
    }
}

/// Records the grant an answer carries (or drops the one held, when the answer refused the write).
/// `(started, boot_started, answered)`: when the decision was asked for, on both clocks, and when
/// its answer came. `(asked, margin, rho)`: the grant length asked for, the settle margin and the
/// clock-rate allowance rho. The grant lasts, counted from before the decision was asked for,
/// what the store gave and never more than was asked, times (1 - rho) / (1 + rho) (this gateway's
/// clock may run rho slow, and the store's sleep, which a term change waits the grant out with,
/// rho fast), less the margin.
fn install(
    grants: &Mutex<HashMap<String, Grant>>,
    key: &GrantKey<'_>,
    gate: &Gate,
    (started, boot_started, answered): (Instant, BootInstant, Instant),
    (asked, margin, rho): (Duration, Duration, f64),
    generation: u64,
) {
    let Ok(mut grants) = grants.lock() else { return };
    let lasts =
        gate.grant.min(asked).mul_f64((1.0 - rho) / (1.0 + rho)).checked_sub(margin).filter(|lasts| !lasts.is_zero());
    let (true, Some(term), Some(lasts)) = (gate.is_admitted(), gate.term, lasts) else {
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
        // Renew once half of the asked-for grant is left. An answer that gave no grant (a term
        // change held the fence) leaves this one to its end; the next renewal goes a sixteenth
        // of a grant after the answer at the earliest.
        renew_after: (started + lasts).checked_sub(asked / 2).unwrap_or(started).max(answered + asked / 16),
        renewing: false,
        generation,
    };
    if grants.len() >= CAPACITY && !grants.contains_key(key.resource) {
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
