//! The command line.

use clap::{Parser, Subcommand};

/// Exit code for a bad command line or configuration (`EX_USAGE` of sysexits.h).
pub const EXIT_USAGE: u8 = 64;

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
    /// Apply the pending schema migrations (schema `fencing`) to a database, then exit.
    ///
    /// Safe to run from several replicas at once; refuses a database migrated by a newer release.
    Migrate {
        /// The database, as a libpq URL or key=value string.
        #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
        database_url: String,
    },
}
