//! A node of a cluster that runs daemons (`fencing_election::daemons`), printing JSON lines.
//!
//! ```text
//! cargo run -p fencing-election --example daemon_node -- \
//!     --database-url postgres://postgres@127.0.0.1:5432/app --cluster workers --node-id n1 \
//!     [--key workers-leader] [--daemons 5] [--heartbeat-ms 15000] [--registration-ttl-ms 90000] \
//!     [--ttl-ms 60000] [--ack-ms 30000] [--drain-ms 60000] [--tick-ms 100] [--slow-drain-ms 0] \
//!     [--query-timeout-ms N] [--metrics-listen 127.0.0.1:9464]
//! ```
//!
//! It registers daemons `d1` .. `dN`. Each running daemon, every tick, records one row in
//! `daemon_runs` (not fenced: where and when it ran, on the store's clock) and one in
//! `daemon_ticks` in a transaction that first calls `fencing.admit('ticks/<daemon>',
//! <generation>)` with its fencing token, so an older instance's writes are refused once a newer
//! one wrote (create both tables first; the tests do). With `--slow-drain-ms`, a daemon keeps
//! going that long after it was told to drain or stop: a slow drainer.
//!
//! Lines: `started`, `elected`/`lost` (with `term`), `daemon_started`/`daemon_stopped` (with
//! `daemon` and `generation`), `tick_refused`, `shutdown`. SIGTERM or SIGINT drain the daemons,
//! give them back, release the lease and leave.

use std::process::ExitCode;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use fencing_election::daemons::{DaemonContext, Daemons};
use fencing_election::membership::Membership;
use fencing_election::{Elector, Event};
use tokio::signal::unix::{SignalKind, signal};
use tokio_postgres::NoTls;

const USAGE: &str = "usage: daemon_node --database-url URL --cluster NAME --node-id ID [--key LEASE] [--daemons 5] \
                     [--heartbeat-ms 15000] [--registration-ttl-ms 90000] [--ttl-ms 60000] [--ack-ms 30000] \
                     [--drain-ms 60000] [--tick-ms 100] [--slow-drain-ms 0] [--query-timeout-ms N] \
                     [--metrics-listen 127.0.0.1:9464] (create the tables daemon_runs and \
                     daemon_ticks (daemon text, generation bigint, node_id text, at timestamptz) first)";

struct Args {
    database_url: String,
    cluster: String,
    node_id: String,
    key: Option<String>,
    daemons: usize,
    heartbeat: Duration,
    registration_ttl: Duration,
    ttl: Duration,
    ack: Option<Duration>,
    drain: Option<Duration>,
    tick: Duration,
    slow_drain: Duration,
    query_timeout: Option<Duration>,
    metrics_listen: Option<std::net::SocketAddr>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        database_url: String::new(),
        cluster: String::new(),
        node_id: String::new(),
        key: None,
        daemons: 5,
        heartbeat: Duration::from_secs(15),
        registration_ttl: Duration::from_secs(90),
        ttl: Duration::from_secs(60),
        ack: None,
        drain: None,
        tick: Duration::from_millis(100),
        slow_drain: Duration::ZERO,
        query_timeout: None,
        metrics_listen: None,
    };
    let mut words = std::env::args().skip(1);
    while let Some(flag) = words.next() {
        if flag == "--help" || flag == "-h" {
            return Err(USAGE.to_owned());
        }
        let value = words.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let ms = || value.parse::<u64>().map(Duration::from_millis).map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--database-url" => args.database_url = value.clone(),
            "--cluster" => args.cluster = value.clone(),
            "--node-id" => args.node_id = value.clone(),
            "--key" => args.key = Some(value.clone()),
            "--daemons" => args.daemons = value.parse().map_err(|e| format!("{flag}: {e}"))?,
            "--heartbeat-ms" => args.heartbeat = ms()?,
            "--registration-ttl-ms" => args.registration_ttl = ms()?,
            "--ttl-ms" => args.ttl = ms()?,
            "--ack-ms" => args.ack = Some(ms()?),
            "--drain-ms" => args.drain = Some(ms()?),
            "--tick-ms" => args.tick = ms()?,
            "--slow-drain-ms" => args.slow_drain = ms()?,
            "--query-timeout-ms" => args.query_timeout = Some(ms()?),
            "--metrics-listen" => args.metrics_listen = Some(value.parse().map_err(|e| format!("{flag}: {e}"))?),
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if args.database_url.is_empty() || args.cluster.is_empty() || args.node_id.is_empty() {
        return Err("--database-url, --cluster and --node-id are required".to_owned());
    }
    Ok(args)
}

/// One tick of a daemon: the unfenced run record, then the fenced tick. Whether the tick was
/// admitted.
async fn tick(pool: &Pool, daemon: &DaemonContext, node_id: &str) -> Result<bool, String> {
    let mut client = pool.get().await.map_err(|e| e.to_string())?;
    let generation = daemon.fencing_token().term();
    client
        .execute(
            "INSERT INTO daemon_runs (daemon, generation, node_id, at) VALUES ($1, $2, $3, clock_timestamp())",
            &[&daemon.name(), &generation, &node_id],
        )
        .await
        .map_err(|e| e.to_string())?;
    let transaction = client.transaction().await.map_err(|e| e.to_string())?;
    let resource = format!("ticks/{}", daemon.name());
    if let Err(error) = transaction.execute("SELECT fencing.admit($1, $2)", &[&resource, &generation]).await {
        if error.code().is_some_and(|code| code.code() == "ZF409") {
            return Ok(false);
        }
        return Err(error.to_string());
    }
    transaction
        .execute(
            "INSERT INTO daemon_ticks (daemon, generation, node_id, at) VALUES ($1, $2, $3, clock_timestamp())",
            &[&daemon.name(), &generation, &node_id],
        )
        .await
        .map_err(|e| e.to_string())?;
    transaction.commit().await.map_err(|e| e.to_string())?;
    Ok(true)
}

fn line(event: &str, daemon: &DaemonContext) -> String {
    format!(r#"{{"event":"{event}","daemon":"{}","generation":{}}}"#, daemon.name(), daemon.generation())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("daemon_node: {message}");
            return ExitCode::from(64);
        }
    };
    let pg_config = match args.database_url.parse::<tokio_postgres::Config>() {
        Ok(config) => config,
        Err(error) => {
            eprintln!("daemon_node: --database-url: {error}");
            return ExitCode::from(64);
        }
    };
    let manager = Manager::from_config(pg_config, NoTls, ManagerConfig { recycling_method: RecyclingMethod::Fast });
    let pool = match Pool::builder(manager).max_size(4 + args.daemons).build() {
        Ok(pool) => pool,
        Err(error) => {
            eprintln!("daemon_node: build the pool: {error}");
            return ExitCode::from(70);
        }
    };
    if let Some(address) = args.metrics_listen {
        // The membership and daemon metrics (and the election's), for Prometheus; histograms
        // with buckets, as the dashboard's quantiles need.
        let buckets = [0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];
        let installed = metrics_exporter_prometheus::PrometheusBuilder::new()
            .with_http_listener(address)
            .set_buckets(&buckets)
            .and_then(|builder| builder.install());
        if let Err(error) = installed {
            eprintln!("daemon_node: --metrics-listen {address}: {error}");
            return ExitCode::from(70);
        }
    }
    let mut node = Membership::builder(pool.clone(), args.cluster.clone())
        .node_id(args.node_id.clone())
        .heartbeat_interval(args.heartbeat)
        .ttl(args.registration_ttl);
    if let Some(query_timeout) = args.query_timeout {
        node = node.query_timeout(query_timeout);
    }
    let built = node.build().and_then(|node| {
        let key = args.key.clone().unwrap_or_else(|| format!("{}-leader", args.cluster));
        let elector = Elector::builder(pool.clone(), key).owner(args.node_id.clone()).ttl(args.ttl).build()?;
        let mut builder = Daemons::builder(node, elector);
        for index in 1..=args.daemons {
            let (pool, node_id, tick_every, slow) = (pool.clone(), args.node_id.clone(), args.tick, args.slow_drain);
            builder = builder.daemon(format!("d{index}"), move |daemon| {
                let (pool, node_id) = (pool.clone(), node_id.clone());
                async move {
                    println!("{}", line("daemon_started", &daemon));
                    let mut stop_at = None;
                    loop {
                        // A slow drainer goes on past its cancellation; a well-behaved one
                        // acts only while valid.
                        if daemon.is_valid() || (daemon.is_draining() && !slow.is_zero()) {
                            match tick(&pool, &daemon, &node_id).await {
                                Ok(true) => {}
                                Ok(false) => println!("{}", line("tick_refused", &daemon)),
                                Err(error) => eprintln!("daemon_node: {}: tick: {error}", daemon.name()),
                            }
                        } else if daemon.cancellation_token().is_cancelled() {
                            break;
                        }
                        if daemon.is_draining() {
                            let until = *stop_at.get_or_insert_with(|| tokio::time::Instant::now() + slow);
                            if tokio::time::Instant::now() >= until {
                                break;
                            }
                        }
                        tokio::time::sleep(tick_every).await;
                    }
                    println!("{}", line("daemon_stopped", &daemon));
                }
            });
        }
        if let Some(ack) = args.ack {
            builder = builder.ack_timeout(ack);
        }
        if let Some(drain) = args.drain {
            builder = builder.drain_timeout(drain);
        }
        builder.build()
    });
    let daemons = match built {
        Ok(daemons) => daemons,
        Err(error) => {
            eprintln!("daemon_node: {error}");
            return ExitCode::from(64);
        }
    };
    let (mut terminate, mut interrupt) = match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
        (Ok(terminate), Ok(interrupt)) => (terminate, interrupt),
        _ => {
            eprintln!("daemon_node: cannot install signal handlers");
            return ExitCode::from(70);
        }
    };
    println!(r#"{{"event":"started","node":"{}","pid":{}}}"#, args.node_id, std::process::id());
    let handle = daemons.start();
    if let Some(elector) = handle.elector() {
        let mut events = elector.events();
        tokio::spawn(async move {
            while let Ok(event) = events.recv().await {
                match event {
                    Event::Elected { term } => println!(r#"{{"event":"elected","term":{term}}}"#),
                    Event::Lost { term, .. } => println!(r#"{{"event":"lost","term":{term}}}"#),
                    Event::HolderChanged { .. } => {}
                }
            }
        });
    }
    tokio::select! {
        _ = terminate.recv() => {}
        _ = interrupt.recv() => {}
    }
    handle.shutdown().await;
    println!(r#"{{"event":"shutdown"}}"#);
    ExitCode::SUCCESS
}
