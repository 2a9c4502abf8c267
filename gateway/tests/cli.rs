//! The binary's command line, run as a real process.

use std::process::Command;

fn gateway() -> Command {
    Command::new(env!("CARGO_BIN_EXE_fencing-gateway"))
}

#[test]
fn unknown_subcommand_exits_with_usage_code_64() {
    let output = gateway().arg("frobnicate").output().expect("run the gateway binary");
    assert_eq!(output.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&output.stderr).contains("frobnicate"));
}

#[test]
fn migrate_without_database_url_exits_64_naming_the_option() {
    let output = gateway().arg("migrate").env_remove("DATABASE_URL").output().expect("run the gateway binary");
    assert_eq!(output.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--database-url"));
}

#[test]
fn migrate_against_an_unreachable_database_fails_clearly() {
    // Port 1 on loopback: nothing listens there, so the connection is refused at once.
    let output = gateway()
        .args(["migrate", "--database-url", "postgres://nobody@127.0.0.1:1/none?connect_timeout=2"])
        .output()
        .expect("run the gateway binary");
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("connect to the database"), "stderr: {stderr}");
}

#[test]
fn help_exits_zero() {
    let output = gateway().arg("--help").output().expect("run the gateway binary");
    assert_eq!(output.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&output.stdout).contains("migrate"));
}

#[test]
fn serve_with_a_bad_configuration_exits_64_naming_every_bad_key() {
    let path = std::env::temp_dir().join(format!("fencing-bad-config-{}.toml", std::process::id()));
    std::fs::write(
        &path,
        "[proxy]\nlisten = \"not-an-address\"\n[upstream]\nforward_timeout_ms = 0\n\
         [[routes]]\nprefix = \"/x\"\nupstream = \"ftp://example.invalid\"\nresource = { segment = 0 }\n",
    )
    .expect("write the config");
    let output = gateway().args(["serve", "--config"]).arg(&path).output().expect("run the gateway binary");
    let _ = std::fs::remove_file(&path);
    assert_eq!(output.status.code(), Some(64));
    let stderr = String::from_utf8_lossy(&output.stderr);
    for key in ["proxy.listen", "upstream.forward_timeout_ms", "routes[0].upstream", "routes[0].resource"] {
        assert!(stderr.contains(key), "{key} missing from: {stderr}");
    }
}

#[test]
fn serve_with_a_missing_config_file_exits_64() {
    let output = gateway().args(["serve", "--config", "/nonexistent/fencing.toml"]).output().expect("run");
    assert_eq!(output.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&output.stderr).contains("/nonexistent/fencing.toml"));
}

/// Runs `serve` with no routes against an unreachable database, with `env` added; returns the
/// stderr lines up to the first containing `needle` (found) or 20 s of them (not found).
fn serve_until(env: &[(&str, &str)], needle: &str) -> (bool, Vec<String>) {
    use std::io::{BufRead, BufReader};
    let mut command = gateway();
    command
        .arg("serve")
        .env_remove("FENCING_CONFIG")
        .env("FENCING_DATABASE_URL", "postgres://nobody@127.0.0.1:1/none?connect_timeout=1")
        .env("FENCING_PROXY_LISTEN", "127.0.0.1:0")
        .env("FENCING_CONTROL_LISTEN", "127.0.0.1:0")
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    for (name, value) in env {
        command.env(name, value);
    }
    let mut child = command.spawn().expect("run the gateway binary");
    let stderr = child.stderr.take().expect("piped stderr");
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if sender.send(line).is_err() {
                return;
            }
        }
    });
    let mut seen = Vec::new();
    let found = loop {
        match receiver.recv_timeout(std::time::Duration::from_secs(20)) {
            Ok(line) => {
                let hit = line.contains(needle);
                seen.push(line);
                if hit {
                    break true;
                }
            }
            Err(_) => break false,
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    (found, seen)
}

#[test]
fn serve_without_routes_warns_that_no_routes_are_configured_without_colour_in_a_pipe() {
    let (found, seen) = serve_until(&[], "no routes are configured");
    assert!(found, "no warning about missing routes; stderr: {seen:?}");
    // stderr is a pipe here, not a terminal: no colour escapes in the log.
    assert!(seen.iter().all(|line| !line.contains('\u{1b}')), "ANSI escapes in a piped log: {seen:?}");
}

#[test]
fn logs_are_json_lines_with_fencing_log_format_json_and_other_formats_are_refused() {
    let (found, seen) = serve_until(&[("FENCING_LOG_FORMAT", "json")], "no routes are configured");
    assert!(found, "stderr: {seen:?}");
    let line: serde_json::Value = serde_json::from_str(seen.last().expect("a line")).expect("a JSON log line");
    assert_eq!(line["level"], "WARN", "{line}");
    let bad = gateway().arg("serve").env("FENCING_LOG_FORMAT", "xml").output().expect("run the gateway binary");
    assert_eq!(bad.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("FENCING_LOG_FORMAT"));
}

#[test]
fn a_password_on_the_command_line_is_refused_without_being_echoed() {
    for args in [
        vec!["migrate", "--database-url", "postgres://u:hunter2@127.0.0.1:1/x"],
        vec!["inspect", "leases", "--database-url=host=127.0.0.1 user=u password=hunter2"],
    ] {
        let output = gateway().args(&args).env_remove("DATABASE_URL").output().expect("run the gateway binary");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(64), "{args:?}: {stderr}");
        assert!(stderr.contains("DATABASE_URL_FILE"), "{stderr}");
        assert!(!stderr.contains("hunter2"), "the password was echoed: {stderr}");
    }
}

#[test]
fn the_database_url_can_come_from_a_file() {
    let path = std::env::temp_dir().join(format!("fencing-cli-url-{}", std::process::id()));
    std::fs::write(&path, "postgres://nobody@127.0.0.1:1/none?connect_timeout=2\n").expect("write the url file");
    let output = gateway()
        .arg("migrate")
        .env_remove("DATABASE_URL")
        .env("DATABASE_URL_FILE", &path)
        .output()
        .expect("run the gateway binary");
    let stderr = String::from_utf8_lossy(&output.stderr);
    // It read the file: it tried that database.
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("connect to the database"), "{stderr}");

    // Both the variable and the file: ambiguous, refused before anything starts.
    let output = gateway()
        .arg("serve")
        .env("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none")
        .env("DATABASE_URL_FILE", &path)
        .output()
        .expect("run the gateway binary");
    let _ = std::fs::remove_file(&path);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("set DATABASE_URL or DATABASE_URL_FILE, not both"), "{stderr}");
}

#[test]
fn token_prints_a_token_and_the_sha256_the_configuration_keeps() {
    let output =
        gateway().args(["token", "--name", "billing", "--lease", "billing-*", "--read"]).output().expect("run");
    assert!(output.status.success());
    let stdout = String::from_utf8_lossy(&output.stdout);
    let token = stdout.lines().nth(1).and_then(|line| line.strip_prefix("# ")).expect("the token line");
    let hash = stdout
        .lines()
        .find_map(|line| line.strip_prefix("token_sha256 = \""))
        .and_then(|rest| rest.strip_suffix('"'))
        .expect("the hash line");
    assert_eq!(hash, fencing_gateway::security::auth::token_sha256_hex(token));
    assert!(token.len() >= 64, "a token of 32 random bytes: {token}");
    assert!(stdout.contains("leases = [\"billing-*\"]") && stdout.contains("read = true"), "{stdout}");
    let bad = gateway().args(["token", "--name", "a/b"]).output().expect("run");
    assert_eq!(bad.status.code(), Some(64));
}
