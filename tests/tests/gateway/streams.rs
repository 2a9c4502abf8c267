//! The fenced log over HTTP (`/v1/streams/...`): a leader appends with its `Fencing-Token`, a
//! follower long-polls the entries and reports its position; a zombie's append is answered 409
//! and no follower ever reads it; bad input, an unknown stream and a reader behind retention get
//! their problems.

use std::time::Duration;

use fencing_schema::log::{self as store_log, Retention};
use fencing_schema::store;
use fencing_tests::gateway::{Gateway, JSON, Reply, send};
use fencing_tests::pg::TestDb;
use http::{Method, StatusCode};
use serde_json::json;

const ROUTES: &str = "[[routes]]\nprefix = \"/r\"\nupstream = \"http://127.0.0.1:1\"\nresource = { fixed = \"r\" }\n";

async fn append(control: std::net::SocketAddr, stream: &str, token: &str, body: &str) -> Reply {
    send(control, Method::POST, &format!("/v1/streams/{stream}/entries"), &[JSON, ("fencing-token", token)], body)
        .await
        .unwrap()
}

fn kind(reply: &Reply) -> String {
    reply.json()["type"].as_str().unwrap_or_default().rsplit(':').next().unwrap_or_default().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_over_http_tails_the_leaders_appends_and_never_reads_the_zombies() {
    let db = TestDb::new().await;
    let admin = db.connect().await;
    store_log::create_stream(&admin, "orders", "orders-leader", Retention::default()).await.unwrap();
    let gateway = Gateway::start(&db.url(), ROUTES).await.unwrap();
    let control = gateway.control;
    let a = store::acquire(&admin, "orders-leader", "a", Duration::from_secs(60)).await.unwrap().term.unwrap();

    let reply = append(control, "orders", &a.to_string(), r#"{"entries": [{"n": 1}, {"n": 2}]}"#).await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    assert_eq!((reply.json()["first_seq"].as_i64(), reply.json()["last_seq"].as_i64()), (Some(1), Some(2)));

    // A follower waits after 2: the next admitted append answers it.
    let waiting = tokio::spawn(async move {
        send(control, Method::GET, "/v1/streams/orders/entries?after=2&wait=20s", &[], "").await.unwrap()
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "nothing after 2 yet: the follower waits");

    // a loses the lease (nobody holds it), then b leads: a's appends (a zombie's) are refused
    // and append nothing.
    store::force_release(&admin, "orders-leader", "test", "a is cut off").await.unwrap();
    let zombie = append(control, "orders", &a.to_string(), r#"{"entries": [{"zombie": true}]}"#).await;
    assert_eq!(zombie.status, StatusCode::CONFLICT, "{:?}", zombie.body);
    assert_eq!(kind(&zombie), "not-leader", "{:?}", zombie.body);
    assert_eq!(zombie.json()["presented_term"].as_i64(), Some(a));
    let b = store::acquire(&admin, "orders-leader", "b", Duration::from_secs(60)).await.unwrap().term.unwrap();
    let zombie = append(control, "orders", &a.to_string(), r#"{"entries": [{"zombie": true}]}"#).await;
    assert_eq!((zombie.status, kind(&zombie)), (StatusCode::CONFLICT, "stale-term".to_owned()), "{:?}", zombie.body);
    let reply = append(control, "orders", &b.to_string(), r#"{"entries": [{"n": 3}]}"#).await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    assert_eq!(reply.json()["first_seq"].as_i64(), Some(3));
    let zombie = append(control, "orders", &a.to_string(), r#"{"entries": [{"zombie": true}]}"#).await;
    assert_eq!((zombie.status, kind(&zombie)), (StatusCode::CONFLICT, "stale-term".to_owned()), "{:?}", zombie.body);
    assert_eq!(zombie.json()["current_term"].as_i64(), Some(b));
    assert_eq!(zombie.header("fencing-current-term").map(str::to_owned), Some(b.to_string()));

    let woken = tokio::time::timeout(Duration::from_secs(15), waiting).await.unwrap().unwrap();
    assert_eq!(woken.status, StatusCode::OK, "{:?}", woken.body);
    assert_eq!(
        woken.json()["entries"],
        json!([{"seq": 3, "term": b, "appended_at": woken.json()["entries"][0]["appended_at"], "payload": {"n": 3}}])
    );

    // The whole log: exactly the admitted entries, in order, with their terms.
    let all = send(control, Method::GET, "/v1/streams/orders/entries?after=0&limit=10", &[], "").await.unwrap();
    let entries: Vec<(i64, i64, serde_json::Value)> = all.json()["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["seq"].as_i64().unwrap(), e["term"].as_i64().unwrap(), e["payload"].clone()))
        .collect();
    assert_eq!(entries, vec![(1, a, json!({"n": 1})), (2, a, json!({"n": 2})), (3, b, json!({"n": 3}))]);
    assert_eq!(all.json()["last_seq"].as_i64(), Some(3));
    assert_eq!(gateway.metric("fencing_log_appends_total{outcome=\"refused\"}").await.unwrap(), Some(3.0));

    // The follower reports its position; the stream shows it with its lag.
    let reported =
        send(control, Method::PUT, "/v1/streams/orders/followers/f1", &[JSON], r#"{"applied": 2}"#).await.unwrap();
    assert_eq!(reported.status, StatusCode::OK, "{:?}", reported.body);
    assert_eq!((reported.json()["head"].as_i64(), reported.json()["lag_entries"].as_i64()), (Some(3), Some(1)));
    let stream = send(control, Method::GET, "/v1/streams/orders", &[], "").await.unwrap();
    assert_eq!(stream.status, StatusCode::OK, "{:?}", stream.body);
    assert_eq!(stream.json()["lease_key"], json!("orders-leader"));
    assert_eq!(stream.json()["followers"][0]["follower"], json!("f1"));
    assert_eq!(stream.json()["followers"][0]["applied"], json!(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_appends_and_reads_get_their_problems_and_change_nothing() {
    let db = TestDb::new().await;
    let admin = db.connect().await;
    let retention = Retention { keep_count: Some(1), keep_age: None, max_entries: None };
    store_log::create_stream(&admin, "s", "s-leader", retention).await.unwrap();
    let gateway = Gateway::start(&db.url(), ROUTES).await.unwrap();
    let control = gateway.control;
    let term = store::acquire(&admin, "s-leader", "a", Duration::from_secs(60)).await.unwrap().term.unwrap();
    let token = term.to_string();
    let cases: Vec<(Reply, StatusCode, &str)> = vec![
        (
            send(control, Method::POST, "/v1/streams/s/entries", &[JSON], r#"{"entries": [1]}"#).await.unwrap(),
            StatusCode::PRECONDITION_REQUIRED,
            "missing-token",
        ),
        (append(control, "s", "x", r#"{"entries": [1]}"#).await, StatusCode::BAD_REQUEST, "malformed-request"),
        (
            append(control, "s", &token, r#"{"entries": []}"#).await,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid-argument",
        ),
        (
            append(control, "s", &token, r#"{"entries": [1], "x": 2}"#).await,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid-body",
        ),
        (append(control, "s", &token, r#"{"entries": "#).await, StatusCode::BAD_REQUEST, "malformed-json"),
        (
            send(control, Method::POST, "/v1/streams/s/entries", &[("fencing-token", &token)], r#"{"entries": [1]}"#)
                .await
                .unwrap(),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported-media-type",
        ),
        (append(control, "missing", &token, r#"{"entries": [1]}"#).await, StatusCode::NOT_FOUND, "no-such-stream"),
        (
            append(control, "s", &(term + 1).to_string(), r#"{"entries": [1]}"#).await,
            StatusCode::CONFLICT,
            "future-term",
        ),
        (
            send(control, Method::GET, "/v1/streams/s/entries?limit=0", &[], "").await.unwrap(),
            StatusCode::BAD_REQUEST,
            "invalid-query",
        ),
        (
            send(control, Method::GET, "/v1/streams/missing/entries", &[], "").await.unwrap(),
            StatusCode::NOT_FOUND,
            "no-such-stream",
        ),
        (
            send(control, Method::PUT, "/v1/streams/s/followers/f", &[JSON], r#"{"applied": 5}"#).await.unwrap(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid-argument",
        ),
    ];
    for (reply, status, expected) in cases {
        assert_eq!((reply.status, kind(&reply)), (status, expected.to_owned()), "{:?}", reply.body);
    }
    assert_eq!(store_log::status(&admin, "s").await.unwrap().head, 0, "nothing was appended");

    // Behind retention: 410 with the sequence to resnapshot from.
    let reply = append(control, "s", &token, r#"{"entries": [1, 2, 3]}"#).await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    assert_eq!(store_log::retain(&admin, "s").await.unwrap(), 2);
    let gone = send(control, Method::GET, "/v1/streams/s/entries?after=0", &[], "").await.unwrap();
    assert_eq!((gone.status, kind(&gone)), (StatusCode::GONE, "compacted".to_owned()), "{:?}", gone.body);
    assert_eq!(gone.json()["first_seq"].as_i64(), Some(3));
    let on = send(control, Method::GET, "/v1/streams/s/entries?after=2", &[], "").await.unwrap();
    assert_eq!(on.json()["entries"][0]["seq"].as_i64(), Some(3));
    // A follower reporting a position retention passed is told the same, and registers nothing.
    let late = send(control, Method::PUT, "/v1/streams/s/followers/late", &[JSON], r#"{"applied": 1}"#).await.unwrap();
    assert_eq!((late.status, kind(&late)), (StatusCode::GONE, "compacted".to_owned()), "{:?}", late.body);
    assert_eq!(late.json()["first_seq"].as_i64(), Some(3));
    assert_eq!(store_log::position(&admin, "s", "late").await.unwrap(), None);
}
