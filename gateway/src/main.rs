//! The `fencing-gateway` binary: load config, set up tracing, build the app, wait for a
//! signal, drain.

use std::process::ExitCode;

use clap::Parser;
use fencing_gateway::cli::{Cli, Command, EXIT_UNAVAILABLE, EXIT_USAGE};
use fencing_gateway::config::{Config, ProcessEnvironment};
use fencing_gateway::embedded::EmbeddedPostgres;
use fencing_gateway::{Listeners, error_chain, metrics};
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> ExitCode {
    if let Some(message) = password_in_argv(std::env::args_os()).or_else(both_database_urls) {
        eprintln!("fencing-gateway: {message}");
        return ExitCode::from(EXIT_USAGE);
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            let code = if error.use_stderr() { EXIT_USAGE } else { 0 };
            let _ = error.print();
            return ExitCode::from(code);
        }
    };
    // Colours only on a terminal; JSON lines for log shippers with FENCING_LOG_FORMAT=json.
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    match std::env::var("FENCING_LOG_FORMAT").as_deref() {
        Ok("json") => tracing_subscriber::fmt()
            .json()
            .with_current_span(true)
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .init(),
        Ok("text") | Err(_) => tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_writer(std::io::stderr)
            .init(),
        Ok(other) => {
            eprintln!("invalid configuration: FENCING_LOG_FORMAT: {other:?} is neither text nor json");
            return ExitCode::from(EXIT_USAGE);
        }
    }

    match cli.command {
        Command::Serve { config } => serve(config.as_deref()).await,
        Command::Demo { data_dir, control_listen, exit_after_story } => {
            let metrics = match metrics::install() {
                Ok(handle) => handle,
                Err(error) => {
                    eprintln!("fencing-gateway demo: metrics: {error}");
                    return ExitCode::from(EXIT_UNAVAILABLE);
                }
            };
            match fencing_gateway::demo::run(&data_dir, control_listen, exit_after_story, metrics).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    eprintln!("fencing-gateway demo: {}", error_chain(&error));
                    ExitCode::FAILURE
                }
            }
        }
        Command::Token { name, leases, read } => {
            if !fencing_gateway::auth::valid_client_name(&name) {
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
            println!("token_sha256 = {:?}", fencing_gateway::auth::token_sha256_hex(&token));
            println!("leases = [{leases}]");
            println!("read = {read}");
            ExitCode::SUCCESS
        }
        Command::DemoLeader { database_url, owner, proxy } => {
            match fencing_gateway::demo::leader(&database_url, &owner, proxy).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    eprintln!("fencing-gateway demo-leader: {}", error_chain(&error));
                    ExitCode::FAILURE
                }
            }
        }
        Command::Inspect { what, database_url, config } => {
            let url = match find_database(database_url, config.as_deref()) {
                Ok(url) => url,
                Err(message) => {
                    eprintln!("fencing-gateway inspect: {message}");
                    return ExitCode::from(EXIT_USAGE);
                }
            };
            match fencing_gateway::inspect::inspect(&url, &what).await {
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
            let url = match find_database(database_url, config.as_deref()) {
                Ok(url) => url,
                Err(message) => {
                    eprintln!("fencing-gateway admin: {message}");
                    return ExitCode::from(EXIT_USAGE);
                }
            };
            let mut input = std::io::stdin().lock();
            match fencing_gateway::inspect::admin(&url, &action, &mut input).await {
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
        Command::Migrate { database_url } => {
            let database_url = match database_url.map_or_else(url_from_file, |url| Ok(Some(url))) {
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
            migrate(&database_url).await
        }
    }
}

async fn migrate(database_url: &str) -> ExitCode {
    match fencing_gateway::migrate::run(database_url).await {
        Ok(report) if report.applied.is_empty() => {
            println!("schema fencing is current at version {}", report.version);
            ExitCode::SUCCESS
        }
        Ok(report) => {
            println!("applied migrations {:?}; schema fencing is at version {}", report.applied, report.version);
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("fencing-gateway migrate: {}", error_chain(&error));
            ExitCode::FAILURE
        }
    }
}

/// A password on the command line is readable by every local user (`/proc/PID/cmdline`, `ps`):
/// refused, with where to put it instead.
fn password_in_argv(args: impl Iterator<Item = std::ffi::OsString>) -> Option<String> {
    let mut flag_before = false;
    for arg in args {
        let arg = arg.to_string_lossy().into_owned();
        let value = if flag_before { Some(arg.as_str()) } else { arg.strip_prefix("--database-url=") };
        flag_before = arg == "--database-url";
        if value.is_some_and(carries_password) {
            return Some(
                "--database-url carries a password, which every local user can read in /proc/PID/cmdline; \
                 set DATABASE_URL, or DATABASE_URL_FILE naming a file only you can read, instead"
                    .to_owned(),
            );
        }
    }
    None
}

/// Whether a libpq URL or key=value string names a password, however else it is spelled:
/// `user:password@` in a URL, or a `password` parameter in either form.
fn carries_password(text: &str) -> bool {
    let lower = text.to_ascii_lowercase();
    let url_userinfo = ["postgres://", "postgresql://"]
        .iter()
        .find_map(|scheme| lower.strip_prefix(scheme))
        .and_then(|rest| rest.split(['/', '?']).next())
        .and_then(|authority| authority.rsplit_once('@'))
        .is_some_and(|(userinfo, _)| userinfo.contains(':'));
    url_userinfo || lower.contains("password=")
}

/// `DATABASE_URL` and `DATABASE_URL_FILE` both set: which one is meant is unclear.
fn both_database_urls() -> Option<String> {
    (std::env::var_os("DATABASE_URL").is_some() && std::env::var_os("DATABASE_URL_FILE").is_some())
        .then(|| "set DATABASE_URL or DATABASE_URL_FILE, not both".to_owned())
}

/// The database URL from the file `DATABASE_URL_FILE` names, if set.
fn url_from_file() -> Result<Option<String>, String> {
    match std::env::var_os("DATABASE_URL_FILE") {
        None => Ok(None),
        Some(path) => std::fs::read_to_string(&path)
            .map(|text| Some(text.trim().to_owned()))
            .map_err(|error| format!("DATABASE_URL_FILE {}: {error}", std::path::Path::new(&path).display())),
    }
}

async fn serve(config_path: Option<&std::path::Path>) -> ExitCode {
    let config = match Config::load(config_path, &ProcessEnvironment) {
        Ok(config) => config,
        Err(error) => {
            for problem in &error.problems {
                eprintln!("invalid configuration: {problem}");
            }
            return ExitCode::from(EXIT_USAGE);
        }
    };
    for warning in &config.warnings {
        warn!("configuration: {warning}");
    }
    if config.routes.is_empty() {
        warn!(
            config = config_path.map_or_else(|| "(none)".to_owned(), |path| path.display().to_string()),
            "no routes are configured: the proxy answers 404 to every request; pass --config FILE \
             (fencing-gateway.example.toml works as is)"
        );
    }
    let shutdown = CancellationToken::new();
    let (mut terminate, mut interrupt) = match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
        (Ok(terminate), Ok(interrupt)) => (terminate, interrupt),
        _ => {
            eprintln!("fencing-gateway: cannot install signal handlers");
            return ExitCode::from(EXIT_UNAVAILABLE);
        }
    };
    let listeners = match Listeners::bind(&config).await {
        Ok(listeners) => listeners,
        Err(error) => {
            eprintln!("fencing-gateway: bind {} / {}: {error}", config.proxy.listen, config.control.listen);
            return ExitCode::from(EXIT_UNAVAILABLE);
        }
    };
    let metrics = match metrics::install() {
        Ok(handle) => handle,
        Err(error) => {
            eprintln!("fencing-gateway: metrics: {error}");
            return ExitCode::from(EXIT_UNAVAILABLE);
        }
    };
    let embedded = match &config.database.url {
        Some(_) => None,
        None => {
            let data_dir = config.database.data_dir.clone();
            let started = tokio::task::spawn_blocking(move || EmbeddedPostgres::start(&data_dir))
                .await
                .unwrap_or_else(|error| Err(error.to_string()));
            match started {
                Ok(server) => Some(server),
                Err(error) => {
                    eprintln!("fencing-gateway: embedded PostgreSQL: {error}");
                    return ExitCode::from(EXIT_UNAVAILABLE);
                }
            }
        }
    };
    let database_url = match (&config.database.url, &embedded) {
        (Some(url), _) => url.clone(),
        (None, Some(server)) => server.url(),
        (None, None) => return ExitCode::from(EXIT_UNAVAILABLE),
    };
    let (proxy_addr, control_addr) = (listeners.proxy.local_addr(), listeners.control.local_addr());
    if let (Ok(proxy), Ok(control)) = (proxy_addr, control_addr) {
        // One line on stdout, for scripts and tests that bind port 0.
        println!("fencing-gateway listening proxy={proxy} control={control}");
        info!(%proxy, %control, embedded = embedded.is_some(), "listening");
    }

    let signal_shutdown = shutdown.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = terminate.recv() => info!("SIGTERM: shutting down"),
            _ = interrupt.recv() => info!("SIGINT: shutting down"),
        }
        signal_shutdown.cancel();
    });
    let result = fencing_gateway::run(config, &database_url, listeners, metrics, shutdown).await;
    if let Some(server) = embedded
        && let Err(error) =
            tokio::task::spawn_blocking(move || server.stop()).await.unwrap_or_else(|e| Err(e.to_string()))
    {
        error!(%error, "could not stop the embedded PostgreSQL");
    }
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(error) => {
            eprintln!("fencing-gateway: {}", error_chain(&error));
            ExitCode::FAILURE
        }
    }
}

/// The database `inspect` and `admin` work on: `--database-url` (or `DATABASE_URL`), else the
/// configuration's `database.url`, else the embedded PostgreSQL `serve` runs under the
/// configuration's `data_dir`.
fn find_database(database_url: Option<String>, config_path: Option<&std::path::Path>) -> Result<String, String> {
    if let Some(url) = database_url {
        return Ok(url);
    }
    if let Some(url) = url_from_file()? {
        return Ok(url);
    }
    let config = Config::load(config_path, &ProcessEnvironment).map_err(|error| error.to_string())?;
    match config.database.url {
        Some(url) => Ok(url),
        None => fencing_gateway::embedded::running_url(&config.database.data_dir),
    }
}
