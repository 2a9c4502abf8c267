//! The rules: each function takes a schedule's [`History`] and returns the violations it finds.
//!
//! Every rule reads the recorded facts only; nothing here knows how the product works beyond the
//! contract's invariants (S1-S5, S7), exactly-once application and recovery after the last fault.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::history::{
    CHECKING_UPSTREAM, ClientWrite, History, LeaderAct, LeaseCall, LeasePeriod, Mode, Outcome, UpstreamRequest,
    WritePath,
};
use crate::report::{Invariant, Violation};

/// Tunables of the rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckOptions {
    /// S4: how long a grant may take to commit, in microseconds: a write invoked less than this
    /// after a newer grant is not held against the gateway.
    pub grant_margin_us: i64,
    /// S5: how late, in microseconds, a lower-term byte may arrive after a higher-term head.
    pub byte_tolerance_us: i64,
    /// S5: how late, in microseconds, a byte may arrive after its gateway's deadline for the
    /// write (the gateway's timer and the reset reaching the link run late on a busy machine).
    pub deadline_tolerance_us: i64,
}

impl Default for CheckOptions {
    fn default() -> Self {
        CheckOptions { grant_margin_us: 100_000, byte_tolerance_us: 0, deadline_tolerance_us: 250_000 }
    }
}

/// All rules over one history, in invariant order.
pub fn check_history(h: &History, opts: &CheckOptions) -> Vec<Violation> {
    let mut out = Vec::new();
    out.extend(s1_periods_do_not_overlap(h));
    out.extend(s2_terms_grow_by_one(h));
    out.extend(s2_every_believed_period_is_the_stores(h));
    out.extend(s2_no_period_resumed_after_its_holder_lost_it(h));
    out.extend(s1_leaders_acts_do_not_overlap(h));
    out.extend(lease_answers_name_the_callers_period(h));
    out.extend(s2_no_renewal_brings_an_ended_period_back(h));
    out.extend(s3_terms_never_decrease(h));
    out.extend(s4_no_write_after_newer_grant(h, opts));
    out.extend(s4_bound_writes_carry_a_granted_term_of_their_owner(h));
    out.extend(s5_no_lower_byte_after_higher_head(h, opts));
    out.extend(s5_no_byte_after_the_gateways_deadline(h, opts));
    out.extend(s7_acts_before_the_deadline_within_the_period(h));
    out.extend(exactly_once(h));
    out.extend(recovery(h).1);
    out.extend(log_holds_the_admitted_appends(h, opts));
    out.extend(followers_apply_a_prefix_of_the_log(h));
    out
}

fn violation(h: &History, invariant: Invariant, detail: String) -> Violation {
    Violation { invariant, schedule: h.meta.schedule, detail }
}

fn periods_by_key(h: &History) -> BTreeMap<&str, Vec<&LeasePeriod>> {
    let mut by_key: BTreeMap<&str, Vec<&LeasePeriod>> = BTreeMap::new();
    for p in &h.leases {
        by_key.entry(&p.key).or_default().push(p);
    }
    for periods in by_key.values_mut() {
        periods.sort_by_key(|p| (p.granted_at_us, p.term));
    }
    by_key
}

/// Each period by its key and term (the last line wins where the history has a term twice: S2
/// reports that).
fn periods_by_term(h: &History) -> HashMap<(&str, i64), &LeasePeriod> {
    h.leases.iter().map(|p| ((p.key.as_str(), p.term), p)).collect()
}

fn describe_end(end: Option<i64>) -> String {
    end.map_or_else(|| "open".to_owned(), |e| e.to_string())
}

/// S1: per key, no two periods `[granted_at_us, ended_at_us)` overlap; an open period lasts
/// past the end of the schedule. A period that ends before it starts is reported too.
pub fn s1_periods_do_not_overlap(h: &History) -> Vec<Violation> {
    let mut out = Vec::new();
    for (key, periods) in periods_by_key(h) {
        for (i, a) in periods.iter().enumerate() {
            let a_end = a.ended_at_us.unwrap_or(i64::MAX);
            if a_end < a.granted_at_us {
                out.push(violation(
                    h,
                    Invariant::S1,
                    format!(
                        "key {key}: term {} ({}) ends at {} before its grant at {}",
                        a.term, a.owner, a_end, a.granted_at_us
                    ),
                ));
                continue;
            }
            for b in &periods[i + 1..] {
                if b.granted_at_us >= a_end {
                    break;
                }
                if b.ended_at_us.is_some_and(|e| e <= b.granted_at_us) {
                    continue;
                }
                out.push(violation(
                    h,
                    Invariant::S1,
                    format!(
                        "key {key}: term {} ({}, [{}, {})) overlaps term {} ({}, [{}, {}))",
                        a.term,
                        a.owner,
                        a.granted_at_us,
                        describe_end(a.ended_at_us),
                        b.term,
                        b.owner,
                        b.granted_at_us,
                        describe_end(b.ended_at_us)
                    ),
                ));
            }
        }
    }
    out
}

/// S2: per key, in grant order, each period's term is the previous one's plus one (so terms
/// strictly increase and none appears twice).
pub fn s2_terms_grow_by_one(h: &History) -> Vec<Violation> {
    let mut out = Vec::new();
    for (key, periods) in periods_by_key(h) {
        for pair in periods.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            if Some(b.term) != a.term.checked_add(1) {
                let what = if b.term == a.term { "appears twice" } else { "does not follow" };
                out.push(violation(
                    h,
                    Invariant::S2,
                    format!(
                        "key {key}: term {} ({}, granted at {}) {what} term {} ({}, granted at {}); expected term {}",
                        b.term,
                        b.owner,
                        b.granted_at_us,
                        a.term,
                        a.owner,
                        a.granted_at_us,
                        a.term.saturating_add(1)
                    ),
                ));
            }
        }
    }
    out
}

/// S1 and S2 as the leaders lived them: every term a leader process was elected with is a
/// period of the store's history with that process as owner. Two owners elected with one term
/// of a key, or an elected term the history lacks or gives to another owner, is a grant that
/// was not durable (lost in a crash) or a period two processes shared.
pub fn s2_every_believed_period_is_the_stores(h: &History) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut owners: HashMap<(&str, i64), Vec<&str>> = HashMap::new();
    for p in &h.leases {
        owners.entry((p.key.as_str(), p.term)).or_default().push(p.owner.as_str());
    }
    let mut elected: BTreeMap<(&str, i64), Vec<&str>> = BTreeMap::new();
    for e in h.elections.iter().filter(|e| e.event == "elected") {
        let owners_of_term = elected.entry((e.key.as_str(), e.term)).or_default();
        if !owners_of_term.contains(&e.owner.as_str()) {
            owners_of_term.push(e.owner.as_str());
        }
    }
    for ((key, term), believers) in elected {
        if believers.len() > 1 {
            out.push(violation(
                h,
                Invariant::S2,
                format!(
                    "key {key}: term {term} was believed led by {} processes: {}",
                    believers.len(),
                    believers.join(", ")
                ),
            ));
        }
        for believer in believers {
            match owners.get(&(key, term)) {
                Some(held_by) if held_by.contains(&believer) => {}
                Some(held_by) => out.push(violation(
                    h,
                    Invariant::S2,
                    format!(
                        "key {key}: {believer} was elected with term {term}, which the store's history gives to {}",
                        held_by.join(", ")
                    ),
                )),
                None => out.push(violation(
                    h,
                    Invariant::S2,
                    format!("key {key}: {believer} was elected with term {term}, which the store's history does not have (a grant lost in a crash?)"),
                )),
            }
        }
    }
    out
}

/// How far apart two clocks of this machine read when the records compare them: the history's
/// clock (real time) and a process's monotonic clock, read as a pair (`instant_us`).
pub const CLOCK_READ_TOLERANCE_US: i64 = 1_000;

/// Whether a step of the store's clock happened (may have happened) within `[from_us, to_us]`:
/// then the store's times and the processes' own no longer compare (docs/CONTRACT.md, Clocks:
/// a step moves expiry against a holder's deadline until its next round trip).
fn clock_stepped_within(h: &History, from_us: i64, to_us: i64) -> bool {
    h.clock_steps.iter().any(|step| step.before_us <= to_us && step.at_us >= from_us)
}

/// S2: a period a holder ended locally is over: an owner elected again with a term it had
/// already seen itself lose (the store handed back the same period) is reported. Events are
/// taken per owner in the order that process saw them.
pub fn s2_no_period_resumed_after_its_holder_lost_it(h: &History) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut by_owner: BTreeMap<(&str, &str), Vec<&crate::history::Election>> = BTreeMap::new();
    for e in &h.elections {
        by_owner.entry((e.owner.as_str(), e.key.as_str())).or_default().push(e);
    }
    for ((owner, key), mut events) in by_owner {
        events.sort_by_key(|e| e.at_us);
        let mut lost: HashMap<i64, i64> = HashMap::new();
        for e in events {
            match e.event.as_str() {
                "lost" => {
                    lost.entry(e.term).or_insert(e.at_us);
                }
                "elected" => {
                    if let Some(at) = lost.get(&e.term) {
                        out.push(violation(
                            h,
                            Invariant::S2,
                            format!(
                                "key {key}: {owner} was elected with term {} at {}, a period it had lost at {at}: a \
                                 period ended locally is over, the next one needs a new term",
                                e.term, e.at_us
                            ),
                        ));
                    }
                }
                _ => {}
            }
        }
    }
    out
}

/// S1 from the leaders' own records: per key, no leader acts with a term after a leader with a
/// higher term had already acted. An act's check lies between its `checked_us` and its
/// `acted_us`, so only a pair whose checks certainly came in the wrong order is reported: the
/// older term's act checked after the newer one's had been answered. Not where the store's clock
/// stepped since the renewal that gave the older act its deadline (the contract: a step moves
/// expiry against the holder's deadline until its next round trip), nor after a forced release of
/// the older period.
pub fn s1_leaders_acts_do_not_overlap(h: &History) -> Vec<Violation> {
    let mut out = Vec::new();
    // A forced release ends a period its holder still believes in, until its deadline: by design.
    let forced: HashSet<(&str, i64)> = h
        .leases
        .iter()
        .filter(|p| p.end_reason.as_deref() == Some("force_released"))
        .map(|p| (p.key.as_str(), p.term))
        .collect();
    // Per key and term: the earliest answered act, and the latest-checked act.
    let mut first_answered: BTreeMap<(&str, i64), &LeaderAct> = BTreeMap::new();
    let mut last_checked: BTreeMap<(&str, i64), &LeaderAct> = BTreeMap::new();
    for act in &h.acts {
        let first = first_answered.entry((act.key.as_str(), act.term)).or_insert(act);
        if act.acted_us < first.acted_us {
            *first = act;
        }
        let last = last_checked.entry((act.key.as_str(), act.term)).or_insert(act);
        if act.checked_us > last.checked_us {
            *last = act;
        }
    }
    for (&(key, term), older) in &last_checked {
        if forced.contains(&(key, term)) {
            continue;
        }
        let newer = first_answered
            .range((key, term.saturating_add(1))..=(key, i64::MAX))
            .map(|(_, act)| *act)
            .filter(|newer| older.checked_us > newer.acted_us)
            .min_by_key(|newer| newer.acted_us);
        if let Some(newer) = newer {
            // The older holder's deadline came from a renewal sent at most a ttl before it: a
            // step of the store's clock since then may have ended its period early.
            let ttl_us = i64::try_from(h.meta.ttl_ms).unwrap_or(i64::MAX / 1_000).saturating_mul(1_000);
            if clock_stepped_within(h, older.deadline_us.saturating_sub(ttl_us), older.checked_us) {
                continue;
            }
            out.push(violation(
                h,
                Invariant::S1,
                format!(
                    "key {key}: {} acted with term {term} (checked at {}) after {} had acted with term {} (answered \
                     at {}): two leaders at once, by their own records",
                    older.owner, older.checked_us, newer.owner, newer.term, newer.acted_us
                ),
            ));
        }
    }
    out
}

/// S7: a well-behaved holder (an act its elector said it may do) acts only before its local
/// deadline, and that deadline falls before the store's expiry of its period; every act lies
/// within the store's period of that term, which is the actor's. Where the store's clock stepped
/// during the period, only the first rule holds (the contract: the holder notices the step at its
/// next round trip).
pub fn s7_acts_before_the_deadline_within_the_period(h: &History) -> Vec<Violation> {
    let mut out = Vec::new();
    let periods = periods_by_term(h);
    // Reported once per period and rule, at its first act.
    let mut reported: HashSet<(String, i64, &str)> = HashSet::new();
    let mut report = |out: &mut Vec<Violation>, act: &LeaderAct, rule: &'static str, detail: String| {
        if reported.insert((act.key.clone(), act.term, rule)) {
            out.push(violation(h, Invariant::S7, detail));
        }
    };
    for act in &h.acts {
        let who = format!("{} (key {}, term {})", act.owner, act.key, act.term);
        if act.checked_us > act.deadline_us.saturating_add(CLOCK_READ_TOLERANCE_US) {
            report(
                &mut out,
                act,
                "deadline",
                format!(
                    "{who} acted at {} after its own deadline {}: it was told it leads {} us past the deadline",
                    act.checked_us,
                    act.deadline_us,
                    act.checked_us.saturating_sub(act.deadline_us)
                ),
            );
        }
        let Some(period) = periods.get(&(act.key.as_str(), act.term)) else {
            report(&mut out, act, "period", format!("{who} acted with a term the store's history does not have"));
            continue;
        };
        if period.owner != act.owner {
            report(&mut out, act, "period", format!("{who} acted in a period the store gives to {}", period.owner));
            continue;
        }
        let end = period.ended_at_us.unwrap_or(i64::MAX);
        let span_end = end.min(h.meta.ended_us).max(act.deadline_us).max(act.checked_us);
        if clock_stepped_within(h, period.granted_at_us, span_end) {
            continue;
        }
        if act.acted_us.saturating_add(CLOCK_READ_TOLERANCE_US) < period.granted_at_us {
            report(
                &mut out,
                act,
                "before",
                format!(
                    "{who} acted at {} before the store granted the term at {}",
                    act.acted_us, period.granted_at_us
                ),
            );
        }
        if period.end_reason.as_deref() == Some("force_released") {
            continue;
        }
        if act.checked_us > end.saturating_add(CLOCK_READ_TOLERANCE_US) {
            report(
                &mut out,
                act,
                "after",
                format!(
                    "{who} acted at {} after the store's period ended at {} ({})",
                    act.checked_us,
                    end,
                    period.end_reason.as_deref().unwrap_or("open")
                ),
            );
        }
        if period.end_reason.as_deref() == Some("expired")
            && act.deadline_us > end.saturating_add(CLOCK_READ_TOLERANCE_US)
        {
            report(
                &mut out,
                act,
                "expiry",
                format!(
                    "{who} had a deadline {} that fell {} us after the store's expiry of its period at {}",
                    act.deadline_us,
                    act.deadline_us.saturating_sub(end),
                    end
                ),
            );
        }
    }
    out
}

/// Renewals and acquires of the HTTP lease API as their clients saw them: an ok answer names a
/// period of the store's history whose owner is the caller, and an ok renewal answers the term the
/// caller holds (a renewal that answers ok with another term has extended another period: a
/// client that does not compare terms is told it still leads). Reported as S1: the caller and the
/// store's holder both hold the lease.
pub fn lease_answers_name_the_callers_period(h: &History) -> Vec<Violation> {
    let mut out = Vec::new();
    let periods = periods_by_term(h);
    for call in h.lease_calls.iter().filter(|c| c.status == Some(200) && c.op != "release") {
        let what = format!("{} of {} by {} (sent at {})", call.op, call.key, call.owner, call.sent_us);
        let Some(term) = call.term else {
            out.push(violation(h, Invariant::S1, format!("{what} answered ok without a term")));
            continue;
        };
        match periods.get(&(call.key.as_str(), term)).map(|p| p.owner.as_str()) {
            Some(owner) if owner == call.owner => {}
            Some(owner) => out.push(violation(
                h,
                Invariant::S1,
                format!("{what} answered ok with term {term}, which the store's history gives to {owner}"),
            )),
            None => out.push(violation(
                h,
                Invariant::S1,
                format!("{what} answered ok with term {term}, which the store's history does not have"),
            )),
        }
        if call.op == "renew"
            && let Some(believed) = call.believed_term.filter(|believed| *believed != term)
            && !unanswered_call_may_still_land(h, call)
        {
            out.push(violation(
                h,
                Invariant::S1,
                format!("{what} for term {believed} answered ok with term {term}: it extended another period"),
            ));
        }
    }
    out
}

/// How long after it was sent a call whose outcome the caller never learned (no answer, or a 5xx:
/// a gateway gave up waiting) may still take effect at the store: a link held, or a gateway
/// paused, for up to 2 s delivers it late, and the query then runs. Two and a half times that.
pub const UNANSWERED_CALL_WINDOW_US: i64 = 5_000_000;

/// Whether a call of `call`'s caller sent before it, whose outcome the caller never learned, may
/// have taken effect at the store after its other calls were answered (within
/// [`UNANSWERED_CALL_WINDOW_US`] of `call`): then its answers no longer show what it held.
fn unanswered_call_may_still_land(h: &History, call: &LeaseCall) -> bool {
    h.lease_calls.iter().any(|earlier| {
        earlier.owner == call.owner
            && earlier.key == call.key
            && earlier.op != "release"
            && earlier.sent_us < call.sent_us
            && earlier.sent_us >= call.sent_us.saturating_sub(UNANSWERED_CALL_WINDOW_US)
            && earlier.status.is_none_or(|status| status >= 500)
    })
}

/// S2 for renewals: a period that ended is over. Per caller, an ok renewal of term t is reported
/// when t had certainly ended before it was sent: released by an ok release, or expired (the
/// call before it, by this caller, was answered ok with t and a remaining time that ran out
/// before this one was sent, and no call in between may have extended it). Not where the store's
/// clock stepped in between, nor where an earlier call of the caller whose outcome it never
/// learned may have reached the store late ([`UNANSWERED_CALL_WINDOW_US`]).
pub fn s2_no_renewal_brings_an_ended_period_back(h: &History) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut by_caller: BTreeMap<(&str, &str), Vec<&LeaseCall>> = BTreeMap::new();
    for call in &h.lease_calls {
        by_caller.entry((call.owner.as_str(), call.key.as_str())).or_default().push(call);
    }
    for ((owner, key), mut calls) in by_caller {
        calls.sort_by_key(|c| c.sent_us);
        for (i, call) in calls.iter().enumerate() {
            let (Some(200), "renew", Some(term)) = (call.status, call.op.as_str(), call.term) else { continue };
            // The calls before it, latest first, skipping those that certainly changed nothing.
            let mut earlier = calls[..i].iter().rev().filter(|c| !matches!(c.status, Some(400..=499)));
            let Some(previous) = earlier.next() else { continue };
            if previous.received_us > call.sent_us
                || clock_stepped_within(h, previous.sent_us, call.received_us)
                || unanswered_call_may_still_land(h, call)
            {
                continue;
            }
            let ended = match (previous.op.as_str(), previous.status) {
                ("release", Some(204)) if previous.believed_term == Some(term) => {
                    Some(format!("released by its ok release answered at {}", previous.received_us))
                }
                ("acquire" | "renew", Some(200)) if previous.term == Some(term) => {
                    let expired_by = previous
                        .received_us
                        .saturating_add(previous.remaining_ms.unwrap_or(i64::MAX / 2_000).saturating_mul(1_000));
                    (call.sent_us > expired_by.saturating_add(CLOCK_READ_TOLERANCE_US)).then(|| {
                        format!(
                            "expired by {expired_by} (its {} answered at {} with {} ms remaining)",
                            previous.op,
                            previous.received_us,
                            previous.remaining_ms.unwrap_or_default()
                        )
                    })
                }
                _ => None,
            };
            if let Some(ended) = ended {
                out.push(violation(
                    h,
                    Invariant::S2,
                    format!(
                        "key {key}: a renewal by {owner} sent at {} was answered ok with term {term}, a period that had \
                         ended: {ended}",
                        call.sent_us
                    ),
                ));
            }
        }
    }
    out
}

/// S3: per resource, terms never decrease (a) in the protected table in ticket order, (b) per
/// upstream in the arrival order of complete requests, (c) the checking upstream never had
/// to refuse (409) a token lower than one it had already received complete, and (d) in the
/// clients' own order, across paths: no write on an unbound resource that ended ok with term t
/// was invoked after a write of a higher term on it had ended ok (that one was admitted before
/// it ended, this one after it began). Unbound resources are named the same way on both paths
/// (the racer's lanes); bound ones are S4's.
pub fn s3_terms_never_decrease(h: &History) -> Vec<Violation> {
    let mut out = Vec::new();

    let mut ok_by_resource: BTreeMap<&str, Vec<(&ClientWrite, i64)>> = BTreeMap::new();
    for c in h.clients.iter().filter(|c| c.outcome == Outcome::Ok && !c.bound) {
        if let Some(term) = admitted_term(h, c) {
            ok_by_resource.entry(&c.resource).or_default().push((c, term));
        }
    }
    for (resource, writes) in &ok_by_resource {
        // The earliest end of an ok write of each term, then, per write, any higher term that
        // had ended before it was invoked.
        let mut first_end: BTreeMap<i64, &ClientWrite> = BTreeMap::new();
        for &(c, term) in writes {
            let entry = first_end.entry(term).or_insert(c);
            if c.completed_us < entry.completed_us {
                *entry = c;
            }
        }
        for &(c, term) in writes {
            let earlier = first_end
                .range(term.saturating_add(1)..)
                .map(|(t, w)| (*t, *w))
                .filter(|(_, w)| w.completed_us < c.invoked_us)
                .min_by_key(|(_, w)| w.completed_us);
            if let Some((higher, w)) = earlier {
                out.push(violation(
                    h,
                    Invariant::S3,
                    format!(
                        "resource {resource}: {} ({} via {}) was admitted with term {term}, invoked at {}, after {} \
                         ({} via {}) with term {higher} had been answered ok at {}",
                        c.request_id,
                        c.client,
                        c.path.as_str(),
                        c.invoked_us,
                        w.request_id,
                        w.client,
                        w.path.as_str(),
                        w.completed_us
                    ),
                ));
            }
        }
    }

    let mut rows_by_resource: BTreeMap<&str, Vec<_>> = BTreeMap::new();
    for row in &h.table {
        rows_by_resource.entry(&row.resource).or_default().push(row);
    }
    for (resource, mut rows) in rows_by_resource {
        rows.sort_by_key(|r| r.ticket);
        let mut max: Option<&crate::history::TableRow> = None;
        for row in rows {
            match max {
                Some(m) if row.term < m.term => out.push(violation(
                    h,
                    Invariant::S3,
                    format!(
                        "table, resource {resource}: {} (term {}, ticket {}) committed after {} (term {}, ticket {})",
                        row.request_id, row.term, row.ticket, m.request_id, m.term, m.ticket
                    ),
                )),
                Some(m) if row.term <= m.term => {}
                _ => max = Some(row),
            }
        }
    }

    for ((upstream, resource), mut reqs) in requests_by_upstream_resource(h) {
        reqs.retain(|r| r.complete);
        reqs.sort_by_key(|r| (r.complete_at_us, r.seq));
        let mut max: Option<&UpstreamRequest> = None;
        for r in reqs {
            let Some(token) = r.token else { continue };
            match max {
                Some(m) if m.token.is_some_and(|t| token < t) => {
                    let detail = if r.status == Some(409) {
                        format!(
                            "upstream {upstream}, resource {resource}: refused (409) {} with token {token}, lower than \
                             {} (token {}) complete earlier: the gateway forwarded a stale write",
                            r.request_id,
                            m.request_id,
                            m.token.unwrap_or_default()
                        )
                    } else {
                        format!(
                            "upstream {upstream}, resource {resource}: {} (token {token}, seq {}) complete after {} \
                             (token {}, seq {})",
                            r.request_id,
                            r.seq,
                            m.request_id,
                            m.token.unwrap_or_default(),
                            m.seq
                        )
                    };
                    out.push(violation(h, Invariant::S3, detail));
                }
                Some(m) if m.token.is_some_and(|t| token <= t) => {}
                _ => max = Some(r),
            }
        }
    }
    out
}

fn requests_by_upstream_resource(h: &History) -> BTreeMap<(&str, &str), Vec<&UpstreamRequest>> {
    let mut map: BTreeMap<(&str, &str), Vec<&UpstreamRequest>> = BTreeMap::new();
    for r in &h.upstream {
        if r.token.is_some() {
            map.entry((&r.upstream, &r.resource)).or_default().push(r);
        }
    }
    map
}

/// The term a client write was admitted with: the presented term, or, in stamp mode (or when
/// none was presented), the token its upstream received for it.
fn admitted_term(h: &History, c: &ClientWrite) -> Option<i64> {
    if c.mode != Mode::Stamp
        && let Some(t) = c.term
    {
        return Some(t);
    }
    let upstream = c.upstream.as_deref()?;
    let mine = || h.upstream.iter().filter(|r| r.request_id == c.request_id && r.upstream == upstream);
    mine().find(|r| r.applied()).or_else(|| mine().find(|r| r.complete)).and_then(|r| r.token)
}

/// The first instant a process had been told of each grant (an elector's `elected` event, an ok
/// acquire's answer).
fn grants_told(h: &History) -> HashMap<(&str, i64), i64> {
    let mut told: HashMap<(&str, i64), i64> = HashMap::new();
    let answers = h.elections.iter().filter(|e| e.event == "elected").map(|e| (e.key.as_str(), e.term, e.at_us));
    let acquired = h
        .lease_calls
        .iter()
        .filter(|c| c.op == "acquire" && c.status == Some(200))
        .filter_map(|c| c.term.map(|term| (c.key.as_str(), term, c.received_us)));
    for (key, term, at) in answers.chain(acquired) {
        let first = told.entry((key, term)).or_insert(at);
        *first = (*first).min(at);
    }
    told
}

/// S4: no ok write on a bound resource with term t was invoked after a later term of its key was
/// known to be granted: at the grant margin after the store's grant (how long a grant may take to
/// commit), or, the moment the contract says, at the first instant a process had been told of it
/// (an elector's `elected` event, an ok acquire's answer), whichever came first.
pub fn s4_no_write_after_newer_grant(h: &History, opts: &CheckOptions) -> Vec<Violation> {
    let mut out = Vec::new();
    let by_key = periods_by_key(h);
    let told = grants_told(h);
    for c in &h.clients {
        if c.outcome != Outcome::Ok || !c.bound {
            continue;
        }
        let Some(term) = admitted_term(h, c) else { continue };
        let Some(periods) = by_key.get(c.key.as_str()) else { continue };
        let known = |p: &LeasePeriod| {
            let by_margin = p.granted_at_us.saturating_add(opts.grant_margin_us);
            told.get(&(p.key.as_str(), p.term)).map_or(by_margin, |at| by_margin.min(*at))
        };
        let newer = periods.iter().filter(|p| p.term > term && known(p) <= c.invoked_us).min_by_key(|p| known(p));
        if let Some(p) = newer {
            out.push(violation(
                h,
                Invariant::S4,
                format!(
                    "{} ({}, {} via {}, resource {}) admitted with term {term} although key {} granted term {} \
                     to {} at {} (known granted by {}), {} us before it was invoked at {}",
                    c.request_id,
                    c.client,
                    c.mode.as_str(),
                    c.path.as_str(),
                    c.resource,
                    c.key,
                    p.term,
                    p.owner,
                    p.granted_at_us,
                    known(p),
                    c.invoked_us.saturating_sub(p.granted_at_us),
                    c.invoked_us
                ),
            ));
        }
    }
    out
}

/// S4 for forged and future tokens, and for stamp mode: an ok write on a bound resource was
/// admitted with a term its lease had granted by the time the write ended (a forged or future
/// token is refused, and cannot poison the fence), and in stamp mode with the term of the owner it
/// presented (the gateway stamps only for the lease's holder). Not where the store's clock stepped
/// during the write.
pub fn s4_bound_writes_carry_a_granted_term_of_their_owner(h: &History) -> Vec<Violation> {
    let mut out = Vec::new();
    let periods = periods_by_term(h);
    for c in h.clients.iter().filter(|c| c.outcome == Outcome::Ok && c.bound) {
        let Some(term) = admitted_term(h, c) else { continue };
        let what = format!(
            "{} ({}, {} via {}, resource {})",
            c.request_id,
            c.client,
            c.mode.as_str(),
            c.path.as_str(),
            c.resource
        );
        let Some(period) = periods.get(&(c.key.as_str(), term)) else {
            out.push(violation(
                h,
                Invariant::S4,
                format!("{what} admitted with term {term}, which key {} never granted (a forged token)", c.key),
            ));
            continue;
        };
        if period.granted_at_us > c.completed_us && !clock_stepped_within(h, c.invoked_us, period.granted_at_us) {
            out.push(violation(
                h,
                Invariant::S4,
                format!(
                    "{what} admitted with term {term}, ended at {}, before key {} granted that term at {} (a future token)",
                    c.completed_us, c.key, period.granted_at_us
                ),
            ));
        }
        if c.mode == Mode::Stamp
            && let Some(owner) = c.owner.as_deref()
            && owner != period.owner
        {
            out.push(violation(
                h,
                Invariant::S4,
                format!("{what} presented owner {owner} and was stamped with term {term}, which is {}'s", period.owner),
            ));
        }
    }
    out
}

/// S5: per upstream and resource, no byte (head or chunk, complete or not) of a request arrives
/// more than the tolerance after the head of a request with a higher token. Reported once per
/// late request, against the earliest higher-token head.
pub fn s5_no_lower_byte_after_higher_head(h: &History, opts: &CheckOptions) -> Vec<Violation> {
    let mut out = Vec::new();
    for ((upstream, resource), reqs) in requests_by_upstream_resource(h) {
        for a in &reqs {
            let Some(ta) = a.token else { continue };
            let first_higher = reqs.iter().filter(|b| b.token.is_some_and(|tb| tb > ta)).min_by_key(|b| b.head_at_us);
            let Some(b) = first_higher else { continue };
            let last = a.last_byte_us();
            if last > b.head_at_us.saturating_add(opts.byte_tolerance_us) {
                out.push(violation(
                    h,
                    Invariant::S5,
                    format!(
                        "upstream {upstream}, resource {resource}: {} (token {ta}, seq {}) had a byte at {last}, {} us \
                         after the head of {} (token {}, seq {}) at {}",
                        a.request_id,
                        a.seq,
                        last.saturating_sub(b.head_at_us),
                        b.request_id,
                        b.token.unwrap_or_default(),
                        b.seq,
                        b.head_at_us
                    ),
                ));
            }
        }
    }
    out
}

/// S5: no byte of a forwarded write (head or body piece) arrives at an upstream after the
/// deadline its gateway set for it (`deadlines.jsonl`), beyond the tolerance. Not held against a
/// gateway paused across the deadline (the contract's timing assumption: no pause longer than
/// the margin) for bytes that came no later than the tolerance after it resumed, or against one
/// whose clocks ran at another rate (its deadline in real time is not known; such a gateway
/// admits nothing anyway).
pub fn s5_no_byte_after_the_gateways_deadline(h: &History, opts: &CheckOptions) -> Vec<Violation> {
    let mut by_id: HashMap<&str, Vec<&UpstreamRequest>> = HashMap::new();
    for r in &h.upstream {
        by_id.entry(&r.request_id).or_default().push(r);
    }
    let mut out = Vec::new();
    for d in &h.deadlines {
        let gateway = format!("gateway-{}", d.gateway);
        if h.meta.clock_rates.contains_key(&gateway) {
            continue;
        }
        let allowed = d.deadline_us.saturating_add(opts.deadline_tolerance_us);
        for r in by_id.get(d.request_id.as_str()).into_iter().flatten() {
            let last = r.last_byte_us();
            if last <= allowed {
                continue;
            }
            // Paused from before the gateway had to act (the deadline, give or take the
            // tolerance) until after it, and the byte no later than the tolerance after it resumed.
            let paused = h.faults.iter().any(|f| {
                f.kind.starts_with("sigstop-gateway")
                    && f.target == gateway
                    && f.start_us <= allowed
                    && f.end_us >= d.deadline_us
                    && last <= f.end_us.saturating_add(opts.deadline_tolerance_us)
            });
            if paused {
                continue;
            }
            out.push(violation(
                h,
                Invariant::S5,
                format!(
                    "{} (term {}, through {gateway}): a byte arrived at upstream {} at {last}, {} us after the \
                     gateway's deadline for it ({})",
                    d.request_id,
                    d.term,
                    r.upstream,
                    last.saturating_sub(d.deadline_us),
                    d.deadline_us
                ),
            ));
        }
    }
    out
}

/// Where a request was applied.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Place<'a> {
    Upstream(&'a str),
    Table,
}

impl std::fmt::Display for Place<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Place::Upstream(u) => write!(f, "upstream {u}"),
            Place::Table => f.write_str("table"),
        }
    }
}

fn list(places: &[Place<'_>]) -> String {
    places.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}

/// Exactly once: ok writes are applied exactly once where they were sent, failed writes never,
/// indeterminate ones at most once; nothing is applied twice and nothing unknown is applied.
/// Applied means: complete in an upstream (for the checking upstream, also answered 2xx), or a
/// row of the protected table.
pub fn exactly_once(h: &History) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut applied: BTreeMap<&str, Vec<Place<'_>>> = BTreeMap::new();
    for r in h.upstream.iter().filter(|r| r.applied()) {
        applied.entry(&r.request_id).or_default().push(Place::Upstream(&r.upstream));
    }
    for row in &h.table {
        applied.entry(&row.request_id).or_default().push(Place::Table);
    }
    let clients: HashMap<&str, &ClientWrite> = h.clients.iter().map(|c| (c.request_id.as_str(), c)).collect();

    let mut twice = HashSet::new();
    for (id, places) in &applied {
        let who = clients.get(id).map_or("unknown", |c| c.outcome.as_str());
        if !clients.contains_key(id) {
            out.push(violation(h, Invariant::Once, format!("unknown write {id} applied at {}", list(places))));
        } else if places.len() > 1 {
            twice.insert(*id);
            out.push(violation(
                h,
                Invariant::Once,
                format!("{id} ({who}) applied {} times: {}", places.len(), list(places)),
            ));
        }
    }

    for c in &h.clients {
        let id = c.request_id.as_str();
        let places = applied.get(id).map_or(&[][..], Vec::as_slice);
        let expected = match c.path {
            WritePath::Gateway => Place::Upstream(c.upstream.as_deref().unwrap_or_default()),
            WritePath::Sql => Place::Table,
        };
        match c.outcome {
            Outcome::Ok => {
                if twice.contains(id) {
                    continue;
                }
                let complete_there = match &expected {
                    Place::Upstream(u) => {
                        h.upstream.iter().filter(|r| r.request_id == id && r.upstream == *u && r.complete).count()
                    }
                    Place::Table => places.len(),
                };
                if places.is_empty() {
                    out.push(violation(
                        h,
                        Invariant::Once,
                        format!("{id} ({}) ok but never applied at {expected}", c.client),
                    ));
                } else if places[0] != expected {
                    out.push(violation(
                        h,
                        Invariant::Once,
                        format!("{id} ({}) ok at {expected} but applied at {}", c.client, list(places)),
                    ));
                } else if complete_there != 1 {
                    out.push(violation(
                        h,
                        Invariant::Once,
                        format!("{id} ({}) ok but complete {complete_there} times at {expected}", c.client),
                    ));
                }
            }
            Outcome::Failed => {
                let refused_by_upstream = c.refused_by.as_deref() == Some("upstream");
                let mut seen: Vec<String> = h
                    .upstream
                    .iter()
                    .filter(|r| r.request_id == id && r.complete)
                    .filter(|r| !(refused_by_upstream && r.upstream == CHECKING_UPSTREAM && r.status == Some(409)))
                    .map(|r| {
                        format!(
                            "upstream {} (status {})",
                            r.upstream,
                            r.status.map_or("none".into(), |s| s.to_string())
                        )
                    })
                    .collect();
                seen.extend(places.iter().filter(|p| **p == Place::Table).map(ToString::to_string));
                if !seen.is_empty() {
                    out.push(violation(
                        h,
                        Invariant::Once,
                        format!(
                            "{id} ({}) failed (refused by {}) but reached {}",
                            c.client,
                            c.refused_by.as_deref().unwrap_or("none"),
                            seen.join(", ")
                        ),
                    ));
                }
            }
            Outcome::Indeterminate => {}
        }
    }
    out
}

/// The bound within which writes must recover after the last fault: `2 * ttl + 5 s`.
pub fn recovery_bound_us(h: &History) -> i64 {
    i64::try_from(h.meta.ttl_ms).unwrap_or(i64::MAX / 4_000).saturating_mul(2_000).saturating_add(5_000_000)
}

/// Recovery: writes that need a live leader flow again on every path after the last fault.
/// For each path (through a gateway, straight into the table) on which the schedule had any ok
/// write to a bound resource, the first ok such write completing at or after `quiet_from_us`;
/// the delay is the latest of those, and each path without one within [`recovery_bound_us`] is
/// a violation. Writes to unbound resources do not count: any term is taken there, so they flow
/// without a leader.
pub fn recovery(h: &History) -> (Option<i64>, Vec<Violation>) {
    let quiet = h.meta.quiet_from_us;
    let bound = recovery_bound_us(h);
    let ok = |path: WritePath| h.clients.iter().filter(move |c| c.outcome == Outcome::Ok && c.bound && c.path == path);
    let mut paths: Vec<WritePath> =
        [WritePath::Gateway, WritePath::Sql].into_iter().filter(|&p| ok(p).next().is_some()).collect();
    if paths.is_empty() {
        // No ok write that needed a leader in the whole schedule: writes never flowed.
        paths.push(WritePath::Gateway);
    }
    let mut out = Vec::new();
    // Each path's delay; the schedule's is the latest, and none when a path never recovered.
    let mut delays = Vec::new();
    for path in paths {
        let name = path.as_str();
        let first = ok(path).filter(|c| c.completed_us >= quiet).min_by_key(|c| c.completed_us);
        let detail = match first {
            Some(c) => {
                let took = c.completed_us.saturating_sub(quiet);
                delays.push(Some(took));
                (took > bound).then(|| {
                    format!(
                        "first ok {name} write after the last fault ({}, completed at {}) took {took} us, more than \
                         the bound {bound} us",
                        c.request_id, c.completed_us
                    )
                })
            }
            None => {
                delays.push(None);
                Some(if h.meta.ended_us >= quiet.saturating_add(bound) {
                    format!(
                        "no ok {name} write to a bound resource within {bound} us after the last fault ended at {quiet}"
                    )
                } else {
                    format!(
                        "schedule ended before {name} writes recovered: ended at {}, {} us after the last fault, no \
                         ok {name} write since",
                        h.meta.ended_us,
                        h.meta.ended_us.saturating_sub(quiet)
                    )
                })
            }
        };
        out.extend(detail.map(|detail| violation(h, Invariant::Recovery, detail)));
    }
    let delay = delays.into_iter().try_fold(0, |latest: i64, delay| delay.map(|d| latest.max(d)));
    (delay, out)
}

/// The fenced log (`log`): per stream, the entries the store kept are numbered 1..n without a
/// gap, in terms that never decrease; each is an append a leader made, with the term it
/// presented, at most once, and never one that was refused (`failed`); every append answered ok
/// is there at the sequence it was answered with; and none was admitted with a term t although
/// it was invoked after a newer term of its key was known to be granted (S4 for streams, with the
/// grant margin of [`s4_no_write_after_newer_grant`]).
pub fn log_holds_the_admitted_appends(h: &History, opts: &CheckOptions) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut streams: BTreeMap<&str, Vec<&crate::history::LogEntry>> = BTreeMap::new();
    for entry in &h.log {
        streams.entry(entry.stream.as_str()).or_default().push(entry);
    }
    let appends: HashMap<&str, &crate::history::Append> =
        h.appends.iter().map(|append| (append.request_id.as_str(), append)).collect();
    let by_key = periods_by_key(h);
    let told = grants_told(h);
    let mut seen: HashMap<&str, i64> = HashMap::new();
    for (stream, mut entries) in streams {
        entries.sort_by_key(|entry| entry.seq);
        for (index, entry) in entries.iter().enumerate() {
            let expected = i64::try_from(index).unwrap_or(i64::MAX).saturating_add(1);
            if entry.seq != expected {
                out.push(violation(
                    h,
                    Invariant::Log,
                    format!(
                        "stream {stream}: entry {} where {expected} was due (a gap, or a number given twice)",
                        entry.seq
                    ),
                ));
                break;
            }
        }
        for pair in entries.windows(2) {
            if pair[1].term < pair[0].term {
                out.push(violation(
                    h,
                    Invariant::Log,
                    format!(
                        "stream {stream}: entry {} of term {} after entry {} of term {}",
                        pair[1].seq, pair[1].term, pair[0].seq, pair[0].term
                    ),
                ));
            }
        }
        for entry in &entries {
            let Some(id) = entry.request_id.as_deref() else {
                out.push(violation(
                    h,
                    Invariant::Log,
                    format!("stream {stream}: entry {} has no request_id", entry.seq),
                ));
                continue;
            };
            if let Some(first) = seen.insert(id, entry.seq) {
                out.push(violation(
                    h,
                    Invariant::Log,
                    format!("stream {stream}: append {id} is in the log twice, at {first} and {}", entry.seq),
                ));
            }
            let Some(append) = appends.get(id) else {
                out.push(violation(
                    h,
                    Invariant::Log,
                    format!("stream {stream}: entry {} ({id}) is no append a leader made", entry.seq),
                ));
                continue;
            };
            if append.term != entry.term {
                out.push(violation(
                    h,
                    Invariant::Log,
                    format!(
                        "stream {stream}: entry {} ({id}) has term {} but was appended with {}",
                        entry.seq, entry.term, append.term
                    ),
                ));
            }
            if append.outcome == Outcome::Failed {
                out.push(violation(
                    h,
                    Invariant::Log,
                    format!(
                        "stream {stream}: entry {} is append {id} of {} with term {}, which was refused ({})",
                        entry.seq,
                        append.client,
                        append.term,
                        append.error.as_deref().unwrap_or("no error recorded")
                    ),
                ));
            }
            let Some(periods) = by_key.get(append.key.as_str()) else { continue };
            // Its own period had ended (expired, released) before the append was invoked: a
            // lease not held admits no append, newer term or not. Not across a step of the
            // store's clock between the end and the admission (its expiry is a projection on
            // that clock, and a step back makes it live again): the admission is at the latest
            // the append's answer, or the history's end for an append whose answer never came.
            let admitted_by = match append.outcome {
                Outcome::Ok | Outcome::Failed => append.completed_us,
                Outcome::Indeterminate => h.meta.ended_us.max(append.completed_us),
            };
            if let Some(own) = periods.iter().find(|p| p.term == entry.term)
                && let Some(end) = own.ended_at_us
                && append.invoked_us > end.saturating_add(opts.grant_margin_us)
                && !clock_stepped_within(h, end, admitted_by)
            {
                out.push(violation(
                    h,
                    Invariant::Log,
                    format!(
                        "stream {stream}: entry {} ({id} of {}) admitted with term {}, whose period ended at {end} ({}), \
                         before the append was invoked at {}",
                        entry.seq,
                        append.client,
                        entry.term,
                        own.end_reason.as_deref().unwrap_or("ended"),
                        append.invoked_us
                    ),
                ));
            }
            let known = |p: &LeasePeriod| {
                let by_margin = p.granted_at_us.saturating_add(opts.grant_margin_us);
                told.get(&(p.key.as_str(), p.term)).map_or(by_margin, |at| by_margin.min(*at))
            };
            let newer = periods
                .iter()
                .filter(|p| p.term > entry.term && known(p) <= append.invoked_us)
                .min_by_key(|p| known(p));
            if let Some(p) = newer {
                out.push(violation(
                    h,
                    Invariant::Log,
                    format!(
                        "stream {stream}: entry {} ({id} of {}) admitted with term {} although key {} granted term {} to {} \
                         (known granted by {}), before the append was invoked at {}",
                        entry.seq,
                        append.client,
                        entry.term,
                        append.key,
                        p.term,
                        p.owner,
                        known(p),
                        append.invoked_us
                    ),
                ));
            }
        }
    }
    for append in h.appends.iter().filter(|append| append.outcome == Outcome::Ok) {
        let kept = h.log.iter().find(|entry| entry.request_id.as_deref() == Some(append.request_id.as_str()));
        match kept {
            None => out.push(violation(
                h,
                Invariant::Log,
                format!(
                    "append {} of {} (term {}) was answered ok with seq {:?}, and the log does not have it",
                    append.request_id, append.client, append.term, append.seq
                ),
            )),
            Some(entry) if Some(entry.seq) != append.seq => out.push(violation(
                h,
                Invariant::Log,
                format!(
                    "append {} was answered with seq {:?}, and the log has it at {}",
                    append.request_id, append.seq, entry.seq
                ),
            )),
            Some(_) => {}
        }
    }
    out
}

/// The followers (`log`): each follower applies entries of the log as the store kept them (the
/// same sequence, term and payload), never past one it has not applied (a follower's distinct
/// applied sequences are a prefix 1..m of the log at every moment), and so never a refused or
/// lost append. Applying an entry again (at least once, after a restart) is allowed.
pub fn followers_apply_a_prefix_of_the_log(h: &History) -> Vec<Violation> {
    let mut out = Vec::new();
    let log: HashMap<(&str, i64), &crate::history::LogEntry> =
        h.log.iter().map(|entry| ((entry.stream.as_str(), entry.seq), entry)).collect();
    // The highest entry each follower applied, and the last one each of its processes applied:
    // a process goes on from its own last entry (or applies one again, after its cursor went
    // back), and a new process from at most the highest entry any process applied.
    let mut applied_up_to: HashMap<(&str, &str), i64> = HashMap::new();
    let mut last_of_process: HashMap<(&str, &str, u32), i64> = HashMap::new();
    for applied in &h.applied {
        let (stream, follower) = (applied.stream.as_str(), applied.follower.as_str());
        let up_to = applied_up_to.entry((stream, follower)).or_insert(0);
        let after = last_of_process.get(&(stream, follower, applied.pid)).copied().unwrap_or(*up_to);
        if applied.seq > after + 1 {
            out.push(violation(
                h,
                Invariant::Log,
                format!(
                    "follower {follower} (pid {}) of stream {stream} applied entry {} after {after}: it skipped {} entries",
                    applied.pid,
                    applied.seq,
                    applied.seq - after - 1
                ),
            ));
        }
        *up_to = (*up_to).max(applied.seq);
        last_of_process.insert((stream, follower, applied.pid), applied.seq);
        match log.get(&(stream, applied.seq)) {
            None => out.push(violation(
                h,
                Invariant::Log,
                format!(
                    "follower {follower} (pid {}) of stream {stream} applied entry {} ({:?}, term {}), which the log \
                     does not have",
                    applied.pid, applied.seq, applied.request_id, applied.term
                ),
            )),
            Some(entry) if entry.term != applied.term || entry.request_id != applied.request_id => {
                out.push(violation(
                    h,
                    Invariant::Log,
                    format!(
                        "follower {follower} (pid {}) of stream {stream} applied entry {} as {:?} of term {}; the log \
                         has {:?} of term {}",
                        applied.pid, applied.seq, applied.request_id, applied.term, entry.request_id, entry.term
                    ),
                ));
            }
            Some(_) => {}
        }
    }
    out
}
