//! Clients and authentication, tried as an attacker on the same host would: every control
//! endpoint with no token, a wrong token and a right one; a lease taken over by another client
//! that knows its owner string; writes under another client's lease; a web page's text/plain
//! POST; a foreign Host; a non-loopback listener without clients.

use std::time::Duration;

use fencing_gateway::security::auth::token_sha256_hex;
use fencing_tests::fencing_state;
use fencing_tests::gateway::{Gateway, JSON, Reply, Upstream, raw, send};
use fencing_tests::pg::TestDb;
use fencing_tests::workspace_bin;
use http::{Method, StatusCode};

const BILLING: &str = "billing-token-0123456789abcdef";
const OTHER: &str = "other-token-fedcba9876543210";
const READER: &str = "reader-token-5555555555555555";
const WRITER: &str = "writer-token-7777777777777777";

fn config(upstream: &str) -> String {
    format!(
        r#"
[proxy]
hosts = ["localhost", "127.0.0.1"]
[control]
hosts = ["localhost", "127.0.0.1"]
[[clients]]
name = "billing"
token_sha256 = "{billing}"
leases = ["billing-*"]
read = true
[[clients]]
name = "other"
token_sha256 = "{other}"
leases = ["other-*", "billing-*"]
[[clients]]
name = "reader"
token_sha256 = "{reader}"
read = true
[[clients]]
name = "writer"
token_sha256 = "{writer}"
routes = ["/free"]
[[routes]]
prefix = "/billing"
upstream = "{upstream}"
resource = {{ segment = 2 }}
lease = "billing-writer"
[[routes]]
prefix = "/free"
upstream = "{upstream}"
resource = {{ segment = 2 }}
"#,
        billing = token_sha256_hex(BILLING),
        other = token_sha256_hex(OTHER),
        reader = token_sha256_hex(READER),
        writer = token_sha256_hex(WRITER),
    )
}

struct Secured {
    db: TestDb,
    upstream: Upstream,
    gateway: Gateway,
}

async fn secured() -> Secured {
    let db = TestDb::new().await;
    let upstream = Upstream::start().await.unwrap();
    let gateway = Gateway::start_capturing_logs(&db.url(), &config(&upstream.url())).await.unwrap();
    Secured { db, upstream, gateway }
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

fn problem_type(reply: &Reply) -> String {
    reply.json()["type"].as_str().unwrap_or_default().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_control_endpoint_needs_a_valid_token_and_the_permission_for_it() {
    let s = secured().await;
    let client = s.db.connect().await;
    let before = fencing_state(&client).await;
    let acquire = r#"{"owner":"w1","ttl_ms":30000}"#;
    let endpoints: [(Method, &str, &str); 6] = [
        (Method::POST, "/v1/leases/billing-writer/acquire", acquire),
        (Method::POST, "/v1/leases/billing-writer/renew", acquire),
        (Method::POST, "/v1/leases/billing-writer/release", r#"{"owner":"w1"}"#),
        (Method::GET, "/v1/leases/billing-writer", ""),
        (Method::GET, "/v1/fences/acct-1", ""),
        (Method::GET, "/metrics", ""),
    ];
    // No token, a wrong one, a malformed header: 401 with a Bearer challenge, nothing written.
    for (method, path, body) in &endpoints {
        for auth in [None, Some("Bearer wrong-token"), Some("Basic Zm9vOmJhcg=="), Some(BILLING)] {
            let mut headers = vec![JSON];
            if let Some(auth) = auth {
                headers.push(("authorization", auth));
            }
            let reply = send(s.gateway.control, method.clone(), path, &headers, body).await.unwrap();
            assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{method} {path} with {auth:?}");
            assert_eq!(reply.header("content-type"), Some("application/problem+json"));
            assert_eq!(reply.header("www-authenticate"), Some("Bearer realm=\"fencing-gateway\""));
            assert!(problem_type(&reply).ends_with("unauthenticated"), "{}", reply.json());
        }
    }
    assert_eq!(fencing_state(&client).await, before, "unauthenticated calls wrote nothing");
    // The probes stay open: a load balancer has no token.
    for path in ["/healthz", "/readyz"] {
        assert_eq!(send(s.gateway.control, Method::GET, path, &[], "").await.unwrap().status, StatusCode::OK);
    }

    // The reader may read but not use leases; billing may use billing-*, not other keys.
    let reader = bearer(READER);
    let reply = send(s.gateway.control, Method::POST, endpoints[0].1, &[JSON, ("authorization", &reader)], acquire)
        .await
        .unwrap();
    assert_eq!(reply.status, StatusCode::FORBIDDEN, "{}", reply.json());
    assert!(problem_type(&reply).ends_with("forbidden"));
    let billing = bearer(BILLING);
    let reply = send(
        s.gateway.control,
        Method::POST,
        "/v1/leases/other-writer/acquire",
        &[JSON, ("authorization", &billing)],
        acquire,
    )
    .await
    .unwrap();
    assert_eq!(reply.status, StatusCode::FORBIDDEN);
    for (op, body) in [("renew", acquire), ("release", r#"{"owner":"w1"}"#)] {
        let path = format!("/v1/leases/other-writer/{op}");
        let reply =
            send(s.gateway.control, Method::POST, &path, &[JSON, ("authorization", &billing)], body).await.unwrap();
        assert_eq!(reply.status, StatusCode::FORBIDDEN, "{op} of a key the client may not use");
        // JSON bodies need their content type on every lease call.
        let path = format!("/v1/leases/billing-writer/{op}");
        let plain = [("content-type", "text/plain"), ("authorization", billing.as_str())];
        let reply = send(s.gateway.control, Method::POST, &path, &plain, body).await.unwrap();
        assert_eq!(reply.status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{op} as text/plain");
    }
    assert_eq!(fencing_state(&client).await, before, "forbidden calls wrote nothing");

    // The right token: every endpoint works.
    fn with(token: &str) -> Vec<(&str, &str)> {
        vec![JSON, ("authorization", token)]
    }
    let mut statuses = Vec::new();
    for (method, path, body) in &endpoints {
        let reply = send(s.gateway.control, method.clone(), path, &with(&billing), body).await.unwrap();
        statuses.push(reply.status.as_u16());
    }
    assert_eq!(statuses, vec![200, 200, 204, 200, 404, 200], "acquire, renew, release, get, fence, metrics");
    // Without read permission, the reads are 403.
    let other = bearer(OTHER);
    for (method, path, body) in &endpoints[3..] {
        let reply = send(s.gateway.control, method.clone(), path, &with(&other), body).await.unwrap();
        assert_eq!(reply.status, StatusCode::FORBIDDEN, "{method} {path} without read");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_is_the_clients_that_acquired_it_even_for_one_who_knows_the_owner_string() {
    let s = secured().await;
    let (billing, other) = (bearer(BILLING), bearer(OTHER));
    let call = |token: String, op: &'static str, body: &'static str| {
        let control = s.gateway.control;
        async move {
            send(
                control,
                Method::POST,
                &format!("/v1/leases/billing-writer/{op}"),
                &[JSON, ("authorization", &token)],
                body,
            )
            .await
            .unwrap()
        }
    };
    let acquired = call(billing.clone(), "acquire", r#"{"owner":"w1","ttl_ms":30000}"#).await;
    assert_eq!(acquired.status, StatusCode::OK);
    assert_eq!(acquired.json()["owner"], "w1");
    let term = acquired.json()["term"].as_i64().unwrap();

    // `other` may use billing-* keys too, and every 409 shows the holder: still, the lease is
    // billing's. Renew, release and acquire with the same owner string all fail.
    let taken = call(other.clone(), "acquire", r#"{"owner":"w1","ttl_ms":30000}"#).await;
    assert_eq!(taken.status, StatusCode::CONFLICT);
    assert_eq!(taken.json()["holder"], "billing/w1", "the holder names its client");
    for (op, body) in [("renew", r#"{"owner":"w1","ttl_ms":30000}"#), ("release", r#"{"owner":"w1"}"#)] {
        let reply = call(other.clone(), op, body).await;
        assert_eq!(reply.status, StatusCode::CONFLICT, "{op} by another client");
    }

    // Stamp mode with billing's owner string, sent by `other`: refused, nothing forwarded.
    let mut s = s;
    let stamped = send(
        s.gateway.proxy,
        Method::POST,
        "/billing/acct-1/entries",
        &[
            ("authorization", &other),
            ("fencing-lease", "billing-writer"),
            ("fencing-owner", "w1"),
            ("x-request-id", "forged-stamp"),
        ],
        "{}",
    )
    .await
    .unwrap();
    assert_eq!(stamped.status, StatusCode::CONFLICT, "{}", stamped.json());
    // The refusal's log line names the client that sent it, and the owner as the store saw it:
    // not billing's writer.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut logged = None;
    while let Ok(line) = s.gateway.logs.try_recv() {
        let Ok(value) = serde_json::from_str::<serde_json::Value>(&line) else { continue };
        if value["fields"]["request_id"] == "forged-stamp" {
            logged = Some(value["fields"].clone());
        }
    }
    let logged = logged.expect("the forged stamp's refusal is logged");
    assert_eq!((logged["caller"].as_str(), logged["owner"].as_str()), (Some("other"), Some("other/w1")), "{logged}");
    // The holder itself stamps fine, and the gateway's token never reaches the upstream.
    let own = send(
        s.gateway.proxy,
        Method::POST,
        "/billing/acct-1/entries",
        &[
            ("authorization", &billing),
            ("fencing-lease", "billing-writer"),
            ("fencing-owner", "w1"),
            ("x-request-id", "own-stamp"),
        ],
        "{}",
    )
    .await
    .unwrap();
    assert_eq!((own.status, own.header("fencing-token")), (StatusCode::OK, Some(term.to_string().as_str())));
    let log = s.upstream.collect(Duration::from_millis(200)).await.to_vec();
    assert!(!s.upstream.received("forged-stamp"), "the forged stamp reached the upstream");
    let forwarded = log.iter().find(|l| l["x_request_id"] == "own-stamp").expect("the holder's write arrived");
    assert!(forwarded["authorization"].is_null(), "the bearer token was forwarded: {forwarded}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_writes_need_a_token_and_a_lease_the_client_may_use_unfenced_reads_do_not() {
    let mut s = secured().await;
    let client = s.db.connect().await;
    let before = fencing_state(&client).await;
    let (billing, reader, writer) = (bearer(BILLING), bearer(READER), bearer(WRITER));
    // No token, a wrong one: 401. A client without the route's lease, or (unbound route) without
    // the route in its `routes`, or a stamp under a lease it may not use: 403. `billing` may not
    // write through the unbound route; the reader may write nowhere, not even with the highest
    // term, which would otherwise block the resource for everyone.
    let max = i64::MAX.to_string();
    type Case<'a> = (Option<&'a str>, &'a str, Vec<(&'a str, &'a str)>, u16);
    let cases: Vec<Case<'_>> = vec![
        (None, "/billing/acct-1/entries", vec![("fencing-token", "1")], 401),
        (None, "/free/thing-1", vec![("fencing-token", "1")], 401),
        (Some("Bearer nope"), "/billing/acct-1/entries", vec![("fencing-token", "1")], 401),
        (Some("Bearer nope"), "/free/thing-1", vec![("fencing-token", "1")], 401),
        (Some(reader.as_str()), "/billing/acct-1/entries", vec![("fencing-token", "1")], 403),
        (Some(reader.as_str()), "/free/thing-1", vec![("fencing-token", max.as_str())], 403),
        (Some(billing.as_str()), "/free/thing-1", vec![("fencing-token", max.as_str())], 403),
        (Some(writer.as_str()), "/billing/acct-1/entries", vec![("fencing-token", "1")], 403),
        (
            Some(writer.as_str()),
            "/free/thing-1",
            vec![("fencing-lease", "billing-writer"), ("fencing-owner", "w1")],
            403,
        ),
    ];
    for (auth, path, mut headers, expected) in cases {
        headers.push(("x-request-id", "refused"));
        if let Some(auth) = auth {
            headers.push(("authorization", auth));
        }
        let reply = send(s.gateway.proxy, Method::POST, path, &headers, "{}").await.unwrap();
        assert_eq!(reply.status.as_u16(), expected, "{path} with {auth:?} {headers:?}: {}", reply.json());
    }
    assert_eq!(fencing_state(&client).await, before, "refused writes changed nothing");
    // The writer may write through the unbound route, with a lower-case scheme too.
    let lower = format!("bearer {WRITER}");
    let reply = send(
        s.gateway.proxy,
        Method::POST,
        "/free/thing-1",
        &[("authorization", &lower), ("fencing-token", "1"), ("x-request-id", "writer")],
        "{}",
    )
    .await
    .unwrap();
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.json());
    // An unfenced GET passes without a token; a token sent along is not forwarded.
    let read = send(
        s.gateway.proxy,
        Method::GET,
        "/billing/acct-1",
        &[("authorization", &billing), ("x-request-id", "read")],
        "",
    )
    .await
    .unwrap();
    assert_eq!(read.status, StatusCode::OK);
    s.upstream.collect(Duration::from_millis(200)).await;
    assert!(!s.upstream.received("refused"), "a refused write reached the upstream");
    let read = s.upstream.log.iter().find(|l| l["x_request_id"] == "read").expect("the read arrived");
    assert!(read["authorization"].is_null(), "the bearer token was forwarded with a read: {read}");
    // Billing's own bound write with its own term goes through.
    let lease = send(
        s.gateway.control,
        Method::POST,
        "/v1/leases/billing-writer/acquire",
        &[JSON, ("authorization", &billing)],
        r#"{"owner":"w1","ttl_ms":30000}"#,
    )
    .await
    .unwrap();
    let term = lease.json()["term"].as_i64().unwrap().to_string();
    let write = send(
        s.gateway.proxy,
        Method::POST,
        "/billing/acct-1/entries",
        &[("authorization", &billing), ("fencing-token", &term)],
        "{}",
    )
    .await
    .unwrap();
    assert_eq!(write.status, StatusCode::OK, "{}", write.json());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_pages_cannot_call_the_control_api_and_foreign_hosts_are_refused() {
    let s = secured().await;
    let client = s.db.connect().await;
    let before = fencing_state(&client).await;
    let billing = bearer(BILLING);
    // A cross-site "simple request" can only be text/plain, a form or multipart.
    for content_type in ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", ""] {
        let mut headers = vec![("authorization", billing.as_str())];
        if !content_type.is_empty() {
            headers.push(("content-type", content_type));
        }
        let reply = send(
            s.gateway.control,
            Method::POST,
            "/v1/leases/billing-writer/acquire",
            &headers,
            r#"{"owner":"w1","ttl_ms":30000}"#,
        )
        .await
        .unwrap();
        assert_eq!(reply.status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{content_type:?}");
    }
    // DNS rebinding: the page's own name in Host.
    let control = s.gateway.control;
    let answer = raw(
        control,
        format!(
            "POST /v1/leases/billing-writer/acquire HTTP/1.1\r\nHost: evil.example\r\nAuthorization: {billing}\r\n\
             Content-Type: application/json\r\nContent-Length: 29\r\nConnection: close\r\n\r\n{{\"owner\":\"w1\",\"ttl_ms\":30000}}"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    assert!(answer.starts_with("HTTP/1.1 421"), "{answer}");
    // RFC 9112: no Host, two Hosts, a malformed Host: 400, on both listeners.
    for head in [
        "GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n",
        "GET /healthz HTTP/1.1\r\nHost: localhost\r\nHost: localhost\r\nConnection: close\r\n\r\n",
        "GET /healthz HTTP/1.1\r\nHost: evil\\\r\nConnection: close\r\n\r\n",
    ] {
        for addr in [s.gateway.control, s.gateway.proxy] {
            let answer = raw(addr, head.as_bytes()).await.unwrap();
            assert!(answer.starts_with("HTTP/1.1 400"), "{head:?} to {addr}: {answer}");
        }
    }
    // The proxy's configured names too.
    let answer =
        raw(s.gateway.proxy, b"GET /free/x HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n").await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 421"), "{answer}");
    assert_eq!(fencing_state(&client).await, before, "nothing was written");
}

/// Without clients nobody authenticates: a web page that rebinds its own name to 127.0.0.1 is
/// refused by name on both listeners, unless names are configured.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_clients_only_loopback_host_names_are_served() {
    let db = TestDb::new().await;
    let upstream = Upstream::start().await.unwrap();
    let routes =
        format!("[[routes]]\nprefix = \"/free\"\nupstream = \"{}\"\nresource = {{ segment = 2 }}\n", upstream.url());
    let gateway = Gateway::start(&db.url(), &routes).await.unwrap();
    for (addr, path) in [(gateway.control, "/v1/leases/k"), (gateway.proxy, "/free/x")] {
        let foreign = format!("GET {path} HTTP/1.1\r\nHost: attacker.example\r\nConnection: close\r\n\r\n");
        let answer = raw(addr, foreign.as_bytes()).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 421"), "{addr}: {answer}");
        for host in ["localhost:9090", "127.0.0.1", "[::1]:80"] {
            let local = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
            let answer = raw(addr, local.as_bytes()).await.unwrap();
            assert!(!answer.starts_with("HTTP/1.1 421"), "{addr} {host}: {answer}");
        }
    }
}

/// `fencing-gateway serve` with `config` and `env`, which must stop at start-up: its exit code
/// and stderr.
async fn serve_stopping(config: &str, env: &[(&str, &str)]) -> (Option<i32>, String) {
    let dir = std::env::temp_dir().join(format!("fencing-security-{}-{}", std::process::id(), rand::random::<u32>()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("config.toml");
    std::fs::write(&path, config).unwrap();
    let mut command = tokio::process::Command::new(workspace_bin("fencing-gateway").unwrap());
    command.args(["serve", "--config"]).arg(&path).env("FENCING_DATABASE_URL", "postgres://nobody@127.0.0.1:1/none");
    for (name, value) in env {
        command.env(name, value);
    }
    let output = tokio::time::timeout(Duration::from_secs(10), command.kill_on_drop(true).output())
        .await
        .expect("serve did not stop within 10 s")
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    (output.status.code(), String::from_utf8_lossy(&output.stderr).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_clients_a_listener_beyond_loopback_is_refused_at_start_up() {
    let (code, stderr) = serve_stopping("[proxy]\nlisten = \"0.0.0.0:0\"\n[control]\nlisten = \"[::]:0\"\n", &[]).await;
    assert_eq!(code, Some(64), "{stderr}");
    for key in ["proxy.listen", "control.listen", "[[clients]]"] {
        assert!(stderr.contains(key), "{key} missing from: {stderr}");
    }
    // The same through the environment, and for an IPv4-mapped address.
    let (code, stderr) = serve_stopping("", &[("FENCING_PROXY_LISTEN", "[::ffff:10.0.0.1]:0")]).await;
    assert_eq!(code, Some(64), "{stderr}");
    assert!(stderr.contains("proxy.listen"), "{stderr}");
}

/// Client-sent address headers are removed unless the peer is a trusted proxy; the gateway's own
/// `Forwarded` element stays well formed; an upstream's `Fencing-Current-Term` is not relayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn address_headers_from_untrusted_peers_are_removed_and_upstream_fencing_headers_not_relayed() {
    let db = TestDb::new().await;
    let mut upstream = Upstream::start().await.unwrap();
    let routes =
        format!("[[routes]]\nprefix = \"/free\"\nupstream = \"{}\"\nresource = {{ segment = 2 }}\n", upstream.url());
    let untrusted = Gateway::start(&db.url(), &routes).await.unwrap();
    let trusted =
        Gateway::start(&db.url(), &format!("[proxy]\ntrusted_proxies = [\"127.0.0.1\"]\n{routes}")).await.unwrap();
    let spoofed = [
        ("forwarded", "for=\"6.6.6.6\""),
        ("x-forwarded-for", "6.6.6.6"),
        ("x-real-ip", "6.6.6.6"),
        ("fencing-token", "1"),
    ];
    for (gateway, id) in [(&untrusted, "untrusted"), (&trusted, "trusted")] {
        let mut headers = spoofed.to_vec();
        headers.push(("x-request-id", id));
        let reply = send(gateway.proxy, Method::POST, "/free/r1", &headers, "{}").await.unwrap();
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.json());
        assert!(reply.header("fencing-current-term").is_none(), "the upstream's Fencing-Current-Term was relayed");
        // A GET passes unfenced, and its response is cleaned the same way.
        let read = send(gateway.proxy, Method::GET, "/free/r1", &headers, "").await.unwrap();
        assert!(read.header("fencing-current-term").is_none());
    }
    let log = upstream.collect(Duration::from_millis(200)).await.to_vec();
    let line = |id: &str| log.iter().find(|l| l["x_request_id"] == id && l["method"] == "POST").cloned().unwrap();
    let untrusted_line = line("untrusted");
    assert!(untrusted_line["x_forwarded_for"].is_null() && untrusted_line["x_real_ip"].is_null(), "{untrusted_line}");
    let forwarded = untrusted_line["forwarded"].as_str().unwrap();
    assert!(!forwarded.contains("6.6.6.6") && forwarded.starts_with("for=\"127.0.0.1:"), "{forwarded}");
    let trusted_line = line("trusted");
    assert_eq!(trusted_line["x_forwarded_for"], "6.6.6.6", "a trusted proxy's headers pass: {trusted_line}");
    assert!(trusted_line["forwarded"].as_str().unwrap().contains("6.6.6.6"));
}

/// An upstream's 101 that nobody asked for (the gateway never forwards Upgrade) is a 502.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unrequested_101_from_an_upstream_is_not_relayed() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buffer = [0_u8; 4096];
                let _ = stream.read(&mut buffer).await;
                let _ = stream
                    .write_all(b"HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\nUpgrade: evil\r\n\r\n")
                    .await;
                tokio::time::sleep(Duration::from_secs(2)).await;
            });
        }
    });
    let db = TestDb::new().await;
    let routes =
        format!("[[routes]]\nprefix = \"/free\"\nupstream = \"http://{addr}\"\nresource = {{ segment = 2 }}\n");
    let gateway = Gateway::start(&db.url(), &routes).await.unwrap();
    for (method, headers) in [(Method::POST, vec![("fencing-token", "1")]), (Method::GET, vec![])] {
        let answer = send(gateway.proxy, method.clone(), "/free/r1", &headers, "").await.unwrap();
        assert_eq!(answer.status, StatusCode::BAD_GATEWAY, "{method}: {:?}", answer.headers);
        assert!(answer.header("upgrade").is_none());
    }
}

/// Membership over HTTP with clients: a client may use only the clusters its lease globs name,
/// and another client cannot make its node leave (incarnations are kept per client, like
/// lease owners); without a token nothing is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_nodes_are_its_own_and_clusters_follow_its_lease_globs() {
    let s = secured().await;
    let control = s.gateway.control;
    let (billing, other, reader) = (bearer(BILLING), bearer(OTHER), bearer(READER));
    let call = |token: String, method: Method, path: &'static str, body: &'static str| async move {
        send(control, method, path, &[JSON, ("authorization", &token)], body).await.unwrap()
    };
    let beat = r#"{"incarnation":"p1","ttl_ms":30000}"#;
    let joined = call(billing.clone(), Method::POST, "/v1/clusters/billing-workers/nodes/n1/heartbeat", beat).await;
    assert_eq!(joined.status, StatusCode::OK, "{}", joined.json());
    // A cluster outside the client's globs, for a write and for a read.
    let outside = call(reader.clone(), Method::POST, "/v1/clusters/billing-workers/nodes/n2/heartbeat", beat).await;
    assert_eq!((outside.status, problem_type(&outside).ends_with("forbidden")), (StatusCode::FORBIDDEN, true));
    let outside = call(billing.clone(), Method::GET, "/v1/clusters/payments/nodes", "").await;
    assert_eq!(outside.status, StatusCode::FORBIDDEN);
    // Another client allowed the same cluster, with the same incarnation string: not billing's node.
    let hijack =
        call(other.clone(), Method::POST, "/v1/clusters/billing-workers/nodes/n1/leave", r#"{"incarnation":"p1"}"#)
            .await;
    assert_eq!(hijack.status, StatusCode::CONFLICT);
    let hijack = call(other.clone(), Method::POST, "/v1/clusters/billing-workers/nodes/n1/heartbeat", beat).await;
    assert_eq!(hijack.status, StatusCode::CONFLICT);
    let listed = call(other, Method::GET, "/v1/clusters/billing-workers/nodes", "").await;
    assert_eq!(listed.json()["nodes"].as_array().map(Vec::len), Some(1), "{}", listed.json());
    // Leaving a cluster outside the globs: 403 before anything is looked at.
    let outside =
        call(reader, Method::POST, "/v1/clusters/billing-workers/nodes/n1/leave", r#"{"incarnation":"p1"}"#).await;
    assert_eq!(outside.status, StatusCode::FORBIDDEN);
    // A NUL in a name: 422, not a dropped connection and a 503.
    let nul = call(billing.clone(), Method::POST, "/v1/clusters/billing-workers/nodes/n%00/heartbeat", beat).await;
    assert_eq!(nul.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", nul.json());
    // No token (or a wrong one): 401, nothing registered.
    let anonymous =
        send(control, Method::POST, "/v1/clusters/billing-workers/nodes/n9/heartbeat", &[JSON], beat).await.unwrap();
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
    let wrong =
        call(bearer("not-a-token"), Method::POST, "/v1/clusters/billing-workers/nodes/n9/heartbeat", beat).await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    let nodes: i64 = s.db.connect().await.query_one("SELECT count(*) FROM fencing.nodes", &[]).await.unwrap().get(0);
    assert_eq!(nodes, 1, "only billing's n1 was ever registered");
    let left =
        call(billing, Method::POST, "/v1/clusters/billing-workers/nodes/n1/leave", r#"{"incarnation":"p1"}"#).await;
    assert_eq!(left.status, StatusCode::NO_CONTENT);
}

#[tokio::test]
async fn a_clients_assignments_are_its_own_and_its_leader_pass_needs_its_own_lease() {
    let s = secured().await;
    let control = s.gateway.control;
    let (billing, other, reader) = (bearer(BILLING), bearer(OTHER), bearer(READER));
    let call = |token: String, method: Method, path: String, body: String| async move {
        send(control, method, &path, &[JSON, ("authorization", &token)], &body).await.unwrap()
    };
    let post = |token: String, path: &str, body: &str| call(token, Method::POST, path.to_owned(), body.to_owned());
    let joined = post(
        billing.clone(),
        "/v1/clusters/billing-workers/nodes/n1/heartbeat",
        r#"{"incarnation":"p1","ttl_ms":30000}"#,
    )
    .await;
    assert_eq!(joined.status, StatusCode::OK);
    let offer = r#"{"incarnation":"p1","daemons":["outbox"]}"#;
    assert_eq!(
        post(billing.clone(), "/v1/clusters/billing-workers/nodes/n1/assignments", offer).await.status,
        StatusCode::OK
    );
    let lease = post(billing.clone(), "/v1/leases/billing-leader/acquire", r#"{"owner":"L","ttl_ms":30000}"#).await;
    let term = lease.json()["term"].as_i64().unwrap();
    let pass = |owner: &str| {
        format!(
            r#"{{"lease":"billing-leader","owner":"{owner}","term":{term},"ack_timeout_ms":30000,"drain_timeout_ms":30000}}"#
        )
    };
    // Outside the client's globs: 403 for the cluster and for the lease.
    let outside = post(reader.clone(), "/v1/clusters/billing-workers/reconcile", &pass("L")).await;
    assert_eq!(outside.status, StatusCode::FORBIDDEN);
    let outside = post(reader.clone(), "/v1/clusters/billing-workers/nodes/n1/assignments", offer).await;
    assert_eq!(outside.status, StatusCode::FORBIDDEN);
    let outside = call(reader, Method::GET, "/v1/clusters/billing-workers/daemons".to_owned(), String::new()).await;
    assert_eq!(outside.status, StatusCode::FORBIDDEN);
    // Another client allowed the cluster and the lease, presenting billing's owner and term:
    // its owner is "other/L", which holds nothing.
    let forged = post(other.clone(), "/v1/clusters/billing-workers/reconcile", &pass("L")).await;
    assert_eq!(forged.status, StatusCode::CONFLICT, "{}", forged.json());
    let db = s.db.connect().await;
    let assigned: i64 =
        db.query_one("SELECT count(*) FROM fencing.daemons WHERE state <> 'unassigned'", &[]).await.unwrap().get(0);
    assert_eq!(assigned, 0, "a forged pass assigned work");
    let pass_ok = post(billing.clone(), "/v1/clusters/billing-workers/reconcile", &pass("L")).await;
    assert_eq!(pass_ok.status, StatusCode::OK, "{}", pass_ok.json());
    // Another client with billing's node id and incarnation string cannot see, acknowledge or
    // end billing's assignment.
    let theirs = post(other.clone(), "/v1/clusters/billing-workers/nodes/n1/assignments", offer).await;
    assert_eq!(theirs.json()["assignments"], serde_json::json!([]), "{}", theirs.json());
    for op in ["ack", "stopped"] {
        let hijack = post(
            other.clone(),
            &format!("/v1/clusters/billing-workers/nodes/n1/assignments/outbox/{op}"),
            r#"{"incarnation":"p1","generation":1}"#,
        )
        .await;
        assert_eq!(hijack.status, StatusCode::CONFLICT, "{op}: {}", hijack.json());
    }
    let acked = post(
        billing,
        "/v1/clusters/billing-workers/nodes/n1/assignments/outbox/ack",
        r#"{"incarnation":"p1","generation":1}"#,
    )
    .await;
    assert_eq!(acked.status, StatusCode::OK, "{}", acked.json());
}

/// Graceful handover with clients: a client that may use a key cannot ask (let alone force)
/// another client's holder to step down, nor name another client's owner as successor; a
/// client hands over among its own owners.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_cannot_hand_over_or_force_another_clients_lease() {
    let s = secured().await;
    let control = s.gateway.control;
    let call = |token: &'static str, path: &'static str, body: &'static str| async move {
        let auth = bearer(token);
        send(control, Method::POST, path, &[JSON, ("authorization", auth.as_str())], body).await.unwrap()
    };
    let acquired = call(BILLING, "/v1/leases/billing-x/acquire", r#"{"owner":"w1","ttl_ms":30000}"#).await;
    assert_eq!(acquired.status, StatusCode::OK);
    let term = acquired.json()["term"].as_i64().unwrap();
    // "other" may use billing-* keys, but the holder is billing's: nothing asked, nothing forced.
    let refused = call(
        OTHER,
        "/v1/leases/billing-x/resign-request",
        r#"{"reason":"mine now","successor":"w9","force_after_ms":0}"#,
    )
    .await;
    assert_eq!(refused.status, StatusCode::CONFLICT, "{}", refused.json());
    let renewed = call(BILLING, "/v1/leases/billing-x/renew", r#"{"owner":"w1","ttl_ms":30000}"#).await;
    assert_eq!((renewed.status, renewed.json()["resign_requested"].as_bool()), (StatusCode::OK, Some(false)));
    // billing hands over to its own w2: the successor is billing's, whatever the name says.
    let asked = call(BILLING, "/v1/leases/billing-x/resign-request", r#"{"reason":"deploy","successor":"w2"}"#).await;
    assert_eq!((asked.status, asked.json()["successor"].as_str()), (StatusCode::ACCEPTED, Some("billing/w2")));
    assert_eq!(call(BILLING, "/v1/leases/billing-x/release", r#"{"owner":"w1"}"#).await.status, StatusCode::NO_CONTENT);
    let other_w2 = call(OTHER, "/v1/leases/billing-x/acquire", r#"{"owner":"w2","ttl_ms":30000}"#).await;
    assert_eq!(other_w2.status, StatusCode::CONFLICT, "another client's w2 is not the successor");
    let w2 = call(BILLING, "/v1/leases/billing-x/acquire", r#"{"owner":"w2","ttl_ms":30000}"#).await;
    assert_eq!((w2.status, w2.json()["term"].as_i64()), (StatusCode::OK, Some(term + 1)));
}
