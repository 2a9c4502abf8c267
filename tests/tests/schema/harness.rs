//! The harness itself: a cluster is removed, server and files, however its test process ends.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Starts the probe and reads the postmaster's pid and the cluster's temp dir.
async fn probe(mode: &str) -> (Child, Pid, PathBuf) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_pg-harness-probe"))
        .arg(mode)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .expect("the probe reports its cluster")
        .unwrap()
        .expect("the probe printed a line");
    let mut pid = None;
    let mut root = None;
    for field in line.split_whitespace() {
        if let Some(value) = field.strip_prefix("postmaster_pid=") {
            pid = Some(Pid::from_raw(value.parse().unwrap()));
        } else if let Some(value) = field.strip_prefix("root=") {
            root = Some(PathBuf::from(value));
        }
    }
    let (pid, root) = (pid.unwrap(), root.unwrap());
    assert!(kill(pid, None).is_ok(), "the probe's postmaster {pid} runs");
    assert!(root.is_dir(), "the probe's cluster dir {} exists", root.display());
    (child, pid, root)
}

/// Waits, bounded, until the postmaster is gone and the temp dir removed.
async fn assert_cleaned_up(pid: Pid, root: &std::path::Path) {
    for _ in 0..600 {
        if kill(pid, None) == Err(Errno::ESRCH) && !root.exists() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("postmaster {pid} or {} outlived its test process by 30 s", root.display());
}

#[tokio::test]
async fn cluster_is_removed_when_its_test_process_panics() {
    let (mut child, pid, root) = probe("panic").await;
    let status = child.wait().await.unwrap();
    assert!(!status.success(), "the probe panicked");
    assert_cleaned_up(pid, &root).await;
}

#[tokio::test]
async fn cluster_is_removed_when_its_test_process_is_killed() {
    let (mut child, pid, root) = probe("hang").await;
    let probe_pid = Pid::from_raw(i32::try_from(child.id().unwrap()).unwrap());
    kill(probe_pid, Signal::SIGKILL).unwrap();
    child.wait().await.unwrap();
    assert_cleaned_up(pid, &root).await;
}

/// A server that does not act on SIGQUIT (here: its postmaster stopped, as one hung in its
/// signal handler under libfaketime would be) is still crashed, within the bound, by SIGKILL to
/// it and its children, and starts again on its data: the fault suite's crashes never hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_ignores_sigquit_is_still_crashed_and_starts_again() {
    let cluster = fencing_tests::pg::PgCluster::start().unwrap();
    let postmaster = Pid::from_raw(cluster.postmaster_pid().unwrap());
    kill(postmaster, Signal::SIGSTOP).unwrap();
    let started = tokio::time::Instant::now();
    tokio::task::block_in_place(|| cluster.crash_now()).unwrap();
    assert!(started.elapsed() < Duration::from_secs(25), "crash took {:?}", started.elapsed());
    assert!(kill(postmaster, None).is_err(), "the postmaster survived");
    tokio::task::block_in_place(|| cluster.start_server()).unwrap();
    let client = fencing_tests::pg::connect(&cluster.url("postgres")).await;
    let one: i32 = client.query_one("SELECT 1", &[]).await.unwrap().get(0);
    assert_eq!(one, 1);
}
