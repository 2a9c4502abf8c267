//! Watch: wait for a lease or a cluster's members to change, instead of polling.
//!
//! Every change has a revision (schema version 13): a new term, a holder, a value, a release,
//! an expiry of a lease; a join, a leave, a change or an expiry of a node. A read returns the
//! state with its revision; [`wait_for_change`] returns as soon as the revision differs from the
//! one the caller last saw, so no change is ever missed, though several may coalesce into one
//! answer.
//!
//! What wakes a waiting watcher, whichever comes first:
//! - a wake-up from [`Wakeups`]: every change notifies Postgres channel `fencing_watch` when it
//!   commits, whichever process made it, and [`Wakeups::listen`] hears it on its own connection;
//! - the instant the state ends by the store's clock (a lease's expiry, a node's), which writes
//!   nothing;
//! - the poll: every [`POLL_LISTENING`] while the listening connection is up, every
//!   [`POLL_NOT_LISTENING`] while it is down or with [`Wakeups::polling`]. A lost wake-up (the
//!   connection dropped) only delays an answer: the reconnected listener wakes every watcher.
//!
//! [`LeaseWatch`] and [`MembersWatch`] give the same as streams of states in revision order,
//! each read bounded by a timeout (the HTTP API's `?wait=&after=` uses the same
//! [`wait_for_change`]).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use deadpool_postgres::Pool;
use fencing_schema::store::{self, LeaseState, Member};
use futures::future::BoxFuture;
use tokio::sync::broadcast;
use tokio::time::{Instant, sleep_until, timeout};
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{AsyncMessage, Socket};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

use crate::error::Error;
use crate::runtime::read_within;

/// The Postgres channel every change notifies (schema/functions/watch.sql).
pub const CHANNEL: &str = "fencing_watch";

/// How often a waiting watcher reads again while the listening connection is up: wake-ups
/// are then reliable, the poll only a guard.
pub const POLL_LISTENING: Duration = Duration::from_secs(10);

/// How often a waiting watcher reads again without a listening connection.
pub const POLL_NOT_LISTENING: Duration = Duration::from_secs(1);

/// How long the listener waits for its connection, and for its liveness probe.
const LISTEN_TIMEOUT: Duration = Duration::from_secs(5);

/// How often the listener probes its connection: a connection cut without a word (a dead
/// host) is found within this plus [`LISTEN_TIMEOUT`].
const PROBE_EVERY: Duration = Duration::from_secs(10);

/// A margin past a store-clock expiry before reading again: the store rounds the time left down,
/// and watchers of one state spread their reads over up to twice this.
const EXPIRY_MARGIN: Duration = Duration::from_millis(10);

/// What wakes watchers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wake {
    /// This topic changed: `lease:<key>` or `nodes:<cluster>`.
    Topic(Arc<str>),
    /// Anything may have changed (the listener reconnected after missing wake-ups).
    All,
}

/// The topic of a lease's changes.
pub fn lease_topic(key: &str) -> String {
    format!("lease:{key}")
}

/// The topic of a cluster's members' changes.
pub fn nodes_topic(cluster: &str) -> String {
    format!("nodes:{cluster}")
}

/// Wake-ups for watchers: from a connection that listens on [`CHANNEL`], or none (polling).
/// Cheap to clone; one per process is enough for any number of watchers.
#[derive(Debug, Clone)]
pub struct Wakeups {
    sender: broadcast::Sender<Wake>,
    listening: Arc<AtomicBool>,
}

impl Wakeups {
    /// No wake-ups: watchers read every [`POLL_NOT_LISTENING`] and at each expiry.
    pub fn polling() -> Wakeups {
        let (sender, _) = broadcast::channel(1);
        Wakeups { sender, listening: Arc::new(AtomicBool::new(false)) }
    }

    /// Listens on [`CHANNEL`] on a connection of its own to `config` (reconnecting with backoff
    /// while it cannot), until `shutdown`. Must be called inside a Tokio runtime.
    pub fn listen<T>(config: tokio_postgres::Config, tls: T, shutdown: CancellationToken) -> Wakeups
    where
        T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
        T::Stream: Send + 'static,
        T::TlsConnect: Send,
        <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
    {
        let (sender, _) = broadcast::channel(1024);
        let wakeups = Wakeups { sender, listening: Arc::new(AtomicBool::new(false)) };
        tokio::spawn(listen_loop(config, tls, wakeups.clone(), shutdown));
        wakeups
    }

    /// Whether the listening connection is up now.
    pub fn listening(&self) -> bool {
        self.listening.load(Ordering::SeqCst)
    }

    /// Subscribes before a read: a wake-up sent after this is never missed.
    pub fn subscribe(&self) -> broadcast::Receiver<Wake> {
        self.sender.subscribe()
    }

    fn poll_interval(&self) -> Duration {
        if self.listening() { POLL_LISTENING } else { POLL_NOT_LISTENING }
    }
}

async fn listen_loop<T>(config: tokio_postgres::Config, tls: T, wakeups: Wakeups, shutdown: CancellationToken)
where
    T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
    T::Stream: Send + 'static,
    T::TlsConnect: Send,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
    let mut failures: u32 = 0;
    loop {
        let ended = tokio::select! {
            () = shutdown.cancelled() => return,
            ended = listen_once(&config, tls.clone(), &wakeups) => ended,
        };
        wakeups.listening.store(false, Ordering::SeqCst);
        // Only a connection that lived a while resets the backoff: one that dies at once (a
        // proxy that drops it, an idle timeout) is retried ever more slowly, not every 200 ms.
        if ended.lasted >= PROBE_EVERY {
            failures = 0;
        }
        failures = failures.saturating_add(1);
        let backoff =
            Duration::from_millis(100).saturating_mul(2u32.saturating_pow(failures.min(6))).min(LISTEN_TIMEOUT);
        debug!(reason = %ended.reason, ?backoff, "watch: listening connection ended");
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(backoff) => {}
        }
    }
}

struct Ended {
    /// How long it listened.
    lasted: Duration,
    reason: String,
}

async fn listen_once<T>(config: &tokio_postgres::Config, tls: T, wakeups: &Wakeups) -> Ended
where
    T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
    T::Stream: Send + 'static,
    T::TlsConnect: Send,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
    let started = Instant::now();
    let ended =
        |heard: bool, reason: String| Ended { lasted: if heard { started.elapsed() } else { Duration::ZERO }, reason };
    let (client, mut connection) = match timeout(LISTEN_TIMEOUT, config.connect(tls)).await {
        Ok(Ok(pair)) => pair,
        Ok(Err(error)) => return ended(false, format!("connect: {error}")),
        Err(_) => return ended(false, "connect: timed out".to_owned()),
    };
    let sender = wakeups.sender.clone();
    // The connection's messages, on a task of their own: notifications to the watchers.
    let messages = tokio::spawn(async move {
        loop {
            match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                Some(Ok(AsyncMessage::Notification(notification))) => {
                    if notification.channel() == CHANNEL {
                        // No watcher at all is no error.
                        let _ = sender.send(Wake::Topic(Arc::from(notification.payload())));
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(error)) => return format!("connection: {error}"),
                None => return "connection closed".to_owned(),
            }
        }
    });
    let mut messages = AbortOnDrop(messages);
    match timeout(LISTEN_TIMEOUT, client.batch_execute(&format!("LISTEN {CHANNEL}"))).await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => return ended(false, format!("LISTEN: {error}")),
        Err(_) => return ended(false, "LISTEN: timed out".to_owned()),
    }
    wakeups.listening.store(true, Ordering::SeqCst);
    // Changes made while no connection listened were heard by nobody: every watcher reads again.
    let _ = wakeups.sender.send(Wake::All);
    info!("watch: listening for changes");
    // Returning drops the connection's task, and with it the connection.
    loop {
        tokio::select! {
            reason = &mut messages.0 => {
                return ended(true, reason.unwrap_or_else(|error| format!("listener task: {error}")));
            }
            () = tokio::time::sleep(PROBE_EVERY) => {
                match timeout(LISTEN_TIMEOUT, client.simple_query("SELECT 1")).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(error)) => return ended(true, format!("probe: {error}")),
                    Err(_) => return ended(true, "probe: timed out".to_owned()),
                }
            }
        }
    }
}

/// Aborts the task when dropped (an early return leaves no task behind).
struct AbortOnDrop(tokio::task::JoinHandle<String>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Returns when `receiver` hears a change of `topic` (or may have missed one); never without a
/// receiver, or once its sender is gone.
pub(crate) async fn changed(receiver: Option<&mut broadcast::Receiver<Wake>>, topic: &str) {
    let Some(receiver) = receiver else {
        return std::future::pending().await;
    };
    loop {
        match receiver.recv().await {
            Ok(Wake::Topic(changed)) if &*changed != topic => {}
            Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => return,
            Err(broadcast::error::RecvError::Closed) => return std::future::pending().await,
        }
    }
}

/// A state read with its revision.
#[derive(Debug, Clone, PartialEq)]
pub struct Observed<T> {
    /// The state's revision: differs from an earlier read's exactly when the state changed.
    pub revision: i64,
    /// How long until the state changes by the store's clock alone (an expiry), if it will.
    pub next_expiry: Option<Duration>,
    /// The state.
    pub state: T,
}

/// Reads with `read` until the revision differs from `after` (at once when `after` is `None`)
/// or `until` passes, then returns the last read. Between reads it waits for a wake-up of
/// `topic`, the state's next expiry, or the poll. The first error of `read` is returned.
pub async fn wait_for_change<T, E, F, Fut>(
    wakeups: &Wakeups,
    topic: &str,
    after: Option<i64>,
    until: Instant,
    mut read: F,
) -> Result<Observed<T>, E>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Observed<T>, E>>,
{
    loop {
        let mut wakes = wakeups.subscribe();
        let observed = read().await?;
        let now = Instant::now();
        if after != Some(observed.revision) || now >= until {
            return Ok(observed);
        }
        // Watchers of one state do not all read at the same instant.
        let spread = EXPIRY_MARGIN.mul_f64(rand::random::<f64>());
        let mut wake_at = until.min(now + wakeups.poll_interval() + spread);
        if let Some(expiry) = observed.next_expiry {
            wake_at = wake_at.min(now + expiry + EXPIRY_MARGIN + spread);
        }
        let mut closed = false;
        loop {
            tokio::select! {
                () = sleep_until(wake_at) => break,
                wake = wakes.recv(), if !closed => match wake {
                    Ok(Wake::Topic(changed)) if &*changed != topic => {}
                    // This topic, every topic, or wake-ups lost to a full queue: read again.
                    Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => break,
                    Err(broadcast::error::RecvError::Closed) => closed = true,
                },
            }
        }
    }
}

/// Reads a lease's state and revision through `pool` within `limit`. A connection whose read
/// failed or timed out leaves the pool.
pub async fn read_lease(pool: &Pool, key: &str, limit: Duration) -> Result<Observed<Option<LeaseState>>, Error> {
    read_within(pool, limit, key, async |client| store::observe_lease(client, key).await).await.map(lease_observed)
}

/// A lease row as a watcher sees it: revision 0 for a key never acquired; the next expiry while
/// it is held.
pub fn lease_observed(row: Option<LeaseState>) -> Observed<Option<LeaseState>> {
    let revision = row.as_ref().map_or(0, |row| row.revision);
    let next_expiry = row.as_ref().map(|row| row.lease.remaining).filter(|remaining| !remaining.is_zero());
    // A lease with under a millisecond left reads as 0 ms left yet not ended: read again soon.
    let next_expiry = match (&row, next_expiry) {
        (Some(row), None) if row.revision % 2 == 0 => Some(Duration::ZERO),
        (_, next_expiry) => next_expiry,
    };
    Observed { revision, next_expiry, state: row }
}

/// Reads a cluster's members and their revision through `pool` within `limit`, in one call
/// (`fencing.observe_members`): the members live at the instant the revision is of, so a change
/// shows as a later revision, never a missed one.
pub async fn read_members(pool: &Pool, cluster: &str, limit: Duration) -> Result<Observed<Vec<Member>>, Error> {
    read_within(pool, limit, &format!("cluster {cluster}"), async |client| {
        let (revision, members) = store::observe_members(client, cluster).await?;
        Ok(Observed { revision: revision.revision, next_expiry: revision.next_expiry, state: members })
    })
    .await
}

/// How long a failed read waits before the next, in the streams.
const RETRY_AFTER_ERROR: Duration = Duration::from_secs(1);

/// One read of what a [`Watch`] watches: through `pool`, of the lease key or cluster named,
/// within the time limit.
type Reader<T> = for<'a> fn(&'a Pool, &'a str, Duration) -> BoxFuture<'a, Result<Observed<T>, Error>>;

/// States of a lease ([`LeaseWatch`]) or of a cluster's members ([`MembersWatch`]), each
/// differing from the one before, in revision order.
///
/// ```no_run
/// # async fn example(pool: deadpool_postgres::Pool) {
/// use fencing_election::watch::{LeaseWatch, Wakeups};
/// let mut watch = LeaseWatch::new(pool, "billing-reconciler", Wakeups::polling());
/// while let Ok(state) = watch.next().await {
///     match state.state.map(|state| state.lease) {
///         Some(lease) if !lease.remaining.is_zero() => println!("term {} led by {}", lease.term, lease.owner),
///         _ => println!("nobody leads"),
///     }
/// }
/// # }
/// ```
pub struct Watch<T> {
    pool: Pool,
    name: String,
    topic: String,
    wakeups: Wakeups,
    read_timeout: Duration,
    last: Option<i64>,
    failed: bool,
    read: Reader<T>,
}

impl<T> std::fmt::Debug for Watch<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch").field("topic", &self.topic).field("last", &self.last).finish_non_exhaustive()
    }
}

/// A lease's states, each differing from the one before (a new term, a holder, a value, a
/// handover request, a release, an expiry).
pub type LeaseWatch = Watch<Option<LeaseState>>;

/// A cluster's live members, each list differing from the one before (a join, a leave, a
/// change of a node's name or metadata, an expiry).
pub type MembersWatch = Watch<Vec<Member>>;

impl LeaseWatch {
    /// Watches `key` through `pool`, woken by `wakeups` ([`Wakeups::polling`] for none); each
    /// read has 5 s.
    pub fn new(pool: Pool, key: impl Into<String>, wakeups: Wakeups) -> LeaseWatch {
        let key = key.into();
        Watch::with_reader(pool, lease_topic(&key), key, wakeups, |pool, key, limit| {
            Box::pin(read_lease(pool, key, limit))
        })
    }
}

impl MembersWatch {
    /// Watches `cluster`'s members through `pool`, woken by `wakeups`; each read has 5 s.
    pub fn new(pool: Pool, cluster: impl Into<String>, wakeups: Wakeups) -> MembersWatch {
        let cluster = cluster.into();
        Watch::with_reader(pool, nodes_topic(&cluster), cluster, wakeups, |pool, cluster, limit| {
            Box::pin(read_members(pool, cluster, limit))
        })
    }
}

impl<T> Watch<T> {
    fn with_reader(pool: Pool, topic: String, name: String, wakeups: Wakeups, read: Reader<T>) -> Watch<T> {
        Watch { pool, name, topic, wakeups, read_timeout: Duration::from_secs(5), last: None, failed: false, read }
    }

    /// Each read's time limit.
    #[must_use]
    pub fn read_timeout(mut self, limit: Duration) -> Watch<T> {
        self.read_timeout = limit;
        self
    }

    /// Starts after `revision` (a state read before): the first [`Watch::next`] waits for a
    /// change since.
    #[must_use]
    pub fn after(mut self, revision: i64) -> Watch<T> {
        self.last = Some(revision);
        self
    }

    /// The current state the first time, then the next state that differs from the last one
    /// returned. An error (the store failed or did not answer) is returned once; the call after
    /// it waits a second and reads again, still from the last state returned.
    pub async fn next(&mut self) -> Result<Observed<T>, Error> {
        if std::mem::take(&mut self.failed) {
            tokio::time::sleep(RETRY_AFTER_ERROR).await;
        }
        let (pool, name, limit, read) = (&self.pool, &self.name, self.read_timeout, self.read);
        loop {
            let until = Instant::now() + Duration::from_secs(3600);
            match wait_for_change(&self.wakeups, &self.topic, self.last, until, || read(pool, name, limit)).await {
                Ok(observed) if Some(observed.revision) == self.last => continue,
                Ok(observed) => {
                    self.last = Some(observed.revision);
                    return Ok(observed);
                }
                Err(error) => {
                    self.failed = true;
                    return Err(error);
                }
            }
        }
    }

    /// The same as a stream.
    pub fn into_stream(self) -> impl futures::Stream<Item = Result<Observed<T>, Error>> {
        futures::stream::unfold(self, |mut watch| async move {
            let item = watch.next().await;
            Some((item, watch))
        })
    }
}
