//! The accept loop both listeners share: HTTP/1.1 with a header-read timeout, a head size
//! limit and a connection cap, and a graceful drain on shutdown.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// A request handler: the request and the client's address in, the response out.
pub type Handler =
    Arc<dyn Fn(Request<Incoming>, SocketAddr) -> Pin<Box<dyn Future<Output = Response<Body>> + Send>> + Send + Sync>;

/// What protects a listener from slow or greedy clients.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// A client must send its whole request head within this.
    pub header_read_timeout: Duration,
    /// The largest request head; larger ones get 431.
    pub max_header_bytes: usize,
    /// Connections held at once.
    pub max_connections: usize,
}

/// Serves `listener` until `shutdown` is cancelled, then stops accepting and lets open
/// connections finish their requests for up to `grace`. Returns whether the drain finished.
pub async fn serve(
    name: &'static str,
    listener: TcpListener,
    handler: Handler,
    limits: Limits,
    shutdown: CancellationToken,
    grace: Duration,
) -> bool {
    let graceful = GracefulShutdown::new();
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    loop {
        let permit = tokio::select! {
            () = shutdown.cancelled() => break,
            permit = Arc::clone(&permits).acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
        };
        let (stream, remote) = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    warn!(listener = name, %error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let handler = Arc::clone(&handler);
        let service = service_fn(move |request| {
            let handler = Arc::clone(&handler);
            async move { Ok::<_, Infallible>(handler(request, remote).await) }
        });
        let connection = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_read_timeout)
            .max_buf_size(limits.max_header_bytes)
            .keep_alive(true)
            .serve_connection(TokioIo::new(stream), service);
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            let _ = connection.await;
            drop(permit);
        });
    }
    drop(listener);
    info!(listener = name, ?grace, "stopped accepting; draining open connections");
    match tokio::time::timeout(grace, graceful.shutdown()).await {
        Ok(()) => {
            info!(listener = name, "drained");
            true
        }
        Err(_) => {
            warn!(listener = name, ?grace, "grace period passed with requests still open; closing them");
            false
        }
    }
}
