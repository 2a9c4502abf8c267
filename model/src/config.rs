//! What the model checks: its sizes, its faults, its planted bugs, and how it counts time.

/// Gateways in the model (each with its own boot clock, grants, settles and calls).
pub const GATEWAYS: usize = 2;
/// Electors in the model (each one process incarnation, so one owner).
pub const ELECTORS: usize = 2;
/// The most resources the state has room for.
pub const MAX_RESOURCES: usize = 3;
/// Decisions a gateway may have out at once (asked and not answered, or lost).
pub const MAX_CALLS: usize = 1;
/// Admitted writes a gateway may hold at once (settling, or on their way to the upstream).
pub const MAX_WRITES: usize = 2;

/// Time in ticks. Every length of the real system is a small whole number of ticks; the ratios
/// are what matter (a grant shorter than a lease, a forward timeout shorter than a grant).
///
/// The store's sleep timer (`pg_sleep`, the kernel's monotonic timer) is the reference: it runs
/// at the rate of real time. Only relative rates matter for the protocol, so the tolerance
/// `rho` of the contract is all put on the gateways' boot clocks: each may drift by at most
/// [`Timing::drift`] ticks from real time over a run (a run lasts [`Config::horizon`] ticks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Timing {
    /// The lease's ttl (`fencing.acquire(.., ttl)`), on the store's wall clock.
    pub ttl: i8,
    /// The elector's safety margin, taken off its local deadline (S7).
    pub elector_margin: i8,
    /// The grant a gateway asks for (`database.grant_ms`).
    pub grant: u8,
    /// The forward timeout (`upstream.forward_timeout`): how long after its decision a write may
    /// be sent.
    pub forward: u8,
    /// How far one boot clock may drift from real time over a run, in ticks: the contract's rho.
    /// A gateway counts a grant `drift` ticks shorter (`(1 - rho) / (1 + rho)`) and a settle
    /// wait `2 * drift` ticks longer (`(1 + rho) / (1 - rho)`: this clock and the lower term's
    /// gateway's may drift apart by twice the tolerance).
    pub drift: i8,
    /// The size of the store's clock step (both ways).
    pub step: i8,
}

impl Default for Timing {
    fn default() -> Timing {
        Timing { ttl: 3, elector_margin: 1, grant: 2, forward: 1, drift: 1, step: 2 }
    }
}

/// A bug planted in the model, one per planted bug of the fault suite
/// (`tests/src/faultsuite.rs`, `plant_sql`), plus the planned design of lease-scoped grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Plant {
    /// `weak-fence`: `fencing.gate`'s stale refusal turned into an admission with no wait.
    WeakFence,
    /// `no-new-term`: `fencing.acquire` starts a new period with the old term (`l.term`).
    NoNewTerm,
    /// `no-settle`: every wait `fencing.gate` answers is zero.
    NoSettle,
    /// `grant-ignored`: `fencing.await_grants` does nothing, so a raise does not wait out the
    /// grants on the lower term.
    GrantIgnored,
    /// `grant-overstay`: the store records a smaller grant than it gives (a quarter in the fault
    /// suite; half here, the smallest fraction whole ticks express), so a term change waits too
    /// little.
    GrantOverstay,
    /// `gate-race`: `fencing.gate`'s raise no longer checks the maximum of the version it locked,
    /// so a higher term committed since its first read is overwritten.
    GateRace,
    /// `async-commit`: `fencing.commit_durably` does nothing: an answered decision may be lost in
    /// a crash of the store.
    AsyncCommit,
    /// `wall-clock-waits`: grants end at an instant of the store's wall clock, and a term change
    /// waits until that clock reads past it (the code before schema version 8): a step of the
    /// clock ends the wait early.
    WallClockWaits,
    /// `sql-raise-skips-settle`: a raise through SQL (`fencing.try_admit`) records no settle for
    /// the new term, so the new term's gateway writes are sent at once.
    SqlRaiseSkipsSettle,
    /// `busy-grant-skips-lease-check`: a decision of the lease's own term that finds a term
    /// change holding the grant locks is admitted on the lease as it read it (the code before the
    /// model found it with an SQL raise; no plant of the fault suite).
    BusyGrantSkipsLeaseCheck,
    /// `raise-skips-lease-check`: a raise of a bound fence decides on the lease as it read it
    /// before it waited for the fence row and the grants (the code before the model found it; no
    /// plant of the fault suite: `tests/tests/schema/s4_bound_resource.rs` holds the interleaving).
    RaiseSkipsLeaseCheck,
    /// `gate-async-commit`: `fencing.gate` commits asynchronously (the other paths stay durable).
    GateAsyncCommit,
    /// `admit-async-commit`: an SQL writer's transaction commits asynchronously.
    AdmitAsyncCommit,
    /// `advance-async-commit`: `fencing.advance_fence` commits asynchronously.
    AdvanceAsyncCommit,
    /// `bind-async-commit`: `fencing.bind` commits asynchronously.
    BindAsyncCommit,
    /// `rebind-async-commit`: `fencing.rebind` commits asynchronously.
    RebindAsyncCommit,
    /// `renew-any-owner`: `fencing.renew` extends whoever holds the lease and answers ok.
    RenewAnyOwner,
    /// `renew-expired`: `fencing.renew` brings back a period that expired.
    RenewExpired,
    /// `acquire-keeps-period`: `fencing.acquire` ignores `new_period`, so a holder that ended its
    /// period locally gets the same term again.
    AcquireKeepsPeriod,
    /// `elector-margin-added`: the elector's deadline adds the safety margin instead of taking it
    /// off.
    ElectorMarginAdded,
    /// `elector-deadline-ignored`: the elector's leadership ends only when a renewal fails or it
    /// releases, not at its deadline.
    ElectorDeadlineIgnored,
    /// `future-term`: a bound resource's decision takes a term above its lease's for its current
    /// one.
    FutureTerm,
    /// `stamp-any-owner`: `fencing.gate_lease` stamps the lease's term whoever presents it, without
    /// checking that the presented owner holds the lease.
    StampAnyOwner,
    /// `batch-grant-skips-lease-lock`: a grant of a bound resource decided in a batch is given
    /// without the lease's advisory lock, so a new term of the lease does not wait for the batch
    /// to commit and misses the grant it records (no plant of the fault suite: the lock is what
    /// makes batching safe, and this shows the model would see it gone).
    BatchGrantSkipsLeaseLock,
    /// The design planned next, not a bug planted in code: one grant per (lease, term), covering
    /// every resource bound to that lease, recorded on the lease row and waited out by the
    /// lease's next term (instead of one grant per resource).
    LeaseScopedGrants,
    /// The same design, repaired: the lease's grant covers a resource only once the gateway had
    /// one admitted decision of that resource at the grant's term (its binding, its raise and
    /// settle), and a write under it starts and ends as that decision said. A change of a bound
    /// fence's term or binding by hand (`advance_fence`, `rebind`) waits out the lease's grant at
    /// the fence's term too, as a new term of the lease does, and bumps the lease's epoch, so that
    /// the decisions made before it count for no lease grant given after it.
    LeaseGrantsAfterDecision,
    /// The repaired design without that last wait: an admin action waits out only the fence
    /// row's own grants, which the lease's grant does not record.
    LeaseGrantsAdminNoWait,
    /// The repaired design with the wait but without the lease's epoch: a gateway's decision of a
    /// resource made before an operator changed its fence still counts for a lease grant given
    /// after the change (renewed through another resource).
    LeaseGrantsAdminNoEpoch,
    /// The design for unbound routes (issue 23, item 2): one grant per (namespace, term), the
    /// namespace being the unbound route's resources, covering a resource once the gateway had
    /// one admitted decision of it at the grant's term and at the namespace's epoch, recorded on
    /// the namespace row. A raise of any of the namespace's fences takes the namespace's lock
    /// (no grant is given on the namespace while it is held, and raises of its fences queue),
    /// sleeps out the longest namespace grant, and bumps the namespace's epoch.
    NamespaceGrants,
    /// `namespace-grant-no-epoch`: the design without the epoch, so a decision of a resource
    /// made before its fence was raised still counts for a namespace grant: the grant admits a
    /// term below the resource's maximum.
    NamespaceGrantNoEpoch,
    /// `namespace-grant-without-decision`: the first sketch of the issue, a grant at a term that
    /// covers every resource of the namespace, decided or not: it admits its term on a resource
    /// whose fence is above it (created or raised after the grant, or before it), and on one
    /// whose fence is below it without raising the row, so a lower term is admitted after it.
    NamespaceGrantWithoutDecision,
    /// `busy-grant-on-stale-version`: a decision of the current term that finds a term change
    /// holding the grant locks is admitted on the version it read before, even when a higher term
    /// was admitted since (the code before the model found it, with the fences created before the
    /// run; no plant of the fault suite).
    BusyGrantOnStaleVersion,
}

impl Plant {
    /// Every variant, in the order the tests check them.
    pub const ALL: [Plant; 32] = [
        Plant::WeakFence,
        Plant::NoNewTerm,
        Plant::NoSettle,
        Plant::GrantIgnored,
        Plant::GrantOverstay,
        Plant::GateRace,
        Plant::AsyncCommit,
        Plant::WallClockWaits,
        Plant::SqlRaiseSkipsSettle,
        Plant::BusyGrantSkipsLeaseCheck,
        Plant::RaiseSkipsLeaseCheck,
        Plant::BatchGrantSkipsLeaseLock,
        Plant::GateAsyncCommit,
        Plant::AdmitAsyncCommit,
        Plant::AdvanceAsyncCommit,
        Plant::BindAsyncCommit,
        Plant::RebindAsyncCommit,
        Plant::RenewAnyOwner,
        Plant::RenewExpired,
        Plant::AcquireKeepsPeriod,
        Plant::FutureTerm,
        Plant::ElectorMarginAdded,
        Plant::ElectorDeadlineIgnored,
        Plant::StampAnyOwner,
        Plant::LeaseScopedGrants,
        Plant::LeaseGrantsAfterDecision,
        Plant::LeaseGrantsAdminNoWait,
        Plant::LeaseGrantsAdminNoEpoch,
        Plant::NamespaceGrants,
        Plant::NamespaceGrantNoEpoch,
        Plant::NamespaceGrantWithoutDecision,
        Plant::BusyGrantOnStaleVersion,
    ];

    /// The name the fault suite gives it (or the design's name).
    pub fn name(self) -> &'static str {
        match self {
            Plant::WeakFence => "weak-fence",
            Plant::NoNewTerm => "no-new-term",
            Plant::NoSettle => "no-settle",
            Plant::GrantIgnored => "grant-ignored",
            Plant::GrantOverstay => "grant-overstay",
            Plant::GateRace => "gate-race",
            Plant::AsyncCommit => "async-commit",
            Plant::WallClockWaits => "wall-clock-waits",
            Plant::SqlRaiseSkipsSettle => "sql-raise-skips-settle",
            Plant::BusyGrantSkipsLeaseCheck => "busy-grant-skips-lease-check",
            Plant::RaiseSkipsLeaseCheck => "raise-skips-lease-check",
            Plant::BatchGrantSkipsLeaseLock => "batch-grant-skips-lease-lock",
            Plant::StampAnyOwner => "stamp-any-owner",
            Plant::GateAsyncCommit => "gate-async-commit",
            Plant::AdmitAsyncCommit => "admit-async-commit",
            Plant::AdvanceAsyncCommit => "advance-async-commit",
            Plant::BindAsyncCommit => "bind-async-commit",
            Plant::RebindAsyncCommit => "rebind-async-commit",
            Plant::RenewAnyOwner => "renew-any-owner",
            Plant::RenewExpired => "renew-expired",
            Plant::AcquireKeepsPeriod => "acquire-keeps-period",
            Plant::FutureTerm => "future-term",
            Plant::ElectorMarginAdded => "elector-margin-added",
            Plant::ElectorDeadlineIgnored => "elector-deadline-ignored",
            Plant::LeaseScopedGrants => "lease-scoped-grants",
            Plant::LeaseGrantsAfterDecision => "lease-grants-after-decision",
            Plant::LeaseGrantsAdminNoWait => "lease-grants-admin-no-wait",
            Plant::LeaseGrantsAdminNoEpoch => "lease-grants-admin-no-epoch",
            Plant::NamespaceGrants => "namespace-grants",
            Plant::NamespaceGrantNoEpoch => "namespace-grant-no-epoch",
            Plant::NamespaceGrantWithoutDecision => "namespace-grant-without-decision",
            Plant::BusyGrantOnStaleVersion => "busy-grant-on-stale-version",
        }
    }

    /// Whether the variant makes some commits asynchronous, so that a crash of the store can lose
    /// them (the model then keeps what was flushed).
    pub fn loses_commits(self) -> bool {
        matches!(
            self,
            Plant::AsyncCommit
                | Plant::GateAsyncCommit
                | Plant::AdmitAsyncCommit
                | Plant::AdvanceAsyncCommit
                | Plant::BindAsyncCommit
                | Plant::RebindAsyncCommit
        )
    }

    /// Whether the variant needs grants to show.
    pub fn needs_grants(self) -> bool {
        matches!(
            self,
            Plant::GrantIgnored
                | Plant::GrantOverstay
                | Plant::WallClockWaits
                | Plant::LeaseScopedGrants
                | Plant::LeaseGrantsAfterDecision
                | Plant::LeaseGrantsAdminNoWait
                | Plant::LeaseGrantsAdminNoEpoch
                | Plant::NamespaceGrants
                | Plant::NamespaceGrantNoEpoch
                | Plant::NamespaceGrantWithoutDecision
                | Plant::BusyGrantOnStaleVersion
                | Plant::BusyGrantSkipsLeaseCheck
                | Plant::BatchGrantSkipsLeaseLock
        )
    }
}

/// One check: the sizes, the faults, and the variant of the protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Config {
    /// Resources bound to the one lease key (a route with `lease = "k"`), named `r1`, `r2`.
    pub bound_resources: u8,
    /// Resources of an unbound route (verify mode, any term), named `f1`, ...
    pub unbound_resources: u8,
    /// The highest term explored: states with a higher lease term are outside the boundary.
    pub terms: u8,
    /// The last tick of real time explored.
    pub horizon: i8,
    /// Whether gateways ask for grants (`database.grant_ms` above zero).
    pub grants: bool,
    /// Whether the store's wall clock may be stepped (once, `Timing::step` ticks either way).
    pub clock_step: bool,
    /// How many boot clocks may drift (each once, by `Timing::drift` ticks either way).
    pub drifting_clocks: u8,
    /// S5's timing assumption: no gateway pauses between its last check of a write's deadline
    /// and its send (in ticks: never across a tick). Without it, a pause there breaks S5.
    pub pause_assumption: bool,
    /// How many writes arrive at gateways in a run (each a decision, asked or under a grant): the
    /// bound that makes the state space finite and small.
    pub writes: u8,
    /// How many calls electors make in a run (acquire, renew, release).
    pub lease_calls: u8,
    /// Whether callers give up on calls (their timeouts) that the store still runs later: a
    /// gateway's decision or an elector's call, one of each per process at a time, beside its
    /// next call (delayed past the caller's retry, and so run after it: a duplicate).
    pub give_up: bool,
    /// Whether an SQL writer (`fencing.admit` in a transaction that then writes a row) writes
    /// too, on resources whose fence row exists.
    pub sql_writer: bool,
    /// Whether writes may come in stamp mode too (presenting an elector's identity, stamped by
    /// `fencing.gate_lease` with the lease's term when that elector holds it).
    pub stamp: bool,
    /// How many admin actions an operator runs in a run (`fencing.advance_fence`, `fencing.bind`,
    /// `fencing.rebind`, `fencing.force_release`, each at any step).
    pub admin_actions: u8,
    /// Whether a gateway's decisions run in batches (`fencing.gate_many` of several items, one
    /// transaction): a decision that wrote (a raise, a first write, a grant) holds its locks and
    /// stays invisible to others until the batch commits, after the batch's other items (their
    /// lock waits and grant sleeps), and only then is it answered.
    pub batched: bool,
    /// Whether presented terms go up to `terms` (forged and future tokens) or only up to the
    /// highest term a store has granted so far plus one.
    pub forged_terms: bool,
    /// Whether the unbound route's fences exist at the start, at term 1 (written, and sent,
    /// before the run): the checks of the namespace-grant design spend their writes on the
    /// namespace, not on each resource's first write, which gets no grant.
    pub seeded: bool,
    /// Whether the check explores one state per renaming of gateways, electors and bound
    /// resources ([`crate::symmetry`]; depth first, so a counterexample need not be shortest).
    pub symmetry: bool,
    /// The planted bug or design variant, if any.
    pub plant: Option<Plant>,
    /// How time is counted.
    pub timing: Timing,
}

impl Config {
    /// The sizes of issue 29: 2 gateways, 2 electors, resources on one bound lease and one
    /// unbound route, 3 terms; `grants` on or off.
    pub fn standard(grants: bool) -> Config {
        Config {
            bound_resources: 1,
            unbound_resources: 1,
            terms: 3,
            horizon: 3,
            writes: 2,
            lease_calls: 2,
            grants,
            clock_step: false,
            drifting_clocks: 0,
            pause_assumption: true,
            sql_writer: false,
            give_up: false,
            forged_terms: false,
            seeded: false,
            batched: false,
            admin_actions: 0,
            stamp: false,
            symmetry: false,
            plant: None,
            timing: Timing::default(),
        }
    }

    /// Grant admissions on a bound resource: `r1` alone, grants on, four writes (the first
    /// write on a resource gets no grant, the second one does, the next ones may be admitted
    /// under it), two elector calls (an acquire that sleeps out the grants completes within the
    /// horizon when an earlier acquire's answer was lost).
    pub fn bound_grants() -> Config {
        Config { bound_resources: 1, unbound_resources: 0, writes: 4, ..Config::standard(true) }
    }

    /// The lease moving on during a raise: `r1` alone, grants off, three writes (forged terms
    /// too), three elector calls, so that a newer term can be granted while a raise waits.
    pub fn lease_moves_on() -> Config {
        Config { unbound_resources: 0, writes: 3, lease_calls: 3, forged_terms: true, ..Config::standard(false) }
    }

    /// Calls their callers gave up on, run by the store later: `r1` alone, grants on, 2 writes,
    /// 2 elector calls.
    pub fn give_up() -> Config {
        Config { give_up: true, unbound_resources: 0, ..Config::standard(true) }
    }

    /// An SQL writer beside the gateways: `r1` bound, grants on, 3 writes (gateways' and the SQL
    /// writer's), 2 elector calls.
    pub fn sql_writers() -> Config {
        Config { unbound_resources: 0, writes: 3, sql_writer: true, ..Config::standard(true) }
    }

    /// Batched decisions: `r1` bound and `f1` unbound, grants on, 3 writes, 2 elector calls; each
    /// decision that writes is held uncommitted, its locks taken, until its batch commits.
    pub fn batched() -> Config {
        Config { batched: true, writes: 3, ..Config::standard(true) }
    }

    /// The clocks check: one unbound resource, grants on, four writes, no electors, the store's
    /// clock stepped and one gateway's boot clock drifting.
    pub fn clocks() -> Config {
        Config {
            bound_resources: 0,
            unbound_resources: 1,
            horizon: 3,
            writes: 4,
            lease_calls: 0,
            grants: true,
            clock_step: true,
            drifting_clocks: 1,
            forged_terms: true,
            ..Config::standard(true)
        }
    }

    /// This configuration with `plant`.
    pub fn planted(self, plant: Plant) -> Config {
        Config { plant: Some(plant), grants: self.grants || plant.needs_grants(), ..self }
    }

    /// How many resources there are.
    pub fn resources(&self) -> usize {
        usize::from(self.bound_resources + self.unbound_resources).min(MAX_RESOURCES)
    }

    /// Whether resource `r` is bound to the lease.
    pub fn bound(&self, r: usize) -> bool {
        r < usize::from(self.bound_resources)
    }

    /// The name of resource `r`.
    pub fn resource_name(&self, r: usize) -> String {
        if self.bound(r) { format!("r{}", r + 1) } else { format!("f{}", r + 1 - usize::from(self.bound_resources)) }
    }

    /// Whether `plant` is planted.
    pub fn has(&self, plant: Plant) -> bool {
        self.plant == Some(plant)
    }
}
