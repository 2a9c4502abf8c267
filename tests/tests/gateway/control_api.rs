//! The control listener: the lease API, fences, metrics and health, and its bad input.

use fencing_tests::fencing_state;
use fencing_tests::gateway::{JSON, send};
use http::{Method, StatusCode};
use serde_json::Value;

use crate::Setup;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_api_acquires_renews_releases_and_reports_conflicts() {
    let setup = Setup::new().await;
    let control = setup.gateway.control;
    let call = |method: Method, path: &'static str, body: &'static str| async move {
        send(control, method, path, &[JSON], body).await.unwrap()
    };

    let a = call(Method::POST, "/v1/leases/jobs/acquire", r#"{"owner":"a","ttl_ms":30000}"#).await;
    assert_eq!(a.status, StatusCode::OK);
    let lease = a.json();
    assert_eq!(
        (lease["key"].as_str(), lease["owner"].as_str(), lease["term"].as_i64()),
        (Some("jobs"), Some("a"), Some(1))
    );
    assert_eq!(lease["ttl_ms"], 30000);
    assert!(lease["remaining_ms"].as_u64().is_some_and(|ms| ms > 25_000 && ms <= 30_000), "{lease}");
    assert!(lease["expires_at"].as_str().is_some_and(|t| t.ends_with('Z') && t.contains('T')), "RFC 3339: {lease}");

    let b = call(Method::POST, "/v1/leases/jobs/acquire", r#"{"owner":"b","ttl_ms":30000}"#).await;
    assert_eq!(b.status, StatusCode::CONFLICT);
    assert_eq!(b.header("content-type"), Some("application/problem+json"));
    assert_eq!((b.json()["holder"].as_str(), b.json()["term"].as_i64()), (Some("a"), Some(1)));
    assert!(b.json()["expires_at"].is_string());

    let renewed = call(Method::POST, "/v1/leases/jobs/renew", r#"{"owner":"a","ttl_ms":20000}"#).await;
    assert_eq!((renewed.status, renewed.json()["term"].as_i64()), (StatusCode::OK, Some(1)));
    let not_holder = call(Method::POST, "/v1/leases/jobs/renew", r#"{"owner":"b","ttl_ms":20000}"#).await;
    assert_eq!(not_holder.status, StatusCode::CONFLICT);
    let not_holder = call(Method::POST, "/v1/leases/jobs/release", r#"{"owner":"b"}"#).await;
    assert_eq!(not_holder.status, StatusCode::CONFLICT);

    let got = call(Method::GET, "/v1/leases/jobs", "").await;
    assert_eq!((got.status, got.json()["owner"].as_str()), (StatusCode::OK, Some("a")));
    assert_eq!(call(Method::GET, "/v1/leases/nobody", "").await.status, StatusCode::NOT_FOUND);
    assert_eq!(call(Method::GET, "/v1/fences/nothing", "").await.status, StatusCode::NOT_FOUND);

    let released = call(Method::POST, "/v1/leases/jobs/release", r#"{"owner":"a"}"#).await;
    assert_eq!(released.status, StatusCode::NO_CONTENT);
    let next = call(Method::POST, "/v1/leases/jobs/acquire", r#"{"owner":"b","ttl_ms":30000}"#).await;
    assert_eq!(
        (next.status, next.json()["term"].as_i64()),
        (StatusCode::OK, Some(2)),
        "a released term is never reused"
    );

    let metrics = call(Method::GET, "/metrics", "").await;
    let text = String::from_utf8_lossy(&metrics.body);
    assert!(text.contains("fencing_lease_operations_total"), "{text}");
    // `jobs` is no configured lease key: counted as `other`.
    assert!(text.contains("fencing_lease_transitions_total{key=\"other\"} 2"), "{text}");
    assert_eq!(call(Method::GET, "/healthz", "").await.status, StatusCode::OK);
    assert_eq!(call(Method::GET, "/readyz", "").await.status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_lease_requests_get_400_or_422_and_write_nothing() {
    let setup = Setup::new().await;
    let control = setup.gateway.control;
    let client = setup.db.connect().await;
    let before = fencing_state(&client).await;
    for (body, status, fragment) in [
        ("{not json", StatusCode::BAD_REQUEST, "malformed-json"),
        ("", StatusCode::BAD_REQUEST, "malformed-json"),
        (r#"{"owner":"a","ttl_ms":1000,"extra":1}"#, StatusCode::UNPROCESSABLE_ENTITY, "invalid-body"),
        (r#"{"owner":"a"}"#, StatusCode::UNPROCESSABLE_ENTITY, "invalid-body"),
        (r#"{"owner":"a","ttl_ms":"soon"}"#, StatusCode::UNPROCESSABLE_ENTITY, "invalid-body"),
        (r#"{"owner":"a","ttl_ms":-5}"#, StatusCode::UNPROCESSABLE_ENTITY, "invalid-body"),
        (r#"{"owner":"a","ttl_ms":10}"#, StatusCode::UNPROCESSABLE_ENTITY, "ttl-out-of-bounds"),
        (r#"{"owner":"a","ttl_ms":99999999}"#, StatusCode::UNPROCESSABLE_ENTITY, "ttl-out-of-bounds"),
        (r#"{"owner":"","ttl_ms":1000}"#, StatusCode::UNPROCESSABLE_ENTITY, "invalid-argument"),
    ] {
        for op in ["acquire", "renew"] {
            let reply = send(control, Method::POST, &format!("/v1/leases/k/{op}"), &[JSON], body).await.unwrap();
            assert_eq!(reply.status, status, "{op} {body}: {}", String::from_utf8_lossy(&reply.body));
            assert_eq!(reply.header("content-type"), Some("application/problem+json"));
            assert!(
                reply.json()["type"].as_str().is_some_and(|t| t.ends_with(fragment)),
                "{op} {body}: {}",
                reply.json()
            );
        }
    }
    let reply = send(control, Method::POST, "/v1/leases/k/release", &[JSON], r#"{"owner":"a","x":1}"#).await.unwrap();
    assert_eq!(reply.status, StatusCode::UNPROCESSABLE_ENTITY);
    let long_key = format!("/v1/leases/{}/acquire", "k".repeat(300));
    let reply = send(control, Method::POST, &long_key, &[JSON], r#"{"owner":"a","ttl_ms":1000}"#).await.unwrap();
    assert_eq!(reply.status, StatusCode::UNPROCESSABLE_ENTITY);
    let unknown = send(control, Method::GET, "/v2/anything", &[], "").await.unwrap();
    assert_eq!((unknown.status, unknown.json()["status"].clone()), (StatusCode::NOT_FOUND, Value::from(404)));
    assert_eq!(fencing_state(&client).await, before, "nothing was written");
}

/// Series whose labels are known in advance are exported at 0 from start-up; lease keys the
/// configuration does not name are counted as `other`, so clients cannot grow the series.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn known_series_start_at_zero_and_unnamed_lease_keys_count_as_other() {
    let setup = Setup::new().await;
    let control = setup.gateway.control;
    let metrics = || async move {
        String::from_utf8_lossy(&send(control, Method::GET, "/metrics", &[], "").await.unwrap().body).into_owned()
    };
    let has = |text: &str, name: &str, labels: &[&str], value: &str| {
        text.lines().any(|line| {
            line.starts_with(&format!("{name}{{"))
                && labels.iter().all(|label| line.contains(label))
                && line.ends_with(&format!(" {value}"))
        })
    };
    let text = metrics().await;
    for (name, labels) in [
        ("fencing_writes_total", vec![r#"route="/ledger""#, r#"outcome="unavailable""#]),
        ("fencing_writes_total", vec![r#"route="/jobs""#, r#"outcome="stale""#]),
        ("fencing_upstream_errors_total", vec![r#"route="/dead""#, r#"kind="connect""#]),
        ("fencing_store_errors_total", vec![r#"kind="timeout""#]),
        ("fencing_lease_operations_total", vec![r#"op="renew""#, r#"result="error""#]),
        ("fencing_lease_transitions_total", vec![r#"key="ledger-writer""#]),
        ("fencing_lease_transitions_total", vec![r#"key="other""#]),
    ] {
        assert!(has(&text, name, &labels, "0"), "{name} {labels:?} is not exported at 0:\n{text}");
    }

    // A thousand keys nobody configured: one series, `other`.
    for i in 0..1000 {
        let key = format!("/v1/leases/random-{}-{i}/acquire", rand::random::<u32>());
        let reply = send(control, Method::POST, &key, &[JSON], r#"{"owner":"o","ttl_ms":1000}"#).await.unwrap();
        assert_eq!(reply.status, StatusCode::OK);
    }
    let text = metrics().await;
    let series: Vec<&str> = text.lines().filter(|line| line.starts_with("fencing_lease_transitions_total{")).collect();
    assert_eq!(series.len(), 2, "{series:?}");
    assert!(has(&text, "fencing_lease_transitions_total", &[r#"key="other""#], "1000"), "{series:?}");
}

/// The gateway's own view of each configured lease, for leaders in any language: held, term,
/// time left, and renewals it refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_exports_its_view_of_each_configured_lease() {
    let setup = Setup::new().await;
    let control = setup.gateway.control;
    let metrics = || async move {
        String::from_utf8_lossy(&send(control, Method::GET, "/metrics", &[], "").await.unwrap().body).into_owned()
    };
    let value = |text: &str, name: &str| -> Option<f64> {
        text.lines()
            .find(|line| line.starts_with(&format!("{name}{{key=\"ledger-writer\"}} ")))
            .and_then(|line| line.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    };
    let acquired =
        send(control, Method::POST, "/v1/leases/ledger-writer/acquire", &[JSON], r#"{"owner":"a","ttl_ms":30000}"#)
            .await
            .unwrap();
    assert_eq!(acquired.status, StatusCode::OK);
    let mut seen = None;
    for _ in 0..50 {
        let text = metrics().await;
        if value(&text, "fencing_lease_held") == Some(1.0) {
            seen = Some(text);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let text = seen.expect("fencing_lease_held{key=\"ledger-writer\"} never became 1");
    assert_eq!(value(&text, "fencing_lease_term"), Some(1.0), "{text}");
    assert!(value(&text, "fencing_lease_remaining_seconds").is_some_and(|s| s > 20.0 && s <= 30.0), "{text}");
    assert_eq!(value(&text, "fencing_lease_lock_delay_remaining_seconds"), Some(0.0), "held: no delay. {text}");

    let refused =
        send(control, Method::POST, "/v1/leases/ledger-writer/renew", &[JSON], r#"{"owner":"b","ttl_ms":30000}"#)
            .await
            .unwrap();
    assert_eq!(refused.status, StatusCode::CONFLICT);
    let text = metrics().await;
    assert_eq!(value(&text, "fencing_lease_renew_failures_total"), Some(1.0), "{text}");

    let released =
        send(control, Method::POST, "/v1/leases/ledger-writer/release", &[JSON], r#"{"owner":"a"}"#).await.unwrap();
    assert_eq!(released.status, StatusCode::NO_CONTENT);
    let mut released_seen = false;
    for _ in 0..50 {
        if value(&metrics().await, "fencing_lease_held") == Some(0.0) {
            released_seen = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(released_seen, "the released lease still shows a holder");
}

/// Cluster membership over HTTP, for processes in any language: heartbeats register and
/// refresh nodes, the list shows the live ones with their metadata, one live incarnation per
/// node id (the holder is never named), leave ends a node at once, bad input changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_heartbeat_list_and_leave_through_the_control_api() {
    let setup = Setup::new().await;
    let control = setup.gateway.control;
    let call = |method: Method, path: &'static str, body: &'static str| async move {
        send(control, method, path, &[JSON], body).await.unwrap()
    };
    let beat = call(
        Method::POST,
        "/v1/clusters/workers/nodes/n1/heartbeat",
        r#"{"incarnation":"p1","ttl_ms":30000,"metadata":{"zone":"a"}}"#,
    )
    .await;
    assert_eq!(beat.status, StatusCode::OK, "{}", beat.json());
    assert!(beat.json()["remaining_ms"].as_u64().is_some_and(|ms| ms > 25_000 && ms <= 30_000), "{}", beat.json());
    let started = beat.json()["started_at"].clone();
    let again = call(
        Method::POST,
        "/v1/clusters/workers/nodes/n1/heartbeat",
        r#"{"incarnation":"p1","ttl_ms":30000,"metadata":{"zone":"a"}}"#,
    )
    .await;
    assert_eq!((again.status, &again.json()["started_at"]), (StatusCode::OK, &started), "a refresh keeps the start");
    call(Method::POST, "/v1/clusters/workers/nodes/n2/heartbeat", r#"{"incarnation":"p2","ttl_ms":30000}"#).await;

    let listed = call(Method::GET, "/v1/clusters/workers/nodes", "").await;
    assert_eq!(listed.status, StatusCode::OK);
    let nodes = listed.json()["nodes"].as_array().cloned().unwrap_or_default();
    let ids: Vec<&str> = nodes.iter().filter_map(|node| node["node_id"].as_str()).collect();
    assert_eq!(ids, ["n1", "n2"]);
    assert_eq!(nodes[0]["metadata"]["zone"], "a", "{}", listed.json());

    // Another process with n1's id: refused, and not told which incarnation holds it.
    let taken =
        call(Method::POST, "/v1/clusters/workers/nodes/n1/heartbeat", r#"{"incarnation":"p9","ttl_ms":30000}"#).await;
    assert_eq!(taken.status, StatusCode::CONFLICT);
    assert!(taken.json()["type"].as_str().is_some_and(|t| t.ends_with("node-id-in-use")), "{}", taken.json());
    assert!(
        !String::from_utf8_lossy(&taken.body).contains("p1"),
        "the holder's incarnation leaked: {}",
        String::from_utf8_lossy(&taken.body)
    );
    let not_it = call(Method::POST, "/v1/clusters/workers/nodes/n1/leave", r#"{"incarnation":"p9"}"#).await;
    assert_eq!(not_it.status, StatusCode::CONFLICT);

    // Bad input: each refused, nothing changes.
    let before =
        fencing_tests::snapshot(&setup.db.connect().await, "SELECT * FROM fencing.nodes ORDER BY node_id").await;
    for (path, body, status) in [
        (
            "/v1/clusters/workers/nodes/n3/heartbeat",
            r#"{"incarnation":"p3","ttl_ms":1}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            "/v1/clusters/workers/nodes/n3/heartbeat",
            r#"{"incarnation":"","ttl_ms":30000}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            "/v1/clusters/workers/nodes/n3/heartbeat",
            r#"{"incarnation":"p3","ttl_ms":30000,"metadata":[1]}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            "/v1/clusters/workers/nodes/n3/heartbeat",
            r#"{"incarnation":"p3","ttl_ms":30000,"extra":1}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        ("/v1/clusters/workers/nodes/n3/heartbeat", r#"{"incarnation":"p3""#, StatusCode::BAD_REQUEST),
    ] {
        let reply = call(Method::POST, path, body).await;
        assert_eq!(reply.status, status, "{body}: {}", String::from_utf8_lossy(&reply.body));
        assert_eq!(reply.header("content-type"), Some("application/problem+json"), "{body}");
    }
    let untyped = send(
        control,
        Method::POST,
        "/v1/clusters/workers/nodes/n3/heartbeat",
        &[],
        r#"{"incarnation":"p3","ttl_ms":30000}"#,
    )
    .await
    .unwrap();
    assert_eq!(untyped.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let after =
        fencing_tests::snapshot(&setup.db.connect().await, "SELECT * FROM fencing.nodes ORDER BY node_id").await;
    assert_eq!(after, before, "bad input changed the nodes");

    // Leave: gone from the list at once.
    let left = call(Method::POST, "/v1/clusters/workers/nodes/n1/leave", r#"{"incarnation":"p1"}"#).await;
    assert_eq!(left.status, StatusCode::NO_CONTENT);
    let listed = call(Method::GET, "/v1/clusters/workers/nodes", "").await;
    let ids: Vec<String> = listed.json()["nodes"]
        .as_array()
        .map(|nodes| nodes.iter().filter_map(|node| node["node_id"].as_str().map(str::to_owned)).collect())
        .unwrap_or_default();
    assert_eq!(ids, ["n2"]);
}

#[tokio::test]
async fn daemons_offer_reconcile_acknowledge_and_stop_through_the_control_api() {
    let setup = Setup::new().await;
    let control = setup.gateway.control;
    let call = |method: Method, path: String, body: String| async move {
        send(control, method, &path, &[JSON], &body).await.unwrap()
    };
    for (node, incarnation) in [("n1", "p1"), ("n2", "p2")] {
        let beat = call(
            Method::POST,
            format!("/v1/clusters/workers/nodes/{node}/heartbeat"),
            format!(r#"{{"incarnation":"{incarnation}","ttl_ms":30000}}"#),
        )
        .await;
        assert_eq!(beat.status, StatusCode::OK);
        let offered = call(
            Method::POST,
            format!("/v1/clusters/workers/nodes/{node}/assignments"),
            format!(r#"{{"incarnation":"{incarnation}","daemons":["d1","d2"]}}"#),
        )
        .await;
        assert_eq!(offered.status, StatusCode::OK, "{}", offered.json());
        assert_eq!(offered.json()["assignments"], serde_json::json!([]));
    }
    let lease = call(
        Method::POST,
        "/v1/leases/workers-leader/acquire".to_owned(),
        r#"{"owner":"L","ttl_ms":30000}"#.to_owned(),
    )
    .await;
    let term = lease.json()["term"].as_i64().unwrap();
    let reconcile = |owner: &'static str, term: i64| {
        call(
            Method::POST,
            "/v1/clusters/workers/reconcile".to_owned(),
            format!(
                r#"{{"lease":"workers-leader","owner":"{owner}","term":{term},"ack_timeout_ms":30000,"drain_timeout_ms":30000}}"#
            ),
        )
    };
    let pass = reconcile("L", term).await;
    assert_eq!(pass.status, StatusCode::OK, "{}", pass.json());
    assert_eq!(pass.json()["changes"].as_array().map(Vec::len), Some(2), "{}", pass.json());

    // A zombie or forged leader: refused, nothing changes.
    let db = setup.db.connect().await;
    let before = fencing_tests::snapshot(&db, "SELECT * FROM fencing.daemons ORDER BY daemon").await;
    for (owner, presented) in [("L", term + 1), ("M", term)] {
        let refused = reconcile(owner, presented).await;
        assert_eq!(refused.status, StatusCode::CONFLICT, "{owner} {presented}: {}", refused.json());
        assert!(refused.json()["type"].as_str().is_some_and(|t| t.ends_with("not-leader")));
    }
    assert_eq!(fencing_tests::snapshot(&db, "SELECT * FROM fencing.daemons ORDER BY daemon").await, before);

    let mine = call(
        Method::POST,
        "/v1/clusters/workers/nodes/n1/assignments".to_owned(),
        r#"{"incarnation":"p1","daemons":["d1","d2"]}"#.to_owned(),
    )
    .await;
    let assignment = mine.json()["assignments"][0].clone();
    assert_eq!(assignment["state"], "assigning", "{}", mine.json());
    let daemon = assignment["daemon"].as_str().unwrap().to_owned();
    let generation = assignment["generation"].as_i64().unwrap();
    let step = |node: &'static str, incarnation: &'static str, op: &'static str, generation: i64| {
        call(
            Method::POST,
            format!("/v1/clusters/workers/nodes/{node}/assignments/{daemon}/{op}"),
            format!(r#"{{"incarnation":"{incarnation}","generation":{generation}}}"#),
        )
    };
    // Only n1's own incarnation acknowledges n1's assignment, once.
    for (node, incarnation, presented) in [("n1", "p9", generation), ("n2", "p2", generation), ("n1", "p1", 99)] {
        let refused = step(node, incarnation, "ack", presented).await;
        assert_eq!(refused.status, StatusCode::CONFLICT, "{node} {incarnation} {presented}");
        assert!(refused.json()["type"].as_str().is_some_and(|t| t.ends_with("assignment-moved")));
    }
    let acked = step("n1", "p1", "ack", generation).await;
    assert_eq!(acked.status, StatusCode::OK, "{}", acked.json());
    assert_eq!(acked.json()["fencing_token"], generation);
    assert_eq!(step("n1", "p1", "ack", generation).await.status, StatusCode::CONFLICT, "acknowledged once");

    // Bad input: refused with problem+json, nothing changes.
    let before = fencing_tests::snapshot(&db, "SELECT * FROM fencing.daemons ORDER BY daemon").await;
    let many: Vec<String> = (0..101).map(|i| format!("\"d{i}\"")).collect();
    for (path, body) in [
        (
            "/v1/clusters/workers/nodes/n1/assignments".to_owned(),
            format!(r#"{{"incarnation":"p1","daemons":[{}]}}"#, many.join(",")),
        ),
        ("/v1/clusters/workers/nodes/n1/assignments".to_owned(), r#"{"incarnation":"p1","daemons":[""]}"#.to_owned()),
        (
            format!("/v1/clusters/workers/nodes/n1/assignments/{daemon}/ack"),
            r#"{"incarnation":"p1","generation":0}"#.to_owned(),
        ),
        (
            format!("/v1/clusters/workers/nodes/n1/assignments/{daemon}/stopped"),
            r#"{"incarnation":"p1","generation":1,"x":1}"#.to_owned(),
        ),
        (
            "/v1/clusters/workers/reconcile".to_owned(),
            format!(
                r#"{{"lease":"workers-leader","owner":"L","term":{term},"ack_timeout_ms":0,"drain_timeout_ms":1}}"#
            ),
        ),
    ] {
        let reply = call(Method::POST, path.clone(), body.clone()).await;
        assert_eq!(reply.status, StatusCode::UNPROCESSABLE_ENTITY, "{path} {body}: {}", reply.json());
        assert_eq!(reply.header("content-type"), Some("application/problem+json"));
    }
    assert_eq!(fencing_tests::snapshot(&db, "SELECT * FROM fencing.daemons ORDER BY daemon").await, before);

    // Stopped: the assignment ends, and the list shows it waiting for a node.
    assert_eq!(step("n1", "p1", "stopped", generation).await.status, StatusCode::NO_CONTENT);
    let listed = call(Method::GET, "/v1/clusters/workers/daemons".to_owned(), String::new()).await;
    let states = listed.json()["daemons"].as_array().cloned().unwrap_or_default();
    let state = states.iter().find(|d| d["daemon"] == daemon.as_str()).unwrap();
    assert_eq!((state["state"].as_str(), state["reason"].as_str()), (Some("unassigned"), Some("released")));
}

/// A leader's value through the control API: set at acquire, read by anyone with `GET`, changed
/// by its own `PUT .../value`; a zombie (the old holder, with its old term) cannot overwrite the
/// new leader's, neither by `PUT` nor by a renewal; bad input is 400, 415 or 422 problem+json and
/// changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leaders_value_is_the_holders_and_a_zombie_cannot_overwrite_it() {
    let setup = Setup::new().await;
    let control = setup.gateway.control;
    let call = |method: Method, path: &'static str, body: String| async move {
        send(control, method, path, &[JSON], &body).await.unwrap()
    };
    let acquired =
        call(Method::POST, "/v1/leases/svc/acquire", r#"{"owner":"a","ttl_ms":1000,"value":{"addr":"a:7000"}}"#.into())
            .await;
    assert_eq!(acquired.status, StatusCode::OK, "{}", acquired.json());
    assert_eq!(acquired.json()["value"], serde_json::json!({"addr": "a:7000"}));
    let term_a = acquired.json()["term"].as_i64().unwrap();
    let got = call(Method::GET, "/v1/leases/svc", String::new()).await;
    assert_eq!(got.json()["value"], serde_json::json!({"addr": "a:7000"}));
    let changed = call(
        Method::PUT,
        "/v1/leases/svc/value",
        format!(r#"{{"owner":"a","term":{term_a},"value":{{"addr":"a:7001","version":"2"}}}}"#),
    )
    .await;
    assert_eq!(changed.status, StatusCode::OK, "{}", changed.json());
    assert_eq!(
        call(Method::GET, "/v1/leases/svc", String::new()).await.json()["value"],
        serde_json::json!({"addr": "a:7001", "version": "2"})
    );

    // a stops renewing (paused); its lease expires and b takes over with its own value.
    tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
    let b = call(Method::POST, "/v1/leases/svc/acquire", r#"{"owner":"b","ttl_ms":30000}"#.into()).await;
    assert_eq!(b.status, StatusCode::OK);
    let term_b = b.json()["term"].as_i64().unwrap();
    assert!(term_b > term_a);
    assert_eq!(
        call(Method::GET, "/v1/leases/svc", String::new()).await.json()["value"],
        serde_json::Value::Null,
        "a new term shows no value until its holder sets one, never the last leader's"
    );
    let set_b = format!(r#"{{"owner":"b","term":{term_b},"value":{{"addr":"b:7000"}}}}"#);
    assert_eq!(call(Method::PUT, "/v1/leases/svc/value", set_b).await.status, StatusCode::OK);

    // a resumes as a zombie: its old term's value is refused, and so is a renewal with a value.
    let zombie = call(
        Method::PUT,
        "/v1/leases/svc/value",
        format!(r#"{{"owner":"a","term":{term_a},"value":{{"addr":"zombie"}}}}"#),
    )
    .await;
    assert_eq!(zombie.status, StatusCode::CONFLICT);
    assert_eq!(zombie.header("content-type"), Some("application/problem+json"));
    let renewal =
        call(Method::POST, "/v1/leases/svc/renew", r#"{"owner":"a","ttl_ms":1000,"value":{"addr":"zombie"}}"#.into())
            .await;
    assert_eq!(renewal.status, StatusCode::CONFLICT);
    assert_eq!(
        call(Method::GET, "/v1/leases/svc", String::new()).await.json()["value"],
        serde_json::json!({"addr": "b:7000"}),
        "the zombie changed nothing"
    );

    // Bad input: nothing changes.
    let before = fencing_state(&setup.db.connect().await).await;
    let big = format!(r#"{{"owner":"b","term":{term_b},"value":"{}"}}"#, "x".repeat(5000));
    let too_large = call(Method::PUT, "/v1/leases/svc/value", big).await;
    assert_eq!(
        (too_large.status, too_large.json()["type"].as_str().map(|t| t.ends_with("value-too-large"))),
        (StatusCode::UNPROCESSABLE_ENTITY, Some(true)),
        "{}",
        too_large.json()
    );
    let missing_term = call(Method::PUT, "/v1/leases/svc/value", r#"{"owner":"b","value":1}"#.into()).await;
    assert_eq!(missing_term.status, StatusCode::UNPROCESSABLE_ENTITY);
    let malformed = call(Method::PUT, "/v1/leases/svc/value", r#"{"owner":"b","term":"#.into()).await;
    assert_eq!(malformed.status, StatusCode::BAD_REQUEST);
    let untyped =
        send(control, Method::PUT, "/v1/leases/svc/value", &[], r#"{"owner":"b","term":2,"value":1}"#).await.unwrap();
    assert_eq!(untyped.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let acquire_big = format!(r#"{{"owner":"c","ttl_ms":30000,"value":"{}"}}"#, "x".repeat(5000));
    assert_eq!(
        call(Method::POST, "/v1/leases/other/acquire", acquire_big).await.status,
        StatusCode::UNPROCESSABLE_ENTITY
    );
    // Values the gateway lets through but the store refuses: 3001 bytes as sent, 4499 as
    // Postgres prints JSON (a space after each comma); a NUL character, which Postgres's JSON
    // does not take. The acquire they came with is undone: 422, and no lease.
    let zeros = vec!["0"; 1501].join(",");
    for value in [format!("[{zeros}]"), r#""\u0000""#.to_owned()] {
        let body = format!(r#"{{"owner":"c","ttl_ms":30000,"value":{value}}}"#);
        let refused = call(Method::POST, "/v1/leases/other/acquire", body).await;
        assert_eq!(refused.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", refused.json());
        assert_eq!(refused.header("content-type"), Some("application/problem+json"));
    }
    assert_eq!(fencing_state(&setup.db.connect().await).await, before, "bad input changed nothing");
    assert_eq!(call(Method::GET, "/v1/leases/other", String::new()).await.status, StatusCode::NOT_FOUND);
    // JSON null in a renewal clears the value.
    let cleared =
        call(Method::POST, "/v1/leases/svc/renew", r#"{"owner":"b","ttl_ms":30000,"value":null}"#.into()).await;
    assert_eq!((cleared.status, cleared.json()["value"].clone()), (StatusCode::OK, serde_json::Value::Null));
    assert_eq!(call(Method::GET, "/v1/leases/svc", String::new()).await.json()["value"], serde_json::Value::Null);
}

/// Lock-delay through the control API: after a period that expired, an acquire is refused with
/// 409 `lock-delay`, what is left of the delay and `Retry-After`, and `GET` shows it; once it
/// has passed, the acquire succeeds with the next term.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_in_the_lock_delay_after_an_expiry_is_409_with_what_is_left() {
    let setup = Setup::new().await;
    let control = setup.gateway.control;
    let client = setup.db.connect().await;
    fencing_schema::store::set_lock_delay(&client, Some("svc"), Some(std::time::Duration::from_secs(2)), "ops", "test")
        .await
        .unwrap();
    let call = |method: Method, path: &'static str, body: &'static str| async move {
        send(control, method, path, &[JSON], body).await.unwrap()
    };
    let a = call(Method::POST, "/v1/leases/svc/acquire", r#"{"owner":"a","ttl_ms":1000}"#).await;
    assert_eq!(a.status, StatusCode::OK);
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let refused = call(Method::POST, "/v1/leases/svc/acquire", r#"{"owner":"b","ttl_ms":30000}"#).await;
    assert_eq!(refused.status, StatusCode::CONFLICT);
    let problem = refused.json();
    assert!(problem["type"].as_str().is_some_and(|t| t.ends_with("lock-delay")), "{problem}");
    assert_eq!((problem.get("holder"), problem["term"].as_i64()), (Some(&Value::Null), Some(1)), "{problem}");
    let left = problem["lock_delay_remaining_ms"].as_u64().unwrap();
    assert!(left > 0 && left <= 2000, "{problem}");
    assert!(refused.header("retry-after").is_some_and(|s| s.parse::<u64>().is_ok_and(|s| (1..=2).contains(&s))));
    let got = call(Method::GET, "/v1/leases/svc", "").await.json();
    assert!(got["lock_delay_remaining_ms"].as_u64().is_some_and(|ms| ms > 0 && ms <= 2000), "{got}");
    tokio::time::sleep(std::time::Duration::from_millis(left + 50)).await;
    let b = call(Method::POST, "/v1/leases/svc/acquire", r#"{"owner":"b","ttl_ms":30000}"#).await;
    assert_eq!((b.status, b.json()["term"].as_i64()), (StatusCode::OK, Some(2)), "{}", b.json());
}
