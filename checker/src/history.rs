//! The recorded history of one schedule, as described in `checker/HISTORY.md`, and its loading.
//!
//! Every file is parsed strictly: a line that is not valid JSON, lacks a field or has a field of the
//! wrong type is an [`InputError`] naming the file and the line, never skipped. Unknown extra
//! fields are tolerated so that the runner may record more than the checker reads.

use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Why a history could not be read.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// A file or directory could not be read.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// A line (or `meta.json`) is not the JSON the format describes.
    #[error("{}:{line}: {source}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// The line, counting from 1.
        line: usize,
        /// The underlying error.
        source: serde_json::Error,
    },
    /// A record is well-formed JSON but inconsistent with the format.
    #[error("{}:{line}: {reason}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The line, counting from 1.
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// A run directory holds no `schedule-*` folder.
    #[error("{}: no schedule-* directory", path.display())]
    NoSchedules {
        /// The run directory.
        path: PathBuf,
    },
}

/// `meta.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Meta {
    /// The schedule's number.
    pub schedule: u64,
    /// The seed of its faults.
    pub seed: u64,
    /// The lease ttl the leaders used.
    pub ttl_ms: u64,
    /// The gateways' forward timeout.
    pub forward_timeout_ms: u64,
    /// When traffic started.
    pub started_us: i64,
    /// When traffic stopped.
    pub ended_us: i64,
    /// The end of the last fault.
    pub quiet_from_us: i64,
    /// Processes whose clocks ran at another rate than real time (`"gateway-1"`), with the
    /// rate in thousandths; absent in histories recorded before it was read.
    #[serde(default, with = "rates")]
    pub clock_rates: BTreeMap<String, i64>,
}

/// `clock_rates` as the runner writes it (`{"gateway-1": 0.5}`), kept in thousandths so that
/// [`Meta`] stays `Eq`.
mod rates {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[allow(clippy::cast_possible_truncation)]
    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, i64>, D::Error> {
        let rates = Option::<BTreeMap<String, f64>>::deserialize(d)?.unwrap_or_default();
        Ok(rates.into_iter().map(|(process, rate)| (process, (rate * 1000.0).round() as i64)).collect())
    }

    #[allow(clippy::cast_precision_loss)]
    pub(super) fn serialize<S: Serializer>(rates: &BTreeMap<String, i64>, s: S) -> Result<S::Ok, S::Error> {
        let rates: BTreeMap<&String, f64> =
            rates.iter().map(|(process, rate)| (process, *rate as f64 / 1000.0)).collect();
        rates.serialize(s)
    }
}

/// One line of `leases.jsonl`: a leadership period.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeasePeriod {
    /// The lease key.
    pub key: String,
    /// The period's term.
    pub term: i64,
    /// Who held it.
    pub owner: String,
    /// When the term was granted.
    pub granted_at_us: i64,
    /// When the period ended; `None` while it may still run.
    pub ended_at_us: Option<i64>,
    /// Why it ended.
    pub end_reason: Option<String>,
}

/// One line of `upstream-<name>.jsonl`: one request whose head reached an upstream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpstreamRequest {
    /// The upstream's name (`checking`, `applying`).
    pub upstream: String,
    /// Arrival order within that upstream.
    pub seq: u64,
    /// The client's request id.
    pub request_id: String,
    /// The resource written.
    pub resource: String,
    /// The `Fencing-Token` the upstream received.
    pub token: Option<i64>,
    /// When the head arrived.
    pub head_at_us: i64,
    /// `[at_us, bytes]` per body piece.
    pub chunks: Vec<(i64, u64)>,
    /// Whether the whole body arrived.
    pub complete: bool,
    /// When the whole body arrived.
    pub complete_at_us: Option<i64>,
    /// What the upstream answered.
    pub status: Option<u16>,
}

/// The name of the upstream that refuses lower tokens with 409.
pub const CHECKING_UPSTREAM: &str = "checking";

impl UpstreamRequest {
    /// Whether this request was applied: complete, and for the checking upstream answered 2xx.
    pub fn applied(&self) -> bool {
        if !self.complete {
            return false;
        }
        if self.upstream == CHECKING_UPSTREAM { self.status.is_some_and(|s| (200..300).contains(&s)) } else { true }
    }

    /// The arrival time of the request's last byte (its head when it has no chunk).
    pub fn last_byte_us(&self) -> i64 {
        self.chunks.iter().map(|c| c.0).fold(self.head_at_us, i64::max)
    }
}

/// One line of `table.jsonl`: a row of the protected table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableRow {
    /// The client's request id.
    pub request_id: String,
    /// The resource written.
    pub resource: String,
    /// The term the guard admitted.
    pub term: i64,
    /// Commit order.
    pub ticket: i64,
}

/// How a write went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WritePath {
    /// Through a gateway to an upstream.
    Gateway,
    /// Into the protected table behind the SQL guard.
    Sql,
}

impl WritePath {
    /// The name used in the history.
    pub fn as_str(self) -> &'static str {
        match self {
            WritePath::Gateway => "gateway",
            WritePath::Sql => "sql",
        }
    }
}

/// How a write presented its term.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// `Fencing-Token`.
    Verify,
    /// `Fencing-Lease` + `Fencing-Owner`: the gateway stamps the term.
    Stamp,
    /// `SET LOCAL fencing.token`.
    Sql,
}

impl Mode {
    /// The name used in the history.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Verify => "verify",
            Mode::Stamp => "stamp",
            Mode::Sql => "sql",
        }
    }
}

impl Outcome {
    /// The name used in the history.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Failed => "failed",
            Outcome::Indeterminate => "indeterminate",
        }
    }
}

/// What the client saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Certainly applied.
    Ok,
    /// Certainly not applied.
    Failed,
    /// May or may not have been applied.
    Indeterminate,
}

/// One line of `clients.jsonl`: a write a leader process attempted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientWrite {
    /// The leader process.
    pub client: String,
    /// The owner identity it wrote as (a leader's elector's; none for the racer). Stamp mode
    /// presents it (`Fencing-Owner`).
    #[serde(default)]
    pub owner: Option<String>,
    /// The write's id, unique within a schedule.
    pub request_id: String,
    /// The lease key it wrote under.
    pub key: String,
    /// Gateway or SQL.
    pub path: WritePath,
    /// How it presented its term.
    pub mode: Mode,
    /// The gateway replica used.
    pub gateway: Option<u32>,
    /// The upstream addressed (gateway path).
    pub upstream: Option<String>,
    /// The resource written.
    pub resource: String,
    /// Whether the resource is bound to the lease key.
    pub bound: bool,
    /// The term presented (verify, sql).
    pub term: Option<i64>,
    /// When the client sent it.
    pub invoked_us: i64,
    /// When the client saw its outcome.
    pub completed_us: i64,
    /// What the client saw.
    pub outcome: Outcome,
    /// The HTTP status, if any.
    pub status: Option<u16>,
    /// Who refused it.
    pub refused_by: Option<String>,
    /// The error text, if any.
    pub error: Option<String>,
}

/// One line of `deadlines.jsonl`: a gateway's deadline for a write it forwarded, from its log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForwardDeadline {
    /// The gateway's number (`gateway-N` in `faults.jsonl`).
    pub gateway: u32,
    /// The client's request id.
    pub request_id: String,
    /// The term the write was admitted with.
    pub term: i64,
    /// The gateway's deadline for every byte of it, in real time.
    pub deadline_us: i64,
}

/// One line of `faults.jsonl`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fault {
    /// The kind of fault.
    pub kind: String,
    /// What it hit.
    pub target: String,
    /// When it started.
    pub start_us: i64,
    /// When it ended.
    pub end_us: i64,
}

/// One line of `elections.jsonl`: a period a leader process believed it led.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Election {
    /// The owner (the leader process's identity).
    pub owner: String,
    /// The lease key.
    pub key: String,
    /// The term it believed it led with.
    pub term: i64,
    /// `elected` or `lost`.
    pub event: String,
    /// When the process saw it.
    pub at_us: i64,
}

/// One line of `acts.jsonl`: a leader-only act of a leader process, with the belief it acted on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaderAct {
    /// The owner (the leader process's identity).
    pub owner: String,
    /// The lease key.
    pub key: String,
    /// The term it acted with.
    pub term: i64,
    /// Just before it asked its elector whether it leads (the check came at or after this).
    pub checked_us: i64,
    /// Just after the elector answered that it leads (the check came at or before this).
    pub acted_us: i64,
    /// The local deadline of the period it acted in, as the elector had it then, in real time.
    pub deadline_us: i64,
}

/// One line of `appends.jsonl`: one append to a stream of the fenced log by a leader process
/// (its last line: the end, or the invocation when the process died first).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Append {
    /// The leader process.
    pub client: String,
    /// Its owner identity for the key.
    pub owner: Option<String>,
    /// The append's id, also its entry's payload (`{"request_id"}`).
    pub request_id: String,
    /// The lease key the stream is bound to.
    pub key: String,
    /// The stream.
    pub stream: String,
    /// The term presented.
    pub term: i64,
    /// When it was sent.
    pub invoked_us: i64,
    /// When its answer came, or the process gave up.
    pub completed_us: i64,
    /// `ok` (committed, with `seq`), `failed` (refused before commit), `indeterminate`.
    pub outcome: Outcome,
    /// The sequence number the store gave it, when ok.
    pub seq: Option<i64>,
    /// The error, when not ok.
    pub error: Option<String>,
}

/// One line of `log.jsonl`: an entry of a stream, as the store has it at the end.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogEntry {
    /// The stream.
    pub stream: String,
    /// Its sequence number.
    pub seq: i64,
    /// The term it was appended with.
    pub term: i64,
    /// Its payload's `request_id` (null when it has none).
    pub request_id: Option<String>,
}

/// One line of `followers.jsonl`: an entry a follower process applied, in the order it applied
/// them (each follower's lines in its file's order).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applied {
    /// The follower's name (its durable cursor).
    pub follower: String,
    /// The process that applied it (a restarted follower is a new one).
    pub pid: u32,
    /// The stream.
    pub stream: String,
    /// The entry's sequence number, term and payload's `request_id`.
    pub seq: i64,
    /// The entry's term.
    pub term: i64,
    /// The entry's `request_id`.
    pub request_id: Option<String>,
    /// When it was applied.
    pub at_us: i64,
}

/// One line of `lease_calls.jsonl`: one call of a client of the HTTP lease API, and its answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseCall {
    /// The client process.
    pub client: String,
    /// The owner identity it called with.
    pub owner: String,
    /// The lease key.
    pub key: String,
    /// `acquire`, `renew` or `release`.
    pub op: String,
    /// The term the client believed it held when it called (from its last ok acquire).
    pub believed_term: Option<i64>,
    /// When the call was sent.
    pub sent_us: i64,
    /// When its answer arrived, or the client gave up.
    pub received_us: i64,
    /// The HTTP status; none when no answer came.
    pub status: Option<u16>,
    /// The term the answer named.
    pub term: Option<i64>,
    /// The lease's remaining time the answer gave, in milliseconds.
    pub remaining_ms: Option<i64>,
}

/// One line of `clock.jsonl`: the store's wall clock was set to read real time plus `offset_us`
/// at some instant between `before_us` and `at_us` (real time).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClockStep {
    /// Real time just before the step was made.
    pub before_us: i64,
    /// Real time just after.
    pub at_us: i64,
    /// What the store's clock reads ahead of real time from then on (negative: behind).
    pub offset_us: i64,
}

/// How long before the schedule's start and after its end the store may write lease history
/// (leaders start before traffic does, release as they are stopped, and the history is read
/// after that): the clock windows of `clock.jsonl` are taken to span no further.
const AROUND_SCHEDULE_US: i64 = 30_000_000;

/// The store's clock over a schedule: the offsets in force, from `clock.jsonl`, with offset 0
/// before the first step.
struct StoreClockLog {
    /// `(before_us, at_us, offset_us)`, the first with offset 0 from before the schedule.
    windows: Vec<(i64, i64, i64)>,
    /// Real time after which the store read nothing that was recorded.
    end_us: i64,
}

impl StoreClockLog {
    fn new(steps: &[ClockStep], meta: &Meta) -> StoreClockLog {
        let start = meta.started_us.saturating_sub(AROUND_SCHEDULE_US);
        let mut windows = vec![(start, start, 0)];
        windows.extend(steps.iter().map(|s| (s.before_us, s.at_us, s.offset_us)));
        StoreClockLog { windows, end_us: meta.ended_us.saturating_add(AROUND_SCHEDULE_US) }
    }

    /// The real time at which the store's clock read `store_us`: the one window whose real span
    /// holds `store_us` less its offset; for a time the clock stepped over, the first step that
    /// carried it past. Err when two windows could have read it (steps whose store spans
    /// overlap: the runner must not make them) or none did.
    ///
    /// Each reading of the store's clock reads the offset in force (libfaketime without a cache),
    /// and the offset changes at one instant between a step's `before_us` and `at_us`: so a
    /// window's readings lie between its step's `before_us` and the next step's `at_us`, with no
    /// slack (slack would place an expiry the next step carried the clock past after that step).
    fn real(&self, store_us: i64) -> Result<Reading, String> {
        let w = &self.windows;
        let mut found = None;
        for (i, &(before, _, offset)) in w.iter().enumerate() {
            let until = w.get(i + 1).map_or(self.end_us, |next| next.1);
            let real = store_us.saturating_sub(offset);
            if real >= before && real < until {
                if found.is_some() {
                    return Err(format!("store time {store_us} could have been read in two clock windows"));
                }
                found = Some(Reading::Read { real, window: i });
            }
        }
        if let Some(found) = found {
            return Ok(found);
        }
        // Stepped over: the first step after which the clock reads past it, having read before it.
        for (i, pair) in w.windows(2).enumerate() {
            let ((_, _, offset), (before, at, next_offset)) = (pair[0], pair[1]);
            if before.saturating_add(offset) <= store_us && store_us < at.saturating_add(next_offset) {
                return Ok(Reading::SteppedOver { window: i + 1 });
            }
        }
        Err(format!("store time {store_us} was never read by the store's clock as `clock.jsonl` has it"))
    }
}

/// Where a store time falls in real time.
#[derive(Debug, Clone, Copy)]
enum Reading {
    /// The clock read it at `real`, in window `window`.
    Read { real: i64, window: usize },
    /// A step carried the clock past it: it passed at that step's instant; the step opened window
    /// `window`.
    SteppedOver { window: usize },
}

/// Turns lease times (the store's) into real time, each at the earliest instant the records
/// allow, so that S1 reports only overlaps that certainly happened.
///
/// A grant, a release, an abandonment or a forced release is a reading of the store's clock, at
/// its real time. An expiry is not: it is a renewal's reading plus the ttl, computed ahead. It
/// happened when the clock first read past it: at its real time in its window, but not before
/// the step that opened that window; or, when a step carried the clock past it, at that step's
/// instant. A step's instant is known only to lie between its `before_us` and `at_us`, and after
/// every reading recorded in the window before it: so the earliest it can have been is the later
/// of its `before_us` and just after the last such reading (a lease granted at 7.004 s on the old
/// offset shows that a step made between 7.000 s and 7.010 s came after 7.004 s).
fn leases_in_real_time(periods: &mut [(usize, LeasePeriod)], clock: &StoreClockLog) -> Result<(), (usize, String)> {
    let mut readings = Vec::new();
    for (line, period) in periods.iter() {
        let granted = clock.real(period.granted_at_us).map_err(|reason| (*line, reason))?;
        let ended = period.ended_at_us.map(|t| clock.real(t)).transpose().map_err(|reason| (*line, reason))?;
        let projected = period.end_reason.as_deref().is_none_or(|reason| reason == "expired");
        readings.push((granted, ended, projected));
    }
    // The first and last reading of each window (expiries are projections, not readings).
    let mut first: BTreeMap<usize, i64> = BTreeMap::new();
    let mut last: BTreeMap<usize, i64> = BTreeMap::new();
    let genuine = readings
        .iter()
        .flat_map(|(granted, ended, projected)| std::iter::once(*granted).chain(ended.filter(|_| !projected)));
    for reading in genuine {
        if let Reading::Read { real, window } = reading {
            let latest = last.entry(window).or_insert(real);
            *latest = (*latest).max(real);
            let earliest = first.entry(window).or_insert(real);
            *earliest = (*earliest).min(real);
        }
    }
    // The earliest instant of the step that opened `window`.
    let step_earliest = |window: usize| {
        let before = clock.windows.get(window).map_or(i64::MIN, |w| w.0);
        let after_last = window.checked_sub(1).and_then(|previous| last.get(&previous)).map_or(i64::MIN, |t| t + 1);
        before.max(after_last)
    };
    let real = |reading: Reading, projected: bool| match reading {
        // The next window read the clock at or before this instant: its step came first, and
        // when it stepped the clock forward it carried the clock past this projection (a store
        // time below `at_us` of that step, so taken for a reading of the old window). A step
        // back carries the clock past nothing: the projection then stands where it is.
        Reading::Read { real, window } if projected => {
            let forward = match (clock.windows.get(window), clock.windows.get(window + 1)) {
                (Some(this), Some(next)) => next.2 > this.2,
                _ => false,
            };
            match first.get(&(window + 1)) {
                Some(&read) if forward && read <= real => step_earliest(window + 1),
                _ => real.max(step_earliest(window)),
            }
        }
        Reading::Read { real, .. } => real,
        Reading::SteppedOver { window } => step_earliest(window),
    };
    for ((_, period), (granted, ended, projected)) in periods.iter_mut().zip(readings) {
        period.granted_at_us = real(granted, false);
        period.ended_at_us = ended.map(|ended| real(ended, projected));
    }
    Ok(())
}

/// Everything recorded for one schedule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct History {
    /// `meta.json`.
    pub meta: Meta,
    /// `leases.jsonl`.
    pub leases: Vec<LeasePeriod>,
    /// All `upstream-*.jsonl` files, file by file in name order, each in line order.
    pub upstream: Vec<UpstreamRequest>,
    /// `table.jsonl`.
    pub table: Vec<TableRow>,
    /// `clients.jsonl`.
    pub clients: Vec<ClientWrite>,
    /// `faults.jsonl`.
    pub faults: Vec<Fault>,
    /// `elections.jsonl`.
    #[serde(default)]
    pub elections: Vec<Election>,
    /// `acts.jsonl`.
    #[serde(default)]
    pub acts: Vec<LeaderAct>,
    /// `lease_calls.jsonl`.
    #[serde(default)]
    pub lease_calls: Vec<LeaseCall>,
    /// `clock.jsonl`: the steps of the store's clock.
    #[serde(default)]
    pub clock_steps: Vec<ClockStep>,
    /// `deadlines.jsonl`.
    #[serde(default)]
    pub deadlines: Vec<ForwardDeadline>,
    /// `appends.jsonl`.
    #[serde(default)]
    pub appends: Vec<Append>,
    /// `log.jsonl`.
    #[serde(default)]
    pub log: Vec<LogEntry>,
    /// `followers.jsonl`.
    #[serde(default)]
    pub applied: Vec<Applied>,
}

fn io_error(path: &Path, source: io::Error) -> InputError {
    InputError::Io { path: path.to_path_buf(), source }
}

/// Reads a JSON-lines file. A missing file is an error: the runner writes every file, empty
/// when it has no records of that kind, so a missing one is a history that cannot be checked
/// (its rules would pass with nothing to check). Blank lines are refused like any other
/// malformed line.
fn read_lines<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Vec<(usize, T)>, InputError> {
    let text = fs::read_to_string(path).map_err(|e| io_error(path, e))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let record = serde_json::from_str(line).map_err(|source| InputError::Parse {
            path: path.to_path_buf(),
            line: i + 1,
            source,
        })?;
        out.push((i + 1, record));
    }
    Ok(out)
}

fn invalid(path: &Path, line: usize, reason: String) -> InputError {
    InputError::Invalid { path: path.to_path_buf(), line, reason }
}

impl History {
    /// Reads the history recorded in one schedule directory.
    pub fn load(dir: &Path) -> Result<History, InputError> {
        let meta_path = dir.join("meta.json");
        let meta_text = fs::read_to_string(&meta_path).map_err(|e| io_error(&meta_path, e))?;
        let meta: Meta = serde_json::from_str(&meta_text).map_err(|source| InputError::Parse {
            path: meta_path.clone(),
            line: source.line(),
            source,
        })?;

        // Lease times are the store's: with steps of its clock recorded, they become real time.
        let clock_path = dir.join("clock.jsonl");
        let steps: Vec<ClockStep> = read_lines::<ClockStep>(&clock_path)?.into_iter().map(|(_, r)| r).collect();
        let store_clock = StoreClockLog::new(&steps, &meta);
        let leases_path = dir.join("leases.jsonl");
        let mut periods = read_lines::<LeasePeriod>(&leases_path)?;
        if !steps.is_empty() {
            leases_in_real_time(&mut periods, &store_clock)
                .map_err(|(line, reason)| invalid(&leases_path, line, reason))?;
        }
        let leases: Vec<LeasePeriod> = periods.into_iter().map(|(_, period)| period).collect();

        let mut upstream = Vec::new();
        let upstream_paths = upstream_files(dir)?;
        if upstream_paths.is_empty() {
            return Err(InputError::Io {
                path: dir.join("upstream-*.jsonl"),
                source: io::Error::new(io::ErrorKind::NotFound, "no upstream file"),
            });
        }
        for path in upstream_paths {
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_prefix("upstream-"))
                .and_then(|n| n.strip_suffix(".jsonl"))
                .unwrap_or_default()
                .to_owned();
            for (line, r) in read_lines::<UpstreamRequest>(&path)? {
                if r.upstream != name {
                    return Err(invalid(
                        &path,
                        line,
                        format!("upstream {:?} in the file of upstream {name:?}", r.upstream),
                    ));
                }
                if r.complete && r.complete_at_us.is_none() {
                    return Err(invalid(&path, line, "complete request without complete_at_us".to_owned()));
                }
                upstream.push(r);
            }
        }

        let table = read_lines::<TableRow>(&dir.join("table.jsonl"))?.into_iter().map(|(_, r)| r).collect();
        let elections = read_lines::<Election>(&dir.join("elections.jsonl"))?.into_iter().map(|(_, r)| r).collect();

        let clients_path = dir.join("clients.jsonl");
        let mut clients = Vec::new();
        let mut ids = HashSet::new();
        for (line, c) in read_lines::<ClientWrite>(&clients_path)? {
            if !ids.insert(c.request_id.clone()) {
                return Err(invalid(&clients_path, line, format!("request_id {:?} recorded twice", c.request_id)));
            }
            if c.path == WritePath::Gateway && c.upstream.is_none() {
                return Err(invalid(&clients_path, line, "gateway write without an upstream".to_owned()));
            }
            if c.outcome == Outcome::Ok && c.mode != Mode::Stamp && c.term.is_none() {
                return Err(invalid(&clients_path, line, format!("ok {:?} write without a term", c.mode)));
            }
            clients.push(c);
        }

        let faults = read_lines::<Fault>(&dir.join("faults.jsonl"))?.into_iter().map(|(_, r)| r).collect();
        let acts_path = dir.join("acts.jsonl");
        let mut acts = Vec::new();
        for (line, act) in read_lines::<LeaderAct>(&acts_path)? {
            if act.acted_us < act.checked_us {
                return Err(invalid(&acts_path, line, "acted_us before checked_us".to_owned()));
            }
            acts.push(act);
        }
        let calls_path = dir.join("lease_calls.jsonl");
        let mut lease_calls = Vec::new();
        for (line, call) in read_lines::<LeaseCall>(&calls_path)? {
            if !matches!(call.op.as_str(), "acquire" | "renew" | "release") {
                return Err(invalid(&calls_path, line, format!("unknown op {:?}", call.op)));
            }
            if call.received_us < call.sent_us {
                return Err(invalid(&calls_path, line, "received_us before sent_us".to_owned()));
            }
            lease_calls.push(call);
        }
        let deadlines =
            read_lines::<ForwardDeadline>(&dir.join("deadlines.jsonl"))?.into_iter().map(|(_, r)| r).collect();
        let appends_path = dir.join("appends.jsonl");
        let mut appends = Vec::new();
        let mut append_ids = HashSet::new();
        for (line, append) in read_lines::<Append>(&appends_path)? {
            if !append_ids.insert(append.request_id.clone()) {
                return Err(invalid(&appends_path, line, format!("request_id {:?} recorded twice", append.request_id)));
            }
            if append.outcome == Outcome::Ok && append.seq.is_none() {
                return Err(invalid(&appends_path, line, "ok append without a seq".to_owned()));
            }
            appends.push(append);
        }
        let log = read_lines::<LogEntry>(&dir.join("log.jsonl"))?.into_iter().map(|(_, r)| r).collect();
        let applied = read_lines::<Applied>(&dir.join("followers.jsonl"))?.into_iter().map(|(_, r)| r).collect();
        Ok(History {
            meta,
            leases,
            upstream,
            table,
            clients,
            faults,
            elections,
            acts,
            lease_calls,
            clock_steps: steps,
            deadlines,
            appends,
            log,
            applied,
        })
    }
}

/// The `upstream-*.jsonl` files of a schedule directory, in name order.
fn upstream_files(dir: &Path) -> Result<Vec<PathBuf>, InputError> {
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).map_err(|e| io_error(dir, e))? {
        let entry = entry.map_err(|e| io_error(dir, e))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.starts_with("upstream-") && name.ends_with(".jsonl") {
            files.push(entry.path());
        }
    }
    files.sort();
    Ok(files)
}

/// The `schedule-*` directories of a run directory, in name order.
pub fn schedule_dirs(run: &Path) -> Result<Vec<PathBuf>, InputError> {
    let mut dirs = Vec::new();
    for entry in fs::read_dir(run).map_err(|e| io_error(run, e))? {
        let entry = entry.map_err(|e| io_error(run, e))?;
        let is_dir = entry.file_type().map_err(|e| io_error(&entry.path(), e))?.is_dir();
        if is_dir && entry.file_name().to_str().is_some_and(|n| n.starts_with("schedule-")) {
            dirs.push(entry.path());
        }
    }
    if dirs.is_empty() {
        return Err(InputError::NoSchedules { path: run.to_path_buf() });
    }
    dirs.sort();
    Ok(dirs)
}
