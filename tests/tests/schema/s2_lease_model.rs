//! S2: the terms of a key strictly increase across leadership periods, checked step by step
//! against a small in-memory model over random operations by four owners.
//!
//! The seed is printed; replay a run with `FENCING_TEST_SEED=<seed>`.

use std::time::Duration;

use fencing_schema::store::{self, LeaseReply};
use fencing_tests::fencing_state;
use fencing_tests::pg::TestDb;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const OPERATIONS: usize = 2_000;
const OWNERS: [&str; 4] = ["owner-a", "owner-b", "owner-c", "owner-d"];
/// Far longer than the test runs, so only the explicit expiry step ends a lease by time.
const LONG_TTL: Duration = Duration::from_secs(600);
/// The ttl the expiry step renews with before waiting for the store's clock to pass it.
const EXPIRING_TTL: Duration = Duration::from_millis(15);
const KEY: &str = "s2-model";

/// What the store should hold, by the rules of CONTRACT.md.
#[derive(Debug, Default)]
struct Model {
    /// The last holder; it holds the lease while `valid`.
    holder: Option<&'static str>,
    /// The last period's term; 0 before the first acquire.
    term: i64,
    valid: bool,
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Acquire(&'static str),
    Renew(&'static str),
    Release(&'static str),
    Expire,
}

fn random_op(rng: &mut StdRng) -> Op {
    let owner = OWNERS[rng.random_range(0..OWNERS.len())];
    match rng.random_range(0..100) {
        0..35 => Op::Acquire(owner),
        35..65 => Op::Renew(owner),
        65..88 => Op::Release(owner),
        _ => Op::Expire,
    }
}

fn seed() -> u64 {
    match std::env::var("FENCING_TEST_SEED") {
        Ok(text) => text.parse().expect("FENCING_TEST_SEED is a u64"),
        Err(_) => rand::random(),
    }
}

/// Checks a reply that refused the caller: it describes the model's current holder, if any.
fn check_refusal(model: &Model, reply: &LeaseReply, context: &str) {
    assert!(!reply.ok, "{context}: expected a refusal, got {reply:?}");
    if model.valid {
        assert_eq!(reply.holder.as_deref(), model.holder, "{context}: names the holder");
        assert_eq!(reply.term, Some(model.term), "{context}: names the holder's term");
        assert!(reply.remaining > Duration::ZERO, "{context}: the holder's lease has time left");
    } else {
        assert_eq!(reply.holder, None, "{context}: nobody holds the lease");
        assert_eq!(reply.term, (model.term > 0).then_some(model.term), "{context}: names the last term");
        assert_eq!(reply.remaining, Duration::ZERO, "{context}");
    }
}

#[tokio::test]
async fn s2_terms_strictly_increase_across_periods_in_2000_random_operations() {
    let seed = seed();
    println!("s2 seed: {seed} (replay with FENCING_TEST_SEED={seed})");
    let mut rng = StdRng::seed_from_u64(seed);
    let db = TestDb::new().await;
    let client = db.connect().await;
    let mut model = Model::default();
    let mut period_terms: Vec<i64> = Vec::new();
    let mut counts = [0usize; 4];

    for step in 0..OPERATIONS {
        let op = random_op(&mut rng);
        let context = format!("seed {seed}, step {step}, {op:?}, model {model:?}");
        let before = fencing_state(&client).await;
        match op {
            Op::Acquire(owner) => {
                let reply = store::acquire(&client, KEY, owner, LONG_TTL).await.unwrap();
                if model.valid && model.holder != Some(owner) {
                    check_refusal(&model, &reply, &context);
                    assert_eq!(fencing_state(&client).await, before, "{context}: a refused acquire changes nothing");
                } else {
                    let new_period = !(model.valid && model.holder == Some(owner));
                    let expected_term = if new_period { model.term + 1 } else { model.term };
                    assert!(reply.ok, "{context}: expected success, got {reply:?}");
                    assert_eq!(reply.holder.as_deref(), Some(owner), "{context}");
                    assert_eq!(reply.term, Some(expected_term), "{context}");
                    assert!(reply.remaining <= LONG_TTL && reply.remaining > LONG_TTL / 2, "{context}: {reply:?}");
                    if new_period {
                        period_terms.push(expected_term);
                    }
                    model = Model { holder: Some(owner), term: expected_term, valid: true };
                    counts[0] += 1;
                }
            }
            Op::Renew(owner) => {
                let reply = store::renew(&client, KEY, owner, LONG_TTL).await.unwrap();
                if model.valid && model.holder == Some(owner) {
                    assert!(reply.ok, "{context}: the holder renews, got {reply:?}");
                    assert_eq!(reply.term, Some(model.term), "{context}: a renewal keeps the term");
                    counts[1] += 1;
                } else {
                    check_refusal(&model, &reply, &context);
                    assert_eq!(fencing_state(&client).await, before, "{context}: a refused renew changes nothing");
                }
            }
            Op::Release(owner) => {
                let released = store::release(&client, KEY, owner).await.unwrap();
                if model.valid && model.holder == Some(owner) {
                    assert!(released, "{context}: the holder releases");
                    let row = store::get_lease(&client, KEY).await.unwrap().unwrap();
                    assert_eq!(row.term, model.term, "{context}: release keeps the row and its term");
                    assert_eq!(row.remaining, Duration::ZERO, "{context}: released means expired");
                    model.valid = false;
                    counts[2] += 1;
                } else {
                    assert!(!released, "{context}: a non-holder cannot release");
                    assert_eq!(fencing_state(&client).await, before, "{context}: a refused release changes nothing");
                }
            }
            Op::Expire => {
                if let (true, Some(holder)) = (model.valid, model.holder) {
                    let reply = store::renew(&client, KEY, holder, EXPIRING_TTL).await.unwrap();
                    assert!(reply.ok, "{context}: the holder renews with a short ttl");
                    fencing_tests::wait_for_store_clock(&client, reply.expires_at.unwrap()).await;
                    model.valid = false;
                    counts[3] += 1;
                }
            }
        }

        // After every step the row itself agrees with the model.
        match store::get_lease(&client, KEY).await.unwrap() {
            None => assert_eq!(model.term, 0, "{context}: the row exists once acquired"),
            Some(row) => {
                assert_eq!(Some(row.owner.as_str()), model.holder, "{context}: row {row:?}");
                assert_eq!(row.term, model.term, "{context}: row {row:?}");
                assert_eq!(row.remaining > Duration::ZERO, model.valid, "{context}: row {row:?}");
            }
        }
    }

    assert!(
        period_terms.windows(2).all(|pair| pair[1] == pair[0] + 1) && period_terms.first() == Some(&1),
        "seed {seed}: terms of successive periods are 1, 2, 3, ...: {period_terms:?}"
    );
    // The run exercised every path: successful acquires, renewals, releases and expiries.
    assert!(counts.iter().all(|count| *count > 10), "seed {seed}: too few successes of some operation: {counts:?}");
    println!("s2: {} periods; successes (acquire, renew, release, expire): {counts:?}", period_terms.len());
}

/// `fencing.lease_history`: one row per period, written with the grant, closed with the reason
/// the period ended.
#[tokio::test]
async fn lease_history_records_every_period_and_how_it_ended() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    let ttl = Duration::from_secs(60);
    assert_eq!(store::acquire(&client, "h", "a", ttl).await.unwrap().term, Some(1));
    assert!(store::release(&client, "h", "a").await.unwrap());
    assert_eq!(store::acquire(&client, "h", "b", Duration::from_millis(100)).await.unwrap().term, Some(2));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(store::acquire(&client, "h", "c", ttl).await.unwrap().term, Some(3));
    // The holder asks for a new period while it still holds: its old one is abandoned.
    assert_eq!(store::acquire(&client, "h", "c", ttl).await.unwrap().term, Some(3), "without new_period: kept");
    assert_eq!(store::acquire_new_period(&client, "h", "c", ttl).await.unwrap().term, Some(4));
    store::force_release(&client, "h", "ops", "test").await.unwrap();
    assert_eq!(store::acquire(&client, "h", "d", ttl).await.unwrap().term, Some(5));

    let mut history = store::list_history(&client, "h", 10).await.unwrap();
    history.reverse();
    let rows: Vec<(i64, &str, Option<&str>)> =
        history.iter().map(|p| (p.term, p.owner.as_str(), p.end_reason.as_deref())).collect();
    assert_eq!(
        rows,
        vec![
            (1, "a", Some("released")),
            (2, "b", Some("expired")),
            (3, "c", Some("abandoned")),
            (4, "c", Some("force_released")),
            (5, "d", None),
        ]
    );
    for pair in history.windows(2) {
        let ended = pair[0].ended_at.expect("ended");
        assert!(ended <= pair[1].granted_at, "periods overlap: {pair:?}");
    }
}
