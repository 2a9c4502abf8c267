//! S3 and S5 across replicas: three gateways on one database, eight writers presenting random
//! and rising terms to four resources. In the upstream's log, per resource, terms never
//! decrease; every write that got 2xx is in the log; no 409 is.

use std::collections::HashMap;
use std::time::Duration;

use fencing_tests::gateway::{Gateway, Upstream, send};
use fencing_tests::pg::TestDb;
use futures::future::join_all;
use http::{Method, StatusCode};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const GATEWAYS: usize = 3;
const WRITERS: usize = 8;
const WRITES_PER_WRITER: usize = 30;
const RESOURCES: usize = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_s5_three_replicas_eight_writers_terms_never_decrease_at_the_upstream() {
    three_replicas_eight_writers("grant_ms = 0").await;
}

/// The same with grants on (the default): a raise waits out the other replicas' grants, and
/// with a new term every few writes on four resources, raises queue behind one another on a row
/// past the fence check timeout: such a write fails closed (503, S6) and reaches nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_s5_three_replicas_eight_writers_with_grants_terms_never_decrease_at_the_upstream() {
    three_replicas_eight_writers("").await;
}

async fn three_replicas_eight_writers(database: &str) {
    let grants = database.is_empty();
    let db = TestDb::new().await;
    let mut upstream = Upstream::start().await.unwrap();
    let config = format!(
        "[database]\n{database}\n[upstream]\nforward_timeout_ms = 1000\n\
         [[routes]]\nprefix = \"/r\"\nupstream = \"{}\"\nresource = {{ segment = 2 }}\n",
        upstream.url()
    );
    let mut gateways = Vec::new();
    for _ in 0..GATEWAYS {
        gateways.push(Gateway::start(&db.url(), &config).await.unwrap());
    }
    let proxies: Vec<_> = gateways.iter().map(|g| g.proxy).collect();
    let seed: u64 = rand::random();
    println!("replicas seed: {seed}");

    let writers = (0..WRITERS).map(|writer| {
        let proxies = proxies.clone();
        tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(seed ^ writer as u64);
            let mut results = Vec::new();
            for write in 0..WRITES_PER_WRITER {
                let term = 1 + write / 6 + rng.random_range(0..3);
                let resource = rng.random_range(0..RESOURCES);
                let proxy = proxies[rng.random_range(0..proxies.len())];
                let id = format!("w{writer}-{write}");
                let reply = send(
                    proxy,
                    Method::PUT,
                    &format!("/r/res-{resource}/item"),
                    &[("fencing-token", &term.to_string()), ("x-request-id", &id)],
                    "",
                )
                .await
                .unwrap();
                results.push((id, resource, term, reply.status));
            }
            results
        })
    });
    let results: Vec<_> = join_all(writers).await.into_iter().flat_map(Result::unwrap).collect();

    let log = upstream.collect(Duration::from_millis(500)).await.to_vec();
    let mut last_term: HashMap<String, i64> = HashMap::new();
    for line in &log {
        let resource = line["fencing_resource"].as_str().unwrap().to_owned();
        let term: i64 = line["fencing_token"].as_str().unwrap().parse().unwrap();
        let last = last_term.entry(resource.clone()).or_insert(term);
        assert!(term >= *last, "seed {seed}: {resource} received term {term} after {last}");
        *last = term;
    }
    let (mut admitted, mut stale) = (0, 0);
    for (id, resource, term, status) in &results {
        match *status {
            StatusCode::OK => {
                admitted += 1;
                assert!(
                    upstream.received(id),
                    "seed {seed}: {id} (res-{resource}, term {term}) got 200 but is not in the log"
                );
            }
            StatusCode::CONFLICT => {
                stale += 1;
                assert!(!upstream.received(id), "seed {seed}: {id} got 409 but reached the upstream");
            }
            StatusCode::SERVICE_UNAVAILABLE if grants => {
                assert!(!upstream.received(id), "seed {seed}: {id} got 503 but reached the upstream");
            }
            other => panic!("seed {seed}: {id} got {other}"),
        }
    }
    assert_eq!(log.len(), admitted, "the upstream received exactly the admitted writes");
    assert!(admitted > 0 && stale > 0, "both paths exercised: {admitted} admitted, {stale} stale");
    println!("replicas: {admitted} admitted, {stale} refused as stale");
}

/// A `fault-upstream` process (it records the arrival time of each request's head and of
/// every body piece), answering at once on a request's head when `early`.
pub(crate) struct TimingUpstream {
    pub(crate) addr: std::net::SocketAddr,
    log: std::path::PathBuf,
    _child: tokio::process::Child,
}

impl TimingUpstream {
    pub(crate) async fn start(early: bool) -> TimingUpstream {
        use tokio::io::AsyncBufReadExt;
        let log =
            std::env::temp_dir().join(format!("fencing-timing-{}-{}.jsonl", std::process::id(), rand::random::<u32>()));
        let mut command = tokio::process::Command::new(fencing_tests::workspace_bin("fault-upstream").unwrap());
        command.args(["--name", "applying", "--log"]).arg(&log).stdout(std::process::Stdio::piped()).kill_on_drop(true);
        if early {
            command.arg("--early");
        }
        let mut child = command.spawn().unwrap();
        let stdout = child.stdout.take().unwrap();
        let first = tokio::io::BufReader::new(stdout).lines().next_line().await.unwrap().unwrap();
        let addr = first.strip_prefix("listening ").unwrap().parse().unwrap();
        TimingUpstream { addr, log, _child: child }
    }

    /// Every request recorded so far, by request id.
    pub(crate) fn records(&self) -> HashMap<String, serde_json::Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .filter_map(|v| Some((v["request_id"].as_str()?.to_owned(), v)))
            .collect()
    }
}

impl Drop for TimingUpstream {
    /// The log is the test's own: nothing is left in the temp dir.
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.log);
    }
}

/// Every arrival time (head and body pieces) of a recorded request, in microseconds.
pub(crate) fn arrivals(record: &serde_json::Value) -> Vec<i64> {
    let mut times = vec![record["head_at_us"].as_i64().unwrap()];
    times.extend(record["chunks"].as_array().unwrap().iter().filter_map(|c| c[0].as_i64()));
    times
}

fn config_for(upstream: std::net::SocketAddr, forward_ms: u64) -> String {
    format!(
        "[upstream]\nforward_timeout_ms = {forward_ms}\n\
         [[routes]]\nprefix = \"/r\"\nupstream = \"http://{upstream}\"\nresource = {{ segment = 2 }}\n"
    )
}

/// S5 across replicas: a lower-term write admitted by one replica is still on its way to the
/// upstream (its link is slow) when another replica admits the next term. The higher term is
/// forwarded only after the lower-term write could have arrived, so the upstream never sees a
/// byte of the lower term after the higher one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s5_a_higher_term_is_never_forwarded_ahead_of_a_slow_lower_term_write_on_another_replica() {
    let db = TestDb::new().await;
    let upstream = TimingUpstream::start(false).await;
    let slow_link = fencing_tests::faultproxy::FaultProxy::start(upstream.addr).await.unwrap();
    let first = Gateway::start(&db.url(), &config_for(slow_link.addr(), 1500)).await.unwrap();
    let second = Gateway::start(&db.url(), &config_for(upstream.addr, 1500)).await.unwrap();
    // Term 1 is the resource's current term.
    let reply = send(first.proxy, Method::PUT, "/r/s5/item", &[("fencing-token", "1")], "").await.unwrap();
    assert_eq!(reply.status, StatusCode::OK);

    slow_link.set(fencing_tests::faultproxy::Mode::Delay(Duration::from_millis(700)));
    let proxy = first.proxy;
    let lower = tokio::spawn(async move {
        send(proxy, Method::PUT, "/r/s5/item", &[("fencing-token", "1"), ("x-request-id", "lower")], "x").await
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    let higher =
        send(second.proxy, Method::PUT, "/r/s5/item", &[("fencing-token", "2"), ("x-request-id", "higher")], "y")
            .await
            .unwrap();
    assert_eq!(higher.status, StatusCode::OK);
    assert_eq!(
        lower.await.unwrap().unwrap().status,
        StatusCode::OK,
        "the lower-term write was admitted before the raise"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_lower_arrived_before_higher(&upstream);
}

/// The requests `lower` and `higher` reached `upstream`, and no byte of `lower` arrived after the
/// head of `higher` (S5).
pub(crate) fn assert_lower_arrived_before_higher(upstream: &TimingUpstream) {
    let records = upstream.records();
    let higher_head = records["higher"]["head_at_us"].as_i64().unwrap();
    let latest_lower = arrivals(&records["lower"]).into_iter().max().unwrap();
    assert!(
        latest_lower < higher_head,
        "a byte of the lower term arrived {} us after the higher term's head",
        latest_lower - higher_head
    );
}

/// S5 with an upstream that answers before it has read the body (legal in HTTP/1.1): the
/// gateway never sends a byte of a write after its deadline, so a lower-term body trickling in
/// slowly can never reach the upstream after a higher term's write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s5_no_byte_of_a_trickling_lower_term_body_reaches_the_upstream_after_a_higher_term_write() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let db = TestDb::new().await;
    let upstream = TimingUpstream::start(true).await;
    let first = Gateway::start(&db.url(), &config_for(upstream.addr, 1000)).await.unwrap();
    let second = Gateway::start(&db.url(), &config_for(upstream.addr, 1000)).await.unwrap();
    let reply = send(first.proxy, Method::PUT, "/r/s5/item", &[("fencing-token", "1")], "").await.unwrap();
    assert_eq!(reply.status, StatusCode::OK);

    // A term-1 write whose chunked body trickles in over 3.2 s.
    let proxy = first.proxy;
    let lower = tokio::spawn(async move {
        let mut stream = tokio::net::TcpStream::connect(proxy).await.unwrap();
        let head = "PUT /r/s5/item HTTP/1.1\r\nHost: localhost\r\nFencing-Token: 1\r\nX-Request-Id: lower\r\n\
                    Connection: close\r\nTransfer-Encoding: chunked\r\n\r\n";
        stream.write_all(head.as_bytes()).await.unwrap();
        for _ in 0..8 {
            tokio::time::sleep(Duration::from_millis(400)).await;
            if stream.write_all(b"1\r\nx\r\n").await.is_err() {
                break;
            }
        }
        let _ = stream.write_all(b"0\r\n\r\n").await;
        let mut answer = String::new();
        let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_string(&mut answer)).await;
        answer
    });
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let higher =
        send(second.proxy, Method::PUT, "/r/s5/item", &[("fencing-token", "2"), ("x-request-id", "higher")], "y")
            .await
            .unwrap();
    assert_eq!(higher.status, StatusCode::OK);
    let _ = lower.await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let records = upstream.records();
    let higher_head = records["higher"]["head_at_us"].as_i64().unwrap();
    if let Some(lower) = records.get("lower") {
        let late: Vec<i64> = arrivals(lower).into_iter().filter(|at| *at > higher_head).collect();
        assert!(late.is_empty(), "{} bytes of the term-1 write arrived after the term-2 write's head", late.len());
    }
}

/// A gateway that waited out a settle tells the store, naming the settle (schema version 10), and
/// then that the writes decided before its mark have drained: the fence row's settle_ms and then
/// drain_ms go back to NULL, and a later decision waits nothing. Were the gateway to name the settle
/// wrongly, the store would refuse every mark: each settle would then be waited in full by every
/// write of its term, and this test would see settle_ms stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s5_a_gateway_marks_the_settle_it_waited_out_and_then_its_drain() {
    let db = TestDb::new().await;
    let upstream = Upstream::start().await.unwrap();
    let config = format!(
        "[database]\ngrant_ms = 0\n[upstream]\nforward_timeout_ms = 300\n\
         [[routes]]\nprefix = \"/r\"\nupstream = \"{}\"\nresource = {{ segment = 2 }}\n",
        upstream.url()
    );
    let gateway = Gateway::start(&db.url(), &config).await.unwrap();
    let client = db.connect().await;
    let row = "SELECT settle_ms, drain_ms, settle_id FROM fencing.fences WHERE resource = '/r/acct'";
    for term in ["1", "2"] {
        let reply = send(gateway.proxy, Method::PUT, "/r/acct/x", &[("fencing-token", term)], "{}").await.unwrap();
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.json());
    }
    let raised = client.query_one(row, &[]).await.unwrap();
    // Term 2 settles behind term 1's forward timeout; the term-2 write waited it out before its
    // answer, so the mark may have come already, but not the drain (that length again after it).
    let (settle_ms, drain_ms) = (raised.get::<_, Option<i64>>(0), raised.get::<_, Option<i64>>(1));
    assert_eq!(settle_ms.or(drain_ms), Some(300), "term 2 settles behind term 1's forward timeout");
    let settle: i64 = raised.get(2);
    // The mark comes a settle (stretched by the clock-rate allowance) and a margin after the
    // decision, the drain the same again plus the forward timeout after that: well within 10 s.
    let started = tokio::time::Instant::now();
    loop {
        let now = client.query_one(row, &[]).await.unwrap();
        let (settle_ms, drain_ms, id) =
            (now.get::<_, Option<i64>>(0), now.get::<_, Option<i64>>(1), now.get::<_, Option<i64>>(2));
        assert_eq!(id, Some(settle), "no other settle began");
        if settle_ms.is_none() && drain_ms.is_none() {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the gateway did not mark the settle and its drain: settle_ms {settle_ms:?}, drain_ms {drain_ms:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The store now says no wait to the next decision of term 2.
    let next = fencing_schema::store::gate(&client, "/r/acct", 2, Duration::from_millis(300), None).await.unwrap();
    assert_eq!((next.outcome, next.wait), (fencing_schema::store::Outcome::Admitted, Duration::ZERO));
}
