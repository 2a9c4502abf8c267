//! The rules: each function takes a schedule's [`History`] and returns the violations it finds.
//!
//! Every rule reads the recorded facts only; nothing here knows how the product works beyond the
//! contract's invariants (S1-S5), exactly-once application and recovery after the last fault.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::history::{CHECKING_UPSTREAM, ClientWrite, History, LeasePeriod, Mode, Outcome, UpstreamRequest, WritePath};
use crate::report::{Invariant, Violation};

/// Tunables of the rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckOptions {
    /// S4: how long a grant may take to commit, in microseconds: a write invoked less than this
    /// after a newer grant is not held against the gateway.
    pub grant_margin_us: i64,
    /// S5: how late, in microseconds, a lower-term byte may arrive after a higher-term head.
    pub byte_tolerance_us: i64,
}

impl Default for CheckOptions {
    fn default() -> Self {
        CheckOptions { grant_margin_us: 100_000, byte_tolerance_us: 0 }
    }
}

/// All rules over one history, in invariant order.
pub fn check_history(h: &History, opts: &CheckOptions) -> Vec<Violation> {
    let mut out = Vec::new();
    out.extend(s1_periods_do_not_overlap(h));
    out.extend(s2_terms_grow_by_one(h));
    out.extend(s2_every_believed_period_is_the_stores(h));
    out.extend(s3_terms_never_decrease(h));
    out.extend(s4_no_write_after_newer_grant(h, opts));
    out.extend(s5_no_lower_byte_after_higher_head(h, opts));
    out.extend(exactly_once(h));
    out.extend(recovery(h).1);
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

/// S4: no ok write on a bound resource with term t was invoked at least the grant margin after
/// a later term of its key had been granted.
pub fn s4_no_write_after_newer_grant(h: &History, opts: &CheckOptions) -> Vec<Violation> {
    let mut out = Vec::new();
    let by_key = periods_by_key(h);
    for c in &h.clients {
        if c.outcome != Outcome::Ok || !c.bound {
            continue;
        }
        let Some(term) = admitted_term(h, c) else { continue };
        let Some(periods) = by_key.get(c.key.as_str()) else { continue };
        let newer = periods
            .iter()
            .filter(|p| p.term > term && p.granted_at_us <= c.invoked_us.saturating_sub(opts.grant_margin_us))
            .min_by_key(|p| p.granted_at_us);
        if let Some(p) = newer {
            out.push(violation(
                h,
                Invariant::S4,
                format!(
                    "{} ({}, {} via {}, resource {}) admitted with term {term} although key {} granted term {} \
                     to {} at {}, {} us before it was invoked at {}",
                    c.request_id,
                    c.client,
                    c.mode.as_str(),
                    c.path.as_str(),
                    c.resource,
                    c.key,
                    p.term,
                    p.owner,
                    p.granted_at_us,
                    c.invoked_us.saturating_sub(p.granted_at_us),
                    c.invoked_us
                ),
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
