//! TLS with a CA made inside each test: both listeners, client certificates, `https://`
//! upstreams with SNI, and Postgres with `sslmode=verify-full|verify-ca|require`. Nothing falls
//! back to plaintext, and a failed handshake says why.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use fencing_tests::gateway::{Gateway, Upstream, raw, send};
use fencing_tests::pg::{PgCluster, TestDb, connect};
use fencing_tests::tls::{Issued, TestCa, send_tls, server_config};
use fencing_tests::workspace_bin;
use http::{Method, StatusCode};
use hyper_util::rt::TokioIo;

fn listener_tls(issued: &Issued, client_ca: Option<&std::path::Path>) -> String {
    let client_ca = client_ca.map(|ca| format!(", client_ca = \"{}\"", ca.display())).unwrap_or_default();
    format!("tls = {{ cert = \"{}\", key = \"{}\"{client_ca} }}", issued.cert.display(), issued.key.display())
}

async fn wait_ready_tls(ca: &TestCa, client: Option<&Issued>, control: SocketAddr) {
    for _ in 0..300 {
        if let Ok(reply) =
            send_tls(ca.client_config(client).unwrap(), control, "localhost", Method::GET, "/readyz", &[], "").await
            && reply.status == StatusCode::OK
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the gateway did not become ready over TLS");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_listeners_speak_tls_only_and_the_control_listener_can_require_client_certificates() {
    let ca = TestCa::new("listeners").unwrap();
    let server = ca.issue("server", &["localhost", "127.0.0.1"]).unwrap();
    let client = ca.issue("client", &["leader.example"]).unwrap();
    let stranger_ca = TestCa::new("stranger").unwrap();
    let stranger = stranger_ca.issue("client", &["leader.example"]).unwrap();
    let db = TestDb::new().await;
    let mut upstream = Upstream::start().await.unwrap();
    let config = format!(
        "[proxy]\n{}\n[control]\n{}\n[[routes]]\nprefix = \"/free\"\nupstream = \"{}\"\nresource = {{ segment = 2 }}\n",
        listener_tls(&server, None),
        listener_tls(&server, Some(&ca.ca_file())),
        upstream.url()
    );
    let gateway = Gateway::spawn(&db.url(), &config).await.unwrap();
    wait_ready_tls(&ca, Some(&client), gateway.control).await;

    let write = send_tls(
        ca.client_config(None).unwrap(),
        gateway.proxy,
        "localhost",
        Method::POST,
        "/free/r1",
        &[("fencing-token", "1"), ("x-request-id", "over-tls")],
        "{}",
    )
    .await
    .unwrap();
    assert_eq!(write.status, StatusCode::OK, "{}", write.json());
    upstream.collect(Duration::from_millis(200)).await;
    assert!(upstream.received("over-tls"));

    // Plain HTTP to a TLS listener gets no HTTP answer.
    for addr in [gateway.proxy, gateway.control] {
        let answer = raw(addr, b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").await.unwrap();
        assert!(!answer.contains("HTTP/"), "{addr} answered plaintext: {answer}");
    }
    // A client that does not trust the gateway's CA refuses it; the control listener refuses
    // clients without a certificate, or with one from another CA.
    assert!(
        send_tls(stranger_ca.client_config(None).unwrap(), gateway.proxy, "localhost", Method::GET, "/free/x", &[], "")
            .await
            .is_err()
    );
    for certificate in [None, Some(&stranger)] {
        let config = match certificate {
            None => ca.client_config(None).unwrap(),
            Some(stranger) => {
                // Trusts the gateway, presents a certificate the gateway does not trust.
                let mut config = ca.client_config(Some(&client)).unwrap();
                config.client_auth_cert_resolver =
                    stranger_ca.client_config(Some(stranger)).unwrap().client_auth_cert_resolver;
                config
            }
        };
        let reply = send_tls(config, gateway.control, "localhost", Method::GET, "/healthz", &[], "").await;
        assert!(reply.is_err(), "the control listener answered a client with {certificate:?}: {reply:?}");
    }
}

/// A TLS upstream that answers 200 and counts the requests it received.
async fn tls_upstream(issued: &Issued) -> (SocketAddr, Arc<AtomicUsize>) {
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server_config(issued).unwrap()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let received = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&received);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            let counter = Arc::clone(&counter);
            tokio::spawn(async move {
                let Ok(stream) = acceptor.accept(stream).await else { return };
                let service = hyper::service::service_fn(move |_request| {
                    counter.fetch_add(1, Ordering::SeqCst);
                    async {
                        Ok::<_, std::convert::Infallible>(http::Response::new(http_body_util::Full::new(
                            bytes::Bytes::from_static(b"ok"),
                        )))
                    }
                });
                let _ =
                    hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
            });
        }
    });
    (addr, received)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_upstreams_are_verified_against_the_configured_ca_by_name() {
    let ca = TestCa::new("upstream").unwrap();
    // A name only, no address: the gateway must send SNI and check the name.
    let issued = ca.issue("upstream", &["localhost"]).unwrap();
    let (addr, received) = tls_upstream(&issued).await;
    let other_ca = TestCa::new("other").unwrap();
    let db = TestDb::new().await;
    let route = |ca_file: &std::path::Path| {
        format!(
            "[upstream]\nca_file = \"{}\"\n[[routes]]\nprefix = \"/s\"\nupstream = \"https://localhost:{}\"\nresource = {{ segment = 2 }}\n",
            ca_file.display(),
            addr.port()
        )
    };
    let trusted = Gateway::start(&db.url(), &route(&ca.ca_file())).await.unwrap();
    let reply = send(trusted.proxy, Method::POST, "/s/r1", &[("fencing-token", "1")], "").await.unwrap();
    assert_eq!(reply.status, StatusCode::OK, "{}", String::from_utf8_lossy(&reply.body));
    assert_eq!(received.load(Ordering::SeqCst), 1);

    let untrusting = Gateway::start(&db.url(), &route(&other_ca.ca_file())).await.unwrap();
    let reply = send(untrusting.proxy, Method::POST, "/s/r2", &[("fencing-token", "1")], "").await.unwrap();
    assert_eq!(reply.status, StatusCode::BAD_GATEWAY, "an upstream with an untrusted certificate was used");
    assert_eq!(received.load(Ordering::SeqCst), 1, "nothing reached it");

    // A certificate from the right CA for another name: refused too.
    let misnamed = ca.issue("misnamed", &["other.example"]).unwrap();
    let (misnamed_addr, misnamed_received) = tls_upstream(&misnamed).await;
    let config = route(&ca.ca_file())
        .replace(&format!("localhost:{}", addr.port()), &format!("localhost:{}", misnamed_addr.port()));
    let checking = Gateway::start(&db.url(), &config).await.unwrap();
    let reply = send(checking.proxy, Method::POST, "/s/r3", &[("fencing-token", "1")], "").await.unwrap();
    assert_eq!(reply.status, StatusCode::BAD_GATEWAY, "an upstream with a certificate for another name was used");
    assert_eq!(misnamed_received.load(Ordering::SeqCst), 0);
}

/// `fencing-gateway migrate` against `url`, given through the environment.
async fn migrate(url: String) -> std::process::Output {
    tokio::process::Command::new(workspace_bin("fencing-gateway").unwrap())
        .arg("migrate")
        .env("DATABASE_URL", url)
        .env_remove("DATABASE_URL_FILE")
        .kill_on_drop(true)
        .output()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_over_tls_with_verify_full_verify_ca_and_require_and_never_in_clear() {
    let ca = TestCa::new("postgres").unwrap();
    let server = ca.issue("db", &["127.0.0.1"]).unwrap();
    let elsewhere = ca.issue("db-elsewhere", &["db.example"]).unwrap();
    let other_ca = TestCa::new("postgres-other").unwrap();
    let cluster = PgCluster::start().unwrap();
    cluster.enable_tls(&server.cert, &server.key).unwrap();
    connect(&cluster.url("postgres")).await.batch_execute("CREATE DATABASE gw").await.unwrap();
    let base = cluster.url("gw");
    let routes = "[[routes]]\nprefix = \"/w\"\nupstream = \"http://127.0.0.1:1\"\nresource = { segment = 2 }\n";

    let ca_file = ca.ca_file();
    let verify_full = format!("{base}?sslmode=verify-full&sslrootcert={}", ca_file.display());
    // A gateway on `url` gets ready, and every connection it holds to `gw` is encrypted (the
    // server accepts plaintext too, so only this shows that nothing fell back).
    let admin_url = cluster.url("postgres");
    let only_encrypted = |url: String| {
        let admin_url = admin_url.clone();
        async move {
            let admin = connect(&admin_url).await;
            let gateway = Gateway::start(&url, routes).await.unwrap();
            let counts = admin
                .query_one(
                    "SELECT count(*) FILTER (WHERE s.ssl), count(*) FILTER (WHERE NOT s.ssl)
                       FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) WHERE a.datname = 'gw'",
                    &[],
                )
                .await
                .unwrap();
            let (encrypted, clear): (i64, i64) = (counts.get(0), counts.get(1));
            assert!(encrypted >= 1 && clear == 0, "{url}: {encrypted} encrypted and {clear} clear connections");
            drop(gateway);
        }
    };
    only_encrypted(verify_full.clone()).await;

    // A server certificate from another CA: no connection, and the CLI says why.
    let wrong_ca = format!("{base}?sslmode=verify-full&sslrootcert={}", other_ca.ca_file().display());
    let output = migrate(wrong_ca.clone()).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("certificate"), "the cause of the failed handshake is not shown: {stderr}");

    // The gateway itself: not ready, and its log says why (/readyz, open to anyone, says only
    // where to look).
    let mut gateway = Gateway::spawn_capturing_logs(&wrong_ca, routes).await.unwrap();
    let mut why = None;
    for _ in 0..100 {
        let reply = send(gateway.control, Method::GET, "/readyz", &[], "").await.unwrap();
        assert_ne!(reply.status, StatusCode::OK, "ready without a verified connection");
        while let Ok(line) = gateway.logs.try_recv() {
            if line.contains("certificate") {
                why = Some(line);
            }
        }
        if why.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(why.is_some(), "the log does not say why the store cannot be reached");
    drop(gateway);

    // A certificate for another name: verify-ca accepts it (from its CA only), verify-full does not.
    cluster.enable_tls(&elsewhere.cert, &elsewhere.key).unwrap();
    only_encrypted(format!("{base}?sslmode=verify-ca&sslrootcert={}", ca_file.display())).await;
    let stranger = migrate(format!("{base}?sslmode=verify-ca&sslrootcert={}", other_ca.ca_file().display())).await;
    assert_eq!(stranger.status.code(), Some(1), "verify-ca accepted a certificate from another CA");
    let full = migrate(verify_full.clone()).await;
    assert_eq!(full.status.code(), Some(1), "verify-full accepted a certificate for another name");
    // `require` without a root: encrypted, unverified, as libpq.
    only_encrypted(format!("{base}?sslmode=require")).await;

    // Modes that would fall back to plaintext are refused before anything starts.
    let output = tokio::process::Command::new(workspace_bin("fencing-gateway").unwrap())
        .args(["serve"])
        .env("FENCING_DATABASE_URL", format!("{base}?sslmode=prefer"))
        .env_remove("DATABASE_URL")
        .env_remove("DATABASE_URL_FILE")
        .kill_on_drop(true)
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("plaintext"), "{stderr}");
}
