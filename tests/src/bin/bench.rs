//! The gateway benchmark: not a test, a measurement.
//!
//! ```text
//! cargo run --release -p fencing-tests --bin bench -- [--seconds 5] [--concurrency 32,1] [--rounds 3] \
//!     [--only 'gw verify, grants|pass-through'] [--resources 1,100,10000,100000] [--verbose]
//! ```
//!
//! It starts a durable PostgreSQL (the server's default fsync and synchronous commit), a fast
//! upstream, a plain pass-through proxy (hyper server, hyper-util pooled client), nginx
//! when it is installed (2 workers, keep-alive to the upstream), and two gateways, one without
//! grants (`grant_ms = 0`) and one with (`grant_ms = 400`), all on loopback. It drives each with
//! the same closed-loop load (each of `concurrency` connections sends its next request when the
//! previous answer arrives), every target once per round, rounds interleaved, and prints the
//! median round per target: requests per second, p50 and p99, their ratios to the pass-through
//! and to nginx, the gateway's Postgres transactions (decision round trips) per request, and the
//! CPU time per request of the proxy process (the gateway's, the pass-through's).
//! `--verbose` also prints every round's p50, p90, p99, p99.9 and maximum. `--resources` adds,
//! per value N, writes spread at random over N resources: through the gateway with grants on a
//! bound route (one lease grant covers them) and on an unbound one (a grant per resource written
//! often enough), through the gateway without grants on the unbound one, and through the
//! pass-through and nginx on the same paths, their baselines. Each target's first
//! round pays one decision per resource (the warm-up second, and more for large N): the median
//! round is a later one, and `--verbose` shows each.
//! Then it measures how long the first write of a new term takes while the old term's grant is
//! held (a grant period plus the settle wait at most), and what the monotonic waits of schema
//! version 8 cost a term change against the wall-clock waits before them.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use axum::body::Body;
use bytes::Bytes;
use fencing_gateway::proxy::strip_hop_by_hop;
use fencing_gateway::proxy::upstream::connector;
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

/// The gateway benchmark: every target driven with the same closed-loop load, rounds
/// interleaved, the median round printed.
#[derive(Debug, clap::Parser)]
#[command(name = "bench")]
struct Options {
    /// Seconds of load per target and round (after 1 s of warm-up).
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Closed-loop connections, one run of every target per value (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "32,1", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    concurrency: Vec<usize>,
    /// Rounds of every target, interleaved; the median round is printed.
    #[arg(long, default_value_t = 3, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    rounds: usize,
    /// Only the targets whose name contains one of these (`|`-separated; all when empty).
    #[arg(long, value_delimiter = '|')]
    only: Vec<String>,
    /// Print every round's quantiles, not only the median round.
    #[arg(long)]
    verbose: bool,
    /// Also spread writes over this many resources, per value (comma-separated): bound and
    /// unbound routes through the gateway with grants (and unbound without), and the
    /// pass-through and nginx on the same paths.
    #[arg(long, value_delimiter = ',', value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    resources: Vec<usize>,
}

#[tokio::main]
async fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    if args.next().as_deref() == Some("passthrough") {
        let upstream: Uri = args.next().context("passthrough UPSTREAM")?.parse()?;
        return passthrough(upstream).await;
    }
    let mut options = <Options as clap::Parser>::parse();
    options.only = options.only.iter().map(|name| name.trim().to_owned()).collect();
    run(&options).await
}

/// The baseline proxy: hyper's server, hyper-util's pooled client (with the gateway's
/// connector) and the gateway's hop-by-hop handling, nothing else.
async fn passthrough(upstream: Uri) -> Result<()> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    println!("listening {}", listener.local_addr()?);
    let tls = fencing_gateway::security::tls::upstream_client_config(None, false).map_err(|e| anyhow::anyhow!(e))?;
    let client: Client<_, Body> = Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .build(connector(Duration::from_secs(1), tls));
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

#[derive(Debug, Clone, Copy, Default)]
struct Stats {
    requests: usize,
    errors: usize,
    rps: f64,
    p50_ms: f64,
    p99_ms: f64,
    p90_ms: f64,
    p999_ms: f64,
    max_ms: f64,
}

/// Closed-loop load: `concurrency` workers, each sending its next request when the previous
/// answer arrived, for `seconds` after one second of warm-up.
async fn load(
    addr: SocketAddr,
    method: Method,
    (path, spread): (&str, usize),
    headers: &[(String, String)],
    concurrency: usize,
    seconds: u64,
) -> Stats {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let headers: Arc<Vec<(String, String)>> = Arc::new(headers.to_vec());
    let uri: Uri = format!("http://{addr}{path}").parse().unwrap_or_default();
    // With a spread, each request names one of `spread` resources at random: `{n}` in the path.
    let path_spreads = path.contains("{n}");
    let (before, after) = path.split_once("{n}").unwrap_or((path, ""));
    let (before, after) = (before.to_owned(), after.to_owned());
    let spread_uri =
        Arc::new(move |n: usize| -> Uri { format!("http://{addr}{before}{n}{after}").parse().unwrap_or_default() });
    let warm_until = Instant::now() + Duration::from_secs(1);
    let until = warm_until + Duration::from_secs(seconds);
    let workers: Vec<_> = (0..concurrency)
        .map(|worker| {
            let (client, headers, uri, method) = (client.clone(), Arc::clone(&headers), uri.clone(), method.clone());
            let spread_uri = Arc::clone(&spread_uri);
            tokio::spawn(async move {
                use rand::{Rng, SeedableRng};
                let mut rng = rand::rngs::StdRng::seed_from_u64(worker as u64);
                let mut latencies = Vec::new();
                let mut errors = 0;
                loop {
                    let started = Instant::now();
                    if started >= until {
                        break;
                    }
                    let uri = if spread > 1 {
                        spread_uri(rng.random_range(0..spread))
                    } else if path_spreads {
                        spread_uri(0)
                    } else {
                        uri.clone()
                    };
                    let mut request = Request::builder().method(method.clone()).uri(uri);
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
        rps: latencies.len() as f64 / seconds as f64,
        p50_ms: quantile(0.50),
        p99_ms: quantile(0.99),
        p90_ms: quantile(0.90),
        p999_ms: quantile(0.999),
        max_ms: quantile(1.0),
    }
}

/// Fence-decision round trips a gateway has made (each one Postgres transaction: one call of
/// `fencing.gate_many`), from its own `/metrics`. Postgres's own counters would do too, but
/// backends report them up to seconds late, into the next target's window.
async fn decision_round_trips(gateway: &Gateway) -> Result<i64> {
    let reply = send(gateway.control, Method::GET, "/metrics", &[], "").await?;
    let text = String::from_utf8_lossy(&reply.body).into_owned();
    let count = text
        .lines()
        .find(|line| line.starts_with("fencing_check_batch_size_count"))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse::<f64>().ok())
        .unwrap_or(0.0);
    Ok(count as i64)
}

/// Writes each of the `spread` resources of `path` (`{n}` in it) once, 32 at a time; returns how
/// many were not answered 2xx.
async fn prime(addr: SocketAddr, path: &str, spread: usize, headers: &[(String, String)]) -> usize {
    const AT_ONCE: usize = 32;
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let (before, after) = path.split_once("{n}").unwrap_or((path, ""));
    let workers: Vec<_> = (0..AT_ONCE)
        .map(|worker| {
            let client = client.clone();
            let headers = headers.to_vec();
            let (before, after) = (before.to_owned(), after.to_owned());
            tokio::spawn(async move {
                let mut failed = 0;
                for n in (worker..spread).step_by(AT_ONCE) {
                    let uri: Uri = format!("http://{addr}{before}{n}{after}").parse().unwrap_or_default();
                    let mut request = Request::builder().method(Method::POST).uri(uri);
                    for (name, value) in &headers {
                        request = request.header(name, value);
                    }
                    let Ok(request) = request.body(Full::new(Bytes::from_static(b"{\"amount\":1}"))) else {
                        failed += 1;
                        continue;
                    };
                    let ok = match client.request(request).await {
                        Ok(response) => response.status().is_success() && response.into_body().collect().await.is_ok(),
                        Err(_) => false,
                    };
                    failed += usize::from(!ok);
                }
                failed
            })
        })
        .collect();
    let mut failed = 0;
    for worker in workers {
        failed += worker.await.unwrap_or(spread);
    }
    failed
}

/// A process's resident memory in KiB, from `/proc/PID/status` (0 when unknown).
fn rss_kb(pid: Option<i32>) -> u64 {
    let Some(pid) = pid else { return 0 };
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else { return 0 };
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kb| kb.parse().ok())
        .unwrap_or(0)
}

/// CPU time (user + system) a process has used, from `/proc/PID/stat`.
fn cpu_time(pid: Option<i32>) -> Duration {
    let Some(pid) = pid else { return Duration::ZERO };
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return Duration::ZERO };
    // The fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat.rsplit_once(')').map_or(vec![], |(_, rest)| rest.split_whitespace().collect());
    let ticks = |index: usize| fields.get(index).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100).max(1) as u64;
    Duration::from_micros((ticks(11) + ticks(12)) * 1_000_000 / hz)
}

/// A running nginx. Its master process is stopped with SIGTERM, which stops its workers too,
/// when this is dropped: a SIGKILL (`kill_on_drop`) ends the master alone and leaves its
/// workers running, holding the upstream's connections and CPU time into the next run.
struct Nginx {
    child: tokio::process::Child,
    addr: SocketAddr,
}

impl Nginx {
    /// Stops nginx and waits (at most 10 s) for its master to end.
    async fn stop(mut self) {
        self.terminate();
        let _ = tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await;
    }

    fn terminate(&self) {
        if let Some(pid) = self.child.id().and_then(|id| i32::try_from(id).ok()) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGTERM);
        }
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        self.terminate();
    }
}

/// nginx as a plain reverse proxy to `upstream`, when the binary is installed.
async fn start_nginx(upstream: SocketAddr, dir: &std::path::Path) -> Result<Option<Nginx>> {
    let Some(binary) = ["/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/local/nginx/sbin/nginx"]
        .into_iter()
        .map(std::path::PathBuf::from)
        .find(|path| path.exists())
    else {
        return Ok(None);
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
    let config = dir.join("nginx.conf");
    std::fs::write(
        &config,
        format!(
            "worker_processes 2;\ndaemon off;\nerror_log {dir}/error.log;\npid {dir}/nginx.pid;\n\
             events {{ worker_connections 1024; }}\n\
             http {{\n  access_log off;\n  client_body_temp_path {dir}/body;\n  proxy_temp_path {dir}/proxy;\n\
             fastcgi_temp_path {dir}/fastcgi;\n  uwsgi_temp_path {dir}/uwsgi;\n  scgi_temp_path {dir}/scgi;\n\
             upstream app {{ server {upstream}; keepalive 64; }}\n\
             server {{ listen {addr}; location / {{ proxy_pass http://app; proxy_http_version 1.1; \
             proxy_set_header Connection \"\"; }} }}\n}}\n",
            dir = dir.display()
        ),
    )?;
    let child = Command::new(binary)
        .args(["-p", &dir.display().to_string(), "-c", &config.display().to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let nginx = Nginx { child, addr };
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return Ok(Some(nginx));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("nginx did not listen on {addr}")
}

/// One load target.
struct Target {
    name: &'static str,
    addr: SocketAddr,
    method: Method,
    path: String,
    /// Resources the writes are spread over (`{n}` in the path): 1, one resource.
    spread: usize,
    headers: Vec<(String, String)>,
    /// The gateway process, for its decision round trips (Postgres transactions).
    gateway: Option<usize>,
    /// The proxy process whose CPU time per request is reported (a gateway, the pass-through).
    cpu_pid: Option<i32>,
}

/// What one target measured in one round.
#[derive(Debug, Clone, Copy, Default)]
struct Round {
    stats: Stats,
    transactions: i64,
    cpu: Duration,
    /// The proxy process's resident memory at the round's end, in KiB.
    rss_kb: u64,
}

const GRANT_MS: u64 = 400;

async fn run(options: &Options) -> Result<()> {
    eprintln!(
        "bench: starting a durable PostgreSQL, an upstream, a pass-through proxy, nginx if installed and two gateways"
    );
    let cluster = PgCluster::start_with(Durability::On)?;
    connect(&cluster.url("postgres")).await.batch_execute("CREATE DATABASE bench").await?;
    let database_url = cluster.url("bench");
    let scratch = std::env::temp_dir().join(format!("fencing-bench-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;

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
    let nginx = start_nginx(upstream_addr, &scratch).await?;
    let config = |grant_ms: u64| {
        format!(
            "[database]\npool_size = 16\ngrant_ms = {grant_ms}\n[upstream]\nforward_timeout_ms = 1000\n\
             [[routes]]\nprefix = \"/ledger\"\nupstream = \"http://{upstream_addr}\"\nresource = {{ segment = 2 }}\n\
             [[routes]]\nprefix = \"/bound\"\nupstream = \"http://{upstream_addr}\"\nresource = {{ segment = 2 }}\n\
             lease = \"bench-writer\"\n"
        )
    };
    // The third: the default configuration, routes only (grants and proxy threads by default).
    let default_config = format!(
        "[[routes]]\nprefix = \"/ledger\"\nupstream = \"http://{upstream_addr}\"\nresource = {{ segment = 2 }}\n"
    );
    let gateways = [
        Gateway::start(&database_url, &config(0)).await?,
        Gateway::start(&database_url, &config(GRANT_MS)).await?,
        Gateway::start(&database_url, &default_config).await?,
    ];
    let lease = send(
        gateways[0].control,
        Method::POST,
        "/v1/leases/bench-writer/acquire",
        &[JSON],
        r#"{"owner":"bench","ttl_ms":3600000}"#,
    )
    .await?;
    let passthrough_pid = passthrough.id().and_then(|id| i32::try_from(id).ok());
    let gateway_pid = |index: usize| gateways[index].pid().map(|pid| pid.as_raw());
    let term = lease.json()["term"].as_i64().context("lease term")?.to_string();
    let header = |name: &str, value: &str| (name.to_owned(), value.to_owned());
    let token = vec![header("fencing-token", &term)];
    let stamp = vec![header("fencing-lease", "bench-writer"), header("fencing-owner", "bench")];

    let mut targets = vec![
        Target {
            name: "direct",
            addr: upstream_addr,
            method: Method::POST,
            path: "/ledger/acct-1/entries".to_owned(),
            spread: 1,
            headers: vec![],
            gateway: None,
            cpu_pid: None,
        },
        Target {
            name: "pass-through",
            addr: passthrough_addr,
            method: Method::POST,
            path: "/ledger/acct-1/entries".to_owned(),
            spread: 1,
            headers: vec![],
            gateway: None,
            cpu_pid: passthrough_pid,
        },
    ];
    if let Some(Nginx { addr, .. }) = &nginx {
        targets.push(Target {
            name: "nginx",
            addr: *addr,
            method: Method::POST,
            path: "/ledger/acct-1/entries".to_owned(),
            spread: 1,
            headers: vec![],
            gateway: None,
            cpu_pid: None,
        });
    } else {
        println!("nginx: not installed, its rows are skipped (apt-get install nginx-light)");
    }
    for (index, suffix) in [(0, "no grants"), (1, "grants")] {
        let addr = gateways[index].proxy;
        let name = |mode: &str| -> &'static str { Box::leak(format!("gw {mode}, {suffix}").into_boxed_str()) };
        targets.push(Target {
            name: name("verify"),
            addr,
            method: Method::POST,
            path: "/ledger/acct-1/entries".to_owned(),
            spread: 1,
            headers: token.clone(),
            gateway: Some(index),
            cpu_pid: gateway_pid(index),
        });
        targets.push(Target {
            name: name("stamp"),
            addr,
            method: Method::POST,
            path: "/bound/acct-2/entries".to_owned(),
            spread: 1,
            headers: stamp.clone(),
            gateway: Some(index),
            cpu_pid: gateway_pid(index),
        });
        targets.push(Target {
            name: name("bound verify"),
            addr,
            method: Method::POST,
            path: "/bound/acct-3/entries".to_owned(),
            spread: 1,
            headers: token.clone(),
            gateway: Some(index),
            cpu_pid: gateway_pid(index),
        });
    }
    targets.push(Target {
        name: "gw verify, default config",
        addr: gateways[2].proxy,
        method: Method::POST,
        path: "/ledger/acct-4/entries".to_owned(),
        spread: 1,
        headers: token.clone(),
        gateway: Some(2),
        cpu_pid: gateway_pid(2),
    });
    targets.push(Target {
        name: "pass-through GET",
        addr: passthrough_addr,
        method: Method::GET,
        path: "/ledger/acct-1/entries".to_owned(),
        spread: 1,
        headers: vec![],
        gateway: None,
        cpu_pid: passthrough_pid,
    });
    targets.push(Target {
        name: "gw GET",
        addr: gateways[0].proxy,
        method: Method::GET,
        path: "/ledger/acct-1/entries".to_owned(),
        spread: 1,
        headers: vec![],
        gateway: Some(0),
        cpu_pid: gateway_pid(0),
    });

    // Writes spread over N resources: the gateway with grants on a bound route (its lease's
    // grant covers them all) and on an unbound one (a grant per resource), and the baselines on
    // the same paths.
    for &n in &options.resources {
        let name = |what: &str| -> &'static str { Box::leak(format!("{what}, N={n}").into_boxed_str()) };
        let spread = |name: &'static str,
                      addr,
                      path: String,
                      headers: Vec<(String, String)>,
                      gateway: Option<usize>,
                      cpu_pid| {
            Target { name, addr, method: Method::POST, path, spread: n, headers, gateway, cpu_pid }
        };
        targets.push(spread(
            name("pass-through"),
            passthrough_addr,
            format!("/ledger/n{n}-{{n}}/entries"),
            vec![],
            None,
            passthrough_pid,
        ));
        if let Some(Nginx { addr, .. }) = &nginx {
            targets.push(spread(name("nginx"), *addr, format!("/ledger/n{n}-{{n}}/entries"), vec![], None, None));
        }
        targets.push(spread(
            name("gw bound, grants"),
            gateways[1].proxy,
            format!("/bound/n{n}-{{n}}/entries"),
            token.clone(),
            Some(1),
            gateway_pid(1),
        ));
        targets.push(spread(
            name("gw unbound, grants"),
            gateways[1].proxy,
            format!("/ledger/n{n}-{{n}}/entries"),
            token.clone(),
            Some(1),
            gateway_pid(1),
        ));
        targets.push(spread(
            name("gw unbound, no grants"),
            gateways[0].proxy,
            format!("/ledger/n{n}-{{n}}/entries"),
            token.clone(),
            Some(0),
            gateway_pid(0),
        ));
    }
    if !options.only.is_empty() {
        targets.retain(|target| options.only.iter().any(|name| target.name.contains(name.as_str())));
    }
    for (index, gateway) in gateways.iter().enumerate() {
        let pid = gateway.pid().map_or(-1, |pid| pid.as_raw());
        let grants = ["0", "400", "the default"][index];
        eprintln!("bench: gateway {index} (grant_ms {grants}) is pid {pid}");
    }
    // A leader that writes to N resources pays one decision per resource and term, once: each
    // spread target through a gateway is primed (every resource written once, 32 at a time)
    // before its rounds, and what that took is printed. Its rounds then measure the steady state.
    for target in targets.iter().filter(|t| t.spread > 1 && t.gateway.is_some()) {
        let started = Instant::now();
        let failed = prime(target.addr, &target.path, target.spread, &target.headers).await;
        println!(
            "primed {}: {} first writes in {:.1} s ({failed} not answered 2xx)",
            target.name,
            target.spread,
            started.elapsed().as_secs_f64()
        );
    }
    for &concurrency in &options.concurrency {
        eprintln!(
            "bench: {concurrency} connections, {} s per target after 1 s of warm-up, {} rounds",
            options.seconds, options.rounds
        );
        let mut rounds: Vec<Vec<Round>> = vec![Vec::new(); targets.len()];
        for _ in 0..options.rounds {
            for (index, target) in targets.iter().enumerate() {
                let pid = target.cpu_pid;
                let round_trips = async || match target.gateway {
                    Some(g) => decision_round_trips(&gateways[g]).await,
                    None => Ok(0),
                };
                let (tx0, cpu0) = (round_trips().await?, cpu_time(pid));
                let stats = load(
                    target.addr,
                    target.method.clone(),
                    (&target.path, target.spread),
                    &target.headers,
                    concurrency,
                    options.seconds,
                )
                .await;
                let (tx1, cpu1) = (round_trips().await?, cpu_time(pid));
                if options.verbose {
                    eprintln!(
                        "bench: {:<24} {:>7.0} req/s  p50 {:.2}  p90 {:.2}  p99 {:.2}  p99.9 {:.2}  max {:.2} ms  {} PG tx",
                        target.name,
                        stats.rps,
                        stats.p50_ms,
                        stats.p90_ms,
                        stats.p99_ms,
                        stats.p999_ms,
                        stats.max_ms,
                        tx1 - tx0
                    );
                }
                rounds[index].push(Round {
                    stats,
                    transactions: tx1 - tx0,
                    cpu: cpu1.saturating_sub(cpu0),
                    rss_kb: rss_kb(pid),
                });
            }
        }
        // Ratios to a baseline are the median of the ratios within each round (the rounds are
        // interleaved, so a round's targets share the machine's state of the moment).
        let paired = |target: usize, baseline: usize, of: fn(&Stats) -> f64| -> f64 {
            let mut ratios: Vec<f64> =
                rounds[target].iter().zip(&rounds[baseline]).map(|(t, b)| of(&t.stats) / of(&b.stats)).collect();
            ratios.sort_by(f64::total_cmp);
            ratios.get(ratios.len() / 2).copied().unwrap_or(f64::NAN)
        };
        let rps = |stats: &Stats| stats.rps;
        let p99 = |stats: &Stats| stats.p99_ms;
        // The median round by req/s, per target.
        let median: Vec<Round> = rounds
            .clone()
            .into_iter()
            .map(|mut r| {
                r.sort_by(|a, b| a.stats.rps.total_cmp(&b.stats.rps));
                r[r.len() / 2]
            })
            .collect();
        let find = |name: &str| targets.iter().position(|t| t.name == name);
        // A spread target is compared with the baselines on the same paths.
        let spread_of = |name: &str| name.rsplit_once(", N=").map(|(_, n)| n.to_owned());
        println!("\n{concurrency} connections (median of {} rounds of {} s):", options.rounds, options.seconds);
        println!(
            "{:<30} {:>9} {:>8} {:>8} {:>6} {:>9} {:>9} {:>9} {:>9} {:>8} {:>9} {:>8}",
            "target",
            "req/s",
            "p50 ms",
            "p99 ms",
            "errors",
            "vs pass",
            "vs nginx",
            "p99/pass",
            "p99/nginx",
            "PG tx/w",
            "CPU us/r",
            "RSS MiB"
        );
        for (index, (target, round)) in targets.iter().zip(&median).enumerate() {
            let stats = round.stats;
            let spread = spread_of(target.name);
            let baseline = match &spread {
                Some(n) => find(&format!("pass-through, N={n}")),
                None if target.method == Method::GET => find("pass-through GET"),
                None => find("pass-through"),
            };
            let nginx = match &spread {
                Some(n) => find(&format!("nginx, N={n}")),
                None => find("nginx"),
            };
            let ratio = |baseline: Option<usize>, of: fn(&Stats) -> f64| {
                baseline.map_or_else(|| "-".to_owned(), |b| format!("{:.2}x", paired(index, b, of)))
            };
            let requests = (stats.requests + stats.errors).max(1) as f64;
            // Warm-up requests count in both totals: transactions and CPU over all requests sent.
            let sent = requests * (options.seconds as f64 + 1.0) / options.seconds as f64;
            let (vs_nginx, p99_nginx) = match target.method == Method::GET {
                false => (ratio(nginx, rps), ratio(nginx, p99)),
                true => ("-".to_owned(), "-".to_owned()),
            };
            let (vs_pass, p99_pass) = (ratio(baseline, rps), ratio(baseline, p99));
            let tx = match target.gateway {
                Some(_) => format!("{:.3}", round.transactions as f64 / sent),
                None => "-".to_owned(),
            };
            let cpu = match target.cpu_pid {
                Some(_) => format!("{:.1}", round.cpu.as_secs_f64() * 1e6 / sent),
                None => "-".to_owned(),
            };
            let rss = match target.cpu_pid {
                Some(_) => format!("{:.1}", round.rss_kb as f64 / 1024.0),
                None => "-".to_owned(),
            };
            println!(
                "{:<30} {:>9.0} {:>8.2} {:>8.2} {:>6} {:>9} {:>9} {:>9} {:>9} {:>8} {:>9} {:>8}",
                target.name,
                stats.rps,
                stats.p50_ms,
                stats.p99_ms,
                stats.errors,
                vs_pass,
                vs_nginx,
                p99_pass,
                p99_nginx,
                tx,
                cpu,
                rss
            );
        }
    }

    // A term change while the old term's grant is held: how long the new term's first write takes.
    let grant_gateway = &gateways[1];
    let fresh = "/ledger/term-change/entries";
    for _ in 0..3 {
        send(grant_gateway.proxy, Method::POST, fresh, &[("fencing-token", "1")], "{}").await?;
    }
    let started = Instant::now();
    let reply = send(gateways[0].proxy, Method::POST, fresh, &[("fencing-token", "2")], "{}").await?;
    println!(
        "\nfirst write of a new term while a {GRANT_MS} ms grant on the old one is held: {} in {:.0} ms \
         (bound: one grant, then the settle wait of 1.25 x forward_timeout 1000 ms + 25 ms margin = {} ms, plus round trips)",
        reply.status,
        started.elapsed().as_secs_f64() * 1000.0,
        GRANT_MS + 1250 + 25
    );
    drop(gateways);
    term_change_cost(&cluster).await?;
    if let Some(nginx) = nginx {
        nginx.stop().await;
    }
    std::fs::remove_dir_all(&scratch).ok();
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

/// What the waits as lengths (schema version 8) cost a term change, against the waits before
/// them (until the grant's end by the store's wall clock: the planted bug `wall-clock-waits`),
/// each in a database of its own: a raise through `fencing.admit` while a grant on the lower term
/// is held and renewed at half its length, as a gateway under load renews it, the raise landing
/// at a random point of the grant. Today's raise waits the whole recorded grant from the moment it
/// holds the row; the old one waited only what was left of it.
async fn term_change_cost(cluster: &PgCluster) -> Result<()> {
    use fencing_schema::store;
    use fencing_tests::faultsuite::{Plant, plant_sql};
    use rand::Rng;

    const TRIALS: usize = 12;
    let grant = Duration::from_millis(GRANT_MS);
    let forward = Duration::from_millis(1000);
    let mut medians = Vec::new();
    println!(
        "\nterm change with a {GRANT_MS} ms grant held and renewed at half (fencing.admit, {TRIALS} raises each):"
    );
    for (label, plant) in
        [("waits as lengths (schema 8)", None), ("wall-clock waits (before, planted)", Some(Plant::WallClockWaits))]
    {
        let name = if plant.is_some() { "bench_wall_clock_waits" } else { "bench_lengths" };
        connect(&cluster.url("postgres")).await.batch_execute(&format!("CREATE DATABASE {name}")).await?;
        let mut admin = connect(&cluster.url(name)).await;
        fencing_schema::migrate(&mut admin).await?;
        if let Some(plant) = plant {
            admin.batch_execute(&plant_sql(plant)?).await?;
        }
        let term = Arc::new(std::sync::atomic::AtomicI64::new(1));
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let holder = connect(&cluster.url(name)).await;
        let renewing = Arc::clone(&term);
        let renewer = tokio::spawn(async move {
            while !*stopped.borrow() {
                let term = renewing.load(std::sync::atomic::Ordering::SeqCst);
                let _ = store::gate_granted(&holder, "term-change", term, forward, None, grant).await;
                tokio::time::sleep(grant / 2).await;
            }
        });
        let raiser = connect(&cluster.url(name)).await;
        let mut took = Vec::new();
        for _ in 0..TRIALS {
            // Let the holder take (or renew) its grant on the current term, then land anywhere in it.
            tokio::time::sleep(grant + Duration::from_millis(rand::rng().random_range(0..GRANT_MS))).await;
            let next = term.load(std::sync::atomic::Ordering::SeqCst) + 1;
            let started = Instant::now();
            store::admit(&raiser, "term-change", next).await?;
            took.push(started.elapsed().as_secs_f64() * 1000.0);
            term.store(next, std::sync::atomic::Ordering::SeqCst);
        }
        let _ = stop.send(true);
        renewer.await.ok();
        took.sort_by(f64::total_cmp);
        let median = took[took.len() / 2];
        println!(
            "  {label:<36} median {median:>6.0} ms, min {:>6.0} ms, max {:>6.0} ms",
            took[0],
            took[took.len() - 1]
        );
        medians.push(median);
    }
    if let [lengths, wall] = medians[..] {
        println!("  cost of the waits as lengths: {:+.0} ms per term change in the median", lengths - wall);
    }
    Ok(())
}
