//! Failover of the fence store mid-load (issue 25, item 5): a primary with a synchronous standby,
//! two gateway processes (one holding grants of 400 ms, one asking Postgres for every write) on a
//! multi-host URL with `target_session_attrs=read-write`, writers presenting rising and stale
//! terms on unbound resources, and a leader taking new terms of a bound lease through the
//! control API. The primary is killed (SIGQUIT to its postmaster) and, a second later, the
//! standby is promoted; the load goes on throughout.
//!
//! What must hold across the failover: S2 (every answered term is on the new primary, terms only
//! grow), S3 (no write of a term below one already admitted is admitted), S4 (a bound resource
//! admits only its lease's current term), S5 (the upstream sees each resource's terms in order),
//! S6 (a write the gateway could not decide is 503, never forwarded). The test prints the
//! timeline: the 503s, the writes a grant admitted while Postgres was down, and how long each
//! gateway took to admit again after the promotion.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use http::{Method, StatusCode};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::Mutex;
use tokio::time::Instant;

use fencing_tests::gateway::{Gateway, JSON, Upstream, send};
use fencing_tests::pg::{PgCluster, Replication, SUPERUSER, TestDb, connect};

const WRITERS: usize = 4;
const UNBOUND: usize = 2;
const LOAD: Duration = Duration::from_secs(7);
const CRASH_AT: Duration = Duration::from_millis(1500);
const DOWN_FOR: Duration = Duration::from_secs(1);
/// Unbound writers present `1 + elapsed / EPOCH`, or one less (a stale writer).
const EPOCH: Duration = Duration::from_millis(300);

/// One write as its client saw it.
#[derive(Debug, Clone)]
struct Write {
    id: String,
    gateway: usize,
    resource: String,
    term: i64,
    sent: Instant,
    answered: Instant,
    status: StatusCode,
}

/// One acquire of the bound lease that was answered with a term.
#[derive(Debug, Clone, Copy)]
struct Acquired {
    term: i64,
    answered: Instant,
}

fn config(upstream: &str, grant_ms: u64) -> String {
    config_with(upstream, grant_ms, "")
}

fn config_with(upstream: &str, grant_ms: u64, database: &str) -> String {
    format!(
        "[upstream]\nforward_timeout_ms = 1000\n\
         [database]\nfence_check_timeout_ms = 1000\ngrant_ms = {grant_ms}\n{database}\n\
         [[routes]]\nprefix = \"/free\"\nupstream = \"{upstream}\"\nresource = {{ segment = 2 }}\n\
         [[routes]]\nprefix = \"/ledger\"\nupstream = \"{upstream}\"\nresource = {{ segment = 2 }}\nlease = \"writer\"\n"
    )
}

async fn write(
    gateways: &[std::net::SocketAddr],
    gateway: usize,
    path: &str,
    resource: &str,
    term: i64,
    id: String,
) -> Write {
    let sent = Instant::now();
    let status = match send(
        gateways[gateway],
        Method::PUT,
        path,
        &[("fencing-token", &term.to_string()), ("x-request-id", &id)],
        "",
    )
    .await
    {
        Ok(reply) => reply.status,
        Err(error) => panic!("{id}: no answer from gateway {gateway}: {error:#}"),
    };
    Write { id, gateway, resource: resource.to_owned(), term, sent, answered: Instant::now(), status }
}

/// A primary with a migrated database `failover`, a synchronous standby of it, and the
/// multi-host URL that follows whichever of the two is primary.
async fn primary_and_synchronous_standby() -> (PgCluster, PgCluster, String) {
    let primary = PgCluster::start().unwrap();
    primary.psql("CREATE DATABASE failover").unwrap();
    let mut client = connect(&primary.url("failover")).await;
    fencing_schema::migrate(&mut client).await.unwrap();
    drop(client);
    let standby = tokio::task::block_in_place(|| primary.start_standby(Replication::Synchronous)).unwrap();
    let url = format!(
        "postgres://{SUPERUSER}@127.0.0.1:{},127.0.0.1:{}/failover?target_session_attrs=read-write",
        primary.port(),
        standby.port()
    );
    (primary, standby, url)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s2_to_s6_hold_while_the_primary_is_killed_and_a_synchronous_standby_promoted_mid_load() {
    let (primary, standby, url) = primary_and_synchronous_standby().await;
    let mut upstream = Upstream::start().await.unwrap();
    let granting = Gateway::start(&url, &config(&upstream.url(), 400)).await.unwrap();
    let asking = Gateway::start(&url, &config(&upstream.url(), 0)).await.unwrap();
    let proxies = vec![granting.proxy, asking.proxy];
    let controls = vec![granting.control, asking.control];
    let seed: u64 = rand::random();
    println!("failover seed: {seed}");

    let start = Instant::now();
    let writes = Arc::new(Mutex::new(Vec::<Write>::new()));
    let acquired = Arc::new(Mutex::new(Vec::<Acquired>::new()));
    let mut tasks = Vec::new();
    for writer in 0..WRITERS {
        let (proxies, writes) = (proxies.clone(), Arc::clone(&writes));
        tasks.push(tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(seed ^ writer as u64);
            let mut n = 0;
            while start.elapsed() < LOAD {
                let epoch = i64::try_from(start.elapsed().as_millis() / EPOCH.as_millis()).unwrap_or(0);
                let term = 1 + epoch - i64::from(rng.random_bool(0.3) && epoch > 0);
                let resource = format!("free-{}", writer % UNBOUND);
                let gateway = rng.random_range(0..proxies.len());
                let id = format!("w{writer}-{n}");
                n += 1;
                let done = write(&proxies, gateway, &format!("/free/{resource}/x"), &resource, term, id).await;
                writes.lock().await.push(done);
                tokio::time::sleep(Duration::from_millis(rng.random_range(0..10))).await;
            }
        }));
    }
    // A steady writer per gateway: term 1 on a resource of its own, so that the granting gateway
    // holds a grant when the primary dies, and recovery is seen where no new term is needed.
    for gateway in 0..proxies.len() {
        let (proxies, writes) = (proxies.clone(), Arc::clone(&writes));
        tasks.push(tokio::spawn(async move {
            let mut n = 0;
            let resource = format!("steady-{gateway}");
            while start.elapsed() < LOAD {
                let id = format!("{resource}-{n}");
                let done = write(&proxies, gateway, &format!("/free/{resource}/x"), &resource, 1, id).await;
                n += 1;
                writes.lock().await.push(done);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }));
    }
    // The leader of `writer`: a new owner (so a new term) every round, ten writes at its term
    // and one at the term before (a zombie's), then a release.
    {
        let (proxies, controls, writes, acquired) =
            (proxies.clone(), controls.clone(), Arc::clone(&writes), Arc::clone(&acquired));
        tasks.push(tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(seed ^ 0xbeef);
            let mut round = 0;
            let mut previous = None;
            while start.elapsed() < LOAD {
                let owner = format!("owner-{round}");
                let body = format!(r#"{{"owner": "{owner}", "ttl_ms": 5000}}"#);
                let control = controls[rng.random_range(0..controls.len())];
                let Ok(reply) = send(control, Method::POST, "/v1/leases/writer/acquire", &[JSON], &body).await else {
                    continue;
                };
                if reply.status != StatusCode::OK {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
                let Some(term) = reply.json()["term"].as_i64() else { panic!("a lease without a term: {reply:?}") };
                acquired.lock().await.push(Acquired { term, answered: Instant::now() });
                for n in 0..11 {
                    let term = if n == 5 { previous.unwrap_or(term) } else { term };
                    let gateway = rng.random_range(0..proxies.len());
                    let id = format!("leader-{round}-{n}");
                    let done = write(&proxies, gateway, "/ledger/acct/x", "acct", term, id).await;
                    writes.lock().await.push(done);
                }
                previous = Some(term);
                let release = format!(r#"{{"owner": "{owner}"}}"#);
                while start.elapsed() < LOAD * 2 {
                    let control = controls[rng.random_range(0..controls.len())];
                    match send(control, Method::POST, "/v1/leases/writer/release", &[JSON], &release).await {
                        Ok(reply) if reply.status == StatusCode::NO_CONTENT || reply.status == StatusCode::CONFLICT => {
                            break;
                        }
                        _ => tokio::time::sleep(Duration::from_millis(50)).await,
                    }
                }
                round += 1;
            }
        }));
    }

    // The probe: a new term of a resource of its own for every write, as fast as the store
    // answers, up to the crash and never after. Nothing raises it later, so a raise answered just
    // before the crash and lost in the failover shows: its fence on the new primary is below it,
    // and the term under it is admitted again.
    let crashing = Arc::new(std::sync::atomic::AtomicBool::new(false));
    {
        let (proxies, writes, crashing) = (proxies.clone(), Arc::clone(&writes), Arc::clone(&crashing));
        tasks.push(tokio::spawn(async move {
            let mut term = 1;
            while !crashing.load(std::sync::atomic::Ordering::SeqCst) {
                let done = write(&proxies, 1, "/free/probe/x", "probe", term, format!("probe-{term}")).await;
                writes.lock().await.push(done);
                term += 1;
            }
        }));
    }

    tokio::time::sleep(CRASH_AT).await;
    crashing.store(true, std::sync::atomic::Ordering::SeqCst);
    let crashed = Instant::now();
    tokio::task::block_in_place(|| primary.crash_now()).unwrap();
    let down = Instant::now();
    tokio::time::sleep(DOWN_FOR).await;
    let promoting = Instant::now();
    tokio::task::block_in_place(|| standby.promote()).unwrap();
    let promoted = Instant::now();
    for task in tasks {
        task.await.unwrap();
    }
    let writes = writes.lock().await.clone();
    let acquired = acquired.lock().await.clone();
    let log = upstream.collect(Duration::from_millis(500)).await.to_vec();

    // Every status is a decision (200, 409) or fail-closed (503).
    let mut statuses: BTreeMap<u16, usize> = BTreeMap::new();
    for write in &writes {
        *statuses.entry(write.status.as_u16()).or_default() += 1;
        assert!(
            [StatusCode::OK, StatusCode::CONFLICT, StatusCode::SERVICE_UNAVAILABLE].contains(&write.status),
            "seed {seed}: {write:?}"
        );
        assert_eq!(write.status == StatusCode::OK, upstream.received(&write.id), "seed {seed}: {write:?}");
    }
    // S3 and S4: once a term was admitted (or granted, for the bound lease), nothing lower is.
    for later in writes.iter().filter(|w| w.status == StatusCode::OK) {
        for earlier in writes.iter().filter(|w| w.status == StatusCode::OK && w.resource == later.resource) {
            assert!(
                !(earlier.answered < later.sent && later.term < earlier.term),
                "seed {seed}: S3: {later:?} was admitted after {earlier:?}"
            );
        }
        if later.resource == "acct" {
            for lease in acquired.iter().filter(|a| a.answered < later.sent) {
                assert!(later.term >= lease.term, "seed {seed}: S4: {later:?} was admitted after term {lease:?}");
            }
        }
    }
    // S2: answered terms grow, and every one of them is on the new primary.
    let client = connect(&standby.url("failover")).await;
    for pair in acquired.windows(2) {
        assert!(pair[0].term < pair[1].term, "seed {seed}: S2: {pair:?}");
    }
    let periods: Vec<i64> = client
        .query("SELECT term FROM fencing.lease_history WHERE key = 'writer' ORDER BY term", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    for lease in &acquired {
        assert!(periods.contains(&lease.term), "seed {seed}: S2: term {} is not in {periods:?}", lease.term);
    }
    // S3 in the store: each resource's fence is at least the highest term admitted.
    let mut highest: HashMap<&str, i64> = HashMap::new();
    for write in writes.iter().filter(|w| w.status == StatusCode::OK) {
        let entry = highest.entry(&write.resource).or_default();
        *entry = (*entry).max(write.term);
    }
    for (resource, term) in &highest {
        // An unbound route's fences are named by the route's prefix and the resource.
        let name = if *resource == "acct" { (*resource).to_owned() } else { format!("/free/{resource}") };
        let fence =
            client.query_opt("SELECT max_term FROM fencing.fences WHERE resource = $1", &[&name]).await.unwrap();
        let fence = fence.map(|row| row.get::<_, i64>(0));
        let all = fencing_tests::snapshot(&client, "SELECT * FROM fencing.fences ORDER BY resource").await;
        assert!(fence >= Some(*term), "seed {seed}: {resource} admitted {term}, fence {fence:?}; fences: {all:?}");
    }
    // The probe's last admitted term survived: the term under it is refused through both gateways.
    let probed = highest.get("probe").copied().unwrap_or_else(|| panic!("seed {seed}: no probe write was admitted"));
    for proxy in &proxies {
        let stale = (probed - 1).to_string();
        let reply = send(
            *proxy,
            Method::PUT,
            "/free/probe/x",
            &[("fencing-token", &stale), ("x-request-id", "probe-stale")],
            "",
        )
        .await
        .unwrap();
        assert_eq!(
            reply.status,
            StatusCode::CONFLICT,
            "seed {seed}: S3: term {stale} of the probe after {probed}: {}",
            reply.json()
        );
    }
    // S5: the upstream saw each resource's terms in order.
    let mut last: HashMap<String, i64> = HashMap::new();
    for line in &log {
        let resource = line["fencing_resource"].as_str().unwrap().to_owned();
        let term: i64 = line["fencing_token"].as_str().unwrap().parse().unwrap();
        let previous = last.entry(resource.clone()).or_insert(term);
        assert!(term >= *previous, "seed {seed}: S5: {resource} received term {term} after {previous}");
        *previous = term;
    }

    // The timeline. Each gateway admits again after the promotion (bounded by the load's end).
    let since = |at: Instant| at.saturating_duration_since(crashed).as_millis();
    println!(
        "failover seed {seed}: {} writes {statuses:?}; {} acquires; crash at 0 ms, primary gone at {} ms, \
         promote asked at {} ms, done at {} ms",
        writes.len(),
        acquired.len(),
        since(down),
        since(promoting),
        since(promoted)
    );
    for (gateway, name) in ["granting (grant_ms 400)", "asking (no grants)"].iter().enumerate() {
        let mine: Vec<&Write> = writes.iter().filter(|w| w.gateway == gateway).collect();
        // Sent after the primary was killed, admitted before the promotion: by a grant, or by a
        // decision the dying primary still answered.
        let admitted_after_crash: Vec<&&Write> =
            mine.iter().filter(|w| w.sent >= crashed && w.answered < promoting && w.status == StatusCode::OK).collect();
        let last_admitted_down = admitted_after_crash.iter().map(|w| since(w.answered)).max();
        // Sent while no Postgres could decide at all: after the primary was gone, before the promotion.
        let admitted_down =
            mine.iter().filter(|w| w.sent >= down && w.sent < promoting && w.status == StatusCode::OK).count();
        let unavailable = mine.iter().filter(|w| w.status == StatusCode::SERVICE_UNAVAILABLE).count();
        let first_503 =
            mine.iter().filter(|w| w.status == StatusCode::SERVICE_UNAVAILABLE).map(|w| since(w.answered)).min();
        let back =
            mine.iter().filter(|w| w.status == StatusCode::OK && w.sent >= promoted).map(|w| since(w.answered)).min();
        let decided = mine
            .iter()
            .filter(|w| w.status != StatusCode::SERVICE_UNAVAILABLE && w.sent >= promoted)
            .map(|w| since(w.answered))
            .min();
        let steady_back = mine
            .iter()
            .filter(|w| w.resource.starts_with("steady") && w.status == StatusCode::OK && w.sent >= promoted)
            .map(|w| since(w.answered))
            .min();
        println!(
            "failover seed {seed}: gateway {name}: {unavailable} x 503 (first at {first_503:?} ms); \
             {} writes sent after the crash admitted before the promotion, the last answered at \
             {last_admitted_down:?} ms ({admitted_down} sent once the primary was gone); after the promotion, first decision at {decided:?} ms, first admitted \
             write at {back:?} ms, steady writer (no new term) admitted again at {steady_back:?} ms",
            admitted_after_crash.len()
        );
        assert!(back.is_some(), "seed {seed}: gateway {name} admitted nothing after the promotion");
        if gateway == 1 {
            assert_eq!(admitted_down, 0, "seed {seed}: a gateway without grants admitted writes without Postgres");
        }
    }
}

/// Whether the gateway logs a line holding `needle` within `within`.
async fn logs_within(gateway: &mut Gateway, needle: &str, within: Duration) -> bool {
    let until = Instant::now() + within;
    loop {
        match tokio::time::timeout_at(until, gateway.logs.recv()).await {
            Ok(Some(line)) if line.contains(needle) => return true,
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => return false,
        }
    }
}

const NO_SYNCHRONOUS_STANDBY: &str = "without a synchronous standby";
const SYNCHRONOUS_STANDBY_MISSING: &str = "fewer synchronous standbys of the fence store are connected";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_warns_while_the_store_is_a_primary_without_a_synchronous_standby_unless_told_not_to() {
    // A lone primary: warned at start.
    let db = TestDb::new().await;
    let upstream = Upstream::start().await.unwrap();
    let warn = config_with(&upstream.url(), 0, "standby_check = \"warn\"");
    let mut lone = Gateway::start_capturing_logs(&db.url(), &warn).await.unwrap();
    assert!(logs_within(&mut lone, NO_SYNCHRONOUS_STANDBY, Duration::from_secs(15)).await, "no warning");
    // Told that this Postgres never fails over: quiet (the first check runs at start).
    let off = config_with(&upstream.url(), 0, "standby_check = \"off\"");
    let mut quiet = Gateway::start_capturing_logs(&db.url(), &off).await.unwrap();
    assert!(!logs_within(&mut quiet, NO_SYNCHRONOUS_STANDBY, Duration::from_secs(3)).await, "warned though off");

    // A primary with a synchronous standby: quiet, until a failover leaves the new primary alone.
    let (primary, standby, url) = primary_and_synchronous_standby().await;
    let mut protected = Gateway::start_capturing_logs(&url, &warn).await.unwrap();
    assert!(
        !logs_within(&mut protected, NO_SYNCHRONOUS_STANDBY, Duration::from_secs(3)).await,
        "warned though a synchronous standby confirms every commit"
    );
    tokio::task::block_in_place(|| primary.crash_now()).unwrap();
    tokio::task::block_in_place(|| standby.promote()).unwrap();
    assert!(
        logs_within(&mut protected, NO_SYNCHRONOUS_STANDBY, Duration::from_secs(30)).await,
        "no warning once the promoted standby runs alone"
    );
    // A synchronous standby named but not connected (down, or Patroni's strict mode with no
    // replica left) protects nothing: warned, never reported protected.
    standby.psql("ALTER SYSTEM SET synchronous_standby_names = 'ghost'").unwrap();
    standby.psql("SELECT pg_reload_conf()").unwrap();
    assert!(
        logs_within(&mut protected, SYNCHRONOUS_STANDBY_MISSING, Duration::from_secs(30)).await,
        "no warning while the named synchronous standby is not connected"
    );
}

/// The session that would break S3 across a failover if the gateway cancelled a decision it gave
/// up on: its synchronous standby stalls, a raise to 9 times out (503) while its commit waits
/// for the standby, and the next writes of term 9 must not be admitted, for the standby does
/// not have 9 and a failover would admit 8 again. A cancel would make the raise visible on the
/// primary (PostgreSQL ends a cancelled wait with success, `tests/tests/schema/failover.rs`),
/// and a read would then admit 9. Once the standby is back, the raise commits and 9 is admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_a_raise_that_timed_out_waiting_for_the_synchronous_standby_is_not_admitted_by_a_later_write() {
    use fencing_tests::faultproxy::{FaultProxy, Mode};
    let primary = PgCluster::start().unwrap();
    primary.psql("CREATE DATABASE failover").unwrap();
    let mut client = connect(&primary.url("failover")).await;
    fencing_schema::migrate(&mut client).await.unwrap();
    let link = FaultProxy::start(format!("127.0.0.1:{}", primary.port()).parse().unwrap()).await.unwrap();
    let port = link.addr().port();
    let _standby =
        tokio::task::block_in_place(|| primary.start_standby_through(Replication::Synchronous, port)).unwrap();
    let mut upstream = Upstream::start().await.unwrap();
    let gateway = Gateway::start(&primary.url("failover"), &config(&upstream.url(), 0)).await.unwrap();
    let put = |term: i64, id: &str| {
        let (id, term) = (id.to_owned(), term.to_string());
        async move {
            send(gateway.proxy, Method::PUT, "/free/acct/x", &[("fencing-token", &term), ("x-request-id", &id)], "")
                .await
                .unwrap()
                .status
        }
    };
    assert_eq!(put(7, "seven").await, StatusCode::OK);
    link.set(Mode::Hold);
    assert_eq!(put(9, "nine-0").await, StatusCode::SERVICE_UNAVAILABLE, "the raise waits for the standby");
    for n in 1..4 {
        let status = put(9, &format!("nine-{n}")).await;
        assert_ne!(status, StatusCode::OK, "S3: term 9 admitted while the standby lacks the raise to 9");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let fence =
        client.query_one("SELECT max_term FROM fencing.fences WHERE resource = '/free/acct'", &[]).await.unwrap();
    assert_eq!(fence.get::<_, i64>(0), 7, "the raise to 9 is visible before the standby has it");
    link.set(Mode::Pass);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut n = 4;
    while put(9, &format!("nine-{n}")).await != StatusCode::OK {
        assert!(Instant::now() < deadline, "term 9 not admitted within 30 s of the standby's return");
        n += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = upstream.collect(Duration::from_millis(300)).await.to_vec();
    let nines: Vec<&str> =
        log.iter().filter_map(|line| line["x_request_id"].as_str()).filter(|id| id.starts_with("nine")).collect();
    assert_eq!(nines, [format!("nine-{n}")], "only the last write of 9 reached the upstream");
}

/// A primary that went down without a word, listed first in a multi-host URL: its host drops
/// connection attempts (as a host powered off or cut off does), so without a connect timeout
/// each new connection would wait out the kernel's SYN retries, minutes, inside a decision
/// bounded by the fence-check timeout, and never reach the second host: every write 503 for
/// good. Each host gets half the fence-check timeout, so the promoted standby (here: the live
/// server listed second) is reached and writes are admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_host_that_drops_connection_attempts_does_not_keep_writes_from_the_second() {
    let db = TestDb::new().await;
    // A listener whose accept queue (backlog 0) one connection fills: the kernel then drops every
    // further SYN to it, as to a host that is down.
    let silent = tokio::net::TcpSocket::new_v4().unwrap();
    silent.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let silent = silent.listen(0).unwrap();
    let addr = silent.local_addr().unwrap();
    let _filler = tokio::net::TcpStream::connect(addr).await.unwrap();
    let attempt = tokio::time::timeout(Duration::from_millis(500), tokio::net::TcpStream::connect(addr)).await;
    assert!(attempt.is_err(), "the silent host answered a connection attempt: the test would prove nothing");

    let url = format!(
        "postgres://{SUPERUSER}@127.0.0.1:{},127.0.0.1:{}/{}?target_session_attrs=read-write",
        addr.port(),
        db.cluster().port(),
        db.name
    );
    let mut upstream = Upstream::start().await.unwrap();
    let gateway = Gateway::spawn(&url, &config(&upstream.url(), 0)).await.unwrap();
    let started = Instant::now();
    let mut refused = 0;
    loop {
        let reply = send(
            gateway.proxy,
            Method::PUT,
            "/free/acct/x",
            &[("fencing-token", "1"), ("x-request-id", "through")],
            "",
        )
        .await
        .unwrap();
        if reply.status == StatusCode::OK {
            break;
        }
        assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{}", reply.json());
        refused += 1;
        assert!(started.elapsed() < Duration::from_secs(20), "no write admitted in 20 s: the first host held them all");
    }
    println!("admitted after {:?} ({refused} writes refused first)", started.elapsed());
    upstream.collect(Duration::from_millis(300)).await;
    assert!(upstream.received("through"));
}
