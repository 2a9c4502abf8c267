//! Request hygiene (S8): nothing unfenced may carry a write. Each case is the exact bytes an
//! attacker sends, and the upstream is the Python standard library's server
//! (`tests/upstreams/stdlib_upstream.py`): HTTP/1.1 keep-alive, no body read on GET, wsgiref's
//! header mapping, and a log of every byte it received. Each test fails with its rule taken out
//! of the gateway: the smuggled request is run, the forged header is seen, the other spelling of
//! the path arrives.

use std::time::Duration;

use fencing_tests::gateway::{Gateway, Upstream, raw};
use fencing_tests::pg::TestDb;
use serde_json::Value;

use crate::routes;

struct Hygiene {
    _db: TestDb,
    upstream: Upstream,
    gateway: Gateway,
}

async fn hygiene() -> Hygiene {
    let db = TestDb::new().await;
    let upstream = Upstream::start_stdlib().await.unwrap();
    let gateway = Gateway::start(&db.url(), &routes(&upstream.url())).await.unwrap();
    Hygiene { _db: db, upstream, gateway }
}

/// The whole answer to `request`, sent as raw bytes on a connection of its own.
async fn answer(addr: std::net::SocketAddr, request: &[u8]) -> String {
    raw(addr, request).await.unwrap()
}

fn status_line(answer: &str) -> &str {
    answer.lines().next().unwrap_or_default()
}

/// Asserts a refusal by the gateway: 400, and (but for HEAD) a problem+json body.
fn assert_refused(answer: &str, what: &str) {
    assert!(status_line(answer).starts_with("HTTP/1.1 400"), "{what}: {answer}");
    assert!(answer.to_ascii_lowercase().contains("content-type: application/problem+json"), "{what}: {answer}");
}

/// Collects the upstream's log after the gateway's connections to it ended.
async fn upstream_log(upstream: &mut Upstream) -> (Vec<Value>, String) {
    upstream.collect(Duration::from_millis(700)).await;
    (upstream.requests().into_iter().cloned().collect(), upstream.raw_received())
}

const SMUGGLED: &str =
    "DELETE /fixed HTTP/1.1\r\nHost: localhost\r\nX-Request-Id: smuggled\r\nContent-Length: 0\r\n\r\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s8_an_unfenced_method_never_carries_a_body_to_the_upstream() {
    let mut h = hygiene().await;
    let proxy = h.gateway.proxy;
    for method in ["GET", "HEAD", "OPTIONS"] {
        let with_length = format!(
            "{method} /fixed HTTP/1.1\r\nHost: localhost\r\nX-Request-Id: cl-{method}\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n{SMUGGLED}",
            SMUGGLED.len()
        );
        let reply = answer(proxy, with_length.as_bytes()).await;
        if method == "HEAD" {
            assert!(status_line(&reply).starts_with("HTTP/1.1 400"), "{method} with a body: {reply}");
        } else {
            assert_refused(&reply, &format!("{method} with a Content-Length body"));
        }
        let chunked = format!(
            "{method} /fixed HTTP/1.1\r\nHost: localhost\r\nX-Request-Id: te-{method}\r\nTransfer-Encoding: chunked\r\n\
             Connection: close\r\n\r\n{:x}\r\n{SMUGGLED}\r\n0\r\n\r\n",
            SMUGGLED.len()
        );
        let reply = answer(proxy, chunked.as_bytes()).await;
        assert!(status_line(&reply).starts_with("HTTP/1.1 400"), "{method} with a chunked body: {reply}");
    }
    // An empty body, said either way, is no body: those pass.
    let empty = "GET /fixed HTTP/1.1\r\nHost: localhost\r\nX-Request-Id: empty\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    let reply = answer(proxy, empty.as_bytes()).await;
    assert!(status_line(&reply).starts_with("HTTP/1.1 200"), "{reply}");

    let (requests, received) = upstream_log(&mut h.upstream).await;
    let ids: Vec<&str> = requests.iter().filter_map(|r| r["x_request_id"].as_str()).collect();
    assert_eq!(ids, ["empty"], "only the bodiless GET may reach the upstream: {requests:?}");
    assert!(!received.contains("DELETE"), "the smuggled request's bytes reached the upstream: {received:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s8_header_names_with_underscores_never_reach_the_upstream() {
    let mut h = hygiene().await;
    let proxy = h.gateway.proxy;
    // Names that a WSGI or CGI upstream reads as a header the gateway sets, strips or reads.
    let forged = [
        ("POST", "/fixed", "Fencing-Token: 1\r\nFencing_Token: 999\r\n"),
        ("POST", "/fixed", "Fencing-Token: 1\r\nFencing_Resource: acct-9\r\n"),
        ("POST", "/jobs", "Fencing-Token: 1\r\nFencing-Resource: job-1\r\nfencing_resource: job-2\r\n"),
        ("POST", "/ledger/acct-1/e", "Fencing_Lease: ledger-writer\r\nFencing_Owner: x\r\n"),
        ("GET", "/fixed", "X_Forwarded_For: 6.6.6.6\r\n"),
        ("GET", "/fixed", "X_Real_IP: 6.6.6.6\r\n"),
        ("GET", "/fixed", "X_Forwarded-Host: evil.example\r\n"),
        ("GET", "/fixed", "X_HTTP_Method_Override: DELETE\r\n"),
        ("GET", "/fixed", "X_Original_URL: /ledger/acct-1/e\r\n"),
        ("GET", "/fixed", "Content_Length: 5\r\n"),
        // Any character but a-z 0-9 - reads as _ to CGI and FastCGI servers (lighttpd, PHP).
        ("POST", "/fixed", "Fencing-Token: 1\r\nFencing.Token: 999\r\n"),
        ("POST", "/jobs", "Fencing-Token: 1\r\nFencing-Resource: job-1\r\nFencing+Resource: job-2\r\n"),
        ("POST", "/fixed", "Fencing-Token: 1\r\nFencing~Owner: x\r\n"),
        ("GET", "/fixed", "X.Forwarded.For: 6.6.6.6\r\n"),
        ("GET", "/fixed", "X*Real*IP: 6.6.6.6\r\n"),
    ];
    for (n, (method, path, headers)) in forged.iter().enumerate() {
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\nX-Request-Id: forged-{n}\r\n{headers}Content-Length: 0\r\n\
             Connection: close\r\n\r\n"
        );
        assert_refused(&answer(proxy, request.as_bytes()).await, headers);
    }
    // Any other such name is dropped, as nginx does by default (`underscores_in_headers off`,
    // `ignore_invalid_headers`).
    for (method, token) in [("GET", ""), ("POST", "Fencing-Token: 1\r\n")] {
        let request = format!(
            "{method} /fixed HTTP/1.1\r\nHost: localhost\r\nX-Request-Id: dropped-{method}\r\n{token}X_Custom_Thing: 1\r\n\
             X.Other.Thing: 2\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        let reply = answer(proxy, request.as_bytes()).await;
        assert!(status_line(&reply).starts_with("HTTP/1.1 200"), "{reply}");
    }

    let (requests, received) = upstream_log(&mut h.upstream).await;
    let ids: Vec<&str> = requests.iter().filter_map(|r| r["x_request_id"].as_str()).collect();
    assert_eq!(ids, ["dropped-GET", "dropped-POST"], "{requests:?}");
    for request in &requests {
        let environ = request["environ"].as_object().unwrap();
        assert!(!environ.contains_key("HTTP_X_CUSTOM_THING"), "an underscore header reached the upstream: {request}");
        assert!(request["fencing_token"].is_null() || request["fencing_token"] == "1", "{request}");
    }
    assert!(!received.contains('_'), "a header name with _ reached the upstream: {received:?}");
    assert!(!received.to_ascii_lowercase().contains("x.other.thing"), "{received:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s8_method_overrides_on_unfenced_methods_are_refused_and_rewrite_headers_stripped() {
    let mut h = hygiene().await;
    let proxy = h.gateway.proxy;
    for (n, (method, header)) in [
        ("GET", "X-HTTP-Method-Override: DELETE"),
        ("GET", "X-Method-Override: PUT"),
        ("GET", "X-HTTP-Method: DELETE"),
        ("OPTIONS", "X-HTTP-Method-Override: POST"),
        ("HEAD", "x-http-method-override: PATCH"),
    ]
    .iter()
    .enumerate()
    {
        let request = format!(
            "{method} /fixed HTTP/1.1\r\nHost: localhost\r\nX-Request-Id: override-{n}\r\n{header}\r\nConnection: close\r\n\r\n"
        );
        let reply = answer(proxy, request.as_bytes()).await;
        assert!(status_line(&reply).starts_with("HTTP/1.1 400"), "{method} {header}: {reply}");
    }
    // A `_method` query parameter, however its name is spelled.
    // PHP turns `.` and a space in a name into `_` and cuts it at NUL or `[`; Rack and Node's
    // `qs` read `_method[]` as `_method`.
    let queries = [
        "_method=DELETE",
        "x=1&_METHOD=put",
        "%5Fmethod=DELETE",
        "a=b;_method=PATCH",
        ".method=DELETE",
        "%20method=DELETE",
        "__method=DELETE",
        "_method[]=DELETE",
        "_method%00=DELETE",
        "_method.=DELETE",
    ];
    for (n, query) in queries.iter().enumerate() {
        let request = format!(
            "GET /fixed?{query} HTTP/1.1\r\nHost: localhost\r\nX-Request-Id: query-override-{n}\r\nConnection: close\r\n\r\n"
        );
        let reply = answer(proxy, request.as_bytes()).await;
        assert_refused(&reply, query);
    }
    // On a fenced write an override is fenced with it: it goes on, decided on the path's resource.
    let fenced = "POST /fixed HTTP/1.1\r\nHost: localhost\r\nX-Request-Id: fenced-override\r\nFencing-Token: 1\r\n\
                  X-HTTP-Method-Override: DELETE\r\nX-Original-URL: /ledger/acct-1/e\r\nX-Rewrite-URL: /ledger/acct-1/e\r\n\
                  Content-Length: 2\r\nConnection: close\r\n\r\n{}";
    let reply = answer(proxy, fenced.as_bytes()).await;
    assert!(status_line(&reply).starts_with("HTTP/1.1 200"), "{reply}");
    let read = "GET /fixed HTTP/1.1\r\nHost: localhost\r\nX-Request-Id: rewrite-read\r\n\
                X-Original-URL: /ledger/acct-1/e\r\nX-Rewrite-URL: /ledger/acct-1/e\r\nConnection: close\r\n\r\n";
    let reply = answer(proxy, read.as_bytes()).await;
    assert!(status_line(&reply).starts_with("HTTP/1.1 200"), "{reply}");

    let (requests, received) = upstream_log(&mut h.upstream).await;
    let ids: Vec<&str> = requests.iter().filter_map(|r| r["x_request_id"].as_str()).collect();
    assert_eq!(ids, ["fenced-override", "rewrite-read"], "{requests:?}");
    for request in &requests {
        let environ = request["environ"].as_object().unwrap();
        assert!(
            !environ.contains_key("HTTP_X_ORIGINAL_URL") && !environ.contains_key("HTTP_X_REWRITE_URL"),
            "a URL rewrite header reached the upstream: {request}"
        );
    }
    assert_eq!(requests[0]["fencing_token"], "1");
    assert!(!received.to_ascii_lowercase().contains("x-original-url"), "{received:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s8_a_path_whose_decoded_form_is_another_spelling_is_refused() {
    let mut h = hygiene().await;
    let proxy = h.gateway.proxy;
    let paths: [&[u8]; 36] = [
        b"/fixed/a+b",
        b"/fixed/a%3fb",
        b"/fixed/a%3Fb",
        b"/fixed/a%23b",
        b"/fixed/%2D",
        b"/fixed/a\"b",
        b"/fixed/a|b",
        b"/fixed/[x]",
        b"/fixed/%C2%85",
        b"/fixed/%E2%80%AE",
        b"/fixed/%EF%BB%BF",
        b"/fixed/%EF%BC%8E%EF%BC%8E/x",
        b"/fixed/%EF%BC%8F",
        b"/fixed/%25u002e%25u002e/x",
        b"/fixed/%C2%A0",
        b"/fixed/%E2%80%8B",
        b"/fixed/%00",
        b"/fixed/a%00b",
        b"/fixed/%0A",
        b"/fixed/%C0%AE%C0%AE/x",
        b"/fixed/%E0%80%AE",
        b"/fixed/%252E%252E/x",
        b"/fixed/%252F",
        b"/fixed/%255C",
        b"/fixed/%FF",
        b"/fixed/caf%E9",
        b"/fixed/%3B/x",
        b"/fixed/\xff",
        b"/fixed/caf\xc3\xa9",
        // Windows' best-fit conversions: yen and won signs to \, division and fraction slashes to /.
        b"/fixed/..%C2%A5..%C2%A5windows%C2%A5win.ini",
        b"/fixed/..%E2%82%A9x",
        b"/fixed/..%E2%88%95..%E2%88%95x",
        b"/fixed/..%E2%81%84x",
        // NFKC to ASCII (an ellipsis, a fullwidth digit), and a decomposed (NFD) e with acute.
        b"/fixed/%E2%80%A6",
        b"/fixed/%EF%BC%91",
        b"/fixed/cafe%CC%81",
    ];
    for (n, path) in paths.iter().enumerate() {
        for (method, token) in [("GET", ""), ("POST", "Fencing-Token: 1\r\n")] {
            let mut request = format!("{method} ").into_bytes();
            request.extend_from_slice(path);
            request.extend_from_slice(
                format!(
                    " HTTP/1.1\r\nHost: localhost\r\nX-Request-Id: path-{n}-{method}\r\n{token}Content-Length: 0\r\n\
                     Connection: close\r\n\r\n"
                )
                .as_bytes(),
            );
            let reply = answer(proxy, &request).await;
            assert!(
                status_line(&reply).starts_with("HTTP/1.1 400"),
                "{method} {}: {reply}",
                String::from_utf8_lossy(path)
            );
        }
    }
    // Their one plain spellings pass: a UTF-8 name percent-encoded, a percent sign encoded.
    // What encodeURIComponent and its kin send for @ : + , is one spelling too (no route prefix
    // or resource name holds them).
    let plain =
        ["/fixed/caf%C3%A9", "/fixed/100%25", "/fixed/a%20b", "/fixed/alice%40example.com", "/fixed/%2B1555%3A1"];
    for (n, path) in plain.iter().enumerate() {
        let request =
            format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nX-Request-Id: plain-{n}\r\nConnection: close\r\n\r\n");
        let reply = answer(proxy, request.as_bytes()).await;
        assert!(status_line(&reply).starts_with("HTTP/1.1 200"), "{path}: {reply}");
    }

    let (requests, received) = upstream_log(&mut h.upstream).await;
    let paths: Vec<&str> = requests.iter().filter_map(|r| r["path"].as_str()).collect();
    assert_eq!(paths, plain, "{requests:?}");
    assert!(!received.contains("path-"), "a refused spelling reached the upstream: {received:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s8_a_host_port_outside_1_to_65535_is_refused_on_both_listeners() {
    let mut h = hygiene().await;
    let hosts =
        ["127.0.0.1:99999", "localhost:0", "localhost:65536", "[::1]:70000", "[::1].evil.example:0", "[::1]x:99999"];
    for (n, host) in hosts.iter().enumerate() {
        for (addr, path) in [(h.gateway.proxy, "/fixed"), (h.gateway.control, "/healthz")] {
            let request =
                format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nX-Request-Id: host-{n}\r\nConnection: close\r\n\r\n");
            let reply = answer(addr, request.as_bytes()).await;
            assert!(status_line(&reply).starts_with("HTTP/1.1 400"), "Host: {host} on {path}: {reply}");
        }
    }
    for (id, host) in [("host-ok", "localhost:65535"), ("host-empty-port", "localhost:")] {
        let request = format!("GET /fixed HTTP/1.1\r\nHost: {host}\r\nX-Request-Id: {id}\r\nConnection: close\r\n\r\n");
        let reply = answer(h.gateway.proxy, request.as_bytes()).await;
        assert!(status_line(&reply).starts_with("HTTP/1.1 200"), "{host}: {reply}");
    }

    let (requests, _) = upstream_log(&mut h.upstream).await;
    let ids: Vec<&str> = requests.iter().filter_map(|r| r["x_request_id"].as_str()).collect();
    assert_eq!(ids, ["host-ok", "host-empty-port"], "{requests:?}");
    let forwarded = requests[0]["environ"]["HTTP_FORWARDED"].as_str().unwrap_or_default();
    assert!(forwarded.contains("host=\"localhost:65535\""), "{forwarded}");
}

/// A fenced write's body is sent with its own length, whatever it holds: an upstream that frames
/// requests correctly reads an HTTP request in a body as data (README, "An upstream that checks
/// Fencing-Token").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_body_that_holds_a_request_is_one_request_at_the_upstream() {
    let mut h = hygiene().await;
    let request = format!(
        "POST /fixed HTTP/1.1\r\nHost: localhost\r\nX-Request-Id: carrier\r\nFencing-Token: 3\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{SMUGGLED}",
        SMUGGLED.len()
    );
    let reply = answer(h.gateway.proxy, request.as_bytes()).await;
    assert!(status_line(&reply).starts_with("HTTP/1.1 200"), "{reply}");
    let (requests, _) = upstream_log(&mut h.upstream).await;
    assert_eq!(requests.len(), 1, "{requests:?}");
    assert_eq!((requests[0]["method"].as_str(), requests[0]["body"].as_str()), (Some("POST"), Some(SMUGGLED)));
    assert_eq!(requests[0]["fencing_token"], "3");
}

/// A fenced write carries a body only on the route's body methods (POST, PUT, PATCH by default):
/// the Python server reads no body for PURGE, so the body of an admitted PURGE would be read as
/// a second request, with a token its author forged, against a resource of another route.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s8_a_fenced_write_carries_a_body_only_on_a_body_method() {
    let mut h = hygiene().await;
    let smuggled = "DELETE /ledger/acct-1/e HTTP/1.1\r\nHost: localhost\r\nFencing-Token: 999999\r\n\
                    Fencing-Resource: acct-1\r\nX-Request-Id: smuggled\r\nContent-Length: 0\r\n\r\n";
    for (n, method) in ["PURGE", "DELETE", "MOVE"].iter().enumerate() {
        for framing in ["length", "chunked"] {
            let head = format!(
                "{method} /jobs HTTP/1.1\r\nHost: localhost\r\nX-Request-Id: carrier-{n}-{framing}\r\n\
                 Fencing-Token: 1\r\nFencing-Resource: fresh-{n}\r\nConnection: close\r\n"
            );
            let request = match framing {
                "length" => format!("{head}Content-Length: {}\r\n\r\n{smuggled}", smuggled.len()),
                _ => format!("{head}Transfer-Encoding: chunked\r\n\r\n{:x}\r\n{smuggled}\r\n0\r\n\r\n", smuggled.len()),
            };
            assert_refused(&answer(h.gateway.proxy, request.as_bytes()).await, &format!("{method} ({framing})"));
        }
    }
    // Without a body these methods are writes like any other.
    let bodiless = "PURGE /jobs HTTP/1.1\r\nHost: localhost\r\nX-Request-Id: bodiless\r\nFencing-Token: 1\r\n\
                    Fencing-Resource: fresh-9\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    let reply = answer(h.gateway.proxy, bodiless.as_bytes()).await;
    assert!(status_line(&reply).starts_with("HTTP/1.1 200"), "{reply}");

    let (requests, received) = upstream_log(&mut h.upstream).await;
    let ids: Vec<&str> = requests.iter().filter_map(|r| r["x_request_id"].as_str()).collect();
    assert_eq!(ids, ["bodiless"], "{requests:?}");
    assert!(!received.contains("smuggled"), "the smuggled request's bytes reached the upstream: {received:?}");
    let client = h._db.connect().await;
    let fences = client.query("SELECT resource FROM fencing.fences ORDER BY resource", &[]).await.unwrap();
    let fences: Vec<String> = fences.iter().map(|row| row.get(0)).collect();
    assert_eq!(fences, ["/jobs/fresh-9"], "a refused write changed a fence");
}

/// What a client claims of itself or of the fence never reaches the upstream from a peer that
/// is not a trusted proxy: every `X-Forwarded*` and client-address header, a `Fencing-*` header
/// the gateway does not set, and `Proxy` (httpoxy).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s8_client_claims_and_foreign_fencing_headers_never_reach_the_upstream() {
    let mut h = hygiene().await;
    let claims = "X-Forwarded-Uri: /admin\r\nX-Forwarded-Path: /admin\r\nX-Forwarded-Client-Cert: CN=admin\r\n\
                  X-Forwarded-Scheme: https\r\nX-Forwarded-Ssl: on\r\nX-Original-URI: /admin\r\nTrue-Client-IP: 6.6.6.6\r\n\
                  X-Client-IP: 6.6.6.6\r\nCF-Connecting-IP: 6.6.6.6\r\nFencing-Current-Term: 5\r\nFencing-Whatever: 1\r\n\
                  Proxy: http://evil.example\r\nWL-Proxy-Client-IP: 6.6.6.6\r\nX-Originating-IP: 6.6.6.6\r\n\
                  X-Envoy-Original-Path: /admin\r\nX-Proxied-Https: on\r\nProxy-ssl-id: 1\r\nRemote-User: admin\r\n\
                  X-Auth-Request-User: admin\r\nX-Amzn-Oidc-Identity: admin\r\nSsl-Client-Verify: SUCCESS\r\n\
                  X-Tenant: admin\r\n";
    for (id, method, token) in [("claims-read", "GET", ""), ("claims-write", "POST", "Fencing-Token: 1\r\n")] {
        let request = format!(
            "{method} /fixed HTTP/1.1\r\nHost: localhost\r\nX-Request-Id: {id}\r\n{token}{claims}Content-Length: 0\r\n\
             Connection: close\r\n\r\n"
        );
        let reply = answer(h.gateway.proxy, request.as_bytes()).await;
        assert!(status_line(&reply).starts_with("HTTP/1.1 200"), "{reply}");
    }
    // The gateway holds the whole body: an upstream has nothing to continue.
    let expecting = "GET /fixed HTTP/1.1\r\nHost: localhost\r\nX-Request-Id: continue-asked\r\nExpect: 100-continue\r\n\
                     Connection: close\r\n\r\n";
    let reply = answer(h.gateway.proxy, expecting.as_bytes()).await;
    assert!(reply.contains("HTTP/1.1 200"), "{reply}");
    let (requests, received) = upstream_log(&mut h.upstream).await;
    assert_eq!(requests.len(), 3, "{requests:?}");
    let lower = received.to_ascii_lowercase();
    for claim in [
        "x-forwarded-uri",
        "x-forwarded-path",
        "x-forwarded-client-cert",
        "x-forwarded-scheme",
        "x-forwarded-ssl",
        "x-original-uri",
        "true-client-ip",
        "x-client-ip",
        "cf-connecting-ip",
        "fencing-current-term",
        "fencing-whatever",
        "proxy:",
        "wl-proxy-client-ip",
        "x-originating-ip",
        "x-envoy-original-path",
        "x-proxied-https",
        "proxy-ssl-id",
        "remote-user",
        "x-auth-request-user",
        "x-amzn-oidc-identity",
        "ssl-client-verify",
        // Named in the gateway's `proxy.client_claim_headers`.
        "x-tenant",
        "expect:",
        "6.6.6.6",
        "/admin",
        "admin",
    ] {
        assert!(!lower.contains(claim), "{claim} reached the upstream: {received:?}");
    }
}

/// What the upstream claims of the fence never reaches the client: only the gateway says which
/// term a write was admitted for, so a read's answer cannot pass for an admitted write's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s8_an_upstreams_fencing_headers_never_reach_the_client() {
    let h = hygiene().await;
    let read = "GET /fixed/forge-reply HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    let reply = answer(h.gateway.proxy, read.as_bytes()).await;
    assert!(status_line(&reply).starts_with("HTTP/1.1 200"), "{reply}");
    assert!(
        !reply.to_ascii_lowercase().contains("fencing-"),
        "an upstream's Fencing-* header reached the client: {reply}"
    );
    let write = "POST /fixed/forge-reply HTTP/1.1\r\nHost: localhost\r\nFencing-Token: 2\r\nContent-Length: 0\r\n\
                 Connection: close\r\n\r\n";
    let reply = answer(h.gateway.proxy, write.as_bytes()).await;
    assert!(status_line(&reply).starts_with("HTTP/1.1 200"), "{reply}");
    let fencing: Vec<&str> = reply.lines().filter(|line| line.to_ascii_lowercase().starts_with("fencing-")).collect();
    assert_eq!(fencing, ["fencing-token: 2"], "{reply}");
}

/// An admitted POST without a body still says how long its body is: IIS and other front ends
/// answer 411 to a POST or PUT with neither `Content-Length` nor `Transfer-Encoding`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admitted_empty_post_carries_content_length_0() {
    let mut h = hygiene().await;
    for (id, framing) in
        [("empty-length", "Content-Length: 0\r\n"), ("empty-chunked", "Transfer-Encoding: chunked\r\n")]
    {
        let body = if framing.starts_with("Transfer") { "0\r\n\r\n" } else { "" };
        let request = format!(
            "POST /fixed HTTP/1.1\r\nHost: localhost\r\nX-Request-Id: {id}\r\nFencing-Token: 1\r\n{framing}\
             Connection: close\r\n\r\n{body}"
        );
        let reply = answer(h.gateway.proxy, request.as_bytes()).await;
        assert!(status_line(&reply).starts_with("HTTP/1.1 200"), "{reply}");
    }
    let (requests, received) = upstream_log(&mut h.upstream).await;
    assert_eq!(requests.len(), 2, "{requests:?}");
    for request in &requests {
        assert_eq!(request["environ"]["CONTENT_LENGTH"], "0", "{request}");
    }
    assert_eq!(received.to_ascii_lowercase().matches("content-length: 0\r\n").count(), 2, "{received:?}");
}

/// The spellings of a route's prefix that upstreams fold into it: case (ASP.NET Core's routing
/// and IIS ignore it), letters with diacritics (Windows' best-fit conversions drop them) and
/// trailing dots (Windows drops them). Each would be decided under the catch-all route and
/// applied under the bound one. A resource name never ends with a dot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s8_a_path_that_folds_into_a_longer_routes_prefix_is_refused() {
    let db = TestDb::new().await;
    let mut upstream = Upstream::start_stdlib().await.unwrap();
    let url = upstream.url();
    let config = format!(
        "[[routes]]\nprefix = \"/ledger\"\nupstream = \"{url}\"\nresource = {{ segment = 2 }}\nlease = \"ledger-writer\"\n\
         [[routes]]\nprefix = \"/\"\nupstream = \"{url}\"\nresource = {{ fixed = \"everything\" }}\n"
    );
    let gateway = Gateway::start(&db.url(), &config).await.unwrap();
    for path in
        ["/LEDGER/acct-1/e", "/Ledger/acct-1/e", "/l%C4%95dger/acct-1/e", "/ledger./acct-1/e", "/ledger../acct-1/e"]
    {
        for (method, token) in [("GET", ""), ("POST", "Fencing-Token: 1\r\n")] {
            let request = format!(
                "{method} {path} HTTP/1.1\r\nHost: localhost\r\nX-Request-Id: folded\r\n{token}Content-Length: 0\r\n\
                 Connection: close\r\n\r\n"
            );
            assert_refused(&answer(gateway.proxy, request.as_bytes()).await, &format!("{method} {path}"));
        }
    }
    let dotted = "POST /ledger/acct-1./e HTTP/1.1\r\nHost: localhost\r\nX-Request-Id: folded\r\n\
                  Fencing-Lease: ledger-writer\r\nFencing-Owner: o\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    assert_refused(&answer(gateway.proxy, dotted.as_bytes()).await, "a resource name ending with a dot");
    // The catch-all route's own paths pass.
    let other = "POST /other/x HTTP/1.1\r\nHost: localhost\r\nX-Request-Id: other\r\nFencing-Token: 1\r\n\
                 Content-Length: 0\r\nConnection: close\r\n\r\n";
    let reply = answer(gateway.proxy, other.as_bytes()).await;
    assert!(status_line(&reply).starts_with("HTTP/1.1 200"), "{reply}");

    let (requests, _) = upstream_log(&mut upstream).await;
    let ids: Vec<&str> = requests.iter().filter_map(|r| r["x_request_id"].as_str()).collect();
    assert_eq!(ids, ["other"], "{requests:?}");
    let client = db.connect().await;
    let fences = client.query("SELECT resource FROM fencing.fences ORDER BY resource", &[]).await.unwrap();
    let fences: Vec<String> = fences.iter().map(|row| row.get(0)).collect();
    assert_eq!(fences, ["/everything"], "a refused write changed a fence");
}

/// A client's `X-Request-Id` is kept only from a trusted proxy (or with
/// `proxy.client_request_ids`): any other client would make its refusals, and the upstream's
/// log, carry another request's id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_request_id_is_replaced_unless_it_comes_from_a_trusted_proxy() {
    let db = TestDb::new().await;
    let mut upstream = Upstream::start_stdlib().await.unwrap();
    let url = upstream.url();
    let routes = format!("[[routes]]\nprefix = \"/fixed\"\nupstream = \"{url}\"\nresource = {{ fixed = \"f\" }}\n");
    let untrusted = Gateway::start(&db.url(), &format!("[proxy]\nclient_request_ids = false\n{routes}")).await.unwrap();
    let trusted = Gateway::start(
        &db.url(),
        &format!("[proxy]\nclient_request_ids = false\ntrusted_proxies = [\"127.0.0.1\"]\n{routes}"),
    )
    .await
    .unwrap();
    let request =
        "GET /fixed HTTP/1.1\r\nHost: localhost\r\nX-Request-Id: someone-elses-id\r\nConnection: close\r\n\r\n";
    let replaced = answer(untrusted.proxy, request.as_bytes()).await;
    let kept = answer(trusted.proxy, request.as_bytes()).await;
    assert!(status_line(&replaced).starts_with("HTTP/1.1 200"), "{replaced}");
    assert!(!replaced.contains("someone-elses-id"), "{replaced}");
    assert!(kept.contains("someone-elses-id"), "{kept}");
    let (requests, _) = upstream_log(&mut upstream).await;
    let ids: Vec<&str> = requests.iter().filter_map(|r| r["x_request_id"].as_str()).collect();
    assert_eq!(ids.len(), 2, "{requests:?}");
    assert_eq!(ids.iter().filter(|id| **id == "someone-elses-id").count(), 1, "{requests:?}");
}
