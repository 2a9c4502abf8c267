//! The `fencing-checker` command: checks a run directory and prints the run table and the
//! violations. Exit code 0: no violation; 1: at least one; 2: unreadable input or bad usage.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use fencing_checker::{CheckOptions, check_run_with};

/// Checks a fault suite run directory (one `schedule-*` folder per schedule) for violations.
#[derive(Debug, Parser)]
#[command(name = "fencing-checker", version)]
struct Args {
    /// The run directory.
    run_dir: PathBuf,
    /// S4: how long a grant may take to commit before a write with an older term counts.
    #[arg(long, default_value_t = 100)]
    grant_margin_ms: u32,
    /// S5: how late a lower-term byte may arrive after a higher-term head, in microseconds.
    #[arg(long, default_value_t = 0)]
    byte_tolerance_us: u32,
    /// S5: how late a byte may arrive after its gateway's deadline for the write, in milliseconds.
    #[arg(long, default_value_t = 250)]
    deadline_tolerance_ms: u32,
    /// Print the report as JSON instead of the table.
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let opts = CheckOptions {
        grant_margin_us: i64::from(args.grant_margin_ms) * 1000,
        byte_tolerance_us: i64::from(args.byte_tolerance_us),
        deadline_tolerance_us: i64::from(args.deadline_tolerance_ms) * 1000,
    };
    let report = match check_run_with(&args.run_dir, &opts) {
        Ok(report) => report,
        Err(e) => {
            eprintln!("fencing-checker: {e}");
            return ExitCode::from(2);
        }
    };
    if args.json {
        match serde_json::to_string_pretty(&report) {
            Ok(json) => println!("{json}"),
            Err(e) => {
                eprintln!("fencing-checker: {e}");
                return ExitCode::from(2);
            }
        }
    } else {
        print!("{}", report.render());
    }
    if report.is_clean() { ExitCode::SUCCESS } else { ExitCode::from(1) }
}
