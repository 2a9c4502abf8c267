//! Cluster membership: every process heartbeats its node row in `fencing.nodes`, and every
//! process (not only the leader) reads the table and hears nodes join and leave.
//!
//! A node is live while its row's `expires_at` is in the future by the store's clock. One node
//! id is live in one process at a time: a heartbeat from another incarnation of a live id is
//! refused ([`MemberEvent::IdentityConflict`]) until the holder leaves or expires.
//!
//! ```no_run
//! use fencing_election::membership::{MemberEvent, Membership};
//!
//! # async fn example(pool: deadpool_postgres::Pool) -> Result<(), fencing_election::Error> {
//! let node = Membership::builder(pool, "billing")
//!     // Stable for this process unless given (for example the pod name).
//!     .node_id(std::env::var("POD_NAME").unwrap_or_else(|_| "billing-1".to_owned()))
//!     .metadata(r#"{"zone":"a"}"#)
//!     .build()?
//!     .start();
//! let mut events = node.events();
//! loop {
//!     match events.recv().await {
//!         Ok(MemberEvent::NodeJoined(member)) => println!("{} joined", member.node_id),
//!         Ok(MemberEvent::NodeLeft(member)) => println!("{} left", member.node_id),
//!         Ok(MemberEvent::IdentityConflict { node_id }) => eprintln!("{node_id} is live elsewhere"),
//!         // Fell behind: `node.members()` has the current list.
//!         Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
//!         Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
//!     }
//! }
//! node.shutdown().await;
//! # Ok(())
//! # }
//! ```

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::Duration;

use deadpool_postgres::Pool;
use fencing_schema::store::{self, Member};
use rand::Rng;
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, timeout_at};
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::clock::{BootInstant, ClockSample, ClockVerdict, ClockWatch};
use crate::error::Error;

/// How often a node heartbeats unless set.
pub const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(15);
/// How long a node stays live after a heartbeat unless set.
pub const DEFAULT_REGISTRATION_TTL: Duration = Duration::from_secs(90);
/// The registration ttl must be at least this many heartbeat intervals: a node survives two
/// missed or slow heartbeats.
pub const MIN_TTL_INTERVALS: u32 = 3;
/// A leader that assigns work to nodes must hold its lease at least this many heartbeat
/// intervals ([`Membership::check_leader_ttl`]), so one leader sees several heartbeats.
pub const MIN_LEADER_TTL_INTERVALS: u32 = 2;
/// The most metadata a node carries: a JSON object of this many bytes.
pub const MAX_METADATA_BYTES: usize = 8192;
/// Events a slow listener may fall behind by before it misses some: one read reports at most
/// every node of a full cluster (1000) leaving and as many joining.
const EVENT_CAPACITY: usize = 2048;

/// Gauge `{cluster}`: live nodes as this process last read them.
pub const LIVE_NODES: &str = "membership_live_nodes";
/// Counter `{cluster}`: heartbeats that failed, timed out or were refused.
pub const HEARTBEAT_FAILURES: &str = "membership_heartbeat_failures_total";
/// Counter `{cluster}`: heartbeats in which the store's clock and this host's boot clock
/// disagreed: the node counted itself unregistered until the next heartbeat (its daemons stop).
pub const CLOCK_DISAGREEMENTS: &str = "membership_clock_disagreements_total";

/// A live node, as the store listed it.
pub type Node = Member;

/// What every node hears about the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemberEvent {
    /// A node is live: seen for the first time by this process, or back as a new incarnation
    /// (a new `started_at`). The first read reports every live node, this one included.
    NodeJoined(Node),
    /// A node is no longer live: it left, or stopped heartbeating past its ttl. A node that
    /// came back as a new incarnation is reported left, then joined.
    NodeLeft(Node),
    /// This process's heartbeat was refused: another live process holds its node id. It keeps
    /// trying, and joins once the other leaves or expires.
    IdentityConflict {
        /// The node id in use.
        node_id: String,
    },
}

/// A configured node of a cluster; [`Membership::start`] runs it.
#[derive(Debug, Clone)]
pub struct Membership {
    pool: Pool,
    cluster: String,
    node_id: String,
    incarnation: String,
    name: String,
    metadata: String,
    heartbeat_interval: Duration,
    ttl: Duration,
    query_timeout: Duration,
}

/// Settings for a [`Membership`].
#[derive(Debug, Clone)]
#[must_use]
pub struct MembershipBuilder {
    pool: Pool,
    cluster: String,
    node_id: Option<String>,
    name: Option<String>,
    metadata: String,
    heartbeat_interval: Duration,
    ttl: Duration,
    query_timeout: Option<Duration>,
}

impl Membership {
    /// Starts configuring this process's node of `cluster`, using connections from `pool`.
    pub fn builder(pool: Pool, cluster: impl Into<String>) -> MembershipBuilder {
        MembershipBuilder {
            pool,
            cluster: cluster.into(),
            node_id: None,
            name: None,
            metadata: "{}".to_owned(),
            heartbeat_interval: DEFAULT_HEARTBEAT_INTERVAL,
            ttl: DEFAULT_REGISTRATION_TTL,
            query_timeout: None,
        }
    }

    /// The node id.
    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    /// This start's incarnation (empty before [`Membership::start`]).
    pub(crate) fn incarnation(&self) -> &str {
        &self.incarnation
    }

    /// The cluster.
    pub fn cluster(&self) -> &str {
        &self.cluster
    }

    /// How often the node heartbeats.
    pub fn heartbeat_interval(&self) -> Duration {
        self.heartbeat_interval
    }

    /// How long the node stays live after a heartbeat.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The longest one heartbeat or read may take.
    pub fn query_timeout(&self) -> Duration {
        self.query_timeout
    }

    /// Refuses a leader lease ttl that is not markedly longer than the heartbeat interval (at
    /// least [`MIN_LEADER_TTL_INTERVALS`] of them): a leader that acts on every heartbeat
    /// would otherwise change hands between two of them.
    pub fn check_leader_ttl(&self, leader_ttl: Duration) -> Result<(), Error> {
        let floor = self.heartbeat_interval * MIN_LEADER_TTL_INTERVALS;
        if leader_ttl < floor {
            return Err(Error::InvalidSetting(format!(
                "the leader's lease ttl ({leader_ttl:?}) must be at least {MIN_LEADER_TTL_INTERVALS} heartbeat \
                 intervals ({floor:?})"
            )));
        }
        Ok(())
    }

    /// Spawns the node's background task on the current Tokio runtime: it heartbeats, reads
    /// the live nodes after each heartbeat, and reports what changed.
    pub fn start(self) -> MembershipHandle {
        let mut node = self;
        // Made per start: two starts of one configuration are two incarnations.
        node.incarnation = format!("{:032x}", rand::random::<u128>());
        let (events, first_receiver) = broadcast::channel(EVENT_CAPACITY);
        let (members_tx, members) = watch::channel(Vec::new());
        let (registered_tx, registered) = watch::channel(None);
        let stop = CancellationToken::new();
        let done = CancellationToken::new();
        let heartbeats = run(node.clone(), events.clone(), members_tx, registered_tx, stop.clone());
        let ended = done.clone();
        let task = tokio::spawn(async move {
            let _ended = ended.drop_guard();
            heartbeats.await;
        });
        MembershipHandle {
            membership: node,
            events,
            first_receiver: std::sync::Mutex::new(Some(first_receiver)),
            members,
            registered,
            stop,
            done,
            task: Some(task),
        }
    }

    /// One store call in one transaction of its own (`BEGIN`, the call, `COMMIT`): at most one
    /// Postgres transaction per call, under this node's limits and at READ COMMITTED whatever the
    /// pool's defaults (the daemons' pass decides on the newest rows).
    ///
    /// The server gives up at the call's deadline too (`SET LOCAL statement_timeout` and
    /// `lock_timeout` of the time left, gone at the transaction's end, so the connection goes back
    /// to the application's pool as it came), and a process paused inside the transaction holds
    /// its locks no longer than that, or a second, whichever is longer, after its last statement
    /// (`idle_in_transaction_session_timeout`: the server ends the session). A call whose
    /// statements are not answered by the deadline is rolled back, never committed; a `COMMIT`
    /// sent before it may still land after it (its outcome unknown here, as when an answer is
    /// lost), and the node counts nothing from a call it did not see answered. A slow answer costs no connection: the
    /// connection is rolled back in the background, once the server has answered (within
    /// [`CLEANUP_TIMEOUT`], else it is closed), and goes back to the pool, so a busy server is
    /// not made busier by reconnections (each a new backend and an authentication).
    pub(crate) async fn call<T>(
        &self,
        call: impl AsyncFnOnce(&tokio_postgres::Client) -> Result<T, fencing_schema::Error>,
    ) -> Result<T, String> {
        let deadline = Instant::now() + self.query_timeout;
        let client = match crate::pool::connection_by(&self.pool, deadline).await {
            Some(Ok(client)) => client,
            Some(Err(error)) => return Err(format!("get a connection: {error}")),
            None => return Err("timed out getting a connection".to_owned()),
        };
        let limit = deadline.saturating_duration_since(Instant::now()).as_millis().max(1);
        // The idle limit: a process paused between two statements of the transaction (or before
        // its COMMIT) holds its locks at most that long; the server then ends the session. At
        // least a second, so that a busy machine's scheduling costs no connection.
        let idle = limit.max(IDLE_FLOOR.as_millis());
        let begin = format!(
            "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL statement_timeout = {limit}; \
             SET LOCAL lock_timeout = {limit}; SET LOCAL idle_in_transaction_session_timeout = {idle}"
        );
        let transaction = async {
            client.batch_execute(&begin).await.map_err(|error| format!("begin: {error}"))?;
            let answer = call(&**client).await.map_err(|error| crate::runtime::error_chain(&error))?;
            // Answered late (this task ran after its deadline): never committed.
            if Instant::now() >= deadline {
                return Err(format!("no answer within {:?}", self.query_timeout));
            }
            client.batch_execute("COMMIT").await.map_err(|error| format!("commit: {error}"))?;
            Ok(answer)
        };
        match timeout_at(deadline, transaction).await {
            // Committed: the connection goes back to the pool as it came.
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(error)) => {
                tokio::spawn(roll_back(Dirty(Some(client))));
                Err(error)
            }
            Err(_) => {
                tokio::spawn(roll_back(Dirty(Some(client))));
                Err(format!("no answer within {:?}", self.query_timeout))
            }
        }
    }

    /// One heartbeat and the members' read, in one transaction: the heartbeat, then
    /// `fencing.members_since`, which reads the members only when their revision is not `known`
    /// (it waits for no lock, and a read it cannot make now is skipped, never the heartbeat's
    /// failure). A node's reads thus cost O(changes), not O(members) per heartbeat, and a
    /// heartbeat one transaction.
    async fn beat(&self, known: Option<i64>) -> Result<(store::Heartbeat, store::MembersSince), String> {
        let node = (self.cluster.as_str(), self.node_id.as_str(), self.incarnation.as_str());
        self.call(async |client| {
            let beat = store::heartbeat(client, node, &self.name, self.ttl, &self.metadata).await?;
            let members = store::members_since(client, &self.cluster, known).await?;
            Ok((beat, members))
        })
        .await
    }

    pub(crate) async fn leave(&self) -> Result<bool, String> {
        self.call(async |client| store::leave(client, &self.cluster, &self.node_id, &self.incarnation).await).await
    }
}

/// The least time a call's transaction may stay idle between its statements before the server
/// ends its session (`idle_in_transaction_session_timeout`): the query timeout, but never less.
const IDLE_FLOOR: Duration = Duration::from_secs(1);

/// How long a connection whose call failed or timed out may take to roll back (after the
/// server answered what was in flight) before it is closed instead of going back to the pool.
pub const CLEANUP_TIMEOUT: Duration = Duration::from_secs(10);

/// A pooled connection that may be inside a transaction: closed when dropped, unless
/// [`roll_back`] took it back to the pool clean (a task cancelled at a runtime's shutdown thus
/// never pools a connection inside a transaction).
struct Dirty(Option<deadpool_postgres::Object>);

impl Drop for Dirty {
    fn drop(&mut self) {
        if let Some(client) = self.0.take() {
            crate::runtime::discard(client);
        }
    }
}

/// Rolls back what a failed or abandoned call left open. The `ROLLBACK` queues behind whatever
/// the connection still runs (the server ends that at its statement timeout), so once it is
/// answered the connection is clean and goes back to the pool.
async fn roll_back(mut dirty: Dirty) {
    let Some(client) = dirty.0.as_ref() else { return };
    if let Ok(Ok(())) = tokio::time::timeout(CLEANUP_TIMEOUT, client.batch_execute("ROLLBACK")).await {
        drop(dirty.0.take());
    }
}

impl MembershipBuilder {
    /// The node id, stable for the process (default: host name and process id, the same for
    /// every node of this process). Override it with a name the platform keeps, such as a pod
    /// name; a process restarted under the same id joins once its previous incarnation left
    /// or expired.
    pub fn node_id(mut self, node_id: impl Into<String>) -> Self {
        self.node_id = Some(node_id.into());
        self
    }

    /// A name for people (default: the node id).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Metadata every node sees: a JSON object of at most 8 KiB, as text. Default `{}`.
    pub fn metadata(mut self, json: impl Into<String>) -> Self {
        self.metadata = json.into();
        self
    }

    /// How often the node heartbeats (before jitter: up to 20 % early). Default 15 s.
    pub fn heartbeat_interval(mut self, interval: Duration) -> Self {
        self.heartbeat_interval = interval;
        self
    }

    /// How long the node stays live after a heartbeat, by the store's clock. Default 90 s; at
    /// least three heartbeat intervals.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// The longest one heartbeat (with its read of the members) may take, the server's
    /// statement and lock timeouts too. Default and most: the heartbeat interval. A slow
    /// heartbeat is no loss of the registration, which is counted from when it was sent and
    /// lasts the ttl (three intervals or more): a store that stalls for less than two intervals
    /// costs no node its registration.
    pub fn query_timeout(mut self, timeout: Duration) -> Self {
        self.query_timeout = Some(timeout);
        self
    }

    /// Checks the settings: the first that cannot work is the error.
    pub fn build(self) -> Result<Membership, Error> {
        let invalid = |message: String| Err(Error::InvalidSetting(message));
        let node_id = self.node_id.unwrap_or_else(|| process_node_id().to_owned());
        let name = self.name.unwrap_or_else(|| node_id.clone());
        for (what, value) in [("cluster", &self.cluster), ("node id", &node_id), ("node name", &name)] {
            if value.is_empty() || value.chars().count() > 256 {
                return invalid(format!("{what} must be 1 to 256 characters"));
            }
        }
        let object = serde_json::from_str::<serde_json::Value>(&self.metadata).is_ok_and(|value| value.is_object());
        if self.metadata.len() > MAX_METADATA_BYTES || !object {
            return invalid(format!("metadata must be a JSON object of at most {MAX_METADATA_BYTES} bytes"));
        }
        let interval = self.heartbeat_interval;
        if interval < crate::config::MIN_INTERVAL {
            return invalid(format!(
                "heartbeat interval ({interval:?}) must be at least {:?}",
                crate::config::MIN_INTERVAL
            ));
        }
        if self.ttl > crate::config::MAX_TTL {
            return invalid(format!("registration ttl must be at most {:?}", crate::config::MAX_TTL));
        }
        if self.ttl < interval * MIN_TTL_INTERVALS {
            return invalid(format!(
                "registration ttl ({:?}) must be at least {MIN_TTL_INTERVALS} heartbeat intervals ({:?}), so a node \
                 survives two missed heartbeats",
                self.ttl,
                interval * MIN_TTL_INTERVALS
            ));
        }
        let query_timeout = self.query_timeout.unwrap_or(interval);
        if query_timeout.is_zero() || query_timeout > interval {
            return invalid(format!(
                "query timeout ({query_timeout:?}) must be positive and at most the heartbeat interval \
                 ({interval:?}): one heartbeat and its read fit in one interval"
            ));
        }
        Ok(Membership {
            pool: self.pool,
            cluster: self.cluster,
            node_id,
            incarnation: String::new(),
            name,
            metadata: self.metadata,
            heartbeat_interval: interval,
            ttl: self.ttl,
            query_timeout,
        })
    }
}

/// The default node id: host name and process id, made once per process.
fn process_node_id() -> &'static str {
    static ID: OnceLock<String> = OnceLock::new();
    ID.get_or_init(|| {
        let host = crate::config::kernel_host_name().unwrap_or_else(|| "unknown-host".to_owned());
        let host: String = host.chars().take(200).collect();
        format!("{host}-{}", std::process::id())
    })
}

/// An accepted heartbeat: which incarnation of the node the store has (its `started_at`: a
/// node that expired and heartbeats again is a new one) and until when it is registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Registration {
    pub(crate) started_at: std::time::SystemTime,
    pub(crate) until: BootInstant,
}

/// A running node: the live members as last read, events, and a clean leave.
#[derive(Debug)]
pub struct MembershipHandle {
    membership: Membership,
    events: broadcast::Sender<MemberEvent>,
    members: watch::Receiver<Vec<Node>>,
    /// Subscribed before the task started: the first caller of `events` misses nothing.
    first_receiver: std::sync::Mutex<Option<broadcast::Receiver<MemberEvent>>>,
    /// The incarnation the store has (its start) and until when it is registered, on the boot
    /// clock (sent + remaining).
    registered: watch::Receiver<Option<Registration>>,
    stop: CancellationToken,
    /// Cancelled when the heartbeat task has ended (no heartbeat of it is in flight any more).
    done: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl MembershipHandle {
    /// This node's id.
    pub fn node_id(&self) -> &str {
        &self.membership.node_id
    }

    /// The running node's configuration, its incarnation included.
    pub(crate) fn config(&self) -> &Membership {
        &self.membership
    }

    /// The token that stops the node's heartbeats (without leaving, as dropping this handle),
    /// and the one cancelled once the heartbeat task has ended.
    pub(crate) fn stop_tokens(&self) -> (CancellationToken, CancellationToken) {
        (self.stop.clone(), self.done.clone())
    }

    /// This node's registration: its start in the store and until when, on the boot clock.
    pub(crate) fn registration(&self) -> watch::Receiver<Option<Registration>> {
        self.registered.clone()
    }

    /// Events: the first call gets every event since the start (the first read's joins
    /// included), later calls those from then on.
    pub fn events(&self) -> broadcast::Receiver<MemberEvent> {
        let first = self.first_receiver.lock().ok().and_then(|mut first| first.take());
        first.unwrap_or_else(|| self.events.subscribe())
    }

    /// The live nodes as last read (by node id).
    pub fn members(&self) -> Vec<Node> {
        self.members.borrow().clone()
    }

    /// Watches the live nodes.
    pub fn watch_members(&self) -> watch::Receiver<Vec<Node>> {
        self.members.clone()
    }

    /// True while this node's last heartbeat was accepted and has not expired by the local
    /// boot clock (sent + remaining: never later than the store's expiry; a suspended or paused
    /// process finds it false when it resumes).
    pub fn is_registered(&self) -> bool {
        self.registered.borrow().is_some_and(|registration| BootInstant::now() < registration.until)
    }

    /// Stops heartbeating and leaves the cluster now (bounded by the query timeout), so others
    /// hear `NodeLeft` at their next read instead of after the ttl. Whether the leave was
    /// recorded.
    pub async fn shutdown(mut self) -> bool {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
        match self.membership.leave().await {
            Ok(left) => left,
            Err(error) => {
                let (cluster, node_id) = (&self.membership.cluster, &self.membership.node_id);
                warn!(%cluster, %node_id, %error, "could not leave; the node expires after its ttl");
                false
            }
        }
    }
}

impl Drop for MembershipHandle {
    /// Stops heartbeating without leaving: the node expires after its ttl.
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Compares the store's clock as `beat` shows it (its expiry less what remains) with this host's
/// boot clock over the heartbeat sent at `sent`.
fn clock_agrees(clock: &mut ClockWatch, sent: BootInstant, beat: &store::Heartbeat) -> bool {
    let received = BootInstant::now();
    let Ok(since_epoch) = beat.expires_at.duration_since(std::time::UNIX_EPOCH) else { return true };
    if beat.remaining.is_zero() {
        return true;
    }
    let store_secs = since_epoch.as_secs_f64() - beat.remaining.as_secs_f64();
    !matches!(clock.observe(ClockSample { sent, received, store_secs }), ClockVerdict::Disagrees { .. })
}

async fn run(
    node: Membership,
    events: broadcast::Sender<MemberEvent>,
    members: watch::Sender<Vec<Node>>,
    registered: watch::Sender<Option<Registration>>,
    stop: CancellationToken,
) {
    let live_nodes = metrics::gauge!(LIVE_NODES, "cluster" => node.cluster.clone());
    let failures = metrics::counter!(HEARTBEAT_FAILURES, "cluster" => node.cluster.clone());
    let disagreements = metrics::counter!(CLOCK_DISAGREEMENTS, "cluster" => node.cluster.clone());
    // Exported at 0 from the start, without resetting another node's count of this cluster.
    failures.increment(0);
    disagreements.increment(0);
    // The registration is counted on this host's boot clock from the store's remaining time:
    // a clock that disagrees with the store's (stepped, fast or slow) cannot count it.
    let mut clock =
        ClockWatch::new(crate::config::DEFAULT_CLOCK_RATE_TOLERANCE, Duration::from_millis(5), Duration::from_secs(10));
    // The known incarnation of every live node: node id -> the node as last read.
    let mut known: BTreeMap<String, Node> = BTreeMap::new();
    // The members' revision `known` was read at: the members are read again only when it moves.
    let mut revision: Option<i64> = None;
    let mut in_conflict = false;
    loop {
        // Heartbeat, and read the members when they changed.
        let sent = Instant::now();
        let boot_sent = BootInstant::now();
        let read = match node.beat(revision).await {
            Ok((beat, read)) => {
                if !beat.ok {
                    failures.increment(1);
                    registered.send_replace(None);
                    if !in_conflict {
                        warn!(cluster = %node.cluster, node_id = %node.node_id, "another live process holds this node id");
                        let _ = events.send(MemberEvent::IdentityConflict { node_id: node.node_id.clone() });
                    }
                    in_conflict = true;
                } else if !clock_agrees(&mut clock, boot_sent, &beat) {
                    disagreements.increment(1);
                    registered.send_replace(None);
                    warn!(
                        cluster = %node.cluster,
                        node_id = %node.node_id,
                        "the store's clock and this host's boot clock disagree; not registered until they agree (see \
                         docs/operations.md, \"Clocks disagree\")"
                    );
                } else {
                    let until = boot_sent + beat.remaining;
                    registered.send_replace(Some(Registration { started_at: beat.started_at, until }));
                    in_conflict = false;
                }
                Some(read)
            }
            Err(error) => {
                // Not a leave: the node stays registered until its last accepted heartbeat's
                // time runs out, and the others list it while the store does.
                failures.increment(1);
                warn!(cluster = %node.cluster, node_id = %node.node_id, %error, "heartbeat failed");
                None
            }
        };

        // Report the differences when the members were read.
        if let Some(store::MembersSince { revision: read_at, members: Some(live) }) = read {
            revision = read_at;
            let now_live: BTreeMap<String, Node> =
                live.into_iter().map(|member| (member.node_id.clone(), member)).collect();
            // The list first: whoever hears an event finds it in `members()` already.
            live_nodes.set(now_live.len() as f64);
            members.send_replace(now_live.values().cloned().collect());
            for (id, old) in &known {
                if now_live.get(id).is_none_or(|new| new.started_at != old.started_at) {
                    let _ = events.send(MemberEvent::NodeLeft(old.clone()));
                }
            }
            for (id, new) in &now_live {
                if known.get(id).is_none_or(|old| old.started_at != new.started_at) {
                    let _ = events.send(MemberEvent::NodeJoined(new.clone()));
                }
            }
            known = now_live;
        }

        // Up to 20 % early, never late.
        let jitter = node.heartbeat_interval.mul_f64(0.2 * rand::rng().random::<f64>());
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep_until(sent + node.heartbeat_interval - jitter) => {}
        }
    }
}
