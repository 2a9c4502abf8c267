//! `fencing-gateway verify`, the zombie story a user points at their own setup, run as a process
//! against a real gateway, a real PostgreSQL and an upstream that applies every write it gets
//! (the recording upstream's `GET /__applied`): it passes where fencing holds, reports the
//! documented gap of an unbound route, refuses a lease or resource in use, and fails where the
//! writes do not pass the fence.

use std::process::Output;

use fencing_tests::gateway::send;
use fencing_tests::workspace_bin;
use http::{Method, StatusCode};

use crate::Setup;

async fn verify(args: &[&str]) -> (Output, String) {
    let output = tokio::process::Command::new(workspace_bin("fencing-gateway").unwrap())
        .arg("verify")
        .args(args)
        .env_remove("FENCING_CLIENT_TOKEN")
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    println!("{stdout}{}", String::from_utf8_lossy(&output.stderr));
    (output, stdout)
}

fn lines_starting(stdout: &str, prefix: &str) -> usize {
    stdout.lines().filter(|line| line.starts_with(prefix)).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_holds_on_a_bound_route_reports_the_unbound_gap_and_refuses_a_lease_in_use() {
    let setup = Setup::new().await;
    let control = format!("http://{}", setup.gateway.control);
    let proxy = format!("http://{}", setup.gateway.proxy);
    let applied = format!("{}/__applied", setup.upstream.url());
    let target = ["--control", control.as_str(), "--proxy", proxy.as_str(), "--check-url", applied.as_str()];

    // A route bound to its lease: the zombie is refused before and after B's first write.
    let bound = [&target[..], &["--path", "/ledger/verify-acct/entries", "--resource", "verify-acct"]].concat();
    let (output, stdout) = verify(&[&bound[..], &["--lease", "ledger-writer"]].concat()).await;
    assert!(output.status.success(), "{stdout}");
    for step in ["PASS 1.", "PASS 2.", "PASS 3.", "PASS 4.", "PASS 5.", "PASS 6."] {
        assert_eq!(lines_starting(&stdout, step), 1, "{step} missing: {stdout}");
    }
    assert!(stdout.contains("fencing held on this route"), "{stdout}");
    // In stamp mode too, on another account.
    let stamp = [&target[..], &["--path", "/ledger/verify-stamp/entries", "--resource", "verify-stamp"]].concat();
    let (output, stdout) = verify(&[&stamp[..], &["--lease", "ledger-writer", "--mode", "stamp"]].concat()).await;
    assert!(output.status.success(), "{stdout}");
    assert_eq!(lines_starting(&stdout, "PASS "), 6, "{stdout}");

    // An unbound route: the zombie's write before B's first one is the documented gap; after it,
    // refused. Its fence then exists and binds no lease: a second run is refused as in use (its
    // writes could raise a fence other writers use), and plays with --yes.
    let unbound = [&target[..], &["--path", "/jobs/any", "--resource", "verify-job"]].concat();
    let gap = |output: &Output, stdout: &str| {
        assert!(output.status.success(), "{stdout}");
        assert_eq!(lines_starting(stdout, "GAP  3."), 1, "{stdout}");
        assert!(stdout.contains("documented gap of unbound routes"), "{stdout}");
        for step in ["PASS 1.", "PASS 2.", "PASS 4.", "PASS 5.", "PASS 6."] {
            assert_eq!(lines_starting(stdout, step), 1, "{step} missing: {stdout}");
        }
    };
    let (output, stdout) = verify(&unbound).await;
    gap(&output, &stdout);
    let (output, _) = verify(&unbound).await;
    assert_eq!(output.status.code(), Some(64), "{output:?}");
    assert!(String::from_utf8_lossy(&output.stderr).contains("\"/jobs/verify-job\" is at term"), "{output:?}");
    let (output, stdout) = verify(&[&unbound[..], &["--yes"]].concat()).await;
    gap(&output, &stdout);

    // A lease someone holds is refused (64) and nothing is written; --yes plays on.
    let held = send(
        setup.gateway.control,
        Method::POST,
        "/v1/leases/ledger-writer/acquire",
        &[("content-type", "application/json")],
        r#"{"owner":"the-real-leader","ttl_ms":2000}"#,
    )
    .await
    .unwrap();
    assert_eq!(held.status, StatusCode::OK);
    let before = applied_now(&setup).await;
    let (output, stdout) = verify(&[&bound[..], &["--lease", "ledger-writer"]].concat()).await;
    assert_eq!(output.status.code(), Some(64), "{stdout}");
    assert!(String::from_utf8_lossy(&output.stderr).contains("is held by"), "{output:?}");
    assert_eq!(applied_now(&setup).await, before, "a refused run wrote");
    let (output, stdout) = verify(&[&bound[..], &["--lease", "ledger-writer", "--yes"]].concat()).await;
    assert!(output.status.success(), "{stdout}");

    // The lease is left released.
    let lease = send(setup.gateway.control, Method::GET, "/v1/leases/ledger-writer", &[], "").await.unwrap();
    assert_eq!(lease.json()["remaining_ms"], 0, "{:?}", lease.json());
}

/// The upstream's applied writes, read directly.
async fn applied_now(setup: &Setup) -> String {
    let reply = send(setup.upstream.addr, Method::GET, "/__applied", &[], "").await.unwrap();
    String::from_utf8_lossy(&reply.body).into_owned()
}

/// The classic misconfiguration: the leaders write around the gateway (here, straight to the
/// upstream). Every write is applied, the zombie's too: verify fails (exit 1) and says where.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_fails_when_the_writes_go_around_the_fence() {
    let setup = Setup::new().await;
    let control = format!("http://{}", setup.gateway.control);
    let around = setup.upstream.url();
    let applied = format!("{around}/__applied");
    let (output, stdout) = verify(&[
        "--control",
        control.as_str(),
        "--proxy",
        around.as_str(),
        "--check-url",
        applied.as_str(),
        "--path",
        "/ledger/around/entries",
        "--resource",
        "around",
        "--lease",
        "ledger-writer",
    ])
    .await;
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("has no fence after an admitted write"), "{stdout}");
    assert_eq!(lines_starting(&stdout, "FAIL 5."), 1, "{stdout}");
    assert!(stdout.contains("does not fence"), "{stdout}");
    assert!(stdout.contains("verify: FAILED"), "{stdout}");

    // Bad command lines are 64 and touch nothing.
    for args in [
        &["--control", "ftp://x", "--proxy", "http://127.0.0.1:1", "--path", "/a", "--resource", "r"][..],
        &["--control", control.as_str(), "--proxy", "http://127.0.0.1:1", "--path", "a", "--resource", "r"],
        &[
            "--control",
            control.as_str(),
            "--proxy",
            "http://127.0.0.1:1",
            "--path",
            "/a",
            "--resource",
            "r",
            "--ttl-ms",
            "5",
        ],
    ] {
        let (output, _) = verify(args).await;
        assert_eq!(output.status.code(), Some(64), "{args:?}");
    }
}
