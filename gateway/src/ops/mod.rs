//! The operator's side of the binary: the command line (`cli`), `serve` (configuration, the
//! embedded Postgres when no URL is set, listeners, signals), `demo`, `inspect` and `admin`,
//! `migrate`, `token`, and the embedded Postgres itself (`embedded`).
//!
//! It may use every other part of the crate; nothing but `main.rs` uses it.

pub mod cli;
pub mod demo;
pub mod embedded;
pub mod inspect;
pub mod migrate;
pub mod serve;
pub mod verify;

use std::process::ExitCode;

use crate::error_chain;
use crate::ops::cli::{Cli, Command, EXIT_UNAVAILABLE, EXIT_USAGE};

/// Runs the command `cli` names; its exit code.
pub async fn run(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Serve { config } => serve::serve(config.as_deref()).await,
        Command::Demo { data_dir, control_listen, exit_after_story } => {
            let metrics = match crate::metrics::install() {
                Ok(handle) => handle,
                Err(error) => {
                    eprintln!("fencing-gateway demo: metrics: {error}");
                    return ExitCode::from(EXIT_UNAVAILABLE);
                }
            };
            let (data_dir, scratch) = match data_dir {
                Some(dir) => (dir, None),
                None => match demo::default_data_dir() {
                    Ok(chosen) => chosen,
                    Err(message) => {
                        eprintln!("fencing-gateway demo: {message}");
                        return ExitCode::from(EXIT_UNAVAILABLE);
                    }
                },
            };
            let told = crate::ops::demo::run(&data_dir, control_listen, exit_after_story, metrics).await;
            // A directory the demo chose under /tmp is its own: removed once its PostgreSQL stopped.
            if let Some(scratch) = scratch
                && let Err(error) = std::fs::remove_dir_all(&scratch)
            {
                eprintln!("fencing-gateway demo: could not remove {}: {error}", scratch.display());
            }
            match told {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    eprintln!("fencing-gateway demo: {}", error_chain(&error));
                    ExitCode::FAILURE
                }
            }
        }
        Command::Token { name, leases, read } => {
            if !crate::security::auth::valid_client_name(&name) {
                eprintln!("fencing-gateway token: --name {name:?} must be 1 to 64 of A-Z a-z 0-9 . _ -");
                return ExitCode::from(EXIT_USAGE);
            }
            let token: String = (0..32).map(|_| format!("{:02x}", rand::random::<u8>())).collect();
            let leases = leases.iter().map(|lease| format!("{lease:?}")).collect::<Vec<_>>().join(", ");
            println!(
                "# The client's bearer token (shown once; give it to the client through a file or the environment):"
            );
            println!("# {token}");
            println!("[[clients]]");
            println!("name = {name:?}");
            println!("token_sha256 = {:?}", crate::security::auth::token_sha256_hex(&token));
            println!("leases = [{leases}]");
            println!("read = {read}");
            ExitCode::SUCCESS
        }
        Command::DemoLeader { database_url, owner, proxy } => {
            match crate::ops::demo::leader(&database_url, &owner, proxy).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    eprintln!("fencing-gateway demo-leader: {}", error_chain(&error));
                    ExitCode::FAILURE
                }
            }
        }
        Command::Inspect { what, database_url, config } => {
            let url = match serve::find_database(database_url, config.as_deref()) {
                Ok(url) => url,
                Err(message) => {
                    eprintln!("fencing-gateway inspect: {message}");
                    return ExitCode::from(EXIT_USAGE);
                }
            };
            match crate::ops::inspect::inspect(&url, &what).await {
                Ok(text) => {
                    print!("{text}");
                    ExitCode::SUCCESS
                }
                Err(error) => {
                    eprintln!("fencing-gateway inspect: {}", error_chain(&error));
                    ExitCode::FAILURE
                }
            }
        }
        Command::Admin { action, database_url, config } => {
            let url = match serve::find_database(database_url, config.as_deref()) {
                Ok(url) => url,
                Err(message) => {
                    eprintln!("fencing-gateway admin: {message}");
                    return ExitCode::from(EXIT_USAGE);
                }
            };
            let mut input = std::io::stdin().lock();
            match crate::ops::inspect::admin(&url, &action, &mut input).await {
                Ok(Some(text)) => {
                    print!("{text}");
                    ExitCode::SUCCESS
                }
                Ok(None) => {
                    eprintln!("not confirmed; nothing changed");
                    ExitCode::FAILURE
                }
                Err(error) => {
                    eprintln!("fencing-gateway admin: {}", error_chain(&error));
                    ExitCode::FAILURE
                }
            }
        }
        Command::Verify(args) => {
            let usage = |message: String| {
                eprintln!("fencing-gateway verify: {message}");
                ExitCode::from(EXIT_USAGE)
            };
            let target = match verify::target(args) {
                Ok(target) => target,
                Err(message) => return usage(message),
            };
            match verify::run(&target).await {
                Ok(report) if report.passed() => {
                    println!("verify: fencing held on this {}", target.what());
                    ExitCode::SUCCESS
                }
                Ok(_) => {
                    println!("verify: FAILED: fencing did not hold on this {} (see the FAIL lines)", target.what());
                    ExitCode::FAILURE
                }
                Err(error @ (crate::Error::InUse(_) | crate::Error::Usage(_))) => usage(error_chain(&error)),
                Err(error) => {
                    eprintln!("fencing-gateway verify: {}", error_chain(&error));
                    ExitCode::from(EXIT_UNAVAILABLE)
                }
            }
        }
        Command::Migrate { database_url } => {
            let database_url = match database_url.map_or_else(serve::url_from_file, |url| Ok(Some(url))) {
                Ok(Some(url)) => url,
                Ok(None) => {
                    eprintln!("fencing-gateway migrate: needs --database-url, DATABASE_URL or DATABASE_URL_FILE");
                    return ExitCode::from(EXIT_USAGE);
                }
                Err(message) => {
                    eprintln!("fencing-gateway migrate: {message}");
                    return ExitCode::from(EXIT_USAGE);
                }
            };
            migrate::command(&database_url).await
        }
    }
}
