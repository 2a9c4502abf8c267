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
    let db = TestDb::new().await;
    let mut upstream = Upstream::start().await.unwrap();
    let config = format!(
        "[upstream]\nforward_timeout_ms = 1000\n\
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
            other => panic!("seed {seed}: {id} got {other}"),
        }
    }
    assert_eq!(log.len(), admitted, "the upstream received exactly the admitted writes");
    assert!(admitted > 0 && stale > 0, "both paths exercised: {admitted} admitted, {stale} stale");
    println!("replicas: {admitted} admitted, {stale} refused as stale");
}

/// Sends a fenced write to `proxy` whose body trickles in over `body_time`, and returns the
/// status line.
async fn slow_write(proxy: std::net::SocketAddr, term: i64, id: &str, body_time: Duration) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(proxy).await.unwrap();
    let head = format!(
        "POST /r/s5/item HTTP/1.1\r\nHost: x\r\nFencing-Token: {term}\r\nX-Request-Id: {id}\r\n\
         Connection: close\r\nContent-Length: 10\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    for _ in 0..10 {
        tokio::time::sleep(body_time / 10).await;
        stream.write_all(b"x").await.unwrap();
    }
    let mut answer = String::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_string(&mut answer)).await;
    answer.lines().next().unwrap_or_default().to_owned()
}

/// S5 across replicas: a lower-term write admitted by one replica is still on its way to the
/// upstream (its body trickles in) when another replica admits a higher term. The higher term
/// is forwarded only after the lower-term write could have completed, so the upstream never
/// sees the lower term after the higher one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s5_a_higher_term_is_never_forwarded_ahead_of_a_slow_lower_term_write_on_another_replica() {
    let db = TestDb::new().await;
    let mut upstream = Upstream::start().await.unwrap();
    let config = format!(
        "[upstream]\nforward_timeout_ms = 1500\n\
         [[routes]]\nprefix = \"/r\"\nupstream = \"{}\"\nresource = {{ segment = 2 }}\n",
        upstream.url()
    );
    let first = Gateway::start(&db.url(), &config).await.unwrap();
    let second = Gateway::start(&db.url(), &config).await.unwrap();
    // Term 1 is the resource's current term.
    let reply = send(first.proxy, Method::PUT, "/r/s5/item", &[("fencing-token", "1")], "").await.unwrap();
    assert_eq!(reply.status, StatusCode::OK);

    let proxy = first.proxy;
    let lower = tokio::spawn(async move { slow_write(proxy, 1, "lower", Duration::from_millis(700)).await });
    tokio::time::sleep(Duration::from_millis(150)).await;
    let higher =
        send(second.proxy, Method::PUT, "/r/s5/item", &[("fencing-token", "2"), ("x-request-id", "higher")], "")
            .await
            .unwrap();
    assert_eq!(higher.status, StatusCode::OK);
    assert!(lower.await.unwrap().starts_with("HTTP/1.1 200"), "the lower-term write was admitted before the raise");

    let order: Vec<String> = upstream
        .collect(Duration::from_millis(300))
        .await
        .iter()
        .filter_map(|line| line["x_request_id"].as_str().map(str::to_owned))
        .filter(|id| id == "lower" || id == "higher")
        .collect();
    assert_eq!(order, vec!["lower", "higher"], "the higher term overtook a lower-term write in flight");
}
