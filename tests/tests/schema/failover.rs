//! Failover to a standby (issue 25, item 5): what an answered decision is worth once the primary
//! is gone and a standby was promoted in its place.
//!
//! Each test runs a primary and a streaming standby of its own, the standby's replication link
//! through a fault proxy, so that the test can hold the WAL the primary sends (a standby that
//! lags) and have it lost with the primary (the held bytes die with the walsender's connection).
//! Every decision function commits durably (`fencing.commit_durably`): with a synchronous standby
//! that commit waits for the standby's flush, so an answered raise, grant or term is on the
//! standby before anyone hears of it (S2, S3, S4 across the failover); with an asynchronous one
//! it is not, and the promoted standby goes back in time. That loss is shown here on purpose: it
//! is why the README asks for synchronous replication and `serve` warns without it.

use std::time::Duration;

use tokio::time::Instant;

use fencing_schema::store::{self, Outcome};
use fencing_tests::faultproxy::{FaultProxy, Mode};
use fencing_tests::pg::{PgCluster, Replication, connect};

use crate::grants::take_grant_of;

const FORWARD: Duration = Duration::from_secs(1);
const GRANT: Duration = Duration::from_millis(1500);
const TTL: Duration = Duration::from_secs(30);

/// A primary with a migrated database `failover` (resource `acct` bound to lease `writer`), and
/// a standby of `replication` reaching it through the returned proxy.
async fn primary_and_standby(replication: Replication) -> (PgCluster, PgCluster, FaultProxy, String) {
    let primary = PgCluster::start().unwrap();
    primary.psql("CREATE DATABASE failover").unwrap();
    let mut client = connect(&primary.url("failover")).await;
    fencing_schema::migrate(&mut client).await.unwrap();
    store::bind(&client, "acct", "writer").await.unwrap();
    let link = FaultProxy::start(format!("127.0.0.1:{}", primary.port()).parse().unwrap()).await.unwrap();
    let port = link.addr().port();
    let standby = tokio::task::block_in_place(|| primary.start_standby_through(replication, port)).unwrap();
    (primary, standby, link, "failover".to_owned())
}

/// Crashes `primary` (SIGQUIT to the postmaster: no shutdown checkpoint, no more WAL sent), then
/// promotes `standby`; returns a client of the new primary.
async fn fail_over(
    primary: &PgCluster,
    standby: &PgCluster,
    link: &FaultProxy,
    database: &str,
) -> tokio_postgres::Client {
    tokio::task::block_in_place(|| primary.crash_now()).unwrap();
    // Whatever the proxy still held was bound for a connection that no longer exists.
    link.reset_all();
    tokio::task::block_in_place(|| standby.promote()).unwrap();
    connect(&standby.url(database)).await
}

fn max_term(fence: Option<store::FenceRow>) -> i64 {
    fence.map_or(0, |fence| fence.max_term)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s2_s3_s4_answered_terms_raises_and_grants_survive_a_failover_to_a_synchronous_standby() {
    let (primary, standby, link, database) = primary_and_standby(Replication::Synchronous).await;
    let client = connect(&primary.url(&database)).await;
    let lease = store::acquire(&client, "writer", "owner-a", TTL).await.unwrap();
    assert!(lease.ok, "{lease:?}");
    let term = lease.term.unwrap();
    store::admit(&client, "acct", term).await.unwrap();
    store::admit(&client, "free", 7).await.unwrap();
    let (_, grant) = take_grant_of(&client, "free", 7, None, FORWARD, GRANT).await;

    let client = fail_over(&primary, &standby, &link, &database).await;

    // S2: the lease, its term and its period are there; the holder still holds it (S1), and
    // the next acquirer gets a higher term.
    let row = store::get_lease(&client, "writer").await.unwrap().unwrap();
    assert_eq!((row.owner.as_str(), row.term), ("owner-a", term), "{row:?}");
    let periods: i64 = client
        .query_one("SELECT count(*) FROM fencing.lease_history WHERE key = 'writer' AND term = $1", &[&term])
        .await
        .unwrap()
        .get(0);
    assert_eq!(periods, 1, "the period of term {term} is in the lease history");
    let other = store::acquire(&client, "writer", "owner-b", TTL).await.unwrap();
    assert!(!other.ok, "the lease of owner-a has not expired: {other:?}");
    // S3: the raise to 7 and the grant on it are there: a lower term is refused, and a raise
    // waits until the grant a gateway may still be using has ended.
    assert_eq!(max_term(store::get_fence(&client, "free").await.unwrap()), 7);
    let lower = store::try_admit(&client, "free", 6, false).await.unwrap();
    assert_eq!(lower.outcome, Outcome::Stale, "{lower:?}");
    // The raise sleeps the grant's whole length once it holds the row (it cannot tell, on a
    // clock of its own, that the grant has ended): the grant is on the new primary.
    let raising = Instant::now();
    store::admit(&client, "free", 8).await.unwrap();
    let waited = raising.elapsed();
    assert!(waited >= grant, "the raise to 8 waited {waited:?}, less than the grant of {grant:?}: the grant was lost");
    // S4: the bound resource still admits only the lease's term (a forged next term is refused).
    let stale = store::try_admit(&client, "acct", term + 1, false).await.unwrap();
    assert_ne!(stale.outcome, Outcome::Admitted, "{stale:?}");
    let current = store::try_admit(&client, "acct", term, false).await.unwrap();
    assert_eq!(current.outcome, Outcome::Admitted, "{current:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_synchronous_standby_that_lags_a_raise_is_not_answered_until_the_standby_has_it() {
    let (primary, standby, link, database) = primary_and_standby(Replication::Synchronous).await;
    let client = connect(&primary.url(&database)).await;
    store::admit(&client, "free", 7).await.unwrap();
    link.set(Mode::Hold);
    let raiser = connect(&primary.url(&database)).await;
    let raise = tokio::spawn(async move { store::admit(&raiser, "free", 9).await });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!raise.is_finished(), "a raise was answered before the synchronous standby had it");

    let client = fail_over(&primary, &standby, &link, &database).await;
    let answer = tokio::time::timeout(Duration::from_secs(30), raise).await.unwrap().unwrap();
    assert!(answer.is_err(), "the raise the standby never had was answered: {answer:?}");
    // Nobody heard of 9, so the new primary admitting 8 breaks no answered decision.
    assert_eq!(max_term(store::get_fence(&client, "free").await.unwrap()), 7);
    store::admit(&client, "free", 8).await.unwrap();
}

/// Why the old primary must be fenced before the standby is promoted (README, "Running on
/// Postgres HA", item 3): a gateway's decision on a write of the current term only reads, so it
/// never waits for the standby. Cut off from its synchronous standby, which is promoted and raises
/// the fence to 8, the old primary still admits term 7 to a gateway (a zombie's write, after 8 was
/// answered: S3 broken), though a raise on it waits for a standby that will never answer. If this
/// test ever fails, that README item can be revisited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_primary_left_running_after_a_promotion_still_admits_the_term_the_new_one_raised_past() {
    let (primary, standby, link, database) = primary_and_standby(Replication::Synchronous).await;
    let old = connect(&primary.url(&database)).await;
    assert!(store::gate(&old, "free", 7, FORWARD, None).await.unwrap().is_admitted());
    link.set(Mode::Hold);
    tokio::task::block_in_place(|| standby.promote()).unwrap();
    let new = connect(&standby.url(&database)).await;
    assert_eq!(store::admit(&new, "free", 8).await.unwrap(), 8);
    let zombie = tokio::time::timeout(Duration::from_secs(5), store::gate(&old, "free", 7, FORWARD, None)).await;
    assert!(
        matches!(&zombie, Ok(Ok(gate)) if gate.is_admitted()),
        "the cut-off primary no longer admits the current term by a read: {zombie:?}"
    );
    let raiser = connect(&primary.url(&database)).await;
    let raise = tokio::spawn(async move { store::admit(&raiser, "free", 9).await });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!raise.is_finished(), "a raise on the cut-off primary was answered without its standby");
    raise.abort();
}

/// The demonstration: an asynchronous standby that lags loses answered decisions in a failover.
/// A raise to 9 and a grant on 9 were answered on the primary; the promoted standby has neither,
/// so it admits term 8, which S3 forbids once 9 was admitted, and a raise on it does not wait
/// for the grant a gateway is still using. If this test ever fails, the README's "Running on
/// Postgres HA" is wrong and must be revisited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_asynchronous_standby_that_lags_loses_answered_raises_and_grants_in_a_failover() {
    let (primary, standby, link, database) = primary_and_standby(Replication::Asynchronous).await;
    let client = connect(&primary.url(&database)).await;
    store::admit(&client, "free", 7).await.unwrap();
    // The standby has 7 before its link stalls.
    let standby_client = connect(&standby.url(&database)).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while max_term(store::get_fence(&standby_client, "free").await.unwrap()) < 7 {
        assert!(Instant::now() < deadline, "the standby did not replay the raise to 7 within 30 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(standby_client);
    link.set(Mode::Hold);
    let raised = tokio::time::timeout(Duration::from_secs(10), store::admit(&client, "free", 9)).await;
    assert!(matches!(raised, Ok(Ok(9))), "the primary answers without waiting for an asynchronous standby: {raised:?}");
    take_grant_of(&client, "free", 9, None, FORWARD, GRANT).await;

    let client = fail_over(&primary, &standby, &link, &database).await;
    assert_eq!(max_term(store::get_fence(&client, "free").await.unwrap()), 7, "the answered raise to 9 is lost");
    let lower = store::try_admit(&client, "free", 8, false).await.unwrap();
    assert_eq!(lower.outcome, Outcome::Admitted, "term 8 is admitted after 9 was: S3 broken by the failover");
    // The grant on 9 is lost too: a raise does not wait for it, while the gateway that holds it
    // may still admit 9 without asking.
    let raising = Instant::now();
    store::admit(&client, "free", 10).await.unwrap();
    let waited = raising.elapsed();
    assert!(waited < GRANT / 2, "the raise to 10 waited {waited:?}: the grant on 9 survived after all");
}

/// Why nothing in this project cancels a call that may be committing: PostgreSQL answers a
/// cancel of a commit waiting for its synchronous standby with success and a WARNING ("the
/// transaction has already committed locally, but might not have been replicated"). The raise
/// is then visible on the primary though the standby never had it: a read-only decision admits
/// its term (no WAL, no wait), and after a failover a lower term is admitted again. The gateway
/// and the election library therefore bound their calls with the server's `statement_timeout`,
/// which ends a statement but never a commit's wait, and drop a late connection without
/// cancelling it (`gateway/src/fence/pool.rs`, `election/src/runtime.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_wait_for_the_synchronous_standby_commits_locally_and_is_lost_in_a_failover() {
    let (primary, standby, link, database) = primary_and_standby(Replication::Synchronous).await;
    let client = connect(&primary.url(&database)).await;
    store::admit(&client, "free", 7).await.unwrap();
    link.set(Mode::Hold);
    let raiser = connect(&primary.url(&database)).await;
    let cancel = raiser.cancel_token();
    let raise = tokio::spawn(async move { store::admit(&raiser, "free", 9).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!raise.is_finished(), "the raise waits for the synchronous standby");
    cancel.cancel_query(tokio_postgres::NoTls).await.unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(10), raise).await.unwrap().unwrap();
    assert!(matches!(answer, Ok(9)), "a cancelled wait answers the commit as done: {answer:?}");
    let read = store::try_admit(&client, "free", 9, false).await.unwrap();
    assert_eq!(read.outcome, Outcome::Admitted, "term 9 is admitted on the primary by a read");

    let client = fail_over(&primary, &standby, &link, &database).await;
    assert_eq!(max_term(store::get_fence(&client, "free").await.unwrap()), 7, "the standby never had 9");
    let lower = store::try_admit(&client, "free", 8, false).await.unwrap();
    assert_eq!(lower.outcome, Outcome::Admitted, "term 8 admitted after 9 was: what a cancel would cost");
}

/// What the gateway and the elector rely on instead of a cancel: `statement_timeout` ends a
/// statement, never a commit's wait for the synchronous standby, so a raise that timed out on
/// the client stays invisible until the standby has it, then commits (durably, on both).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_statement_timeout_never_ends_a_wait_for_the_synchronous_standby() {
    let (primary, _standby, link, database) = primary_and_standby(Replication::Synchronous).await;
    let client = connect(&primary.url(&database)).await;
    store::admit(&client, "free", 7).await.unwrap();
    link.set(Mode::Hold);
    let raiser = connect(&primary.url(&database)).await;
    raiser.batch_execute("SET statement_timeout = 300").await.unwrap();
    let raise = tokio::spawn(async move { store::admit(&raiser, "free", 9).await });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!raise.is_finished(), "the statement timeout ended a commit's wait for the standby");
    assert_eq!(max_term(store::get_fence(&client, "free").await.unwrap()), 7, "the raise is not visible yet");
    link.set(Mode::Pass);
    let answer = tokio::time::timeout(Duration::from_secs(30), raise).await.unwrap().unwrap();
    assert!(matches!(answer, Ok(9)), "{answer:?}");
    assert_eq!(max_term(store::get_fence(&client, "free").await.unwrap()), 9);
}
