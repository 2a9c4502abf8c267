//! S6, fail closed: when the fence decision cannot be made, nothing is forwarded; when the store
//! is back, writes flow again without restarting the gateway.

use std::time::Duration;

use fencing_tests::gateway::{Gateway, Upstream, send};
use fencing_tests::pg::{PgCluster, connect};
use http::{Method, StatusCode};

use crate::Setup;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s6_postgres_stopped_mid_load_gives_503_forwards_nothing_and_recovers_without_restart() {
    // A cluster of its own: stopping the shared one would disturb the other tests.
    let cluster = PgCluster::start().unwrap();
    connect(&cluster.url("postgres")).await.batch_execute("CREATE DATABASE gw").await.unwrap();
    let url = cluster.url("gw");
    let mut upstream = Upstream::start().await.unwrap();
    // Without grants: every write asks Postgres, so the first write after it stops gets 503
    // (with grants, writes go on until the grant's deadline:
    // `grants::s6_a_gateway_cut_off_from_postgres_stops_admitting_at_its_grants_deadline`).
    let config = format!(
        "[database]\nfence_check_timeout_ms = 500\ngrant_ms = 0\n\
         [[routes]]\nprefix = \"/w\"\nupstream = \"{}\"\nresource = {{ segment = 2 }}\n",
        upstream.url()
    );
    let gateway = Gateway::start(&url, &config).await.unwrap();
    let proxy = gateway.proxy;
    let write = |n: usize| async move {
        let id = format!("w-{n}");
        let reply =
            send(proxy, Method::POST, &format!("/w/r{}", n % 4), &[("fencing-token", "1"), ("x-request-id", &id)], "")
                .await
                .unwrap();
        (id, reply)
    };

    let mut n = 0;
    for _ in 0..20 {
        let (_, reply) = write(n).await;
        assert_eq!(reply.status, StatusCode::OK);
        n += 1;
    }
    cluster.stop().unwrap();
    let mut unavailable = Vec::new();
    for _ in 0..20 {
        let (id, reply) = write(n).await;
        n += 1;
        assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{}", String::from_utf8_lossy(&reply.body));
        assert!(reply.header("retry-after").is_some(), "503 carries Retry-After");
        assert_eq!(reply.header("content-type"), Some("application/problem+json"));
        unavailable.push(id);
    }
    // Unfenced methods never touch Postgres: reads still pass while it is down.
    let read = send(proxy, Method::GET, "/w/r1", &[("x-request-id", "read-while-down")], "").await.unwrap();
    assert_eq!(read.status, StatusCode::OK);
    let ready = send(gateway.control, Method::GET, "/readyz", &[], "").await.unwrap();
    assert_eq!(ready.status, StatusCode::SERVICE_UNAVAILABLE, "not ready while the store is down");

    cluster.start_server().unwrap();
    let mut recovered = false;
    for _ in 0..100 {
        let (_, reply) = write(n).await;
        n += 1;
        if reply.status == StatusCode::OK {
            recovered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(recovered, "writes flow again once Postgres is back, without restarting the gateway");

    upstream.collect(Duration::from_millis(300)).await;
    for id in &unavailable {
        assert!(!upstream.received(id), "{id} got 503 but reached the upstream");
    }
    assert!(upstream.received("read-while-down"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s6_a_fence_decision_slower_than_the_timeout_gives_503_and_forwards_nothing() {
    let mut setup = Setup::new().await;
    let proxy = setup.gateway.proxy;
    let first = send(proxy, Method::POST, "/fixed", &[("fencing-token", "1")], "").await.unwrap();
    assert_eq!(first.status, StatusCode::OK);

    // Hold the fence row: raising its term must wait for the lock, past the check timeout.
    let mut locker = setup.db.connect().await;
    let lock = locker.transaction().await.unwrap();
    lock.execute("SELECT 1 FROM fencing.fences WHERE resource = '/fixed/the-fixed-one' FOR UPDATE", &[]).await.unwrap();
    let slow = send(proxy, Method::POST, "/fixed", &[("fencing-token", "2"), ("x-request-id", "slow-check")], "")
        .await
        .unwrap();
    assert_eq!(slow.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(slow.header("retry-after").is_some());
    lock.rollback().await.unwrap();

    setup.upstream.collect(Duration::from_millis(300)).await;
    assert!(!setup.upstream.received("slow-check"), "an undecided write was forwarded");
}
