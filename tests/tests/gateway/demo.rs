//! `fencing-gateway demo` tells the whole story on a fresh data directory and cleans up.

use std::time::Duration;

use fencing_tests::workspace_bin;

/// Runs `fencing-gateway demo --exit-after-story` with `args`, in `cwd` if given; its output.
async fn demo(args: &[&std::ffi::OsStr], cwd: Option<&std::path::Path>) -> std::process::Output {
    let mut command = tokio::process::Command::new(workspace_bin("fencing-gateway").unwrap());
    command.args(["demo", "--control-listen", "127.0.0.1:0", "--exit-after-story"]).args(args);
    if let Some(cwd) = cwd {
        command.current_dir(cwd);
    }
    let output = command.env("RUST_LOG", "error").kill_on_drop(true).output();
    tokio::time::timeout(Duration::from_secs(120), output).await.expect("the demo finishes").unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_tells_the_zombie_story_and_stops_everything_it_started() {
    let dir = std::env::temp_dir().join(format!("fencing-demo-{}-{}", std::process::id(), rand::random::<u32>()));
    let data_dir = dir.join("pgdata");
    let output = demo(&[std::ffi::OsStr::new("--data-dir"), data_dir.as_os_str()], None).await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    let steps = [
        "leader-a holds lease \"demo-writer\" with term 1",
        "leader-a wrote with term 1: HTTP 200",
        "pausing leader-a (SIGSTOP)",
        "leader-b took over with term 2",
        "leader-b wrote with term 2: HTTP 200",
        "the gateway refused leader-a's write with term 1: HTTP 409 (current term 2)",
        "leader-a noticed it lost term 1",
        "/metrics; point Prometheus at it",
        "demo: stopped",
    ];
    let mut rest: &str = &stdout;
    for step in steps {
        let at = rest.find(step).unwrap_or_else(|| panic!("{step:?} missing, or out of order, in:\n{stdout}"));
        rest = &rest[at + step.len()..];
    }
    assert!(!data_dir.join("postmaster.pid").exists(), "the demo's PostgreSQL stopped");
    let _ = std::fs::remove_dir_all(&dir);
}

/// As root, PostgreSQL runs as another account, which cannot enter a directory under a
/// root-owned 0700 one: run there without --data-dir, the demo keeps its data under /tmp instead,
/// says so, tells the story, and removes that directory at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_run_as_root_where_postgres_cannot_enter_chooses_a_directory_it_can() {
    if !nix::unistd::Uid::effective().is_root() {
        println!("not root: PostgreSQL runs as this account, which can enter its own directories");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let locked = std::env::temp_dir().join(format!("fencing-demo-locked-{}", std::process::id()));
    let here = locked.join("project");
    std::fs::create_dir_all(&here).unwrap();
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o700)).unwrap();
    let output = demo(&[], Some(&here)).await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let _ = std::fs::remove_dir_all(&locked);
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    let chosen = stdout
        .lines()
        .find_map(|line| line.split("keeps its data in ").nth(1)?.split(' ').next())
        .unwrap_or_else(|| panic!("the demo did not say where it keeps its data: {stdout}"));
    assert!(chosen.starts_with("/tmp/fencing-gateway-demo-"), "{chosen}");
    assert!(stdout.contains("the gateway refused leader-a's write with term 1: HTTP 409"), "{stdout}");
    assert!(!std::path::Path::new(chosen).exists(), "{chosen} was left behind");
}
