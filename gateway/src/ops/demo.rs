//! `fencing-gateway demo`: the whole story in one command, on this machine only.
//!
//! It starts the embedded Postgres, an example upstream and the gateway in this process, and
//! two leader processes (`fencing-gateway demo-leader`, this same binary) that elect themselves
//! with the election library and write through the gateway. Leader A is paused with SIGSTOP
//! while it holds a write prepared with its term; B takes over with a higher term and writes;
//! A is resumed, sends its old write, and the gateway refuses it with 409 before it reaches the
//! upstream. Every step is printed in plain words.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use fencing_election::{Elector, Event, FencingToken};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::net::TcpListener;
use tokio::process::{Child, ChildStdout, Command};
use tokio_postgres::NoTls;
use tokio_util::sync::CancellationToken;

use crate::Error;
use crate::app::Listeners;
use crate::config::{Config, ProcessEnvironment};
use crate::ops::embedded::EmbeddedPostgres;

/// The lease the two leaders compete for.
const KEY: &str = "demo-writer";
/// Short, so the takeover happens in about two seconds.
const TTL: Duration = Duration::from_millis(2000);
/// How long a leader takes to prepare each write: the window a pause falls into.
const PREPARE: Duration = Duration::from_millis(400);

fn say(text: &str) {
    println!("demo: {text}");
}

/// A demo leader process and its output lines.
struct Leader {
    name: &'static str,
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
    /// Lines read while waiting for another, oldest first: a later wait finds them.
    backlog: std::collections::VecDeque<String>,
}

impl Leader {
    fn spawn(name: &'static str, database_url: &str, proxy: SocketAddr) -> Result<Leader, Error> {
        let exe = std::env::current_exe().map_err(|e| Error::Setup(format!("find this binary: {e}")))?;
        let mut child = Command::new(exe)
            .args(["demo-leader", "--database-url", database_url, "--owner", name, "--proxy", &proxy.to_string()])
            .env("RUST_LOG", "error")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| Error::Setup(format!("start leader {name}: {e}")))?;
        let stdout = child.stdout.take().ok_or_else(|| Error::Setup("no stdout".to_owned()))?;
        Ok(Leader { name, child, lines: BufReader::new(stdout).lines(), backlog: Default::default() })
    }

    /// Forgets the lines read so far but not waited for.
    fn forget(&mut self) {
        self.backlog.clear();
    }

    /// Returns the first line, read before or now, that starts with `prefix`. Bounded to 30 s.
    async fn wait_for(&mut self, prefix: &str) -> Result<String, Error> {
        if let Some(index) = self.backlog.iter().position(|line| line.starts_with(prefix)) {
            return Ok(self.backlog.remove(index).unwrap_or_default());
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let line = tokio::time::timeout_at(deadline, self.lines.next_line())
                .await
                .map_err(|_| Error::Setup(format!("leader {} did not report {prefix:?} in time", self.name)))?
                .map_err(|e| Error::Setup(e.to_string()))?
                .ok_or_else(|| Error::Setup(format!("leader {} exited", self.name)))?;
            if line.starts_with(prefix) {
                return Ok(line);
            }
            self.backlog.push_back(line);
        }
    }

    fn signal(&self, signal: nix::sys::signal::Signal) -> Result<(), Error> {
        let pid = self.child.id().and_then(|id| i32::try_from(id).ok()).unwrap_or(0);
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal).map_err(|e| Error::Setup(e.to_string()))
    }
}

/// `field=value` from a line of a demo leader.
fn field<'a>(line: &'a str, name: &str) -> &'a str {
    line.split_whitespace().find_map(|pair| pair.strip_prefix(name)?.strip_prefix('=')).unwrap_or("?")
}

/// The demo's data directory when none is given: `.fencing-gateway/demo-pgdata` here, unless
/// PostgreSQL's account (as root, another one) cannot enter this directory; then a new one
/// under `/tmp`, which it can (the second value: remove it when done), and the demo says so.
pub fn default_data_dir() -> Result<(std::path::PathBuf, Option<std::path::PathBuf>), Error> {
    let here = Path::new(".fencing-gateway/demo-pgdata");
    if EmbeddedPostgres::can_reach(here).map_err(Error::Setup)? {
        return Ok((here.to_path_buf(), None));
    }
    let scratch = std::path::PathBuf::from(format!("/tmp/fencing-gateway-demo-{}", std::process::id()));
    let elsewhere = scratch.join("pgdata");
    say(&format!(
        "PostgreSQL's account cannot enter this directory (it runs as another account than root), so the demo \
         keeps its data in {} instead (pass --data-dir to choose)",
        elsewhere.display()
    ));
    Ok((elsewhere, Some(scratch)))
}

/// Runs the demo; `metrics` is this process's Prometheus handle.
pub async fn run(
    data_dir: &Path,
    control_listen: SocketAddr,
    exit_after_story: bool,
    metrics: PrometheusHandle,
) -> Result<(), Error> {
    say("starting a private PostgreSQL from the system's binaries ...");
    let dir = data_dir.to_path_buf();
    let postgres = tokio::task::spawn_blocking(move || EmbeddedPostgres::start(&dir))
        .await
        .map_err(|e| Error::Setup(e.to_string()))?
        .map_err(Error::Setup)?;
    let database_url = postgres.url();
    let result = story(&database_url, control_listen, exit_after_story, metrics).await;
    let stopped = tokio::task::spawn_blocking(move || postgres.stop()).await;
    if let Ok(Err(error)) = stopped {
        eprintln!("demo: could not stop PostgreSQL: {error}");
    }
    result
}

async fn story(
    database_url: &str,
    control_listen: SocketAddr,
    exit_after_story: bool,
    metrics: PrometheusHandle,
) -> Result<(), Error> {
    crate::app::migrate(database_url).await?;
    let (upstream, received) = start_upstream().await?;
    let config = Config::parse(
        &format!(
            "[proxy]\nlisten = \"127.0.0.1:0\"\n[control]\nlisten = \"{control_listen}\"\n\
             [upstream]\nforward_timeout_ms = 1000\n\
             [[routes]]\nprefix = \"/ledger\"\nupstream = \"http://{upstream}\"\nresource = {{ segment = 2 }}\n"
        ),
        &ProcessEnvironment,
    )
    .map_err(|e| Error::Setup(e.to_string()))?;
    let listeners = Listeners::bind(&config).await.map_err(|e| Error::Setup(format!("bind: {e}")))?;
    let proxy = listeners.proxy.local_addr().map_err(|e| Error::Setup(e.to_string()))?;
    let control = listeners.control.local_addr().map_err(|e| Error::Setup(e.to_string()))?;
    let shutdown = CancellationToken::new();
    let url = database_url.to_owned();
    let gateway_shutdown = shutdown.clone();
    let gateway =
        tokio::spawn(async move { crate::app::run(config, &url, listeners, metrics, gateway_shutdown).await });
    say(&format!("gateway: proxy on {proxy}, control API and metrics on {control}; upstream on {upstream}"));

    let mut a = Leader::spawn("leader-a", database_url, proxy)?;
    let elected = a.wait_for("elected").await?;
    let term_a = field(&elected, "term").to_owned();
    say(&format!("leader-a holds lease {KEY:?} with term {term_a}"));
    let mut b = Leader::spawn("leader-b", database_url, proxy)?;
    b.wait_for("started").await?;
    say("leader-b started and follows");
    for _ in 0..2 {
        let wrote = a.wait_for("wrote").await?;
        say(&format!("leader-a wrote with term {}: HTTP {}", field(&wrote, "term"), field(&wrote, "status")));
    }

    a.forget();
    a.wait_for("prepared").await?;
    a.signal(nix::sys::signal::Signal::SIGSTOP)?;
    say(&format!(
        "pausing leader-a (SIGSTOP) while it holds a write prepared with term {term_a}, longer than its {} s lease",
        TTL.as_secs()
    ));
    b.forget();
    let elected = b.wait_for("elected").await?;
    let term_b = field(&elected, "term").to_owned();
    say(&format!("leader-a's lease ran out; leader-b took over with term {term_b}"));
    let wrote = b.wait_for("wrote").await?;
    say(&format!("leader-b wrote with term {}: HTTP {}", field(&wrote, "term"), field(&wrote, "status")));

    a.signal(nix::sys::signal::Signal::SIGCONT)?;
    say("resuming leader-a: it does not know yet that it lost, and sends the write it prepared");
    let refused = a.wait_for("wrote").await?;
    say(&format!(
        "the gateway refused leader-a's write with term {}: HTTP {} (current term {}); the upstream never saw it",
        field(&refused, "term"),
        field(&refused, "status"),
        field(&refused, "current_term")
    ));
    let lost = a.wait_for("lost").await?;
    say(&format!(
        "leader-a noticed it lost term {} ({}) and stopped writing",
        field(&lost, "term"),
        field(&lost, "reason")
    ));
    say(&format!(
        "the upstream received {} writes during the story, none of them stale (the new leader goes on writing every \
         0.3 s until you stop the demo, so the counters in /metrics keep growing); `fencing-gateway inspect \
         refusals --database-url '{database_url}'` shows the refusal",
        received.load(Ordering::SeqCst)
    ));
    say(&format!(
        "metrics: http://{control}/metrics; point Prometheus at it (scrape target {control}) and import dashboards/fencing-gateway.json into Grafana"
    ));

    if !exit_after_story {
        say("press Ctrl-C to stop");
        let _ = tokio::signal::ctrl_c().await;
    }
    for leader in [&mut a, &mut b] {
        let _ = leader.signal(nix::sys::signal::Signal::SIGCONT);
        let _ = leader.signal(nix::sys::signal::Signal::SIGTERM);
        let _ = tokio::time::timeout(Duration::from_secs(5), leader.child.wait()).await;
    }
    shutdown.cancel();
    let _ = gateway.await;
    say("stopped");
    Ok(())
}

/// An example upstream that accepts every write and counts it.
async fn start_upstream() -> Result<(SocketAddr, Arc<AtomicU64>), Error> {
    let listener = TcpListener::bind("127.0.0.1:0").await.map_err(|e| Error::Setup(e.to_string()))?;
    let address = listener.local_addr().map_err(|e| Error::Setup(e.to_string()))?;
    let received = Arc::new(AtomicU64::new(0));
    let counter = Arc::clone(&received);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let counter = Arc::clone(&counter);
            tokio::spawn(async move {
                let service = service_fn(move |request: Request<Incoming>| {
                    let counter = Arc::clone(&counter);
                    async move {
                        let _ = request.into_body().collect().await;
                        counter.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"{\"ok\":true}"))))
                    }
                });
                let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
            });
        }
    });
    Ok((address, received))
}

/// `fencing-gateway demo-leader`: one leader of the demo. It prints `follower`, `elected`,
/// `prepared`, `wrote` and `lost` lines. Each write takes its token first and sends it after
/// preparing: the check-then-act gap in which a paused leader becomes a zombie, which the
/// gateway closes.
pub async fn leader(database_url: &str, owner: &str, proxy: SocketAddr) -> Result<(), Error> {
    let pg_config: tokio_postgres::Config = database_url.parse().map_err(|e| Error::Setup(format!("{e}")))?;
    let manager = Manager::from_config(pg_config, NoTls, ManagerConfig { recycling_method: RecyclingMethod::Fast });
    let pool = Pool::builder(manager).max_size(2).build().map_err(|e| Error::Setup(e.to_string()))?;
    let elector =
        Elector::builder(pool, KEY).owner(owner).ttl(TTL).build().map_err(|e| Error::Setup(e.to_string()))?.start();
    println!("started owner={owner}");
    // The state watch never misses the current state; losses come as events, with a reason.
    let mut state = elector.state();
    tokio::spawn(async move {
        let mut leading = None;
        loop {
            let term = state.borrow_and_update().current_term();
            if let Some(term) = term
                && leading != Some(term)
            {
                println!("elected term={term}");
            }
            leading = term;
            if state.changed().await.is_err() {
                return;
            }
        }
    });
    let mut events = elector.events();
    tokio::spawn(async move {
        while let Ok(event) = events.recv().await {
            if let Event::Lost { term, reason } = event {
                println!("lost term={term} reason={}", reason.as_label());
            }
        }
    });
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| Error::Setup(e.to_string()))?;
    loop {
        tokio::select! {
            _ = terminate.recv() => break,
            () = tokio::time::sleep(Duration::from_millis(300)) => {}
        }
        let Some(token) = elector.leadership().and_then(|leadership| leadership.fencing_token().ok()) else {
            continue;
        };
        println!("prepared term={}", token.term());
        tokio::time::sleep(PREPARE).await;
        let request = Request::post(format!("http://{proxy}/ledger/demo-account/entries"))
            .header(FencingToken::HEADER, token.header_value())
            .body(Full::new(Bytes::from_static(b"{\"amount\":1}")))
            .map_err(|e| Error::Setup(e.to_string()))?;
        match client.request(request).await {
            Ok(response) => {
                let current = response
                    .headers()
                    .get("fencing-current-term")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("-")
                    .to_owned();
                let status = response.status();
                let _ = response.into_body().collect().await;
                println!("wrote term={} status={} current_term={current}", token.term(), status.as_u16());
                if status == StatusCode::CONFLICT {
                    // The gateway said a newer leader exists: stop acting as leader at once.
                    tokio::time::sleep(TTL).await;
                }
            }
            Err(error) => println!("wrote term={} status=error error={error}", token.term()),
        }
    }
    elector.shutdown().await;
    Ok(())
}
