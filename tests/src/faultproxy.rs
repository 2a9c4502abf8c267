//! A TCP fault proxy on loopback: put it between two processes (a gateway and Postgres, a
//! gateway and an upstream, a leader and Postgres) and make the link slow, stuck, one-way,
//! or cut, on command.
//!
//! Every connection to [`FaultProxy::addr`] is forwarded to the target. The mode applies to
//! every byte not yet forwarded: [`Mode::Delay`] holds each piece for a while (in order),
//! [`Mode::Hold`] holds everything until the mode changes (then releases it in order),
//! [`Mode::OneWay`] holds one direction only. Bytes held when their sender closes or resets
//! the connection are lost, never delivered later. [`FaultProxy::drop_all`] closes every open
//! connection; [`FaultProxy::reset_all`] resets them (RST, nothing more delivered).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{broadcast, watch};
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
    /// Starts a proxy on a free loopback port that forwards to `target`.
    pub async fn start(target: SocketAddr) -> std::io::Result<FaultProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (mode, _) = watch::channel(Mode::Pass);
        let (cuts, _) = broadcast::channel(16);
        let (target, _) = watch::channel(target);
        let accept = tokio::spawn(accept_loop(listener, target.subscribe(), mode.subscribe(), cuts.clone()));
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
            proxy_connection(client, server, mode, cut).await;
        });
    }
}

async fn proxy_connection(
    client: TcpStream,
    server: TcpStream,
    mode: watch::Receiver<Mode>,
    mut cut: broadcast::Receiver<Cut>,
) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let received = {
        let up = pump(&mut client_read, &mut server_write, mode.clone(), Direction::ToTarget);
        let down = pump(&mut server_read, &mut client_write, mode, Direction::FromTarget);
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

/// Copies one direction, honouring the mode before every piece it forwards.
async fn pump(
    from: &mut OwnedReadHalf,
    to: &mut OwnedWriteHalf,
    mut mode: watch::Receiver<Mode>,
    direction: Direction,
) {
    let mut buffer = vec![0_u8; 16 * 1024];
    loop {
        let read = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => {
                let _ = to.shutdown().await;
                return;
            }
            Ok(read) => read,
        };
        let mut pending = buffer[..read].to_vec();
        loop {
            let current = *mode.borrow_and_update();
            match current {
                Mode::Pass => break,
                Mode::Delay(delay) => {
                    tokio::time::sleep(delay).await;
                    break;
                }
                Mode::OneWay(open) if open == direction => break,
                Mode::Hold | Mode::OneWay(_) => {
                    // Held: the sender may reset the connection meanwhile (a gateway aborting a
                    // write at its deadline). Bytes held then are lost, as a reset loses what the
                    // sender's kernel had not sent: a hold delays, it never delivers bytes the
                    // sender took back.
                    let mut more = vec![0_u8; 16 * 1024];
                    tokio::select! {
                        changed = mode.changed() => {
                            if changed.is_err() {
                                return;
                            }
                        }
                        read = from.read(&mut more) => match read {
                            Ok(0) | Err(_) => return,
                            Ok(n) => pending.extend_from_slice(&more[..n]),
                        },
                    }
                }
            }
        }
        if to.write_all(&pending).await.is_err() {
            return;
        }
    }
}

/// A shared handle on a proxy, for the injector.
pub type SharedProxy = Arc<FaultProxy>;
