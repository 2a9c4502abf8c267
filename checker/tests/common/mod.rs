//! Synthetic histories for the checker's tests: a clean base schedule, record builders, and
//! writing a history to a schedule directory in the recorded format.
#![allow(clippy::unwrap_used, dead_code, unreachable_pub)]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use fencing_checker::history::{
    Append, Applied, ClientWrite, Election, Fault, ForwardDeadline, History, LeaderAct, LeaseCall, LeasePeriod,
    LogEntry, Meta, Mode, Outcome, TableRow, UpstreamRequest, WritePath,
};

/// One second in microseconds.
pub const S: i64 = 1_000_000;

pub fn lease(key: &str, term: i64, owner: &str, granted: i64, ended: Option<i64>) -> LeasePeriod {
    LeasePeriod {
        key: key.into(),
        term,
        owner: owner.into(),
        granted_at_us: granted,
        ended_at_us: ended,
        end_reason: ended.map(|_| "released".into()),
    }
}

/// A complete request to `upstream` whose head arrives at `head` and whose one chunk arrives
/// 10 ms later, answered `status`.
pub fn req(upstream: &str, seq: u64, id: &str, token: Option<i64>, head: i64, status: Option<u16>) -> UpstreamRequest {
    UpstreamRequest {
        upstream: upstream.into(),
        seq,
        request_id: id.into(),
        resource: "acct-1".into(),
        token,
        head_at_us: head,
        chunks: vec![(head + 10_000, 64)],
        complete: true,
        complete_at_us: Some(head + 10_000),
        status,
    }
}

/// The same request, but its connection dropped before the body was complete.
pub fn incomplete(mut r: UpstreamRequest) -> UpstreamRequest {
    r.complete = false;
    r.complete_at_us = None;
    r.status = None;
    r
}

/// An ok verify write of key `k1` through gateway 1 to `upstream`, invoked at `invoked`.
pub fn gateway_write(id: &str, upstream: &str, term: i64, invoked: i64) -> ClientWrite {
    ClientWrite {
        client: "leader-a".into(),
        owner: Some("leader-a#1".into()),
        request_id: id.into(),
        key: "k1".into(),
        path: WritePath::Gateway,
        mode: Mode::Verify,
        gateway: Some(1),
        upstream: Some(upstream.into()),
        resource: "acct-1".into(),
        bound: true,
        term: Some(term),
        invoked_us: invoked,
        completed_us: invoked + 50_000,
        outcome: Outcome::Ok,
        status: Some(200),
        refused_by: None,
        error: None,
    }
}

/// An ok SQL write of key `k1`, invoked at `invoked`.
pub fn sql_write(id: &str, term: i64, invoked: i64) -> ClientWrite {
    ClientWrite {
        path: WritePath::Sql,
        mode: Mode::Sql,
        gateway: None,
        upstream: None,
        status: None,
        ..gateway_write(id, "applying", term, invoked)
    }
}

pub fn failed(mut c: ClientWrite, refused_by: &str, status: Option<u16>) -> ClientWrite {
    c.outcome = Outcome::Failed;
    c.refused_by = Some(refused_by.into());
    c.status = status;
    c
}

pub fn row(id: &str, term: i64, ticket: i64) -> TableRow {
    TableRow { request_id: id.into(), resource: "acct-1".into(), term, ticket }
}

/// A clean schedule: key k1 held by term 1 from 0 to 4 s and term 2 from 6 s on; a fault from
/// 2 s to 10 s; writes of both terms through both upstreams and SQL, and an ok write 1 s after
/// the fault ended. The schedule ends at 60 s.
pub fn base() -> History {
    let meta = Meta {
        schedule: 1,
        seed: 42,
        ttl_ms: 1500,
        forward_timeout_ms: 1000,
        started_us: 0,
        ended_us: 60 * S,
        quiet_from_us: 10 * S,
        clock_rates: BTreeMap::new(),
    };
    History {
        meta,
        leases: vec![
            lease("k1", 1, "leader-a#1", 0, Some(4 * S)),
            lease("k1", 2, "leader-b#1", 6 * S, None),
            lease("k3", 1, "lease-x#1", 20 * S + 2_000, Some(21 * S + 2_000)),
        ],
        upstream: vec![
            req("applying", 1, "c1", Some(1), S, Some(200)),
            req("checking", 1, "c2", Some(1), S + 100_000, Some(200)),
            req("applying", 2, "c4", Some(2), 11 * S, Some(200)),
            req("checking", 2, "c5", Some(2), 11 * S + 100_000, Some(200)),
        ],
        table: vec![row("c3", 1, 1), row("c6", 2, 2)],
        clients: vec![
            gateway_write("c1", "applying", 1, S - 5_000),
            gateway_write("c2", "checking", 1, S + 95_000),
            sql_write("c3", 1, S + 200_000),
            gateway_write("c4", "applying", 2, 11 * S - 5_000),
            gateway_write("c5", "checking", 2, 11 * S + 95_000),
            sql_write("c6", 2, 11 * S + 200_000),
        ],
        faults: vec![Fault {
            kind: "sigstop-gateway".into(),
            target: "gateway-1".into(),
            start_us: 2 * S,
            end_us: 10 * S,
        }],
        elections: vec![elected("k1", 1, "leader-a#1", 0), elected("k1", 2, "leader-b#1", 6 * S)],
        acts: vec![
            act("leader-a#1", "k1", 1, S - 10_000, S + 400_000),
            act("leader-a#1", "k1", 1, 3 * S, 3 * S + 500_000),
            act("leader-b#1", "k1", 2, 11 * S - 10_000, 11 * S + 500_000),
        ],
        lease_calls: vec![
            call("lease-x#1", "acquire", None, 20 * S, Some(200), Some(1), Some(1500)),
            call("lease-x#1", "renew", Some(1), 20 * S + 500_000, Some(200), Some(1), Some(1500)),
            call("lease-y#1", "acquire", None, 20 * S + 600_000, Some(409), Some(1), None),
            call("lease-x#1", "release", Some(1), 21 * S, Some(204), None, None),
            call("lease-x#1", "renew", Some(1), 21 * S + 100_000, Some(409), None, None),
        ],
        clock_steps: Vec::new(),
        deadlines: vec![
            deadline(0, "c1", 1, S + 900_000),
            deadline(1, "c2", 1, S + 990_000),
            deadline(0, "c4", 2, 11 * S + 900_000),
            deadline(1, "c5", 2, 11 * S + 990_000),
        ],
        // Stream log-k1 of key k1: two appends of term 1, a zombie's append of term 1 refused
        // after term 2's grant, one append of term 2; follower f1 applies all three, f2 is
        // restarted and applies 1 again.
        appends: vec![
            log_append("a1", "leader-a", 1, S, Outcome::Ok, Some(1)),
            log_append("a2", "leader-a", 1, 2 * S, Outcome::Ok, Some(2)),
            log_append("a3", "leader-a", 1, 7 * S, Outcome::Failed, None),
            log_append("a4", "leader-b", 2, 11 * S, Outcome::Ok, Some(3)),
        ],
        log: vec![entry(1, 1, "a1"), entry(2, 1, "a2"), entry(3, 2, "a4")],
        applied: vec![
            applied("f1", 10, 1, 1, "a1", S + 10_000),
            applied("f2", 20, 1, 1, "a1", S + 20_000),
            applied("f1", 10, 2, 1, "a2", 2 * S + 10_000),
            applied("f2", 21, 1, 1, "a1", 5 * S),
            applied("f2", 21, 2, 1, "a2", 5 * S + 10_000),
            applied("f1", 10, 3, 2, "a4", 11 * S + 10_000),
        ],
    }
}

/// An append to stream `log-k1` of key k1 by `client`, answered 10 ms after `invoked`.
pub fn log_append(id: &str, client: &str, term: i64, invoked: i64, outcome: Outcome, seq: Option<i64>) -> Append {
    Append {
        client: client.into(),
        owner: Some(format!("{client}#1")),
        request_id: id.into(),
        key: "k1".into(),
        stream: "log-k1".into(),
        term,
        invoked_us: invoked,
        completed_us: invoked + 10_000,
        outcome,
        seq,
        error: (outcome == Outcome::Failed).then(|| "SQLSTATE ZF409: stale".to_owned()),
    }
}

/// An entry of stream `log-k1`, as the store kept it.
pub fn entry(seq: i64, term: i64, id: &str) -> LogEntry {
    LogEntry { stream: "log-k1".into(), seq, term, request_id: Some(id.into()) }
}

/// An entry of stream `log-k1` that `follower` (process `pid`) applied at `at`.
pub fn applied(follower: &str, pid: u32, seq: i64, term: i64, id: &str, at: i64) -> Applied {
    Applied {
        follower: follower.into(),
        pid,
        stream: "log-k1".into(),
        seq,
        term,
        request_id: Some(id.into()),
        at_us: at,
    }
}

/// A line of `deadlines.jsonl`: `gateway`'s deadline for write `id` of `term`.
pub fn deadline(gateway: u32, id: &str, term: i64, at: i64) -> ForwardDeadline {
    ForwardDeadline { gateway, request_id: id.into(), term, deadline_us: at }
}

/// A leader's act of `key` with `term`, checked at `checked` and answered 1 ms later, under the
/// deadline `deadline`.
pub fn act(owner: &str, key: &str, term: i64, checked: i64, deadline: i64) -> LeaderAct {
    LeaderAct {
        owner: owner.into(),
        key: key.into(),
        term,
        checked_us: checked,
        acted_us: checked + 1_000,
        deadline_us: deadline,
    }
}

/// A call of the HTTP lease API on key `k3`, sent at `sent` and answered 5 ms later.
pub fn call(
    owner: &str,
    op: &str,
    believed: Option<i64>,
    sent: i64,
    status: Option<u16>,
    term: Option<i64>,
    remaining_ms: Option<i64>,
) -> LeaseCall {
    LeaseCall {
        client: owner.split('#').next().unwrap_or_default().into(),
        owner: owner.into(),
        key: "k3".into(),
        op: op.into(),
        believed_term: believed,
        sent_us: sent,
        received_us: sent + 5_000,
        status,
        term,
        remaining_ms,
    }
}

/// An `elected` line of `elections.jsonl`.
pub fn elected(key: &str, term: i64, owner: &str, at: i64) -> Election {
    Election { owner: owner.into(), key: key.into(), term, event: "elected".into(), at_us: at }
}

fn lines<T: serde::Serialize>(records: &[T]) -> String {
    let mut out = String::new();
    for r in records {
        writeln!(out, "{}", serde_json::to_string(r).unwrap()).unwrap();
    }
    out
}

/// Writes `h` into `dir` in the recorded format (one file per upstream).
pub fn write_schedule(dir: &Path, h: &History) {
    fs::create_dir_all(dir).unwrap();
    fs::write(dir.join("meta.json"), serde_json::to_string(&h.meta).unwrap()).unwrap();
    fs::write(dir.join("leases.jsonl"), lines(&h.leases)).unwrap();
    fs::write(dir.join("table.jsonl"), lines(&h.table)).unwrap();
    fs::write(dir.join("clients.jsonl"), lines(&h.clients)).unwrap();
    fs::write(dir.join("faults.jsonl"), lines(&h.faults)).unwrap();
    fs::write(dir.join("elections.jsonl"), lines(&h.elections)).unwrap();
    fs::write(dir.join("acts.jsonl"), lines(&h.acts)).unwrap();
    fs::write(dir.join("lease_calls.jsonl"), lines(&h.lease_calls)).unwrap();
    fs::write(dir.join("clock.jsonl"), lines(&h.clock_steps)).unwrap();
    fs::write(dir.join("deadlines.jsonl"), lines(&h.deadlines)).unwrap();
    fs::write(dir.join("appends.jsonl"), lines(&h.appends)).unwrap();
    fs::write(dir.join("log.jsonl"), lines(&h.log)).unwrap();
    fs::write(dir.join("followers.jsonl"), lines(&h.applied)).unwrap();
    let mut by_upstream: BTreeMap<&str, Vec<&UpstreamRequest>> = BTreeMap::new();
    for r in &h.upstream {
        by_upstream.entry(&r.upstream).or_default().push(r);
    }
    for (name, reqs) in by_upstream {
        fs::write(dir.join(format!("upstream-{name}.jsonl")), lines(&reqs)).unwrap();
    }
}

/// A fresh, empty directory for one test.
pub fn temp_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fencing-checker-{}-{test}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}
