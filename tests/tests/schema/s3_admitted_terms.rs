//! S3: per resource, admitted terms never decrease, whatever the concurrency.

use std::time::Duration;

use fencing_schema::{SQLSTATE_REFUSED, store};
use fencing_tests::pg::TestDb;
use fencing_tests::sqlstate;
use futures::future::join_all;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const SESSIONS: usize = 16;
const WRITES_PER_SESSION: usize = 120;
const RESOURCE: &str = "s3-resource";

/// Each session runs transactions of: admit a random term, then take a ticket from a counter
/// row and log (ticket, term). The counter row is locked until commit, so ticket order is
/// commit order, and the log read in ticket order is the sequence of admitted terms as committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_sixteen_sessions_admitting_random_terms_commit_a_never_decreasing_sequence() {
    let db = TestDb::new().await;
    let setup = db.connect().await;
    setup
        .batch_execute(
            "CREATE TABLE s3_counter (id int PRIMARY KEY, next bigint NOT NULL);
             INSERT INTO s3_counter VALUES (1, 0);
             CREATE TABLE s3_log (ticket bigint PRIMARY KEY, term bigint NOT NULL, session int NOT NULL);",
        )
        .await
        .unwrap();
    let seed: u64 = rand::random();
    println!("s3 seed: {seed}");

    let sessions = db.connect_many(SESSIONS).await.into_iter().enumerate().map(|(session, mut client)| {
        tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(seed ^ session as u64);
            let (mut admitted, mut refused) = (0usize, 0usize);
            for write in 0..WRITES_PER_SESSION {
                // Terms rise slowly with jitter, so equal, lower and higher terms all race.
                let term = i64::try_from(write / 8).unwrap() + rng.random_range(1..=4);
                let transaction = client.transaction().await.unwrap();
                match transaction.query_one("SELECT fencing.admit($1, $2)", &[&RESOURCE, &term]).await {
                    Ok(row) => {
                        let max: i64 = row.get(0);
                        assert_eq!(max, term, "an admitted term is the maximum after admit");
                        let ticket: i64 = transaction
                            .query_one("UPDATE s3_counter SET next = next + 1 WHERE id = 1 RETURNING next", &[])
                            .await
                            .unwrap()
                            .get(0);
                        let session_id = i32::try_from(session).unwrap();
                        transaction
                            .execute("INSERT INTO s3_log VALUES ($1, $2, $3)", &[&ticket, &term, &session_id])
                            .await
                            .unwrap();
                        transaction.commit().await.unwrap();
                        admitted += 1;
                    }
                    Err(error) => {
                        assert_eq!(sqlstate(&error), Some(SQLSTATE_REFUSED), "unexpected error: {error}");
                        transaction.rollback().await.unwrap();
                        refused += 1;
                    }
                }
                if rng.random_bool(0.1) {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
            (admitted, refused)
        })
    });
    let results: Vec<(usize, usize)> = join_all(sessions).await.into_iter().map(Result::unwrap).collect();
    let admitted: usize = results.iter().map(|r| r.0).sum();
    let refused: usize = results.iter().map(|r| r.1).sum();

    let log: Vec<(i64, i64)> = setup
        .query("SELECT ticket, term FROM s3_log ORDER BY ticket", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    assert_eq!(log.len(), admitted, "every admitted write committed its log row");
    for pair in log.windows(2) {
        assert!(pair[1].1 >= pair[0].1, "seed {seed}: admitted terms decreased in commit order: {pair:?}");
    }
    let highest = log.iter().map(|(_, term)| *term).max().unwrap();
    let fence = store::get_fence(&setup, RESOURCE).await.unwrap().unwrap();
    assert_eq!(fence.max_term, highest, "the final maximum is the highest term ever admitted");
    assert!(admitted > 100 && refused > 100, "both paths were exercised: {admitted} admitted, {refused} refused");
    println!("s3: {admitted} admitted, {refused} refused, final maximum {highest}");
}

/// The gateway's path (`try_admit` without holding a lock, one statement a call): concurrent
/// callers can never both win with the lower one last, so the maximum ends at the highest
/// admitted term and no refused term is above the maximum it was refused against.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_try_admit_without_lock_never_lowers_or_skips_the_maximum() {
    let db = TestDb::new().await;
    let sessions = db.connect_many(SESSIONS).await.into_iter().enumerate().map(|(session, client)| {
        tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(session as u64);
            let mut outcomes = Vec::new();
            for write in 0..WRITES_PER_SESSION {
                let term = i64::try_from(write / 8).unwrap() + rng.random_range(1..=4);
                let admission = store::try_admit(&client, RESOURCE, term, false).await.unwrap();
                if admission.is_admitted() {
                    assert_eq!(admission.max_term, term);
                } else {
                    assert!(term < admission.max_term, "refused {term} against maximum {}", admission.max_term);
                }
                outcomes.push((term, admission.is_admitted()));
            }
            outcomes
        })
    });
    let outcomes: Vec<(i64, bool)> = join_all(sessions).await.into_iter().flat_map(Result::unwrap).collect();
    let highest_admitted = outcomes.iter().filter(|(_, ok)| *ok).map(|(term, _)| *term).max().unwrap();
    let client = db.connect().await;
    let fence = store::get_fence(&client, RESOURCE).await.unwrap().unwrap();
    assert_eq!(fence.max_term, highest_admitted);
}
