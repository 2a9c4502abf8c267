//! The model checked: the correct protocol satisfies S1-S5 exhaustively within its bounds, each
//! planted bug is found with a shortest counterexample (printed as a history), and every piece of
//! code a transition mirrors still exists.
#![allow(clippy::unwrap_used)]

use fencing_model::mirrors::{GATEWAY_ANSWER, Mirror, mirrors};
use fencing_model::protocol::ActionKind;
use fencing_model::{Action, Config, Invariant, Plant, Protocol, Witness, check, history};
use stateright::Model;

/// Checks that `config` satisfies S1-S5 and S7 and that every one of `must_reach` happens in some
/// explored state (so the check cannot silently stop exercising what it is meant to).
fn holds(name: &str, config: Config, must_reach: &[Witness]) {
    // A check that must prove explores one state per renaming (gateways, electors, two bound
    // resources): the same verdict in a fraction of the states (see
    // `the_symmetry_reduction_finds_what_the_full_search_finds`).
    let config = Config { symmetry: true, ..config };
    let report = check(config, false);
    println!("{name}: {}; reached: {:?}", report.summary(), report.reached);
    for (property, steps) in &report.violations {
        println!("{property}: {} steps\n{}", steps.len(), history::render(&config, steps));
    }
    assert!(report.violations.is_empty(), "{name}: the protocol violates an invariant");
    let unreached: Vec<&str> =
        must_reach.iter().map(|w| w.name()).filter(|name| !report.reached.contains(name)).collect();
    assert!(unreached.is_empty(), "{name}: the check no longer reaches {unreached:?}");
}

#[test]
fn s1_to_s5_hold_with_grants_off() {
    holds("grants off", Config::standard(false), &[]);
}

/// The sizes issue 29 asks for: two resources on the one bound lease (`r1`, `r2`) and one of an
/// unbound route (`f1`), grants off and on.
#[test]
fn s1_to_s5_hold_with_two_resources_on_the_lease() {
    holds("two bound resources, grants off", Config { bound_resources: 2, ..Config::standard(false) }, &[]);
    holds(
        "two bound resources, grants on",
        Config { bound_resources: 2, ..Config::standard(true) },
        &[Witness::AcquireSleptOutGrants],
    );
}

/// Both resources, grants on: grants are given, recorded and slept out by a new term of the
/// lease, but with two writes none is admitted under a grant (the first write on a resource
/// gets none, the second one gets it); the next check covers that.
#[test]
fn s1_to_s5_hold_with_grants_on() {
    holds("grants on", Config::standard(true), &[Witness::AcquireSleptOutGrants]);
}

/// The bound resource alone, grants on, four writes: writes admitted under a grant, and a new
/// term of the lease that sleeps out the grants and starts within the horizon.
#[test]
fn s1_to_s5_hold_with_grant_admissions_on_a_bound_resource() {
    holds("grants on, r1", Config::bound_grants(), &[Witness::GrantAdmission, Witness::AcquireSleptOutGrants]);
}

/// The bound resource alone, three elector calls, three writes, forged terms: the lease moves on
/// twice, so a raise that waited for the fence row may find a newer term granted meanwhile (the
/// S4 bug the model found, `raise-skips-lease-check`, shows in this configuration).
#[test]
fn s1_to_s5_hold_when_the_lease_moves_on_during_a_raise() {
    holds("three elector calls, r1", Config::lease_moves_on(), &[Witness::RaiseRefusedByNewerLease]);
}

/// Callers that give up on a call (their timeouts) while the store still runs it later, after
/// the caller's next call: a gateway's decision, an elector's acquire or renewal (a delayed
/// duplicate, as after a retry).
#[test]
fn s1_to_s5_hold_when_the_store_runs_calls_their_callers_gave_up_on() {
    holds("given up", Config::give_up(), &[Witness::CallRunAfterGiveUp]);
}

/// An SQL writer beside the gateways (`fencing.admit` in a transaction that then writes a row):
/// its `FOR KEY SHARE` hold keeps a gateway's raise out until it commits, its raise waits out
/// the grants and reads the lease again, and its raise becomes visible at its commit.
#[test]
fn s1_to_s5_hold_with_an_sql_writer() {
    holds("SQL writer", Config::sql_writers(), &[Witness::SqlWriteCommitted, Witness::AcquireSleptOutGrants]);
}

/// Both gateways' boot clocks drifting (one slow, one fast: the contract's rho both ways at
/// once), the store's clock stepped, three writes.
#[test]
fn s3_holds_with_both_boot_clocks_drifting() {
    holds(
        "clocks, both drifting",
        Config { drifting_clocks: 2, writes: 3, ..Config::clocks() },
        &[Witness::GrantAdmission, Witness::GrantAdmissionAfterClockFaults, Witness::RaiseSleptOutGrants],
    );
}

#[test]
fn s3_holds_across_clock_steps_and_drift_with_monotonic_waits() {
    holds(
        "clocks",
        Config::clocks(),
        &[Witness::GrantAdmission, Witness::GrantAdmissionAfterClockFaults, Witness::RaiseSleptOutGrants],
    );
}

/// Without S5's timing assumption (a gateway may pause between its check of a write's deadline
/// and its send), S5 breaks: a write is sent at or after its own deadline. This shows that S5's
/// deadline clause is not vacuous in the model.
#[test]
fn without_the_pause_assumption_a_write_is_sent_after_its_deadline() {
    let config = Config { pause_assumption: false, ..Config::standard(false) };
    let report = check(config, true);
    let (property, steps) = report.violations.first().expect("no violation without the pause assumption");
    println!("no pause assumption: {property} violated in {} steps\n{}", steps.len(), history::render(&config, steps));
    assert_eq!(*property, Invariant::S5.name());
    let (before, action, _) = steps.last().unwrap();
    let Action::GatewaySend { gateway, write } = *action else { panic!("the last step is not a send: {action:?}") };
    let sent = before.gateways[usize::from(gateway)].writes[usize::from(write)].unwrap();
    assert!(before.boot(usize::from(gateway)) >= sent.deadline, "the write sent was before its deadline");
}

/// The repaired lease-grant design beside an operator: `r1` alone, grants on, 3 writes, 1 elector
/// call, 1 admin action.
fn lease_grant_admin() -> Config {
    Config { admin_actions: 1, unbound_resources: 0, writes: 3, lease_calls: 1, ..Config::standard(true) }
}

/// The same with two resources on the lease and 4 writes: after an operator's change of `r1`,
/// the lease's grant can be given again through `r2` (found by a review: a decision of `r1` made
/// before the change then counted for it).
fn lease_grant_admin_two_resources() -> Config {
    Config { bound_resources: 2, writes: 4, ..lease_grant_admin() }
}

/// The namespace-grant design's sizes: an unbound route of two resources (`f1`, `f2`), grants
/// on, `writes` writes of forged terms, no electors.
/// Their fences exist at term 1 from the start (`seeded`), so every write can bring or use a
/// namespace grant.
fn namespace(writes: u8) -> Config {
    Config {
        bound_resources: 0,
        unbound_resources: 2,
        lease_calls: 0,
        writes,
        forged_terms: true,
        seeded: true,
        ..Config::standard(true)
    }
}

/// The smallest configuration each plant shows in (the search stops at its first violation).
fn planted(plant: Plant) -> Config {
    let small = Config { writes: 3, forged_terms: true, ..Config::standard(false) };
    match plant {
        Plant::GrantIgnored | Plant::GrantOverstay => Config { clock_step: false, ..Config::clocks() }.planted(plant),
        Plant::WallClockWaits => Config { drifting_clocks: 0, ..Config::clocks() }.planted(plant),
        Plant::RaiseSkipsLeaseCheck => Config::lease_moves_on().planted(plant),
        Plant::BusyGrantSkipsLeaseCheck => Config::sql_writers().planted(plant),
        Plant::BatchGrantSkipsLeaseLock => Config { unbound_resources: 0, ..Config::batched() }.planted(plant),
        Plant::StampAnyOwner => Config { stamp: true, unbound_resources: 0, ..Config::standard(false) }.planted(plant),
        Plant::AdvanceAsyncCommit => {
            Config { bound_resources: 0, lease_calls: 0, admin_actions: 1, ..small }.planted(plant)
        }
        Plant::BindAsyncCommit => {
            Config { unbound_resources: 0, admin_actions: 2, sql_writer: true, writes: 2, ..small }.planted(plant)
        }
        Plant::RebindAsyncCommit => Config { unbound_resources: 0, admin_actions: 1, ..small }.planted(plant),
        Plant::RenewAnyOwner => Config { lease_calls: 3, admin_actions: 1, writes: 0, ..small }.planted(plant),
        Plant::RenewExpired | Plant::AcquireKeepsPeriod | Plant::ElectorMarginAdded | Plant::ElectorDeadlineIgnored => {
            Config { writes: 0, ..small }.planted(plant)
        }
        Plant::LeaseGrantsAdminNoWait => Config { admin_actions: 1, ..lease_grant_admin() }.planted(plant),
        // Unseeded: a resource created above the grant's term after it was given.
        Plant::NamespaceGrantWithoutDecision => Config { seeded: false, ..namespace(4) }.planted(plant),
        Plant::NamespaceGrantNoEpoch => namespace(4).planted(plant),
        // One unbound resource, its fence at term 1 from the start, four writes.
        Plant::BusyGrantOnStaleVersion => Config { unbound_resources: 1, ..namespace(4) }.planted(plant),
        Plant::SqlRaiseSkipsSettle | Plant::AdmitAsyncCommit => Config {
            bound_resources: 0,
            lease_calls: 0,
            writes: 3,
            sql_writer: true,
            forged_terms: true,
            ..Config::standard(false)
        }
        .planted(plant),
        _ => small.planted(plant),
    }
}

/// The invariant each plant breaks in the model (one of those the fault suite documents it to
/// break).
fn expected(plant: Plant) -> Invariant {
    match plant {
        Plant::NoNewTerm | Plant::AsyncCommit | Plant::RenewExpired | Plant::AcquireKeepsPeriod => Invariant::S2,
        Plant::RenewAnyOwner => Invariant::S1,
        Plant::ElectorMarginAdded | Plant::ElectorDeadlineIgnored => Invariant::S7,
        Plant::GateAsyncCommit | Plant::AdmitAsyncCommit | Plant::AdvanceAsyncCommit => Invariant::S3,
        Plant::BindAsyncCommit | Plant::RebindAsyncCommit | Plant::FutureTerm => Invariant::S4,
        Plant::BusyGrantOnStaleVersion => Invariant::S3,
        Plant::RaiseSkipsLeaseCheck
        | Plant::BusyGrantSkipsLeaseCheck
        | Plant::BatchGrantSkipsLeaseLock
        | Plant::StampAnyOwner => Invariant::S4,
        // An advance of the fence by hand, and the lease's grant still admits the lower term.
        Plant::LeaseGrantsAdminNoWait | Plant::LeaseGrantsAdminNoEpoch => Invariant::S3,
        // A term below the resource's maximum admitted under the namespace's grant.
        Plant::NamespaceGrants | Plant::NamespaceGrantNoEpoch | Plant::NamespaceGrantWithoutDecision => Invariant::S3,
        // (The repaired design is no bug: the test of planted bugs leaves it out.)
        Plant::NoSettle | Plant::LeaseScopedGrants | Plant::LeaseGrantsAfterDecision | Plant::SqlRaiseSkipsSettle => {
            Invariant::S5
        }
        Plant::WeakFence | Plant::GrantIgnored | Plant::GrantOverstay | Plant::GateRace | Plant::WallClockWaits => {
            Invariant::S3
        }
    }
}

#[test]
fn every_planted_bug_is_found_with_a_shortest_counterexample() {
    let mut wrong = Vec::new();
    for plant in Plant::ALL
        .into_iter()
        // The designs have tests of their own (replays: their searches are long).
        .filter(|plant| {
            !matches!(
                plant,
                Plant::LeaseScopedGrants
                    | Plant::LeaseGrantsAfterDecision
                    | Plant::LeaseGrantsAdminNoEpoch
                    | Plant::NamespaceGrants
            )
        })
    {
        let config = planted(plant);
        let report = check(config, true);
        match report.violations.first() {
            Some((property, steps)) => {
                println!(
                    "{}: {property} violated in {} steps ({})\n{}",
                    plant.name(),
                    steps.len(),
                    report.summary(),
                    history::render(&config, steps)
                );
                if *property != expected(plant).name() {
                    wrong.push(format!("{}: {property} violated, not {}", plant.name(), expected(plant).name()));
                }
            }
            None => wrong.push(format!("{}: not found", plant.name())),
        }
    }
    assert!(wrong.is_empty(), "planted bugs not found as expected: {wrong:?}");
}

/// Replays `action` from `state` (it must be enabled), keeping the step for the history.
fn step(
    model: &Protocol,
    steps: &mut Vec<(fencing_model::State, Action, fencing_model::State)>,
    state: &mut fencing_model::State,
    action: Action,
) {
    let next = model.next_state(state, action).unwrap_or_else(|| panic!("{action:?} is not enabled"));
    steps.push((state.clone(), action, next.clone()));
    *state = next;
}

/// The index of `g`'s admitted write of `term` on `resource`.
fn write_of(state: &fencing_model::State, g: usize, resource: u8, term: u8) -> u8 {
    let w = state.gateways[g].writes.iter().position(|w| w.is_some_and(|w| w.resource == resource && w.term == term));
    u8::try_from(w.unwrap()).unwrap()
}

/// The lease-scoped counterexample's path to gateway-2's grant on the lease at term 2: gateway-1
/// holds a write of term 1 on `r2`; the lease moves to term 2; gateway-2 writes `r1` at term 2,
/// then is granted the lease at term 2 on its next write of `r1`.
fn to_a_lease_grant_at_term_2(
    state: &mut fencing_model::State,
    run: &mut dyn FnMut(&mut fencing_model::State, Action),
) {
    run(state, Action::ElectorAcquire(0));
    run(state, Action::StoreAcquire { elector: 0, lost: false });
    run(state, Action::GatewayDecide { gateway: 0, resource: 1, term: 1 });
    run(state, Action::GateRead { gateway: 0, call: 0, lost: false });
    run(state, Action::ElectorRelease(0));
    run(state, Action::StoreRelease { elector: 0, lost: false });
    run(state, Action::ElectorAcquire(1));
    run(state, Action::StoreAcquire { elector: 1, lost: false });
    run(state, Action::GatewayDecide { gateway: 1, resource: 0, term: 2 });
    run(state, Action::GateRead { gateway: 1, call: 0, lost: false });
    let w = write_of(state, 1, 0, 2);
    run(state, Action::GatewaySend { gateway: 1, write: w });
    run(state, Action::GatewayDecide { gateway: 1, resource: 0, term: 2 });
    run(state, Action::GateRead { gateway: 1, call: 0, lost: false });
    run(state, Action::GateGrant { gateway: 1, call: 0, lost: false });
}

/// Lease-scoped grants (the planned design) break S5: a gateway's grant on the lease admits a
/// write of the new term on a resource it never asked about, so without that resource's settle,
/// while another gateway's write of the old term on it may still be sent. Its counterexample is
/// deeper than the breadth-first search reaches within the CI budget, so it is replayed here.
#[test]
fn lease_scoped_grants_break_s5() {
    let config =
        Config { bound_resources: 2, unbound_resources: 0, writes: 4, lease_calls: 3, ..Config::standard(true) }
            .planted(Plant::LeaseScopedGrants);
    let model = Protocol::new(config);
    let mut state = model.init_states().remove(0);
    let mut steps = Vec::new();
    let mut run = |state: &mut fencing_model::State, action: Action| step(&model, &mut steps, state, action);
    to_a_lease_grant_at_term_2(&mut state, &mut run);
    run(&mut state, Action::GatewayDecide { gateway: 1, resource: 1, term: 2 });
    let w = write_of(&state, 1, 1, 2);
    run(&mut state, Action::GatewaySend { gateway: 1, write: w });
    let w = write_of(&state, 0, 1, 1);
    run(&mut state, Action::GatewaySend { gateway: 0, write: w });
    println!("lease-scoped-grants: {} steps\n{}", steps.len(), history::render(&config, &steps));
    assert!(Invariant::S5.violated(&state.ghost));
    assert!(!Invariant::S3.violated(&state.ghost) && !Invariant::S4.violated(&state.ghost));
}

/// Whether `sql` defines `fencing.<name>`: a line (comments stripped) that begins
/// `CREATE FUNCTION fencing.<name>(` or `CREATE OR REPLACE FUNCTION fencing.<name>(`, in any case.
fn sql_defines(sql: &str, name: &str) -> bool {
    let name = name.to_lowercase();
    let heads = [format!("create function fencing.{name}("), format!("create or replace function fencing.{name}(")];
    sql.lines().any(|line| {
        let code = line.split("--").next().unwrap_or_default();
        let words = code.split_whitespace().collect::<Vec<_>>().join(" ").to_lowercase();
        heads.iter().any(|head| words.starts_with(head.as_str()))
    })
}

/// `rust` without its `#[cfg(test)]` items (up to the end of the brace block that follows) and
/// without `//` comments.
fn rust_code(rust: &str) -> String {
    let mut code = String::new();
    let mut skipping = false;
    let mut depth = 0usize;
    let mut opened = false;
    for line in rust.lines() {
        let line = line.split("//").next().unwrap_or_default();
        if !skipping && line.trim() == "#[cfg(test)]" {
            (skipping, depth, opened) = (true, 0, false);
            continue;
        }
        if skipping {
            for c in line.chars() {
                match c {
                    '{' => (depth, opened) = (depth + 1, true),
                    '}' => depth = depth.saturating_sub(1),
                    _ => {}
                }
            }
            // A braceless item (`#[cfg(test)] use ...;`) ends at its semicolon.
            if (opened && depth == 0) || (!opened && line.trim_end().ends_with(';')) {
                skipping = false;
            }
            continue;
        }
        code.push_str(line);
        code.push('\n');
    }
    code
}

/// Whether `rust` defines `fn <name>` outside `#[cfg(test)]` items: `fn` and the name as whole
/// words, followed by `(` or `<`.
fn rust_defines(rust: &str, name: &str) -> bool {
    let code = rust_code(rust);
    let needle = format!("fn {name}");
    code.match_indices(&needle).any(|(at, _)| {
        let before = code[..at].chars().next_back();
        let after = code[at + needle.len()..].chars().next();
        !before.is_some_and(|c| c.is_alphanumeric() || c == '_') && matches!(after, Some('(' | '<'))
    })
}

#[test]
fn the_drift_check_matches_only_definitions() {
    let sql = "-- CREATE OR REPLACE FUNCTION fencing.acquire(key text)\n\
               GRANT EXECUTE ON FUNCTION fencing.acquire(text) TO x;\n\
               SELECT fencing.acquire('k');\n\
               create  or replace function fencing.renew(key text)\n";
    assert!(!sql_defines(sql, "acquire"));
    assert!(sql_defines(sql, "renew"));
    assert!(sql_defines("CREATE FUNCTION fencing.gate(resource text) -- the gate", "gate"));
    assert!(!sql_defines("CREATE OR REPLACE FUNCTION fencing.gate_many(x int)", "gate"));
    let rust = "// fn send(\nfn sender() {}\nasync fn forward_all() {}\nlet f = send(1);\n\
                #[cfg(test)]\nmod tests {\n    fn decide() { if x { } }\n}\n\
                pub(crate) async fn remember<T>(t: T) {}\n";
    assert!(!rust_defines(rust, "send"));
    assert!(!rust_defines(rust, "forward"));
    assert!(!rust_defines(rust, "decide"));
    assert!(rust_defines(rust, "remember"));
}

/// Every SQL function and Rust function a transition names is still defined, so a rename or a
/// removal in the code fails here and the model is brought up to date.
#[test]
fn every_mirrored_function_exists() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut sql = String::new();
    for entry in std::fs::read_dir(root.join("schema/functions")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|ext| ext == "sql") {
            sql.push_str(&std::fs::read_to_string(&path).unwrap());
            sql.push('\n');
        }
    }
    let mut missing = Vec::new();
    let named = ActionKind::ALL.iter().flat_map(|kind| mirrors(*kind).iter()).chain(GATEWAY_ANSWER.iter());
    for mirror in named {
        let found = match mirror {
            Mirror::Sql(name) => sql_defines(&sql, name),
            Mirror::Rust { path, name } => {
                let text = std::fs::read_to_string(root.join(path)).unwrap_or_default();
                rust_defines(&text, name)
            }
        };
        if !found {
            missing.push(format!("{mirror:?}"));
        }
    }
    assert!(missing.is_empty(), "the model mirrors code that is gone: {missing:?}");
}

/// The repaired design (`lease-grants-after-decision`) on the counterexample's path: the write of
/// the new term on the resource the gateway never asked about at that term is not admitted under
/// the lease's grant; it is asked, so it raises that resource's fence and waits its settle.
#[test]
fn lease_grants_after_a_decision_ask_about_a_resource_not_yet_decided_at_the_term() {
    let config =
        Config { bound_resources: 2, unbound_resources: 0, writes: 4, lease_calls: 3, ..Config::standard(true) }
            .planted(Plant::LeaseGrantsAfterDecision);
    let model = Protocol::new(config);
    let mut state = model.init_states().remove(0);
    let mut run = |state: &mut fencing_model::State, action: Action| {
        *state = model.next_state(state, action).unwrap_or_else(|| panic!("{action:?} is not enabled"));
    };
    to_a_lease_grant_at_term_2(&mut state, &mut run);
    assert!(state.gateways[1].lease_grant.is_some_and(|grant| grant.term == 2), "no lease grant at term 2");
    run(&mut state, Action::GatewayDecide { gateway: 1, resource: 1, term: 2 });
    let gateway = &state.gateways[1];
    assert!(
        gateway.writes.iter().flatten().all(|w| w.resource != 1),
        "a write of r2 admitted under the lease's grant: {gateway:?}"
    );
    assert!(
        gateway.calls.iter().flatten().any(|call| call.resource == 1 && call.term == 2),
        "the write of r2 was not asked: {gateway:?}"
    );
}

/// The symmetry reduction keeps what a check finds: the same configuration holds with and without
/// it, in fewer states with it, and a planted bug is still found through it.
#[test]
fn the_symmetry_reduction_finds_what_the_full_search_finds() {
    let config = Config { bound_resources: 2, ..Config::standard(true) };
    let full = check(config, false);
    let reduced = check(Config { symmetry: true, ..config }, false);
    println!("two bound resources, grants on: {} without symmetry, {} with", full.summary(), reduced.summary());
    assert!(full.violations.is_empty() && reduced.violations.is_empty());
    assert!(reduced.unique_states * 3 < full.unique_states, "the reduction saves less than expected");
    assert_eq!(full.reached, reduced.reached);
    // The namespace-grant design: gateways renamed with their namespace grants.
    let config = namespace(3).planted(Plant::NamespaceGrants);
    let (full, reduced) = (check(config, false), check(Config { symmetry: true, ..config }, false));
    println!("namespace grants: {} without symmetry, {} with", full.summary(), reduced.summary());
    assert!(full.violations.is_empty() && reduced.violations.is_empty());
    assert_eq!(full.reached, reduced.reached);
    let planted =
        Config { bound_resources: 2, writes: 3, forged_terms: true, symmetry: true, ..Config::standard(false) }
            .planted(Plant::NoSettle);
    let report = check(planted, true);
    assert!(
        report.violations.iter().any(|(property, _)| *property == Invariant::S5.name()),
        "no-settle not found with the symmetry reduction: {}",
        report.summary()
    );
}

/// The repaired lease-grant design (`lease-grants-after-decision`, issue 23) proven at the size of
/// the lease-scoped design's counterexample: two resources on the lease, grants on, 4 writes, 3
/// elector calls, with the symmetry reduction. Long (see model/README.md): run with
/// `cargo test -p fencing-model --release -- --ignored lease_grants_after_a_decision_hold`.
#[test]
#[ignore = "minutes: the design's proof at the counterexample's size"]
fn lease_grants_after_a_decision_hold_at_the_counterexamples_size() {
    let config = Config {
        bound_resources: 2,
        unbound_resources: 0,
        writes: 4,
        lease_calls: 3,
        symmetry: true,
        ..Config::standard(true)
    }
    .planted(Plant::LeaseGrantsAfterDecision);
    holds("lease grants after a decision", config, &[Witness::GrantAdmission, Witness::AcquireSleptOutGrants]);
}

/// Decisions in batches (`fencing.gate_many` of several items in one transaction): a raise, a
/// first write or a grant holds its locks and stays invisible until the batch commits after its
/// other items, and only then is it answered; the lease's next term and the fence's next raise
/// wait for a held grant. `r1` alone, with the symmetry reduction (with `f1` as well: 2,361,531
/// states, 15 s, S1-S5 hold; not run in CI).
/// The namespace-grant design for unbound routes (issue 23, item 2): one grant per namespace and
/// term covers the resources decided at its term and the namespace's epoch; a raise of any of
/// the namespace's fences sleeps out the namespace's grant holding its lock, and bumps the epoch.
/// S1, S2 and S4 hold vacuously there (no lease, no bound resource): S3 and S5 are what it checks.
#[test]
fn s3_s5_hold_with_namespace_grants() {
    holds(
        "namespace grants, f1 and f2 at term 1, 3 writes",
        namespace(3).planted(Plant::NamespaceGrants),
        &[Witness::GrantAdmission, Witness::RaiseSleptOutGrants, Witness::NamespaceGrantOtherResource],
    );
}

/// The same with four writes: the size at which the design without its epoch breaks (found
/// breadth first in the planted bugs' test), and a write admitted under a namespace grant given
/// through another resource after a raise in the namespace.
#[test]
#[ignore = "minutes: the namespace-grant design at four writes"]
fn s3_s5_hold_with_namespace_grants_at_four_writes() {
    holds(
        "namespace grants, f1 and f2 at term 1, 4 writes",
        namespace(4).planted(Plant::NamespaceGrants),
        &[
            Witness::GrantAdmission,
            Witness::RaiseSleptOutGrants,
            Witness::NamespaceGrantOtherResource,
            Witness::NamespaceGrantAfterRaise,
        ],
    );
}

/// The path on which a namespace grant would admit a term below a resource's maximum:
/// gateway-1 decides `f1` at term 1; gateway-2 raises `f1` to term 2; gateway-1 decides `f2` at
/// term 1 and is granted the namespace at term 1 on its next write of `f2`; then it writes `f1` at
/// term 1 again.
fn to_a_namespace_grant_after_a_raise(
    state: &mut fencing_model::State,
    run: &mut dyn FnMut(&mut fencing_model::State, Action),
) {
    let (f1, f2) = (0, 1);
    // Gateway `g` asks about a write of `term` on `r` (the read, then `then`, if any) and sends it.
    let mut write =
        |state: &mut fencing_model::State, g: u8, r: u8, term: u8, then: Option<Action>| {
            run(state, Action::GatewayDecide { gateway: g, resource: r, term });
            run(state, Action::GateRead { gateway: g, call: 0, lost: false });
            if let Some(action) = then {
                run(state, action);
            }
            if let Some(w) = state.gateways[usize::from(g)].writes.iter().position(|w| {
                w.is_some_and(|w| w.resource == r && w.term == term && w.start <= state.boot(usize::from(g)))
            }) {
                run(state, Action::GatewaySend { gateway: g, write: u8::try_from(w).unwrap() });
            }
        };
    write(state, 0, f1, 1, None);
    // A raise: its write waits for its settle, and is not sent here.
    write(state, 1, f1, 2, Some(Action::GateLock { gateway: 1, call: 0, lost: false }));
    write(state, 0, f2, 1, None);
    write(state, 0, f2, 1, Some(Action::GateGrant { gateway: 0, call: 0, lost: false }));
    run(state, Action::GatewayDecide { gateway: 0, resource: f1, term: 1 });
}

/// `namespace-grant-no-epoch` on another path than the one the search finds (there the raise
/// sleeps out a grant; here it comes before any grant was given, and the resources are created
/// in the run): gateway-1's decision of `f1` at term 1, made before gateway-2 raised `f1` to
/// term 2, counts for the namespace grant gateway-1 is given later through `f2`, and term 1 is
/// admitted on `f1` after term 2 (S3). The design asks the store instead, which refuses.
#[test]
fn a_namespace_grant_admits_no_term_below_a_resources_maximum() {
    for (plant, broken) in [(Plant::NamespaceGrantNoEpoch, true), (Plant::NamespaceGrants, false)] {
        let config = Config { seeded: false, ..namespace(5) }.planted(plant);
        let model = Protocol::new(config);
        let mut state = model.init_states().remove(0);
        let mut steps = Vec::new();
        let mut run = |state: &mut fencing_model::State, action: Action| step(&model, &mut steps, state, action);
        to_a_namespace_grant_after_a_raise(&mut state, &mut run);
        println!("{}: {} steps\n{}", plant.name(), steps.len(), history::render(&config, &steps));
        assert!(state.gateways[0].ns_grant.is_some_and(|grant| grant.term == 1), "no namespace grant at term 1");
        assert_eq!(Invariant::S3.violated(&state.ghost), broken, "{}", plant.name());
        if !broken {
            let gateway = &state.gateways[0];
            assert!(
                gateway.calls.iter().flatten().any(|call| call.resource == 0 && call.term == 1),
                "the write of f1 was not asked: {gateway:?}"
            );
            // The store refuses it: nothing of term 1 is admitted on f1 after term 2.
            step(&model, &mut steps, &mut state, Action::GateRead { gateway: 0, call: 0, lost: false });
            assert!(state.gateways[0].calls.iter().all(Option::is_none), "still asked: {:?}", state.gateways[0]);
            assert!(state.gateways[0].writes.iter().flatten().all(|w| w.resource != 0 || w.term != 1));
            assert!(!Invariant::S3.violated(&state.ghost) && state.ghost.admitted[0] == 2);
        }
    }
}

#[test]
fn s1_to_s5_hold_with_batched_decisions() {
    holds(
        "batched",
        Config { symmetry: true, unbound_resources: 0, ..Config::batched() },
        &[Witness::BatchedRaiseCommitted, Witness::GrantAdmission, Witness::AcquireSleptOutGrants],
    );
}

/// An operator's audited actions beside the protocol, one per run at any step:
/// `fencing.advance_fence` (of either resource, to any term, inserting an unbound row when there
/// is none), `fencing.bind` and `fencing.rebind` (to a lease nobody holds) of the bound route's
/// resource, `fencing.force_release`. Each locks its row, sleeps out the grants, and settles the
/// next writes behind the old ones.
#[test]
fn s1_to_s5_hold_with_admin_actions() {
    holds(
        "admin actions",
        Config { admin_actions: 1, symmetry: true, ..Config::standard(true) },
        &[Witness::AdminSleptOutGrants, Witness::GrantAdmission, Witness::RaiseRefusedByNewerLease],
    );
}

/// Two admin actions on `r1`: its row created unbound (`fencing.advance_fence` before any write),
/// the bound route's writes refused as `wrong_lease`, then `fencing.bind` binds it to the lease:
/// the first binding of a resource, which waits out its unbound grants.
#[test]
fn s1_to_s5_hold_when_a_fence_is_bound_by_hand() {
    holds(
        "bound by hand",
        Config { admin_actions: 2, unbound_resources: 0, symmetry: true, ..Config::standard(true) },
        &[Witness::FenceBoundByHand, Witness::AdminSleptOutGrants],
    );
}

/// Stamp mode (`fencing.gate_lease`): writes present an elector's identity, the store stamps the
/// lease's term when that elector holds it, and a bound route's grant covers that owner's stamp
/// writes only; S4 also asks that a stamp write carries a term its owner was granted. Both
/// resources with 2 writes, then `r1` alone with 3 (stamp writes under a grant).
#[test]
fn s1_to_s5_hold_in_stamp_mode() {
    holds("stamp mode", Config { stamp: true, ..Config::standard(true) }, &[Witness::AcquireSleptOutGrants]);
    holds(
        "stamp mode, r1",
        Config { stamp: true, symmetry: true, unbound_resources: 0, writes: 3, ..Config::standard(true) },
        &[Witness::StampGrantAdmission, Witness::AcquireSleptOutGrants],
    );
}

/// The repaired lease-grant design (issue 23) beside an operator: `fencing.advance_fence` and
/// `fencing.rebind` of a bound fence wait out the lease's grant at the fence's term, which covers
/// the resource without being recorded on its row. Without that wait (`lease-grants-admin-no-wait`,
/// in the planted list) an advance lets the lease's grant admit the lower term (S3, 9 steps) and a
/// rebinding lets it admit a term of the old lease (S4, 9 steps).
#[test]
fn lease_grants_after_a_decision_hold_with_admin_actions() {
    holds(
        "lease grants after a decision, admin",
        Config { symmetry: true, ..lease_grant_admin() }.planted(Plant::LeaseGrantsAfterDecision),
        &[Witness::GrantAdmission, Witness::AdminSleptOutGrants],
    );
}

/// The repaired design beside an operator with two resources on the lease: a change of `r1` by
/// hand bumps the lease's epoch, so a lease grant given after it (through `r2`) covers no decision
/// of `r1` made before it. Without the epoch (`lease-grants-admin-no-epoch`) the old decision of
/// `r1` counts and its old term is admitted after an advance (S3, 12 steps, found breadth first in
/// 22,313,443 states, 195 s; replayed in CI by
/// `lease_grants_need_the_epoch_after_an_operator_changes_a_bound_fence`). Long (10,895,667 states
/// with symmetry, 213 s): `cargo test -p fencing-model --release -- --ignored admin_actions_on_two`.
#[test]
#[ignore = "minutes: the design beside an operator on two resources"]
fn lease_grants_after_a_decision_hold_with_admin_actions_on_two_resources() {
    holds(
        "lease grants after a decision, admin, r1 and r2",
        lease_grant_admin_two_resources().planted(Plant::LeaseGrantsAfterDecision),
        &[Witness::GrantAdmission, Witness::AdminSleptOutGrants],
    );
}

/// The path a review found (by hand) through the repaired design without the lease's epoch: a
/// gateway decides `r1` at term 1; an operator advances `r1` to term 2 (no lease grant yet, so no
/// wait); the gateway writes `r2` twice and is given the lease's grant at term 1; then a write of
/// `r1` at term 1 is covered by that grant through the decision of `r1` made before the advance.
/// Replayed on both variants: without the epoch it is admitted (S3); with it, it is asked.
#[test]
fn lease_grants_need_the_epoch_after_an_operator_changes_a_bound_fence() {
    for plant in [Plant::LeaseGrantsAdminNoEpoch, Plant::LeaseGrantsAfterDecision] {
        let config = lease_grant_admin_two_resources().planted(plant);
        let model = Protocol::new(config);
        let mut state = model.init_states().remove(0);
        let mut steps = Vec::new();
        let mut run = |state: &mut fencing_model::State, action: Action| step(&model, &mut steps, state, action);
        run(&mut state, Action::ElectorAcquire(0));
        run(&mut state, Action::StoreAcquire { elector: 0, lost: false });
        run(&mut state, Action::GatewayDecide { gateway: 0, resource: 0, term: 1 });
        run(&mut state, Action::GateRead { gateway: 0, call: 0, lost: false });
        let w = write_of(&state, 0, 0, 1);
        run(&mut state, Action::GatewaySend { gateway: 0, write: w });
        run(&mut state, Action::AdminRuns(fencing_model::state::Admin::Advance { resource: 0, term: 2 }));
        run(&mut state, Action::GatewayDecide { gateway: 0, resource: 1, term: 1 });
        run(&mut state, Action::GateRead { gateway: 0, call: 0, lost: false });
        let w = write_of(&state, 0, 1, 1);
        run(&mut state, Action::GatewaySend { gateway: 0, write: w });
        run(&mut state, Action::GatewayDecide { gateway: 0, resource: 1, term: 1 });
        run(&mut state, Action::GateRead { gateway: 0, call: 0, lost: false });
        run(&mut state, Action::GateGrant { gateway: 0, call: 0, lost: false });
        assert!(state.gateways[0].lease_grant.is_some_and(|grant| grant.term == 1), "no lease grant at term 1");
        run(&mut state, Action::GatewayDecide { gateway: 0, resource: 0, term: 1 });
        println!("{}: {} steps\n{}", plant.name(), steps.len(), history::render(&config, &steps));
        let asked = state.gateways[0].calls.iter().flatten().any(|call| call.resource == 0 && call.term == 1);
        if plant == Plant::LeaseGrantsAdminNoEpoch {
            assert!(Invariant::S3.violated(&state.ghost), "the old decision of r1 no longer counts without the epoch");
        } else {
            assert!(!Invariant::S3.violated(&state.ghost) && asked, "the write of r1 was not asked: {state:?}");
        }
    }
}
