//! `fencing-gateway serve`: loads the configuration, starts the embedded Postgres when no
//! database URL is set, binds both listeners, runs the gateway until SIGTERM or SIGINT, drains.

use std::process::ExitCode;

use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::app::Listeners;
use crate::config::{Config, ProcessEnvironment};
use crate::ops::cli::{EXIT_UNAVAILABLE, EXIT_USAGE};
use crate::ops::embedded::EmbeddedPostgres;
use crate::{error_chain, metrics};

/// Runs the gateway with the configuration at `config_path` until SIGTERM or SIGINT.
pub async fn serve(config_path: Option<&std::path::Path>) -> ExitCode {
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
    // What grants cost, said once at start-up (they are on unless `database.grant_ms = 0`).
    let grant_ms = config.database.grant.as_millis();
    if grant_ms > 0 {
        info!(
            grant_ms,
            "grants on: writes of a fence's current term are admitted without Postgres for up to grant_ms after a \
             decision; in exchange a new term (of a resource or a bound lease), the SQL guard's and fencing.admit's \
             raises and the admin actions wait up to grant_ms, and the gateway relies on its boot clock running \
             within database.clock_rate_tolerance; database.grant_ms = 0 turns them off"
        );
    } else {
        info!(
            "grants off (database.grant_ms = 0, or the default grant did not fit half of \
             database.fence_check_timeout_ms above 8 x upstream.settle_margin_ms): every fenced write asks Postgres"
        );
    }

    let signal_shutdown = shutdown.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = terminate.recv() => info!("SIGTERM: shutting down"),
            _ = interrupt.recv() => info!("SIGINT: shutting down"),
        }
        signal_shutdown.cancel();
    });
    let result = crate::app::run(config, &database_url, listeners, metrics, shutdown).await;
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

/// The database URL from the file `DATABASE_URL_FILE` names, if set.
pub fn url_from_file() -> Result<Option<String>, String> {
    match std::env::var_os("DATABASE_URL_FILE") {
        None => Ok(None),
        Some(path) => std::fs::read_to_string(&path)
            .map(|text| Some(text.trim().to_owned()))
            .map_err(|error| format!("DATABASE_URL_FILE {}: {error}", std::path::Path::new(&path).display())),
    }
}

/// The database `inspect` and `admin` work on: `--database-url` (or `DATABASE_URL`), else the
/// configuration's `database.url`, else the embedded PostgreSQL `serve` runs under the
/// configuration's `data_dir`.
pub fn find_database(database_url: Option<String>, config_path: Option<&std::path::Path>) -> Result<String, String> {
    if let Some(url) = database_url {
        return Ok(url);
    }
    if let Some(url) = url_from_file()? {
        return Ok(url);
    }
    let config = Config::load(config_path, &ProcessEnvironment).map_err(|error| error.to_string())?;
    match config.database.url {
        Some(url) => Ok(url),
        None => crate::ops::embedded::running_url(&config.database.data_dir),
    }
}
