//! The store's own clock faults: Postgres's wall clock stepped forward and back (libfaketime,
//! only `CLOCK_REALTIME` moved) while grants and settle waits are out. Each test is the session
//! that broke S3, S4 or S5 when waits compared instants of that clock (schema version 7): a
//! forward step ended every grant and settle wait at once, a backward step lengthened a grant by
//! the whole step. Waits are lengths of real time now, measured here on the test's monotonic
//! clock from before the grant was asked for.

use std::time::Duration;

use fencing_schema::store::{self, Outcome};
use fencing_tests::pg::{FakeClock, PgCluster, connect};
use tokio::sync::MutexGuard;
use tokio::time::Instant;
use tokio_postgres::Client;

const FORWARD: Duration = Duration::from_secs(4);
const GRANT: Duration = Duration::from_millis(400);
/// Rounding between the store's milliseconds and this process's clock (a term change sleeps a
/// 10 ms slice more than the grant, so a sleep short by one slice fails these tests).
const SLACK: Duration = Duration::from_millis(1);

/// The fake-clock cluster of this test binary.
fn clock() -> &'static FakeClock {
    PgCluster::fake_clock()
}

/// A fresh migrated database in the fake-clock cluster, its clock at the real time, two
/// sessions to it, and the clock's lock.
async fn database(name: &str) -> (Client, Client, MutexGuard<'static, ()>) {
    let (url, guard) = clock().database(name).await;
    (connect(&url).await, connect(&url).await, guard)
}

/// Takes a grant on `resource` at `term`: when it was asked for, and how long it lasts.
async fn take_grant(client: &Client, resource: &str, term: i64, bind: Option<&str>) -> (Instant, Duration) {
    crate::grants::take_grant_of(client, resource, term, bind, FORWARD, GRANT).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_a_forward_step_of_the_stores_clock_does_not_end_a_grant_early() {
    let (holder, raiser, _clock) = database("step_forward_grant").await;
    let (asked, lasts) = take_grant(&holder, "/free/r", 1, None).await;
    clock().step_to(60_000);
    // Through the SQL guard's function and through a gateway's decision.
    raiser.query_one("SELECT fencing.admit('/free/r', 2)", &[]).await.unwrap();
    let raised = Instant::now();
    assert!(
        raised + SLACK >= asked + lasts,
        "term 2 admitted {:?} before term 1's grant ended",
        (asked + lasts) - raised
    );
    let (asked, lasts) = take_grant(&holder, "/free/s", 1, None).await;
    clock().step_to(120_000);
    let gate = store::gate(&raiser, "/free/s", 2, FORWARD, None).await.unwrap();
    assert!(gate.is_admitted() && Instant::now() + SLACK >= asked + lasts, "{gate:?}");
    let late = store::gate_granted(&holder, "/free/s", 1, FORWARD, None, GRANT).await.unwrap();
    assert_eq!(late.outcome, Outcome::Stale, "{late:?}");
    clock().step_to(0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_a_backward_step_of_the_stores_clock_does_not_lengthen_a_grant() {
    let (holder, raiser, _clock) = database("step_back_grant").await;
    // A grant at the real time, then a renewal 120 s behind it: measured against the end the
    // store recorded before the step, the renewal would last the whole step.
    take_grant(&holder, "/free/r", 1, None).await;
    clock().step_to(-120_000);
    let (asked, lasts) = take_grant(&holder, "/free/r", 1, None).await;
    assert!(lasts <= GRANT, "{lasts:?}");
    // The clock is set right again (a forward step of 120 s): the raise waits the grant's length,
    // not the step, and not less.
    clock().step_to(0);
    let started = Instant::now();
    let gate = store::gate(&raiser, "/free/r", 2, FORWARD, None).await.unwrap();
    assert!(gate.is_admitted(), "{gate:?}");
    assert!(Instant::now() + SLACK >= asked + lasts, "the raise ended before the grant");
    assert!(started.elapsed() < GRANT * 3, "the raise waited {:?}, not one grant", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s5_the_settle_wait_is_a_length_whatever_the_stores_clock_did() {
    let (first, second, _clock) = database("step_forward_settle").await;
    // Term 1's gateway writes may be forwarded for up to FORWARD after their decisions.
    assert!(store::gate(&first, "/free/r", 1, FORWARD, None).await.unwrap().is_admitted());
    clock().step_to(60_000);
    let raised = store::gate(&second, "/free/r", 2, FORWARD, None).await.unwrap();
    assert!(raised.is_admitted(), "{raised:?}");
    assert!(raised.wait >= FORWARD, "term 2 settles for {:?} after a forward step, not {FORWARD:?}", raised.wait);
    // A follower through another session waits the same length, counted from its own decision.
    let follower = store::gate(&first, "/free/r", 2, FORWARD, None).await.unwrap();
    assert_eq!(follower.wait, raised.wait, "{follower:?}");
    // The same through an SQL raise.
    assert!(store::gate(&first, "/free/s", 3, FORWARD, None).await.unwrap().is_admitted());
    clock().step_to(180_000);
    assert_eq!(store::admit(&second, "/free/s", 4).await.unwrap(), 4);
    let next = store::gate(&first, "/free/s", 4, FORWARD, None).await.unwrap();
    assert!(next.wait >= FORWARD, "{next:?}");
    clock().step_to(0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s4_a_new_term_of_a_lease_waits_out_its_grants_after_a_forward_step() {
    let (holder, taker, _clock) = database("step_forward_lease").await;
    let term = store::acquire(&holder, "k", "a", Duration::from_secs(30)).await.unwrap().term.unwrap();
    let (asked, lasts) = take_grant(&holder, "acct", term, Some("k")).await;
    // The store's clock jumps past the lease's expiry: a new term may start, but only once the
    // grant on the old one has ended.
    clock().step_to(60_000);
    let taken = store::acquire(&taker, "k", "b", Duration::from_secs(30)).await.unwrap();
    assert_eq!(taken.term, Some(term + 1), "{taken:?}");
    assert!(Instant::now() + SLACK >= asked + lasts, "a new term while a grant on the old one could admit writes");
    let zombie = store::gate_granted(&holder, "acct", term, FORWARD, Some("k"), GRANT).await.unwrap();
    assert_eq!(zombie.outcome, Outcome::Stale, "{zombie:?}");
    clock().step_to(0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fake_clock_moves_the_stores_wall_clock_only() {
    let (client, _, _clock) = database("fake_clock_itself").await;
    let read = "SELECT extract(epoch FROM clock_timestamp())::float8";
    let before: f64 = client.query_one(read, &[]).await.unwrap().get(0);
    clock().step_to(3_600_000);
    let after: f64 = client.query_one(read, &[]).await.unwrap().get(0);
    assert!((after - before - 3600.0).abs() < 5.0, "the offset did not move clock_timestamp(): {before} -> {after}");
    // pg_sleep still sleeps real time.
    let started = Instant::now();
    client.batch_execute("SELECT pg_sleep(0.2)").await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(190) && started.elapsed() < Duration::from_secs(2));
    clock().step_to(0);
}
