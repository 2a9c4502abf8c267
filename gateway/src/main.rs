//! The `fencing-gateway` binary: parse, set up tracing, run the command, report.

use std::process::ExitCode;

use clap::Parser;
use fencing_gateway::cli::{Cli, Command, EXIT_USAGE};
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            let code = if error.use_stderr() { EXIT_USAGE } else { 0 };
            let _ = error.print();
            return ExitCode::from(code);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();

    match cli.command {
        Command::Migrate { database_url } => {
            match fencing_gateway::migrate::run(&database_url).await {
                Ok(report) if report.applied.is_empty() => {
                    println!("schema fencing is current at version {}", report.version);
                    ExitCode::SUCCESS
                }
                Ok(report) => {
                    println!(
                        "applied migrations {:?}; schema fencing is at version {}",
                        report.applied, report.version
                    );
                    ExitCode::SUCCESS
                }
                Err(error) => {
                    eprintln!("fencing-gateway migrate: {}", error_chain(&error));
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// The error and its sources on one line, for a human.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
