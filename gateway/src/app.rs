//! The gateway's wiring: the fence store, the control API and the proxy on their listeners,
//! started together and drained together.

use std::sync::Arc;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use fencing_schema::MigrationReport;

use crate::config::{Config, StandbyCheck};
use crate::control::ControlState;
use crate::error::{Error, error_chain};
use crate::fence::refusals::RefusalLog;
use crate::fence::{self, FenceStore};
use crate::listener::{self, Limits};
use crate::proxy::{self, Proxy, upstream};
use crate::security::database::Database;
use crate::security::tls;
use crate::{control, metrics};

/// The two bound listeners.
#[derive(Debug)]
pub struct Listeners {
    /// Leader writes.
    pub proxy: TcpListener,
    /// The control API.
    pub control: TcpListener,
}

impl Listeners {
    /// Binds both addresses of `config`.
    pub async fn bind(config: &Config) -> std::io::Result<Listeners> {
        Ok(Listeners {
            proxy: TcpListener::bind(config.proxy.listen).await?,
            control: TcpListener::bind(config.control.listen).await?,
        })
    }
}

/// Runs the gateway on `listeners` against `database_url` until `shutdown` is cancelled, then
/// drains both listeners for up to the configured grace period. Returns whether the drain
/// finished in time.
pub async fn run(
    config: Config,
    database_url: &str,
    listeners: Listeners,
    metrics: PrometheusHandle,
    shutdown: CancellationToken,
) -> Result<bool, Error> {
    let config = Arc::new(config);
    let database = Database::parse(database_url).map_err(Error::Setup)?;
    let pool =
        fence::pool(&database, config.database.pool_size, config.database.fence_check_timeout).map_err(Error::Setup)?;
    let fences = Arc::new(FenceStore::new(
        pool,
        fence::Settings {
            check_timeout: config.database.fence_check_timeout,
            forward_timeout: config.upstream.forward_timeout,
            max_batches_in_flight: config.database.max_batches_in_flight,
            grant: config.database.grant,
            margin: config.upstream.settle_margin,
            clock_rate_tolerance: config.database.clock_rate_tolerance,
        },
    ));
    tokio::spawn(migrate_until_done(database_url.to_owned(), shutdown.clone()));
    // The embedded Postgres is local and never fails over: nothing to say about its standbys.
    if config.database.url.is_some() && config.database.standby_check == StandbyCheck::Warn {
        tokio::spawn(fence::standby::watch(
            fences.pool().clone(),
            config.database.fence_check_timeout,
            shutdown.clone(),
        ));
    }
    tokio::spawn(control::lease_view::watch(
        fences.pool().clone(),
        metrics::named_keys(&config),
        config.database.fence_check_timeout,
        shutdown.clone(),
    ));

    let refusal_log = RefusalLog::start(fences.pool().clone());
    let any_https = config.routes.iter().any(|route| route.upstream.scheme_str() == Some("https"));
    let upstream_tls =
        tls::upstream_client_config(config.upstream.ca_file.as_deref(), any_https).map_err(Error::Setup)?;
    metrics::register_known(&config);
    // The control API has connections of its own: a flood of proxy writes cannot make lease
    // renewals wait for a pooled connection.
    let control_pool = fence::pool(&database, config.database.control_pool_size, config.database.fence_check_timeout)
        .map_err(Error::Setup)?;
    // Watches are woken by changes heard on a connection of their own (LISTEN fencing_watch).
    let wakeups = {
        let mut listen = database.config.clone();
        listen.application_name("fencing-gateway watch");
        fencing_election::watch::Wakeups::listen(listen, database.tls.clone(), shutdown.clone())
    };
    tokio::spawn(control::watch::report_listening(wakeups.clone(), shutdown.clone()));
    let control = control::router(ControlState {
        config: Arc::clone(&config),
        fences: Arc::clone(&fences),
        pool: control_pool,
        metrics,
        granted_terms: Arc::default(),
        readiness: Arc::default(),
        sql_refusals: Arc::default(),
        named_keys: Arc::new(metrics::named_keys(&config)),
        membership_calls: Arc::new(tokio::sync::Semaphore::new(
            config.database.control_pool_size.saturating_sub(1).max(1),
        )),
        wakeups: wakeups.clone(),
        watchers: Arc::default(),
        shutdown: shutdown.clone(),
    });
    let control_handler = control::handler(control, &config);
    let limits = Limits {
        header_read_timeout: config.proxy.header_read_timeout,
        max_header_bytes: config.proxy.max_header_bytes,
        max_connections: config.proxy.max_connections,
        write_timeout: config.proxy.write_timeout,
    };
    let grace = config.shutdown_grace;
    let acceptor = |tls: Option<&tls::ListenerTls>| -> Result<Option<tokio_rustls::TlsAcceptor>, Error> {
        tls.map(|tls| tls::server_config(tls).map(tokio_rustls::TlsAcceptor::from)).transpose().map_err(Error::Setup)
    };
    let proxy_tls = acceptor(config.proxy.tls.as_ref())?;
    let control_tls = acceptor(config.control.tls.as_ref())?;
    // Routes with `[routes.reads]`: their followers and leader, polled on the fence pool.
    // The polls outlive the shutdown signal: draining reads still go where they should.
    let reads_stop = CancellationToken::new();
    let _stop_reads = reads_stop.clone().drop_guard();
    let own: Vec<std::net::SocketAddr> =
        [&listeners.proxy, &listeners.control].iter().filter_map(|listener| listener.local_addr().ok()).collect();
    let reads = proxy::reads::start(&config.routes, &own, &fences, config.database.fence_check_timeout, &reads_stop);
    let proxy_handler = || {
        let connector = upstream::connector(config.upstream.connect_timeout, upstream_tls.clone());
        let proxy =
            Proxy::new(Arc::clone(&config), Arc::clone(&fences), connector, refusal_log.clone(), Arc::clone(&reads));
        Arc::new(proxy).handler()
    };
    let proxy_server = if config.proxy.threads == 0 {
        let serve =
            listener::serve("proxy", listeners.proxy, proxy_handler(), limits, proxy_tls, shutdown.clone(), grace);
        tokio::spawn(async move { Ok(serve.await) })
    } else {
        let handlers = (0..config.proxy.threads).map(|_| proxy_handler()).collect();
        tokio::spawn(listener::serve_on_threads(
            "proxy",
            listeners.proxy,
            handlers,
            limits,
            proxy_tls,
            shutdown.clone(),
            grace,
            config.proxy.pin_threads,
        ))
    };
    let control_server = tokio::spawn(listener::serve(
        "control",
        listeners.control,
        control_handler,
        limits,
        control_tls,
        shutdown.clone(),
        grace,
    ));
    let proxy_drained = match proxy_server.await {
        Ok(Ok(drained)) => drained,
        Ok(Err(error)) => {
            shutdown.cancel();
            let _ = control_server.await;
            return Err(Error::Setup(format!("start the proxy threads: {error}")));
        }
        Err(_) => false,
    };
    let control_drained = control_server.await.unwrap_or(false);
    Ok(proxy_drained && control_drained)
}

/// Applies the schema migrations, retrying until the database answers; `/readyz` reports 503
/// and fenced writes get 503 until then.
async fn migrate_until_done(database_url: String, shutdown: CancellationToken) {
    let mut delay = Duration::from_millis(200);
    loop {
        match migrate(&database_url).await {
            Ok(report) => {
                info!(version = report.version, applied = ?report.applied, "schema ready");
                return;
            }
            Err(Error::Schema(error @ fencing_schema::Error::SchemaTooNew { .. })) => {
                warn!(error = %error_chain(&error), "refusing to migrate; /readyz will report 503");
                return;
            }
            Err(error) => warn!(error = %error_chain(&error), ?delay, "schema not ready yet; retrying"),
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(Duration::from_secs(5));
    }
}

/// Connects to `database_url` (TLS as its `sslmode` says) and applies the pending migrations.
pub async fn migrate(database_url: &str) -> Result<MigrationReport, Error> {
    let database = Database::parse(database_url).map_err(Error::Setup)?;
    let mut client = database.connect().await.map_err(Error::Connect)?;
    Ok(fencing_schema::migrate(&mut client).await?)
}
