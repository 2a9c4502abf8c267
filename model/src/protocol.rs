//! The transitions of the model and its properties.
//!
//! Each [`Action`] is one step that the real code takes atomically: one SQL statement (or the
//! statements of a function that run under one lock without a wait between them), one decision
//! of a gateway, one check or send of a write, one tick of real time. [`crate::mirrors`] names the
//! code each one mirrors.
//!
//! Messages between processes and the store are the stages of calls ([`Stage`],
//! [`LeaseStage`]): any call may be delivered at any later step (delayed, and reordered with every
//! other call), and any call on its way, either way, may be lost. A call the store never ran is
//! lost before it arrived; one whose answer is lost ran and committed, and its caller never
//! learns the outcome (it timed out). A duplicated or delayed write from a leader needs no
//! message of its own: writes of any term arrive at any gateway at any step
//! ([`Action::GatewayDecide`]), which covers a zombie leader, a client's retry and a forged token.
//!
//! A process is paused across any number of steps simply by taking none: ticks of real time go
//! on without it. The one exception is S5's timing assumption ([`Config::pause_assumption`]).

use stateright::{Model, Property};

use crate::config::{Config, ELECTORS, GATEWAYS, MAX_CALLS, MAX_RESOURCES, Plant};
use crate::state::{
    Admin, AdminTx, Answer, Binding, Call, Elector, ElectorCall, Fence, Gateway, Ghost, Grant, Held, Lease, LeaseCall,
    LeaseStage, Namespace, Settle, SqlStage, SqlTx, Stage, State, Tables, Write, remove_sorted,
};

/// Which function's transaction commits (`fencing.commit_durably` is called on each path; the
/// fault suite's durability plants take it away from one path at a time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Commit {
    /// `fencing.acquire`, `renew`, `release`, `force_release`.
    Lease,
    /// `fencing.gate` (`gate_many`).
    Gate,
    /// `fencing.try_admit` (`fencing.admit`, the SQL guard).
    Admit,
    /// `fencing.advance_fence`.
    Advance,
    /// `fencing.bind`.
    Bind,
    /// `fencing.rebind`.
    Rebind,
}

impl Commit {
    /// The path of an admin action.
    fn of(action: Admin) -> Commit {
        match action {
            Admin::Advance { .. } => Commit::Advance,
            Admin::Bind { .. } => Commit::Bind,
            Admin::Rebind { .. } => Commit::Rebind,
            Admin::ForceRelease => Commit::Lease,
        }
    }
}

/// The model: a [`Config`] and the transitions it allows.
#[derive(Debug, Clone)]
pub struct Protocol {
    pub config: Config,
}

/// The contract's safety invariants (`docs/CONTRACT.md`), as bits of [`Ghost::violated`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Invariant {
    /// S1: at most one owner holds an unexpired lease at any instant of the store's clock: a new
    /// period of another owner starts only once the row's lease has expired by that clock.
    S1,
    /// S2: terms strictly increase across leadership periods: every new period the store grants
    /// has a term above every earlier one, and no elector leads twice with one term (a period it
    /// ended locally is over).
    S2,
    /// S3: per resource, admitted terms never decrease: no admission (through the store or under
    /// a gateway's grant) of a term below one admitted before.
    S3,
    /// S4: a bound resource admits only its lease's current term, at the instant of admission.
    S4,
    /// S5: per resource, no write is sent to the upstream after a write of a higher term was
    /// (every earlier-admitted lower-term write has been sent, aborted, or passed its deadline),
    /// and no byte of a write is sent after its own deadline.
    S5,
    /// S7: a holder's local deadline is the instant it sent its last ok acquire or renew plus the
    /// remaining time the store reported, minus the margin (never past the store's expiry as
    /// reported), and it stops acting at that deadline, checked whenever it acts.
    S7,
}

impl Invariant {
    /// Every invariant.
    pub const ALL: [Invariant; 6] =
        [Invariant::S1, Invariant::S2, Invariant::S3, Invariant::S4, Invariant::S5, Invariant::S7];

    fn bit(self) -> u8 {
        match self {
            Invariant::S1 => 1,
            Invariant::S2 => 2,
            Invariant::S3 => 4,
            Invariant::S4 => 8,
            Invariant::S5 => 16,
            Invariant::S7 => 32,
        }
    }

    /// The property's name.
    pub fn name(self) -> &'static str {
        match self {
            Invariant::S1 => "S1 one unexpired holder",
            Invariant::S2 => "S2 terms increase across periods",
            Invariant::S3 => "S3 admitted terms never decrease",
            Invariant::S4 => "S4 bound resource admits only the lease's term",
            Invariant::S5 => "S5 upstream order and deadlines",
            Invariant::S7 => "S7 a holder stops at its local deadline",
        }
    }

    /// Whether `ghost` records a violation of this invariant.
    pub fn violated(self, ghost: &Ghost) -> bool {
        ghost.violated & self.bit() != 0
    }
}

/// Events a check must reach (stateright's `sometimes` properties), as bits of [`Ghost::seen`]: a
/// check that asserts one was reached cannot become vacuous about it unnoticed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Witness {
    /// A write admitted by a gateway under a grant it held (`Grants::admit`), not by the store.
    GrantAdmission,
    /// A write admitted under a grant after the store's clock was stepped and a boot clock
    /// drifted, in the same run.
    GrantAdmissionAfterClockFaults,
    /// A raise woke after sleeping out the grants on the lower term (`fencing.await_grants`).
    RaiseSleptOutGrants,
    /// `fencing.acquire` started a new period after sleeping out the grants on the old term.
    AcquireSleptOutGrants,
    /// A raise of a bound fence refused on the lease read again after its row lock: a newer term
    /// was granted while it waited (`fencing.lease_refusal`).
    RaiseRefusedByNewerLease,
    /// An SQL writer's transaction committed its row.
    SqlWriteCommitted,
    /// A call its caller had given up on ran in the store after the caller's next call was sent
    /// (an elector's) or answered (a gateway's).
    CallRunAfterGiveUp,
    /// A raise held in a batch until the batch committed (and was answered then).
    BatchedRaiseCommitted,
    /// An admin action that changes a fence's term or binding slept out grants first.
    AdminSleptOutGrants,
    /// A stamp-mode write admitted under a grant its gateway keeps for the presented owner.
    StampGrantAdmission,
    /// `fencing.bind` bound a fence that was raised (by a write or by hand) while unbound.
    FenceBoundByHand,
    /// The namespace-grant design: a write admitted under a namespace grant given through
    /// another resource of the namespace.
    NamespaceGrantOtherResource,
    /// The same after a raise of one of the namespace's fences (its epoch moved).
    NamespaceGrantAfterRaise,
}

impl Witness {
    /// Every witness.
    pub const ALL: [Witness; 13] = [
        Witness::GrantAdmission,
        Witness::GrantAdmissionAfterClockFaults,
        Witness::RaiseSleptOutGrants,
        Witness::AcquireSleptOutGrants,
        Witness::RaiseRefusedByNewerLease,
        Witness::SqlWriteCommitted,
        Witness::CallRunAfterGiveUp,
        Witness::BatchedRaiseCommitted,
        Witness::AdminSleptOutGrants,
        Witness::StampGrantAdmission,
        Witness::FenceBoundByHand,
        Witness::NamespaceGrantOtherResource,
        Witness::NamespaceGrantAfterRaise,
    ];

    fn bit(self) -> u16 {
        match self {
            Witness::GrantAdmission => 1,
            Witness::GrantAdmissionAfterClockFaults => 2,
            Witness::RaiseSleptOutGrants => 4,
            Witness::AcquireSleptOutGrants => 8,
            Witness::RaiseRefusedByNewerLease => 16,
            Witness::SqlWriteCommitted => 32,
            Witness::CallRunAfterGiveUp => 64,
            Witness::BatchedRaiseCommitted => 128,
            Witness::AdminSleptOutGrants => 256,
            Witness::StampGrantAdmission => 512,
            Witness::FenceBoundByHand => 1024,
            Witness::NamespaceGrantOtherResource => 2048,
            Witness::NamespaceGrantAfterRaise => 4096,
        }
    }

    /// The property's name.
    pub fn name(self) -> &'static str {
        match self {
            Witness::GrantAdmission => "reached: a write admitted under a grant",
            Witness::GrantAdmissionAfterClockFaults => {
                "reached: a write admitted under a grant after a clock step and a drift"
            }
            Witness::RaiseSleptOutGrants => "reached: a raise slept out grants",
            Witness::AcquireSleptOutGrants => "reached: an acquire slept out grants and started its period",
            Witness::RaiseRefusedByNewerLease => "reached: a raise refused by a term granted while it waited",
            Witness::SqlWriteCommitted => "reached: an SQL writer committed its row",
            Witness::CallRunAfterGiveUp => "reached: a call run after its caller gave up and called again",
            Witness::BatchedRaiseCommitted => "reached: a raise held in a batch until its commit",
            Witness::AdminSleptOutGrants => "reached: an admin action slept out grants",
            Witness::StampGrantAdmission => "reached: a stamp-mode write admitted under its owner's grant",
            Witness::FenceBoundByHand => "reached: fencing.bind bound a fence raised while unbound",
            Witness::NamespaceGrantOtherResource => {
                "reached: a write admitted under a namespace grant given through another resource"
            }
            Witness::NamespaceGrantAfterRaise => {
                "reached: a write admitted under a namespace grant given through another resource after a raise in the namespace"
            }
        }
    }

    /// Whether `ghost` records the event.
    pub fn seen(self, ghost: &Ghost) -> bool {
        ghost.seen & self.bit() != 0
    }
}

/// One step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// One tick of real time; every boot clock and the store's wall clock advance with it. What
    /// a tick ends ends at its start: grants and writes past their deadline (dropped, aborted),
    /// leaders past theirs (the elector's watchdog), settles and drains a gateway has seen end
    /// (`fencing.mark_settled`, `fencing.mark_drained`, called at the earliest instant they can
    /// be: a later call only makes writes wait longer).
    Tick,
    /// One tick of real time during which `gateway`'s boot clock stands still (`slow`) or counts
    /// two ticks: its drift, once per run.
    TickDrift { gateway: u8, slow: bool },
    /// The store's wall clock is stepped by `Timing::step`, forward or back (once per run).
    StepClock { forward: bool },
    /// `async-commit` only: the store crashes and restarts with what was flushed; the
    /// transactions open in it are gone.
    Crash,
    /// `async-commit` only: the store flushes its commits.
    Flush,
    /// An idle elector asks `fencing.acquire` (always with `new_period`).
    ElectorAcquire(u8),
    /// A leading elector asks `fencing.renew`.
    ElectorRenew(u8),
    /// A leading elector stops leading, then asks `fencing.release`.
    ElectorRelease(u8),
    /// An elector's call is lost on its way (the elector times out; the store never runs it).
    ElectorLost(u8),
    /// `fencing.acquire` runs: a refusal, or a new period (at once, or asleep holding the lease
    /// row while the grants on the old term end). An answer reaches the elector at once, or is
    /// `lost` (see [`Action::GateRead`] for why at once).
    StoreAcquire { elector: u8, lost: bool },
    /// An asleep `fencing.acquire` wakes, starts the new period and commits.
    StoreAcquireWakes { elector: u8, lost: bool },
    /// `fencing.renew` runs.
    StoreRenew { elector: u8, lost: bool },
    /// `fencing.release` runs.
    StoreRelease { elector: u8, lost: bool },
    /// A write of `term` for `resource` arrives at `gateway`: admitted under a grant that covers
    /// it and lasts (its boot clock before the grant's deadline), or its decision is asked.
    GatewayDecide { gateway: u8, resource: u8, term: u8 },
    /// A stamp-mode write for `resource` presenting elector `owner`'s identity arrives at
    /// `gateway`: admitted under a grant kept for that owner, or its decision is asked
    /// (`fencing.gate_lease`).
    GatewayStampWrite { gateway: u8, resource: u8, owner: u8 },
    /// `fencing.gate_lease` reads the lease for the stamp-mode decision in `call`: refused
    /// (`not_leader`) unless the presented owner holds it unexpired, else the lease's term is
    /// stamped and `fencing.gate` decides it next.
    GateStamp { gateway: u8, call: u8, lost: bool },
    /// `gateway`'s decision is lost on its way (the store never runs it).
    GatewayLost { gateway: u8, call: u8 },
    /// `fencing.gate`'s first statement (a plain read) for the decision in `call`. When it
    /// answers, the answer reaches the gateway at once, or is `lost`: at once is the most
    /// adversarial delivery (a later answer only starts its write later, and its grant, counted
    /// from the asking, is then shorter).
    GateRead { gateway: u8, call: u8, lost: bool },
    /// `fencing.gate`'s grant statements: the advisory locks tried shared, the row locked
    /// `SKIP LOCKED`, the version checked again, the grant recorded.
    GateGrant { gateway: u8, call: u8, lost: bool },
    /// `fencing.gate`'s raise: `SELECT .. FOR UPDATE` (waits while another raise holds the row),
    /// the locked version checked, then `fencing.await_grants` (asleep) or the raise at once.
    GateLock { gateway: u8, call: u8, lost: bool },
    /// An asleep raise wakes, raises the maximum (with the next settle) and commits.
    GateWakes { gateway: u8, call: u8, lost: bool },
    /// The batch that holds the decision in `call` commits (its other items are done): what the
    /// decision wrote becomes visible, its locks are released, and it is answered.
    GateCommit { gateway: u8, call: u8, lost: bool },
    /// The batch that holds the decision in `call` rolls back (another item failed: 40001, a
    /// deadlock, a timeout): nothing it wrote is ever visible, and the decision fails.
    GateAbort { gateway: u8, call: u8 },
    /// `gateway` gives up on its decision `call` (its timeout: the write is refused locally); the
    /// store may still run it, and its answer goes nowhere.
    GatewayGaveUp { gateway: u8, call: u8 },
    /// An elector gives up on its call (its timeout; a renewal that times out ends its leadership
    /// locally); the store may still run it, after the elector's next calls.
    ElectorGaveUp(u8),
    /// The store runs, or wakes, the call elector `elector` gave up on; its answer goes nowhere.
    StoreOrphan { elector: u8 },
    /// Without S5's timing assumption only: `gateway` checks `write`'s settle and deadline.
    GatewayCheck { gateway: u8, write: u8 },
    /// `gateway` sends `write` to the upstream. Under S5's timing assumption this step also
    /// checks its settle and deadline (no pause between the check and the send); without it, it
    /// sends a write checked before, whatever the time.
    GatewaySend { gateway: u8, write: u8 },
    /// The SQL writer begins a transaction that presents `term` for `resource` (whose fence row
    /// exists): `fencing.try_admit`'s plain read, refused there or on to the row lock.
    SqlAdmit { resource: u8, term: u8 },
    /// `fencing.try_admit` takes the row lock (waits while another holds it `FOR UPDATE`), checks
    /// the version and the lease again, and admits holding it, or raises (asleep in
    /// `fencing.await_grants` first, when there are grants).
    SqlLock,
    /// An asleep SQL raise wakes, reads the lease again and raises (not yet committed).
    SqlWakes,
    /// The SQL writer's transaction writes its row and commits: its raise becomes visible.
    SqlCommit,
    /// An operator runs an admin action: it locks its row (waiting while another holds it), and
    /// is refused, done at once, or asleep in `fencing.await_grants` holding the row.
    AdminRuns(Admin),
    /// An asleep admin action wakes, changes the row and commits.
    AdminWakes,
}

/// The kinds of [`Action`], for [`crate::mirrors`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ActionKind {
    Tick,
    StepClock,
    Crash,
    Flush,
    ElectorAcquire,
    ElectorRenew,
    ElectorRelease,
    ElectorLost,
    StoreAcquire,
    StoreAcquireWakes,
    StoreRenew,
    StoreRelease,
    GatewayDecide,
    GatewayStampWrite,
    GateStamp,
    GatewayLost,
    GateRead,
    GateGrant,
    GateLock,
    GateWakes,
    GateCommit,
    GateAbort,
    GatewayCheck,
    GatewaySend,
    SqlAdmit,
    SqlLock,
    SqlWakes,
    SqlCommit,
    AdminRuns,
    AdminWakes,
    GatewayGaveUp,
    ElectorGaveUp,
    StoreOrphan,
}

impl ActionKind {
    /// Every kind.
    pub const ALL: [ActionKind; 33] = [
        ActionKind::Tick,
        ActionKind::StepClock,
        ActionKind::Crash,
        ActionKind::Flush,
        ActionKind::ElectorAcquire,
        ActionKind::ElectorRenew,
        ActionKind::ElectorRelease,
        ActionKind::ElectorLost,
        ActionKind::StoreAcquire,
        ActionKind::StoreAcquireWakes,
        ActionKind::StoreRenew,
        ActionKind::StoreRelease,
        ActionKind::GatewayDecide,
        ActionKind::GatewayStampWrite,
        ActionKind::GateStamp,
        ActionKind::GatewayLost,
        ActionKind::GateRead,
        ActionKind::GateGrant,
        ActionKind::GateLock,
        ActionKind::GateWakes,
        ActionKind::GateCommit,
        ActionKind::GateAbort,
        ActionKind::GatewayCheck,
        ActionKind::GatewaySend,
        ActionKind::SqlAdmit,
        ActionKind::SqlLock,
        ActionKind::SqlWakes,
        ActionKind::SqlCommit,
        ActionKind::AdminRuns,
        ActionKind::AdminWakes,
        ActionKind::GatewayGaveUp,
        ActionKind::ElectorGaveUp,
        ActionKind::StoreOrphan,
    ];
}

impl Action {
    /// Its kind.
    pub fn kind(self) -> ActionKind {
        match self {
            Action::Tick | Action::TickDrift { .. } => ActionKind::Tick,
            Action::StepClock { .. } => ActionKind::StepClock,
            Action::Crash => ActionKind::Crash,
            Action::Flush => ActionKind::Flush,
            Action::ElectorAcquire(_) => ActionKind::ElectorAcquire,
            Action::ElectorRenew(_) => ActionKind::ElectorRenew,
            Action::ElectorRelease(_) => ActionKind::ElectorRelease,
            Action::ElectorLost(_) => ActionKind::ElectorLost,
            Action::StoreAcquire { .. } => ActionKind::StoreAcquire,
            Action::StoreAcquireWakes { .. } => ActionKind::StoreAcquireWakes,
            Action::StoreRenew { .. } => ActionKind::StoreRenew,
            Action::StoreRelease { .. } => ActionKind::StoreRelease,
            Action::GatewayDecide { .. } => ActionKind::GatewayDecide,
            Action::GatewayStampWrite { .. } => ActionKind::GatewayStampWrite,
            Action::GateStamp { .. } => ActionKind::GateStamp,
            Action::GatewayLost { .. } => ActionKind::GatewayLost,
            Action::GateRead { .. } => ActionKind::GateRead,
            Action::GateGrant { .. } => ActionKind::GateGrant,
            Action::GateLock { .. } => ActionKind::GateLock,
            Action::GateWakes { .. } => ActionKind::GateWakes,
            Action::GateCommit { .. } => ActionKind::GateCommit,
            Action::GateAbort { .. } => ActionKind::GateAbort,
            Action::GatewayCheck { .. } => ActionKind::GatewayCheck,
            Action::GatewaySend { .. } => ActionKind::GatewaySend,
            Action::SqlAdmit { .. } => ActionKind::SqlAdmit,
            Action::SqlLock => ActionKind::SqlLock,
            Action::SqlWakes => ActionKind::SqlWakes,
            Action::SqlCommit => ActionKind::SqlCommit,
            Action::AdminRuns(_) => ActionKind::AdminRuns,
            Action::AdminWakes => ActionKind::AdminWakes,
            Action::GatewayGaveUp { .. } => ActionKind::GatewayGaveUp,
            Action::ElectorGaveUp(_) => ActionKind::ElectorGaveUp,
            Action::StoreOrphan { .. } => ActionKind::StoreOrphan,
        }
    }
}

/// `u8` index of a small collection (every index in the model is below 8).
fn idx(i: usize) -> u8 {
    u8::try_from(i).unwrap_or(u8::MAX)
}

/// `u8` as a tick count.
fn ticks(n: u8) -> i8 {
    i8::try_from(n).unwrap_or(i8::MAX)
}

/// A tick count as `u8` (negative: zero).
fn length(n: i8) -> u8 {
    u8::try_from(n.max(0)).unwrap_or(u8::MAX)
}

impl Protocol {
    /// The model of `config`.
    pub fn new(config: Config) -> Protocol {
        Protocol { config }
    }

    fn has(&self, plant: Plant) -> bool {
        self.config.has(plant)
    }

    fn lease_scoped(&self) -> bool {
        self.has(Plant::LeaseScopedGrants) || self.after_decision()
    }

    /// The repaired lease-grant design (with or without the admin actions' wait).
    fn after_decision(&self) -> bool {
        self.has(Plant::LeaseGrantsAfterDecision)
            || self.has(Plant::LeaseGrantsAdminNoWait)
            || self.has(Plant::LeaseGrantsAdminNoEpoch)
    }

    /// The namespace-grant design (with or without its plants).
    fn ns_scoped(&self) -> bool {
        self.has(Plant::NamespaceGrants)
            || self.has(Plant::NamespaceGrantNoEpoch)
            || self.has(Plant::NamespaceGrantWithoutDecision)
    }

    /// The namespace-grant design: whether a raise holds the namespace's lock (one of its
    /// fences' rows locked by a change of term).
    fn ns_locked(&self, s: &State) -> bool {
        self.ns_scoped() && (0..self.config.resources()).any(|r| !self.config.bound(r) && Self::fence_locked(s, r))
    }

    /// The grant a gateway asks for (`grant_for`), zero with grants off.
    fn grant_for(&self) -> u8 {
        if self.config.grants { self.config.timing.grant } else { 0 }
    }

    /// The terms a write may present.
    fn presentable_terms(&self, s: &State) -> u8 {
        if self.config.forged_terms {
            self.config.terms
        } else {
            let seen = s.ghost.granted.max(s.ghost.admitted.iter().copied().max().unwrap_or(0));
            (seen + 1).min(self.config.terms)
        }
    }

    // --- The ghosts -------------------------------------------------------------------------

    fn violate(s: &mut State, invariant: Invariant) {
        s.ghost.violated |= invariant.bit();
    }

    fn witness(s: &mut State, witness: Witness) {
        s.ghost.seen |= witness.bit();
    }

    /// A write of `term` for `resource` is admitted now (S3, S4).
    fn admitted(&self, s: &mut State, resource: usize, term: u8) {
        Self::ordered(s, resource, term);
        self.current(s, resource, term);
    }

    /// S3: an admission of `term` for `resource` takes effect now (for an SQL writer: at its
    /// commit, which is when its row and its raise become visible).
    fn ordered(s: &mut State, resource: usize, term: u8) {
        if term < s.ghost.admitted[resource] {
            Self::violate(s, Invariant::S3);
        }
        s.ghost.admitted[resource] = s.ghost.admitted[resource].max(term);
    }

    /// S4: `term` is decided for `resource` now (for an SQL writer: when it locked the row; it
    /// holds the row, so the lease's next term cannot write before it commits).
    fn current(&self, s: &mut State, resource: usize, term: u8) {
        // The binding an operator was answered is the one the row has (a lost binding breaks S4).
        if s.ghost.bindings[resource].is_some_and(|answered| answered != self.binding(s, resource)) {
            Self::violate(s, Invariant::S4);
        }
        let current = match self.binding(s, resource) {
            Binding::Unbound => true,
            Binding::Lease => term == s.tables.lease.term,
            // Nobody ever holds the other lease: it has no current term.
            Binding::Other => false,
        };
        if !current {
            Self::violate(s, Invariant::S4);
        }
    }

    /// `resource`'s binding: its fence row's `lease_key`, or, before the row exists, the one its
    /// route would create it with.
    fn binding(&self, s: &State, resource: usize) -> Binding {
        match s.tables.fences[resource] {
            Some(fence) => fence.binding,
            None if self.config.bound(resource) => Binding::Lease,
            None => Binding::Unbound,
        }
    }

    /// Whether `resource`'s fence row is bound to a lease (`lease_key` not `NULL`).
    fn bound(&self, s: &State, resource: usize) -> bool {
        self.binding(s, resource) != Binding::Unbound
    }

    // --- The store ---------------------------------------------------------------------------

    /// Whether some raise holds `resource`'s fence row (and its advisory lock): a gateway's, or
    /// the SQL writer's until it commits.
    fn fence_locked(s: &State, resource: usize) -> bool {
        s.gateways.iter().flat_map(|g| g.calls.iter().flatten().chain(g.orphan.iter())).any(|call| {
            usize::from(call.resource) == resource
                && matches!(call.stage, Stage::Raising { .. } | Stage::Holding { held: Held::Raise(_), .. })
        }) || s.sql.is_some_and(|tx| {
            usize::from(tx.resource) == resource
                && matches!(tx.stage, SqlStage::Raising { .. } | SqlStage::Holding { raised: true })
        }) || s.admin.is_some_and(|tx| tx.action.resource().is_some_and(|r| usize::from(r) == resource))
    }

    /// What the uncommitted decisions of batches hold, with their resources.
    fn held(s: &State) -> impl Iterator<Item = (usize, Held)> + '_ {
        s.gateways.iter().flat_map(|g| g.calls.iter().flatten().chain(g.orphan.iter())).filter_map(|call| {
            match call.stage {
                Stage::Holding { held, .. } => Some((usize::from(call.resource), held)),
                _ => None,
            }
        })
    }

    /// Whether a batch holds a grant on `resource` (its advisory locks shared; with a record, its
    /// row `FOR NO KEY UPDATE` too, when `recorded`).
    fn grant_held(s: &State, resource: usize, recorded: bool) -> bool {
        Self::held(s)
            .any(|(r, held)| r == resource && matches!(held, Held::Grant { record } if record.is_some() || !recorded))
    }

    /// Whether `fencing.lease_grant_ms` (in an acquire or a release) waits for a batch: one
    /// holds a grant on a resource bound to the lease (the lease's advisory lock shared), and the
    /// lease's grants at its term were not waited out yet.
    fn lease_grants_held(&self, s: &State) -> bool {
        let lease = s.tables.lease;
        !self.has(Plant::BatchGrantSkipsLeaseLock)
            && lease.term > 0
            && lease.grants_ended_term < lease.term
            && Self::held(s).any(|(r, held)| self.binding(s, r) == Binding::Lease && matches!(held, Held::Grant { .. }))
    }

    /// Whether an uncommitted first write of `resource` is in a batch (an insert of the same key
    /// waits for it).
    fn insert_held(s: &State, resource: usize) -> bool {
        Self::held(s).any(|(r, held)| r == resource && matches!(held, Held::Insert(_)))
    }

    /// Whether the SQL writer holds `resource`'s row at all (`FOR KEY SHARE` or `FOR UPDATE`):
    /// a raise's `FOR UPDATE` waits for it.
    fn sql_holds(s: &State, resource: usize) -> bool {
        s.sql.is_some_and(|tx| usize::from(tx.resource) == resource && !matches!(tx.stage, SqlStage::Read { .. }))
    }

    /// Whether an acquire holds the lease row (`FOR UPDATE`) and the lease's advisory lock.
    fn lease_locked(s: &State) -> bool {
        s.electors.iter().any(|e| {
            [e.call, e.orphan].into_iter().flatten().any(|call| matches!(call.stage, LeaseStage::Sleeping { .. }))
        })
    }

    /// `fencing.lease_grant_ms`: the longest grant on the lease's bound resources at its term,
    /// unless a new term waited for them already.
    fn lease_grant(&self, s: &State) -> u8 {
        let lease = &s.tables.lease;
        if lease.term == 0 || lease.grants_ended_term >= lease.term {
            return 0;
        }
        let fences =
            s.tables.fences.iter().flatten().filter(|f| f.binding == Binding::Lease && f.max_term == lease.term);
        if self.has(Plant::WallClockWaits) {
            // Planted: what is left until the recorded ends, by the wall clock.
            let wall = s.wall();
            return fences.filter_map(|f| f.grant_ends).map(|end| length(end - wall)).max().unwrap_or(0);
        }
        let per_resource = fences.map(|f| f.grant).max().unwrap_or(0);
        per_resource.max(lease.grant)
    }

    /// `fencing.acquire` starts the new period for elector `e` (and commits).
    fn start_period(&self, s: &mut State, e: usize, slept: u8) -> Option<(u8, i8)> {
        let wall = s.wall();
        let old = s.tables.lease;
        if old.term > 0 && old.expires > wall && old.owner.is_some_and(|owner| usize::from(owner) != e) {
            Self::violate(s, Invariant::S1);
        }
        let term = if old.term == 0 {
            1
        } else if self.has(Plant::NoNewTerm) {
            old.term
        } else {
            old.term + 1
        };
        if term <= s.ghost.granted {
            Self::violate(s, Invariant::S2);
        }
        s.ghost.granted = s.ghost.granted.max(term);
        if self.config.stamp {
            // Kept only where stamp writes read it: it would tell apart states that are the same.
            s.ghost.owned[e] |= 1 << term;
        }
        if slept > 0 {
            Self::witness(s, Witness::AcquireSleptOutGrants);
        }
        s.tables.lease = Lease {
            owner: Some(idx(e)),
            term,
            expires: wall + self.config.timing.ttl,
            grants_ended_term: if slept > 0 { old.term } else { old.grants_ended_term },
            grant: 0,
            epoch: old.epoch,
        };
        self.committed(s, Commit::Lease);
        Some((term, self.config.timing.ttl))
    }

    /// A transaction of `path` committed: durable at once (a synchronous commit flushes every
    /// commit before it too), unless its path is planted to commit asynchronously.
    fn committed(&self, s: &mut State, path: Commit) {
        if s.durable.is_none() || self.commits_asynchronously(path) {
            return;
        }
        s.durable = Some(s.tables);
    }

    /// Whether `path` commits asynchronously (`async-commit`: every path; the per-path plants).
    fn commits_asynchronously(&self, path: Commit) -> bool {
        let plant = match path {
            Commit::Gate => Plant::GateAsyncCommit,
            Commit::Admit => Plant::AdmitAsyncCommit,
            Commit::Advance => Plant::AdvanceAsyncCommit,
            Commit::Bind => Plant::BindAsyncCommit,
            Commit::Rebind => Plant::RebindAsyncCommit,
            Commit::Lease => Plant::AsyncCommit,
        };
        self.has(Plant::AsyncCommit) || self.has(plant)
    }

    /// The answer to an admitted decision, as the planted wrappers of `fencing.gate` change it.
    /// The epoch a decision on `resource` reads with the fence's version: the lease's for a
    /// bound route's resource, the namespace's for an unbound one's.
    fn epoch_of(&self, s: &State, resource: usize) -> u8 {
        if self.config.bound(resource) { s.tables.lease.epoch } else { s.tables.namespace.epoch }
    }

    fn admit_answer(&self, s: &mut State, resource: usize, wait: u8, grant: u8) -> Answer {
        let epoch = self.epoch_of(s, resource);
        self.admit_answer_at(s, resource, wait, grant, epoch)
    }

    /// An admission on a version read earlier, with the epoch read with it.
    fn admit_answer_at(&self, s: &mut State, resource: usize, wait: u8, grant: u8, epoch: u8) -> Answer {
        let wait = if self.has(Plant::NoSettle) { 0 } else { wait };
        if self.has(Plant::WallClockWaits) && grant > 0 {
            let end = s.wall() + ticks(grant);
            if let Some(fence) = s.tables.fences[resource].as_mut() {
                fence.grant_ends = Some(fence.grant_ends.map_or(end, |held| held.max(end)));
            }
        }
        Answer::Admitted { wait, grant, epoch }
    }

    /// A refusal as `stale`: admitted with no wait under the planted `weak-fence`.
    fn stale(&self, s: &mut State, resource: usize, term: u8, max: u8) -> Answer {
        if self.has(Plant::WeakFence) {
            self.admitted(s, resource, term);
            return self.admit_answer(s, resource, 0, 0);
        }
        Answer::Refused { max }
    }

    /// `fencing.gate`'s refusals for a bound resource, on the lease as read now.
    fn lease_refusal(&self, s: &mut State, resource: usize, term: u8, max: u8) -> Option<Answer> {
        match self.binding(s, resource) {
            Binding::Unbound => return None,
            // The other lease was never acquired: `future_term`.
            Binding::Other => return Some(Answer::Refused { max }),
            Binding::Lease => {}
        }
        let lease = s.tables.lease;
        // Planted `future-term`: a term above the lease's taken for its current one.
        if lease.term == 0 || (term > lease.term && !self.has(Plant::FutureTerm)) {
            return Some(Answer::Refused { max });
        }
        if term < lease.term {
            return Some(self.stale(s, resource, term, max));
        }
        if lease.expires <= s.wall() {
            return Some(Answer::Refused { max });
        }
        None
    }

    /// `fencing.gate`'s first statement for a write of `term` on `resource`.
    fn gate_read(&self, s: &mut State, resource: usize, term: u8, attempt: u8, stamped: bool) -> Stage {
        let Some(fence) = s.tables.fences[resource] else {
            // The first write ever: the lease read, the row inserted (a concurrent insert makes
            // the code decide again on the new row, which the order of steps gives here).
            if let Some(refusal) = self.lease_refusal(s, resource, term, 0) {
                return Stage::Answered(refusal);
            }
            let binding = self.binding(s, resource);
            let fence = Fence { binding, max_term: term, settle: None, drain: None, grant: 0, grant_ends: None };
            if self.config.batched {
                self.current(s, resource, term);
                let answer = self.admit_answer(s, resource, 0, 0);
                return Stage::Holding { answer, held: Held::Insert(fence) };
            }
            s.tables.fences[resource] = Some(fence);
            self.committed(s, Commit::Gate);
            self.admitted(s, resource, term);
            return Stage::Answered(self.admit_answer(s, resource, 0, 0));
        };
        // `wrong_lease`: a bound route's write on a row not bound to its lease (an unbound route
        // writes a bound row under that row's lease).
        if self.config.bound(resource) && fence.binding != Binding::Lease {
            return Stage::Answered(Answer::Refused { max: fence.max_term });
        }
        if term < fence.max_term {
            return Stage::Answered(self.stale(s, resource, term, fence.max_term));
        }
        if let Some(refusal) = self.lease_refusal(s, resource, term, fence.max_term) {
            return Stage::Answered(refusal);
        }
        if term == fence.max_term {
            let settle = fence.settle.unwrap_or(0);
            // An unbound route's stamp-mode writes get no grant (`fencing.gate_lease`).
            if self.grant_for() == 0 || (stamped && !self.config.bound(resource)) {
                // The common case: admitted on the version one read sees.
                self.admitted(s, resource, term);
                return Stage::Answered(self.admit_answer(s, resource, settle, 0));
            }
            return Stage::ReadGrant { attempt, settle, epoch: self.epoch_of(s, resource) };
        }
        Stage::ReadRaise { attempt }
    }

    /// `CONTINUE` in `fencing.gate`: decide again on the newest version, three times at most.
    fn decide_again(attempt: u8) -> Stage {
        if attempt >= 2 { Stage::Answered(Answer::Failed) } else { Stage::Asked { attempt: attempt + 1 } }
    }

    /// `fencing.gate`'s grant statements, after a first read at `term` that found `settle`.
    fn gate_grant(&self, s: &mut State, resource: usize, term: u8, attempt: u8, settle: u8, epoch: u8) -> Stage {
        let bound = self.bound(s, resource);
        let (wall, lease) = (s.wall(), s.tables.lease);
        let asked = self.grant_for();
        let given = if bound { asked.min(length(lease.expires - wall)) } else { asked };
        // Planted `grant-overstay`: the store records less than it gives.
        let recorded = if self.has(Plant::GrantOverstay) { given / 2 } else { given };
        // A longer grant than the row says is recorded: the row `FOR NO KEY UPDATE SKIP LOCKED`,
        // which a batch's uncommitted record holds; a grant that records nothing takes only the
        // advisory locks shared, which only a term change holds.
        let needs_record = s.tables.fences[resource].is_some_and(|f| recorded > f.grant);
        // A term change in progress holds the locks: no grant, admitted on the version read,
        // once the lease read again still holds this term (`fencing.lease_refusal`).
        if Self::fence_locked(s, resource)
            || (bound && Self::lease_locked(s))
            || (!bound && self.ns_locked(s))
            || (needs_record && Self::grant_held(s, resource, true))
        {
            // `fencing.gate` reads the row again: only on the version as it is now (a higher
            // term admitted since the first read decides again).
            let now = s.tables.fences[resource];
            // (The code also decides again on a changed binding; the model admits there, which
            // explores more admissions, never fewer.)
            let moved = now.is_none_or(|f| f.max_term != term);
            if moved && !self.has(Plant::BusyGrantOnStaleVersion) {
                return Self::decide_again(attempt);
            }
            let max = s.tables.fences[resource].map_or(0, |f| f.max_term);
            if !self.has(Plant::BusyGrantSkipsLeaseCheck)
                && let Some(refusal) = self.lease_refusal(s, resource, term, max)
            {
                return Stage::Answered(refusal);
            }
            self.admitted(s, resource, term);
            // On the version read, with the epoch read with it.
            return Stage::Answered(self.admit_answer_at(s, resource, settle, 0, epoch));
        }
        let Some(fence) = s.tables.fences[resource] else { return Self::decide_again(attempt) };
        // The namespace-grant design: the namespace's lock taken shared, its epoch is read
        // again (as `fencing.gate` does the lease's): a raise committed since the read decides
        // again.
        if !bound && self.ns_scoped() && s.tables.namespace.epoch != epoch {
            return Self::decide_again(attempt);
        }
        let lease_holds = match fence.binding {
            Binding::Unbound => true,
            Binding::Lease => lease.term == term && lease.expires > wall,
            Binding::Other => false,
        };
        let route_holds = !self.config.bound(resource) || fence.binding == Binding::Lease;
        if fence.max_term != term || !lease_holds || !route_holds {
            return Self::decide_again(attempt);
        }
        if self.config.batched {
            // Recorded at the batch's commit; a longer grant than the row says locks the row.
            let record = (recorded > fence.grant).then_some(recorded);
            self.admitted(s, resource, term);
            let answer = self.admit_answer(s, resource, fence.settle.unwrap_or(0), given);
            return Stage::Holding { answer, held: Held::Grant { record } };
        }
        self.record_grant(s, resource, recorded);
        self.committed(s, Commit::Gate);
        self.admitted(s, resource, term);
        let settle = fence.settle.unwrap_or(0);
        Stage::Answered(self.admit_answer(s, resource, settle, given))
    }

    /// A grant of `recorded` recorded on `resource`'s row (lease-scoped: on the lease's).
    fn record_grant(&self, s: &mut State, resource: usize, recorded: u8) {
        if self.lease_scoped() && self.binding(s, resource) == Binding::Lease {
            s.tables.lease.grant = s.tables.lease.grant.max(recorded);
        } else if self.ns_scoped() && self.binding(s, resource) == Binding::Unbound {
            s.tables.namespace.grant = s.tables.namespace.grant.max(recorded);
        } else if let Some(fence) = s.tables.fences[resource].as_mut() {
            fence.grant = fence.grant.max(recorded);
        }
    }

    /// `fencing.gate`'s raise: the row locked, its version checked, the grants awaited.
    fn gate_lock(&self, s: &mut State, resource: usize, term: u8, attempt: u8) -> Stage {
        let Some(fence) = s.tables.fences[resource] else { return Self::decide_again(attempt) };
        // Planted `gate-race`: the locked version's maximum is not checked.
        if fence.max_term >= term && !self.has(Plant::GateRace) {
            return Self::decide_again(attempt);
        }
        // `fencing.await_grants`.
        let wait = self.grant_wait(s, fence);
        if wait > 0 && !self.has(Plant::GrantIgnored) {
            if self.has(Plant::WallClockWaits) {
                if let Some(end) = fence.grant_ends
                    && end > s.wall()
                {
                    return Stage::Raising { until: end };
                }
            } else {
                return Stage::Raising { until: s.now + ticks(wait) };
            }
        }
        self.raise(s, resource, term)
    }

    /// `fencing.await_grants(fence)`: how long a change of `fence`'s term or binding sleeps
    /// holding the row (zero: none). A bound fence's grants at a term its lease has left behind
    /// were waited out by the lease's new term. The design `lease-grants-after-decision` also
    /// waits out the lease's grant at the fence's term, which covers the resource too.
    fn grant_wait(&self, s: &State, fence: Fence) -> u8 {
        let lease = s.tables.lease;
        if fence.binding == Binding::Lease && lease.grants_ended_term >= fence.max_term {
            return 0;
        }
        let waits_lease_grant = self.has(Plant::LeaseGrantsAfterDecision) || self.has(Plant::LeaseGrantsAdminNoEpoch);
        if waits_lease_grant && fence.binding == Binding::Lease && fence.max_term == lease.term {
            return fence.grant.max(lease.grant);
        }
        if self.ns_scoped() && fence.binding == Binding::Unbound {
            return fence.grant.max(s.tables.namespace.grant);
        }
        fence.grant
    }

    /// The raise's update and commit.
    fn raise(&self, s: &mut State, resource: usize, term: u8) -> Stage {
        let Some(fence) = s.tables.fences[resource] else { return Stage::Answered(Answer::Failed) };
        // `fencing.lease_refusal`: a bound fence's lease read again after the row lock and the
        // grant wait, so that a term granted meanwhile refuses this one (S4).
        if self.bound(s, resource)
            && !self.has(Plant::RaiseSkipsLeaseCheck)
            && let Some(refusal) = self.lease_refusal(s, resource, term, fence.max_term)
        {
            if s.tables.lease.term > term {
                Self::witness(s, Witness::RaiseRefusedByNewerLease);
            }
            return Stage::Answered(refusal);
        }
        let settle = self.config.timing.forward + fence.settle.or(fence.drain).unwrap_or(0);
        let raised = Fence { max_term: term, settle: Some(settle), drain: None, grant: 0, ..fence };
        if self.config.batched {
            self.current(s, resource, term);
            let answer = self.admit_answer(s, resource, settle, 0);
            return Stage::Holding { answer, held: Held::Raise(raised) };
        }
        s.tables.fences[resource] = Some(raised);
        if self.ns_scoped() && fence.binding == Binding::Unbound && !self.has(Plant::NamespaceGrantNoEpoch) {
            s.tables.namespace.epoch = s.tables.namespace.epoch.wrapping_add(1);
        }
        self.committed(s, Commit::Gate);
        self.admitted(s, resource, term);
        Stage::Answered(self.admit_answer(s, resource, settle, 0))
    }

    /// A batch commits what its decision of `term` on `resource` held.
    fn commit_held(&self, s: &mut State, resource: usize, term: u8, held: Held) {
        match held {
            Held::Raise(fence) | Held::Insert(fence) => {
                s.tables.fences[resource] = Some(fence);
                Self::ordered(s, resource, term);
                if matches!(held, Held::Raise(_)) {
                    Self::witness(s, Witness::BatchedRaiseCommitted);
                }
            }
            Held::Grant { record } => self.record_grant(s, resource, record.unwrap_or(0)),
        }
        self.committed(s, Commit::Gate);
    }

    // --- The gateways --------------------------------------------------------------------------

    /// The grant of gateway `g` that would cover a write on `resource` presenting `term` (verify
    /// mode, `owner` `None`) or `owner`'s identity (stamp mode), if any lasts (`Grant::covers`).
    fn covering_grant(&self, s: &State, g: usize, resource: usize, owner: Option<u8>, term: u8) -> Option<Grant> {
        if !self.config.grants {
            return None;
        }
        let gateway = &s.gateways[g];
        let grant = if self.lease_scoped() && self.config.bound(resource) {
            let lease = gateway.lease_grant?;
            if self.after_decision() {
                // Only a resource decided at the grant's term and epoch (no operator changed a
                // bound fence of the lease since), as that decision said.
                let epoch_ok = |d: &Grant| d.epoch == lease.epoch || self.has(Plant::LeaseGrantsAdminNoEpoch);
                let decided = gateway.decided[resource].filter(|d| d.term == lease.term && epoch_ok(d))?;
                Grant { start: decided.start, latest: decided.latest, ..lease }
            } else {
                lease
            }
        } else if self.ns_scoped() && !self.config.bound(resource) {
            let namespace = gateway.ns_grant?;
            if self.has(Plant::NamespaceGrantWithoutDecision) {
                namespace
            } else {
                // Only a resource decided at the grant's term and the namespace's epoch (no
                // fence of the namespace raised since), as that decision said.
                let epoch_ok = |d: &Grant| d.epoch == namespace.epoch || self.has(Plant::NamespaceGrantNoEpoch);
                let decided = gateway.decided[resource].filter(|d| d.term == namespace.term && epoch_ok(d))?;
                Grant { start: decided.start, latest: decided.latest, ..namespace }
            }
        } else {
            gateway.grants[resource]?
        };
        let covers = grant.owner == owner && (owner.is_some() || grant.term == term);
        (covers && s.boot(g) < grant.deadline).then_some(grant)
    }

    /// A write arrives at gateway `g` (see [`Action::GatewayDecide`], [`Action::GatewayStampWrite`]).
    fn gateway_write(&self, s: &mut State, g: usize, r: usize, owner: Option<u8>, term: u8) -> bool {
        let resource = idx(r);
        if let Some(grant) = self.covering_grant(s, g, r, owner, term) {
            if !s.gateways[g].write_slot_free() {
                return false;
            }
            // Admitted here, under the grant (`Grants::admit`), at the grant's term.
            let term = grant.term;
            if self.ns_scoped() && !self.config.bound(r) && grant.via != resource {
                Self::witness(s, Witness::NamespaceGrantOtherResource);
                if s.tables.namespace.epoch > 0 {
                    Self::witness(s, Witness::NamespaceGrantAfterRaise);
                }
            }
            self.admitted(s, r, term);
            Self::stamped(s, owner, term);
            Self::witness(s, Witness::GrantAdmission);
            if owner.is_some() {
                Self::witness(s, Witness::StampGrantAdmission);
            }
            if s.stepped && s.gateways.iter().any(|g| g.drifted) {
                Self::witness(s, Witness::GrantAdmissionAfterClockFaults);
            }
            let boot = s.boot(g);
            let write = Write {
                resource,
                term,
                owner,
                start: grant.start,
                deadline: grant.latest.max(boot) + ticks(self.config.timing.forward),
                checked: false,
            };
            return s.gateways[g].add_write(write);
        }
        let asked = s.boot(g);
        let stage = if owner.is_some() { Stage::Stamp } else { Stage::Asked { attempt: 0 } };
        s.gateways[g].add_call(Call { resource, term, owner, asked, stage })
    }

    /// S4 in stamp mode: a write admitted for `owner` carries a term the store granted that owner.
    fn stamped(s: &mut State, owner: Option<u8>, term: u8) {
        if let Some(e) = owner
            && s.ghost.owned[usize::from(e)] & (1 << term) == 0
        {
            Self::violate(s, Invariant::S4);
        }
    }

    /// Gateway `g` handles the answer `answer` to its call `call`.
    fn gateway_answer(&self, s: &mut State, g: usize, call: Call, answer: Answer) {
        if matches!(answer, Answer::Admitted { .. }) {
            Self::stamped(s, call.owner, call.term);
        }
        let boot = s.boot(g);
        let resource = usize::from(call.resource);
        let timing = self.config.timing;
        let bound = self.config.bound(resource);
        let ns_scoped = self.ns_scoped();
        let gateway = &mut s.gateways[g];
        match answer {
            // The epoch the answer carries: read with the version it was decided on.
            Answer::Admitted { wait, grant, epoch } => {
                // `FenceStore::remember`: grants below the maximum seen are dropped.
                if gateway.grants[resource].is_some_and(|held| held.term < call.term) {
                    gateway.grants[resource] = None;
                }
                // `Settles::wait`: the earliest end seen for this settle, stretched.
                let start = if wait == 0 {
                    boot
                } else {
                    let end = boot + ticks(wait) + 2 * timing.drift;
                    let settle = match gateway.settles[resource] {
                        Some(held) if held.term == call.term && held.length == wait => {
                            Settle { end: held.end.min(end), ..held }
                        }
                        _ => Settle { term: call.term, length: wait, end, drained_at: None },
                    };
                    gateway.settles[resource] = Some(settle);
                    settle.end
                };
                let latest = call.asked + ticks(wait);
                let deadline = latest + ticks(timing.forward);
                if boot < deadline {
                    // With no slot free it is a renewal: no writer waits for it.
                    gateway.add_write(Write {
                        resource: call.resource,
                        term: call.term,
                        owner: call.owner,
                        start,
                        deadline,
                        checked: false,
                    });
                }
                // `Grants::admit` counts a later write's latest start from the asking plus the
                // wait as this gateway counts it (stretched), and shortens the deadline by the
                // stretch of what is left of the wait; the model keeps the later bound (more
                // sends explored, never fewer).
                let stretch = if wait > 0 { 2 * timing.drift } else { 0 };
                let decides = (self.after_decision() && bound) || (ns_scoped && !bound);
                if decides && gateway.decided[resource].is_none_or(|d| d.term <= call.term) {
                    gateway.decided[resource] = Some(Grant {
                        term: call.term,
                        owner: call.owner,
                        epoch,
                        deadline: 0,
                        start,
                        via: 0,
                        latest: latest + stretch,
                    });
                }
                // `install`: counted from the asking, shortened by the drift allowance.
                let lasts = ticks(grant) - timing.drift;
                if grant > 0 && lasts > 0 {
                    let fresh = Grant {
                        term: call.term,
                        owner: call.owner,
                        epoch,
                        deadline: call.asked + lasts,
                        start,
                        via: if ns_scoped && !bound { call.resource } else { 0 },
                        latest: latest + stretch,
                    };
                    let slot = if self.lease_scoped() && bound {
                        &mut gateway.lease_grant
                    } else if ns_scoped && !bound {
                        &mut gateway.ns_grant
                    } else {
                        &mut gateway.grants[resource]
                    };
                    // Never replace a lasting grant of a higher term.
                    if !slot.is_some_and(|held| held.term > call.term && boot < held.deadline) {
                        *slot = Some(fresh);
                    }
                }
            }
            Answer::Refused { .. } => {
                // A refusal drops the grant held on the resource (lease-scoped: the lease's grant
                // of the refused term).
                gateway.grants[resource] = None;
                if self.lease_scoped() && bound && gateway.lease_grant.is_some_and(|held| held.term == call.term) {
                    gateway.lease_grant = None;
                }
                if gateway.decided[resource].is_some_and(|d| d.term <= call.term) {
                    gateway.decided[resource] = None;
                }
            }
            Answer::Failed => {}
        }
    }

    fn apply(&self, s: &mut State, action: Action) -> bool {
        match action {
            Action::Tick | Action::TickDrift { .. } => self.tick(s, action),
            Action::StepClock { forward } => {
                if !self.config.clock_step || s.stepped {
                    return false;
                }
                s.stepped = true;
                s.wall_offset += if forward { self.config.timing.step } else { -self.config.timing.step };
                true
            }
            Action::Crash => {
                let Some(durable) = s.durable else { return false };
                if durable == s.tables {
                    return false;
                }
                s.tables = durable;
                for gateway in &mut s.gateways {
                    gateway.calls = [None; MAX_CALLS];
                    gateway.orphan = None;
                }
                for elector in &mut s.electors {
                    elector.call = None;
                    elector.orphan = None;
                }
                s.sql = None;
                s.admin = None;
                true
            }
            Action::Flush => {
                if s.durable.is_none_or(|durable| durable == s.tables) {
                    return false;
                }
                s.durable = Some(s.tables);
                true
            }
            Action::ElectorAcquire(e) | Action::ElectorRenew(e) | Action::ElectorRelease(e) => {
                if s.lease_calls >= self.config.lease_calls {
                    return false;
                }
                s.lease_calls += 1;
                let elector = &mut s.electors[usize::from(e)];
                if elector.call.is_some() {
                    return false;
                }
                let call = match action {
                    Action::ElectorAcquire(_) if elector.leading.is_none() => LeaseCall::Acquire,
                    Action::ElectorRenew(_) if elector.leading.is_some() => LeaseCall::Renew,
                    Action::ElectorRelease(_) if elector.leading.is_some() => {
                        elector.leading = None;
                        LeaseCall::Release
                    }
                    _ => return false,
                };
                elector.call = Some(ElectorCall { call, sent: s.now, stage: LeaseStage::Asked });
                true
            }
            Action::ElectorLost(e) => {
                let elector = &mut s.electors[usize::from(e)];
                if elector.call.is_none_or(|c| c.stage != LeaseStage::Asked) {
                    return false;
                }
                elector.call = None;
                true
            }
            Action::StoreAcquire { elector: e, lost }
            | Action::StoreRenew { elector: e, lost }
            | Action::StoreRelease { elector: e, lost } => {
                let e = usize::from(e);
                let Some(ElectorCall { call, sent, stage: LeaseStage::Asked }) = s.electors[e].call else {
                    return false;
                };
                let expected = match action {
                    Action::StoreAcquire { .. } => LeaseCall::Acquire,
                    Action::StoreRenew { .. } => LeaseCall::Renew,
                    _ => LeaseCall::Release,
                };
                // Every one of them locks the lease row: none runs while an acquire sleeps on it.
                // An acquire or a release (`fencing.lease_grant_ms`) waits for a batch's grant.
                if call != expected || Self::lease_locked(s) || (call != LeaseCall::Renew && self.lease_grants_held(s))
                {
                    return false;
                }
                let stage = self.lease_call(s, e, call);
                self.elector_answer(s, e, ElectorCall { call, sent, stage }, lost)
            }
            Action::StoreAcquireWakes { elector: e, lost } => {
                let e = usize::from(e);
                let Some(ElectorCall { call, sent, stage: LeaseStage::Sleeping { until, slept } }) = s.electors[e].call
                else {
                    return false;
                };
                if s.now < until {
                    return false;
                }
                let answer = self.start_period(s, e, slept);
                self.elector_answer(s, e, ElectorCall { call, sent, stage: LeaseStage::Answered(answer) }, lost)
            }
            Action::GatewayDecide { gateway, resource, term } => {
                let (g, r) = (usize::from(gateway), usize::from(resource));
                if s.writes >= self.config.writes {
                    return false;
                }
                s.writes += 1;
                self.gateway_write(s, g, r, None, term)
            }
            Action::GatewayStampWrite { gateway, resource, owner } => {
                let (g, r) = (usize::from(gateway), usize::from(resource));
                if !self.config.stamp || s.writes >= self.config.writes {
                    return false;
                }
                s.writes += 1;
                self.gateway_write(s, g, r, Some(owner), 0)
            }
            Action::GateAbort { gateway, call: c } => {
                let (g, c) = (usize::from(gateway), usize::from(c));
                let orphan = c == MAX_CALLS;
                let held = if orphan { s.gateways[g].orphan } else { s.gateways[g].calls.get(c).copied().flatten() };
                if !held.is_some_and(|call| matches!(call.stage, Stage::Holding { .. })) {
                    return false;
                }
                if orphan {
                    s.gateways[g].orphan = None;
                } else {
                    // The gateway's decision fails (the write is refused locally).
                    remove_sorted(&mut s.gateways[g].calls, c);
                }
                true
            }
            Action::GatewayLost { gateway, call: c } => {
                let (g, c) = (usize::from(gateway), usize::from(c));
                if s.gateways[g].calls[c]
                    .is_none_or(|call| !matches!(call.stage, Stage::Asked { attempt: 0 } | Stage::Stamp))
                {
                    return false;
                }
                remove_sorted(&mut s.gateways[g].calls, c);
                true
            }
            Action::GateStamp { gateway, call: c, lost }
            | Action::GateRead { gateway, call: c, lost }
            | Action::GateGrant { gateway, call: c, lost }
            | Action::GateLock { gateway, call: c, lost }
            | Action::GateWakes { gateway, call: c, lost }
            | Action::GateCommit { gateway, call: c, lost } => {
                let (g, c) = (usize::from(gateway), usize::from(c));
                // Index MAX_CALLS: the decision the gateway gave up on.
                let orphan = c == MAX_CALLS;
                let held = if orphan { s.gateways[g].orphan } else { s.gateways[g].calls.get(c).copied().flatten() };
                let Some(mut call) = held else { return false };
                let (r, term) = (usize::from(call.resource), call.term);
                let stamped = call.owner.is_some();
                let stage = match (action, call.stage) {
                    (Action::GateStamp { .. }, Stage::Stamp) => {
                        // `fencing.gate_lease`: the lease as it is now.
                        let lease = s.tables.lease;
                        let holds = lease.term > 0
                            && lease.expires > s.wall()
                            && (lease.owner == call.owner || self.has(Plant::StampAnyOwner));
                        if holds {
                            call.term = lease.term;
                            Stage::Asked { attempt: 0 }
                        } else {
                            Stage::Answered(Answer::Refused { max: s.tables.fences[r].map_or(0, |f| f.max_term) })
                        }
                    }
                    (Action::GateRead { .. }, Stage::Asked { attempt }) => {
                        // A first write's insert waits for a batch's uncommitted insert of the key.
                        if s.tables.fences[r].is_none() && Self::insert_held(s, r) {
                            return false;
                        }
                        self.gate_read(s, r, term, attempt, stamped)
                    }
                    (Action::GateGrant { .. }, Stage::ReadGrant { attempt, settle, epoch }) => {
                        self.gate_grant(s, r, term, attempt, settle, epoch)
                    }
                    (Action::GateLock { .. }, Stage::ReadRaise { attempt }) => {
                        if Self::fence_locked(s, r) || Self::sql_holds(s, r) || Self::grant_held(s, r, false) {
                            return false;
                        }
                        // The namespace-grant design: raises of the namespace's fences queue on
                        // its lock.
                        if !self.config.bound(r) && self.ns_locked(s) {
                            return false;
                        }
                        self.gate_lock(s, r, term, attempt)
                    }
                    (Action::GateWakes { .. }, Stage::Raising { until }) => {
                        let clock = if self.has(Plant::WallClockWaits) { s.wall() } else { s.now };
                        if clock < until {
                            return false;
                        }
                        Self::witness(s, Witness::RaiseSleptOutGrants);
                        self.raise(s, r, term)
                    }
                    (Action::GateCommit { .. }, Stage::Holding { answer, held }) => {
                        self.commit_held(s, r, term, held);
                        Stage::Answered(answer)
                    }
                    _ => return false,
                };
                match stage {
                    Stage::Answered(answer) => {
                        if orphan {
                            // Nobody waits for it.
                            if lost {
                                return false;
                            }
                            s.gateways[g].orphan = None;
                            if s.gateways[g].calls.iter().any(Option::is_some) || s.writes >= 2 {
                                Self::witness(s, Witness::CallRunAfterGiveUp);
                            }
                        } else {
                            remove_sorted(&mut s.gateways[g].calls, c);
                            if !lost {
                                self.gateway_answer(s, g, call, answer);
                            }
                        }
                    }
                    // Only an answer can be lost.
                    _ if lost => return false,
                    _ if orphan => s.gateways[g].orphan = Some(Call { stage, ..call }),
                    _ => s.gateways[g].calls[c] = Some(Call { stage, ..call }),
                }
                true
            }
            Action::GatewayCheck { gateway, write: w } => {
                let (g, w) = (usize::from(gateway), usize::from(w));
                let boot = s.boot(g);
                let Some(write) = s.gateways[g].writes[w] else { return false };
                if self.config.pause_assumption || write.checked || boot < write.start || boot >= write.deadline {
                    return false;
                }
                s.gateways[g].writes[w] = Some(Write { checked: true, ..write });
                s.gateways[g].writes.sort();
                true
            }
            Action::GatewaySend { gateway, write: w } => {
                let (g, w) = (usize::from(gateway), usize::from(w));
                let boot = s.boot(g);
                let Some(write) = s.gateways[g].writes[w] else { return false };
                let ready = if self.config.pause_assumption {
                    boot >= write.start && boot < write.deadline
                } else {
                    write.checked
                };
                if !ready {
                    return false;
                }
                let r = usize::from(write.resource);
                if write.term < s.ghost.sent[r] || boot >= write.deadline {
                    Self::violate(s, Invariant::S5);
                }
                s.ghost.sent[r] = s.ghost.sent[r].max(write.term);
                remove_sorted(&mut s.gateways[g].writes, w);
                true
            }
            Action::GatewayGaveUp { gateway, call: c } => {
                let (g, c) = (usize::from(gateway), usize::from(c));
                if !self.config.give_up || s.gateways[g].orphan.is_some() {
                    return false;
                }
                let Some(call) = s.gateways[g].calls.get(c).copied().flatten() else { return false };
                remove_sorted(&mut s.gateways[g].calls, c);
                s.gateways[g].orphan = Some(call);
                true
            }
            Action::ElectorGaveUp(e) => {
                let elector = &mut s.electors[usize::from(e)];
                if !self.config.give_up || elector.orphan.is_some() {
                    return false;
                }
                let Some(call) = elector.call else { return false };
                if call.call == LeaseCall::Renew {
                    // A renewal that failed ends the period locally.
                    elector.leading = None;
                }
                elector.call = None;
                elector.orphan = Some(call);
                true
            }
            Action::StoreOrphan { elector: e } => {
                let e = usize::from(e);
                let Some(orphan) = s.electors[e].orphan else { return false };
                let stage = match orphan.stage {
                    LeaseStage::Asked => {
                        if Self::lease_locked(s) || (orphan.call != LeaseCall::Renew && self.lease_grants_held(s)) {
                            return false;
                        }
                        self.lease_call(s, e, orphan.call)
                    }
                    LeaseStage::Sleeping { until, slept } => {
                        if s.now < until {
                            return false;
                        }
                        LeaseStage::Answered(self.start_period(s, e, slept))
                    }
                    LeaseStage::Answered(_) => return false,
                };
                if s.electors[e].call.is_some() || s.electors[e].leading.is_some() {
                    Self::witness(s, Witness::CallRunAfterGiveUp);
                }
                s.electors[e].orphan = match stage {
                    LeaseStage::Answered(_) => None,
                    sleeping => Some(ElectorCall { stage: sleeping, ..orphan }),
                };
                true
            }
            Action::AdminRuns(action) => self.admin_runs(s, action),
            Action::AdminWakes => {
                let Some(tx) = s.admin else { return false };
                if s.now < tx.until {
                    return false;
                }
                s.admin = None;
                Self::witness(s, Witness::AdminSleptOutGrants);
                self.admin_apply(s, tx.action);
                true
            }
            Action::SqlAdmit { resource, term } => self.sql_admit(s, resource, term),
            Action::SqlLock => self.sql_lock(s),
            Action::SqlWakes => {
                let Some(tx) = s.sql else { return false };
                let SqlStage::Raising { until } = tx.stage else { return false };
                if s.now < until {
                    return false;
                }
                Self::witness(s, Witness::RaiseSleptOutGrants);
                self.sql_raise(s, tx);
                true
            }
            Action::SqlCommit => {
                let Some(tx) = s.sql else { return false };
                let SqlStage::Holding { raised } = tx.stage else { return false };
                let r = usize::from(tx.resource);
                if raised && let Some(fence) = s.tables.fences[r] {
                    // `fencing.next_settle` of the version it locked (planted: none).
                    let settle = (!self.has(Plant::SqlRaiseSkipsSettle))
                        .then(|| self.config.timing.forward + fence.settle.or(fence.drain).unwrap_or(0));
                    s.tables.fences[r] = Some(Fence { max_term: tx.term, settle, drain: None, grant: 0, ..fence });
                }
                s.sql = None;
                self.committed(s, Commit::Admit);
                Self::ordered(s, r, tx.term);
                Self::witness(s, Witness::SqlWriteCommitted);
                true
            }
        }
    }

    /// An admin action's first steps (see [`Action::AdminRuns`]).
    fn admin_runs(&self, s: &mut State, action: Admin) -> bool {
        if s.admin_actions >= self.config.admin_actions || s.admin.is_some() {
            return false;
        }
        let Some(resource) = action.resource() else {
            // `fencing.force_release`: the lease row `FOR UPDATE`, `fencing.lease_grant_ms`.
            if s.tables.lease.term == 0 || Self::lease_locked(s) || self.lease_grants_held(s) {
                return false;
            }
            s.admin_actions += 1;
            let wall = s.wall();
            s.tables.lease.expires = s.tables.lease.expires.min(wall);
            self.committed(s, Commit::Lease);
            return true;
        };
        let r = usize::from(resource);
        // `SELECT .. FOR UPDATE` waits for every holder of the row.
        if Self::fence_locked(s, r) || Self::sql_holds(s, r) || Self::grant_held(s, r, false) || Self::insert_held(s, r)
        {
            return false;
        }
        s.admin_actions += 1;
        let Some(fence) = s.tables.fences[r] else {
            let fresh =
                |binding, max_term| Fence { binding, max_term, settle: None, drain: None, grant: 0, grant_ends: None };
            match action {
                // `advance_fence` inserts an unbound row, `bind` a bound one; `rebind` is refused.
                Admin::Advance { term, .. } => {
                    s.tables.fences[r] = Some(fresh(Binding::Unbound, term));
                    Self::ordered(s, r, term);
                }
                Admin::Bind { .. } => {
                    s.tables.fences[r] = Some(fresh(Binding::Lease, 0));
                    s.ghost.bindings[r] = Some(Binding::Lease);
                }
                _ => return true,
            }
            self.committed(s, Commit::of(action));
            return true;
        };
        let refused = match action {
            Admin::Advance { term, .. } => term <= fence.max_term,
            Admin::Bind { .. } => fence.binding != Binding::Unbound,
            Admin::Rebind { .. } => fence.binding == Binding::Other,
            Admin::ForceRelease => true,
        };
        if refused {
            return true;
        }
        let wait = self.grant_wait(s, fence);
        if wait > 0 {
            s.admin = Some(AdminTx { action, until: s.now + ticks(wait) });
        } else {
            self.admin_apply(s, action);
        }
        true
    }

    /// An admin action changes its fence row (after the grant wait) and commits.
    fn admin_apply(&self, s: &mut State, action: Admin) {
        let Some(r) = action.resource().map(usize::from) else { return };
        let Some(fence) = s.tables.fences[r] else { return };
        if self.after_decision() && (fence.binding == Binding::Lease || matches!(action, Admin::Bind { .. })) {
            // The repaired design: the lease's grants given from now on count no decision made
            // before this change.
            s.tables.lease.epoch = s.tables.lease.epoch.wrapping_add(1);
        }
        let next_settle = Some(self.config.timing.forward + fence.settle.or(fence.drain).unwrap_or(0));
        s.tables.fences[r] = Some(match action {
            Admin::Advance { term, .. } => {
                Self::ordered(s, r, term);
                Fence { max_term: term, settle: next_settle, drain: None, grant: 0, ..fence }
            }
            Admin::Bind { .. } => {
                if s.ghost.admitted[r] > 0 {
                    Self::witness(s, Witness::FenceBoundByHand);
                }
                s.ghost.bindings[r] = Some(Binding::Lease);
                Fence { binding: Binding::Lease, grant: 0, ..fence }
            }
            Admin::Rebind { .. } => {
                s.ghost.bindings[r] = Some(Binding::Other);
                Fence { binding: Binding::Other, settle: next_settle, drain: None, grant: 0, ..fence }
            }
            Admin::ForceRelease => fence,
        });
        self.committed(s, Commit::of(action));
    }

    /// `fencing.try_admit`'s plain read for the SQL writer (see [`Action::SqlAdmit`]).
    fn sql_admit(&self, s: &mut State, resource: u8, term: u8) -> bool {
        let r = usize::from(resource);
        if !self.config.sql_writer || s.sql.is_some() || s.writes >= self.config.writes {
            return false;
        }
        // Only on a resource whose fence row exists (a bound one's from its binding).
        let Some(fence) = s.tables.fences[r] else { return false };
        s.writes += 1;
        if term < fence.max_term || self.lease_refusal(s, r, term, fence.max_term).is_some() {
            return true; // refused: the transaction writes nothing
        }
        s.sql = Some(SqlTx { resource, term, stage: SqlStage::Read { raise: term > fence.max_term } });
        true
    }

    /// `fencing.try_admit`'s row lock for the SQL writer (see [`Action::SqlLock`]).
    fn sql_lock(&self, s: &mut State) -> bool {
        let Some(tx) = s.sql else { return false };
        let SqlStage::Read { raise } = tx.stage else { return false };
        let (r, term) = (usize::from(tx.resource), tx.term);
        // `FOR KEY SHARE` and `FOR UPDATE` both wait for a raise holding the row; `FOR UPDATE`
        // (and the grant wait after it) for a batch's grant too.
        if Self::fence_locked(s, r) || (raise && Self::grant_held(s, r, false)) {
            return false;
        }
        let Some(fence) = s.tables.fences[r] else { return false };
        if fence.max_term > term || (!raise && fence.max_term != term) {
            s.sql = None; // stale on the version locked
            return true;
        }
        if fence.max_term == term {
            // The lease read again after the lock (`fencing.lease_refusal`).
            if self.bound(s, r) && self.lease_refusal(s, r, term, fence.max_term).is_some() {
                s.sql = None;
                return true;
            }
            self.current(s, r, term);
            s.sql = Some(SqlTx { stage: SqlStage::Holding { raised: false }, ..tx });
            return true;
        }
        // A raise: `fencing.await_grants`, then the raise.
        let wait = self.grant_wait(s, fence);
        if wait > 0 {
            s.sql = Some(SqlTx { stage: SqlStage::Raising { until: s.now + ticks(wait) }, ..tx });
            return true;
        }
        self.sql_raise(s, tx);
        true
    }

    /// The SQL writer's raise after the lock and the grant wait: the lease read again, then the
    /// raise, held until the commit.
    fn sql_raise(&self, s: &mut State, tx: SqlTx) {
        let (r, term) = (usize::from(tx.resource), tx.term);
        if self.bound(s, r) {
            let max = s.tables.fences[r].map_or(0, |f| f.max_term);
            if self.lease_refusal(s, r, term, max).is_some() {
                s.sql = None;
                return;
            }
        }
        self.current(s, r, term);
        s.sql = Some(SqlTx { stage: SqlStage::Holding { raised: true }, ..tx });
    }

    /// A tick (see [`Action::Tick`]).
    fn tick(&self, s: &mut State, action: Action) -> bool {
        if s.now >= self.config.horizon {
            return false;
        }
        s.now += 1;
        if let Action::TickDrift { gateway, slow } = action {
            let drift = self.config.timing.drift;
            let used = s.gateways.iter().filter(|g| g.drifted).count();
            let g = usize::from(gateway);
            if s.gateways[g].drifted || used >= usize::from(self.config.drifting_clocks) {
                return false;
            }
            s.gateways[g].drifted = true;
            s.gateways[g].skew += if slow { -drift } else { drift };
        }
        for g in 0..GATEWAYS {
            let boot = s.boot(g);
            let gateway = &mut s.gateways[g];
            for grant in gateway
                .grants
                .iter_mut()
                .chain(std::iter::once(&mut gateway.lease_grant))
                .chain(std::iter::once(&mut gateway.ns_grant))
            {
                if grant.is_some_and(|held| boot >= held.deadline) {
                    *grant = None;
                }
            }
            for write in &mut gateway.writes {
                if write.is_some_and(|w| !w.checked && boot >= w.deadline) {
                    *write = None;
                }
            }
            gateway.writes.sort();
        }
        // The settle marks due at this tick: every gateway's `fencing.mark_settled` before any
        // `fencing.mark_drained`, so the outcome does not depend on the gateways' names (the
        // symmetry reduction needs that).
        for drains in [false, true] {
            for g in 0..GATEWAYS {
                let boot = s.boot(g);
                for r in 0..MAX_RESOURCES {
                    let Some(settle) = s.gateways[g].settles[r] else { continue };
                    // The marks update the row: they wait while a batch holds it (made later).
                    if settle.drained_at.is_some() != drains
                        || Self::held(s).any(|(held_r, held)| {
                            held_r == r && matches!(held, Held::Raise(_) | Held::Grant { record: Some(_) })
                        })
                    {
                        continue;
                    }
                    s.gateways[g].settles[r] = match settle.drained_at {
                        None if boot >= settle.end => self.mark_settled(s, r, settle).map(|drain_for| Settle {
                            drained_at: Some(boot + ticks(drain_for) + 2 * self.config.timing.drift),
                            ..settle
                        }),
                        Some(at) if boot >= at => {
                            self.mark_drained(s, r, settle);
                            None
                        }
                        _ => Some(settle),
                    };
                }
            }
        }
        let now = s.now;
        let watchdog = !self.has(Plant::ElectorDeadlineIgnored);
        for elector in &mut s.electors {
            if watchdog && elector.leading.is_some_and(|(_, deadline)| now >= deadline) {
                elector.leading = None;
            }
        }
        // S7: a holder acts only before its deadline (it checks it whenever it acts).
        if s.electors.iter().any(|e| e.leading.is_some_and(|(_, deadline)| now >= deadline)) {
            Self::violate(s, Invariant::S7);
        }
        true
    }

    /// `deadline`: the elector's local deadline for an answer with `remaining` to a call sent at
    /// `sent` (planted `elector-margin-added`: the margin added, not taken off). S7: never past
    /// the expiry the store reported, now + `remaining` (the answer arrives at once).
    fn deadline(&self, s: &mut State, sent: i8, remaining: i8) -> i8 {
        let margin = self.config.timing.elector_margin;
        let deadline =
            if self.has(Plant::ElectorMarginAdded) { sent + remaining + margin } else { sent + remaining - margin };
        if deadline > s.now + remaining {
            Self::violate(s, Invariant::S7);
        }
        deadline
    }

    /// Elector `e`'s call after a store step: still asleep in the store, or answered (and the
    /// answer handled, unless `lost`).
    fn elector_answer(&self, s: &mut State, e: usize, call: ElectorCall, lost: bool) -> bool {
        let LeaseStage::Answered(answer) = call.stage else {
            if lost {
                return false;
            }
            s.electors[e].call = Some(call);
            return true;
        };
        s.electors[e].call = None;
        if lost {
            return true;
        }
        let now = s.now;
        match (call.call, answer) {
            (LeaseCall::Acquire, Some((term, remaining))) => {
                let deadline = self.deadline(s, call.sent, remaining);
                if now < deadline && s.electors[e].leading.is_none() {
                    if s.ghost.led & (1 << term) != 0 {
                        Self::violate(s, Invariant::S2);
                    }
                    s.ghost.led |= 1 << term;
                    s.electors[e].leading = Some((term, deadline));
                }
            }
            (LeaseCall::Renew, Some((_, remaining))) => {
                if let Some((term, deadline)) = s.electors[e].leading
                    && now < deadline
                {
                    let extended = self.deadline(s, call.sent, remaining);
                    s.electors[e].leading = Some((term, extended));
                }
            }
            (LeaseCall::Renew, None) => s.electors[e].leading = None,
            _ => {}
        }
        true
    }

    /// `fencing.mark_drained`.
    fn mark_drained(&self, s: &mut State, resource: usize, settle: Settle) {
        let _ = self;
        if let Some(fence) = s.tables.fences[resource].as_mut()
            && fence.max_term == settle.term
            && fence.settle.is_none()
            && fence.drain == Some(settle.length)
        {
            fence.drain = None;
        }
    }

    /// `fencing.mark_settled`: the drain length, counted from now, when the settle is over.
    fn mark_settled(&self, s: &mut State, resource: usize, settle: Settle) -> Option<u8> {
        let forward = self.config.timing.forward;
        let fence = s.tables.fences[resource].as_mut()?;
        if fence.max_term != settle.term {
            return None;
        }
        if fence.settle == Some(settle.length) {
            fence.settle = None;
            fence.drain = Some(settle.length);
            return Some(settle.length + forward);
        }
        (fence.settle.is_none() && fence.drain == Some(settle.length)).then_some(settle.length + forward)
    }

    /// `fencing.acquire`, `fencing.renew` or `fencing.release` for elector `e`, on the row as it
    /// is now (each takes the row's lock, so it decides on the newest version).
    fn lease_call(&self, s: &mut State, e: usize, call: LeaseCall) -> LeaseStage {
        let wall = s.wall();
        let lease = s.tables.lease;
        let held = lease.term > 0 && lease.expires > wall;
        let mine = lease.owner.is_some_and(|owner| usize::from(owner) == e);
        match call {
            LeaseCall::Acquire => {
                if held && !mine {
                    return LeaseStage::Answered(None);
                }
                if held && self.has(Plant::AcquireKeepsPeriod) {
                    // Planted: the holder's own acquire keeps its period and term.
                    s.tables.lease.expires = wall + self.config.timing.ttl;
                    self.committed(s, Commit::Lease);
                    return LeaseStage::Answered(Some((lease.term, self.config.timing.ttl)));
                }
                let grant = self.lease_grant(s);
                if grant > 0 {
                    return LeaseStage::Sleeping { until: s.now + ticks(grant), slept: grant };
                }
                LeaseStage::Answered(self.start_period(s, e, 0))
            }
            LeaseCall::Renew => {
                // Planted `renew-any-owner` and `renew-expired`: a check left out.
                let owner_ok = mine || self.has(Plant::RenewAnyOwner);
                let unexpired_ok = held || (lease.term > 0 && self.has(Plant::RenewExpired));
                if !owner_ok || !unexpired_ok {
                    return LeaseStage::Answered(None);
                }
                // S1: an ok renewal tells the caller it holds the lease unexpired, so it must be
                // the row's holder; S2: a period that ended may not come back with its term.
                if !mine {
                    Self::violate(s, Invariant::S1);
                }
                if !held {
                    Self::violate(s, Invariant::S2);
                }
                s.tables.lease.expires = wall + self.config.timing.ttl;
                self.committed(s, Commit::Lease);
                LeaseStage::Answered(Some((lease.term, self.config.timing.ttl)))
            }
            LeaseCall::Release => {
                if held && mine {
                    s.tables.lease.expires = wall;
                    self.committed(s, Commit::Lease);
                }
                LeaseStage::Answered(None)
            }
        }
    }
}

impl Model for Protocol {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let mut tables =
            Tables { lease: Lease::default(), fences: [None; MAX_RESOURCES], namespace: Namespace::default() };
        let mut ghost = Ghost::default();
        if self.config.seeded {
            for r in (0..self.config.resources()).filter(|r| !self.config.bound(*r)) {
                tables.fences[r] = Some(Fence {
                    binding: Binding::Unbound,
                    max_term: 1,
                    settle: None,
                    drain: None,
                    grant: 0,
                    grant_ends: None,
                });
                ghost.admitted[r] = 1;
                ghost.sent[r] = 1;
            }
        }
        vec![State {
            now: 0,
            wall_offset: 0,
            stepped: false,
            writes: 0,
            lease_calls: 0,
            tables,
            durable: self.config.plant.is_some_and(Plant::loses_commits).then_some(tables),
            gateways: [Gateway::idle(); GATEWAYS],
            electors: [Elector::default(); ELECTORS],
            sql: None,
            admin: None,
            admin_actions: 0,
            ghost,
            bound: self.config.bound_resources,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        let candidates = self.candidates(s);
        for action in candidates {
            let mut next = s.clone();
            if self.apply(&mut next, action) {
                actions.push(action);
            }
        }
    }

    fn next_state(&self, s: &State, action: Action) -> Option<State> {
        let mut next = s.clone();
        self.apply(&mut next, action).then_some(next)
    }

    fn format_action(&self, action: &Action) -> String {
        format!("{action:?}")
    }

    fn format_step(&self, last: &State, action: Action) -> Option<String> {
        let next = self.next_state(last, action)?;
        Some(crate::history::describe(&self.config, last, action, &next))
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(Invariant::S1.name(), |_, s: &State| !Invariant::S1.violated(&s.ghost)),
            Property::always(Invariant::S2.name(), |_, s: &State| !Invariant::S2.violated(&s.ghost)),
            Property::always(Invariant::S3.name(), |_, s: &State| !Invariant::S3.violated(&s.ghost)),
            Property::always(Invariant::S4.name(), |_, s: &State| !Invariant::S4.violated(&s.ghost)),
            Property::always(Invariant::S5.name(), |_, s: &State| !Invariant::S5.violated(&s.ghost)),
            Property::always(Invariant::S7.name(), |_, s: &State| !Invariant::S7.violated(&s.ghost)),
            Property::sometimes(Witness::GrantAdmission.name(), |_, s: &State| Witness::GrantAdmission.seen(&s.ghost)),
            Property::sometimes(Witness::GrantAdmissionAfterClockFaults.name(), |_, s: &State| {
                Witness::GrantAdmissionAfterClockFaults.seen(&s.ghost)
            }),
            Property::sometimes(Witness::RaiseSleptOutGrants.name(), |_, s: &State| {
                Witness::RaiseSleptOutGrants.seen(&s.ghost)
            }),
            Property::sometimes(Witness::AcquireSleptOutGrants.name(), |_, s: &State| {
                Witness::AcquireSleptOutGrants.seen(&s.ghost)
            }),
            Property::sometimes(Witness::RaiseRefusedByNewerLease.name(), |_, s: &State| {
                Witness::RaiseRefusedByNewerLease.seen(&s.ghost)
            }),
            Property::sometimes(Witness::SqlWriteCommitted.name(), |_, s: &State| {
                Witness::SqlWriteCommitted.seen(&s.ghost)
            }),
            Property::sometimes(Witness::CallRunAfterGiveUp.name(), |_, s: &State| {
                Witness::CallRunAfterGiveUp.seen(&s.ghost)
            }),
            Property::sometimes(Witness::BatchedRaiseCommitted.name(), |_, s: &State| {
                Witness::BatchedRaiseCommitted.seen(&s.ghost)
            }),
            Property::sometimes(Witness::AdminSleptOutGrants.name(), |_, s: &State| {
                Witness::AdminSleptOutGrants.seen(&s.ghost)
            }),
            Property::sometimes(Witness::StampGrantAdmission.name(), |_, s: &State| {
                Witness::StampGrantAdmission.seen(&s.ghost)
            }),
            Property::sometimes(Witness::FenceBoundByHand.name(), |_, s: &State| {
                Witness::FenceBoundByHand.seen(&s.ghost)
            }),
            Property::sometimes(Witness::NamespaceGrantOtherResource.name(), |_, s: &State| {
                Witness::NamespaceGrantOtherResource.seen(&s.ghost)
            }),
            Property::sometimes(Witness::NamespaceGrantAfterRaise.name(), |_, s: &State| {
                Witness::NamespaceGrantAfterRaise.seen(&s.ghost)
            }),
        ]
    }

    fn within_boundary(&self, s: &State) -> bool {
        s.now <= self.config.horizon && s.tables.lease.term <= self.config.terms
    }
}

impl Protocol {
    /// Every action that might be enabled in `s` (the ones that are not do nothing and are left
    /// out by [`Model::actions`]).
    fn candidates(&self, s: &State) -> Vec<Action> {
        let mut out = vec![Action::Tick];
        for g in 0..GATEWAYS {
            out.push(Action::TickDrift { gateway: idx(g), slow: true });
            out.push(Action::TickDrift { gateway: idx(g), slow: false });
        }
        out.extend([Action::StepClock { forward: true }, Action::StepClock { forward: false }]);
        out.extend([Action::Crash, Action::Flush]);
        for e in 0..ELECTORS {
            let e = idx(e);
            out.extend([Action::ElectorAcquire(e), Action::ElectorRenew(e), Action::ElectorRelease(e)]);
            if self.config.give_up {
                out.extend([Action::ElectorGaveUp(e), Action::StoreOrphan { elector: e }]);
            }
            if s.electors[usize::from(e)].call.is_some() {
                out.push(Action::ElectorLost(e));
                for lost in [false, true] {
                    out.extend([
                        Action::StoreAcquire { elector: e, lost },
                        Action::StoreAcquireWakes { elector: e, lost },
                        Action::StoreRenew { elector: e, lost },
                        Action::StoreRelease { elector: e, lost },
                    ]);
                }
            }
        }
        let terms = self.presentable_terms(s);
        for (g, gateway) in s.gateways.iter().enumerate() {
            let g = idx(g);
            for r in 0..self.config.resources() {
                for term in 1..=terms {
                    out.push(Action::GatewayDecide { gateway: g, resource: idx(r), term });
                }
                if self.config.stamp {
                    for owner in 0..ELECTORS {
                        out.push(Action::GatewayStampWrite { gateway: g, resource: idx(r), owner: idx(owner) });
                    }
                }
            }
            if gateway.orphan.is_some() {
                let c = idx(MAX_CALLS);
                out.extend([
                    Action::GateStamp { gateway: g, call: c, lost: false },
                    Action::GateRead { gateway: g, call: c, lost: false },
                    Action::GateGrant { gateway: g, call: c, lost: false },
                    Action::GateLock { gateway: g, call: c, lost: false },
                    Action::GateWakes { gateway: g, call: c, lost: false },
                    Action::GateCommit { gateway: g, call: c, lost: false },
                    Action::GateAbort { gateway: g, call: c },
                ]);
            }
            for (c, call) in gateway.calls.iter().enumerate() {
                if call.is_some() {
                    let c = idx(c);
                    out.push(Action::GatewayLost { gateway: g, call: c });
                    if self.config.batched {
                        out.push(Action::GateAbort { gateway: g, call: c });
                    }
                    if self.config.give_up {
                        out.push(Action::GatewayGaveUp { gateway: g, call: c });
                    }
                    for lost in [false, true] {
                        out.extend([
                            Action::GateStamp { gateway: g, call: c, lost },
                            Action::GateRead { gateway: g, call: c, lost },
                            Action::GateGrant { gateway: g, call: c, lost },
                            Action::GateLock { gateway: g, call: c, lost },
                            Action::GateWakes { gateway: g, call: c, lost },
                            Action::GateCommit { gateway: g, call: c, lost },
                        ]);
                    }
                }
            }
            for (w, write) in gateway.writes.iter().enumerate() {
                if write.is_some() {
                    let w = idx(w);
                    out.extend([
                        Action::GatewayCheck { gateway: g, write: w },
                        Action::GatewaySend { gateway: g, write: w },
                    ]);
                }
            }
        }
        if self.config.admin_actions > 0 {
            out.extend([Action::AdminRuns(Admin::ForceRelease), Action::AdminWakes]);
            for r in 0..self.config.resources() {
                let resource = idx(r);
                for term in 1..=terms {
                    out.push(Action::AdminRuns(Admin::Advance { resource, term }));
                }
                // Only names outside unbound routes' own ('/...') can be bound.
                if self.config.bound(r) {
                    out.extend([
                        Action::AdminRuns(Admin::Bind { resource }),
                        Action::AdminRuns(Admin::Rebind { resource }),
                    ]);
                }
            }
        }
        if self.config.sql_writer {
            if s.sql.is_some() {
                out.extend([Action::SqlLock, Action::SqlWakes, Action::SqlCommit]);
            } else {
                for r in 0..self.config.resources() {
                    for term in 1..=terms {
                        out.push(Action::SqlAdmit { resource: idx(r), term });
                    }
                }
            }
        }
        out
    }
}
