//! The accept loop both listeners share: HTTP/1.1 with a header-read timeout (which also ends
//! idle keep-alive connections: hyper starts it as soon as a connection waits for a request
//! head), a head size limit, a connection cap answered with 503, a write timeout on every
//! connection (a slow reader cannot hold a slot for ever), and a graceful drain on shutdown.
//! There is no read timeout while a request is in flight: hyper keeps a read pending then, and
//! bodies have timeouts of their own.

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
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_io_timeout::TimeoutStream;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

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
    /// Connections held at once; one more is answered 503 and closed.
    pub max_connections: usize,
    /// A write to the client that cannot proceed for this long closes the connection (slow
    /// readers).
    pub write_timeout: Duration,
}

/// Serves `listener` until `shutdown` is cancelled, then stops accepting and lets open
/// connections finish their requests for up to `grace`. Returns whether the drain finished.
pub async fn serve(
    name: &'static str,
    listener: TcpListener,
    handler: Handler,
    limits: Limits,
    tls: Option<TlsAcceptor>,
    shutdown: CancellationToken,
    grace: Duration,
) -> bool {
    let graceful = GracefulShutdown::new();
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    loop {
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
        let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
            metrics::counter!(crate::metrics::CONNECTIONS_REFUSED, "listener" => name).increment(1);
            if tls.is_none() {
                tokio::spawn(answer_busy(stream));
            }
            // A TLS listener never speaks plaintext, not even to say it is busy: closed.
            continue;
        };
        let mut timed = TimeoutStream::new(stream);
        timed.set_write_timeout(Some(limits.write_timeout));
        let stream = Box::pin(timed);
        let handler = Arc::clone(&handler);
        let service = service_fn(move |request| {
            let handler = Arc::clone(&handler);
            async move { Ok::<_, Infallible>(handler(request, remote).await) }
        });
        let builder = {
            let mut builder = http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout)
                .max_buf_size(limits.max_header_bytes)
                .keep_alive(true);
            builder
        };
        let watcher = graceful.watcher();
        match &tls {
            None => {
                let connection = watcher.watch(builder.serve_connection(TokioIo::new(stream), service));
                tokio::spawn(async move {
                    let _ = connection.await;
                    drop(permit);
                });
            }
            Some(acceptor) => {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    // The handshake is bounded like a request head.
                    match tokio::time::timeout(limits.header_read_timeout, acceptor.accept(stream)).await {
                        Ok(Ok(stream)) => {
                            let _ = watcher.watch(builder.serve_connection(TokioIo::new(stream), service)).await;
                        }
                        Ok(Err(error)) => {
                            debug!(listener = name, %remote, error = %crate::error_chain(&error), "TLS handshake failed");
                        }
                        Err(_) => debug!(listener = name, %remote, "TLS handshake timed out"),
                    }
                    drop(permit);
                });
            }
        }
    }
    drop(listener);
    info!(listener = name, ?grace, "stopped accepting; draining open connections");
    // Connections still open hold their permits; a closed semaphore ends nothing early.
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

/// The answer to a connection over the cap: 503 with Retry-After, then close, bounded in time.
async fn answer_busy(mut stream: TcpStream) {
    const BODY: &str = r#"{"type":"urn:fencing-gateway:problem:too-many-connections","title":"Too many connections","status":503,"detail":"the listener holds its maximum of connections; retry later"}"#;
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/problem+json\r\nretry-after: 1\r\n\
         connection: close\r\ncontent-length: {}\r\n\r\n{BODY}",
        BODY.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = stream.write_all(response.as_bytes()).await;
        let _ = stream.shutdown().await;
    })
    .await;
}
