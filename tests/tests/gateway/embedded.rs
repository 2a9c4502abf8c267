//! The embedded default: with no database URL, `serve` starts a private PostgreSQL under its
//! data directory, initialised on first start, and stops it when the gateway stops.

use std::time::Duration;

use fencing_tests::gateway::{Gateway, Upstream, send};
use http::{Method, StatusCode};
use nix::sys::signal::Signal;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_database_url_serve_owns_a_local_postgres_that_stops_and_keeps_its_data() {
    let upstream = Upstream::start().await.unwrap();
    let dir = std::env::temp_dir().join(format!("fencing-embedded-{}-{}", std::process::id(), rand::random::<u32>()));
    let data_dir = dir.join("pgdata");
    let config = format!(
        "[database]\ndata_dir = \"{}\"\n[[routes]]\nprefix = \"/w\"\nupstream = \"{}\"\nresource = {{ fixed = \"w\" }}\n",
        data_dir.display(),
        upstream.url()
    );
    for (round, term) in [(0, "3"), (1, "3")] {
        let mut gateway = Gateway::start("", &config).await.unwrap();
        assert!(data_dir.join("PG_VERSION").is_file(), "round {round}: the data dir was initialised");
        assert!(data_dir.join("postmaster.pid").is_file(), "round {round}: the server runs");
        let reply = send(gateway.proxy, Method::POST, "/w", &[("fencing-token", term)], "").await.unwrap();
        assert_eq!(reply.status, StatusCode::OK, "round {round}");
        let stale = send(gateway.proxy, Method::POST, "/w", &[("fencing-token", "2")], "").await.unwrap();
        assert_eq!(stale.status, StatusCode::CONFLICT, "round {round}: the fence survived the restart");
        gateway.signal(Signal::SIGTERM).unwrap();
        assert_eq!(gateway.wait_exit(Duration::from_secs(30)).await.unwrap(), Some(0));
        assert!(!data_dir.join("postmaster.pid").exists(), "round {round}: the server stopped with the gateway");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
