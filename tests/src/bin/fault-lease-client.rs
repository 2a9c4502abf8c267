//! A leader of the fault suite that uses the gateways' HTTP lease API, as a leader in another
//! language would, and records every answer it gets: acquire, renew, release.
//!
//! ```text
//! fault-lease-client --name lease-x --controls ADDR,ADDR,ADDR --key k3 --log FILE --seed N
//!                    [--ttl-ms 1500]
//! ```
//! It contends for `key` through random gateways' control listeners. While it holds the lease it
//! renews every third of the ttl, and now and then it is late on purpose: it sleeps past the end
//! of its lease (up to twice the ttl, as a paused process would) and then renews as if nothing had
//! happened, or releases. It takes every answer at its word and checks none of them (no term
//! comparison), so what the store tells a client that does not check is what the history shows:
//! the checker holds each answer against the store's history (`checker/HISTORY.md`,
//! `lease_calls.jsonl`). Its owner identity is unique per process (`<name>#<pid>`). SIGTERM stops
//! it.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use fencing_tests::faultclient::{BoxBody, HttpClient, Log, http_client, now_us, open_log_or_exit, until_sigterm};
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

struct Args {
    name: String,
    controls: Vec<SocketAddr>,
    key: String,
    log: String,
    seed: u64,
    ttl: Duration,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        name: String::new(),
        controls: Vec::new(),
        key: String::new(),
        log: String::new(),
        seed: 0,
        ttl: Duration::from_millis(1500),
    };
    let mut words = std::env::args().skip(1);
    while let Some(flag) = words.next() {
        let value = words.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--name" => args.name = value,
            "--controls" => {
                args.controls = value
                    .split(',')
                    .map(|a| a.parse().map_err(|e| format!("--controls {a}: {e}")))
                    .collect::<Result<_, _>>()?
            }
            "--key" => args.key = value,
            "--log" => args.log = value,
            "--seed" => args.seed = value.parse().map_err(|e| format!("--seed: {e}"))?,
            "--ttl-ms" => args.ttl = Duration::from_millis(value.parse().map_err(|e| format!("--ttl-ms: {e}"))?),
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if args.name.is_empty() || args.controls.is_empty() || args.key.is_empty() || args.log.is_empty() {
        return Err("--name, --controls, --key and --log are required".to_owned());
    }
    Ok(args)
}

struct Client {
    name: String,
    owner: String,
    key: String,
    controls: Vec<SocketAddr>,
    ttl: Duration,
    http: HttpClient,
    log: Log,
}

/// What one call was answered.
struct Answer {
    status: Option<u16>,
    term: Option<i64>,
}

impl Client {
    /// One call through a random gateway, recorded whatever its outcome.
    async fn call(&self, op: &str, believed: Option<i64>, rng: &mut StdRng) -> Answer {
        let gateway = rng.random_range(0..self.controls.len());
        let body = if op == "release" {
            json!({"owner": self.owner})
        } else {
            json!({"owner": self.owner, "ttl_ms": u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX)})
        };
        let uri = format!("http://{}/v1/leases/{}/{op}", self.controls[gateway], self.key);
        let mut record = json!({
            "client": self.name, "owner": self.owner, "key": self.key, "op": op, "gateway": gateway,
            "believed_term": believed, "sent_us": now_us(), "received_us": Value::Null, "status": Value::Null,
            "term": Value::Null, "remaining_ms": Value::Null, "holder": Value::Null, "error": Value::Null,
        });
        let request = Request::builder()
            .method(Method::POST)
            .uri(uri)
            .header("content-type", "application/json")
            .body(BodyExt::boxed(Full::new(Bytes::from(body.to_string()))) as BoxBody);
        let exchange = async {
            let response = self.http.request(request.map_err(|e| e.to_string())?).await.map_err(|e| e.to_string())?;
            let status = response.status().as_u16();
            let body = response.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
            Ok::<_, String>((status, serde_json::from_slice::<Value>(&body).unwrap_or(Value::Null)))
        };
        let answer = match tokio::time::timeout(Duration::from_secs(3), exchange).await {
            Ok(Ok((status, body))) => {
                record["status"] = json!(status);
                record["term"] = body["term"].clone();
                record["remaining_ms"] = body["remaining_ms"].clone();
                record["holder"] = body["holder"].clone();
                Answer { status: Some(status), term: body["term"].as_i64() }
            }
            Ok(Err(error)) => {
                record["error"] = json!(error);
                Answer { status: None, term: None }
            }
            Err(_) => {
                record["error"] = json!("timed out");
                Answer { status: None, term: None }
            }
        };
        record["received_us"] = json!(now_us());
        self.log.write(&record);
        answer
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let _ = now_us();
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("fault-lease-client: {message}");
            std::process::exit(64);
        }
    };
    let client = Client {
        owner: format!("{}#{}", args.name, std::process::id()),
        name: args.name,
        key: args.key,
        controls: args.controls,
        ttl: args.ttl,
        http: http_client(),
        log: open_log_or_exit("fault-lease-client", &args.log),
    };
    let mut rng = StdRng::seed_from_u64(args.seed ^ u64::from(std::process::id()));
    let work = async {
        // The term this client believes it holds, from its last ok acquire.
        let mut holding: Option<i64> = None;
        loop {
            match holding {
                None => {
                    let answer = client.call("acquire", None, &mut rng).await;
                    if answer.status == Some(200) {
                        holding = answer.term;
                    } else {
                        tokio::time::sleep(Duration::from_millis(rng.random_range(100..300))).await;
                    }
                }
                Some(term) => {
                    // Late on purpose now and then: past the lease's end, as a paused process; at
                    // times before the other client took the lease, at times after.
                    let wait = if rng.random_bool(0.15) {
                        client.ttl.mul_f64(rng.random_range(1.05..2.0))
                    } else {
                        client.ttl.mul_f64(rng.random_range(0.25..0.34))
                    };
                    tokio::time::sleep(wait).await;
                    if rng.random_bool(0.2) {
                        client.call("release", Some(term), &mut rng).await;
                        holding = None;
                        // Sometimes renews what it has just released, as a confused client would.
                        if rng.random_bool(0.7) {
                            client.call("renew", Some(term), &mut rng).await;
                        }
                        tokio::time::sleep(Duration::from_millis(rng.random_range(100..400))).await;
                        continue;
                    }
                    let answer = client.call("renew", Some(term), &mut rng).await;
                    match answer.status {
                        Some(200) => {}
                        // Refused: the lease is gone; anything else: renew again after the next wait.
                        Some(409) => holding = None,
                        _ => {}
                    }
                }
            }
        }
    };
    tokio::select! {
        () = work => {}
        () = until_sigterm("fault-lease-client") => {}
    }
}
