//! S4 at every isolation level: a guarded write whose snapshot predates a new grant of its
//! resource's lease is refused; and the locks that make this true never make a renewal or a
//! gateway decision of the current term wait for a writer's open transaction.

use std::time::Duration;

use fencing_schema::SQLSTATE_REFUSED;
use fencing_schema::store;
use fencing_tests::pg::TestDb;
use fencing_tests::{snapshot, sqlstate};
use tokio_postgres::Client;

const TTL: Duration = Duration::from_secs(60);
const FORWARD: Duration = Duration::from_secs(4);

async fn bound_orders(db: &TestDb) -> Client {
    let client = db.connect().await;
    client
        .batch_execute(
            "CREATE TABLE orders (id int PRIMARY KEY, item text NOT NULL);
             SELECT fencing.protect('orders', 'orders');
             SELECT fencing.bind('orders', 'order-writer');",
        )
        .await
        .unwrap();
    client
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s4_a_transaction_whose_snapshot_predates_a_new_grant_is_refused_at_every_isolation_level() {
    for level in ["READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE"] {
        let db = TestDb::new().await;
        let admin = bound_orders(&db).await;
        assert_eq!(store::acquire(&admin, "order-writer", "a", TTL).await.unwrap().term, Some(1));
        admin
            .batch_execute("BEGIN; SET LOCAL fencing.token = '1'; INSERT INTO orders VALUES (1, 'apple'); COMMIT")
            .await
            .unwrap();

        // The zombie's transaction takes its snapshot while it still leads ...
        let zombie = db.connect().await;
        zombie.batch_execute(&format!("BEGIN ISOLATION LEVEL {level}; SET LOCAL fencing.token = '1'")).await.unwrap();
        assert_eq!(snapshot(&zombie, "SELECT id FROM orders").await.len(), 1);
        // ... then its period ends and B is granted term 2, before B writes anything.
        assert!(store::release(&admin, "order-writer", "a").await.unwrap());
        assert_eq!(store::acquire(&admin, "order-writer", "b", TTL).await.unwrap().term, Some(2));

        let error = zombie.batch_execute("INSERT INTO orders VALUES (2, 'zombie')").await.unwrap_err();
        let state = sqlstate(&error).map(str::to_owned);
        assert!(
            state.as_deref() == Some(SQLSTATE_REFUSED) || state.as_deref() == Some("40001"),
            "{level}: the zombie's insert must be refused (ZF409 or 40001), got {error}"
        );
        zombie.batch_execute("ROLLBACK").await.unwrap();
        assert_eq!(snapshot(&admin, "SELECT id FROM orders ORDER BY id").await, vec![r#"{"id":1}"#], "{level}");
    }
}

/// A connection that gives up on any statement after `limit`.
async fn impatient(db: &TestDb, limit: Duration) -> Client {
    let client = db.connect().await;
    client.batch_execute(&format!("SET statement_timeout = {}", limit.as_millis())).await.unwrap();
    client
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_and_current_term_gateway_decisions_do_not_wait_for_a_guarded_writers_open_transaction() {
    let db = TestDb::new().await;
    let admin = bound_orders(&db).await;
    assert_eq!(store::acquire(&admin, "order-writer", "a", TTL).await.unwrap().term, Some(1));
    // The gateway's route writes the same resource with the same lease.
    let first = store::gate(&admin, "orders", 1, FORWARD, Some("order-writer")).await.unwrap();
    assert!(first.is_admitted(), "{first:?}");

    // A long SQL-guarded transaction of the current term stays open ...
    let mut writer = db.connect().await;
    let open = writer.transaction().await.unwrap();
    open.batch_execute("SET LOCAL fencing.token = '1'; INSERT INTO orders VALUES (1, 'apple')").await.unwrap();

    // ... while the leader renews, and the gateway decides writes whose forward deadline lies
    // beyond the horizon (so the horizon must be extended: a write to the fence row).
    let quick = impatient(&db, Duration::from_secs(1)).await;
    for _ in 0..3 {
        let renewed = store::renew(&quick, "order-writer", "a", TTL).await;
        assert!(renewed.as_ref().is_ok_and(|r| r.ok), "a renewal waited for the writer: {renewed:?}");
    }
    for forward_s in [30, 60, 120] {
        let decision = store::gate(&quick, "orders", 1, Duration::from_secs(forward_s), Some("order-writer")).await;
        assert!(
            decision.as_ref().is_ok_and(|d| d.is_admitted()),
            "a current-term decision that extends the horizon waited for the writer: {decision:?}"
        );
    }
    open.commit().await.unwrap();
}
