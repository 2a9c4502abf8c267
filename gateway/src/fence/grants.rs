//! Grants: with `database.grant_ms` above zero, an admitted decision may also bring a grant (see
//! `schema/functions/grants.sql`): until the grant's local deadline, writes of the same term are
//! admitted here without a round trip. The deadline is the instant the decision was asked for
//! plus the remaining time the store reported, minus the settle margin, on `CLOCK_BOOTTIME` and on
//! the monotonic clock both (S6, S7). While writes flow, one renewal per grant goes out once half
//! of it is left; if it fails, the grant simply ends and writes go back to asking.
//!
//! What a grant covers depends on the route:
//! - **Unbound routes:** one resource (and, in stamp mode, one lease and owner): a grant per fence.
//!   A decision asks for one only when it and this gateway's two decisions of the resource
//!   before it each came within a grant of the one before (`FenceStore::decide`): a resource written less often would find its grant ended,
//!   and a grant costs the store more to give than a plain decision.
//! - **Bound routes (lease grants):** the lease at the grant's term, so one grant per lease,
//!   whichever of its resources it was given on. It covers a resource only once this gateway has
//!   had an admitted decision for it at that term and at the same fence epoch of the lease (an
//!   operator's change of one of the lease's fences moves the epoch on, in the same transaction):
//!   that decision made the resource's binding, its raise and its settle; writes under the grant
//!   start no earlier and no later than it said, as under a fence's own grant. So the first write
//!   of a resource at a term asks Postgres once, and later ones do not.

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

/// Beyond this many resources the table of decisions starts over (writes ask again).
const CAPACITY: usize = 1 << 20;
/// A lease grant that ended is kept this long (and the decisions it covered with it), so that
/// writes after a pause need only one decision to cover every resource again.
const KEEP_ENDED: Duration = Duration::from_secs(600);

/// What the grants of this gateway are kept in.
#[derive(Debug, Default)]
struct Table {
    /// By fence name: an unbound route's grant, or a bound route's decision a lease grant covers.
    resources: HashMap<String, Grant>,
    /// By lease key: the lease grants of bound routes.
    leases: HashMap<String, LeaseGrant>,
}

/// The grants this gateway holds, and how it asks for and keeps them.
#[derive(Debug)]
pub(super) struct Grants {
    table: Arc<Mutex<Table>>,
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

/// How long a grant lasts, and its renewal.
#[derive(Debug, Clone)]
struct Lasting {
    /// The end of the grant on the boot clock, and on the monotonic clock: both must be ahead.
    boot_deadline: BootInstant,
    deadline: Instant,
    /// From here on, the next write sends a renewal.
    renew_after: Instant,
    /// A renewal is out.
    renewing: bool,
}

impl Lasting {
    fn lasts(&self, now: Instant, boot_now: BootInstant) -> bool {
        now < self.deadline && boot_now < self.boot_deadline
    }
}

/// One resource's admitted decision that writes matching it are admitted under: with its own
/// grant on an unbound route, under its lease's grant on a bound one.
#[derive(Debug, Clone)]
struct Grant {
    /// The term it covers.
    term: i64,
    /// The route's bound lease the decision was made under.
    bind_lease: Option<String>,
    /// In stamp mode, the lease and owner it was decided for; `None` in verify mode.
    stamp: Option<(String, String)>,
    /// The lease's fence epoch the decision was made at (bound routes).
    epoch: Option<i64>,
    /// The decision: asked, answered, and the settle wait it said (S5).
    asked: Instant,
    answered: Instant,
    wait: Duration,
    /// Its own grant (unbound routes); `None` on a bound route, whose lease's grant lasts.
    own: Option<Lasting>,
    /// The store clock's generation it was decided under ([`StoreClock::generation`]).
    generation: u64,
}

/// A bound route's lease grant: writes of its term to the lease's resources that have a
/// decision at its term and epoch are admitted without asking.
#[derive(Debug, Clone)]
struct LeaseGrant {
    term: i64,
    epoch: Option<i64>,
    /// In stamp mode, the lease and owner it was given for; `None` in verify mode.
    stamp: Option<(String, String)>,
    lasting: Lasting,
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

    /// Whether `lease`'s grant covers this decision: the same term, epoch and stamp.
    fn under(&self, lease: &LeaseGrant) -> bool {
        lease.term == self.term && lease.epoch == self.epoch && self.epoch.is_some() && lease.stamp == self.stamp
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
        let table: Arc<Mutex<Table>> = Arc::default();
        if !length.is_zero() {
            tokio::spawn(sweep(Arc::downgrade(&table)));
        }
        Grants { table, length, margin, rho, check_timeout, clock, runtime: tokio::runtime::Handle::current() }
    }

    /// Whether this gateway asks for grants.
    pub(super) fn enabled(&self) -> bool {
        !self.length.is_zero()
    }

    /// Drops the grant or decision on `resource` when a higher maximum than its term was seen.
    pub(super) fn drop_below(&self, resource: &str, max_term: i64) {
        if let Ok(mut table) = self.table.lock()
            && table.resources.get(resource).is_some_and(|grant| grant.term < max_term)
        {
            table.resources.remove(resource);
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
        let mut guard = self.table.lock().ok()?;
        let table = &mut *guard;
        let grant = table.resources.get(resource)?;
        if grant.generation != generation {
            table.resources.remove(resource);
            return None;
        }
        if !grant.covers(presented, bind_lease) {
            return None;
        }
        // The grant that lasts for it: its own (unbound), or its lease's (bound).
        let lasting = match bind_lease {
            None => {
                let grant = table.resources.get_mut(resource)?;
                grant.own.as_mut()?
            }
            Some(key) => {
                let lease = table.leases.get_mut(key)?;
                if lease.generation != generation || !grant.under(lease) {
                    return None;
                }
                &mut lease.lasting
            }
        };
        if !lasting.lasts(now, boot_now) {
            if bind_lease.is_none() {
                table.resources.remove(resource);
            }
            return None;
        }
        let deadline = lasting.deadline;
        let renew = now >= lasting.renew_after && !lasting.renewing;
        lasting.renewing |= renew;
        let grant = table.resources.get(resource)?;
        // S5 for a write admitted now under a grant: sent no earlier than the decision's answer
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
            grant: deadline.saturating_duration_since(now),
            epoch: grant.epoch,
            // Its wait is counted from the grant's decision, which named the settle.
            settle_id: None,
        };
        let decision = Decision {
            gate,
            asked: latest_start.checked_sub(wait).unwrap_or(now).min(now),
            answered: now,
            clocks: ClockTicket::new(&self.clock, generation, (now, boot_now)),
        };
        // The renewal wakes the shared runtime: never while holding the lock every proxy thread
        // takes per write (a thread preempted by the woken one would stall them all).
        drop(guard);
        if renew && !self.renew(resource, presented, bind_lease, lane, settles) {
            self.renewed(resource, bind_lease);
        }
        Some(decision)
    }

    /// The renewal of the grant covering `resource` is no longer out.
    fn renewed(&self, resource: &str, bind_lease: Option<&str>) {
        if let Ok(mut table) = self.table.lock() {
            renewal_done(&mut table, resource, bind_lease);
        }
    }

    /// Sends one decision for `resource` that no writer waits for: its answer renews the grant
    /// (on a bound route, its lease's). False when it could not be sent.
    fn renew(
        &self,
        resource: &str,
        presented: &Presented,
        bind_lease: Option<&str>,
        lane: &mpsc::UnboundedSender<Pending>,
        settles: &Settles,
    ) -> bool {
        let (pending, answer) = Pending::new(resource, presented, bind_lease, true);
        // The agreement the renewal is asked under: its grant and settle are counted from here.
        let generation = self.clock.generation();
        let started = Instant::now();
        let boot_started = BootInstant::now();
        if lane.send(pending).is_err() {
            return false;
        }
        let table = Arc::clone(&self.table);
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
                        gate.wait = settles.wait(&resource, term, &gate, (answered, &clocks));
                    }
                    if !gate.is_admitted() || clocks.holds() {
                        install(
                            &table,
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
            if let Ok(mut table) = table.lock() {
                renewal_done(&mut table, &resource, bind_lease.as_deref());
            }
        });
        true
    }
}

/// Marks the renewal of the grant covering `resource` (on a bound route, its lease's) as back.
fn renewal_done(table: &mut Table, resource: &str, bind_lease: Option<&str>) {
    let lasting = match bind_lease {
        None => table.resources.get_mut(resource).and_then(|grant| grant.own.as_mut()),
        Some(key) => table.leases.get_mut(key).map(|lease| &mut lease.lasting),
    };
    if let Some(lasting) = lasting {
        lasting.renewing = false;
    }
}

/// How often ended grants are dropped and the grant gauges set.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// Every [`SWEEP_EVERY`], for as long as the table lives: drops the grants that have ended (a
/// write finds them ended and drops them too, but a resource no longer written would keep its row),
/// the lease grants ended [`KEEP_ENDED`] ago, and the decisions no lease grant kept covers once
/// they are that old; sets `fencing_grants_held`, `fencing_grant_covered_resources` and
/// `fencing_grant_table_bytes`, so what the grants cost this gateway is on its dashboard: grants
/// held, and memory.
async fn sweep(table: std::sync::Weak<Mutex<Table>>) {
    let held = metrics::gauge!(names::GRANTS_HELD);
    let covered = metrics::gauge!(names::GRANT_COVERED);
    let bytes = metrics::gauge!(names::GRANT_TABLE_BYTES);
    loop {
        tokio::time::sleep(SWEEP_EVERY).await;
        let Some(table) = table.upgrade() else { return };
        let Ok(mut guard) = table.lock() else { return };
        let table = &mut *guard;
        let (now, boot_now) = (Instant::now(), BootInstant::now());
        let kept = now.checked_sub(KEEP_ENDED);
        table.leases.retain(|_, lease| kept.is_none_or(|kept| lease.lasting.deadline > kept));
        let leases = &table.leases;
        table.resources.retain(|_, grant| match (&grant.own, &grant.bind_lease) {
            (Some(own), _) => own.lasts(now, boot_now),
            (None, Some(key)) => {
                leases.get(key).is_some_and(|lease| grant.under(lease)) || kept.is_none_or(|kept| grant.answered > kept)
            }
            (None, None) => false,
        });
        // After a burst of resources, give back what the table no longer needs.
        let len = table.resources.len();
        if table.resources.capacity() > 4 * len.max(1024) {
            table.resources.shrink_to(2 * len);
        }
        let lasting_leases = table.leases.values().filter(|lease| lease.lasting.lasts(now, boot_now)).count();
        let own = table.resources.values().filter(|grant| grant.own.is_some()).count();
        held.set((lasting_leases + own) as f64);
        covered.set((table.resources.len() - own) as f64);
        bytes.set(table_bytes(table) as f64);
    }
}

/// The memory the table takes, estimated: its slots (key and grant, by capacity) and the strings
/// they own.
fn table_bytes(table: &Table) -> usize {
    let stamp =
        |stamp: &Option<(String, String)>| stamp.as_ref().map_or(0, |(key, owner)| key.capacity() + owner.capacity());
    let slot = std::mem::size_of::<(String, Grant)>() + 1;
    let owned: usize = table
        .resources
        .iter()
        .map(|(resource, grant)| {
            resource.capacity() + grant.bind_lease.as_ref().map_or(0, String::capacity) + stamp(&grant.stamp)
        })
        .sum();
    let lease_slot = std::mem::size_of::<(String, LeaseGrant)>() + 1;
    let lease_owned: usize = table.leases.iter().map(|(key, lease)| key.capacity() + stamp(&lease.stamp)).sum();
    table.resources.capacity() * slot + owned + table.leases.capacity() * lease_slot + lease_owned
}

/// What a grant is held for.
pub(super) struct GrantKey<'a> {
    pub(super) resource: &'a str,
    pub(super) presented: &'a Presented,
    pub(super) bind_lease: Option<&'a str>,
}

impl Grants {
    /// Records the grant a decision's answer carries, and on a bound route the decision itself
    /// (or drops what is held, when the answer refused the write). `anchors`: when the decision
    /// was asked for, on both clocks, and when its answer came.
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

/// Records the grant an answer carries, and on a bound route the decision (or drops what is
/// held, when the answer refused the write). `(started, boot_started, answered)`: when the
/// decision was asked for, on both clocks, and when its answer came. `(asked, margin, rho)`: the
/// grant length asked for, the settle margin and the clock-rate allowance rho. The grant lasts,
/// counted from before the decision was asked for, what the store gave and never more than was
/// asked, times (1 - rho) / (1 + rho) (this gateway's clock may run rho slow, and the store's
/// sleep, which a term change waits the grant out with, rho fast), less the margin.
fn install(
    table: &Mutex<Table>,
    key: &GrantKey<'_>,
    gate: &Gate,
    (started, boot_started, answered): (Instant, BootInstant, Instant),
    (asked, margin, rho): (Duration, Duration, f64),
    generation: u64,
) {
    let Ok(mut guard) = table.lock() else { return };
    let table = &mut *guard;
    let stamp = match key.presented {
        Presented::Token(_) => None,
        Presented::Lease { key, owner } => Some((key.clone(), owner.clone())),
    };
    let (true, Some(term)) = (gate.is_admitted(), gate.term) else {
        // A refusal: the resource's grant or decision goes, and on a bound route the lease's
        // grant of the refused term (stamp mode: the refused owner's). A zombie's older term
        // leaves the leader's grant alone.
        table.resources.remove(key.resource);
        if let Some(lease_key) = key.bind_lease
            && table
                .leases
                .get(lease_key)
                .is_some_and(|lease| gate.term.map_or(lease.stamp == stamp, |t| lease.term == t))
        {
            table.leases.remove(lease_key);
        }
        return;
    };
    let now = (Instant::now(), BootInstant::now());
    let lasts =
        gate.grant.min(asked).mul_f64((1.0 - rho) / (1.0 + rho)).checked_sub(margin).filter(|lasts| !lasts.is_zero());
    let lasting = lasts.map(|lasts| Lasting {
        boot_deadline: boot_started + lasts,
        deadline: started + lasts,
        // Renew once half of the asked-for grant is left. An answer that gave no grant (a term
        // change held the fence) leaves this one to its end; the next renewal goes a sixteenth
        // of a grant after the answer at the earliest.
        renew_after: (started + lasts).checked_sub(asked / 2).unwrap_or(started).max(answered + asked / 16),
        renewing: false,
    });
    let bound = key.bind_lease.is_some() && gate.epoch.is_some();
    if key.bind_lease.is_some() && !bound {
        // A bound route's answer without an epoch (a schema before version 9 cannot answer one):
        // no lease grant.
        return;
    }
    // An unbound route keeps a decision only with a grant of its own.
    if !bound && lasting.is_none() {
        return;
    }
    let grant = Grant {
        term,
        bind_lease: key.bind_lease.map(str::to_owned),
        stamp: stamp.clone(),
        epoch: gate.epoch,
        asked: started,
        answered,
        wait: gate.wait,
        own: if bound { None } else { lasting.clone() },
        generation,
    };
    if table.resources.len() >= CAPACITY && !table.resources.contains_key(key.resource) {
        table.resources.clear();
    }
    match table.resources.get(key.resource) {
        // Never replace a grant or decision of a higher term (answers may arrive out of order)
        // while it may still be of use.
        Some(held) if held.term > term && held.own.as_ref().is_none_or(|own| own.lasts(now.0, now.1)) => {}
        _ => {
            table.resources.insert(key.resource.to_owned(), grant);
        }
    }
    if let (true, Some(lease_key), Some(lasting)) = (bound, key.bind_lease, lasting) {
        let fresh = LeaseGrant { term, epoch: gate.epoch, stamp, lasting, generation };
        match table.leases.get(lease_key) {
            // Never replace a lasting lease grant of a higher term or epoch.
            Some(held) if (held.term, held.epoch) > (term, gate.epoch) && held.lasting.lasts(now.0, now.1) => {}
            _ => {
                table.leases.insert(lease_key.to_owned(), fresh);
            }
        }
    }
}
