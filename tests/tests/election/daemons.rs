//! Daemons as real processes: three nodes of the daemon node example share five daemons; nodes
//! are killed, paused, never acknowledge, drain slowly and join. Every test ends with the
//! history check: the fenced ticks of each daemon never go back to an older generation, each
//! daemon ran on one node at a time outside the documented bound, and the leader's assignment
//! writes never go back to an older term.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use fencing_schema::store;
use fencing_tests::pg::TestDb;
use fencing_tests::process::{DAEMON_NODE_TABLES, ElectorProcess, event};
use nix::sys::signal::Signal;
use serde_json::Value;
use tokio_postgres::Client;

const CLUSTER: &str = "workers";
const KEY: &str = "workers-leader";
const HEARTBEAT_MS: u64 = 500;
const REGISTRATION_TTL_MS: u64 = 2000;
const LEADER_TTL_MS: u64 = 2000;
const ACK_MS: u64 = 1500;
const DRAIN_MS: u64 = 1500;
/// Under half the heartbeat interval, as the membership settings require.
const QUERY_TIMEOUT_MS: u64 = 240;
/// One pass's queries and process scheduling on a loaded two-core machine.
const SLACK_MS: u64 = 1000;
/// How long any wait for a placement may take.
const WAIT: Duration = Duration::from_secs(40);

async fn prepare(client: &Client) {
    client.batch_execute(DAEMON_NODE_TABLES).await.unwrap();
}

fn node(url: &str, id: &str, extra: &[&str]) -> ElectorProcess {
    ElectorProcess::spawn_daemon_node(id, &node_args(url, id, extra)).unwrap()
}

fn node_args(url: &str, id: &str, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        ("--database-url", url),
        ("--cluster", CLUSTER),
        ("--key", KEY),
        ("--node-id", id),
        ("--daemons", "5"),
        ("--heartbeat-ms", &HEARTBEAT_MS.to_string()),
        ("--registration-ttl-ms", &REGISTRATION_TTL_MS.to_string()),
        ("--ttl-ms", &LEADER_TTL_MS.to_string()),
        ("--ack-ms", &ACK_MS.to_string()),
        ("--drain-ms", &DRAIN_MS.to_string()),
        ("--query-timeout-ms", &QUERY_TIMEOUT_MS.to_string()),
        ("--tick-ms", "100"),
    ]
    .into_iter()
    .flat_map(|(flag, value)| [flag.to_owned(), value.to_owned()])
    .collect();
    args.extend(extra.iter().map(|arg| (*arg).to_owned()));
    args
}

async fn store_now(client: &Client) -> SystemTime {
    client.query_one("SELECT clock_timestamp()", &[]).await.unwrap().get(0)
}

/// Node id -> the daemons active on it (only when every daemon is active).
type Placement = BTreeMap<String, Vec<String>>;

async fn placement(client: &Client) -> Option<Placement> {
    let states = store::daemon_states(client, CLUSTER).await.unwrap();
    if states.len() != 5 || states.iter().any(|daemon| daemon.state != "active") {
        return None;
    }
    let mut placement = Placement::new();
    for daemon in states {
        placement.entry(daemon.node_id.unwrap_or_default()).or_default().push(daemon.daemon);
    }
    Some(placement)
}

fn loads(placement: &Placement) -> Vec<usize> {
    let mut loads: Vec<usize> = placement.values().map(Vec::len).collect();
    loads.sort_unstable();
    loads
}

/// Waits until every daemon is active and `wanted` holds.
async fn wait_for_placement(client: &Client, what: &str, wanted: impl Fn(&Placement) -> bool) -> Placement {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(placement) = placement(client).await
            && wanted(&placement)
        {
            return placement;
        }
        if tokio::time::Instant::now() > deadline {
            let states = store::daemon_states(client, CLUSTER).await.unwrap();
            panic!("no {what} within {WAIT:?}: {states:#?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One step of an assignment, from `fencing.daemon_history`.
#[derive(Debug, Clone)]
struct Step {
    id: i64,
    daemon: String,
    generation: i64,
    node_id: String,
    state: String,
    reason: Option<String>,
    term: i64,
    at: SystemTime,
}

async fn history(client: &Client) -> Vec<Step> {
    let rows = client
        .query(
            "SELECT id, daemon, generation, node_id, state, reason, term, at FROM fencing.daemon_history
              WHERE cluster = $1 ORDER BY id",
            &[&CLUSTER],
        )
        .await
        .unwrap();
    rows.iter()
        .map(|row| Step {
            id: row.get(0),
            daemon: row.get(1),
            generation: row.get(2),
            node_id: row.get(3),
            state: row.get(4),
            reason: row.get(5),
            term: row.get(6),
            at: row.get(7),
        })
        .collect()
}

fn after(later: SystemTime, earlier: SystemTime) -> Duration {
    later.duration_since(earlier).unwrap_or_default()
}

/// The independent check over what the store recorded:
/// - per daemon, the fenced ticks (admitted with the instance's generation) never go back to
///   an older generation: two instances' fenced effects never interleave;
/// - per daemon, no instance ran (its unfenced run records) after a later instance's first run,
///   except an instance whose assignment was forced after the drain timeout, for at most
///   `slow_drain` plus a tick, and one record of an instance on a node in `paused` (a process
///   resumed in the middle of an action), whose assignment ended when the node expired;
/// - the leader-made steps (assignments, revocations, forced ends) never go back to an older
///   term.
async fn check_history(client: &Client, slow_drain: Duration, paused: &[&str]) {
    let ticks = client.query("SELECT daemon, generation FROM daemon_ticks ORDER BY id", &[]).await.unwrap();
    let mut newest: BTreeMap<String, i64> = BTreeMap::new();
    for row in &ticks {
        let (daemon, generation): (String, i64) = (row.get(0), row.get(1));
        let seen = newest.entry(daemon.clone()).or_insert(generation);
        assert!(generation >= *seen, "{daemon}: an admitted tick of generation {generation} after one of {seen}");
        *seen = generation;
    }
    assert!(!ticks.is_empty(), "the daemons ran");

    let steps = history(client).await;
    let ended = |daemon: &str, generation: i64| {
        steps
            .iter()
            .find(|s| s.daemon == daemon && s.generation == generation && s.state == "deleted")
            .and_then(|s| s.reason.clone())
    };
    let runs = client
        .query(
            "SELECT daemon, generation, min(node_id), min(at), max(at), array_agg(at ORDER BY at),
                    count(DISTINCT node_id)
               FROM daemon_runs GROUP BY daemon, generation ORDER BY daemon, min(at)",
            &[],
        )
        .await
        .unwrap();
    for run in &runs {
        let nodes: i64 = run.get(6);
        assert_eq!(nodes, 1, "generation {} of {} ran on {nodes} nodes", run.get::<_, i64>(1), run.get::<_, String>(0));
    }
    type Run = (String, i64, String, SystemTime, SystemTime, Vec<SystemTime>);
    let runs: Vec<Run> = runs.iter().map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5))).collect();
    for (daemon, generation, node_id, older_first, last, times) in &runs {
        for (other, later, _, first, later_last, _) in &runs {
            // Every pair of an older and a newer generation of one daemon whose runs overlap,
            // whichever started first.
            if other != daemon || later <= generation || last < first || later_last < older_first {
                continue;
            }
            let late = times.iter().filter(|at| *at >= first).count();
            let reason = ended(daemon, *generation);
            let overlap = after(*last, *first);
            let allowed = older_first < first
                && match reason.as_deref() {
                    // A slow drainer runs on past its cancellation, for the time it takes.
                    Some("drain_timeout") => !slow_drain.is_zero() && overlap <= slow_drain,
                    // A paused process resumed in the middle of one action.
                    Some("node_expired") => paused.contains(&node_id.as_str()) && late <= 1,
                    _ => false,
                };
            assert!(
                allowed,
                "{daemon}: generation {generation} on {node_id} ran {overlap:?} ({late} records) after generation \
                 {later} started; its assignment ended with {reason:?}"
            );
        }
    }

    let mut term = 0;
    for step in steps.iter().filter(|s| {
        matches!(s.state.as_str(), "assigning" | "revoking")
            || matches!(s.reason.as_deref(), Some("node_expired" | "ack_timeout" | "drain_timeout"))
    }) {
        assert!(step.term >= term, "a leader step with term {} after term {term}: {step:?}", step.term);
        term = step.term;
    }
}

async fn lease(client: &Client) -> store::LeaseRow {
    store::get_lease(client, KEY).await.unwrap().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemons_spread_evenly_a_joining_node_gets_one_move_and_a_killed_nodes_daemons_move_within_ttl_and_a_heartbeat()
{
    let db = TestDb::new().await;
    let client = db.connect().await;
    prepare(&client).await;
    let mut processes = BTreeMap::new();
    processes.insert("n1", node(&db.url(), "n1", &[]));
    processes.insert("n2", node(&db.url(), "n2", &[]));
    wait_for_placement(&client, "2 + 3 on two nodes", |p| loads(p) == [2, 3]).await;

    // A third node joins: one move (3-2-0 -> 2-2-1), no more.
    let joined = history(&client).await.len();
    processes.insert("n3", node(&db.url(), "n3", &[]));
    let even = wait_for_placement(&client, "1 + 2 + 2 on three nodes", |p| loads(p) == [1, 2, 2]).await;
    tokio::time::sleep(Duration::from_millis(3 * HEARTBEAT_MS)).await;
    let moves: Vec<Step> = history(&client).await.split_off(joined);
    let rebalances = moves.iter().filter(|s| s.state == "revoking").count();
    assert_eq!(rebalances, 1, "one bounded move for one joining node: {moves:#?}");
    assert!(moves.iter().filter(|s| s.state == "revoking").all(|s| s.reason.as_deref() == Some("rebalance")));

    // Kill a node that holds two daemons and does not lead.
    let leader = lease(&client).await.owner;
    let (victim, daemons) = even
        .iter()
        .find(|(id, daemons)| daemons.len() == 2 && !leader.starts_with(id.as_str()))
        .map(|(id, daemons)| (id.clone(), daemons.clone()))
        .unwrap();
    let before = history(&client).await.len();
    let killed_at = store_now(&client).await;
    processes[victim.as_str()].signal(Signal::SIGKILL).unwrap();
    let survivors = wait_for_placement(&client, "the victim's daemons elsewhere", |p| !p.contains_key(&victim)).await;
    assert_eq!(loads(&survivors), [2, 3]);
    // Moved (assigned to another node) within the registration ttl plus one heartbeat of the
    // kill, on the store's clock: the victim's row expired at most one ttl after the kill (its
    // last heartbeat came before it), and the leader passes once per heartbeat.
    let bound = Duration::from_millis(REGISTRATION_TTL_MS + HEARTBEAT_MS + SLACK_MS);
    let steps = history(&client).await.split_off(before);
    for daemon in &daemons {
        let moved = steps
            .iter()
            .find(|s| &s.daemon == daemon && s.state == "assigning" && s.node_id != victim)
            .unwrap_or_else(|| panic!("{daemon} not reassigned: {steps:#?}"));
        let took = after(moved.at, killed_at);
        assert!(took <= bound, "{daemon} moved {took:?} after the kill, more than {bound:?}");
        assert!(steps.iter().any(|s| &s.daemon == daemon && s.reason.as_deref() == Some("node_expired")), "{steps:#?}");
    }

    // A graceful stop (SIGTERM) of a node that does not lead: it gives its daemons back
    // (released, not expired) and leaves; they run on the last node, never on two at once.
    let leader = lease(&client).await.owner;
    let stopping = survivors.keys().find(|id| !leader.starts_with(id.as_str())).cloned().unwrap();
    let given_back: Vec<String> = survivors[&stopping].clone();
    let before = history(&client).await.len();
    let process = processes.get_mut(stopping.as_str()).unwrap();
    process.signal(Signal::SIGTERM).unwrap();
    process.wait_for("shutdown", |l| event(l) == "shutdown").await.unwrap();
    let last = wait_for_placement(&client, "everything on the last node", |p| p.len() == 1).await;
    assert_eq!(loads(&last), [5]);
    let steps = history(&client).await.split_off(before);
    for daemon in &given_back {
        assert!(
            steps
                .iter()
                .any(|s| &s.daemon == daemon && s.state == "deleted" && s.reason.as_deref() == Some("released")),
            "{daemon} was not given back: {steps:#?}"
        );
    }
    check_history(&client, Duration::ZERO, &[]).await;
}

/// A node whose clocks (wall, monotonic and boot, under libfaketime) run at half or twice the
/// rate of real time would count its registration and its daemons' drain deadlines on a clock
/// that is not the store's: a daemon could run on there after the store moved it. It sees the
/// store's clock disagree with its own at its heartbeats, so it counts itself unregistered and
/// its elector does not lead: it runs no daemon, the two right nodes carry all five, a kill of one
/// moves them to the other (never to the odd node), and the history check holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_clocks_run_slow_or_fast_runs_no_daemon_and_the_right_nodes_carry_them() {
    let faketime = fencing_tests::pg::faketime_library().unwrap().display().to_string();
    for rate in ["0.5", "2"] {
        let db = TestDb::new().await;
        let client = db.connect().await;
        prepare(&client).await;
        let env = [("LD_PRELOAD", faketime.clone()), ("FAKETIME", format!("+0 x{rate}"))];
        let _odd = ElectorProcess::spawn_daemon_node_with_env("odd", &node_args(&db.url(), "odd", &[]), &env).unwrap();
        let mut processes = BTreeMap::new();
        processes.insert("n1", node(&db.url(), "n1", &[]));
        processes.insert("n2", node(&db.url(), "n2", &[]));
        let placed =
            wait_for_placement(&client, "all five on the right nodes", |p| !p.contains_key("odd") && p.len() == 2)
                .await;
        tokio::time::sleep(Duration::from_millis(4 * HEARTBEAT_MS)).await;
        let leader = lease(&client).await.owner;
        assert!(!leader.starts_with("odd"), "x{rate}: the node whose clocks disagree leads: {leader}");

        // Kill the right node that does not lead: its daemons go to the other, not to the odd one.
        let victim = placed.keys().find(|id| !leader.starts_with(id.as_str())).cloned().unwrap();
        processes[victim.as_str()].signal(Signal::SIGKILL).unwrap();
        let survivor = if victim == "n1" { "n2" } else { "n1" };
        wait_for_placement(&client, "all five on the surviving right node", |p| {
            p.len() == 1 && p.contains_key(survivor)
        })
        .await;
        tokio::time::sleep(Duration::from_millis(4 * HEARTBEAT_MS)).await;
        let odd_runs: i64 =
            client.query_one("SELECT count(*) FROM daemon_runs WHERE node_id = 'odd'", &[]).await.unwrap().get(0);
        let odd_steps = history(&client).await.into_iter().filter(|s| s.node_id == "odd").count();
        println!("x{rate}: the odd node was assigned {odd_steps} steps and ran {odd_runs} daemon actions");
        assert_eq!(odd_runs, 0, "x{rate}: the node whose clocks disagree ran daemons");
        check_history(&client, Duration::ZERO, &[]).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_leaders_assignment_writes_are_fenced_by_the_new_leaders_term() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    prepare(&client).await;
    let mut n1 = node(&db.url(), "n1", &[]);
    n1.wait_for("n1 elected", |l| event(l) == "elected").await.unwrap();
    let mut processes = BTreeMap::new();
    processes.insert("n2", node(&db.url(), "n2", &[]));
    processes.insert("n3", node(&db.url(), "n3", &[]));
    wait_for_placement(&client, "1 + 2 + 2", |p| loads(p) == [1, 2, 2]).await;
    let old = lease(&client).await;
    assert!(old.owner.starts_with("n1"), "{old:?}");

    n1.signal(Signal::SIGSTOP).unwrap();
    // A new leader, and n1's daemons on the other two nodes.
    let moved = wait_for_placement(&client, "n1's daemons moved", |p| !p.contains_key("n1")).await;
    assert_eq!(loads(&moved), [2, 3]);
    let new = lease(&client).await;
    assert!(new.term > old.term && !new.owner.starts_with("n1"), "{old:?} -> {new:?}");

    // The zombie's pass, sent with what it held: refused, nothing changed.
    let before = fencing_tests::snapshot(&client, "SELECT * FROM fencing.daemons ORDER BY daemon").await;
    let refused = store::reconcile_daemons(
        &client,
        CLUSTER,
        (KEY, &old.owner, old.term),
        Duration::from_millis(ACK_MS),
        Duration::from_millis(DRAIN_MS),
    )
    .await
    .unwrap_err();
    assert!(matches!(refused, fencing_schema::Error::Refused { .. }), "{refused:?}");
    assert_eq!(fencing_tests::snapshot(&client, "SELECT * FROM fencing.daemons ORDER BY daemon").await, before);

    // Resumed: it learns it lost, writes nothing with its old term, and rejoins as a node.
    n1.signal(Signal::SIGCONT).unwrap();
    n1.wait_for("n1 lost", |l: &Value| event(l) == "lost").await.unwrap();
    wait_for_placement(&client, "1 + 2 + 2 again", |p| loads(p) == [1, 2, 2]).await;
    let old_term = old.term;
    let first_new = history(&client).await.into_iter().find(|s| s.term > old_term).unwrap();
    let late_old: Vec<Step> = history(&client)
        .await
        .into_iter()
        .filter(|s| s.id > first_new.id && s.term == old_term && s.state == "assigning")
        .collect();
    assert!(late_old.is_empty(), "the old term assigned after the new one: {late_old:#?}");
    check_history(&client, Duration::ZERO, &["n1"]).await;
    drop(processes);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_never_acknowledges_is_bypassed_after_the_ack_timeout() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    prepare(&client).await;
    // A live node that offers every daemon and never acknowledges: heartbeats from this test.
    let mute_client = db.connect().await;
    let names = ["d1", "d2", "d3", "d4", "d5"];
    let mute = tokio::spawn(async move {
        loop {
            mute_client
                .query_one(
                    "SELECT ok FROM fencing.heartbeat('workers', 'mute', 'mute-1', 'mute', interval '2000 ms', '{}')",
                    &[],
                )
                .await
                .unwrap();
            store::assignments(&mute_client, (CLUSTER, "mute", "mute-1"), &names).await.unwrap();
            tokio::time::sleep(Duration::from_millis(HEARTBEAT_MS)).await;
        }
    });
    tokio::time::sleep(Duration::from_millis(2 * HEARTBEAT_MS)).await;
    let _n1 = node(&db.url(), "n1", &[]);
    let _n2 = node(&db.url(), "n2", &[]);

    // Every daemon ends up active on n1 or n2, each assignment to the mute node forced away
    // after the acknowledge timeout (and never back by a rebalance).
    wait_for_placement(&client, "all on n1 and n2", |p| !p.contains_key("mute") && loads(p) == [2, 3]).await;
    mute.abort();
    let steps = history(&client).await;
    let to_mute: Vec<&Step> = steps.iter().filter(|s| s.node_id == "mute").collect();
    assert!(to_mute.iter().any(|s| s.state == "assigning"), "the mute node was assigned work: {steps:#?}");
    assert!(to_mute.iter().all(|s| s.state != "active"), "{to_mute:#?}");
    let bound = Duration::from_millis(ACK_MS + HEARTBEAT_MS + SLACK_MS);
    for assigned in to_mute.iter().filter(|s| s.state == "assigning") {
        let Some(forced) = steps
            .iter()
            .find(|s| s.daemon == assigned.daemon && s.generation == assigned.generation && s.state == "deleted")
        else {
            panic!("{assigned:?} never ended: {steps:#?}");
        };
        assert_eq!(forced.reason.as_deref(), Some("ack_timeout"), "{forced:?}");
        let waited = after(forced.at, assigned.at);
        assert!(waited >= Duration::from_millis(ACK_MS), "forced early: {waited:?}");
        assert!(waited <= bound, "forced {waited:?} after the assignment, more than {bound:?}");
        let next = steps
            .iter()
            .find(|s| s.daemon == assigned.daemon && s.state == "assigning" && s.id > forced.id)
            .unwrap_or_else(|| panic!("{assigned:?} never reassigned"));
        assert!(next.node_id != "mute" && next.at == forced.at, "bypassed in the same pass: {next:?}");
    }
    check_history(&client, Duration::ZERO, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_drainer_is_forced_after_the_drain_timeout_and_its_late_writes_are_refused() {
    const SLOW_MS: u64 = 3500;
    let db = TestDb::new().await;
    let client = db.connect().await;
    prepare(&client).await;
    let slow = ["--slow-drain-ms", "3500"];
    let mut processes = BTreeMap::new();
    processes.insert("n1", node(&db.url(), "n1", &slow));
    processes.insert("n2", node(&db.url(), "n2", &slow));
    wait_for_placement(&client, "2 + 3", |p| loads(p) == [2, 3]).await;
    let before = history(&client).await.len();
    processes.insert("n3", node(&db.url(), "n3", &slow));
    wait_for_placement(&client, "1 + 2 + 2", |p| loads(p) == [1, 2, 2]).await;

    let steps = history(&client).await.split_off(before);
    let revoked = steps.iter().find(|s| s.state == "revoking").unwrap();
    let forced = steps
        .iter()
        .find(|s| s.daemon == revoked.daemon && s.generation == revoked.generation && s.state == "deleted")
        .unwrap();
    assert_eq!(forced.reason.as_deref(), Some("drain_timeout"), "{steps:#?}");
    // The drain time starts when the node reads the revocation (within a heartbeat), and the
    // leader passes once per heartbeat.
    let waited = after(forced.at, revoked.at);
    let bound = Duration::from_millis(DRAIN_MS + 2 * HEARTBEAT_MS + SLACK_MS);
    assert!(waited >= Duration::from_millis(DRAIN_MS) && waited <= bound, "forced after {waited:?}");
    let next = steps.iter().find(|s| s.daemon == revoked.daemon && s.state == "assigning" && s.id > forced.id).unwrap();
    assert_eq!((next.node_id.as_str(), next.at), ("n3", forced.at), "{next:?}");

    // The slow instance went on running past the drain timeout, and its fenced ticks were
    // refused once the new instance wrote.
    let old = processes.get_mut(revoked.node_id.as_str()).unwrap();
    let daemon = revoked.daemon.clone();
    let generation = revoked.generation;
    old.wait_for("the slow instance's refused tick", |l| {
        event(l) == "tick_refused" && l["daemon"] == daemon.as_str() && l["generation"] == generation
    })
    .await
    .unwrap();
    old.wait_for("the slow instance stopped", |l| {
        event(l) == "daemon_stopped" && l["daemon"] == daemon.as_str() && l["generation"] == generation
    })
    .await
    .unwrap();
    check_history(&client, Duration::from_millis(SLOW_MS + 500), &[]).await;
}

/// The history check itself, on planted records: it fails on two instances of one daemon at
/// once, and on an older generation's fenced tick after a newer one's.
#[tokio::test]
async fn the_history_check_catches_an_overlap_and_an_older_generations_tick() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    prepare(&client).await;
    let planted = [
        // Generation 1 on n1 still running half a second after generation 2 started on n2, and
        // its assignment was not forced after a drain timeout.
        "INSERT INTO daemon_runs (daemon, generation, node_id, at) VALUES
             ('d1', 1, 'n1', now()), ('d1', 1, 'n1', now() + interval '1 s'), ('d1', 2, 'n2', now() + interval '500 ms');
         INSERT INTO daemon_ticks (daemon, generation, node_id, at) VALUES ('d1', 1, 'n1', now())",
        // An admitted tick of generation 1 after one of generation 2.
        "INSERT INTO daemon_ticks (daemon, generation, node_id, at) VALUES
             ('d1', 2, 'n2', now()), ('d1', 1, 'n1', now() + interval '1 s')",
        // Generation 1 started (on a node that lapsed and came back) while generation 2 ran.
        "INSERT INTO daemon_runs (daemon, generation, node_id, at) VALUES
             ('d1', 2, 'n2', now()), ('d1', 2, 'n2', now() + interval '2 s'), ('d1', 1, 'n1', now() + interval '1 s');
         INSERT INTO daemon_ticks (daemon, generation, node_id, at) VALUES ('d1', 2, 'n2', now())",
    ];
    for plant in planted {
        client.batch_execute("TRUNCATE daemon_runs, daemon_ticks").await.unwrap();
        client.batch_execute(plant).await.unwrap();
        let url = db.url();
        let checked = tokio::spawn(async move {
            let client = fencing_tests::pg::connect(&url).await;
            check_history(&client, Duration::ZERO, &[]).await;
        })
        .await;
        assert!(checked.is_err_and(|error| error.is_panic()), "the check missed: {plant}");
    }
}

/// The watchdog thread cancels a daemon before its node expires in the store even when the
/// daemon blocks the only thread of its runtime, so that neither the heartbeats nor the
/// daemons' own task run.
#[test]
fn a_daemon_that_blocks_its_runtime_is_cancelled_before_its_node_expires() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};

    use fencing_election::Elector;
    use fencing_election::daemons::Daemons;
    use fencing_election::membership::Membership;

    let harness = tokio::runtime::Runtime::new().unwrap();
    let db = harness.block_on(TestDb::new());
    let client = harness.block_on(db.connect());
    let url = db.url();
    let cancelled_at: Arc<Mutex<Option<SystemTime>>> = Arc::new(Mutex::new(None));
    let started = Arc::new(AtomicBool::new(false));
    let (record, flag) = (Arc::clone(&cancelled_at), Arc::clone(&started));
    let node = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async move {
            let pool = crate::in_process::pool(&url);
            let membership = Membership::builder(pool.clone(), "starved")
                .node_id("s1")
                .heartbeat_interval(Duration::from_millis(400))
                .ttl(Duration::from_millis(1600))
                .query_timeout(Duration::from_millis(190))
                .build()
                .unwrap();
            let elector = Elector::builder(pool, "starved-leader").ttl(Duration::from_millis(1600)).build().unwrap();
            let daemons = Daemons::builder(membership, elector)
                .ack_timeout(Duration::from_secs(1))
                .drain_timeout(Duration::from_secs(1))
                .daemon("blocker", move |daemon| {
                    let (record, flag) = (Arc::clone(&record), Arc::clone(&flag));
                    async move {
                        let token = daemon.cancellation_token().clone();
                        std::thread::spawn(move || {
                            for _ in 0..2500 {
                                if token.is_cancelled() {
                                    // The first instance's cancellation (the node rejoins after
                                    // the block and runs it again).
                                    record.lock().unwrap().get_or_insert_with(SystemTime::now);
                                    return;
                                }
                                std::thread::sleep(Duration::from_millis(2));
                            }
                        });
                        flag.store(true, Ordering::Release);
                        // Blocks the runtime's only thread: no heartbeat, no runner pass.
                        std::thread::sleep(Duration::from_secs(4));
                    }
                })
                .build()
                .unwrap()
                .start();
            tokio::time::sleep(Duration::from_secs(7)).await;
            drop(daemons);
        });
    });
    // The node's expiry in the store once its runtime is blocked (its last heartbeat is in).
    let deadline = SystemTime::now() + Duration::from_secs(20);
    while !started.load(Ordering::Acquire) {
        assert!(SystemTime::now() < deadline, "the daemon never started");
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(300));
    let expires_at: SystemTime = harness
        .block_on(client.query_one("SELECT expires_at FROM fencing.nodes WHERE node_id = 's1'", &[]))
        .unwrap()
        .get(0);
    node.join().unwrap();
    // The store and this process share the host's clock.
    let cancelled = cancelled_at.lock().unwrap().expect("the blocked daemon was never cancelled");
    assert!(
        cancelled < expires_at,
        "cancelled at {cancelled:?}, after its node expired in the store at {expires_at:?}"
    );
}

/// A panic of the daemons' runner itself (the planted `daemons-runner-panic`: the failpoint panics
/// the runner of the cluster it names) ends leadership: the lease is released at once, every
/// daemon running on the node is cancelled, and the node leaves the cluster, so another node
/// takes over the leader's pass and the daemons. Before, the elector went on leading (renewing
/// its lease) with no leader pass, and the daemons ran on with nothing to revoke them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_panic_ends_leadership_the_nodes_daemons_and_its_membership() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use fencing_election::Elector;
    use fencing_election::daemons::Daemons;
    use fencing_election::membership::Membership;

    const PANICKY: &str = "panicky";
    let db = TestDb::new().await;
    let client = db.connect().await;
    let pool = crate::in_process::pool(&db.url());
    let membership = Membership::builder(pool.clone(), PANICKY)
        .node_id("p1")
        .heartbeat_interval(Duration::from_millis(400))
        .ttl(Duration::from_millis(1600))
        .query_timeout(Duration::from_millis(190))
        .build()
        .unwrap();
    let elector = Elector::builder(pool, "panicky-leader").ttl(Duration::from_millis(1600)).build().unwrap();
    let cancelled = Arc::new(AtomicBool::new(false));
    let returned_at: Arc<std::sync::Mutex<Option<SystemTime>>> = Arc::default();
    let (flag, returned) = (Arc::clone(&cancelled), Arc::clone(&returned_at));
    let daemons = Daemons::builder(membership, elector)
        .ack_timeout(Duration::from_secs(1))
        .drain_timeout(Duration::from_secs(1))
        .daemon("worker", move |daemon| {
            let (flag, returned) = (Arc::clone(&flag), Arc::clone(&returned));
            async move {
                daemon.cancellation_token().cancelled().await;
                flag.store(true, Ordering::Release);
                // Finishing the work in hand: the node must not leave (and let another node
                // start the daemon) before this returns.
                tokio::time::sleep(Duration::from_millis(300)).await;
                *returned.lock().unwrap() = Some(SystemTime::now());
            }
        })
        .build()
        .unwrap()
        .start();
    let started = tokio::time::Instant::now();
    while daemons.elector().and_then(|elector| elector.current_term()).is_none() || daemons.running().is_empty() {
        assert!(started.elapsed() < Duration::from_secs(20), "the node never led and ran its daemon");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let term = daemons.elector().and_then(|elector| elector.current_term()).unwrap();
    // Live node rows, and those that ended before their ttl ran out (left, not expired).
    let node_rows = "SELECT count(*) FILTER (WHERE expires_at > clock_timestamp()),
                            count(*) FILTER (WHERE expires_at < heartbeat_at + interval '1400 milliseconds')
                       FROM fencing.nodes WHERE cluster = $1";
    let live: i64 = client.query_one(node_rows, &[&PANICKY]).await.unwrap().get(0);
    assert_eq!(live, 1);

    fail::cfg("daemons-runner-panic", &format!("return({PANICKY})")).unwrap();
    // The next pass comes within a heartbeat interval; the release and the leave within a query
    // timeout after it. Well before the lease's ttl (1.6 s) or the node's would end either.
    let panicked = tokio::time::Instant::now();
    loop {
        let lease = store::get_lease(&client, "panicky-leader").await.unwrap().unwrap();
        let row = client.query_one(node_rows, &[&PANICKY]).await.unwrap();
        let (live, left): (i64, i64) = (row.get(0), row.get(1));
        // Released, not expired: its end came well before the renewal's ttl ran out.
        let released = lease.term == term
            && lease.remaining.is_zero()
            && lease.expires_at < lease.renewed_at + Duration::from_millis(1400);
        if released && live == 0 && left == 1 && cancelled.load(Ordering::Acquire) {
            break;
        }
        assert!(
            panicked.elapsed() < Duration::from_secs(10),
            "after the runner panicked: lease {lease:?}, {live} live node rows, {left} left, daemon cancelled: {}",
            cancelled.load(Ordering::Acquire)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    fail::remove("daemons-runner-panic");
    // The store and this process share the host's clock.
    let left_at: SystemTime =
        client.query_one("SELECT expires_at FROM fencing.nodes WHERE cluster = $1", &[&PANICKY]).await.unwrap().get(0);
    let returned = returned_at.lock().unwrap().expect("the daemon returned");
    assert!(returned <= left_at, "the node left at {left_at:?}, before its daemon returned at {returned:?}");
    assert_eq!(daemons.elector().and_then(|elector| elector.current_term()), None, "no longer leading");
    assert!(daemons.running().is_empty(), "no daemon runs here: {:?}", daemons.running());
    daemons.shutdown().await;
}
