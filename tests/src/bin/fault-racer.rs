//! The racer of the fault suite: a client that presents two adjacent terms for one resource at
//! the same instant, as a zombie and a new leader do at a term change, but on purpose and often.
//!
//! ```text
//! fault-racer --name racer --gateways ADDR,ADDR,ADDR --log FILE --seed N
//!             [--forward-timeout-ms 1000] [--lanes 12]
//! ```
//! Each lane owns one unbound resource (`race-<lane>`, on the routes `/free1` and `/free2`, so
//! through the checking and the applying upstream) and repeats a trial: one write of its current
//! term t; a pause until the gateways' horizon for t no longer covers a new write (a quarter of
//! the forward timeout), so that the next decision for t extends it; then, at once, one to four
//! writes of t and one of t + 1 through random gateways. A decision that reads the fence twice
//! (the gate race of the fence-integrity issue) or a new term that does not wait for the lower
//! term's writes in flight (the settle wait) lets a write of t reach the upstream after one of
//! t + 1; with the store deciding on one row version, every write of t is either sent before
//! the raise's settle time or refused.
//!
//! Every write is logged like a leader's (`checker/HISTORY.md`), with client `racer`, key `""`
//! (it leads nothing) and `bound: false`. SIGTERM stops it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
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

struct Args {
    name: String,
    gateways: Vec<SocketAddr>,
    log: String,
    seed: u64,
    forward_timeout: Duration,
    lanes: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        name: "racer".to_owned(),
        gateways: Vec::new(),
        log: String::new(),
        seed: 0,
        forward_timeout: Duration::from_millis(1000),
        lanes: 12,
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
}

impl Racer {
    /// One write of `term` to the lane's resource through gateway `gateway`.
    async fn write(&self, lane: usize, term: i64, gateway: usize) {
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
    }

    /// Trials on one lane, forever.
    async fn lane(&self, lane: usize, forward_timeout: Duration, mut rng: StdRng) {
        let gateways = self.gateways.len();
        let mut term = 1;
        // Lanes start spread out, so their trials do not all fall on the same instants.
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..500))).await;
        loop {
            // The resource's maximum is t (or becomes it), and the horizon covers this write.
            self.write(lane, term, rng.random_range(0..gateways)).await;
            // The horizon has a quarter of the forward timeout to spare: past that, the next
            // decision for t must extend it.
            let spare = forward_timeout / 4;
            tokio::time::sleep(spare + Duration::from_millis(rng.random_range(20..200))).await;
            let lower = rng.random_range(1..=4);
            let mut race = Vec::new();
            for _ in 0..lower {
                race.push(self.write(lane, term, rng.random_range(0..gateways)));
            }
            race.insert(rng.random_range(0..=race.len()), self.write(lane, term + 1, rng.random_range(0..gateways)));
            futures::future::join_all(race).await;
            term += 1;
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
