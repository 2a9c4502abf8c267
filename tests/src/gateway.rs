//! The gateway and the recording upstream as real processes, and an HTTP client to drive them.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

use crate::workspace_bin;

/// How long a wait for a process's line may take.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Reads `child`'s stdout lines into a channel; returns the first line.
async fn first_line_then_forward(child: &mut Child, sender: mpsc::UnboundedSender<String>) -> Result<String> {
    let stdout = child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
    let mut lines = BufReader::new(stdout).lines();
    let first = tokio::time::timeout(START_TIMEOUT, lines.next_line())
        .await
        .map_err(|_| anyhow!("no first line within {START_TIMEOUT:?}"))??
        .ok_or_else(|| anyhow!("exited before printing its address"))?;
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            if sender.send(line).is_err() {
                return;
            }
        }
    });
    Ok(first)
}

/// The recording upstream (`tests/src/bin/recording-upstream.rs`) as a process.
#[derive(Debug)]
pub struct Upstream {
    /// Where it listens.
    pub addr: SocketAddr,
    child: Child,
    lines: mpsc::UnboundedReceiver<String>,
    /// Every request it logged so far, in arrival order.
    pub log: Vec<Value>,
}

impl Upstream {
    /// Starts a recording upstream on a free loopback port.
    pub async fn start() -> Result<Upstream> {
        Upstream::spawn(Command::new(workspace_bin("recording-upstream")?), "recording-upstream").await
    }

    /// Starts `command`, an upstream that prints `listening ADDR` first and then a JSON line per
    /// thing it saw.
    async fn spawn(mut command: Command, name: &str) -> Result<Upstream> {
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("spawn {name}"))?;
        let (sender, lines) = mpsc::unbounded_channel();
        let first = first_line_then_forward(&mut child, sender).await?;
        let addr = first
            .strip_prefix("listening ")
            .and_then(|a| a.parse().ok())
            .ok_or_else(|| anyhow!("unexpected first line {first:?}"))?;
        Ok(Upstream { addr, child, lines, log: Vec::new() })
    }

    /// Starts `tests/upstreams/stdlib_upstream.py`, an upstream made of the Python standard
    /// library only (http.server's keep-alive loop, wsgiref's header mapping), on a free loopback
    /// port. Its log has a `"kind": "request"` line per request it acted on and a
    /// `"kind": "connection"` line with every byte it received when a connection ends.
    pub async fn start_stdlib() -> Result<Upstream> {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/upstreams/stdlib_upstream.py");
        let mut command = Command::new("python3");
        command.arg(script);
        Upstream::spawn(command, "python3 stdlib_upstream.py").await
    }

    /// The requests the stdlib upstream acted on (after [`Upstream::collect`]).
    pub fn requests(&self) -> Vec<&Value> {
        self.log.iter().filter(|line| line["kind"] == "request").collect()
    }

    /// Every byte the stdlib upstream received on its connections that have ended (after
    /// [`Upstream::collect`]), as latin-1 text.
    pub fn raw_received(&self) -> String {
        self.log.iter().filter(|line| line["kind"] == "connection").filter_map(|line| line["raw"].as_str()).collect()
    }

    /// The base URL to configure a route with.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Reads every request logged so far into [`Upstream::log`], waiting `settle` first so that
    /// requests in flight have arrived.
    pub async fn collect(&mut self, settle: Duration) -> &[Value] {
        tokio::time::sleep(settle).await;
        while let Ok(line) = self.lines.try_recv() {
            if let Ok(value) = serde_json::from_str(&line) {
                self.log.push(value);
            }
        }
        &self.log
    }

    /// Whether a request with this `x-request-id` reached the upstream (after [`Upstream::collect`]).
    pub fn received(&self, request_id: &str) -> bool {
        self.log.iter().any(|line| line.get("x_request_id").and_then(Value::as_str) == Some(request_id))
    }

    /// Stops the upstream.
    pub async fn stop(&mut self) {
        let _ = self.child.kill().await;
    }
}

/// A gateway process.
#[derive(Debug)]
pub struct Gateway {
    /// The proxy listener.
    pub proxy: SocketAddr,
    /// The control listener.
    pub control: SocketAddr,
    child: Child,
    config_path: PathBuf,
    /// Keeps the stdout reader alive, so the gateway never blocks on a full pipe.
    _stdout: mpsc::UnboundedReceiver<String>,
    /// The log lines, when started with [`Gateway::start_capturing_logs`].
    pub logs: mpsc::UnboundedReceiver<String>,
}

impl Gateway {
    /// Starts `fencing-gateway serve` with `config` (TOML) against `database_url`, both
    /// listeners on free ports (through the environment overrides), and waits until it listens
    /// and its schema is ready.
    pub async fn start(database_url: &str, config: &str) -> Result<Gateway> {
        let gateway = Gateway::spawn(database_url, config).await?;
        gateway.wait_ready().await?;
        Ok(gateway)
    }

    /// As [`Gateway::start`], without waiting for `/readyz` (a control listener that speaks TLS,
    /// or a store that is not meant to be reachable).
    pub async fn spawn(database_url: &str, config: &str) -> Result<Gateway> {
        Gateway::spawn_with(database_url, config, false, &[]).await
    }

    /// As [`Gateway::start`], with the log as JSON lines in [`Gateway::logs`] instead of on the
    /// test's stderr.
    pub async fn start_capturing_logs(database_url: &str, config: &str) -> Result<Gateway> {
        let gateway = Gateway::spawn_with(database_url, config, true, &[]).await?;
        gateway.wait_ready().await?;
        Ok(gateway)
    }

    /// As [`Gateway::spawn`], with the log as JSON lines in [`Gateway::logs`].
    pub async fn spawn_capturing_logs(database_url: &str, config: &str) -> Result<Gateway> {
        Gateway::spawn_with(database_url, config, true, &[]).await
    }

    /// As [`Gateway::spawn`], with more environment variables (libfaketime's, for a gateway
    /// whose clocks run slow or fast: such a gateway never becomes ready).
    pub async fn spawn_with_env(database_url: &str, config: &str, env: &[(&str, String)]) -> Result<Gateway> {
        Gateway::spawn_with(database_url, config, false, env).await
    }

    /// The value of the metric line starting with `name` (labels included, as in the text
    /// format), or `None` when the gateway does not export it.
    pub async fn metric(&self, name: &str) -> Result<Option<f64>> {
        let reply = send(self.control, Method::GET, "/metrics", &[], "").await?;
        let text = String::from_utf8_lossy(&reply.body).into_owned();
        Ok(text
            .lines()
            .find(|line| line.starts_with(name) && !line.starts_with('#'))
            .and_then(|line| line.rsplit(' ').next())
            .and_then(|value| value.parse().ok()))
    }

    async fn spawn_with(
        database_url: &str,
        config: &str,
        capture_logs: bool,
        env: &[(&str, String)],
    ) -> Result<Gateway> {
        let config_path = std::env::temp_dir().join(format!(
            "fencing-gateway-test-{}-{}.toml",
            std::process::id(),
            rand::random::<u64>()
        ));
        std::fs::write(&config_path, config).context("write the gateway config")?;
        let mut child = Command::new(workspace_bin("fencing-gateway")?)
            .arg("serve")
            .arg("--config")
            .arg(&config_path)
            .env("FENCING_DATABASE_URL", database_url)
            .env("FENCING_PROXY_LISTEN", "127.0.0.1:0")
            .env("FENCING_CONTROL_LISTEN", "127.0.0.1:0")
            // The tests find their requests at the upstream by the id they sent, unless a test
            // configures the setting itself.
            .env(
                if config.contains("client_request_ids") {
                    "FENCING_UNUSED"
                } else {
                    "FENCING_PROXY_CLIENT_REQUEST_IDS"
                },
                "true",
            )
            // The tests' Postgres has no standby: the warning about it is for the tests that
            // configure the check themselves.
            .env(
                if config.contains("standby_check") { "FENCING_UNUSED" } else { "FENCING_DATABASE_STANDBY_CHECK" },
                "off",
            )
            .env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".to_owned()))
            .env("FENCING_LOG_FORMAT", if capture_logs { "json" } else { "text" })
            .envs(env.iter().map(|(name, value)| (*name, value.as_str())))
            .stdout(Stdio::piped())
            .stderr(if capture_logs { Stdio::piped() } else { Stdio::inherit() })
            .kill_on_drop(true)
            .spawn()
            .context("spawn fencing-gateway")?;
        let (log_sender, logs) = mpsc::unbounded_channel();
        if let Some(stderr) = child.stderr.take() {
            tokio::spawn(async move {
                let mut lines = BufReader::new(stderr).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if log_sender.send(line).is_err() {
                        return;
                    }
                }
            });
        }
        let (sender, stdout) = mpsc::unbounded_channel();
        let first = first_line_then_forward(&mut child, sender).await?;
        let mut proxy = None;
        let mut control = None;
        for field in first.split_whitespace() {
            if let Some(value) = field.strip_prefix("proxy=") {
                proxy = value.parse().ok();
            } else if let Some(value) = field.strip_prefix("control=") {
                control = value.parse().ok();
            }
        }
        let (Some(proxy), Some(control)) = (proxy, control) else {
            bail!("unexpected first line {first:?}");
        };
        Ok(Gateway { proxy, control, child, config_path, _stdout: stdout, logs })
    }

    /// Waits (bounded) until `/readyz` answers 200.
    pub async fn wait_ready(&self) -> Result<()> {
        for _ in 0..300 {
            if let Ok(response) = send(self.control, Method::GET, "/readyz", &[], "").await
                && response.status == StatusCode::OK
            {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!("the gateway did not become ready")
    }

    /// The process id; `None` once the process has been reaped: its pid may belong to another process by then.
    pub fn pid(&self) -> Option<Pid> {
        self.child.id().and_then(|id| i32::try_from(id).ok()).map(Pid::from_raw)
    }

    /// Sends `signal` to the gateway.
    pub fn signal(&self, signal: Signal) -> Result<()> {
        // Never kill(0, ..): that would signal this test's own process group.
        let pid = self.pid().ok_or_else(|| anyhow!("the gateway has already exited"))?;
        kill(pid, signal).context("signal the gateway")
    }

    /// Waits for the process to exit; returns its exit code.
    pub async fn wait_exit(&mut self, limit: Duration) -> Result<Option<i32>> {
        let status = tokio::time::timeout(limit, self.child.wait())
            .await
            .map_err(|_| anyhow!("the gateway did not exit within {limit:?}"))??;
        Ok(status.code())
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.config_path);
    }
}

/// The header every JSON body to the control API carries (else 415).
pub const JSON: (&str, &str) = ("content-type", "application/json");

/// A response read whole.
#[derive(Debug, Clone)]
pub struct Reply {
    /// The status.
    pub status: StatusCode,
    /// The headers.
    pub headers: HeaderMap,
    /// The body.
    pub body: Bytes,
}

impl Reply {
    /// The body as JSON (`Null` when it is not JSON).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    /// A header's value as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

/// Sends one request to `addr` and reads the whole response.
pub async fn send(addr: SocketAddr, method: Method, path: &str, headers: &[(&str, &str)], body: &str) -> Result<Reply> {
    let mut request = Request::builder().method(method).uri(format!("http://{addr}{path}"));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request.body(Full::new(Bytes::copy_from_slice(body.as_bytes())))?;
    let response = tokio::time::timeout(Duration::from_secs(30), client().request(request))
        .await
        .map_err(|_| anyhow!("no response within 30 s"))??;
    let (parts, body) = response.into_parts();
    let body = body.collect().await?.to_bytes();
    Ok(Reply { status: parts.status, headers: parts.headers, body })
}

/// Writes `raw` bytes to `addr` and returns everything read back until the server closes or
/// 5 s pass: for requests no well-behaved client would send.
pub async fn raw(addr: SocketAddr, raw: &[u8]) -> Result<String> {
    let mut stream = TcpStream::connect(addr).await?;
    stream.write_all(raw).await?;
    let mut buffer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut buffer)).await;
    Ok(String::from_utf8_lossy(&buffer).into_owned())
}
