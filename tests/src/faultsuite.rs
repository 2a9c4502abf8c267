//! The fault suite's scenario runner: real processes, seeded faults, a recorded history.
//!
//! One run is one PostgreSQL cluster (from the harness, its database committing asynchronously,
//! so only `fencing.commit_durably` makes decisions durable) and a series of schedules. Each
//! schedule gets a fresh database and starts: two upstreams (`fault-upstream`, one checking
//! tokens itself, one applying everything), three gateways, three leader processes
//! (`fault-leader`, each contending for the lease keys `k1` and `k2`), a racer (`fault-racer`,
//! presenting adjacent terms at one instant on unbound resources of its own), and TCP fault proxies
//! between the gateways and Postgres, the gateways and the upstreams, and the leaders and
//! Postgres. A seeded injector then pauses, kills and restarts processes, crashes Postgres and
//! disturbs the links for the fault phase, stops, and waits for writes to flow again. At the end
//! the runner writes the history (`checker/HISTORY.md`) into the schedule's folder.
//!
//! The schedule's seed decides every fault, its target and its timing; the processes' own
//! scheduling is not under its control, so a replay repeats the faults, not every interleaving.
//!
//! Planted bugs ([`Plant`]) replace SQL in the schedule's database after migrating, or turn on
//! a failpoint of the election library in the leader processes (`FAILPOINTS`; compiled in only
//! with `fencing-election`'s `failpoints` feature, which only this crate asks for): the suite
//! shows that the checker catches them.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, anyhow, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};
use tokio::time::Instant;

use crate::faultprobe::{FollowUp, ProbePath, Prober};
use crate::faultproxy::{Direction, FaultProxy, Mode, OnClose};
use crate::pg::{Durability, PgCluster, Replication, try_connect};
use crate::workspace_bin;

/// A bug planted in the schedule's database or in the leader processes, to show that the checker
/// catches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plant {
    /// The fence comparison weakened: a stale term is admitted.
    WeakFence,
    /// The settle wait removed: a new term's writes do not wait for lower-term writes in flight.
    NoSettle,
    /// Asynchronous commit without the synchronous override: answered decisions lost in a crash.
    AsyncCommit,
    /// No new term when a lease is acquired after it expired.
    NoNewTerm,
    /// A raise of `fencing.gate` decided on two versions of the fence row: the one it read, and
    /// the one it locked, whose maximum it no longer checks.
    GateRace,
    /// A term change that ignores grants: a higher term is admitted while gateways may still
    /// admit the lower one without asking.
    GrantIgnored,
    /// A grant used past its end: the store gives four times the grant it records, so a term
    /// change waits for a quarter of it.
    GrantOverstay,
    /// Waits that compare instants of the store's wall clock (the code before schema version 8):
    /// each grant records when it ends by that clock, and a term change waits until the clock
    /// reads past it, so a step of the clock ends the wait while gateways still hold grants.
    WallClockWaits,
    /// An elector whose local deadline adds the safety margin instead of taking it off: the
    /// holder acts past the store's expiry of its period (a failpoint in the election library).
    ElectorMarginAdded,
    /// An elector whose `leadership()` does not check the deadline at the moment of acting, only
    /// what its renewal loop last set (a failpoint in the election library).
    ElectorDeadlineIgnored,
    /// A renewal that does not check the owner: it extends whoever holds the lease, and answers
    /// ok with that holder's term.
    RenewAnyOwner,
    /// A renewal that does not check the expiry: a period that ended (expired or released) is
    /// brought back while no one else took the lease.
    RenewExpired,
    /// An acquire that ignores `new_period`: a holder that ended its period locally is handed the
    /// same term again.
    AcquireKeepsPeriod,
    /// Stamp mode that does not check the owner: any owner's write is stamped with the lease's
    /// current term while it is unexpired.
    StampAnyOwner,
    /// A gate that takes a future term of a bound resource's lease for its current one.
    FutureTerm,
    /// The gateway's decision (`fencing.gate`) commits asynchronously: a raise answered before
    /// it was durable is lost in a crash (the other paths stay durable).
    GateAsyncCommit,
    /// An application's raise through SQL (`fencing.try_admit`, behind `fencing.admit` and the
    /// SQL guard) commits as the session does: asynchronously here, so a raise answered before
    /// it was durable is lost in a crash.
    AdmitAsyncCommit,
    /// The admin action `fencing.advance_fence` commits as the session does.
    AdvanceAsyncCommit,
    /// `fencing.bind` commits as the session does: a binding answered before it was durable is
    /// lost in a crash, and the resource admits any term again.
    BindAsyncCommit,
    /// The admin action `fencing.rebind` commits as the session does: a rebinding answered
    /// before it was durable is lost in a crash, and the old lease's leader is admitted again.
    RebindAsyncCommit,
    /// A raise through SQL (`fencing.try_admit`) records no settle for the new term: its writes
    /// through a gateway are forwarded at once, while the lower term's may still be arriving.
    SqlRaiseSkipsSettle,
    /// The gateway's upstream sockets close with FIN, not RST (a failpoint in the gateway): a
    /// write aborted at its deadline is still sent by the kernel, and arrives after it.
    UpstreamGracefulClose,
    /// An append to the fenced log without the stream's fence (`fencing.append` numbers any
    /// term): a zombie's append lands in the log, after the new leader's, and followers apply it.
    LogUnfenced,
}

impl Plant {
    /// Every planted bug.
    pub const ALL: [Plant; 23] = [
        Plant::WeakFence,
        Plant::NoSettle,
        Plant::AsyncCommit,
        Plant::NoNewTerm,
        Plant::GateRace,
        Plant::GrantIgnored,
        Plant::GrantOverstay,
        Plant::WallClockWaits,
        Plant::ElectorMarginAdded,
        Plant::ElectorDeadlineIgnored,
        Plant::RenewAnyOwner,
        Plant::RenewExpired,
        Plant::AcquireKeepsPeriod,
        Plant::StampAnyOwner,
        Plant::FutureTerm,
        Plant::GateAsyncCommit,
        Plant::AdmitAsyncCommit,
        Plant::AdvanceAsyncCommit,
        Plant::BindAsyncCommit,
        Plant::RebindAsyncCommit,
        Plant::SqlRaiseSkipsSettle,
        Plant::UpstreamGracefulClose,
        Plant::LogUnfenced,
    ];

    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Plant::WeakFence => "weak-fence",
            Plant::NoSettle => "no-settle",
            Plant::AsyncCommit => "async-commit",
            Plant::NoNewTerm => "no-new-term",
            Plant::GateRace => "gate-race",
            Plant::GrantIgnored => "grant-ignored",
            Plant::GrantOverstay => "grant-overstay",
            Plant::WallClockWaits => "wall-clock-waits",
            Plant::ElectorMarginAdded => "elector-margin-added",
            Plant::ElectorDeadlineIgnored => "elector-deadline-ignored",
            Plant::RenewAnyOwner => "renew-any-owner",
            Plant::RenewExpired => "renew-expired",
            Plant::AcquireKeepsPeriod => "acquire-keeps-period",
            Plant::StampAnyOwner => "stamp-any-owner",
            Plant::FutureTerm => "future-term",
            Plant::GateAsyncCommit => "gate-async-commit",
            Plant::AdmitAsyncCommit => "admit-async-commit",
            Plant::AdvanceAsyncCommit => "advance-async-commit",
            Plant::BindAsyncCommit => "bind-async-commit",
            Plant::RebindAsyncCommit => "rebind-async-commit",
            Plant::SqlRaiseSkipsSettle => "sql-raise-skips-settle",
            Plant::UpstreamGracefulClose => "upstream-graceful-close",
            Plant::LogUnfenced => "log-unfenced",
        }
    }

    /// The failpoint of the election library that plants this bug in the leader processes
    /// (`FAILPOINTS`), if it is one.
    pub fn leader_failpoint(self) -> Option<&'static str> {
        match self {
            Plant::ElectorMarginAdded => Some("elector-margin-added=return"),
            Plant::ElectorDeadlineIgnored => Some("elector-deadline-ignored=return"),
            _ => None,
        }
    }

    /// The failpoint of the gateway that plants this bug in the gateway processes
    /// (`FAILPOINTS`), if it is one. Plants of neither kind are SQL ([`plant_sql`]).
    pub fn gateway_failpoint(self) -> Option<&'static str> {
        match self {
            Plant::UpstreamGracefulClose => Some("upstream-graceful-close=return"),
            _ => None,
        }
    }

    /// The invariants whose violation shows this bug; the planted-bug tests count no other.
    pub fn shows_as(self) -> &'static [fencing_checker::Invariant] {
        use fencing_checker::Invariant::{Log, Once, S1, S2, S3, S4, S5, S7};
        match self {
            // A stale term admitted: it reaches an upstream or the table after a higher one.
            Plant::WeakFence => &[S3, S4, S5],
            // Lower-term writes in flight overtaken by the new term's.
            Plant::NoSettle | Plant::GateRace | Plant::SqlRaiseSkipsSettle => &[S3, S5],
            // A lower term admitted by a grant after a higher term's write was answered (the
            // racer's SQL raise), or forwarded after it (overstay).
            Plant::GrantIgnored => &[S3],
            Plant::GrantOverstay => &[S3, S5],
            // A grant outlives the term change a step cut short: a lower term admitted after the
            // higher one was answered or granted, or forwarded after it.
            Plant::WallClockWaits => &[S3, S4, S5],
            // A grant or a raise lost in a crash: a term granted twice, or a fence gone back.
            Plant::AsyncCommit => &[S1, S2, S3],
            Plant::NoNewTerm => &[S1, S2],
            // A holder acting after the store's expiry of its period, or past its own deadline.
            Plant::ElectorMarginAdded | Plant::ElectorDeadlineIgnored => &[S7],
            // A client told it holds a period the store gives to another owner.
            Plant::RenewAnyOwner => &[S1],
            // A period brought back after it ended.
            Plant::RenewExpired => &[S2],
            // A period a holder ended locally, handed back to it.
            Plant::AcquireKeepsPeriod => &[S2],
            // A write admitted with a term it should not have carried.
            Plant::StampAnyOwner | Plant::FutureTerm => &[S4],
            // A raise lost in a crash: the lower term admitted again after the higher one was
            // answered (a durability probe's, in the clients' order), and an SQL raise's row gone.
            Plant::GateAsyncCommit => &[S3],
            Plant::AdmitAsyncCommit | Plant::AdvanceAsyncCommit => &[S3, Once],
            // A binding lost in a crash: the resource admits a term its lease never granted.
            Plant::BindAsyncCommit | Plant::RebindAsyncCommit => &[S4],
            // A byte of a write sent after the gateway's own deadline for it.
            // (and lower-term writes arriving after higher ones: S3 at the upstream).
            Plant::UpstreamGracefulClose => &[S3, S5],
            // A zombie's append in the log, after a newer term's.
            Plant::LogUnfenced => &[Log],
        }
    }

    /// Parses a name of [`Plant::name`].
    pub fn parse(name: &str) -> Option<Plant> {
        Plant::ALL.into_iter().find(|plant| plant.name() == name)
    }
}

/// What one run does.
#[derive(Debug, Clone)]
pub struct SuiteConfig {
    /// How many schedules.
    pub schedules: usize,
    /// Seconds of traffic with faults in each schedule (the quiet tail comes on top).
    pub seconds: u64,
    /// The first schedule's seed; schedule i uses seed + i.
    pub seed: u64,
    /// Where the histories go (one folder per schedule).
    pub out: PathBuf,
    /// A bug to plant, if any.
    pub plant: Option<Plant>,
    /// The leaders' lease ttl.
    pub ttl: Duration,
    /// The gateways' forward timeout.
    pub forward_timeout: Duration,
    /// The path every schedule's durability probe takes; None: the seed's turn (`seed % 5`).
    pub probe: Option<ProbePath>,
}

impl SuiteConfig {
    /// The default shape: ttl 1.5 s, forward timeout 1 s.
    pub fn new(schedules: usize, seconds: u64, seed: u64, out: PathBuf) -> SuiteConfig {
        SuiteConfig {
            schedules,
            seconds,
            seed,
            out,
            plant: None,
            ttl: Duration::from_millis(1500),
            forward_timeout: Duration::from_millis(1000),
            probe: None,
        }
    }
}

fn now_us() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

fn free_port() -> Result<u16> {
    Ok(StdListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Starts the run's cluster: asynchronous commit in the database, a WAL writer that flushes
/// rarely, so a crash loses whatever was not made durable on purpose; its wall clock under the
/// injector's control (libfaketime), so the store's clock can be stepped.
pub fn start_cluster() -> Result<PgCluster> {
    PgCluster::start_with_fake_clock_and_settings(
        Durability::Off,
        "synchronous_commit = off\nwal_writer_delay = 10s\nmax_connections = 300\n",
    )
}

/// A child process the injector can pause, kill and restart.
struct Managed {
    name: String,
    command: Vec<String>,
    child: Option<Child>,
    paused: bool,
    /// Where its stderr goes (appended across restarts); nowhere if None.
    stderr: Option<PathBuf>,
}

impl Managed {
    fn pid(&self) -> Option<Pid> {
        self.child.as_ref().and_then(Child::id).and_then(|id| i32::try_from(id).ok()).map(Pid::from_raw)
    }

    fn signal(&mut self, signal: Signal) {
        if let Some(pid) = self.pid() {
            let _ = kill(pid, signal);
        }
        match signal {
            Signal::SIGSTOP => self.paused = true,
            Signal::SIGCONT => self.paused = false,
            _ => {}
        }
    }

    fn spawn(&mut self) -> Result<()> {
        let (program, args) = self.command.split_first().ok_or_else(|| anyhow!("empty command"))?;
        let stderr = match &self.stderr {
            Some(path) => Stdio::from(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .with_context(|| format!("open {}", path.display()))?,
            ),
            None => Stdio::null(),
        };
        let child = Command::new(program)
            .args(args)
            .env("RUST_LOG", "error")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("spawn {}", self.name))?;
        self.child = Some(child);
        self.paused = false;
        Ok(())
    }

    async fn kill_now(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.start_kill();
            let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
        }
    }

    /// [`Managed::terminate`] for all of `processes` at once: SIGTERM to each, then each waited
    /// for until `grace` from now, and killed if it has not exited.
    async fn terminate_all(processes: &mut [Managed], grace: Duration) {
        for process in processes.iter_mut() {
            if process.paused {
                process.signal(Signal::SIGCONT);
            }
            if let Some(pid) = process.pid() {
                let _ = kill(pid, Signal::SIGTERM);
            }
        }
        let until = Instant::now() + grace;
        for process in processes.iter_mut() {
            if let Some(mut child) = process.child.take()
                && tokio::time::timeout_at(until, child.wait()).await.is_err()
            {
                let _ = child.start_kill();
                let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
            }
        }
    }

    /// SIGTERM, then SIGKILL after `grace`.
    async fn terminate(&mut self, grace: Duration) {
        if self.paused {
            self.signal(Signal::SIGCONT);
        }
        if let Some(pid) = self.pid() {
            let _ = kill(pid, Signal::SIGTERM);
        }
        if let Some(mut child) = self.child.take() {
            if tokio::time::timeout(grace, child.wait()).await.is_err() {
                let _ = child.start_kill();
                let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
            }
        }
    }
}

/// Everything one schedule runs.
struct Schedule {
    index: usize,
    seed: u64,
    dir: PathBuf,
    url: String,
    gateways: Vec<Managed>,
    /// The gateways' control listeners (`/readyz`).
    control_ports: Vec<u16>,
    /// The leaders' lease ttl.
    ttl: Duration,
    /// The gateways' forward timeout.
    forward_timeout: Duration,
    leaders: Vec<Managed>,
    /// The fenced log's followers (`fault-follower`), and their links to Postgres (no faults of
    /// their own; retargeted by a failover).
    followers: Vec<Managed>,
    follower_pg: Vec<FaultProxy>,
    racer: Managed,
    /// Leaders through the gateways' HTTP lease API (key `k3`).
    lease_clients: Vec<Managed>,
    upstreams: Vec<Managed>,
    gateway_pg: Vec<FaultProxy>,
    leader_pg: Vec<FaultProxy>,
    /// The racer's link to Postgres (no faults of its own; retargeted by a failover).
    racer_pg: FaultProxy,
    upstream_proxies: Vec<FaultProxy>,
    faults: Vec<Value>,
    /// The steps of the store's clock, as `clock.jsonl` records them.
    clock_steps: Vec<Value>,
    /// What the store's clock reads ahead of real time now, in microseconds.
    clock_offset_us: i64,
    /// The offset a backward step returns to when it ends.
    offset_before_back_us: i64,
    /// No store time of this schedule is below this, or above `store_max_us`, so far: a step
    /// goes past them, so no store time is read twice (the checker could not place it).
    store_min_us: i64,
    store_max_us: i64,
    /// The processes run slow or fast, and their rates.
    clock_rates: Value,
    /// The standby a failover promoted in place of the run's cluster (the store from then on).
    promoted: Option<Arc<PgCluster>>,
    /// During a failover: the synchronous standby waiting to be promoted.
    standby: Option<PgCluster>,
    /// The schedule's database name.
    database: String,
    /// A schedule fails over at most once (a failover takes a base backup: seconds).
    failed_over: bool,
    /// The durability probes ([`crate::faultprobe`]), and the one whose crash is on.
    prober: Prober,
    probe_pending: Option<FollowUp>,
}

/// One fault being applied.
#[derive(Debug, Clone)]
struct Fault {
    kind: &'static str,
    target: usize,
    /// Where a proxy fault applies: 0 gateway-Postgres, 1 leader-Postgres, 2 gateway-upstream.
    link: usize,
    started_us: i64,
    ends: Instant,
}

/// Runs `config.schedules` schedules on `cluster`, writing each history into its folder.
/// Calls `check` with each schedule's folder as soon as it is written; stops early when it
/// returns true (a violation was found).
pub async fn run(
    cluster: &PgCluster,
    config: &SuiteConfig,
    mut check: impl FnMut(&Path) -> Result<bool>,
) -> Result<usize> {
    std::fs::create_dir_all(&config.out).with_context(|| format!("create {}", config.out.display()))?;
    // After a failover the promoted standby is the store, for the rest of the run.
    let mut promoted: Option<Arc<PgCluster>> = None;
    for index in 0..config.schedules {
        let seed = config.seed.wrapping_add(index as u64);
        let dir = config.out.join(format!("schedule-{index:04}"));
        std::fs::create_dir_all(&dir)?;
        promoted = run_schedule(cluster, promoted, config, index, seed, &dir)
            .await
            .with_context(|| format!("schedule {index} (seed {seed})"))?;
        if check(&dir)? {
            return Ok(index + 1);
        }
    }
    Ok(config.schedules)
}

async fn admin_client(cluster: &PgCluster, database: &str) -> Result<tokio_postgres::Client> {
    store_client(cluster, &cluster.url(database)).await
}

/// A client at `url` on `cluster`, each try bounded (2 s), for 10 s; then the server is cut off
/// and started again, and tried for 10 s more. Seen once: a backend under libfaketime aborted
/// in malloc, and after the server's own restart every new backend hung in authentication, so
/// an unbounded connect hung the run.
async fn store_client(cluster: &PgCluster, url: &str) -> Result<tokio_postgres::Client> {
    for round in 0..2 {
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until {
            if let Ok(Ok(client)) = tokio::time::timeout(Duration::from_secs(2), try_connect(url)).await {
                return Ok(client);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if round == 0 {
            eprintln!("fault suite: no connection to the store within 10 s: power cut and restart");
            tokio::task::block_in_place(|| {
                let _ = cluster.power_cut();
                cluster.start_server()
            })?;
        }
    }
    bail!("cannot connect to the store at {url}")
}

async fn prepare_database(cluster: &PgCluster, config: &SuiteConfig, name: &str) -> Result<String> {
    let admin = admin_client(cluster, "postgres").await?;
    // Earlier schedules' databases are done with (their histories are files): dropped, so that a
    // failover's base backup copies one schedule, not the whole run.
    for row in admin.query(r"SELECT datname FROM pg_database WHERE datname LIKE 'schedule\_%'", &[]).await? {
        let old: String = row.try_get(0)?;
        admin.batch_execute(&format!("DROP DATABASE IF EXISTS {old} WITH (FORCE)")).await?;
    }
    admin.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).await?;
    admin.batch_execute(&format!("CREATE DATABASE {name}")).await?;
    let url = cluster.url(name);
    let mut client = store_client(cluster, &url).await?;
    fencing_schema::migrate(&mut client).await.map_err(|e| anyhow!("migrate: {e}"))?;
    client
        .batch_execute(
            "CREATE TABLE fault_tickets (id int PRIMARY KEY, n bigint NOT NULL);
             INSERT INTO fault_tickets VALUES (1, 0);
             CREATE TABLE ledger_k1 (request_id text PRIMARY KEY, resource text NOT NULL, term bigint, ticket bigint);
             CREATE TABLE ledger_k2 (request_id text PRIMARY KEY, resource text NOT NULL, term bigint, ticket bigint);
             CREATE TABLE race_ledger (request_id text PRIMARY KEY, resource text NOT NULL, term bigint, ticket bigint);
             SELECT fencing.protect('ledger_k1', 'ledger-k1');
             SELECT fencing.protect('ledger_k2', 'ledger-k2');
             SELECT fencing.bind('ledger-k1', 'k1');
             SELECT fencing.bind('ledger-k2', 'k2');
             SELECT fencing.create_stream('log-k1', 'k1');",
        )
        .await?;
    if let Some(plant) = config.plant {
        client.batch_execute(&plant_sql(plant)?).await.with_context(|| format!("plant {}", plant.name()))?;
    }
    // Everything so far on disk, so a crash in the schedule loses only what it ought to keep.
    client.batch_execute("CHECKPOINT").await?;
    Ok(url)
}

/// Renames today's `fencing.gate` and puts a wrapper in its place that runs `tweak` (plpgsql
/// statements on `decision`, the real decision) before returning it.
fn wrap_gate(tweak: &str) -> String {
    wrap_gate_asking("grant_for", tweak)
}

/// [`wrap_gate`], the real gate asked for the grant `grant_for` (an SQL expression).
fn wrap_gate_asking(grant_for: &str, tweak: &str) -> String {
    format!(
        "ALTER FUNCTION fencing.gate(text, bigint, interval, text, interval) RENAME TO gate_planted;
         CREATE FUNCTION fencing.gate(resource text, term bigint, forward_timeout interval, bind_lease text DEFAULT NULL,
                                      grant_for interval DEFAULT interval '0')
         RETURNS fencing.gate_result LANGUAGE plpgsql AS $$
         DECLARE decision fencing.gate_result;
         BEGIN
             decision := fencing.gate_planted(resource, term, forward_timeout, bind_lease, {grant_for});
             {tweak}
             RETURN decision;
         END $$;"
    )
}

/// The planted wall-clock waits: today's grant functions (`schema/functions/grants.sql`), their
/// waits made comparisons of the store's clock with when each resource's grants end by it, as
/// the code before schema version 8 did; the table of those ends comes first.
fn wall_clock_waits(grants: &str) -> Result<String> {
    let replacements = [
        (
            "CREATE OR REPLACE FUNCTION fencing.await_grants(fence_ fencing.fences) RETURNS void\nLANGUAGE plpgsql VOLATILE AS $$\nBEGIN",
            "CREATE OR REPLACE FUNCTION fencing.await_grants(fence_ fencing.fences) RETURNS void\nLANGUAGE plpgsql VOLATILE AS $$\nDECLARE ends_at_ timestamptz;\nBEGIN",
        ),
        (
            "    PERFORM fencing.sleep_ms(fence_.grant_ms);",
            "    SELECT p.ends_at INTO ends_at_ FROM fencing.planted_grant_ends p WHERE p.resource = fence_.resource;
    WHILE ends_at_ IS NOT NULL AND clock_timestamp() < ends_at_ LOOP
        PERFORM pg_sleep(0.005);
    END LOOP;",
        ),
        (
            "    RETURN coalesce((SELECT max(f.grant_ms) FROM fencing.fences f",
            "    RETURN coalesce((SELECT greatest(0, max(ceil(extract(epoch FROM p.ends_at - clock_timestamp()) * 1000)))::bigint
                       FROM fencing.fences f JOIN fencing.planted_grant_ends p ON p.resource = f.resource",
        ),
    ];
    let mut planted = grants.to_owned();
    for (today, instead) in replacements {
        if !planted.contains(today) {
            bail!("the grant functions no longer say {today:?}: update the planted bug");
        }
        planted = planted.replacen(today, instead, 1);
    }
    Ok(format!(
        "CREATE TABLE fencing.planted_grant_ends (resource text PRIMARY KEY, ends_at timestamptz NOT NULL);\n{planted}"
    ))
}

/// The planted wall-clock waits' record of each grant's end, by the store's clock.
const WALL_CLOCK_GRANT: &str = "
    IF decision.grant_ms > 0 THEN
        INSERT INTO fencing.planted_grant_ends AS p
        VALUES (resource, clock_timestamp() + decision.grant_ms * interval '1 millisecond')
        ON CONFLICT ON CONSTRAINT planted_grant_ends_pkey DO UPDATE SET ends_at = greatest(p.ends_at, excluded.ends_at);
    END IF;";

/// The SQL that plants `plant` in a migrated database.
pub fn plant_sql(plant: Plant) -> Result<String> {
    let function = |name: &str| {
        fencing_schema::FUNCTIONS
            .iter()
            .find(|f| f.name == name)
            .map(|f| f.sql.to_owned())
            .ok_or_else(|| anyhow!("no function file {name}"))
    };
    Ok(match plant {
        Plant::WeakFence => wrap_gate(
            "IF decision.outcome = 'stale' THEN decision.admitted := true; decision.outcome := 'admitted'; decision.wait_ms := 0; END IF;",
        ),
        Plant::NoSettle => wrap_gate("decision.wait_ms := 0;"),
        Plant::GrantIgnored => "CREATE OR REPLACE FUNCTION fencing.await_grants(fence_ fencing.fences)
             RETURNS void LANGUAGE plpgsql AS $$ BEGIN END $$;"
            .to_owned(),
        // The store records a quarter of the grant it gives: a term change waits too little.
        Plant::GrantOverstay => wrap_gate_asking("grant_for / 4", "decision.grant_ms := decision.grant_ms * 4;"),
        Plant::WallClockWaits => wall_clock_waits(&function("grants")?)? + &wrap_gate(WALL_CLOCK_GRANT),
        Plant::AsyncCommit => "CREATE OR REPLACE FUNCTION fencing.commit_durably() RETURNS void
             LANGUAGE plpgsql AS $$ BEGIN END $$;"
            .to_owned(),
        Plant::NoNewTerm => {
            let acquire = function("acquire")?;
            let planted = acquire.replace("l.term + 1", "l.term");
            if planted == acquire {
                bail!("the acquire function no longer says `l.term + 1`: update the planted bug");
            }
            planted
        }
        Plant::ElectorMarginAdded | Plant::ElectorDeadlineIgnored | Plant::UpstreamGracefulClose => String::new(),
        Plant::LogUnfenced => remove_block(
            &function("log")?,
            "    PERFORM fencing.admit(fencing.log_resource(p_stream), p_term);\n",
            "append's fence",
        )?,
        Plant::RenewAnyOwner => remove_block(
            &function("renew")?,
            "    IF row_.owner <> p_owner THEN
        RETURN (false, row_.owner, row_.term, row_.expires_at,
                fencing.remaining_ms(row_.expires_at, now_), 0, false)::fencing.lease_result;
    END IF;
",
            "renewal's owner check",
        )?,
        Plant::RenewExpired => remove_block(
            &function("renew")?,
            "    IF row_.expires_at <= now_ THEN
        RETURN (false, NULL, row_.term, row_.expires_at, 0, 0, false)::fencing.lease_result;
    END IF;
",
            "renewal's expiry check",
        )?,
        Plant::AcquireKeepsPeriod => {
            let acquire = function("acquire")?;
            let planted = acquire.replace("AND NOT coalesce(new_period, false) THEN", "THEN");
            if planted == acquire {
                bail!("the acquire function no longer checks `new_period` as it did: update the planted bug");
            }
            planted
        }
        Plant::StampAnyOwner => {
            remove_block(&function("gate_lease")?, "lease_.owner <> p_owner OR ", "stamp's owner check")?
        }
        Plant::FutureTerm => wrap_gate(
            "IF decision.outcome = 'future_term' THEN decision.admitted := true; decision.outcome := 'admitted'; decision.wait_ms := 0; END IF;",
        ),
        Plant::GateAsyncCommit => {
            let gate = function("gate")?;
            let planted = gate.replace("PERFORM fencing.commit_durably();", "NULL;");
            if planted == gate {
                bail!("the gate function no longer calls fencing.commit_durably: update the planted bug");
            }
            planted
        }
        Plant::AdmitAsyncCommit => {
            let try_admit = function("try_admit")?;
            let planted = try_admit.replace("PERFORM fencing.commit_durably();", "NULL;");
            if planted == try_admit {
                bail!("fencing.try_admit no longer calls fencing.commit_durably: update the planted bug");
            }
            planted
        }
        Plant::AdvanceAsyncCommit => remove_block(
            &function("advance_fence")?,
            "    PERFORM fencing.commit_durably();\n",
            "advance_fence's durable commit",
        )?,
        // The first call in the file is fencing.bind's (fencing.rebind's comes after).
        Plant::BindAsyncCommit => {
            remove_block(&function("bind")?, "    PERFORM fencing.commit_durably();\n", "bind's durable commit")?
        }
        Plant::SqlRaiseSkipsSettle => {
            let try_admit = function("try_admit")?;
            let planted =
                try_admit.replace("settle_ms = fencing.next_settle(fence_), settle_id", "settle_ms = NULL, settle_id");
            if planted == try_admit {
                bail!("fencing.try_admit no longer records the new term's settle as it did: update the planted bug");
            }
            planted
        }
        Plant::RebindAsyncCommit => {
            let bind = function("bind")?;
            let at = bind
                .find("CREATE OR REPLACE FUNCTION fencing.rebind")
                .ok_or_else(|| anyhow!("the bind file no longer defines fencing.rebind: update the planted bug"))?;
            let (before, rebind) = bind.split_at(at);
            format!(
                "{before}{}",
                remove_block(rebind, "    PERFORM fencing.commit_durably();\n", "rebind's durable commit")?
            )
        }
        Plant::GateRace => {
            // A raise that decides on two versions of the fence row: the one it read, and the
            // one it locked, whose maximum it no longer checks (a concurrent higher term that
            // committed in between is overwritten by this lower one).
            let gate = function("gate")?;
            let checked = "        IF NOT FOUND OR fence_.max_term >= p_term
           OR fence_.lease_key IS DISTINCT FROM coalesce(bind_lease, fence_.lease_key) THEN
            CONTINUE; -- changed since it was read: decide again on the newest version
        END IF;";
            let planted = gate.replace(checked, "        IF NOT FOUND THEN\n            CONTINUE;\n        END IF;");
            if planted == gate {
                bail!(
                    "the gate function's raise no longer checks the locked version as it did: update the planted bug"
                );
            }
            planted
        }
    })
}

/// `sql` without `block` (a check the planted bug leaves out), or an error when `sql` no longer
/// has it (`what` names it).
fn remove_block(sql: &str, block: &str, what: &str) -> Result<String> {
    if !sql.contains(block) {
        bail!("the {what} is no longer written as it was: update the planted bug");
    }
    Ok(sql.replacen(block, "", 1))
}

/// Gateways 0 and 1 hold grants, gateway 2 asks Postgres for every write: a term change through
/// any of them must wait for the others' grants.
pub const GRANT_MS: [u64; 3] = [400, 400, 0];

/// The gateway's log target for each forwarded write's deadline (enabled at trace level in
/// the suite's gateways, whose JSON log lines become `deadlines.jsonl`).
const DEADLINE_TARGET: &str = "fencing_gateway::forward_deadline";

fn gateway_config(config: &SuiteConfig, upstreams: &[SocketAddr], grant_ms: u64) -> String {
    let mut text = format!(
        "[upstream]\nforward_timeout_ms = {}\nconnect_timeout_ms = 500\n\
         [database]\nfence_check_timeout_ms = 1000\npool_size = 8\ngrant_ms = {grant_ms}\n\
         [shutdown]\ngrace_period_ms = 500\n",
        config.forward_timeout.as_millis()
    );
    for (index, key) in ["k1", "k2"].iter().enumerate() {
        let upstream = upstreams[index];
        let _ = write!(
            text,
            "[[routes]]\nprefix = \"/{key}\"\nupstream = \"http://{upstream}\"\nresource = {{ segment = 2 }}\nlease = \"{key}\"\n\
             [[routes]]\nprefix = \"/free{n}\"\nupstream = \"http://{upstream}\"\nresource = {{ segment = 2 }}\n",
            n = index + 1
        );
    }
    text
}

/// For a whole schedule, perhaps one process of three whose clocks (wall, monotonic and boot)
/// run at half or twice the rate of real time: its index and the rate. Such a leader's elector
/// sees its clock disagree with the store's and must never lead; were it to lead, its writes
/// are the zombie writes the fences refuse. Such a gateway must admit nothing: its waits and
/// deadlines, counted on its own clock, would not be the store's lengths.
fn draw_clock_rate(rng: &mut StdRng) -> Option<(usize, f64)> {
    if !rng.random_bool(1.0 / 3.0) {
        return None;
    }
    let process = rng.random_range(0..3);
    Some((process, if rng.random_bool(0.5) { 0.5 } else { 2.0 }))
}

/// The `env` words that run a process under libfaketime at `rate` (sleeps and timeouts scaled
/// too), telling it the rate so that it can record real time in the history.
fn clock_rate_env(rate: f64) -> Result<Vec<String>> {
    let library = crate::pg::faketime_library()?;
    Ok(vec![
        format!("LD_PRELOAD={}", library.display()),
        format!("FAKETIME=+0 x{rate}"),
        format!("FENCING_FAULT_CLOCK_RATE={rate}"),
    ])
}

async fn wait_listening(port: u16, within: Duration) -> bool {
    let until = Instant::now() + within;
    while Instant::now() < until {
        if tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// Runs one schedule on the store (`promoted`, else `original`); returns the store for the next
/// one (a failover in this schedule promoted a standby in place of the store).
async fn run_schedule(
    original: &PgCluster,
    promoted: Option<Arc<PgCluster>>,
    config: &SuiteConfig,
    index: usize,
    seed: u64,
    dir: &Path,
) -> Result<Option<Arc<PgCluster>>> {
    let current = promoted.clone();
    let cluster = current.as_deref().unwrap_or(original);
    let mut rng = StdRng::seed_from_u64(seed);
    let name = format!("schedule_{index}");
    // The store's clock reads real time unless a fault of this schedule steps it.
    cluster.set_clock_offset(0)?;
    // A leader may run slow or fast for the whole schedule, and so may a gateway: one whose
    // clock disagrees with the store's must admit nothing (docs/CONTRACT.md, Clocks), or its
    // grants, settle waits and forward deadlines would let zombie writes through (S3, S5). The
    // gateway's draw comes from a generator of its own, so the rest of a seed's schedule is as
    // it was before gateways ran slow or fast.
    let leader_rate = draw_clock_rate(&mut rng);
    let gateway_rate = draw_clock_rate(&mut StdRng::seed_from_u64(seed ^ 0x6a7e_c10c));
    let mut clock_rates = serde_json::Map::new();
    let url = prepare_database(cluster, config, &name).await?;
    let pg_addr: SocketAddr = format!("127.0.0.1:{}", cluster.port()).parse()?;

    // Upstreams; each gateway reaches each upstream through a proxy of its own, so one
    // gateway's link can be slow while another's is not.
    let mut upstreams = Vec::new();
    let mut upstream_ports = Vec::new();
    for (name, checking) in [("checking", true), ("applying", false)] {
        let port = free_port()?;
        let mut command = vec![
            workspace_bin("fault-upstream")?.display().to_string(),
            "--name".to_owned(),
            name.to_owned(),
            "--listen".to_owned(),
            format!("127.0.0.1:{port}"),
            "--log".to_owned(),
            dir.join(format!("upstream-{name}.jsonl")).display().to_string(),
        ];
        if checking {
            command.push("--checking".to_owned());
        }
        let mut managed =
            Managed { name: format!("upstream-{name}"), command, child: None, paused: false, stderr: None };
        managed.spawn()?;
        if !wait_listening(port, Duration::from_secs(10)).await {
            bail!("upstream {name} did not listen");
        }
        upstream_ports.push(port);
        upstreams.push(managed);
    }
    let mut upstream_proxies = Vec::new();
    let mut config_paths = Vec::new();
    for (gateway, grant_ms) in GRANT_MS.into_iter().enumerate() {
        let mut addrs = Vec::new();
        for port in &upstream_ports {
            let proxy = FaultProxy::start_with(format!("127.0.0.1:{port}").parse()?, OnClose::Deliver).await?;
            addrs.push(proxy.addr());
            upstream_proxies.push(proxy);
        }
        let config_path = dir.join(format!("gateway-{gateway}.toml"));
        std::fs::write(&config_path, gateway_config(config, &addrs, grant_ms))?;
        config_paths.push(config_path);
    }

    // Gateways, each reaching Postgres through a proxy of its own.
    let mut gateways = Vec::new();
    let mut gateway_ports = Vec::new();
    let mut control_ports = Vec::new();
    let mut gateway_pg = Vec::new();
    for (gateway, config_path) in config_paths.iter().enumerate() {
        let proxy = FaultProxy::start(pg_addr).await?;
        let database_url = format!("postgres://{}@{}/{name}", crate::pg::SUPERUSER, proxy.addr());
        // A port found free may be taken before the gateway binds it: then new ports.
        let mut started = None;
        for _ in 0..3 {
            let (proxy_port, control_port) = (free_port()?, free_port()?);
            let mut command = vec!["env".to_owned()];
            if let Some((_, rate)) = gateway_rate.filter(|(off, _)| *off == gateway) {
                command.extend(clock_rate_env(rate)?);
                clock_rates.insert(format!("gateway-{gateway}"), json!(rate));
            }
            // A planted bug of the gateway: its failpoint, in every gateway.
            if let Some(failpoint) = config.plant.and_then(Plant::gateway_failpoint) {
                command.push(format!("FAILPOINTS={failpoint}"));
            }
            command.extend([
                // Each forwarded write's deadline, for the history (`deadlines.jsonl`).
                "FENCING_LOG_FORMAT=json".to_owned(),
                format!("RUST_LOG=error,{DEADLINE_TARGET}=trace"),
                format!("FENCING_DATABASE_URL={database_url}"),
                format!("FENCING_PROXY_LISTEN=127.0.0.1:{proxy_port}"),
                format!("FENCING_CONTROL_LISTEN=127.0.0.1:{control_port}"),
                // The histories pair each write with its arrival by the writer's request id.
                "FENCING_PROXY_CLIENT_REQUEST_IDS=true".to_owned(),
                workspace_bin("fencing-gateway")?.display().to_string(),
                "serve".to_owned(),
                "--config".to_owned(),
                config_path.display().to_string(),
            ]);
            let mut managed = Managed {
                name: format!("gateway-{gateway}"),
                command,
                child: None,
                paused: false,
                stderr: Some(dir.join(format!("gateway-{gateway}.log"))),
            };
            managed.spawn()?;
            if wait_listening(proxy_port, Duration::from_secs(20)).await {
                started = Some((managed, proxy_port, control_port));
                break;
            }
            managed.kill_now().await;
        }
        let (managed, proxy_port, control_port) =
            started.ok_or_else(|| anyhow!("gateway-{gateway} did not listen in 3 tries"))?;
        gateway_pg.push(proxy);
        gateway_ports.push(proxy_port);
        control_ports.push(control_port);
        gateways.push(managed);
    }

    // Leaders, each reaching Postgres through a proxy of its own.
    let gateway_list = gateway_ports.iter().map(|port| format!("127.0.0.1:{port}")).collect::<Vec<_>>().join(",");
    let mut leaders = Vec::new();
    let mut leader_pg = Vec::new();
    for (leader, letter) in ["a", "b", "c"].iter().enumerate() {
        let proxy = FaultProxy::start(pg_addr).await?;
        let database_url = format!("postgres://{}@{}/{name}", crate::pg::SUPERUSER, proxy.addr());
        let mut command = vec!["env".to_owned()];
        if let Some((_, rate)) = leader_rate.filter(|(slow, _)| *slow == leader) {
            command.extend(clock_rate_env(rate)?);
            clock_rates.insert(format!("leader-{letter}"), json!(rate));
        }
        // A planted bug of the election library: its failpoint, in every leader.
        if let Some(failpoint) = config.plant.and_then(Plant::leader_failpoint) {
            command.push(format!("FAILPOINTS={failpoint}"));
        }
        command.extend([
            workspace_bin("fault-leader")?.display().to_string(),
            "--name".to_owned(),
            format!("leader-{letter}"),
            "--database-url".to_owned(),
            database_url,
            "--gateways".to_owned(),
            gateway_list.clone(),
            "--log".to_owned(),
            dir.join(format!("client-{letter}.jsonl")).display().to_string(),
            "--elections".to_owned(),
            dir.join(format!("elections-{letter}.jsonl")).display().to_string(),
            "--acts".to_owned(),
            dir.join(format!("acts-{letter}.jsonl")).display().to_string(),
            "--appends".to_owned(),
            dir.join(format!("appends-{letter}.jsonl")).display().to_string(),
            "--seed".to_owned(),
            (seed ^ ((leader as u64 + 1) * 0x9e37_79b9)).to_string(),
            "--ttl-ms".to_owned(),
            config.ttl.as_millis().to_string(),
        ]);
        let mut managed =
            Managed { name: format!("leader-{letter}"), command, child: None, paused: false, stderr: None };
        managed.spawn()?;
        leader_pg.push(proxy);
        leaders.push(managed);
    }

    // Two followers of the fenced log `log-k1`, each reaching Postgres through a proxy of its own.
    let mut followers = Vec::new();
    let mut follower_pg = Vec::new();
    for n in 1..=2 {
        let proxy = FaultProxy::start(pg_addr).await?;
        let command = vec![
            workspace_bin("fault-follower")?.display().to_string(),
            "--name".to_owned(),
            format!("follower-{n}"),
            "--database-url".to_owned(),
            format!("postgres://{}@{}/{name}", crate::pg::SUPERUSER, proxy.addr()),
            "--stream".to_owned(),
            "log-k1".to_owned(),
            "--log".to_owned(),
            dir.join(format!("follower-{n}.jsonl")).display().to_string(),
        ];
        let mut managed = Managed { name: format!("follower-{n}"), command, child: None, paused: false, stderr: None };
        managed.spawn()?;
        follower_pg.push(proxy);
        followers.push(managed);
    }

    // The racer: adjacent terms at one instant on unbound resources of its own.
    let racer_pg = FaultProxy::start(pg_addr).await?;
    let racer_command = vec![
        workspace_bin("fault-racer")?.display().to_string(),
        "--database-url".to_owned(),
        format!("postgres://{}@{}/{name}", crate::pg::SUPERUSER, racer_pg.addr()),
        "--gateways".to_owned(),
        gateway_list.clone(),
        "--log".to_owned(),
        dir.join("client-racer.jsonl").display().to_string(),
        "--seed".to_owned(),
        (seed ^ 0x5eed_7ace).to_string(),
        "--forward-timeout-ms".to_owned(),
        config.forward_timeout.as_millis().to_string(),
    ];
    let mut racer =
        Managed { name: "racer".to_owned(), command: racer_command, child: None, paused: false, stderr: None };
    racer.spawn()?;

    // Two leaders of `k3` through the HTTP lease API, late on purpose now and then.
    let control_list = control_ports.iter().map(|port| format!("127.0.0.1:{port}")).collect::<Vec<_>>().join(",");
    let mut lease_clients = Vec::new();
    for (n, letter) in ["x", "y"].iter().enumerate() {
        let command = vec![
            workspace_bin("fault-lease-client")?.display().to_string(),
            "--name".to_owned(),
            format!("lease-{letter}"),
            "--controls".to_owned(),
            control_list.clone(),
            "--key".to_owned(),
            "k3".to_owned(),
            "--log".to_owned(),
            dir.join(format!("lease-calls-{letter}.jsonl")).display().to_string(),
            "--seed".to_owned(),
            (seed ^ ((n as u64 + 7) * 0x85eb_ca6b)).to_string(),
            "--ttl-ms".to_owned(),
            config.ttl.as_millis().to_string(),
        ];
        let mut managed =
            Managed { name: format!("lease-{letter}"), command, child: None, paused: false, stderr: None };
        managed.spawn()?;
        lease_clients.push(managed);
    }

    let mut schedule = Schedule {
        index,
        seed,
        dir: dir.to_owned(),
        url,
        gateways,
        control_ports: control_ports.clone(),
        ttl: config.ttl,
        forward_timeout: config.forward_timeout,
        leaders,
        followers,
        follower_pg,
        racer,
        lease_clients,
        upstreams,
        gateway_pg,
        leader_pg,
        racer_pg,
        upstream_proxies,
        faults: Vec::new(),
        clock_steps: Vec::new(),
        clock_offset_us: 0,
        offset_before_back_us: 0,
        // The checker takes the store to have read real time from 30 s before the schedule.
        store_min_us: now_us() - 35_000_000,
        store_max_us: now_us(),
        clock_rates: Value::Object(clock_rates),
        promoted,
        standby: None,
        database: name.clone(),
        failed_over: false,
        prober: Prober::new(
            dir,
            gateway_ports.iter().map(|port| SocketAddr::from(([127, 0, 0, 1], *port))).collect(),
            index,
        )?,
        probe_pending: None,
    };
    // The gateways admit nothing until they trust the store's clock (docs/CONTRACT.md, Clocks):
    // faults on a system that has not yet admitted a write test nothing, so the schedule begins
    // once every gateway with a clock of the store's rate is ready (bounded: one that never
    // becomes ready is the schedule's to show, by writes refused).
    let ready_until = Instant::now() + READY_BOUND;
    for (gateway, port) in control_ports.iter().enumerate() {
        if gateway_rate.is_some_and(|(off, _)| off == gateway) {
            continue;
        }
        while Instant::now() < ready_until && !ready(*port).await {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let started_us = now_us();
    // Let leaders be elected and write before the first fault: both keys led, then a few
    // hundred milliseconds of writes (at most a ttl in all: a fault may come before an election).
    let warm_until = Instant::now() + config.ttl;
    while Instant::now() < warm_until && !both_keys_elected(dir) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(WARM_WRITES.min(warm_until.saturating_duration_since(Instant::now()))).await;
    let quiet_from_us = schedule.inject(original, config, &mut rng).await?;
    // Writes must flow again: wait for them (bounded by the recovery bound), then a little more.
    let bound = config.ttl * 2 + Duration::from_secs(5);
    let until = Instant::now() + bound;
    while Instant::now() < until {
        if first_ok_after(dir, quiet_from_us).is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The followers keep up: after the last fault, each reaches the log's head (bounded).
    let store = schedule.promoted.clone();
    schedule.followers_catch_up(store.as_deref().unwrap_or(original)).await?;
    let ended_us = now_us();
    schedule.stop().await;
    let store = schedule.promoted.clone();
    schedule.record(store.as_deref().unwrap_or(original), config, started_us, quiet_from_us, ended_us).await?;
    // A gateway whose clocks ran slow or fast must have admitted nothing at all: not only no
    // violation the checker could see, none of its writes answered ok.
    if let Some((gateway, rate)) = gateway_rate {
        let admitted = admitted_through(dir, gateway)?;
        if admitted > 0 {
            bail!(
                "schedule {index}: gateway-{gateway}, whose clocks ran at x{rate}, admitted {admitted} writes: a \
                 gateway whose clock disagrees with the store's must admit nothing"
            );
        }
    }
    Ok(schedule.promoted.take())
}

/// How long leaders write after both keys are first led, before the first fault.
const WARM_WRITES: Duration = Duration::from_millis(300);

/// How long a schedule waits for its gateways to be ready before its faults begin.
const READY_BOUND: Duration = Duration::from_secs(10);

/// Whether the gateway whose control listener is on `port` answers `/readyz` with 200 (within
/// half a second).
async fn ready(port: u16) -> bool {
    let ask = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        stream.write_all(b"GET /readyz HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n").await?;
        let mut head = [0_u8; 12];
        stream.read_exact(&mut head).await?;
        Ok::<_, std::io::Error>(head.starts_with(b"HTTP/1.1 200"))
    };
    matches!(tokio::time::timeout(Duration::from_millis(500), ask).await, Ok(Ok(true)))
}

/// Whether the leaders' own records (`elections-<letter>.jsonl`, written as they go) show both
/// `k1` and `k2` elected.
fn both_keys_elected(dir: &Path) -> bool {
    let mut led = [false, false];
    for letter in ["a", "b", "c"] {
        let Ok(text) = std::fs::read_to_string(dir.join(format!("elections-{letter}.jsonl"))) else { continue };
        for line in text.lines() {
            let Ok(value) = serde_json::from_str::<Value>(line) else { continue };
            if value["event"] != "elected" {
                continue;
            }
            match value["key"].as_str() {
                Some("k1") => led[0] = true,
                Some("k2") => led[1] = true,
                _ => {}
            }
        }
    }
    led == [true, true]
}

/// How many writes the clients saw answered ok through gateway `gateway` (in the recorded
/// history, `clients.jsonl`).
fn admitted_through(dir: &Path, gateway: usize) -> Result<usize> {
    let text = std::fs::read_to_string(dir.join("clients.jsonl")).context("read clients.jsonl")?;
    Ok(text
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|write| {
            write["path"] == "gateway" && write["gateway"].as_u64() == Some(gateway as u64) && write["outcome"] == "ok"
        })
        .count())
}

/// When writes that need a leader (to a bound resource) have flowed again after `after_us` on
/// both paths, through a gateway and into the table: the later of the two first ok completions
/// (the checker's recovery rule), if both came.
fn first_ok_after(dir: &Path, after_us: i64) -> Option<i64> {
    let (mut gateway, mut sql): (Option<i64>, Option<i64>) = (None, None);
    for letter in ["a", "b", "c"] {
        let Ok(text) = std::fs::read_to_string(dir.join(format!("client-{letter}.jsonl"))) else { continue };
        for line in text.lines() {
            let Ok(value) = serde_json::from_str::<Value>(line) else { continue };
            if value["outcome"] != "ok" || value["bound"] != true {
                continue;
            }
            let Some(done) = value["completed_us"].as_i64().filter(|&done| done > after_us) else { continue };
            let first = if value["path"] == "sql" { &mut sql } else { &mut gateway };
            *first = Some(first.map_or(done, |f| f.min(done)));
        }
    }
    Some(gateway?.max(sql?))
}

impl Schedule {
    /// Runs the fault phase; returns when the last fault ended.
    async fn inject(&mut self, original: &PgCluster, config: &SuiteConfig, rng: &mut StdRng) -> Result<i64> {
        let phase_end = Instant::now() + Duration::from_secs(config.seconds);
        let mut active: Vec<Fault> = Vec::new();
        let mut next_fault = Instant::now();
        let mut last_end_us = now_us();
        // Once a schedule, in its first half, a crash of Postgres right after a fence-moving
        // action (every deciding path must be durable, not only a lease's new term:
        // `crate::faultprobe`), on the path the seed names: consecutive seeds take turns, so any
        // five schedules in a row probe every path. Its time is drawn from a generator of its
        // own, so that a seed's other faults stay what they were.
        let mut raise_rng = StdRng::seed_from_u64(self.seed ^ 0x7a15_e0c8);
        let phase_ms = config.seconds.saturating_mul(1000).max(2000);
        let turn = config
            .probe
            .unwrap_or(ProbePath::ALL[usize::try_from(self.seed % ProbePath::ALL.len() as u64).unwrap_or(0)]);
        let mut crashes_after_raise =
            vec![(Instant::now() + Duration::from_millis(raise_rng.random_range(300..phase_ms / 2)), turn)];
        loop {
            // The store changes when a failover ends.
            let current = self.promoted.clone();
            let cluster = current.as_deref().unwrap_or(original);
            let now = Instant::now();
            // End the faults whose time is up.
            let (ended, still): (Vec<Fault>, Vec<Fault>) = active.into_iter().partition(|f| f.ends <= now);
            active = still;
            let any_ended = !ended.is_empty();
            for fault in ended {
                self.end(cluster, &fault).await?;
                last_end_us = now_us();
            }
            // An ended failover changed the store: nothing more on the old one in this round.
            if any_ended && self.promoted.as_ref().map(Arc::as_ptr) != current.as_ref().map(Arc::as_ptr) {
                continue;
            }
            if now >= phase_end {
                if active.is_empty() {
                    return Ok(last_end_us);
                }
            } else if crashes_after_raise.first().is_some_and(|(at, _)| now >= *at)
                // Not during a hold of a gateway's upstream links either: the probe pauses the
                // gateways, and one paused across its deadlines need not abort its writes.
                && !active.iter().any(|f| {
                    f.kind.starts_with("pg-crash") || f.kind == "pg-failover" || f.kind == "proxy-hold-upstream"
                })
            {
                let (_, path) = crashes_after_raise.remove(0);
                let started_us = now_us();
                self.crash_after_probe(cluster, path, &mut raise_rng).await?;
                let lasting = Duration::from_millis(raise_rng.random_range(100..400));
                active.push(Fault {
                    kind: path.fault_kind(),
                    target: 0,
                    link: usize::MAX,
                    started_us,
                    ends: Instant::now() + lasting,
                });
            } else if now >= next_fault && active.len() < 2 {
                if let Some(fault) = self.begin(cluster, rng, &active).await? {
                    active.push(fault);
                }
                next_fault = now + Duration::from_millis(rng.random_range(200..700));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn begin(&mut self, cluster: &PgCluster, rng: &mut StdRng, active: &[Fault]) -> Result<Option<Fault>> {
        // Leaders are paused, killed and resign more often than the rest: term changes are
        // where fencing works. Links to the upstreams are delayed often: that is where a term
        // change meets writes still in flight (S5).
        // A crash right after a grant, and a failover, need a moment with no other fault: they are
        // drawn often (a failover at most once a schedule: its base backup takes a second or two).
        // The store's clock is stepped forward more often than back: a forward step is what ends
        // a wait on the wall clock early. The faults that end a current leader's period while the
        // store may still hold it (paused past its ttl, its connections reset) come often too:
        // what the leader does next is where S2 and S7 are decided. A gateway's links to the
        // upstreams stalled past its forward deadlines (`proxy-hold-upstream`) is where a write
        // must be aborted, not left to the kernel (S5).
        const KINDS: [&str; 44] = [
            "pg-failover",
            "pg-failover",
            "pg-failover",
            "pg-clock-forward",
            "pg-clock-forward",
            "pg-clock-forward",
            "pg-clock-forward",
            "pg-clock-forward",
            "pg-clock-back",
            "pg-crash-after-grant",
            "pg-crash-after-grant",
            "pg-crash-after-grant",
            "pg-crash-after-grant",
            "sigstop-gateway",
            "sigstop-gateway-inflight",
            "sigstop-gateway-inflight",
            "sigstop-leader",
            "sigstop-leader",
            "sigstop-leader",
            "sigstop-leader-past-ttl",
            "sigstop-leader-past-ttl",
            "sigstop-leader-past-ttl",
            "sigkill-leader",
            "sigkill-leader",
            "leader-resign",
            "sigkill-gateway",
            "sigkill-upstream",
            "pg-crash",
            "proxy-delay",
            "proxy-delay",
            "proxy-delay",
            "proxy-hold",
            "proxy-hold-upstream",
            "proxy-hold-upstream",
            "proxy-hold-upstream",
            "proxy-hold-upstream",
            "proxy-drop",
            "proxy-reset",
            "proxy-reset-leader",
            "proxy-reset-leader",
            "proxy-oneway",
            "leader-resign",
            "sigstop-follower",
            "sigkill-follower",
        ];
        let kind = KINDS[rng.random_range(0..KINDS.len())];
        let mut target = rng.random_range(0..3);
        // Faults on leaders hit a current leader more often than not: that is where fencing works.
        if kind.contains("leader") && rng.random_bool(0.7) {
            let leaders = self.current_leaders().await;
            if !leaders.is_empty() {
                target = leaders[rng.random_range(0..leaders.len())];
            }
        }
        let mut link = if kind == "proxy-delay" && rng.random_bool(0.7) { 2 } else { rng.random_range(0..3) };
        // So do faults on a leader's link to Postgres: a renewal that fails while the store still
        // holds the lease ends the period locally, and the next acquire must be a new period.
        // A reset of a current leader's connections (`proxy-reset-leader`: a pooler restarted, a
        // network blip) does that at once, and the leader acquires again within the ttl.
        // The classic zombie: a current leader paused past its lease's ttl (a long GC pause, a
        // stalled VM), which must find on waking that it no longer leads, before it acts.
        if kind == "sigstop-leader-past-ttl" {
            let leaders = self.current_leaders().await;
            if leaders.is_empty() {
                return Ok(None);
            }
            target = leaders[rng.random_range(0..leaders.len())];
        }
        if kind == "proxy-reset-leader" {
            let leaders = self.current_leaders().await;
            if leaders.is_empty() {
                return Ok(None);
            }
            target = leaders[rng.random_range(0..leaders.len())];
            link = 1;
        } else if kind.starts_with("proxy") && link == 1 && rng.random_bool(0.7) {
            let leaders = self.current_leaders().await;
            if !leaders.is_empty() {
                target = leaders[rng.random_range(0..leaders.len())];
            }
        }
        // A forward step of the store's clock comes with a slow link from a gateway with grants to
        // Postgres: that gateway sees the step late, and keeps admitting under its grants. It is
        // one that admits now (else it holds no grant): with none, another fault is drawn.
        if kind == "pg-clock-forward" {
            let ready_now = self.ready_gateways().await;
            if ready_now.is_empty() || active.iter().any(|f| f.kind.starts_with("pg-")) {
                return Ok(None);
            }
            target = ready_now[rng.random_range(0..ready_now.len())];
            link = 0;
        }
        // A gateway that admits now, its upstream links held past its forward timeout.
        if kind == "proxy-hold-upstream" {
            let ready_now = self.ready_gateways().await;
            if ready_now.is_empty() {
                return Ok(None);
            }
            target = ready_now[rng.random_range(0..ready_now.len())];
            link = 2;
        }
        let lasting = if kind == "sigstop-leader-past-ttl" {
            self.ttl + Duration::from_millis(rng.random_range(0..1000))
        } else if kind == "proxy-hold-upstream" {
            self.forward_timeout + Duration::from_millis(rng.random_range(200..1000))
        } else {
            Duration::from_millis(rng.random_range(300..2000))
        };
        // One fault per process or link at a time, and a Postgres crash alone; while the store
        // is down after a durability probe's crash, faults of processes and links go on (only
        // the store's own wait), so that the probes do not take the schedule's time from them.
        let crash = |kind: &str| kind.starts_with("pg-crash") || kind == "pg-failover";
        let probe = |kind: &str| ProbePath::ALL.iter().any(|path| path.fault_kind() == kind);
        if kind == "pg-failover" && self.failed_over {
            return Ok(None);
        }
        if active.iter().any(|f| crash(f.kind) && !probe(f.kind)) || (crash(kind) && !active.is_empty()) {
            return Ok(None);
        }
        if kind.starts_with("pg-") && active.iter().any(|f| probe(f.kind)) {
            return Ok(None);
        }
        if active.iter().any(|f| f.target == target && f.link == link) {
            return Ok(None);
        }
        // One follower fault at a time, on follower 0 or 1 (`target`).
        if kind.ends_with("-follower") {
            if active.iter().any(|f| f.kind.ends_with("-follower")) {
                return Ok(None);
            }
            target = rng.random_range(0..self.followers.len());
        }
        // A gateway paused across its forward deadlines cannot abort its writes (the contract's
        // timing assumption): its upstream links are not held meanwhile, and the other way round.
        let gateway_stalls = |kind: &str| kind.starts_with("sigstop-gateway") || kind == "proxy-hold-upstream";
        if gateway_stalls(kind) && active.iter().any(|f| f.target == target && gateway_stalls(f.kind)) {
            return Ok(None);
        }
        // One clock, one step at a time.
        if kind.starts_with("pg-clock") && active.iter().any(|f| f.kind.starts_with("pg-clock")) {
            return Ok(None);
        }
        // One fault at a time on a gateway's link to Postgres (each sets it back when it ends).
        let postgres_link = |kind: &str, target: usize, link: usize| {
            (kind == "sigstop-gateway-inflight"
                || kind == "pg-clock-forward"
                || (kind.starts_with("proxy") && link == 0))
                .then_some(target)
        };
        if let Some(gateway) = postgres_link(kind, target, link)
            && active.iter().any(|f| postgres_link(f.kind, f.target, f.link) == Some(gateway))
        {
            return Ok(None);
        }
        let started_us = now_us();
        match kind {
            "sigstop-gateway" => self.gateways[target].signal(Signal::SIGSTOP),
            "sigstop-gateway-inflight" => {
                // Slow the gateway's decisions, then pause it as they come back: likely between a
                // decision and its send.
                self.gateway_pg[target].set(Mode::Delay(Duration::from_millis(150)));
                tokio::time::sleep(Duration::from_millis(170)).await;
                self.gateways[target].signal(Signal::SIGSTOP);
            }
            "sigstop-leader" | "sigstop-leader-past-ttl" => self.leaders[target].signal(Signal::SIGSTOP),
            "sigkill-leader" => self.leaders[target].kill_now().await,
            "sigstop-follower" => self.followers[target].signal(Signal::SIGSTOP),
            "sigkill-follower" => self.followers[target].kill_now().await,
            "sigkill-gateway" => self.gateways[target].kill_now().await,
            "sigkill-upstream" => self.upstreams[target % 2].kill_now().await,
            "pg-crash" => tokio::task::block_in_place(|| cluster.crash())?,
            "pg-crash-after-grant" => target = self.crash_after_grant(cluster).await?,
            "pg-failover" => {
                if !self.begin_failover(cluster, rng).await? {
                    return Ok(None);
                }
            }
            "proxy-delay" => {
                let delay = Mode::Delay(Duration::from_millis(rng.random_range(50..300)));
                self.links(link, target).iter().for_each(|proxy| proxy.set(delay));
            }
            "proxy-hold" | "proxy-hold-upstream" => {
                self.links(link, target).iter().for_each(|proxy| proxy.set(Mode::Hold));
            }
            "proxy-drop" => self.links(link, target).iter().for_each(|proxy| proxy.drop_all()),
            "proxy-reset" | "proxy-reset-leader" => self.links(link, target).iter().for_each(|proxy| proxy.reset_all()),
            "proxy-oneway" => {
                let direction = if rng.random_bool(0.5) { Direction::ToTarget } else { Direction::FromTarget };
                self.links(link, target).iter().for_each(|proxy| proxy.set(Mode::OneWay(direction)));
            }
            "leader-resign" => self.leaders[target].terminate(Duration::from_secs(3)).await,
            // The store's clock never reads a time twice, nor one it stepped over (the checker
            // could not tell which reading a recorded time was): a forward step goes past every
            // store time so far and stays; a backward step goes below every one (by more than a
            // lease's ttl, and for at most 2 s), and comes back to where the clock was.
            "pg-clock-forward" => {
                // The clock-step probe's grant on that gateway (`crate::faultprobe`).
                let armed = self.prober.grant_before_step(&self.url, target).await;
                let offset =
                    (self.store_max_us - now_us()).max(self.clock_offset_us) + rng.random_range(20_000_000..60_000_000);
                self.gateway_pg[target].set(Mode::Delay(Duration::from_millis(rng.random_range(150..400))));
                self.step_clock(cluster, offset)?;
                // Term changes at once, while grants given before the step are held: the probe's,
                // and the racer's on every lane waiting for its next trial.
                if let Some(armed) = armed {
                    self.prober.after_step(armed);
                }
                self.racer.signal(Signal::SIGUSR1);
            }
            "pg-clock-back" => {
                self.offset_before_back_us = self.clock_offset_us;
                let offset = self.store_min_us - now_us() - rng.random_range(10_000_000..40_000_000);
                self.step_clock(cluster, offset)?;
            }
            _ => return Ok(None),
        }
        let link = if kind.starts_with("proxy") || kind == "pg-clock-forward" { link } else { usize::MAX };
        Ok(Some(Fault { kind, target, link, started_us, ends: Instant::now() + lasting }))
    }

    /// A term change, then a crash of Postgres as soon as its grant is visible, with every
    /// other leader paused meanwhile so that none of their own synchronous commits flushes the
    /// grant's WAL first: a grant that was answered before it was durable is lost. Returns the
    /// leader that resigned to make the term change; it is started again when the fault ends.
    async fn crash_after_grant(&mut self, cluster: &PgCluster) -> Result<usize> {
        let leaders = self.current_leaders().await;
        let target = leaders.first().copied().unwrap_or(0);
        let terms = "SELECT coalesce(sum(term), 0)::bigint FROM fencing.leases";
        // Straight to Postgres, not through a fault proxy.
        let watcher = match tokio::time::timeout(Duration::from_secs(1), try_connect(&self.url)).await {
            Ok(Ok(client)) => Some(client),
            _ => None,
        };
        let mut before = None;
        if let Some(client) = &watcher
            && let Ok(Ok(row)) = tokio::time::timeout(Duration::from_millis(500), client.query_one(terms, &[])).await
        {
            before = row.try_get::<_, i64>(0).ok();
        }
        self.leaders[target].terminate(Duration::from_secs(3)).await;
        if let (Some(client), Some(before)) = (&watcher, before) {
            let until = Instant::now() + Duration::from_secs(3);
            while Instant::now() < until {
                match tokio::time::timeout(Duration::from_millis(200), client.query_one(terms, &[])).await {
                    Ok(Ok(row)) if row.try_get::<_, i64>(0).ok() != Some(before) => break,
                    _ => {}
                }
            }
        }
        let paused: Vec<usize> = (0..self.leaders.len()).filter(|&i| i != target && !self.leaders[i].paused).collect();
        for &leader in &paused {
            self.leaders[leader].signal(Signal::SIGSTOP);
        }
        let crashed = tokio::task::block_in_place(|| cluster.crash_now());
        for &leader in &paused {
            self.leaders[leader].signal(Signal::SIGCONT);
        }
        crashed?;
        Ok(target)
    }

    /// The gateways a probe may write through: running and not paused.
    /// The usable gateways that admit now (`/readyz` 200): those a probe can act through.
    async fn ready_gateways(&self) -> Vec<usize> {
        let mut ready_now = Vec::new();
        for gateway in self.usable_gateways() {
            if ready(self.control_ports[gateway]).await {
                ready_now.push(gateway);
            }
        }
        ready_now
    }

    fn usable_gateways(&self) -> Vec<usize> {
        (0..self.gateways.len()).filter(|&g| self.gateways[g].child.is_some() && !self.gateways[g].paused).collect()
    }

    /// A crash of Postgres right after a probe's fence-moving action on `path`
    /// ([`crate::faultprobe`]), made with every other process that writes to the store paused
    /// (the leaders, the lease clients, the racer, and the gateways but the one that raises), so
    /// that no durable commit of theirs carries the action's record to disk by chance; they go on
    /// once Postgres is down.
    async fn crash_after_probe(&mut self, cluster: &PgCluster, path: ProbePath, rng: &mut StdRng) -> Result<()> {
        // A gateway raise goes through a gateway that admits (one whose clock runs at another
        // rate, or that has not yet earned its trust, refuses everything).
        let usable = self.ready_gateways().await;
        let url = self.url.clone();
        let clients: Vec<Pid> = self
            .leaders
            .iter()
            .chain(&self.lease_clients)
            .chain(std::iter::once(&self.racer))
            .filter(|process| !process.paused)
            .filter_map(Managed::pid)
            .collect();
        let gateways: Vec<(usize, Pid)> = self
            .gateways
            .iter()
            .enumerate()
            .filter(|(_, process)| !process.paused)
            .filter_map(|(gateway, process)| Some((gateway, process.pid()?)))
            .collect();
        let mut paused = Vec::new();
        // The gateways paused, and since when: a pause of the history like any other
        // (`sigstop-gateway-probe`), which S5's deadline rule must know of.
        let mut paused_gateways = Vec::new();
        let pause = |acting: Option<usize>| {
            let others: Vec<&(usize, Pid)> = gateways.iter().filter(|(gateway, _)| Some(*gateway) != acting).collect();
            let at = now_us();
            for pid in clients.iter().copied().chain(others.iter().map(|(_, pid)| *pid)) {
                let _ = kill(pid, Signal::SIGSTOP);
                paused.push(pid);
            }
            paused_gateways.extend(others.iter().map(|(gateway, _)| (*gateway, at)));
        };
        self.probe_pending = self.prober.act(path, &url, &usable, rng, pause).await;
        // As a power cut: every process of the server stopped, then killed, so nothing of it
        // runs after the action's answer (a server told to quit runs its signal handlers first).
        let crashed = tokio::task::block_in_place(|| cluster.power_cut());
        for pid in paused {
            let _ = kill(pid, Signal::SIGCONT);
        }
        let resumed = now_us();
        for (gateway, at) in paused_gateways {
            self.faults.push(json!({
                "kind": "sigstop-gateway-probe", "target": format!("gateway-{gateway}"),
                "start_us": at, "end_us": resumed,
            }));
        }
        crashed
    }

    /// A failover, its first half: a synchronous standby of the store is made (a base backup
    /// while the load goes on; from then on every durable commit waits for it), the load runs on
    /// it a moment, and the primary is killed (SIGQUIT to the postmaster). The standby is
    /// promoted when the fault ends ([`Schedule::promote`]); until then there is no store.
    ///
    /// False, and no fault, when the base backup failed (it was seen to lose its WAL stream on
    /// a loaded machine, once in hundreds of failovers): the store is as it was, and a harness
    /// failure is not a finding about the product. Said on stderr.
    async fn begin_failover(&mut self, cluster: &PgCluster, rng: &mut StdRng) -> Result<bool> {
        let standby = match tokio::task::block_in_place(|| cluster.start_standby(Replication::Synchronous)) {
            Ok(standby) => standby,
            // Only the base backup's failure: it comes before the primary is told to wait for the
            // standby. Any later failure leaves the primary waiting: an error, as before.
            Err(error) if format!("{error:#}").contains("pg_basebackup failed") => {
                eprintln!("fault suite: schedule {}: no failover, the base backup failed: {error:#}", self.index);
                return Ok(false);
            }
            Err(error) => return Err(error),
        };
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..500))).await;
        tokio::task::block_in_place(|| cluster.crash_now())?;
        self.standby = Some(standby);
        self.failed_over = true;
        Ok(true)
    }

    /// A failover, its second half: the standby is promoted, and every link to Postgres sends
    /// new connections to it, as a multi-host URL or a virtual IP would.
    async fn promote(&mut self) -> Result<()> {
        let standby = self.standby.take().ok_or_else(|| anyhow!("a failover without a standby"))?;
        tokio::task::block_in_place(|| standby.promote())?;
        let addr: SocketAddr = format!("127.0.0.1:{}", standby.port()).parse()?;
        for proxy in self.gateway_pg.iter().chain(&self.leader_pg).chain(&self.follower_pg).chain([&self.racer_pg]) {
            proxy.retarget(addr);
        }
        self.url = standby.url(&self.database);
        self.promoted = Some(Arc::new(standby));
        Ok(())
    }

    /// Sets the store's clock to read `offset_us` (rounded to milliseconds) ahead of real time,
    /// and records the step.
    fn step_clock(&mut self, cluster: &PgCluster, offset_us: i64) -> Result<()> {
        let offset_ms = offset_us / 1000;
        let before_us = now_us();
        cluster.set_clock_offset(offset_ms)?;
        let at_us = now_us();
        // The window that ends here read up to at + the old offset; the next starts at before +
        // the new one.
        self.store_max_us = self.store_max_us.max(at_us + self.clock_offset_us);
        self.clock_offset_us = offset_ms * 1000;
        self.store_min_us = self.store_min_us.min(before_us + self.clock_offset_us);
        self.store_max_us = self.store_max_us.max(at_us + self.clock_offset_us);
        self.clock_steps.push(json!({"before_us": before_us, "at_us": at_us, "offset_us": self.clock_offset_us}));
        Ok(())
    }

    /// The leader processes (by index) that hold a lease right now, by the store.
    async fn current_leaders(&self) -> Vec<usize> {
        let Ok(Ok(client)) = tokio::time::timeout(Duration::from_millis(300), try_connect(&self.url)).await else {
            return Vec::new();
        };
        let Ok(Ok(rows)) = tokio::time::timeout(
            Duration::from_millis(300),
            client.query("SELECT owner FROM fencing.leases WHERE expires_at > clock_timestamp()", &[]),
        )
        .await
        else {
            return Vec::new();
        };
        rows.iter()
            .filter_map(|row| row.try_get::<_, String>(0).ok())
            .filter_map(|owner| ["leader-a", "leader-b", "leader-c"].iter().position(|name| owner.starts_with(name)))
            .collect()
    }

    /// The proxies of one link: a gateway's or a leader's to Postgres, or a gateway's to both
    /// upstreams.
    fn links(&self, link: usize, target: usize) -> Vec<&FaultProxy> {
        match link {
            0 => vec![&self.gateway_pg[target]],
            1 => vec![&self.leader_pg[target]],
            _ => self.upstream_proxies[target * 2..target * 2 + 2].iter().collect(),
        }
    }

    fn link_name(link: usize, target: usize) -> String {
        match link {
            0 => format!("gateway-{target}->postgres"),
            1 => format!("leader-{target}->postgres"),
            _ => format!("gateway-{target}->upstreams"),
        }
    }

    async fn end(&mut self, cluster: &PgCluster, fault: &Fault) -> Result<()> {
        let target = fault.target;
        match fault.kind {
            "sigstop-gateway" => self.gateways[target].signal(Signal::SIGCONT),
            "sigstop-gateway-inflight" => {
                self.gateways[target].signal(Signal::SIGCONT);
                self.gateway_pg[target].set(Mode::Pass);
            }
            "sigstop-leader" | "sigstop-leader-past-ttl" => self.leaders[target].signal(Signal::SIGCONT),
            "sigkill-leader" | "leader-resign" => self.leaders[target].spawn()?,
            "sigstop-follower" => self.followers[target].signal(Signal::SIGCONT),
            "sigkill-follower" => self.followers[target].spawn()?,
            "sigkill-gateway" => self.gateways[target].spawn()?,
            "sigkill-upstream" => self.upstreams[target % 2].spawn()?,
            "pg-clock-back" => {
                self.step_clock(cluster, self.offset_before_back_us)?;
                self.racer.signal(Signal::SIGUSR1);
            }
            // The step stays (the store's clock never reads a time twice); the link recovers.
            "pg-clock-forward" => self.gateway_pg[target].set(Mode::Pass),
            "pg-crash" => tokio::task::block_in_place(|| cluster.start_server())?,
            kind if ProbePath::ALL.iter().any(|path| path.fault_kind() == kind) => {
                tokio::task::block_in_place(|| cluster.start_server())?;
                if let Some(follow_up) = self.probe_pending.take() {
                    let usable = self.usable_gateways();
                    self.prober.follow_up(follow_up, self.url.clone(), usable, self.seed ^ fault.started_us as u64);
                }
            }
            "pg-failover" => self.promote().await?,
            "pg-crash-after-grant" => {
                tokio::task::block_in_place(|| cluster.start_server())?;
                self.leaders[target].spawn()?;
            }
            kind if kind.starts_with("proxy") => {
                self.links(fault.link, target).iter().for_each(|proxy| proxy.set(Mode::Pass))
            }
            _ => {}
        }
        let target_name = if fault.kind.starts_with("proxy") {
            Schedule::link_name(fault.link, target)
        } else if fault.kind.contains("gateway") {
            format!("gateway-{target}")
        } else if fault.kind.contains("upstream") {
            format!("upstream-{}", if target % 2 == 0 { "checking" } else { "applying" })
        } else if fault.kind.contains("follower") {
            format!("follower-{}", target + 1)
        } else if fault.kind.contains("leader") {
            format!("leader-{target}")
        } else {
            "postgres".to_owned()
        };
        self.faults
            .push(json!({"kind": fault.kind, "target": target_name, "start_us": fault.started_us, "end_us": now_us()}));
        Ok(())
    }

    async fn stop(&mut self) {
        // The probes' last follow-ups first (bounded): they write through the gateways.
        self.prober.finish().await;
        // Each kind at once (their shutdowns overlap), in the order the writes flow.
        self.racer.terminate(Duration::from_secs(1)).await;
        Managed::terminate_all(&mut self.lease_clients, Duration::from_secs(1)).await;
        Managed::terminate_all(&mut self.leaders, Duration::from_secs(3)).await;
        Managed::terminate_all(&mut self.followers, Duration::from_secs(1)).await;
        // Writes in flight end within the forward timeout.
        tokio::time::sleep(Duration::from_millis(1200)).await;
        Managed::terminate_all(&mut self.gateways, Duration::from_secs(2)).await;
        Managed::terminate_all(&mut self.upstreams, Duration::from_secs(1)).await;
    }

    /// `deadlines.jsonl`: every forwarded write's deadline, from the gateways' logs (whole lines
    /// only: a gateway killed mid-line leaves a torn one).
    fn write_deadlines(&self) -> Result<()> {
        let mut text = String::new();
        for gateway in 0..self.gateways.len() {
            let path = self.dir.join(format!("gateway-{gateway}.log"));
            let Ok(log) = std::fs::read_to_string(&path) else { continue };
            for line in log.lines() {
                let Ok(event) = serde_json::from_str::<Value>(line) else { continue };
                if event["target"] != DEADLINE_TARGET {
                    continue;
                }
                let fields = &event["fields"];
                let (Some(request_id), Some(term), Some(deadline_us)) =
                    (fields["request_id"].as_str(), fields["term"].as_i64(), fields["deadline_unix_us"].as_i64())
                else {
                    continue;
                };
                let record =
                    json!({"gateway": gateway, "request_id": request_id, "term": term, "deadline_us": deadline_us});
                let _ = writeln!(text, "{record}");
            }
            let _ = std::fs::remove_file(&path);
        }
        std::fs::write(self.dir.join("deadlines.jsonl"), text)?;
        Ok(())
    }

    /// The records of the files `<part>.jsonl` (removed once read), the last line per
    /// `request_id` (its end, or its invocation when the process died first: then it ended with
    /// the schedule, at `ended_us`), in the order each request first appeared. A process killed
    /// mid-line leaves a torn last line: never a whole record.
    fn last_line_per_request(&self, parts: &[String], ended_us: i64) -> Vec<Value> {
        let mut last: BTreeMap<String, Value> = BTreeMap::new();
        let mut order: HashMap<String, usize> = HashMap::new();
        for part in parts {
            let path = self.dir.join(format!("{part}.jsonl"));
            let Ok(text) = std::fs::read_to_string(&path) else { continue };
            for line in text.lines() {
                let Ok(value) = serde_json::from_str::<Value>(line) else { continue };
                let Some(id) = value["request_id"].as_str().map(str::to_owned) else { continue };
                let next = order.len();
                order.entry(id.clone()).or_insert(next);
                last.insert(id, value);
            }
            let _ = std::fs::remove_file(&path);
        }
        let mut by_order: Vec<(usize, Value)> = last
            .into_iter()
            .map(|(id, mut value)| {
                if value["completed_us"].is_null() {
                    value["completed_us"] = json!(ended_us.max(value["invoked_us"].as_i64().unwrap_or(ended_us)));
                }
                (order.get(&id).copied().unwrap_or(0), value)
            })
            .collect();
        by_order.sort_by_key(|(n, _)| *n);
        by_order.into_iter().map(|(_, value)| value).collect()
    }

    /// Waits (at most 10 s) until every follower has reported the stream's head as it is now:
    /// a follower that stopped following (an error it does not get over) fails the schedule,
    /// rather than passing the `log` rule with nothing applied.
    async fn followers_catch_up(&self, cluster: &PgCluster) -> Result<()> {
        let client = store_client(cluster, &self.url).await.context("read the followers' positions")?;
        let head: i64 = client.query_one("SELECT head FROM fencing.streams WHERE stream = 'log-k1'", &[]).await?.get(0);
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            let rows = client.query("SELECT follower, applied FROM fencing.followers_of('log-k1')", &[]).await?;
            let behind: Vec<String> = (1..=self.followers.len())
                .map(|n| format!("follower-{n}"))
                .filter(|name| !rows.iter().any(|row| row.get::<_, String>(0) == *name && row.get::<_, i64>(1) >= head))
                .collect();
            if behind.is_empty() {
                return Ok(());
            }
            if Instant::now() >= until {
                bail!(
                    "{} did not reach the fenced log's head ({head}) within 10 s of the quiet period",
                    behind.join(", ")
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The fenced log's files: `appends.jsonl` (the last line per append), `log.jsonl` (the
    /// stream as the store kept it), `followers.jsonl` (each follower's applies, whole lines, in
    /// its file's order).
    async fn record_log(&self, client: &tokio_postgres::Client, ended_us: i64) -> Result<()> {
        let appends = self.last_line_per_request(&["a", "b", "c"].map(|letter| format!("appends-{letter}")), ended_us);
        if appends.is_empty() {
            bail!("no appends to the fenced log were recorded in this schedule (do the leaders of k1 append?)");
        }
        std::fs::write(self.dir.join("appends.jsonl"), jsonl(&appends))?;
        let mut log = String::new();
        for row in client
            .query(
                "SELECT stream, seq, term, payload ->> 'request_id' FROM fencing.stream_entries
                  WHERE stream = 'log-k1' ORDER BY seq",
                &[],
            )
            .await?
        {
            let line = json!({
                "stream": row.get::<_, String>(0), "seq": row.get::<_, i64>(1), "term": row.get::<_, i64>(2),
                "request_id": row.get::<_, Option<String>>(3),
            });
            let _ = writeln!(log, "{line}");
        }
        std::fs::write(self.dir.join("log.jsonl"), log)?;
        let mut applied = String::new();
        for n in 1..=self.followers.len() {
            let path = self.dir.join(format!("follower-{n}.jsonl"));
            let Ok(lines) = std::fs::read_to_string(&path) else { continue };
            for line in lines.lines().filter(|l| serde_json::from_str::<Value>(l).is_ok()) {
                let _ = writeln!(applied, "{line}");
            }
            let _ = std::fs::remove_file(&path);
        }
        std::fs::write(self.dir.join("followers.jsonl"), applied)?;
        Ok(())
    }

    async fn record(
        &self,
        cluster: &PgCluster,
        config: &SuiteConfig,
        started_us: i64,
        quiet_from_us: i64,
        ended_us: i64,
    ) -> Result<()> {
        let client = store_client(cluster, &self.url).await.context("read the schedule's database")?;
        let mut leases = String::new();
        for row in client
            .query(
                "SELECT key, term, owner,
                        (extract(epoch FROM granted_at) * 1000000)::bigint,
                        (extract(epoch FROM ended_at) * 1000000)::bigint, end_reason
                   FROM fencing.lease_history ORDER BY key, term",
                &[],
            )
            .await?
        {
            let line = json!({
                "key": row.get::<_, String>(0), "term": row.get::<_, i64>(1), "owner": row.get::<_, String>(2),
                "granted_at_us": row.get::<_, i64>(3), "ended_at_us": row.get::<_, Option<i64>>(4),
                "end_reason": row.get::<_, Option<String>>(5),
            });
            let _ = writeln!(leases, "{line}");
        }
        std::fs::write(self.dir.join("leases.jsonl"), leases)?;
        let mut table = String::new();
        for table_name in ["ledger_k1", "ledger_k2", "race_ledger"] {
            for row in client
                .query(&format!("SELECT request_id, resource, term, ticket FROM {table_name} ORDER BY ticket"), &[])
                .await?
            {
                let line = json!({
                    "request_id": row.get::<_, String>(0), "resource": row.get::<_, String>(1),
                    "term": row.get::<_, Option<i64>>(2), "ticket": row.get::<_, Option<i64>>(3),
                });
                let _ = writeln!(table, "{line}");
            }
        }
        std::fs::write(self.dir.join("table.jsonl"), table)?;

        // The clients' logs: the last line per request (its end, or its invocation when the
        // process died before the write ended).
        let parts = ["a", "b", "c", "racer", "prober"].map(|letter| format!("client-{letter}"));
        let clients = self.last_line_per_request(&parts, ended_us);
        // Without the racer's writes a clean run would show less than it claims.
        if !clients.iter().any(|value| value["client"] == "racer" && value["outcome"] == "ok") {
            bail!("the racer made no ok write in this schedule (is fault-racer built and starting?)");
        }
        std::fs::write(self.dir.join("clients.jsonl"), jsonl(&clients))?;

        // The upstreams' logs may end with a torn line if an upstream was killed mid-write.
        for name in ["checking", "applying"] {
            let path = self.dir.join(format!("upstream-{name}.jsonl"));
            if let Ok(text) = std::fs::read_to_string(&path) {
                let whole: String = text
                    .lines()
                    .filter(|l| serde_json::from_str::<Value>(l).is_ok())
                    .map(|l| format!("{l}\n"))
                    .collect();
                std::fs::write(&path, whole)?;
            }
        }
        self.write_deadlines()?;
        let mut elections = String::new();
        for letter in ["a", "b", "c"] {
            let path = self.dir.join(format!("elections-{letter}.jsonl"));
            let Ok(text) = std::fs::read_to_string(&path) else { continue };
            for line in text.lines().filter(|l| serde_json::from_str::<Value>(l).is_ok()) {
                let _ = writeln!(elections, "{line}");
            }
            let _ = std::fs::remove_file(&path);
        }
        std::fs::write(self.dir.join("elections.jsonl"), elections)?;
        // The leaders' acts (S7) and the HTTP lease clients' calls, whole lines only.
        for (merged, parts) in
            [("acts", ["acts-a", "acts-b", "acts-c"].as_slice()), ("lease_calls", &["lease-calls-x", "lease-calls-y"])]
        {
            let mut text = String::new();
            for part in parts {
                let path = self.dir.join(format!("{part}.jsonl"));
                let Ok(lines) = std::fs::read_to_string(&path) else { continue };
                for line in lines.lines().filter(|l| serde_json::from_str::<Value>(l).is_ok()) {
                    let _ = writeln!(text, "{line}");
                }
                let _ = std::fs::remove_file(&path);
            }
            if text.is_empty() {
                bail!("no {merged} were recorded in this schedule (are the leaders and lease clients starting?)");
            }
            std::fs::write(self.dir.join(format!("{merged}.jsonl")), text)?;
        }
        self.record_log(&client, ended_us).await?;
        let mut faults = String::new();
        for fault in &self.faults {
            let _ = writeln!(faults, "{fault}");
        }
        std::fs::write(self.dir.join("faults.jsonl"), faults)?;
        let mut clock = String::new();
        for step in &self.clock_steps {
            let _ = writeln!(clock, "{step}");
        }
        std::fs::write(self.dir.join("clock.jsonl"), clock)?;
        let meta = json!({
            "schedule": self.index, "seed": self.seed, "ttl_ms": config.ttl.as_millis() as u64,
            "forward_timeout_ms": config.forward_timeout.as_millis() as u64,
            "started_us": started_us, "ended_us": ended_us, "quiet_from_us": quiet_from_us,
            "plant": config.plant.map(Plant::name), "clock_rates": self.clock_rates,
        });
        std::fs::write(self.dir.join("meta.json"), meta.to_string())?;
        Ok(())
    }
}

/// Records as JSON lines.
fn jsonl(records: &[Value]) -> String {
    let mut text = String::new();
    for record in records {
        let _ = writeln!(text, "{record}");
    }
    text
}
