//! The test harness of fencing-gateway: a real PostgreSQL started from the system binaries,
//! fresh migrated databases, and the workspace's binaries as real processes.
//!
//! # Layout
//!
//! - [`pg`]: [`pg::PgCluster`] starts a throwaway cluster (initdb + pg_ctl in a temp dir on a
//!   free loopback port, as an unprivileged user when the tests run as root) and removes it when
//!   dropped or when the test process ends, however it ends. [`pg::TestDb`] is a fresh database in
//!   the cluster shared by one test binary, migrated by the production migration code.
//! - [`faultproxy`]: a TCP proxy that delays, holds, cuts or resets a link on command.
//! - [`faultsuite`]: the fault suite's scenario runner: real processes, seeded faults, a history.
//! - [`faultclient`]: what the fault suite's client processes share: the log, one HTTP write.
//! - [`faultprobe`]: the fault suite's durability probes: each fence-moving path crashed right
//!   after its answer, then the lower term presented again.
//! - [`gateway`]: the gateway and the recording upstream as real processes, and a client.
//! - [`process`]: [`process::ElectorProcess`] runs the election example as a real process and
//!   reads its JSON lines.
//! - [`workspace_bin`] finds a binary of the workspace (built by `cargo test --workspace`).

#![allow(clippy::unwrap_used)]

pub mod faultclient;
pub mod faultprobe;
pub mod faultproxy;
pub mod faultsuite;
pub mod gateway;
pub mod pg;
pub mod process;
pub mod tls;

use std::path::PathBuf;

/// The path of a binary built from this workspace, next to the running test binary.
///
/// `cargo test --workspace` builds every binary that a package's integration tests need before
/// running any test, so the gateway binary is there when the README's test command is used.
pub fn workspace_bin(name: &str) -> anyhow::Result<PathBuf> {
    let path = workspace_bin_dir()?.join(name);
    anyhow::ensure!(
        path.is_file(),
        "{} is not built: run the tests with `cargo test --workspace`, or `cargo build --workspace` first",
        path.display()
    );
    Ok(path)
}

/// The path of an example built from this workspace (`cargo test --workspace` builds them).
pub fn workspace_example(name: &str) -> anyhow::Result<PathBuf> {
    let path = workspace_bin_dir()?.join("examples").join(name);
    anyhow::ensure!(
        path.is_file(),
        "{} is not built: run the tests with `cargo test --workspace`, or `cargo build --workspace --examples` first",
        path.display()
    );
    Ok(path)
}

fn workspace_bin_dir() -> anyhow::Result<PathBuf> {
    // A test binary lives in target/<profile>/deps, a binary in target/<profile>.
    let exe = std::env::current_exe()?;
    let dir =
        exe.parent().ok_or_else(|| anyhow::anyhow!("cannot locate the target directory from {}", exe.display()))?;
    Ok(if dir.ends_with("deps") { dir.parent().unwrap_or(dir) } else { dir }.to_path_buf())
}

/// The SQLSTATE of a database error, if it is one.
pub fn sqlstate(error: &tokio_postgres::Error) -> Option<&str> {
    error.as_db_error().map(|db| db.code().code())
}

/// The message of a database error, or the error's text.
pub fn message(error: &tokio_postgres::Error) -> String {
    error.as_db_error().map_or_else(|| error.to_string(), |db| db.message().to_owned())
}

/// Every row of `query`, each rendered as text in order: compare two of these to prove that
/// nothing changed.
pub async fn snapshot(client: &tokio_postgres::Client, query: &str) -> Vec<String> {
    let wrapped = format!("SELECT row_to_json(q)::text FROM ({query}) q");
    match client.query(&wrapped, &[]).await {
        Ok(rows) => rows.iter().map(|row| row.get::<_, String>(0)).collect(),
        Err(error) => panic!("snapshot {query}: {error}"),
    }
}

/// The leases and fences tables, in key order: what a refused call must leave unchanged.
pub async fn fencing_state(client: &tokio_postgres::Client) -> Vec<String> {
    let mut state = snapshot(client, "SELECT * FROM fencing.leases ORDER BY key").await;
    state.extend(snapshot(client, "SELECT * FROM fencing.fences ORDER BY resource").await);
    state
}

/// Waits (bounded, 30 s) until the store's clock has passed `instant`.
pub async fn wait_for_store_clock(client: &tokio_postgres::Client, instant: std::time::SystemTime) {
    for _ in 0..3000 {
        match client.query_one("SELECT clock_timestamp() >= $1", &[&instant]).await {
            Ok(row) if row.get::<_, bool>(0) => return,
            Ok(_) => tokio::time::sleep(std::time::Duration::from_millis(10)).await,
            Err(error) => panic!("read the store's clock: {error}"),
        }
    }
    panic!("the store's clock did not pass {instant:?} within 30 s");
}

/// How period `term` of lease `key` ended (`fencing.lease_history.end_reason`), `None` while it
/// has not (an expiry is recorded when the next period starts).
pub async fn end_reason(client: &tokio_postgres::Client, key: &str, term: i64) -> Option<String> {
    let row = client
        .query_opt("SELECT end_reason FROM fencing.lease_history WHERE key = $1 AND term = $2", &[&key, &term])
        .await
        .ok()
        .flatten()?;
    row.get(0)
}

/// The admin actions recorded on `target` (`fencing.admin_audit`), oldest first.
pub async fn audit_actions(client: &tokio_postgres::Client, target: &str) -> Vec<String> {
    match client.query("SELECT action FROM fencing.admin_audit WHERE target = $1 ORDER BY id", &[&target]).await {
        Ok(rows) => rows.iter().map(|row| row.get(0)).collect(),
        Err(_) => Vec::new(),
    }
}
