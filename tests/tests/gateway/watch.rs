//! Watch over HTTP (`GET /v1/leases/{key}?wait=&after=`, the same on a cluster's nodes): a
//! watcher on one gateway sees every term made through another, in order, while the gateways'
//! listening connections are killed at random; expiries wake watchers; a wait ends with the
//! state unchanged; bad queries get 400; past a cap, 429.

use std::time::Duration;

use fencing_tests::gateway::{Gateway, JSON, Reply, send};
use fencing_tests::pg::TestDb;
use http::{Method, StatusCode};
use rand::Rng;
use serde_json::Value;
use tokio::time::Instant;

const ROUTES: &str = "[[routes]]\nprefix = \"/r\"\nupstream = \"http://127.0.0.1:1\"\nresource = { fixed = \"r\" }\n";

async fn call(control: std::net::SocketAddr, method: Method, path: &str, body: &str) -> Reply {
    send(control, method, path, &[JSON], body).await.unwrap()
}

/// Kills the listening connections (`application_name` "fencing-gateway watch") of this test's
/// gateways: those connected to its database (other tests share the cluster).
const KILL_LISTENERS: &str = "SELECT count(pg_terminate_backend(pid))::int FROM pg_stat_activity
                               WHERE application_name = 'fencing-gateway watch' AND datname = current_database()";

/// 100 terms, each acquired and released through gateway A (200 changes); a watcher on gateway
/// B, resuming each time from the revision it last saw, sees every term held, in order, with
/// revisions that only grow. The first 10 terms run with the listening connections up, and
/// each is seen well within the 10 s poll: wake-ups work across gateways. For the other 90 a
/// task kills both gateways' listening connections at random: each term is still seen (the
/// reconnected listener wakes every watcher; polling covers the gap). Then 20 more terms come
/// in a burst, without waiting for the watcher: several changes coalesce into one answer, and
/// the watcher still ends at the last state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_on_another_gateway_sees_every_term_in_order_while_listeners_are_killed() {
    let db = TestDb::new().await;
    let a = Gateway::start(&db.url(), ROUTES).await.unwrap();
    let b = Gateway::start(&db.url(), ROUTES).await.unwrap();
    let (seen_tx, mut seen_rx) = tokio::sync::watch::channel(0_i64);
    let watcher_control = b.control;
    let watcher = tokio::spawn(async move {
        let mut history: Vec<(i64, i64, bool)> = Vec::new();
        let mut after = 0_i64;
        loop {
            let reply =
                call(watcher_control, Method::GET, &format!("/v1/leases/churn?after={after}&wait=20s"), "").await;
            let body = reply.json();
            let revision = body["revision"].as_i64().unwrap();
            if reply.status == StatusCode::OK {
                let (term, held) = (body["term"].as_i64().unwrap(), body["remaining_ms"].as_u64().unwrap() > 0);
                if revision != after {
                    history.push((revision, term, held));
                }
                if held {
                    seen_tx.send_replace(term);
                }
                if term == 120 && !held {
                    return history;
                }
            } else {
                assert_eq!(reply.status, StatusCode::NOT_FOUND, "{body}");
            }
            after = revision;
            // A slow client during the burst: changes pile up between its reads and coalesce.
            if after > 0 && *seen_tx.borrow() >= 100 {
                tokio::time::sleep(Duration::from_millis(30)).await;
            }
        }
    });

    let mut killer = None;
    let mut slowest = [Duration::ZERO; 2];
    for term in 1..=100_i64 {
        if term == 11 {
            let client = db.connect().await;
            killer = Some(tokio::spawn(async move {
                let mut kills = 0_i32;
                loop {
                    let pause = rand::rng().random_range(50..600);
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                    kills += client.query_one(KILL_LISTENERS, &[]).await.unwrap().get::<_, i32>(0);
                    println!("listening connections killed so far: {kills}");
                }
            }));
        }
        let owner = format!("owner-{term}");
        let acquired = call(
            a.control,
            Method::POST,
            "/v1/leases/churn/acquire",
            &format!(r#"{{"owner":"{owner}","ttl_ms":60000}}"#),
        )
        .await;
        assert_eq!((acquired.status, acquired.json()["term"].as_i64()), (StatusCode::OK, Some(term)));
        let changed = Instant::now();
        let seen = tokio::time::timeout(Duration::from_secs(15), seen_rx.wait_for(|seen| *seen >= term)).await;
        assert!(matches!(seen, Ok(Ok(_))), "term {term} was not seen within 15 s");
        let phase = usize::from(term > 10);
        slowest[phase] = slowest[phase].max(changed.elapsed());
        let released =
            call(a.control, Method::POST, "/v1/leases/churn/release", &format!(r#"{{"owner":"{owner}"}}"#)).await;
        assert_eq!(released.status, StatusCode::NO_CONTENT);
    }
    if let Some(killer) = killer {
        killer.abort();
    }
    for term in 101..=120_i64 {
        let owner = format!("owner-{term}");
        let body = format!(r#"{{"owner":"{owner}","ttl_ms":60000}}"#);
        assert_eq!(call(a.control, Method::POST, "/v1/leases/churn/acquire", &body).await.status, StatusCode::OK);
        let body = format!(r#"{{"owner":"{owner}"}}"#);
        let released = call(a.control, Method::POST, "/v1/leases/churn/release", &body).await;
        assert_eq!(released.status, StatusCode::NO_CONTENT);
    }
    let history = tokio::time::timeout(Duration::from_secs(30), watcher).await.unwrap().unwrap();
    println!("watch: slowest change seen {:?} with listeners up, {:?} with them killed", slowest[0], slowest[1]);
    assert!(
        slowest[0] < Duration::from_secs(5),
        "with listening connections up, a change on gateway A woke the watcher on gateway B at once \
         (the poll is 10 s): slowest {:?}",
        slowest[0]
    );
    for pair in history.windows(2) {
        assert!(pair[1].0 > pair[0].0 && pair[1].1 >= pair[0].1, "revisions and terms only grow: {pair:?}");
    }
    let held: Vec<i64> =
        history.iter().filter(|(_, term, held)| *held && *term <= 100).map(|(_, term, _)| *term).collect();
    assert_eq!(held, (1..=100).collect::<Vec<_>>(), "every paced term seen held, once, in order");
    assert_eq!(history.last().map(|(_, term, held)| (*term, *held)), Some((120, false)), "the burst's last state");
    println!("watch: {} answers for the 40 changes of the burst", history.iter().filter(|(_, t, _)| *t > 100).count());
}

/// A lease's expiry wakes its watcher though nothing writes at that instant; a renewal is no
/// change (the wait ends with the same revision); `wait` is cut to the configured longest; bad
/// queries get 400 problem+json; past the per-client cap, 429 with Retry-After until a slot is
/// free again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_wakes_a_watcher_renewals_do_not_and_caps_and_bad_queries_are_refused() {
    let db = TestDb::new().await;
    let config = format!("[control]\nwatch_max_wait_ms = 3000\nmax_watchers_per_client = 2\n{ROUTES}");
    let gateway = Gateway::start(&db.url(), &config).await.unwrap();
    let control = gateway.control;
    let acquired = call(control, Method::POST, "/v1/leases/k/acquire", r#"{"owner":"a","ttl_ms":10000}"#).await;
    assert_eq!(acquired.status, StatusCode::OK);
    let revision = call(control, Method::GET, "/v1/leases/k", "").await.json()["revision"].as_i64().unwrap();

    // A renewal is no change: the wait ends (cut to 3 s) with the same revision.
    let renewed = call(control, Method::POST, "/v1/leases/k/renew", r#"{"owner":"a","ttl_ms":3500}"#).await;
    assert_eq!(renewed.status, StatusCode::OK);
    let asked = Instant::now();
    let same = call(control, Method::GET, &format!("/v1/leases/k?after={revision}&wait=10m"), "").await;
    assert_eq!((same.status, same.json()["revision"].as_i64()), (StatusCode::OK, Some(revision)));
    assert!(asked.elapsed() >= Duration::from_millis(2900), "the wait ran (cut to 3 s): {:?}", asked.elapsed());

    // The lease runs out within the next wait (about 0.5 s in): answered then, as a change,
    // not at the wait's end (3 s) nor at the 10 s poll.
    let asked = Instant::now();
    let reply = call(control, Method::GET, &format!("/v1/leases/k?after={revision}&wait=1m"), "").await;
    let expired = reply.json();
    assert_ne!(expired["revision"].as_i64(), Some(revision), "{expired}");
    assert!(asked.elapsed() < Duration::from_millis(2000), "woken by the expiry: {:?}", asked.elapsed());
    assert_eq!((expired["remaining_ms"].as_u64(), expired["owner"].as_str()), (Some(0), Some("a")), "{expired}");
    let ended = expired["revision"].as_i64().unwrap();
    assert!(ended > revision);

    // Bad queries: 400 problem+json.
    for query in ["wait=5s", "after=x&wait=1s", "after=1&wait=5", "after=1&wait=5h", "after=1&watch=1", "after=-2"] {
        let reply = call(control, Method::GET, &format!("/v1/leases/k?{query}"), "").await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{query}");
        assert_eq!(reply.header("content-type"), Some("application/problem+json"));
        assert_eq!(reply.json()["type"].as_str().map(|t| t.ends_with("invalid-query")), Some(true), "{query}");
    }

    // Two watches wait; the third is refused with 429 until one of them ends.
    let waiting: Vec<_> = (0..2)
        .map(|_| {
            let path = format!("/v1/leases/k?after={ended}&wait=1500ms");
            tokio::spawn(async move { call(control, Method::GET, &path, "").await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let refused = call(control, Method::GET, &format!("/v1/leases/k?after={ended}&wait=1s"), "").await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS, "{}", refused.json());
    assert_eq!(refused.header("content-type"), Some("application/problem+json"));
    assert!(refused.header("retry-after").is_some());
    assert_eq!((refused.json()["limit"].as_str(), refused.json()["max"].as_u64()), (Some("client"), Some(2)));
    // A read without waiting is no watch: never refused.
    assert_eq!(call(control, Method::GET, "/v1/leases/k", "").await.status, StatusCode::OK);
    assert_eq!(gateway.metric("fencing_watchers").await.unwrap(), Some(2.0));
    for watch in waiting {
        assert_eq!(watch.await.unwrap().status, StatusCode::OK);
    }
    let again = call(control, Method::GET, &format!("/v1/leases/k?after={ended}&wait=100ms"), "").await;
    assert_eq!(again.status, StatusCode::OK, "a slot is free again");
    assert_eq!(gateway.metric("fencing_watch_refusals_total{limit=\"client\"}").await.unwrap(), Some(1.0));
    assert_eq!(gateway.metric("fencing_watch_listening").await.unwrap(), Some(1.0));

    // A key never acquired: 404 with revision 0; a watch from 0 is answered when it is.
    let none = call(control, Method::GET, "/v1/leases/fresh", "").await;
    assert_eq!((none.status, none.json()["revision"].as_i64()), (StatusCode::NOT_FOUND, Some(0)));
    let watch =
        tokio::spawn(async move { call(control, Method::GET, "/v1/leases/fresh?after=0&wait=1500ms", "").await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    call(control, Method::POST, "/v1/leases/fresh/acquire", r#"{"owner":"z","ttl_ms":10000}"#).await;
    let created = watch.await.unwrap();
    assert_eq!((created.status, created.json()["owner"].as_str()), (StatusCode::OK, Some("z")));
}

/// A cluster's members: a join, a leave and an expiry each wake a watcher with a later revision
/// and the members as they are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_members_watch_wakes_on_join_leave_and_expiry() {
    let db = TestDb::new().await;
    let gateway = Gateway::start(&db.url(), ROUTES).await.unwrap();
    let control = gateway.control;
    let beat = async |node: &str, ttl_ms: u64| {
        let path = format!("/v1/clusters/c/nodes/{node}/heartbeat");
        let reply =
            call(control, Method::POST, &path, &format!(r#"{{"incarnation":"{node}-1","ttl_ms":{ttl_ms}}}"#)).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.json());
    };
    let nodes = |body: &Value| -> Vec<String> {
        body["nodes"].as_array().unwrap().iter().map(|n| n["node_id"].as_str().unwrap().to_owned()).collect()
    };
    let first = call(control, Method::GET, "/v1/clusters/c/nodes", "").await.json();
    assert_eq!((nodes(&first), first["revision"].as_i64()), (vec![], Some(0)));
    let watch_from = |after: i64| {
        tokio::spawn(async move {
            call(control, Method::GET, &format!("/v1/clusters/c/nodes?after={after}&wait=20s"), "").await
        })
    };

    let join = watch_from(0);
    tokio::time::sleep(Duration::from_millis(200)).await;
    beat("n1", 60_000).await;
    beat("n2", 1_000).await;
    let joined = join.await.unwrap().json();
    let mut revision = joined["revision"].as_i64().unwrap();
    assert!(revision > 0);
    // Both joins, or the first only (the second then answers the next watch at once).
    if nodes(&joined).len() < 2 {
        let next = watch_from(revision).await.unwrap().json();
        revision = next["revision"].as_i64().unwrap();
        assert_eq!(nodes(&next), ["n1", "n2"]);
    }
    // n2 stops heartbeating: its expiry, 1 s later, wakes the watcher.
    let asked = Instant::now();
    let expired = watch_from(revision).await.unwrap().json();
    assert_eq!(nodes(&expired), ["n1"], "{expired}");
    assert!(
        asked.elapsed() < Duration::from_secs(4),
        "woken by the expiry (1 s), not the wait's end (20 s): {:?}",
        asked.elapsed()
    );
    revision = expired["revision"].as_i64().unwrap();
    let leave = watch_from(revision);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let left = call(control, Method::POST, "/v1/clusters/c/nodes/n1/leave", r#"{"incarnation":"n1-1"}"#).await;
    assert_eq!(left.status, StatusCode::NO_CONTENT);
    let after_leave = leave.await.unwrap().json();
    assert!(nodes(&after_leave).is_empty() && after_leave["revision"].as_i64() > Some(revision), "{after_leave}");
}
