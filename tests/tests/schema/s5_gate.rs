//! S5 inside the store: `fencing.gate` makes the first writes of a new term wait until every
//! lower-term gateway write may have been forwarded, and costs no write in the common case.

use std::time::Duration;

use fencing_schema::store::{self, Outcome};
use fencing_tests::fencing_state;
use fencing_tests::pg::TestDb;
use tokio_postgres::Client;

const FORWARD: Duration = Duration::from_secs(4);

/// The fence row's version: it changes exactly when the row is written.
async fn row_version(client: &Client, resource: &str) -> String {
    client.query_one("SELECT xmin::text FROM fencing.fences WHERE resource = $1", &[&resource]).await.unwrap().get(0)
}

#[tokio::test]
async fn s5_a_new_term_waits_for_the_old_terms_horizon_and_same_term_writes_need_no_store_write() {
    let db = TestDb::new().await;
    let client = db.connect().await;

    let first = store::gate(&client, "r", 1, FORWARD, None).await.unwrap();
    assert_eq!((first.outcome, first.term, first.wait), (Outcome::Admitted, Some(1), Duration::ZERO));
    // The horizon now covers more than this write's deadline: the next writes do not write.
    let version = row_version(&client, "r").await;
    for _ in 0..5 {
        let again = store::gate(&client, "r", 1, FORWARD, None).await.unwrap();
        assert_eq!((again.outcome, again.wait), (Outcome::Admitted, Duration::ZERO));
    }
    assert_eq!(row_version(&client, "r").await, version, "same-term admissions wrote nothing");

    // A refusal writes nothing either.
    let before = fencing_state(&client).await;
    let raised = store::gate(&client, "r", 2, FORWARD, None).await.unwrap();
    assert!(raised.is_admitted());
    // Term 1 writes admitted just before may be forwarded until about now + FORWARD: term 2 waits.
    assert!(raised.wait > FORWARD / 2 && raised.wait <= FORWARD * 5 / 4, "waits {:?}", raised.wait);
    let after_raise = fencing_state(&client).await;
    assert_ne!(after_raise, before);
    let stale = store::gate(&client, "r", 1, FORWARD, None).await.unwrap();
    assert_eq!((stale.outcome, stale.current_term()), (Outcome::Stale, Some(2)));
    assert_eq!(fencing_state(&client).await, after_raise, "a refusal changes nothing");

    // Every term-2 write admitted during the settle period waits for it too, through any replica.
    let other_replica = db.connect().await;
    let follower = store::gate(&other_replica, "r", 2, FORWARD, None).await.unwrap();
    assert!(follower.wait > Duration::ZERO && follower.wait <= raised.wait, "{follower:?} vs {raised:?}");
}

#[tokio::test]
async fn s5_a_term_change_through_the_sql_guard_also_makes_gateway_writes_settle() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    store::gate(&client, "shared", 3, FORWARD, None).await.unwrap();
    // A SQL writer raises the term inside Postgres; gateway writes of term 3 may still be in flight.
    assert_eq!(store::admit(&client, "shared", 4).await.unwrap(), 4);
    let next = store::gate(&client, "shared", 4, FORWARD, None).await.unwrap();
    assert!(next.is_admitted() && next.wait > Duration::ZERO, "{next:?}");
}

#[tokio::test]
async fn gate_lease_stamps_the_holders_term_and_refuses_anyone_else() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    let lease = store::acquire(&client, "writer", "a", Duration::from_secs(60)).await.unwrap();
    let term = lease.term.unwrap();

    let stamped = store::gate_lease(&client, "ledger", "writer", "a", FORWARD, Some("writer")).await.unwrap();
    assert_eq!((stamped.outcome, stamped.term), (Outcome::Admitted, Some(term)));
    let fence = store::get_fence(&client, "ledger").await.unwrap().unwrap();
    assert_eq!((fence.max_term, fence.lease_key.as_deref()), (term, Some("writer")), "bound on first write");

    let before = fencing_state(&client).await;
    let intruder = store::gate_lease(&client, "ledger", "writer", "b", FORWARD, Some("writer")).await.unwrap();
    assert_eq!((intruder.outcome, intruder.term, intruder.current_term()), (Outcome::NotLeader, None, Some(term)));
    let unknown = store::gate_lease(&client, "ledger", "nobody-holds-this", "a", FORWARD, None).await.unwrap();
    assert_eq!(unknown.outcome, Outcome::NotLeader);
    assert_eq!(fencing_state(&client).await, before, "refusals change nothing");

    // Verify mode on the bound resource: a forged future term is refused.
    let forged = store::gate(&client, "ledger", term + 5, FORWARD, Some("writer")).await.unwrap();
    assert_eq!(forged.outcome, Outcome::FutureTerm);
    assert_eq!(fencing_state(&client).await, before);
}

/// S4: stamp mode on a route bound to one lease, naming another lease whose term happens to be
/// the same number, is refused: a holder of `scratch` is not the leader of `writer`.
#[tokio::test]
async fn gate_lease_under_another_lease_than_the_bound_one_is_refused_even_with_an_equal_term() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    let writer = store::acquire(&client, "writer", "leader", Duration::from_secs(60)).await.unwrap();
    let scratch = store::acquire(&client, "scratch", "zombie", Duration::from_secs(60)).await.unwrap();
    assert_eq!(writer.term, scratch.term, "both leases are at their first term");
    let admitted = store::gate_lease(&client, "ledger", "writer", "leader", FORWARD, Some("writer")).await.unwrap();
    assert_eq!(admitted.outcome, Outcome::Admitted);

    let before = fencing_state(&client).await;
    let other = store::gate_lease(&client, "ledger", "scratch", "zombie", FORWARD, Some("writer")).await.unwrap();
    assert_eq!(other.outcome, Outcome::WrongLease, "{other:?}");
    // The same through gate_many, as the gateway calls it.
    let rows = client
        .query(
            store::GATE_MANY_SQL,
            &[
                &vec!["ledger"],
                &vec![None::<i64>],
                &vec![Some("scratch")],
                &vec![Some("zombie")],
                &vec![Some("writer")],
                &4000_i64,
                &0_i64,
            ],
        )
        .await
        .unwrap();
    assert_eq!(rows[0].get::<_, String>("outcome"), "wrong_lease");
    assert_eq!(fencing_state(&client).await, before, "refusals change nothing");
}

#[tokio::test]
async fn gate_many_decides_each_item_in_input_order_in_one_statement() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    store::acquire(&client, "writer", "a", Duration::from_secs(60)).await.unwrap();
    store::gate(&client, "r1", 5, FORWARD, None).await.unwrap();

    let resources = vec!["r1", "r1", "r2", "r2", "r1"];
    let terms: Vec<Option<i64>> = vec![Some(5), Some(4), None, None, Some(6)];
    let lease_keys: Vec<Option<&str>> = vec![None, None, Some("writer"), Some("writer"), None];
    let owners: Vec<Option<&str>> = vec![None, None, Some("a"), Some("b"), None];
    let bind_leases: Vec<Option<&str>> = vec![None; 5];
    let forward_ms: i64 = 4000;
    let rows = client
        .query(store::GATE_MANY_SQL, &[&resources, &terms, &lease_keys, &owners, &bind_leases, &forward_ms, &0_i64])
        .await
        .unwrap();
    let outcomes: Vec<(Outcome, Option<i64>)> =
        rows.iter().map(|row| store::Gate::from_row(row).unwrap()).map(|gate| (gate.outcome, gate.term)).collect();
    assert_eq!(
        outcomes,
        vec![
            (Outcome::Admitted, Some(5)),
            (Outcome::Stale, Some(4)),
            (Outcome::Admitted, Some(1)),
            (Outcome::NotLeader, None),
            (Outcome::Admitted, Some(6)),
        ]
    );
    // Arrays of different lengths are bad input, and nothing is decided.
    let before = fencing_state(&client).await;
    let error = client
        .query(
            store::GATE_MANY_SQL,
            &[
                &vec!["r1"],
                &vec![Some(9_i64), Some(9)],
                &vec![None::<&str>],
                &vec![None::<&str>],
                &vec![None::<&str>],
                &forward_ms,
                &0_i64,
            ],
        )
        .await
        .unwrap_err();
    assert_eq!(fencing_tests::sqlstate(&error), Some(fencing_schema::SQLSTATE_INVALID_ARGUMENT));
    assert_eq!(fencing_state(&client).await, before);
}

#[tokio::test]
async fn a_refused_write_to_a_new_resource_on_a_bound_route_creates_no_fence_row() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    store::acquire(&client, "writer", "a", Duration::from_secs(60)).await.unwrap();
    let before = fencing_state(&client).await;
    for (resource, term) in [("new-1", 5), ("new-2", 7)] {
        let refused = store::gate(&client, resource, term, FORWARD, Some("writer")).await.unwrap();
        assert_eq!(refused.outcome, Outcome::FutureTerm);
        let stamped =
            store::gate_lease(&client, resource, "writer", "intruder", FORWARD, Some("writer")).await.unwrap();
        assert_eq!(stamped.outcome, Outcome::NotLeader);
    }
    assert_eq!(fencing_state(&client).await, before, "refusals created no fence rows");
    let admitted = store::gate(&client, "new-1", 1, FORWARD, Some("writer")).await.unwrap();
    assert!(admitted.is_admitted());
    let fence = store::get_fence(&client, "new-1").await.unwrap().unwrap();
    assert_eq!((fence.max_term, fence.lease_key.as_deref()), (1, Some("writer")));
}

/// A settle marked over (`fencing.mark_settled`) ends the wait of the decisions that come after
/// the mark, not of those before it: a term-2 write decided just before the mark still waits the
/// settle and is then forwarded for up to its forward timeout. So a term 3 that comes right after
/// the mark must settle behind both (drain_ms), until a gateway has seen that length pass since
/// the mark (`fencing.mark_drained`); only then does it settle behind the forward timeout alone.
/// Before drain_ms, term 3 settled behind FORWARD only, and a term-2 write that waited overtook
/// none of term 1 but arrived after term 3's first write (seen as "term 5 after 6" with three
/// gateways in `tests/tests/gateway/replicas.rs`).
#[tokio::test]
async fn s5_writes_that_waited_before_a_settle_was_marked_over_still_hold_back_the_next_term() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap();
    store::gate(&client, "r", 1, FORWARD, None).await.unwrap();
    let raised = store::gate(&client, "r", 2, FORWARD, None).await.unwrap();
    assert_eq!(raised.wait, FORWARD, "term 2 settles behind term 1's forward timeout");
    let settle = raised.settle_id.expect("a settle has a name");
    // A term-2 write decided before the mark: it waits the settle, then has FORWARD to be sent.
    let before_mark = store::gate(&client, "r", 2, FORWARD, None).await.unwrap();
    assert_eq!((before_mark.wait, before_mark.settle_id), (FORWARD, Some(settle)));

    // The mark answers how long those writes may still be on their way, counted from now.
    let mark = "SELECT fencing.mark_settled('r', 2, NULL, $1, $2)";
    let wrong: Option<i64> = client.query_one(mark, &[&ms(FORWARD), &(settle + 1)]).await.unwrap().get(0);
    assert_eq!(wrong, None, "a mark of another settle changes nothing");
    let drain: Option<i64> = client.query_one(mark, &[&ms(FORWARD), &settle]).await.unwrap().get(0);
    assert_eq!(drain, Some(ms(FORWARD) * 2));
    // Marked again (another gateway), the same answer; a mark of another length or term, none.
    let again: Option<i64> = client.query_one(mark, &[&ms(FORWARD), &settle]).await.unwrap().get(0);
    assert_eq!(again, Some(ms(FORWARD) * 2));
    let wrong: Option<i64> = client.query_one(mark, &[&1_i64, &settle]).await.unwrap().get(0);
    assert_eq!(wrong, None);
    let after_mark = store::gate(&client, "r", 2, FORWARD, None).await.unwrap();
    assert_eq!(after_mark.wait, Duration::ZERO, "decisions after the mark wait no more");

    // Term 3, raised right after the mark: behind term 2's forward timeout and its drain.
    let third = store::gate(&client, "r", 3, FORWARD, None).await.unwrap();
    assert_eq!(third.wait, FORWARD * 2, "term 3 must settle behind the writes that waited before the mark");
    let third_settle = third.settle_id.expect("a settle has a name");
    assert_ne!(third_settle, settle);

    // Once drained (a gateway saw that length pass since the mark), the next term settles behind
    // the forward timeout alone: a settle never grows from term to term.
    let mark3 = "SELECT fencing.mark_settled('r', 3, NULL, $1, $2)";
    let settled: Option<i64> = client.query_one(mark3, &[&ms(FORWARD * 2), &third_settle]).await.unwrap().get(0);
    assert_eq!(settled, Some(ms(FORWARD) * 3));
    let drain = "SELECT fencing.mark_drained('r', 3, NULL, $1, $2)";
    let other: bool = client.query_one(drain, &[&1_i64, &third_settle]).await.unwrap().get(0);
    assert!(!other, "a drain of another length changes nothing");
    let other: bool = client.query_one(drain, &[&ms(FORWARD * 2), &settle]).await.unwrap().get(0);
    assert!(!other, "a drain of another settle changes nothing");
    let drained: bool = client.query_one(drain, &[&ms(FORWARD * 2), &third_settle]).await.unwrap().get(0);
    assert!(drained);
    assert_eq!(store::gate(&client, "r", 4, FORWARD, None).await.unwrap().wait, FORWARD, "behind FORWARD alone");
}

/// A settle is named (`settle_id`, schema version 10), not only by its fence's term, binding and
/// length: a rebinding away and back at one term starts a settle equal to an older one in all
/// three. A gateway whose decision in the older settle was answered late marks it late; before
/// the name, that mark ended the newer settle at once, and a write of the newer binding could be
/// sent while a write of the previous binding, decided just before the rebinding, was still on
/// its way to the upstream (S5). Found by an adversarial review; this is that SQL session.
#[tokio::test]
async fn s5_a_late_mark_of_an_older_settle_never_ends_a_newer_one_of_the_same_term_binding_and_length() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap();
    let rebind = |to: &'static str| format!("SELECT (fencing.rebind('r', '{to}', 'ops', 'test')).settle_ms");
    let settle_of = "SELECT settle_ms, drain_ms, settle_id FROM fencing.fences WHERE resource = 'r'";
    store::acquire(&client, "a", "x", Duration::from_secs(60)).await.unwrap();
    store::acquire(&client, "b", "y", Duration::from_secs(60)).await.unwrap();
    // r is created bound to a at term 1 (a's term), then rebound to b: b's writes settle behind
    // a's forward timeout.
    assert!(store::gate(&client, "r", 1, FORWARD, Some("a")).await.unwrap().is_admitted());
    let first: Option<i64> = client.query_one(&rebind("b"), &[]).await.unwrap().get(0);
    assert_eq!(first, Some(ms(FORWARD)));
    // The late gateway's decision in that settle: it will mark (r, 1, b, FORWARD, older) late.
    let late = store::gate(&client, "r", 1, FORWARD, Some("b")).await.unwrap();
    assert!(late.is_admitted());
    assert_eq!(late.wait, FORWARD);
    let older = late.settle_id.expect("a settle has a name");
    // Another gateway marks it over and drained in time.
    let marked: Option<i64> = client
        .query_one("SELECT fencing.mark_settled('r', 1, 'b', $1, $2)", &[&ms(FORWARD), &older])
        .await
        .unwrap()
        .get(0);
    assert!(marked.is_some());
    let drained: bool = client
        .query_one("SELECT fencing.mark_drained('r', 1, 'b', $1, $2)", &[&ms(FORWARD), &older])
        .await
        .unwrap()
        .get(0);
    assert!(drained);
    // Away to a and straight back to b at the same term: b's writes again settle for FORWARD,
    // behind b's own writes decided before the first of these rebindings (a's settle, carried).
    // Same term, binding and length as the older settle.
    assert_eq!(client.query_one(&rebind("a"), &[]).await.unwrap().get::<_, Option<i64>>(0), Some(ms(FORWARD)));
    assert_eq!(client.query_one(&rebind("b"), &[]).await.unwrap().get::<_, Option<i64>>(0), Some(ms(FORWARD)));
    let row = client.query_one(settle_of, &[]).await.unwrap();
    let newer: i64 = row.get(2);
    assert_ne!(newer, older, "every rebinding starts a settle of its own");

    // The late mark of the older settle arrives now: it must end nothing.
    let stale: Option<i64> = client
        .query_one("SELECT fencing.mark_settled('r', 1, 'b', $1, $2)", &[&ms(FORWARD), &older])
        .await
        .unwrap()
        .get(0);
    assert_eq!(stale, None, "a mark of an older settle is no mark of this one");
    let stale_drain: bool = client
        .query_one("SELECT fencing.mark_drained('r', 1, 'b', $1, $2)", &[&ms(FORWARD), &older])
        .await
        .unwrap()
        .get(0);
    assert!(!stale_drain);
    let row = client.query_one(settle_of, &[]).await.unwrap();
    assert_eq!(
        (row.get::<_, Option<i64>>(0), row.get::<_, Option<i64>>(1)),
        (Some(ms(FORWARD)), None),
        "the newer settle goes on"
    );
    let decided = store::gate(&client, "r", 1, FORWARD, Some("b")).await.unwrap();
    assert_eq!((decided.wait, decided.settle_id), (FORWARD, Some(newer)), "b's next write still waits out a's");
    // Its own mark ends it.
    let own: Option<i64> = client
        .query_one("SELECT fencing.mark_settled('r', 1, 'b', $1, $2)", &[&ms(FORWARD), &newer])
        .await
        .unwrap()
        .get(0);
    assert!(own.is_some());
    assert_eq!(store::gate(&client, "r", 1, FORWARD, Some("b")).await.unwrap().wait, Duration::ZERO);
}
