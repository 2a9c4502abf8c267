//! The racer of the fault suite: a client that presents two adjacent terms for one resource at
//! the same instant, as a zombie and a new leader do at a term change, but on purpose and often.
//!
//! ```text
//! fault-racer --name racer --gateways ADDR,ADDR,ADDR --log FILE --seed N
//!             [--database-url URL] [--forward-timeout-ms 1000] [--lanes 12]
//! ```
//! Each lane owns one unbound resource (`race-<lane>`, on the routes `/free1` and `/free2`, so
//! through the checking and the applying upstream) and repeats a trial: one write of its current
//! term t; a pause of a quarter of the forward timeout and more, past half of the suite's grants,
//! so that the next decisions for t through the gateways with grants renew them (a decision that
//! writes or locks, not the plain read); then, at once, one to four writes of t and one of t + 1
//! through random gateways. A decision that reads the fence twice
//! (the gate race of the fence-integrity issue) or a new term that does not wait for the lower
//! term's writes in flight (the settle wait) lets a write of t reach the upstream after one of
//! t + 1; with the store deciding on one row version, every write of t is either sent before
//! the raise's settle time or refused.
//!
//! After each trial, one more write of t goes through every gateway, as a zombie's would; and
//! each trial begins with a write of the term below (the last trial's t), repeated until it is
//! decided (the store may be down), which a raise lost in a crash would let in again.
//!
//! SIGUSR1 (the injector sends it right after stepping the store's clock) ends the pause of
//! every lane that is in it: those lanes raise through SQL at once (with `--database-url`), so
//! term changes meet grants given before the step, as a term change waiting on the wall clock
//! would not.
//!
//! With `--database-url`, a third of the raises to t + 1 go through SQL instead, as an
//! application's own transaction: `fencing.admit` of the lane's fence, then a row in
//! `race_ledger`. Such a raise is answered without any settle wait, so a gateway that still
//! admits t afterwards (a grant used past its end, or a term change that did not wait for the
//! grants on t) is seen by the client order: a write of t invoked after t + 1 was answered.
//! Paths mix as they do where a leader writes through gateways and a job through SQL: with the
//! zombie writes after an SQL raise, a write of its term goes through a gateway; and a quarter of
//! the SQL raises come as a double raise: t + 1 through a gateway, which waits there for the writes
//! of t to settle, and meanwhile t + 2 through SQL, then through a gateway. The write of t + 2
//! must settle behind the one of t + 1 still on its way (S5), which the SQL raise records for it
//! (`settle_ms`) as a gateway's raise does; one that did not would be forwarded first.
//!
//! A quarter of the raises through gateways come crossed: t + 2 through one gateway, and a moment
//! later t + 1 through another, as two would-be leaders of adjacent periods do. The lower raise
//! reads the fence before the higher one commits and locks it after; a raise that decided on the
//! version it read, not the one it locked (the gate race), would overwrite t + 2 with t + 1.
//!
//! Every write is logged like a leader's (`checker/HISTORY.md`), with client `racer`, key `""`
//! (it leads nothing) and `bound: false`. SIGTERM stops it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use fencing_tests::faultclient::{
    BoxBody, HttpClient, Log, http_client, http_write, now_us, open_log_or_exit, until_sigterm,
};
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use tokio_postgres::NoTls;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};

fn pool(url: &str) -> Result<Pool, String> {
    let config: tokio_postgres::Config = url.parse().map_err(|e| format!("--database-url: {e}"))?;
    let manager = Manager::from_config(config, NoTls, ManagerConfig { recycling_method: RecyclingMethod::Fast });
    Pool::builder(manager).max_size(12).build().map_err(|e| e.to_string())
}

struct Args {
    name: String,
    gateways: Vec<SocketAddr>,
    log: String,
    seed: u64,
    forward_timeout: Duration,
    lanes: usize,
    database_url: Option<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        name: "racer".to_owned(),
        gateways: Vec::new(),
        log: String::new(),
        seed: 0,
        forward_timeout: Duration::from_millis(1000),
        lanes: 12,
        database_url: None,
    };
    let mut words = std::env::args().skip(1);
    while let Some(flag) = words.next() {
        let value = words.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--name" => args.name = value,
            "--gateways" => {
                args.gateways = value
                    .split(',')
                    .map(|a| a.parse().map_err(|e| format!("--gateways {a}: {e}")))
                    .collect::<Result<_, _>>()?
            }
            "--log" => args.log = value,
            "--seed" => args.seed = value.parse().map_err(|e| format!("--seed: {e}"))?,
            "--forward-timeout-ms" => {
                args.forward_timeout =
                    Duration::from_millis(value.parse().map_err(|e| format!("--forward-timeout-ms: {e}"))?)
            }
            "--database-url" => args.database_url = Some(value),
            "--lanes" => args.lanes = value.parse().map_err(|e| format!("--lanes: {e}"))?,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if args.gateways.is_empty() || args.log.is_empty() || args.lanes == 0 {
        return Err("--gateways, --log and at least one lane are required".to_owned());
    }
    Ok(args)
}

struct Racer {
    name: String,
    gateways: Vec<SocketAddr>,
    http: HttpClient,
    log: Log,
    next_id: AtomicU64,
    pool: Option<Pool>,
    /// Woken by SIGUSR1: the lanes in their pause raise at once, through SQL.
    now: tokio::sync::Notify,
}

impl Racer {
    /// One write of `term` to the lane's resource through gateway `gateway`. True when it was
    /// decided: admitted (a 2xx) or refused for its term (409), not left unknown or unavailable.
    async fn write(&self, lane: usize, term: i64, gateway: usize) -> bool {
        let route = 1 + lane % 2;
        let resource = format!("race-{lane}");
        let request_id =
            format!("{}.{}.{}", self.name, std::process::id(), self.next_id.fetch_add(1, Ordering::Relaxed));
        let upstream = if route == 1 { "checking" } else { "applying" };
        let mut record = json!({
            "client": self.name, "request_id": request_id, "key": "", "path": "gateway", "mode": "verify",
            "gateway": gateway, "upstream": upstream, "resource": resource, "bound": false, "term": term,
            "invoked_us": now_us(), "completed_us": Value::Null, "outcome": "indeterminate",
            "status": Value::Null, "refused_by": Value::Null, "error": Value::Null,
        });
        self.log.write(&record);
        let request = Request::builder()
            .method(Method::POST)
            .uri(format!("http://{}/free{route}/{resource}", self.gateways[gateway]))
            .header("x-request-id", &request_id)
            .header("fencing-token", term.to_string())
            .body(BodyExt::boxed(Full::new(Bytes::from_static(b"{\"amount\":1}"))) as BoxBody);
        http_write(&self.http, &mut record, request).await;
        record["completed_us"] = json!(now_us());
        self.log.write(&record);
        record["outcome"] == "ok" || record["status"] == 409
    }

    /// One raise to `term` of the lane's fence through SQL, as an application's transaction.
    /// True when it committed.
    async fn write_sql(&self, lane: usize, term: i64, pool: &Pool) -> bool {
        let route = 1 + lane % 2;
        let resource = format!("race-{lane}");
        let fence = format!("/free{route}/{resource}");
        let request_id =
            format!("{}.{}.{}", self.name, std::process::id(), self.next_id.fetch_add(1, Ordering::Relaxed));
        let mut record = json!({
            "client": self.name, "request_id": request_id, "key": "", "path": "sql", "mode": "sql",
            "gateway": Value::Null, "upstream": Value::Null, "resource": resource, "bound": false, "term": term,
            "invoked_us": now_us(), "completed_us": Value::Null, "outcome": "indeterminate",
            "status": Value::Null, "refused_by": Value::Null, "error": Value::Null,
        });
        self.log.write(&record);
        let result = tokio::time::timeout(Duration::from_secs(5), async {
            let mut client = pool.get().await.map_err(|e| (false, e.to_string()))?;
            client.batch_execute("SET statement_timeout = 3000").await.map_err(|e| (false, e.to_string()))?;
            let transaction = client.transaction().await.map_err(|e| (false, e.to_string()))?;
            let refused = |e: tokio_postgres::Error| {
                let coded = e.as_db_error().map(|db| db.code().code().to_owned());
                (coded.is_some(), format!("SQLSTATE {}: {e}", coded.unwrap_or_default()))
            };
            transaction.batch_execute("SET LOCAL synchronous_commit = on").await.map_err(refused)?;
            transaction.query_one("SELECT fencing.admit($1, $2)", &[&fence, &term]).await.map_err(refused)?;
            let ticket: i64 = transaction
                .query_one("UPDATE fault_tickets SET n = n + 1 WHERE id = 1 RETURNING n", &[])
                .await
                .map_err(refused)?
                .get(0);
            transaction
                .execute(
                    "INSERT INTO race_ledger (request_id, resource, term, ticket) VALUES ($1, $2, $3, $4)",
                    &[&request_id, &resource, &term, &ticket],
                )
                .await
                .map_err(refused)?;
            // A failure of the commit itself leaves the outcome unknown.
            transaction.commit().await.map_err(|e| (false, e.to_string()))
        })
        .await;
        match result {
            Ok(Ok(())) => record["outcome"] = json!("ok"),
            Ok(Err((true, error))) => {
                record["outcome"] = json!("failed");
                record["refused_by"] = json!("store");
                record["error"] = json!(error);
            }
            Ok(Err((false, error))) => record["error"] = json!(error),
            Err(_) => record["error"] = json!("timed out"),
        }
        record["completed_us"] = json!(now_us());
        self.log.write(&record);
        record["outcome"] == "ok"
    }

    /// Trials on one lane, forever.
    async fn lane(&self, lane: usize, forward_timeout: Duration, mut rng: StdRng) {
        let gateways = self.gateways.len();
        let mut term = 1;
        // Lanes start spread out, so their trials do not all fall on the same instants.
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..500))).await;
        loop {
            // The term before first, as a zombie of the last trial would, again until it is
            // decided (for up to 5 s: the store may be down): after a crash, a raise answered but
            // not durable would let it in again (the runner's durability probes aim at exactly
            // that, `fencing_tests::faultprobe`; this catches it wherever a crash falls).
            if term > 1 {
                let until = tokio::time::Instant::now() + Duration::from_secs(5);
                while !self.write(lane, term - 1, rng.random_range(0..gateways)).await
                    && tokio::time::Instant::now() < until
                {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
            // The resource's maximum is t (or becomes it), with this write's forward timeout.
            self.write(lane, term, rng.random_range(0..gateways)).await;
            // Past half of a grant: the next decisions for t renew the gateways' grants.
            let spare = forward_timeout / 4;
            let pause = spare + Duration::from_millis(rng.random_range(20..200));
            let woken = tokio::select! {
                () = tokio::time::sleep(pause) => false,
                () = self.now.notified() => true,
            };
            let lower = rng.random_range(1..=4);
            // Set when this trial's raise through SQL was answered ok (declared before the race,
            // whose futures borrow it).
            let raised = AtomicBool::new(false);
            let mut race = Vec::new();
            for _ in 0..lower {
                let gateway = rng.random_range(0..gateways);
                race.push(Box::pin(async move {
                    self.write(lane, term, gateway).await;
                }) as std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>>);
            }
            let raise = rng.random_range(0..gateways);
            let by_sql = self.pool.as_ref().filter(|_| rng.random_bool(1.0 / 3.0) || woken);
            // A quarter of the SQL raises come in a double raise across paths (below): it takes
            // a trial the settle of two terms, seconds the other trials need too.
            let double = by_sql.is_some() && !woken && rng.random_bool(0.25);
            // A quarter of the other raises come crossed: t + 2 through one gateway, then t + 1
            // through another a moment later (0 to 30 ms), as two would-be leaders of adjacent
            // periods do. The lower one reads the fence before the higher commits (its grant wait
            // and durable commit hold the row) and locks it after: the newest version, the
            // higher term's, must be the one it decides on, so that it is refused.
            let crossed = by_sql.is_none() && !woken && rng.random_bool(0.25);
            let (cross_to, cross_after) = (rng.random_range(0..gateways), rng.random_range(0..30));
            let then = rng.random_range(0..gateways);
            let raised_by_sql = &raised;
            race.insert(
                rng.random_range(0..=race.len()),
                Box::pin(async move {
                    match by_sql {
                        // Paths mixed as where a leader writes through gateways and a job
                        // through SQL: t + 1 through a gateway (settling there behind the
                        // writes of t), and while it waits, t + 2 through SQL, then through a
                        // gateway the moment that is answered. The write of t + 2 must settle
                        // behind the one of t + 1 still on its way (S5), which the SQL raise
                        // records for it as a gateway's raise does.
                        Some(pool) if double => {
                            let first = self.write(lane, term + 1, raise);
                            let second = async {
                                tokio::time::sleep(Duration::from_millis(20)).await;
                                if self.write_sql(lane, term + 2, pool).await {
                                    self.write(lane, term + 2, then).await;
                                }
                            };
                            futures::join!(first, second);
                        }
                        Some(pool) => {
                            if self.write_sql(lane, term + 1, pool).await {
                                raised_by_sql.store(true, Ordering::Relaxed);
                            }
                        }
                        None if crossed => {
                            let higher = self.write(lane, term + 2, raise);
                            let lower = async {
                                tokio::time::sleep(Duration::from_millis(cross_after)).await;
                                self.write(lane, term + 1, cross_to).await;
                            };
                            futures::join!(higher, lower);
                        }
                        None => {
                            self.write(lane, term + 1, raise).await;
                        }
                    }
                }) as std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>>,
            );
            futures::future::join_all(race).await;
            // Then t once more through every gateway, as a zombie would: whether t + 1 was
            // admitted or not, none of these may be admitted after an ok answer for t + 1 (a
            // grant on t used past its end, or a raise that did not wait for it, would be).
            // With them, after a single raise through SQL, the new term through a gateway too.
            let late: Vec<_> = (0..gateways).map(|gateway| self.write(lane, term, gateway)).collect();
            let next = async {
                if raised_by_sql.load(Ordering::Relaxed) {
                    self.write(lane, term + 1, then).await;
                }
            };
            // After crossed raises, t + 1 once more too, as the lower would-be leader would.
            let lower_again = async {
                if crossed {
                    self.write(lane, term + 1, then).await;
                }
            };
            futures::join!(futures::future::join_all(late), next, lower_again);
            term += if double || crossed { 2 } else { 1 };
        }
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("fault-racer: {message}");
            std::process::exit(64);
        }
    };
    let log = open_log_or_exit("fault-racer", &args.log);
    let racer = Arc::new(Racer {
        name: args.name.clone(),
        gateways: args.gateways.clone(),
        http: http_client(),
        log,
        next_id: AtomicU64::new(0),
        pool: args.database_url.as_deref().map(pool).transpose().unwrap_or_else(|message| {
            eprintln!("fault-racer: {message}");
            std::process::exit(64);
        }),
        now: tokio::sync::Notify::new(),
    });
    let Ok(mut usr1) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1()) else {
        eprintln!("fault-racer: cannot listen for SIGUSR1");
        std::process::exit(70);
    };
    let woken = Arc::clone(&racer);
    tokio::spawn(async move {
        while usr1.recv().await.is_some() {
            woken.now.notify_waiters();
        }
    });
    let mut rng = StdRng::seed_from_u64(args.seed);
    let mut lanes = Vec::new();
    for lane in 0..args.lanes {
        let (racer, lane_rng) = (Arc::clone(&racer), StdRng::seed_from_u64(rng.random()));
        lanes.push(tokio::spawn(async move { racer.lane(lane, args.forward_timeout, lane_rng).await }));
    }
    until_sigterm("fault-racer").await;
    for lane in &lanes {
        lane.abort();
    }
    for lane in lanes {
        let _ = lane.await;
    }
}
