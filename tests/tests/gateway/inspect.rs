//! The inspection CLI against a gateway's database: leases, fences and refused writes as an
//! operator sees them, and the admin actions, which ask for confirmation and are audited.

use std::process::Stdio;
use std::time::Duration;

use fencing_schema::store;
use fencing_tests::gateway::{JSON, send};
use fencing_tests::workspace_bin;
use http::{Method, StatusCode};
use tokio::io::AsyncWriteExt;

use crate::Setup;

/// Runs `fencing-gateway ARGS --database-url URL` with `stdin`; returns exit code and stdout+stderr.
async fn cli(url: &str, args: &[&str], stdin: &str) -> (Option<i32>, String) {
    let mut child = tokio::process::Command::new(workspace_bin("fencing-gateway").unwrap())
        .args(args)
        .args(["--database-url", url])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.as_bytes()).await.unwrap();
    drop(input);
    let output = child.wait_with_output().await.unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    (output.status.code(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_inspect_leases_fences_and_refusals_and_change_them_only_when_confirmed() {
    let setup = Setup::new().await;
    let url = setup.db.url();
    let client = setup.db.connect().await;
    let acquire = |owner: &'static str| async move {
        send(
            setup.gateway.control,
            Method::POST,
            "/v1/leases/ledger-writer/acquire",
            &[JSON],
            &format!(r#"{{"owner":"{owner}","ttl_ms":600000,"value":{{"addr":"{owner}:7000"}}}}"#),
        )
        .await
        .unwrap()
    };
    assert_eq!(acquire("node-a").await.status, StatusCode::OK);
    let write = |term: &'static str| async move {
        send(setup.gateway.proxy, Method::POST, "/ledger/acct-1/entries", &[("fencing-token", term)], "")
            .await
            .unwrap()
            .status
    };
    assert_eq!(write("1").await, StatusCode::OK);
    assert_eq!(write("3").await, StatusCode::CONFLICT, "a future term on the bound resource");

    let (code, leases) = cli(&url, &["inspect", "leases"], "").await;
    assert_eq!(code, Some(0), "{leases}");
    assert!(
        leases.lines().any(|l| l.starts_with("ledger-writer")
            && l.contains("node-a")
            && l.contains(" 1 ")
            && l.ends_with(r#"{"addr": "node-a:7000"}"#)),
        "the holder, its term and its value: {leases}"
    );
    let (code, fence) = cli(&url, &["inspect", "fence", "acct-1"], "").await;
    assert_eq!(code, Some(0));
    assert!(fence.contains("max term:   1") && fence.contains("bound to:   ledger-writer"), "{fence}");

    // The refusal is recorded in the background, then shown.
    let mut recorded = false;
    for _ in 0..100 {
        if !store::list_refusals(&client, Some("acct-1"), 10).await.unwrap().is_empty() {
            recorded = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(recorded, "the refused write was recorded");
    let (code, refusals) = cli(&url, &["inspect", "refusals", "--resource", "acct-1"], "").await;
    assert_eq!(code, Some(0));
    let line = refusals.lines().nth(1).unwrap_or_default();
    assert!(line.contains("acct-1") && line.contains("/ledger") && line.contains("future_term"), "{refusals}");
    assert!(line.contains("127.0.0.1:"), "the refusal names the client's address: {refusals}");
    // Verify mode: the lease the resource is bound to, and the term presented, name the zombie.
    assert!(
        line.contains("ledger-writer") && line.contains("        3 "),
        "the lease and the presented term: {refusals}"
    );
    assert!(refusals.contains("Postgres itself refused 0 write(s)"), "{refusals}");

    // Releasing a lease by hand: not confirmed, nothing changes; confirmed, it ends and is audited.
    let (code, text) =
        cli(&url, &["admin", "release-lease", "ledger-writer", "--reason", "node-a is gone"], "no\n").await;
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("held by \"node-a\" with term 1") && text.contains("nothing changed"), "{text}");
    assert_eq!(acquire("node-b").await.status, StatusCode::CONFLICT, "still held by node-a");
    let (code, text) = cli(
        &url,
        &["admin", "release-lease", "ledger-writer", "--reason", "node-a is gone", "--actor", "alice"],
        "ledger-writer\n",
    )
    .await;
    assert_eq!(code, Some(0), "{text}");
    // Shown as forced, not as expired (issue 31: a released lease read "expired").
    let (_, leases) = cli(&url, &["inspect", "leases"], "").await;
    let line = leases.lines().find(|line| line.starts_with("ledger-writer")).unwrap_or_default();
    assert!(line.contains("(none; last node-a)") && line.contains("forced"), "{leases}");
    let next = acquire("node-b").await;
    assert_eq!((next.status, next.json()["term"].as_i64()), (StatusCode::OK, Some(2)));

    // Advancing a fence: never backwards; forwards when confirmed, and then lower terms are refused.
    let (code, text) =
        cli(&url, &["admin", "advance-fence", "acct-1", "--term", "1", "--reason", "x", "--yes"], "").await;
    assert_eq!(code, Some(1));
    assert!(text.contains("never goes back"), "{text}");
    let (code, text) = cli(
        &url,
        &["admin", "advance-fence", "acct-1", "--term", "7", "--reason", "incident 42", "--actor", "alice", "--yes"],
        "",
    )
    .await;
    assert_eq!(code, Some(0), "{text}");
    assert_eq!(store::get_fence(&client, "acct-1").await.unwrap().unwrap().max_term, 7);

    let (code, audit) = cli(&url, &["inspect", "audit"], "").await;
    assert_eq!(code, Some(0));
    assert!(audit.contains("alice  advance_fence acct-1  reason: incident 42"), "{audit}");
    assert!(audit.contains("alice  force_release ledger-writer  reason: node-a is gone"), "{audit}");
}

/// Rebinding and resetting a fence are admin actions, confirmed and audited; a reset works on
/// unbound fences only, and a write never does either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_rebind_a_resource_and_reset_a_poisoned_unbound_fence_only_by_audited_admin_actions() {
    let setup = Setup::new().await;
    let url = setup.db.url();
    let client = setup.db.connect().await;
    let term =
        store::acquire(&client, "ledger-writer", "node-a", Duration::from_secs(600)).await.unwrap().term.unwrap();
    let forward = Duration::from_secs(1);
    assert!(store::gate(&client, "acct-9", term, forward, Some("ledger-writer")).await.unwrap().is_admitted());

    let (code, text) = cli(&url, &["admin", "rebind", "acct-9", "--lease", "other", "--reason", "moved"], "no\n").await;
    assert_eq!(code, Some(1), "{text}");
    assert_eq!(store::get_fence(&client, "acct-9").await.unwrap().unwrap().lease_key.as_deref(), Some("ledger-writer"));
    let (code, text) = cli(
        &url,
        &["admin", "rebind", "acct-9", "--lease", "other", "--reason", "moved", "--actor", "bob"],
        "acct-9\n",
    )
    .await;
    assert_eq!(code, Some(0), "{text}");
    assert_eq!(store::get_fence(&client, "acct-9").await.unwrap().unwrap().lease_key.as_deref(), Some("other"));

    // A bound fence is never reset; a poisoned unbound one is.
    let (code, text) =
        cli(&url, &["admin", "reset-fence", "acct-9", "--term", "1", "--reason", "x", "--yes"], "").await;
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("only unbound fences"), "{text}");
    assert!(store::gate(&client, "/jobs/job-1", i64::MAX, forward, None).await.unwrap().is_admitted());
    let (code, text) = cli(
        &url,
        &["admin", "reset-fence", "/jobs/job-1", "--term", "2", "--reason", "poisoned", "--actor", "bob", "--yes"],
        "",
    )
    .await;
    assert_eq!(code, Some(0), "{text}");
    assert_eq!(store::get_fence(&client, "/jobs/job-1").await.unwrap().unwrap().max_term, 2);
    let (_, audit) = cli(&url, &["inspect", "audit"], "").await;
    assert!(audit.contains("bob  rebind acct-9  reason: moved"), "{audit}");

    // A write refused inside Postgres rolls back, yet the gateway's /metrics counts it.
    client
        .batch_execute("CREATE TABLE orders (id int PRIMARY KEY); SELECT fencing.protect('orders', 'orders');")
        .await
        .unwrap();
    assert!(client.batch_execute("INSERT INTO orders VALUES (1)").await.is_err());
    let metrics = send(setup.gateway.control, Method::GET, "/metrics", &[], "").await.unwrap();
    let text = String::from_utf8_lossy(&metrics.body);
    assert!(text.lines().any(|l| l == "fencing_sql_refusals_total 1"), "{text}");
    assert!(audit.contains("bob  reset_fence /jobs/job-1  reason: poisoned"), "{audit}");
}

/// Finding the zombie from the log: every refusal is a warn line naming the client's address,
/// the request id, the terms and, in stamp mode, the lease and owner; at most 10 lines a second,
/// the next one saying how many were left out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_are_logged_at_warn_with_who_and_which_terms_rate_limited() {
    let db = fencing_tests::pg::TestDb::new().await;
    let upstream = fencing_tests::gateway::Upstream::start().await.unwrap();
    let mut gateway = fencing_tests::gateway::Gateway::start_capturing_logs(&db.url(), &crate::routes(&upstream.url()))
        .await
        .unwrap();
    let acquire = |owner: &'static str| {
        let control = gateway.control;
        async move {
            send(
                control,
                Method::POST,
                "/v1/leases/ledger-writer/acquire",
                &[JSON],
                &format!(r#"{{"owner":"{owner}","ttl_ms":600000}}"#),
            )
            .await
            .unwrap()
        }
    };
    let term = acquire("leader").await.json()["term"].as_i64().unwrap().to_string();
    let proxy = gateway.proxy;
    let ok = send(proxy, Method::POST, "/ledger/acct-1/x", &[("fencing-token", &term)], "").await.unwrap();
    assert_eq!(ok.status, StatusCode::OK);
    let stamped = send(
        proxy,
        Method::POST,
        "/ledger/acct-1/x",
        &[("fencing-lease", "ledger-writer"), ("fencing-owner", "zombie-7"), ("x-request-id", "zombie-stamp")],
        "",
    )
    .await
    .unwrap();
    assert_eq!(stamped.status, StatusCode::CONFLICT);
    for i in 0..30 {
        let id = format!("stale-{i}");
        let reply = send(
            proxy,
            Method::POST,
            "/jobs",
            &[("fencing-token", "1"), ("fencing-resource", "j"), ("x-request-id", &id)],
            "",
        )
        .await
        .unwrap();
        // The first admits term 1 on `j`; raise it, then every later write with 1 is stale.
        if i == 0 {
            let raise = send(proxy, Method::POST, "/jobs", &[("fencing-token", "2"), ("fencing-resource", "j")], "")
                .await
                .unwrap();
            assert_eq!(raise.status, StatusCode::OK);
        } else {
            assert_eq!(reply.status, StatusCode::CONFLICT);
        }
    }
    tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
    let late = send(
        proxy,
        Method::POST,
        "/jobs",
        &[("fencing-token", "1"), ("fencing-resource", "j"), ("x-request-id", "late")],
        "",
    )
    .await
    .unwrap();
    assert_eq!(late.status, StatusCode::CONFLICT);
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;

    let mut refusals = Vec::new();
    while let Ok(line) = gateway.logs.try_recv() {
        let Ok(value) = serde_json::from_str::<serde_json::Value>(&line) else { continue };
        if value["level"] == "WARN"
            && value["fields"]["message"].as_str().is_some_and(|m| m.contains("refused by the fence"))
        {
            refusals.push(value["fields"].clone());
        }
    }
    let stamp = refusals.iter().find(|f| f["request_id"] == "zombie-stamp").expect("the stamp-mode refusal is logged");
    assert_eq!(
        (stamp["lease"].as_str(), stamp["owner"].as_str()),
        (Some("ledger-writer"), Some("zombie-7")),
        "{stamp}"
    );
    assert!(stamp["client"].as_str().is_some_and(|c| c.starts_with("127.0.0.1:")), "{stamp}");
    assert_eq!(stamp["outcome"], "not_leader");
    let stale = refusals.iter().find(|f| f["request_id"] == "stale-1").expect("a stale refusal is logged");
    assert_eq!((stale["presented_term"].as_i64(), stale["current_term"].as_i64()), (Some(1), Some(2)), "{stale}");
    // 31 refusals, most within a second: at most 10 lines a second, and every refusal left out
    // is counted by the next line that is written (the last one comes after a quiet second).
    let logged = refusals.len() as u64;
    let left_out: u64 = refusals.iter().filter_map(|f| f["suppressed_since_last"].as_u64()).sum();
    assert_eq!(logged + left_out, 31, "{logged} lines and {left_out} left out for 31 refusals");
    assert!(left_out >= 9, "only {left_out} of a burst of 29 refusals were left out");
    assert!(refusals.iter().any(|f| f["request_id"] == "late"), "the line after the quiet second");
}

/// `inspect streams`: every stream with its lease, term, head and first kept entry, and each
/// follower's position and lag; one stream by name; an unknown one is an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_inspect_the_fenced_logs_streams_and_their_followers() {
    use fencing_schema::log::{self as store_log, Retention};
    let db = fencing_tests::pg::TestDb::new().await;
    let url = db.url();
    let client = db.connect().await;
    // `admin create-stream` makes a stream with its retention; one that exists, or a bad
    // retention, is an error that changes nothing.
    let (code, text) =
        cli(&url, &["admin", "create-stream", "orders", "--lease", "orders-leader", "--keep-count", "100"], "").await;
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("created stream \"orders\", bound to lease \"orders-leader\""), "{text}");
    let status = store_log::status(&client, "orders").await.unwrap();
    assert_eq!((status.lease_key.as_deref(), status.retention.keep_count), (Some("orders-leader"), Some(100)));
    let (code, again) = cli(&url, &["admin", "create-stream", "orders", "--lease", "other"], "").await;
    assert_ne!(code, Some(0), "{again}");
    assert_eq!(store_log::status(&client, "orders").await.unwrap().lease_key.as_deref(), Some("orders-leader"));
    let (code, bad) = cli(&url, &["admin", "create-stream", "x", "--lease", "k", "--keep-count", "0"], "").await;
    assert_eq!(code, Some(64), "{bad}");
    store_log::create_stream(&client, "audit", "audit-leader", Retention::default()).await.unwrap();
    let term = store::acquire(&client, "orders-leader", "a", Duration::from_secs(60)).await.unwrap().term.unwrap();
    store_log::append(&client, "orders", term, &["1", "2", "3"]).await.unwrap();
    store_log::report_position(&client, "orders", "replica-1", 1).await.unwrap();

    let (code, all) = cli(&url, &["inspect", "streams"], "").await;
    assert_eq!(code, Some(0), "{all}");
    let orders = all.lines().find(|line| line.starts_with("orders")).unwrap_or_default();
    for column in ["orders-leader", &term.to_string(), "3", "count 100"] {
        assert!(orders.contains(column), "{orders:?} lacks {column:?}: {all}");
    }
    assert!(all.lines().any(|line| line.starts_with("audit") && line.contains("audit-leader")), "{all}");
    let replica = all.lines().find(|line| line.contains("replica-1")).unwrap_or_default();
    assert!(replica.contains("applied          1") && replica.contains("behind        2 entries"), "{replica:?}");

    let (code, one) = cli(&url, &["inspect", "streams", "audit"], "").await;
    assert_eq!(code, Some(0), "{one}");
    assert!(!one.contains("orders"), "{one}");
    let (code, missing) = cli(&url, &["inspect", "streams", "nope"], "").await;
    assert_ne!(code, Some(0), "{missing}");
    assert!(missing.contains("no stream \"nope\""), "{missing}");
}
