//! Grants (schema versions 5 and 8): while a gateway may admit a term without asking, nothing
//! moves the fence past that term, and a bound lease gets no new term. Each test is the session
//! that would break the rule if a term change ignored grants: it measures that the change waited
//! for the grant's end (a length of real time from before the grant was asked for), and that a
//! grant is never longer than asked nor reaches past its lease.

use std::time::Duration;

use tokio::time::Instant;

use fencing_schema::store::{self, Outcome};
use fencing_tests::pg::TestDb;

const FORWARD: Duration = Duration::from_secs(1);
const GRANT: Duration = Duration::from_millis(700);
/// Clock reading and rounding slack between the store's answer and this process's clock.
/// (A term change sleeps a 10 ms slice more than the grant: a sleep short by one slice fails.)
const SLACK: Duration = Duration::from_millis(1);

/// Takes a grant on `resource` at `term` and returns how long it lasts from now (at most).
async fn take_grant(
    client: &tokio_postgres::Client,
    resource: &str,
    term: i64,
    bind: Option<&str>,
) -> (Instant, Duration) {
    take_grant_of(client, resource, term, bind, FORWARD, GRANT).await
}

/// Takes a grant of `grant` on `resource` at `term` (writes forwarded for `forward`): when it was
/// asked for, and how long it lasts from then (at most); never longer than asked.
pub(crate) async fn take_grant_of(
    client: &tokio_postgres::Client,
    resource: &str,
    term: i64,
    bind: Option<&str>,
    forward: Duration,
    grant: Duration,
) -> (Instant, Duration) {
    // The first write creates the fence without a grant; the next one is granted.
    for _ in 0..2 {
        let asked = Instant::now();
        let gate = store::gate_granted(client, resource, term, forward, bind, grant).await.unwrap();
        assert!(gate.is_admitted(), "{gate:?}");
        if !gate.grant.is_zero() {
            assert!(gate.grant <= grant, "a grant is never longer than asked: {gate:?}");
            return (asked, gate.grant);
        }
    }
    panic!("no grant on {resource}");
}

#[tokio::test]
async fn grant_zero_keeps_the_per_write_decision_and_records_no_grant() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    for _ in 0..3 {
        let gate = store::gate_granted(&client, "r", 1, FORWARD, None, Duration::ZERO).await.unwrap();
        assert!(gate.is_admitted());
        assert_eq!(gate.grant, Duration::ZERO);
    }
    let granted: Option<i64> =
        client.query_one("SELECT grant_ms FROM fencing.fences WHERE resource = 'r'", &[]).await.unwrap().get(0);
    assert_eq!(granted, None);
    // And a higher term goes through at once.
    let started = Instant::now();
    assert!(store::gate(&client, "r", 2, FORWARD, None).await.unwrap().is_admitted());
    assert!(started.elapsed() < Duration::from_millis(500));
}

#[tokio::test]
async fn a_renewal_as_long_as_the_recorded_grant_writes_nothing() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    take_grant(&client, "r", 1, None).await;
    let read = "SELECT grant_ms, xmin::text FROM fencing.fences WHERE resource = 'r'";
    let before = client.query_one(read, &[]).await.unwrap();
    for _ in 0..50 {
        let gate = store::gate_granted(&client, "r", 1, FORWARD, None, GRANT).await.unwrap();
        assert!(gate.is_admitted() && gate.grant == GRANT, "{gate:?}");
    }
    let after = client.query_one(read, &[]).await.unwrap();
    let (x0, x1): (String, String) = (before.get(1), after.get(1));
    // Fifty renewals of the length the row records: the fence row was not written again.
    assert_eq!(x0, x1, "a renewal that records nothing new wrote the fence row");
    assert_eq!(after.get::<_, Option<i64>>(0), Some(GRANT.as_millis() as i64));
    // A bound fence's renewal writes neither the fence nor the lease.
    let term = store::acquire(&client, "k", "a", Duration::from_secs(60)).await.unwrap().term.unwrap();
    take_grant(&client, "acct", term, Some("k")).await;
    let rows = "SELECT (SELECT xmin::text FROM fencing.fences WHERE resource = 'acct'), \
                (SELECT xmin::text FROM fencing.leases WHERE key = 'k')";
    let before = client.query_one(rows, &[]).await.unwrap();
    for _ in 0..20 {
        let gate = store::gate_granted(&client, "acct", term, FORWARD, Some("k"), GRANT).await.unwrap();
        assert!(gate.is_admitted() && !gate.grant.is_zero(), "{gate:?}");
    }
    let after = client.query_one(rows, &[]).await.unwrap();
    assert_eq!(
        (before.get::<_, String>(0), before.get::<_, String>(1)),
        (after.get::<_, String>(0), after.get::<_, String>(1)),
        "a bound renewal wrote the fence or the lease row"
    );
}

/// A renewal that would record nothing new, while a term change sleeps out the grants holding the
/// advisory lock: no grant (the change waits for no grant given after it began), and the write
/// is admitted on the version read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_while_a_term_change_sleeps_out_the_grants_gets_no_grant() {
    let db = TestDb::new().await;
    let holder = db.connect().await;
    let raiser = db.connect().await;
    let (asked, lasts) = take_grant(&holder, "/free/r", 1, None).await;
    let raise = tokio::spawn(async move { raiser.query_one("SELECT fencing.admit('/free/r', 2)", &[]).await.unwrap() });
    tokio::time::sleep(GRANT / 3).await;
    let during = store::gate_granted(&holder, "/free/r", 1, FORWARD, None, GRANT).await.unwrap();
    assert!(during.is_admitted(), "the raise has not committed: {during:?}");
    assert_eq!(during.grant, Duration::ZERO, "a grant given after the term change began: {during:?}");
    raise.await.unwrap();
    assert!(Instant::now() + SLACK >= asked + lasts, "the raise ended before the grant");
    let late = store::gate_granted(&holder, "/free/r", 1, FORWARD, None, GRANT).await.unwrap();
    assert_eq!(late.outcome, Outcome::Stale, "{late:?}");
}

#[tokio::test]
async fn a_higher_term_through_a_gateway_waits_until_the_lower_terms_grant_has_ended() {
    let db = TestDb::new().await;
    let holder = db.connect().await;
    let raiser = db.connect().await;
    let (asked, lasts) = take_grant(&holder, "/free/r", 1, None).await;
    let grant_end = asked + lasts;

    let raise = store::gate(&raiser, "/free/r", 2, FORWARD, None).await.unwrap();
    let done = Instant::now();
    assert!(raise.is_admitted(), "{raise:?}");
    assert!(done + SLACK >= grant_end, "term 2 was admitted {:?} before term 1's grant ended", grant_end - done);
    // From then on term 1 is refused, and no grant is handed out for it.
    let late = store::gate_granted(&holder, "/free/r", 1, FORWARD, None, GRANT).await.unwrap();
    assert_eq!(late.outcome, Outcome::Stale, "{late:?}");
    assert_eq!(late.grant, Duration::ZERO);
    // Term 2's writes settle behind every write term 1's grant may have admitted (S5).
    assert!(raise.wait >= FORWARD, "{raise:?}");
}

#[tokio::test]
async fn the_sql_guard_and_admin_actions_wait_for_grants_too() {
    let db = TestDb::new().await;
    let holder = db.connect().await;
    let other = db.connect().await;

    // fencing.admit (what the guard calls) with a higher term.
    let (asked, lasts) = take_grant(&holder, "a", 1, None).await;
    other.query_one("SELECT fencing.admit('a', 2)", &[]).await.unwrap();
    assert!(Instant::now() + SLACK >= asked + lasts, "fencing.admit raised the fence under a grant");

    // advance_fence.
    let (asked, lasts) = take_grant(&holder, "b", 1, None).await;
    other.query_one("SELECT fencing.advance_fence('b', 5, 'ops', 'test')", &[]).await.unwrap();
    assert!(Instant::now() + SLACK >= asked + lasts, "advance_fence moved the fence under a grant");

    // reset_fence (the poisoned-fence recovery).
    let (asked, lasts) = take_grant(&holder, "c", 9, None).await;
    other.query_one("SELECT fencing.reset_fence('c', 1, 'ops', 'test')", &[]).await.unwrap();
    assert!(Instant::now() + SLACK >= asked + lasts, "reset_fence moved the fence under a grant");

    // bind: an unbound grant admits any writer of its term.
    let (asked, lasts) = take_grant(&holder, "d", 1, None).await;
    other.query_one("SELECT fencing.bind('d', 'l')", &[]).await.unwrap();
    assert!(Instant::now() + SLACK >= asked + lasts, "bind bound a fence under an unbound grant");

    // rebind.
    let term = store::acquire(&holder, "l1", "a", Duration::from_secs(60)).await.unwrap().term.unwrap();
    let (asked, lasts) = take_grant(&holder, "e", term, Some("l1")).await;
    other.query_one("SELECT fencing.rebind('e', 'l2', 'ops', 'test')", &[]).await.unwrap();
    assert!(Instant::now() + SLACK >= asked + lasts, "rebind moved the fence under a grant");
}

#[tokio::test]
async fn a_released_lease_gets_no_new_term_before_its_grants_end() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    let ttl = Duration::from_secs(60);
    let term = store::acquire(&client, "k", "a", ttl).await.unwrap().term.unwrap();
    let (asked, lasts) = take_grant(&client, "acct", term, Some("k")).await;
    assert!(store::release(&client, "k", "a").await.unwrap());

    // Another owner: the new period starts only once the grant has ended.
    let taken = store::acquire(&client, "k", "b", ttl).await.unwrap();
    assert!(Instant::now() + SLACK >= asked + lasts, "a new term while a grant on the old one may still admit writes");
    assert!(taken.ok, "{taken:?}");
    assert_eq!(taken.term, Some(term + 1));
    let zombie = store::gate_granted(&client, "acct", term, FORWARD, Some("k"), GRANT).await.unwrap();
    assert_eq!(zombie.outcome, Outcome::Stale, "{zombie:?}");
}

#[tokio::test]
async fn a_force_released_lease_gets_no_new_term_before_its_grants_end() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    let ttl = Duration::from_secs(60);
    let term = store::acquire(&client, "k", "a", ttl).await.unwrap().term.unwrap();
    let (asked, lasts) = take_grant(&client, "acct", term, Some("k")).await;
    client.query_one("SELECT fencing.force_release('k', 'ops', 'test')", &[]).await.unwrap();
    let taken = store::acquire(&client, "k", "b", ttl).await.unwrap();
    assert!(Instant::now() + SLACK >= asked + lasts, "a new term under an outstanding grant: {taken:?}");
    assert_eq!(taken.term, Some(term + 1), "{taken:?}");
    // The new holder's next period starts at once: no grant was given at its term.
    let again = Instant::now();
    let old = store::acquire_new_period(&client, "k", "b", ttl).await.unwrap();
    assert_eq!(old.term, Some(term + 2), "{old:?}");
    assert!(again.elapsed() < GRANT, "a new period with no grant at its old term waited");
}

#[tokio::test]
async fn a_grant_on_a_bound_resource_never_outlives_its_lease() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    let ttl = Duration::from_millis(300);
    let acquired = Instant::now();
    let term = store::acquire(&client, "k", "a", ttl).await.unwrap().term.unwrap();
    let (asked, lasts) = take_grant(&client, "acct", term, Some("k")).await;
    // The lease's expiry is counted by the store from its decision, a round trip after `acquired`.
    let round_trip = Duration::from_millis(30);
    assert!(asked + lasts <= acquired + ttl + round_trip, "the grant ({lasts:?}) reaches past the lease");
    // Once the lease expired: not_leader, with grants as without.
    tokio::time::sleep_until(acquired + ttl + round_trip).await;
    let late = store::gate_granted(&client, "acct", term, FORWARD, Some("k"), GRANT).await.unwrap();
    assert_eq!(late.outcome, Outcome::NotLeader, "{late:?}");
    assert_eq!(late.grant, Duration::ZERO);
    // A renewal lets the next grant reach further.
    let term = store::acquire(&client, "k", "a", Duration::from_secs(60)).await.unwrap().term.unwrap();
    let (_, lasts) = take_grant(&client, "acct", term, Some("k")).await;
    assert!(lasts > GRANT / 2, "{lasts:?}");
}

#[tokio::test]
async fn a_bad_grant_is_refused_and_changes_nothing() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    for grant in [Duration::from_secs(61), Duration::from_secs(3600)] {
        let error = store::gate_granted(&client, "r", 1, FORWARD, None, grant).await.unwrap_err();
        assert!(error.to_string().contains("grant"), "{error}");
    }
    assert!(store::get_fence(&client, "r").await.unwrap().is_none());
}

#[tokio::test]
async fn a_renewal_with_a_shorter_ttl_does_not_let_a_new_term_in_before_the_grants_end() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    let term = store::acquire(&client, "k", "a", Duration::from_secs(30)).await.unwrap().term.unwrap();
    let (asked, lasts) = take_grant(&client, "acct", term, Some("k")).await;
    // The holder shortens its lease below the grant, and lets it expire.
    assert!(store::renew(&client, "k", "a", Duration::from_millis(100)).await.unwrap().ok);
    tokio::time::sleep(Duration::from_millis(150)).await;
    let taken = store::acquire(&client, "k", "b", Duration::from_secs(30)).await.unwrap();
    assert!(Instant::now() + SLACK >= asked + lasts, "a new term under an outstanding grant: {taken:?}");
    assert!(taken.ok, "{taken:?}");
}

#[tokio::test]
async fn ending_or_starting_a_period_outside_read_committed_is_refused() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    store::acquire(&client, "k", "a", Duration::from_secs(30)).await.unwrap();
    for level in ["REPEATABLE READ", "SERIALIZABLE"] {
        client.batch_execute(&format!("BEGIN ISOLATION LEVEL {level}")).await.unwrap();
        let error = client.query_one("SELECT fencing.release('k', 'a')", &[]).await.unwrap_err();
        assert_eq!(fencing_tests::sqlstate(&error), Some("0A000"), "{level}: {error}");
        client.batch_execute("ROLLBACK").await.unwrap();
    }
    // At READ COMMITTED it works, and the next term starts at once (no grant was given).
    assert!(store::release(&client, "k", "a").await.unwrap());
    let next = store::acquire(&client, "k", "b", Duration::from_secs(30)).await.unwrap();
    assert_eq!(next.term, Some(2), "{next:?}");
}

#[tokio::test]
async fn stamp_mode_on_an_unbound_route_gets_no_grant() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    store::acquire(&client, "s", "o", Duration::from_secs(1)).await.unwrap();
    for _ in 0..3 {
        let row = client
            .query_one(
                store::GATE_LEASE_SQL,
                &[&"/r/x", &"s", &"o", &1000_i64, &None::<&str>, &(GRANT.as_millis() as i64)],
            )
            .await
            .unwrap();
        let gate = store::Gate::from_row(&row).unwrap();
        assert!(gate.is_admitted(), "{gate:?}");
        assert_eq!(gate.grant, Duration::ZERO, "a stamp-mode grant on an unbound fence would outlive the lease");
    }
}

/// Many raced pairs: a gateway decision of term t asking for a grant, and an SQL raise to t + 1,
/// at the same instant. Whenever the decision came back admitted with a grant, the raise must not
/// have been answered before that grant's end (measured from when the decision was asked).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raise_racing_a_grant_never_ends_before_the_grant() {
    let db = TestDb::new().await;
    let gate_session = std::sync::Arc::new(db.connect().await);
    let raise_session = std::sync::Arc::new(db.connect().await);
    let grant = Duration::from_millis(150);
    let mut granted = 0;
    for round in 0..60_i64 {
        let resource = format!("/race/r{round}");
        let t = 1_i64;
        // The fence exists at term t, recording a forward timeout shorter than the decision's (so
        // the decision writes the row).
        store::gate(&*gate_session, &resource, t, Duration::from_millis(5), None).await.unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
        let (g, r) = (std::sync::Arc::clone(&gate_session), std::sync::Arc::clone(&raise_session));
        let (res_g, res_r) = (resource.clone(), resource.clone());
        let decision = tokio::spawn(async move {
            let asked = Instant::now();
            let gate = store::gate_granted(&*g, &res_g, t, FORWARD, None, grant).await.unwrap();
            (asked, gate)
        });
        let delay = Duration::from_micros((round as u64 % 7) * 150);
        let raise = tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            r.query_one("SELECT fencing.admit($1, $2)", &[&res_r, &(t + 1)]).await.unwrap();
            Instant::now()
        });
        let (asked, gate) = decision.await.unwrap();
        let answered = raise.await.unwrap();
        if gate.is_admitted() && !gate.grant.is_zero() {
            granted += 1;
            assert!(
                answered + SLACK >= asked + gate.grant,
                "round {round}: the raise was answered {:?} before a grant it did not wait for ended: {gate:?}",
                (asked + gate.grant) - answered
            );
        }
    }
    println!("{granted} of 60 decisions came back with a grant");
}

/// The fault suite's find: a fence whose forward timeout is recorded but on which no grant was
/// (the last decisions came from a replica without grants), a raise holding the row
/// (uncommitted), and a decision asking for a grant: it may be admitted on the version it read,
/// but must not come back with a grant, since the raise waits for no grant on that row.
#[tokio::test]
async fn a_decision_that_skips_a_locked_row_never_hands_out_a_grant_nobody_recorded() {
    let db = TestDb::new().await;
    let no_grants = db.connect().await;
    let raiser = db.connect().await;
    let granting = db.connect().await;
    // Term 1 through a replica without grants: forward_ms is recorded, grant_ms stays NULL.
    for _ in 0..2 {
        assert!(store::gate(&no_grants, "/free/r", 1, FORWARD, None).await.unwrap().is_admitted());
    }
    // The raise holds the row and has not committed.
    raiser.batch_execute("BEGIN; SELECT fencing.admit('/free/r', 2)").await.unwrap();
    let decision = store::gate_granted(&granting, "/free/r", 1, FORWARD, None, GRANT).await.unwrap();
    assert_eq!(decision.grant, Duration::ZERO, "a grant no raise waits for: {decision:?}");
    raiser.batch_execute("COMMIT").await.unwrap();
    let late = store::gate_granted(&granting, "/free/r", 1, FORWARD, None, GRANT).await.unwrap();
    assert_eq!(late.outcome, Outcome::Stale, "{late:?}");
}

/// Lease grants (schema version 9): a grant given on one resource of a lease covers, at the
/// gateway, every resource of the lease decided at that term and fence epoch. So an admin change
/// of another resource of the lease, one whose own row records no grant, must still wait the
/// grant out, and must move the epoch on: the session that would break it advances and rebinds
/// such a resource right after a grant was given on its sibling.
#[tokio::test]
async fn an_admin_change_of_a_bound_fence_waits_out_the_grants_on_its_leases_other_resources() {
    let db = TestDb::new().await;
    let gateway = db.connect().await;
    let admin = db.connect().await;
    let term = store::acquire(&gateway, "k", "a", Duration::from_secs(60)).await.unwrap().term.unwrap();
    for (x, change) in [
        ("x1", "SELECT fencing.advance_fence('x1', $1::bigint, 'ops', 'test')"),
        ("x2", "SELECT fencing.rebind('x2', 'other', 'ops', 'test')"),
    ] {
        // x: one decision, no grant recorded on its row (a first write gets none).
        let first = store::gate_granted(&gateway, x, term, FORWARD, Some("k"), GRANT).await.unwrap();
        assert!(first.is_admitted());
        assert_eq!(first.grant, Duration::ZERO);
        let epoch = first.epoch.expect("a bound decision carries the lease's fence epoch");
        let x_grant: Option<i64> =
            admin.query_one("SELECT grant_ms FROM fencing.fences WHERE resource = $1", &[&x]).await.unwrap().get(0);
        assert_eq!(x_grant, None);
        // y: a grant at the lease's term, which covers x at the gateway.
        let (asked, lasts) = take_grant(&gateway, "y", term, Some("k")).await;
        let next = term + 1;
        let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
            if change.contains("$1") { vec![&next] } else { vec![] };
        admin.query_one(change, &params).await.unwrap();
        let answered = Instant::now();
        assert!(answered + SLACK >= asked + lasts, "{change} was answered before the grant on y had ended");
        // The epoch moved on: the decision on y after the change carries the new one, so a
        // gateway's lease grant given now covers no decision of x made before.
        let after = store::gate_granted(&gateway, "y", term, FORWARD, Some("k"), GRANT).await.unwrap();
        assert!(after.is_admitted(), "{after:?}");
        assert!(after.epoch > Some(epoch), "{change}: epoch {:?} after, {epoch} before", after.epoch);
        // x is no longer writable at the lease's term under k (advanced past it, or rebound away).
        let refused = store::gate_granted(&gateway, x, term, FORWARD, Some("k"), GRANT).await.unwrap();
        assert!(!refused.is_admitted(), "{refused:?}");
        assert_eq!(refused.epoch, None);
    }
}

/// A grant carries the lease's fence epoch as it stands when the grant is given, and only a
/// change of a fence bound to the lease at the lease's term moves it on (an advance of an unbound
/// fence and the first binding of one do not: no gateway can hold a decision of a fence that was
/// not bound; nor a change of a fence behind its lease's term: no grant at its term lasts).
/// The fence epoch of lease k.
const EPOCH: &str = "SELECT coalesce((SELECT epoch FROM fencing.lease_epochs WHERE key = 'k'), 0)";

#[tokio::test]
async fn a_grant_carries_the_fence_epoch_it_was_given_at() {
    let db = TestDb::new().await;
    let gateway = db.connect().await;
    let admin = db.connect().await;
    let term = store::acquire(&gateway, "k", "a", Duration::from_secs(60)).await.unwrap().term.unwrap();
    for round in 0..3 {
        take_grant(&gateway, "y", term, Some("k")).await;
        let epoch: i64 = admin.query_one(EPOCH, &[]).await.unwrap().get(0);
        let granted = store::gate_granted(&gateway, "y", term, FORWARD, Some("k"), GRANT).await.unwrap();
        assert!(granted.grant > Duration::ZERO, "{granted:?}");
        assert_eq!(granted.epoch, Some(epoch), "round {round}");
        admin
            .execute("SELECT fencing.advance_fence($1, $2::bigint, 'ops', 'test')", &[&format!("z{round}"), &term])
            .await
            .unwrap();
        // Bound, behind the lease's term (0): a rebind needs no new epoch.
        admin.execute("SELECT fencing.bind($1, 'k')", &[&format!("w{round}")]).await.unwrap();
        admin.execute("SELECT fencing.rebind($1, 'k', 'ops', 'test')", &[&format!("w{round}")]).await.unwrap();
        let unmoved: i64 = admin.query_one(EPOCH, &[]).await.unwrap().get(0);
        assert_eq!(unmoved, epoch, "an unbound advance, a bind and a rebind behind the lease's term keep the epoch");
        // Bound, at the lease's term: a rebind moves it on.
        let at_term = format!("v{round}");
        assert!(store::gate_granted(&gateway, &at_term, term, FORWARD, Some("k"), GRANT).await.unwrap().is_admitted());
        admin.execute("SELECT fencing.rebind($1, 'k', 'ops', 'test')", &[&at_term]).await.unwrap();
        let moved: i64 = admin.query_one(EPOCH, &[]).await.unwrap().get(0);
        assert_eq!(moved, epoch + 1, "a rebind of a bound fence at its lease's term moves the lease's epoch on");
    }
}

/// An admin change of a bound fence at its lease's term waits for a transaction that holds the
/// lease's advisory lock shared (one that granted, not yet committed): it tries for 100 ms, then
/// queues, and goes on once that transaction ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_change_waits_for_a_granting_transaction_to_commit() {
    let db = TestDb::new().await;
    let gateway = db.connect().await;
    let admin = db.connect().await;
    let mut holder = db.connect().await;
    let term = store::acquire(&gateway, "k", "a", Duration::from_secs(60)).await.unwrap().term.unwrap();
    assert!(store::gate_granted(&gateway, "x", term, FORWARD, Some("k"), GRANT).await.unwrap().is_admitted());
    let granting = holder.transaction().await.unwrap();
    granting.execute("SELECT pg_advisory_xact_lock_shared(1818583397, fencing.lease_lock_id('k'))", &[]).await.unwrap();
    let started = Instant::now();
    let change = tokio::spawn(async move {
        admin.execute("SELECT fencing.advance_fence('x', $1::bigint, 'ops', 'test')", &[&(term + 1)]).await
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(!change.is_finished(), "the change went on while a granting transaction held the lease's lock");
    granting.commit().await.unwrap();
    change.await.unwrap().unwrap();
    assert!(started.elapsed() >= Duration::from_millis(400));
    let max: i64 =
        gateway.query_one("SELECT max_term FROM fencing.fences WHERE resource = 'x'", &[]).await.unwrap().get(0);
    assert_eq!(max, term + 1);
}
