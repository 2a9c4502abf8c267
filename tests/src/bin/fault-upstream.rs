//! The fault suite's upstream: it records every request whose head arrived, with the arrival
//! time of the head and of every body piece, in the history format of `checker/HISTORY.md`.
//!
//! ```text
//! fault-upstream --name checking|applying --listen 127.0.0.1:PORT --log FILE [--checking] [--early]
//! ```
//! With `--early` it answers 200 as soon as a request's head arrives (legal in HTTP/1.1) and
//! goes on reading and recording the body: an upstream before which a proxy must not keep
//! streaming a write past its deadline.
//! With `--checking` it keeps its own maximum `Fencing-Token` per `Fencing-Resource` and answers
//! 409 (not applied) to a lower token: the upstream-side check the gateway makes one line. Without
//! it, it applies every complete request. It answers as soon as the whole body arrived. Each line
//! is written and flushed when its request ends, so a kill loses at most the requests in flight.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use fencing_tests::faultclient::Log;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Body as _;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio::net::TcpListener;

fn now_us() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

struct State {
    name: String,
    checking: bool,
    early: bool,
    log: Log,
    seq: Mutex<u64>,
    /// The highest token accepted per resource (checking mode).
    maxima: Mutex<HashMap<String, i64>>,
}

impl State {
    fn write(&self, line: &serde_json::Value) {
        self.log.write(line);
    }
}

fn header(request: &Request<Incoming>, name: &str) -> Option<String> {
    request.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned)
}

/// Records the request when dropped, so a request whose connection went away is recorded too.
struct Record {
    state: Arc<State>,
    line: serde_json::Value,
}

impl Drop for Record {
    fn drop(&mut self) {
        self.state.write(&self.line);
    }
}

async fn answer(request: Request<Incoming>, state: Arc<State>) -> Result<Response<Full<Bytes>>, Infallible> {
    let head_at = now_us();
    let seq = state.seq.lock().map(|mut seq| {
        *seq += 1;
        *seq
    });
    let token = header(&request, "fencing-token").and_then(|t| t.parse::<i64>().ok());
    let resource = header(&request, "fencing-resource");
    let mut record = Record {
        state: Arc::clone(&state),
        line: json!({
            "upstream": state.name,
            "seq": seq.unwrap_or(0),
            "request_id": header(&request, "x-request-id"),
            "resource": resource,
            "token": token,
            "head_at_us": head_at,
            "chunks": [],
            "complete": false,
            "complete_at_us": null,
            "status": null,
        }),
    };
    let mut body = request.into_body();
    if state.early {
        // Answer now; read and record the body as it comes.
        tokio::spawn(async move {
            let mut chunks = Vec::new();
            while let Some(Ok(frame)) = body.frame().await {
                if let Some(data) = frame.data_ref() {
                    chunks.push(json!([now_us(), data.len()]));
                    record.line["chunks"] = json!(chunks);
                }
            }
            record.line["complete"] = json!(body.is_end_stream());
            if body.is_end_stream() {
                record.line["complete_at_us"] = json!(now_us());
                record.line["status"] = json!(200);
            }
        });
        return Ok(Response::new(Full::new(Bytes::from_static(b"{}"))));
    }
    let mut chunks = Vec::new();
    loop {
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    chunks.push(json!([now_us(), data.len()]));
                    record.line["chunks"] = json!(chunks);
                }
            }
            Some(Err(_)) => {
                // The sender aborted the request: never applied.
                return Ok(Response::builder()
                    .status(StatusCode::BAD_REQUEST)
                    .body(Full::new(Bytes::from_static(b"incomplete request")))
                    .unwrap_or_default());
            }
            None => break,
        }
    }
    record.line["complete"] = json!(true);
    record.line["complete_at_us"] = json!(now_us());
    let status = match (state.checking, &resource, token) {
        (true, Some(resource), Some(token)) => {
            let mut maxima = state.maxima.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let max = maxima.entry(resource.clone()).or_insert(token);
            if token < *max {
                StatusCode::CONFLICT
            } else {
                *max = token;
                StatusCode::OK
            }
        }
        _ => StatusCode::OK,
    };
    record.line["status"] = json!(status.as_u16());
    drop(record);
    Ok(Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap_or_default())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut name = "applying".to_owned();
    let mut listen: SocketAddr = SocketAddr::from(([127, 0, 0, 1], 0));
    let mut log = None;
    let mut checking = false;
    let mut early = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--name" => name = args.next().unwrap_or_default(),
            "--listen" => listen = args.next().and_then(|v| v.parse().ok()).unwrap_or(listen),
            "--log" => log = args.next(),
            "--checking" => checking = true,
            "--early" => early = true,
            other => {
                eprintln!("fault-upstream: unknown argument {other}");
                std::process::exit(64);
            }
        }
    }
    let Some(log) = log else {
        eprintln!("fault-upstream: --log FILE is required");
        std::process::exit(64);
    };
    // Appended to, after a restart too (a line torn by the kill is ended first).
    let file = match Log::open(&log) {
        Ok(file) => file,
        Err(error) => {
            eprintln!("fault-upstream: open {log}: {error}");
            std::process::exit(69);
        }
    };
    let listener = match TcpListener::bind(listen).await {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!("fault-upstream: bind {listen}: {error}");
            std::process::exit(69);
        }
    };
    match listener.local_addr() {
        Ok(address) => println!("listening {address}"),
        Err(error) => {
            eprintln!("fault-upstream: {error}");
            std::process::exit(69);
        }
    }
    let state =
        Arc::new(State { name, checking, early, log: file, seq: Mutex::new(0), maxima: Mutex::new(HashMap::new()) });
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let state = Arc::clone(&state);
        tokio::spawn(async move {
            let service = service_fn(move |request| answer(request, Arc::clone(&state)));
            // A request whose sender closed its side right after it (a FIN behind the body: a
            // write the gateway closed instead of resetting) is still served and recorded, as a
            // server that reads to the end does (hyper's default gives up on such a connection).
            let _ = http1::Builder::new().half_close(true).serve_connection(TokioIo::new(stream), service).await;
        });
    }
}
