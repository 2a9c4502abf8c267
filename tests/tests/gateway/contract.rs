//! Every row of the contract's status table, the problem+json bodies and headers, the headers
//! the upstream sees, and bad input: each rejection leaves the upstream untouched.

use std::time::Duration;

use fencing_tests::gateway::{JSON, Reply, raw, send};
use http::{Method, StatusCode};
use serde_json::Value;

use crate::Setup;

/// Checks a problem+json rejection: status, content type, the RFC 9457 members.
fn problem(reply: &Reply, status: StatusCode) -> Value {
    assert_eq!(reply.status, status, "body: {}", String::from_utf8_lossy(&reply.body));
    assert_eq!(reply.header("content-type"), Some("application/problem+json"));
    let body = reply.json();
    for member in ["type", "title", "detail"] {
        assert!(body.get(member).and_then(Value::as_str).is_some_and(|v| !v.is_empty()), "{member} in {body}");
    }
    assert_eq!(body.get("status").and_then(Value::as_u64), Some(u64::from(status.as_u16())));
    body
}

/// Checks a fence rejection's members and `Fencing-Current-Term`.
fn fenced(reply: &Reply, resource: &str, presented: Option<i64>, current: i64) {
    let body = problem(reply, StatusCode::CONFLICT);
    assert_eq!(body["resource"], Value::from(resource), "{body}");
    assert_eq!(body["presented_term"], presented.map_or(Value::Null, Value::from), "{body}");
    assert_eq!(body["current_term"], Value::from(current), "{body}");
    assert_eq!(reply.header("fencing-current-term"), Some(current.to_string().as_str()));
}

async fn acquire(setup: &Setup, key: &str, owner: &str) -> i64 {
    let body = format!(r#"{{"owner":"{owner}","ttl_ms":60000}}"#);
    let reply =
        send(setup.gateway.control, Method::POST, &format!("/v1/leases/{key}/acquire"), &[JSON], &body).await.unwrap();
    assert_eq!(reply.status, StatusCode::OK, "{}", String::from_utf8_lossy(&reply.body));
    reply.json()["term"].as_i64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_row_of_the_status_table_with_its_problem_body_and_headers() {
    let mut setup = Setup::new().await;
    let proxy = setup.gateway.proxy;
    let term = acquire(&setup, "ledger-writer", "leader-1").await;
    let post = |path: &'static str, headers: Vec<(&'static str, &'static str)>, body: &'static str| async move {
        send(proxy, Method::POST, path, &headers, body).await.unwrap()
    };

    // Admitted, verify mode: the upstream's answer, stamped; client copies replaced or removed.
    let reply = post(
        "/ledger/acct-7/entries",
        vec![
            ("fencing-token", "1"),
            ("x-request-id", "admit-verify"),
            ("fencing-owner", "spoof"),
            ("fencing-resource", "spoof"),
        ],
        "entry",
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", String::from_utf8_lossy(&reply.body));
    assert_eq!(reply.header("fencing-token"), Some("1"));
    assert!(reply.header("x-upstream-seq").is_some(), "the upstream's own headers come through");
    // Admitted, stamp mode: the lease's term is used.
    let reply = post(
        "/ledger/acct-7/entries",
        vec![("fencing-lease", "ledger-writer"), ("fencing-owner", "leader-1"), ("x-request-id", "admit-stamp")],
        "entry",
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.header("fencing-token"), Some(term.to_string().as_str()));
    // An unbound resource named by header takes any term at or above its maximum.
    let reply =
        post("/jobs", vec![("fencing-token", "5"), ("fencing-resource", "job-a"), ("x-request-id", "admit-jobs")], "")
            .await;
    assert_eq!(reply.status, StatusCode::OK);

    let mut refused: Vec<&str> = Vec::new();
    // Term lower than the resource's maximum.
    let reply =
        post("/jobs", vec![("fencing-token", "4"), ("fencing-resource", "job-a"), ("x-request-id", "stale")], "").await;
    fenced(&reply, "job-a", Some(4), 5);
    refused.push("stale");
    // Stamp mode, owner does not hold the lease.
    let reply = post(
        "/ledger/acct-7/entries",
        vec![("fencing-lease", "ledger-writer"), ("fencing-owner", "intruder"), ("x-request-id", "not-leader")],
        "",
    )
    .await;
    fenced(&reply, "acct-7", None, term);
    refused.push("not-leader");
    // Bound resource, a term other than the lease's current term.
    let reply = post("/ledger/acct-7/entries", vec![("fencing-token", "2"), ("x-request-id", "future")], "").await;
    fenced(&reply, "acct-7", Some(2), term);
    refused.push("future");
    // No token and no lease.
    let reply = post("/ledger/acct-7/entries", vec![("x-request-id", "missing")], "").await;
    problem(&reply, StatusCode::PRECONDITION_REQUIRED);
    refused.push("missing");
    // Malformed tokens: not decimal, out of 1..2^63-1, repeated; lease without owner; both modes.
    for (id, headers) in [
        ("bad-alpha", vec![("fencing-token", "abc")]),
        ("bad-negative", vec![("fencing-token", "-1")]),
        ("bad-zero", vec![("fencing-token", "0")]),
        ("bad-overflow", vec![("fencing-token", "9223372036854775808")]),
        ("bad-fraction", vec![("fencing-token", "1.0")]),
        ("bad-repeated", vec![("fencing-token", "1"), ("fencing-token", "1")]),
        ("bad-lease-alone", vec![("fencing-lease", "ledger-writer")]),
        ("bad-both", vec![("fencing-token", "1"), ("fencing-lease", "ledger-writer"), ("fencing-owner", "leader-1")]),
    ] {
        let mut headers = headers;
        headers.push(("x-request-id", id));
        let reply = send(proxy, Method::POST, "/ledger/acct-7/entries", &headers, "").await.unwrap();
        problem(&reply, StatusCode::BAD_REQUEST);
        refused.push(id);
    }
    // A route naming the resource by header, without the header.
    let reply = post("/jobs", vec![("fencing-token", "5"), ("x-request-id", "no-resource")], "").await;
    problem(&reply, StatusCode::BAD_REQUEST);
    refused.push("no-resource");
    // No route.
    let reply = post("/nowhere", vec![("fencing-token", "1"), ("x-request-id", "no-route")], "").await;
    problem(&reply, StatusCode::NOT_FOUND);
    refused.push("no-route");
    // Body over the limit (1024 bytes here).
    let big = "x".repeat(2000);
    let reply = send(proxy, Method::POST, "/fixed", &[("fencing-token", "1"), ("x-request-id", "too-big")], &big)
        .await
        .unwrap();
    problem(&reply, StatusCode::PAYLOAD_TOO_LARGE);
    refused.push("too-big");

    // Upstream unreachable after admission: 502. Upstream too slow: 504.
    let reply = post("/dead", vec![("fencing-token", "1"), ("x-request-id", "dead")], "").await;
    problem(&reply, StatusCode::BAD_GATEWAY);
    let reply =
        post("/fixed", vec![("fencing-token", "1"), ("x-upstream-delay-ms", "4000"), ("x-request-id", "slow")], "")
            .await;
    problem(&reply, StatusCode::GATEWAY_TIMEOUT);

    let log = setup.upstream.collect(Duration::from_millis(300)).await.to_vec();
    for id in &refused {
        assert!(!setup.upstream.received(id), "rejected request {id} reached the upstream");
    }
    let verify = log.iter().find(|l| l["x_request_id"] == "admit-verify").expect("the admitted write arrived");
    assert_eq!(verify["fencing_token"], "1");
    assert_eq!(verify["fencing_resource"], "acct-7");
    assert_eq!(verify["fencing_owner"], Value::Null, "Fencing-Owner is never forwarded");
    assert_eq!(verify["host"], Value::from(setup.upstream.addr.to_string()), "Host is the upstream's");
    assert!(verify["forwarded"].as_str().is_some_and(|f| f.starts_with("for=\"127.0.0.1:")), "{verify}");
    assert_eq!(verify["path"], "/ledger/acct-7/entries");
    let stamp = log.iter().find(|l| l["x_request_id"] == "admit-stamp").expect("the stamped write arrived");
    assert_eq!((stamp["fencing_token"].as_str(), stamp["fencing_lease"].clone()), (Some("1"), Value::Null));

    // The fence reflects only what was admitted.
    let fence = send(setup.gateway.control, Method::GET, "/v1/fences/acct-7", &[], "").await.unwrap();
    assert_eq!(fence.json()["max_term"], Value::from(term));
    assert_eq!(fence.json()["lease_key"], "ledger-writer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hop_by_hop_headers_host_and_client_fencing_headers_never_reach_the_upstream() {
    let mut setup = Setup::new().await;
    let reply = send(
        setup.gateway.proxy,
        Method::POST,
        "/jobs",
        &[
            ("fencing-token", "3"),
            ("fencing-resource", "job-h"),
            ("connection", "x-hop"),
            ("x-hop", "secret"),
            ("host", "localhost:7777"),
            ("x-request-id", "hop"),
        ],
        "",
    )
    .await
    .unwrap();
    assert_eq!(reply.status, StatusCode::OK);
    // An unfenced read passes straight through, with client fencing headers removed.
    let reply = send(
        setup.gateway.proxy,
        Method::GET,
        "/jobs/list",
        &[("fencing-token", "999"), ("fencing-owner", "x"), ("x-request-id", "read")],
        "",
    )
    .await
    .unwrap();
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.header("fencing-token"), None);

    let log = setup.upstream.collect(Duration::from_millis(200)).await.to_vec();
    let hop = log.iter().find(|l| l["x_request_id"] == "hop").unwrap();
    assert_eq!(hop["x_hop"], Value::Null, "headers named in Connection are removed");
    assert_eq!(hop["connection"], Value::Null);
    assert_eq!(hop["host"], Value::from(setup.upstream.addr.to_string()), "the client's Host is ignored");
    assert!(hop["forwarded"].as_str().unwrap().contains("host=\"localhost:7777\""));
    assert_eq!(hop["fencing_resource"], "job-h");
    let read = log.iter().find(|l| l["x_request_id"] == "read").unwrap();
    assert_eq!((read["fencing_token"].clone(), read["fencing_owner"].clone()), (Value::Null, Value::Null));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_a_clean_4xx_and_the_gateway_stays_up_and_forwards_nothing() {
    let mut setup = Setup::new().await;
    let proxy = setup.gateway.proxy;

    // Absolute-form target: never routed by its authority.
    let answer = raw(
        proxy,
        b"POST http://evil.example/ledger/acct-7/x HTTP/1.1\r\nHost: localhost\r\nFencing-Token: 1\r\nX-Request-Id: absolute\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
    )
    .await
    .unwrap();
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("application/problem+json"), "{answer}");
    // CONNECT is refused.
    let answer =
        raw(proxy, b"CONNECT evil.example:443 HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 405"), "{answer}");
    // Oversized request head.
    let huge = format!(
        "POST /fixed HTTP/1.1\r\nHost: localhost\r\nFencing-Token: 1\r\nX-Request-Id: huge\r\nX-Big: {}\r\nContent-Length: 0\r\n\r\n",
        "a".repeat(40_000)
    );
    let answer = raw(proxy, huge.as_bytes()).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 431"), "{}", &answer[..answer.len().min(200)]);
    // Declared body over the limit: refused before the fence check.
    let answer = raw(
        proxy,
        b"POST /fixed HTTP/1.1\r\nHost: localhost\r\nFencing-Token: 1\r\nX-Request-Id: declared\r\nConnection: close\r\nContent-Length: 999999\r\n\r\n",
    )
    .await
    .unwrap();
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    // A chunked body that grows past the limit.
    let mut chunked = b"POST /jobs HTTP/1.1\r\nHost: localhost\r\nFencing-Token: 1\r\nFencing-Resource: chunky\r\nX-Request-Id: chunked\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    for _ in 0..3 {
        chunked.extend_from_slice(b"400\r\n");
        chunked.extend_from_slice(&[b'z'; 0x400]);
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    let answer = raw(proxy, &chunked).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    // A header that is not a token at all.
    let answer = raw(
        proxy,
        b"POST /fixed HTTP/1.1\r\nHost: localhost\r\nFencing-Token: \xff\xfe\r\nX-Request-Id: binary\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
    )
    .await
    .unwrap();
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");

    // A client that never finishes its request head is disconnected (header_read_timeout_ms
    // is 500 here), without an answer that could be mistaken for a response.
    let started = tokio::time::Instant::now();
    let answer = raw(proxy, b"POST /fixed HTTP/1.1\r\nHost: localhost\r\nFencing-Tok").await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(4), "a slow client held its connection: {answer:?}");
    assert!(!answer.contains("200 OK"), "{answer}");

    // Still up, still correct.
    let health = send(setup.gateway.control, Method::GET, "/healthz", &[], "").await.unwrap();
    assert_eq!(health.status, StatusCode::OK);
    let reply =
        send(proxy, Method::POST, "/fixed", &[("fencing-token", "1"), ("x-request-id", "after")], "").await.unwrap();
    assert_eq!(reply.status, StatusCode::OK);
    setup.upstream.collect(Duration::from_millis(300)).await;
    for id in ["absolute", "huge", "declared", "binary"] {
        assert!(!setup.upstream.received(id), "{id} reached the upstream");
    }
    // The chunked request's head may have reached the upstream before its body went over the
    // limit; its body never did, so the upstream never answered it as a complete request.
    assert!(
        setup
            .upstream
            .log
            .iter()
            .filter(|l| l["x_request_id"] == "chunked")
            .all(|l| l["body_bytes"].as_u64() < Some(3 * 0x400))
    );
    assert!(setup.upstream.received("after"));
}
