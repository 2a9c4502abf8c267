//! Admin actions and the record of refusals: a fence never goes back, even by hand; every
//! hand-made change leaves an audit row; the refusal record stays bounded.

use std::time::{Duration, SystemTime};

use fencing_schema::store::{self, Refusal};
use fencing_schema::{Error, SQLSTATE_INVALID_ARGUMENT};
use fencing_tests::pg::TestDb;
use fencing_tests::{fencing_state, sqlstate};

#[tokio::test]
async fn advance_fence_only_moves_forward_and_is_audited() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    store::admit(&client, "ledger", 4).await.unwrap();

    let before = fencing_state(&client).await;
    for term in [4, 2] {
        let error = client
            .execute("SELECT fencing.advance_fence('ledger', $1, 'ops', 'test')", &[&i64::from(term)])
            .await
            .unwrap_err();
        assert_eq!(sqlstate(&error), Some(SQLSTATE_INVALID_ARGUMENT), "{error}");
        assert!(fencing_tests::message(&error).contains("never goes back"));
    }
    assert_eq!(fencing_state(&client).await, before, "a refused advance changes nothing");
    assert!(store::list_audit(&client, 10).await.unwrap().is_empty(), "nothing to audit");

    store::advance_fence(&client, "ledger", 9, "ops", "zombie wrote after the incident").await.unwrap();
    assert_eq!(store::get_fence(&client, "ledger").await.unwrap().unwrap().max_term, 9);
    assert!(matches!(store::admit(&client, "ledger", 8).await, Err(Error::Refused { .. })));
    let audit = store::list_audit(&client, 10).await.unwrap();
    assert_eq!(audit.len(), 1);
    assert_eq!(
        (audit[0].actor.as_str(), audit[0].action.as_str(), audit[0].target.as_str()),
        ("ops", "advance_fence", "ledger")
    );
    assert!(audit[0].before.as_deref().is_some_and(|b| b.contains("\"max_term\": 4")), "{:?}", audit[0].before);
    assert!(audit[0].after.as_deref().is_some_and(|a| a.contains("\"max_term\": 9")), "{:?}", audit[0].after);
}

#[tokio::test]
async fn force_release_ends_a_dead_owners_period_and_the_next_holder_gets_the_next_term() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    let dead = store::acquire(&client, "jobs", "dead-owner", Duration::from_secs(600)).await.unwrap();
    assert!(!store::acquire(&client, "jobs", "new-owner", Duration::from_secs(60)).await.unwrap().ok);

    store::force_release(&client, "jobs", "ops", "owner host is gone").await.unwrap();
    let next = store::acquire(&client, "jobs", "new-owner", Duration::from_secs(60)).await.unwrap();
    assert!(next.ok);
    assert_eq!(next.term, dead.term.map(|t| t + 1));
    let audit = store::list_audit(&client, 10).await.unwrap();
    assert_eq!(
        (audit[0].action.as_str(), audit[0].target.as_str(), audit[0].reason.as_str()),
        ("force_release", "jobs", "owner host is gone")
    );

    let error = client.execute("SELECT fencing.force_release('nope', 'ops', 'x')", &[]).await.unwrap_err();
    assert_eq!(sqlstate(&error), Some(SQLSTATE_INVALID_ARGUMENT));
    let error = client.execute("SELECT fencing.force_release('jobs', '', 'x')", &[]).await.unwrap_err();
    assert_eq!(sqlstate(&error), Some(SQLSTATE_INVALID_ARGUMENT), "an audit row needs an actor");
}

#[tokio::test]
async fn the_refusal_record_keeps_only_the_newest_rows() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    let refusal = |n: i64| Refusal {
        at: SystemTime::now(),
        resource: "acct".to_owned(),
        route: Some("/ledger".to_owned()),
        outcome: "stale".to_owned(),
        presented_term: Some(n),
        current_term: Some(100),
        gateway: None,
        client_addr: Some("127.0.0.1:40000".to_owned()),
        request_id: Some(format!("req-{n}")),
        lease_key: Some("ledger-writer".to_owned()),
        owner: (n % 2 == 0).then(|| format!("owner-{n}")),
        caller: Some("billing".to_owned()),
    };
    let batch: Vec<Refusal> = (1..=5).map(refusal).collect();
    store::record_refusals(&client, &batch, "gw-1", 3).await.unwrap();
    store::record_refusals(&client, &[refusal(6)], "gw-1", 3).await.unwrap();
    let kept = store::list_refusals(&client, Some("acct"), 10).await.unwrap();
    let presented: Vec<Option<i64>> = kept.iter().map(|r| r.presented_term).collect();
    assert_eq!(presented, vec![Some(6), Some(5), Some(4)], "newest first, only three kept");
    assert!(kept.iter().all(|r| r.gateway.as_deref() == Some("gw-1") && r.current_term == Some(100)));
    assert_eq!(kept[0].client_addr.as_deref(), Some("127.0.0.1:40000"));
    assert_eq!(kept[0].request_id.as_deref(), Some("req-6"));
    let who: Vec<(Option<&str>, Option<&str>, Option<&str>)> =
        kept.iter().map(|r| (r.lease_key.as_deref(), r.owner.as_deref(), r.caller.as_deref())).collect();
    assert_eq!(
        who,
        [
            (Some("ledger-writer"), Some("owner-6"), Some("billing")),
            (Some("ledger-writer"), None, Some("billing")),
            (Some("ledger-writer"), Some("owner-4"), Some("billing"))
        ],
        "who was refused"
    );
}

/// A write refused inside Postgres rolls back with its transaction, and any row it wrote with
/// it; the count of such refusals survives the rollback.
#[tokio::test]
async fn refusals_inside_postgres_are_counted_although_their_transactions_roll_back() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    client
        .batch_execute("CREATE TABLE orders (id int PRIMARY KEY); SELECT fencing.protect('orders', 'orders');")
        .await
        .unwrap();
    assert_eq!(store::sql_refusal_count(&client).await.unwrap(), 0);
    client.batch_execute("BEGIN; SET LOCAL fencing.token = '5'; INSERT INTO orders VALUES (1); COMMIT").await.unwrap();
    for sql in [
        "BEGIN; SET LOCAL fencing.token = '4'; INSERT INTO orders VALUES (2); COMMIT",
        "BEGIN; INSERT INTO orders VALUES (3); COMMIT",
    ] {
        assert!(client.batch_execute(sql).await.is_err());
        client.batch_execute("ROLLBACK").await.unwrap();
    }
    assert!(store::admit(&client, "orders", 1).await.is_err());
    assert_eq!(store::sql_refusal_count(&client).await.unwrap(), 3, "two guard refusals and one admit");
}
