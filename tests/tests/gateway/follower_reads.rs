//! Reads within a lag bound (`[routes.reads]`), with real processes: three followers of a
//! fenced log (the election example, each serving reads of its projection and announcing its
//! `read_url` in its membership metadata), a leader that appends, and the gateway routing reads.
//!
//! What must hold, checked on every read, not on averages:
//! - a read a follower serves is within the bound: every entry whose append returned more than
//!   `max_lag_ms` before the read was sent is in the follower's projection (the follower's answer
//!   says the last sequence it applied);
//! - a follower that falls behind (one that applies slowly) serves nothing once behind;
//! - a paused follower (SIGSTOP) serves no read sent `max_lag_ms` after its pause, and those reads
//!   all succeed, from the other follower or the leader; with both fast followers paused, from the
//!   leader (the lease holder's `read_url`);
//! - a member announcing a host outside `allow_hosts` never gets a read, however fresh its reports;
//! - a member that reports often but never applies (its lag grows) never gets a read;
//! - two members claiming one follower name never get a read, however fresh that name's reports;
//! - with no follower within the bound and no leader, a read gets 503 `no-reader`.
//!
//! A pause's phase starts at the follower's last report as the store stamped it (a report in
//! flight when SIGSTOP came is stamped after it), plus the bound.

use std::sync::Arc;
use std::time::Duration;

use fencing_schema::log::{self as store_log, Retention};
use fencing_schema::store;
use fencing_tests::gateway::{Gateway, Reply, Upstream, send};
use fencing_tests::pg::TestDb;
use fencing_tests::process::{ElectorProcess, Timing, event};
use http::{Method, StatusCode};
use nix::sys::signal::Signal;
use tokio::sync::Mutex;
use tokio::time::Instant;

const MAX_LAG_MS: u64 = 600;

/// One read through the gateway: when it was sent, what came back.
#[derive(Debug)]
struct Read {
    sent: Instant,
    status: Option<StatusCode>,
    from: String,
    applied: i64,
    problem: String,
}

fn read_of(sent: Instant, reply: Option<Reply>) -> Read {
    match reply {
        None => Read { sent, status: None, from: String::new(), applied: -1, problem: String::new() },
        Some(reply) => Read {
            sent,
            status: Some(reply.status),
            from: reply.header("fencing-read-from").unwrap_or_default().to_owned(),
            applied: reply.json()["applied"].as_i64().unwrap_or(-1),
            problem: reply.json()["type"].as_str().unwrap_or_default().to_owned(),
        },
    }
}

/// A follower process: the example elector following "orders" as `name`, in cluster "readers",
/// serving reads on a free loopback port.
async fn follower(url: &str, dir: &std::path::Path, name: &str, extra: &[&str]) -> ElectorProcess {
    let projection = dir.join(format!("{name}.jsonl")).display().to_string();
    let mut args = vec![
        "--follow-stream",
        "orders",
        "--follower",
        name,
        "--projection",
        projection.as_str(),
        "--cluster",
        "readers",
        "--node-id",
        name,
        "--read-listen",
        "127.0.0.1:0",
        "--report-every-ms",
        "100",
    ];
    args.extend_from_slice(extra);
    let mut process = ElectorProcess::spawn_with(url, &format!("{name}-own"), name, Timing::FAST, &args).unwrap();
    process.wait_for("its read listener", |line| event(line) == "reads").await.unwrap();
    process
}

/// When the last report of `followers`, paused since `paused`, was stamped by the store (a
/// report in flight at SIGSTOP is stamped after it): the later of that and `paused`, on this
/// process's clock.
async fn last_report(admin: &tokio_postgres::Client, followers: &[&str], paused: Instant) -> Instant {
    tokio::time::sleep(Duration::from_millis(300)).await;
    let rows = store_log::followers(admin, "orders").await.unwrap();
    // Measured by the store before the answer came: from now, it is the latest it can be (the
    // store floors it to the millisecond).
    let answered = Instant::now() + Duration::from_millis(1);
    let mut last = paused;
    for row in rows.iter().filter(|row| followers.contains(&row.follower.as_str())) {
        last = last.max(answered.checked_sub(row.reported_ago).unwrap_or(answered));
    }
    last
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_go_to_followers_within_the_bound_and_to_the_leader_when_they_are_paused_or_behind() {
    let db = TestDb::new().await;
    let admin = db.connect().await;
    store_log::create_stream(&admin, "orders", "orders-leader", Retention::default()).await.unwrap();
    let term = store::acquire(&admin, "orders-leader", "leader", Duration::from_secs(600)).await.unwrap().term.unwrap();
    // The leader serves its reads at a recording upstream; its lease value says where.
    let mut leader = Upstream::start().await.unwrap();
    let value = serde_json::json!({"read_url": leader.url()}).to_string();
    assert!(store::set_lease_value(&admin, "orders-leader", "leader", term, &value).await.unwrap());
    // A member that reports fresh and caught up, at a host the route does not allow.
    let mut rogue = Upstream::start().await.unwrap();
    let rogue_url = format!("http://localhost:{}", rogue.addr.port());
    let rogue_metadata = serde_json::json!({"read_url": rogue_url, "follower": "rogue"}).to_string();
    store::heartbeat(&admin, ("readers", "rogue", "rogue-1"), "rogue", Duration::from_secs(600), &rogue_metadata)
        .await
        .unwrap();
    // A member at an allowed host that reports often and never applies: entry 1, appended now,
    // is more than a bound old before the gateway's first poll.
    let mut laggard = Upstream::start().await.unwrap();
    let laggard_metadata = serde_json::json!({"read_url": laggard.url(), "follower": "laggard"}).to_string();
    store::heartbeat(&admin, ("readers", "laggard", "l-1"), "laggard", Duration::from_secs(600), &laggard_metadata)
        .await
        .unwrap();
    store_log::append(&admin, "orders", term, &["{\"n\": \"first\"}"]).await.unwrap();
    store_log::report_position(&admin, "orders", "laggard", 0).await.unwrap();
    // Two members that claim one follower name, whose reports are fresh and caught up.
    let mut twins = Vec::new();
    for twin in ["twin-a", "twin-b"] {
        let upstream = Upstream::start().await.unwrap();
        let metadata = serde_json::json!({"read_url": upstream.url(), "follower": "twin"}).to_string();
        store::heartbeat(&admin, ("readers", twin, "t-1"), twin, Duration::from_secs(600), &metadata).await.unwrap();
        twins.push(upstream);
    }
    tokio::time::sleep(Duration::from_millis(MAX_LAG_MS + 100)).await;

    let config = format!(
        r#"
[upstream]
forward_timeout_ms = 1000
[[routes]]
prefix = "/orders"
upstream = "http://127.0.0.1:1"
resource = {{ fixed = "orders" }}
[routes.reads]
cluster = "readers"
stream = "orders"
max_lag_ms = {MAX_LAG_MS}
leader_lease = "orders-leader"
allow_hosts = ["127.0.0.1"]
"#
    );
    let gateway = Gateway::start(&db.url(), &config).await.unwrap();
    let proxy = gateway.proxy;

    let dir = std::env::temp_dir().join(format!("fencing-follower-reads-{}-{}", std::process::id(), db.name));
    std::fs::create_dir_all(&dir).unwrap();
    let url = db.url();
    let f1 = follower(&url, &dir, "f1", &[]).await;
    let f2 = follower(&url, &dir, "f2", &[]).await;
    // f3 applies one entry per 150 ms while the leader appends one per 20 ms: it falls behind.
    let f3 = follower(&url, &dir, "f3", &["--apply-delay-ms", "150"]).await;

    // The leader appends every 20 ms and records when each append returned; the rogue reports
    // itself caught up after each.
    let appended: Arc<Mutex<Vec<(i64, Instant)>>> = Arc::default();
    let appending = {
        let (appended, client) = (Arc::clone(&appended), db.connect().await);
        tokio::spawn(async move {
            for n in 0.. {
                let Ok(seq) = store_log::append(&client, "orders", term, &[&format!("{{\"n\": {n}}}")]).await else {
                    return;
                };
                appended.lock().await.push((seq, Instant::now()));
                for caught_up in ["rogue", "twin"] {
                    let _ = store_log::report_position(&client, "orders", caught_up, seq).await;
                }
                let _ = store_log::report_position(&client, "orders", "laggard", 0).await;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    // Reads every 10 ms, each with its own timeout, recorded as sent.
    let reads: Arc<Mutex<Vec<Read>>> = Arc::default();
    let reading = {
        let reads = Arc::clone(&reads);
        tokio::spawn(async move {
            loop {
                let reads = Arc::clone(&reads);
                tokio::spawn(async move {
                    let sent = Instant::now();
                    let reply = tokio::time::timeout(
                        Duration::from_secs(5),
                        send(proxy, Method::GET, "/orders/state", &[], ""),
                    )
                    .await
                    .ok()
                    .and_then(Result::ok);
                    reads.lock().await.push(read_of(sent, reply));
                });
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    let wait_until = async |what: &str, done: &dyn Fn(&[Read]) -> bool| {
        for _ in 0..200 {
            if done(&reads.lock().await) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("{what} within 20 s");
    };
    let served_by = |reads: &[Read], from: &str, after: Instant| {
        reads.iter().filter(|read| read.sent >= after && read.from == from).count()
    };

    // Both fast followers serve reads.
    let start = Instant::now();
    wait_until("f1 and f2 serve reads", &|reads| {
        served_by(reads, "follower f1", start) > 5 && served_by(reads, "follower f2", start) > 5
    })
    .await;
    // f3 is far behind by now (its lag, by the store, well over the bound).
    let mut behind = false;
    for _ in 0..200 {
        let rows = store_log::followers(&admin, "orders").await.unwrap();
        behind = rows
            .iter()
            .any(|row| row.follower == "f3" && row.lag.is_some_and(|lag| lag > Duration::from_millis(3 * MAX_LAG_MS)));
        if behind {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(behind, "f3 falls behind within 20 s");
    let f3_behind = Instant::now();
    tokio::time::sleep(Duration::from_millis(1500)).await;

    // f1 paused: no read sent one bound later goes to it, and every such read succeeds.
    f1.signal(Signal::SIGSTOP).unwrap();
    let f1_paused = last_report(&admin, &["f1"], Instant::now()).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    // Both fast followers paused: reads go to the leader.
    // A read sent shortly before the signal may reach f2 after it and wait for it: f1's phase
    // vouches for the reads sent until 300 ms before (ample time to serve one here).
    let f2_pausing = Instant::now() - Duration::from_millis(300);
    f2.signal(Signal::SIGSTOP).unwrap();
    let f2_paused = last_report(&admin, &["f2"], Instant::now()).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    f1.signal(Signal::SIGCONT).unwrap();
    f2.signal(Signal::SIGCONT).unwrap();
    let resumed = Instant::now();
    wait_until("f1 and f2 serve reads again after SIGCONT", &|reads| {
        served_by(reads, "follower f1", resumed) > 5 && served_by(reads, "follower f2", resumed) > 5
    })
    .await;

    // No leader and no follower within the bound: 503 no-reader.
    appending.abort();
    store::force_release(&admin, "orders-leader", "test", "the leader is gone").await.unwrap();
    for process in [&f1, &f2, &f3] {
        process.signal(Signal::SIGSTOP).unwrap();
    }
    let all_paused = last_report(&admin, &["f1", "f2", "f3"], Instant::now()).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    reading.abort();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    for process in [&f1, &f2, &f3] {
        process.signal(Signal::SIGCONT).unwrap();
    }

    let reads = reads.lock().await;
    let appended = appended.lock().await;
    let bound = Duration::from_millis(MAX_LAG_MS);
    let mut from_followers = 0;
    for read in reads.iter() {
        // Within the bound: every entry appended more than a bound before the read was sent is
        // in the serving follower's projection.
        if read.from.starts_with("follower ") && read.status == Some(StatusCode::OK) {
            from_followers += 1;
            let required = appended
                .iter()
                .filter(|(_, returned)| read.sent.checked_duration_since(*returned).is_some_and(|age| age > bound))
                .map(|(seq, _)| *seq)
                .max()
                .unwrap_or(0);
            assert!(
                read.applied >= required,
                "{} served a read with {} applied, but entry {required} was appended more than {MAX_LAG_MS} ms before it \
                 was sent",
                read.from,
                read.applied
            );
        }
        let in_phase = |from: Instant, to: Instant| read.sent >= from + bound && read.sent < to;
        if in_phase(f3_behind, all_paused) {
            assert_ne!(read.from, "follower f3", "f3 is far behind, yet served a read");
        }
        if in_phase(f1_paused, resumed) {
            assert_ne!(read.from, "follower f1", "paused f1 was sent a read a bound after its pause: {read:?}");
        }
        if in_phase(f1_paused, f2_pausing) {
            assert_eq!(
                read.status,
                Some(StatusCode::OK),
                "a read one bound after f1's pause failed: {read:?}, sent {:?} after the pause",
                read.sent - f1_paused
            );
        }
        if in_phase(f2_paused, resumed) {
            assert_eq!(read.status, Some(StatusCode::OK), "a read one bound after f2's pause failed: {read:?}");
            assert_eq!(read.from, "leader", "both fast followers are paused: the leader serves {read:?}");
        }
        if in_phase(all_paused, all_paused + Duration::from_millis(1500)) {
            assert_eq!(read.status, Some(StatusCode::SERVICE_UNAVAILABLE), "{read:?}");
            assert!(read.problem.ends_with(":no-reader"), "{read:?}");
        }
        assert_ne!(read.from, "follower rogue", "a read went to a host outside allow_hosts");
        assert_ne!(read.from, "follower laggard", "a read went to a follower that never applies");
        assert_ne!(read.from, "follower twin", "a read went to a follower name two members claim");
    }
    assert!(from_followers > 100, "followers served {from_followers} reads");
    assert!(
        served_by(&reads, "leader", f2_paused + bound) > 50,
        "the leader served the reads while f1 and f2 were paused"
    );
    let leader_log = leader.collect(Duration::from_millis(100)).await.len();
    assert!(leader_log > 50, "the leader's upstream saw {leader_log} reads");
    assert!(rogue.collect(Duration::from_millis(100)).await.is_empty(), "the rogue member's upstream got a read");
    assert!(laggard.collect(Duration::from_millis(10)).await.is_empty(), "the laggard's upstream got a read");
    for twin in &mut twins {
        assert!(twin.collect(Duration::from_millis(10)).await.is_empty(), "a twin's upstream got a read");
    }
    assert!(
        reads
            .iter()
            .filter(|read| read.sent >= all_paused + bound && read.sent < all_paused + Duration::from_millis(1500))
            .count()
            > 20,
        "reads were sent while nothing could serve them"
    );
    drop((reads, appended));
    for mut process in [f1, f2, f3] {
        process.signal(Signal::SIGTERM).unwrap();
        process.wait_for("shutdown", |line| event(line) == "shutdown").await.unwrap();
    }
    std::fs::remove_dir_all(&dir).ok();
}
