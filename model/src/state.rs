//! The state of the model: the store's tables and open transactions, the gateways, the electors,
//! and the ghost variables the properties read.
//!
//! Times are ticks ([`crate::Timing`]). `now` is real time; the store's wall clock reads
//! `now + wall_offset`; gateway `g`'s boot clock reads `now + skew`. Electors' boot clocks are
//! real time (S1-S5 do not rest on them: a zombie leader's writes are modelled as writes of any
//! term arriving at any time).
//!
//! A message is the stage of the call it belongs to: a call is asked (in flight to the store), in
//! the store (a transaction between statements or asleep holding locks), or answered (in flight
//! back). Calls are delivered in any order and any may be lost; see [`crate::protocol`].

use crate::config::{ELECTORS, GATEWAYS, MAX_CALLS, MAX_RESOURCES, MAX_WRITES};

/// The row of `fencing.leases` for the one lease key (`term` 0: no row yet).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Lease {
    /// The elector holding it (`owner`), if any ever did.
    pub owner: Option<u8>,
    /// The current term; 0 before the first acquire.
    pub term: u8,
    /// `expires_at`, on the store's wall clock.
    pub expires: i8,
    /// `grants_ended_term`: the term whose grants a new term already waited out.
    pub grants_ended_term: u8,
    /// Lease-scoped grants (the planned design): the longest grant given at this term.
    pub grant: u8,
    /// The repaired lease-grant design: bumped by an operator's change of a fence bound to this
    /// lease (`advance_fence`, `bind`, `rebind`); a gateway's decisions of a resource count for
    /// the lease's grant only at the epoch the grant carries.
    pub epoch: u8,
}

/// A fence row's `lease_key`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Binding {
    /// `NULL`: any term its writers present (an unbound route's, or a protected table's before
    /// `fencing.bind`).
    Unbound,
    /// The model's lease `k`.
    Lease,
    /// Another lease, `k2`, that nobody in the model ever holds (after `fencing.rebind`): every
    /// write is refused from then on.
    Other,
}

/// A row of `fencing.fences`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fence {
    /// `lease_key`.
    pub binding: Binding,
    /// `max_term`.
    pub max_term: u8,
    /// `settle_ms`: how long writes of this term wait from their decision (`None`: settled).
    pub settle: Option<u8>,
    /// `drain_ms`: the settle the writes decided before the mark still wait.
    pub drain: Option<u8>,
    /// `grant_ms`: the longest grant given at this term.
    pub grant: u8,
    /// The planted `wall-clock-waits` only: when the grants end, on the store's wall clock
    /// (`fencing.planted_grant_ends`).
    pub grant_ends: Option<i8>,
}

/// The store's tables.
/// The unbound route's namespace, in the namespace-grant design only (`Plant::NamespaceGrants`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Namespace {
    /// The longest grant given on the namespace (at any term).
    pub grant: u8,
    /// Bumped by every raise of one of its fences: a gateway's decisions count for a namespace
    /// grant only at the epoch the grant carries.
    pub epoch: u8,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tables {
    pub lease: Lease,
    pub fences: [Option<Fence>; MAX_RESOURCES],
    /// The namespace-grant design only.
    pub namespace: Namespace,
}

/// Where a gateway's decision is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stage {
    /// A stamp-mode write's decision on its way to the store: `fencing.gate_lease` reads the
    /// lease first, and the term it stamps is decided by `fencing.gate`, the next statement.
    Stamp,
    /// On its way to the store (`attempt` 0), or about to be read again in the store after a
    /// version changed under it (`CONTINUE` in `fencing.gate`, `attempt` 1 or 2).
    Asked { attempt: u8 },
    /// `fencing.gate` read the fence row (one statement, no lock) and found a write of its
    /// current term that asks for a grant: the statements that take the locks come next.
    /// `settle`: the version read's settle.
    ReadGrant { attempt: u8, settle: u8, epoch: u8 },
    /// `fencing.gate` read a lower maximum: `SELECT .. FOR UPDATE` comes next.
    ReadRaise { attempt: u8 },
    /// The raise holds the fence row (`FOR UPDATE`) and the fence's advisory lock, asleep in
    /// `fencing.await_grants` until `until` (real time; the store's wall clock under
    /// `wall-clock-waits`).
    Raising { until: i8 },
    /// Decided in a batch (`fencing.gate_many` of several items, [`crate::Config::batched`]): what
    /// it wrote is not visible to others, and its locks are held, until the batch commits, after
    /// its other items; then `answer` goes back.
    Holding { answer: Answer, held: Held },
    /// Answered: the answer is on its way back.
    Answered(Answer),
}

/// What a decision in a batch holds until the batch commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Held {
    /// A raise: the row `FOR UPDATE` (and the fence's advisory lock), with the row it wrote.
    Raise(Fence),
    /// A resource's first write: the row it inserted (an insert of the same key waits for it).
    Insert(Fence),
    /// A grant: the grant advisory locks shared (a term change of the fence, or of a bound
    /// fence's lease, waits for them), and, when it recorded a longer grant (`Some`), the row
    /// `FOR NO KEY UPDATE`.
    Grant { record: Option<u8> },
}

/// What `fencing.gate` answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Answer {
    /// Admitted: wait `wait` from the decision, and a grant of `grant`; `epoch`: the lease's
    /// (bound) or the namespace's (unbound, namespace-grant design) epoch read with the version
    /// it was decided on, which the answer carries.
    Admitted { wait: u8, grant: u8, epoch: u8 },
    /// Refused (stale, future term, not leader); `max`: the maximum it saw, if any.
    Refused { max: u8 },
    /// The fence kept changing (SQLSTATE 40001): undecided.
    Failed,
}

/// A gateway's decision call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Call {
    pub resource: u8,
    /// The term presented (verify mode) or stamped (stamp mode; 0 until the lease is read).
    pub term: u8,
    /// Stamp mode: the elector whose identity the write presents (`Fencing-Lease`,
    /// `Fencing-Owner`); `None` in verify mode.
    pub owner: Option<u8>,
    /// When it was asked, on this gateway's boot clock.
    pub asked: i8,
    pub stage: Stage,
}

/// An admitted write, waiting out its settle or on its way to the upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Write {
    pub resource: u8,
    pub term: u8,
    /// Stamp mode: the owner the write presented.
    pub owner: Option<u8>,
    /// Sent no earlier than this (boot clock): the settle's end.
    pub start: i8,
    /// Never sent from this on (boot clock): decision + the store's wait + forward timeout.
    pub deadline: i8,
    /// Its deadline was checked and its bytes are going out.
    pub checked: bool,
}

/// A grant the gateway holds (`gateway/src/fence/grants.rs`, `Grant`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Grant {
    pub term: u8,
    /// Stamp mode: the owner it was decided for (it covers that owner's stamp writes only);
    /// `None` in verify mode (it covers writes presenting `term`).
    pub owner: Option<u8>,
    /// The repaired lease-grant design: the lease's epoch its decision read (0 otherwise).
    pub epoch: u8,
    /// Its end on the boot clock: asked + grant - drift allowance.
    pub deadline: i8,
    /// The settle's end it was given with (boot clock): writes under it start no earlier.
    pub start: i8,
    /// The namespace-grant design: the resource the grant was given through (0 otherwise).
    pub via: u8,
    /// asked + the store's wait: writes under it end no later than this (or now) + forward.
    pub latest: i8,
}

/// What a gateway knows of one fence's settle (`gateway/src/fence/settles.rs`, `Settle`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Settle {
    pub term: u8,
    /// The length the store said (`settle_ms`).
    pub length: u8,
    /// The earliest end seen (boot clock).
    pub end: i8,
    /// After `fencing.mark_settled`: `fencing.mark_drained` is due at this boot instant.
    pub drained_at: Option<i8>,
}

/// A gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Gateway {
    /// Its boot clock reads `now + skew`.
    pub skew: i8,
    /// Its clock drifted already (once per run).
    pub drifted: bool,
    /// Its grants, by resource.
    pub grants: [Option<Grant>; MAX_RESOURCES],
    /// Lease-scoped grants (the planned design): its grant on the lease.
    pub lease_grant: Option<Grant>,
    /// The namespace-grant design: its grant on the unbound route's namespace.
    pub ns_grant: Option<Grant>,
    /// Its settles, by resource.
    pub settles: [Option<Settle>; MAX_RESOURCES],
    /// Its decisions out (sorted: the state has one spelling).
    pub calls: [Option<Call>; MAX_CALLS],
    /// A decision it gave up on (its timeout) that is still in the store: it may run later, and
    /// its answer goes nowhere ([`crate::Config::give_up`]).
    pub orphan: Option<Call>,
    /// The designs `lease-grants-after-decision` (bound resources) and `namespace-grants`
    /// (unbound ones) only: per resource, the term of its last admitted decision, the epoch it
    /// was made at, and the start and latest start it gave (`deadline` unused).
    pub decided: [Option<Grant>; MAX_RESOURCES],
    /// Its admitted writes (sorted).
    pub writes: [Option<Write>; MAX_WRITES],
}

/// What an elector asked the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LeaseCall {
    Acquire,
    Renew,
    Release,
}

/// Where an elector's call is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LeaseStage {
    /// On its way to the store.
    Asked,
    /// `fencing.acquire` holds the lease row (`FOR UPDATE`) and the lease's advisory lock, asleep
    /// until `until` (real time) waiting out the grants on the old term.
    Sleeping { until: i8, slept: u8 },
    /// Answered: `Some((term, remaining))` when ok.
    Answered(Option<(u8, i8)>),
}

/// An elector's call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ElectorCall {
    pub call: LeaseCall,
    /// When it was sent (its boot clock, here real time).
    pub sent: i8,
    pub stage: LeaseStage,
}

/// An elector (`election/src/runtime.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Elector {
    /// `Some((term, deadline))` while it leads.
    pub leading: Option<(u8, i8)>,
    pub call: Option<ElectorCall>,
    /// A call it gave up on (its timeout) that is still in the store: it may run later, after
    /// the elector's next calls, and its answer goes nowhere ([`crate::Config::give_up`]).
    pub orphan: Option<ElectorCall>,
}

/// Ghost variables: what the properties read, kept by the transitions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Ghost {
    /// Per resource, the highest term admitted so far (S3).
    pub admitted: [u8; MAX_RESOURCES],
    /// Per resource, the highest term sent to the upstream so far (S5).
    pub sent: [u8; MAX_RESOURCES],
    /// The highest term the store granted to a new period (S2).
    pub granted: u8,
    /// The terms electors have led with, as bits (S2).
    pub led: u8,
    /// Per elector, the terms the store granted it, as bits (S4 in stamp mode: a stamp write
    /// carries a term its presented owner was granted).
    pub owned: [u8; ELECTORS],
    /// Per resource, the binding an admin action last answered (`fencing.bind`,
    /// `fencing.rebind`): S4 asks that the row keeps it.
    pub bindings: [Option<Binding>; MAX_RESOURCES],
    /// Invariants violated so far, as bits ([`crate::Invariant`]).
    pub violated: u8,
    /// Events that happened so far in this run, as bits ([`crate::Witness`]): what the checks
    /// assert was reached, so that a check cannot silently stop exercising them.
    pub seen: u16,
}

/// The whole state.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct State {
    /// Real time.
    pub now: i8,
    /// The store's wall clock reads `now + wall_offset`.
    pub wall_offset: i8,
    /// The store's clock was stepped (once per run).
    pub stepped: bool,
    /// Writes that arrived at gateways so far ([`crate::Config::writes`]).
    pub writes: u8,
    /// Calls electors made so far ([`crate::Config::lease_calls`]).
    pub lease_calls: u8,
    /// The store's tables as committed.
    pub tables: Tables,
    /// `async-commit` only: the tables as they survive a crash (what was flushed).
    pub durable: Option<Tables>,
    pub gateways: [Gateway; GATEWAYS],
    pub electors: [Elector; ELECTORS],
    /// The SQL writer's open transaction, if any.
    pub sql: Option<SqlTx>,
    /// An admin action asleep holding its fence row, if any.
    pub admin: Option<AdminTx>,
    /// Admin actions run so far ([`crate::Config::admin_actions`]).
    pub admin_actions: u8,
    pub ghost: Ghost,
    /// How many resources are bound to the lease ([`crate::Config::bound_resources`]), constant
    /// over a run: the symmetry reduction ([`crate::symmetry`]) may swap two bound resources.
    pub bound: u8,
}

/// An operator's audited action (`fencing.advance_fence`, `fencing.bind`, `fencing.rebind`,
/// `fencing.force_release`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Admin {
    /// `fencing.advance_fence(resource, term)`: raises the maximum by hand (inserting an unbound
    /// row when there is none).
    Advance { resource: u8, term: u8 },
    /// `fencing.bind(resource, 'k')`: binds an unbound (or new) fence to the lease.
    Bind { resource: u8 },
    /// `fencing.rebind(resource, 'k2')`: binds the fence to another lease.
    Rebind { resource: u8 },
    /// `fencing.force_release('k')`: ends the current period, whoever holds it.
    ForceRelease,
}

impl Admin {
    /// The resource it acts on, if any.
    pub fn resource(self) -> Option<u8> {
        match self {
            Admin::Advance { resource, .. } | Admin::Bind { resource } | Admin::Rebind { resource } => Some(resource),
            Admin::ForceRelease => None,
        }
    }
}

/// An admin action asleep in `fencing.await_grants`, holding its fence row `FOR UPDATE` (and the
/// fence's advisory lock), until `until` (real time).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AdminTx {
    pub action: Admin,
    pub until: i8,
}

/// The SQL writer's transaction (`fencing.admit`, as the SQL guard calls it, then its row, then
/// `COMMIT`), on a resource whose fence row exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SqlTx {
    pub resource: u8,
    pub term: u8,
    pub stage: SqlStage,
}

/// Where the SQL writer's transaction is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SqlStage {
    /// `fencing.try_admit`'s plain read is done: next, the row lock (`FOR KEY SHARE` for the
    /// fence's own term, `FOR UPDATE` to raise it).
    Read { raise: bool },
    /// Asleep in `fencing.await_grants`, holding the row `FOR UPDATE`.
    Raising { until: i8 },
    /// Admitted, holding the row until `COMMIT` (`FOR UPDATE` and the raise not yet visible
    /// when `raised`).
    Holding { raised: bool },
}

impl State {
    /// The store's wall clock.
    pub fn wall(&self) -> i8 {
        self.now + self.wall_offset
    }

    /// Gateway `g`'s boot clock.
    pub fn boot(&self, g: usize) -> i8 {
        self.now + self.gateways[g].skew
    }
}

impl Gateway {
    /// A gateway with nothing going on.
    pub fn idle() -> Gateway {
        Gateway {
            skew: 0,
            drifted: false,
            grants: [None; MAX_RESOURCES],
            lease_grant: None,
            ns_grant: None,
            settles: [None; MAX_RESOURCES],
            calls: [None; MAX_CALLS],
            orphan: None,
            decided: [None; MAX_RESOURCES],
            writes: [None; MAX_WRITES],
        }
    }

    /// Puts `call` in a free slot; false when there is none.
    pub fn add_call(&mut self, call: Call) -> bool {
        insert_sorted(&mut self.calls, call)
    }

    /// Puts `write` in a free slot; false when there is none.
    pub fn add_write(&mut self, write: Write) -> bool {
        insert_sorted(&mut self.writes, write)
    }

    /// Whether a write slot is free.
    pub fn write_slot_free(&self) -> bool {
        self.writes.iter().any(Option::is_none)
    }

    /// Whether a call slot is free.
    pub fn call_slot_free(&self) -> bool {
        self.calls.iter().any(Option::is_none)
    }
}

/// Puts `item` into a free slot of `slots` and sorts them, so that one set of items has one
/// spelling; false when no slot is free.
pub fn insert_sorted<T: Ord + Copy, const N: usize>(slots: &mut [Option<T>; N], item: T) -> bool {
    let Some(free) = slots.iter_mut().find(|slot| slot.is_none()) else { return false };
    *free = Some(item);
    slots.sort();
    true
}

/// Empties slot `index` of `slots` and sorts them.
pub fn remove_sorted<T: Ord + Copy, const N: usize>(slots: &mut [Option<T>; N], index: usize) {
    if let Some(slot) = slots.get_mut(index) {
        *slot = None;
    }
    slots.sort();
}
