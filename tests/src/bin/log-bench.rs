//! The fenced log's benchmark: not a test, a measurement.
//!
//! ```text
//! cargo run --release -p fencing-tests --bin log-bench -- [--seconds 5] [--appenders 8] [--rate 200]
//! ```
//!
//! It starts a durable PostgreSQL of its own (the server's default fsync and synchronous
//! commit) and measures, each for `--seconds`:
//! - appends per second of one entry each, from `--appenders` connections, to one stream, and
//!   spread at random over 100 streams (one lease);
//! - the tail latency, from an append's commit (its answer) to a `Follower`'s apply of it, with
//!   1 and with 10 followers woken by LISTEN/NOTIFY, while one appender appends `--rate` entries
//!   per second: p50, p99 and the maximum over every follower's applies.
//!
//! Appenders and followers run in this process, so both instants are on one monotonic clock.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use fencing_election::log::{Entry, Follower};
use fencing_election::watch::Wakeups;
use fencing_schema::log::{self as store_log, Retention};
use fencing_schema::store;
use fencing_tests::pg::{Durability, PgCluster, connect};
use rand::Rng;
use tokio::time::Instant;
use tokio_postgres::NoTls;
use tokio_util::sync::CancellationToken;

const DATABASE: &str = "log_bench";

struct Options {
    seconds: u64,
    appenders: usize,
    rate: u64,
}

fn options() -> Result<Options> {
    let mut options = Options { seconds: 5, appenders: 8, rate: 200 };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--seconds" => options.seconds = value.parse()?,
            "--appenders" => options.appenders = value.parse()?,
            "--rate" => options.rate = value.parse()?,
            other => bail!("unknown flag {other}"),
        }
    }
    if options.seconds == 0 || options.appenders == 0 || options.rate == 0 {
        bail!("--seconds, --appenders and --rate must be positive");
    }
    Ok(options)
}

fn pool(url: &str, size: usize) -> Result<Pool> {
    let config: tokio_postgres::Config = url.parse()?;
    let manager = Manager::from_config(config, NoTls, ManagerConfig { recycling_method: RecyclingMethod::Fast });
    Ok(Pool::builder(manager).max_size(size).build()?)
}

/// Appends one entry at a time from `appenders` connections for `seconds`, each to one of
/// `streams` at random; returns appends per second.
async fn throughput(url: &str, term: i64, streams: &[String], appenders: usize, seconds: u64) -> Result<f64> {
    let until = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for _ in 0..appenders {
        let client = connect(url).await;
        let streams = streams.to_vec();
        tasks.push(tokio::spawn(async move {
            let mut count = 0u64;
            while Instant::now() < until {
                let stream = &streams[rand::rng().random_range(0..streams.len())];
                store_log::append(&client, stream, term, &[r#"{"order": 1, "state": "shipped"}"#]).await?;
                count += 1;
            }
            Ok::<u64, fencing_schema::Error>(count)
        }));
    }
    let mut total = 0;
    for task in tasks {
        total += task.await??;
    }
    Ok(total as f64 / seconds as f64)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

/// One appender at `rate` per second for `seconds` to `stream`, and `followers` followers
/// tailing it: the latencies from each append's answer to each follower's apply, in ms.
async fn tail_latency(
    url: &str,
    term: i64,
    stream: &str,
    followers: usize,
    rate: u64,
    seconds: u64,
) -> Result<Vec<f64>> {
    let stop = CancellationToken::new();
    let wakeups = Wakeups::listen(url.parse()?, NoTls, stop.clone());
    for _ in 0..100 {
        if wakeups.listening() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Each follower's applies (sequence, instant), and each append's answer, compared at the end.
    let applies: Arc<Mutex<Vec<(i64, Instant)>>> = Arc::default();
    let mut committed: HashMap<i64, Instant> = HashMap::new();
    let follower_pool = pool(url, 4)?;
    let mut tasks = Vec::new();
    for n in 0..followers {
        let follower = Follower::new(follower_pool.clone(), stream, format!("f{n}"), wakeups.clone());
        let (applies, stop) = (Arc::clone(&applies), stop.clone());
        tasks.push(tokio::spawn(async move {
            follower
                .run(
                    |entry: Entry| {
                        let applied = Instant::now();
                        if let Ok(mut applies) = applies.lock() {
                            applies.push((entry.seq, applied));
                        }
                        async { Ok::<(), String>(()) }
                    },
                    stop,
                )
                .await
        }));
    }
    // The followers start at the head: wait for each to have read once.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let client = connect(url).await;
    let interval = Duration::from_secs_f64(1.0 / rate as f64);
    let until = Instant::now() + Duration::from_secs(seconds);
    let mut next = Instant::now();
    while Instant::now() < until {
        tokio::time::sleep_until(next).await;
        next += interval;
        let seq = store_log::append(&client, stream, term, &[r#"{"order": 1}"#]).await?;
        committed.insert(seq, Instant::now());
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.cancel();
    for task in tasks {
        task.await??;
    }
    // An apply seen before its append's answer arrived counts as 0.
    let applies = applies.lock().map_err(|_| anyhow::anyhow!("a follower panicked"))?.clone();
    let mut latencies: Vec<f64> = applies
        .iter()
        .filter_map(|(seq, applied)| {
            committed.get(seq).map(|at| applied.saturating_duration_since(*at).as_secs_f64() * 1000.0)
        })
        .collect();
    latencies.sort_by(f64::total_cmp);
    Ok(latencies)
}

#[tokio::main]
async fn main() -> Result<()> {
    let options = options()?;
    let cluster = PgCluster::start_with(Durability::On)?;
    let admin = connect(&cluster.url("postgres")).await;
    admin.batch_execute(&format!("CREATE DATABASE {DATABASE}")).await?;
    let url = cluster.url(DATABASE);
    let mut client = connect(&url).await;
    fencing_schema::migrate(&mut client).await?;
    let term = store::acquire(&client, "bench", "bench", Duration::from_secs(3600)).await?.term.context("no term")?;
    let streams: Vec<String> = (0..100).map(|n| format!("s{n}")).collect();
    for stream in streams.iter().chain(["one".to_owned(), "tail-1".to_owned(), "tail-10".to_owned()].iter()) {
        store_log::create_stream(&client, stream, "bench", Retention::default()).await?;
    }
    println!(
        "log-bench: durable PostgreSQL, {} s per measurement, {} appenders, one entry per append",
        options.seconds, options.appenders
    );
    let one = throughput(&url, term, &["one".to_owned()], options.appenders, options.seconds).await?;
    println!("appends/s, one stream:        {one:>10.0}");
    let many = throughput(&url, term, &streams, options.appenders, options.seconds).await?;
    println!("appends/s, 100 streams:       {many:>10.0}");
    for (followers, stream) in [(1, "tail-1"), (10, "tail-10")] {
        let latencies = tail_latency(&url, term, stream, followers, options.rate, options.seconds).await?;
        println!(
            "tail latency, {followers:>2} follower(s), {} appends/s: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms ({} applies)",
            options.rate,
            percentile(&latencies, 0.50),
            percentile(&latencies, 0.99),
            latencies.last().copied().unwrap_or(f64::NAN),
            latencies.len()
        );
    }
    Ok(())
}
