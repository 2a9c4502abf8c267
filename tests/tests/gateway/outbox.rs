//! The README's outbox daemon: a daemon that publishes through the gateway with its fencing
//! token (its assignment's generation), on an unbound route; once a newer instance wrote, the
//! older instance's token is refused.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use fencing_election::Elector;
use fencing_election::daemons::{Daemons, DaemonsHandle};
use fencing_election::membership::Membership;
use fencing_tests::gateway::send;
use http::{Method, StatusCode};
use tokio_postgres::NoTls;

use crate::Setup;

fn pool(url: &str) -> Pool {
    let config: tokio_postgres::Config = url.parse().unwrap();
    let manager = Manager::from_config(config, NoTls, ManagerConfig { recycling_method: RecyclingMethod::Fast });
    Pool::builder(manager).max_size(4).build().unwrap()
}

type Published = Arc<Mutex<Vec<(i64, StatusCode)>>>;

/// A node of the cluster `outbox` whose one daemon publishes a message through the gateway every
/// 100 ms with its fencing token, recording (generation, status).
fn outbox_node(url: &str, node_id: &str, proxy: std::net::SocketAddr, published: &Published) -> DaemonsHandle {
    let pool = pool(url);
    let membership = Membership::builder(pool.clone(), "outbox")
        .node_id(node_id)
        .heartbeat_interval(Duration::from_millis(200))
        .ttl(Duration::from_millis(800))
        .query_timeout(Duration::from_millis(90))
        .build()
        .unwrap();
    let elector = Elector::builder(pool, "outbox-leader").ttl(Duration::from_millis(800)).build().unwrap();
    let published = Arc::clone(published);
    Daemons::builder(membership, elector)
        .ack_timeout(Duration::from_secs(1))
        .drain_timeout(Duration::from_secs(1))
        .daemon("outbox", move |daemon| {
            let published = Arc::clone(&published);
            async move {
                let token = daemon.fencing_token();
                while daemon.is_valid() && !daemon.is_draining() {
                    let header = token.header_value();
                    let reply = send(proxy, Method::POST, "/fixed/publish", &[("fencing-token", &header)], "message")
                        .await
                        .unwrap();
                    published.lock().unwrap().push((token.term(), reply.status));
                    if reply.status == StatusCode::CONFLICT {
                        return; // a newer instance owns the outbox
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        })
        .build()
        .unwrap()
        .start()
}

async fn wait_for_a_publish(published: &Published, newer_than: i64) -> i64 {
    for _ in 0..300 {
        let found = published
            .lock()
            .unwrap()
            .iter()
            .find(|(generation, status)| *generation > newer_than && *status == StatusCode::OK)
            .map(|(generation, _)| *generation);
        if let Some(generation) = found {
            return generation;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no publish above generation {newer_than}: {:?}", published.lock().unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbox_daemon_publishes_through_the_gateway_and_an_older_instances_token_is_refused() {
    let mut setup = Setup::new().await;
    let proxy = setup.gateway.proxy;
    let published: Published = Arc::default();

    let first = outbox_node(&setup.db.url(), "o1", proxy, &published);
    let old = wait_for_a_publish(&published, 0).await;
    // The node goes; the outbox moves to the next node with a newer generation.
    first.shutdown().await;
    let second = outbox_node(&setup.db.url(), "o2", proxy, &published);
    let new = wait_for_a_publish(&published, old).await;
    assert!(new > old);

    // The old instance's token, presented again (a paused process resuming): refused, and
    // never forwarded.
    let headers = [("fencing-token", old.to_string()), ("x-request-id", "outbox-late".to_owned())];
    let headers: Vec<(&str, &str)> = headers.iter().map(|(name, value)| (*name, value.as_str())).collect();
    let stale = send(proxy, Method::POST, "/fixed/publish", &headers, "late").await.unwrap();
    assert_eq!(stale.status, StatusCode::CONFLICT);
    assert!(stale.json()["type"].as_str().is_some_and(|t| t.ends_with("stale-term")), "{}", stale.json());
    second.shutdown().await;
    setup.upstream.collect(Duration::from_millis(300)).await;
    assert!(!setup.upstream.received("outbox-late"), "a stale write reached the upstream");
}
