//! Smoke run of the fault suite's runner (temporary).
#![allow(clippy::unwrap_used)]
use fencing_tests::faultsuite::{SuiteConfig, run, start_cluster};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smoke() {
    let cluster = start_cluster().unwrap();
    let out = std::path::PathBuf::from("/tmp/fault-smoke");
    let _ = std::fs::remove_dir_all(&out);
    let config = SuiteConfig::new(1, 5, 42, out.clone());
    run(&cluster, &config, |_| Ok(false)).await.unwrap();
}
