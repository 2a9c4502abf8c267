//! A path of the model as a readable, numbered history: one line per step, saying who did what
//! and what came of it, with the clocks where they matter.

use std::fmt::Write as _;

use crate::config::{Config, MAX_CALLS};
use crate::protocol::{Action, Invariant};
use crate::state::{Admin, Answer, Binding, Call, LeaseStage, SqlStage, Stage, State};

/// The numbered history of `steps` (each a state and the action taken from it), and at the end
/// the invariants the last state violates.
pub fn render(config: &Config, steps: &[(State, Action, State)]) -> String {
    let mut out = String::new();
    if let Some((first, _, _)) = steps.first() {
        let _ = writeln!(out, "0. start: time 0, {}", tables(config, first));
    }
    for (n, (before, action, after)) in steps.iter().enumerate() {
        let _ = writeln!(out, "{}. {}", n + 1, describe(config, before, *action, after));
    }
    if let Some((_, _, last)) = steps.last() {
        let violated: Vec<&str> = Invariant::ALL.iter().filter(|i| i.violated(&last.ghost)).map(|i| i.name()).collect();
        let _ = writeln!(out, "violated: {}", violated.join(", "));
    }
    out
}

fn gateway(g: u8) -> String {
    format!("gateway-{}", g + 1)
}

fn elector(e: u8) -> String {
    format!("elector-{}", e + 1)
}

/// The store's tables, briefly.
fn tables(config: &Config, s: &State) -> String {
    let lease = &s.tables.lease;
    let mut out = if lease.term == 0 {
        "lease k: none".to_owned()
    } else {
        format!(
            "lease k: term {} held by {} until wall {}",
            lease.term,
            lease.owner.map_or_else(|| "nobody".to_owned(), elector),
            lease.expires
        )
    };
    for r in 0..config.resources() {
        let name = config.resource_name(r);
        match s.tables.fences[r] {
            None => {
                let _ = write!(out, "; {name}: no fence");
            }
            Some(f) => {
                let _ = write!(out, "; {name}: max {}", f.max_term);
                match f.binding {
                    Binding::Lease if !config.bound(r) => out.push_str(" bound to k"),
                    Binding::Unbound if config.bound(r) => out.push_str(" unbound"),
                    Binding::Other => out.push_str(" bound to k2"),
                    _ => {}
                }
                if let Some(settle) = f.settle {
                    let _ = write!(out, " settle {settle}");
                }
                if let Some(drain) = f.drain {
                    let _ = write!(out, " drain {drain}");
                }
                if f.grant > 0 {
                    let _ = write!(out, " grant {}", f.grant);
                }
            }
        }
    }
    out
}

fn answer(answer: Answer) -> String {
    match answer {
        Answer::Admitted { wait, grant: 0, .. } => format!("admitted, wait {wait}"),
        Answer::Admitted { wait, grant, .. } => format!("admitted, wait {wait}, grant {grant}"),
        Answer::Refused { max } => format!("refused (fence at {max})"),
        Answer::Failed => "failed (the fence kept changing)".to_owned(),
    }
}

fn call_of(s: &State, g: u8, c: u8) -> Option<Call> {
    let gateway = s.gateways.get(usize::from(g))?;
    if usize::from(c) == MAX_CALLS { gateway.orphan } else { gateway.calls.get(usize::from(c)).copied().flatten() }
}

/// What `action` from `before` did, ending in `after`.
pub fn describe(config: &Config, before: &State, action: Action, after: &State) -> String {
    let clocks = |s: &State| format!("time {}, store wall {}", s.now, s.wall());
    let resource = |r: u8| config.resource_name(usize::from(r));
    let mut line = match action {
        Action::Tick => format!("tick: {}", clocks(after)),
        Action::TickDrift { gateway: g, slow } => format!(
            "tick: {}; {}'s boot clock {} (boot {})",
            clocks(after),
            gateway(g),
            if slow { "stands still" } else { "counts two ticks" },
            after.boot(usize::from(g))
        ),
        Action::StepClock { forward } => {
            format!("the store's wall clock steps {}: {}", if forward { "forward" } else { "back" }, clocks(after))
        }
        Action::Crash => format!("the store crashes and restarts with what was flushed: {}", tables(config, after)),
        Action::Flush => "the store flushes its commits".to_owned(),
        Action::ElectorAcquire(e) => format!("{} asks fencing.acquire (new period) at {}", elector(e), clocks(after)),
        Action::ElectorRenew(e) => format!("{} asks fencing.renew at {}", elector(e), clocks(after)),
        Action::ElectorRelease(e) => format!("{} stops leading and asks fencing.release", elector(e)),
        Action::ElectorLost(e) => format!("{}'s call is lost on its way", elector(e)),
        Action::StoreAcquire { elector: e, lost }
        | Action::StoreAcquireWakes { elector: e, lost }
        | Action::StoreRenew { elector: e, lost }
        | Action::StoreRelease { elector: e, lost } => {
            let name = match action {
                Action::StoreAcquire { .. } => "fencing.acquire runs",
                Action::StoreAcquireWakes { .. } => "fencing.acquire wakes",
                Action::StoreRenew { .. } => "fencing.renew runs",
                _ => "fencing.release runs",
            };
            let ei = usize::from(e);
            let stage = after.electors[ei].call.map(|c| c.stage);
            let (was, led) = (before.electors[ei].leading, after.electors[ei].leading);
            let outcome = match (stage, led) {
                (Some(LeaseStage::Sleeping { until, slept }), _) => {
                    format!("holds the lease row, sleeps {slept} (until time {until}) for the old term's grants")
                }
                _ if lost => format!("answered, the answer is lost [{}]", tables(config, after)),
                (_, Some((term, deadline))) if was != led => format!(
                    "ok: {} leads with term {term} until boot {deadline} [{}]",
                    elector(e),
                    tables(config, after)
                ),
                (_, None) if was.is_some() => {
                    format!("refused: {} steps down [{}]", elector(e), tables(config, after))
                }
                _ => format!("answered [{}]", tables(config, after)),
            };
            format!("{name} for {} at {}: {outcome}", elector(e), clocks(after))
        }
        Action::GatewayDecide { gateway: g, resource: r, term } => {
            let gi = usize::from(g);
            let boot = after.boot(gi);
            let local = after.gateways[gi].writes.iter().flatten().count()
                > before.gateways[gi].writes.iter().flatten().count();
            if local {
                let grant = before.gateways[gi].grants[usize::from(r)]
                    .or(before.gateways[gi].lease_grant)
                    .or(before.gateways[gi].ns_grant)
                    .map_or(0, |grant| grant.deadline);
                format!(
                    "{} decides write of term {term} on {} at boot {boot}: admitted under its grant (until boot {grant})",
                    gateway(g),
                    resource(r)
                )
            } else {
                format!("{} asks fencing.gate for a write of term {term} on {} at boot {boot}", gateway(g), resource(r))
            }
        }
        Action::GatewayStampWrite { gateway: g, resource: r, owner } => {
            let gi = usize::from(g);
            let boot = after.boot(gi);
            let local = after.gateways[gi].writes.iter().flatten().count()
                > before.gateways[gi].writes.iter().flatten().count();
            if local {
                format!(
                    "{} decides a stamp-mode write of {} on {} at boot {boot}: admitted under the grant it keeps for that owner",
                    gateway(g),
                    elector(owner),
                    resource(r)
                )
            } else {
                format!(
                    "{} asks fencing.gate_lease for a stamp-mode write of {} on {} at boot {boot}",
                    gateway(g),
                    elector(owner),
                    resource(r)
                )
            }
        }
        Action::GateAbort { gateway: g, call: c } => {
            let what = call_of(before, g, c)
                .map_or_else(String::new, |call| format!(" (term {} on {})", call.term, resource(call.resource)));
            format!("{}'s batch rolls back: its decision{what} fails, nothing it wrote is kept", gateway(g))
        }
        Action::GatewayLost { gateway: g, call: c } => {
            let what = call_of(before, g, c)
                .map_or_else(String::new, |call| format!(" (term {} on {})", call.term, resource(call.resource)));
            format!("{}'s decision{what} is lost on its way", gateway(g))
        }
        Action::GateStamp { gateway: g, call: c, lost }
        | Action::GateRead { gateway: g, call: c, lost }
        | Action::GateGrant { gateway: g, call: c, lost }
        | Action::GateLock { gateway: g, call: c, lost }
        | Action::GateWakes { gateway: g, call: c, lost }
        | Action::GateCommit { gateway: g, call: c, lost } => {
            let Some(call) = call_of(before, g, c) else { return format!("{action:?}") };
            let step = match action {
                Action::GateStamp { .. } => "reads the lease (fencing.gate_lease)",
                Action::GateRead { .. } => "reads the fence",
                Action::GateGrant { .. } => "takes the grant locks",
                Action::GateLock { .. } => "locks the fence row to raise it",
                Action::GateCommit { .. } => "commits with its batch",
                _ => "wakes from await_grants",
            };
            let gi = usize::from(g);
            let orphan = usize::from(c) == MAX_CALLS;
            let next = after.gateways[gi]
                .calls
                .iter()
                .flatten()
                .chain(after.gateways[gi].orphan.iter().filter(|_| orphan))
                .find(|n| n.resource == call.resource && n.owner == call.owner && n.asked == call.asked);
            let outcome = match next.map(|n| n.stage) {
                Some(Stage::ReadGrant { .. }) => "current term, a grant is asked: grant statements next".to_owned(),
                Some(Stage::ReadRaise { .. }) => "a higher term: the raise next".to_owned(),
                Some(Stage::Raising { until }) => format!("holds the row, sleeps out the grants until {until}"),
                Some(Stage::Asked { .. }) if call.stage == Stage::Stamp => {
                    format!("stamped with the lease's term {}", next.map_or(0, |n| n.term))
                }
                Some(Stage::Asked { .. }) => "the version changed: decides again".to_owned(),
                Some(Stage::Stamp) => "not yet stamped".to_owned(),
                Some(Stage::Answered(a)) => answer(a),
                Some(Stage::Holding { answer: a, .. }) => {
                    format!("{}, held uncommitted until its batch commits", answer(a))
                }
                None if lost => "answered; the answer is lost".to_owned(),
                None if orphan => "answered; nobody waits for the answer (its gateway gave up)".to_owned(),
                None => received(config, before, after, gi, call),
            };
            format!(
                "fencing.gate for {} (term {} on {}, asked at boot {}) {step}: {outcome} [{}; {}]",
                gateway(g),
                call.term,
                resource(call.resource),
                call.asked,
                clocks(after),
                tables(config, after)
            )
        }
        Action::GatewayCheck { gateway: g, write: w } | Action::GatewaySend { gateway: g, write: w } => {
            let gi = usize::from(g);
            let Some(write) = before.gateways[gi].writes[usize::from(w)] else {
                return format!("{action:?}");
            };
            let verb = match action {
                Action::GatewayCheck { .. } => "checks the settle and deadline of",
                _ if config.pause_assumption => "checks and sends to the upstream",
                _ => "sends to the upstream",
            };
            format!(
                "{} {verb} the write of term {} on {} [boot {}, start {}, deadline {}]",
                gateway(g),
                write.term,
                resource(write.resource),
                before.boot(gi),
                write.start,
                write.deadline
            )
        }
        Action::GatewayGaveUp { gateway: g, call: c } => {
            let what = call_of(before, g, c)
                .map_or_else(String::new, |call| format!(" (term {} on {})", call.term, resource(call.resource)));
            format!("{} gives up on its decision{what}; the store may still run it", gateway(g))
        }
        Action::ElectorGaveUp(e) => format!("{} gives up on its call; the store may still run it", elector(e)),
        Action::StoreOrphan { elector: e } => {
            format!("the store runs the call {} gave up on: {}", elector(e), tables(config, after))
        }
        Action::SqlAdmit { resource: r, term } => {
            let outcome = match after.sql {
                Some(tx) if matches!(tx.stage, SqlStage::Read { raise: true }) => "a higher term: the row lock next",
                Some(_) => "its own term: the row lock next",
                None => "refused",
            };
            format!("the SQL writer begins, fencing.admit of term {term} on {} reads: {outcome}", resource(r))
        }
        Action::SqlLock | Action::SqlWakes => {
            let (Some(tx), verb) =
                (before.sql, if action == Action::SqlLock { "locks the row" } else { "wakes from the grant wait" })
            else {
                return format!("{action:?}");
            };
            let outcome = match after.sql.map(|tx| tx.stage) {
                Some(SqlStage::Holding { raised: false }) => "admitted, holding the row FOR KEY SHARE".to_owned(),
                Some(SqlStage::Holding { raised: true }) => "raised, holding the row FOR UPDATE".to_owned(),
                Some(SqlStage::Raising { until }) => format!("asleep in fencing.await_grants until time {until}"),
                _ => "refused".to_owned(),
            };
            format!(
                "the SQL writer's fencing.try_admit (term {} on {}) {verb}: {outcome} [{}]",
                tx.term,
                resource(tx.resource),
                tables(config, after)
            )
        }
        Action::SqlCommit => format!("the SQL writer writes its row and commits [{}]", tables(config, after)),
        Action::AdminRuns(admin) => {
            let what = match admin {
                Admin::Advance { resource: r, term } => format!("fencing.advance_fence({}, {term})", resource(r)),
                Admin::Bind { resource: r } => format!("fencing.bind({}, k)", resource(r)),
                Admin::Rebind { resource: r } => format!("fencing.rebind({}, k2)", resource(r)),
                Admin::ForceRelease => "fencing.force_release(k)".to_owned(),
            };
            let outcome = match after.admin {
                Some(tx) => format!("holds the row, sleeps out the grants until time {}", tx.until),
                None if before.tables == after.tables => "refused".to_owned(),
                None => "done".to_owned(),
            };
            format!("an operator runs {what}: {outcome} [{}; {}]", clocks(after), tables(config, after))
        }
        Action::AdminWakes => {
            format!("the admin action wakes and commits [{}; {}]", clocks(after), tables(config, after))
        }
    };
    for invariant in Invariant::ALL {
        if invariant.violated(&after.ghost) && !invariant.violated(&before.ghost) {
            let _ = write!(line, "  <-- violates {}", invariant.name());
        }
    }
    line
}

/// What gateway `g` made of the answer to `call`: its write, its grant, or the refusal.
fn received(config: &Config, before: &State, after: &State, g: usize, call: Call) -> String {
    let gw = &after.gateways[g];
    let old = &before.gateways[g];
    let r = usize::from(call.resource);
    let new_write = gw
        .writes
        .iter()
        .flatten()
        .find(|w| w.resource == call.resource && w.term == call.term && !old.writes.contains(&Some(**w)));
    let grant = gw.grants[r].or(gw.lease_grant).or(gw.ns_grant).filter(|gr| gr.term == call.term);
    let new_grant =
        grant.filter(|gr| Some(*gr) != old.grants[r] && Some(*gr) != old.lease_grant && Some(*gr) != old.ns_grant);
    let admitted = after.ghost.admitted[r] >= call.term && (new_write.is_some() || new_grant.is_some());
    let mut text = match new_write {
        Some(w) => format!("admitted; the write may be sent from boot {} until before boot {}", w.start, w.deadline),
        None if admitted => "admitted".to_owned(),
        None => format!(
            "refused, or admitted with no write waiting ({} at max {})",
            config.resource_name(r),
            after.tables.fences[r].map_or(0, |f| f.max_term)
        ),
    };
    if let Some(grant) = new_grant {
        let _ = write!(text, "; grant until boot {}", grant.deadline);
    }
    text
}
