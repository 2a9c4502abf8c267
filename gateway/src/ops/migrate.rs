//! `fencing-gateway migrate`.

use std::process::ExitCode;

use crate::app::migrate;
use crate::error_chain;

/// What a migration did, in one line: the versions applied, and the function files applied
/// because they were new or their text differed from the one recorded (a new release of the
/// same schema version; never all of them on a second run).
fn summary(report: &fencing_schema::MigrationReport) -> String {
    let migrations = if report.applied.is_empty() {
        format!("schema fencing was at version {}: no migration to apply", report.version)
    } else {
        format!("applied migrations {:?}; schema fencing is at version {}", report.applied, report.version)
    };
    match report.functions.len() {
        0 => format!("{migrations}; every function file as recorded"),
        count => format!(
            "{migrations}; applied {count} function file(s) that were new or changed since they were recorded: {}",
            report.functions.join(", ")
        ),
    }
}

/// `fencing-gateway migrate`: applies the pending migrations and says what it did.
pub async fn command(database_url: &str) -> ExitCode {
    match migrate(database_url).await {
        Ok(report) => {
            println!("{}", summary(&report));
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("fencing-gateway migrate: {}", error_chain(&error));
            ExitCode::FAILURE
        }
    }
}
