//! The fencing gateway: an HTTP proxy that every leader write passes through, which admits a
//! write only when its term is current for the resource it changes, and a control API.
//!
//! # Layout
//!
//! - [`auth`]: clients, bearer tokens and what each client may do.
//! - [`config`]: the configuration file and its environment overrides, checked in one place.
//! - [`proxy`]: the proxy listener's handler: route, decide, settle, forward, stream back.
//! - [`fence`]: the fence decision, one prepared call of `fencing.gate` per write.
//! - [`control`]: the control listener: lease API, fences, metrics, health.
//! - [`tls`]: rustls for the listeners, `https://` upstreams and Postgres (`sslmode`).
//! - [`server`]: the accept loop both listeners share (timeouts, limits, graceful drain).
//! - [`refusals`]: the background record of refused writes in `fencing.refusals`.
//! - [`problem`]: every response the gateway makes itself, as problem+json.
//! - [`metrics`]: metric names and help.
//! - [`lease_view`]: the gateway's own view of each configured lease, as metrics.
//! - [`demo`]: `fencing-gateway demo`, the whole story in one command.
//! - [`embedded`]: the private local Postgres started when no database URL is configured.
//! - [`inspect`]: `fencing-gateway inspect` and `admin`.
//! - [`migrate`]: `fencing-gateway migrate`.
//! - [`cli`]: the command line.

pub mod auth;
pub mod cli;
pub mod config;
pub mod control;
pub mod demo;
pub mod embedded;
mod error;
pub mod fence;
pub mod inspect;
pub mod lease_view;
pub mod metrics;
pub mod migrate;
pub mod problem;
pub mod proxy;
pub mod refusals;
pub mod server;
pub mod tls;
pub mod upstream;

use std::sync::Arc;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

pub use error::Error;

use crate::config::Config;
use crate::control::ControlState;
use crate::fence::FenceStore;
use crate::proxy::Proxy;
use crate::server::{Handler, Limits};

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
    let database = tls::Database::parse(database_url).map_err(Error::Setup)?;
    let pool = fence::pool(&database, config.database.pool_size).map_err(Error::Setup)?;
    let fences = Arc::new(FenceStore::new(
        pool,
        database.clone(),
        config.database.fence_check_timeout,
        config.upstream.forward_timeout,
        config.database.max_batches_in_flight,
        config.database.grant,
        config.upstream.settle_margin,
    ));
    tokio::spawn(migrate_until_done(database_url.to_owned(), shutdown.clone()));
    tokio::spawn(lease_view::watch(
        fences.pool().clone(),
        metrics::named_keys(&config),
        config.database.fence_check_timeout,
        shutdown.clone(),
    ));

    let refusal_log = refusals::RefusalLog::start(fences.pool().clone());
    let any_https = config.routes.iter().any(|route| route.upstream.scheme_str() == Some("https"));
    let upstream_tls =
        tls::upstream_client_config(config.upstream.ca_file.as_deref(), any_https).map_err(Error::Setup)?;
    metrics::register_known(&config);
    // The control API has connections of its own: a flood of proxy writes cannot make lease
    // renewals wait for a pooled connection.
    let control_pool = fence::pool(&database, config.database.control_pool_size).map_err(Error::Setup)?;
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
    });
    let body_read_timeout = config.proxy.body_read_timeout;
    let clients = config.clients.clone();
    let control_hosts = Arc::new(config.control.hosts.clone());
    let control_handler: Handler = Arc::new(move |request, _peer| {
        let control = control.clone();
        let clients = clients.clone();
        let control_hosts = Arc::clone(&control_hosts);
        Box::pin(async move {
            use tower::ServiceExt;
            // Who it is first (a client without a valid token sends no body to anyone), then
            // the whole body, bounded in size and in time.
            if let Err(problem) = auth::check_host(request.headers(), request.version(), &control_hosts) {
                return problem.into_response();
            }
            let path = request.uri().path();
            if path != "/healthz"
                && path != "/readyz"
                && let Err(reason) = clients.authenticate(request.headers())
            {
                return problem::unauthenticated(reason).into_response();
            }
            let (parts, body) = request.into_parts();
            let body = match control::read_body(body, body_read_timeout).await {
                Ok(body) => body,
                Err(problem) => return problem.into_response(),
            };
            let request = http::Request::from_parts(parts, axum::body::Body::from(body));
            match control.oneshot(request).await {
                Ok(response) => response,
                Err(infallible) => match infallible {},
            }
        })
    });
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
    let proxy_handler = || -> Handler {
        let proxy = Arc::new(Proxy::new(
            Arc::clone(&config),
            Arc::clone(&fences),
            upstream::connector(config.upstream.connect_timeout, upstream_tls.clone()),
            refusal_log.clone(),
        ));
        Arc::new(move |request, peer| Box::pin(Arc::clone(&proxy).handle(request, peer)))
    };
    let proxy_server = if config.proxy.threads == 0 {
        let serve =
            server::serve("proxy", listeners.proxy, proxy_handler(), limits, proxy_tls, shutdown.clone(), grace);
        tokio::spawn(async move { Ok(serve.await) })
    } else {
        let handlers = (0..config.proxy.threads).map(|_| proxy_handler()).collect();
        tokio::spawn(server::serve_on_threads(
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
    let control_server = tokio::spawn(server::serve(
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
        match migrate::run(&database_url).await {
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

/// An error and its sources on one line (`a: b: c`), for logs and messages: a failed TLS
/// handshake says why, not only that it failed.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.ends_with(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}
