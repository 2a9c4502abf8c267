//! Electors in this process: stability, leader work, fenced writes, loss on a stuck renewal.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use fencing_election::{Elector, ElectorBuilder, ElectorHandle, Error, Event, LossReason};
use fencing_schema::store;
use fencing_tests::pg::TestDb;
use tokio::sync::broadcast::error::TryRecvError;
use tokio_postgres::NoTls;

// Long enough that a loaded CI machine does not stall a renewal past the query timeout.
const TTL: Duration = Duration::from_millis(3000);
const RENEW: Duration = Duration::from_millis(900);
const MARGIN: Duration = Duration::from_millis(300);
const QUERY_TIMEOUT: Duration = Duration::from_millis(900);

pub(crate) fn pool(url: &str) -> Pool {
    let config: tokio_postgres::Config = url.parse().unwrap();
    let manager = Manager::from_config(config, NoTls, ManagerConfig { recycling_method: RecyclingMethod::Fast });
    Pool::builder(manager).max_size(2).build().unwrap()
}

/// The builder of this file's electors: its timings, for `key` and `owner`.
fn builder(db: &TestDb, key: &str, owner: &str) -> ElectorBuilder {
    Elector::builder(pool(&db.url()), key)
        .owner(owner)
        .ttl(TTL)
        .renew_interval(RENEW)
        .safety_margin(MARGIN)
        .query_timeout(QUERY_TIMEOUT)
}

fn elector(db: &TestDb, key: &str, owner: &str) -> ElectorHandle {
    builder(db, key, owner).build().unwrap().start()
}

/// Waits (bounded) until exactly one of `handles` leads; returns its index and term.
async fn sole_leader(handles: &[ElectorHandle]) -> (usize, i64) {
    for _ in 0..600 {
        let leaders: Vec<(usize, i64)> =
            handles.iter().enumerate().filter_map(|(i, h)| h.current_term().map(|term| (i, term))).collect();
        if leaders.len() == 1 {
            return leaders[0];
        }
        assert!(leaders.len() <= 1, "two leaders at once: {leaders:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no leader within 30 s");
}

async fn steady_state_has_one_leader_and_no_changes(electors: usize) {
    let db = TestDb::new().await;
    let handles: Vec<ElectorHandle> = (0..electors).map(|i| elector(&db, "stable", &format!("elector-{i}"))).collect();
    let (leader, term) = sole_leader(&handles).await;
    let mut events: Vec<_> = handles.iter().map(ElectorHandle::events).collect();

    // Thirty renew periods, sampled every 50 ms.
    let samples = 30 * RENEW.as_millis() / 50;
    for sample in 0..samples {
        let leaders: Vec<(usize, i64)> =
            handles.iter().enumerate().filter_map(|(i, h)| h.current_term().map(|t| (i, t))).collect();
        assert_eq!(leaders, vec![(leader, term)], "sample {sample}: exactly the same one leader");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for (index, receiver) in events.iter_mut().enumerate() {
        loop {
            match receiver.try_recv() {
                Ok(event @ (Event::Elected { .. } | Event::Lost { .. })) => {
                    panic!("elector-{index}: leadership changed in steady state: {event:?}")
                }
                Ok(Event::HolderChanged { .. }) => {}
                Err(TryRecvError::Empty) => break,
                Err(error) => panic!("elector-{index}: events: {error}"),
            }
        }
    }
    let client = db.connect().await;
    let lease = store::get_lease(&client, "stable").await.unwrap().unwrap();
    assert_eq!((lease.owner.as_str(), lease.term), (handles[leader].owner(), term), "the store agrees");
    for handle in handles {
        handle.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_electors_elect_one_leader_and_keep_it_for_30_renew_periods() {
    steady_state_has_one_leader_and_no_changes(2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_electors_elect_one_leader_and_keep_it_for_30_renew_periods() {
    steady_state_has_one_leader_and_no_changes(5).await;
}

/// Counts how many times leader work started and how many times it was stopped (dropped).
#[derive(Default)]
struct WorkCounts {
    started: AtomicUsize,
    stopped: AtomicUsize,
}

struct StopGuard(Arc<WorkCounts>);

impl Drop for StopGuard {
    fn drop(&mut self) {
        self.0.stopped.fetch_add(1, Ordering::SeqCst);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_work_and_fenced_writes_run_only_while_leader_and_stop_when_a_renewal_hangs() {
    let db = TestDb::new().await;
    let a = elector(&db, "work", "a");
    let (_, term) = sole_leader(std::slice::from_ref(&a)).await;
    let b = elector(&db, "work", "b");

    // Fenced writes: the leader's carry its term; a follower's are refused without sending.
    assert_eq!(a.write_fenced(|token| async move { token.term() }).await, Ok(term));
    let sent = AtomicUsize::new(0);
    let refused = b.write_fenced(|_| async { sent.fetch_add(1, Ordering::SeqCst) }).await;
    assert_eq!(refused, Err(Error::NotLeader { key: "work".to_owned() }));
    assert_eq!(sent.load(Ordering::SeqCst), 0, "a follower's write is never sent");

    let counts = Arc::new(WorkCounts::default());
    let work_counts = Arc::clone(&counts);
    a.spawn_leader_work(move |leadership| {
        let counts = Arc::clone(&work_counts);
        async move {
            counts.started.fetch_add(1, Ordering::SeqCst);
            let _guard = StopGuard(Arc::clone(&counts));
            leadership.cancellation_token().cancelled().await;
            // Never reached: the work is dropped the instant leadership ends.
            std::future::pending::<()>().await;
        }
    });
    for _ in 0..200 {
        if counts.started.load(Ordering::SeqCst) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(counts.started.load(Ordering::SeqCst), 1, "leader work starts while leader");

    // Hold the lease row locked: A's next renewal hangs, times out, and A steps down.
    let mut events = a.events();
    let mut locker = db.connect().await;
    let lock = locker.transaction().await.unwrap();
    lock.execute("SELECT 1 FROM fencing.leases WHERE key = 'work' FOR UPDATE", &[]).await.unwrap();
    let lost = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            if let Event::Lost { term, reason } = events.recv().await.unwrap() {
                return (term, reason);
            }
        }
    })
    .await
    .expect("A reports the loss");
    assert_eq!(lost, (term, LossReason::RenewTimedOut));
    assert_eq!(a.current_term(), None);
    // The work's token was cancelled before the event was sent; its task drops the work when
    // it next runs.
    for _ in 0..200 {
        if counts.stopped.load(Ordering::SeqCst) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(counts.stopped.load(Ordering::SeqCst), 1, "leader work stopped at the loss");
    assert!(a.write_fenced(|token| async move { token.term() }).await.is_err(), "no fenced write after loss");
    lock.rollback().await.unwrap();

    // The row is free again: one of them leads, A again with its term if its lease had not
    // expired at the store meanwhile, else whoever acquires first with the next term.
    let (leader, again) = sole_leader(&[a, b]).await;
    assert!(again == term && leader == 0 || again == term + 1, "leader {leader} with term {again} after {term}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_leader_work_then_releases_the_lease() {
    let db = TestDb::new().await;
    let a = elector(&db, "release", "a");
    let (_, term) = sole_leader(std::slice::from_ref(&a)).await;
    let counts = Arc::new(WorkCounts::default());
    let work_counts = Arc::clone(&counts);
    a.spawn_leader_work(move |_| {
        let counts = Arc::clone(&work_counts);
        async move {
            counts.started.fetch_add(1, Ordering::SeqCst);
            let _guard = StopGuard(counts);
            std::future::pending::<()>().await;
        }
    });
    while counts.started.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(a.shutdown().await, "shutdown released the lease");
    assert_eq!(counts.stopped.load(Ordering::SeqCst), 1);
    let client = db.connect().await;
    let lease = store::get_lease(&client, "release").await.unwrap().unwrap();
    assert_eq!((lease.term, lease.remaining), (term, Duration::ZERO), "released: the row stays, expired");
}

/// S7: the end of a period does not wait for the runtime. A leader whose only runtime thread
/// is blocked (a starved runtime) has its period's token cancelled at its deadline anyway, by a
/// thread of its own, so anything checking the token sees the end in time.
#[test]
fn a_period_ends_at_its_deadline_even_when_the_runtime_is_starved() {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let db = TestDb::new().await;
        let handle = elector(&db, "starved", "a");
        let leadership =
            tokio::time::timeout(Duration::from_secs(30), handle.wait_for_leadership()).await.unwrap().expect("leads");
        let token = leadership.cancellation_token().clone();
        let latest_end = std::time::SystemTime::now() + TTL;
        let watcher = std::thread::spawn(move || {
            for _ in 0..(3 * TTL.as_millis() / 10) {
                if token.is_cancelled() {
                    return Some(std::time::SystemTime::now());
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            None
        });
        // Starve the runtime: block its only thread for three ttl. No renewal, no timer runs.
        std::thread::sleep(TTL * 3);
        let ended = watcher.join().unwrap().expect("the period's token was never cancelled while the runtime starved");
        let late = ended.duration_since(latest_end).unwrap_or_default();
        assert!(late < Duration::from_millis(200), "the period ended {late:?} after its deadline");
        assert!(!leadership.is_valid());
        handle.shutdown().await;
    });
}

/// A fenced send that was in flight when the period ended has an unknown outcome, and says so;
/// only a send that never started is "not the leader".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_in_flight_when_the_period_ends_reports_an_unknown_outcome() {
    let db = TestDb::new().await;
    let handle = elector(&db, "in-flight", "a");
    handle.wait_for_leadership().await.unwrap();
    // Renewals block on a row lock from now on, so the period ends while the send is out.
    let mut client = db.connect().await;
    let lock = client.transaction().await.unwrap();
    lock.execute("SELECT 1 FROM fencing.leases WHERE key = 'in-flight' FOR UPDATE", &[]).await.unwrap();
    let result = handle.write_fenced(|_token| tokio::time::sleep(TTL * 2)).await;
    assert!(matches!(result, Err(Error::OutcomeUnknown { .. })), "{result:?}");
    let after = handle.write_fenced(|_token| async {}).await;
    assert!(matches!(after, Err(Error::NotLeader { .. })), "{after:?}");
    lock.rollback().await.unwrap();
    handle.shutdown().await;
}

/// Shutdown does not release the lease while leader work that overran the grace may still run:
/// a successor starting now would run beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_does_not_release_while_overrunning_leader_work_may_still_run() {
    let db = TestDb::new().await;
    let handle = Elector::builder(pool(&db.url()), "overrun")
        .owner("a")
        .ttl(TTL)
        .renew_interval(RENEW)
        .safety_margin(MARGIN)
        .query_timeout(QUERY_TIMEOUT)
        .shutdown_grace(Duration::from_millis(200))
        .build()
        .unwrap()
        .start();
    handle.wait_for_leadership().await.unwrap();
    handle.spawn_leader_work(|_leadership| async {
        // Work that blocks its thread and never yields in time to be stopped.
        std::thread::sleep(Duration::from_secs(2));
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let released = handle.shutdown().await;
    assert!(!released, "released the lease while leader work was still running");
    let client = db.connect().await;
    let lease = store::get_lease(&client, "overrun").await.unwrap().unwrap();
    assert!(!lease.remaining.is_zero(), "the lease was ended early: {lease:?}");
}

/// No revival: a renewal whose reply is handled after the old deadline (here the runtime is
/// blocked while the reply waits in the socket) does not bring the ended period back. The
/// period ends at its deadline, and the elector reports the loss.
#[test]
fn a_renewal_reply_handled_after_the_deadline_does_not_revive_the_period() {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let db = TestDb::new().await;
        let url = format!("{}?application_name=revival", db.url());
        let handle = Elector::builder(pool(&url), "revival")
            .owner("a")
            .ttl(TTL)
            .renew_interval(RENEW)
            .safety_margin(MARGIN)
            .query_timeout(QUERY_TIMEOUT)
            .build()
            .unwrap()
            .start();
        let mut events = handle.events();
        let leadership = handle.wait_for_leadership().await.unwrap();
        let term = leadership.term();

        // A locker on a thread and runtime of its own: the renewal blocks on the lease row.
        let (release, released) = std::sync::mpsc::channel::<()>();
        let locker_url = db.url();
        let locker = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async move {
                let mut client = fencing_tests::pg::connect(&locker_url).await;
                let lock = client.transaction().await.unwrap();
                lock.execute("SELECT 1 FROM fencing.leases WHERE key = 'revival' FOR UPDATE", &[]).await.unwrap();
                let _ = tokio::task::spawn_blocking(move || released.recv()).await;
                lock.rollback().await.unwrap();
            });
        });
        let observer = db.connect().await;
        let mut waiting = false;
        for _ in 0..2000 {
            waiting = observer
                .query_one(
                    "SELECT count(*) > 0 FROM pg_stat_activity WHERE application_name = 'revival' AND wait_event_type = 'Lock'",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            if waiting {
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        assert!(waiting, "the renewal blocks on the row lock");
        // Let the renewal through, and keep this runtime (the elector's) from handling its
        // reply until the old deadline has passed.
        let old_deadline = leadership.deadline();
        release.send(()).unwrap();
        std::thread::sleep(old_deadline.saturating_duration_since(tokio::time::Instant::now()) + Duration::from_millis(200));
        locker.join().unwrap();

        let lost = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                match events.recv().await {
                    Ok(Event::Lost { term: lost, reason }) => return (lost, reason),
                    Ok(_) => {}
                    Err(error) => panic!("events: {error}"),
                }
            }
        })
        .await
        .expect("the elector reports the loss of the period whose deadline passed");
        assert_eq!(lost, (term, LossReason::DeadlinePassed));
        assert!(!leadership.is_valid(), "the ended period came back");
        assert!(handle.current_term() != Some(term), "leading again with the same term");
        handle.shutdown().await;
    });
}

fn elector_with_value(db: &TestDb, key: &str, owner: &str, value: &serde_json::Value) -> ElectorHandle {
    builder(db, key, owner).value(value).build().unwrap().start()
}

/// Proclaim and observe in the library: each period starts with the value its elector was built
/// with, `set_value` changes it during the period, anyone finds the leader and its value with
/// `observe`; an elector whose period ended (here by an operator's forced release) gets
/// `NotLeader` and changes nothing, and the next leader's period shows its own value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_period_carries_its_leaders_value_and_a_lost_leader_cannot_change_the_next_ones() {
    use fencing_election::observe;
    use serde_json::json;

    let db = TestDb::new().await;
    let client = db.connect().await;
    let reader = pool(&db.url());
    let a = elector_with_value(&db, "proclaimed", "a", &json!({"addr": "a:7000"}));
    let (_, term_a) = sole_leader(std::slice::from_ref(&a)).await;
    let seen = observe(&reader, "proclaimed", QUERY_TIMEOUT).await.unwrap().expect("a leads");
    assert_eq!((seen.term, seen.value), (term_a, Some(json!({"addr": "a:7000"}))));
    assert!(seen.owner.starts_with("a#"), "{}", seen.owner);
    a.set_value(&json!({"addr": "a:7001"})).await.unwrap();
    let seen = observe(&reader, "proclaimed", QUERY_TIMEOUT).await.unwrap().expect("a leads");
    assert_eq!(seen.value, Some(json!({"addr": "a:7001"})));
    let big = json!("x".repeat(5000));
    assert!(matches!(a.set_value(&big).await, Err(Error::InvalidSetting(_))));

    // An operator ends a's period; b, waiting, takes over with its own value.
    let b = elector_with_value(&db, "proclaimed", "b", &json!({"addr": "b:7000"}));
    store::force_release(&client, "proclaimed", "ops", "test").await.unwrap();
    let started = tokio::time::Instant::now();
    let term_b = loop {
        if let Some(term) = b.current_term() {
            break term;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "b never took over");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(term_b > term_a);
    let started = tokio::time::Instant::now();
    while a.current_term().is_some() {
        assert!(started.elapsed() < TTL, "a still leads after its lease was released");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        matches!(a.set_value(&json!({"addr": "zombie"})).await, Err(Error::NotLeader { .. })),
        "a lost leader sets nothing"
    );
    let seen = observe(&reader, "proclaimed", QUERY_TIMEOUT).await.unwrap().expect("b leads");
    assert_eq!((seen.term, seen.value), (term_b, Some(json!({"addr": "b:7000"}))));
    b.shutdown().await;
    assert_eq!(observe(&reader, "proclaimed", QUERY_TIMEOUT).await.unwrap(), None, "released: nobody leads");
    a.shutdown().await;
}

/// `fencing_election::watch` as streams: a lease watch woken by LISTEN sees each elector's
/// term with its value, the release at shutdown and the next term, in revision order; a members
/// watch sees a join and a leave. The first state comes at once; each later one only on a
/// change (a renewal is none).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_streams_see_each_term_release_join_and_leave_in_order() {
    use fencing_election::watch::{LeaseWatch, MembersWatch, Wakeups};
    use futures::StreamExt;

    let db = TestDb::new().await;
    let shutdown = tokio_util::sync::CancellationToken::new();
    let wakeups = Wakeups::listen(db.url().parse().unwrap(), NoTls, shutdown.clone());
    for _ in 0..100 {
        if wakeups.listening() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(wakeups.listening());
    let mut leases = LeaseWatch::new(pool(&db.url()), "watched", wakeups.clone()).into_stream().boxed();
    let first = tokio::time::timeout(Duration::from_secs(5), leases.next()).await.unwrap().unwrap().unwrap();
    assert_eq!((first.revision, first.state), (0, None), "a key never acquired, at once");

    let next = async |leases: &mut futures::stream::BoxStream<'_, _>| {
        let item: Result<fencing_election::watch::Observed<Option<store::LeaseState>>, Error> =
            tokio::time::timeout(Duration::from_secs(5), leases.next()).await.unwrap().unwrap();
        item.unwrap()
    };
    let a = builder(&db, "watched", "a").value(&serde_json::json!({"addr": "a:1"})).build().unwrap().start();
    let mut seen = vec![];
    // Held by a, with its value (set right after the acquire: one or two states).
    loop {
        let state = next(&mut leases).await;
        seen.push(state.revision);
        let row = state.state.unwrap().lease;
        assert!(row.owner.starts_with("a#") && row.term == 1, "{row:?}");
        if row.value.is_some() {
            break;
        }
    }
    // Renewals are no change: nothing for two renew periods.
    assert!(tokio::time::timeout(RENEW * 2, leases.next()).await.is_err(), "a renewal is no change");
    a.shutdown().await;
    let released = next(&mut leases).await;
    assert!(released.state.as_ref().is_some_and(|row| row.lease.remaining.is_zero() && row.lease.term == 1));
    seen.push(released.revision);
    let b = elector(&db, "watched", "b");
    let taken = next(&mut leases).await;
    assert!(
        taken.state.as_ref().is_some_and(|row| row.lease.owner.starts_with("b#") && row.lease.term == 2),
        "{taken:?}"
    );
    seen.push(taken.revision);
    for pair in seen.windows(2) {
        assert!(pair[1] > pair[0], "revisions only grow: {seen:?}");
    }
    b.shutdown().await;

    let client = db.connect().await;
    let mut members = MembersWatch::new(pool(&db.url()), "crew", wakeups.clone());
    assert!(members.next().await.unwrap().state.is_empty());
    assert!(store::heartbeat(&client, ("crew", "n1", "i1"), "n1", Duration::from_secs(60), "{}").await.unwrap().ok);
    let joined = tokio::time::timeout(Duration::from_secs(5), members.next()).await.unwrap().unwrap();
    assert_eq!(joined.state.iter().map(|m| m.node_id.as_str()).collect::<Vec<_>>(), ["n1"]);
    assert!(store::leave(&client, "crew", "n1", "i1").await.unwrap());
    let left = tokio::time::timeout(Duration::from_secs(5), members.next()).await.unwrap().unwrap();
    assert!(left.state.is_empty() && left.revision > joined.revision);
    shutdown.cancel();
}

/// How a handover is made in [`handover_gap`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Handover {
    /// `fencing.request_resign` naming the successor (graceful handover).
    Request,
    /// `fencing.force_release`, as `admin release-lease` does.
    ReleaseLease,
}

/// Two electors, `a` leading and `b` following, each writing a record (term, instant) every
/// 2 ms while `leadership.check()` passes; the lease is handed over `how`. Returns the time from
/// a's last record of its term to b's first record of the next, negative (as `Err`) when a
/// still wrote after b began.
async fn handover_gap(how: Handover, wakeups: bool) -> (Result<Duration, Duration>, Duration) {
    use fencing_election::watch::Wakeups;
    let db = TestDb::new().await;
    let shutdown = tokio_util::sync::CancellationToken::new();
    let records = Arc::new(std::sync::Mutex::new(Vec::<(i64, tokio::time::Instant)>::new()));
    let start = |owner: &str| {
        let mut builder = builder(&db, "handover", owner).retry_interval(Duration::from_millis(900));
        if wakeups {
            builder = builder.wakeups(Wakeups::listen(db.url().parse().unwrap(), NoTls, shutdown.clone()));
        }
        let handle = builder.build().unwrap().start();
        let records = Arc::clone(&records);
        handle.spawn_leader_work(move |leadership| {
            let records = Arc::clone(&records);
            async move {
                while let Ok(term) = leadership.check() {
                    records.lock().unwrap().push((term, tokio::time::Instant::now()));
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }
        });
        handle
    };
    let a = start("a");
    let (_, term) = sole_leader(std::slice::from_ref(&a)).await;
    let b = start("b");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let client = db.connect().await;
    let asked = tokio::time::Instant::now();
    match how {
        Handover::Request => {
            assert_eq!(
                store::request_resign(&client, "handover", ("ops", "deploy"), Some("b"), None).await.unwrap(),
                Some(term)
            );
        }
        Handover::ReleaseLease => {
            store::force_release(&client, "handover", "ops", "test").await.unwrap();
        }
    }
    for _ in 0..200 {
        if records.lock().unwrap().iter().filter(|(t, _)| *t == term + 1).count() >= 20 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    a.shutdown().await;
    b.shutdown().await;
    shutdown.cancel();
    let records = records.lock().unwrap().clone();
    let last_a = records.iter().filter(|(t, _)| *t == term).map(|(_, at)| *at).max().unwrap();
    let first_b = records.iter().filter(|(t, _)| *t == term + 1).map(|(_, at)| *at).min().unwrap();
    let gap = if first_b >= last_a { Ok(first_b - last_a) } else { Err(last_a - first_b) };
    (gap, first_b.saturating_duration_since(asked))
}

/// The handover gap, measured: the last write of term t to the first write of term t+1, for a
/// graceful handover (with and without wake-ups) and for `admin release-lease` today. A
/// graceful handover never overlaps the two terms (the old leader stops before it releases);
/// the figures are printed for the README.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handover_gap_graceful_against_release_lease() {
    let mut report = Vec::new();
    for (how, wakeups) in [
        (Handover::Request, true),
        (Handover::Request, false),
        (Handover::ReleaseLease, false),
        (Handover::ReleaseLease, true),
    ] {
        let (gap, since_asked) = handover_gap(how, wakeups).await;
        println!(
            "handover gap: {how:?}, wake-ups {wakeups}: {gap:?} (Err: the old term still wrote that long after the \
             new one began); the new term's first write {since_asked:?} after the request"
        );
        report.push((how, wakeups, gap));
    }
    for (how, wakeups, gap) in report {
        if how == Handover::Request {
            let gap = gap.unwrap_or_else(|overlap| panic!("a graceful handover overlapped terms by {overlap:?}"));
            assert!(gap < TTL, "the successor began {gap:?} after the old leader's last write (wake-ups {wakeups})");
        }
    }
}
