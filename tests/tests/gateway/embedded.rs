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
    let psql = fencing_gateway::ops::embedded::find_bin_dir().unwrap().join("psql");
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
        "[database]\ndata_dir = \"{}\"\n[[routes]]\nprefix = \"/w\"\nupstream = \"{}\"\nresource = {{ fixed = \"w\" }}\n\
         [[routes]]\nprefix = \"/b\"\nupstream = \"{}\"\nresource = {{ segment = 2 }}\nlease = \"embedded-writer\"\n",
        data_dir.display(),
        upstream.url(),
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
        // inspect and admin find the embedded database from the configuration, without a URL.
        let config_file = dir.join("gateway.toml");
        std::fs::write(&config_file, &config).unwrap();
        let inspect = tokio::process::Command::new(fencing_tests::workspace_bin("fencing-gateway").unwrap())
            .args(["inspect", "fence", "/w/w", "--config"])
            .arg(&config_file)
            .env_remove("DATABASE_URL")
            .env_remove("FENCING_DATABASE_URL")
            .output()
            .await
            .unwrap();
        let text = String::from_utf8_lossy(&inspect.stdout);
        assert!(inspect.status.success(), "inspect: {}", String::from_utf8_lossy(&inspect.stderr));
        assert!(text.contains("max term:   3"), "round {round}: {text}");
        if round == 1 {
            // fencing-gateway verify against the embedded setup, on its bound route.
            let (control, proxy) = (format!("http://{}", gateway.control), format!("http://{}", gateway.proxy));
            let applied = format!("{}/__applied", upstream.url());
            let verify = tokio::process::Command::new(fencing_tests::workspace_bin("fencing-gateway").unwrap())
                .args(["verify", "--control", &control, "--proxy", &proxy, "--check-url", &applied])
                .args(["--path", "/b/acct/entries", "--resource", "acct", "--lease", "embedded-writer"])
                .env_remove("FENCING_CLIENT_TOKEN")
                .output()
                .await
                .unwrap();
            let said = String::from_utf8_lossy(&verify.stdout);
            assert!(verify.status.success(), "verify: {said}{}", String::from_utf8_lossy(&verify.stderr));
            assert_eq!(said.lines().filter(|line| line.starts_with("PASS ")).count(), 6, "{said}");
        }
        gateway.signal(Signal::SIGTERM).unwrap();
        assert_eq!(gateway.wait_exit(Duration::from_secs(30)).await.unwrap(), Some(0));
        assert!(!data_dir.join("postmaster.pid").exists(), "round {round}: the server stopped with the gateway");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// As root, the embedded PostgreSQL runs as `postgres`, which cannot enter a directory only
/// root may enter: serve says so and what to do, instead of initdb's "Permission denied".
#[tokio::test]
async fn a_data_dir_the_server_account_cannot_reach_is_refused_with_what_to_do() {
    if !nix::unistd::geteuid().is_root() {
        return; // Not root: the server runs as this account, which can reach its own directories.
    }
    let dir = std::env::temp_dir().join(format!("fencing-private-{}-{}", std::process::id(), rand::random::<u32>()));
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let config = format!("[database]\ndata_dir = \"{}\"\n", dir.join("state").join("pgdata").display());
    let config_file = std::env::temp_dir().join(format!("fencing-private-{}.toml", std::process::id()));
    std::fs::write(&config_file, config).unwrap();
    let output = tokio::process::Command::new(fencing_tests::workspace_bin("fencing-gateway").unwrap())
        .args(["serve", "--config"])
        .arg(&config_file)
        .env_remove("DATABASE_URL")
        .env_remove("FENCING_DATABASE_URL")
        .env("FENCING_PROXY_LISTEN", "127.0.0.1:0")
        .env("FENCING_CONTROL_LISTEN", "127.0.0.1:0")
        .output()
        .await
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_file(&config_file);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(69), "{stderr}");
    assert!(stderr.contains("cannot enter") && stderr.contains("chmod o+x"), "{stderr}");
}
