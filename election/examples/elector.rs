//! An elector process that prints its state changes and leader-work ticks as JSON lines.
//!
//! ```text
//! cargo run -p fencing-election --example elector -- \
//!     --database-url postgres://postgres@127.0.0.1:5432/app --key demo [--owner NAME] \
//!     [--ttl-ms 10000] [--renew-ms N] [--margin-ms N] [--query-timeout-ms N] [--tick-ms 100] \
//!     [--metrics-listen 127.0.0.1:9464] \
//!     [--cluster NAME --node-id ID [--heartbeat-ms 15000] [--registration-ttl-ms 90000]] \
//!     [--append-stream STREAM] [--follow-stream STREAM --follower NAME --projection FILE
//!      [--apply-delay-ms N] [--report-every-ms N]] [--read-listen 127.0.0.1:0]
//! ```
//!
//! With `--append-stream`, its leader work appends one entry per tick to that stream of the
//! fenced log (`{"owner", "term", "n"}`, printing `appended` with `seq` and `term`, or
//! `append_refused`). With `--follow-stream`, it also follows that stream as `--follower`: each
//! entry is applied to the projection file (one JSON line per entry) unless the file already has
//! its sequence (an idempotent apply: the follower applies at least once), and `applied` lines
//! are printed. `--apply-delay-ms` makes each apply take that long (a follower that falls
//! behind).
//!
//! With `--read-listen`, it serves reads there (printing `reads` with the `address`): any GET is
//! answered `{"owner", "applied", "leader"}` (the last sequence in its projection, 0 when it
//! follows nothing; whether it leads now). Its URL goes in its lease value (`{"read_url"}`,
//! shown while it leads) and, with `--cluster`, in its node's metadata (`{"read_url",
//! "follower"}`): what a gateway route with `[routes.reads]` sends reads by.
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
use fencing_election::log::{Entry, Follower};
use fencing_election::membership::{MemberEvent, Membership};
use fencing_election::watch::Wakeups;
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
    append_stream: Option<String>,
    follow_stream: Option<String>,
    follower: Option<String>,
    projection: Option<std::path::PathBuf>,
    apply_delay: Duration,
    report_every: Option<Duration>,
    read_listen: Option<std::net::SocketAddr>,
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
        append_stream: None,
        follow_stream: None,
        follower: None,
        projection: None,
        apply_delay: Duration::ZERO,
        report_every: None,
        read_listen: None,
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
            "--append-stream" => args.append_stream = Some(value.clone()),
            "--follow-stream" => args.follow_stream = Some(value.clone()),
            "--follower" => args.follower = Some(value.clone()),
            "--projection" => args.projection = Some(value.clone().into()),
            "--apply-delay-ms" => args.apply_delay = ms()?,
            "--report-every-ms" => args.report_every = Some(ms()?),
            "--read-listen" => args.read_listen = Some(value.parse().map_err(|e| format!("{flag}: {e}"))?),
            "--metrics-listen" => args.metrics_listen = Some(value.parse().map_err(|e| format!("{flag}: {e}"))?),
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if args.follow_stream.is_some() && (args.follower.is_none() || args.projection.is_none()) {
        return Err("--follow-stream needs --follower and --projection".to_owned());
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

/// This process's node of `cluster`, as the flags say, with `metadata`.
fn membership(
    pool: Pool,
    cluster: String,
    node_id: Option<String>,
    heartbeat: Option<Duration>,
    ttl: Option<Duration>,
    metadata: Option<String>,
) -> Result<Membership, fencing_election::Error> {
    let mut builder = Membership::builder(pool, cluster);
    if let Some(metadata) = metadata {
        builder = builder.metadata(metadata);
    }
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

/// The last sequence in the projection file (0 for none).
fn last_projected(path: &std::path::Path) -> i64 {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .rev()
        .find_map(|line| serde_json::from_str::<serde_json::Value>(line).ok()?["seq"].as_i64())
        .unwrap_or(0)
}

/// Applies `entry` to the projection file once: an entry at or below the last one projected is
/// skipped (applied already, before a restart), a gap is an error.
fn project(path: &std::path::Path, last: &std::sync::Mutex<i64>, entry: &Entry, at_ms: u128) -> Result<(), String> {
    use std::io::Write;
    let mut last = last.lock().map_err(|_| "the projection's lock is poisoned".to_owned())?;
    if entry.seq <= *last {
        println!(r#"{{"event":"skipped","at_ms":{at_ms},"seq":{}}}"#, entry.seq);
        return Ok(());
    }
    if entry.seq != *last + 1 {
        return Err(format!("entry {} after {}: a gap", entry.seq, *last));
    }
    let line = serde_json::json!({"seq": entry.seq, "term": entry.term, "payload": entry.payload});
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|error| format!("open {}: {error}", path.display()))?;
    writeln!(file, "{line}").map_err(|error| format!("write {}: {error}", path.display()))?;
    *last = entry.seq;
    println!(r#"{{"event":"applied","at_ms":{at_ms},"seq":{},"term":{}}}"#, entry.seq, entry.term);
    Ok(())
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
    let manager =
        Manager::from_config(pg_config.clone(), NoTls, ManagerConfig { recycling_method: RecyclingMethod::Fast });
    let pool = match Pool::builder(manager).max_size(3).build() {
        Ok(pool) => pool,
        Err(error) => {
            eprintln!("elector: build the pool: {error}");
            return ExitCode::from(70);
        }
    };
    // Where this process serves reads, bound before anything announces it.
    let reads = match args.read_listen {
        None => None,
        Some(address) => match tokio::net::TcpListener::bind(address).await {
            Ok(listener) => Some(listener),
            Err(error) => {
                eprintln!("elector: --read-listen {address}: {error}");
                return ExitCode::from(70);
            }
        },
    };
    let read_url = reads.as_ref().and_then(|listener| listener.local_addr().ok()).map(|addr| format!("http://{addr}"));
    let metadata = read_url.as_ref().map(|url| {
        let follower = args.follower.clone().or_else(|| args.node_id.clone()).unwrap_or_default();
        serde_json::json!({"read_url": url, "follower": follower}).to_string()
    });
    let node = match args
        .cluster
        .map(|cluster| membership(pool.clone(), cluster, args.node_id, args.heartbeat, args.registration_ttl, metadata))
    {
        None => None,
        Some(Ok(node)) => Some(node),
        Some(Err(error)) => {
            eprintln!("elector: {error}");
            return ExitCode::from(64);
        }
    };
    let stop = tokio_util::sync::CancellationToken::new();
    let follower = match (args.follow_stream, args.follower, args.projection) {
        (Some(stream), Some(name), Some(path)) => {
            let wakeups = Wakeups::listen(pg_config, NoTls, stop.clone());
            let mut follower = Follower::new(pool.clone(), stream, name, wakeups);
            if let Some(every) = args.report_every {
                follower = follower.report_every(every);
            }
            Some((follower, path))
        }
        _ => None,
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
    if let Some(url) = &read_url {
        builder = builder.value(&serde_json::json!({ "read_url": url }));
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
    // The projection's last sequence, shared by the follower and the read server.
    let projected = follower.as_ref().map_or(0, |(_, path)| last_projected(path));
    let last = std::sync::Arc::new(std::sync::Mutex::new(projected));
    if let (Some(listener), Some(url)) = (reads, &read_url) {
        println!(r#"{{"event":"reads","at_ms":{},"address":{}}}"#, at(), quote(url));
        let (owner, last, state) = (handle.owner().to_owned(), std::sync::Arc::clone(&last), handle.state());
        let app = axum::Router::new().fallback(move || {
            let applied = last.lock().map_or(-1, |last| *last);
            let leader = matches!(*state.borrow(), LeaderState::Leader { deadline, .. } if Instant::now() < deadline);
            let body = serde_json::json!({"owner": owner, "applied": applied, "leader": leader});
            std::future::ready(axum::Json(body))
        });
        let stop = stop.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).with_graceful_shutdown(stop.cancelled_owned()).await;
        });
    }
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
    let appender = args.append_stream.map(|stream| handle.appender(stream));
    let owner = handle.owner().to_owned();
    handle.spawn_leader_work(move |leadership| {
        let (appender, owner) = (appender.clone(), owner.clone());
        async move {
            let mut n: u64 = 0;
            loop {
                // Checked immediately before the visible action, on this process's monotonic clock.
                let Ok(term) = leadership.check() else { return };
                println!(
                    r#"{{"event":"tick","at_ms":{},"term":{term},"deadline_ms":{}}}"#,
                    at(),
                    ms_since(origin, leadership.deadline())
                );
                if let Some(appender) = &appender {
                    n += 1;
                    let entry = serde_json::json!({"owner": owner, "term": term, "n": n});
                    match appender.append(&[entry]).await {
                        Ok(seq) => println!(r#"{{"event":"appended","at_ms":{},"seq":{seq},"term":{term}}}"#, at()),
                        Err(error) => println!(
                            r#"{{"event":"append_refused","at_ms":{},"term":{term},"error":{}}}"#,
                            at(),
                            quote(&error.to_string())
                        ),
                    }
                }
                tokio::time::sleep(tick).await;
            }
        }
    });
    let apply_delay = args.apply_delay;
    let following = follower.map(|(follower, path)| {
        let stop = stop.clone();
        tokio::spawn(async move {
            let result = follower
                .run(
                    |entry: Entry| {
                        let (path, last) = (path.clone(), std::sync::Arc::clone(&last));
                        async move {
                            tokio::time::sleep(apply_delay).await;
                            project(&path, &last, &entry, at())
                        }
                    },
                    stop,
                )
                .await;
            let error = result.err().map_or_else(|| "null".to_owned(), |error| quote(&error.to_string()));
            println!(r#"{{"event":"follower_stopped","at_ms":{},"error":{error}}}"#, at());
        })
    });

    tokio::select! {
        _ = terminate.recv() => {}
        _ = interrupt.recv() => {}
    }
    stop.cancel();
    if let Some(following) = following {
        let _ = following.await;
    }
    let released = handle.shutdown().await;
    if let Some(node) = node {
        let left = node.shutdown().await;
        println!(r#"{{"event":"left","at_ms":{},"left":{left}}}"#, at());
    }
    println!(r#"{{"event":"shutdown","at_ms":{},"released":{released}}}"#, at());
    ExitCode::SUCCESS
}
