//! The zombie story end to end: leader A writes; A is paused past its ttl; B is elected, and
//! A's term is refused at once, before B writes; B writes; A resumes and its writes get 409
//! and never reach the upstream.

use std::time::Duration;

use fencing_tests::gateway::send;
use fencing_tests::process::{ElectorProcess, Timing, event, int};
use http::{Method, StatusCode};
use nix::sys::signal::Signal;

use crate::Setup;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zombie_leader_paused_past_its_ttl_is_fenced_off_by_the_gateway() {
    let mut setup = Setup::new().await;
    let proxy = setup.gateway.proxy;
    let url = setup.db.url();
    let mut a = ElectorProcess::spawn(&url, "ledger-writer", "a", Timing::FAST).unwrap();
    let term_a = int(&a.wait_for("a elected", |l| event(l) == "elected").await.unwrap(), "term");
    // The owner the elector acquired as: the configured "a" plus a part of its own.
    let owner_a = a
        .seen
        .iter()
        .find(|l| event(l) == "started")
        .and_then(|l| l.get("owner").and_then(serde_json::Value::as_str))
        .unwrap()
        .to_owned();
    let mut b = ElectorProcess::spawn(&url, "ledger-writer", "b", Timing::FAST).unwrap();
    let started_b = b.wait_for("b started", |l| event(l) == "started").await.unwrap();
    let owner_b = started_b.get("owner").and_then(serde_json::Value::as_str).unwrap().to_owned();

    let write = |id: &'static str, headers: Vec<(&'static str, String)>| async move {
        let mut all: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        all.push(("x-request-id", id));
        send(proxy, Method::POST, "/ledger/acct-1/entries", &all, "").await.unwrap()
    };
    let token = |term: i64| vec![("fencing-token", term.to_string())];
    let stamp = |owner: &str| vec![("fencing-lease", "ledger-writer".to_owned()), ("fencing-owner", owner.to_owned())];

    assert_eq!(write("a-before", token(term_a)).await.status, StatusCode::OK);
    assert_eq!(write("a-before-stamp", stamp(&owner_a)).await.status, StatusCode::OK);

    a.signal(Signal::SIGSTOP).unwrap();
    let term_b = int(&b.wait_for("b elected", |l| event(l) == "elected").await.unwrap(), "term");
    assert!(term_b > term_a);
    // The moment B is granted its term, A's term is refused, although B has not written yet.
    let early = write("a-after-grant", token(term_a)).await;
    assert_eq!(early.status, StatusCode::CONFLICT);
    assert_eq!(early.header("fencing-current-term"), Some(term_b.to_string().as_str()));
    assert_eq!(write("b-first", token(term_b)).await.status, StatusCode::OK);

    a.signal(Signal::SIGCONT).unwrap();
    a.wait_for("a reports loss", |l| event(l) == "lost").await.unwrap();
    // The zombie's writes, in either mode, are refused.
    let zombie = write("a-zombie", token(term_a)).await;
    assert_eq!(zombie.status, StatusCode::CONFLICT);
    assert_eq!(zombie.json()["presented_term"], term_a);
    assert_eq!(write("a-zombie-stamp", stamp(&owner_a)).await.status, StatusCode::CONFLICT);
    assert_eq!(write("b-second", stamp(&owner_b)).await.status, StatusCode::OK);

    setup.upstream.collect(Duration::from_millis(300)).await;
    for id in ["a-after-grant", "a-zombie", "a-zombie-stamp"] {
        assert!(!setup.upstream.received(id), "{id} reached the upstream");
    }
    let tokens: Vec<i64> =
        setup.upstream.log.iter().map(|l| l["fencing_token"].as_str().unwrap().parse().unwrap()).collect();
    assert_eq!(tokens, vec![term_a, term_a, term_b, term_b], "the upstream saw A's writes, then B's");
}
