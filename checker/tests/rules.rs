//! Each rule on synthetic in-memory histories: a clean one passes, and each single defect is
//! reported exactly once, under the right invariant.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use fencing_checker::check::{CheckOptions, check_history, recovery};
use fencing_checker::history::{History, Mode, Outcome, WritePath};
use fencing_checker::{Invariant, Violation};

fn check(h: &History) -> Vec<Violation> {
    check_history(h, &CheckOptions::default())
}

/// Asserts exactly one violation, of `invariant`, whose text names every one of `names`.
#[track_caller]
fn assert_one(violations: &[Violation], invariant: Invariant, names: &[&str]) {
    assert_eq!(violations.len(), 1, "expected one {invariant} violation, got {violations:#?}");
    let v = &violations[0];
    assert_eq!(v.invariant, invariant, "{v}");
    assert_eq!(v.schedule, 1);
    for name in names {
        assert!(v.detail.contains(name), "{v} does not name {name}");
    }
}

/// Removes the fenced log's records (for a defect of the leases that the log would show too).
fn clear_log(h: &mut History) {
    h.appends.clear();
    h.log.clear();
    h.applied.clear();
}

#[test]
fn base_history_is_clean() {
    let h = base();
    assert_eq!(check(&h), vec![]);
    // The later of the two paths: the SQL write c6 completes 1.25 s after the fault.
    assert_eq!(recovery(&h).0, Some(1_250_000));
}

// S1

#[test]
fn s1_overlapping_closed_periods_are_reported() {
    let mut h = base();
    h.leases[1].ended_at_us = Some(80 * S);
    h.leases.push(lease("k1", 3, "leader-c#1", 70 * S, Some(90 * S)));
    assert_one(&check(&h), Invariant::S1, &["term 2", "term 3", "leader-c#1"]);
}

#[test]
fn s1_open_period_overlapped_by_later_grant_is_reported() {
    let mut h = base();
    h.leases[1].ended_at_us = None;
    h.leases.push(lease("k1", 3, "leader-c#1", 70 * S, None));
    assert_one(&check(&h), Invariant::S1, &["term 2", "term 3", "open"]);
}

#[test]
fn s1_period_ending_before_its_grant_is_reported() {
    let mut h = base();
    h.leases[0].ended_at_us = Some(-1);
    // (The leader's acts and appends after that "end" would be S7's and the log's too.)
    h.acts.clear();
    clear_log(&mut h);
    assert_one(&check(&h), Invariant::S1, &["term 1", "ends at -1 before its grant at 0"]);
}

#[test]
fn s1_touching_periods_and_other_keys_do_not_overlap() {
    let mut h = base();
    // (Grants after the last write, so that S4 has nothing to say.)
    h.leases[1].ended_at_us = Some(80 * S);
    h.leases.push(lease("k1", 3, "leader-c#1", 80 * S, None));
    h.leases.push(lease("k2", 1, "leader-c#1", 70 * S, None));
    assert_eq!(check(&h), vec![]);
}

// S2

#[test]
fn s2_skipped_term_is_reported() {
    let mut h = base();
    h.leases[1].ended_at_us = Some(80 * S);
    h.leases.push(lease("k1", 4, "leader-c#1", 90 * S, None));
    assert_one(&check(&h), Invariant::S2, &["term 4", "term 2", "expected term 3"]);
}

#[test]
fn s2_term_granted_twice_is_reported() {
    let mut h = base();
    h.leases[1].ended_at_us = Some(8 * S);
    h.leases.push(lease("k1", 2, "leader-c#1", 9 * S, None));
    // (leader-b#1's acts and appends in a period the history also gives to leader-c#1 would be
    // S7's and the log's too.)
    h.acts.clear();
    clear_log(&mut h);
    assert_one(&check(&h), Invariant::S2, &["term 2", "appears twice", "leader-c#1"]);
}

#[test]
fn s2_consecutive_terms_per_key_are_clean() {
    let mut h = base();
    h.leases[1].ended_at_us = Some(80 * S);
    h.leases.push(lease("k1", 3, "leader-c#1", 90 * S, None));
    h.leases.push(lease("k2", 7, "leader-c#1", 9 * S, Some(10 * S)));
    h.leases.push(lease("k2", 8, "leader-a#2", 11 * S, None));
    assert_eq!(check(&h), vec![]);
}

// S3

#[test]
fn s3_table_term_decreasing_in_ticket_order_is_reported() {
    let mut h = base();
    h.clients.push(sql_write("c7", 1, 12 * S));
    h.table.push(row("c7", 1, 3));
    let v = check(&h);
    // The write is also an S4 violation (term 1 written long after term 2's grant): keep S3.
    let s3: Vec<_> = v.iter().filter(|v| v.invariant == Invariant::S3).cloned().collect();
    assert_one(&s3, Invariant::S3, &["table", "c7", "ticket 3", "c6", "ticket 2"]);
}

#[test]
fn s3_table_in_ticket_order_not_file_order_is_clean() {
    let mut h = base();
    h.table.reverse();
    h.table.push(row("c7", 2, 3));
    h.clients.push(sql_write("c7", 2, 12 * S));
    assert_eq!(check(&h), vec![]);
}

#[test]
fn s3_applying_upstream_token_decreasing_is_reported() {
    let mut h = base();
    // An unbound resource, invoked before the grant of term 2: only S3 (and S5) can see it.
    let mut c = gateway_write("c7", "applying", 1, 5 * S);
    c.bound = false;
    h.clients.push(c);
    let mut r = req("applying", 3, "c7", Some(1), 5 * S, Some(200));
    r.complete_at_us = Some(12 * S);
    r.chunks = vec![];
    h.upstream.push(r);
    assert_one(&check(&h), Invariant::S3, &["upstream applying", "c7", "token 1", "c4", "token 2"]);
}

#[test]
fn s3_checking_upstream_refusing_a_lower_token_is_reported() {
    let mut h = base();
    h.clients.push(failed(gateway_write("c7", "checking", 1, 11 * S + 150_000), "upstream", Some(409)));
    let mut r = req("checking", 3, "c7", Some(1), 11 * S + 100_000, Some(409));
    r.chunks = vec![];
    r.complete_at_us = Some(11 * S + 120_000);
    h.upstream.push(r);
    assert_one(&check(&h), Invariant::S3, &["refused (409)", "c7", "token 1", "c5", "token 2"]);
}

#[test]
fn s3_equal_tokens_and_null_tokens_are_clean() {
    let mut h = base();
    h.clients.push(gateway_write("c7", "applying", 2, 12 * S));
    h.upstream.push(req("applying", 3, "c7", Some(2), 12 * S, Some(200)));
    let mut c = gateway_write("c8", "applying", 1, 13 * S);
    c.bound = false;
    c.mode = Mode::Stamp;
    c.term = None;
    h.clients.push(c);
    h.upstream.push(req("applying", 4, "c8", None, 13 * S, Some(200)));
    assert_eq!(check(&h), vec![]);
}

// S4

#[test]
fn s4_write_with_old_term_invoked_after_newer_grant_is_reported() {
    let mut h = base();
    // Term 2 granted at 6 s; a term-1 write invoked at 6.2 s, 200 ms later, on another resource.
    let mut c = gateway_write("c7", "applying", 1, 6 * S + 200_000);
    c.resource = "acct-2".into();
    h.clients.push(c);
    let mut r = req("applying", 3, "c7", Some(1), 6 * S + 210_000, Some(200));
    r.resource = "acct-2".into();
    h.upstream.push(r);
    assert_one(&check(&h), Invariant::S4, &["c7", "term 1", "term 2", "leader-b#1"]);
}

#[test]
fn s4_stamp_mode_uses_the_token_the_upstream_received() {
    let mut h = base();
    let mut c = gateway_write("c7", "applying", 1, 6 * S + 200_000);
    c.resource = "acct-2".into();
    c.mode = Mode::Stamp;
    c.term = None;
    h.clients.push(c);
    let mut r = req("applying", 3, "c7", Some(1), 6 * S + 210_000, Some(200));
    r.resource = "acct-2".into();
    h.upstream.push(r);
    assert_one(&check(&h), Invariant::S4, &["c7", "term 1", "term 2"]);

    // Stamped with term 2 for its holder, the same write is clean, whatever term the client
    // record names.
    h.upstream.last_mut().unwrap().token = Some(2);
    h.clients.last_mut().unwrap().owner = Some("leader-b#1".into());
    assert_eq!(check(&h), vec![]);
    h.clients.last_mut().unwrap().term = Some(1);
    assert_eq!(check(&h), vec![]);
}

#[test]
fn s4_write_within_the_grant_margin_or_unbound_is_clean() {
    let mut h = base();
    // No process was told of term 2 before 6.2 s.
    h.elections[1].at_us = 6 * S + 200_000;
    let mut c = gateway_write("c7", "applying", 1, 6 * S + 90_000);
    c.resource = "acct-2".into();
    h.clients.push(c);
    let mut c = sql_write("c8", 1, 7 * S);
    c.bound = false;
    c.resource = "acct-3".into();
    h.clients.push(c);
    let mut r = req("applying", 3, "c7", Some(1), 6 * S + 100_000, Some(200));
    r.resource = "acct-2".into();
    h.upstream.push(r);
    let mut t = row("c8", 1, 3);
    t.resource = "acct-3".into();
    h.table.push(t);
    assert_eq!(check(&h), vec![]);

    // A margin of 50 ms makes the first one a violation.
    let opts = CheckOptions { grant_margin_us: 50_000, ..CheckOptions::default() };
    assert_one(&check_history(&h, &opts), Invariant::S4, &["c7"]);
}

#[test]
fn s4_ignores_failed_writes() {
    let mut h = base();
    let mut c = failed(gateway_write("c7", "applying", 1, 7 * S), "gateway", Some(409));
    c.resource = "acct-2".into();
    h.clients.push(c);
    assert_eq!(check(&h), vec![]);
}

/// The racer's pair on an unbound resource: an SQL raise to term 8 answered ok at 20.05 s, and
/// a gateway write of term 7, invoked at `invoked`, answered ok.
fn racer_pair(invoked: i64) -> History {
    let mut h = base();
    let mut raise = sql_write("r1", 8, 20 * S);
    (raise.client, raise.key, raise.bound, raise.resource) = ("racer".into(), String::new(), false, "race-3".into());
    let mut lower = gateway_write("r2", "checking", 7, invoked);
    (lower.client, lower.key, lower.bound, lower.resource) = ("racer".into(), String::new(), false, "race-3".into());
    h.clients.extend([raise, lower]);
    let mut t = row("r1", 8, 3);
    t.resource = "race-3".into();
    h.table.push(t);
    let mut r = req("checking", 3, "r2", Some(7), invoked + 10_000, Some(200));
    r.resource = "race-3".into();
    h.upstream.push(r);
    h
}

#[test]
fn s3_a_lower_term_admitted_after_a_higher_one_was_answered_is_reported_across_paths() {
    // Invoked 10 ms after the raise was answered: admitted after it (a grant used too long,
    // or a raise that did not wait for the grants on term 7).
    assert_one(&check(&racer_pair(20 * S + 60_000)), Invariant::S3, &["race-3", "r2", "r1", "term 7", "term 8"]);
}

#[test]
fn s3_a_lower_term_invoked_before_the_higher_one_was_answered_is_clean() {
    // Invoked while the raise was still out: either order of admission is allowed.
    assert_eq!(check(&racer_pair(20 * S + 40_000)), vec![]);
    // Failed writes and bound resources are not this rule's.
    let mut h = racer_pair(20 * S + 60_000);
    h.clients[7].outcome = Outcome::Failed;
    h.clients[7].refused_by = Some("gateway".into());
    h.upstream.pop();
    assert_eq!(check(&h), vec![]);
}

// S5

#[test]
fn s5_lower_token_chunk_after_higher_head_is_reported() {
    let mut h = base();
    // c7 (token 1) starts before c4 (token 2, head at 11 s) and its last chunk arrives after it,
    // but it completes before c4 completes, so tokens in completion order do not decrease.
    let mut c = gateway_write("c7", "applying", 1, 5 * S);
    c.bound = false;
    h.clients.push(c);
    let mut r = req("applying", 3, "c7", Some(1), 5 * S, Some(200));
    r.chunks = vec![(5 * S, 10), (11 * S + 1, 10)];
    r.complete_at_us = Some(11 * S + 1);
    h.upstream.push(r);
    assert_one(&check(&h), Invariant::S5, &["upstream applying", "c7", "token 1", "c4", "token 2", "1 us after"]);

    // A tolerance of 1 us accepts it.
    let opts = CheckOptions { byte_tolerance_us: 1, ..CheckOptions::default() };
    assert_eq!(check_history(&h, &opts), vec![]);
}

#[test]
fn s5_counts_bytes_of_incomplete_requests() {
    let mut h = base();
    let mut c = gateway_write("c7", "applying", 1, 5 * S);
    c.outcome = Outcome::Indeterminate;
    c.bound = false;
    h.clients.push(c);
    let mut r = incomplete(req("applying", 3, "c7", Some(1), 5 * S, None));
    r.chunks = vec![(12 * S, 10)];
    h.upstream.push(r);
    assert_one(&check(&h), Invariant::S5, &["c7", "token 1", "c4"]);
}

#[test]
fn s5_lower_request_finished_before_higher_head_is_clean() {
    let mut h = base();
    let mut c = gateway_write("c7", "applying", 1, 5 * S);
    c.bound = false;
    h.clients.push(c);
    let mut r = req("applying", 3, "c7", Some(1), 5 * S, Some(200));
    r.chunks = vec![(11 * S, 10)];
    r.complete_at_us = Some(11 * S);
    h.upstream.push(r);
    // Exactly at the higher head is not after it; another resource does not count either.
    let mut other = req("applying", 4, "c8", Some(1), 20 * S, Some(200));
    other.resource = "acct-2".into();
    let mut c = gateway_write("c8", "applying", 1, 20 * S);
    c.bound = false;
    c.resource = "acct-2".into();
    h.clients.push(c);
    h.upstream.push(other);
    assert_eq!(check(&h), vec![]);
}

#[test]
fn s5_a_byte_after_the_gateways_deadline_is_reported() {
    let mut h = base();
    // c1's deadline at gateway-0 is 1.9 s; its last body piece arrives 150 ms after it (a write
    // closed, not reset, at its deadline: the kernel sent the rest later).
    let r = h.upstream.iter_mut().find(|r| r.request_id == "c1").unwrap();
    r.chunks = vec![(S + 10_000, 10), (S + 1_200_000, 54)];
    r.complete_at_us = Some(S + 1_200_000);
    assert_one(
        &check(&h),
        Invariant::S5,
        &["c1", "term 1", "gateway-0", "upstream applying", "300000 us after the gateway's deadline"],
    );
    // A head that arrives late counts as much as a body piece.
    let mut h = base();
    let r = h.upstream.iter_mut().find(|r| r.request_id == "c4").unwrap();
    (r.head_at_us, r.chunks, r.complete_at_us) = (12 * S + 500_000, vec![], Some(12 * S + 500_000));
    assert_one(&check(&h), Invariant::S5, &["c4", "term 2", "gateway-0"]);
}

#[test]
fn s5_a_byte_within_the_deadline_tolerance_or_from_a_paused_or_rated_gateway_is_not_reported() {
    let late = |h: &mut History, id: &str, at: i64| {
        let r = h.upstream.iter_mut().find(|r| r.request_id == id).unwrap();
        r.chunks = vec![(at, 64)];
        r.complete_at_us = Some(at);
    };
    // 150 ms late: within the default tolerance of 250 ms (a busy machine's timer).
    let mut h = base();
    late(&mut h, "c1", S + 1_050_000);
    assert_eq!(check(&h), vec![]);
    let strict = CheckOptions { deadline_tolerance_us: 0, ..CheckOptions::default() };
    assert_eq!(check_history(&h, &strict).len(), 1);

    // gateway-1 was paused from 2 s to 10 s: a write of it whose deadline fell in the pause
    // ends late (the contract's timing assumption), one whose deadline fell before it does not.
    let mut h = base();
    h.deadlines.push(deadline(1, "c2b", 1, 2 * S + 500_000));
    h.upstream.push(req("checking", 3, "c2b", Some(1), 2 * S, Some(200)));
    late(&mut h, "c2b", 10 * S + 20_000);
    h.clients.push(gateway_write("c2b", "checking", 1, 2 * S - 5_000));
    assert_eq!(check(&h), vec![]);
    // ... but not for a byte that came long after it resumed.
    late(&mut h, "c2b", 10 * S + 400_000);
    assert_one(&check(&h), Invariant::S5, &["c2b", "gateway-1"]);
    late(&mut h, "c2b", 10 * S + 20_000);
    let d = h.deadlines.iter_mut().find(|d| d.request_id == "c2b").unwrap();
    d.deadline_us = 2 * S - 300_000;
    assert_one(&check(&h), Invariant::S5, &["c2b", "gateway-1"]);

    // A gateway whose clocks ran at another rate: its deadline in real time is unknown.
    let mut h = base();
    late(&mut h, "c1", 3 * S);
    assert_eq!(check(&h).len(), 1);
    h.meta.clock_rates.insert("gateway-0".into(), 500);
    assert_eq!(check(&h), vec![]);
}

// Exactly once

#[test]
fn once_ok_write_never_applied_is_reported() {
    let mut h = base();
    h.upstream.retain(|r| r.request_id != "c1");
    assert_one(&check(&h), Invariant::Once, &["c1", "never applied", "upstream applying"]);
}

#[test]
fn once_ok_sql_write_missing_from_table_is_reported() {
    let mut h = base();
    h.table.retain(|r| r.request_id != "c3");
    assert_one(&check(&h), Invariant::Once, &["c3", "never applied", "table"]);
}

#[test]
fn once_ok_write_applied_twice_is_reported() {
    let mut h = base();
    // A second copy within the gateway's deadline (a later one is an S5 violation as well).
    h.upstream.push(req("applying", 3, "c4", Some(2), 11 * S + 500_000, Some(200)));
    assert_one(&check(&h), Invariant::Once, &["c4", "applied 2 times"]);
}

#[test]
fn once_ok_write_applied_at_another_upstream_is_reported() {
    let mut h = base();
    h.upstream.retain(|r| r.request_id != "c5");
    h.upstream.push(req("applying", 3, "c5", Some(2), 12 * S, Some(200)));
    assert_one(&check(&h), Invariant::Once, &["c5", "ok at upstream checking", "applied at upstream applying"]);
}

#[test]
fn once_ok_write_complete_twice_at_the_checking_upstream_is_reported() {
    let mut h = base();
    // Forwarded twice: once refused with 409, once accepted. Applied once, but sent twice.
    h.upstream.push(req("checking", 3, "c5", Some(2), 12 * S, Some(409)));
    assert_one(&check(&h), Invariant::Once, &["c5", "complete 2 times"]);
}

#[test]
fn once_failed_write_applied_is_reported() {
    let mut h = base();
    h.clients[3] = failed(h.clients[3].clone(), "gateway", Some(503));
    assert_one(&check(&h), Invariant::Once, &["c4", "failed", "gateway", "upstream applying"]);
}

#[test]
fn once_failed_sql_write_in_table_is_reported() {
    let mut h = base();
    h.clients[5] = failed(h.clients[5].clone(), "store", None);
    // Another SQL write recovers the SQL path, so only c6 is reported.
    h.clients.push(sql_write("c7", 2, 11 * S + 300_000));
    h.table.push(row("c7", 2, 3));
    assert_one(&check(&h), Invariant::Once, &["c6", "failed", "table"]);
}

#[test]
fn once_gateway_refused_write_reaching_checking_upstream_is_reported() {
    let mut h = base();
    // The gateway said it refused c7, yet the checking upstream received it complete (and
    // refused it itself).
    h.clients.push(failed(gateway_write("c7", "checking", 2, 12 * S), "gateway", Some(409)));
    h.upstream.push(req("checking", 3, "c7", Some(2), 12 * S, Some(409)));
    assert_one(&check(&h), Invariant::Once, &["c7", "refused by gateway", "upstream checking (status 409)"]);
}

#[test]
fn once_write_refused_by_the_checking_upstream_is_clean() {
    let mut h = base();
    h.clients.push(failed(gateway_write("c7", "checking", 2, 12 * S), "upstream", Some(409)));
    h.upstream.push(req("checking", 3, "c7", Some(2), 12 * S, Some(409)));
    // And a failed write whose request never completed anywhere.
    h.clients.push(failed(gateway_write("c8", "applying", 2, 13 * S), "gateway", Some(503)));
    h.upstream.push(incomplete(req("applying", 3, "c8", Some(2), 13 * S, None)));
    assert_eq!(check(&h), vec![]);
}

#[test]
fn once_unknown_write_is_reported() {
    let mut h = base();
    h.upstream.push(req("applying", 3, "ghost-1", Some(2), 12 * S, Some(200)));
    assert_one(&check(&h), Invariant::Once, &["unknown write ghost-1", "upstream applying"]);
}

#[test]
fn once_unknown_table_row_is_reported() {
    let mut h = base();
    h.table.push(row("ghost-2", 2, 3));
    assert_one(&check(&h), Invariant::Once, &["unknown write ghost-2", "table"]);
}

#[test]
fn once_indeterminate_write_applied_twice_is_reported() {
    let mut h = base();
    let mut c = gateway_write("c7", "applying", 2, 12 * S);
    c.outcome = Outcome::Indeterminate;
    h.clients.push(c);
    h.upstream.push(req("applying", 3, "c7", Some(2), 12 * S, Some(200)));
    h.upstream.push(req("applying", 4, "c7", Some(2), 13 * S, Some(200)));
    assert_one(&check(&h), Invariant::Once, &["c7", "indeterminate", "applied 2 times"]);
}

#[test]
fn once_indeterminate_write_applied_at_most_once_is_clean() {
    let mut h = base();
    for (id, seq) in [("c7", 3), ("c8", 4)] {
        let mut c = gateway_write(id, "applying", 2, 12 * S);
        c.outcome = Outcome::Indeterminate;
        h.clients.push(c);
        if id == "c7" {
            h.upstream.push(req("applying", seq, id, Some(2), 12 * S, None));
        }
    }
    assert_eq!(check(&h), vec![]);
}

// Recovery

#[test]
fn recovery_without_ok_write_within_the_bound_is_reported() {
    let mut h = base();
    // Bound: 2 * 1.5 s + 5 s = 8 s after 10 s. Every write after the fault fails.
    for c in h.clients.iter_mut().filter(|c| c.invoked_us > 10 * S) {
        *c = failed(c.clone(), "gateway", Some(503));
    }
    h.upstream.retain(|r| r.head_at_us < 10 * S);
    h.table.retain(|r| r.term == 1);
    let violations = check(&h);
    assert_eq!(violations.len(), 2, "{violations:#?}");
    for (v, path) in violations.iter().zip(["gateway", "sql"]) {
        assert_eq!(v.invariant, Invariant::Recovery);
        assert!(v.detail.contains(&format!("no ok {path} write to a bound resource within 8000000 us")), "{v}");
    }
    assert_eq!(recovery(&h).0, None);
}

#[test]
fn recovery_needs_every_path_that_wrote_before() {
    let mut h = base();
    // Gateway writes recover; the SQL path never does.
    for c in h.clients.iter_mut().filter(|c| c.invoked_us > 10 * S && c.path == WritePath::Sql) {
        *c = failed(c.clone(), "store", None);
    }
    h.table.retain(|r| r.term == 1);
    assert_one(&check(&h), Invariant::Recovery, &["no ok sql write to a bound resource within 8000000 us"]);
    assert_eq!(recovery(&h).0, None);
}

#[test]
fn recovery_counts_only_writes_to_bound_resources() {
    let mut h = base();
    // Every write after the fault fails, but an unbound write (no leader needed) is ok.
    for c in h.clients.iter_mut().filter(|c| c.invoked_us > 10 * S) {
        *c = failed(c.clone(), "gateway", Some(503));
    }
    h.upstream.retain(|r| r.head_at_us < 10 * S);
    h.table.retain(|r| r.term == 1);
    let mut unbound = gateway_write("racer.1", "applying", 7, 11 * S);
    unbound.bound = false;
    unbound.resource = "race-0".to_owned();
    unbound.client = "racer".to_owned();
    unbound.key = String::new();
    h.clients.push(unbound);
    let mut arrived = req("applying", 90, "racer.1", Some(7), 11 * S + 10_000, Some(200));
    arrived.resource = "race-0".to_owned();
    h.upstream.push(arrived);
    let violations = check(&h);
    assert_eq!(violations.len(), 2, "{violations:#?}");
    assert!(violations.iter().all(|v| v.invariant == Invariant::Recovery && v.detail.contains("to a bound resource")));
    assert_eq!(recovery(&h).0, None);
}

#[test]
fn recovery_first_ok_write_after_the_bound_is_reported() {
    let mut h = base();
    for c in h.clients.iter_mut().filter(|c| c.invoked_us > 10 * S) {
        c.completed_us += 8 * S;
    }
    let violations = check(&h);
    assert_eq!(violations.len(), 2, "{violations:#?}");
    assert!(violations[0].detail.contains("first ok gateway write") && violations[0].detail.contains("9045000 us"));
    assert!(violations[1].detail.contains("first ok sql write") && violations[1].detail.contains("9250000 us"));
    assert_eq!(recovery(&h).0, Some(9_250_000));
}

#[test]
fn recovery_schedule_ending_before_writes_recovered_is_reported() {
    let mut h = base();
    h.meta.ended_us = 10 * S + 500_000;
    h.clients.retain(|c| c.invoked_us < 10 * S);
    h.upstream.retain(|r| r.head_at_us < 10 * S);
    h.table.retain(|r| r.term == 1);
    let violations = check(&h);
    assert_eq!(violations.len(), 2, "{violations:#?}");
    assert!(violations[0].detail.contains("schedule ended before gateway writes recovered"));
    assert!(violations[1].detail.contains("schedule ended before sql writes recovered"));
}

#[test]
fn recovery_within_the_bound_is_clean_and_measured_from_quiet() {
    let mut h = base();
    // An ok write completing exactly at the bound still counts.
    for c in h.clients.iter_mut().filter(|c| c.invoked_us > 10 * S) {
        c.completed_us = 18 * S;
    }
    assert_eq!(check(&h), vec![]);
    assert_eq!(recovery(&h).0, Some(8 * S));
}

#[test]
fn s2_a_term_two_processes_were_elected_with_is_reported() {
    let mut h = base();
    // A grant lost in a crash: leader-c was elected with term 2 too.
    h.elections.push(elected("k1", 2, "leader-c#1", 7 * S));
    let violations = check(&h);
    assert!(
        violations.iter().any(|v| v.invariant == Invariant::S2 && v.detail.contains("2 processes")),
        "{violations:#?}"
    );
    assert!(violations.iter().any(|v| v.detail.contains("leader-c#1") && v.detail.contains("gives to leader-b#1")));
}

#[test]
fn s2_an_elected_term_missing_from_the_stores_history_is_reported() {
    let mut h = base();
    h.elections.push(elected("k1", 3, "leader-a#2", 20 * S));
    assert_one(&check(&h), Invariant::S2, &["leader-a#2", "term 3", "does not have"]);
}

#[test]
fn s2_an_owner_elected_again_into_a_period_it_had_lost_is_reported() {
    let mut h = base();
    // leader-b#1 lost term 2 locally (its renewal timed out) and was handed term 2 again.
    h.elections.push(fencing_checker::history::Election {
        owner: "leader-b#1".into(),
        key: "k1".into(),
        term: 2,
        event: "lost".into(),
        at_us: 12 * S,
    });
    h.elections.push(elected("k1", 2, "leader-b#1", 12 * S + 300_000));
    assert_one(&check(&h), Invariant::S2, &["leader-b#1", "term 2", "a period it had lost at 12000000"]);
    // Elected with a new term after the loss: clean.
    h.leases[1].ended_at_us = Some(12 * S + 200_000);
    h.leases.push(lease("k1", 3, "leader-b#1", 12 * S + 200_000, None));
    h.elections.last_mut().unwrap().term = 3;
    assert_eq!(check(&h), vec![]);
}

// S7

#[test]
fn s7_an_act_after_its_own_deadline_is_reported() {
    let mut h = base();
    h.acts.push(act("leader-b#1", "k1", 2, 12 * S, 12 * S - 5_000));
    assert_one(&check(&h), Invariant::S7, &["leader-b#1", "after its own deadline", "5000 us past"]);
    // Within the clocks' reading tolerance of the deadline: clean.
    h.acts.last_mut().unwrap().deadline_us = 12 * S - 500;
    assert_eq!(check(&h), vec![]);
}

#[test]
fn s7_a_deadline_after_the_stores_expiry_is_reported() {
    let mut h = base();
    h.leases[0].end_reason = Some("expired".into());
    // The store's expiry of term 1 is 4 s; the holder's deadline 4.15 s (a margin added, not
    // taken off).
    h.acts.push(act("leader-a#1", "k1", 1, 3 * S + 600_000, 4 * S + 150_000));
    assert_one(&check(&h), Invariant::S7, &["leader-a#1", "fell 150000 us after the store's expiry"]);
    // Not where the store's clock stepped during the period: a step moves expiry against the
    // holder's deadline until its next round trip.
    h.clock_steps.push(fencing_checker::history::ClockStep { before_us: 2 * S, at_us: 2 * S + 1_000, offset_us: 0 });
    assert_eq!(check(&h), vec![]);
}

#[test]
fn s7_an_act_after_the_period_ended_or_in_anothers_period_is_reported() {
    let mut h = base();
    h.acts.push(act("leader-a#1", "k1", 1, 4 * S + 200_000, 4 * S + 300_000));
    assert_one(&check(&h), Invariant::S7, &["leader-a#1", "after the store's period ended at 4000000 (released)"]);
    let mut h = base();
    h.acts.push(act("leader-c#1", "k1", 2, 12 * S, 12 * S + 500_000));
    assert_one(&check(&h), Invariant::S7, &["leader-c#1", "a period the store gives to leader-b#1"]);
    let mut h = base();
    h.acts.push(act("leader-c#1", "k1", 7, 12 * S, 12 * S + 500_000));
    assert_one(&check(&h), Invariant::S7, &["leader-c#1", "term 7", "does not have"]);
}

#[test]
fn s1_a_leader_acting_after_a_newer_term_had_acted_is_reported_from_the_leaders_own_records() {
    let mut h = base();
    // leader-a#1 acts with term 1 at 11.5 s, after leader-b#1 had acted with term 2 at 11 s: its
    // deadline (as it had it) is also past, and the store ended its period at 4 s.
    h.acts.push(act("leader-a#1", "k1", 1, 11 * S + 500_000, 11 * S + 600_000));
    let violations = check(&h);
    assert!(
        violations.iter().any(|v| v.invariant == Invariant::S1
            && v.detail.contains("leader-a#1 acted with term 1")
            && v.detail.contains("by their own records")),
        "{violations:#?}"
    );
    // Not where the store's clock stepped since the renewal that gave the older act its deadline
    // (a forward step ends the period early; the holder notices at its next round trip).
    let mut stepped = h.clone();
    stepped.acts.last_mut().unwrap().deadline_us = 12 * S;
    stepped.clock_steps.push(fencing_checker::history::ClockStep {
        before_us: 10 * S + 700_000,
        at_us: 10 * S + 701_000,
        offset_us: 60 * S,
    });
    assert!(!s1_from_records(&stepped), "{:#?}", check(&stepped));
    // Nor after a forced release of the older period: its holder acts until its deadline.
    let mut forced = h.clone();
    forced.leases[0].end_reason = Some("force_released".into());
    assert!(!s1_from_records(&forced), "{:#?}", check(&forced));
    // Checks that may have come in either order (the newer one answered after the older one was
    // checked) are not reported.
    let mut h = base();
    h.leases[0].ended_at_us = None;
    h.leases[0].end_reason = None;
    h.leases[1].granted_at_us = 11 * S - 20_000;
    h.acts = vec![act("leader-a#1", "k1", 1, 11 * S - 10_500, 11 * S + 100_000)];
    h.acts.push(act("leader-b#1", "k1", 2, 11 * S - 11_000, 11 * S + 500_000));
    assert!(!s1_from_records(&h));
}

fn s1_from_records(h: &History) -> bool {
    check(h).iter().any(|v| v.detail.contains("by their own records"))
}

// The HTTP lease API's answers

#[test]
fn an_ok_renewal_naming_another_owners_period_is_reported() {
    let mut h = base();
    // lease-y#1 took k3 with term 2; lease-x#1's late renewal extended that period.
    h.lease_calls.truncate(2);
    h.leases[2].ended_at_us = Some(22 * S);
    h.leases[2].end_reason = Some("expired".into());
    h.leases.push(lease("k3", 2, "lease-y#1", 22 * S, None));
    h.lease_calls.push(call("lease-y#1", "acquire", None, 22 * S - 3_000, Some(200), Some(2), Some(1500)));
    h.lease_calls.push(call("lease-x#1", "renew", Some(1), 23 * S, Some(200), Some(2), Some(1500)));
    let violations = check(&h);
    assert!(
        violations.iter().any(|v| v.invariant == Invariant::S1
            && v.detail.contains("renew of k3 by lease-x#1")
            && v.detail.contains("gives to lease-y#1")),
        "{violations:#?}"
    );
    assert!(violations.iter().any(|v| v.detail.contains("for term 1 answered ok with term 2")), "{violations:#?}");
    // A renewal answering a later term of the caller's own, after one of its acquires went
    // unanswered (it may have reached the store after the release and started that term): clean.
    let mut h = base();
    h.lease_calls.insert(0, call("lease-x#1", "acquire", None, 19 * S, None, None, None));
    h.leases[2].end_reason = Some("released".into());
    h.leases.push(lease("k3", 2, "lease-x#1", 21 * S + 50_000, None));
    h.lease_calls.last_mut().unwrap().status = Some(200);
    h.lease_calls.last_mut().unwrap().term = Some(2);
    h.lease_calls.last_mut().unwrap().remaining_ms = Some(1500);
    assert_eq!(check(&h), vec![]);
}

#[test]
fn an_ok_renewal_of_an_expired_or_released_period_is_reported() {
    let mut h = base();
    // After its renewal at 20.5 s (1.5 s left at 20.505 s), lease-x#1 renews at 22.2 s: ok.
    h.lease_calls.truncate(2);
    h.lease_calls.push(call("lease-x#1", "renew", Some(1), 22 * S + 200_000, Some(200), Some(1), Some(1500)));
    h.leases[2].ended_at_us = Some(24 * S);
    assert_one(&check(&h), Invariant::S2, &["lease-x#1", "term 1", "a period that had ended: expired by 22005000"]);
    // A renewal in between whose answer was lost may have extended it: not reported.
    let late = h.lease_calls.pop().unwrap();
    let mut lost = call("lease-x#1", "renew", Some(1), 21 * S, None, None, None);
    lost.received_us = 24 * S;
    h.lease_calls.push(lost);
    h.lease_calls.push(late);
    assert_eq!(check(&h), vec![]);
    // An earlier call whose outcome the caller never learned (a 503: the gateway gave up while a
    // held link still carried it) may have reached the store after the others: not reported.
    let mut h = base();
    h.lease_calls.truncate(2);
    h.lease_calls.insert(0, call("lease-x#1", "renew", Some(1), 19 * S, Some(503), None, None));
    h.lease_calls.push(call("lease-x#1", "renew", Some(1), 22 * S + 200_000, Some(200), Some(1), Some(1500)));
    h.leases[2].ended_at_us = Some(24 * S);
    assert_eq!(check(&h), vec![]);
    // ...unless it was sent long before.
    h.lease_calls[0].sent_us = 5 * S;
    h.lease_calls[0].received_us = 6 * S;
    assert_one(&check(&h), Invariant::S2, &["lease-x#1", "a period that had ended"]);
    // After its own ok release.
    let mut h = base();
    h.lease_calls.last_mut().unwrap().status = Some(200);
    h.lease_calls.last_mut().unwrap().term = Some(1);
    h.lease_calls.last_mut().unwrap().remaining_ms = Some(1500);
    h.leases[2].ended_at_us = Some(23 * S);
    assert_one(&check(&h), Invariant::S2, &["lease-x#1", "released by its ok release"]);
}

#[test]
fn s4_a_write_invoked_after_a_process_was_told_of_the_newer_grant_is_reported_at_once() {
    let mut h = base();
    // 20 ms after the grant of term 2, within the grant margin, but after leader-b#1 was told.
    h.elections[1].at_us = 6 * S + 10_000;
    let mut c = gateway_write("c7", "applying", 1, 6 * S + 20_000);
    c.resource = "acct-2".into();
    h.clients.push(c);
    let mut r = req("applying", 3, "c7", Some(1), 6 * S + 30_000, Some(200));
    r.resource = "acct-2".into();
    h.upstream.push(r);
    assert_one(&check(&h), Invariant::S4, &["c7", "term 1", "known granted by 6010000"]);
    // Invoked before anyone was told: within the margin, not reported.
    h.elections[1].at_us = 6 * S + 30_000;
    assert_eq!(check(&h), vec![]);
}

#[test]
fn s4_a_forged_or_future_token_admitted_is_reported() {
    let mut h = base();
    h.clients[3].term = Some(5);
    h.upstream[2].token = Some(5);
    let violations = check(&h);
    assert!(
        violations.iter().any(|v| v.invariant == Invariant::S4 && v.detail.contains("never granted")),
        "{violations:#?}"
    );
    // A term granted only after the write ended: a future token.
    let mut h = base();
    h.leases[1].granted_at_us = 12 * S;
    h.elections[1].at_us = 12 * S;
    h.acts.pop();
    let violations = check(&h);
    assert!(
        violations.iter().any(|v| v.invariant == Invariant::S4 && v.detail.contains("a future token")),
        "{violations:#?}"
    );
}

#[test]
fn s4_a_stamp_write_stamped_with_another_owners_term_is_reported() {
    let mut h = base();
    // c4 in stamp mode, as leader-a#1 (a zombie of term 1), stamped with leader-b#1's term 2.
    h.clients[3].mode = Mode::Stamp;
    h.clients[3].term = None;
    assert_one(&check(&h), Invariant::S4, &["c4", "presented owner leader-a#1", "leader-b#1's"]);
    h.clients[3].owner = Some("leader-b#1".into());
    assert_eq!(check(&h), vec![]);
}

// The fenced log

/// Asserts that every violation is the log's, and that one names every one of `names`.
#[track_caller]
fn assert_log(violations: &[Violation], names: &[&str]) {
    assert!(!violations.is_empty(), "expected a log violation");
    assert!(violations.iter().all(|v| v.invariant == Invariant::Log), "{violations:#?}");
    assert!(
        violations.iter().any(|v| names.iter().all(|name| v.detail.contains(name))),
        "no violation names all of {names:?}: {violations:#?}"
    );
}

#[test]
fn log_a_refused_append_in_the_log_is_reported() {
    let mut h = base();
    h.appends.push(log_append("a5", "leader-b", 2, 12 * S, Outcome::Failed, None));
    h.log.push(entry(4, 2, "a5"));
    assert_one(&check(&h), Invariant::Log, &["entry 4", "a5", "refused"]);
}

#[test]
fn log_a_zombies_append_admitted_after_a_newer_grant_is_reported() {
    let mut h = base();
    // leader-a's append of term 1, invoked at 7 s, after term 2's grant at 6 s, is in the log.
    h.appends[2].outcome = Outcome::Ok;
    h.appends[2].seq = Some(4);
    h.log.push(entry(4, 1, "a3"));
    let violations = check(&h);
    assert_log(&violations, &["entry 4", "a3", "granted term 2"]);
    assert_log(&violations, &["entry 4 of term 1 after entry 3 of term 2"]);
}

#[test]
fn log_a_gap_in_the_log_is_reported() {
    let mut h = base();
    h.log[2].seq = 4;
    h.appends[3].seq = Some(4);
    h.applied.retain(|a| a.seq < 3);
    assert_one(&check(&h), Invariant::Log, &["entry 4 where 3 was due"]);
}

#[test]
fn log_an_acknowledged_append_missing_from_the_log_is_reported() {
    let mut h = base();
    h.log.pop();
    h.applied.retain(|a| a.seq < 3);
    assert_one(&check(&h), Invariant::Log, &["a4", "answered ok with seq Some(3)", "does not have it"]);
}

#[test]
fn log_a_follower_that_skips_an_entry_is_reported() {
    let mut h = base();
    h.applied.retain(|a| !(a.follower == "f1" && a.seq == 2));
    assert_one(&check(&h), Invariant::Log, &["follower f1", "applied entry 3 after 1", "skipped 1"]);
}

#[test]
fn log_a_follower_that_applies_what_the_log_does_not_have_is_reported() {
    let mut h = base();
    // A refused append a follower saw anyway (read before a rollback, say): never in the log.
    h.applied.push(applied("f2", 21, 3, 1, "a3", 8 * S));
    assert_one(&check(&h), Invariant::Log, &["follower f2", "entry 3", "a3", "the log has Some(\"a4\") of term 2"]);
}

#[test]
fn log_a_follower_process_that_skips_below_the_highest_entry_is_reported() {
    let mut h = base();
    // f2's second process resumes from a cursor that went back (a lost report) to 0, applies 1,
    // then skips 2: below the highest entry f2 ever applied, but a skip all the same.
    h.applied.retain(|a| !(a.follower == "f2" && a.pid == 21));
    h.applied.push(applied("f2", 21, 1, 1, "a1", 12 * S));
    h.applied.push(applied("f2", 21, 3, 2, "a4", 12 * S + 10_000));
    h.applied.insert(2, applied("f2", 20, 2, 1, "a2", 2 * S + 20_000));
    h.applied.insert(3, applied("f2", 20, 3, 2, "a4", 11 * S + 20_000));
    assert_one(&check(&h), Invariant::Log, &["follower f2 (pid 21)", "applied entry 3 after 1"]);
}

#[test]
fn log_an_append_admitted_after_its_own_period_ended_is_reported() {
    let mut h = base();
    // Term 1 ended at 4 s; leader-a's append invoked at 5 s, before term 2 (6 s), is in the log
    // between term 1's entries and term 2's: terms never decrease, yet the lease was not held.
    h.appends.push(log_append("a5", "leader-a", 1, 5 * S, Outcome::Ok, Some(3)));
    h.appends[3].seq = Some(4);
    h.log = vec![entry(1, 1, "a1"), entry(2, 1, "a2"), entry(3, 1, "a5"), entry(4, 2, "a4")];
    h.applied.retain(|a| a.seq < 3);
    assert_one(&check(&h), Invariant::Log, &["entry 3", "a5", "whose period ended at 4000000"]);
    // A step of the store's clock after the append's answer changes nothing.
    let step = |at_us| fencing_checker::history::ClockStep { before_us: at_us - 1_000, at_us, offset_us: -50 * S };
    h.clock_steps.push(step(5 * S + 20_000));
    assert_one(&check(&h), Invariant::Log, &["entry 3", "a5", "whose period ended at 4000000"]);
    // A step back between the invocation and the answer (a fault run met one): the store's clock
    // made the lease live again before it admitted the append, as the contract allows.
    h.clock_steps = vec![step(5 * S + 5_000)];
    assert_eq!(check(&h), vec![]);
    // An append whose answer never came may have been admitted until the history's end.
    h.appends[4].outcome = Outcome::Indeterminate;
    h.clock_steps = vec![step(5 * S + 20_000)];
    assert_eq!(check(&h), vec![]);
}
