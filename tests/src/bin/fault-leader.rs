//! A leader process of the fault suite: it contends for the lease keys `k1` and `k2` through the
//! election library and, for each key it leads, writes as fast as it reasonably can: through a
//! random gateway in verify and stamp mode, to a bound route and an unbound one, and straight
//! into the key's protected table with `SET LOCAL fencing.token`; some bodies trickle in; one in
//! sixteen bound writes forges a term the lease has not granted yet. After it loses a key, it
//! sometimes goes on writing with the old term (or, in stamp mode, its old owner identity) for a
//! while, as a leader that does not know it lost would: those writes must be refused.
//!
//! ```text
//! fault-leader --name leader-a --database-url URL --gateways ADDR,ADDR,ADDR --log FILE
//!              --elections FILE --acts FILE --appends FILE --seed N [--ttl-ms 1500] [--zombie-ms 1000]
//! ```
//! As leader of `k1` (and as a zombie of it), it also appends to the fenced log `log-k1`, one
//! entry `{"request_id"}` per append every 10 to 40 ms, logged to the appends file.
//! Every write is logged twice in the history format of `checker/HISTORY.md`: once when invoked
//! (outcome `indeterminate`) and once when it ended; the runner keeps the last line per request.
//! Every election and loss it sees is logged to the elections file. Every leader-only act (a batch
//! of writes while the elector says it leads: the well-behaved leader, as opposed to the zombie
//! writes after it found it no longer leads) is logged to the acts file with the term, the instant
//! just before it asked the elector, and the local deadline it acted under (S7).
//!
//! Planted bugs in the election library (`FAILPOINTS`, the `fail` crate's syntax) are set up at
//! start; the suite sets them only for a planted-bug run.
//! SIGTERM resigns gracefully (the electors shut down and release), then the process exits.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use fencing_election::{Elector, ElectorHandle};
use fencing_tests::faultclient::{
    BoxBody, HttpClient, Log, http_client, http_write, instant_us, now_us, open_log_or_exit, until_sigterm,
};
use http::{Method, Request};
use http_body_util::{BodyExt, Full, StreamBody};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use tokio_postgres::NoTls;

struct Args {
    name: String,
    database_url: String,
    gateways: Vec<SocketAddr>,
    log: String,
    elections: String,
    acts: String,
    appends: String,
    seed: u64,
    ttl: Duration,
    zombie: Duration,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        name: String::new(),
        database_url: String::new(),
        gateways: Vec::new(),
        log: String::new(),
        elections: String::new(),
        acts: String::new(),
        appends: String::new(),
        seed: 0,
        ttl: Duration::from_millis(1500),
        zombie: Duration::from_millis(1000),
    };
    let mut words = std::env::args().skip(1);
    while let Some(flag) = words.next() {
        let value = words.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--name" => args.name = value,
            "--database-url" => args.database_url = value,
            "--gateways" => {
                args.gateways = value
                    .split(',')
                    .map(|a| a.parse().map_err(|e| format!("--gateways {a}: {e}")))
                    .collect::<Result<_, _>>()?
            }
            "--log" => args.log = value,
            "--elections" => args.elections = value,
            "--acts" => args.acts = value,
            "--appends" => args.appends = value,
            "--seed" => args.seed = value.parse().map_err(|e| format!("--seed: {e}"))?,
            "--ttl-ms" => args.ttl = Duration::from_millis(value.parse().map_err(|e| format!("--ttl-ms: {e}"))?),
            "--zombie-ms" => {
                args.zombie = Duration::from_millis(value.parse().map_err(|e| format!("--zombie-ms: {e}"))?)
            }
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if args.name.is_empty()
        || args.database_url.is_empty()
        || args.gateways.is_empty()
        || args.log.is_empty()
        || args.elections.is_empty()
        || args.acts.is_empty()
        || args.appends.is_empty()
    {
        return Err(
            "--name, --database-url, --gateways, --log, --elections, --acts and --appends are required".to_owned()
        );
    }
    Ok(args)
}

/// What one key's writer knows: the term it believes it leads with.
struct Key {
    key: &'static str,
    elector: ElectorHandle,
    /// The last term it led with, and when this writer first saw that it no longer leads
    /// (for zombie writes).
    last: Mutex<Option<(i64, Option<tokio::time::Instant>)>>,
}

struct Leader {
    name: String,
    gateways: Vec<SocketAddr>,
    http: HttpClient,
    database_url: String,
    log: Log,
    /// Leader-only acts, with the deadline each acted under (S7).
    acts: Log,
    /// Appends to the fenced log.
    appends: Log,
    /// The appends' connection, while it works.
    append_client: tokio::sync::Mutex<Option<tokio_postgres::Client>>,
    next_id: AtomicU64,
    zombie: Duration,
}

#[derive(Clone, Copy)]
enum Kind {
    Verify,
    Stamp,
    Unbound,
    Sql,
}

impl Leader {
    fn request_id(&self) -> String {
        format!("{}.{}.{}", self.name, std::process::id(), self.next_id.fetch_add(1, Ordering::Relaxed))
    }

    /// One write for `key` with `term`, of a random kind.
    async fn write(&self, key: &Key, term: i64, leading: bool, rng: &mut StdRng) {
        // Stamp mode for zombies too, and more often: the gateway must stamp only for the lease's
        // holder, and a zombie's stamp writes meet the next holder's lease.
        let kind = match (leading, rng.random_range(0..10)) {
            (true, 0..=3) | (false, 0..=1) => Kind::Verify,
            (true, 4..=5) | (false, 2..=6) => Kind::Stamp,
            (true, 6) | (false, 7) => Kind::Unbound,
            _ => Kind::Sql,
        };
        // Now and then a forged token on a bound resource: a term the lease has not granted yet
        // (S4: it must not poison the fence, nor be admitted).
        let term = match kind {
            Kind::Verify | Kind::Sql if rng.random_ratio(1, 16) => term + rng.random_range(1..=3),
            _ => term,
        };
        let index = if key.key == "k1" { 1 } else { 2 };
        let suffix = if rng.random_bool(0.5) { "a" } else { "b" };
        // A bound write through the gateway sometimes names the key's protected table's resource
        // (ledger-k1, bound to k1 too): SQL writers and gateway writers then share one fence.
        let bound_resource =
            if rng.random_bool(0.3) { format!("ledger-{}", key.key) } else { format!("{}-{suffix}", key.key) };
        let request_id = self.request_id();
        let (path, mode, resource, upstream, bound) = match kind {
            Kind::Verify => ("gateway", "verify", bound_resource, upstream_of(index), true),
            Kind::Stamp => ("gateway", "stamp", bound_resource, upstream_of(index), true),
            Kind::Unbound => ("gateway", "verify", format!("f{index}-{suffix}"), upstream_of(index), false),
            Kind::Sql => ("sql", "sql", format!("ledger-{}", key.key), Value::Null, true),
        };
        let gateway = rng.random_range(0..self.gateways.len());
        let presented = if matches!(kind, Kind::Stamp) { Value::Null } else { json!(term) };
        let mut record = json!({
            "client": self.name, "owner": key.elector.owner(), "request_id": request_id, "key": key.key,
            "path": path, "mode": mode,
            "gateway": if path == "gateway" { json!(gateway) } else { Value::Null },
            "upstream": upstream, "resource": resource, "bound": bound, "term": presented,
            "invoked_us": now_us(), "completed_us": Value::Null, "outcome": "indeterminate",
            "status": Value::Null, "refused_by": Value::Null, "error": Value::Null,
        });
        self.log.write(&record);
        match kind {
            Kind::Sql => self.sql_write(&mut record, key.key, &resource, term).await,
            _ => {
                let uri = match kind {
                    Kind::Unbound => format!("http://{}/free{index}/{resource}", self.gateways[gateway]),
                    _ => format!("http://{}/{}/{resource}", self.gateways[gateway], key.key),
                };
                let mut request = Request::builder().method(Method::POST).uri(uri).header("x-request-id", &request_id);
                request = match kind {
                    Kind::Stamp => {
                        request.header("fencing-lease", key.key).header("fencing-owner", key.elector.owner())
                    }
                    _ => request.header("fencing-token", term.to_string()),
                };
                let trickle = rng.random_bool(0.1);
                let body: BoxBody = if trickle {
                    let chunks = futures::stream::unfold(0, |n| async move {
                        if n >= 3 {
                            return None;
                        }
                        tokio::time::sleep(Duration::from_millis(150)).await;
                        Some((
                            Ok::<_, std::convert::Infallible>(hyper::body::Frame::data(Bytes::from_static(b"xxxx"))),
                            n + 1,
                        ))
                    });
                    BodyExt::boxed(StreamBody::new(chunks))
                } else {
                    BodyExt::boxed(Full::new(Bytes::from_static(b"{\"amount\":1}")))
                };
                http_write(&self.http, &mut record, request.body(body)).await;
            }
        }
        record["completed_us"] = json!(now_us());
        self.log.write(&record);
    }

    /// A connection of its own for one write, whose statements give up after 2 s.
    async fn connect(&self) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
        let (client, connection) = tokio_postgres::connect(&self.database_url, NoTls).await?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        client.batch_execute("SET statement_timeout = 2000").await?;
        Ok(client)
    }

    async fn sql_write(&self, record: &mut Value, key: &str, resource: &str, term: i64) {
        let result = tokio::time::timeout(Duration::from_secs(3), async {
            let mut client = self.connect().await?;
            let transaction = client.transaction().await?;
            // The application's own rows are durable because it asks for it: the suite's database
            // commits asynchronously, to test that the fencing functions override that.
            transaction.batch_execute("SET LOCAL synchronous_commit = on").await?;
            transaction.execute("SELECT set_config('fencing.token', $1, true)", &[&term.to_string()]).await?;
            let table = format!("ledger_{key}");
            let request_id = record["request_id"].as_str().unwrap_or_default().to_owned();
            transaction
                .execute(
                    &format!("INSERT INTO {table} (request_id, resource, term) VALUES ($1, $2, $3)"),
                    &[&request_id, &resource, &term],
                )
                .await?;
            let ticket: i64 =
                transaction.query_one("UPDATE fault_tickets SET n = n + 1 WHERE id = 1 RETURNING n", &[]).await?.get(0);
            transaction
                .execute(&format!("UPDATE {table} SET ticket = $1 WHERE request_id = $2"), &[&ticket, &request_id])
                .await?;
            // Anything that fails from here on may or may not have committed.
            Ok::<_, tokio_postgres::Error>(transaction.commit().await.map_err(|e| (true, e)))
        })
        .await;
        match result {
            Ok(Ok(Ok(()))) => record["outcome"] = json!("ok"),
            Ok(Ok(Err((_, error)))) => record["error"] = json!(error.to_string()),
            Ok(Err(error)) => {
                let code = error.as_db_error().map(|db| db.code().code().to_owned());
                record["error"] = json!(error.to_string());
                if let Some(code) = code {
                    // The server refused a statement before COMMIT: the transaction rolled back.
                    record["outcome"] = json!("failed");
                    record["refused_by"] = json!("store");
                    record["error"] = json!(format!("SQLSTATE {code}: {error}"));
                }
            }
            Err(_) => record["error"] = json!("timed out"),
        }
    }
}

/// The fenced log the leaders of `k1` append to (bound to `k1`).
const STREAM: &str = "log-k1";

impl Leader {
    /// One append of `term` to [`STREAM`], in a transaction of its own: an error before COMMIT
    /// rolled it back (`failed`), one at COMMIT may or may not have committed.
    async fn append(&self, key: &Key, term: i64) {
        let request_id = self.request_id();
        let mut record = json!({
            "client": self.name, "owner": key.elector.owner(), "request_id": request_id, "key": key.key,
            "stream": STREAM, "term": term, "invoked_us": now_us(), "completed_us": Value::Null,
            "outcome": "indeterminate", "seq": Value::Null, "error": Value::Null,
        });
        self.appends.write(&record);
        let payload = json!({ "request_id": request_id }).to_string();
        // One connection for the appends, kept while they succeed (a connection per append
        // would fork a backend every few milliseconds); any error or timeout drops it.
        let mut slot = self.append_client.lock().await;
        let result = tokio::time::timeout(Duration::from_secs(3), async {
            let mut client = match slot.take() {
                Some(client) => client,
                None => self.connect().await?,
            };
            let transaction = client.transaction().await?;
            let seq: i64 = transaction
                .query_one(
                    "SELECT fencing.append($1, $2, ARRAY[$3::text::jsonb], $4)",
                    &[&STREAM, &term, &payload, &key.key],
                )
                .await?
                .get(0);
            // Anything that fails from here on may or may not have committed.
            let committed = transaction.commit().await.map(|()| seq);
            if committed.is_ok() {
                *slot = Some(client);
            }
            Ok::<_, tokio_postgres::Error>(committed)
        })
        .await;
        drop(slot);
        match result {
            Ok(Ok(Ok(seq))) => {
                record["outcome"] = json!("ok");
                record["seq"] = json!(seq);
            }
            Ok(Ok(Err(error))) => record["error"] = json!(error.to_string()),
            Ok(Err(error)) => match error.as_db_error().map(|db| db.code().code().to_owned()) {
                // The server refused a statement before COMMIT: the transaction rolled back.
                Some(code) => {
                    record["outcome"] = json!("failed");
                    record["error"] = json!(format!("SQLSTATE {code}: {error}"));
                }
                None => record["error"] = json!(error.to_string()),
            },
            Err(_) => record["error"] = json!("timed out"),
        }
        record["completed_us"] = json!(now_us());
        self.appends.write(&record);
    }
}

fn upstream_of(index: usize) -> Value {
    json!(if index == 1 { "checking" } else { "applying" })
}

fn pool(url: &str) -> Result<Pool, String> {
    let config: tokio_postgres::Config = url.parse().map_err(|e| format!("--database-url: {e}"))?;
    let manager = Manager::from_config(config, NoTls, ManagerConfig { recycling_method: RecyclingMethod::Fast });
    Pool::builder(manager).max_size(2).build().map_err(|e| e.to_string())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    // The history's clock takes its first reading as its start (a slow or fast leader).
    let _ = now_us();
    let _failpoints = fail::FailScenario::setup();
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("fault-leader: {message}");
            std::process::exit(64);
        }
    };
    let log = open_log_or_exit("fault-leader", &args.log);
    let mut keys = Vec::new();
    for key in ["k1", "k2"] {
        let pool = match pool(&args.database_url) {
            Ok(pool) => pool,
            Err(error) => {
                eprintln!("fault-leader: {error}");
                std::process::exit(64);
            }
        };
        let elector = Elector::builder(pool, key)
            .owner(args.name.clone())
            .ttl(args.ttl)
            .renew_interval(args.ttl / 3)
            .safety_margin(args.ttl / 10)
            .query_timeout(args.ttl / 5)
            .build();
        match elector {
            Ok(elector) => keys.push(Arc::new(Key { key, elector: elector.start(), last: Mutex::new(None) })),
            Err(error) => {
                eprintln!("fault-leader: {error}");
                std::process::exit(64);
            }
        }
    }
    let leader = Arc::new(Leader {
        name: args.name.clone(),
        gateways: args.gateways.clone(),
        http: http_client(),
        database_url: args.database_url.clone(),
        log,
        acts: open_log_or_exit("fault-leader", &args.acts),
        appends: open_log_or_exit("fault-leader", &args.appends),
        append_client: tokio::sync::Mutex::new(None),
        next_id: AtomicU64::new(0),
        zombie: args.zombie,
    });
    let elections = Arc::new(open_log_or_exit("fault-leader", &args.elections));
    // Every period this process believes it leads: the checker holds them against the store's
    // history (a grant lost in a crash shows up as a term two owners were elected with).
    for key in &keys {
        let mut events = key.elector.events();
        let (elections, owner, key_name) = (Arc::clone(&elections), key.elector.owner().to_owned(), key.key);
        tokio::spawn(async move {
            loop {
                match events.recv().await {
                    Ok(fencing_election::Event::Elected { term }) => elections.write(&json!({
                        "owner": owner, "key": key_name, "term": term, "event": "elected", "at_us": now_us(),
                    })),
                    Ok(fencing_election::Event::Lost { term, .. }) => elections.write(&json!({
                        "owner": owner, "key": key_name, "term": term, "event": "lost", "at_us": now_us(),
                    })),
                    Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                }
            }
        });
    }
    println!("started {}", std::process::id());
    let mut writers = Vec::new();
    for (index, key) in keys.iter().enumerate() {
        let (leader, key) = (Arc::clone(&leader), Arc::clone(key));
        let mut rng = StdRng::seed_from_u64(args.seed ^ (index as u64 + 1) ^ u64::from(std::process::id()));
        writers.push(tokio::spawn(async move {
            loop {
                // The instant before the elector is asked: a period it answers with lasted at
                // least until then.
                let checked_us = now_us();
                let period = key.elector.leadership();
                if let Some(period) = &period {
                    // ...and the instant after it answered: the check lies in between.
                    let acted_us = now_us();
                    leader.acts.write(&json!({
                        "owner": key.elector.owner(), "key": key.key, "term": period.term(),
                        "checked_us": checked_us, "acted_us": acted_us,
                        "deadline_us": instant_us(period.deadline()),
                    }));
                }
                let leading = period.map(|period| period.term());
                let term = {
                    let mut last = key.last.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    match (leading, *last) {
                        (Some(term), _) => {
                            *last = Some((term, None));
                            Some(term)
                        }
                        // A leader that does not know it lost: its old term, for a while after
                        // this writer first finds it no longer leads (a pause ends, say).
                        (None, Some((term, None))) => {
                            *last = Some((term, Some(tokio::time::Instant::now())));
                            Some(term)
                        }
                        (None, Some((term, Some(noticed)))) => (noticed.elapsed() < leader.zombie).then_some(term),
                        (None, None) => None,
                    }
                };
                if let Some(term) = term {
                    let writes = if leading.is_some() { 3 } else { 1 };
                    let mut rngs: Vec<StdRng> = (0..writes).map(|_| StdRng::seed_from_u64(rng.random())).collect();
                    let batch = rngs.iter_mut().map(|rng| leader.write(&key, term, leading.is_some(), rng));
                    futures::future::join_all(batch).await;
                }
                tokio::time::sleep(Duration::from_millis(rng.random_range(10..40))).await;
            }
        }));
    }
    // The fenced log: appends to `log-k1` while leading `k1`, and for a while after this process
    // first finds it no longer leads (a zombie), every 10 to 40 ms.
    if let Some(key) = keys.iter().find(|key| key.key == "k1") {
        let (leader, key) = (Arc::clone(&leader), Arc::clone(key));
        let mut rng = StdRng::seed_from_u64(args.seed ^ 0x00a9_9e4d ^ u64::from(std::process::id()));
        writers.push(tokio::spawn(async move {
            let mut last: Option<(i64, Option<tokio::time::Instant>)> = None;
            loop {
                let term = match (key.elector.leadership().map(|period| period.term()), last) {
                    (Some(term), _) => {
                        last = Some((term, None));
                        Some(term)
                    }
                    (None, Some((term, None))) => {
                        last = Some((term, Some(tokio::time::Instant::now())));
                        Some(term)
                    }
                    (None, Some((term, Some(noticed)))) => (noticed.elapsed() < leader.zombie).then_some(term),
                    (None, None) => None,
                };
                if let Some(term) = term {
                    leader.append(&key, term).await;
                }
                tokio::time::sleep(Duration::from_millis(rng.random_range(10..40))).await;
            }
        }));
    }
    until_sigterm("fault-leader").await;
    for writer in &writers {
        writer.abort();
    }
    for writer in writers {
        let _ = writer.await;
    }
    for key in keys {
        if let Ok(key) = Arc::try_unwrap(key) {
            let _ = key.elector.shutdown().await;
        }
    }
}
