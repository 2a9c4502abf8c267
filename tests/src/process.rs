//! The election example (`election/examples/elector.rs`) as a real process: spawn it, read its
//! JSON lines, pause, resume, kill or stop it.

use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;

use crate::workspace_example;

/// The tables the daemon node example (`election/examples/daemon_node.rs`) writes its runs and
/// fenced ticks to: create them before starting one.
pub const DAEMON_NODE_TABLES: &str =
    "CREATE TABLE daemon_runs (id bigserial PRIMARY KEY, daemon text, generation bigint, node_id text, at timestamptz);
     CREATE TABLE daemon_ticks (id bigserial PRIMARY KEY, daemon text, generation bigint, node_id text, at timestamptz);";

/// How long any wait for a line may take before the test fails: generous, because a wait that
/// ends early on the awaited line costs nothing, and CI machines are slow at times.
pub const LINE_TIMEOUT: Duration = Duration::from_secs(30);

/// One running elector process.
#[derive(Debug)]
pub struct ElectorProcess {
    /// The owner name it was started with.
    pub owner: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::UnboundedReceiver<Value>,
    /// Every line read so far, in order.
    pub seen: Vec<Value>,
}

/// Settings of an elector process, in milliseconds.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// Lease ttl.
    pub ttl_ms: u64,
    /// Renew interval.
    pub renew_ms: u64,
    /// Safety margin.
    pub margin_ms: u64,
    /// Query timeout.
    pub query_timeout_ms: u64,
    /// Leader-work tick interval.
    pub tick_ms: u64,
}

impl Timing {
    /// A short lease for fault tests: takeovers within about two seconds.
    pub const FAST: Timing = Timing { ttl_ms: 1500, renew_ms: 500, margin_ms: 150, query_timeout_ms: 300, tick_ms: 50 };
}

impl ElectorProcess {
    /// Starts `elector --database-url url --key key --owner owner` with `timing`.
    pub fn spawn(url: &str, key: &str, owner: &str, timing: Timing) -> Result<ElectorProcess> {
        ElectorProcess::spawn_with(url, key, owner, timing, &[])
    }

    /// As [`ElectorProcess::spawn`], with more arguments (`--metrics-listen ADDR`).
    pub fn spawn_with(url: &str, key: &str, owner: &str, timing: Timing, extra: &[&str]) -> Result<ElectorProcess> {
        let mut args: Vec<String> = extra.iter().map(|arg| (*arg).to_owned()).collect();
        for (flag, value) in [
            ("--database-url", url.to_owned()),
            ("--key", key.to_owned()),
            ("--owner", owner.to_owned()),
            ("--ttl-ms", timing.ttl_ms.to_string()),
            ("--renew-ms", timing.renew_ms.to_string()),
            ("--margin-ms", timing.margin_ms.to_string()),
            ("--query-timeout-ms", timing.query_timeout_ms.to_string()),
            ("--tick-ms", timing.tick_ms.to_string()),
        ] {
            args.extend([flag.to_owned(), value]);
        }
        ElectorProcess::spawn_example("elector", owner, &args, &[])
    }

    /// Starts the daemon node example (`election/examples/daemon_node.rs`) with `args`.
    pub fn spawn_daemon_node(node_id: &str, args: &[String]) -> Result<ElectorProcess> {
        ElectorProcess::spawn_example("daemon_node", node_id, args, &[])
    }

    /// As [`ElectorProcess::spawn_daemon_node`], with more environment variables (libfaketime's,
    /// for a node whose clocks run slow or fast).
    pub fn spawn_daemon_node_with_env(
        node_id: &str,
        args: &[String],
        env: &[(&str, String)],
    ) -> Result<ElectorProcess> {
        ElectorProcess::spawn_example("daemon_node", node_id, args, env)
    }

    fn spawn_example(example: &str, owner: &str, args: &[String], env: &[(&str, String)]) -> Result<ElectorProcess> {
        let mut command = Command::new(workspace_example(example)?);
        command.args(args).envs(env.iter().map(|(name, value)| (*name, value.as_str()))).env("RUST_LOG", "warn");
        ElectorProcess::spawn_command(command, example, owner, false)
    }

    /// Starts `command` (a leader in another language, say) as one of these processes: its
    /// stdout JSON lines are read as the examples' are; with `piped_stdin`, [`ElectorProcess::send_line`]
    /// writes to its stdin.
    pub fn spawn_command(mut command: Command, name: &str, owner: &str, piped_stdin: bool) -> Result<ElectorProcess> {
        let mut child = command
            .stdin(if piped_stdin { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("spawn {name}"))?;
        let stdin = child.stdin.take();
        let example = name;
        let stdout = child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
        let (sender, lines) = mpsc::unbounded_channel();
        let name = example.to_owned();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                match serde_json::from_str::<Value>(&line) {
                    Ok(value) => {
                        if sender.send(value).is_err() {
                            return;
                        }
                    }
                    Err(error) => {
                        eprintln!("{name} printed a line that is not JSON ({error}): {line}")
                    }
                }
            }
        });
        Ok(ElectorProcess { owner: owner.to_owned(), child, stdin, lines, seen: Vec::new() })
    }

    /// Writes `line` and a newline to the process's stdin (bounded by [`LINE_TIMEOUT`]).
    pub async fn send_line(&mut self, line: &str) -> Result<()> {
        let stdin = self.stdin.as_mut().ok_or_else(|| anyhow!("{}: stdin is not piped", self.owner))?;
        let mut bytes = line.as_bytes().to_vec();
        bytes.push(b'\n');
        tokio::time::timeout(LINE_TIMEOUT, async {
            stdin.write_all(&bytes).await?;
            stdin.flush().await
        })
        .await
        .map_err(|_| anyhow!("{}: stdin not written within {LINE_TIMEOUT:?}", self.owner))?
        .with_context(|| format!("write to the stdin of {}", self.owner))
    }

    /// The process id; `None` once the process has been reaped: its pid may belong to another process by then.
    pub fn pid(&self) -> Option<Pid> {
        self.child.id().and_then(|id| i32::try_from(id).ok()).map(Pid::from_raw)
    }

    /// Sends `signal` to the process.
    pub fn signal(&self, signal: Signal) -> Result<()> {
        // Never kill(0, ..): that would signal this test's own process group.
        let pid = self.pid().ok_or_else(|| anyhow!("{} has already exited", self.owner))?;
        kill(pid, signal).with_context(|| format!("send {signal} to {}", self.owner))
    }

    /// Waits (bounded by [`LINE_TIMEOUT`]) for the next line for which `wanted` is true, keeping
    /// every line read on the way in [`ElectorProcess::seen`].
    pub async fn wait_for(&mut self, what: &str, wanted: impl Fn(&Value) -> bool) -> Result<Value> {
        let deadline = tokio::time::Instant::now() + LINE_TIMEOUT;
        loop {
            let line = tokio::time::timeout_at(deadline, self.lines.recv())
                .await
                .map_err(|_| anyhow!("{}: no {what} within {LINE_TIMEOUT:?}; saw {:?}", self.owner, self.seen))?
                .ok_or_else(|| anyhow!("{}: exited before {what}; saw {:?}", self.owner, self.seen))?;
            self.seen.push(line.clone());
            if wanted(&line) {
                return Ok(line);
            }
        }
    }

    /// Reads every line already printed, without waiting.
    pub fn drain(&mut self) {
        while let Ok(line) = self.lines.try_recv() {
            self.seen.push(line);
        }
    }

    /// Waits for the process to exit and returns its exit code.
    pub async fn wait_exit(&mut self) -> Result<Option<i32>> {
        let status = tokio::time::timeout(LINE_TIMEOUT, self.child.wait())
            .await
            .map_err(|_| anyhow!("{} did not exit within {LINE_TIMEOUT:?}", self.owner))??;
        Ok(status.code())
    }
}

/// The `event` field of a line.
pub fn event(line: &Value) -> &str {
    line.get("event").and_then(Value::as_str).unwrap_or("")
}

/// An integer field of a line, or -1.
pub fn int(line: &Value, field: &str) -> i64 {
    line.get(field).and_then(Value::as_i64).unwrap_or(-1)
}
