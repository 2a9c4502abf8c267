//! Bad input to every SQL function raises a clear error and writes nothing.

use fencing_schema::{SQLSTATE_INVALID_ARGUMENT, SQLSTATE_REFUSED};
use fencing_tests::pg::TestDb;
use fencing_tests::{fencing_state, message, snapshot, sqlstate};
use tokio_postgres::Client;

/// Runs `sql` in its own transaction and expects SQLSTATE `code` with `fragment` in the
/// message, and no change to the leases, the fences or the sample table.
async fn check(client: &Client, sql: &str, code: &str, fragment: &str) {
    let state_before = fencing_state(client).await;
    let table_before = snapshot(client, "SELECT * FROM orders ORDER BY id").await;
    let error = match client.batch_execute(&format!("BEGIN; {sql}; COMMIT")).await {
        Ok(()) => panic!("{sql}: accepted, expected SQLSTATE {code}"),
        Err(error) => error,
    };
    client.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(sqlstate(&error), Some(code), "{sql}: {error}");
    let text = message(&error);
    assert!(text.contains(fragment), "{sql}: message {text:?} lacks {fragment:?}");
    assert_eq!(fencing_state(client).await, state_before, "{sql} changed the fencing tables");
    assert_eq!(snapshot(client, "SELECT * FROM orders ORDER BY id").await, table_before, "{sql} changed orders");
}

async fn setup(db: &TestDb) -> Client {
    let client = db.connect().await;
    client
        .batch_execute(
            "SELECT fencing.acquire('k', 'holder', '1 minute');
             SELECT fencing.admit('r', 3);
             CREATE TABLE orders (id int PRIMARY KEY, term bigint, label text);
             SELECT fencing.protect('orders', 'orders', 'term');
             SET fencing.token = '';
             INSERT INTO orders VALUES (1, 1, 'x');",
        )
        .await
        .unwrap();
    client
}

#[tokio::test]
async fn bad_lease_arguments_raise_22023_and_write_nothing() {
    let db = TestDb::new().await;
    let client = setup(&db).await;
    let long = "x".repeat(257);
    let invalid = SQLSTATE_INVALID_ARGUMENT;
    for function in ["acquire", "renew"] {
        check(
            &client,
            &format!("SELECT fencing.{function}(NULL, 'o', '10 s')"),
            invalid,
            "lease key must not be null or empty",
        )
        .await;
        check(
            &client,
            &format!("SELECT fencing.{function}('', 'o', '10 s')"),
            invalid,
            "lease key must not be null or empty",
        )
        .await;
        check(
            &client,
            &format!("SELECT fencing.{function}('{long}', 'o', '10 s')"),
            invalid,
            "lease key must be at most 256 characters",
        )
        .await;
        check(
            &client,
            &format!("SELECT fencing.{function}('k', NULL, '10 s')"),
            invalid,
            "owner must not be null or empty",
        )
        .await;
        check(
            &client,
            &format!("SELECT fencing.{function}('k', '', '10 s')"),
            invalid,
            "owner must not be null or empty",
        )
        .await;
        check(
            &client,
            &format!("SELECT fencing.{function}('k', '{long}', '10 s')"),
            invalid,
            "owner must be at most 256",
        )
        .await;
        check(&client, &format!("SELECT fencing.{function}('k', 'holder', '0 s')"), invalid, "ttl must be positive")
            .await;
        check(&client, &format!("SELECT fencing.{function}('k', 'holder', '-5 s')"), invalid, "ttl must be positive")
            .await;
        check(&client, &format!("SELECT fencing.{function}('k', 'holder', NULL)"), invalid, "ttl must be positive")
            .await;
        check(
            &client,
            &format!("SELECT fencing.{function}('k', 'holder', '2 hours')"),
            invalid,
            "ttl must be at most 01:00:00",
        )
        .await;
        check(&client, &format!("SELECT fencing.{function}('k', 'holder', '1 month')"), invalid, "ttl must be at most")
            .await;
    }
    check(&client, "SELECT fencing.release(NULL, 'holder')", invalid, "lease key must not be null or empty").await;
    check(&client, "SELECT fencing.release('', 'holder')", invalid, "lease key must not be null or empty").await;
    check(&client, "SELECT fencing.release('k', '')", invalid, "owner must not be null or empty").await;
    check(&client, "SELECT fencing.release('k', NULL)", invalid, "owner must not be null or empty").await;
}

#[tokio::test]
async fn bad_fence_arguments_raise_22023_and_write_nothing() {
    let db = TestDb::new().await;
    let client = setup(&db).await;
    let invalid = SQLSTATE_INVALID_ARGUMENT;
    check(&client, "SELECT fencing.admit(NULL, 1)", invalid, "resource must not be null or empty").await;
    check(&client, "SELECT fencing.admit('', 1)", invalid, "resource must not be null or empty").await;
    check(&client, "SELECT fencing.admit('r', 0)", invalid, "term must be an integer >= 1, got 0").await;
    check(&client, "SELECT fencing.admit('r', -7)", invalid, "term must be an integer >= 1, got -7").await;
    check(&client, "SELECT fencing.admit('r', NULL)", invalid, "term must be an integer >= 1, got null").await;
    check(&client, "SELECT fencing.try_admit('r', 0)", invalid, "term must be an integer >= 1").await;
    check(&client, "SELECT fencing.bind('', 'k')", invalid, "resource must not be null or empty").await;
    check(&client, "SELECT fencing.bind('r', '')", invalid, "lease key must not be null or empty").await;
    check(&client, "SELECT fencing.bind('r', NULL)", invalid, "lease key must not be null or empty").await;
    check(&client, "SELECT fencing.protect('orders', '')", invalid, "resource must not be null or empty").await;
    check(&client, "SELECT fencing.protect('orders', 'orders', 'nope')", invalid, "has no column \"nope\"").await;
    check(&client, "SELECT fencing.protect('orders', 'orders', 'label')", invalid, "must be bigint, got text").await;
    check(&client, "SELECT fencing.protect(NULL, 'orders')", invalid, "table must not be null").await;
    // A term beyond bigint is refused by Postgres's own type resolution.
    check(&client, "SELECT fencing.admit('r', 9223372036854775808)", "42883", "does not exist").await;
    check(&client, "SELECT fencing.admit('r', '9223372036854775808')", "22003", "out of range").await;
}

#[tokio::test]
async fn malformed_fencing_token_settings_raise_22023_and_write_nothing() {
    let db = TestDb::new().await;
    let client = setup(&db).await;
    let invalid = SQLSTATE_INVALID_ARGUMENT;
    for token in ["abc", "-1", "1.5", "0x10", "9223372036854775808", "99999999999999999999", "7 8", "+3"] {
        let sql = format!("SET LOCAL fencing.token = '{token}'; UPDATE orders SET label = 'y'");
        check(&client, &sql, invalid, "fencing.token must be a decimal integer in 1..9223372036854775807").await;
    }
    check(
        &client,
        "SET LOCAL fencing.token = '0'; UPDATE orders SET label = 'y'",
        invalid,
        "term must be an integer >= 1, got 0",
    )
    .await;
    // A term column holding a non-positive term is bad input too, not a stale write.
    check(&client, "INSERT INTO orders VALUES (2, 0, 'z')", invalid, "term must be an integer >= 1, got 0").await;
    // A write presenting nothing is a refusal, not bad input.
    check(&client, "TRUNCATE orders", SQLSTATE_REFUSED, "presents no term").await;
}
