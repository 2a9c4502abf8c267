//! S8 at the proxy: nothing goes around the fence. Every method but a route's unfenced ones is
//! fenced; a method that is not an upper-case token is refused; a resource has one spelling;
//! a malformed body is refused before any fence changes; and an unbound route can never poison
//! a fence a bound route uses. Each case is the request an attacker would send.

use std::time::Duration;

use fencing_schema::store;
use fencing_tests::gateway::{JSON, raw, send};
use http::{Method, StatusCode};

use crate::Setup;

/// Sends `request` raw and returns the status line.
async fn status_of(setup: &Setup, request: String) -> String {
    let answer = raw(setup.gateway.proxy, request.as_bytes()).await.unwrap();
    answer.lines().next().unwrap_or_default().to_owned()
}

fn request(method: &str, path: &str, id: &str, headers: &str, body: &str) -> String {
    format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nX-Request-Id: {id}\r\n{headers}Connection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s8_every_method_but_the_unfenced_ones_is_fenced_and_odd_spellings_are_refused() {
    let mut setup = Setup::new().await;
    let cases =
        [("post", "400"), ("Post", "400"), ("MOVE", "428"), ("PROPPATCH", "428"), ("X-WRITE", "428"), ("TRACE", "405")];
    for (method, expected) in cases {
        let id = format!("method-{method}");
        let line = status_of(&setup, request(method, "/fixed", &id, "", "{\"evil\":1}")).await;
        assert!(line.starts_with(&format!("HTTP/1.1 {expected}")), "{method}: {line}");
    }
    // The unfenced methods pass without a token; a fenced extension method with a token is
    // decided like any write.
    let get = send(setup.gateway.proxy, Method::GET, "/fixed", &[("x-request-id", "method-GET")], "").await.unwrap();
    assert_eq!(get.status, StatusCode::OK);
    // (without a body: an extension method is not one of the route's body methods)
    let line =
        status_of(&setup, request("X-WRITE", "/fixed", "method-X-WRITE-token", "Fencing-Token: 1\r\n", "")).await;
    assert!(line.starts_with("HTTP/1.1 200"), "{line}");
    setup.upstream.collect(Duration::from_millis(300)).await;
    for (method, _) in cases {
        assert!(!setup.upstream.received(&format!("method-{method}")), "{method} without a token reached the upstream");
    }
    assert!(setup.upstream.received("method-GET") && setup.upstream.received("method-X-WRITE-token"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s8_a_path_or_header_that_could_name_a_resource_another_way_is_refused() {
    let mut setup = Setup::new().await;
    let paths = [
        "/ledger/acct%2D7/e",
        "/ledger/acct%2d7/e",
        "/ledger/x/../acct-7/e",
        "/ledger/./acct-7/e",
        "/ledger/acct-7;x/e",
        "/ledger//acct-7/e",
        "/ledger/acct%2F7/e",
        "/ledger/acct%5C7/e",
        "/ledger/acct%20/e",
        "/ledger/acct%zz/e",
    ];
    for (n, path) in paths.iter().enumerate() {
        let line = status_of(&setup, request("POST", path, &format!("path-{n}"), "Fencing-Token: 1\r\n", "")).await;
        assert!(line.starts_with("HTTP/1.1 400"), "{path}: {line}");
    }
    for (n, value) in ["nightly, acct-7", "acct 7", "..", "a/b", "acct%2D7"].iter().enumerate() {
        let headers = format!("Fencing-Token: 1\r\nFencing-Resource: {value}\r\n");
        let line = status_of(&setup, request("POST", "/jobs", &format!("header-{n}"), &headers, "")).await;
        assert!(line.starts_with("HTTP/1.1 400"), "{value:?}: {line}");
    }
    setup.upstream.collect(Duration::from_millis(300)).await;
    assert!(setup.upstream.log.is_empty(), "a refused spelling reached the upstream: {:?}", setup.upstream.log);
    let client = setup.db.connect().await;
    assert!(
        client.query("SELECT resource FROM fencing.fences", &[]).await.unwrap().is_empty(),
        "a refused spelling created a fence"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s8_a_malformed_chunked_body_is_refused_before_any_fence_changes() {
    let mut setup = Setup::new().await;
    let bodies = ["4\nabcd\r\n0\r\n\r\n", "0x4\r\nabcd\r\n0\r\n\r\n", "ffffffffffffffffffff\r\nabcd\r\n0\r\n\r\n"];
    for (n, body) in bodies.iter().enumerate() {
        let request = format!(
            "POST /jobs HTTP/1.1\r\nHost: localhost\r\nFencing-Token: 9\r\nFencing-Resource: chunky\r\nX-Request-Id: chunk-{n}\r\n\
             Connection: close\r\nTransfer-Encoding: chunked\r\n\r\n{body}"
        );
        let answer = raw(setup.gateway.proxy, request.as_bytes()).await.unwrap();
        assert!(!answer.starts_with("HTTP/1.1 2") && !answer.starts_with("HTTP/1.1 5"), "{body:?}: {answer}");
    }
    let client = setup.db.connect().await;
    assert!(store::get_fence(&client, "/jobs/chunky").await.unwrap().is_none(), "a malformed body raised a fence");
    setup.upstream.collect(Duration::from_millis(300)).await;
    assert!(setup.upstream.log.is_empty(), "{:?}", setup.upstream.log);
    let metrics = send(setup.gateway.control, Method::GET, "/metrics", &[], "").await.unwrap();
    let text = String::from_utf8_lossy(&metrics.body);
    assert!(
        !text.lines().any(|l| l.starts_with("fencing_upstream_errors_total") && !l.ends_with(" 0")),
        "a malformed body was counted as an upstream error:\n{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s8_an_unbound_route_cannot_poison_the_fence_of_a_bound_route() {
    let setup = Setup::new().await;
    let proxy = setup.gateway.proxy;
    // A client of the unbound route writes the bound route's resource name with the highest term.
    let poison = send(
        proxy,
        Method::POST,
        "/jobs",
        &[("fencing-token", "9223372036854775807"), ("fencing-resource", "acct-1")],
        "",
    )
    .await
    .unwrap();
    assert_eq!(poison.status, StatusCode::OK, "admitted in the unbound route's own namespace");
    let lease = send(
        setup.gateway.control,
        Method::POST,
        "/v1/leases/ledger-writer/acquire",
        &[JSON],
        r#"{"owner":"leader","ttl_ms":60000}"#,
    )
    .await
    .unwrap();
    let term = lease.json()["term"].as_i64().unwrap().to_string();
    let write =
        send(proxy, Method::POST, "/ledger/acct-1/entries", &[("fencing-token", term.as_str())], "").await.unwrap();
    assert_eq!(write.status, StatusCode::OK, "the bound route's leader was refused: {:?}", write.json());
    let client = setup.db.connect().await;
    let fence = store::get_fence(&client, "acct-1").await.unwrap().unwrap();
    assert_eq!((fence.max_term, fence.lease_key.as_deref()), (1, Some("ledger-writer")));
    assert_eq!(store::get_fence(&client, "/jobs/acct-1").await.unwrap().unwrap().max_term, i64::MAX);
}
