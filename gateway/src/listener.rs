//! The accept loop both listeners share: HTTP/1.1 with a header-read timeout (which also ends
//! idle keep-alive connections: hyper starts it as soon as a connection waits for a request
//! head), a head size limit, a connection cap answered with 503, a write timeout on every
//! connection (a slow reader cannot hold a slot for ever), and a graceful drain on shutdown.
//! The proxy listener serves its connections on threads of their own, each a single-threaded
//! runtime ([`serve_on_threads`]).
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
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio_io_timeout::TimeoutStream;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

/// Answers the requests of one connection: made once per connection, so what it holds (the
/// proxy's upstream connections, say) belongs to that connection.
pub type Connection =
    Arc<dyn Fn(Request<Incoming>) -> Pin<Box<dyn Future<Output = Response<Body>> + Send>> + Send + Sync>;

/// A listener's handler: makes each new connection's [`Connection`] from the client's address.
pub type Handler = Arc<dyn Fn(SocketAddr) -> Connection + Send + Sync>;

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

/// Serves `listener` on the current runtime until `shutdown` is cancelled, then stops
/// accepting and lets open connections finish their requests for up to `grace`. Returns whether
/// the drain finished.
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
    accept_loop(name, &listener, limits, tls.is_some(), &shutdown, |stream, remote, permit| {
        serve_connection(name, stream, remote, &handler, limits, tls.clone(), &graceful, permit);
    })
    .await;
    drop(listener);
    drain(name, graceful, grace).await
}

/// A thread with a single-threaded runtime that serves the connections handed to it.
struct Worker {
    connections: mpsc::UnboundedSender<(std::net::TcpStream, SocketAddr, Slot)>,
    /// Its open connections: the acceptor hands the next one to the least loaded thread.
    load: Arc<AtomicUsize>,
    drained: oneshot::Receiver<bool>,
}

/// A connection's place: its permit under the listener's cap, and its count on its thread.
type Slot = (OwnedSemaphorePermit, Counted);

/// One open connection in a thread's count, taken off when dropped.
struct Counted(Arc<AtomicUsize>);

impl Counted {
    fn new(load: &Arc<AtomicUsize>) -> Counted {
        load.fetch_add(1, Ordering::Relaxed);
        Counted(Arc::clone(load))
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// As [`serve`], with each connection served on one of as many threads as `handlers`, each
/// running a single-threaded runtime: a request, its upstream exchange and its answer stay on
/// one thread, with no wake-up of another worker per request. Each thread has a handler of its
/// own (so what it holds, an upstream client and its pool, belongs to that thread's runtime).
/// One accept loop on the current runtime holds the cap and hands each connection to the
/// thread with the fewest open connections. With `pin`, thread i runs only on the i-th CPU the
/// process may use.
#[allow(clippy::too_many_arguments)]
pub async fn serve_on_threads(
    name: &'static str,
    listener: TcpListener,
    handlers: Vec<Handler>,
    limits: Limits,
    tls: Option<TlsAcceptor>,
    shutdown: CancellationToken,
    grace: Duration,
    pin: bool,
) -> std::io::Result<bool> {
    let mut workers = Vec::with_capacity(handlers.len());
    let mut stopped = Vec::new();
    let cpus = if pin { crate::cpus::allowed() } else { Vec::new() };
    for (index, handler) in handlers.into_iter().enumerate() {
        let cpus = cpus.clone();
        let (connections, mut incoming) = mpsc::unbounded_channel::<(std::net::TcpStream, SocketAddr, Slot)>();
        let (done, drained) = oneshot::channel();
        let tls = tls.clone();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        std::thread::Builder::new().name(format!("{name}-{index}")).spawn(move || {
            if let Some(&cpu) = cpus.get(index % cpus.len().max(1)) {
                pin_to(name, index, cpu);
            }
            let finished = runtime.block_on(async move {
                let graceful = GracefulShutdown::new();
                while let Some((stream, remote, slot)) = incoming.recv().await {
                    match TcpStream::from_std(stream) {
                        Ok(stream) => {
                            serve_connection(name, stream, remote, &handler, limits, tls.clone(), &graceful, slot)
                        }
                        Err(error) => {
                            debug!(listener = name, %remote, %error, "connection lost on its way to a thread")
                        }
                    }
                }
                drain(name, graceful, grace).await
            });
            let _ = done.send(finished);
        })?;
        workers.push(Worker { connections, load: Arc::default(), drained });
    }
    accept_loop(name, &listener, limits, tls.is_some(), &shutdown, |stream, remote, permit| {
        let stream = match stream.into_std() {
            Ok(stream) => stream,
            Err(error) => {
                debug!(listener = name, %remote, %error, "could not hand a connection to a thread");
                return;
            }
        };
        let mut message = Some((stream, permit));
        // The least loaded thread that still serves; a thread that stopped (it cannot, short of
        // a bug) is skipped from then on, and the connection closed when none is left.
        while let Some((stream, permit)) = message.take() {
            let Some(index) = (0..workers.len()).min_by_key(|&index| workers[index].load.load(Ordering::Relaxed))
            else {
                error!(listener = name, %remote, "no proxy thread is serving; connection closed");
                return;
            };
            let slot = (permit, Counted::new(&workers[index].load));
            if let Err(returned) = workers[index].connections.send((stream, remote, slot)) {
                let (stream, _, (permit, _counted)) = returned.0;
                error!(listener = name, thread = index, "a proxy thread stopped serving; its share goes to the others");
                stopped.push(workers.swap_remove(index));
                message = Some((stream, permit));
            }
        }
    })
    .await;
    drop(listener);
    // Every thread hears the end at once (its sender dropped) and drains within the grace
    // period, all together.
    let drains: Vec<_> = workers
        .into_iter()
        .chain(stopped)
        .map(|worker| {
            drop(worker.connections);
            worker.drained
        })
        .collect();
    let mut drained = true;
    for done in drains {
        drained &= done.await.unwrap_or(false);
    }
    Ok(drained)
}

/// Keeps the calling thread on `cpu`; a failure only costs speed, so it is logged and ignored.
fn pin_to(name: &str, index: usize, cpu: usize) {
    match crate::cpus::pin_current_thread(cpu) {
        Ok(()) => debug!(listener = name, thread = index, cpu, "proxy thread pinned"),
        Err(error) => {
            warn!(listener = name, thread = index, cpu, %error, "could not pin a proxy thread; it runs unpinned")
        }
    }
}

/// Accepts connections until `shutdown` is cancelled: one over the cap is answered 503 (in
/// clear; a TLS listener closes it), every other goes to `serve` with its permit.
async fn accept_loop(
    name: &'static str,
    listener: &TcpListener,
    limits: Limits,
    tls: bool,
    shutdown: &CancellationToken,
    mut serve: impl FnMut(TcpStream, SocketAddr, OwnedSemaphorePermit),
) {
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
            if !tls {
                tokio::spawn(answer_busy(stream));
            }
            // A TLS listener never speaks plaintext, not even to say it is busy: closed.
            continue;
        };
        serve(stream, remote, permit);
    }
}

/// Serves one connection on the current runtime: TLS handshake (bounded like a request head)
/// when `tls`, then HTTP/1.1 until it closes or `graceful` drains it; `slot` is held until then.
#[allow(clippy::too_many_arguments)]
fn serve_connection<S: Send + 'static>(
    name: &'static str,
    stream: TcpStream,
    remote: SocketAddr,
    handler: &Handler,
    limits: Limits,
    tls: Option<TlsAcceptor>,
    graceful: &GracefulShutdown,
    slot: S,
) {
    let mut timed = TimeoutStream::new(stream);
    timed.set_write_timeout(Some(limits.write_timeout));
    let stream = Box::pin(timed);
    let connection = handler(remote);
    let service = service_fn(move |request| {
        let answer = connection(request);
        async move { Ok::<_, Infallible>(answer.await) }
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
    match tls {
        None => {
            let connection = watcher.watch(builder.serve_connection(TokioIo::new(stream), service));
            tokio::spawn(async move {
                let _ = connection.await;
                drop(slot);
            });
        }
        Some(acceptor) => {
            tokio::spawn(async move {
                match tokio::time::timeout(limits.header_read_timeout, acceptor.accept(stream)).await {
                    Ok(Ok(stream)) => {
                        let _ = watcher.watch(builder.serve_connection(TokioIo::new(stream), service)).await;
                    }
                    Ok(Err(error)) => {
                        debug!(listener = name, %remote, error = %crate::error_chain(&error), "TLS handshake failed");
                    }
                    Err(_) => debug!(listener = name, %remote, "TLS handshake timed out"),
                }
                drop(slot);
            });
        }
    }
}

/// Lets the connections `graceful` watches finish for up to `grace`; whether they did.
async fn drain(name: &'static str, graceful: GracefulShutdown, grace: Duration) -> bool {
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
