//! S4 and S8: a write never rebinds a resource, nothing a bound write does can take over a
//! resource that another lease or a protected table uses, and the names the gateway keeps for
//! unbound routes (beginning with '/') can never be bound or protected.

use std::time::Duration;

use fencing_schema::SQLSTATE_INVALID_ARGUMENT;
use fencing_schema::store::{self, Outcome};
use fencing_tests::pg::TestDb;
use fencing_tests::{fencing_state, message, sqlstate};

const TTL: Duration = Duration::from_secs(60);
const FORWARD: Duration = Duration::from_secs(4);

#[tokio::test]
async fn s4_a_write_through_another_lease_never_rebinds_a_resource() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    let l1 = store::acquire(&client, "l1", "a", TTL).await.unwrap().term.unwrap();
    let l2 = store::acquire(&client, "l2", "b", TTL).await.unwrap().term.unwrap();
    assert!(store::gate(&client, "acct-7", l1, FORWARD, Some("l1")).await.unwrap().is_admitted());

    // A second route bound to l2 names the same resource: refused, nothing changes.
    let before = fencing_state(&client).await;
    let taken = store::gate(&client, "acct-7", l2, FORWARD, Some("l2")).await.unwrap();
    assert_eq!(taken.outcome, Outcome::WrongLease, "{taken:?}");
    let stamped = store::gate_lease(&client, "acct-7", "l2", "b", FORWARD, Some("l2")).await.unwrap();
    assert_eq!(stamped.outcome, Outcome::WrongLease, "{stamped:?}");
    assert_eq!(fencing_state(&client).await, before, "a refused write changes nothing");
    // l1's leader still writes.
    assert!(store::gate(&client, "acct-7", l1, FORWARD, Some("l1")).await.unwrap().is_admitted());

    // fencing.bind does not rebind either: that is an audited admin action.
    let error = client.execute("SELECT fencing.bind('acct-7', 'l2')", &[]).await.unwrap_err();
    assert_eq!(sqlstate(&error), Some(SQLSTATE_INVALID_ARGUMENT), "{error}");
    assert!(message(&error).contains("fencing.rebind"), "{}", message(&error));
    assert_eq!(fencing_state(&client).await, before);

    client.execute("SELECT fencing.rebind('acct-7', 'l2', 'ops', 'moved to the l2 service')", &[]).await.unwrap();
    let fence = store::get_fence(&client, "acct-7").await.unwrap().unwrap();
    assert_eq!(fence.lease_key.as_deref(), Some("l2"));
    let audit = store::list_audit(&client, 10).await.unwrap();
    assert_eq!((audit[0].action.as_str(), audit[0].target.as_str()), ("rebind", "acct-7"));
    assert_eq!(store::gate(&client, "acct-7", l1, FORWARD, Some("l1")).await.unwrap().outcome, Outcome::WrongLease);
}

#[tokio::test]
async fn s8_a_bound_write_cannot_take_over_the_fence_of_a_protected_table() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    client
        .batch_execute("CREATE TABLE orders (id int PRIMARY KEY); SELECT fencing.protect('orders', 'orders');")
        .await
        .unwrap();
    let term = store::acquire(&client, "intruder", "x", TTL).await.unwrap().term.unwrap();
    let before = fencing_state(&client).await;
    let decision = store::gate(&client, "orders", term, FORWARD, Some("intruder")).await.unwrap();
    assert_eq!(decision.outcome, Outcome::WrongLease, "{decision:?}");
    assert_eq!(fencing_state(&client).await, before, "the table's fence is as it was");
    // The table's own writers go on.
    client.batch_execute("BEGIN; SET LOCAL fencing.token = '3'; INSERT INTO orders VALUES (1); COMMIT").await.unwrap();
}

#[tokio::test]
async fn s8_names_beginning_with_a_slash_belong_to_unbound_gateway_routes_only() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    client.batch_execute("CREATE TABLE jobs (id int PRIMARY KEY)").await.unwrap();
    store::acquire(&client, "l1", "a", TTL).await.unwrap();
    let before = fencing_state(&client).await;
    for sql in [
        "SELECT fencing.bind('/jobs/job-7', 'l1')",
        "SELECT fencing.protect('jobs', '/jobs/job-7')",
        "SELECT fencing.gate('/jobs/job-7', 1, interval '1 s', 'l1')",
    ] {
        let error = client.execute(sql, &[]).await.unwrap_err();
        assert_eq!(sqlstate(&error), Some(SQLSTATE_INVALID_ARGUMENT), "{sql}: {error}");
    }
    assert_eq!(fencing_state(&client).await, before);
    // An unbound route's write in its own namespace is an ordinary unbound fence.
    assert!(store::gate(&client, "/jobs/job-7", 4, FORWARD, None).await.unwrap().is_admitted());
}

#[tokio::test]
async fn s8_a_poisoned_unbound_fence_is_recovered_by_an_audited_reset_and_a_bound_one_never_is() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    // A client of an unbound route wrote the highest possible term.
    assert!(store::gate(&client, "/jobs/job-7", i64::MAX, FORWARD, None).await.unwrap().is_admitted());
    assert_eq!(store::gate(&client, "/jobs/job-7", 3, FORWARD, None).await.unwrap().outcome, Outcome::Stale);

    client
        .execute("SELECT fencing.reset_fence('/jobs/job-7', 3, 'ops', 'poisoned by a test client')", &[])
        .await
        .unwrap();
    let fence = store::get_fence(&client, "/jobs/job-7").await.unwrap().unwrap();
    assert_eq!(fence.max_term, 3);
    let audit = store::list_audit(&client, 10).await.unwrap();
    assert_eq!((audit[0].action.as_str(), audit[0].target.as_str()), ("reset_fence", "/jobs/job-7"));
    let after = store::gate(&client, "/jobs/job-7", 3, FORWARD, None).await.unwrap();
    assert!(after.is_admitted(), "{after:?}");
    assert!(after.wait > Duration::ZERO, "writes after a reset settle behind the poisoned term's writes");

    // A bound fence cannot be poisoned, so it has nothing to reset; a fence never goes back there.
    store::acquire(&client, "l1", "a", TTL).await.unwrap();
    assert!(store::gate(&client, "acct", 1, FORWARD, Some("l1")).await.unwrap().is_admitted());
    let error = client.execute("SELECT fencing.reset_fence('acct', 0, 'ops', 'x')", &[]).await.unwrap_err();
    assert_eq!(sqlstate(&error), Some(SQLSTATE_INVALID_ARGUMENT), "{error}");
}
