//! Replication model B in this process: a leader's `Appender`, followers that tail the fenced
//! log into projections, a zombie's append that no follower ever sees, a follower restarted
//! after a failed apply, and one behind retention.

use std::sync::Arc;
use std::time::Duration;

use fencing_election::log::{Entry, Follower};
use fencing_election::watch::Wakeups;
use fencing_election::{Elector, Error};
use fencing_schema::log::{self as store_log, Retention};
use fencing_schema::store;
use fencing_tests::pg::TestDb;
use tokio::sync::Mutex;
use tokio_postgres::NoTls;
use tokio_util::sync::CancellationToken;

use crate::in_process::pool;

type Applied = Arc<Mutex<Vec<(i64, String)>>>;

/// A follower task that records what it applies; returns its handle and the record.
fn follow(follower: Follower, stop: &CancellationToken) -> (tokio::task::JoinHandle<Result<(), Error>>, Applied) {
    let applied: Applied = Arc::default();
    let record = Arc::clone(&applied);
    let stop = stop.clone();
    let task = tokio::spawn(async move {
        follower
            .run(
                |entry: Entry| {
                    let record = Arc::clone(&record);
                    async move {
                        record.lock().await.push((entry.seq, entry.payload));
                        Ok::<(), String>(())
                    }
                },
                stop,
            )
            .await
    });
    (task, applied)
}

/// Waits (bounded) until `applied` holds `count` entries.
async fn applied_count(applied: &Applied, count: usize) {
    for _ in 0..300 {
        if applied.lock().await.len() >= count {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the follower applied {} of {count} entries within 15 s", applied.lock().await.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_apply_exactly_the_admitted_entries_in_order_and_never_a_zombies() {
    let db = TestDb::new().await;
    let admin = db.connect().await;
    store_log::create_stream(&admin, "decisions", "log-leader", Retention::default()).await.unwrap();
    let leader = Elector::builder(pool(&db.url()), "log-leader")
        .owner("a")
        .ttl(Duration::from_secs(3))
        .renew_interval(Duration::from_millis(900))
        .safety_margin(Duration::from_millis(300))
        .query_timeout(Duration::from_millis(900))
        .build()
        .unwrap()
        .start();
    let leadership =
        tokio::time::timeout(Duration::from_secs(15), leader.wait_for_leadership()).await.unwrap().unwrap();
    let appender = leader.appender("decisions");
    let stop = CancellationToken::new();
    let wakeups = Wakeups::listen(db.url().parse().unwrap(), NoTls, stop.clone());
    let (first, first_applied) = follow(Follower::new(pool(&db.url()), "decisions", "f1", wakeups.clone()), &stop);
    let (second, second_applied) =
        follow(Follower::new(pool(&db.url()), "decisions", "f2", Wakeups::polling()).batch(2), &stop);

    for n in 1..=5 {
        let seq = appender.append(&[serde_json::json!({"decision": n})]).await.unwrap();
        assert_eq!(seq, n);
    }
    assert_eq!(appender.append(&[serde_json::json!(6), serde_json::json!(7)]).await.unwrap(), 6);

    // The lease is taken from a (an operator's force-release) and b leads with a higher term;
    // a's elector has not noticed yet or has: either way its append is refused, by the store
    // or by its own deadline check, and appends nothing.
    store::force_release(&admin, "log-leader", "test", "a is cut off").await.unwrap();
    let b = store::acquire(&admin, "log-leader", "b", Duration::from_secs(60)).await.unwrap().term.unwrap();
    assert!(b > leadership.term());
    assert_eq!(store_log::append(&admin, "decisions", b, &[r#"{"decision": "b"}"#]).await.unwrap(), 8);
    match appender.append(&[serde_json::json!({"decision": "zombie"})]).await {
        Err(Error::NotLeader { .. }) => {}
        other => panic!("the zombie's append must be refused, got {other:?}"),
    }
    assert_eq!(store_log::append(&admin, "decisions", b, &[r#"{"decision": "b2"}"#]).await.unwrap(), 9);

    applied_count(&first_applied, 9).await;
    applied_count(&second_applied, 9).await;
    let log: Vec<(i64, String)> =
        store_log::read(&admin, "decisions", 0, 100).await.unwrap().into_iter().map(|e| (e.seq, e.payload)).collect();
    assert_eq!(log.len(), 9);
    assert!(
        log.iter().all(|(_, payload)| !payload.contains("zombie")),
        "the zombie's append is not in the log: {log:?}"
    );
    for applied in [&first_applied, &second_applied] {
        assert_eq!(*applied.lock().await, log, "a follower applied exactly the log, in order");
    }
    // Caught up: no lag, within any bound, and the store shows both at the head.
    let followers = store_log::followers(&admin, "decisions").await.unwrap();
    assert_eq!(
        followers.iter().map(|f| (f.follower.as_str(), f.applied)).collect::<Vec<_>>(),
        vec![("f1", 9), ("f2", 9)]
    );
    stop.cancel();
    assert!(first.await.unwrap().is_ok());
    assert!(second.await.unwrap().is_ok());
    leader.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_resumes_after_its_cursor_and_applies_again_only_what_it_did_not_report() {
    let db = TestDb::new().await;
    let admin = db.connect().await;
    store_log::create_stream(&admin, "jobs", "jobs-leader", Retention::default()).await.unwrap();
    let term = store::acquire(&admin, "jobs-leader", "a", Duration::from_secs(60)).await.unwrap().term.unwrap();
    let payloads: Vec<String> = (1..=10).map(|n| n.to_string()).collect();
    let payloads: Vec<&str> = payloads.iter().map(String::as_str).collect();
    store_log::append(&admin, "jobs", term, &payloads).await.unwrap();

    // The first run fails to apply entry 5: it returns, with 1-4 reported.
    let seen: Applied = Arc::default();
    let follower = Follower::new(pool(&db.url()), "jobs", "f", Wakeups::polling()).batch(3);
    let record = Arc::clone(&seen);
    let result = follower
        .run(
            |entry: Entry| {
                let record = Arc::clone(&record);
                async move {
                    record.lock().await.push((entry.seq, entry.payload));
                    if entry.seq == 5 { Err("the projection's disk is full") } else { Ok(()) }
                }
            },
            CancellationToken::new(),
        )
        .await;
    match result {
        Err(Error::Apply { seq: 5, .. }) => {}
        other => panic!("expected the apply error of entry 5, got {other:?}"),
    }
    assert_eq!(store_log::position(&admin, "jobs", "f").await.unwrap(), Some(4));

    // A new run (as after a restart) starts after 4: 5 is applied again, nothing is skipped.
    let stop = CancellationToken::new();
    let again = Follower::new(pool(&db.url()), "jobs", "f", Wakeups::polling());
    let lag = again.lag();
    let (task, second_run) = follow(again, &stop);
    applied_count(&second_run, 6).await;
    let second_run: Vec<i64> = second_run.lock().await.iter().map(|(seq, _)| *seq).collect();
    assert_eq!(second_run, vec![5, 6, 7, 8, 9, 10]);
    let first_run: Vec<i64> = seen.lock().await.iter().map(|(seq, _)| *seq).collect();
    assert_eq!(first_run, vec![1, 2, 3, 4, 5]);
    for _ in 0..100 {
        if lag.borrow().is_some_and(|lag| lag.applied == 10) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let now = lag.borrow().unwrap();
    assert_eq!((now.applied, now.entries), (10, 0));
    assert!(now.within(Duration::from_secs(60)));
    assert!(!now.within(Duration::ZERO), "a bound counts the time since the read: {now:?}");
    stop.cancel();
    assert!(task.await.unwrap().is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_behind_retention_is_told_to_resnapshot_from_the_first_kept_entry() {
    let db = TestDb::new().await;
    let admin = db.connect().await;
    let retention = Retention { keep_count: Some(2), keep_age: None, max_entries: Some(3) };
    store_log::create_stream(&admin, "r", "r-leader", retention).await.unwrap();
    let term = store::acquire(&admin, "r-leader", "a", Duration::from_secs(60)).await.unwrap().term.unwrap();
    store_log::append(&admin, "r", term, &["1", "2", "3", "4", "5", "6"]).await.unwrap();
    assert_eq!(store_log::retain(&admin, "r").await.unwrap(), 4);
    let follower = Follower::new(pool(&db.url()), "r", "late", Wakeups::polling());
    let result = follower.run(|_: Entry| async { Ok::<(), String>(()) }, CancellationToken::new()).await;
    match &result {
        Err(error @ Error::Compacted { applied: 0, first_seq: 5, stream }) if stream == "r" => {
            let message = error.to_string();
            assert!(message.contains("resnapshot from sequence 5"), "{message}");
        }
        other => panic!("expected compacted, got {other:?}"),
    }
    // After a snapshot of the state up to 4, it reports 4 and follows on.
    store_log::report_position(&admin, "r", "late", 4).await.unwrap();
    let stop = CancellationToken::new();
    let (task, applied) = follow(Follower::new(pool(&db.url()), "r", "late", Wakeups::polling()), &stop);
    applied_count(&applied, 2).await;
    assert_eq!(applied.lock().await.iter().map(|(seq, _)| *seq).collect::<Vec<_>>(), vec![5, 6]);
    stop.cancel();
    assert!(task.await.unwrap().is_ok());
}
