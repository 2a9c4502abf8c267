//! A follower process of the fault suite: it tails a stream of the fenced log with the election
//! library's `Follower` (polling, reporting every 100 ms) and logs every entry it applies, in
//! the history format of `checker/HISTORY.md` (`followers.jsonl`), before the apply returns: a
//! line per apply, so an entry applied again after a restart (at least once) shows twice.
//!
//! ```text
//! fault-follower --name follower-1 --database-url URL --stream log-k1 --log FILE
//! ```
//! A run that ends with an error (the store unreachable for long, a stream behind retention) is
//! started again after a moment, from the follower's durable cursor. SIGTERM stops it.

use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use fencing_election::log::{Entry, Follower};
use fencing_election::watch::Wakeups;
use fencing_tests::faultclient::{Log, now_us, open_log_or_exit, until_sigterm};
use serde_json::{Value, json};
use tokio_postgres::NoTls;
use tokio_util::sync::CancellationToken;

struct Args {
    name: String,
    database_url: String,
    stream: String,
    log: String,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args { name: String::new(), database_url: String::new(), stream: String::new(), log: String::new() };
    let mut words = std::env::args().skip(1);
    while let Some(flag) = words.next() {
        let value = words.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--name" => args.name = value,
            "--database-url" => args.database_url = value,
            "--stream" => args.stream = value,
            "--log" => args.log = value,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if args.name.is_empty() || args.database_url.is_empty() || args.stream.is_empty() || args.log.is_empty() {
        return Err("--name, --database-url, --stream and --log are required".to_owned());
    }
    Ok(args)
}

fn pool(url: &str) -> Result<Pool, String> {
    let config: tokio_postgres::Config = url.parse().map_err(|e| format!("--database-url: {e}"))?;
    let manager = Manager::from_config(config, NoTls, ManagerConfig { recycling_method: RecyclingMethod::Fast });
    Pool::builder(manager).max_size(2).build().map_err(|e| e.to_string())
}

/// The line of one applied entry.
fn applied_line(name: &str, stream: &str, entry: &Entry) -> Value {
    let request_id = serde_json::from_str::<Value>(&entry.payload)
        .ok()
        .and_then(|payload| payload["request_id"].as_str().map(str::to_owned));
    json!({
        "follower": name, "pid": std::process::id(), "stream": stream, "seq": entry.seq, "term": entry.term,
        "request_id": request_id, "at_us": now_us(),
    })
}

async fn follow(args: &Args, pool: Pool, log: &Log, stop: CancellationToken) {
    while !stop.is_cancelled() {
        let follower = Follower::new(pool.clone(), args.stream.clone(), args.name.clone(), Wakeups::polling())
            .report_every(Duration::from_millis(100))
            .query_timeout(Duration::from_millis(800));
        let result = follower
            .run(
                |entry: Entry| {
                    log.write(&applied_line(&args.name, &args.stream, &entry));
                    std::future::ready(Ok::<(), String>(()))
                },
                stop.clone(),
            )
            .await;
        if let Err(error) = result {
            eprintln!("fault-follower {}: {error}; following again", args.name);
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(Duration::from_millis(200)) => {}
            }
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let _ = now_us();
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("fault-follower: {message}");
            std::process::exit(64);
        }
    };
    let pool = match pool(&args.database_url) {
        Ok(pool) => pool,
        Err(error) => {
            eprintln!("fault-follower: {error}");
            std::process::exit(64);
        }
    };
    let log = open_log_or_exit("fault-follower", &args.log);
    println!("started {}", std::process::id());
    let stop = CancellationToken::new();
    let following = {
        let stop = stop.clone();
        async move { follow(&args, pool, &log, stop).await }
    };
    tokio::select! {
        () = following => {}
        () = until_sigterm("fault-follower") => stop.cancel(),
    }
}
