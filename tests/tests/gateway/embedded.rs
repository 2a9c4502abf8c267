//! The embedded default: with no database URL, `serve` starts a private PostgreSQL under its
//! data directory, initialised on first start, and stops it when the gateway stops.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::time::Duration;

use fencing_tests::gateway::{Gateway, Upstream, send};
use http::{Method, StatusCode};
use nix::sys::signal::Signal;

/// The lines of the running server's `postmaster.pid`.
fn postmaster_pid(data_dir: &Path) -> Vec<String> {
    std::fs::read_to_string(data_dir.join("postmaster.pid")).unwrap().lines().map(str::to_owned).collect()
}

/// The embedded server is reachable by its own account and root only: no TCP listener, and its
/// Unix socket in a private directory. Another local user (as root, `nobody`) cannot connect.
fn assert_private(data_dir: &Path) {
    let pid_file = postmaster_pid(data_dir);
    // postmaster.pid: pid, data dir, start time, port, socket dir, listen address, ...
    let (socket_dir, listen) = (pid_file[4].trim().to_owned(), pid_file[5].trim().to_owned());
    assert!(listen.is_empty(), "the embedded PostgreSQL listens on TCP: {listen:?}");
    let meta = std::fs::metadata(&socket_dir).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o700, "{socket_dir} is private");
    let server_uid = std::fs::metadata(data_dir).unwrap().uid();
    assert_eq!(meta.uid(), server_uid, "{socket_dir} belongs to the server's account");
    if !nix::unistd::geteuid().is_root() {
        return; // Only root can act as another user; the mode and owner above are the proof.
    }
    let nobody = nix::unistd::User::from_name("nobody").unwrap().expect("a user nobody");
    let psql = fencing_gateway::embedded::find_bin_dir().unwrap().join("psql");
    for host in [socket_dir.as_str(), "127.0.0.1"] {
        let output = std::process::Command::new(&psql)
            .args([
                "-X",
                "-h",
                host,
                "-p",
                "5432",
                "-U",
                "postgres",
                "-d",
                "postgres",
                "-c",
                "COPY (SELECT 1) TO PROGRAM 'id'",
            ])
            .env_clear()
            .uid(nobody.uid.as_raw())
            .gid(nobody.gid.as_raw())
            .output()
            .unwrap();
        assert!(
            !output.status.success(),
            "another local user reached the embedded PostgreSQL through {host}: {}",
            String::from_utf8_lossy(&output.stdout)
        );
    }
}

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
        assert_private(&data_dir);
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
