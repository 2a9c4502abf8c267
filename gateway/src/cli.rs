//! The command line.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

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
    /// Apply the pending schema migrations (schema `fencing`) to a database, then exit.
    ///
    /// Safe to run from several replicas at once; refuses a database migrated by a newer release.
    Migrate {
        /// The database, as a libpq URL or key=value string.
        #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
        database_url: String,
    },
}
