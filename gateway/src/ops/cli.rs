//! The command line.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

/// Exit code for a bad command line or configuration (`EX_USAGE` of sysexits.h).
pub const EXIT_USAGE: u8 = 64;
/// Exit code when a needed service cannot be set up (`EX_UNAVAILABLE`).
pub const EXIT_UNAVAILABLE: u8 = 69;

/// The fencing gateway: refuses the writes of stale leaders.
#[derive(Debug, Parser)]
#[command(name = "fencing-gateway", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the proxy and control listeners until SIGTERM or SIGINT.
    ///
    /// Without a database URL (database.url, FENCING_DATABASE_URL or DATABASE_URL), starts and
    /// owns a private local PostgreSQL under database.data_dir.
    Serve {
        /// The TOML configuration file; without it, defaults and environment variables only.
        #[arg(long, env = "FENCING_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Tell the whole story on this machine: an embedded Postgres, an example upstream, the
    /// gateway and two leader processes; leader A is paused, B takes over, A wakes up and its
    /// write is refused. Then leaves the metrics endpoint up until Ctrl-C.
    Demo {
        /// Where the embedded Postgres keeps its data. Default: .fencing-gateway/demo-pgdata here,
        /// or, when this runs as root and PostgreSQL's account cannot enter this directory (under
        /// root's 0700 home, say), a new directory under /tmp, removed when the demo ends.
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// The control listener (metrics); port 0 picks a free one.
        #[arg(long, default_value = "127.0.0.1:9090")]
        control_listen: std::net::SocketAddr,
        /// Exit when the story is told instead of waiting for Ctrl-C (for tests and scripts).
        #[arg(long)]
        exit_after_story: bool,
    },
    /// Make a client token: prints a new random bearer token (give it to the client, keep it
    /// out of argv and logs) and the `[[clients]]` entry with its SHA-256 for the configuration.
    Token {
        /// The client's name (A-Z a-z 0-9 . _ -).
        #[arg(long)]
        name: String,
        /// A lease-key glob the client may use; repeat for more.
        #[arg(long = "lease")]
        leases: Vec<String>,
        /// Let the client read leases, fences and /metrics.
        #[arg(long)]
        read: bool,
    },
    /// One leader of the demo (started by `demo`): elects itself through the library and writes
    /// through the gateway, printing what happens.
    #[command(hide = true)]
    DemoLeader {
        /// The database.
        #[arg(long)]
        database_url: String,
        /// The owner name.
        #[arg(long)]
        owner: String,
        /// The gateway's proxy listener.
        #[arg(long)]
        proxy: std::net::SocketAddr,
    },
    /// Show leases, fences, refused writes and the admin audit.
    Inspect {
        /// What to show.
        #[command(subcommand)]
        what: Inspect,
        /// The database, as a libpq URL or key=value string. Default: the configuration's
        /// database.url, else the embedded PostgreSQL that `serve` runs under its data_dir.
        #[arg(long, env = "DATABASE_URL", hide_env_values = true, global = true)]
        database_url: Option<String>,
        /// The gateway's configuration file, to find its database.
        #[arg(long, env = "FENCING_CONFIG", global = true)]
        config: Option<PathBuf>,
    },
    /// Change a lease or a fence by hand after an incident: asks for confirmation, leaves an
    /// audit row in fencing.admin_audit.
    Admin {
        /// What to change.
        #[command(subcommand)]
        action: Admin,
        /// The database, as a libpq URL or key=value string. Default: the configuration's
        /// database.url, else the embedded PostgreSQL that `serve` runs under its data_dir.
        #[arg(long, env = "DATABASE_URL", hide_env_values = true, global = true)]
        database_url: Option<String>,
        /// The gateway's configuration file, to find its database.
        #[arg(long, env = "FENCING_CONFIG", global = true)]
        config: Option<PathBuf>,
    },
    /// Play the zombie story against your own setup, through a gateway's route or into a table
    /// protected by the SQL guard: leader A acquires a lease and writes, its lease runs out, B
    /// takes over and writes, A writes again with its old term; every answer is checked (and,
    /// with --check-url or --check-query, what was applied). Exit 0 when fencing held, 1 when a
    /// step failed, 64 on a bad command line or when the lease or resource is in use (see
    /// --yes), 69 when the gateway or database could not be asked.
    Verify(VerifyArgs),
    /// Apply the pending schema migrations (schema `fencing`) to a database, then exit.
    ///
    /// Safe to run from several replicas at once; refuses a database migrated by a newer release.
    Migrate {
        /// The database, as a libpq URL or key=value string; or DATABASE_URL_FILE, a file
        /// holding it. A password never goes on the command line (refused): every local user
        /// can read it there.
        #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
        database_url: Option<String>,
    },
}

/// `fencing-gateway verify ...`: a route (`--control`, `--proxy`, `--path`, `--resource`) or a
/// protected table (`--table`, `--write`, the database URL).
#[derive(Debug, clap::Args)]
pub struct VerifyArgs {
    /// The gateway's control listener, e.g. http://127.0.0.1:9090.
    #[arg(long, conflicts_with = "table", requires_all = ["proxy", "path", "resource"])]
    pub control: Option<String>,
    /// The gateway's proxy listener, e.g. http://127.0.0.1:8080.
    #[arg(long, requires = "control")]
    pub proxy: Option<String>,
    /// The path (and query) of a write through the proxy on the route to test, e.g.
    /// /ledger/verify-account/entries.
    #[arg(long, requires = "control")]
    pub path: Option<String>,
    /// The resource the writes go to: on a route, as the route names it (also sent as
    /// Fencing-Resource, for routes that take it from that header); for a table, default the
    /// one its guard fences.
    #[arg(long)]
    pub resource: Option<String>,
    /// The lease the two leaders compete for; for a route or table bound to a lease, that lease.
    #[arg(long, default_value = "fencing-verify")]
    pub lease: String,
    /// The write's method (a route; default POST).
    #[arg(long, requires = "control")]
    pub method: Option<String>,
    /// How the leaders present their term (a route; default verify).
    #[arg(long, value_enum, requires = "control")]
    pub mode: Option<crate::ops::verify::Mode>,
    /// Leader A's lease ttl: B takes over once it has run out.
    #[arg(long, default_value_t = 1000)]
    pub ttl_ms: u64,
    /// A URL whose body shows what the upstream applied (GET): after the story it must show
    /// B's write and no refused one (each write's body carries a marker).
    #[arg(long, requires = "control")]
    pub check_url: Option<String>,
    /// A file holding the client's bearer token (else FENCING_CLIENT_TOKEN; never argv).
    #[arg(long, requires = "control")]
    pub token_file: Option<PathBuf>,
    /// A CA file for https:// listeners.
    #[arg(long, requires = "control")]
    pub ca_file: Option<PathBuf>,
    /// A table protected with fencing.protect, instead of a route: the leaders write into it
    /// in SQL, presenting their terms as fencing.token, with the leases of the database's
    /// fencing schema.
    #[arg(long, requires = "write")]
    pub table: Option<String>,
    /// The write each leader makes into --table: one statement that changes at least one row,
    /// with $1 the write's marker (text), e.g. "INSERT INTO orders (note) VALUES ($1)".
    #[arg(long, requires = "table")]
    pub write: Option<String>,
    /// A query whose rows show what --table holds: after the story they must show B's marker
    /// and no refused one. Run in a read-only transaction.
    #[arg(long, requires = "table")]
    pub check_query: Option<String>,
    /// A statement B runs at the end with its term, $1 the run's marker prefix, to remove the
    /// run's rows, e.g. "DELETE FROM orders WHERE note LIKE $1 || '%'".
    #[arg(long, requires = "table")]
    pub cleanup: Option<String>,
    /// The database of --table, as a libpq URL or key=value string (or DATABASE_URL_FILE, a
    /// file holding it). Its role must be allowed to call fencing.acquire and fencing.release
    /// and to write the table. Default: as for `inspect`.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// Run although the lease is held (verify then waits up to 30 s for it to be free: a
    /// leader that renews keeps it) or the resource's fence is not this lease's (this run's
    /// writes may raise it above its own writers' terms).
    #[arg(long)]
    pub yes: bool,
}

/// `fencing-gateway inspect ...`
#[derive(Debug, Subcommand)]
pub enum Inspect {
    /// Every lease: holder, term (the number of leadership periods so far), time left.
    Leases,
    /// One resource's fence: its maximum term and the lease it is bound to.
    Fence {
        /// The resource.
        resource: String,
    },
    /// The newest refused writes, newest first.
    Refusals {
        /// Only this resource's.
        #[arg(long)]
        resource: Option<String>,
        /// How many.
        #[arg(long, default_value_t = 50)]
        limit: i64,
    },
    /// A lease's leadership periods, newest first: term, owner, granted, ended and why.
    History {
        /// The lease key.
        key: String,
        /// How many.
        #[arg(long, default_value_t = 50)]
        limit: i64,
    },
    /// The fenced log's streams: lease, head, first kept entry, retention, and each follower's
    /// position and lag (one stream, or every stream).
    Streams {
        /// Only this stream.
        stream: Option<String>,
    },
    /// The newest admin actions, newest first.
    Audit {
        /// How many.
        #[arg(long, default_value_t = 50)]
        limit: i64,
    },
}

/// `fencing-gateway admin ...`
#[derive(Debug, Subcommand)]
pub enum Admin {
    /// End a lease's current period now, whoever holds it (a dead owner); the next holder gets
    /// the next term.
    ReleaseLease {
        /// The lease key.
        key: String,
        /// Who, why, and whether to ask.
        #[command(flatten)]
        audit: AuditArgs,
    },
    /// Ask the holder of a lease to step down (it hears it at its next renewal, drains its
    /// leader work and releases), optionally naming the owner that leads next; with
    /// `--force-after-ms`, end its period if it has not stepped down by then.
    Handover {
        /// The lease key.
        key: String,
        /// The owner that should lead next, as `inspect leases` shows owners (an elector's
        /// `<owner>#<incarnation>` also matches `<owner>`).
        #[arg(long)]
        to: Option<String>,
        /// Wait this long (at most 600000) for the holder to step down, then end its period
        /// (never a later term's).
        #[arg(long, value_parser = clap::value_parser!(u64).range(0..=600_000))]
        force_after_ms: Option<u64>,
        /// Who, why, and whether to ask.
        #[command(flatten)]
        audit: AuditArgs,
    },
    /// Bind a resource to another lease (a write never rebinds). Its maximum stays: the new
    /// lease's leader is refused until its term reaches it.
    Rebind {
        /// The resource.
        resource: String,
        /// The lease key it is bound to from now on.
        #[arg(long)]
        lease: String,
        /// Who, why, and whether to ask.
        #[command(flatten)]
        audit: AuditArgs,
    },
    /// Set an unbound fence that a client poisoned (a term no real leader reaches) back to a
    /// term: the one way a fence goes back. Stop the poisoning client first.
    ResetFence {
        /// The fence name (for an unbound gateway route: the route prefix, '/', the resource).
        resource: String,
        /// The maximum term from now on.
        #[arg(long)]
        term: i64,
        /// Who, why, and whether to ask.
        #[command(flatten)]
        audit: AuditArgs,
    },
    /// Create a stream of the fenced log bound to a lease (replication model B): its leader
    /// appends with the lease's term, followers tail it. No retention unless given; retention
    /// never passes a registered follower unless `--max-entries` says so.
    CreateStream {
        /// The stream's name (1 to 244 characters).
        stream: String,
        /// The lease whose current term alone may append.
        #[arg(long)]
        lease: String,
        /// Keep at least this many of the newest entries.
        #[arg(long, value_parser = clap::value_parser!(i64).range(1..))]
        keep_count: Option<i64>,
        /// Keep entries younger than this many milliseconds.
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        keep_age_ms: Option<u64>,
        /// Never keep more than this many entries, followers or not.
        #[arg(long, value_parser = clap::value_parser!(i64).range(1..))]
        max_entries: Option<i64>,
    },
    /// Raise a resource's fence to a term, so every writer below it is refused from now on.
    /// A fence never goes back.
    AdvanceFence {
        /// The resource.
        resource: String,
        /// The new maximum term; must be above the current one.
        #[arg(long)]
        term: i64,
        /// Who, why, and whether to ask.
        #[command(flatten)]
        audit: AuditArgs,
    },
}

/// What every admin action records and asks.
#[derive(Debug, clap::Args)]
pub struct AuditArgs {
    /// Why, for the audit row.
    #[arg(long)]
    pub reason: String,
    /// Who, for the audit row (default: $USER@host).
    #[arg(long)]
    pub actor: Option<String>,
    /// Do not ask for confirmation.
    #[arg(long)]
    pub yes: bool,
}

/// A password on the command line is readable by every local user (`/proc/PID/cmdline`, `ps`):
/// refused, with where to put it instead.
pub fn password_in_argv(args: impl Iterator<Item = std::ffi::OsString>) -> Option<String> {
    let mut flag_before = false;
    for arg in args {
        let arg = arg.to_string_lossy().into_owned();
        let value = if flag_before { Some(arg.as_str()) } else { arg.strip_prefix("--database-url=") };
        flag_before = arg == "--database-url";
        if value.is_some_and(carries_password) {
            return Some(
                "--database-url carries a password, which every local user can read in /proc/PID/cmdline; \
                 set DATABASE_URL, or DATABASE_URL_FILE naming a file only you can read, instead"
                    .to_owned(),
            );
        }
    }
    None
}

/// Whether a libpq URL or key=value string names a password, however else it is spelled:
/// `user:password@` in a URL, or a `password` parameter in either form.
fn carries_password(text: &str) -> bool {
    // As the driver reads it (a `/` or `?` in a URL's password, a percent-encoded key), and,
    // for what it cannot read, by its spelling.
    if text.parse::<tokio_postgres::Config>().is_ok_and(|config| config.get_password().is_some()) {
        return true;
    }
    let lower = text.to_ascii_lowercase();
    let url_userinfo = ["postgres://", "postgresql://"]
        .iter()
        .find_map(|scheme| lower.strip_prefix(scheme))
        .and_then(|rest| rest.split(['/', '?']).next())
        .and_then(|authority| authority.rsplit_once('@'))
        .is_some_and(|(userinfo, _)| userinfo.contains(':'));
    // libpq allows spaces around a key=value string's `=`.
    url_userinfo || lower.split("password").skip(1).any(|rest| rest.trim_start().starts_with('='))
}

/// `DATABASE_URL` and `DATABASE_URL_FILE` both set: which one is meant is unclear.
pub fn both_database_urls() -> Option<String> {
    (std::env::var_os("DATABASE_URL").is_some() && std::env::var_os("DATABASE_URL_FILE").is_some())
        .then(|| "set DATABASE_URL or DATABASE_URL_FILE, not both".to_owned())
}

/// Sets up the log: colours only on a terminal; JSON lines for log shippers with
/// `FENCING_LOG_FORMAT=json`. An unknown format is refused.
pub fn init_tracing() -> Result<(), String> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    match std::env::var("FENCING_LOG_FORMAT").as_deref() {
        Ok("json") => tracing_subscriber::fmt()
            .json()
            .with_current_span(true)
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .init(),
        Ok("text") | Err(_) => tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_writer(std::io::stderr)
            .init(),
        Ok(other) => return Err(format!("FENCING_LOG_FORMAT: {other:?} is neither text nor json")),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{carries_password, password_in_argv};

    #[test]
    fn a_password_on_the_command_line_is_found_however_it_is_spelled() {
        for text in [
            "postgres://app:secret@db/app",
            "postgresql://app:secret@db:5432/app?sslmode=verify-full",
            "host=db user=app password=secret",
            "host=db user=app password = secret",
            "host=db PASSWORD='secret'",
            "postgres://db/app?password=secret",
            "postgres://app:pa/ss@db/app",
            "postgres://app:p?ss@db/app",
            "postgres://db/app?pass%77ord=secret",
        ] {
            assert!(carries_password(text), "{text}");
        }
        for text in ["postgres://app@db/app", "host=db user=app dbname=passwords", "host=/run/postgresql user=app"] {
            assert!(!carries_password(text), "{text}");
        }
        let argv = |args: &[&str]| password_in_argv(args.iter().map(std::ffi::OsString::from));
        assert!(argv(&["fencing-gateway", "verify", "--database-url", "host=db password = x"]).is_some());
        assert!(argv(&["fencing-gateway", "migrate", "--database-url=postgres://a:b@db/x"]).is_some());
        assert!(argv(&["fencing-gateway", "migrate", "--database-url", "postgres://a@db/x"]).is_none());
    }
}
