//! Daemon assignments in SQL: `fencing.reconcile_daemons`, `fencing.assignments`,
//! `fencing.ack_daemon`, `fencing.daemon_stopped`, each driven by the session that would break
//! its rule: a zombie leader, a forged term, a late or foreign acknowledgement.

use std::time::Duration;

use fencing_schema::{SQLSTATE_INVALID_ARGUMENT, store};
use fencing_tests::pg::TestDb;
use fencing_tests::{message, snapshot, sqlstate};
use tokio_postgres::Client;

const CLUSTER: &str = "c";
const LEASE: &str = "c-leader";
const DAEMONS: &str = "SELECT daemon, state, generation, node_id, term FROM fencing.daemons ORDER BY daemon";

async fn beat(client: &Client, node: &str, incarnation: &str) {
    let ok: bool = client
        .query_one(
            "SELECT ok FROM fencing.heartbeat($1, $2, $3, $2, interval '10 seconds', '{}')",
            &[&CLUSTER, &node, &incarnation],
        )
        .await
        .unwrap()
        .get(0);
    assert!(ok, "{node} heartbeats");
}

/// Offers `daemons` as node `node` and returns its assignments as (daemon, generation, state).
async fn offer(client: &Client, node: &str, incarnation: &str, daemons: &[&str]) -> Vec<(String, i64, String)> {
    store::assignments(client, (CLUSTER, node, incarnation), daemons)
        .await
        .unwrap()
        .into_iter()
        .map(|a| (a.daemon, a.generation, a.state))
        .collect()
}

/// A leader's pass with long timeouts: nothing is forced unless a test expires it on purpose.
async fn reconcile(
    client: &impl tokio_postgres::GenericClient,
    owner: &str,
    term: i64,
) -> Result<Vec<store::DaemonChange>, fencing_schema::Error> {
    store::reconcile_daemons(client, CLUSTER, (LEASE, owner, term), Duration::from_secs(30), Duration::from_secs(30))
        .await
}

/// A leader's pass with the shortest timeouts, for the tests of what happens when they pass.
async fn reconcile_short(client: &Client, owner: &str, term: i64) -> Vec<store::DaemonChange> {
    store::reconcile_daemons(client, CLUSTER, (LEASE, owner, term), Duration::from_secs(1), Duration::from_secs(1))
        .await
        .unwrap()
}

async fn ack(client: &Client, node: &str, incarnation: &str, daemon: &str, generation: i64) -> bool {
    store::ack_daemon(client, (CLUSTER, node, incarnation), daemon, generation).await.unwrap().is_some()
}

#[tokio::test]
async fn daemons_spread_over_the_nodes_that_offer_them_and_start_only_once_acknowledged() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    beat(&client, "n1", "i1").await;
    beat(&client, "n2", "i2").await;
    offer(&client, "n1", "i1", &["a", "b", "c"]).await;
    offer(&client, "n2", "i2", &["a", "b", "c", "only-n2"]).await;
    let term = store::acquire(&client, LEASE, "leader", Duration::from_secs(10)).await.unwrap().term.unwrap();

    let changes = reconcile(&client, "leader", term).await.unwrap();
    assert_eq!(changes.len(), 4, "{changes:?}");
    assert!(changes.iter().all(|c| c.state == "assigning"), "{changes:?}");
    let mut generations: Vec<i64> = changes.iter().map(|c| c.generation).collect();
    generations.dedup();
    assert_eq!(generations.len(), 4, "every assignment has a generation of its own: {changes:?}");
    let n1 = offer(&client, "n1", "i1", &["a", "b", "c"]).await;
    let n2 = offer(&client, "n2", "i2", &["a", "b", "c", "only-n2"]).await;
    assert_eq!(n1.len() + n2.len(), 4);
    assert!(n1.len() == 2 && n2.len() == 2, "least loaded first: {n1:?} {n2:?}");
    assert!(n2.iter().any(|(daemon, ..)| daemon == "only-n2"), "only a node that offers it runs it: {n2:?}");

    // Another node cannot acknowledge n1's assignment, nor n1 another incarnation's or generation's.
    let (daemon, generation, _) = n1[0].clone();
    assert!(!ack(&client, "n2", "i2", &daemon, generation).await);
    assert!(!ack(&client, "n1", "not-i1", &daemon, generation).await);
    assert!(!ack(&client, "n1", "i1", &daemon, generation + 1).await);
    assert!(ack(&client, "n1", "i1", &daemon, generation).await);
    assert!(!ack(&client, "n1", "i1", &daemon, generation).await, "acknowledged once");
    let states = snapshot(&client, DAEMONS).await;
    assert!(states.iter().any(|row| row.contains(&daemon) && row.contains("active")), "{states:?}");
}

#[tokio::test]
async fn a_zombie_or_forged_leader_changes_no_assignment() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    beat(&client, "n1", "i1").await;
    offer(&client, "n1", "i1", &["a", "b"]).await;
    let old = store::acquire(&client, LEASE, "old", Duration::from_secs(1)).await.unwrap().term.unwrap();
    reconcile(&client, "old", old).await.unwrap();
    client.batch_execute("SELECT pg_sleep(1.1)").await.unwrap();
    let new = store::acquire(&client, LEASE, "new", Duration::from_secs(10)).await.unwrap().term.unwrap();
    assert!(new > old);
    beat(&client, "n2", "i2").await;
    offer(&client, "n2", "i2", &["a", "b"]).await;

    let before = snapshot(&client, DAEMONS).await;
    let history = snapshot(&client, "SELECT * FROM fencing.daemon_history").await;
    // The old leader, paused past its lease and resumed: its term is stale.
    for (owner, term, why) in [
        ("old", old, "a zombie leader's term"),
        ("old", new, "the current term presented by a non-holder"),
        ("new", old, "the holder with an old term"),
        ("new", new + 1, "a future term"),
    ] {
        let refused = reconcile(&client, owner, term).await.unwrap_err();
        assert!(matches!(refused, fencing_schema::Error::Refused { .. }), "{why}: {refused:?}");
        assert_eq!(snapshot(&client, DAEMONS).await, before, "{why} changed an assignment");
        assert_eq!(snapshot(&client, "SELECT * FROM fencing.daemon_history").await, history, "{why}");
    }
    // The holder's own pass goes through (raising the cluster's fence to its term), and every
    // row it touches carries its term: n1 expires, its daemons move to n2.
    reconcile(&client, "new", new).await.unwrap();
    let max: i64 = client
        .query_one("SELECT max_term FROM fencing.fences WHERE resource = 'fencing.daemons/c'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(max, new);
    client.batch_execute("UPDATE fencing.nodes SET expires_at = clock_timestamp() WHERE node_id = 'n1'").await.unwrap();
    let changes = reconcile(&client, "new", new).await.unwrap();
    assert!(!changes.is_empty());
    let terms: Vec<i64> = client
        .query("SELECT term FROM fencing.daemons WHERE state <> 'active'", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert!(terms.iter().all(|term| *term == new), "{terms:?}");
    // A lease held past its store expiry is no leadership either.
    client.batch_execute("UPDATE fencing.leases SET expires_at = clock_timestamp() - interval '1 ms'").await.unwrap();
    let expired = reconcile(&client, "new", new).await.unwrap_err();
    assert!(matches!(expired, fencing_schema::Error::Refused { .. }), "{expired:?}");
    // And the fence of the assignments cannot be bound to another lease.
    let other = store::acquire(&client, "other-lease", "x", Duration::from_secs(10)).await.unwrap().term.unwrap();
    let error = client
        .query(
            "SELECT * FROM fencing.reconcile_daemons($1, 'other-lease', 'x', $2, interval '1 s', interval '1 s')",
            &[&CLUSTER, &other],
        )
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&error), Some(SQLSTATE_INVALID_ARGUMENT), "{}", message(&error));
}

#[tokio::test]
async fn an_unacknowledged_or_undrained_assignment_is_forced_to_another_node_after_its_deadline() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    beat(&client, "n1", "i1").await;
    offer(&client, "n1", "i1", &["a"]).await;
    let term = store::acquire(&client, LEASE, "leader", Duration::from_secs(30)).await.unwrap().term.unwrap();
    reconcile(&client, "leader", term).await.unwrap();
    beat(&client, "n2", "i2").await;
    offer(&client, "n2", "i2", &["a"]).await;
    // n1 never acknowledges: before the deadline nothing moves, after it the next goes to n2.
    assert!(reconcile(&client, "leader", term).await.unwrap().is_empty());
    client
        .batch_execute("UPDATE fencing.daemons SET deadline = clock_timestamp() - interval '1 ms' WHERE daemon = 'a'")
        .await
        .unwrap();
    assert!(!ack(&client, "n1", "i1", "a", 1).await, "an acknowledgement after the deadline is refused");
    let changes = reconcile(&client, "leader", term).await.unwrap();
    let summary: Vec<(String, String, Option<String>)> =
        changes.iter().map(|c| (c.state.clone(), c.node_id.clone(), c.reason.clone())).collect();
    assert_eq!(
        summary,
        [
            ("deleted".to_owned(), "n1".to_owned(), Some("ack_timeout".to_owned())),
            ("assigning".to_owned(), "n2".to_owned(), Some("ack_timeout".to_owned())),
        ]
    );
    assert!(ack(&client, "n2", "i2", "a", 2).await);
    // n1 cannot end n2's assignment with its old generation.
    assert!(!store::daemon_stopped(&client, (CLUSTER, "n1", "i1"), "a", 1).await.unwrap());

    // A node joins: n2 holds 1, n3 holds 0 -> no move (a difference of one is balanced).
    beat(&client, "n3", "i3").await;
    offer(&client, "n3", "i3", &["a", "b", "c"]).await;
    offer(&client, "n2", "i2", &["a", "b", "c"]).await;
    // b to n3 (0 against n2's 1), c to n2 (a tie, by node id); a stays on n2: n1 timed out on
    // it, so no rebalance moves it back there.
    reconcile(&client, "leader", term).await.unwrap();
    for (node, incarnation, offers) in
        [("n1", "i1", &["a"][..]), ("n2", "i2", &["a", "b", "c"]), ("n3", "i3", &["a", "b", "c"])]
    {
        for (daemon, generation, state) in offer(&client, node, incarnation, offers).await {
            if state == "assigning" {
                assert!(ack(&client, node, incarnation, &daemon, generation).await);
            }
        }
    }
    assert!(
        reconcile(&client, "leader", term).await.unwrap().is_empty(),
        "balanced: {:?}",
        snapshot(&client, DAEMONS).await
    );

    // Revoked and not drained by the deadline: forced elsewhere, and the node's late
    // confirmation changes nothing.
    client.batch_execute("UPDATE fencing.nodes SET daemons = '{}' WHERE node_id = 'n1'").await.unwrap();
    let holder: String =
        client.query_one("SELECT node_id FROM fencing.daemons WHERE daemon = 'a'", &[]).await.unwrap().get(0);
    client
        .batch_execute(&format!(
            "UPDATE fencing.daemons SET state = 'revoking', deadline = clock_timestamp() + interval '100 ms'
              WHERE daemon = 'a' AND node_id = '{holder}'"
        ))
        .await
        .unwrap();
    client.batch_execute("SELECT pg_sleep(0.15)").await.unwrap();
    let changes = reconcile(&client, "leader", term).await.unwrap();
    assert!(
        changes.iter().any(|c| c.daemon == "a" && c.reason.as_deref() == Some("drain_timeout") && c.state == "deleted"),
        "{changes:?}"
    );
    let next: String =
        client.query_one("SELECT node_id FROM fencing.daemons WHERE daemon = 'a'", &[]).await.unwrap().get(0);
    assert_ne!(next, holder, "forced to another node");
}

/// A node that let an assignment's acknowledge time out (a slow or stalled node, a clock the
/// store disagrees with) is not handed that daemon, nor any other, straight back: not by the next
/// pass even when it is the only node offering them, and no rebalance moves work onto it for ten
/// acknowledge timeouts. Once one acknowledge timeout has passed, it may have work again when
/// nobody else offers it.
#[tokio::test]
async fn a_node_that_let_an_acknowledge_time_out_is_not_handed_work_straight_back() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    let pass = async |term: i64| {
        store::reconcile_daemons(
            &client,
            CLUSTER,
            (LEASE, "leader", term),
            Duration::from_secs(2),
            Duration::from_secs(30),
        )
        .await
        .unwrap()
    };
    let expire_acks = async || {
        client
            .batch_execute(
                "UPDATE fencing.daemons SET deadline = clock_timestamp() - interval '1 ms' WHERE state = 'assigning'",
            )
            .await
            .unwrap()
    };
    beat(&client, "slow", "s1").await;
    offer(&client, "slow", "s1", &["a", "b"]).await;
    let term = store::acquire(&client, LEASE, "leader", Duration::from_secs(30)).await.unwrap().term.unwrap();
    let first = pass(term).await;
    assert_eq!(first.iter().filter(|c| c.state == "assigning" && c.node_id == "slow").count(), 2, "{first:?}");
    expire_acks().await;
    let forced = pass(term).await;
    assert_eq!(forced.iter().filter(|c| c.reason.as_deref() == Some("ack_timeout")).count(), 2, "{forced:?}");
    assert!(forced.iter().all(|c| c.state != "assigning"), "handed straight back: {forced:?}");
    assert!(pass(term).await.is_empty(), "nor by the pass after");

    // Another node offers them and c: it gets all three. The slow node then offers c too, which
    // it never timed out on: still no rebalance moves c onto it for ten acknowledge timeouts.
    beat(&client, "n2", "i2").await;
    offer(&client, "n2", "i2", &["a", "b", "c"]).await;
    let moved = pass(term).await;
    assert_eq!(moved.iter().filter(|c| c.state == "assigning" && c.node_id == "n2").count(), 3, "{moved:?}");
    for (daemon, generation, state) in offer(&client, "n2", "i2", &["a", "b", "c"]).await {
        assert_eq!(state, "assigning");
        assert!(ack(&client, "n2", "i2", &daemon, generation).await);
    }
    offer(&client, "slow", "s1", &["a", "b", "c"]).await;
    assert!(
        pass(term).await.is_empty(),
        "a rebalance onto the node that timed out: {:?}",
        snapshot(&client, DAEMONS).await
    );

    // Ten acknowledge timeouts later (the history moved back in time), c is moved there.
    client
        .batch_execute("UPDATE fencing.daemon_history SET at = at - interval '21 s' WHERE reason = 'ack_timeout'")
        .await
        .unwrap();
    let rebalanced = pass(term).await;
    let revoked: Vec<_> =
        rebalanced.iter().map(|c| (c.daemon.as_str(), c.state.as_str(), c.node_id.as_str())).collect();
    assert_eq!(revoked, [("c", "revoking", "n2")]);

    // Alone again one acknowledge timeout after its last: it gets the work, nobody else offers it.
    client.batch_execute("UPDATE fencing.nodes SET expires_at = clock_timestamp() WHERE node_id = 'n2'").await.unwrap();
    client
        .batch_execute(
            "UPDATE fencing.daemon_history SET at = clock_timestamp() - interval '3 s' WHERE reason = 'ack_timeout'",
        )
        .await
        .unwrap();
    let alone = pass(term).await;
    let mut to_slow: Vec<&str> =
        alone.iter().filter(|c| c.state == "assigning" && c.node_id == "slow").map(|c| c.daemon.as_str()).collect();
    to_slow.sort_unstable();
    assert_eq!(to_slow, ["a", "b", "c"], "{alone:?}");
}

#[tokio::test]
async fn a_joining_node_gets_work_by_one_bounded_move_at_a_time_and_a_dead_nodes_work_moves() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    let names = ["d1", "d2", "d3", "d4", "d5"];
    beat(&client, "n1", "i1").await;
    offer(&client, "n1", "i1", &names).await;
    let term = store::acquire(&client, LEASE, "leader", Duration::from_secs(30)).await.unwrap().term.unwrap();
    let settle = async |nodes: &[(&str, &str)]| {
        for _ in 0..10 {
            let changes = reconcile(&client, "leader", term).await.unwrap();
            for (node, incarnation) in nodes {
                for (daemon, generation, state) in offer(&client, node, incarnation, &names).await {
                    match state.as_str() {
                        "assigning" => assert!(ack(&client, node, incarnation, &daemon, generation).await),
                        "revoking" => assert!(
                            store::daemon_stopped(&client, (CLUSTER, node, incarnation), &daemon, generation)
                                .await
                                .unwrap()
                        ),
                        _ => {}
                    }
                }
            }
            if changes.is_empty() {
                return;
            }
        }
        panic!("no steady state: {:?}", snapshot(&client, DAEMONS).await);
    };
    settle(&[("n1", "i1")]).await;
    beat(&client, "n2", "i2").await;
    beat(&client, "n3", "i3").await;
    offer(&client, "n2", "i2", &names).await;
    offer(&client, "n3", "i3", &names).await;
    settle(&[("n1", "i1"), ("n2", "i2"), ("n3", "i3")]).await;
    let loads: Vec<i64> = client
        .query("SELECT count(*) FROM fencing.daemons GROUP BY node_id ORDER BY 1", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(loads, [1, 2, 2]);
    // From 5-0-0 to 2-2-1 takes three moves: only the rebalance revocations needed, one per pass.
    let moves: i64 = client
        .query_one("SELECT count(*) FROM fencing.daemon_history WHERE state = 'revoking' AND reason = 'rebalance'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(moves, 3);

    // n3 stops heartbeating: its daemons move on the first pass after it expired.
    client.batch_execute("UPDATE fencing.nodes SET expires_at = clock_timestamp() WHERE node_id = 'n3'").await.unwrap();
    let changes = reconcile(&client, "leader", term).await.unwrap();
    let ended = changes.iter().filter(|c| c.state == "deleted" && c.reason.as_deref() == Some("node_expired")).count();
    let assigned = changes.iter().filter(|c| c.state == "assigning").count();
    assert!(ended >= 1 && ended == assigned, "{changes:?}");
    assert!(changes.iter().filter(|c| c.state == "assigning").all(|c| c.node_id != "n3"));
}

#[tokio::test]
async fn bad_input_is_refused_and_a_node_not_live_as_itself_sees_nothing() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    beat(&client, "n1", "i1").await;
    let many: Vec<String> = (0..101).map(|i| format!("d{i}")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    let long = "x".repeat(257);
    for (offered, why) in [(many, "101 daemons"), (vec![""], "an empty name"), (vec![long.as_str()], "a long name")] {
        let error =
            client.query("SELECT * FROM fencing.assignments('c', 'n1', 'i1', $1)", &[&offered]).await.unwrap_err();
        assert_eq!(sqlstate(&error), Some(SQLSTATE_INVALID_ARGUMENT), "{why}: {}", message(&error));
    }
    let error = client.query("SELECT * FROM fencing.assignments('c', 'n1', 'i1', NULL)", &[]).await.unwrap_err();
    assert_eq!(sqlstate(&error), Some(SQLSTATE_INVALID_ARGUMENT));
    let term = store::acquire(&client, LEASE, "leader", Duration::from_secs(10)).await.unwrap().term.unwrap();
    for (ack_timeout, drain_timeout) in [("0 s", "1 s"), ("1 s", "-1 s"), ("2 hours", "1 s"), ("1 s", "500 ms")] {
        let error = client
            .query(
                "SELECT * FROM fencing.reconcile_daemons('c', $1, 'leader', $2, $3::text::interval, $4::text::interval)",
                &[&LEASE, &term, &ack_timeout, &drain_timeout],
            )
            .await
            .unwrap_err();
        assert_eq!(sqlstate(&error), Some(SQLSTATE_INVALID_ARGUMENT), "{ack_timeout} {drain_timeout}");
    }
    let long_cluster = "c".repeat(241);
    let error = client
        .query(
            "SELECT * FROM fencing.reconcile_daemons($1, $2, 'leader', $3, interval '1 s', interval '1 s')",
            &[&long_cluster, &LEASE, &term],
        )
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&error), Some(SQLSTATE_INVALID_ARGUMENT), "{}", message(&error));
    // Another incarnation of n1 (a second process with the same id) records no offer and sees
    // no assignment.
    assert!(offer(&client, "n1", "other", &["a"]).await.is_empty());
    let offered: Vec<String> =
        client.query_one("SELECT daemons FROM fencing.nodes WHERE node_id = 'n1'", &[]).await.unwrap().get(0);
    assert!(offered.is_empty(), "{offered:?}");
}

#[tokio::test]
async fn a_later_terms_pass_waits_for_the_earlier_one_to_commit_and_a_snapshot_pass_is_refused() {
    let db = TestDb::new().await;
    let mut old_session = db.connect().await;
    let client = db.connect().await;
    beat(&client, "n1", "i1").await;
    offer(&client, "n1", "i1", &["a", "b"]).await;
    let old = store::acquire(&client, LEASE, "old", Duration::from_secs(1)).await.unwrap().term.unwrap();
    // The old leader's pass, in a transaction still open: it holds the fence row.
    let open = old_session.transaction().await.unwrap();
    let first = reconcile(&open, "old", old).await.unwrap();
    assert_eq!(first.len(), 2);
    client.batch_execute("SELECT pg_sleep(1.1)").await.unwrap();
    let new = store::acquire(&client, LEASE, "new", Duration::from_secs(30)).await.unwrap().term.unwrap();
    let url = db.url();
    let next = tokio::spawn(async move {
        let client = fencing_tests::pg::connect(&url).await;
        reconcile(&client, "new", new).await.map(|changes| changes.len())
    });
    // It waits on a lock (seen by the server), and has not finished.
    let mut waiting = 0;
    for _ in 0..100 {
        waiting = client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                  WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%reconcile_daemons%'",
                &[],
            )
            .await
            .unwrap()
            .get::<_, i64>(0);
        if waiting > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(waiting, 1, "the new term's pass does not wait for the old term's open one");
    assert!(!next.is_finished(), "the new term's pass went ahead of the old term's open one");
    open.commit().await.unwrap();
    next.await.unwrap().unwrap();
    // Every step of the new term comes after every step of the old one.
    let terms: Vec<i64> = client
        .query("SELECT term FROM fencing.daemon_history ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert!(terms.windows(2).all(|pair| pair[0] <= pair[1]), "{terms:?}");
    // The old leader, again: refused.
    assert!(matches!(reconcile(&client, "old", old).await, Err(fencing_schema::Error::Refused { .. })));

    // At REPEATABLE READ or SERIALIZABLE the pass could decide on a snapshot older than a
    // node's heartbeat: refused (0A000), nothing changed.
    let before = snapshot(&client, DAEMONS).await;
    for level in ["REPEATABLE READ", "SERIALIZABLE"] {
        let mut session = db.connect().await;
        let transaction = session.build_transaction().isolation_level(match level {
            "REPEATABLE READ" => tokio_postgres::IsolationLevel::RepeatableRead,
            _ => tokio_postgres::IsolationLevel::Serializable,
        });
        let transaction = transaction.start().await.unwrap();
        let error = transaction
            .query(
                "SELECT * FROM fencing.reconcile_daemons('c', $1, 'new', $2, interval '1 s', interval '1 s')",
                &[&LEASE, &new],
            )
            .await
            .unwrap_err();
        assert_eq!(sqlstate(&error), Some("0A000"), "{level}: {}", message(&error));
    }
    assert_eq!(snapshot(&client, DAEMONS).await, before);
}

/// n1 runs `names` (three daemons), n2 joins with none: the pass (1 s timeouts) revokes one from
/// n1. The leader's term and that revocation.
async fn a_revocation_of_one_of_three(client: &Client, names: &[&str]) -> (i64, Vec<store::DaemonChange>) {
    beat(client, "n1", "i1").await;
    offer(client, "n1", "i1", names).await;
    let term = store::acquire(client, LEASE, "leader", Duration::from_secs(60)).await.unwrap().term.unwrap();
    reconcile(client, "leader", term).await.unwrap();
    for (daemon, generation, _) in offer(client, "n1", "i1", names).await {
        assert!(ack(client, "n1", "i1", &daemon, generation).await);
    }
    beat(client, "n2", "i2").await;
    offer(client, "n2", "i2", names).await;
    let revoked = reconcile_short(client, "leader", term).await;
    assert_eq!(revoked.len(), 1, "{revoked:?}");
    (term, revoked)
}

#[tokio::test]
async fn a_revocation_drains_from_when_the_node_reads_it_and_a_node_that_never_does_is_not_forced() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    let names = ["a", "b", "c"];
    let (term, revoked) = a_revocation_of_one_of_three(&client, &names).await;
    assert_eq!(revoked[0].state, "revoking");
    // n1 does not read its assignments (it is stuck, or its reads fail): past the drain
    // timeout, the daemon is not forced onto n2, where it would run beside n1's instance.
    client.batch_execute("SELECT pg_sleep(1.1)").await.unwrap();
    beat(&client, "n1", "i1").await;
    assert!(reconcile(&client, "leader", term).await.unwrap().is_empty(), "forced before the node heard of it");
    // n1 reads it: the drain time starts now, and is forced when it runs out.
    let read = offer(&client, "n1", "i1", &names).await;
    let seen = read.iter().find(|(daemon, ..)| *daemon == revoked[0].daemon).unwrap();
    assert_eq!(seen.2, "revoking");
    let remaining = store::assignments(&client, (CLUSTER, "n1", "i1"), &names)
        .await
        .unwrap()
        .into_iter()
        .find(|a| a.daemon == revoked[0].daemon)
        .and_then(|a| a.remaining)
        .unwrap();
    assert!(remaining > Duration::from_millis(500), "the drain time starts at the read: {remaining:?}");
    client.batch_execute("SELECT pg_sleep(1.05)").await.unwrap();
    // Past the acknowledge timeout too: a revocation the node read is forced, never withdrawn.
    let forced = reconcile_short(&client, "leader", term).await;
    assert!(!forced.iter().any(|c| c.reason.as_deref() == Some("revocation_unread")), "{forced:?}");
    assert!(forced.iter().any(|c| c.reason.as_deref() == Some("drain_timeout")), "{forced:?}");
}

#[tokio::test]
async fn daemons_nobody_offers_go_and_come_back_with_higher_generations() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    beat(&client, "n1", "i1").await;
    offer(&client, "n1", "i1", &["a"]).await;
    let term = store::acquire(&client, LEASE, "leader", Duration::from_secs(60)).await.unwrap().term.unwrap();
    let first = reconcile(&client, "leader", term).await.unwrap()[0].generation;
    assert!(store::daemon_stopped(&client, (CLUSTER, "n1", "i1"), "a", first).await.unwrap());
    // Renamed in a deploy: the old name goes, the cluster does not fill up with dead names.
    offer(&client, "n1", "i1", &["b"]).await;
    reconcile(&client, "leader", term).await.unwrap();
    let names: Vec<String> =
        client.query("SELECT daemon FROM fencing.daemons", &[]).await.unwrap().iter().map(|r| r.get(0)).collect();
    assert_eq!(names, ["b"]);
    // And back: its next assignment's token is above every earlier one.
    assert!(store::daemon_stopped(&client, (CLUSTER, "n1", "i1"), "b", first + 1).await.unwrap());
    offer(&client, "n1", "i1", &["a"]).await;
    let again = reconcile(&client, "leader", term).await.unwrap();
    let back = again.iter().find(|c| c.daemon == "a" && c.state == "assigning").unwrap();
    assert!(back.generation > first + 1, "{again:?}");

    // Another lease cannot lead this cluster, and is not told which one does.
    let other = store::acquire(&client, "secret-lease", "x", Duration::from_secs(10)).await.unwrap().term.unwrap();
    let error = client
        .query(
            "SELECT * FROM fencing.reconcile_daemons($1, 'secret-lease', 'x', $2, interval '1 s', interval '1 s')",
            &[&CLUSTER, &other],
        )
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&error), Some(SQLSTATE_INVALID_ARGUMENT));
    assert!(!message(&error).contains(LEASE), "{}", message(&error));
}

#[tokio::test]
async fn a_revocation_never_read_is_withdrawn_and_the_daemons_fence_cannot_be_made_by_others() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    let names = ["a", "b", "c"];
    let (term, revoked) = a_revocation_of_one_of_three(&client, &names).await;
    // n1 never reads it: after the acknowledge timeout it is withdrawn, n1 keeps the daemon.
    client.batch_execute("SELECT pg_sleep(1.05)").await.unwrap();
    beat(&client, "n1", "i1").await;
    let withdrawn = reconcile_short(&client, "leader", term).await;
    let back = withdrawn.iter().find(|c| c.daemon == revoked[0].daemon).unwrap();
    assert_eq!((back.state.as_str(), back.reason.as_deref()), ("active", Some("revocation_unread")), "{withdrawn:?}");
    let state: String = client
        .query_one("SELECT state FROM fencing.daemons WHERE daemon = $1", &[&revoked[0].daemon])
        .await
        .unwrap()
        .get(0);
    assert_eq!(state, "active");

    // Nobody but the daemons pass creates a fence under fencing.daemons/: not fencing.admit
    // (which could set a maximum no leader passes), not bind, not protect.
    client.batch_execute("CREATE TABLE t (id int)").await.unwrap();
    for (sql, why) in [
        ("SELECT fencing.admit('fencing.daemons/other', 9223372036854775807)", "admit"),
        ("SELECT fencing.bind('fencing.daemons/other', 'someone-else')", "bind"),
        ("SELECT fencing.protect('t', 'fencing.daemons/other')", "protect"),
        ("SELECT fencing.advance_fence('fencing.daemons/other', 5, 'dba', 'test')", "advance_fence"),
    ] {
        let error = client.query(sql, &[]).await.unwrap_err();
        assert_eq!(sqlstate(&error), Some(SQLSTATE_INVALID_ARGUMENT), "{why}: {}", message(&error));
        assert!(message(&error).contains("are the daemons' own"), "{why}: {}", message(&error));
    }
    // Nor the gateway's decision for a first write under that name.
    let gated: String = client
        .query_one("SELECT outcome FROM fencing.gate('fencing.daemons/other', 1, interval '1 s', 'some-lease')", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(gated, "wrong_lease");
    let fences: i64 = client
        .query_one("SELECT count(*) FROM fencing.fences WHERE resource = 'fencing.daemons/other'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(fences, 0);
}
