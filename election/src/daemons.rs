//! Daemons: named background work units (an outbox processor, a compactor) that the leader of
//! a cluster assigns to its live nodes, each running on one node at a time.
//!
//! Every process registers the daemons it can run and is both a node of the cluster
//! ([`crate::membership`]) and a candidate for its leader ([`crate::Elector`]). On every
//! heartbeat:
//! - the leader runs one pass (`fencing.reconcile_daemons`): it assigns daemons without a node
//!   to the least-loaded live node that offers them, ends the assignments of nodes that stopped
//!   heartbeating, forces the assignments whose acknowledge or drain deadline passed, and
//!   revokes one daemon from the busiest node when another holds two fewer (bounded churn);
//! - every node reads its assignments, acknowledges new ones and only then starts them, drains
//!   revoked ones and confirms when they stopped.
//!
//! An assignment goes Assigning -> Active -> Revoking -> Deleted. The leader's changes carry
//! its term and are admitted through the fence of the cluster's assignments (the resource
//! `fencing.daemons/<cluster>`, bound to the leader's lease): a leader that lost its lease, or
//! was succeeded while paused, changes nothing. Each assignment has a new generation, which is
//! the daemon's fencing token for its own writes ([`DaemonContext::fencing_token`]).
//!
//! # At most one running instance, and its bound
//!
//! A node starts a daemon only after the store accepted its acknowledgement, which it refuses
//! after the acknowledge deadline or once the leader moved the assignment on. A watchdog thread
//! cancels each instance on the boot clock, whatever the node's runner or runtime is doing (it
//! may be waiting for the store, or starved), half a heartbeat interval before either store
//! deadline (it looks every eighth of an interval, at most 50 ms apart, so at least three
//! eighths before): the drain deadline of a
//! revocation (which starts when the node reads it: a node that never heard of a revocation is
//! not forced, it keeps the daemon until it expires) and its node's expiry (its registration on
//! the boot clock: the last accepted heartbeat's send instant plus the time the store gave it).
//! The instance is cancelled at once when its node joined anew (a new incarnation: the store
//! ended its assignments) and when the store says the assignment moved on. The leader forces an
//! assignment only once the store deadline passed. So a daemon that returns within half a
//! heartbeat interval of its [`DaemonContext::cancellation_token`] being cancelled never runs on
//! two live nodes at once. The exceptions are a daemon that keeps running longer (after the
//! drain timeout or its node's expiry it is assigned elsewhere, and runs on two nodes until it
//! returns) and a paused process (SIGSTOP, a long stall) that resumes in the middle of an action
//! ([`DaemonContext::is_valid`] reads the boot clock, so at most the action in flight). Writes
//! made with the daemon's fencing token are safe in both cases: once the new assignment's first
//! write is admitted, the old generation's writes are refused.
//!
//! ```no_run
//! use std::time::{Duration, SystemTime};
//! use fencing_election::Elector;
//! use fencing_election::daemons::Daemons;
//! use fencing_election::membership::Membership;
//!
//! # async fn example(pool: deadpool_postgres::Pool) -> Result<(), fencing_election::Error> {
//! let node = Membership::builder(pool.clone(), "billing").build()?;
//! let elector = Elector::builder(pool, "billing-leader").ttl(Duration::from_secs(60)).build()?;
//! let daemons = Daemons::builder(node, elector)
//!     .daemon("outbox", |daemon| async move {
//!         // Checked just before every action others can see; it is false once cancelled.
//!         while daemon.is_valid() && !daemon.is_draining() {
//!             // Write with daemon.fencing_token() (the Fencing-Token header through the gateway).
//!             tokio::time::sleep(Duration::from_secs(1)).await;
//!         }
//!     })
//!     .build()?
//!     .start();
//! // ...
//! daemons.shutdown().await;
//! # Ok(())
//! # }
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use fencing_schema::store::{self, Assignment};
use rand::Rng;
use tokio::sync::{Notify, watch};
use tokio::task::{AbortHandle, JoinHandle};
use tokio::time::{Instant, timeout, timeout_at};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::clock::BootInstant;
use crate::config::Elector;
use crate::error::Error;
use crate::membership::{Membership, MembershipHandle, Registration};
use crate::runtime::ElectorHandle;
use crate::state::{FencingToken, Leadership};

/// How long a node has to acknowledge an assignment unless set.
pub const DEFAULT_ACK_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a node has to drain a revoked daemon unless set.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(60);
/// The most daemons one process registers.
pub const MAX_DAEMONS: usize = 100;
/// The longest acknowledge or drain timeout.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(3600);
/// The shortest acknowledge or drain timeout (the store refuses shorter ones).
pub const MIN_TIMEOUT: Duration = Duration::from_secs(1);

/// Gauge `{cluster, state}`: daemons by state (`unassigned`, `assigning`, `active`,
/// `revoking`), as the leader last read them; 0 on every other process.
pub const DAEMONS: &str = "election_daemons";
/// Counter `{cluster, reason}`: assignments the leader ended or revoked: `node_expired`,
/// `ack_timeout`, `drain_timeout` (forced) and `rebalance`.
pub const REASSIGNMENTS: &str = "election_daemon_reassignments_total";
/// Histogram `{cluster}`: seconds from a daemon needing a node to a node acknowledging it.
pub const ASSIGN_SECONDS: &str = "election_daemon_assign_seconds";
/// Gauge `{cluster}`: daemons running in this process.
pub const RUNNING: &str = "election_daemons_running";

const STATES: [&str; 4] = ["unassigned", "assigning", "active", "revoking"];
const REASONS: [&str; 4] = ["node_expired", "ack_timeout", "drain_timeout", "rebalance"];

/// What a running daemon gets: its assignment's fencing token, a drain signal and a
/// cancellation token.
#[derive(Debug, Clone)]
pub struct DaemonContext {
    name: Arc<str>,
    generation: i64,
    cancel: CancellationToken,
    drain: CancellationToken,
    registration: watch::Receiver<Option<Registration>>,
    /// The node incarnation (its start in the store) this instance was acknowledged by.
    node_started: SystemTime,
    /// How long before the registration's end the instance stops being valid.
    margin: Duration,
}

impl DaemonContext {
    /// The daemon's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The assignment's generation: it grows with every assignment of this daemon.
    pub fn generation(&self) -> i64 {
        self.generation
    }

    /// The token for this instance's own writes (the generation): present it on every write
    /// (the `Fencing-Token` header through the gateway, or `fencing.admit` in SQL) on a resource
    /// of this daemon's own, so a previous instance that is still running is refused once this
    /// one wrote.
    pub fn fencing_token(&self) -> FencingToken {
        FencingToken::new(self.generation)
    }

    /// Cancelled when the daemon must stop now: its drain deadline passed, its assignment ended
    /// elsewhere, or this node's registration lapsed. Return promptly.
    pub fn cancellation_token(&self) -> &CancellationToken {
        &self.cancel
    }

    /// Cancelled when the daemon should finish the work in hand and return: it was revoked or
    /// the process shuts down (and with the cancellation token).
    pub fn drain_token(&self) -> &CancellationToken {
        &self.drain
    }

    /// True once it should drain.
    pub fn is_draining(&self) -> bool {
        self.drain.is_cancelled()
    }

    /// True while this instance may act: not cancelled, this node still the incarnation that
    /// acknowledged it (not expired and joined anew), and its registration more than half a
    /// heartbeat interval from running out on the boot clock (a process resumed after a pause
    /// finds it false at once, before its runner had a chance to cancel it). Check it
    /// immediately before every action others can see; fence the action itself with
    /// [`DaemonContext::fencing_token`].
    pub fn is_valid(&self) -> bool {
        !self.cancel.is_cancelled() && !valid_for(*self.registration.borrow(), self.node_started, self.margin).is_zero()
    }
}

type Running = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;
type DaemonFn = Arc<dyn Fn(DaemonContext) -> Running + Send + Sync>;

/// A node's daemons and its leader candidacy, configured; [`Daemons::start`] runs them.
pub struct Daemons {
    membership: Membership,
    elector: Elector,
    daemons: BTreeMap<String, DaemonFn>,
    ack_timeout: Duration,
    drain_timeout: Duration,
}

impl fmt::Debug for Daemons {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Daemons")
            .field("membership", &self.membership)
            .field("elector", &self.elector)
            .field("daemons", &self.daemons.keys().collect::<Vec<_>>())
            .field("ack_timeout", &self.ack_timeout)
            .field("drain_timeout", &self.drain_timeout)
            .finish()
    }
}

/// Settings for [`Daemons`].
#[must_use]
pub struct DaemonsBuilder {
    membership: Membership,
    elector: Elector,
    daemons: Vec<(String, DaemonFn)>,
    ack_timeout: Duration,
    drain_timeout: Duration,
}

impl Daemons {
    /// Starts configuring daemons for this process's node `membership` of a cluster, whose
    /// leader is elected by `elector` (the lease's key names the cluster's leadership: one key
    /// per cluster).
    pub fn builder(membership: Membership, elector: Elector) -> DaemonsBuilder {
        DaemonsBuilder {
            membership,
            elector,
            daemons: Vec::new(),
            ack_timeout: DEFAULT_ACK_TIMEOUT,
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
        }
    }

    /// Starts the node, the elector and the daemons' task on the current Tokio runtime.
    pub fn start(self) -> DaemonsHandle {
        let membership = self.membership.start();
        let elector = self.elector.start();
        let cluster = membership.config().cluster().to_owned();
        let (running_tx, running) = watch::channel(Vec::new());
        let stop = CancellationToken::new();
        let runner = Runner {
            node: membership.config().clone(),
            registration: membership.registration(),
            leadership: elector.leadership_watch(),
            lease_key: elector.key().to_owned(),
            owner: elector.owner().to_owned(),
            offered: self.daemons.keys().cloned().collect(),
            daemons: self.daemons,
            ack_timeout: self.ack_timeout,
            drain_timeout: self.drain_timeout,
            wake: Arc::new(Notify::new()),
            margin: membership.config().heartbeat_interval() / 2,
            watched: Arc::new(Mutex::new(Vec::new())),
            tasks: Arc::new(Mutex::new(Vec::new())),
            watchdog_stop: Arc::new(AtomicBool::new(false)),
            running: running_tx,
            led: false,
            instances: BTreeMap::new(),
        };
        for state in STATES {
            metrics::gauge!(DAEMONS, "cluster" => cluster.clone(), "state" => state).set(0.0);
        }
        for reason in REASONS {
            metrics::counter!(REASSIGNMENTS, "cluster" => cluster.clone(), "reason" => reason).increment(0);
        }
        metrics::gauge!(RUNNING, "cluster" => cluster).set(0.0);
        spawn_watchdog(
            Arc::clone(&runner.watched),
            runner.registration.clone(),
            runner.margin,
            Arc::clone(&runner.watchdog_stop),
        );
        let (membership_stop, membership_done) = membership.stop_tokens();
        let give_up = GiveUp {
            elector: elector.stop_token(),
            membership: membership_stop,
            membership_done,
            node: membership.config().clone(),
            watched: Arc::clone(&runner.watched),
            tasks: Arc::clone(&runner.tasks),
            drain_timeout: runner.drain_timeout,
            watchdog_stop: Arc::clone(&runner.watchdog_stop),
            running: runner.running.clone(),
        };
        let runner = tokio::spawn(runner.run(stop.clone()));
        // A panic of the runner itself must not leave the elector leading with no leader pass,
        // nor daemons running unwatched: it ends leadership, the daemons and the node.
        let task = tokio::spawn(async move {
            match runner.await {
                Ok(runner) => Some(runner),
                Err(error) if error.is_panic() => {
                    give_up.now(&panic_message(error.into_panic())).await;
                    None
                }
                Err(_) => None,
            }
        });
        DaemonsHandle { membership: Some(membership), elector: Some(elector), running, stop, task: Some(task) }
    }
}

/// Every instance's task by daemon name, finished ones pruned as new ones start.
type InstanceTasks = Arc<Mutex<Vec<(Arc<str>, AbortHandle)>>>;

/// What a panic of the daemons' runner stops: it leaves no leader without a leader pass and no
/// daemon without its runner.
struct GiveUp {
    /// The elector's: cancelled, it cancels its leader work and releases the lease.
    elector: CancellationToken,
    /// The node's heartbeats: cancelled, they stop.
    membership: CancellationToken,
    /// Cancelled once the heartbeat task has ended.
    membership_done: CancellationToken,
    /// To leave the cluster at once rather than expire.
    node: Membership,
    watched: Arc<Mutex<Vec<Watched>>>,
    /// Every instance's task, to wait for and, past the drain timeout, abort.
    tasks: InstanceTasks,
    drain_timeout: Duration,
    watchdog_stop: Arc<AtomicBool>,
    /// What [`DaemonsHandle::running`] says: nothing, once they are cancelled.
    running: watch::Sender<Vec<(String, i64)>>,
}

impl GiveUp {
    async fn now(self, why: &str) {
        error!(
            cluster = %self.node.cluster(),
            node_id = %self.node.node_id(),
            panic = %why,
            "the daemons' runner panicked: this node gives up leadership (the lease is released), \
             cancels every daemon running here and leaves the cluster; restart the process to rejoin"
        );
        self.elector.cancel();
        for instance in self.watched.lock().unwrap_or_else(std::sync::PoisonError::into_inner).iter() {
            instance.cancel.cancel();
        }
        self.watchdog_stop.store(true, Ordering::Release);
        // The node stays registered (its assignments with it) until its daemons have returned,
        // or were aborted one drain timeout after their cancellation: only then may another node
        // start them.
        let tasks = self.tasks.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        let until = Instant::now() + self.drain_timeout;
        while tasks.iter().any(|(_, task)| !task.is_finished()) && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        for (name, task) in &tasks {
            if !task.is_finished() {
                warn!(daemon = %name, "the daemon did not return within the drain timeout of its cancellation: aborted");
                task.abort();
            }
        }
        self.running.send_replace(Vec::new());
        metrics::gauge!(RUNNING, "cluster" => self.node.cluster().to_owned()).set(0.0);
        // No heartbeat may be in flight when the node leaves: one that committed after the leave
        // would register the node again.
        self.membership.cancel();
        let heartbeat_bound = self.node.query_timeout() * 2;
        if timeout(heartbeat_bound, self.membership_done.cancelled()).await.is_err() {
            warn!("the heartbeat task did not end; leaving all the same");
        }
        match self.node.leave().await {
            Ok(_) => {}
            Err(error) => warn!(%error, "could not leave the cluster; the node expires after its ttl"),
        }
    }
}

/// The text of a panic's payload, when it has one.
fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(text) => *text,
        Err(payload) => {
            payload.downcast_ref::<&str>().map_or_else(|| "(no message)".to_owned(), |text| (*text).to_owned())
        }
    }
}

impl DaemonsBuilder {
    /// Registers daemon `name`: `run` is called with a fresh [`DaemonContext`] each time this
    /// node is assigned the daemon, and the daemon runs until the returned future completes.
    /// Return when [`DaemonContext::drain_token`] is cancelled (finishing the work in hand), and
    /// at once when [`DaemonContext::cancellation_token`] is. A daemon that returns early gives
    /// its assignment back; the leader assigns it again, to another node when there is one.
    pub fn daemon<F, Fut>(mut self, name: impl Into<String>, run: F) -> Self
    where
        F: Fn(DaemonContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let run: DaemonFn = Arc::new(move |context| Box::pin(run(context)));
        self.daemons.push((name.into(), run));
        self
    }

    /// How long a node has, by the store's clock, to acknowledge an assignment before the
    /// leader gives the daemon to another node. Default 30 s; at least two heartbeat
    /// intervals (a node reads its assignments once per interval).
    pub fn ack_timeout(mut self, timeout: Duration) -> Self {
        self.ack_timeout = timeout;
        self
    }

    /// How long a node has, by the store's clock, to drain a revoked daemon (from when it reads
    /// the revocation) before the leader forces it onto another node. Default 60 s; at least
    /// two heartbeat intervals.
    pub fn drain_timeout(mut self, timeout: Duration) -> Self {
        self.drain_timeout = timeout;
        self
    }

    /// Checks the settings: the first that cannot work is the error.
    pub fn build(self) -> Result<Daemons, Error> {
        let invalid = |message: String| Err(Error::InvalidSetting(message));
        self.membership.check_leader_ttl(self.elector.ttl())?;
        if self.membership.cluster().chars().count() > 240 {
            return invalid("a cluster with daemons has a name of at most 240 characters".to_owned());
        }
        if self.daemons.is_empty() || self.daemons.len() > MAX_DAEMONS {
            return invalid(format!("register 1 to {MAX_DAEMONS} daemons, got {}", self.daemons.len()));
        }
        let mut daemons = BTreeMap::new();
        for (name, run) in self.daemons {
            if name.is_empty() || name.chars().count() > 256 || name.contains('\0') {
                return invalid(format!("daemon name {name:?} must be 1 to 256 characters, without NUL"));
            }
            if daemons.insert(name.clone(), run).is_some() {
                return invalid(format!("daemon {name:?} is registered twice"));
            }
        }
        let interval = self.membership.heartbeat_interval();
        if self.ack_timeout < interval * 2 || self.ack_timeout > MAX_TIMEOUT {
            return invalid(format!(
                "ack timeout ({:?}) must be at least two heartbeat intervals ({:?}) and at most {MAX_TIMEOUT:?}",
                self.ack_timeout,
                interval * 2
            ));
        }
        if self.ack_timeout < MIN_TIMEOUT || self.drain_timeout < MIN_TIMEOUT {
            return invalid(format!("ack and drain timeouts must be at least {MIN_TIMEOUT:?}"));
        }
        if self.drain_timeout < interval * 2 || self.drain_timeout > MAX_TIMEOUT {
            return invalid(format!(
                "drain timeout ({:?}) must be at least two heartbeat intervals ({:?}: a node reads a revocation \
                 within one) and at most {MAX_TIMEOUT:?}",
                self.drain_timeout,
                interval * 2
            ));
        }
        Ok(Daemons {
            membership: self.membership,
            elector: self.elector,
            daemons,
            ack_timeout: self.ack_timeout,
            drain_timeout: self.drain_timeout,
        })
    }
}

/// Running daemons: the node, the elector, and which daemons run here.
#[derive(Debug)]
pub struct DaemonsHandle {
    membership: Option<MembershipHandle>,
    elector: Option<ElectorHandle>,
    running: watch::Receiver<Vec<(String, i64)>>,
    stop: CancellationToken,
    /// The runner, under a task that ends leadership and the node if it panics (then `None`).
    task: Option<JoinHandle<Option<Runner>>>,
}

impl DaemonsHandle {
    /// This process's node.
    pub fn membership(&self) -> Option<&MembershipHandle> {
        self.membership.as_ref()
    }

    /// This process's elector.
    pub fn elector(&self) -> Option<&ElectorHandle> {
        self.elector.as_ref()
    }

    /// The daemons running in this process, with their generations, by name.
    pub fn running(&self) -> Vec<(String, i64)> {
        self.running.borrow().clone()
    }

    /// Watches the daemons running in this process.
    pub fn watch_running(&self) -> watch::Receiver<Vec<(String, i64)>> {
        self.running.clone()
    }

    /// Stops leading (the lease is released, so another node takes over the leader's pass at
    /// once), drains every daemon running here (each cancelled at its drain deadline: the
    /// store's, for a revoked one, else the drain timeout from now; aborted one drain timeout
    /// later), gives their assignments back, and leaves the cluster.
    pub async fn shutdown(mut self) {
        self.stop.cancel();
        let runner = match self.task.take() {
            Some(task) => task.await.ok().flatten(),
            None => None,
        };
        if let Some(elector) = self.elector.take() {
            elector.shutdown().await;
        }
        if let Some(runner) = runner {
            runner.drain_all().await;
        }
        if let Some(membership) = self.membership.take() {
            membership.shutdown().await;
        }
    }
}

impl Drop for DaemonsHandle {
    /// Stops the task without draining: the daemons are cancelled and their assignments end
    /// when the node expires.
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// How long an instance acknowledged by incarnation `started` may still act: until its
/// registration's end less `margin`, and not at all once the node is another incarnation.
fn valid_for(registration: Option<Registration>, started: SystemTime, margin: Duration) -> Duration {
    match registration {
        Some(registration) if registration.started_at == started => registration
            .until
            .checked_sub(margin)
            .map_or(Duration::ZERO, |end| end.saturating_duration_since(BootInstant::now())),
        _ => Duration::ZERO,
    }
}

/// One instance of a daemon running in this process.
struct Instance {
    generation: i64,
    /// The node incarnation that acknowledged it.
    node_started: SystemTime,
    cancel: CancellationToken,
    drain: CancellationToken,
    task: JoinHandle<()>,
    /// When the watchdog cancels it, on the boot clock, once revoked (or on shutdown).
    drain_deadline: Arc<Mutex<Option<BootInstant>>>,
}

impl Instance {
    /// Acts on a read of its assignment: a revocation starts the drain, and its store deadline
    /// (from the read sent at `boot_sent`) less `margin` (or half the time left) becomes the
    /// instant the watchdog cancels it, so it can return before another node starts it.
    fn revoked(&self, name: &str, assignment: &Assignment, boot_sent: BootInstant, margin: Duration) {
        if assignment.state != "revoking" {
            return;
        }
        if !self.drain.is_cancelled() {
            info!(daemon = %name, generation = self.generation, "daemon revoked; draining");
            self.drain.cancel();
        }
        let mut deadline = self.drain_deadline.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let (None, Some(left)) = (*deadline, assignment.remaining) {
            *deadline = Some(boot_sent + left.saturating_sub(margin.min(left / 2)));
        }
    }
}

/// Wakes the runner when an instance ends, even by a panic.
struct WakeOnDrop(Arc<Notify>);

impl Drop for WakeOnDrop {
    fn drop(&mut self) {
        self.0.notify_one();
    }
}

/// One instance the watchdog looks after.
struct Watched {
    name: Arc<str>,
    cancel: CancellationToken,
    node_started: SystemTime,
    drain_deadline: Arc<Mutex<Option<BootInstant>>>,
}

/// The watchdog thread: it cancels each instance the moment it must stop, on the boot clock and
/// whatever the runtime is doing (the runner may be waiting for the store, the runtime may be
/// starved by a daemon that blocks it): at its drain deadline, when its node's registration comes
/// within the margin of its end, or when the node is another incarnation. It looks every
/// `poll` (a quarter of the margin, from 1 ms to 50 ms) and ends when `stop` is set.
fn spawn_watchdog(
    watched: Arc<Mutex<Vec<Watched>>>,
    registration: watch::Receiver<Option<Registration>>,
    margin: Duration,
    stop: Arc<AtomicBool>,
) {
    let poll = (margin / 4).clamp(Duration::from_millis(1), Duration::from_millis(50));
    let spawned = std::thread::Builder::new().name("daemons-watchdog".to_owned()).spawn(move || {
        while !stop.load(Ordering::Acquire) {
            let current = *registration.borrow();
            let now = BootInstant::now();
            let mut watched = watched.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            watched.retain(|instance| !instance.cancel.is_cancelled());
            for instance in watched.iter() {
                let drained = instance
                    .drain_deadline
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .is_some_and(|deadline| now >= deadline);
                let lapsed = valid_for(current, instance.node_started, margin).is_zero();
                if drained || lapsed {
                    let why = if drained { "its drain deadline passed" } else { "this node's registration lapsed" };
                    warn!(daemon = %instance.name, "cancelling the daemon: {why}");
                    instance.cancel.cancel();
                }
            }
            drop(watched);
            std::thread::sleep(poll);
        }
    });
    if let Err(error) = spawned {
        // Without the thread the runner's own checks remain (each pass, and is_valid).
        warn!(%error, "could not start the daemons' watchdog thread");
    }
}

struct Runner {
    node: Membership,
    /// Every instance's task (for a runner panic: [`GiveUp`]).
    tasks: InstanceTasks,
    registration: watch::Receiver<Option<Registration>>,
    leadership: watch::Receiver<Option<Leadership>>,
    lease_key: String,
    owner: String,
    daemons: BTreeMap<String, DaemonFn>,
    offered: Vec<String>,
    ack_timeout: Duration,
    drain_timeout: Duration,
    wake: Arc<Notify>,
    /// An instance stops being valid this long before its store deadline: half a heartbeat.
    margin: Duration,
    /// What the watchdog thread looks after, and its stop flag.
    watched: Arc<Mutex<Vec<Watched>>>,
    watchdog_stop: Arc<AtomicBool>,
    running: watch::Sender<Vec<(String, i64)>>,
    /// Whether the last pass ran as leader (its gauges are zeroed when it stops leading).
    led: bool,
    instances: BTreeMap<String, Instance>,
}

impl fmt::Debug for Runner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runner")
            .field("cluster", &self.node.cluster())
            .field("node_id", &self.node.node_id())
            .field("running", &self.instances.iter().map(|(name, i)| (name, i.generation)).collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl Drop for Runner {
    /// Instances not drained (the handle was dropped) are cancelled, not left running; the
    /// watchdog thread ends.
    fn drop(&mut self) {
        for instance in self.instances.values() {
            instance.cancel.cancel();
        }
        self.watchdog_stop.store(true, Ordering::Release);
    }
}

impl Runner {
    fn node_key(&self) -> (&str, &str, &str) {
        (self.node.cluster(), self.node.node_id(), self.node.incarnation())
    }

    async fn run(mut self, stop: CancellationToken) -> Runner {
        loop {
            let started = Instant::now();
            planted_runner_panic(self.node.cluster());
            self.reap().await;
            self.leader_pass().await;
            self.node_pass().await;
            self.publish();

            // The next heartbeat (up to 20 % early), or sooner when an instance ends. Deadlines
            // are each instance's watchdog's.
            let interval = self.node.heartbeat_interval();
            let until = started + interval - interval.mul_f64(0.2 * rand::rng().random::<f64>());
            tokio::select! {
                () = stop.cancelled() => return self,
                () = tokio::time::sleep_until(until) => {}
                () = self.wake.notified() => {}
            }
        }
    }

    fn publish(&self) {
        let running: Vec<(String, i64)> =
            self.instances.iter().map(|(name, instance)| (name.clone(), instance.generation)).collect();
        metrics::gauge!(RUNNING, "cluster" => self.node.cluster().to_owned()).set(running.len() as f64);
        self.running.send_if_modified(|old| {
            let changed = *old != running;
            *old = running;
            changed
        });
    }

    /// Instances that ended: their assignments are given back (drained when revoked).
    async fn reap(&mut self) {
        let ended: Vec<String> = self
            .instances
            .iter()
            .filter(|(_, instance)| instance.task.is_finished())
            .map(|(name, _)| name.clone())
            .collect();
        for name in ended {
            let Some(instance) = self.instances.remove(&name) else { continue };
            // Ended: the watchdog forgets it.
            instance.cancel.cancel();
            self.stopped(&name, instance.generation).await;
        }
    }

    /// Tells the store an instance stopped; a failure is retried by a later pass, which finds
    /// the assignment with no instance here.
    async fn stopped(&self, name: &str, generation: i64) {
        // Up to three tries: an assignment not given back stays with this node until it expires.
        let mut result = Err(String::new());
        for _ in 0..3 {
            result = self
                .node
                .call(async |client| store::daemon_stopped(client, self.node_key(), name, generation).await)
                .await;
            if result.is_ok() {
                break;
            }
        }
        match result {
            Ok(true) => {
                info!(cluster = %self.node.cluster(), daemon = %name, generation, "daemon stopped; assignment ended")
            }
            Ok(false) => debug!(daemon = %name, generation, "daemon stopped; its assignment had already ended"),
            Err(error) => warn!(daemon = %name, generation, %error, "could not end the assignment; retrying"),
        }
    }

    /// The leader's pass, while this process leads.
    async fn leader_pass(&mut self) {
        let cluster = self.node.cluster().to_owned();
        let period = self.leadership.borrow().clone().filter(Leadership::is_valid);
        let Some(period) = period else {
            if std::mem::take(&mut self.led) {
                for state in STATES {
                    metrics::gauge!(DAEMONS, "cluster" => cluster.clone(), "state" => state).set(0.0);
                }
            }
            return;
        };
        let lease = (self.lease_key.as_str(), self.owner.as_str());
        let (ack_timeout, drain_timeout) = (self.ack_timeout, self.drain_timeout);
        let pass = self
            .node
            .call(async |client| {
                // Checked just before the write; the store decides with the term either way.
                let Ok(term) = period.check() else { return Ok(None) };
                let lease = (lease.0, lease.1, term);
                let changes = store::reconcile_daemons(client, &cluster, lease, ack_timeout, drain_timeout).await?;
                Ok(Some((term, changes)))
            })
            .await;
        let (term, changes) = match pass {
            Ok(Some(pass)) => pass,
            Ok(None) => return,
            Err(error) => return warn!(%cluster, term = period.term(), %error, "leader pass refused or failed"),
        };
        self.led = true;
        for change in &changes {
            info!(%cluster, term, daemon = %change.daemon, generation = change.generation, node = %change.node_id,
                  state = %change.state, reason = change.reason.as_deref().unwrap_or(""), "daemon assignment changed");
            let counted = match change.state.as_str() {
                "deleted" | "revoking" => change.reason.as_deref().filter(|reason| REASONS.contains(reason)),
                _ => None,
            };
            if let Some(reason) = counted {
                metrics::counter!(REASSIGNMENTS, "cluster" => cluster.clone(), "reason" => reason.to_owned())
                    .increment(1);
            }
        }
        // The gauges, from a read after the pass.
        if let Ok(states) = self.node.call(async |client| store::daemon_states(client, &cluster).await).await {
            for state in STATES {
                let count = states.iter().filter(|daemon| daemon.state == state).count();
                metrics::gauge!(DAEMONS, "cluster" => cluster.clone(), "state" => state).set(count as f64);
            }
        }
    }

    /// The node's pass: act on this node's assignments.
    async fn node_pass(&mut self) {
        let current = (*self.registration.borrow())
            .filter(|registration| !valid_for(Some(*registration), registration.started_at, self.margin).is_zero());
        let Some(current) = current else {
            // The leader may reassign them once the store sees this node expire: they stop
            // first (their watchdogs cancel them too).
            for instance in self.instances.values() {
                instance.cancel.cancel();
            }
            return;
        };
        for (name, instance) in &self.instances {
            if instance.node_started != current.started_at && !instance.cancel.is_cancelled() {
                warn!(daemon = %name, generation = instance.generation, "this node joined anew; cancelling the daemon");
                instance.cancel.cancel();
            }
        }
        let boot_sent = BootInstant::now();
        let offered: Vec<&str> = self.offered.iter().map(String::as_str).collect();
        let assignments =
            self.node.call(async |client| store::assignments(client, self.node_key(), &offered).await).await;
        let assignments = match assignments {
            Ok(assignments) => assignments,
            Err(error) => return warn!(%error, "could not read this node's assignments"),
        };
        let by_name: BTreeMap<&str, &Assignment> =
            assignments.iter().map(|assignment| (assignment.daemon.as_str(), assignment)).collect();
        for (name, instance) in &mut self.instances {
            match by_name.get(name.as_str()) {
                Some(assignment) if assignment.generation == instance.generation => {
                    instance.revoked(name, assignment, boot_sent, self.margin);
                }
                _ => {
                    if !instance.cancel.is_cancelled() {
                        warn!(daemon = %name, generation = instance.generation, "assignment moved on; cancelling the daemon");
                        instance.cancel.cancel();
                    }
                }
            }
        }
        for assignment in &assignments {
            if self.instances.contains_key(&assignment.daemon) {
                // Running (or an older instance still stopping: it is acknowledged once gone).
                continue;
            }
            let known = self.daemons.get(&assignment.daemon).cloned();
            match (assignment.state.as_str(), known) {
                ("assigning", Some(run)) => self.acknowledge(assignment, run, current.started_at).await,
                // Not running here (it ended, an acknowledgement's answer was lost, or this
                // process does not have it): give it back.
                _ => self.stopped(&assignment.daemon, assignment.generation).await,
            }
        }
    }

    async fn acknowledge(&mut self, assignment: &Assignment, run: DaemonFn, node_started: SystemTime) {
        let (name, generation) = (assignment.daemon.as_str(), assignment.generation);
        let acked =
            self.node.call(async |client| store::ack_daemon(client, self.node_key(), name, generation).await).await;
        let waited = match acked {
            Ok(Some(waited)) => waited,
            Ok(None) => return debug!(daemon = %name, generation, "acknowledgement refused; not starting"),
            // Its answer lost: a later pass finds it active and not running here, and gives it back.
            Err(error) => return warn!(daemon = %name, generation, %error, "acknowledgement failed; not starting"),
        };
        if valid_for(*self.registration.borrow(), node_started, self.margin).is_zero() {
            warn!(daemon = %name, generation, "registration lapsed during the acknowledgement; giving it back");
            return self.stopped(name, generation).await;
        }
        metrics::histogram!(ASSIGN_SECONDS, "cluster" => self.node.cluster().to_owned()).record(waited.as_secs_f64());
        info!(cluster = %self.node.cluster(), daemon = %name, generation, "daemon acknowledged; starting");
        let cancel = CancellationToken::new();
        let drain = cancel.child_token();
        let name: Arc<str> = Arc::from(name);
        let context = DaemonContext {
            name: Arc::clone(&name),
            generation,
            cancel: cancel.clone(),
            drain: drain.clone(),
            registration: self.registration.clone(),
            node_started,
            margin: self.margin,
        };
        let drain_deadline = Arc::new(Mutex::new(None));
        self.watched.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(Watched {
            name: Arc::clone(&name),
            cancel: cancel.clone(),
            node_started,
            drain_deadline: Arc::clone(&drain_deadline),
        });
        let wake = WakeOnDrop(Arc::clone(&self.wake));
        // The daemon's own code runs in its task, from the first call: a panic ends that
        // instance only (its assignment is given back), never the runner.
        let task = tokio::spawn(async move {
            let _wake = wake;
            run(context).await;
        });
        {
            let mut tasks = self.tasks.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            tasks.retain(|(_, task)| !task.is_finished());
            tasks.push((Arc::clone(&name), task.abort_handle()));
        }
        self.instances
            .insert(name.to_string(), Instance { generation, node_started, cancel, drain, task, drain_deadline });
    }

    /// On shutdown: withdraw this node's offer (no new work comes to it), drain every instance
    /// (the watchdog cancels it at its drain deadline: the store's for a revoked one, else the
    /// drain timeout from now), abort what did not stop one drain timeout after that, and give
    /// the assignments back.
    async fn drain_all(mut self) {
        let boot_sent = BootInstant::now();
        match self.node.call(async |client| store::assignments(client, self.node_key(), &[]).await).await {
            // The read may start a revocation's drain time: its deadline counts.
            Ok(assignments) => {
                for assignment in &assignments {
                    if let Some(instance) = self.instances.get(&assignment.daemon)
                        && instance.generation == assignment.generation
                    {
                        instance.revoked(&assignment.daemon, assignment, boot_sent, self.margin);
                    }
                }
            }
            Err(error) => warn!(%error, "could not withdraw this node's offer before draining"),
        }
        let fallback = BootInstant::now() + self.drain_timeout.saturating_sub(self.margin);
        for instance in self.instances.values() {
            instance.drain.cancel();
            let mut deadline = instance.drain_deadline.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            *deadline = Some(deadline.map_or(fallback, |deadline| deadline.min(fallback)));
        }
        let abort_at = Instant::now() + self.drain_timeout * 2;
        let instances = std::mem::take(&mut self.instances);
        for (name, mut instance) in instances {
            if timeout_at(abort_at, &mut instance.task).await.is_err() {
                warn!(daemon = %name, "daemon did not stop when cancelled; aborting it");
                instance.task.abort();
                continue;
            }
            instance.cancel.cancel();
            self.stopped(&name, instance.generation).await;
        }
        self.publish();
    }
}

/// The planted bug of the tests (`daemons-runner-panic`, failpoints builds only): the runner
/// panics at the start of a pass when the failpoint returns this node's cluster.
fn planted_runner_panic(cluster: &str) {
    #[cfg(feature = "failpoints")]
    fail::fail_point!("daemons-runner-panic", |planted: Option<String>| {
        if planted.as_deref() == Some(cluster) {
            panic!("planted: the daemons' runner panics (failpoint daemons-runner-panic)");
        }
    });
    #[cfg(not(feature = "failpoints"))]
    let _ = cluster;
}
