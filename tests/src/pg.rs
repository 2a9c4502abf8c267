//! A throwaway PostgreSQL for tests, started from the system's server binaries.
//!
//! [`PgCluster::start`] runs `initdb` into a fresh temp dir and starts the server with `pg_ctl`
//! on a free loopback port, tuned for tests (`fsync=off`). PostgreSQL refuses to run as root, so
//! when the tests run as root the cluster runs as an unprivileged user (`postgres`, or the one
//! named in `FENCING_PG_USER`) that owns the temp dir. Finding the binaries and that user is
//! shared with the gateway's embedded Postgres (`fencing_gateway::ops::embedded`).
//!
//! Cleanup does not depend on the test process ending well. Each cluster has a supervisor, a
//! small shell in its own process group that blocks reading a pipe whose only writer is the test
//! process. When the test process ends, however it ends (success, panic, SIGKILL), the kernel
//! closes the pipe, and the supervisor stops the server and removes the temp dir.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::net::TcpListener;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use anyhow::{Context, Result, anyhow, bail};
use fencing_gateway::ops::embedded::{RunAs, describe, find_bin_dir, unprivileged_user};
use tokio_postgres::{Client, NoTls};

/// The superuser every test cluster is initialised with.
pub use fencing_gateway::ops::embedded::SUPERUSER;

/// Whether the cluster flushes its WAL to disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// `fsync=off`: fast, for tests; a machine crash could lose data, a test run does not care.
    Off,
    /// The server's defaults: every commit that wrote waits for its WAL flush.
    On,
}

/// How a standby ([`PgCluster::start_standby`]) confirms commits to its primary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replication {
    /// Named in the primary's `synchronous_standby_names`: a durable commit waits for its flush.
    Synchronous,
    /// Streams, but the primary waits for nothing.
    Asynchronous,
}

/// A PostgreSQL cluster owned by the test process.
#[derive(Debug)]
pub struct PgCluster {
    /// Where initdb, pg_ctl and postgres live.
    bin_dir: PathBuf,
    /// The temp dir holding everything of this cluster; removed at the end.
    root: PathBuf,
    /// The data directory, inside `root`.
    data_dir: PathBuf,
    /// The server log, inside `root`: shown when the server fails to start.
    log_file: PathBuf,
    /// The loopback port the server listens on; it keeps it across restarts.
    port: u16,
    /// Set when the tests run as root.
    run_as: Option<RunAs>,
    /// The supervisor; its stdin is the pipe whose closing removes the cluster.
    supervisor: Mutex<Option<Child>>,
    /// With a fake clock: the file libfaketime reads the server's wall-clock offset from.
    clock_file: Option<PathBuf>,
}

impl PgCluster {
    /// Starts a new cluster. It is stopped and removed when dropped or when the process ends.
    pub fn start() -> Result<PgCluster> {
        PgCluster::start_with(Durability::Off)
    }

    /// Starts a new cluster with the given durability: benchmarks use [`Durability::On`], the
    /// server's defaults, so commits wait for the WAL flush as in production.
    pub fn start_with(durability: Durability) -> Result<PgCluster> {
        PgCluster::start_with_settings(durability, "")
    }

    /// As [`PgCluster::start_with`], with more lines for `postgresql.conf` (for example
    /// `"synchronous_commit = off\nwal_writer_delay = 10s\n"` for durability tests).
    pub fn start_with_settings(durability: Durability, extra_settings: &str) -> Result<PgCluster> {
        PgCluster::start_cluster(durability, extra_settings, false)
    }

    /// As [`PgCluster::start`], with the server's wall clock under the test's control: the
    /// server runs under libfaketime (Debian's `faketime` package), which moves only the wall
    /// clock (`CLOCK_REALTIME`: `clock_timestamp()`, `now()`), never the monotonic clocks, by the
    /// offset [`PgCluster::set_clock_offset`] sets. Kernel timers (a `pg_sleep`'s timeout) go on
    /// in real time, as they do when an operator or NTP steps a real clock.
    pub fn start_with_fake_clock() -> Result<PgCluster> {
        PgCluster::start_cluster(Durability::Off, "", true)
    }

    /// [`PgCluster::start_with_settings`] with a fake clock ([`PgCluster::start_with_fake_clock`]).
    pub fn start_with_fake_clock_and_settings(durability: Durability, extra_settings: &str) -> Result<PgCluster> {
        PgCluster::start_cluster(durability, extra_settings, true)
    }

    fn start_cluster(durability: Durability, extra_settings: &str, fake_clock: bool) -> Result<PgCluster> {
        let bin_dir = find_bin_dir().map_err(|message| anyhow!(message))?;
        let run_as = unprivileged_user().map_err(|message| anyhow!(message))?;
        let root = make_root(run_as.as_ref())?;
        let data_dir = root.join("data");
        let log_file = root.join("server.log");
        let clock_file = fake_clock.then(|| root.join("clock-offset"));
        let mut cluster =
            PgCluster { bin_dir, root, data_dir, log_file, port: 0, run_as, supervisor: Mutex::new(None), clock_file };
        // The supervisor is started first, so the temp dir is removed even if initdb fails.
        cluster.spawn_supervisor()?;
        cluster.initdb()?;
        if cluster.clock_file.is_some() {
            cluster.set_clock_offset(0)?;
        }
        let mut last_error = None;
        for _ in 0..5 {
            cluster.port = free_port()?;
            cluster.write_settings(durability, extra_settings)?;
            match cluster.start_server() {
                Ok(()) => return Ok(cluster),
                // Another process may have taken the port between our probe and the start.
                Err(error) => last_error = Some(error),
            }
        }
        Err(last_error.unwrap_or_else(|| anyhow!("the server did not start")))
    }

    /// The fake-clock cluster ([`PgCluster::start_with_fake_clock`]) every test of this test
    /// binary shares, started on first use, and the lock a test holds while it moves the clock
    /// (the clock is one for all the cluster's databases): [`FakeClock::database`].
    pub fn fake_clock() -> &'static FakeClock {
        static FAKE: OnceLock<FakeClock> = OnceLock::new();
        FAKE.get_or_init(|| match PgCluster::start_with_fake_clock() {
            Ok(cluster) => FakeClock { cluster, lock: tokio::sync::Mutex::const_new(()) },
            Err(error) => panic!("cannot start the fake-clock PostgreSQL: {error:#}"),
        })
    }

    /// The cluster every test of this test binary shares, started on first use.
    pub fn shared() -> &'static PgCluster {
        static SHARED: OnceLock<PgCluster> = OnceLock::new();
        SHARED.get_or_init(|| match PgCluster::start() {
            Ok(cluster) => cluster,
            Err(error) => panic!("cannot start the test PostgreSQL: {error:#}"),
        })
    }

    /// The loopback port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The path of one of the PostgreSQL binaries this cluster uses (`psql`, `pg_ctl`, ...).
    pub fn bin(&self, name: &str) -> PathBuf {
        self.bin_dir.join(name)
    }

    /// The temp dir holding the cluster's files; it is gone once the cluster is.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The server's data directory.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// A libpq URL for `database` as the superuser.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://{SUPERUSER}@127.0.0.1:{}/{database}", self.port)
    }

    /// The postmaster's pid, read from `postmaster.pid`, while the server runs.
    pub fn postmaster_pid(&self) -> Option<i32> {
        let text = fs::read_to_string(self.data_dir.join("postmaster.pid")).ok()?;
        text.lines().next()?.trim().parse().ok()
    }

    /// Steps the server's wall clock to `offset_ms` from the real time (with a fake clock; every
    /// backend reads the offset at each reading of the clock).
    pub fn set_clock_offset(&self, offset_ms: i64) -> Result<()> {
        let file = self.clock_file.as_ref().ok_or_else(|| anyhow!("this cluster has no fake clock"))?;
        // Written whole and renamed into place: a reader never sees half a line.
        let next = file.with_extension("next");
        fs::write(&next, format!("{:+.3}\n", offset_ms as f64 / 1000.0)).context("write the clock offset")?;
        if let Some(user) = &self.run_as {
            nix::unistd::chown(
                &next,
                Some(nix::unistd::Uid::from_raw(user.uid)),
                Some(nix::unistd::Gid::from_raw(user.gid)),
            )?;
        }
        fs::rename(&next, file).context("move the clock offset into place")?;
        Ok(())
    }

    /// Starts the server again after [`PgCluster::stop`] or [`PgCluster::crash`], on the same port.
    pub fn start_server(&self) -> Result<()> {
        let mut command = self.pg_command("pg_ctl");
        if let Some(file) = &self.clock_file {
            command
                .env("LD_PRELOAD", faketime_library()?)
                .env("FAKETIME_TIMESTAMP_FILE", file)
                .env("FAKETIME_NO_CACHE", "1")
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
        }
        let output = command
            .arg("-D")
            .arg(&self.data_dir)
            .arg("-l")
            .arg(&self.log_file)
            .args(["-w", "-t", "60", "start"])
            .output()
            .context("run pg_ctl start")?;
        if !output.status.success() {
            bail!(
                "pg_ctl start failed: {}\n--- server log ---\n{}",
                describe(&output),
                fs::read_to_string(&self.log_file).unwrap_or_default()
            );
        }
        Ok(())
    }

    /// Stops the server cleanly (`pg_ctl stop -m fast`): sessions are disconnected.
    pub fn stop(&self) -> Result<()> {
        self.pg_ctl_stop("fast")
    }

    /// Stops the server the way a crash would (`pg_ctl stop -m immediate`): no checkpoint, so
    /// the next start replays the WAL.
    pub fn crash(&self) -> Result<()> {
        self.pg_ctl_stop("immediate")
    }

    /// Crashes the server at once: SIGQUIT to the postmaster (what `pg_ctl stop -m immediate`
    /// sends, without starting a process first), then waits, bounded, until it is gone; after
    /// 10 s, SIGKILL to its children and to it.
    pub fn crash_now(&self) -> Result<()> {
        let pid = self.postmaster_pid().ok_or_else(|| anyhow!("the server is not running"))?;
        let pid = nix::unistd::Pid::from_raw(pid);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGQUIT).context("send SIGQUIT to the postmaster")?;
        // 1,000 checks 10 ms apart: about 10 s.
        for _ in 0..1_000 {
            if nix::sys::signal::kill(pid, None).is_err() && !self.data_dir.join("postmaster.pid").exists() {
                return Ok(());
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        // A server under libfaketime can hang in its SIGQUIT handler (a handler that logs reads
        // the clock, and the library's clock may be mid-call where the signal arrived): then the
        // crash is made harder, as a power cut would.
        self.kill_server(pid)
    }

    /// Crashes the server as a power cut would, with nothing written after the call: every
    /// process of it stopped (SIGSTOP, the postmaster first), then killed (SIGKILL). A server
    /// that gets SIGQUIT may still write out WAL while its processes act on it; one that gets
    /// this does not. Waits, bounded, until it is gone.
    pub fn power_cut(&self) -> Result<()> {
        let pid = self.postmaster_pid().ok_or_else(|| anyhow!("the server is not running"))?;
        let pid = nix::unistd::Pid::from_raw(pid);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP);
        for child in children_of(pid.as_raw()) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(child), nix::sys::signal::Signal::SIGSTOP);
        }
        self.kill_server(pid)
    }

    /// SIGKILL to the postmaster `pid`'s children and to it. Nothing of it survives, so the next
    /// start finds no shared memory in use; its stale pid file is removed.
    fn kill_server(&self, pid: nix::unistd::Pid) -> Result<()> {
        let children = children_of(pid.as_raw());
        for &child in &children {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(child), nix::sys::signal::Signal::SIGKILL);
        }
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        // The postmaster and its children gone (a child still exiting would keep the shared
        // memory in use, and the next start would refuse it).
        for _ in 0..1_000 {
            if nix::sys::signal::kill(pid, None).is_err() && !children.iter().any(|child| running(*child)) {
                let _ = fs::remove_file(self.data_dir.join("postmaster.pid"));
                return Ok(());
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        bail!("the postmaster {pid} or a child of it did not stop within 10 s of SIGKILL")
    }

    fn pg_ctl_stop(&self, mode: &str) -> Result<()> {
        let output = self
            .pg_command("pg_ctl")
            .arg("-D")
            .arg(&self.data_dir)
            .args(["-m", mode, "-w", "-t", "60", "stop"])
            .output()
            .context("run pg_ctl stop")?;
        if !output.status.success() {
            bail!("pg_ctl stop -m {mode} failed: {}", describe(&output));
        }
        Ok(())
    }

    /// A command for one of the server binaries, run as the cluster's user, with the caller's
    /// libpq environment removed so it cannot point the tools elsewhere.
    fn pg_command(&self, program: &str) -> Command {
        let mut command = Command::new(self.bin_dir.join(program));
        for variable in ["PGDATA", "PGHOST", "PGHOSTADDR", "PGPORT", "PGUSER", "PGDATABASE", "PGOPTIONS"] {
            command.env_remove(variable);
        }
        command.current_dir(&self.root).stdin(Stdio::null());
        if let Some(user) = &self.run_as {
            command.uid(user.uid).gid(user.gid);
        }
        command
    }

    fn initdb(&self) -> Result<()> {
        let output = self
            .pg_command("initdb")
            .arg("-D")
            .arg(&self.data_dir)
            .args(["-U", SUPERUSER, "--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync"])
            .output()
            .context("run initdb")?;
        if !output.status.success() {
            bail!("initdb failed: {}", describe(&output));
        }
        Ok(())
    }

    /// Starts a streaming standby of this cluster, on a free port of its own, and waits
    /// (bounded, 60 s) until it streams. A base backup of the running server (`pg_basebackup
    /// -R -X stream`) is its data directory; it shares this cluster's durability settings and,
    /// with a fake clock, the same clock (one offset file: the two servers read one time, as two
    /// hosts synchronised by NTP would). [`Replication::Synchronous`] names it in this cluster's
    /// `synchronous_standby_names`, so every commit that asks for durability (`on`) waits until
    /// the standby has flushed it; [`Replication::Asynchronous`] does not. Either way it returns
    /// once the standby has flushed every commit the primary had flushed by then.
    pub fn start_standby(&self, replication: Replication) -> Result<PgCluster> {
        self.start_standby_through(replication, self.port)
    }

    /// As [`PgCluster::start_standby`], the standby reaching this cluster at the loopback `port`
    /// (a fault proxy's, so a test can hold or cut the replication link). Blocks while it waits:
    /// in an async test, call it from `tokio::task::block_in_place`.
    pub fn start_standby_through(&self, replication: Replication, port: u16) -> Result<PgCluster> {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let name = format!("standby_{}", NEXT.fetch_add(1, Ordering::Relaxed));
        let root = make_root(self.run_as.as_ref())?;
        let mut standby = PgCluster {
            bin_dir: self.bin_dir.clone(),
            data_dir: root.join("data"),
            log_file: root.join("server.log"),
            root,
            port: 0,
            run_as: self.run_as.clone(),
            supervisor: Mutex::new(None),
            clock_file: self.clock_file.clone(),
        };
        standby.spawn_supervisor()?;
        let output = standby
            .pg_command("pg_basebackup")
            .arg("-D")
            .arg(&standby.data_dir)
            .args(["-R", "-X", "stream", "-c", "fast", "--no-sync", "-h", "127.0.0.1", "-U", SUPERUSER])
            .arg("-p")
            .arg(port.to_string())
            .output()
            .context("run pg_basebackup")?;
        if !output.status.success() {
            bail!("pg_basebackup failed: {}", describe(&output));
        }
        // A standby the primary waits for must not itself wait for one once promoted: the copy of
        // the primary's `synchronous_standby_names` (ALTER SYSTEM) is removed.
        let auto_conf = standby.data_dir.join("postgresql.auto.conf");
        let kept: String = fs::read_to_string(&auto_conf)
            .context("read the standby's postgresql.auto.conf")?
            .lines()
            .filter(|line| !line.trim_start().starts_with("synchronous_standby_names"))
            .map(|line| format!("{line}\n"))
            .collect();
        fs::write(&auto_conf, kept).context("write the standby's postgresql.auto.conf")?;
        // The walreceiver names itself after `cluster_name`: the name the primary waits for.
        let settings = format!("cluster_name = '{name}'\nsynchronous_standby_names = ''\n");
        let mut last_error = None;
        let mut started = false;
        for _ in 0..5 {
            standby.port = free_port()?;
            let mut file = OpenOptions::new().append(true).open(standby.data_dir.join("postgresql.conf"))?;
            file.write_all(format!("\nport = {}\n{settings}", standby.port).as_bytes())?;
            match standby.start_server() {
                Ok(()) => {
                    started = true;
                    break;
                }
                Err(error) => last_error = Some(error),
            }
        }
        if !started {
            return Err(last_error.unwrap_or_else(|| anyhow!("the standby did not start")));
        }
        let wanted = match replication {
            Replication::Synchronous => {
                self.psql(&format!("ALTER SYSTEM SET synchronous_standby_names = '{name}'"))?;
                self.psql("SELECT pg_reload_conf()")?;
                "sync"
            }
            Replication::Asynchronous => "async",
        };
        let query = format!(
            "SELECT sync_state FROM pg_stat_replication WHERE application_name = '{name}' AND state = 'streaming'"
        );
        // 600 checks 100 ms apart: about 60 s.
        let mut streaming = false;
        for _ in 0..600 {
            if self.psql(&query)?.trim() == wanted {
                streaming = true;
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        if !streaming {
            bail!("the standby {name} did not stream as {wanted} within 60 s");
        }
        // Commits answered before it became synchronous did not wait for it: it has them all
        // only once it has flushed up to the primary's flushed WAL of now. Until then a crash of
        // the primary could lose them, which no test means to show.
        let flushed = self.psql("SELECT pg_current_wal_flush_lsn()")?;
        let caught_up = format!(
            "SELECT flush_lsn >= '{}'::pg_lsn FROM pg_stat_replication WHERE application_name = '{name}'",
            flushed.trim()
        );
        for _ in 0..600 {
            if self.psql(&caught_up)?.trim() == "t" {
                return Ok(standby);
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        bail!("the standby {name} did not catch up with the primary's flushed WAL within 60 s")
    }

    /// Promotes this standby to a primary (`pg_ctl promote -w`): it replays what it received,
    /// leaves recovery, and accepts writes.
    pub fn promote(&self) -> Result<()> {
        let output = self
            .pg_command("pg_ctl")
            .arg("-D")
            .arg(&self.data_dir)
            .args(["-w", "-t", "60", "promote"])
            .output()
            .context("run pg_ctl promote")?;
        if !output.status.success() {
            bail!("pg_ctl promote failed: {}", describe(&output));
        }
        Ok(())
    }

    /// Runs `sql` with `psql` as the superuser in database `postgres`; its output, unaligned.
    pub fn psql(&self, sql: &str) -> Result<String> {
        let output = self
            .pg_command("psql")
            .args(["-X", "-At", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-U", SUPERUSER, "-d", "postgres"])
            .arg("-p")
            .arg(self.port.to_string())
            .arg("-c")
            .arg(sql)
            .output()
            .context("run psql")?;
        if !output.status.success() {
            bail!("psql failed: {}", describe(&output));
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// Turns TLS on with this certificate and key (copied into the data directory, owned by the
    /// cluster's user, the key 0600), then restarts the server.
    pub fn enable_tls(&self, cert: &Path, key: &Path) -> Result<()> {
        for (from, name, mode) in [(cert, "server.crt", 0o644), (key, "server.key", 0o600)] {
            let to = self.data_dir.join(name);
            fs::copy(from, &to).with_context(|| format!("copy {}", from.display()))?;
            fs::set_permissions(&to, std::os::unix::fs::PermissionsExt::from_mode(mode))?;
            if let Some(user) = &self.run_as {
                nix::unistd::chown(
                    &to,
                    Some(nix::unistd::Uid::from_raw(user.uid)),
                    Some(nix::unistd::Gid::from_raw(user.gid)),
                )?;
            }
        }
        let mut file = OpenOptions::new().append(true).open(self.data_dir.join("postgresql.conf"))?;
        file.write_all(b"\nssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n")?;
        self.stop()?;
        self.start_server()
    }

    /// Appends the test settings to `postgresql.conf` (the last value of a setting wins).
    fn write_settings(&self, durability: Durability, extra_settings: &str) -> Result<()> {
        let durability = match durability {
            Durability::Off => "fsync = off\nfull_page_writes = off\n",
            Durability::On => "",
        };
        let settings = format!(
            "\n# fencing-tests\n\
             port = {port}\n\
             listen_addresses = '127.0.0.1'\n\
             unix_socket_directories = '{socket_dir}'\n\
             {durability}\
             max_connections = 300\n\
             shared_buffers = 64MB\n\
             log_min_messages = warning\n\
             log_min_error_statement = panic\n\
             {extra_settings}\n",
            port = self.port,
            socket_dir = self.root.display(),
        );
        let mut file = OpenOptions::new()
            .append(true)
            .open(self.data_dir.join("postgresql.conf"))
            .context("open postgresql.conf")?;
        file.write_all(settings.as_bytes()).context("write postgresql.conf")?;
        Ok(())
    }

    fn spawn_supervisor(&mut self) -> Result<()> {
        // Blocks until the pipe closes, then stops the server and removes everything.
        // When pg_ctl cannot stop the server, the postmaster is killed; the removal is retried
        // while processes that outlived it may still write, and a failure is reported.
        let script = r#"cat >/dev/null
pidfile="$2/postmaster.pid"
if [ -f "$pidfile" ] && ! "$1" -D "$2" -m immediate -w -t 30 stop >/dev/null 2>&1; then
  pid=$(head -n 1 "$pidfile" 2>/dev/null)
  # Only a postmaster of this data directory: the pid may have been reused.
  if [ -n "$pid" ] && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$2"; then
    kill -9 "$pid" 2>/dev/null
  fi
fi
tries=0
while [ -e "$3" ] && [ "$tries" -lt 100 ]; do
  rm -rf "$3" 2>/dev/null || sleep 0.1
  tries=$((tries + 1))
done
if [ -e "$3" ]; then
  echo "fencing-pg-supervisor: could not remove $3:" >&2
  ls -laR "$3" 2>&1 | head -n 40 >&2
fi"#;
        let mut command = Command::new("sh");
        command
            .args(["-c", script, "fencing-pg-supervisor"])
            .arg(self.bin_dir.join("pg_ctl"))
            .arg(&self.data_dir)
            .arg(&self.root)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            // Inherited: a cluster it could not remove is reported in the test run's output.
            .stderr(Stdio::inherit())
            // Its own process group: a Ctrl-C to the test run does not stop it before it cleans.
            .process_group(0);
        if let Some(user) = &self.run_as {
            command.uid(user.uid).gid(user.gid);
        }
        let child = command.spawn().context("spawn the cluster supervisor (sh)")?;
        *self.supervisor.get_mut().map_err(|_| anyhow!("supervisor lock poisoned"))? = Some(child);
        Ok(())
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        let Ok(slot) = self.supervisor.get_mut() else {
            return;
        };
        if let Some(mut child) = slot.take() {
            // Closing stdin lets the supervisor stop the server and remove the temp dir.
            drop(child.stdin.take());
            let _ = child.wait();
        }
    }
}

/// The shared fake-clock cluster and the lock of its clock.
#[derive(Debug)]
pub struct FakeClock {
    /// The cluster.
    pub cluster: PgCluster,
    lock: tokio::sync::Mutex<()>,
}

impl FakeClock {
    /// Takes the clock (waits for other tests that move it), sets it to the real time, and
    /// makes a fresh migrated database `name`: its URL, and the guard that holds the clock.
    pub async fn database(&self, name: &str) -> (String, tokio::sync::MutexGuard<'_, ()>) {
        let guard = self.lock.lock().await;
        if let Err(error) = self.cluster.set_clock_offset(0) {
            panic!("cannot set the fake clock: {error:#}");
        }
        let admin = connect(&self.cluster.url("postgres")).await;
        for statement in [format!("DROP DATABASE IF EXISTS {name}"), format!("CREATE DATABASE {name}")] {
            if let Err(error) = admin.batch_execute(&statement).await {
                panic!("{statement}: {error}");
            }
        }
        let url = self.cluster.url(name);
        let mut client = connect(&url).await;
        if let Err(error) = fencing_schema::migrate(&mut client).await {
            panic!("cannot migrate {name}: {error}");
        }
        (url, guard)
    }

    /// Steps the server's wall clock to `offset_ms` from the real time.
    pub fn step_to(&self, offset_ms: i64) {
        if let Err(error) = self.cluster.set_clock_offset(offset_ms) {
            panic!("cannot set the fake clock: {error:#}");
        }
    }
}

/// A fresh database in the shared cluster, migrated by the production migration code.
#[derive(Debug)]
pub struct TestDb {
    /// The database's name.
    pub name: String,
    cluster: &'static PgCluster,
}

impl TestDb {
    /// A new database with the fencing schema installed by [`fencing_schema::migrate`].
    pub async fn new() -> TestDb {
        let db = TestDb::empty().await;
        let mut client = db.connect().await;
        if let Err(error) = fencing_schema::migrate(&mut client).await {
            panic!("migrate {}: {error:#}", db.name);
        }
        db
    }

    /// A new empty database: no fencing schema.
    pub async fn empty() -> TestDb {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let cluster = PgCluster::shared();
        let name = format!("test_{}", NEXT.fetch_add(1, Ordering::Relaxed));
        let admin = connect(&cluster.url("postgres")).await;
        if let Err(error) = admin.batch_execute(&format!("CREATE DATABASE {name}")).await {
            panic!("create database {name}: {error}");
        }
        TestDb { name, cluster }
    }

    /// The cluster this database lives in.
    pub fn cluster(&self) -> &'static PgCluster {
        self.cluster
    }

    /// The libpq URL of this database.
    pub fn url(&self) -> String {
        self.cluster.url(&self.name)
    }

    /// A new connection to this database.
    pub async fn connect(&self) -> Client {
        connect(&self.url()).await
    }

    /// `n` new connections to this database.
    pub async fn connect_many(&self, n: usize) -> Vec<Client> {
        let mut clients = Vec::with_capacity(n);
        for _ in 0..n {
            clients.push(self.connect().await);
        }
        clients
    }
}

/// Connects to `url`, driving the connection on a spawned task; panics when it cannot.
pub async fn connect(url: &str) -> Client {
    match try_connect(url).await {
        Ok(client) => client,
        Err(error) => panic!("connect to {url}: {error}"),
    }
}

/// Connects to `url`, driving the connection on a spawned task.
pub async fn try_connect(url: &str) -> Result<Client, tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(async move {
        // The connection's end is seen by the client's next call; nothing to do here.
        let _ = connection.await;
    });
    Ok(client)
}

/// A new private directory for one cluster, owned by the account that runs it.
fn make_root(run_as: Option<&RunAs>) -> Result<PathBuf> {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    // As root, the temp dir must be one the cluster's user can reach: /tmp always is.
    let base = if run_as.is_some() { PathBuf::from("/tmp") } else { std::env::temp_dir() };
    let root = base.join(format!(
        "fencing-pg-{}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed),
        rand::random::<u32>()
    ));
    fs::DirBuilder::new().mode(0o700).create(&root).with_context(|| format!("create {}", root.display()))?;
    if let Some(user) = run_as {
        nix::unistd::chown(
            &root,
            Some(nix::unistd::Uid::from_raw(user.uid)),
            Some(nix::unistd::Gid::from_raw(user.gid)),
        )
        .with_context(|| format!("give {} to user {}", root.display(), user.name))?;
    }
    Ok(root)
}

/// libfaketime, from Debian's `faketime` package.
pub fn faketime_library() -> Result<PathBuf> {
    let candidates = ["/usr/lib/x86_64-linux-gnu/faketime", "/usr/lib/aarch64-linux-gnu/faketime", "/usr/lib/faketime"];
    candidates
        .iter()
        .map(|dir| Path::new(dir).join("libfaketime.so.1"))
        .find(|path| path.is_file())
        .ok_or_else(|| anyhow!("libfaketime is needed for the clock tests: install it (`apt-get install faketime`)"))
}

/// A loopback port that was free a moment ago.
/// Whether process `pid` exists and has not exited (a zombie, exited and not yet reaped, has).
fn running(pid: i32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| stat.rsplit_once(')').map(|(_, rest)| rest.trim_start().to_owned()))
        .is_some_and(|rest| !rest.starts_with('Z') && !rest.starts_with('X'))
}

/// The processes whose parent is `pid` (from `/proc`).
fn children_of(pid: i32) -> Vec<i32> {
    fs::read_dir("/proc")
        .map(|entries| {
            entries
                .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
                .filter(|child| {
                    fs::read_to_string(format!("/proc/{child}/stat")).ok().is_some_and(|stat| {
                        // The parent pid is the second field after the parenthesized name.
                        stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<i32>().ok())
                            == Some(pid)
                    })
                })
                .collect()
        })
        .unwrap_or_default()
}

fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("probe for a free port")?;
    Ok(listener.local_addr()?.port())
}
