//! Cluster membership in SQL: `fencing.heartbeat`, `fencing.leave`, `fencing.members`, each
//! driven by the session that would break its rule.

use fencing_schema::SQLSTATE_INVALID_ARGUMENT;
use fencing_tests::pg::TestDb;
use fencing_tests::{message, snapshot, sqlstate};
use tokio_postgres::Client;

const BEAT: &str =
    "SELECT ok, incarnation, started_at FROM fencing.heartbeat($1, $2, $3, 'name', $4::text::interval, '{}')";

async fn beat(
    client: &Client,
    node: &str,
    incarnation: &str,
    ttl: &str,
) -> (bool, Option<String>, std::time::SystemTime) {
    let row = client.query_one(BEAT, &[&"c", &node, &incarnation, &ttl]).await.unwrap();
    (row.get(0), row.get(1), row.get(2))
}

async fn live(client: &Client) -> Vec<String> {
    client.query("SELECT node_id FROM fencing.members('c')", &[]).await.unwrap().iter().map(|row| row.get(0)).collect()
}

#[tokio::test]
async fn a_live_node_id_is_held_by_one_incarnation_and_a_node_back_after_expiry_is_a_new_one() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    let (ok, _, first_start) = beat(&client, "n", "inc-1", "10 seconds").await;
    assert!(ok);
    // Another process configured with the same id: refused while the first is live.
    let before = snapshot(&client, "SELECT * FROM fencing.nodes").await;
    let (ok, holder, started) = beat(&client, "n", "inc-2", "10 seconds").await;
    // Refused, and the holder's incarnation (what leave checks) is not given away.
    assert_eq!((ok, holder, started), (false, None, first_start));
    assert_eq!(snapshot(&client, "SELECT * FROM fencing.nodes").await, before, "a refused heartbeat changes nothing");
    // The first keeps its start while it heartbeats.
    let (ok, _, started) = beat(&client, "n", "inc-1", "10 seconds").await;
    assert!(ok && started == first_start);
    // Leaving under another incarnation does nothing; under its own, the node is gone at once.
    let left: bool = client.query_one("SELECT fencing.leave('c', 'n', 'inc-2')", &[]).await.unwrap().get(0);
    assert!(!left);
    assert_eq!(live(&client).await, ["n"]);
    let left: bool = client.query_one("SELECT fencing.leave('c', 'n', 'inc-1')", &[]).await.unwrap().get(0);
    assert!(left);
    assert!(live(&client).await.is_empty());
    // Now the second may take the id: a new incarnation, started now.
    let (ok, holder, started) = beat(&client, "n", "inc-2", "10 seconds").await;
    assert!(ok && holder.as_deref() == Some("inc-2") && started > first_start);
    // A node that expired (a paused process) and heartbeats again joins anew, even as itself.
    let (_, _, short_start) = beat(&client, "m", "inc-3", "100 milliseconds").await;
    client.batch_execute("SELECT pg_sleep(0.3)").await.unwrap();
    assert_eq!(live(&client).await, ["n"], "m expired");
    let (ok, _, again) = beat(&client, "m", "inc-3", "10 seconds").await;
    assert!(ok && again > short_start, "a node back after its expiry is a new incarnation");
    assert_eq!(live(&client).await, ["m", "n"]);
}

#[tokio::test]
async fn bad_membership_input_is_refused_and_changes_nothing() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    beat(&client, "n", "inc-1", "10 seconds").await;
    // A node id nobody holds ("fresh"): only the bad argument can be why a call is refused.
    let cases = [
        ("SELECT fencing.heartbeat('', 'fresh', 'i', 'x', '1 second', '{}')", "cluster"),
        ("SELECT fencing.heartbeat('c', NULL, 'i', 'x', '1 second', '{}')", "node id"),
        ("SELECT fencing.heartbeat('c', 'fresh', '', 'x', '1 second', '{}')", "incarnation"),
        ("SELECT fencing.heartbeat('c', 'fresh', 'i', repeat('x', 300), '1 second', '{}')", "node name"),
        ("SELECT fencing.heartbeat('c', 'fresh', 'i', 'x', '0 seconds', '{}')", "ttl"),
        ("SELECT fencing.heartbeat('c', 'fresh', 'i', 'x', '2 hours', '{}')", "ttl"),
        ("SELECT fencing.heartbeat('c', 'fresh', 'i', 'x', '1 second', 'not json')", "not JSON"),
        ("SELECT fencing.heartbeat('c', 'fresh', 'i', 'x', '1 second', '[1]')", "JSON object"),
        ("SELECT fencing.heartbeat('c', 'fresh', 'i', 'x', '1 second', NULL)", "JSON object"),
        (
            "SELECT fencing.heartbeat('c', 'fresh', 'i', 'x', '1 second', '{\"a\":\"' || repeat('x', 9000) || '\"}')",
            "8192",
        ),
        ("SELECT fencing.leave('c', '', 'inc-1')", "node id"),
        ("SELECT * FROM fencing.members(NULL)", "cluster"),
    ];
    for (sql, fragment) in cases {
        let before = snapshot(&client, "SELECT * FROM fencing.nodes").await;
        let error = client.batch_execute(sql).await.expect_err(sql);
        assert_eq!(sqlstate(&error), Some(SQLSTATE_INVALID_ARGUMENT), "{sql}: {error}");
        assert!(message(&error).contains(fragment), "{sql}: {:?} lacks {fragment:?}", message(&error));
        assert_eq!(snapshot(&client, "SELECT * FROM fencing.nodes").await, before, "{sql} changed the nodes");
    }
    // The same call with good arguments registers "fresh": the cases above failed only on theirs.
    let ok: bool = client
        .query_one("SELECT ok FROM fencing.heartbeat('c', 'fresh', 'i', 'x', '1 second', '{}')", &[])
        .await
        .unwrap()
        .get(0);
    assert!(ok);
}

#[tokio::test]
async fn nodes_gone_for_a_day_are_removed_by_the_next_heartbeat_but_never_the_caller() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    beat(&client, "old", "inc-o", "10 seconds").await;
    beat(&client, "me", "inc-m", "10 seconds").await;
    // Both expired more than a day ago (as a store clock far ahead would see them).
    client
        .batch_execute("UPDATE fencing.nodes SET expires_at = clock_timestamp() - interval '2 days', started_at = clock_timestamp() - interval '3 days'")
        .await
        .unwrap();
    let (ok, _, started) = beat(&client, "me", "inc-m", "10 seconds").await;
    assert!(ok, "the caller's own old row is reused, not deleted under it");
    assert!(started > std::time::SystemTime::now() - std::time::Duration::from_secs(60), "and it joined anew");
    let rows: Vec<String> = client
        .query("SELECT node_id FROM fencing.nodes ORDER BY node_id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(rows, ["me"], "the node gone for a day was removed");
}

#[tokio::test]
async fn a_cluster_holds_at_most_1000_live_nodes() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    client
        .batch_execute(
            "SELECT fencing.heartbeat('big', 'n' || i, 'inc', 'x', '1 minute', '{}') FROM generate_series(1, 1000) i",
        )
        .await
        .unwrap();
    let before = snapshot(&client, "SELECT node_id, started_at FROM fencing.nodes ORDER BY node_id").await;
    let error = client
        .batch_execute("SELECT fencing.heartbeat('big', 'one-more', 'inc', 'x', '1 minute', '{}')")
        .await
        .expect_err("the 1001st");
    assert_eq!(sqlstate(&error), Some(SQLSTATE_INVALID_ARGUMENT), "{error}");
    assert!(message(&error).contains("1000 live nodes"), "{}", message(&error));
    assert_eq!(snapshot(&client, "SELECT node_id, started_at FROM fencing.nodes ORDER BY node_id").await, before);
    // A live node still refreshes, and another cluster is not affected.
    client.batch_execute("SELECT fencing.heartbeat('big', 'n1', 'inc', 'x', '1 minute', '{}')").await.unwrap();
    client.batch_execute("SELECT fencing.heartbeat('small', 'n1', 'inc', 'x', '1 minute', '{}')").await.unwrap();
    let listed: i64 = client.query_one("SELECT count(*) FROM fencing.members('big')", &[]).await.unwrap().get(0);
    assert_eq!(listed, 1000);
}
