//! Cluster membership under load, with real processes: not a test, a measurement (the test
//! `membership_load` runs it small and checks what it reports).
//!
//! ```text
//! cargo run --release -p fencing-tests --bin member-load -- --nodes 50 --interval-ms 100 \
//!     [--processes 5] [--seconds 30] [--ttl-ms 3×interval] [--pool 8] [--json]
//! ```
//!
//! It starts a durable PostgreSQL of its own (the server's default fsync and synchronous
//! commit; `track_functions = pl` to count the heartbeats), then `--processes` child processes
//! that run the `--nodes` nodes between them (`fencing_election::membership`, one connection
//! pool per process). Every node is an observer: it counts the joins and leaves it hears until a
//! common stop instant, after which every node leaves. It prints, for the run:
//! - heartbeats per second (calls of `fencing.heartbeat`, against nodes / interval expected),
//!   and the heartbeats that failed (the library's `membership_heartbeat_failures_total`);
//! - spurious events: a leave heard before the stop, or a node heard joining twice by one
//!   observer (no node stops before the stop instant, so every one is spurious), and the
//!   observers that did not hear all the nodes join;
//! - Postgres transactions per heartbeat (`pg_stat_database`: every commit and rollback of the
//!   run's database, joins, reads and leaves included), sessions opened (reconnects), and the
//!   CPU per heartbeat of the node processes and of Postgres (all its processes).
//!
//! The database URL reaches the children in the environment, never in their arguments.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, anyhow, bail};
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use fencing_election::membership::{HEARTBEAT_FAILURES, MemberEvent, Membership};
use fencing_tests::pg::{Durability, PgCluster, connect};
use tokio_postgres::{Client, NoTls};

const CLUSTER: &str = "load";
const DATABASE: &str = "members";
const URL_ENV: &str = "MEMBER_LOAD_DATABASE_URL";

#[derive(Debug, Clone)]
struct Options {
    nodes: usize,
    processes: usize,
    interval: Duration,
    seconds: u64,
    ttl: Option<Duration>,
    pool: usize,
    json: bool,
    /// A child: its first node and how many it runs, and the stop instant (ms since the epoch).
    child: Option<(usize, usize, u64)>,
}

fn options() -> Result<Options> {
    let mut options = Options {
        nodes: 50,
        processes: 5,
        interval: Duration::from_millis(100),
        seconds: 30,
        ttl: None,
        pool: 8,
        json: false,
        child: None,
    };
    let mut child = (None, None, None);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut number = || -> Result<u64> {
            let value = args.next().with_context(|| format!("{arg} needs a value"))?;
            value.parse().with_context(|| format!("{arg} {value}"))
        };
        match arg.as_str() {
            "--nodes" => options.nodes = usize::try_from(number()?)?,
            "--processes" => options.processes = usize::try_from(number()?)?,
            "--interval-ms" => options.interval = Duration::from_millis(number()?),
            "--seconds" => options.seconds = number()?,
            "--ttl-ms" => options.ttl = Some(Duration::from_millis(number()?)),
            "--pool" => options.pool = usize::try_from(number()?)?,
            "--json" => options.json = true,
            "--child-first" => child.0 = Some(usize::try_from(number()?)?),
            "--child-count" => child.1 = Some(usize::try_from(number()?)?),
            "--child-stop-at" => child.2 = Some(number()?),
            other => bail!(
                "unknown argument {other}: member-load [--nodes 50] [--processes 5] [--interval-ms 100] \
                 [--seconds 30] [--ttl-ms N] [--pool 8] [--json]"
            ),
        }
    }
    if let (Some(first), Some(count), Some(stop_at)) = child {
        options.child = Some((first, count, stop_at));
    }
    if options.nodes == 0 || options.processes == 0 || options.processes > options.nodes || options.pool == 0 {
        bail!("--nodes, --processes (at most the nodes) and --pool must be positive");
    }
    Ok(options)
}

/// What one child heard and spent, as its one output line.
#[derive(Debug, Default, Clone, serde::Serialize, serde::Deserialize)]
struct ChildReport {
    observers: usize,
    /// Observers that heard every node of the run join.
    heard_all: usize,
    joins: u64,
    /// A second join of one node heard by one observer.
    spurious_joins: u64,
    /// Leaves heard before the stop instant.
    spurious_leaves: u64,
    heartbeat_failures: u64,
    /// Observers that fell behind their events (and missed some).
    lagged: u64,
    cpu_ms: f64,
}

impl ChildReport {
    /// Adds another's counts to these.
    fn add(&mut self, other: &ChildReport) {
        self.observers += other.observers;
        self.heard_all += other.heard_all;
        self.joins += other.joins;
        self.spurious_joins += other.spurious_joins;
        self.spurious_leaves += other.spurious_leaves;
        self.heartbeat_failures += other.heartbeat_failures;
        self.lagged += other.lagged;
        self.cpu_ms += other.cpu_ms;
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let options = options()?;
    match options.child {
        Some((first, count, stop_at)) => child(&options, first, count, stop_at).await,
        None => driver(&options).await,
    }
}

fn ttl(options: &Options) -> Duration {
    options.ttl.unwrap_or(options.interval * 3)
}

fn node_id(index: usize) -> String {
    format!("node-{index:04}")
}

/// The CPU time this process used, user and system.
fn own_cpu() -> Duration {
    match nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF) {
        Ok(usage) => {
            let micros = |t: nix::sys::time::TimeVal| {
                Duration::from_secs(u64::try_from(t.tv_sec()).unwrap_or(0))
                    + Duration::from_micros(u64::try_from(t.tv_usec()).unwrap_or(0))
            };
            micros(usage.user_time()) + micros(usage.system_time())
        }
        Err(_) => Duration::ZERO,
    }
}

async fn child(options: &Options, first: usize, count: usize, stop_at: u64) -> Result<()> {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .map_err(|error| anyhow!("install the metrics recorder: {error}"))?;
    let url = std::env::var(URL_ENV).with_context(|| format!("{URL_ENV} is not set"))?;
    let config: tokio_postgres::Config = url.parse()?;
    let manager = Manager::from_config(config, NoTls, ManagerConfig { recycling_method: RecyclingMethod::Fast });
    let pool = Pool::builder(manager).max_size(options.pool).build()?;
    let everyone: BTreeSet<String> = (0..options.nodes).map(node_id).collect();
    let stop = UNIX_EPOCH + Duration::from_millis(stop_at);
    let mut nodes = Vec::new();
    let mut listeners = Vec::new();
    for index in first..first + count {
        let node = Membership::builder(pool.clone(), CLUSTER)
            .node_id(node_id(index))
            .heartbeat_interval(options.interval)
            .ttl(ttl(options))
            .build()?
            .start();
        let mut events = node.events();
        let everyone = everyone.clone();
        listeners.push(tokio::spawn(async move {
            let mut report = ChildReport { observers: 1, ..ChildReport::default() };
            let mut joined = BTreeSet::new();
            let until = stop.duration_since(SystemTime::now()).unwrap_or_default();
            let deadline = tokio::time::Instant::now() + until;
            loop {
                let event = tokio::select! {
                    biased;
                    () = tokio::time::sleep_until(deadline) => break,
                    event = events.recv() => event,
                };
                match event {
                    Ok(MemberEvent::NodeJoined(node)) => {
                        report.joins += 1;
                        if !joined.insert(node.node_id) {
                            report.spurious_joins += 1;
                        }
                    }
                    Ok(MemberEvent::NodeLeft(_)) => report.spurious_leaves += 1,
                    Ok(MemberEvent::IdentityConflict { .. }) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        eprintln!("an observer fell behind its events");
                        report.lagged += 1;
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
                }
            }
            report.heard_all = usize::from(joined == everyone);
            report
        }));
        nodes.push(node);
    }
    let mut total = ChildReport::default();
    for listener in listeners {
        total.add(&listener.await?);
    }
    // Every process has stopped counting before any node leaves.
    let leave_at = stop + Duration::from_secs(1);
    tokio::time::sleep(leave_at.duration_since(SystemTime::now()).unwrap_or_default()).await;
    for node in nodes {
        node.shutdown().await;
    }
    total.heartbeat_failures = recorder
        .render()
        .lines()
        .filter(|line| line.starts_with(HEARTBEAT_FAILURES))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64;
    total.cpu_ms = own_cpu().as_secs_f64() * 1000.0;
    println!("{}", serde_json::to_string(&total)?);
    Ok(())
}

/// The CPU time of the PostgreSQL server: the postmaster, its live children and the children it
/// has reaped (the backends of sessions that ended).
fn postgres_cpu(postmaster: i32) -> Duration {
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100).max(1) as f64;
    let stat = |pid: i32| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok();
    // The fields after the command name, which may hold spaces: ppid is the 2nd, utime the 12th.
    let fields = |text: &str| -> Vec<u64> {
        let rest = text.rsplit_once(") ").map_or("", |(_, rest)| rest);
        rest.split_whitespace().map(|field| field.parse().unwrap_or(0)).collect()
    };
    let mut total = 0u64;
    if let Some(text) = stat(postmaster) {
        let f = fields(&text);
        total += f.get(11..15).map_or(0, |times| times.iter().sum());
    }
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<i32>().ok()) else { continue };
            let Some(text) = stat(pid) else { continue };
            let f = fields(&text);
            if f.get(1).copied() == Some(u64::try_from(postmaster).unwrap_or(0)) {
                total += f.get(11..13).map_or(0, |times| times.iter().sum());
            }
        }
    }
    Duration::from_secs_f64(total as f64 / ticks)
}

async fn database_counts(admin: &Client) -> Result<(i64, i64)> {
    let row = admin
        .query_one(
            "SELECT (xact_commit + xact_rollback)::bigint, sessions::bigint FROM pg_stat_database WHERE datname = $1",
            &[&DATABASE],
        )
        .await?;
    Ok((row.try_get(0)?, row.try_get(1)?))
}

async fn driver(options: &Options) -> Result<()> {
    let cluster = PgCluster::start_with_settings(Durability::On, "track_functions = 'pl'\nmax_connections = 300\n")?;
    let admin = connect(&cluster.url("postgres")).await;
    admin.batch_execute(&format!("CREATE DATABASE {DATABASE}")).await?;
    {
        let mut client = connect(&cluster.url(DATABASE)).await;
        fencing_schema::migrate(&mut client).await?;
    }
    // Every session of the setup has ended before the counts start.
    wait_for_no_sessions(&admin).await?;
    let postmaster = cluster.postmaster_pid().context("the postmaster's pid")?;
    let (transactions_before, sessions_before) = database_counts(&admin).await?;
    let cpu_before = postgres_cpu(postmaster);

    let exe = std::env::current_exe()?;
    let start_ms = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis() as u64;
    let stop_at = start_ms + options.seconds * 1000;
    let mut children = Vec::new();
    let per = options.nodes.div_ceil(options.processes);
    let mut first = 0;
    while first < options.nodes {
        let count = per.min(options.nodes - first);
        let mut command = Command::new(&exe);
        command
            .args(["--nodes", &options.nodes.to_string(), "--processes", &options.processes.to_string()])
            .args(["--interval-ms", &options.interval.as_millis().to_string()])
            .args(["--ttl-ms", &ttl(options).as_millis().to_string(), "--pool", &options.pool.to_string()])
            .args(["--child-first", &first.to_string(), "--child-count", &count.to_string()])
            .args(["--child-stop-at", &stop_at.to_string()])
            .env(URL_ENV, cluster.url(DATABASE))
            .env("RUST_LOG", "off")
            .stdin(Stdio::null())
            .stdout(Stdio::piped());
        children.push(command.spawn().context("spawn a node process")?);
        first += count;
    }
    let mut total = ChildReport::default();
    for mut child in children {
        let stdout = child.stdout.take().context("a child's stdout")?;
        let waited = tokio::task::spawn_blocking(move || {
            let line = BufReader::new(stdout).lines().next().transpose()?;
            let status = child.wait()?;
            Ok::<_, std::io::Error>((line, status))
        });
        let (line, status) = tokio::time::timeout(Duration::from_secs(options.seconds + 60), waited)
            .await
            .context("a node process did not end")???;
        if !status.success() {
            bail!("a node process failed: {status}");
        }
        let report: ChildReport = serde_json::from_str(&line.context("a node process printed nothing")?)?;
        total.add(&report);
    }
    // The backends flush their counts when their sessions end.
    wait_for_no_sessions(&admin).await?;
    let (transactions_after, sessions_after) = database_counts(&admin).await?;
    let cpu_after = postgres_cpu(postmaster);
    let counter = connect(&cluster.url(DATABASE)).await;
    let heartbeats: i64 = counter
        .query_opt(
            "SELECT calls FROM pg_stat_user_functions WHERE schemaname = 'fencing' AND funcname = 'heartbeat'",
            &[],
        )
        .await?
        .map_or(Ok(0), |row| row.try_get(0))?;
    let elapsed = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis() as u64 - start_ms;
    let seconds = options.seconds as f64;
    let heartbeats_f = (heartbeats.max(1)) as f64;
    let transactions = transactions_after - transactions_before;
    let summary: BTreeMap<&str, serde_json::Value> = BTreeMap::from([
        ("nodes", options.nodes.into()),
        ("processes", options.processes.into()),
        ("interval_ms", (options.interval.as_millis() as u64).into()),
        ("ttl_ms", (ttl(options).as_millis() as u64).into()),
        ("seconds", options.seconds.into()),
        ("run_ms", elapsed.into()),
        ("heartbeats", heartbeats.into()),
        ("heartbeats_per_s", (heartbeats as f64 / seconds).into()),
        ("expected_per_s", (options.nodes as f64 / options.interval.as_secs_f64()).into()),
        ("heartbeat_failures", total.heartbeat_failures.into()),
        ("observers", total.observers.into()),
        ("heard_all", total.heard_all.into()),
        ("joins", total.joins.into()),
        ("spurious_joins", total.spurious_joins.into()),
        ("spurious_leaves", total.spurious_leaves.into()),
        ("lagged", total.lagged.into()),
        ("transactions", transactions.into()),
        ("transactions_per_heartbeat", (transactions as f64 / heartbeats_f).into()),
        ("sessions_opened", (sessions_after - sessions_before).into()),
        ("node_cpu_us_per_heartbeat", (total.cpu_ms * 1000.0 / heartbeats_f).into()),
        ("postgres_cpu_us_per_heartbeat", ((cpu_after - cpu_before).as_secs_f64() * 1e6 / heartbeats_f).into()),
    ]);
    if options.json {
        println!("{}", serde_json::to_string(&summary)?);
    } else {
        for (name, value) in &summary {
            println!("{name:>30}  {value}");
        }
    }
    Ok(())
}

async fn wait_for_no_sessions(admin: &Client) -> Result<()> {
    for _ in 0..200 {
        let row = admin.query_one("SELECT count(*) FROM pg_stat_activity WHERE datname = $1", &[&DATABASE]).await?;
        if row.try_get::<_, i64>(0)? == 0 {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("sessions of {DATABASE} did not end")
}
