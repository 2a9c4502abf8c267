//! A TCP fault proxy on loopback: put it between two processes (a gateway and Postgres, a
//! gateway and an upstream, a leader and Postgres) and make the link slow, stuck, one-way,
//! or cut, on command.
//!
//! Every connection to [`FaultProxy::addr`] is forwarded to the target. The mode applies to
//! every byte not yet forwarded: [`Mode::Delay`] holds each piece for a while (in order),
//! [`Mode::Hold`] holds everything until the mode changes (then releases it in order),
//! [`Mode::OneWay`] holds one direction only. What happens to bytes held or delayed when their
//! sender closes or resets the connection depends on the link ([`OnClose`]): on a link to an
//! upstream, a reset loses them and a close delivers them; on the Postgres links, a delayed piece
//! is always delivered and a held one is lost.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{broadcast, mpsc, watch};
use tokio::task::JoinHandle;

/// How the proxy treats bytes not yet forwarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Forward at once.
    Pass,
    /// Hold each piece this long before forwarding it.
    Delay(Duration),
    /// Forward nothing until the mode changes.
    Hold,
    /// Forward only in this direction; hold the other.
    OneWay(Direction),
}

/// A direction of a proxied connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// From the connecting side to the target.
    ToTarget,
    /// From the target back to the connecting side.
    FromTarget,
}

/// What a proxy does with the bytes it holds when their sender closes its side (FIN).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnClose {
    /// Delivers them once the mode lets them go, as a kernel sends what was written before a
    /// close (the links to upstreams: a write a gateway closed instead of resetting at its
    /// deadline still arrives).
    Deliver,
    /// Loses them.
    Drop,
}

#[derive(Debug, Clone, Copy)]
enum Cut {
    Close,
    Reset,
}

/// A running fault proxy; dropping it stops it and closes its connections.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    mode: watch::Sender<Mode>,
    target: watch::Sender<SocketAddr>,
    cuts: broadcast::Sender<Cut>,
    accept: JoinHandle<()>,
}

impl FaultProxy {
    /// Starts a proxy on a free loopback port that forwards to `target`, losing the bytes it
    /// holds when their sender closes ([`OnClose::Drop`]).
    pub async fn start(target: SocketAddr) -> std::io::Result<FaultProxy> {
        FaultProxy::start_with(target, OnClose::Drop).await
    }

    /// Starts a proxy on a free loopback port that forwards to `target`.
    pub async fn start_with(target: SocketAddr, on_close: OnClose) -> std::io::Result<FaultProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (mode, _) = watch::channel(Mode::Pass);
        let (cuts, _) = broadcast::channel(16);
        let (target, _) = watch::channel(target);
        let accept = tokio::spawn(accept_loop(listener, target.subscribe(), mode.subscribe(), cuts.clone(), on_close));
        Ok(FaultProxy { addr, mode, target, cuts, accept })
    }

    /// Where to connect instead of the target.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Sets the mode for every byte not yet forwarded, on every connection.
    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }

    /// Sends new connections to `target` from now on (a failover's new primary); open ones stay
    /// where they are.
    pub fn retarget(&self, target: SocketAddr) {
        self.target.send_replace(target);
    }

    /// Closes every open connection (FIN both ways); new ones are accepted as usual.
    pub fn drop_all(&self) {
        let _ = self.cuts.send(Cut::Close);
    }

    /// Resets every open connection (RST both ways); new ones are accepted as usual.
    pub fn reset_all(&self) {
        let _ = self.cuts.send(Cut::Reset);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept.abort();
        let _ = self.cuts.send(Cut::Reset);
    }
}

async fn accept_loop(
    listener: TcpListener,
    target: watch::Receiver<SocketAddr>,
    mode: watch::Receiver<Mode>,
    cuts: broadcast::Sender<Cut>,
    on_close: OnClose,
) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let mode = mode.clone();
        let cut = cuts.subscribe();
        let target = *target.borrow();
        tokio::spawn(async move {
            let Ok(server) = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(target)).await else {
                let _ = client.set_zero_linger();
                return;
            };
            let Ok(server) = server else {
                let _ = client.set_zero_linger();
                return;
            };
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            proxy_connection(client, server, mode, cut, on_close).await;
        });
    }
}

async fn proxy_connection(
    client: TcpStream,
    server: TcpStream,
    mode: watch::Receiver<Mode>,
    mut cut: broadcast::Receiver<Cut>,
    on_close: OnClose,
) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let received = {
        let up = pump(&mut client_read, &mut server_write, mode.clone(), Direction::ToTarget, on_close);
        let down = pump(&mut server_read, &mut client_write, mode, Direction::FromTarget, on_close);
        tokio::select! {
            received = cut.recv() => received.ok(),
            _ = async { tokio::join!(up, down) } => None,
        }
    };
    if let Some(Cut::Reset) = received {
        let _ = client_read.as_ref().set_zero_linger();
        let _ = server_read.as_ref().set_zero_linger();
    }
}

/// How the sender of a direction ended: not yet, with FIN, or with RST.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Open,
    Closed,
    Reset,
}

/// Copies one direction, honouring the mode before every piece it forwards. The proxy reads
/// eagerly. On a link to an upstream ([`OnClose::Deliver`]) what it holds or delays plays the
/// part of what the sender's kernel has not sent yet: a reset by the sender (a gateway aborting
/// a write at its deadline) loses it, as SO_LINGER 0 does, and a close (FIN) delivers it when the
/// mode lets it go. On the Postgres links ([`OnClose::Drop`]) a delayed piece is in flight and
/// always delivered, and a held one is lost when its sender closes or resets.
async fn pump(
    from: &mut OwnedReadHalf,
    to: &mut OwnedWriteHalf,
    mut mode: watch::Receiver<Mode>,
    direction: Direction,
    on_close: OnClose,
) {
    let (pieces, mut queue) = mpsc::unbounded_channel::<Vec<u8>>();
    let (end_tx, mut end) = watch::channel(End::Open);
    let reader = async {
        let mut buffer = vec![0_u8; 16 * 1024];
        loop {
            match from.read(&mut buffer).await {
                Ok(0) => {
                    end_tx.send_replace(End::Closed);
                    break;
                }
                Err(_) => {
                    end_tx.send_replace(End::Reset);
                    break;
                }
                Ok(read) => {
                    if pieces.send(buffer[..read].to_vec()).is_err() {
                        break;
                    }
                }
            }
        }
        drop(pieces);
        // The writer decides when this direction is over.
        std::future::pending::<()>().await;
    };
    let writer = async {
        if forward(&mut queue, to, &mut mode, &mut end, direction, on_close).await == End::Reset {
            // What the sender reset is reset on the other side too: a FIN now, and a RST when the
            // socket is closed, once the other direction has ended as well.
            let _ = to.as_ref().set_zero_linger();
        }
        let _ = to.shutdown().await;
    };
    tokio::select! {
        () = reader => {}
        () = writer => {}
    }
}

/// Forwards the pieces of one direction as the mode lets them go, until the sender's end or a
/// failed write; how the sender ended, as far as this direction goes.
async fn forward(
    queue: &mut mpsc::UnboundedReceiver<Vec<u8>>,
    to: &mut OwnedWriteHalf,
    mode: &mut watch::Receiver<Mode>,
    end: &mut watch::Receiver<End>,
    direction: Direction,
    on_close: OnClose,
) -> End {
    while let Some(mut pending) = queue.recv().await {
        while let Ok(more) = queue.try_recv() {
            pending.extend_from_slice(&more);
        }
        loop {
            let ended = *end.borrow_and_update();
            if ended == End::Reset {
                return End::Reset;
            }
            let current = *mode.borrow_and_update();
            match current {
                Mode::Pass => break,
                Mode::OneWay(open) if open == direction => break,
                // A delayed piece is in flight on a Postgres link (delivered whatever its sender
                // does next, as before), in the sender's kernel on an upstream link.
                Mode::Delay(delay) if on_close == OnClose::Drop => {
                    tokio::time::sleep(delay).await;
                    break;
                }
                Mode::Delay(delay) => {
                    let until = tokio::time::Instant::now() + delay;
                    loop {
                        tokio::select! {
                            () = tokio::time::sleep_until(until) => break,
                            changed = end.changed() => {
                                if changed.is_err() {
                                    return End::Open;
                                }
                                if *end.borrow_and_update() == End::Reset {
                                    return End::Reset;
                                }
                            }
                        }
                    }
                    break;
                }
                Mode::Hold | Mode::OneWay(_) => {
                    if ended == End::Closed && on_close == OnClose::Drop {
                        return End::Closed;
                    }
                    tokio::select! {
                        changed = mode.changed() => {
                            if changed.is_err() {
                                return End::Open;
                            }
                        }
                        changed = end.changed() => {
                            if changed.is_err() {
                                return End::Open;
                            }
                        }
                    }
                }
            }
        }
        if to.write_all(&pending).await.is_err() {
            return End::Open;
        }
    }
    *end.borrow()
}

/// A shared handle on a proxy, for the injector.
pub type SharedProxy = Arc<FaultProxy>;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// What an upstream link's proxy holds when its sender closes is delivered once the hold
    /// ends; what it holds when its sender resets is lost.
    #[tokio::test]
    async fn an_upstream_link_delivers_held_bytes_after_a_close_and_loses_them_after_a_reset() {
        for reset in [false, true] {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let proxy = FaultProxy::start_with(listener.local_addr().unwrap(), OnClose::Deliver).await.unwrap();
            proxy.set(Mode::Hold);
            let mut sender = TcpStream::connect(proxy.addr()).await.unwrap();
            let (mut receiver, _) = listener.accept().await.unwrap();
            sender.write_all(b"held bytes").await.unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
            if reset {
                sender.set_zero_linger().unwrap();
            }
            drop(sender);
            tokio::time::sleep(Duration::from_millis(100)).await;
            proxy.set(Mode::Pass);
            let mut got = Vec::new();
            let _ = tokio::time::timeout(Duration::from_secs(2), receiver.read_to_end(&mut got)).await;
            if reset {
                assert!(got.is_empty(), "bytes held when the sender reset were delivered: {got:?}");
            } else {
                assert_eq!(got, b"held bytes", "bytes held when the sender closed were not delivered");
            }
        }
    }
}
