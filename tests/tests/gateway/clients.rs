//! The clients for other languages (`clients/python`, `clients/node`) as their users run them:
//! each client's own unit tests, and a leader written with each as a real process against a real
//! gateway and Postgres, paused past its lease.

use std::path::PathBuf;
use std::time::Duration;

use fencing_tests::gateway::send;
use fencing_tests::process::{ElectorProcess, event, int};
use http::{Method, StatusCode};
use nix::sys::signal::Signal;
use serde_json::{Value, json};
use tokio::process::Command;

use crate::Setup;

fn client_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../clients").join(name)
}

fn python_client() -> PathBuf {
    client_dir("python")
}

/// `node` (18.17 or newer: `.ci/run` installs Debian's `nodejs` when it is missing).
fn node() -> Command {
    let mut command = Command::new("node");
    command.current_dir(client_dir("node")).kill_on_drop(true);
    command
}

#[derive(Clone, Copy, Debug)]
enum Client {
    Python,
    Node,
}

/// A `python3` with the client's one dependency (httpx) and pytest: `.ci/run` installs them
/// with `pip install ./clients/python[test]`.
fn python(with: &str) -> Command {
    let found = ["python3", "/usr/bin/python3"].into_iter().find(|python| {
        std::process::Command::new(python)
            .args(["-c", &format!("import {with}")])
            .output()
            .is_ok_and(|output| output.status.success())
    });
    let python = found.unwrap_or_else(|| {
        panic!("no python3 that imports {with}: run `python3 -m pip install './clients/python[test]'` (.ci/run does)")
    });
    let mut command = Command::new(python);
    command
        .env("PYTHONPATH", python_client().join("src"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("PYTHONUNBUFFERED", "1")
        .kill_on_drop(true);
    command
}

/// Runs `command` (bounded) and returns its stdout, failing the test on a non-zero exit.
async fn run_tests(mut command: Command, what: &str) -> String {
    let output = tokio::time::timeout(Duration::from_secs(300), command.output())
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish within 300 s"))
        .unwrap_or_else(|error| panic!("run {what}: {error}"));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "{what} failed:\n{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_clients_own_tests_pass() {
    let mut command = python("httpx, pytest");
    command.current_dir(python_client()).args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"]);
    let stdout = run_tests(command, "the Python client's pytest").await;
    assert!(stdout.contains(" passed"), "{stdout}");
    assert!(!stdout.contains("skipped"), "no test of the client may be skipped: {stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_clients_own_tests_pass() {
    let mut command = node();
    command.args(["--test", "test/"]);
    let stdout = run_tests(command, "the Node client's node --test").await;
    let count = |name: &str| {
        stdout
            .lines()
            .find_map(|line| line.strip_prefix(&format!("# {name} ")))
            .and_then(|n| n.trim().parse::<u32>().ok())
    };
    assert!(count("pass").is_some_and(|n| n >= 20), "{stdout}");
    assert_eq!((count("fail"), count("cancelled"), count("skipped")), (Some(0), Some(0), Some(0)), "{stdout}");
}

async fn leader(setup: &Setup, client: Client, owner: &str) -> ElectorProcess {
    let mut command = match client {
        Client::Python => {
            let mut command = python("httpx");
            command.arg(python_client().join("examples/leader.py"));
            command
        }
        Client::Node => {
            let mut command = node();
            command.arg("examples/leader.js");
            command
        }
    };
    command.args([
        "--control",
        &format!("http://{}", setup.gateway.control),
        "--proxy",
        &format!("http://{}", setup.gateway.proxy),
        "--key",
        "ledger-writer",
        "--owner",
        owner,
        "--ttl-ms",
        "1500",
        "--renew-ms",
        "400",
        "--margin-ms",
        "150",
        "--query-timeout-ms",
        "300",
    ]);
    ElectorProcess::spawn_command(command, &format!("{client:?} leader"), owner, true).unwrap()
}

async fn write(process: &mut ElectorProcess, id: &str, force: bool, mode: &str) -> Value {
    let command = json!({"cmd": "write", "id": id, "path": "/ledger/acct-1/entries", "force": force, "mode": mode});
    process.send_line(&command.to_string()).await.unwrap();
    process.wait_for(&format!("write {id}"), |line| event(line) == "write" && line["id"] == id).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_leader_paused_past_its_lease_is_not_leader_when_it_resumes_and_its_forced_write_is_refused() {
    zombie_story(Client::Python).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_leader_paused_past_its_lease_is_not_leader_when_it_resumes_and_its_forced_write_is_refused() {
    zombie_story(Client::Node).await;
}

/// Leader A (a real process in `client`'s language) writes, is paused with SIGSTOP past its
/// lease, B takes over with a higher term and writes; A resumes: `is_leader()` is false before
/// any write, and the writes it forces anyway, in either mode, get 409 and never reach the
/// upstream.
async fn zombie_story(client: Client) {
    let mut setup = Setup::new().await;
    let mut a = leader(&setup, client, "a").await;
    let term_a = int(&a.wait_for("a elected", |l| event(l) == "elected").await.unwrap(), "term");
    let written = write(&mut a, "a-before", false, "verify").await;
    assert_eq!(
        (written["is_leader_before"].as_bool(), written["status"].as_u64()),
        (Some(true), Some(200)),
        "{written}"
    );
    assert_eq!(written["term"], term_a.to_string());
    let stamped = write(&mut a, "a-before-stamp", false, "stamp").await;
    assert_eq!(stamped["status"], 200, "{stamped}");

    a.signal(Signal::SIGSTOP).unwrap();
    let mut b = leader(&setup, client, "b").await;
    let term_b = int(&b.wait_for("b elected", |l| event(l) == "elected").await.unwrap(), "term");
    assert!(term_b > term_a, "{term_b} > {term_a}");
    let b_first = write(&mut b, "b-first", false, "verify").await;
    assert_eq!(b_first["status"], 200, "{b_first}");

    // A resumes, and is asked to write at once: before any of its timers could have run, it
    // finds itself not leader (its deadline, read on the boot clock at the moment of acting).
    a.signal(Signal::SIGCONT).unwrap();
    let zombie = write(&mut a, "a-zombie", false, "verify").await;
    assert_eq!(zombie["is_leader_before"], false, "{zombie}");
    assert_eq!(zombie["error"], "NotLeader", "nothing sent: {zombie}");
    // Forced anyway, with its old term or as its old owner: the gateway refuses both.
    let forced = write(&mut a, "a-zombie-forced", true, "verify").await;
    assert_eq!((forced["status"].as_u64(), forced["kind"].as_str()), (Some(409), Some("stale-term")), "{forced}");
    assert_eq!(forced["error"], "StaleLeader");
    assert_eq!(forced["problem"]["current_term"], term_b, "{forced}");
    let stamped = write(&mut a, "a-zombie-forced-stamp", true, "stamp").await;
    assert_eq!((stamped["status"].as_u64(), stamped["kind"].as_str()), (Some(409), Some("not-leader")), "{stamped}");
    a.drain();
    let lost = a.seen.iter().find(|l| event(l) == "lost" && int(l, "term") == term_a);
    assert!(lost.is_some(), "A reports the end of term {term_a}: {:?}", a.seen);
    assert_eq!(write(&mut b, "b-second", false, "stamp").await["status"], 200);

    // Its lease is gone from the store: A's new attempts are refused while B holds it.
    let lease = send(setup.gateway.control, Method::GET, "/v1/leases/ledger-writer", &[], "").await.unwrap();
    assert_eq!(lease.status, StatusCode::OK);
    assert_eq!(lease.json()["term"], term_b);

    setup.upstream.collect(Duration::from_millis(300)).await;
    for id in ["a-zombie", "a-zombie-forced", "a-zombie-forced-stamp"] {
        assert!(!setup.upstream.received(id), "{id} reached the upstream");
    }
    let tokens: Vec<i64> =
        setup.upstream.log.iter().map(|l| l["fencing_token"].as_str().unwrap().parse().unwrap()).collect();
    assert_eq!(tokens, vec![term_a, term_a, term_b, term_b], "the upstream saw A's writes, then B's");

    for process in [&mut a, &mut b] {
        process.send_line(r#"{"cmd":"shutdown"}"#).await.unwrap();
        process.wait_for("stopped", |l| event(l) == "stopped").await.unwrap();
        assert_eq!(process.wait_exit().await.unwrap(), Some(0));
    }
    // B released on shutdown after its work drained: the lease is free for whoever comes next.
    let lease = send(setup.gateway.control, Method::GET, "/v1/leases/ledger-writer", &[], "").await.unwrap();
    assert_eq!(lease.json()["remaining_ms"], 0, "{}", lease.json());
}
