//! S1: at any instant of the store's clock at most one owner holds an unexpired lease for a key.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use fencing_schema::store;
use fencing_tests::pg::TestDb;
use futures::future::join_all;
use rand::seq::SliceRandom;
use tokio_postgres::Client;

const RACERS: usize = 16;
const ROUNDS: usize = 200;
/// Every EXPIRY_EVERY-th round ends by expiry instead of release.
const EXPIRY_EVERY: usize = 8;
/// Long enough that all racers of a round ask before it runs out, even on a loaded machine.
const SHORT_TTL: Duration = Duration::from_millis(750);
const LONG_TTL: Duration = Duration::from_secs(60);

/// One leadership period as the store reported it.
#[derive(Debug)]
struct Period {
    term: i64,
    owner: String,
    start: SystemTime,
    end: SystemTime,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s1_sixteen_racers_for_200_rounds_never_see_two_unexpired_holders() {
    let db = TestDb::new().await;
    let clients: Vec<Arc<Client>> = db.connect_many(RACERS).await.into_iter().map(Arc::new).collect();
    let observer = db.connect().await;
    let key = "s1-race";
    let mut history: Vec<Period> = Vec::with_capacity(ROUNDS);

    for round in 0..ROUNDS {
        let by_expiry = round % EXPIRY_EVERY == EXPIRY_EVERY - 1;
        let ttl = if by_expiry { SHORT_TTL } else { LONG_TTL };
        // Spawned in a new random order each round, so no racer is favoured by being first.
        let mut order: Vec<usize> = (0..RACERS).collect();
        order.shuffle(&mut rand::rng());
        let tasks = order.into_iter().map(|i| {
            let client = Arc::clone(&clients[i]);
            tokio::spawn(async move {
                let owner = format!("racer-{i}");
                let reply = store::acquire(client.as_ref(), key, &owner, ttl).await.unwrap();
                (owner, reply)
            })
        });
        let replies: Vec<_> = join_all(tasks).await.into_iter().map(Result::unwrap).collect();

        let winners: Vec<_> = replies.iter().filter(|(_, reply)| reply.ok).collect();
        assert_eq!(winners.len(), 1, "round {round}: exactly one racer acquires, got {replies:#?}");
        let (winner, won) = winners[0];
        let term = won.term.unwrap();
        let expires_at = won.expires_at.unwrap();
        assert_eq!(won.holder.as_deref(), Some(winner.as_str()));
        for (owner, reply) in replies.iter().filter(|(_, reply)| !reply.ok) {
            assert_eq!(reply.holder.as_deref(), Some(winner.as_str()), "round {round}: {owner} sees the winner");
            assert_eq!(reply.term, Some(term), "round {round}: {owner} sees the winner's term");
            assert_eq!(reply.expires_at, Some(expires_at));
        }
        let start = expires_at.checked_sub(ttl).unwrap();

        let end = if by_expiry {
            fencing_tests::wait_for_store_clock(&observer, expires_at).await;
            expires_at
        } else {
            let loser = if winner.as_str() == "racer-0" { "racer-1" } else { "racer-0" };
            assert!(!store::release(&observer, key, loser).await.unwrap(), "a non-holder cannot release");
            assert!(store::release(&observer, key, winner).await.unwrap(), "the holder releases");
            store::get_lease(&observer, key).await.unwrap().unwrap().expires_at
        };
        history.push(Period { term, owner: winner.clone(), start, end });
    }

    for (index, period) in history.iter().enumerate() {
        assert_eq!(period.term, i64::try_from(index).unwrap() + 1, "terms grow by exactly one per period");
        assert!(period.start < period.end, "period {period:?} is not empty");
    }
    for pair in history.windows(2) {
        assert!(
            pair[1].start >= pair[0].end,
            "two unexpired holders at once: {:?} began before {:?} ended",
            pair[1],
            pair[0]
        );
    }
    let distinct_winners: std::collections::HashSet<_> = history.iter().map(|p| p.owner.as_str()).collect();
    assert!(distinct_winners.len() > 1, "the race had more than one winner over {ROUNDS} rounds");
}
