//! Starts a test cluster, prints where it lives, then ends badly on purpose: `panic` panics,
//! `hang` waits to be killed. The harness test checks that the cluster is gone afterwards.

use std::io::Write;

use fencing_tests::pg::PgCluster;

fn main() {
    let mode = std::env::args().nth(1).unwrap_or_default();
    let cluster = match PgCluster::start() {
        Ok(cluster) => cluster,
        Err(error) => {
            eprintln!("pg-harness-probe: {error:#}");
            std::process::exit(2);
        }
    };
    let pid = cluster.postmaster_pid().unwrap_or(0);
    println!("postmaster_pid={pid} root={}", cluster.root().display());
    let _ = std::io::stdout().flush();
    match mode.as_str() {
        "panic" => panic!("pg-harness-probe panics on purpose"),
        _ => loop {
            std::thread::sleep(std::time::Duration::from_secs(60));
        },
    }
}
