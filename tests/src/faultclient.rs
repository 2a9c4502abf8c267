//! What the fault suite's client processes (`fault-leader`, `fault-racer`) share: the history's
//! clock, the client log, and one HTTP write through a gateway classified as the checker reads it
//! (`checker/HISTORY.md`: ok, failed and by whom, or indeterminate).

use std::io::Write as _;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::Request;
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};

/// A request body of any shape (whole or trickled).
pub type BoxBody = http_body_util::combinators::BoxBody<Bytes, std::convert::Infallible>;

/// The HTTP client of a fault-suite process.
pub type HttpClient = Client<HttpConnector, BoxBody>;

/// Microseconds since the Unix epoch on the real-time clock: the history's clock.
///
/// A process the suite runs slow or fast under libfaketime (`FAKETIME="+0 xRATE"`: fake time is
/// start plus RATE times the real time since) is told RATE in `FENCING_FAULT_CLOCK_RATE`, and
/// records real time all the same: it takes its first reading as the start and scales what
/// passed since (to within the milliseconds between the library's start and that reading).
pub fn now_us() -> i64 {
    let fake =
        SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
    let (start, rate) = *START.get_or_init(|| (fake, rate_from_env()));
    if rate == 1.0 {
        return fake;
    }
    start + ((fake - start) as f64 / rate) as i64
}

/// The history clock's start (its first reading) and the rate this process's clocks run at.
static START: OnceLock<(i64, f64)> = OnceLock::new();

fn rate_from_env() -> f64 {
    let rate = std::env::var("FENCING_FAULT_CLOCK_RATE").ok().and_then(|r| r.parse::<f64>().ok());
    rate.filter(|r| r.is_finite() && *r > 0.0).unwrap_or(1.0)
}

/// An instant of this process's monotonic clock (tokio's) on the history's clock: the real time
/// at which it falls (or fell). The two clocks are read as a pair with nothing between them (a
/// pair that took over a millisecond, a pause of the process, is read again), so a pause of the
/// process anywhere else does not move the answer.
pub fn instant_us(at: tokio::time::Instant) -> i64 {
    let rate = START.get().map_or_else(rate_from_env, |start| start.1);
    let mut tries = 0;
    loop {
        let before = tokio::time::Instant::now();
        let now = now_us();
        let after = tokio::time::Instant::now();
        tries += 1;
        if after.duration_since(before) < Duration::from_millis(1) || tries >= 20 {
            let middle = before + after.duration_since(before) / 2;
            let ahead_us = if at >= middle {
                at.duration_since(middle).as_secs_f64() * 1e6
            } else {
                -(middle.duration_since(at).as_secs_f64() * 1e6)
            };
            return now + (ahead_us / rate) as i64;
        }
    }
}

/// A pooled HTTP/1.1 client that gives up connecting after a second.
pub fn http_client() -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(Duration::from_secs(1)));
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new()).build(connector)
}

/// A history log: one JSON line per record, each appended by one write. A process restarted
/// after a kill appends to its predecessor's log: a line the kill tore is ended first, so the
/// torn line alone is lost (the runner drops lines that do not parse), not the next record too.
pub struct Log(Mutex<std::fs::File>);

impl Log {
    /// Opens `path` for appending, ending a torn last line.
    pub fn open(path: &str) -> std::io::Result<Log> {
        use std::io::{Read as _, Seek as _, SeekFrom};
        let mut file = std::fs::OpenOptions::new().create(true).read(true).append(true).open(path)?;
        if file.metadata()?.len() > 0 {
            let mut last = [0_u8];
            file.seek(SeekFrom::End(-1))?;
            file.read_exact(&mut last)?;
            if last[0] != b'\n' {
                file.write_all(b"\n")?;
            }
        }
        Ok(Log(Mutex::new(file)))
    }

    /// Appends one record, in one write.
    pub fn write(&self, line: &Value) {
        if let Ok(mut file) = self.0.lock() {
            let _ = file.write_all(format!("{line}\n").as_bytes());
        }
    }
}

/// Sends one write through a gateway and records its outcome in `record`: `ok` on a 2xx;
/// `failed` on a 4xx or 503 the gateway made (a problem of type `urn:fencing-gateway:...`), on a
/// 409 from the checking upstream, or when nothing could be sent; `indeterminate` otherwise.
pub async fn http_write(http: &HttpClient, record: &mut Value, request: Result<Request<BoxBody>, http::Error>) {
    let Ok(request) = request else {
        record["outcome"] = json!("failed");
        record["error"] = json!("request could not be built");
        return;
    };
    // One bound for the whole exchange, the response body included.
    let exchange = async {
        let response = http.request(request).await?;
        let status = response.status();
        let problem = response
            .headers()
            .get("content-type")
            .is_some_and(|v| v.as_bytes().starts_with(b"application/problem+json"));
        let body = response.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
        Ok::<_, hyper_util::client::legacy::Error>((status, problem, body))
    };
    match tokio::time::timeout(Duration::from_secs(5), exchange).await {
        Ok(Ok((status, problem, body))) => {
            let problem_type = problem
                .then(|| serde_json::from_slice::<Value>(&body).ok())
                .flatten()
                .and_then(|v| v.get("type").and_then(Value::as_str).map(str::to_owned));
            let made_by_gateway = problem_type.as_deref().is_some_and(|t| t.starts_with("urn:fencing-gateway:"));
            record["status"] = json!(status.as_u16());
            // Which refusal it was (a 503 for a store that is down, or for clocks not yet
            // trusted), for whoever reads the history.
            if let Some(problem_type) = problem_type {
                record["error"] = json!(problem_type);
            }
            let (outcome, refused_by) = if status.is_success() {
                ("ok", Value::Null)
            } else if made_by_gateway && (status.is_client_error() || status.as_u16() == 503) {
                ("failed", json!("gateway"))
            } else if status.as_u16() == 409 {
                ("failed", json!("upstream"))
            } else {
                ("indeterminate", Value::Null)
            };
            record["outcome"] = json!(outcome);
            record["refused_by"] = refused_by;
        }
        Ok(Err(error)) => {
            // Connection refused before anything was sent is certain; anything else is not.
            record["error"] = json!(error.to_string());
            if error.is_connect() {
                record["outcome"] = json!("failed");
            }
        }
        Err(_) => record["error"] = json!("timed out"),
    }
}

/// Opens the client log at `path`, or exits with 69 (`program` names the process).
pub fn open_log_or_exit(program: &str, path: &str) -> Log {
    match Log::open(path) {
        Ok(log) => log,
        Err(error) => {
            eprintln!("{program}: open {path}: {error}");
            std::process::exit(69);
        }
    }
}

/// Returns when the process gets SIGTERM; exits with 70 when it cannot listen for it.
pub async fn until_sigterm(program: &str) {
    let Ok(mut terminate) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) else {
        eprintln!("{program}: cannot install a SIGTERM handler");
        std::process::exit(70);
    };
    terminate.recv().await;
}
