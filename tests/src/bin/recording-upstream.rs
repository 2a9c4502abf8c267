//! A small upstream for tests, demos and benchmarks. It answers every request with 200 and a
//! short JSON body, and, unless `--quiet`, prints one JSON line per complete request it
//! received, with the fencing headers the gateway stamped, in the order the requests completed
//! arriving (the order an upstream acts on them). Aborted requests are not logged.
//!
//! ```text
//! recording-upstream [--listen 127.0.0.1:0] [--quiet]
//! ```
//! The first line on stdout is `listening <address>`. A request header `x-upstream-delay-ms: N`
//! delays the answer by N milliseconds (for timeout and ordering tests). It applies every write:
//! `GET /__applied` answers the bodies of every request other than a GET it received, one per
//! line (the state `fencing-gateway verify --check-url` reads), unless `--quiet`.

use std::convert::Infallible;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

fn header(request: &Request<Incoming>, name: &str) -> String {
    match request.headers().get(name).and_then(|v| v.to_str().ok()) {
        Some(value) => serde_json::to_string(value).unwrap_or_else(|_| "null".to_owned()),
        None => "null".to_owned(),
    }
}

async fn answer(
    request: Request<Incoming>,
    seq: Arc<AtomicU64>,
    applied: Arc<std::sync::Mutex<Vec<u8>>>,
    quiet: bool,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if request.method() == http::Method::GET && request.uri().path() == "/__applied" {
        let state = applied.lock().map(|bodies| bodies.clone()).unwrap_or_default();
        return Ok(Response::new(Full::new(Bytes::from(state))));
    }
    let write = request.method() != http::Method::GET;
    let delay =
        request.headers().get("x-upstream-delay-ms").and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    let n = seq.fetch_add(1, Ordering::SeqCst);
    let line = if quiet {
        None
    } else {
        Some(format!(
            r#"{{"seq":{n},"method":{},"path":{},"fencing_token":{},"fencing_resource":{},"fencing_owner":{},"fencing_lease":{},"forwarded":{},"host":{},"connection":{},"x_hop":{},"x_request_id":{},"authorization":{},"x_forwarded_for":{},"x_real_ip":{}"#,
            serde_json::to_string(request.method().as_str()).unwrap_or_default(),
            serde_json::to_string(&request.uri().to_string()).unwrap_or_default(),
            header(&request, "fencing-token"),
            header(&request, "fencing-resource"),
            header(&request, "fencing-owner"),
            header(&request, "fencing-lease"),
            header(&request, "forwarded"),
            header(&request, "host"),
            header(&request, "connection"),
            header(&request, "x-hop"),
            header(&request, "x-request-id"),
            header(&request, "authorization"),
            header(&request, "x-forwarded-for"),
            header(&request, "x-real-ip"),
        ))
    };
    // A request whose body did not arrive whole was aborted by its sender: an upstream does not
    // act on it, so it is not logged.
    let Ok(body) = request.into_body().collect().await.map(|b| b.to_bytes()) else {
        let mut response = Response::new(Full::new(Bytes::from_static(b"incomplete request")));
        *response.status_mut() = http::StatusCode::BAD_REQUEST;
        return Ok(response);
    };
    // Logged when the request is complete, in that order: what the upstream acts on.
    if let Some(line) = line {
        let mut stdout = std::io::stdout().lock();
        let _ = writeln!(stdout, r#"{line},"body_bytes":{}}}"#, body.len());
        let _ = stdout.flush();
    }
    if write
        && !quiet
        && let Ok(mut bodies) = applied.lock()
    {
        bodies.extend_from_slice(&body);
        bodies.push(b'\n');
    }
    if let Some(delay) = delay {
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
    let mut response = Response::new(Full::new(Bytes::from(format!("{{\"seq\":{n}}}"))));
    response.headers_mut().insert("content-type", http::HeaderValue::from_static("application/json"));
    response.headers_mut().insert("x-upstream-seq", http::HeaderValue::from(n));
    // An upstream that speaks the gateway's headers itself (or is confused): the gateway must
    // not relay them as if they were its own.
    response.headers_mut().insert("fencing-current-term", http::HeaderValue::from_static("999"));
    Ok(response)
}

#[tokio::main]
async fn main() {
    let mut listen: SocketAddr = SocketAddr::from(([127, 0, 0, 1], 0));
    let mut quiet = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--listen" => match args.next().and_then(|v| v.parse().ok()) {
                Some(address) => listen = address,
                None => {
                    eprintln!("recording-upstream: --listen needs an address");
                    std::process::exit(64);
                }
            },
            "--quiet" => quiet = true,
            other => {
                eprintln!("recording-upstream: unknown argument {other}");
                std::process::exit(64);
            }
        }
    }
    let listener = match TcpListener::bind(listen).await {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!("recording-upstream: bind {listen}: {error}");
            std::process::exit(69);
        }
    };
    match listener.local_addr() {
        Ok(address) => println!("listening {address}"),
        Err(error) => {
            eprintln!("recording-upstream: {error}");
            std::process::exit(69);
        }
    }
    let seq = Arc::new(AtomicU64::new(0));
    let applied = Arc::new(std::sync::Mutex::new(Vec::new()));
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (seq, applied) = (Arc::clone(&seq), Arc::clone(&applied));
        tokio::spawn(async move {
            let service = service_fn(move |request| answer(request, Arc::clone(&seq), Arc::clone(&applied), quiet));
            let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
        });
    }
}
