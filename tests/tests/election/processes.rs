//! The example elector as real processes: killed, paused, cut off from the store, shut down.

use std::time::{Duration, SystemTime};

use fencing_schema::store;
use fencing_tests::pg::{PgCluster, TestDb, connect};
use fencing_tests::process::{ElectorProcess, Timing, event, int};
use nix::sys::signal::Signal;
use serde_json::Value;
use tokio_postgres::Client;

const KEY: &str = "jobs";

async fn store_now(client: &Client) -> SystemTime {
    client.query_one("SELECT clock_timestamp()", &[]).await.unwrap().get(0)
}

/// Starts `a` first and waits until it leads, then starts `b`: returns both and a's term.
async fn leader_and_follower(url: &str, timing: Timing) -> (ElectorProcess, ElectorProcess, i64) {
    let mut a = ElectorProcess::spawn(url, KEY, "a", timing).unwrap();
    let elected = a.wait_for("elected", |l| event(l) == "elected").await.unwrap();
    let mut b = ElectorProcess::spawn(url, KEY, "b", timing).unwrap();
    b.wait_for("started", |l| event(l) == "started").await.unwrap();
    (a, b, int(&elected, "term"))
}

fn is_elected_with(term: i64) -> impl Fn(&Value) -> bool {
    move |line| event(line) == "elected" && int(line, "term") == term
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_leader_is_replaced_with_term_plus_one_within_ttl_and_one_retry_period() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    let timing = Timing::FAST;
    let (a, mut b, term) = leader_and_follower(&db.url(), timing).await;

    let killed_at = store_now(&client).await;
    a.signal(Signal::SIGKILL).unwrap();
    b.wait_for("elected with term + 1", is_elected_with(term + 1)).await.unwrap();

    let lease = store::get_lease(&client, KEY).await.unwrap().unwrap();
    assert!(lease.owner.starts_with("b#"), "{lease:?}");
    assert_eq!(lease.term, term + 1);
    // Measured on the store's clock: the new period began at most one ttl (the dead leader's
    // lease running out) plus one retry period (the follower's next attempt) after the kill,
    // plus one second for process scheduling on a loaded machine.
    let takeover = lease.acquired_at.duration_since(killed_at).unwrap_or_default();
    let bound = Duration::from_millis(timing.ttl_ms + timing.renew_ms + 1000);
    assert!(takeover <= bound, "takeover took {takeover:?}, more than {bound:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_leader_is_replaced_and_on_resume_reports_loss_without_acting_past_its_deadline() {
    let db = TestDb::new().await;
    let timing = Timing::FAST;
    let (mut a, mut b, term) = leader_and_follower(&db.url(), timing).await;
    a.wait_for("a tick", |l| event(l) == "tick").await.unwrap();

    a.signal(Signal::SIGSTOP).unwrap();
    let elected = b.wait_for("b elected", |l| event(l) == "elected").await.unwrap();
    let new_term = int(&elected, "term");
    assert!(new_term > term, "B leads with a higher term: {new_term} after {term}");
    // Let B act as leader for a while before the zombie wakes.
    b.wait_for("b tick", |l| event(l) == "tick" && int(l, "term") == new_term).await.unwrap();
    a.signal(Signal::SIGCONT).unwrap();

    let lost = a.wait_for("a reports loss", |l| event(l) == "lost").await.unwrap();
    assert_eq!(int(&lost, "term"), term);
    let holder = a.wait_for("a sees b", |l| event(l) == "holder_changed").await.unwrap();
    assert!(holder.get("holder").and_then(Value::as_str).is_some_and(|h| h.starts_with("b#")), "{holder}");
    assert_eq!(int(&holder, "term"), new_term);

    // The zombie's own record: every tick of its term came before the deadline it held at the
    // time, that deadline is one the elector published for the term, no tick came after the
    // loss, and none came with B's term.
    let lost_index = a.seen.iter().position(|l| event(l) == "lost").unwrap();
    let published: Vec<i64> = a
        .seen
        .iter()
        .filter(|l| event(l) == "leader" && int(l, "term") == term)
        .map(|l| int(l, "deadline_ms"))
        .collect();
    let mut ticks = 0;
    for (index, line) in a.seen.iter().enumerate().filter(|(_, l)| event(l) == "tick") {
        ticks += 1;
        assert!(index < lost_index, "a tick after the loss: {line}");
        assert_eq!(int(line, "term"), term);
        let deadline = int(line, "deadline_ms");
        assert!(published.contains(&deadline), "tick {line} used a deadline never published: {published:?}");
        assert!(int(line, "at_ms") < deadline, "a tick past its deadline: {line}");
    }
    assert!(ticks > 0, "the zombie acted while it led");
    // And none since: a's work stays stopped while b leads.
    tokio::time::sleep(Duration::from_millis(3 * timing.tick_ms)).await;
    a.drain();
    assert!(a.seen[lost_index..].iter().all(|l| event(l) != "tick"), "the zombie acted after its loss");
}

/// Waits for `process` to report a loss, and checks on the store's clock that the lease it
/// lost would still have been valid: it stepped down before its lease expired at the store.
async fn steps_down_before_expiry(
    process: &mut ElectorProcess,
    expires_at: SystemTime,
    now: impl AsyncFnOnce() -> SystemTime,
    reason: &str,
) {
    let lost = process.wait_for("lost", |l| event(l) == "lost").await.unwrap();
    let observed = now().await;
    assert_eq!(lost.get("reason").and_then(Value::as_str), Some(reason), "{lost}");
    assert!(
        observed < expires_at,
        "the leader reported its loss at {observed:?}, after its lease expired at the store at {expires_at:?}"
    );
}

/// The lease's expiry as the store has it, read right after a renewal so that no renewal can
/// land between this read and the fault that follows.
async fn expiry_after_a_renewal(process: &mut ElectorProcess, client: &Client) -> SystemTime {
    process.wait_for("a renewal", |l| event(l) == "leader").await.unwrap();
    store::get_lease(client, KEY).await.unwrap().unwrap().expires_at
}

/// Fault timing with room for the test to act while a renewal is in flight.
const SLOW_QUERY: Timing = Timing { ttl_ms: 3000, renew_ms: 1000, margin_ms: 300, query_timeout_ms: 800, tick_ms: 50 };

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_whose_backend_is_terminated_mid_renewal_steps_down_before_its_lease_expires() {
    let db = TestDb::new().await;
    let mut client = db.connect().await;
    let observer = db.connect().await;
    let url = format!("{}?application_name=elector-a", db.url());
    let mut a = ElectorProcess::spawn(&url, KEY, "a", SLOW_QUERY).unwrap();
    a.wait_for("elected", |l| event(l) == "elected").await.unwrap();
    let expires_at = expiry_after_a_renewal(&mut a, &client).await;

    // The pool replaces an idle connection that died, so the backend is killed while a renewal
    // runs on it: the row is locked so the renewal waits, and its backend is then terminated.
    let lock = client.transaction().await.unwrap();
    lock.execute("SELECT 1 FROM fencing.leases WHERE key = $1 FOR UPDATE", &[&KEY]).await.unwrap();
    let mut terminated = false;
    for _ in 0..1000 {
        terminated = observer
            .query_one(
                "SELECT count(pg_terminate_backend(pid)) > 0 FROM pg_stat_activity
                  WHERE application_name = 'elector-a' AND wait_event_type = 'Lock'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if terminated {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(terminated, "the elector's renewal was found waiting and its backend terminated");
    steps_down_before_expiry(&mut a, expires_at, async || store_now(&observer).await, "renew_failed").await;
    lock.rollback().await.unwrap();
    // The store still sees A as the valid holder; A's next leadership is a new period (S2).
    let again = a.wait_for("elected again", |l| event(l) == "elected").await.unwrap();
    assert_eq!(
        int(&again, "term"),
        2,
        "re-elected after a local loss with term {}, not a new one",
        int(&again, "term")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_whose_renewal_hangs_steps_down_at_the_query_timeout_before_its_lease_expires() {
    let db = TestDb::new().await;
    let mut client = db.connect().await;
    let mut a = ElectorProcess::spawn(&db.url(), KEY, "a", Timing::FAST).unwrap();
    a.wait_for("elected", |l| event(l) == "elected").await.unwrap();

    let expires_at = expiry_after_a_renewal(&mut a, &client).await;
    let lock = client.transaction().await.unwrap();
    lock.execute("SELECT 1 FROM fencing.leases WHERE key = $1 FOR UPDATE", &[&KEY]).await.unwrap();
    let observer = db.connect().await;
    steps_down_before_expiry(&mut a, expires_at, async || store_now(&observer).await, "renew_timed_out").await;
    lock.rollback().await.unwrap();
    let again = a.wait_for("elected again", |l| event(l) == "elected").await.unwrap();
    assert_eq!(
        int(&again, "term"),
        2,
        "re-elected after a local loss with term {}, not a new one",
        int(&again, "term")
    );
    let history = store::list_history(&observer, KEY, 10).await.unwrap();
    assert_eq!(history.len(), 2, "{history:?}");
    assert_eq!(history[1].end_reason.as_deref(), Some("abandoned"), "{history:?}");
}

/// S1: one configured owner, two processes (or one restarted after SIGKILL): never one period
/// for both, never the dead incarnation's term for the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_with_one_configured_owner_never_share_a_period_and_a_restart_gets_a_new_term() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    let timing = Timing::FAST;
    let mut first = ElectorProcess::spawn(&db.url(), KEY, "same", timing).unwrap();
    let elected = first.wait_for("elected", |l| event(l) == "elected").await.unwrap();
    let term = int(&elected, "term");
    let mut second = ElectorProcess::spawn(&db.url(), KEY, "same", timing).unwrap();
    second.wait_for("started", |l| event(l) == "started").await.unwrap();
    // Two ttl: the second would have been elected with the same term by now if owners collided.
    tokio::time::sleep(Duration::from_millis(2 * timing.ttl_ms)).await;
    second.drain();
    assert!(
        second.seen.iter().all(|l| event(l) != "elected"),
        "two processes with one configured owner both led: {:?}",
        second.seen
    );
    drop(second);

    // Killed and restarted with the same owner: a new incarnation, a new period, a new term.
    first.signal(Signal::SIGKILL).unwrap();
    let mut restarted = ElectorProcess::spawn(&db.url(), KEY, "same", timing).unwrap();
    let again = restarted.wait_for("elected", |l| event(l) == "elected").await.unwrap();
    assert!(int(&again, "term") > term, "the restarted process inherited term {term}");
    let owners: Vec<String> =
        store::list_history(&client, KEY, 10).await.unwrap().into_iter().map(|p| p.owner).collect();
    assert!(owners.iter().all(|o| o.starts_with("same#")), "{owners:?}");
    let distinct: std::collections::BTreeSet<&String> = owners.iter().collect();
    assert_eq!(distinct.len(), owners.len(), "every period has an owner of its own: {owners:?}");
}

/// S1, S2 across a crash: the database commits asynchronously, yet the term granted to A survives
/// a crash of Postgres right after it, so B cannot be granted the same term beside A.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_under_asynchronous_commit_survives_a_crash_so_no_second_owner_gets_its_term() {
    let cluster = PgCluster::start_with_settings(
        fencing_tests::pg::Durability::Off,
        "synchronous_commit = off\nwal_writer_delay = 10s\n",
    )
    .unwrap();
    let admin = connect(&cluster.url("postgres")).await;
    admin.batch_execute("CREATE DATABASE electors").await.unwrap();
    let url = cluster.url("electors");
    let mut client = connect(&url).await;
    fencing_schema::migrate(&mut client).await.unwrap();
    client.batch_execute("CHECKPOINT").await.unwrap();
    let timing = Timing::FAST;
    let mut a = ElectorProcess::spawn(&url, KEY, "a", timing).unwrap();
    let elected = a.wait_for("elected", |l| event(l) == "elected").await.unwrap();
    let term = int(&elected, "term");
    cluster.crash().unwrap();
    cluster.start_server().unwrap();
    let client = connect(&url).await;
    let lease = store::get_lease(&client, KEY).await.unwrap();
    assert!(
        lease.as_ref().is_some_and(|l| l.term >= term && l.owner.starts_with("a#")),
        "A's grant of term {term} was lost in the crash: {lease:?}"
    );
    let mut b = ElectorProcess::spawn(&url, KEY, "b", timing).unwrap();
    a.signal(Signal::SIGKILL).unwrap();
    let b_elected = b.wait_for("b elected", |l| event(l) == "elected").await.unwrap();
    assert!(int(&b_elected, "term") > term, "B was granted term {} beside A's {term}", int(&b_elected, "term"));
}

/// Postgres itself stops: the leader steps down before its lease would have expired, and when
/// Postgres is back, leadership resumes without restarting anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_steps_down_when_postgres_stops_and_leadership_resumes_when_it_returns() {
    // A cluster of its own: stopping the shared one would disturb the other tests.
    let cluster = PgCluster::start().unwrap();
    let admin = connect(&cluster.url("postgres")).await;
    admin.batch_execute("CREATE DATABASE electors").await.unwrap();
    let url = cluster.url("electors");
    let mut client = connect(&url).await;
    fencing_schema::migrate(&mut client).await.unwrap();
    let (mut a, _b, _term) = leader_and_follower(&url, Timing::FAST).await;

    let expires_at = expiry_after_a_renewal(&mut a, &client).await;
    cluster.stop().unwrap();
    // With the store down, its clock is this machine's clock, which it shares.
    steps_down_before_expiry(&mut a, expires_at, async || SystemTime::now(), "renew_failed").await;

    cluster.start_server().unwrap();
    let client = connect(&url).await;
    let mut leader = None;
    for _ in 0..300 {
        if let Some(lease) = store::get_lease(&client, KEY).await.unwrap().filter(|l| !l.remaining.is_zero()) {
            leader = Some(lease);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let lease = leader.expect("someone leads again after Postgres returns");
    assert!(lease.owner.starts_with("a#") || lease.owner.starts_with("b#"), "{lease:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_releases_so_the_follower_leads_well_before_the_ttl() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    // A long lease: without the release, B would wait about 6 s.
    let timing = Timing { ttl_ms: 6000, renew_ms: 1000, margin_ms: 500, query_timeout_ms: 1000, tick_ms: 50 };
    let (mut a, mut b, term) = leader_and_follower(&db.url(), timing).await;
    let expires_at = expiry_after_a_renewal(&mut a, &client).await;

    a.signal(Signal::SIGTERM).unwrap();
    let shutdown = a.wait_for("shutdown", |l| event(l) == "shutdown").await.unwrap();
    assert_eq!(shutdown.get("released").and_then(Value::as_bool), Some(true));
    assert_eq!(a.wait_exit().await.unwrap(), Some(0));
    b.wait_for("b elected", is_elected_with(term + 1)).await.unwrap();

    let lease = store::get_lease(&client, KEY).await.unwrap().unwrap();
    assert!(lease.owner.starts_with("b#"), "{lease:?}");
    assert_eq!(lease.term, term + 1);
    let early = expires_at.duration_since(lease.acquired_at).unwrap_or_default();
    assert!(
        early >= Duration::from_millis(timing.ttl_ms / 3),
        "B took over only {early:?} before A's lease would have expired"
    );
}

#[tokio::test]
async fn elector_with_unsafe_settings_exits_64_naming_the_setting() {
    let db = TestDb::new().await;
    // Renewing after 900 ms of a 1000 ms lease cannot complete before the deadline.
    let output = tokio::process::Command::new(fencing_tests::workspace_example("elector").unwrap())
        .args(["--database-url", &db.url(), "--key", KEY, "--ttl-ms", "1000", "--renew-ms", "900"])
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(64), "stderr: {stderr}");
    assert!(stderr.contains("invalid elector setting: renew interval"), "stderr: {stderr}");
    let client = db.connect().await;
    assert!(store::get_lease(&client, KEY).await.unwrap().is_none(), "nothing was written");
}

/// An acquire that a paused elector abandoned cannot commit later: the server gives up on it
/// at the query timeout by itself (statement and lock timeouts), so no term is granted to a
/// process that is not there to use it, and takeover is not delayed by a ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_abandoned_by_a_paused_elector_never_commits_later() {
    let db = TestDb::new().await;
    let mut client = db.connect().await;
    let observer = db.connect().await;
    // The lease row exists and has expired: the next acquire would be granted term 2.
    store::acquire(&client, KEY, "old", Duration::from_millis(100)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let lock = client.transaction().await.unwrap();
    lock.execute("SELECT 1 FROM fencing.leases WHERE key = $1 FOR UPDATE", &[&KEY]).await.unwrap();

    let url = format!("{}?application_name=elector-paused", db.url());
    let mut a = ElectorProcess::spawn(&url, KEY, "a", SLOW_QUERY).unwrap();
    a.wait_for("started", |l| event(l) == "started").await.unwrap();
    let mut waiting = false;
    for _ in 0..1000 {
        waiting = observer
            .query_one(
                "SELECT count(*) > 0 FROM pg_stat_activity WHERE application_name = 'elector-paused' AND wait_event_type = 'Lock'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if waiting {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(waiting, "the elector's acquire waits on the row lock");
    a.signal(Signal::SIGSTOP).unwrap();
    tokio::time::sleep(Duration::from_millis(3 * SLOW_QUERY.query_timeout_ms)).await;
    lock.rollback().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let lease = store::get_lease(&observer, KEY).await.unwrap().unwrap();
    assert!(!lease.owner.starts_with("a#"), "the paused elector's abandoned acquire committed later: {lease:?}");
    a.signal(Signal::SIGKILL).unwrap();
}

/// A follower exports the election series at 0 from start-up, not nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_exports_every_election_series_at_zero_from_start_up() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    store::acquire(&client, KEY, "someone-else", Duration::from_secs(60)).await.unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen = format!("127.0.0.1:{port}");
    let mut b = ElectorProcess::spawn_with(&db.url(), KEY, "b", Timing::FAST, &["--metrics-listen", &listen]).unwrap();
    b.wait_for("started", |l| event(l) == "started").await.unwrap();
    let mut text = String::new();
    for _ in 0..100 {
        if let Ok(reply) =
            fencing_tests::gateway::send(listen.parse().unwrap(), http::Method::GET, "/metrics", &[], "").await
        {
            text = String::from_utf8_lossy(&reply.body).into_owned();
            if text.contains("election_is_leader") {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for series in [
        "election_is_leader{key=\"jobs\"} 0",
        "election_term{key=\"jobs\"} 0",
        "election_renew_failures_total{key=\"jobs\"} 0",
        "election_resignations_total{key=\"jobs\"} 0",
        "election_lease_remaining_seconds{key=\"jobs\"} 0",
    ] {
        assert!(text.lines().any(|l| l == series), "missing {series:?} in:\n{text}");
    }
}

/// Three elector processes that are also nodes of one cluster: every node hears the other two
/// join; a killed node is heard leaving by the others within its registration ttl plus one
/// heartbeat (measured on the store's clock from the kill); a node paused past its ttl is heard
/// leaving, and after it resumes, joining again as a new incarnation (a later `started_ms`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn member_processes_hear_a_killed_node_leave_and_a_paused_one_come_back_as_a_new_incarnation() {
    const HEARTBEAT_MS: u64 = 300;
    const TTL_MS: u64 = 1500;
    let db = TestDb::new().await;
    let client = db.connect().await;
    let node = |id: &str| {
        let flags = ["--cluster", "workers", "--node-id", id, "--heartbeat-ms", "300", "--registration-ttl-ms", "1500"];
        ElectorProcess::spawn_with(&db.url(), KEY, id, Timing::FAST, &flags).unwrap()
    };
    let (mut n1, mut n2, mut n3) = (node("n1"), node("n2"), node("n3"));
    let joined = |id: &'static str| move |line: &Value| event(line) == "node_joined" && line["node"] == id;
    let left = |id: &'static str| move |line: &Value| event(line) == "node_left" && line["node"] == id;
    let mut n2_start = 0;
    for process in [&mut n1, &mut n2, &mut n3] {
        let mut heard = std::collections::BTreeSet::new();
        while heard.len() < 3 {
            let line = process.wait_for("three joins", |line| event(line) == "node_joined").await.unwrap();
            if line["node"] == "n2" {
                n2_start = int(&line, "started_ms");
            }
            heard.insert(line["node"].as_str().unwrap_or_default().to_owned());
        }
    }

    let killed_at = store_now(&client).await;
    n3.signal(Signal::SIGKILL).unwrap();
    for process in [&mut n1, &mut n2] {
        process.wait_for("n3 left", left("n3")).await.unwrap();
    }
    // Heard by then on the store's clock: the row expired at most one ttl after the kill (its
    // last heartbeat came before it), and each observer reads once per heartbeat; plus a second
    // for scheduling on a loaded machine.
    let heard = store_now(&client).await.duration_since(killed_at).unwrap_or_default();
    let bound = Duration::from_millis(TTL_MS + HEARTBEAT_MS + 1000);
    assert!(heard <= bound, "n3's leave was heard {heard:?} after the kill, more than {bound:?}");

    // Paused past its ttl: heard leaving; resumed: a new incarnation, heard joining.
    n2.signal(Signal::SIGSTOP).unwrap();
    n1.wait_for("n2 left", left("n2")).await.unwrap();
    n2.signal(Signal::SIGCONT).unwrap();
    let back = n1.wait_for("n2 back", joined("n2")).await.unwrap();
    assert!(int(&back, "started_ms") > n2_start, "n2 came back as a new incarnation: {back} after {n2_start}");
    let members = store::members(&client, "workers").await.unwrap();
    let ids: Vec<&str> = members.iter().map(|member| member.node_id.as_str()).collect();
    assert_eq!(ids, ["n1", "n2"]);
}

/// Lock-delay with real processes: the leader is SIGKILLed, so its period ends by expiry, not by
/// a release; the follower gets the next term only once the key's lock-delay has passed since
/// that expiry (on the store's clock), so the dead leader's last writes to a resource that cannot
/// check tokens land first. Without the delay it would take over at the expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leaders_successor_waits_out_the_keys_lock_delay_after_the_expiry() {
    const DELAY: Duration = Duration::from_millis(1500);
    let db = TestDb::new().await;
    let client = db.connect().await;
    store::set_lock_delay(&client, Some(KEY), Some(DELAY), "ops", "test").await.unwrap();
    let timing = Timing::FAST;
    let (a, mut b, term) = leader_and_follower(&db.url(), timing).await;

    a.signal(Signal::SIGKILL).unwrap();
    b.wait_for("elected with term + 1", is_elected_with(term + 1)).await.unwrap();

    let lease = store::get_lease(&client, KEY).await.unwrap().unwrap();
    assert!(lease.owner.starts_with("b#"), "{lease:?}");
    let ended: SystemTime = client
        .query_one("SELECT ended_at FROM fencing.lease_history WHERE key = $1 AND term = $2", &[&KEY, &term])
        .await
        .unwrap()
        .get(0);
    let reason = fencing_tests::end_reason(&client, KEY, term).await.unwrap_or_default();
    assert_eq!(reason, "expired");
    let gap = lease.acquired_at.duration_since(ended).unwrap_or_default();
    assert!(gap >= DELAY, "the next term began {gap:?} after the dead leader's lease expired, within its lock-delay");
}

/// Graceful handover (schema version 14): a request naming `c` reaches the leader `a` at its
/// next renewal; `a` reports the loss as `resigned`, drains and releases (history: handed over),
/// and `c`, not the follower `b` that was there first, leads with the next term.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handover_request_makes_the_leader_step_down_and_the_named_successor_lead() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    let timing = Timing::FAST;
    let (mut a, mut b, term) = leader_and_follower(&db.url(), timing).await;
    let mut c = ElectorProcess::spawn(&db.url(), KEY, "c", timing).unwrap();
    c.wait_for("started", |l| event(l) == "started").await.unwrap();

    assert_eq!(store::request_resign(&client, KEY, ("ops", "deploy"), Some("c"), None).await.unwrap(), Some(term));
    let lost = a.wait_for("lost", |l| event(l) == "lost").await.unwrap();
    assert_eq!((int(&lost, "term"), lost["reason"].as_str()), (term, Some("resigned")), "{lost}");
    c.wait_for("elected with term + 1", is_elected_with(term + 1)).await.unwrap();
    let lease = store::get_lease(&client, KEY).await.unwrap().unwrap();
    assert!(lease.owner.starts_with("c#") && lease.term == term + 1, "{lease:?}");
    let reason = fencing_tests::end_reason(&client, KEY, term).await.unwrap_or_default();
    assert_eq!(reason, "handed_over");
    // b never led: the next term was reserved for c.
    b.drain();
    assert!(!b.seen.iter().any(|l| event(l) == "elected"), "b led: {:?}", b.seen);
}

/// A paused leader cannot hear a handover request: `admin handover --to b --force-after-ms`
/// waits, then ends its period (never a later term's), and `b` leads with the next term.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_leader_that_cannot_hand_over_is_forced_after_the_timeout() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    // A lease long enough that it does not run out by itself while the handover waits.
    let timing = Timing { ttl_ms: 8000, renew_ms: 2500, margin_ms: 300, query_timeout_ms: 500, tick_ms: 50 };
    let (a, mut b, term) = leader_and_follower(&db.url(), timing).await;
    a.signal(Signal::SIGSTOP).unwrap();
    let output = tokio::process::Command::new(fencing_tests::workspace_bin("fencing-gateway").unwrap())
        .args(["admin", "handover", KEY, "--to", "b", "--force-after-ms", "1000", "--reason", "deploy", "--yes"])
        .args(["--database-url", &db.url()])
        .output()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{text}{}", String::from_utf8_lossy(&output.stderr));
    assert!(text.contains("did not step down within 1000 ms"), "{text}");
    b.wait_for("elected with term + 1", is_elected_with(term + 1)).await.unwrap();
    let reason = fencing_tests::end_reason(&client, KEY, term).await.unwrap_or_default();
    assert_eq!(reason, "force_released");
    let actions = fencing_tests::audit_actions(&client, KEY).await;
    assert_eq!(actions, ["request_resign", "force_release"]);
    // Resumed, the old leader hears its period is over at its next renewal.
    a.signal(Signal::SIGCONT).unwrap();
    let mut a = a;
    let lost = a.wait_for("lost", |l| event(l) == "lost").await.unwrap();
    assert_eq!(int(&lost, "term"), term, "{lost}");
}
