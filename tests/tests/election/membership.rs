//! Cluster membership against a real PostgreSQL: every node hears every join and leave, from
//! the table; a node that stops heartbeating is heard leaving within its ttl plus one
//! heartbeat; one node id is live in one process at a time.

use std::collections::BTreeSet;
use std::time::Duration;

use fencing_election::membership::{MemberEvent, Membership, MembershipHandle};
use fencing_tests::pg::TestDb;

use crate::in_process::pool;
use tokio::sync::broadcast;
use tokio::time::Instant;

const INTERVAL: Duration = Duration::from_millis(300);
// Generous for a loaded CI machine, and under half the interval as the builder asks.
const QUERY_TIMEOUT: Duration = Duration::from_millis(140);
const TTL: Duration = Duration::from_millis(1500);

fn node(db: &TestDb, id: &str, ttl: Duration) -> MembershipHandle {
    Membership::builder(pool(&db.url()), "cluster-a")
        .node_id(id)
        .metadata(format!(r#"{{"zone":"{id}-zone"}}"#))
        .heartbeat_interval(INTERVAL)
        .query_timeout(QUERY_TIMEOUT)
        .ttl(ttl)
        .build()
        .unwrap()
        .start()
}

/// The next event matching `wanted` within `within`, or a panic naming what was awaited.
async fn next_event(
    events: &mut broadcast::Receiver<MemberEvent>,
    within: Duration,
    what: &str,
    wanted: impl Fn(&MemberEvent) -> bool,
) -> MemberEvent {
    let deadline = Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, events.recv()).await {
            Ok(Ok(event)) if wanted(&event) => return event,
            Ok(Ok(_)) => {}
            Ok(Err(error)) => panic!("{what}: events ended: {error}"),
            Err(_) => panic!("{what}: not heard within {within:?}"),
        }
    }
}

fn joined(id: &'static str) -> impl Fn(&MemberEvent) -> bool {
    move |event| matches!(event, MemberEvent::NodeJoined(node) if node.node_id == id)
}

fn left(id: &'static str) -> impl Fn(&MemberEvent) -> bool {
    move |event| matches!(event, MemberEvent::NodeLeft(node) if node.node_id == id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_hears_every_join_with_metadata_and_lists_the_live_nodes() {
    let db = TestDb::new().await;
    let nodes = [node(&db, "a", TTL), node(&db, "b", TTL), node(&db, "c", TTL)];
    let mut streams: Vec<_> = nodes.iter().map(MembershipHandle::events).collect();
    for (index, events) in streams.iter_mut().enumerate() {
        let mut heard = BTreeSet::new();
        while heard.len() < 3 {
            let event = next_event(events, Duration::from_secs(10), &format!("node {index}: three joins"), |event| {
                matches!(event, MemberEvent::NodeJoined(_))
            })
            .await;
            if let MemberEvent::NodeJoined(member) = event {
                assert_eq!(member.metadata.replace(' ', ""), format!(r#"{{"zone":"{}-zone"}}"#, member.node_id));
                heard.insert(member.node_id);
            }
        }
    }
    for handle in &nodes {
        let ids: Vec<String> = handle.members().into_iter().map(|member| member.node_id).collect();
        assert_eq!(ids, ["a", "b", "c"], "{} lists every live node", handle.node_id());
        assert!(handle.is_registered(), "{} is registered", handle.node_id());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_stops_heartbeating_is_heard_leaving_within_its_ttl_plus_one_heartbeat() {
    let db = TestDb::new().await;
    let a = node(&db, "a", TTL);
    let mut events = a.events();
    let c = node(&db, "c", TTL);
    next_event(&mut events, Duration::from_secs(10), "c joins", joined("c")).await;
    // Gone without leaving, as a killed process is: its row stays until it expires.
    drop(c);
    next_event(&mut events, TTL + Duration::from_secs(10), "c leaves", left("c")).await;
    // Measured on the store's clock against c's own expiry: heard after it (never while c was
    // live), and within one heartbeat of the observer after it, plus scheduling slack.
    let client = db.connect().await;
    let row = client
        .query_one(
            "SELECT expires_at, clock_timestamp() FROM fencing.nodes WHERE cluster = 'cluster-a' AND node_id = 'c'",
            &[],
        )
        .await
        .unwrap();
    let (expired, now): (std::time::SystemTime, std::time::SystemTime) = (row.get(0), row.get(1));
    let after = now.duration_since(expired).expect("c was heard leaving before its row expired");
    assert!(after <= INTERVAL + Duration::from_secs(1), "c was heard leaving {after:?} after it expired");
    assert_eq!(a.members().into_iter().map(|member| member.node_id).collect::<Vec<_>>(), ["a"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_shuts_down_is_heard_leaving_at_the_next_read() {
    let db = TestDb::new().await;
    let long = Duration::from_secs(30);
    let a = node(&db, "a", long);
    let mut events = a.events();
    let b = node(&db, "b", long);
    next_event(&mut events, Duration::from_secs(10), "b joins", joined("b")).await;
    assert!(b.shutdown().await, "the leave is recorded");
    // Long before the 30 s ttl.
    next_event(&mut events, Duration::from_secs(5), "b leaves", left("b")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_node_id_is_live_in_one_process_at_a_time_and_the_second_joins_after_the_first_leaves() {
    let db = TestDb::new().await;
    let observer = node(&db, "observer", TTL);
    let mut events = observer.events();
    let first = node(&db, "dup", TTL);
    let joined_first = next_event(&mut events, Duration::from_secs(10), "dup joins", joined("dup")).await;
    let second = node(&db, "dup", TTL);
    let mut second_events = second.events();
    next_event(
        &mut second_events,
        Duration::from_secs(10),
        "the second hears the conflict",
        |event| matches!(event, MemberEvent::IdentityConflict { node_id } if node_id == "dup"),
    )
    .await;
    assert!(!second.is_registered(), "the second process is not registered while the first holds the id");
    // The first keeps its incarnation meanwhile: no leave, no second join of "dup".
    tokio::time::sleep(INTERVAL * 4).await;
    let listed: Vec<_> = observer.members().into_iter().filter(|member| member.node_id == "dup").collect();
    let MemberEvent::NodeJoined(first_seen) = &joined_first else { unreachable!() };
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].started_at, first_seen.started_at, "the first incarnation still holds the id");
    while let Ok(event) = events.try_recv() {
        assert!(
            !matches!(&event, MemberEvent::NodeLeft(node) | MemberEvent::NodeJoined(node) if node.node_id == "dup"),
            "the id changed hands while the first was live: {event:?}"
        );
    }
    // The first leaves: the second joins as a new incarnation.
    assert!(first.shutdown().await);
    next_event(&mut events, Duration::from_secs(5), "the first leaves", left("dup")).await;
    let MemberEvent::NodeJoined(second_seen) =
        next_event(&mut events, Duration::from_secs(5), "the second joins", joined("dup")).await
    else {
        unreachable!()
    };
    assert!(second_seen.started_at > first_seen.started_at, "a new incarnation");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !second.is_registered() {
        assert!(Instant::now() < deadline, "the second never registered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn settings_that_cannot_work_are_refused() {
    let db = TestDb::new().await;
    let builder = || Membership::builder(pool(&db.url()), "cluster-a").node_id("n");
    let refused = |result: Result<Membership, fencing_election::Error>, fragment: &str| match result {
        Err(fencing_election::Error::InvalidSetting(message)) => {
            assert!(message.contains(fragment), "{message:?} lacks {fragment:?}")
        }
        other => panic!("expected a refusal about {fragment}, got {other:?}"),
    };
    // The defaults: 15 s heartbeats, 90 s ttl.
    let defaults = Membership::builder(pool(&db.url()), "cluster-a").build().unwrap();
    assert_eq!((defaults.heartbeat_interval(), defaults.ttl()), (Duration::from_secs(15), Duration::from_secs(90)));
    assert!(!defaults.node_id().is_empty());
    assert_eq!(
        defaults.node_id(),
        Membership::builder(pool(&db.url()), "other").build().unwrap().node_id(),
        "the default node id is the process's"
    );
    refused(builder().ttl(Duration::from_secs(40)).build(), "at least 3 heartbeat intervals");
    refused(builder().query_timeout(Duration::from_millis(15_001)).build(), "at most the heartbeat interval");
    refused(builder().query_timeout(Duration::ZERO).build(), "must be positive");
    assert_eq!(builder().build().unwrap().query_timeout(), Duration::from_secs(15), "the interval");
    refused(builder().heartbeat_interval(Duration::from_millis(1)).build(), "heartbeat interval");
    refused(builder().metadata("[1, 2]").build(), "JSON object");
    refused(builder().metadata(format!(r#"{{"x":"{}"}}"#, "y".repeat(9000))).build(), "JSON object");
    refused(builder().node_id("").build(), "node id");
    refused(Membership::builder(pool(&db.url()), "").node_id("n").build(), "cluster");
    // A leader that assigns work must hold its lease markedly longer than a heartbeat.
    let node = builder().build().unwrap();
    refused(node.check_leader_ttl(Duration::from_secs(10)).map(|()| node.clone()), "at least 2 heartbeat intervals");
    assert!(node.check_leader_ttl(Duration::from_secs(30)).is_ok());
}

/// Membership at scale with real processes (the `member-load` binary): 50 nodes heartbeating
/// every 100 ms in 5 processes, each node an observer. Nobody stops, so every leave heard and
/// every second join of a node is spurious: there are none, every observer hears all 50 join,
/// a heartbeat costs one Postgres transaction (its read of the members included; the issue's
/// bound is 2, and this asserts under 1.5), and connections are not replaced again and again (a
/// slow call keeps its connection). The
/// registration ttl is 1 s here, not the 300 ms of the README's table, as this runs beside other
/// tests on a loaded CI machine; the table's runs are `member-load` as printed there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_nodes_at_100_ms_hear_no_spurious_leave_or_join_at_one_transaction_per_heartbeat() {
    let report = member_load("100", "10").await;
    let number = |name: &str| report[name].as_f64().unwrap_or_else(|| panic!("{name} missing: {report}"));
    assert_eq!(number("spurious_leaves"), 0.0, "{report}");
    assert_eq!(number("spurious_joins"), 0.0, "{report}");
    assert_eq!(number("lagged"), 0.0, "{report}");
    assert_eq!(number("heard_all"), 50.0, "{report}");
    assert!(number("heartbeats") > 0.0, "{report}");
    assert!(number("transactions_per_heartbeat") < 1.5, "more than one transaction per heartbeat: {report}");
    // The pools hold 40 at most. A few more are allowed: the server ends the session of a
    // process that stalled more than a second inside a transaction (this runs beside other
    // tests). A design that reconnects after each slow call opens thousands here.
    assert!(number("sessions_opened") <= 80.0, "connections were replaced again and again: {report}");
}

/// A server too slow to answer within a call's timeout: 50 nodes heartbeating every 30 ms in 5
/// processes ask for about three times what two cores can answer, so calls time out, many
/// while their pool is still opening a connection for them. Such a connection is opened to the
/// end and kept in the pool, never abandoned halfway: the pools (40 connections at most) are
/// opened once. Abandoning them (as a plain `timeout(pool.get())` does) opened 1,758 sessions in
/// 6 s here, every call starting one more backend that none lived to use, and no observer heard
/// all 50 nodes (the same collapse that failed the 100 ms test above on a loaded CI machine).
/// Whether every observer hears all 50 at this overload is not asserted: a members read that
/// cannot be made at once is skipped, by design, and at three times the server's capacity many
/// are (one run of the fixed code heard all, another none; the 100 ms test asserts it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overloaded_server_gets_each_pool_opened_once_not_a_new_session_per_timed_out_call() {
    let report = member_load("30", "4").await;
    let number = |name: &str| report[name].as_f64().unwrap_or_else(|| panic!("{name} missing: {report}"));
    assert!(number("heartbeat_failures") > 0.0, "the server kept up: this proves nothing: {report}");
    assert!(number("sessions_opened") <= 80.0, "connections were opened again and again: {report}");
    assert!(number("heartbeats") > 0.0, "{report}");
}

/// Runs `member-load` with 50 nodes in 5 processes (pools of 8, a 1 s registration ttl) at
/// `interval_ms` for `seconds`, and returns its JSON report.
async fn member_load(interval_ms: &str, seconds: &str) -> serde_json::Value {
    let binary = fencing_tests::workspace_bin("member-load").unwrap();
    let output = tokio::process::Command::new(binary)
        .args(["--nodes", "50", "--processes", "5", "--interval-ms", interval_ms, "--ttl-ms", "1000"])
        .args(["--seconds", seconds, "--pool", "8", "--json"])
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "member-load failed: {stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    println!("{stdout}");
    serde_json::from_str(stdout.trim()).unwrap()
}
