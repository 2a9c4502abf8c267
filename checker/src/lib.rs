//! `fencing-checker`: reads a history recorded by the fault suite (format: `checker/HISTORY.md`)
//! and reports violations of the fencing invariants S1-S5 and S7, of exactly-once application, and of
//! recovery after the last fault.
//!
//! Like Jepsen's checkers, it shares no code with the product it checks: it depends on none of
//! the project's crates, so a bug in the product cannot hide a violation.

pub mod check;
pub mod history;
pub mod report;

use std::collections::BTreeMap;
use std::path::Path;

pub use check::CheckOptions;
pub use history::{History, InputError};
pub use report::{Invariant, RunReport, ScheduleReport, Violation};

/// Checks one schedule directory with the default options.
pub fn check_schedule(dir: &Path) -> Result<ScheduleReport, InputError> {
    check_schedule_with(dir, &CheckOptions::default())
}

/// Checks one schedule directory.
pub fn check_schedule_with(dir: &Path, opts: &CheckOptions) -> Result<ScheduleReport, InputError> {
    let history = History::load(dir)?;
    Ok(report_history(&history, &dir.display().to_string(), opts))
}

/// Checks an already loaded history; `dir` only names it in the report.
pub fn report_history(history: &History, dir: &str, opts: &CheckOptions) -> ScheduleReport {
    let mut faults = BTreeMap::new();
    for f in &history.faults {
        *faults.entry(f.kind.clone()).or_default() += 1;
    }
    let mut writes = report::WriteCounts::default();
    for c in &history.clients {
        writes.add(c.path, c.outcome);
    }
    ScheduleReport {
        schedule: history.meta.schedule,
        dir: dir.to_owned(),
        faults,
        writes,
        recovery_us: check::recovery(history).0,
        violations: check::check_history(history, opts),
    }
}

/// Checks every `schedule-*` directory of a run directory, in name order, with the default
/// options.
pub fn check_run(dir: &Path) -> Result<RunReport, InputError> {
    check_run_with(dir, &CheckOptions::default())
}

/// Checks every `schedule-*` directory of a run directory, in name order.
pub fn check_run_with(dir: &Path, opts: &CheckOptions) -> Result<RunReport, InputError> {
    let schedules =
        history::schedule_dirs(dir)?.iter().map(|d| check_schedule_with(d, opts)).collect::<Result<Vec<_>, _>>()?;
    Ok(RunReport { schedules })
}
