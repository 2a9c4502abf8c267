//! The SQL guard from other languages' drivers, as a user would write it: the examples in
//! `examples/python` (psycopg 3) and `examples/java` (JDBC) run against a real database and must
//! show the token set with `set_config(..., true)` inside the write's transaction, the
//! autocommit pitfall refused, and a stale term refused with SQLSTATE ZF409.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use fencing_tests::pg::{SUPERUSER, TestDb};

fn examples() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples")
}

/// Runs `command` (bounded) and checks it printed every expected line fragment and exited 0.
async fn run(command: Command, what: &str, expected: &[&str]) {
    let output = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::from(command).kill_on_drop(true).output(),
    )
    .await
    .unwrap_or_else(|_| panic!("{what} did not finish within 120 s"))
    .unwrap_or_else(|error| panic!("run {what}: {error}"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{what} failed:\n{stdout}\n{stderr}");
    for fragment in expected {
        assert!(stdout.contains(fragment), "{what}: {fragment:?} missing from:\n{stdout}\n{stderr}");
    }
}

const EXPECTED: [&str; 4] = [
    "write with term",
    "autocommit pitfall: the token was gone before the INSERT; refused with ZF409",
    ": refused with ZF409: stop acting as leader",
    "_orders: 1",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_example_guards_writes_with_psycopg() {
    let python = ["python3", "/usr/bin/python3"]
        .into_iter()
        .find(|python| {
            Command::new(python).args(["-c", "import psycopg"]).output().is_ok_and(|output| output.status.success())
        })
        .expect("no python3 with psycopg 3: install it (`apt-get install python3-psycopg` on Debian)");
    let db = TestDb::new().await;
    let mut command = Command::new(python);
    command.arg(examples().join("python/guarded_write.py")).env("DATABASE_URL", db.url());
    run(command, "examples/python/guarded_write.py", &EXPECTED).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_java_example_guards_writes_with_jdbc() {
    let jar = PathBuf::from("/usr/share/java/postgresql.jar");
    assert!(
        jar.exists(),
        "no PostgreSQL JDBC driver: install it (`apt-get install libpostgresql-jdbc-java` on Debian)"
    );
    let db = TestDb::new().await;
    let url = format!("jdbc:postgresql://127.0.0.1:{}/{}?user={SUPERUSER}", db.cluster().port(), db.name);
    let mut command = Command::new("java");
    command.arg("-cp").arg(&jar).arg(examples().join("java/GuardedWrite.java")).arg(url);
    run(command, "examples/java/GuardedWrite.java", &EXPECTED).await;
}
