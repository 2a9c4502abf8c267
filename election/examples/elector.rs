//! An elector process that prints its state changes and leader-work ticks as JSON lines.
//!
//! ```text
//! cargo run -p fencing-election --example elector -- \
//!     --database-url postgres://postgres@127.0.0.1:5432/app --key demo [--owner NAME] \
//!     [--ttl-ms 10000] [--renew-ms N] [--margin-ms N] [--query-timeout-ms N] [--tick-ms 100] \
//!     [--metrics-listen 127.0.0.1:9464] \
//!     [--cluster NAME --node-id ID [--heartbeat-ms 15000] [--registration-ttl-ms 90000]]
//! ```
//!
//! With `--cluster`, it is also a node of that cluster (`fencing_election::membership`) and
//! prints `node_joined`, `node_left` (each with `node` and `started_ms`, the node's start on the
//! store's clock in Unix milliseconds) and `identity_conflict` lines.
//!
//! Every line has `event` and `at_ms`, milliseconds on this process's monotonic clock since it
//! started; leader lines and ticks carry `deadline_ms` on the same clock. SIGTERM or SIGINT shut
//! it down gracefully: leader work stops, the lease is released, then it exits.
//! The integration tests run it as a real process to pause, kill and stop it.

use std::process::ExitCode;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use fencing_election::membership::{MemberEvent, Membership};
use fencing_election::{Elector, Event, LeaderState};
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::Instant;
use tokio_postgres::NoTls;

struct Args {
    database_url: String,
    key: String,
    owner: Option<String>,
    ttl: Duration,
    renew: Option<Duration>,
    margin: Option<Duration>,
    query_timeout: Option<Duration>,
    tick: Duration,
    metrics_listen: Option<std::net::SocketAddr>,
    cluster: Option<String>,
    node_id: Option<String>,
    heartbeat: Option<Duration>,
    registration_ttl: Option<Duration>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        database_url: String::new(),
        key: String::new(),
        owner: None,
        ttl: Duration::from_secs(10),
        renew: None,
        margin: None,
        query_timeout: None,
        tick: Duration::from_millis(100),
        metrics_listen: None,
        cluster: None,
        node_id: None,
        heartbeat: None,
        registration_ttl: None,
    };
    let mut words = std::env::args().skip(1);
    while let Some(flag) = words.next() {
        let value = words.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let ms = || value.parse::<u64>().map(Duration::from_millis).map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--database-url" => args.database_url = value.clone(),
            "--key" => args.key = value.clone(),
            "--owner" => args.owner = Some(value.clone()),
            "--ttl-ms" => args.ttl = ms()?,
            "--renew-ms" => args.renew = Some(ms()?),
            "--margin-ms" => args.margin = Some(ms()?),
            "--query-timeout-ms" => args.query_timeout = Some(ms()?),
            "--tick-ms" => args.tick = ms()?,
            "--cluster" => args.cluster = Some(value.clone()),
            "--node-id" => args.node_id = Some(value.clone()),
            "--heartbeat-ms" => args.heartbeat = Some(ms()?),
            "--registration-ttl-ms" => args.registration_ttl = Some(ms()?),
            "--metrics-listen" => args.metrics_listen = Some(value.parse().map_err(|e| format!("{flag}: {e}"))?),
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if args.database_url.is_empty() || args.key.is_empty() {
        return Err("--database-url and --key are required".to_owned());
    }
    Ok(args)
}

/// A JSON string literal.
fn quote(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// This process's node of `cluster`, as the flags say.
fn membership(
    pool: Pool,
    cluster: String,
    node_id: Option<String>,
    heartbeat: Option<Duration>,
    ttl: Option<Duration>,
) -> Result<Membership, fencing_election::Error> {
    let mut builder = Membership::builder(pool, cluster);
    if let Some(node_id) = node_id {
        builder = builder.node_id(node_id);
    }
    if let Some(heartbeat) = heartbeat {
        builder = builder.heartbeat_interval(heartbeat);
    }
    if let Some(ttl) = ttl {
        builder = builder.ttl(ttl);
    }
    builder.build()
}

fn member_line(event: &str, at_ms: u128, member: &fencing_election::membership::Node) -> String {
    let started_ms = member.started_at.duration_since(std::time::UNIX_EPOCH).map_or(0, |since| since.as_millis());
    format!(r#"{{"event":"{event}","at_ms":{at_ms},"node":{},"started_ms":{started_ms}}}"#, quote(&member.node_id))
}

fn ms_since(origin: Instant, instant: Instant) -> u128 {
    instant.saturating_duration_since(origin).as_millis()
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("elector: {message}");
            return ExitCode::from(64);
        }
    };
    let origin = Instant::now();
    let at = move || ms_since(origin, Instant::now());
    if let Some(address) = args.metrics_listen {
        // The election metrics, at http://ADDRESS/metrics, for Prometheus.
        if let Err(error) = metrics_exporter_prometheus::PrometheusBuilder::new().with_http_listener(address).install()
        {
            eprintln!("elector: --metrics-listen {address}: {error}");
            return ExitCode::from(70);
        }
    }

    let pg_config = match args.database_url.parse::<tokio_postgres::Config>() {
        Ok(config) => config,
        Err(error) => {
            eprintln!("elector: --database-url: {error}");
            return ExitCode::from(64);
        }
    };
    let manager = Manager::from_config(pg_config, NoTls, ManagerConfig { recycling_method: RecyclingMethod::Fast });
    let pool = match Pool::builder(manager).max_size(3).build() {
        Ok(pool) => pool,
        Err(error) => {
            eprintln!("elector: build the pool: {error}");
            return ExitCode::from(70);
        }
    };
    let node = match args
        .cluster
        .map(|cluster| membership(pool.clone(), cluster, args.node_id, args.heartbeat, args.registration_ttl))
    {
        None => None,
        Some(Ok(node)) => Some(node),
        Some(Err(error)) => {
            eprintln!("elector: {error}");
            return ExitCode::from(64);
        }
    };
    let mut builder = Elector::builder(pool, args.key).ttl(args.ttl);
    if let Some(owner) = args.owner {
        builder = builder.owner(owner);
    }
    if let Some(renew) = args.renew {
        builder = builder.renew_interval(renew);
    }
    if let Some(margin) = args.margin {
        builder = builder.safety_margin(margin);
    }
    if let Some(query_timeout) = args.query_timeout {
        builder = builder.query_timeout(query_timeout);
    }
    let elector = match builder.build() {
        Ok(elector) => elector,
        Err(error) => {
            eprintln!("elector: {error}");
            return ExitCode::from(64);
        }
    };
    let (mut terminate, mut interrupt) = match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
        (Ok(terminate), Ok(interrupt)) => (terminate, interrupt),
        _ => {
            eprintln!("elector: cannot install signal handlers");
            return ExitCode::from(70);
        }
    };
    println!(
        r#"{{"event":"started","at_ms":{},"owner":{},"pid":{}}}"#,
        at(),
        quote(elector.owner()),
        std::process::id()
    );
    let handle = elector.start();
    let node = node.map(|node| {
        let node = node.start();
        let mut events = node.events();
        tokio::spawn(async move {
            loop {
                let line = match events.recv().await {
                    Ok(MemberEvent::NodeJoined(member)) => member_line("node_joined", at(), &member),
                    Ok(MemberEvent::NodeLeft(member)) => member_line("node_left", at(), &member),
                    Ok(MemberEvent::IdentityConflict { node_id }) => {
                        format!(r#"{{"event":"identity_conflict","at_ms":{},"node":{}}}"#, at(), quote(&node_id))
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(missed)) => {
                        format!(r#"{{"event":"lagged","at_ms":{},"missed":{missed}}}"#, at())
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                };
                println!("{line}");
            }
        });
        node
    });

    let mut state = handle.state();
    tokio::spawn(async move {
        while state.changed().await.is_ok() {
            let current = *state.borrow_and_update();
            match current {
                LeaderState::Leader { term, deadline } => println!(
                    r#"{{"event":"leader","at_ms":{},"term":{term},"deadline_ms":{}}}"#,
                    at(),
                    ms_since(origin, deadline)
                ),
                LeaderState::Follower => println!(r#"{{"event":"follower","at_ms":{}}}"#, at()),
            }
        }
    });

    let mut events = handle.events();
    tokio::spawn(async move {
        loop {
            let event = match events.recv().await {
                Ok(event) => event,
                // A slow printer missed some events: say so and go on.
                Err(tokio::sync::broadcast::error::RecvError::Lagged(missed)) => {
                    println!(r#"{{"event":"lagged","at_ms":{},"missed":{missed}}}"#, at());
                    continue;
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            };
            match event {
                Event::Elected { term } => {
                    println!(r#"{{"event":"elected","at_ms":{},"term":{term}}}"#, at())
                }
                Event::Lost { term, reason } => println!(
                    r#"{{"event":"lost","at_ms":{},"term":{term},"reason":{}}}"#,
                    at(),
                    quote(reason.as_label())
                ),
                Event::HolderChanged { holder, term } => println!(
                    r#"{{"event":"holder_changed","at_ms":{},"holder":{},"term":{}}}"#,
                    at(),
                    holder.as_deref().map_or_else(|| "null".to_owned(), quote),
                    term.map_or_else(|| "null".to_owned(), |t| t.to_string())
                ),
            }
        }
    });

    let tick = args.tick;
    handle.spawn_leader_work(move |leadership| async move {
        loop {
            // Checked immediately before the visible action, on this process's monotonic clock.
            let Ok(term) = leadership.check() else { return };
            println!(
                r#"{{"event":"tick","at_ms":{},"term":{term},"deadline_ms":{}}}"#,
                at(),
                ms_since(origin, leadership.deadline())
            );
            tokio::time::sleep(tick).await;
        }
    });

    tokio::select! {
        _ = terminate.recv() => {}
        _ = interrupt.recv() => {}
    }
    let released = handle.shutdown().await;
    if let Some(node) = node {
        let left = node.shutdown().await;
        println!(r#"{{"event":"left","at_ms":{},"left":{left}}}"#, at());
    }
    println!(r#"{{"event":"shutdown","at_ms":{},"released":{released}}}"#, at());
    ExitCode::SUCCESS
}
