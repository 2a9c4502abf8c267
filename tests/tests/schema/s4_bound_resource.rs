//! S4: a resource bound to a lease key admits only that lease's current term: a forged or
//! future token cannot poison the fence, and a zombie's older term is refused the moment a new
//! term is granted, before the new leader has written anything.

use std::time::Duration;

use fencing_schema::store::{self, Outcome};
use fencing_schema::{Error, SQLSTATE_REFUSED};
use fencing_tests::pg::TestDb;
use fencing_tests::{fencing_state, sqlstate};
use tokio_postgres::Client;

const LEASE: &str = "s4-lease";
const RESOURCE: &str = "s4-account";
const TTL: Duration = Duration::from_secs(60);

/// Calls `fencing.admit` and expects a refusal that changes nothing.
async fn expect_refused(client: &Client, term: i64, expected: Outcome) {
    let before = fencing_state(client).await;
    let decision = store::try_admit(client, RESOURCE, term, true).await.unwrap();
    assert_eq!(decision.outcome, expected, "term {term}: {decision:?}");
    match store::admit(client, RESOURCE, term).await {
        Err(Error::Refused { message, .. }) => {
            assert!(message.contains(RESOURCE), "names the resource: {message}");
            assert!(message.contains(&format!("presented term {term}")), "names the presented term: {message}");
            assert!(
                message.contains(&format!("current term {}", decision.current_term())),
                "names the current term: {message}"
            );
        }
        other => panic!("term {term}: expected a refusal, got {other:?}"),
    }
    assert_eq!(fencing_state(client).await, before, "a refused term {term} changes nothing");
}

#[tokio::test]
async fn s4_bound_resource_refuses_future_and_forged_terms_and_the_old_term_once_a_new_one_is_granted() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    assert_eq!(store::bind(&client, RESOURCE, LEASE).await.unwrap(), 0);

    // No lease yet: no term is current, so every term is a future one.
    expect_refused(&client, 1, Outcome::FutureTerm).await;

    let a = store::acquire(&client, LEASE, "leader-a", TTL).await.unwrap();
    assert_eq!(a.term, Some(1));
    // A forged or future token cannot poison the fence.
    expect_refused(&client, 2, Outcome::FutureTerm).await;
    expect_refused(&client, i64::MAX, Outcome::FutureTerm).await;
    assert_eq!(store::admit(&client, RESOURCE, 1).await.unwrap(), 1);
    assert_eq!(store::admit(&client, RESOURCE, 1).await.unwrap(), 1, "the leader writes again");

    // A's period ends; B is granted term 2 and has not written.
    assert!(store::release(&client, LEASE, "leader-a").await.unwrap());
    let b = store::acquire(&client, LEASE, "leader-b", TTL).await.unwrap();
    assert_eq!(b.term, Some(2));
    let fence = store::get_fence(&client, RESOURCE).await.unwrap().unwrap();
    assert_eq!(fence.max_term, 1, "B has not written yet");
    // The zombie's term is refused already, although the fence's maximum is still its term.
    expect_refused(&client, 1, Outcome::Stale).await;
    expect_refused(&client, 3, Outcome::FutureTerm).await;
    assert_eq!(store::admit(&client, RESOURCE, 2).await.unwrap(), 2);

    // B's period ends and nobody follows: its term is no longer held, so nothing is admitted.
    assert!(store::release(&client, LEASE, "leader-b").await.unwrap());
    expect_refused(&client, 2, Outcome::NotLeader).await;
}

#[tokio::test]
async fn s4_bound_resource_refuses_the_old_term_after_expiry_and_takeover() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    store::bind(&client, RESOURCE, LEASE).await.unwrap();
    let a = store::acquire(&client, LEASE, "leader-a", Duration::from_millis(200)).await.unwrap();
    assert_eq!(store::admit(&client, RESOURCE, 1).await.unwrap(), 1);

    // A stops renewing (paused, partitioned); its lease runs out by the store's clock.
    fencing_tests::wait_for_store_clock(&client, a.expires_at.unwrap()).await;
    expect_refused(&client, 1, Outcome::NotLeader).await;
    let b = store::acquire(&client, LEASE, "leader-b", TTL).await.unwrap();
    assert_eq!(b.term, Some(2));
    expect_refused(&client, 1, Outcome::Stale).await;
}

/// Granting a new term never waits for the old leader's open transactions (the election stays
/// live), but the new leader's first admission waits until they end, so the old leader's
/// already-admitted write commits before any write of the new term.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s4_new_term_is_granted_at_once_and_its_first_write_waits_for_the_old_terms_open_transaction() {
    let db = TestDb::new().await;
    let mut old_leader = db.connect().await;
    let new_leader = db.connect().await;
    let observer = db.connect().await;
    store::bind(&observer, RESOURCE, LEASE).await.unwrap();
    store::acquire(&observer, LEASE, "leader-a", Duration::from_millis(300)).await.unwrap();

    let transaction = old_leader.transaction().await.unwrap();
    assert_eq!(store::admit(&transaction, RESOURCE, 1).await.unwrap(), 1);

    // A's lease expires while its transaction is open; B is granted term 2 without waiting.
    let granted = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let reply = store::acquire(&observer, LEASE, "leader-b", TTL).await.unwrap();
            if reply.ok {
                return reply;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("acquire is never blocked by an open transaction of the old term");
    assert_eq!(granted.term, Some(2));

    let new_pid: i32 = new_leader.query_one("SELECT pg_backend_pid()", &[]).await.unwrap().get(0);
    let first_write = tokio::spawn(async move { store::admit(&new_leader, RESOURCE, 2).await });
    // Wait until the new leader's admission is blocked on the old transaction's lock.
    let mut blocked = false;
    for _ in 0..500 {
        let row = observer
            .query_one("SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1", &[&new_pid])
            .await
            .unwrap();
        if row.get::<_, Option<bool>>(0) == Some(true) {
            blocked = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(blocked, "the new term's first admission waits for the old term's open transaction");
    assert!(!first_write.is_finished());

    transaction.commit().await.unwrap();
    assert_eq!(first_write.await.unwrap().unwrap(), 2);
    let error = old_leader.query_one("SELECT fencing.admit($1, 1)", &[&RESOURCE]).await.unwrap_err();
    assert_eq!(sqlstate(&error), Some(SQLSTATE_REFUSED));
}

#[tokio::test]
async fn unbound_resource_admits_any_term_at_or_above_its_maximum() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    assert_eq!(store::admit(&client, "free", 5).await.unwrap(), 5);
    assert_eq!(store::admit(&client, "free", 5).await.unwrap(), 5);
    assert_eq!(store::admit(&client, "free", 9).await.unwrap(), 9);
    let before = fencing_state(&client).await;
    assert!(matches!(store::admit(&client, "free", 8).await, Err(Error::Refused { .. })));
    assert_eq!(fencing_state(&client).await, before);
}

/// Each refusal says what is true of it: a newer term exists, the term was never granted, or
/// the lease is not held; never "a newer leader" when there is none.
#[tokio::test]
async fn refusal_messages_and_hints_say_what_is_true_of_each_outcome() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    store::bind(&client, RESOURCE, LEASE).await.unwrap();
    let a = store::acquire(&client, LEASE, "leader-a", TTL).await.unwrap().term.unwrap();
    store::admit(&client, RESOURCE, a).await.unwrap();
    let check = async |term: i64, message: &str, hint: &str| {
        let error = client.execute("SELECT fencing.admit($1, $2)", &[&RESOURCE, &term]).await.unwrap_err();
        let db = error.as_db_error().unwrap();
        assert_eq!(db.code().code(), SQLSTATE_REFUSED);
        assert!(db.message().contains(message), "{:?} lacks {message:?}", db.message());
        let got = db.hint().unwrap_or_default();
        assert!(got.contains(hint), "hint {got:?} lacks {hint:?}");
    };
    check(a + 1, "refused (future term)", "never granted").await;
    assert!(store::release(&client, LEASE, "leader-a").await.unwrap());
    check(a, "refused (not leader)", "is not held right now").await;
    store::acquire(&client, LEASE, "leader-b", TTL).await.unwrap();
    check(a, "refused (stale term)", "granted a newer term").await;
}

/// Waits (up to 10 s) until the session whose backend is `pid` waits for a lock.
async fn until_it_waits_for_a_lock(client: &Client, pid: i32) {
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let row = client
            .query_one("SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'", &[&pid])
            .await
            .unwrap();
        if row.get::<_, i64>(0) > 0 {
            return;
        }
        assert!(tokio::time::Instant::now() < until, "the raise never waited for the fence row");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// S4 at the moment of a raise (found by the protocol model, `model/`, with three elector
/// calls): a raise of a bound fence decides on the lease it read, then waits for the fence row
/// (held here by an open writer) and for the grants. A new term of the lease granted meanwhile
/// must refuse it, though the fence never moved: the raise checks the lease again, held, before
/// it raises. Both raise paths: the gateway's (`fencing.gate`) and SQL's (`fencing.admit`).
/// Without that check, term 2 was admitted after term 3 had been granted (the fence at 2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s4_a_raise_that_waited_for_the_fence_row_is_refused_once_a_newer_term_is_granted() {
    let db = TestDb::new().await;
    let setup = db.connect().await;
    for via_gateway in [true, false] {
        let resource = format!("s4-raise-{via_gateway}");
        let lease = format!("s4-raise-lease-{via_gateway}");
        store::bind(&setup, &resource, &lease).await.unwrap();
        // A leads at term 1 and writes; then B is granted term 2 and has written nothing.
        assert_eq!(store::acquire(&setup, &lease, "leader-a", TTL).await.unwrap().term, Some(1));
        assert_eq!(store::admit(&setup, &resource, 1).await.unwrap(), 1);
        assert!(store::release(&setup, &lease, "leader-a").await.unwrap());
        assert_eq!(store::acquire(&setup, &lease, "leader-b", TTL).await.unwrap().term, Some(2));

        // An open transaction holds the fence row, as an SQL writer does until it commits.
        let holder = db.connect().await;
        holder.batch_execute("BEGIN").await.unwrap();
        holder.query("SELECT 1 FROM fencing.fences WHERE resource = $1 FOR KEY SHARE", &[&resource]).await.unwrap();

        // B's first write raises the fence to 2: it reads the lease at 2, then waits for the row.
        let raiser = db.connect().await;
        let pid: i32 = raiser.query_one("SELECT pg_backend_pid()", &[]).await.unwrap().get(0);
        let (r, l) = (resource.clone(), lease.clone());
        let raise = tokio::spawn(async move {
            if via_gateway {
                store::gate(&raiser, &r, 2, Duration::from_secs(1), Some(&l)).await.map(|gate| gate.outcome)
            } else {
                store::admit(&raiser, &r, 2).await.map(|_| Outcome::Admitted)
            }
        });
        until_it_waits_for_a_lock(&setup, pid).await;

        // Meanwhile B's period ends and C is granted term 3, before B's raise commits.
        assert!(store::release(&setup, &lease, "leader-b").await.unwrap());
        assert_eq!(store::acquire(&setup, &lease, "leader-c", TTL).await.unwrap().term, Some(3));
        holder.batch_execute("COMMIT").await.unwrap();

        let decided = tokio::time::timeout(Duration::from_secs(10), raise).await.unwrap().unwrap();
        if via_gateway {
            assert_eq!(decided.unwrap(), Outcome::Stale, "the gateway's raise of term 2 after term 3 was granted");
        } else {
            match decided {
                Err(Error::Refused { message, .. }) => assert!(message.contains("presented term 2"), "{message}"),
                other => panic!("the SQL raise of term 2 after term 3 was granted: {other:?}"),
            }
        }
        let fence = store::get_fence(&setup, &resource).await.unwrap().unwrap();
        assert_eq!(fence.max_term, 1, "term 2 never reached the fence: its period ended before its raise");
    }
}

/// The lease moves on, from term 1 to 2, while `waiting` (session pid) waits for a lock that
/// `holder` holds; then `holder` ends its transaction with `end` (COMMIT or ROLLBACK).
async fn lease_moves_on_while_it_waits(setup: &Client, holder: &Client, waiting: i32, lease: &str, end: &str) {
    until_it_waits_for_a_lock(setup, waiting).await;
    assert!(store::release(setup, lease, "leader-a").await.unwrap());
    assert_eq!(store::acquire(setup, lease, "leader-b", TTL).await.unwrap().term, Some(2));
    holder.batch_execute(end).await.unwrap();
}

/// S4 after every wait, not only a raise's: each decision of a bound fence that waited for a lock
/// checks the lease again before it admits. Three waits, each with the lease moved from term 1
/// to 2 meanwhile; before the check, each admitted term 1 after term 2 was granted.
/// - The gateway's first write of a resource waited for a concurrent first write that then
///   rolled back.
/// - The gateway's recording of a longer forward timeout waited for another gateway's.
/// - An SQL writer of the current term (`fencing.admit`) waited for a raise that then rolled back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s4_a_decision_that_waited_for_a_lock_is_refused_once_a_newer_term_is_granted() {
    let db = TestDb::new().await;
    let setup = db.connect().await;
    let second = Duration::from_secs(1);

    // The first write of a resource.
    let (resource, lease) = ("s4-wait-first", "s4-wait-first-lease");
    assert_eq!(store::acquire(&setup, lease, "leader-a", TTL).await.unwrap().term, Some(1));
    let holder = db.connect().await;
    holder.batch_execute("BEGIN").await.unwrap();
    let first = store::gate(&holder, resource, 1, second, Some(lease)).await.unwrap();
    assert_eq!(first.outcome, Outcome::Admitted);
    let writer = db.connect().await;
    let pid: i32 = writer.query_one("SELECT pg_backend_pid()", &[]).await.unwrap().get(0);
    let write = tokio::spawn(async move { store::gate(&writer, resource, 1, second, Some(lease)).await });
    lease_moves_on_while_it_waits(&setup, &holder, pid, lease, "ROLLBACK").await;
    let decided = tokio::time::timeout(Duration::from_secs(10), write).await.unwrap().unwrap().unwrap();
    assert_eq!(decided.outcome, Outcome::Stale, "a first write of term 1 after term 2 was granted: {decided:?}");

    // The gateway's recording of a longer forward timeout.
    let (resource, lease) = ("s4-wait-record", "s4-wait-record-lease");
    store::bind(&setup, resource, lease).await.unwrap();
    assert_eq!(store::acquire(&setup, lease, "leader-a", TTL).await.unwrap().term, Some(1));
    assert_eq!(store::gate(&setup, resource, 1, second, Some(lease)).await.unwrap().outcome, Outcome::Admitted);
    let holder = db.connect().await;
    holder.batch_execute("BEGIN").await.unwrap();
    let other = store::gate(&holder, resource, 1, 2 * second, Some(lease)).await.unwrap();
    assert_eq!(other.outcome, Outcome::Admitted);
    let writer = db.connect().await;
    let pid: i32 = writer.query_one("SELECT pg_backend_pid()", &[]).await.unwrap().get(0);
    let write = tokio::spawn(async move { store::gate(&writer, resource, 1, 3 * second, Some(lease)).await });
    lease_moves_on_while_it_waits(&setup, &holder, pid, lease, "COMMIT").await;
    let decided = tokio::time::timeout(Duration::from_secs(10), write).await.unwrap().unwrap().unwrap();
    assert_eq!(decided.outcome, Outcome::Stale, "a write of term 1 after term 2 was granted: {decided:?}");

    // An SQL writer of the current term behind a raise in progress.
    let (resource, lease) = ("s4-wait-sql", "s4-wait-sql-lease");
    store::bind(&setup, resource, lease).await.unwrap();
    assert_eq!(store::acquire(&setup, lease, "leader-a", TTL).await.unwrap().term, Some(1));
    assert_eq!(store::admit(&setup, resource, 1).await.unwrap(), 1);
    let holder = db.connect().await;
    holder.batch_execute("BEGIN").await.unwrap();
    holder.query("SELECT 1 FROM fencing.fences WHERE resource = $1 FOR UPDATE", &[&resource]).await.unwrap();
    let writer = db.connect().await;
    let pid: i32 = writer.query_one("SELECT pg_backend_pid()", &[]).await.unwrap().get(0);
    let write = tokio::spawn(async move { store::admit(&writer, resource, 1).await });
    lease_moves_on_while_it_waits(&setup, &holder, pid, lease, "ROLLBACK").await;
    match tokio::time::timeout(Duration::from_secs(10), write).await.unwrap().unwrap() {
        Err(Error::Refused { message, .. }) => assert!(message.contains("presented term 1"), "{message}"),
        other => panic!("an SQL write of term 1 after term 2 was granted: {other:?}"),
    }
}

/// Two more waits of an SQL writer (found in review): a raise to the lease's current term that
/// waited behind another writer's raise to that same term, committed meanwhile, while the lease
/// moved on; and a writer of the current term whose row lock waited behind a rebinding to
/// another lease. Before, the first admitted term 2 after term 3 was granted, and the second
/// admitted term 1 of the old lease on a resource now bound to a lease no one holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s4_an_sql_writer_decides_on_the_lease_and_binding_it_finds_after_its_wait() {
    let db = TestDb::new().await;
    let setup = db.connect().await;

    // A raise to term 2 behind another raise to term 2.
    let (resource, lease) = ("s4-sql-raise-twice", "s4-sql-raise-twice-lease");
    store::bind(&setup, resource, lease).await.unwrap();
    assert_eq!(store::acquire(&setup, lease, "leader-a", TTL).await.unwrap().term, Some(1));
    assert_eq!(store::admit(&setup, resource, 1).await.unwrap(), 1);
    assert!(store::release(&setup, lease, "leader-a").await.unwrap());
    assert_eq!(store::acquire(&setup, lease, "leader-b", TTL).await.unwrap().term, Some(2));
    let holder = db.connect().await;
    holder.batch_execute("BEGIN").await.unwrap();
    assert_eq!(store::admit(&holder, resource, 2).await.unwrap(), 2);
    let writer = db.connect().await;
    let pid: i32 = writer.query_one("SELECT pg_backend_pid()", &[]).await.unwrap().get(0);
    let write = tokio::spawn(async move { store::admit(&writer, resource, 2).await });
    until_it_waits_for_a_lock(&setup, pid).await;
    assert!(store::release(&setup, lease, "leader-b").await.unwrap());
    assert_eq!(store::acquire(&setup, lease, "leader-c", TTL).await.unwrap().term, Some(3));
    holder.batch_execute("COMMIT").await.unwrap();
    match tokio::time::timeout(Duration::from_secs(10), write).await.unwrap().unwrap() {
        Err(Error::Refused { message, .. }) => assert!(message.contains("presented term 2"), "{message}"),
        other => panic!("an SQL write of term 2 after term 3 was granted: {other:?}"),
    }

    // A writer of the current term behind a rebinding.
    let (resource, lease, other) = ("s4-sql-rebound", "s4-sql-rebound-lease", "s4-sql-rebound-nobody");
    store::bind(&setup, resource, lease).await.unwrap();
    assert_eq!(store::acquire(&setup, lease, "leader-a", TTL).await.unwrap().term, Some(1));
    assert_eq!(store::admit(&setup, resource, 1).await.unwrap(), 1);
    let holder = db.connect().await;
    holder.batch_execute("BEGIN").await.unwrap();
    store::rebind(&holder, resource, other, "dba", "moved to another leader").await.unwrap();
    let writer = db.connect().await;
    let pid: i32 = writer.query_one("SELECT pg_backend_pid()", &[]).await.unwrap().get(0);
    let write = tokio::spawn(async move { store::admit(&writer, resource, 1).await });
    until_it_waits_for_a_lock(&setup, pid).await;
    holder.batch_execute("COMMIT").await.unwrap();
    match tokio::time::timeout(Duration::from_secs(10), write).await.unwrap().unwrap() {
        Err(Error::Refused { message, .. }) => assert!(message.contains("presented term 1"), "{message}"),
        other => panic!("an SQL write of the old lease's term admitted after a rebinding: {other:?}"),
    }
}
