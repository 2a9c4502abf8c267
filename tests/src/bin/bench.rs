//! The gateway benchmark: not a test, a measurement.
//!
//! ```text
//! cargo run --release -p fencing-tests --bin bench -- [--seconds 5] [--concurrency 8]
//! ```
//!
//! It starts a durable PostgreSQL (the server's default fsync and synchronous commit), a fast
//! upstream, a plain pass-through proxy built on the same hyper client as the gateway, and the
//! gateway, all on loopback. It drives each with the same closed-loop load (each of
//! `concurrency` workers sends its next POST when the previous answer arrives) and prints, for
//! direct / pass-through / gateway-verify / gateway-stamp (POST), and pass-through and gateway for
//! unfenced GETs: requests per second, p50 and p99, and their ratios to the pass-through with the
//! same method, plus Postgres transactions and WAL flushes per fenced write.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use axum::body::Body;
use bytes::Bytes;
use fencing_gateway::proxy::{strip_hop_by_hop, upstream_client};
use fencing_tests::gateway::{Gateway, JSON, send};
use fencing_tests::pg::{Durability, PgCluster, connect};
use fencing_tests::workspace_bin;
use http::{Method, Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::TcpListener;
use tokio::process::Command;
use tokio::time::Instant;

struct Options {
    seconds: u64,
    concurrency: usize,
}

fn options() -> Result<Options> {
    let mut options = Options { seconds: 5, concurrency: 8 };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| anyhow!("{flag} needs a value"))?;
        match flag.as_str() {
            "--seconds" => options.seconds = value.parse()?,
            "--concurrency" => options.concurrency = value.parse()?,
            other => bail!("unknown flag {other}"),
        }
    }
    Ok(options)
}

#[tokio::main]
async fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    if args.next().as_deref() == Some("passthrough") {
        let upstream: Uri = args.next().context("passthrough UPSTREAM")?.parse()?;
        return passthrough(upstream).await;
    }
    let options = options()?;
    run(&options).await
}

/// The baseline proxy: the gateway's hyper client and hop-by-hop handling, nothing else.
async fn passthrough(upstream: Uri) -> Result<()> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    println!("listening {}", listener.local_addr()?);
    let client = upstream_client(
        Duration::from_secs(1),
        fencing_gateway::tls::upstream_client_config(None, false).map_err(|e| anyhow::anyhow!(e))?,
    );
    let authority = upstream.authority().cloned().context("upstream authority")?;
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let (client, authority) = (client.clone(), authority.clone());
        tokio::spawn(async move {
            let service = service_fn(move |request: Request<Incoming>| {
                let (client, authority) = (client.clone(), authority.clone());
                async move {
                    let (mut parts, body) = request.into_parts();
                    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str()).to_owned();
                    let forwarded = Uri::builder().scheme("http").authority(authority).path_and_query(path).build();
                    let Ok(uri) = forwarded else {
                        return Ok::<_, Infallible>(status(StatusCode::BAD_REQUEST));
                    };
                    parts.uri = uri;
                    strip_hop_by_hop(&mut parts.headers);
                    parts.headers.remove(http::header::HOST);
                    match client.request(Request::from_parts(parts, Body::new(body))).await {
                        Ok(response) => {
                            let (mut parts, body) = response.into_parts();
                            strip_hop_by_hop(&mut parts.headers);
                            Ok(Response::from_parts(parts, Body::new(body)))
                        }
                        Err(_) => Ok(status(StatusCode::BAD_GATEWAY)),
                    }
                }
            });
            let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
        });
    }
}

fn status(code: StatusCode) -> Response<Body> {
    let mut response = Response::new(Body::empty());
    *response.status_mut() = code;
    response
}

struct Stats {
    requests: usize,
    errors: usize,
    rps: f64,
    p50_ms: f64,
    p99_ms: f64,
}

/// Closed-loop load: `concurrency` workers, each sending its next request when the previous
/// answer arrived, for `seconds` after one second of warm-up.
async fn load(addr: SocketAddr, method: Method, path: &str, headers: &[(&str, &str)], options: &Options) -> Stats {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let headers: Arc<Vec<(String, String)>> =
        Arc::new(headers.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect());
    let uri: Uri = format!("http://{addr}{path}").parse().unwrap_or_default();
    let warm_until = Instant::now() + Duration::from_secs(1);
    let until = warm_until + Duration::from_secs(options.seconds);
    let workers: Vec<_> = (0..options.concurrency)
        .map(|_| {
            let (client, headers, uri, method) = (client.clone(), Arc::clone(&headers), uri.clone(), method.clone());
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut errors = 0;
                loop {
                    let started = Instant::now();
                    if started >= until {
                        break;
                    }
                    let mut request = Request::builder().method(method.clone()).uri(uri.clone());
                    for (name, value) in headers.iter() {
                        request = request.header(name, value);
                    }
                    let body = if method == Method::GET { Bytes::new() } else { Bytes::from_static(b"{\"amount\":1}") };
                    let Ok(request) = request.body(Full::new(body)) else {
                        break;
                    };
                    let ok = match client.request(request).await {
                        Ok(response) => {
                            let success = response.status().is_success();
                            success && response.into_body().collect().await.is_ok()
                        }
                        Err(_) => false,
                    };
                    if started >= warm_until {
                        if ok {
                            latencies.push(started.elapsed());
                        } else {
                            errors += 1;
                        }
                    }
                }
                (latencies, errors)
            })
        })
        .collect();
    let mut latencies = Vec::new();
    let mut errors = 0;
    for worker in workers {
        if let Ok((mut worker_latencies, worker_errors)) = worker.await {
            latencies.append(&mut worker_latencies);
            errors += worker_errors;
        }
    }
    latencies.sort_unstable();
    let quantile = |q: f64| {
        latencies
            .get(((latencies.len() as f64 * q) as usize).min(latencies.len().saturating_sub(1)))
            .map_or(f64::NAN, |d| d.as_secs_f64() * 1000.0)
    };
    Stats {
        requests: latencies.len(),
        errors,
        rps: latencies.len() as f64 / options.seconds as f64,
        p50_ms: quantile(0.50),
        p99_ms: quantile(0.99),
    }
}

/// Transactions committed or rolled back in `database`, and WAL flushes of the whole server.
async fn store_counters(client: &tokio_postgres::Client, database: &str) -> Result<(i64, i64)> {
    let transactions: i64 = client
        .query_one(
            "SELECT (xact_commit + xact_rollback)::bigint FROM pg_stat_database WHERE datname = $1",
            &[&database],
        )
        .await?
        .get(0);
    let flushes: i64 = client.query_one("SELECT wal_sync::bigint FROM pg_stat_wal", &[]).await?.get(0);
    Ok((transactions, flushes))
}

async fn run(options: &Options) -> Result<()> {
    eprintln!("bench: starting a durable PostgreSQL, an upstream, a pass-through proxy and the gateway");
    let cluster = PgCluster::start_with(Durability::On)?;
    connect(&cluster.url("postgres")).await.batch_execute("CREATE DATABASE bench").await?;
    let database_url = cluster.url("bench");
    let stats_client = connect(&cluster.url("postgres")).await;

    let mut upstream = Command::new(workspace_bin("recording-upstream")?)
        .arg("--quiet")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let upstream_addr = first_address(&mut upstream).await?;
    let mut passthrough = Command::new(std::env::current_exe()?)
        .args(["passthrough", &format!("http://{upstream_addr}")])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let passthrough_addr = first_address(&mut passthrough).await?;
    let config = format!(
        "[database]\npool_size = 16\n\
         [[routes]]\nprefix = \"/ledger\"\nupstream = \"http://{upstream_addr}\"\nresource = {{ segment = 2 }}\n\
         [[routes]]\nprefix = \"/stamped\"\nupstream = \"http://{upstream_addr}\"\nresource = {{ segment = 2 }}\n\
         lease = \"bench-writer\"\n"
    );
    let gateway = Gateway::start(&database_url, &config).await?;
    let lease = send(
        gateway.control,
        Method::POST,
        "/v1/leases/bench-writer/acquire",
        &[JSON],
        r#"{"owner":"bench","ttl_ms":3600000}"#,
    )
    .await?;
    let term = lease.json()["term"].as_i64().context("lease term")?.to_string();

    eprintln!("bench: {} workers, {} s per target after 1 s of warm-up", options.concurrency, options.seconds);
    let path = "/ledger/acct-1/entries";
    let direct = load(upstream_addr, Method::POST, path, &[], options).await;
    let pass = load(passthrough_addr, Method::POST, path, &[], options).await;
    // Unfenced reads: the proxy path's own cost, without Postgres.
    let pass_get = load(passthrough_addr, Method::GET, path, &[], options).await;
    let gateway_get = load(gateway.proxy, Method::GET, path, &[], options).await;
    let before = store_counters(&stats_client, "bench").await?;
    let verify = load(gateway.proxy, Method::POST, path, &[("fencing-token", &term)], options).await;
    let middle = store_counters(&stats_client, "bench").await?;
    let stamp = load(
        gateway.proxy,
        Method::POST,
        "/stamped/acct-2/entries",
        &[("fencing-lease", "bench-writer"), ("fencing-owner", "bench")],
        options,
    )
    .await;
    let after = store_counters(&stats_client, "bench").await?;

    println!(
        "{:<16} {:>10} {:>9} {:>9} {:>8} {:>13} {:>13}",
        "target", "req/s", "p50 ms", "p99 ms", "errors", "req/s ratio", "p99 ratio"
    );
    // Each row against the pass-through with the same method.
    for (name, stats, baseline) in [
        ("direct", &direct, &pass),
        ("pass-through", &pass, &pass),
        ("gateway-verify", &verify, &pass),
        ("gateway-stamp", &stamp, &pass),
        ("pass-through GET", &pass_get, &pass_get),
        ("gateway GET", &gateway_get, &pass_get),
    ] {
        println!(
            "{:<16} {:>10.0} {:>9.2} {:>9.2} {:>8} {:>12.2}x {:>12.2}x",
            name,
            stats.rps,
            stats.p50_ms,
            stats.p99_ms,
            stats.errors,
            stats.rps / baseline.rps,
            stats.p99_ms / baseline.p99_ms
        );
    }
    // The warm-up requests hit Postgres too, so count them in: every fenced write of the run.
    let per_write = |delta: i64, requests: usize| delta as f64 / requests.max(1) as f64;
    let verify_writes = verify.requests + verify.errors;
    let stamp_writes = stamp.requests + stamp.errors;
    println!(
        "postgres transactions per fenced write (measured writes only, warm-up included in the count, so an upper bound): \
         verify {:.2}, stamp {:.2}",
        per_write(middle.0 - before.0, verify_writes),
        per_write(after.0 - middle.0, stamp_writes)
    );
    println!(
        "WAL flushes per fenced write: verify {:.4}, stamp {:.4}",
        per_write(middle.1 - before.1, verify_writes),
        per_write(after.1 - middle.1, stamp_writes)
    );
    drop(gateway);
    upstream.kill().await.ok();
    passthrough.kill().await.ok();
    Ok(())
}

async fn first_address(child: &mut tokio::process::Child) -> Result<SocketAddr> {
    let stdout = child.stdout.take().context("stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .map_err(|_| anyhow!("no address line"))??
        .context("exited")?;
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    line.strip_prefix("listening ").context("address line")?.parse().context("address")
}
