//! The clients for other languages (`clients/python`, `clients/node`) as their users run them:
//! each client's own unit tests, and a leader written with each as a real process against a real
//! gateway and Postgres, paused past its lease.

use std::path::PathBuf;
use std::time::Duration;

use fencing_tests::gateway::send;
use fencing_tests::process::{DAEMON_NODE_TABLES, ElectorProcess, event, int};
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_leader_hands_over_when_asked_and_its_successor_leads_next() {
    handover_story(Client::Python).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_leader_hands_over_when_asked_and_its_successor_leads_next() {
    handover_story(Client::Node).await;
}

/// Leader A leads; B asks for a handover to itself through the client's API; A steps down
/// (`resigned`: its work stopped, then released), and B leads with the next term; A's old term
/// is refused.
async fn handover_story(client: Client) {
    let mut setup = Setup::new().await;
    let mut a = leader(&setup, client, "a").await;
    let term_a = int(&a.wait_for("a elected", |l| event(l) == "elected").await.unwrap(), "term");
    let mut b = leader(&setup, client, "b").await;
    b.wait_for("b started", |l| event(l) == "started").await.unwrap();
    b.send_line(r#"{"cmd":"request_resign","successor":"b"}"#).await.unwrap();
    let asked = b.wait_for("the request's answer", |l| event(l) == "resign_request").await.unwrap();
    assert_eq!((asked["outcome"].as_str(), int(&asked, "term")), (Some("requested"), term_a), "{asked}");
    let lost = a.wait_for("a steps down", |l| event(l) == "lost").await.unwrap();
    assert_eq!((lost["reason"].as_str(), int(&lost, "term")), (Some("resigned"), term_a), "{lost}");
    let term_b = int(&b.wait_for("b elected", |l| event(l) == "elected").await.unwrap(), "term");
    assert_eq!(term_b, term_a + 1, "the successor leads next");
    let zombie = write(&mut a, "a-after-handover", true, "verify").await;
    assert_eq!(zombie["status"], 409, "{zombie}");
    assert_eq!(write(&mut b, "b-after-handover", false, "verify").await["status"], 200);
    setup.upstream.collect(Duration::from_millis(300)).await;
    assert!(!setup.upstream.received("a-after-handover"));
    for process in [&mut a, &mut b] {
        process.send_line(r#"{"cmd":"shutdown"}"#).await.unwrap();
        assert_eq!(process.wait_exit().await.unwrap(), Some(0));
    }
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

// Daemons across languages

const CLUSTER: &str = "mixed";
const DAEMONS: usize = 4;

/// Node id -> the daemons active on it, once every daemon is active.
async fn placement(client: &tokio_postgres::Client) -> Option<std::collections::BTreeMap<String, Vec<String>>> {
    let states = fencing_schema::store::daemon_states(client, CLUSTER).await.unwrap();
    if states.len() != DAEMONS || states.iter().any(|daemon| daemon.state != "active") {
        return None;
    }
    let mut placement = std::collections::BTreeMap::<String, Vec<String>>::new();
    for daemon in states {
        placement.entry(daemon.node_id.unwrap_or_default()).or_default().push(daemon.daemon);
    }
    Some(placement)
}

async fn wait_for_placement(
    client: &tokio_postgres::Client,
    what: &str,
    wanted: impl Fn(&std::collections::BTreeMap<String, Vec<String>>) -> bool,
) -> std::collections::BTreeMap<String, Vec<String>> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(40);
    loop {
        if let Some(placement) = placement(client).await
            && wanted(&placement)
        {
            return placement;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no {what} within 40 s: {:#?}",
            fencing_schema::store::daemon_states(client, CLUSTER).await.unwrap()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn rust_node(url: &str, id: &str) -> ElectorProcess {
    let args: Vec<String> = [
        ("--database-url", url),
        ("--cluster", CLUSTER),
        ("--key", "mixed-leader"),
        ("--node-id", id),
        ("--daemons", "4"),
        ("--heartbeat-ms", "300"),
        ("--registration-ttl-ms", "1500"),
        ("--ttl-ms", "2000"),
        ("--ack-ms", "1000"),
        ("--drain-ms", "4000"),
        ("--query-timeout-ms", "140"),
        ("--tick-ms", "100"),
    ]
    .into_iter()
    .flat_map(|(flag, value)| [flag.to_owned(), value.to_owned()])
    .collect();
    ElectorProcess::spawn_daemon_node(id, &args).unwrap()
}

/// A client's daemon node (`examples/daemon_node.py` or `.js`) in the test cluster, with the
/// same timing as [`rust_node`], and `extra` arguments.
fn client_node(setup: &Setup, language: Client, id: &str, extra: &[&str]) -> ElectorProcess {
    let (mut command, example) = match language {
        Client::Python => {
            let mut command = python("httpx");
            command.arg(python_client().join("examples/daemon_node.py"));
            (command, "examples/daemon_node.py")
        }
        Client::Node => {
            let mut command = node();
            command.arg("examples/daemon_node.js");
            (command, "examples/daemon_node.js")
        }
    };
    let control = format!("http://{}", setup.gateway.control);
    let proxy = format!("http://{}", setup.gateway.proxy);
    for (flag, value) in [
        ("--control", control.as_str()),
        ("--proxy", proxy.as_str()),
        ("--cluster", CLUSTER),
        ("--key", "mixed-leader"),
        ("--node-id", id),
        ("--daemons", "4"),
        ("--heartbeat-ms", "300"),
        ("--registration-ttl-ms", "1500"),
        ("--ttl-ms", "2000"),
        ("--ack-ms", "1000"),
        ("--drain-ms", "4000"),
    ] {
        command.args([flag, value]);
    }
    command.args(extra);
    ElectorProcess::spawn_command(command, example, id, true).unwrap()
}

fn python_node(setup: &Setup, id: &str, extra: &[&str]) -> ElectorProcess {
    client_node(setup, Client::Python, id, extra)
}

fn node_node(setup: &Setup, id: &str, extra: &[&str]) -> ElectorProcess {
    client_node(setup, Client::Node, id, extra)
}

/// What `process` started: (daemon, generation) from its `daemon_started` lines.
fn started_runs(process: &mut ElectorProcess) -> Vec<(String, i64)> {
    process.drain();
    process
        .seen
        .iter()
        .filter(|l| event(l) == "daemon_started")
        .map(|l| (l["daemon"].as_str().unwrap_or_default().to_owned(), int(l, "generation")))
        .collect()
}

/// Every generation `node_id` started is one the store assigned to it.
async fn assert_given(client: &tokio_postgres::Client, node_id: &str, started: &[(String, i64)]) {
    let given: std::collections::BTreeSet<(String, i64)> = client
        .query(
            "SELECT DISTINCT daemon, generation FROM fencing.daemon_history
              WHERE cluster = $1 AND node_id = $2 AND state = 'active'",
            &[&CLUSTER, &node_id],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    for run in started {
        assert!(
            given.contains(run),
            "{node_id} started {run:?}, which the store never took as acknowledged by it: {given:?}"
        );
    }
}

/// The daemons' ticks at the upstream: each carries its own generation as `Fencing-Token` (the
/// generation is in its request id, `<node>-<daemon>-<generation>-<n>`), and per daemon they never
/// go back to an older generation. Returns the nodes that wrote.
fn check_ticks(log: &[Value]) -> std::collections::BTreeSet<String> {
    let mut last: std::collections::BTreeMap<String, i64> = Default::default();
    let mut writers = std::collections::BTreeSet::new();
    for request in log {
        let (Some(resource), Some(token), Some(id)) =
            (request["fencing_resource"].as_str(), request["fencing_token"].as_str(), request["x_request_id"].as_str())
        else {
            continue;
        };
        let token: i64 = token.parse().unwrap();
        let parts: Vec<&str> = id.split('-').collect();
        assert_eq!(parts.len(), 4, "{id}");
        assert_eq!(parts[2].parse::<i64>().ok(), Some(token), "{id} sent token {token}, not its generation");
        assert_eq!(resource, format!("ticks-{}", parts[1]));
        let previous = last.insert(resource.to_owned(), token).unwrap_or(0);
        assert!(token >= previous, "{resource}: generation {token} after {previous}");
        writers.insert(parts[0].to_owned());
    }
    writers
}

/// A client node drained what was revoked within the drain timeout: the leader never had to
/// force one of its assignments on (`drain_timeout`).
async fn assert_no_forced_drain(client: &tokio_postgres::Client, nodes: &[&str]) {
    let nodes: Vec<String> = nodes.iter().map(|node| (*node).to_owned()).collect();
    let forced: Vec<(String, i64, String)> = client
        .query(
            "SELECT daemon, generation, node_id FROM fencing.daemon_history
              WHERE cluster = $1 AND reason = 'drain_timeout' AND node_id = ANY($2)",
            &[&CLUSTER, &nodes],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2)))
        .collect();
    assert_eq!(forced, vec![], "revocations a client node did not drain in time");
}

/// Daemons move between a Python node and a Node node of one cluster, both through the gateway
/// and both candidates for its leader: they share the daemons; the Python node killed, its
/// daemons move to the Node node; a new Python node gets its share back (the Node node drains
/// what was revoked); the Node node's shutdown gives everything to the Python node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemons_move_between_a_python_node_and_a_node_node_of_one_cluster() {
    let mut setup = Setup::new().await;
    let client = setup.db.connect().await;
    let p1 = python_node(&setup, "p1", &[]);
    let mut n1 = node_node(&setup, "n1", &[]);
    wait_for_placement(&client, "a 2-2 spread over p1 and n1", |p| {
        p.get("p1").map(Vec::len) == Some(2) && p.get("n1").map(Vec::len) == Some(2)
    })
    .await;
    p1.signal(Signal::SIGKILL).unwrap();
    wait_for_placement(&client, "every daemon on n1 after p1 was killed", |p| {
        p.get("n1").map(Vec::len) == Some(DAEMONS)
    })
    .await;
    let mut p2 = python_node(&setup, "p2", &[]);
    wait_for_placement(&client, "a 2-2 spread over n1 and p2", |p| {
        p.get("p2").map(Vec::len) == Some(2) && p.get("n1").map(Vec::len) == Some(2)
    })
    .await;
    n1.send_line("shutdown").await.unwrap();
    n1.wait_for("n1 stopped", |l| event(l) == "stopped").await.unwrap();
    assert_eq!(n1.wait_exit().await.unwrap(), Some(0));
    wait_for_placement(&client, "every daemon on p2 after n1 shut down", |p| {
        p.get("p2").map(Vec::len) == Some(DAEMONS)
    })
    .await;

    let n1_runs = started_runs(&mut n1);
    assert_given(&client, "n1", &n1_runs).await;
    let ran: std::collections::BTreeSet<&str> = n1_runs.iter().map(|(daemon, _)| daemon.as_str()).collect();
    assert_eq!(ran.len(), DAEMONS, "n1 ran every daemon at some point: {n1_runs:?}");
    let stopped = n1.seen.iter().filter(|l| event(l) == "daemon_stopped").count();
    assert_eq!(stopped, n1_runs.len(), "every daemon n1 started, it stopped: {:?}", n1.seen);
    let p2_runs = started_runs(&mut p2);
    assert_given(&client, "p2", &p2_runs).await;
    assert!(p2_runs.len() >= DAEMONS, "p2 runs every daemon: {p2_runs:?}");

    // The ticks of both languages, per daemon, never went back to an older generation. (A new
    // generation's first tick waits out the older one's forward deadline at the gateway, S5.)
    for _ in 0..50 {
        let log = setup.upstream.collect(Duration::from_millis(200)).await;
        if log.iter().any(|r| r["x_request_id"].as_str().is_some_and(|id| id.starts_with("p2-"))) {
            break;
        }
    }
    let writers = check_ticks(&setup.upstream.log);
    assert!(writers.contains("n1") && writers.contains("p2"), "both languages' daemons wrote: {writers:?}");
    assert_no_forced_drain(&client, &["n1", "p1", "p2"]).await;
    p2.send_line("shutdown").await.unwrap();
    assert_eq!(p2.wait_exit().await.unwrap(), Some(0));
}

/// Daemons move between a Rust node (the library, straight on Postgres) and a Python node (the
/// client, through the gateway) of one cluster, both candidates for its leader: they share the
/// daemons; a killed Rust node's daemons move to the Python node; a new Rust node gets its share
/// back (the Python node drains what was revoked and gives it back); the Python node's shutdown
/// gives everything to the Rust node. The Python node starts only generations the store gave it,
/// and its fenced ticks never go back to an older generation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemons_move_between_a_rust_node_and_a_python_node_of_one_cluster() {
    let mut setup = Setup::new().await;
    let client = setup.db.connect().await;
    client.batch_execute(DAEMON_NODE_TABLES).await.unwrap();
    let url = setup.db.url();
    let r1 = rust_node(&url, "r1");
    let mut p1 = python_node(&setup, "p1", &[]);
    let shared = wait_for_placement(&client, "a 2-2 spread over r1 and p1", |p| {
        p.get("r1").map(Vec::len) == Some(2) && p.get("p1").map(Vec::len) == Some(2)
    })
    .await;

    r1.signal(Signal::SIGKILL).unwrap();
    wait_for_placement(&client, "every daemon on p1 after r1 was killed", |p| {
        p.get("p1").map(Vec::len) == Some(DAEMONS)
    })
    .await;

    let mut r2 = rust_node(&url, "r2");
    wait_for_placement(&client, "a 2-2 spread over p1 and r2", |p| {
        p.get("r2").map(Vec::len) == Some(2) && p.get("p1").map(Vec::len) == Some(2)
    })
    .await;
    r2.wait_for("r2 runs a daemon", |l| event(l) == "daemon_started").await.unwrap();

    p1.send_line("shutdown").await.unwrap();
    p1.wait_for("p1 stopped", |l| event(l) == "stopped").await.unwrap();
    assert_eq!(p1.wait_exit().await.unwrap(), Some(0));
    wait_for_placement(&client, "every daemon on r2 after p1 shut down", |p| {
        p.get("r2").map(Vec::len) == Some(DAEMONS)
    })
    .await;

    // What p1 ran, it was given: every generation it started is one the store assigned to p1,
    // and it ran the daemons it had at the first spread, and those it took over from r1.
    p1.drain();
    let started: Vec<(String, i64)> = p1
        .seen
        .iter()
        .filter(|l| event(l) == "daemon_started")
        .map(|l| (l["daemon"].as_str().unwrap().to_owned(), int(l, "generation")))
        .collect();
    let given: std::collections::BTreeSet<(String, i64)> = client
        .query(
            "SELECT DISTINCT daemon, generation FROM fencing.daemon_history
              WHERE cluster = $1 AND node_id = 'p1' AND state = 'active'",
            &[&CLUSTER],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    for run in &started {
        assert!(given.contains(run), "p1 started {run:?}, which the store never took as acknowledged by it: {given:?}");
    }
    let ran: std::collections::BTreeSet<&str> = started.iter().map(|(daemon, _)| daemon.as_str()).collect();
    assert_eq!(ran.len(), DAEMONS, "p1 ran every daemon at some point (its share, then r1's): {started:?}");
    for daemon in &shared["p1"] {
        assert!(ran.contains(daemon.as_str()));
    }
    let stopped = p1.seen.iter().filter(|l| event(l) == "daemon_stopped").count();
    assert_eq!(stopped, started.len(), "every daemon p1 started, it stopped: {:?}", p1.seen);

    // p1's fenced ticks, per daemon, never went back to an older generation at the upstream.
    setup.upstream.collect(Duration::from_millis(300)).await;
    let writers = check_ticks(&setup.upstream.log);
    assert!(writers.contains("p1"), "p1's daemons wrote through the gateway: {writers:?}");
    assert_no_forced_drain(&client, &["p1"]).await;
    r2.signal(Signal::SIGTERM).unwrap();
    r2.wait_exit().await.unwrap();
}

/// A daemon node of a client (Python, Node) paused (SIGSTOP) past its registration while it runs daemons: the leader
/// gives them to the Rust node, and when it resumes, its daemons stop at once, on
/// the boot clock alone (the gateway is paused too, so no answer can tell the node that its
/// daemons moved): at most the one tick that was in flight at the pause reaches the upstream
/// with an old generation after the resume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_python_daemon_node_stops_its_daemons_when_it_resumes() {
    paused_daemon_node(Client::Python).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_node_daemon_node_stops_its_daemons_when_it_resumes() {
    paused_daemon_node(Client::Node).await;
}

async fn paused_daemon_node(language: Client) {
    let mut setup = Setup::new().await;
    let client = setup.db.connect().await;
    client.batch_execute(DAEMON_NODE_TABLES).await.unwrap();
    let url = setup.db.url();
    let mut r1 = rust_node(&url, "r1");
    let mut p1 = client_node(&setup, language, "p1", &["--no-validity-check"]);
    wait_for_placement(&client, "a 2-2 spread over r1 and p1", |p| {
        p.get("r1").map(Vec::len) == Some(2) && p.get("p1").map(Vec::len) == Some(2)
    })
    .await;
    let held: Vec<(String, i64)> = fencing_schema::store::daemon_states(&client, CLUSTER)
        .await
        .unwrap()
        .into_iter()
        .filter(|daemon| daemon.node_id.as_deref() == Some("p1"))
        .map(|daemon| (daemon.daemon, daemon.generation))
        .collect();
    assert_eq!(held.len(), 2);

    p1.signal(Signal::SIGSTOP).unwrap();
    wait_for_placement(&client, "every daemon on r1 while p1 is paused", |p| {
        p.get("r1").map(Vec::len) == Some(DAEMONS)
    })
    .await;
    setup.upstream.collect(Duration::from_millis(200)).await;
    let before = setup.upstream.log.len();
    setup.gateway.signal(Signal::SIGSTOP).unwrap();
    p1.signal(Signal::SIGCONT).unwrap();
    // Its registration ran out during the pause: the watchdog (every 50 ms at most) cancels the
    // daemons with no answer from anyone. 3 s is far beyond that, and short of any answer.
    let stops = async {
        // In whatever order they stop.
        loop {
            let all_stopped = held.iter().all(|(daemon, generation)| {
                p1.seen.iter().any(|l| {
                    event(l) == "daemon_stopped"
                        && l["daemon"] == daemon.as_str()
                        && int(l, "generation") == *generation
                })
            });
            if all_stopped {
                break;
            }
            p1.wait_for("a daemon stopped", |l| event(l) == "daemon_stopped").await.unwrap();
        }
    };
    let stopped = tokio::time::timeout(Duration::from_secs(3), stops).await;
    setup.gateway.signal(Signal::SIGCONT).unwrap();
    assert!(stopped.is_ok(), "p1's daemons ran on after it resumed past its registration: {:?}", p1.seen);
    setup.upstream.collect(Duration::from_millis(500)).await;
    for (daemon, generation) in &held {
        let prefix = format!("p1-{daemon}-{generation}-");
        let late = setup.upstream.log[before..]
            .iter()
            .filter(|r| r["x_request_id"].as_str().is_some_and(|id| id.starts_with(&prefix)))
            .count();
        assert!(late <= 1, "{late} ticks of {daemon} generation {generation} reached the upstream after p1 resumed");
    }
    p1.send_line("shutdown").await.unwrap();
    assert_eq!(p1.wait_exit().await.unwrap(), Some(0));
    r1.signal(Signal::SIGTERM).unwrap();
    r1.wait_exit().await.unwrap();
}
