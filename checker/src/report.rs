//! What the checker found: violations, per-schedule and per-run reports, and the run table.
//!
//! All report types are serde-serializable so that a runner can print them as JSON.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};

use serde::{Deserialize, Serialize};

use crate::history::{Outcome, WritePath};

/// The invariant a violation breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Invariant {
    /// No two leadership periods of a key overlap.
    S1,
    /// Terms grow by exactly one per period.
    S2,
    /// Admitted terms per resource never decrease.
    S3,
    /// No write admitted after a newer grant of its lease committed.
    S4,
    /// No byte of a lower-term write after the first byte of a higher-term one.
    S5,
    /// A well-behaved holder acts only before its local deadline, which falls before the store's
    /// expiry of its period.
    S7,
    /// Every write is applied as often as its outcome says.
    #[serde(rename = "once")]
    Once,
    /// Writes succeed again after the last fault.
    #[serde(rename = "recovery")]
    Recovery,
    /// The fenced log holds exactly the admitted appends, without a gap, in terms that never
    /// decrease, none after a newer term was granted; every follower applies a prefix of it.
    #[serde(rename = "log")]
    Log,
}

impl Invariant {
    /// Every invariant, in report order.
    pub const ALL: [Invariant; 9] = [
        Invariant::S1,
        Invariant::S2,
        Invariant::S3,
        Invariant::S4,
        Invariant::S5,
        Invariant::S7,
        Invariant::Once,
        Invariant::Recovery,
        Invariant::Log,
    ];

    /// The short name used in reports.
    pub fn name(self) -> &'static str {
        match self {
            Invariant::S1 => "S1",
            Invariant::S2 => "S2",
            Invariant::S3 => "S3",
            Invariant::S4 => "S4",
            Invariant::S5 => "S5",
            Invariant::S7 => "S7",
            Invariant::Once => "once",
            Invariant::Recovery => "recovery",
            Invariant::Log => "log",
        }
    }
}

impl fmt::Display for Invariant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One broken rule, with the records involved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Violation {
    /// The invariant broken.
    pub invariant: Invariant,
    /// The schedule it was seen in.
    pub schedule: u64,
    /// The records involved, in words.
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} schedule {}: {}", self.invariant, self.schedule, self.detail)
    }
}

/// Writes counted by outcome.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutcomeCounts {
    /// Certainly applied.
    pub ok: u64,
    /// Certainly not applied.
    pub failed: u64,
    /// Maybe applied.
    pub indeterminate: u64,
}

impl OutcomeCounts {
    /// Counts one write.
    pub fn add(&mut self, outcome: Outcome) {
        match outcome {
            Outcome::Ok => self.ok += 1,
            Outcome::Failed => self.failed += 1,
            Outcome::Indeterminate => self.indeterminate += 1,
        }
    }

    fn merge(&mut self, other: OutcomeCounts) {
        self.ok += other.ok;
        self.failed += other.failed;
        self.indeterminate += other.indeterminate;
    }
}

impl fmt::Display for OutcomeCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ok {}, failed {}, indeterminate {}", self.ok, self.failed, self.indeterminate)
    }
}

/// Writes counted by outcome, in all and per path.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteCounts {
    /// All writes.
    pub total: OutcomeCounts,
    /// Through a gateway.
    pub gateway: OutcomeCounts,
    /// Through SQL.
    pub sql: OutcomeCounts,
}

impl WriteCounts {
    /// Counts one write.
    pub fn add(&mut self, path: WritePath, outcome: Outcome) {
        self.total.add(outcome);
        match path {
            WritePath::Gateway => self.gateway.add(outcome),
            WritePath::Sql => self.sql.add(outcome),
        }
    }

    fn merge(&mut self, other: &WriteCounts) {
        self.total.merge(other.total);
        self.gateway.merge(other.gateway);
        self.sql.merge(other.sql);
    }
}

/// What the checker found in one schedule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduleReport {
    /// The schedule's number (from `meta.json`).
    pub schedule: u64,
    /// The schedule directory.
    pub dir: String,
    /// Faults injected, by kind.
    pub faults: BTreeMap<String, u64>,
    /// Writes attempted.
    pub writes: WriteCounts,
    /// Delay from `quiet_from_us` to the first ok completion after it, if any.
    pub recovery_us: Option<i64>,
    /// Every violation found.
    pub violations: Vec<Violation>,
}

/// What the checker found in a run: one report per schedule, in directory name order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunReport {
    /// Per schedule.
    pub schedules: Vec<ScheduleReport>,
}

/// How many violation lines [`RunReport::render`] prints before summing up the rest.
pub const MAX_VIOLATION_LINES: usize = 50;

const LABEL_WIDTH: usize = 23;

impl RunReport {
    /// Every violation of every schedule, in schedule order.
    pub fn violations(&self) -> impl Iterator<Item = &Violation> {
        self.schedules.iter().flat_map(|s| s.violations.iter())
    }

    /// Whether no violation was found.
    pub fn is_clean(&self) -> bool {
        self.violations().next().is_none()
    }

    /// Violations counted per invariant (every invariant present, possibly at 0).
    pub fn violation_counts(&self) -> BTreeMap<Invariant, u64> {
        let mut counts: BTreeMap<Invariant, u64> = Invariant::ALL.iter().map(|i| (*i, 0)).collect();
        for v in self.violations() {
            *counts.entry(v.invariant).or_default() += 1;
        }
        counts
    }

    /// Faults counted per kind over all schedules.
    pub fn fault_counts(&self) -> BTreeMap<String, u64> {
        let mut counts = BTreeMap::new();
        for s in &self.schedules {
            for (kind, n) in &s.faults {
                *counts.entry(kind.clone()).or_default() += n;
            }
        }
        counts
    }

    /// Writes counted over all schedules.
    pub fn write_counts(&self) -> WriteCounts {
        let mut counts = WriteCounts::default();
        for s in &self.schedules {
            counts.merge(&s.writes);
        }
        counts
    }

    /// The longest recovery and its schedule (the first one on a tie).
    pub fn worst_recovery(&self) -> Option<(i64, u64)> {
        let mut worst: Option<(i64, u64)> = None;
        for s in &self.schedules {
            if let Some(r) = s.recovery_us
                && worst.is_none_or(|(w, _)| r > w)
            {
                worst = Some((r, s.schedule));
            }
        }
        worst
    }

    /// The run table, then at most [`MAX_VIOLATION_LINES`] violation lines.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let mut row = |label: &str, value: String| {
            let _ = writeln!(out, "{label:<LABEL_WIDTH$}{value}");
        };
        row("schedules", self.schedules.len().to_string());

        let mut faults: Vec<(String, u64)> = self.fault_counts().into_iter().collect();
        faults.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let faults = if faults.is_empty() {
            "none".to_owned()
        } else {
            faults.iter().map(|(k, n)| format!("{k} {n}")).collect::<Vec<_>>().join(", ")
        };
        row("faults", faults);

        let w = self.write_counts();
        row("writes", format!("{} (gateway: {}; sql: {})", w.total, w.gateway, w.sql));

        let violations = self.violation_counts().iter().map(|(i, n)| format!("{i} {n}")).collect::<Vec<_>>().join(", ");
        row("violations", violations);

        let worst = match self.worst_recovery() {
            Some((us, schedule)) => format!("{:.2} s (schedule {schedule})", us as f64 / 1e6),
            None => "none".to_owned(),
        };
        row("worst recovery", worst);

        let total = self.violations().count();
        for v in self.violations().take(MAX_VIOLATION_LINES) {
            let _ = writeln!(out, "{v}");
        }
        if total > MAX_VIOLATION_LINES {
            let _ = writeln!(out, "... and {} more", total - MAX_VIOLATION_LINES);
        }
        out
    }
}
