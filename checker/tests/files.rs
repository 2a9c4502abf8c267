//! Histories on disk: loading (strictly), checking a run directory, the run table, and the
//! `fencing-checker` binary's output and exit codes.
#![allow(clippy::unwrap_used)]

mod common;

use std::fs;
use std::path::Path;
use std::process::{Command, Output};

use common::*;
use fencing_checker::history::Fault;
use fencing_checker::{InputError, Invariant, RunReport, check_run, check_schedule};

fn run_bin(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fencing-checker")).args(args).output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).unwrap()
}

/// A run of two clean schedules (1 and 2, the second with two more faults and a slower recovery).
fn clean_run(test: &str) -> std::path::PathBuf {
    let run = temp_dir(test);
    write_schedule(&run.join("schedule-0001"), &base());
    let mut h = base();
    h.meta.schedule = 2;
    h.faults.push(Fault { kind: "pg-crash".into(), target: "postgres".into(), start_us: 3 * S, end_us: 4 * S });
    h.faults.push(Fault { kind: "pg-crash".into(), target: "postgres".into(), start_us: 5 * S, end_us: 6 * S });
    for c in h.clients.iter_mut().filter(|c| c.invoked_us > 10 * S) {
        c.completed_us = 12 * S + 410_000;
    }
    write_schedule(&run.join("schedule-0002"), &h);
    run
}

fn append(path: &Path, line: &str) {
    let mut text = fs::read_to_string(path).unwrap_or_default();
    text.push_str(line);
    text.push('\n');
    fs::write(path, text).unwrap();
}

#[track_caller]
fn assert_invalid(dir: &Path, file: &str, line: usize, reason: &str) {
    let err = check_schedule(dir).unwrap_err();
    let text = err.to_string();
    assert!(text.contains(&format!("{file}:{line}:")), "{text} does not name {file}:{line}");
    assert!(text.contains(reason), "{text} does not say {reason}");
}

#[test]
fn history_round_trips_through_files() {
    let dir = temp_dir("round-trip");
    write_schedule(&dir, &base());
    let loaded = fencing_checker::History::load(&dir).unwrap();
    let mut expected = base();
    // Upstream files are read in name order: applying before checking.
    expected.upstream.sort_by(|a, b| a.upstream.cmp(&b.upstream).then(a.seq.cmp(&b.seq)));
    assert_eq!(loaded, expected);
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_missing_history_file_is_an_error_not_an_empty_one() {
    // Its rules would pass with nothing to check: every file must be there, empty or not.
    for file in [
        "leases.jsonl",
        "table.jsonl",
        "clients.jsonl",
        "faults.jsonl",
        "elections.jsonl",
        "acts.jsonl",
        "lease_calls.jsonl",
        "clock.jsonl",
        "deadlines.jsonl",
        "appends.jsonl",
        "log.jsonl",
        "followers.jsonl",
    ] {
        let dir = temp_dir(&format!("missing-{file}"));
        write_schedule(&dir, &base());
        fs::remove_file(dir.join(file)).unwrap();
        let error = check_schedule(&dir).unwrap_err();
        assert!(error.to_string().contains(file), "{file}: {error}");
        fs::remove_dir_all(dir).unwrap();
    }
    let dir = temp_dir("missing-upstreams");
    write_schedule(&dir, &base());
    fs::remove_file(dir.join("upstream-applying.jsonl")).unwrap();
    fs::remove_file(dir.join("upstream-checking.jsonl")).unwrap();
    assert!(check_schedule(&dir).unwrap_err().to_string().contains("upstream"));
    // Empty files are a history with no records of that kind.
    for file in ["acts.jsonl", "lease_calls.jsonl", "faults.jsonl"] {
        fs::write(dir.join(file), "").unwrap();
    }
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn malformed_line_is_an_error_naming_file_and_line() {
    let dir = temp_dir("malformed");
    write_schedule(&dir, &base());
    append(&dir.join("clients.jsonl"), "{\"client\": \"leader-a\", ");
    assert_invalid(&dir, "clients.jsonl", 7, "EOF");
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn blank_line_is_an_error() {
    let dir = temp_dir("blank");
    write_schedule(&dir, &base());
    append(&dir.join("leases.jsonl"), "");
    assert_invalid(&dir, "leases.jsonl", 4, "EOF");
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn missing_field_and_unknown_outcome_are_errors() {
    let dir = temp_dir("fields");
    write_schedule(&dir, &base());
    append(&dir.join("table.jsonl"), r#"{"request_id": "c9", "resource": "acct-1", "term": 3}"#);
    assert_invalid(&dir, "table.jsonl", 3, "missing field `ticket`");

    write_schedule(&dir, &base());
    let text = fs::read_to_string(dir.join("clients.jsonl")).unwrap().replacen("\"ok\"", "\"maybe\"", 1);
    fs::write(dir.join("clients.jsonl"), text).unwrap();
    assert_invalid(&dir, "clients.jsonl", 1, "unknown variant `maybe`");
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn inconsistent_records_are_errors() {
    let dir = temp_dir("inconsistent");
    let mut h = base();
    h.upstream[1].upstream = "applying".into();
    write_schedule(&dir, &h);
    fs::rename(dir.join("upstream-applying.jsonl"), dir.join("upstream-other.jsonl")).unwrap();
    assert_invalid(&dir, "upstream-other.jsonl", 1, "upstream \"applying\" in the file of upstream \"other\"");
    fs::remove_dir_all(dir).unwrap();

    let dir = temp_dir("inconsistent-2");
    let mut h = base();
    h.upstream[0].complete_at_us = None;
    write_schedule(&dir, &h);
    assert_invalid(&dir, "upstream-applying.jsonl", 1, "complete request without complete_at_us");

    let mut h = base();
    h.clients.push(sql_write("c1", 1, 50 * S));
    write_schedule(&dir, &h);
    assert_invalid(&dir, "clients.jsonl", 7, "request_id \"c1\" recorded twice");

    let mut h = base();
    h.clients[0].upstream = None;
    write_schedule(&dir, &h);
    assert_invalid(&dir, "clients.jsonl", 1, "gateway write without an upstream");

    let mut h = base();
    h.clients[2].term = None;
    write_schedule(&dir, &h);
    assert_invalid(&dir, "clients.jsonl", 3, "ok Sql write without a term");
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn missing_meta_and_empty_run_are_errors() {
    let dir = temp_dir("no-meta");
    write_schedule(&dir, &base());
    fs::remove_file(dir.join("meta.json")).unwrap();
    assert!(matches!(check_schedule(&dir), Err(InputError::Io { path, .. }) if path.ends_with("meta.json")));
    assert!(matches!(check_run(&dir), Err(InputError::NoSchedules { .. })));
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn run_reads_schedule_directories_in_name_order() {
    let run = clean_run("order");
    fs::create_dir_all(run.join("not-a-schedule")).unwrap();
    let report = check_run(&run).unwrap();
    let numbers: Vec<u64> = report.schedules.iter().map(|s| s.schedule).collect();
    assert_eq!(numbers, vec![1, 2]);
    assert!(report.schedules[0].dir.ends_with("schedule-0001"));
    fs::remove_dir_all(run).unwrap();
}

#[test]
fn table_renders_counts_and_worst_recovery() {
    let run = clean_run("table");
    let report = check_run(&run).unwrap();
    let expected = "\
schedules              2
faults                 pg-crash 2, sigstop-gateway 2
writes                 ok 12, failed 0, indeterminate 0 (gateway: ok 8, failed 0, indeterminate 0; sql: ok 4, failed 0, indeterminate 0)
violations             S1 0, S2 0, S3 0, S4 0, S5 0, S7 0, once 0, recovery 0, log 0
worst recovery         2.41 s (schedule 2)
";
    assert_eq!(report.render(), expected);
    fs::remove_dir_all(run).unwrap();
}

#[test]
fn table_lists_at_most_fifty_violations() {
    let mut h = base();
    for i in 0..53 {
        h.table.push(row(&format!("ghost-{i:02}"), 2, 10 + i));
    }
    let report = RunReport { schedules: vec![fencing_checker::report_history(&h, "x", &Default::default())] };
    let text = report.render();
    assert!(text.contains("once 53,"), "{text}");
    assert!(text.contains("once schedule 1: unknown write ghost-49 applied at table\n"), "{text}");
    assert!(!text.contains("ghost-50"), "{text}");
    assert!(text.ends_with("... and 3 more\n"), "{text}");
    assert_eq!(text.lines().count(), 5 + 50 + 1);
}

#[test]
fn bin_exits_0_on_a_clean_run() {
    let run = clean_run("bin-clean");
    let out = run_bin(&[run.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).starts_with("schedules              2\n"), "{}", stdout(&out));
    assert!(
        stdout(&out).contains("violations             S1 0, S2 0, S3 0, S4 0, S5 0, S7 0, once 0, recovery 0, log 0\n")
    );
    fs::remove_dir_all(run).unwrap();
}

#[test]
fn bin_exits_1_and_prints_each_violation() {
    let run = clean_run("bin-violation");
    let mut h = base();
    h.meta.schedule = 3;
    h.upstream.retain(|r| r.request_id != "c1");
    write_schedule(&run.join("schedule-0003"), &h);
    let out = run_bin(&[run.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}{}", stdout(&out), stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("once 1, recovery 0, log 0\n"), "{text}");
    assert!(text.ends_with("once schedule 3: c1 (leader-a) ok but never applied at upstream applying\n"), "{text}");
    fs::remove_dir_all(run).unwrap();
}

#[test]
fn bin_exits_2_naming_the_malformed_file_and_line() {
    let run = clean_run("bin-malformed");
    append(&run.join("schedule-0002").join("faults.jsonl"), r#"{"kind": "pg-crash"}"#);
    let out = run_bin(&[run.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}{}", stdout(&out), stderr(&out));
    assert!(stderr(&out).contains("schedule-0002/faults.jsonl:4: missing field `target`"), "{}", stderr(&out));
    assert_eq!(stdout(&out), "");
    fs::remove_dir_all(run).unwrap();
}

#[test]
fn bin_exits_2_on_a_missing_run_dir_or_bad_flag() {
    let out = run_bin(&["/nonexistent/fencing-checker-run"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("/nonexistent/fencing-checker-run"), "{}", stderr(&out));
    let out = run_bin(&["/tmp", "--grant-margin-ms", "soon"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn bin_flags_set_grant_margin_and_byte_tolerance() {
    let run = temp_dir("bin-flags");
    let mut h = base();
    // An S4 case 60 ms after the grant (which no process was told of before 6.2 s), and an S5
    // case 5 us late.
    h.elections[1].at_us = 6 * S + 200_000;
    let mut c = gateway_write("c7", "applying", 1, 6 * S + 60_000);
    c.resource = "acct-2".into();
    h.clients.push(c);
    let mut r = req("applying", 3, "c7", Some(1), 6 * S + 70_000, Some(200));
    r.resource = "acct-2".into();
    h.upstream.push(r);
    let mut c = gateway_write("c8", "applying", 1, 5 * S);
    c.bound = false;
    h.clients.push(c);
    let mut r = req("applying", 4, "c8", Some(1), 5 * S, Some(200));
    r.chunks = vec![(11 * S + 5, 1)];
    r.complete_at_us = Some(11 * S + 5);
    h.upstream.push(r);
    write_schedule(&run.join("schedule-0001"), &h);
    let dir = run.to_str().unwrap();

    let out = run_bin(&[dir]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(stdout(&out).contains("S4 0, S5 1,"), "{}", stdout(&out));
    let out = run_bin(&[dir, "--grant-margin-ms", "50"]);
    assert!(stdout(&out).contains("S4 1, S5 1,"), "{}", stdout(&out));
    let out = run_bin(&[dir, "--byte-tolerance-us", "5"]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    fs::remove_dir_all(run).unwrap();
}

#[test]
fn bin_json_prints_the_run_report() {
    let run = clean_run("bin-json");
    let out = run_bin(&[run.to_str().unwrap(), "--json"]);
    assert_eq!(out.status.code(), Some(0));
    let report: RunReport = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report, check_run(&run).unwrap());
    fs::remove_dir_all(run).unwrap();
}

fn write_clock(dir: &Path, steps: &[(i64, i64, i64)]) {
    let mut text = String::new();
    for (before, at, offset) in steps {
        text.push_str(&format!("{{\"before_us\": {before}, \"at_us\": {at}, \"offset_us\": {offset}}}\n"));
    }
    fs::write(dir.join("clock.jsonl"), text).unwrap();
}

#[test]
fn store_times_become_real_times_across_steps_of_the_stores_clock() {
    // Forward by 100 s from 5 s to 5.5 s, back by 300 s from 7 s to 8 s (real time).
    let steps = [(5 * S - 1_000, 5 * S, 100 * S), (5 * S + 500_000, 5 * S + 500_000, 0), (7 * S, 7 * S, -300 * S)];
    let steps = [steps[0], steps[1], steps[2], (8 * S, 8 * S, 0)];
    let dir = temp_dir("clock-steps");
    let mut h = base();
    h.lease_calls.clear();
    h.leases = vec![
        // Granted before the steps; its expiry (store 5.2 s) was stepped over by the step made
        // between 4.999 s and 5 s: it ended at that step's instant, 4.999 s at the earliest.
        lease("k1", 1, "leader-a#1", 0, Some(5 * S + 200_000)),
        // Granted during the forward step, ended during the back step.
        lease("k1", 2, "leader-b#1", 105 * S + 250_000, Some(7 * S + 500_000 - 300 * S)),
        // Granted during the back step; by the store's clock long before term 2.
        lease("k1", 3, "leader-a#1", 7 * S + 600_000 - 300 * S, None),
    ];
    h.elections = vec![elected("k1", 1, "leader-a#1", 0), elected("k1", 2, "leader-b#1", 5 * S + 300_000)];
    write_schedule(&dir, &h);
    write_clock(&dir, &steps);
    let loaded = fencing_checker::History::load(&dir).unwrap();
    let periods: Vec<(i64, Option<i64>)> = loaded.leases.iter().map(|p| (p.granted_at_us, p.ended_at_us)).collect();
    assert_eq!(
        periods,
        vec![(0, Some(5 * S - 1_000)), (5 * S + 250_000, Some(7 * S + 500_000)), (7 * S + 600_000, None)],
    );
    // In store time term 3 overlaps term 1; in real time no two periods overlap.
    let report = check_schedule(&dir).unwrap();
    assert!(!report.violations.iter().any(|v| v.invariant == Invariant::S1), "{:?}", report.violations);

    // Periods that do not overlap on the store's clock but did in real time are S1 violations.
    h.leases[2] = lease("k1", 3, "leader-a#1", 7 * S + 400_000 - 300 * S, None);
    write_schedule(&dir, &h);
    write_clock(&dir, &steps);
    let report = check_schedule(&dir).unwrap();
    assert!(report.violations.iter().any(|v| v.invariant == Invariant::S1), "{:?}", report.violations);
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_store_time_two_clock_windows_could_have_read_is_an_error() {
    let dir = temp_dir("clock-ambiguous");
    let mut h = base();
    // Back by 2 s at 5 s: the store read 3.5 s at 3.5 s and again at 5.5 s.
    h.leases[0] = lease("k1", 1, "leader-a#1", 0, Some(2 * S));
    h.leases[1] = lease("k1", 2, "leader-b#1", 3 * S + 500_000, None);
    write_schedule(&dir, &h);
    write_clock(&dir, &[(5 * S, 5 * S, -2 * S), (6 * S, 6 * S, 0)]);
    assert_invalid(&dir, "leases.jsonl", 2, "two clock windows");
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn an_expiry_just_past_a_step_that_carried_the_clock_past_it_is_that_steps_instant() {
    // Back by 300 s from 7 s to 8 s. A lease renewed at 6.52 s on the stepped clock expires at
    // 8.02 s on it: the return at 8 s carried the clock past that, so term 1 ended at 8 s, before
    // term 2 was granted at 8.01 s (no slack around the step may place the end at 8.02 s).
    let dir = temp_dir("clock-expiry-past-step");
    let mut h = base();
    h.lease_calls.clear();
    h.leases = vec![
        lease("k1", 1, "leader-a#1", 0, Some(8 * S + 20_000 - 300 * S)),
        lease("k1", 2, "leader-b#1", 8 * S + 10_000, None),
    ];
    write_schedule(&dir, &h);
    write_clock(&dir, &[(7 * S, 7 * S, -300 * S), (8 * S, 8 * S, 0)]);
    let loaded = fencing_checker::History::load(&dir).unwrap();
    assert_eq!(loaded.leases[0].ended_at_us, Some(8 * S));
    let report = check_schedule(&dir).unwrap();
    assert!(!report.violations.iter().any(|v| v.invariant == Invariant::S1), "{:?}", report.violations);
    fs::remove_dir_all(dir).unwrap();
}

/// A lease that ended by expiry (a projection of the store's clock, not a reading).
fn expired(key: &str, term: i64, owner: &str, granted: i64, expires: i64) -> fencing_checker::history::LeasePeriod {
    let mut period = lease(key, term, owner, granted, Some(expires));
    period.end_reason = Some("expired".into());
    period
}

#[test]
fn an_expiry_a_forward_step_carried_the_clock_past_ends_at_the_earliest_instant_of_that_step() {
    // Forward by 49 s at an instant between 7.000 s and 7.010 s (real time). Term 1 expires at
    // 7.5 s on the store's clock, which the step carried it past; term 2 was granted at 7.005 s
    // (56.005 s on the stepped clock). The step may have come as early as 7.000 s, so term 1 may
    // have ended then: no certain overlap (a fault-suite run reported a 4.6 ms one, placing the
    // end at the window's 7.010 s).
    let dir = temp_dir("clock-expiry-earliest-step");
    let mut h = base();
    h.lease_calls.clear();
    h.leases = vec![
        expired("k1", 1, "leader-a#1", 5 * S, 7 * S + 500_000),
        lease("k1", 2, "leader-b#1", 7 * S + 5_000 + 49 * S, None),
    ];
    write_schedule(&dir, &h);
    write_clock(&dir, &[(7 * S, 7 * S + 10_000, 49 * S)]);
    let loaded = fencing_checker::History::load(&dir).unwrap();
    assert_eq!(loaded.leases[0].ended_at_us, Some(7 * S));
    assert_eq!(loaded.leases[1].granted_at_us, 7 * S + 5_000);
    let report = check_schedule(&dir).unwrap();
    assert!(!report.violations.iter().any(|v| v.invariant == Invariant::S1), "{:?}", report.violations);

    // Forward by 49 s at an instant between 7.000 s and 7.300 s; term 1 expires at 7.100 s on the
    // store's clock, within that window, and term 2 was granted at 7.050 s (56.050 s on the
    // stepped clock): the step came before 7.050 s and carried the clock past 7.100 s, so term 1
    // ended at the step, 7.000 s at the earliest (a soak reported a 52 ms overlap, taking 7.100 s
    // for a reading of the old offset).
    let mut h = base();
    h.lease_calls.clear();
    h.leases = vec![
        expired("k1", 1, "leader-a#1", 5 * S, 7 * S + 100_000),
        lease("k1", 2, "leader-b#1", 7 * S + 50_000 + 49 * S, None),
    ];
    write_schedule(&dir, &h);
    write_clock(&dir, &[(7 * S, 7 * S + 300_000, 49 * S)]);
    let loaded = fencing_checker::History::load(&dir).unwrap();
    assert_eq!(loaded.leases[0].ended_at_us, Some(7 * S));
    assert_eq!(loaded.leases[1].granted_at_us, 7 * S + 50_000);
    let report = check_schedule(&dir).unwrap();
    assert!(!report.violations.iter().any(|v| v.invariant == Invariant::S1), "{:?}", report.violations);

    // Back by 100 s at an instant between 7.000 s and 7.060 s; term 1 expires at 7.050 s on the
    // store's clock, and another owner is granted term 2 at 7.020 s (-92.980 s on the stepped
    // clock): a step back carries the clock past nothing, so term 1 still ran then, an overlap
    // the checker must report (a step forward in its place would have ended term 1).
    let mut h = base();
    h.lease_calls.clear();
    h.leases = vec![
        expired("k1", 1, "leader-a#1", 5 * S, 7 * S + 50_000),
        lease("k1", 2, "leader-b#1", 7 * S + 20_000 - 100 * S, None),
    ];
    write_schedule(&dir, &h);
    write_clock(&dir, &[(7 * S, 7 * S + 60_000, -100 * S), (9 * S, 9 * S, 0)]);
    let loaded = fencing_checker::History::load(&dir).unwrap();
    assert_eq!(loaded.leases[0].ended_at_us, Some(7 * S + 50_000));
    let report = check_schedule(&dir).unwrap();
    assert!(report.violations.iter().any(|v| v.invariant == Invariant::S1), "{:?}", report.violations);

    // Forward by 1 s in the same window. A grant read on the old offset at 7.004 s shows the step
    // came after it, so term 1 ran until after 7.004 s: that grant overlaps it, whatever another
    // key's expiry (a projection, not a reading: 8.001 s, which falls at 7.001 s on the new
    // offset) seems to say about the step.
    let mut h = base();
    h.lease_calls.clear();
    h.leases = vec![
        expired("k1", 1, "leader-a#1", 5 * S, 7 * S + 500_000),
        lease("k1", 2, "leader-b#1", 7 * S + 4_000, None),
        expired("k2", 1, "leader-c#1", 6 * S, 8 * S + 1_000),
        lease("k2", 2, "leader-d#1", 8 * S + 500_000, None),
    ];
    write_schedule(&dir, &h);
    write_clock(&dir, &[(7 * S, 7 * S + 10_000, S)]);
    let report = check_schedule(&dir).unwrap();
    assert!(
        report.violations.iter().any(|v| v.invariant == Invariant::S1 && v.detail.contains("key k1")),
        "{:?}",
        report.violations
    );
    fs::remove_dir_all(dir).unwrap();
}
