//! SIGTERM during load: in-flight requests complete, new ones are refused, the process exits
//! within the grace period.

use std::time::Duration;

use fencing_tests::gateway::{Gateway, Upstream, send};
use fencing_tests::pg::TestDb;
use http::{Method, StatusCode};
use nix::sys::signal::Signal;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_in_flight_writes_finish_refuses_new_ones_and_exits_within_the_grace_period() {
    sigterm_during_load(0).await;
}

/// The same with the proxy listener served on two threads of their own (`proxy.threads`):
/// every thread drains its connections before the process exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_every_proxy_thread() {
    sigterm_during_load(2).await;
}

async fn sigterm_during_load(proxy_threads: usize) {
    let db = TestDb::new().await;
    let mut upstream = Upstream::start().await.unwrap();
    let config = format!(
        "[proxy]\nthreads = {proxy_threads}\n[shutdown]\ngrace_period_ms = 5000\n[upstream]\nforward_timeout_ms = 4000\n\
         [[routes]]\nprefix = \"/slow\"\nupstream = \"{}\"\nresource = {{ fixed = \"slow\" }}\n",
        upstream.url()
    );
    let mut gateway = Gateway::start(&db.url(), &config).await.unwrap();
    let proxy = gateway.proxy;

    // Eight writes that the upstream answers after a second.
    let in_flight: Vec<_> = (0..8)
        .map(|i| {
            tokio::spawn(async move {
                let id = format!("inflight-{i}");
                send(
                    proxy,
                    Method::POST,
                    "/slow",
                    &[("fencing-token", "1"), ("x-upstream-delay-ms", "1000"), ("x-request-id", &id)],
                    "",
                )
                .await
            })
        })
        .collect();
    // Wait until they have all reached the upstream, then ask the gateway to stop.
    for _ in 0..200 {
        if upstream.collect(Duration::from_millis(20)).await.len() >= 8 {
            break;
        }
    }
    assert_eq!(upstream.log.len(), 8, "all eight writes are in flight");
    gateway.signal(Signal::SIGTERM).unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;

    // New connections are refused once it stopped accepting.
    let refused = send(proxy, Method::POST, "/slow", &[("fencing-token", "1")], "").await;
    assert!(refused.is_err(), "a new request after SIGTERM was served: {refused:?}");

    for request in in_flight {
        let reply = request.await.unwrap().expect("an in-flight write completes");
        assert_eq!(reply.status, StatusCode::OK);
    }
    assert_eq!(gateway.wait_exit(Duration::from_secs(5)).await.unwrap(), Some(0), "drained within the grace period");
}

/// With the proxy listener on two threads, SIGTERM reaches both at once: while one thread
/// drains a slow write, the other stops serving too (its idle keep-alive connection gets no
/// new request served), rather than waiting for the first to finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_reaches_every_proxy_thread_at_once() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    let db = TestDb::new().await;
    let mut upstream = Upstream::start().await.unwrap();
    let config = format!(
        "[proxy]\nthreads = 2\n[shutdown]\ngrace_period_ms = 6000\n[upstream]\nforward_timeout_ms = 5000\n\
         [[routes]]\nprefix = \"/slow\"\nupstream = \"{}\"\nresource = {{ fixed = \"slow\" }}\n",
        upstream.url()
    );
    let mut gateway = Gateway::start(&db.url(), &config).await.unwrap();
    let request = |delay_ms: u64| {
        format!(
            "POST /slow HTTP/1.1\r\nHost: localhost\r\nFencing-Token: 1\r\nX-Upstream-Delay-Ms: {delay_ms}\r\n\
             Content-Length: 0\r\n\r\n"
        )
    };
    // Everything a connection sends until it has been quiet for `quiet` (or closed).
    async fn read_for(stream: &mut TcpStream, quiet: Duration) -> (String, bool) {
        let mut bytes = Vec::new();
        let mut buffer = [0u8; 4096];
        loop {
            match tokio::time::timeout(quiet, stream.read(&mut buffer)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return (String::from_utf8_lossy(&bytes).into_owned(), true),
                Ok(Ok(n)) => bytes.extend_from_slice(&buffer[..n]),
                Err(_) => return (String::from_utf8_lossy(&bytes).into_owned(), false),
            }
        }
    }

    // The first connection goes to the first thread: a write the upstream answers in 2.5 s.
    let mut slow = TcpStream::connect(gateway.proxy).await.unwrap();
    slow.write_all(request(2500).as_bytes()).await.unwrap();
    for _ in 0..200 {
        if !upstream.collect(Duration::from_millis(20)).await.is_empty() {
            break;
        }
    }
    assert_eq!(upstream.log.len(), 1, "the slow write reached the upstream");
    // The second goes to the other thread (the least loaded): one quick write, kept alive.
    let mut kept = TcpStream::connect(gateway.proxy).await.unwrap();
    kept.write_all(request(0).as_bytes()).await.unwrap();
    let (answer, closed) = read_for(&mut kept, Duration::from_millis(500)).await;
    assert!(answer.starts_with("HTTP/1.1 200") && !closed, "{answer}");

    gateway.signal(Signal::SIGTERM).unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Well inside the slow write's drain: the other thread serves nothing more.
    let _ = kept.write_all(request(0).as_bytes()).await;
    let (after, _) = read_for(&mut kept, Duration::from_secs(3)).await;
    assert!(!after.contains("HTTP/1.1 200"), "a write sent after SIGTERM was served by the other thread: {after}");
    // The slow write still completes, and the process exits within the grace period.
    let (slow_answer, _) = read_for(&mut slow, Duration::from_secs(5)).await;
    assert!(slow_answer.starts_with("HTTP/1.1 200"), "{slow_answer}");
    assert_eq!(gateway.wait_exit(Duration::from_secs(6)).await.unwrap(), Some(0), "drained within the grace period");
}
