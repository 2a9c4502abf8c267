//! S8 inside Postgres: nothing goes around the guard. Partitions and inheritance children of a
//! protected table are protected, `session_replication_role = replica` does not switch it off,
//! a guarded writer needs (and has) no privilege on the fencing tables, a writer's search_path
//! cannot change what the guard calls, and a session-level token is not left for later
//! transactions.

use std::time::Duration;

use fencing_schema::SQLSTATE_REFUSED;
use fencing_schema::store;
use fencing_tests::pg::{TestDb, connect};
use fencing_tests::{fencing_state, message, snapshot, sqlstate};
use tokio_postgres::Client;

/// Runs `sql` in a transaction and expects the fencing refusal, with nothing changed.
async fn refused(client: &Client, table: &str, sql: &str, fragment: &str) {
    refused_as(client, client, table, sql, fragment).await;
}

/// As [`refused`], with `sql` run by `writer` and the state read by `admin`.
async fn refused_as(writer: &Client, admin: &Client, table: &str, sql: &str, fragment: &str) {
    let before = snapshot(admin, &format!("SELECT * FROM {table} ORDER BY 1")).await;
    let fences = fencing_state(admin).await;
    let error = writer.batch_execute(&format!("BEGIN; {sql}; COMMIT")).await.unwrap_err();
    writer.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(sqlstate(&error), Some(SQLSTATE_REFUSED), "{sql}: {error}");
    assert!(message(&error).contains(fragment), "{sql}: {:?} lacks {fragment:?}", message(&error));
    assert_eq!(snapshot(admin, &format!("SELECT * FROM {table} ORDER BY 1")).await, before, "{sql}");
    assert_eq!(fencing_state(admin).await, fences, "{sql}");
}

async fn admitted(client: &Client, sql: &str) {
    if let Err(error) = client.batch_execute(&format!("BEGIN; {sql}; COMMIT")).await {
        panic!("{sql}: {error}");
    }
}

#[tokio::test]
async fn s8_every_partition_of_a_protected_table_is_guarded_including_truncate() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    client
        .batch_execute(
            "CREATE TABLE events (id int NOT NULL, body text, term bigint) PARTITION BY RANGE (id);
             CREATE TABLE events_low PARTITION OF events FOR VALUES FROM (0) TO (100);
             SELECT fencing.protect('events', 'events', 'term');
             CREATE TABLE events_high PARTITION OF events FOR VALUES FROM (100) TO (200);",
        )
        .await
        .unwrap();
    admitted(&client, "INSERT INTO events VALUES (1, 'a', 5), (150, 'b', 5)").await;
    for partition in ["events_low", "events_high"] {
        refused(&client, "events", &format!("TRUNCATE {partition}"), "presents no term").await;
        refused(&client, "events", &format!("SET LOCAL fencing.token = '4'; TRUNCATE {partition}"), "current term 5")
            .await;
        refused(&client, "events", &format!("INSERT INTO {partition} VALUES (50, 'x', 4)"), "current term 5").await;
        refused(&client, "events", &format!("DELETE FROM {partition}"), "presents no term").await;
    }
    // A cross-partition UPDATE presents its term with the setting; without it the refusal says so.
    refused(&client, "events", "UPDATE events SET id = 160, term = 6 WHERE id = 1", "SET LOCAL fencing.token").await;
    admitted(&client, "SET LOCAL fencing.token = '6'; UPDATE events SET id = 160 WHERE id = 1").await;
    assert_eq!(
        snapshot(&client, "SELECT id, term FROM events ORDER BY id").await,
        vec![r#"{"id":150,"term":5}"#, r#"{"id":160,"term":6}"#]
    );
}

/// A partition protected by itself (its partitioned parent is not) gets a row guard of its
/// own: before, `fencing.protect` gave it only the TRUNCATE trigger, assuming a clone of its
/// parent's, so INSERT, UPDATE and DELETE went unchecked. Its parent protected later replaces
/// that guard with its own clone, under the parent's resource.
#[tokio::test]
async fn s8_a_partition_protected_by_itself_is_guarded_and_its_parent_can_be_protected_later() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    client
        .batch_execute(
            "CREATE TABLE m (id int NOT NULL, body text) PARTITION BY LIST (id);
             CREATE TABLE m1 PARTITION OF m FOR VALUES IN (1);
             CREATE TABLE m2 PARTITION OF m FOR VALUES IN (2);
             SELECT fencing.protect('m1', 'm1-only');",
        )
        .await
        .unwrap();
    admitted(&client, "SET LOCAL fencing.token = '5'; INSERT INTO m1 VALUES (1, 'a')").await;
    refused(&client, "m1", "INSERT INTO m1 VALUES (1, 'b')", "presents no term").await;
    refused(&client, "m1", "SET LOCAL fencing.token = '4'; INSERT INTO m VALUES (1, 'b')", "current term 5").await;
    refused(&client, "m1", "SET LOCAL fencing.token = '4'; UPDATE m1 SET body = 'c'", "current term 5").await;
    refused(&client, "m1", "DELETE FROM m1", "presents no term").await;
    // m2 is no part of it.
    admitted(&client, "INSERT INTO m2 VALUES (2, 'free')").await;

    // Now the parent: every partition is guarded under its resource, through clones.
    client.batch_execute("SELECT fencing.protect('m', 'm-all')").await.unwrap();
    let own: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_trigger WHERE tgname = 'fencing_guard' AND tgrelid IN ('m1'::regclass, 'm2'::regclass)
                AND tgparentid = 0",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(own, 0, "the partitions keep no row guard of their own");
    admitted(&client, "SET LOCAL fencing.token = '2'; INSERT INTO m VALUES (2, 'b')").await;
    refused(&client, "m", "SET LOCAL fencing.token = '1'; INSERT INTO m1 VALUES (1, 'x')", "current term 2").await;
    refused(&client, "m", "DELETE FROM m2", "presents no term").await;
}

#[tokio::test]
async fn s8_inheritance_children_of_a_protected_table_are_guarded() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    client
        .batch_execute(
            "CREATE TABLE things (id int PRIMARY KEY, term bigint);
             CREATE TABLE old_things () INHERITS (things);
             SELECT fencing.protect('things', 'things', 'term');
             CREATE TABLE new_things () INHERITS (things);",
        )
        .await
        .unwrap();
    admitted(&client, "INSERT INTO things VALUES (1, 3)").await;
    for child in ["old_things", "new_things"] {
        refused(&client, "things", &format!("INSERT INTO {child} VALUES (2, 2)"), "current term 3").await;
        refused(&client, "things", &format!("INSERT INTO {child} VALUES (2, NULL)"), "presents no term").await;
        refused(&client, "things", &format!("TRUNCATE {child}"), "presents no term").await;
        admitted(&client, &format!("INSERT INTO {child} VALUES (1{child_len}, 3)", child_len = child.len())).await;
    }
}

#[tokio::test]
async fn s8_the_guard_fires_in_every_session_replication_role() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    client
        .batch_execute(
            "CREATE TABLE orders (id int PRIMARY KEY, term bigint);
             SELECT fencing.protect('orders', 'orders', 'term');",
        )
        .await
        .unwrap();
    admitted(&client, "INSERT INTO orders VALUES (1, 5)").await;
    for role in ["replica", "local"] {
        refused(
            &client,
            "orders",
            &format!("SET LOCAL session_replication_role = {role}; INSERT INTO orders VALUES (2, 4)"),
            "current term 5",
        )
        .await;
        refused(
            &client,
            "orders",
            &format!("SET LOCAL session_replication_role = {role}; TRUNCATE orders"),
            "presents no term",
        )
        .await;
    }
}

/// A role with privileges on its own table only: it writes through the guard, and cannot
/// change a fence, a lease or the guard's clock by hand.
#[tokio::test]
async fn s8_a_guarded_writer_needs_no_privilege_on_the_fencing_tables_and_cannot_change_a_fence() {
    let db = TestDb::new().await;
    let admin = db.connect().await;
    let role = format!("writer_{}", db.name);
    admin
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN;
             CREATE TABLE orders (id int PRIMARY KEY, term bigint);
             SELECT fencing.protect('orders', 'orders', 'term');
             SELECT fencing.bind('orders', 'order-writer');
             GRANT SELECT, INSERT, UPDATE, DELETE ON orders TO {role};
             GRANT CREATE ON SCHEMA public TO {role};"
        ))
        .await
        .unwrap();
    let term = store::acquire(&admin, "order-writer", "a", Duration::from_secs(60)).await.unwrap().term.unwrap();
    let url = db.url().replace("postgres://postgres@", &format!("postgres://{role}@"));
    let writer = connect(&url).await;
    admitted(&writer, &format!("INSERT INTO orders VALUES (1, {term})")).await;
    admitted(&writer, &format!("SET LOCAL fencing.token = '{term}'; UPDATE orders SET id = 2 WHERE id = 1")).await;

    let before = fencing_state(&admin).await;
    for sql in [
        "UPDATE fencing.fences SET max_term = 0",
        "UPDATE fencing.leases SET expires_at = now() + interval '1 day'",
        "DELETE FROM fencing.fences",
        "SELECT fencing.advance_fence('orders', 100, 'me', 'because')",
        "SELECT fencing.rebind('orders', 'mine', 'me', 'because')",
        "SELECT fencing.force_release('order-writer', 'me', 'because')",
    ] {
        let error = writer.batch_execute(sql).await.unwrap_err();
        assert_eq!(sqlstate(&error), Some("42501"), "{sql}: {error}");
    }
    assert_eq!(fencing_state(&admin).await, before, "the writer changed nothing of the fencing schema");

    // The writer's search_path cannot shadow the clock the guard reads: its lease has expired,
    // and a clock_timestamp() of its own that says otherwise changes nothing.
    admin.batch_execute("UPDATE fencing.leases SET expires_at = clock_timestamp() - interval '1 s'").await.unwrap();
    writer
        .batch_execute(
            "CREATE FUNCTION public.clock_timestamp() RETURNS timestamptz LANGUAGE sql
                 AS $$ SELECT timestamptz '2000-01-01' $$;
             CREATE FUNCTION public.now() RETURNS timestamptz LANGUAGE sql AS $$ SELECT timestamptz '2000-01-01' $$;",
        )
        .await
        .unwrap();
    refused_as(
        &writer,
        &admin,
        "orders",
        &format!("SET LOCAL search_path = public, pg_catalog; INSERT INTO orders VALUES (3, {term})"),
        "not leader",
    )
    .await;
    admin.batch_execute(&format!("DROP OWNED BY {role}; DROP ROLE {role}")).await.unwrap_or_default();
}

/// A token set for the session (not LOCAL) would be a token for whoever uses the connection
/// next (a pool): the guard honours it for the transaction that used it and clears it when
/// that transaction commits, so no later transaction inherits it.
#[tokio::test]
async fn s8_a_session_level_token_is_not_inherited_by_later_transactions() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    client
        .batch_execute(
            "CREATE TABLE orders (id int PRIMARY KEY, term bigint);
             SELECT fencing.protect('orders', 'orders');",
        )
        .await
        .unwrap();
    client.batch_execute("SET fencing.token = '5'").await.unwrap();
    admitted(&client, "INSERT INTO orders VALUES (1, NULL); INSERT INTO orders VALUES (2, NULL)").await;
    // The next transaction on the same connection (the next user of a pooled connection).
    refused(&client, "orders", "INSERT INTO orders VALUES (3, NULL)", "presents no term").await;
    // SET LOCAL keeps working as documented.
    admitted(&client, "SET LOCAL fencing.token = '5'; INSERT INTO orders VALUES (3, NULL)").await;
    admitted(&client, "SELECT set_config('fencing.token', '6', true); INSERT INTO orders VALUES (4, NULL)").await;
    refused(&client, "orders", "DELETE FROM orders", "presents no term").await;
}
