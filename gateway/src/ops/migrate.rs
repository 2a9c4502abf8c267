//! `fencing-gateway migrate`.

use std::process::ExitCode;

use crate::app::migrate;
use crate::error_chain;

/// `fencing-gateway migrate`: applies the pending migrations and says what it did.
pub async fn command(database_url: &str) -> ExitCode {
    match migrate(database_url).await {
        Ok(report) if report.applied.is_empty() => {
            println!("schema fencing is current at version {}", report.version);
            ExitCode::SUCCESS
        }
        Ok(report) => {
            println!("applied migrations {:?}; schema fencing is at version {}", report.applied, report.version);
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("fencing-gateway migrate: {}", error_chain(&error));
            ExitCode::FAILURE
        }
    }
}
