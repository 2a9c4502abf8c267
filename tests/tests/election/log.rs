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

/// An elector of `key` as owner "a", with timings a loaded CI machine keeps.
fn elector(db: &TestDb, key: &str) -> fencing_election::ElectorHandle {
    Elector::builder(pool(&db.url()), key)
        .owner("a")
        .ttl(Duration::from_secs(3))
        .renew_interval(Duration::from_millis(900))
        .safety_margin(Duration::from_millis(300))
        .query_timeout(Duration::from_millis(900))
        .build()
        .unwrap()
        .start()
}

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
    let leader = elector(&db, "log-leader");
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
    // Caught up: the store shows both at the head (each reports after its apply).
    let mut positions = Vec::new();
    for _ in 0..100 {
        let followers = store_log::followers(&admin, "decisions").await.unwrap();
        positions = followers.iter().map(|f| (f.follower.clone(), f.applied)).collect::<Vec<_>>();
        if positions.len() == 2 && positions.iter().all(|(_, applied)| *applied == 9) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(positions, vec![("f1".to_owned(), 9), ("f2".to_owned(), 9)]);
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

/// A follower that read a batch and was held while applying it (a pause, a slow apply) while
/// retention under its limit passed it, is told to resnapshot when it reports, not stopped with
/// an invalid argument (the fresh-clone run of the real-process test below met this race).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_whose_batch_retention_passed_while_it_applied_is_told_to_resnapshot_at_its_report() {
    let db = TestDb::new().await;
    let admin = db.connect().await;
    let retention = Retention { keep_count: Some(2), keep_age: None, max_entries: Some(3) };
    store_log::create_stream(&admin, "r", "r-leader", retention).await.unwrap();
    let term = store::acquire(&admin, "r-leader", "a", Duration::from_secs(60)).await.unwrap().term.unwrap();
    store_log::append(&admin, "r", term, &["1", "2"]).await.unwrap();
    let follower = Follower::new(pool(&db.url()), "r", "held", Wakeups::polling());
    let (held, release) = (Arc::new(tokio::sync::Notify::new()), Arc::new(tokio::sync::Notify::new()));
    let (held_, release_) = (Arc::clone(&held), Arc::clone(&release));
    let run = tokio::spawn(async move {
        let apply = move |entry: Entry| {
            let (held, release) = (Arc::clone(&held_), Arc::clone(&release_));
            async move {
                if entry.seq == 2 {
                    held.notify_one();
                    release.notified().await;
                }
                Ok::<(), String>(())
            }
        };
        follower.run(apply, CancellationToken::new()).await
    });
    tokio::time::timeout(Duration::from_secs(10), held.notified()).await.unwrap();
    store_log::append(&admin, "r", term, &["3", "4", "5", "6"]).await.unwrap();
    assert_eq!(store_log::retain(&admin, "r").await.unwrap(), 4, "the limit passes the unregistered follower");
    release.notify_one();
    let result = tokio::time::timeout(Duration::from_secs(10), run).await.unwrap().unwrap();
    match &result {
        Err(Error::Compacted { applied: 2, first_seq: 5, stream }) if stream == "r" => {}
        other => panic!("expected compacted at the report of 2, got {other:?}"),
    }
    assert_eq!(store_log::position(&admin, "r", "held").await.unwrap(), None, "the refused report registered nothing");
}

/// The zombie story with real processes: leader a appends every tick; follower f1 projects the
/// stream into a file; a is paused (SIGSTOP) and b takes over and appends; f1 is killed
/// (SIGKILL) meanwhile; a resumes; f1 is started again on the same projection. The log holds
/// exactly the admitted entries: numbered without a gap, terms that never go down, and no entry
/// of a's term after b's first. Every append a saw admitted is in the log under a's term. The
/// projection is exactly the log, without a gap or a duplicate, across the kill (the restarted
/// follower resumes after its reported cursor and skips what its projection already has).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_leaders_appends_stop_and_a_killed_follower_resumes_to_exactly_the_admitted_log() {
    use fencing_tests::process::{ElectorProcess, Timing, event, int};
    use nix::sys::signal::Signal;

    let db = TestDb::new().await;
    let admin = db.connect().await;
    store_log::create_stream(&admin, "jobs-log", "jobs", Retention::default()).await.unwrap();
    let dir = std::env::temp_dir().join(format!("fencing-log-{}-{}", std::process::id(), db.name));
    std::fs::create_dir_all(&dir).unwrap();
    let projection = dir.join("f1.jsonl");
    let projection_arg = projection.display().to_string();
    let follower_args = ["--follow-stream", "jobs-log", "--follower", "f1", "--projection", projection_arg.as_str()];
    let url = db.url();
    let timing = Timing::FAST;

    let mut a = ElectorProcess::spawn_with(&url, "jobs", "a", timing, &["--append-stream", "jobs-log"]).unwrap();
    let term_a = int(&a.wait_for("elected", |l| event(l) == "elected").await.unwrap(), "term");
    a.wait_for("five appends", |l| event(l) == "appended" && int(l, "seq") >= 5).await.unwrap();
    let mut f = ElectorProcess::spawn_with(&url, "f1-own", "f1", timing, &follower_args).unwrap();
    f.wait_for("five applied", |l| event(l) == "applied" && int(l, "seq") >= 5).await.unwrap();
    let mut b = ElectorProcess::spawn_with(&url, "jobs", "b", timing, &["--append-stream", "jobs-log"]).unwrap();
    b.wait_for("started", |l| event(l) == "started").await.unwrap();

    a.signal(Signal::SIGSTOP).unwrap();
    let term_b = int(&b.wait_for("elected", |l| event(l) == "elected").await.unwrap(), "term");
    assert!(term_b > term_a);
    let first_b = int(&b.wait_for("b's first append", |l| event(l) == "appended").await.unwrap(), "seq");
    f.signal(Signal::SIGKILL).unwrap();
    let _ = f.wait_exit().await;
    b.wait_for("more of b's appends", |l| event(l) == "appended" && int(l, "seq") >= first_b + 10).await.unwrap();
    a.signal(Signal::SIGCONT).unwrap();
    a.wait_for("a's loss", |l| event(l) == "lost").await.unwrap();
    let mut f = ElectorProcess::spawn_with(&url, "f1-own", "f1", timing, &follower_args).unwrap();
    // a first: stopped after b, it could take the lease b releases and append with a third term.
    a.signal(Signal::SIGTERM).unwrap();
    a.wait_for("a's shutdown", |l| event(l) == "shutdown").await.unwrap();
    b.signal(Signal::SIGTERM).unwrap();
    b.wait_for("b's shutdown", |l| event(l) == "shutdown").await.unwrap();

    let log = store_log::read(&admin, "jobs-log", 0, 10_000).await.unwrap();
    let head = log.last().unwrap().seq;
    f.wait_for("the follower at the head", |l| event(l) == "applied" && int(l, "seq") == head).await.unwrap();
    f.signal(Signal::SIGTERM).unwrap();
    f.wait_for("the follower's shutdown", |l| event(l) == "shutdown").await.unwrap();

    assert_eq!(log.iter().map(|e| e.seq).collect::<Vec<_>>(), (1..=head).collect::<Vec<_>>(), "no gap");
    assert!(log.windows(2).all(|pair| pair[0].term <= pair[1].term), "terms never go down (S3)");
    assert!(log.iter().all(|e| e.term == term_a || e.term == term_b), "only a's and b's terms");
    let first_of_b = log.iter().find(|e| e.term == term_b).unwrap().seq;
    assert!(first_of_b <= first_b);
    assert!(
        log.iter().filter(|e| e.seq > first_of_b).all(|e| e.term == term_b),
        "no entry of a's term after b's first"
    );
    a.drain();
    for line in a.seen.iter().filter(|l| event(l) == "appended") {
        let entry = log.iter().find(|e| e.seq == int(line, "seq")).unwrap();
        assert_eq!(entry.term, term_a, "an append a saw admitted is a's: {line}");
    }
    let projected: Vec<(i64, i64)> = std::fs::read_to_string(&projection)
        .unwrap()
        .lines()
        .map(|line| {
            let value: serde_json::Value = serde_json::from_str(line).unwrap();
            (value["seq"].as_i64().unwrap(), value["term"].as_i64().unwrap())
        })
        .collect();
    assert_eq!(projected, log.iter().map(|e| (e.seq, e.term)).collect::<Vec<_>>(), "the projection is the log");
    std::fs::remove_dir_all(&dir).ok();
}

/// An appender appends only to a stream bound to its own lease, whatever the terms' numbers (two
/// leases' terms are unrelated, and equal here); and a new leader's `open` waits for the old
/// term's open append and returns the head with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_appender_is_refused_on_another_leases_stream_and_open_waits_for_the_old_terms_appends() {
    let db = TestDb::new().await;
    let admin = db.connect().await;
    store_log::create_stream(&admin, "theirs", "their-lease", Retention::default()).await.unwrap();
    store_log::create_stream(&admin, "ours", "our-lease", Retention::default()).await.unwrap();
    let theirs = store::acquire(&admin, "their-lease", "x", Duration::from_secs(60)).await.unwrap().term.unwrap();
    let elector = elector(&db, "our-lease");
    let leadership =
        tokio::time::timeout(Duration::from_secs(15), elector.wait_for_leadership()).await.unwrap().unwrap();
    assert_eq!(leadership.term(), theirs, "the two leases are at the same term number");
    match elector.appender("theirs").append(&[serde_json::json!("not ours")]).await {
        Err(Error::NotLeader { .. }) => {}
        other => panic!("another lease's stream must refuse this appender, got {other:?}"),
    }
    assert_eq!(store_log::status(&admin, "theirs").await.unwrap().head, 0, "nothing appended");

    let appender = elector.appender("ours");
    assert_eq!(appender.open(&leadership).await.unwrap(), 0);
    assert_eq!(appender.append_in(&leadership, &[serde_json::json!(1)]).await.unwrap(), 1);
    elector.shutdown().await;
    // A period that ended is never appended under, even by its own appender.
    match appender.append_in(&leadership, &[serde_json::json!("late")]).await {
        Err(Error::NotLeader { .. }) => {}
        other => panic!("an ended period appends nothing, got {other:?}"),
    }

    // The next term (raw SQL, as a zombie would) has an append open when a newer term is granted;
    // the newest leader's barrier waits for it and returns the head with it.
    let mut old = db.connect().await;
    let b = store::acquire(&admin, "our-lease", "b", Duration::from_secs(2)).await.unwrap().term.unwrap();
    let open = old.transaction().await.unwrap();
    assert_eq!(store_log::append(&open, "ours", b, &["2"]).await.unwrap(), 2);
    tokio::time::sleep(Duration::from_millis(2200)).await;
    let c = store::acquire(&admin, "our-lease", "c", Duration::from_secs(60)).await.unwrap().term.unwrap();
    let barrier_client = db.connect().await;
    let barrier =
        tokio::spawn(async move { store_log::open_stream(&barrier_client, "ours", c, Some("our-lease")).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!barrier.is_finished(), "the barrier waits for the old term's open append");
    open.commit().await.unwrap();
    assert_eq!(tokio::time::timeout(Duration::from_secs(10), barrier).await.unwrap().unwrap().unwrap(), 2);
    assert!(matches!(store_log::append(&old, "ours", b, &["3"]).await, Err(fencing_schema::Error::Refused { .. })));
    assert!(matches!(
        store_log::open_stream(&admin, "ours", c, Some("their-lease")).await,
        Err(fencing_schema::Error::Refused { .. })
    ));
}

/// Retention with a lagging follower, with real processes: follower f1 is paused (SIGSTOP)
/// while the leader appends and retention runs every 100 ms keeping 5 entries. Without a limit,
/// retention keeps every entry f1 has not applied, and f1, resumed, applies them all, without a
/// gap. With `max_entries` 20, retention passes the paused f1, and f1, resumed, is told to
/// resnapshot (`compacted`) instead of skipping entries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_waits_for_a_paused_follower_unless_its_limit_says_so_and_then_tells_it_to_resnapshot() {
    use fencing_tests::process::{ElectorProcess, Timing, event, int};
    use nix::sys::signal::Signal;

    let db = TestDb::new().await;
    let admin = db.connect().await;
    let keep_five = Retention { keep_count: Some(5), keep_age: None, max_entries: None };
    store_log::create_stream(&admin, "r-log", "r", keep_five).await.unwrap();
    let dir = std::env::temp_dir().join(format!("fencing-retention-{}-{}", std::process::id(), db.name));
    std::fs::create_dir_all(&dir).unwrap();
    let projection = dir.join("f1.jsonl");
    let projection_arg = projection.display().to_string();
    let url = db.url();
    let timing = Timing::FAST;
    let follower_args = ["--follow-stream", "r-log", "--follower", "f1", "--projection", projection_arg.as_str()];
    let mut leader = ElectorProcess::spawn_with(&url, "r", "a", timing, &["--append-stream", "r-log"]).unwrap();
    leader.wait_for("an append", |l| event(l) == "appended").await.unwrap();
    let mut f = ElectorProcess::spawn_with(&url, "f1-own", "f1", timing, &follower_args).unwrap();
    f.wait_for("an apply", |l| event(l) == "applied").await.unwrap();

    // Retention every 100 ms in the background, as an operator's job would run it.
    let retainer_client = db.connect().await;
    let retaining = tokio::spawn(async move {
        loop {
            if store_log::retain(&retainer_client, "r-log").await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });

    f.signal(Signal::SIGSTOP).unwrap();
    let paused_at = store_log::position(&admin, "r-log", "f1").await.unwrap().unwrap();
    leader.wait_for("30 more appends", |l| event(l) == "appended" && int(l, "seq") >= paused_at + 30).await.unwrap();
    let status = store_log::status(&admin, "r-log").await.unwrap();
    assert!(
        status.first_seq <= paused_at + 1,
        "retention removed entries the paused follower has not applied: {status:?}"
    );
    f.signal(Signal::SIGCONT).unwrap();
    let head = store_log::status(&admin, "r-log").await.unwrap().head;
    f.wait_for("caught up", |l| event(l) == "applied" && int(l, "seq") >= head).await.unwrap();

    // Now with a limit: the paused follower is passed, and told so when it resumes.
    store_log::set_retention(&admin, "r-log", Retention { keep_count: Some(5), keep_age: None, max_entries: Some(20) })
        .await
        .unwrap();
    f.signal(Signal::SIGSTOP).unwrap();
    // What the paused follower has applied, reported or not: its projection file (written before
    // each apply returns). It may also hold a batch read and not yet applied (at most 100
    // entries): retention must pass all that, not only its last report.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let applied = last_projected(&projection) + 100;
    leader.wait_for("130 more appends", |l| event(l) == "appended" && int(l, "seq") >= applied + 30).await.unwrap();
    let mut first_seq = 0;
    for _ in 0..100 {
        first_seq = store_log::status(&admin, "r-log").await.unwrap().first_seq;
        if first_seq > applied + 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(first_seq > applied + 1, "the limit lets retention pass the paused follower: {first_seq} after {applied}");
    f.signal(Signal::SIGCONT).unwrap();
    let stopped = f.wait_for("the follower stops", |l| event(l) == "follower_stopped").await.unwrap();
    let error = stopped["error"].as_str().unwrap_or_default().to_owned();
    assert!(error.contains("compacted") && error.contains("resnapshot"), "{error}");
    retaining.abort();

    // What it applied has no gap: its projection is a prefix of what the log had.
    let projected: Vec<i64> = std::fs::read_to_string(&projection)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap()["seq"].as_i64().unwrap())
        .collect();
    assert_eq!(projected, (1..=projected.len() as i64).collect::<Vec<_>>(), "applied without a gap");
    for process in [&mut f, &mut leader] {
        process.signal(Signal::SIGTERM).unwrap();
        process.wait_for("shutdown", |l| event(l) == "shutdown").await.unwrap();
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// The last sequence in a projection file of the example elector.
fn last_projected(path: &std::path::Path) -> i64 {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok()?["seq"].as_i64())
        .max()
        .unwrap_or(0)
}
