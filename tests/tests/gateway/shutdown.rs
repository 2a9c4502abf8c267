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
