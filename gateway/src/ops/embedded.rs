//! The embedded default: with no database URL configured, `serve` starts and owns a private
//! local PostgreSQL from the system's server binaries, under a data directory that is
//! initialised on first start, and stops it when the gateway stops.
//!
//! The server listens on no TCP port at all: only on a Unix socket in a private directory (mode
//! 0700, owned by the account the server runs as), so no other local user can reach it, let
//! alone as its superuser. PostgreSQL refuses to run as root, so as root it runs as the
//! unprivileged `postgres` user (or `FENCING_PG_USER`), and the gateway, as root, reaches the
//! socket through the private directory anyway.
//! The test harness uses the same discovery ([`find_bin_dir`], [`unprivileged_user`]).

use std::os::unix::fs::DirBuilderExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use tracing::info;

/// The superuser the embedded cluster is initialised with.
pub const SUPERUSER: &str = "postgres";

/// An unprivileged account to run PostgreSQL as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunAs {
    /// The user name.
    pub name: String,
    /// Its uid.
    pub uid: u32,
    /// Its primary gid.
    pub gid: u32,
}

/// Finds the PostgreSQL server binaries: `FENCING_PG_BIN_DIR`, then `pg_ctl` on PATH, then
/// `pg_config --bindir`, then the newest `/usr/lib/postgresql/*/bin`.
pub fn find_bin_dir() -> Result<PathBuf, String> {
    let has_server = |dir: &Path| dir.join("initdb").is_file() && dir.join("pg_ctl").is_file();
    if let Some(dir) = std::env::var_os("FENCING_PG_BIN_DIR") {
        let dir = PathBuf::from(dir);
        if has_server(&dir) {
            return Ok(dir);
        }
        return Err(format!("FENCING_PG_BIN_DIR={} holds no initdb and pg_ctl", dir.display()));
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            // pg_ctl finds postgres next to itself, so follow a link to the real directory.
            if let Ok(pg_ctl) = std::fs::canonicalize(dir.join("pg_ctl"))
                && let Some(real_dir) = pg_ctl.parent()
                && has_server(real_dir)
            {
                return Ok(real_dir.to_path_buf());
            }
        }
    }
    if let Ok(output) = Command::new("pg_config").arg("--bindir").output()
        && output.status.success()
    {
        let dir = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
        if has_server(&dir) {
            return Ok(dir);
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let dir = entry.path().join("bin");
            has_server(&dir).then_some((version, dir))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, dir)| dir).ok_or_else(|| {
        "no PostgreSQL server binaries found (looked in FENCING_PG_BIN_DIR, on PATH, in pg_config --bindir and \
         /usr/lib/postgresql/*/bin); install them, e.g. `apt-get install postgresql` on Debian or Ubuntu, or \
         configure database.url"
            .to_owned()
    })
}

/// The account to run PostgreSQL as: `None` unless this process is root.
pub fn unprivileged_user() -> Result<Option<RunAs>, String> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(None);
    }
    let name = std::env::var("FENCING_PG_USER").unwrap_or_else(|_| "postgres".to_owned());
    let user = nix::unistd::User::from_name(&name)
        .map_err(|error| format!("look up user {name}: {error}"))?
        .ok_or_else(|| {
            format!(
                "running as root, and PostgreSQL refuses to run as root, but there is no user {name:?} to run it as: \
                 install the postgresql package (it creates `postgres`), or name an unprivileged user in FENCING_PG_USER"
            )
        })?;
    if user.uid.is_root() {
        return Err(format!("FENCING_PG_USER={name} is root; PostgreSQL refuses to run as root"));
    }
    Ok(Some(RunAs { name, uid: user.uid.as_raw(), gid: user.gid.as_raw() }))
}

/// The port number in the socket's file name (`.s.PGSQL.5432`); no TCP port is opened.
const SOCKET_PORT: u16 = 5432;

/// A PostgreSQL server the gateway owns.
#[derive(Debug)]
pub struct EmbeddedPostgres {
    bin_dir: PathBuf,
    data_dir: PathBuf,
    run_as: Option<RunAs>,
    /// The private directory (0700) holding the server's Unix socket.
    socket_dir: PathBuf,
}

impl EmbeddedPostgres {
    /// Starts the server in `data_dir`, initialising it first when empty. A server already
    /// running there (left by a gateway that was killed) is adopted.
    pub fn start(data_dir: &Path) -> Result<EmbeddedPostgres, String> {
        let bin_dir = find_bin_dir()?;
        let run_as = unprivileged_user()?;
        let data_dir = std::path::absolute(data_dir).map_err(|e| format!("database.data_dir: {e}"))?;
        let mut server = EmbeddedPostgres { bin_dir, data_dir, run_as, socket_dir: PathBuf::new() };
        if !server.data_dir.join("PG_VERSION").is_file() {
            server.initdb()?;
        }
        if let Some(socket_dir) = server.running_socket_dir() {
            info!(data_dir = %server.data_dir.display(), socket_dir = %socket_dir.display(),
                  "adopting the embedded PostgreSQL already running");
            server.socket_dir = socket_dir;
            return Ok(server);
        }
        server.socket_dir = server.private_socket_dir()?;
        let log = server.data_dir.join("server.log");
        let options = format!(
            "-c port={SOCKET_PORT} -c listen_addresses='' -c unix_socket_directories='{}' -c unix_socket_permissions=0700",
            server.socket_dir.display()
        );
        let output = server
            .command("pg_ctl")
            .arg("-D")
            .arg(&server.data_dir)
            .arg("-l")
            .arg(&log)
            .args(["-o", &options, "-w", "-t", "60", "start"])
            .output()
            .map_err(|e| format!("run pg_ctl start: {e}"))?;
        if !output.status.success() {
            return Err(format!("pg_ctl start failed: {}; see {}", describe(&output), log.display()));
        }
        info!(data_dir = %server.data_dir.display(), socket_dir = %server.socket_dir.display(),
              "started the embedded PostgreSQL (Unix socket only)");
        Ok(server)
    }

    /// The connection string the gateway connects with (a Unix socket, no password: only the
    /// server's account and root can reach the socket's directory).
    pub fn url(&self) -> String {
        format!("host={} port={SOCKET_PORT} user={SUPERUSER} dbname=postgres", self.socket_dir.display())
    }

    /// The private directory holding the server's socket.
    pub fn socket_dir(&self) -> &Path {
        &self.socket_dir
    }

    /// A new directory for the socket, mode 0700, owned by the server's account. It lives in
    /// the temp dir, not the data dir, because a socket's path must stay under about 100 bytes.
    fn private_socket_dir(&self) -> Result<PathBuf, String> {
        let dir = std::env::temp_dir().join(format!("fencing-gateway-pg-{:016x}", rand::random::<u64>()));
        std::fs::DirBuilder::new().mode(0o700).create(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        if let Some(user) = &self.run_as {
            let (uid, gid) = (nix::unistd::Uid::from_raw(user.uid), nix::unistd::Gid::from_raw(user.gid));
            nix::unistd::chown(&dir, Some(uid), Some(gid))
                .map_err(|e| format!("give {} to {}: {e}", dir.display(), user.name))?;
        }
        Ok(dir)
    }

    /// Stops the server (fast shutdown: sessions are disconnected, data is flushed).
    pub fn stop(&self) -> Result<(), String> {
        let output = self
            .command("pg_ctl")
            .arg("-D")
            .arg(&self.data_dir)
            .args(["-m", "fast", "-w", "-t", "60", "stop"])
            .output()
            .map_err(|e| format!("run pg_ctl stop: {e}"))?;
        if !output.status.success() {
            return Err(format!("pg_ctl stop failed: {}", describe(&output)));
        }
        let _ = std::fs::remove_dir(&self.socket_dir);
        info!("stopped the embedded PostgreSQL");
        Ok(())
    }

    fn command(&self, program: &str) -> Command {
        let mut command = Command::new(self.bin_dir.join(program));
        for variable in ["PGDATA", "PGHOST", "PGHOSTADDR", "PGPORT", "PGUSER", "PGDATABASE", "PGOPTIONS"] {
            command.env_remove(variable);
        }
        command.stdin(Stdio::null());
        if let Some(user) = &self.run_as {
            command.uid(user.uid).gid(user.gid);
        }
        command
    }

    fn initdb(&self) -> Result<(), String> {
        // Parents with the default mode, so that the server's user can reach the data dir.
        if let Some(parent) = self.data_dir.parent() {
            std::fs::create_dir_all(parent).map_err(|e| format!("create {}: {e}", parent.display()))?;
            self.check_reachable(parent)?;
        }
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&self.data_dir)
            .map_err(|e| format!("create {}: {e}", self.data_dir.display()))?;
        if let Some(user) = &self.run_as {
            let (uid, gid) = (nix::unistd::Uid::from_raw(user.uid), nix::unistd::Gid::from_raw(user.gid));
            nix::unistd::chown(&self.data_dir, Some(uid), Some(gid))
                .map_err(|e| format!("give {} to {}: {e}", self.data_dir.display(), user.name))?;
        }
        info!(data_dir = %self.data_dir.display(), "initialising the embedded PostgreSQL");
        let output = self
            .command("initdb")
            .arg("-D")
            .arg(&self.data_dir)
            .args(["-U", SUPERUSER, "--auth=trust", "--encoding=UTF8", "--locale=C"])
            .output()
            .map_err(|e| format!("run initdb: {e}"))?;
        if !output.status.success() {
            return Err(format!("initdb failed: {}", describe(&output)));
        }
        Ok(())
    }

    /// Whether the account the server would run as (another than root, when this runs as root)
    /// can enter the nearest existing directory at or above `dir`.
    pub fn can_reach(dir: &Path) -> Result<bool, String> {
        let Some(user) = unprivileged_user()? else { return Ok(true) };
        let dir = std::path::absolute(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let Some(existing) = dir.ancestors().find(|ancestor| ancestor.is_dir()) else { return Ok(true) };
        enters(&user, existing)
    }

    /// As root, the server runs as another account, which must be able to enter every directory
    /// above the data dir: a data dir under root's 0700 home, say, is not. Says what to do.
    fn check_reachable(&self, dir: &Path) -> Result<(), String> {
        let Some(user) = &self.run_as else { return Ok(()) };
        if enters(user, dir)? {
            return Ok(());
        }
        let blocker = dir
            .ancestors()
            .filter(|ancestor| {
                std::fs::metadata(ancestor).is_ok_and(|meta| {
                    use std::os::unix::fs::PermissionsExt;
                    meta.permissions().mode() & 0o001 == 0
                })
            })
            .last()
            .unwrap_or(dir);
        Err(format!(
            "database.data_dir {} is under {}, which the user {} cannot enter (the embedded PostgreSQL runs as {} \
             because PostgreSQL refuses to run as root). Choose a data_dir that {} can reach, for example \
             /var/lib/fencing-gateway/pgdata or one under /tmp, or allow it in (chmod o+x {}), or run the gateway as \
             an ordinary user, or configure database.url",
            self.data_dir.display(),
            blocker.display(),
            user.name,
            user.name,
            user.name,
            blocker.display()
        ))
    }

    /// The socket directory of a server already running in the data directory, from
    /// `postmaster.pid` (its fifth line).
    fn running_socket_dir(&self) -> Option<PathBuf> {
        let status = self.command("pg_ctl").arg("-D").arg(&self.data_dir).arg("status").output().ok()?;
        if !status.status.success() {
            return None;
        }
        let text = std::fs::read_to_string(self.data_dir.join("postmaster.pid")).ok()?;
        let dir = text.lines().nth(4)?.trim();
        (!dir.is_empty()).then(|| PathBuf::from(dir))
    }
}

/// The connection string of the embedded PostgreSQL running in `data_dir` (started by a
/// `serve` with no database URL), for `inspect` and `admin`; an error saying what to do when
/// none runs there.
pub fn running_url(data_dir: &Path) -> Result<String, String> {
    let data_dir = std::path::absolute(data_dir).map_err(|e| format!("database.data_dir: {e}"))?;
    let pid_file = data_dir.join("postmaster.pid");
    let text = std::fs::read_to_string(&pid_file).map_err(|_| {
        format!(
            "no embedded PostgreSQL runs in {} (no postmaster.pid): start `fencing-gateway serve` with this \
             configuration first, or pass --database-url",
            data_dir.display()
        )
    })?;
    let mut lines = text.lines();
    let pid = lines.next().and_then(|line| line.trim().parse::<i32>().ok());
    let socket_dir = lines.nth(3).map(str::trim).filter(|dir| !dir.is_empty());
    let alive = pid.is_some_and(|pid| nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok());
    match (alive, socket_dir) {
        (true, Some(dir)) => Ok(format!("host={dir} port={SOCKET_PORT} user={SUPERUSER} dbname=postgres")),
        _ => Err(format!(
            "the embedded PostgreSQL in {} is not running: start `fencing-gateway serve` with this configuration \
             first, or pass --database-url",
            data_dir.display()
        )),
    }
}

/// A finished command's status and output, on one line, for error messages.
pub fn describe(output: &Output) -> String {
    format!(
        "{}; stdout: {}; stderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stdout).trim(),
        String::from_utf8_lossy(&output.stderr).trim()
    )
}

/// Whether `user` can enter `dir` (a shell's `cd` as that account).
fn enters(user: &RunAs, dir: &Path) -> Result<bool, String> {
    let entered = Command::new("sh")
        .args(["-c", "cd -- \"$1\"", "check"])
        .arg(dir)
        .uid(user.uid)
        .gid(user.gid)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|e| format!("check that {} can enter {}: {e}", user.name, dir.display()))?;
    Ok(entered.success())
}
