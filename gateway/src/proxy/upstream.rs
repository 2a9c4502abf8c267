//! Upstream connections, driven by the task of the client connection that uses them.
//!
//! Each client connection keeps at most one idle HTTP/1.1 connection per upstream
//! ([`Upstreams`], at most [`IDLE_PER_CLIENT`]). A request takes that connection (or opens
//! one), sends itself and reads the answer's head while polling the connection itself, and the
//! answer's body carries the connection ([`Streamed`]) until its end, when it goes back. No
//! task is spawned per upstream connection and no request crosses from one task to another, so
//! an exchange costs no wake-up of another task (hyper-util's pooled client sends each request
//! over a channel to the connection's own task and the answer back over another).
//!
//! A connection whose exchange does not end cleanly is dropped, never reused: at the request's
//! deadline (the caller's timeout drops the future that owns it), on an error, and when the
//! client goes away before the answer's end. Its socket is then reset (SO_LINGER 0, see
//! [`connector`]): no byte of it is sent or retransmitted later. A fenced write's deadline holds
//! after its answer's head too: an upstream may answer before it has read the request, and the
//! connection goes on sending the request while the answer streams back, so an answer still
//! streaming at the write's deadline is cut there and its connection reset (S5).

use std::future::poll_fn;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

use axum::body::Body;
use bytes::Bytes;
use http::uri::{Authority, Scheme};
use http::{HeaderValue, Request, Response, Uri};
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioIo;
use tower::ServiceExt;

/// The connector to upstreams: plain TCP whose sockets close with RST (SO_LINGER 0), so a
/// write aborted at its deadline leaves nothing in the kernel to be sent or retransmitted later.
pub type UpstreamConnector = hyper_rustls::HttpsConnector<
    tower::util::MapResponse<HttpConnector, fn(TokioIo<tokio::net::TcpStream>) -> TokioIo<tokio::net::TcpStream>>,
>;

type Io = hyper_rustls::MaybeHttpsStream<TokioIo<tokio::net::TcpStream>>;

/// Idle upstream connections one client connection keeps at most (one per upstream).
pub const IDLE_PER_CLIENT: usize = 4;

/// The largest body of a fenced write whose upstream connection is used again after its answer.
/// A larger one may still sit unsent in the kernel (or in TLS's buffer) when an upstream that
/// answered early completes its answer, and would go out later, past the write's deadline, or
/// on the connection's next use: its connection is reset at the answer's end instead. A body this
/// small leaves with its head, in the segments the upstream had to receive to answer at all.
pub const REUSE_WRITE_BODY_MAX: u64 = 1024;

/// What a fenced write's exchange must keep to (S5).
#[derive(Debug, Clone, Copy)]
pub struct WriteBound {
    /// No byte of the write after this instant: an answer still streaming then is cut.
    pub deadline: Instant,
    /// Whether the connection may be used again after the answer ([`REUSE_WRITE_BODY_MAX`]).
    pub reuse: bool,
}

fn reset_on_close(io: TokioIo<tokio::net::TcpStream>) -> TokioIo<tokio::net::TcpStream> {
    // Planted bug (fault suite, `upstream-graceful-close`): the socket closes with FIN, and
    // the kernel goes on sending a write aborted at its deadline.
    #[cfg(feature = "failpoints")]
    if fail::eval("upstream-graceful-close", |_| ()).is_some() {
        return io;
    }
    let _ = io.inner().set_zero_linger();
    io
}

/// The connector every upstream is contacted with: `http://` in clear, `https://` with rustls
/// (`tls`: the roots, SNI from the upstream's host), never one for the other. Every upstream
/// socket is reset, not closed, when the gateway drops it (SO_LINGER 0).
pub fn connector(connect_timeout: Duration, tls: rustls::ClientConfig) -> UpstreamConnector {
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(connect_timeout));
    connector.set_nodelay(true);
    // hyper-rustls decides by the scheme; plain `http://` stays plain.
    connector.enforce_http(false);
    let connector = tower::ServiceExt::map_response(
        connector,
        reset_on_close as fn(TokioIo<tokio::net::TcpStream>) -> TokioIo<tokio::net::TcpStream>,
    );
    hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(connector)
}

/// The `Host` an upstream is sent: its authority, without the scheme's default port.
pub fn host_header(upstream: &Uri) -> Option<HeaderValue> {
    let authority = upstream.authority()?;
    let default_port = if upstream.scheme() == Some(&Scheme::HTTPS) { 443 } else { 80 };
    let host = match authority.port_u16() {
        Some(port) if port != default_port => authority.as_str(),
        _ => authority.host(),
    };
    HeaderValue::from_str(host).ok()
}

/// Why an exchange failed.
#[derive(Debug)]
pub enum Failure {
    /// No connection could be made (refused, unreachable, TLS, the connect timeout).
    Connect(Box<dyn std::error::Error + Send + Sync>),
    /// The connection failed while sending the request or reading the answer's head.
    Request(hyper::Error),
}

impl Failure {
    /// The error, for its source chain.
    pub fn error(&self) -> &(dyn std::error::Error + 'static) {
        match self {
            Failure::Connect(error) => error.as_ref(),
            Failure::Request(error) => error,
        }
    }
}

/// Which upstream a connection goes to.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Key {
    https: bool,
    authority: Authority,
}

/// One upstream connection: the handle requests are sent on, and the connection itself, which
/// does its reads and writes only while polled.
struct Held {
    sender: http1::SendRequest<Body>,
    connection: Pin<Box<http1::Connection<Io, Body>>>,
    /// The connection future has returned: closed or failed.
    ended: bool,
}

impl Held {
    /// Polls the connection once, for its reads and writes; false once it has ended.
    fn drive(&mut self, cx: &mut Context<'_>) -> bool {
        if !self.ended && self.connection.as_mut().poll(cx).is_ready() {
            self.ended = true;
        }
        !self.ended
    }

    /// Whether an idle connection can take a request now (it has not been closed meanwhile).
    async fn usable(&mut self) -> bool {
        poll_fn(|cx| {
            for _ in 0..2 {
                if !self.drive(cx) {
                    return Poll::Ready(false);
                }
                match self.sender.poll_ready(cx) {
                    Poll::Ready(ready) => return Poll::Ready(ready.is_ok()),
                    Poll::Pending => {}
                }
            }
            Poll::Ready(false)
        })
        .await
    }

    /// Sends `request` and drives the connection until the answer's head; the request back
    /// when it was never sent (the connection had closed).
    async fn exchange(
        &mut self,
        request: Request<Body>,
    ) -> Result<Response<Incoming>, (hyper::Error, Option<Request<Body>>)> {
        let answer = self.sender.try_send_request(request);
        let mut answer = std::pin::pin!(answer);
        poll_fn(|cx| {
            self.drive(cx);
            answer.as_mut().poll(cx)
        })
        .await
        .map_err(|mut error| {
            let unsent = error.take_message();
            (error.into_error(), unsent)
        })
    }
}

/// The client connection a request came on: the client's address, and the connection's own
/// upstream connections.
#[derive(Debug)]
pub struct Peer {
    /// The client's address.
    pub remote: SocketAddr,
    /// The connection's own upstream connections.
    pub upstreams: Arc<Upstreams>,
}

impl Peer {
    /// A new client connection from `remote`, with no upstream connection yet.
    pub fn new(remote: SocketAddr) -> Peer {
        Peer { remote, upstreams: Arc::default() }
    }
}

/// The idle upstream connections of one client connection.
#[derive(Default)]
pub struct Upstreams {
    idle: Mutex<Vec<(Key, Held)>>,
}

impl std::fmt::Debug for Upstreams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Upstreams")
    }
}

impl Upstreams {
    fn take(&self, key: &Key) -> Option<Held> {
        let mut idle = self.idle.lock().ok()?;
        let index = idle.iter().position(|(held_for, _)| held_for == key)?;
        Some(idle.swap_remove(index).1)
    }

    fn put(&self, key: Key, held: Held) {
        if held.ended {
            return;
        }
        let Ok(mut idle) = self.idle.lock() else { return };
        if idle.len() >= IDLE_PER_CLIENT {
            idle.remove(0);
        }
        idle.push((key, held));
    }

    /// Sends `request` (origin-form, with its `Host`) to `upstream` on this client connection's
    /// connection to it, or a new one, and returns the answer once its head is in. A request
    /// that an idle connection closed before it was sent goes once more, on a new connection.
    /// The caller bounds the whole call in time; dropping it drops the connection. With a
    /// `write` bound (a fenced write's), the answer's body cuts the connection at its deadline if
    /// the exchange has not ended by then, and resets it at the answer's end unless it may be
    /// used again ([`Streamed`]).
    pub async fn send(
        self: &Arc<Self>,
        connector: &UpstreamConnector,
        upstream: &Uri,
        mut request: Request<Body>,
        write: Option<WriteBound>,
    ) -> Result<Response<Streamed>, Failure> {
        let key = Key {
            https: upstream.scheme() == Some(&Scheme::HTTPS),
            authority: upstream
                .authority()
                .cloned()
                .ok_or_else(|| Failure::Connect("the upstream has no authority".into()))?,
        };
        let mut reused = self.take(&key);
        loop {
            let mut idle = match reused.take() {
                Some(mut held) => held.usable().await.then_some(held),
                None => None,
            };
            let was_reused = idle.is_some();
            let mut held = match idle.take() {
                Some(held) => held,
                None => connect(connector, upstream).await?,
            };
            match held.exchange(request).await {
                Ok(response) => {
                    let home = Some((Arc::clone(self), key));
                    let deadline = write.map(|bound| Box::pin(tokio::time::sleep_until(bound.deadline)));
                    let reuse = write.is_none_or(|bound| bound.reuse);
                    return Ok(response.map(|body| Streamed { body, held: Some(held), home, deadline, reuse }));
                }
                Err((_, Some(unsent))) if was_reused => request = unsent,
                Err((error, _)) => return Err(Failure::Request(error)),
            }
        }
    }
}

async fn connect(connector: &UpstreamConnector, upstream: &Uri) -> Result<Held, Failure> {
    let io = connector.clone().oneshot(upstream.clone()).await.map_err(Failure::Connect)?;
    let (sender, connection) = http1::Builder::new().handshake(io).await.map_err(Failure::Request)?;
    Ok(Held { sender, connection: Box::pin(connection), ended: false })
}

/// An upstream's answer body, carrying the connection it arrives on: polling the body drives
/// the connection, and at the body's end the connection goes back to its client connection's
/// idle set. Dropped before its end, it drops the connection.
///
/// The connection it drives may still be sending the request (an upstream may answer before it
/// has read the whole request). For a fenced write, whose bytes may not reach the upstream
/// after the write's deadline (S5), the answer is cut at that deadline if the exchange has not
/// ended: the connection is dropped (its socket reset, so nothing the kernel holds goes out
/// either) and the body ends with an error. The gateway cannot tell a request that is fully out
/// from one still on its way, so this applies to any answer still streaming then.
pub struct Streamed {
    body: Incoming,
    held: Option<Held>,
    home: Option<(Arc<Upstreams>, Key)>,
    /// A fenced write's deadline, while the exchange has not ended.
    deadline: Option<Pin<Box<Sleep>>>,
    /// Whether the connection may go back to the idle set at the answer's end.
    reuse: bool,
}

impl Streamed {
    /// The answer is complete: its connection goes back to be used again, only if it is ready
    /// for a request now. One that is not (say, still sending the request's body to an upstream
    /// that answered early) is dropped: an idle connection never sends anything of an old
    /// request later, when the next request drives it.
    fn finish(&mut self) {
        if let (Some(held), Some((home, key))) = (self.held.take(), self.home.take())
            && self.reuse
            && held.sender.is_ready()
        {
            home.put(key, held);
        }
    }

    /// Drops the connection: it is never used again (an answer the gateway does not relay).
    pub fn discard(&mut self) {
        self.held = None;
    }
}

impl http_body::Body for Streamed {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        if this.held.is_some()
            && let Some(deadline) = this.deadline.as_mut()
            && deadline.as_mut().poll(cx).is_ready()
        {
            // S5: no byte of the write after its deadline; the connection may still be sending it.
            this.held = None;
            this.deadline = None;
            let cut = std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the write's forward deadline passed while its upstream exchange was unfinished: connection reset",
            );
            return Poll::Ready(Some(Err(Box::new(cut))));
        }
        if let Some(held) = this.held.as_mut() {
            held.drive(cx);
        }
        let frame = Pin::new(&mut this.body).poll_frame(cx);
        match &frame {
            Poll::Ready(None) => {
                this.finish();
                this.deadline = None;
            }
            Poll::Ready(Some(Err(_))) => this.held = None,
            _ => {}
        }
        frame.map_err(Into::into)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Streamed {
    fn drop(&mut self) {
        // An answer without a body (or whose last frame was read) is not polled to its end.
        if http_body::Body::is_end_stream(&self.body) {
            self.finish();
        }
    }
}
