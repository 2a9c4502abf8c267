//! The fault suite from the command line: a longer soak than CI's, or a replay of one seed.
//!
//! ```text
//! fault-suite [--schedules 25] [--seconds 6] [--seed N] [--out DIR] [--plant NAME] [--probe KIND]
//!             [--keep-going]
//! ```
//! `--probe` makes every schedule's durability probe take one path (`pg-crash-after-raise`,
//! `-sql-raise`, `-advance`, `-bind`, `-rebind`) instead of the seed's turn.
//! Prints the seed, runs the schedules (schedule i uses seed + i), checks each history with the
//! independent checker (`fencing-checker`), prints the run's table, and exits 1 on any violation.
//! Planted bugs (for showing that the checker catches them): every name of
//! `fencing_tests::faultsuite::Plant::ALL`, in the README's table (`weak-fence`, `no-settle`,
//! `gate-async-commit`, ...).

use std::path::PathBuf;
use std::process::ExitCode;

use fencing_tests::faultprobe::ProbePath;
use fencing_tests::faultsuite::{Plant, SuiteConfig, run, start_cluster};

fn parse() -> Result<(SuiteConfig, bool), String> {
    let mut config = SuiteConfig::new(25, 6, rand::random::<u32>().into(), PathBuf::from("fault-suite-out"));
    let mut keep_going = false;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "--keep-going" {
            keep_going = true;
            continue;
        }
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--schedules" => config.schedules = value.parse().map_err(|e| format!("--schedules: {e}"))?,
            "--seconds" => config.seconds = value.parse().map_err(|e| format!("--seconds: {e}"))?,
            "--seed" => config.seed = value.parse().map_err(|e| format!("--seed: {e}"))?,
            "--out" => config.out = PathBuf::from(value),
            "--probe" => {
                config.probe = Some(ProbePath::parse(&value).ok_or_else(|| format!("--probe: unknown {value}"))?)
            }
            "--plant" => config.plant = Some(Plant::parse(&value).ok_or_else(|| format!("--plant: unknown {value}"))?),
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok((config, keep_going))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let (config, keep_going) = match parse() {
        Ok(parsed) => parsed,
        Err(message) => {
            eprintln!("fault-suite: {message}");
            return ExitCode::from(64);
        }
    };
    println!(
        "fault-suite: seed {} ({} schedules of {} s, histories in {}){}",
        config.seed,
        config.schedules,
        config.seconds,
        config.out.display(),
        config.plant.map_or_else(String::new, |p| format!(", planted bug {}", p.name()))
    );
    let cluster = match start_cluster() {
        Ok(cluster) => cluster,
        Err(error) => {
            eprintln!("fault-suite: start PostgreSQL: {error:#}");
            return ExitCode::from(69);
        }
    };
    let result = run(&cluster, &config, |dir| {
        let report = fencing_checker::check_schedule(dir).map_err(|e| anyhow::anyhow!("{e}"))?;
        let violations = report.violations.len();
        println!("{}: {} violations", dir.display(), violations);
        Ok(violations > 0 && !keep_going)
    })
    .await;
    if let Err(error) = result {
        eprintln!("fault-suite: {error:#}");
        return ExitCode::FAILURE;
    }
    match fencing_checker::check_run(&config.out) {
        Ok(report) => {
            println!("{}", report.render());
            if report.is_clean() { ExitCode::SUCCESS } else { ExitCode::FAILURE }
        }
        Err(error) => {
            eprintln!("fault-suite: check {}: {error}", config.out.display());
            ExitCode::from(2)
        }
    }
}
