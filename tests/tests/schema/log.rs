//! The fenced log (schema version 16) against a real PostgreSQL: appends admitted only for the
//! stream's lease's current term (S4 for streams), numbers without a gap in commit order (a
//! reader never skips an entry, checked against the classic sequence bug), immutable entries,
//! retention bounded by followers, and bad input.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use fencing_schema::log::{self, Retention};
use fencing_schema::{Error, store};
use fencing_tests::pg::{TestDb, connect};
use tokio::sync::Mutex;

const TTL: Duration = Duration::from_secs(60);

/// The refusal's message, which must name `outcome` (`stale`, `not_leader`, `future_term`).
fn refused(result: Result<i64, Error>, outcome: &str) -> String {
    match result {
        Err(Error::Refused { message, .. }) => {
            let named = match outcome {
                "stale" => "(stale term)".to_owned(),
                other => format!("({})", other.replace('_', " ")),
            };
            assert!(message.contains(&named), "expected a {outcome} refusal: {message}");
            message
        }
        other => panic!("expected a {outcome} refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn s4_a_stream_admits_only_its_leases_current_term_and_the_zombies_append_is_refused() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    assert!(log::create_stream(&client, "orders", "orders-leader", Retention::default()).await.unwrap());
    assert!(!log::create_stream(&client, "orders", "orders-leader", Retention::default()).await.unwrap(), "exists");

    // No leader yet: any term is beyond the lease's (it has none), nothing appended.
    refused(log::append(&client, "orders", 1, &[r#"{"n":0}"#]).await, "future_term");
    let a = store::acquire(&client, "orders-leader", "a", TTL).await.unwrap().term.unwrap();
    assert_eq!(log::append(&client, "orders", a, &[r#"{"n":1}"#, r#"{"n":2}"#]).await.unwrap(), 1);
    // A future or forged term is refused and does not poison the fence.
    refused(log::append(&client, "orders", a + 1, &[r#"{"forged":true}"#]).await, "future_term");
    assert_eq!(log::append(&client, "orders", a, &[r#"{"n":3}"#]).await.unwrap(), 3);

    // a's lease ends (as it would run out); b leads with a higher term before writing anything:
    // a (a zombie that does not know) is refused at once.
    store::force_release(&client, "orders-leader", "test", "a's lease ends").await.unwrap();
    refused(log::append(&client, "orders", a, &[r#"{"late":true}"#]).await, "not_leader");
    let b = store::acquire(&client, "orders-leader", "b", TTL).await.unwrap().term.unwrap();
    assert!(b > a);
    let message = refused(log::append(&client, "orders", a, &[r#"{"zombie":true}"#]).await, "stale");
    assert!(message.contains("fencing.log/orders"), "{message}");
    assert_eq!(log::append(&client, "orders", b, &[r#"{"n":4}"#]).await.unwrap(), 4);
    refused(log::append(&client, "orders", a, &[r#"{"zombie":true}"#]).await, "stale");

    let entries = log::read(&client, "orders", 0, 100).await.unwrap();
    let seen: Vec<(i64, i64, &str)> = entries.iter().map(|e| (e.seq, e.term, e.payload.as_str())).collect();
    assert_eq!(
        seen,
        vec![(1, a, r#"{"n": 1}"#), (2, a, r#"{"n": 2}"#), (3, a, r#"{"n": 3}"#), (4, b, r#"{"n": 4}"#)],
        "exactly the admitted entries, in order"
    );
    let status = log::status(&client, "orders").await.unwrap();
    assert_eq!(
        (status.lease_key.as_deref(), status.max_term, status.head, status.first_seq),
        (Some("orders-leader"), Some(b), 4, 1)
    );

    // The stream's fence is the log's own: no one else binds or writes it, and the stream stays
    // bound to its lease unless an admin rebinds it.
    assert!(matches!(store::bind(&client, "fencing.log/other", "x").await, Err(Error::InvalidArgument { .. })));
    assert!(matches!(store::admit(&client, "fencing.log/other", 1).await, Err(Error::InvalidArgument { .. })));
    let gate =
        store::gate(&client, "fencing.log/other", b, Duration::from_secs(1), Some("orders-leader")).await.unwrap();
    assert!(!gate.is_admitted(), "the gateway's gate makes no log fence either: {gate:?}");
    assert!(store::get_fence(&client, "fencing.log/other").await.unwrap().is_none());
    // A stream's fence name is a resource name too: at most 256 characters.
    let longest = "s".repeat(244);
    assert!(log::create_stream(&client, &longest, "orders-leader", Retention::default()).await.unwrap());
    assert_eq!(log::append(&client, &longest, b, &["1"]).await.unwrap(), 1);
    assert!(matches!(
        log::create_stream(&client, &"s".repeat(245), "orders-leader", Retention::default()).await,
        Err(Error::InvalidArgument { .. })
    ));
    match log::create_stream(&client, "orders", "another-lease", Retention::default()).await {
        Err(Error::InvalidArgument { message }) => assert!(message.contains("fencing.rebind"), "{message}"),
        other => panic!("expected a refusal to move the stream, got {other:?}"),
    }
    assert!(matches!(log::append(&client, "missing", b, &["1"]).await, Err(Error::NoStream { .. })));
    assert!(matches!(log::read(&client, "missing", 0, 10).await, Err(Error::NoStream { .. })));
}

/// The old term's append that is open when the new term is granted commits; the new term's first
/// append waits for it (the fence row), and gets the next number; the old term's next append is
/// refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_a_new_terms_first_append_waits_for_the_old_terms_open_append_and_follows_it() {
    let db = TestDb::new().await;
    let (mut old, new) = (db.connect().await, db.connect().await);
    log::create_stream(&new, "jobs", "jobs-leader", Retention::default()).await.unwrap();
    let a = store::acquire(&new, "jobs-leader", "a", Duration::from_secs(2)).await.unwrap().term.unwrap();
    let open = old.transaction().await.unwrap();
    assert_eq!(log::append(&open, "jobs", a, &[r#""a1""#]).await.unwrap(), 1);
    tokio::time::sleep(Duration::from_millis(2200)).await;
    let b = store::acquire(&new, "jobs-leader", "b", TTL).await.unwrap().term.unwrap();
    let waiting = tokio::spawn(async move { log::append(&new, "jobs", b, &[r#""b1""#]).await.map(|seq| (seq, new)) });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "the new term's append waits for the old term's open one");
    // It waits on the fence (not only on the stream row): b has not raised it yet (a's raise to
    // a is not committed either).
    let watcher = db.connect().await;
    assert!(store::get_fence(&watcher, "fencing.log/jobs").await.unwrap().unwrap().max_term < b);
    open.commit().await.unwrap();
    let (seq, new) = tokio::time::timeout(Duration::from_secs(10), waiting).await.unwrap().unwrap().unwrap();
    assert_eq!(seq, 2);
    refused(log::append(&old, "jobs", a, &[r#""a2""#]).await, "stale");
    let entries = log::read(&new, "jobs", 0, 10).await.unwrap();
    assert_eq!(entries.iter().map(|e| (e.seq, e.term)).collect::<Vec<_>>(), vec![(1, a), (2, b)]);
}

/// The classic bug, and that the log does not have it. With a plain sequence, an appender that
/// took number 1 and has not committed yet lets a reader see number 2 first: a reader that then
/// reads after 2 skips 1 forever. The log gives the next number only after the previous append
/// committed: the reader sees nothing until 1 commits, then 1 and 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_never_sees_an_entry_before_an_earlier_one_commits_unlike_a_plain_sequence() {
    let db = TestDb::new().await;
    let mut clients = db.connect_many(3).await;
    let reader = clients.pop().unwrap();
    let second = clients.pop().unwrap();
    let mut first = clients.pop().unwrap();

    // The classic: bigserial numbers in nextval order.
    reader.batch_execute("CREATE TABLE naive (seq bigserial PRIMARY KEY, payload text)").await.unwrap();
    let open = first.transaction().await.unwrap();
    let one: i64 =
        open.query_one("INSERT INTO naive (payload) VALUES ('one') RETURNING seq", &[]).await.unwrap().get(0);
    let two: i64 =
        second.query_one("INSERT INTO naive (payload) VALUES ('two') RETURNING seq", &[]).await.unwrap().get(0);
    assert_eq!((one, two), (1, 2));
    let seen: Vec<i64> = reader
        .query("SELECT seq FROM naive WHERE seq > 0 ORDER BY seq", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(seen, vec![2], "the plain sequence shows 2 before 1: a reader at 2 would skip 1");
    open.commit().await.unwrap();

    // The log.
    log::create_stream(&reader, "s", "s-leader", Retention::default()).await.unwrap();
    let term = store::acquire(&reader, "s-leader", "a", TTL).await.unwrap().term.unwrap();
    let open = first.transaction().await.unwrap();
    assert_eq!(log::append(&open, "s", term, &[r#""one""#]).await.unwrap(), 1);
    let waiting = tokio::spawn(async move { log::append(&second, "s", term, &[r#""two""#]).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(log::read(&reader, "s", 0, 10).await.unwrap().is_empty(), "nothing is visible before 1 commits");
    assert!(!waiting.is_finished(), "2 is not given while 1 is open");
    open.commit().await.unwrap();
    assert_eq!(tokio::time::timeout(Duration::from_secs(10), waiting).await.unwrap().unwrap().unwrap(), 2);
    let seqs: Vec<i64> = log::read(&reader, "s", 0, 10).await.unwrap().iter().map(|e| e.seq).collect();
    assert_eq!(seqs, vec![1, 2]);

    // An append rolled back gives its number back: no gap.
    let open = first.transaction().await.unwrap();
    assert_eq!(log::append(&open, "s", term, &[r#""rolled back""#]).await.unwrap(), 3);
    open.rollback().await.unwrap();
    assert_eq!(log::append(&first, "s", term, &[r#""three""#]).await.unwrap(), 3);
}

/// Appenders on four connections pause a random while between an append and its commit (the
/// moment a plain sequence would let a later number commit first), some roll back, and three
/// readers tail the stream as fast as they can.
/// Every batch a reader gets starts right after its cursor and has no gap, and every reader ends
/// with exactly the committed entries, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_appenders_and_readers_never_skip_or_reorder_an_entry() {
    const APPENDERS: usize = 4;
    const APPENDS: usize = 60;
    let db = TestDb::new().await;
    let setup = db.connect().await;
    log::create_stream(&setup, "tail", "tail-leader", Retention::default()).await.unwrap();
    let term = store::acquire(&setup, "tail-leader", "a", TTL).await.unwrap().term.unwrap();
    let committed: Arc<Mutex<BTreeMap<i64, String>>> = Arc::default();
    let finished = Arc::new(std::sync::atomic::AtomicBool::new(false));

    let mut readers = Vec::new();
    for reader in 0..3 {
        let client = db.connect().await;
        let finished = Arc::clone(&finished);
        readers.push(tokio::spawn(async move {
            let mut cursor = 0;
            let mut seen: Vec<(i64, String)> = Vec::new();
            loop {
                let last_pass = finished.load(std::sync::atomic::Ordering::SeqCst);
                let batch = log::read(&client, "tail", cursor, 7).await.unwrap();
                for entry in &batch {
                    assert_eq!(
                        entry.seq,
                        cursor + 1,
                        "reader {reader} skipped or reordered: after {cursor} came {}",
                        entry.seq
                    );
                    cursor = entry.seq;
                    seen.push((entry.seq, entry.payload.clone()));
                }
                if batch.is_empty() {
                    if last_pass {
                        return seen;
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
        }));
    }
    let mut appenders = Vec::new();
    for appender in 0..APPENDERS {
        let mut client = db.connect().await;
        let committed = Arc::clone(&committed);
        appenders.push(tokio::spawn(async move {
            for n in 0..APPENDS {
                let payload = format!(r#"{{"appender": {appender}, "n": {n}}}"#);
                let transaction = client.transaction().await.unwrap();
                let seq = log::append(&transaction, "tail", term, &[&payload]).await.unwrap();
                transaction.batch_execute("SELECT pg_sleep(random() * 0.003)").await.unwrap();
                if n % 10 == 9 {
                    transaction.rollback().await.unwrap();
                } else {
                    // Recorded before the commit: a reader may see it the moment it commits.
                    committed.lock().await.insert(seq, payload);
                    transaction.commit().await.unwrap();
                }
            }
        }));
    }
    for appender in appenders {
        appender.await.unwrap();
    }
    finished.store(true, std::sync::atomic::Ordering::SeqCst);
    let committed = committed.lock().await.clone();
    let expected: Vec<(i64, String)> = log::read(&setup, "tail", 0, 10_000)
        .await
        .unwrap()
        .into_iter()
        .map(|entry| (entry.seq, entry.payload))
        .collect();
    assert_eq!(expected.len(), APPENDERS * APPENDS * 9 / 10, "every committed append, no rolled-back one");
    assert_eq!(
        expected.iter().map(|(seq, _)| *seq).collect::<Vec<_>>(),
        (1..=expected.len() as i64).collect::<Vec<_>>()
    );
    for (seq, payload) in &expected {
        let sent: serde_json::Value = serde_json::from_str(&committed[seq]).unwrap();
        let stored: serde_json::Value = serde_json::from_str(payload).unwrap();
        assert_eq!(sent, stored, "entry {seq} is the append that got its number");
    }
    for reader in readers {
        let seen = tokio::time::timeout(Duration::from_secs(30), reader).await.unwrap().unwrap();
        assert_eq!(seen, expected, "a reader ends with exactly the committed entries, in order");
    }
}

/// Entries are immutable: no UPDATE, DELETE, TRUNCATE or direct INSERT, not even by the schema's
/// owner and not with triggers off for replication.
#[tokio::test]
async fn entries_cannot_be_changed_removed_or_slipped_in_except_by_append_and_retention() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    log::create_stream(&client, "s", "k", Retention::default()).await.unwrap();
    let term = store::acquire(&client, "k", "a", TTL).await.unwrap().term.unwrap();
    log::append(&client, "s", term, &[r#""kept""#]).await.unwrap();
    for role in ["origin", "replica"] {
        client.batch_execute(&format!("SET session_replication_role = {role}")).await.unwrap();
        for statement in [
            "UPDATE fencing.stream_entries SET payload = '\"changed\"'",
            "DELETE FROM fencing.stream_entries",
            "TRUNCATE fencing.stream_entries",
            "INSERT INTO fencing.stream_entries VALUES ('s', 2, 99, now(), '\"slipped\"')",
            "SELECT set_config('fencing.log_writer', 'x', true); DELETE FROM fencing.stream_entries",
            // The setting append and retention use does not open the table either: retention
            // removes only below the first kept entry, append writes only up to the head.
            "SELECT set_config('fencing.log_writer', 'retain', true); DELETE FROM fencing.stream_entries",
            "SELECT set_config('fencing.log_writer', 'append', true); \
             INSERT INTO fencing.stream_entries VALUES ('s', 2, 99, now(), '\"slipped\"')",
        ] {
            let error = client.batch_execute(statement).await.unwrap_err();
            assert!(
                error.to_string().contains("immutable") || format!("{error:?}").contains("immutable"),
                "{statement}: {error:?}"
            );
        }
    }
    client.batch_execute("RESET session_replication_role").await.unwrap();
    let entries = log::read(&client, "s", 0, 10).await.unwrap();
    assert_eq!(entries.iter().map(|e| (e.seq, e.payload.as_str())).collect::<Vec<_>>(), vec![(1, r#""kept""#)]);
}

#[tokio::test]
async fn retention_keeps_what_a_follower_has_not_applied_unless_the_limit_says_so() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    let retention = Retention { keep_count: Some(3), keep_age: None, max_entries: Some(8) };
    log::create_stream(&client, "r", "k", retention).await.unwrap();
    let term = store::acquire(&client, "k", "a", TTL).await.unwrap().term.unwrap();
    let payloads: Vec<String> = (1..=10).map(|n| n.to_string()).collect();
    let payloads: Vec<&str> = payloads.iter().map(String::as_str).collect();
    assert_eq!(log::append(&client, "r", term, &payloads).await.unwrap(), 1);

    // The count alone would let 1-7 go (10 entries, keep 3). A follower that applied nothing
    // holds them all back, but the limit of 8 entries lets 1 and 2 go all the same.
    log::report_position(&client, "r", "slow", 0).await.unwrap();
    log::report_position(&client, "r", "fast", 10).await.unwrap();
    let followers = log::followers(&client, "r").await.unwrap();
    let slow = followers.iter().find(|f| f.follower == "slow").unwrap();
    assert_eq!((slow.applied, slow.lag_entries), (0, 10));
    let fast = followers.iter().find(|f| f.follower == "fast").unwrap();
    assert_eq!((fast.lag_entries, fast.lag), (0, Some(Duration::ZERO)));
    assert_eq!(log::retain(&client, "r").await.unwrap(), 2);
    assert_eq!(log::status(&client, "r").await.unwrap().first_seq, 3);
    // Retention passed the slow follower: its lag in time is unknown now (the entry after its
    // position is gone), never "caught up" (a gateway would send it reads).
    let slow = log::followers(&client, "r").await.unwrap().into_iter().find(|f| f.follower == "slow").unwrap();
    assert_eq!((slow.lag_entries, slow.lag), (10, None));
    assert!(matches!(log::read(&client, "r", 0, 10).await, Err(Error::Compacted { first_seq: 3, .. })));
    // The slow follower moves to 5: 3-5 may go now, the count allows up to 7.
    log::report_position(&client, "r", "slow", 5).await.unwrap();
    assert_eq!(log::retain(&client, "r").await.unwrap(), 3);
    assert_eq!(log::status(&client, "r").await.unwrap().first_seq, 6);
    // Forgotten, it holds nothing back: the count leaves 8-10.
    assert!(log::forget_follower(&client, "r", "slow").await.unwrap());
    assert_eq!(log::retain(&client, "r").await.unwrap(), 2);
    assert_eq!(log::read(&client, "r", 7, 10).await.unwrap().iter().map(|e| e.seq).collect::<Vec<_>>(), vec![8, 9, 10]);

    // A reader behind retention is told to resnapshot, and from where.
    match log::read(&client, "r", 2, 10).await {
        Err(Error::Compacted { first_seq, message }) => {
            assert_eq!(first_seq, 8);
            assert!(message.contains("compacted") && message.contains("resnapshot from sequence 8"), "{message}");
        }
        other => panic!("expected compacted, got {other:?}"),
    }
    assert!(log::read(&client, "r", 7, 10).await.is_ok(), "a reader at first_seq - 1 reads on");
    // A position from a log this database does not have, or out of range, is refused.
    assert!(matches!(log::read(&client, "r", 11, 10).await, Err(Error::InvalidArgument { .. })));
    assert!(matches!(log::report_position(&client, "r", "x", 11).await, Err(Error::InvalidArgument { .. })));
    assert!(matches!(log::report_position(&client, "r", "x", -1).await, Err(Error::InvalidArgument { .. })));
    // A follower that reports a position retention passed (it read a batch, paused, and reports
    // after retention ran) is told to resnapshot, as a read would tell it.
    match log::report_position(&client, "r", "x", 3).await {
        Err(Error::Compacted { first_seq, message }) => {
            assert_eq!(first_seq, 8);
            assert!(message.contains("entries 4 to 7 are gone; resnapshot from sequence 8"), "{message}");
        }
        other => panic!("expected compacted, got {other:?}"),
    }
    assert_eq!(log::position(&client, "r", "x").await.unwrap(), None, "a refused report registers nothing");
    let reported = log::report_position(&client, "r", "fast", 9).await.unwrap();
    assert_eq!(reported.head, 10);
    assert_eq!(log::position(&client, "r", "fast").await.unwrap(), Some(9));
    assert_eq!(log::position(&client, "r", "never").await.unwrap(), None);
    log::report_position(&client, "r", "fast", 10).await.unwrap();

    // By age: entries older than the age go (none is older than an hour; after a second, all
    // but the one appended since).
    let by_age = |age| Retention { keep_count: None, keep_age: Some(age), max_entries: None };
    log::set_retention(&client, "r", by_age(Duration::from_secs(3600))).await.unwrap();
    assert_eq!(log::retain(&client, "r").await.unwrap(), 0, "nothing is older than an hour");
    log::set_retention(&client, "r", by_age(Duration::from_secs(1))).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(log::append(&client, "r", term, &["11"]).await.unwrap(), 11);
    // 8-10 are older than a second; 11 is not, unless this machine stalled for a second.
    let removed = log::retain(&client, "r").await.unwrap();
    assert!(removed == 3 || removed == 4, "{removed}");
    assert_eq!(log::status(&client, "r").await.unwrap().first_seq, 8 + removed);
    // Without any limit nothing goes.
    log::set_retention(&client, "r", Retention::default()).await.unwrap();
    assert_eq!(log::append(&client, "r", term, &["12"]).await.unwrap(), 12);
    assert_eq!(log::retain(&client, "r").await.unwrap(), 0);
}

#[tokio::test]
async fn bad_input_to_the_log_is_refused_with_22023_and_changes_nothing() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    log::create_stream(&client, "s", "k", Retention::default()).await.unwrap();
    let term = store::acquire(&client, "k", "a", TTL).await.unwrap().term.unwrap();
    let invalid = |result: Result<i64, Error>, what: &str| match result {
        Err(Error::InvalidArgument { .. }) => {}
        other => panic!("{what}: expected 22023, got {other:?}"),
    };
    invalid(log::append(&client, "s", term, &[]).await, "no entry");
    let many: Vec<&str> = vec!["1"; 1001];
    invalid(log::append(&client, "s", term, &many).await, "1001 entries");
    let big = format!("\"{}\"", "x".repeat(1 << 20));
    invalid(log::append(&client, "s", term, &[&big]).await, "over 1 MiB");
    invalid(log::append(&client, "s", term, &["{not json"]).await, "not JSON");
    invalid(log::append(&client, "s", 0, &["1"]).await, "term 0");
    invalid(log::append(&client, "", term, &["1"]).await, "empty stream name");
    let null_entry = client
        .query_one("SELECT fencing.append('s', $1, ARRAY['1'::jsonb, NULL])", &[&term])
        .await
        .map(|_| 0)
        .map_err(Error::from);
    invalid(null_entry, "a null entry");
    let two_dimensional = client
        .query_one("SELECT fencing.append('s', $1, ARRAY[['1'::jsonb, '2'::jsonb]])", &[&term])
        .await
        .map(|_| 0)
        .map_err(Error::from);
    invalid(two_dimensional, "a two-dimensional array");
    invalid(log::read(&client, "s", i64::MAX, 10).await.map(|_| 0), "after i64::MAX");
    let ages =
        Retention { keep_count: None, keep_age: Some(Duration::from_secs(200 * 366 * 86_400)), max_entries: None };
    invalid(log::set_retention(&client, "s", ages).await.map(|()| 0), "keep_age of 200 years");
    invalid(log::read(&client, "s", -1, 10).await.map(|_| 0), "after -1");
    invalid(log::read(&client, "s", 0, 0).await.map(|_| 0), "max_count 0");
    invalid(log::read(&client, "s", 0, 10_001).await.map(|_| 0), "max_count 10001");
    let negative = Retention { keep_count: Some(0), keep_age: None, max_entries: None };
    invalid(log::create_stream(&client, "t", "k", negative).await.map(|_| 0), "keep_count 0");
    invalid(log::set_retention(&client, "s", negative).await.map(|()| 0), "keep_count 0");
    let status = log::status(&client, "s").await.unwrap();
    assert_eq!((status.head, status.retention), (0, Retention::default()), "nothing changed");
    assert!(matches!(log::status(&client, "t").await, Err(Error::NoStream { .. })), "no stream made");
}

/// An append answered under asynchronous commit survives a crash of Postgres: a follower that
/// applied it never finds it gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_an_append_answered_under_asynchronous_commit_survives_a_crash_of_postgres() {
    let (cluster, url) = crate::durability::asynchronous_cluster().await;
    let client = connect(&url).await;
    log::create_stream(&client, "s", "k", Retention::default()).await.unwrap();
    let term = store::acquire(&client, "k", "a", TTL).await.unwrap().term.unwrap();
    client.batch_execute("CHECKPOINT").await.unwrap();
    let setting: String = client.query_one("SHOW synchronous_commit", &[]).await.unwrap().get(0);
    assert_eq!(setting, "off", "the database commits asynchronously");
    assert_eq!(log::append(&client, "s", term, &[r#""answered""#]).await.unwrap(), 1);
    cluster.crash().unwrap();
    cluster.start_server().unwrap();
    let client = connect(&url).await;
    let entries = log::read(&client, "s", 0, 10).await.unwrap();
    assert_eq!(entries.iter().map(|e| e.payload.as_str()).collect::<Vec<_>>(), vec![r#""answered""#]);
}
