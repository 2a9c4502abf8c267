//! The guard trigger: `fencing.protect` on an existing table makes Postgres itself refuse
//! stale writes.

use std::time::Duration;

use fencing_schema::{SQLSTATE_REFUSED, store};
use fencing_tests::pg::TestDb;
use fencing_tests::{fencing_state, message, snapshot, sqlstate};
use tokio_postgres::Client;

const ORDERS: &str = "SELECT * FROM orders ORDER BY id";

/// A sample existing table, protected in one statement with a term column.
async fn orders(db: &TestDb) -> Client {
    let client = db.connect().await;
    client
        .batch_execute(
            "CREATE TABLE orders (id int PRIMARY KEY, item text NOT NULL, term bigint);
             SELECT fencing.protect('orders', 'orders', 'term');",
        )
        .await
        .unwrap();
    client
}

/// Runs `sql` (one or more statements, in one transaction) and expects it to be refused with
/// the fencing SQLSTATE, naming `fragment`, leaving the table and the fences unchanged.
async fn refused(client: &Client, sql: &str, fragment: &str) {
    let table_before = snapshot(client, ORDERS).await;
    let fences_before = fencing_state(client).await;
    let error = client.batch_execute(&format!("BEGIN; {sql}; COMMIT")).await.unwrap_err();
    client.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(sqlstate(&error), Some(SQLSTATE_REFUSED), "{sql}: {error}");
    assert!(message(&error).contains(fragment), "{sql}: message {:?} lacks {fragment:?}", message(&error));
    assert_eq!(snapshot(client, ORDERS).await, table_before, "{sql} left the table unchanged");
    assert_eq!(fencing_state(client).await, fences_before, "{sql} left the fences unchanged");
}

async fn admitted(client: &Client, sql: &str) {
    if let Err(error) = client.batch_execute(&format!("BEGIN; {sql}; COMMIT")).await {
        panic!("{sql}: {error}");
    }
}

async fn max_term(client: &Client, resource: &str) -> i64 {
    store::get_fence(client, resource).await.unwrap().unwrap().max_term
}

#[tokio::test]
async fn guard_refuses_stale_insert_update_and_delete_leaving_the_table_unchanged() {
    let db = TestDb::new().await;
    let client = orders(&db).await;

    admitted(&client, "INSERT INTO orders VALUES (1, 'apple', 5)").await;
    assert_eq!(max_term(&client, "orders").await, 5);
    refused(&client, "INSERT INTO orders VALUES (2, 'pear', 4)", "presented term 4, current term 5").await;
    refused(&client, "UPDATE orders SET item = 'plum', term = 4 WHERE id = 1", "presented term 4, current term 5")
        .await;
    refused(
        &client,
        "SET LOCAL fencing.token = '4'; DELETE FROM orders WHERE id = 1",
        "presented term 4, current term 5",
    )
    .await;
    refused(&client, "SET LOCAL fencing.token = '4'; TRUNCATE orders", "presented term 4, current term 5").await;

    // The message names the resource too.
    refused(&client, "INSERT INTO orders VALUES (3, 'fig', 1)", "resource \"orders\"").await;
}

#[tokio::test]
async fn guard_takes_the_term_from_the_column_or_from_set_local_fencing_token() {
    let db = TestDb::new().await;
    let client = orders(&db).await;

    // From the column, on INSERT and on an UPDATE that changes it.
    admitted(&client, "INSERT INTO orders VALUES (1, 'apple', 3)").await;
    admitted(&client, "UPDATE orders SET item = 'apple pie', term = 4 WHERE id = 1").await;
    assert_eq!(max_term(&client, "orders").await, 4);

    // From the setting: it wins over the column, and the admitted term is written into it.
    admitted(&client, "SET LOCAL fencing.token = '6'; INSERT INTO orders VALUES (2, 'pear', 1)").await;
    admitted(&client, "SET LOCAL fencing.token = '6'; UPDATE orders SET item = 'apple tart' WHERE id = 1").await;
    let rows = snapshot(&client, "SELECT id, term FROM orders ORDER BY id").await;
    assert_eq!(rows, vec![r#"{"id":1,"term":6}"#, r#"{"id":2,"term":6}"#]);
    assert_eq!(max_term(&client, "orders").await, 6);

    // A current-term DELETE and TRUNCATE go through.
    admitted(&client, "SET LOCAL fencing.token = '6'; DELETE FROM orders WHERE id = 2").await;
    admitted(&client, "SET LOCAL fencing.token = '7'; TRUNCATE orders").await;
    assert!(snapshot(&client, ORDERS).await.is_empty());
    assert_eq!(max_term(&client, "orders").await, 7);

    // SET LOCAL ends with its transaction: the next transaction presents no token.
    admitted(&client, "SET LOCAL fencing.token = '7'; INSERT INTO orders VALUES (3, 'fig', NULL)").await;
    refused(&client, "DELETE FROM orders", "presents no term").await;
}

#[tokio::test]
async fn guard_refuses_writes_that_present_no_term() {
    let db = TestDb::new().await;
    let client = orders(&db).await;
    admitted(&client, "INSERT INTO orders VALUES (1, 'apple', 2)").await;

    refused(&client, "INSERT INTO orders VALUES (2, 'pear', NULL)", "INSERT on public.orders presents no term").await;
    // An UPDATE that leaves the term column as it was inherits an older writer's term.
    refused(&client, "UPDATE orders SET item = 'plum' WHERE id = 1", "UPDATE on public.orders presents no term").await;
    refused(&client, "UPDATE orders SET item = 'plum', term = 2 WHERE id = 1", "presents no term").await;
    refused(&client, "DELETE FROM orders WHERE id = 1", "DELETE on public.orders presents no term").await;
    refused(&client, "TRUNCATE orders", "TRUNCATE on public.orders presents no term").await;
    // An empty setting is no token.
    refused(&client, "SET LOCAL fencing.token = ''; DELETE FROM orders", "presents no term").await;
}

#[tokio::test]
async fn guard_without_a_term_column_needs_the_setting() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    client
        .batch_execute(
            "CREATE TABLE events (id int PRIMARY KEY, body text);
             SELECT fencing.protect('events', 'events');",
        )
        .await
        .unwrap();
    let error = client.batch_execute("INSERT INTO events VALUES (1, 'x')").await.unwrap_err();
    assert_eq!(sqlstate(&error), Some(SQLSTATE_REFUSED));
    admitted(&client, "SET LOCAL fencing.token = '1'; INSERT INTO events VALUES (1, 'x')").await;
    assert_eq!(snapshot(&client, "SELECT id FROM events").await, vec![r#"{"id":1}"#]);
}

#[tokio::test]
async fn protect_twice_leaves_one_guard() {
    let db = TestDb::new().await;
    let client = orders(&db).await;
    client.batch_execute("SELECT fencing.protect('orders', 'orders', 'term')").await.unwrap();
    let triggers = snapshot(
        &client,
        "SELECT tgname FROM pg_trigger WHERE tgrelid = 'orders'::regclass AND NOT tgisinternal ORDER BY tgname",
    )
    .await;
    assert_eq!(triggers, vec![r#"{"tgname":"fencing_guard"}"#, r#"{"tgname":"fencing_guard_truncate"}"#]);
    admitted(&client, "INSERT INTO orders VALUES (1, 'apple', 1)").await;
}

/// The zombie story inside Postgres: the table's resource is bound to the lease, so the old
/// leader's writes are refused as soon as the new leader is granted its term.
#[tokio::test]
async fn guard_on_a_bound_resource_refuses_the_zombie_as_soon_as_a_new_term_is_granted() {
    let db = TestDb::new().await;
    let client = orders(&db).await;
    store::bind(&client, "orders", "order-writer").await.unwrap();
    let ttl = Duration::from_secs(60);
    assert_eq!(store::acquire(&client, "order-writer", "a", ttl).await.unwrap().term, Some(1));
    admitted(&client, "SET LOCAL fencing.token = '1'; INSERT INTO orders VALUES (1, 'apple', NULL)").await;
    refused(&client, "SET LOCAL fencing.token = '2'; INSERT INTO orders VALUES (2, 'pear', NULL)", "future term").await;

    assert!(store::release(&client, "order-writer", "a").await.unwrap());
    assert_eq!(store::acquire(&client, "order-writer", "b", ttl).await.unwrap().term, Some(2));
    refused(
        &client,
        "SET LOCAL fencing.token = '1'; UPDATE orders SET item = 'zombie' WHERE id = 1",
        "presented term 1, current term 2",
    )
    .await;
    admitted(&client, "SET LOCAL fencing.token = '2'; UPDATE orders SET item = 'banana' WHERE id = 1").await;
}

/// The admission holds the fence row until the transaction ends: a higher term cannot be
/// admitted between a lower-term writer's check and its commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guard_holds_the_fence_until_commit_so_a_higher_term_waits() {
    let db = TestDb::new().await;
    let mut writer = orders(&db).await;
    let newer = db.connect().await;
    let observer = db.connect().await;
    admitted(&writer, "INSERT INTO orders VALUES (0, 'seed', 5)").await;

    // An equal-term writer holds the fence row in share mode until it commits.
    let transaction = writer.transaction().await.unwrap();
    transaction.batch_execute("INSERT INTO orders VALUES (1, 'apple', 5)").await.unwrap();

    let newer_pid: i32 = newer.query_one("SELECT pg_backend_pid()", &[]).await.unwrap().get(0);
    let higher = tokio::spawn(async move { newer.batch_execute("INSERT INTO orders VALUES (2, 'pear', 6)").await });
    let mut waiting = false;
    for _ in 0..500 {
        let row = observer
            .query_one("SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1", &[&newer_pid])
            .await
            .unwrap();
        if row.get::<_, Option<bool>>(0) == Some(true) {
            waiting = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(waiting, "the higher term waits for the open lower-term transaction");
    assert_eq!(max_term(&observer, "orders").await, 5);

    transaction.commit().await.unwrap();
    higher.await.unwrap().unwrap();
    assert_eq!(max_term(&observer, "orders").await, 6);
    assert_eq!(snapshot(&observer, "SELECT id FROM orders ORDER BY id").await.len(), 3);
}
