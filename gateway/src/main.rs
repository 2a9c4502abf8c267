//! The `fencing-gateway` binary: refuse a password in argv, parse the command line, set up
//! tracing, run the command (`ops::run`: `serve` loads the configuration, builds the app, waits
//! for a signal and drains).

use std::process::ExitCode;

use clap::Parser;
use fencing_gateway::ops;
use fencing_gateway::ops::cli::{Cli, EXIT_USAGE};

#[tokio::main]
async fn main() -> ExitCode {
    // Planted bugs of the fault suite (`FAILPOINTS`): only in a build with the `failpoints`
    // feature, which nothing but the test crate turns on.
    #[cfg(feature = "failpoints")]
    let _failpoints = fail::FailScenario::setup();
    if let Some(message) = ops::cli::password_in_argv(std::env::args_os()).or_else(ops::cli::both_database_urls) {
        eprintln!("fencing-gateway: {message}");
        return ExitCode::from(EXIT_USAGE);
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            let code = if error.use_stderr() { EXIT_USAGE } else { 0 };
            let _ = error.print();
            return ExitCode::from(code);
        }
    };
    if let Err(message) = ops::cli::init_tracing() {
        eprintln!("invalid configuration: {message}");
        return ExitCode::from(EXIT_USAGE);
    }
    ops::run(cli).await
}
