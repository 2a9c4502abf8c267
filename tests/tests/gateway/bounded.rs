//! Bounded resources, tried as a greedy or broken client would: stalled control bodies, slow
//! readers of big responses, idle connections, more connections than the cap. None of them may
//! hold the gateway: a lease renewal still answers at once.

use std::net::SocketAddr;
use std::time::Duration;

use fencing_tests::gateway::{Gateway, JSON, send};
use fencing_tests::pg::TestDb;
use http::{Method, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

/// An upstream whose every answer is a body of `bytes` zero bytes.
async fn big_upstream(bytes: usize) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buffer = [0_u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buffer[..n]),
                    }
                }
                let answer = format!("HTTP/1.1 200 OK\r\ncontent-length: {bytes}\r\n\r\n");
                if stream.write_all(answer.as_bytes()).await.is_err() {
                    return;
                }
                let chunk = vec![0_u8; 64 * 1024];
                let mut left = bytes;
                while left > 0 {
                    let n = left.min(chunk.len());
                    if stream.write_all(&chunk[..n]).await.is_err() {
                        return;
                    }
                    left -= n;
                }
            });
        }
    });
    addr
}

/// The proxy listener on two threads of its own (`proxy.threads`): the limits hold across them,
/// the connection cap is one for the listener.
fn config(upstream: SocketAddr, extra: &str) -> String {
    format!(
        "[proxy]\nthreads = 2\n{extra}\n[[routes]]\nprefix = \"/free\"\nupstream = \"http://{upstream}\"\nresource = {{ segment = 2 }}\n"
    )
}

/// A connection that sent a request for a big response and reads nothing.
async fn slow_reader(proxy: SocketAddr) -> TcpStream {
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    stream.write_all(b"GET /free/big HTTP/1.1\r\nHost: localhost\r\n\r\n").await.unwrap();
    stream
}

/// A control connection that announced a body and sent a part of it.
async fn stalled_body(control: SocketAddr) -> TcpStream {
    let mut stream = TcpStream::connect(control).await.unwrap();
    stream
        .write_all(
            b"POST /v1/leases/k/acquire HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
              Content-Length: 100\r\n\r\n{\"owner\":",
        )
        .await
        .unwrap();
    stream
}

/// Reads until the peer closes or `limit` passes; returns how many bytes came and whether it
/// closed.
async fn read_until_closed(stream: &mut TcpStream, limit: Duration) -> (usize, bool) {
    let mut total = 0;
    let mut buffer = vec![0_u8; 64 * 1024];
    let until = Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(until, stream.read(&mut buffer)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (total, true),
            Ok(Ok(n)) => total += n,
            Err(_) => return (total, false),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_answers_within_a_second_beside_100_stalled_control_bodies_and_100_slow_readers() {
    let db = TestDb::new().await;
    let upstream = big_upstream(16 * 1024 * 1024).await;
    let gateway = Gateway::start(&db.url(), &config(upstream, "max_connections = 300")).await.unwrap();
    let renew_body = r#"{"owner":"leader","ttl_ms":30000}"#;
    let acquired = send(gateway.control, Method::POST, "/v1/leases/k/acquire", &[JSON], renew_body).await.unwrap();
    assert_eq!(acquired.status, StatusCode::OK);

    let mut held = Vec::new();
    for _ in 0..100 {
        held.push(stalled_body(gateway.control).await);
        held.push(slow_reader(gateway.proxy).await);
    }
    // Let the slow readers' responses fill every buffer on the way.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut slowest = Duration::ZERO;
    for _ in 0..5 {
        let started = Instant::now();
        let renewed = send(gateway.control, Method::POST, "/v1/leases/k/renew", &[JSON], renew_body).await.unwrap();
        slowest = slowest.max(started.elapsed());
        assert_eq!(renewed.status, StatusCode::OK, "{}", renewed.json());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(slowest < Duration::from_secs(1), "a renewal took {slowest:?} beside 200 greedy connections");
    // The proxy still serves others.
    let write = send(gateway.proxy, Method::POST, "/free/x", &[("fencing-token", "1")], "").await.unwrap();
    assert_eq!(write.status, StatusCode::OK);
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_control_body_is_answered_408_and_a_slow_reader_and_an_idle_connection_are_closed() {
    let db = TestDb::new().await;
    let upstream = big_upstream(16 * 1024 * 1024).await;
    let gateway = Gateway::start(
        &db.url(),
        &config(
            upstream,
            "body_read_timeout_ms = 300\nwrite_timeout_ms = 500\nheader_read_timeout_ms = 2000\n[upstream]\nforward_timeout_ms = 1000",
        ),
    )
    .await
    .unwrap();

    let mut stalled = stalled_body(gateway.control).await;
    let mut answer = vec![0_u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), stalled.read(&mut answer)).await.unwrap().unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("application/problem+json"), "{answer}");
    let client = db.connect().await;
    let leases: i64 = client.query_one("SELECT count(*) FROM fencing.leases", &[]).await.unwrap().get(0);
    assert_eq!(leases, 0, "the half-sent acquire wrote nothing");

    // A slow reader: the gateway gives up on it (it never receives the 16 MB).
    let mut reader = slow_reader(gateway.proxy).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (received, closed) = read_until_closed(&mut reader, Duration::from_secs(10)).await;
    assert!(closed && received < 16 * 1024 * 1024, "the slow reader kept its connection: {received} bytes");

    // An idle keep-alive connection is closed after the header-read timeout.
    let mut idle = TcpStream::connect(gateway.proxy).await.unwrap();
    idle.write_all(b"POST /free/y HTTP/1.1\r\nHost: localhost\r\nFencing-Token: 1\r\nContent-Length: 0\r\n\r\n")
        .await
        .unwrap();
    let started = Instant::now();
    let (_, closed) = read_until_closed(&mut idle, Duration::from_secs(10)).await;
    assert!(closed, "the idle connection was not closed");
    assert!(started.elapsed() >= Duration::from_millis(1500), "closed before the idle timeout");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_over_the_cap_is_answered_503() {
    let db = TestDb::new().await;
    let upstream = big_upstream(10).await;
    let gateway = Gateway::start(&db.url(), &config(upstream, "max_connections = 3\nheader_read_timeout_ms = 10000"))
        .await
        .unwrap();
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(TcpStream::connect(gateway.proxy).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut extra = TcpStream::connect(gateway.proxy).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), extra.read_to_end(&mut answer)).await.unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("too-many-connections") && answer.contains("retry-after: 1"), "{answer}");
    drop(held);
    // Slots come back when connections close.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let write = send(gateway.proxy, Method::POST, "/free/x", &[("fencing-token", "1")], "").await.unwrap();
    assert_eq!(write.status, StatusCode::OK);
    let metrics = send(gateway.control, Method::GET, "/metrics", &[], "").await.unwrap();
    let text = String::from_utf8_lossy(&metrics.body);
    assert!(text.contains("fencing_connections_refused_total{listener=\"proxy\"} 1"), "{text}");
}

/// At the cap, greedy connections are the ones that go: stalled control bodies are answered
/// 408 and slow readers cut after their timeouts, so a renewal and a write get a slot again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn greedy_connections_at_the_cap_are_evicted_by_their_timeouts_so_renewals_get_through() {
    let db = TestDb::new().await;
    let upstream = big_upstream(16 * 1024 * 1024).await;
    let gateway = Gateway::start(
        &db.url(),
        &config(
            upstream,
            "max_connections = 100\nbody_read_timeout_ms = 500\nwrite_timeout_ms = 500\nheader_read_timeout_ms = 2000\n\
             [upstream]\nforward_timeout_ms = 1000",
        ),
    )
    .await
    .unwrap();
    let renew_body = r#"{"owner":"leader","ttl_ms":30000}"#;
    let acquired = send(gateway.control, Method::POST, "/v1/leases/k/acquire", &[JSON], renew_body).await.unwrap();
    assert_eq!(acquired.status, StatusCode::OK);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut held = Vec::new();
    for _ in 0..100 {
        held.push(stalled_body(gateway.control).await);
        held.push(slow_reader(gateway.proxy).await);
    }
    // Both listeners are full now; their timeouts end the greedy connections.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let started = Instant::now();
    let renewed = tokio::time::timeout(
        Duration::from_secs(5),
        send(gateway.control, Method::POST, "/v1/leases/k/renew", &[JSON], renew_body),
    )
    .await
    .expect("the renewal got no answer: the control listener's slots are still held")
    .unwrap();
    assert_eq!(renewed.status, StatusCode::OK, "{}", renewed.json());
    assert!(started.elapsed() < Duration::from_secs(1), "the renewal took {:?}", started.elapsed());
    let write = tokio::time::timeout(
        Duration::from_secs(5),
        send(gateway.proxy, Method::POST, "/free/x", &[("fencing-token", "1")], ""),
    )
    .await
    .expect("the write got no answer: the proxy listener's slots are still held")
    .unwrap();
    assert_eq!(write.status, StatusCode::OK);
    drop(held);
}

/// Proxy decisions stuck on a locked fence row hold every connection of the proxy's pool; the
/// control API has connections of its own, so renewals do not wait for them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_do_not_wait_for_connections_that_proxy_decisions_hold() {
    let db = TestDb::new().await;
    let upstream = big_upstream(10).await;
    let gateway = Gateway::start(
        &db.url(),
        &format!(
            "[database]\npool_size = 2\nmax_batches_in_flight = 2\nfence_check_timeout_ms = 4000\n{}",
            config(upstream, "")
        ),
    )
    .await
    .unwrap();
    let renew_body = r#"{"owner":"leader","ttl_ms":30000}"#;
    assert_eq!(
        send(gateway.control, Method::POST, "/v1/leases/k/acquire", &[JSON], renew_body).await.unwrap().status,
        StatusCode::OK
    );
    // Fence rows exist, then are locked; new terms for them wait on the locks inside Postgres.
    for resource in ["a", "b", "c"] {
        let path = format!("/free/{resource}");
        assert_eq!(
            send(gateway.proxy, Method::POST, &path, &[("fencing-token", "1")], "").await.unwrap().status,
            StatusCode::OK
        );
    }
    let mut locker = db.connect().await;
    let lock = locker.transaction().await.unwrap();
    lock.execute("SELECT 1 FROM fencing.fences WHERE resource LIKE '/free/%' FOR UPDATE", &[]).await.unwrap();
    let mut stuck = Vec::new();
    for (i, resource) in ["a", "b", "c", "a", "b", "c"].iter().enumerate() {
        let proxy = gateway.proxy;
        let path = format!("/free/{resource}");
        let term = (i + 2).to_string();
        stuck
            .push(tokio::spawn(async move { send(proxy, Method::POST, &path, &[("fencing-token", &term)], "").await }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = Instant::now();
    let renewed = send(gateway.control, Method::POST, "/v1/leases/k/renew", &[JSON], renew_body).await.unwrap();
    let took = started.elapsed();
    assert_eq!(renewed.status, StatusCode::OK, "{}", renewed.json());
    assert!(took < Duration::from_secs(1), "the renewal waited {took:?} for a connection the proxy held");
    lock.rollback().await.unwrap();
    for write in stuck {
        let _ = write.await;
    }
}

/// `/readyz` needs no token; a flood of it, each stuck on a locked table, must not take the
/// control API's connections from renewals: probes share one query at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_stuck_readiness_probes_does_not_starve_renewals() {
    let db = TestDb::new().await;
    let upstream = big_upstream(10).await;
    let gateway =
        Gateway::start(&db.url(), &format!("[database]\nfence_check_timeout_ms = 4000\n{}", config(upstream, "")))
            .await
            .unwrap();
    let renew_body = r#"{"owner":"leader","ttl_ms":30000}"#;
    assert_eq!(
        send(gateway.control, Method::POST, "/v1/leases/k/acquire", &[JSON], renew_body).await.unwrap().status,
        StatusCode::OK
    );
    let mut locker = db.connect().await;
    let lock = locker.transaction().await.unwrap();
    lock.batch_execute("LOCK TABLE fencing.schema_migrations IN ACCESS EXCLUSIVE MODE").await.unwrap();
    let mut probes = Vec::new();
    for _ in 0..20 {
        let control = gateway.control;
        probes.push(tokio::spawn(async move { send(control, Method::GET, "/readyz", &[], "").await }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let renewed = send(gateway.control, Method::POST, "/v1/leases/k/renew", &[JSON], renew_body).await.unwrap();
    let took = started.elapsed();
    assert_eq!(renewed.status, StatusCode::OK, "{}", renewed.json());
    assert!(took < Duration::from_secs(1), "the renewal waited {took:?} behind stuck probes");
    lock.rollback().await.unwrap();
    for probe in probes {
        let _ = probe.await;
    }
}

/// The connection timeouts end idle and greedy connections, never a request in flight: an
/// upstream that takes longer than the header-read and write timeouts to answer is waited for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_answer_is_not_cut_by_the_connection_timeouts() {
    let db = TestDb::new().await;
    let upstream = fencing_tests::gateway::Upstream::start().await.unwrap();
    let config = format!(
        "[proxy]\nheader_read_timeout_ms = 1000\nwrite_timeout_ms = 500\n[upstream]\nforward_timeout_ms = 5000\n\
         [[routes]]\nprefix = \"/free\"\nupstream = \"{}\"\nresource = {{ segment = 2 }}\n",
        upstream.url()
    );
    let gateway = Gateway::start(&db.url(), &config).await.unwrap();
    for (method, headers) in [
        (Method::POST, vec![("fencing-token", "1"), ("x-upstream-delay-ms", "2500")]),
        (Method::GET, vec![("x-upstream-delay-ms", "2500")]),
    ] {
        let started = Instant::now();
        let reply = send(gateway.proxy, method.clone(), "/free/slow", &headers, "").await.unwrap();
        assert_eq!(reply.status, StatusCode::OK, "{method}: {}", String::from_utf8_lossy(&reply.body));
        assert!(started.elapsed() >= Duration::from_millis(2400), "{method} did not wait for the upstream");
    }
}
