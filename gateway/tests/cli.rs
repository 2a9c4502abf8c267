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
         [[routes]]\nprefix = \"/x\"\nupstream = \"https://example.invalid\"\nresource = { segment = 0 }\n",
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
