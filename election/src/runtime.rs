//! The elector's background task and the handle that owns it.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Object;
use fencing_schema::store::{self, LeaseReply};
use rand::Rng;
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, sleep_until, timeout_at};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::clock::{BootInstant, ClockSample, ClockVerdict, ClockWatch};
use crate::config::{Elector, RENEW_JITTER};
use crate::error::Error;
use crate::metrics as names;
use crate::state::{Deadline, Event, FencingToken, LeaderState, Leadership, LossReason};

/// What the store's clock and this host's may differ by in one reading (rounding, the
/// milliseconds of `remaining`).
const CLOCK_SLACK: Duration = Duration::from_millis(5);
/// The gap between the two probes of the store's clock before leading.
const CLOCK_PROBE_GAP: Duration = Duration::from_millis(100);
/// Reads the store's clock.
const STORE_CLOCK_SQL: &str = "SELECT extract(epoch FROM clock_timestamp())::float8";

/// When a call was sent, on both clocks.
#[derive(Debug, Clone, Copy)]
struct Sent {
    wake: Instant,
    boot: BootInstant,
}

impl Sent {
    fn now() -> Sent {
        Sent { wake: Instant::now(), boot: BootInstant::now() }
    }
}

/// How many events a slow subscriber may fall behind before it misses some.
const EVENT_CAPACITY: usize = 64;
/// The first backoff step after a store error while a follower.
const BACKOFF_BASE: Duration = Duration::from_millis(25);

/// A running elector. Dropping it stops the elector (leader work is cancelled and the lease
/// released in the background); [`ElectorHandle::shutdown`] does the same and waits.
#[derive(Debug)]
pub struct ElectorHandle {
    shared: Arc<Shared>,
    /// The elector's pool and query timeout, for [`ElectorHandle::set_value`].
    pool: deadpool_postgres::Pool,
    query_timeout: Duration,
    /// Cancelled to stop the elector task.
    shutdown: CancellationToken,
    /// The leader work spawned through this handle, waited for (bounded) on shutdown.
    leader_work: TaskTracker,
    task: Option<JoinHandle<bool>>,
}

/// What the task publishes and the handle reads.
#[derive(Debug)]
struct Shared {
    key: Arc<str>,
    owner: String,
    state: watch::Sender<LeaderState>,
    leadership: watch::Sender<Option<Leadership>>,
    events: broadcast::Sender<Event>,
}

impl Shared {
    fn publish(&self, event: Event) {
        // No subscriber is fine: events are for whoever listens.
        let _ = self.events.send(event);
    }
}

impl Elector {
    /// Spawns the elector's background task on the current Tokio runtime.
    pub fn start(self) -> ElectorHandle {
        start(self)
    }
}

pub(crate) fn start(elector: Elector) -> ElectorHandle {
    names::describe();
    let key: Arc<str> = Arc::from(elector.key.as_str());
    let shared = Arc::new(Shared {
        key: Arc::clone(&key),
        owner: elector.owner.clone(),
        state: watch::channel(LeaderState::Follower).0,
        leadership: watch::channel(None).0,
        events: broadcast::channel(EVENT_CAPACITY).0,
    });
    let shutdown = CancellationToken::new();
    let leader_work = TaskTracker::new();
    let span = info_span!("elector", key = %elector.key, owner = %elector.owner);
    let runtime = Runtime {
        shared: Arc::clone(&shared),
        shutdown: shutdown.clone(),
        leader_work: leader_work.clone(),
        metric_labels: [("key", elector.key.clone())],
        clock: std::sync::Mutex::new(ClockWatch::new(
            elector.clock_rate_tolerance,
            CLOCK_SLACK,
            Duration::from_secs(10),
        )),
        clock_agreed: std::sync::atomic::AtomicBool::new(false),
        elector,
    };
    // Every series from start-up, at 0: a follower shows 0, not "No data".
    let labels = [("key", runtime.elector.key.clone())];
    metrics::gauge!(names::IS_LEADER, &labels).set(0.0);
    metrics::gauge!(names::TERM, &labels).set(0.0);
    metrics::gauge!(names::LEASE_REMAINING_SECONDS, &labels).set(0.0);
    metrics::counter!(names::RENEW_FAILURES, &labels).increment(0);
    metrics::counter!(names::RESIGNATIONS, &labels).increment(0);
    metrics::counter!(names::CLOCK_DISAGREEMENTS, &labels).increment(0);
    let (pool, query_timeout) = (runtime.elector.pool.clone(), runtime.elector.query_timeout);
    let task = tokio::spawn(runtime.run().instrument(span));
    ElectorHandle { shared, pool, query_timeout, shutdown, leader_work, task: Some(task) }
}

impl ElectorHandle {
    /// The lease key.
    pub fn key(&self) -> &str {
        &self.shared.key
    }

    /// The owner identity this elector acquires as.
    pub fn owner(&self) -> &str {
        &self.shared.owner
    }

    /// The leadership state, updated on every election, renewal and loss.
    pub fn state(&self) -> watch::Receiver<LeaderState> {
        self.shared.state.subscribe()
    }

    /// Leadership changes from now on.
    pub fn events(&self) -> broadcast::Receiver<Event> {
        self.shared.events.subscribe()
    }

    /// The current leadership period, if this process leads and its deadline has not passed.
    pub fn leadership(&self) -> Option<Leadership> {
        // Planted bug (fault suite, `elector-deadline-ignored`): the period as the elector last
        // set it, its deadline not checked at the moment of acting.
        #[cfg(feature = "failpoints")]
        fail::fail_point!("elector-deadline-ignored", |_| self.shared.leadership.borrow().clone());
        self.shared.leadership.borrow().clone().filter(Leadership::is_valid)
    }

    /// Every leadership period as it starts and ends, for the daemons' leader pass.
    pub(crate) fn leadership_watch(&self) -> watch::Receiver<Option<Leadership>> {
        self.shared.leadership.subscribe()
    }

    /// The term to stamp writes with, if this process leads right now.
    pub fn current_term(&self) -> Option<i64> {
        self.leadership().map(|leadership| leadership.term())
    }

    /// Waits until this process leads; `None` once the elector is shut down.
    pub async fn wait_for_leadership(&self) -> Option<Leadership> {
        wait_for_leadership(self.shared.leadership.subscribe(), &self.shutdown).await
    }

    /// Runs `work` for every leadership period of this process, under that period's
    /// [`Leadership`]: it starts when the period starts and is stopped (dropped at its next
    /// await) the instant the period ends. Shutdown waits for it, bounded by the grace period.
    pub fn spawn_leader_work<F, Fut>(&self, mut work: F)
    where
        F: FnMut(Leadership) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send,
    {
        let leadership = self.shared.leadership.subscribe();
        let shutdown = self.shutdown.clone();
        self.leader_work.spawn(async move {
            while let Some(period) = wait_for_leadership(leadership.clone(), &shutdown).await {
                // Work that finishes early waits for the period's end before the next one.
                let _ = period.run(work(period.clone())).await;
                period.ended().await;
            }
        });
    }

    /// Calls `send` with the current fencing token, only while this process leads; the period
    /// is checked on every poll of the send, and the send is dropped if the period ends before
    /// it completes. Use it for writes through the gateway: put
    /// `FencingToken::HEADER: token.header_value()` on the request.
    ///
    /// [`Error::NotLeader`]: nothing was sent. [`Error::OutcomeUnknown`]: the period ended while
    /// the send was in flight, and it may have arrived (a request handed to a connection task
    /// goes on when its future is dropped): treat the write as indeterminate.
    pub async fn write_fenced<F, Fut, T>(&self, send: F) -> Result<T, Error>
    where
        F: FnOnce(FencingToken) -> Fut,
        Fut: Future<Output = T>,
    {
        let leadership = self.leadership().ok_or_else(|| Error::NotLeader { key: self.key().to_owned() })?;
        let token = leadership.fencing_token()?;
        leadership.run_send(send(token)).await
    }

    /// Attaches `value` (at most 4096 bytes of JSON text; JSON null clears it) to the lease for
    /// this process's current period (proclaim), replacing the one set at its start
    /// ([`crate::ElectorBuilder::value`]). Checked by the store against this owner and term, so
    /// a process whose period ended (a zombie) changes nothing: [`Error::NotLeader`]. Bounded by
    /// the query timeout ([`Error::Store`] past it).
    pub async fn set_value(&self, value: &serde_json::Value) -> Result<(), Error> {
        let key = self.key().to_owned();
        let text = value.to_string();
        if text.len() > store::MAX_LEASE_VALUE_BYTES {
            return Err(Error::InvalidSetting(format!(
                "the lease value is at most {} bytes of JSON, got {}",
                store::MAX_LEASE_VALUE_BYTES,
                text.len()
            )));
        }
        let term = self.current_term().ok_or_else(|| Error::NotLeader { key: key.clone() })?;
        let deadline = Instant::now() + self.query_timeout;
        let failed = |message: String| Error::Store { key: key.clone(), message };
        let client = match crate::pool::connection_by(&self.pool, deadline).await {
            Some(Ok(client)) => client,
            Some(Err(error)) => return Err(failed(format!("get a connection from the pool: {}", error_chain(&error)))),
            None => return Err(failed("timed out getting a connection".to_owned())),
        };
        match timeout_at(deadline, store::set_lease_value(&**client, &key, &self.shared.owner, term, &text)).await {
            Ok(Ok(true)) => Ok(()),
            Ok(Ok(false)) => Err(Error::NotLeader { key }),
            Ok(Err(error)) => {
                if error.is_store_failure() {
                    discard(client);
                }
                Err(failed(error_chain(&error)))
            }
            Err(_) => {
                discard(client);
                Err(failed("timed out".to_owned()))
            }
        }
    }

    /// An appender to `stream` of the fenced log (schema version 16) under this process's
    /// leadership: its appends carry the current term, stop at the period's deadline, and are
    /// refused by the store for a term that no longer leads (see [`crate::log`]). The stream
    /// must exist, bound to this elector's lease (`fencing.create_stream`).
    pub fn appender(&self, stream: impl Into<String>) -> crate::log::Appender {
        crate::log::Appender::new(
            Arc::clone(&self.shared.key),
            stream.into(),
            self.pool.clone(),
            self.query_timeout,
            self.shared.leadership.subscribe(),
        )
    }

    /// The token that stops the elector's task (as dropping this handle does).
    pub(crate) fn stop_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// Stops the elector: cancels leader work and waits for it (bounded by the shutdown
    /// grace), then releases the lease so a follower takes over at once. Returns true when the
    /// lease was released by this call.
    pub async fn shutdown(mut self) -> bool {
        self.shutdown.cancel();
        match self.task.take() {
            Some(task) => task.await.unwrap_or(false),
            None => false,
        }
    }
}

impl Drop for ElectorHandle {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

async fn wait_for_leadership(
    mut leadership: watch::Receiver<Option<Leadership>>,
    shutdown: &CancellationToken,
) -> Option<Leadership> {
    loop {
        if let Some(period) = leadership.borrow_and_update().clone().filter(Leadership::is_valid) {
            return Some(period);
        }
        tokio::select! {
            () = shutdown.cancelled() => return None,
            changed = leadership.changed() => changed.ok()?,
        }
    }
}

/// Why a store call did not answer.
enum CallError {
    TimedOut,
    /// What went wrong, for logs and the loss reason.
    Failed(String),
}

#[derive(Clone, Copy)]
enum LeaseCall {
    Acquire,
    Renew,
}

/// The background task's state.
struct Runtime {
    elector: Elector,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
    leader_work: TaskTracker,
    metric_labels: [(&'static str, String); 1],
    /// The store's clock against this host's boot clock, round trip by round trip.
    clock: std::sync::Mutex<ClockWatch>,
    /// The two agreed since the last disagreement: only then does the elector lead.
    clock_agreed: std::sync::atomic::AtomicBool,
}

impl Runtime {
    /// Follows and leads until shut down; returns whether the lease was released at the end.
    async fn run(self) -> bool {
        loop {
            let Some((reply, sent)) = self.acquire().await else {
                self.leader_work.close();
                return false;
            };
            match self.lead(&reply, sent).await {
                LossReason::Shutdown => return self.finish_leading().await,
                _ => continue,
            }
        }
    }

    /// Tries to acquire until it succeeds (returning the reply and when it was sent) or the
    /// elector is shut down.
    async fn acquire(&self) -> Option<(LeaseReply, Sent)> {
        let mut failures: u32 = 0;
        let mut last_seen: Option<(Option<String>, Option<i64>)> = None;
        let topic = crate::watch::lease_topic(&self.elector.key);
        loop {
            if self.shutdown.is_cancelled() {
                return None;
            }
            // Before the call: a release heard after it wakes the wait below.
            let mut wakes = self.elector.wakeups.as_ref().map(crate::watch::Wakeups::subscribe);
            // Lead only with a clock that agrees with the store's (a leader's deadline is counted
            // on it): two probes a moment apart, unless acquires have shown it already.
            if !self.clock_agreed.load(std::sync::atomic::Ordering::Acquire) && !self.probe_clock().await {
                tokio::select! {
                    () = self.shutdown.cancelled() => return None,
                    () = sleep(self.retry_delay()) => {}
                }
                continue;
            }
            let sent = Sent::now();
            let call_deadline = sent.wake + self.elector.acquire_timeout;
            // Shutdown does not wait for an acquire (which may wait out the old period's grants):
            // the call is dropped (its query is never cancelled: the server's statement_timeout
            // ends it before it commits), and nothing it grants is acted on.
            let answer = tokio::select! {
                () = self.shutdown.cancelled() => return None,
                answer = self.call(LeaseCall::Acquire, call_deadline) => answer,
            };
            let delay = match answer {
                Ok(reply) if reply.ok && self.shutdown.is_cancelled() => {
                    // Shut down while the acquire ran: end the period at once, quietly; it was
                    // never anyone's to act on.
                    self.release().await;
                    return None;
                }
                Ok(reply)
                    if reply.ok
                        && BootInstant::now()
                            >= self.deadline(sent, &reply).boot.min(sent.boot + self.elector.acquire_timeout) =>
                {
                    // The answer came too late to act on: never publish a period whose deadline
                    // is behind us. The next acquire starts a new period with a new term.
                    warn!(term = ?reply.term, "acquire answered after its call deadline; not leading with it");
                    Duration::ZERO
                }
                Ok(reply) if reply.ok && !self.observe_clock(sent.boot, &reply) => {
                    // The clocks disagree: a deadline counted on this host's clock is not to be
                    // trusted. The period is given back; the elector leads again once they agree.
                    warn!(term = ?reply.term, "acquired, but the store's clock disagrees with this host's; not leading");
                    self.release().await;
                    self.retry_delay()
                }
                Ok(reply) if reply.ok => return Some((reply, sent)),
                Ok(reply) => {
                    failures = 0;
                    self.observe_clock(sent.boot, &reply);
                    let seen = (reply.holder.clone(), reply.term);
                    if last_seen.as_ref() != Some(&seen) {
                        match &seen.0 {
                            Some(_) => debug!(holder = ?seen.0, term = ?seen.1, "lease held by another owner"),
                            None => debug!(term = ?seen.1, lock_delay = ?reply.lock_delay, "lease in its lock-delay"),
                        }
                        self.shared.publish(Event::HolderChanged { holder: seen.0.clone(), term: seen.1 });
                        last_seen = Some(seen);
                    }
                    // In a lock-delay, the next try comes no earlier than its end.
                    self.retry_delay().max(reply.lock_delay)
                }
                Err(error) => {
                    failures = failures.saturating_add(1);
                    match error {
                        CallError::TimedOut => warn!(failures, "acquire timed out"),
                        CallError::Failed(error) => warn!(failures, %error, "acquire failed"),
                    }
                    self.backoff(failures)
                }
            };
            tokio::select! {
                () = self.shutdown.cancelled() => return None,
                () = sleep(delay) => {}
                // The lease changed (released, handed over): try again now.
                () = crate::watch::changed(wakes.as_mut(), &topic) => {}
            }
        }
    }

    /// Leads from a successful acquire until the period ends; returns why it ended. Leader work
    /// is cancelled and the state is Follower again when this returns.
    async fn lead(&self, reply: &LeaseReply, sent: Sent) -> LossReason {
        let Some(term) = reply.term else {
            return LossReason::RenewFailed { error: "the store granted a lease without a term".to_owned() };
        };
        let mut deadline = self.deadline(sent, reply);
        let token = CancellationToken::new();
        let (deadline_tx, deadline_rx) = watch::channel(deadline);
        // The period ends at its deadline even when this runtime is too busy to notice: a thread
        // of its own cancels the period's token then (S7).
        let watchdog = spawn_watchdog(token.clone(), deadline_rx.clone());
        let period_work = tokio_util::task::TaskTracker::new();
        let leadership =
            Leadership::new(Arc::clone(&self.shared.key), term, token.clone(), deadline_rx, period_work.clone());
        self.shared.leadership.send_replace(Some(leadership));
        self.shared.state.send_replace(LeaderState::Leader { term, deadline: deadline.wake });
        self.shared.publish(Event::Elected { term });
        metrics::gauge!(names::IS_LEADER, &self.metric_labels).set(1.0);
        metrics::gauge!(names::TERM, &self.metric_labels).set(term as f64);
        self.record_remaining(deadline);
        info!(term, "elected");

        let mut last_sent = sent;
        let topic = crate::watch::lease_topic(&self.elector.key);
        let mut wakes = self.elector.wakeups.as_ref().map(crate::watch::Wakeups::subscribe);
        let reason = loop {
            let next_renew = last_sent.wake + self.jittered_renew_interval();
            tokio::select! {
                biased;
                () = token.cancelled() => break LossReason::DeadlinePassed,
                () = sleep_until(deadline.wake) => break LossReason::DeadlinePassed,
                () = self.shutdown.cancelled() => break LossReason::Shutdown,
                () = sleep_until(next_renew) => {}
                // The lease changed (a handover requested): renew now to hear of it.
                () = crate::watch::changed(wakes.as_mut(), &topic) => {}
            }
            let sent = Sent::now();
            if sent.boot >= deadline.boot || token.is_cancelled() {
                break LossReason::DeadlinePassed;
            }
            let call_deadline = deadline.wake.min(sent.wake + self.elector.query_timeout);
            match self.call(LeaseCall::Renew, call_deadline).await {
                // A reply handled after the old deadline never brings the period back: the
                // period ended at its deadline, whatever the store said since (no revival).
                Ok(_) if BootInstant::now() >= deadline.boot || token.is_cancelled() => {
                    break LossReason::DeadlinePassed;
                }
                Ok(reply) if reply.ok && reply.term == Some(term) && !self.observe_clock(sent.boot, &reply) => {
                    break LossReason::ClockDisagreement;
                }
                Ok(reply) if reply.ok && reply.term == Some(term) => {
                    let renewed = self.deadline(sent, &reply);
                    if renewed.boot <= BootInstant::now() {
                        break LossReason::DeadlinePassed;
                    }
                    deadline = renewed;
                    last_sent = sent;
                    deadline_tx.send_replace(deadline);
                    self.shared.state.send_replace(LeaderState::Leader { term, deadline: deadline.wake });
                    self.record_remaining(deadline);
                    if reply.resign_requested {
                        break LossReason::Resigned;
                    }
                }
                Ok(reply) => {
                    break LossReason::RenewRefused { holder: reply.holder };
                }
                Err(CallError::TimedOut) if BootInstant::now() >= deadline.boot => {
                    break LossReason::DeadlinePassed;
                }
                Err(CallError::TimedOut) => break LossReason::RenewTimedOut,
                Err(CallError::Failed(error)) => break LossReason::RenewFailed { error },
            }
        };

        // Step down: stop leader work first, then tell everyone.
        token.cancel();
        if let Some(watchdog) = watchdog {
            watchdog.thread().unpark();
        }
        drop(deadline_tx);
        self.shared.leadership.send_replace(None);
        self.shared.state.send_replace(LeaderState::Follower);
        if !matches!(reason, LossReason::Shutdown | LossReason::Resigned) {
            metrics::counter!(names::RENEW_FAILURES, &self.metric_labels).increment(1);
        }
        metrics::gauge!(names::IS_LEADER, &self.metric_labels).set(0.0);
        metrics::gauge!(names::TERM, &self.metric_labels).set(0.0);
        metrics::gauge!(names::LEASE_REMAINING_SECONDS, &self.metric_labels).set(0.0);
        match &reason {
            LossReason::Shutdown => info!(term, "stepped down for shutdown"),
            LossReason::Resigned => info!(term, "stepped down: a handover was requested"),
            other => warn!(term, reason = other.as_label(), detail = ?other, "lost leadership"),
        }
        self.shared.publish(Event::Lost { term, reason: reason.clone() });
        if reason == LossReason::Resigned {
            metrics::counter!(names::RESIGNATIONS, &self.metric_labels).increment(1);
            self.finish_resigning(&period_work).await;
        }
        reason
    }

    /// After stepping down for shutdown: waits for leader work (bounded), then releases. When
    /// leader work overran the grace, it may still be running: the lease is not released then,
    /// so no successor starts beside it before the lease expires.
    async fn finish_leading(&self) -> bool {
        self.leader_work.close();
        if tokio::time::timeout(self.elector.shutdown_grace, self.leader_work.wait()).await.is_err() {
            warn!(
                grace = ?self.elector.shutdown_grace,
                "leader work did not stop within the shutdown grace; not releasing the lease, it will expire"
            );
            return false;
        }
        self.release().await
    }

    /// After stepping down for a handover: waits for the period's work and sends to stop
    /// (bounded by the shutdown grace), releases (only when they stopped in time: otherwise the
    /// lease expires, so no successor starts beside them), then waits a ttl before trying to
    /// lead again, so another owner takes over.
    async fn finish_resigning(&self, period_work: &tokio_util::task::TaskTracker) {
        period_work.close();
        let drained = tokio::time::timeout(self.elector.shutdown_grace, period_work.wait()).await.is_ok();
        if drained {
            self.release().await;
        } else {
            warn!(
                grace = ?self.elector.shutdown_grace,
                "leader work did not stop within the shutdown grace; not releasing the lease, it will expire"
            );
        }
        tokio::select! {
            () = self.shutdown.cancelled() => {}
            () = sleep(self.elector.ttl) => {}
        }
    }

    /// Releases the lease (bounded by the query timeout); true when it was released.
    async fn release(&self) -> bool {
        let call_deadline = Instant::now() + self.elector.query_timeout;
        let released = match timeout_at(call_deadline, self.pooled(call_deadline)).await {
            Ok(Ok(client)) => {
                match timeout_at(call_deadline, store::release(&**client, &self.elector.key, &self.elector.owner)).await
                {
                    Ok(Ok(released)) => released,
                    Ok(Err(error)) => {
                        warn!(error = %error_chain(&error), "release failed; the lease will expire by itself");
                        false
                    }
                    Err(_) => {
                        warn!("release timed out; the lease will expire by itself");
                        false
                    }
                }
            }
            _ => {
                warn!("no connection to release the lease; it will expire by itself");
                false
            }
        };
        if released {
            info!("released the lease");
        }
        released
    }

    /// Compares the store's clock, as `reply` shows it (its expiry less what remains), with this
    /// host's boot clock over the call sent at `sent`; false when they disagree (counted, logged).
    fn observe_clock(&self, sent: BootInstant, reply: &LeaseReply) -> bool {
        let received = BootInstant::now();
        let Some(expires_at) = reply.expires_at.filter(|_| !reply.remaining.is_zero()) else { return true };
        let Ok(since_epoch) = expires_at.duration_since(std::time::UNIX_EPOCH) else { return true };
        let store_secs = since_epoch.as_secs_f64() - reply.remaining.as_secs_f64();
        self.clock_verdict(ClockSample { sent, received, store_secs })
    }

    fn clock_verdict(&self, sample: ClockSample) -> bool {
        let verdict = match self.clock.lock() {
            Ok(mut watch) => watch.observe(sample),
            Err(_) => ClockVerdict::Unknown,
        };
        match verdict {
            ClockVerdict::Unknown => true,
            ClockVerdict::Agrees { .. } => {
                self.clock_agreed.store(true, std::sync::atomic::Ordering::Release);
                true
            }
            ClockVerdict::Disagrees { store_secs, local_min_secs, local_max_secs } => {
                self.clock_agreed.store(false, std::sync::atomic::Ordering::Release);
                metrics::counter!(names::CLOCK_DISAGREEMENTS, &self.metric_labels).increment(1);
                warn!(
                    store_secs,
                    local_min_secs,
                    local_max_secs,
                    "the store's clock and this host's boot clock disagree (a step of the store's wall clock, or a \
                     clock running fast or slow); see docs/operations.md, \"Clocks disagree\""
                );
                false
            }
        }
    }

    /// Reads the store's clock twice, a moment apart; true when it agrees with this host's.
    async fn probe_clock(&self) -> bool {
        for round in 0..2 {
            if round > 0 {
                sleep(CLOCK_PROBE_GAP).await;
            }
            let sent = BootInstant::now();
            let call_deadline = Instant::now() + self.elector.query_timeout;
            let Ok(client) = self.pooled(call_deadline).await else { return false };
            let read = timeout_at(call_deadline, client.query_one(STORE_CLOCK_SQL, &[])).await;
            let store_secs = match read {
                Ok(Ok(row)) => match row.try_get::<_, f64>(0) {
                    Ok(secs) => secs,
                    Err(_) => return false,
                },
                Ok(Err(_)) | Err(_) => {
                    discard(client);
                    return false;
                }
            };
            if !self.clock_verdict(ClockSample { sent, received: BootInstant::now(), store_secs }) {
                return false;
            }
        }
        self.clock_agreed.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The local deadline: when the call was sent, plus the store's remaining time, minus the
    /// safety margin (S7), on both clocks. Never based on a wall clock.
    fn deadline(&self, sent: Sent, reply: &LeaseReply) -> Deadline {
        // Planted bug (fault suite, `elector-margin-added`): the margin added, not taken off, so
        // the deadline falls after the store's expiry.
        #[cfg(feature = "failpoints")]
        fail::fail_point!("elector-margin-added", |_| Deadline {
            wake: sent.wake + reply.remaining + self.elector.safety_margin,
            boot: sent.boot + reply.remaining + self.elector.safety_margin,
        });
        Deadline {
            wake: (sent.wake + reply.remaining).checked_sub(self.elector.safety_margin).unwrap_or(sent.wake),
            boot: (sent.boot + reply.remaining).checked_sub(self.elector.safety_margin).unwrap_or(sent.boot),
        }
    }

    fn record_remaining(&self, deadline: Deadline) {
        let remaining = deadline.boot.saturating_duration_since(BootInstant::now());
        metrics::gauge!(names::LEASE_REMAINING_SECONDS, &self.metric_labels).set(remaining.as_secs_f64());
    }

    /// The renew interval, up to `RENEW_JITTER` early, never late.
    fn jittered_renew_interval(&self) -> Duration {
        let factor = 1.0 - RENEW_JITTER * rand::rng().random::<f64>();
        self.elector.renew_interval.mul_f64(factor)
    }

    /// The wait while another owner holds the lease: half to all of the retry interval.
    fn retry_delay(&self) -> Duration {
        self.elector.retry_interval.mul_f64(0.5 + 0.5 * rand::rng().random::<f64>())
    }

    /// Exponential backoff with full jitter after `failures` store errors, capped by the retry
    /// interval.
    fn backoff(&self, failures: u32) -> Duration {
        let exponential = BACKOFF_BASE.saturating_mul(2u32.saturating_pow(failures.min(16)));
        let cap = exponential.min(self.elector.retry_interval);
        cap.mul_f64(rand::rng().random::<f64>())
    }

    async fn pooled(&self, call_deadline: Instant) -> Result<Object, CallError> {
        match crate::pool::connection_by(&self.elector.pool, call_deadline).await {
            Some(Ok(client)) => Ok(client),
            Some(Err(error)) => {
                Err(CallError::Failed(format!("get a connection from the pool: {}", error_chain(&error))))
            }
            None => Err(CallError::TimedOut),
        }
    }

    /// One acquire or renew, answered by `call_deadline` or abandoned. A connection whose call
    /// failed or was abandoned is dropped from the pool (never cancelled: see [`discard`]), so a
    /// stuck query never delays the next call.
    async fn call(&self, call: LeaseCall, call_deadline: Instant) -> Result<LeaseReply, CallError> {
        let client = self.pooled(call_deadline).await?;
        let (key, owner, ttl) = (&self.elector.key, &self.elector.owner, self.elector.ttl);
        // The server gives up on its own too: a call this process abandoned (timed out, or
        // the process paused) can never commit later and grant a term nobody uses. An acquire
        // may take longer (it waits out the old period's grants); waiting for another caller's
        // lock never may.
        let limit = self.elector.query_timeout.as_millis().max(1);
        let statement_limit = match call {
            LeaseCall::Acquire => self.elector.acquire_timeout.as_millis().max(1),
            LeaseCall::Renew => limit,
        };
        // READ COMMITTED whatever the database's default: a new term or a release decides on
        // the newest rows (fencing.lease_grant_ms refuses an older snapshot).
        let limits = format!(
            "SET statement_timeout = {statement_limit}; SET lock_timeout = {limit}; \
             SET default_transaction_isolation = 'read committed'"
        );
        match timeout_at(call_deadline, client.batch_execute(&limits)).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                discard(client);
                return Err(CallError::Failed(error_chain(&error)));
            }
            Err(_) => {
                discard(client);
                return Err(CallError::TimedOut);
            }
        }
        let answer = match call {
            // Every acquire asks for a new period: a period this process held before and ended
            // locally (or whose reply it never saw) is over, so it never leads again with its
            // term (S2).
            LeaseCall::Acquire => {
                timeout_at(call_deadline, store::acquire_new_period(&**client, key, owner, ttl)).await
            }
            LeaseCall::Renew => timeout_at(call_deadline, store::renew(&**client, key, owner, ttl)).await,
        };
        match answer {
            Ok(Ok(reply)) => {
                // The period's value (proclaim), on the same connection, within the call's time:
                // not part of the leadership, so a failure only leaves the period without one.
                if let (LeaseCall::Acquire, true, Some(term), Some(value)) =
                    (call, reply.ok, reply.term, self.elector.value.as_deref())
                {
                    let deadline = call_deadline.min(Instant::now() + self.elector.query_timeout);
                    match timeout_at(deadline, store::set_lease_value(&**client, key, owner, term, value)).await {
                        Ok(Ok(_)) => {}
                        Ok(Err(error)) => {
                            warn!(error = %error_chain(&error), term, "could not attach the lease's value for this period");
                            if error.is_store_failure() {
                                discard(client);
                            }
                        }
                        Err(_) => {
                            warn!(term, "attaching the lease's value for this period timed out");
                            discard(client);
                        }
                    }
                }
                Ok(reply)
            }
            Ok(Err(error)) if server_gave_up(&error) => {
                // The server's statement or lock timeout, the twin of the client's.
                discard(client);
                Err(CallError::TimedOut)
            }
            Ok(Err(error)) => {
                if error.is_store_failure() {
                    discard(client);
                }
                Err(CallError::Failed(error_chain(&error)))
            }
            Err(_) => {
                discard(client);
                Err(CallError::TimedOut)
            }
        }
    }
}

/// One read through `pool`, bounded by `limit` from the connection's checkout to the answer, as
/// [`Error::Store`] for `key` otherwise. A connection whose read failed at the store or timed out
/// leaves the pool (never cancelled: see [`discard`]).
pub(crate) async fn read_within<T>(
    pool: &deadpool_postgres::Pool,
    limit: Duration,
    key: &str,
    read: impl AsyncFnOnce(&tokio_postgres::Client) -> Result<T, fencing_schema::Error>,
) -> Result<T, Error> {
    let failed = |message: String| Error::Store { key: key.to_owned(), message };
    let deadline = Instant::now() + limit;
    let client = match crate::pool::connection_by(pool, deadline).await {
        Some(Ok(client)) => client,
        Some(Err(error)) => return Err(failed(format!("get a connection from the pool: {}", error_chain(&error)))),
        None => return Err(failed("timed out getting a connection".to_owned())),
    };
    match timeout_at(deadline, read(&**client)).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) => {
            if error.is_store_failure() {
                discard(client);
            }
            Err(failed(error_chain(&error)))
        }
        Err(_) => {
            discard(client);
            Err(failed("timed out".to_owned()))
        }
    }
}

/// True when the server cancelled the call at its statement or lock timeout.
fn server_gave_up(error: &fencing_schema::Error) -> bool {
    let fencing_schema::Error::Store(error) = error else { return false };
    error.as_db_error().is_some_and(|db| matches!(db.code().code(), "57014" | "55P03"))
}

/// A thread that cancels `token` when the period's boot-clock deadline passes, whatever the
/// async runtime is doing; renewals move the deadline it waits for. It ends when the token is
/// cancelled (it is unparked then). `None` when no thread can be started: the runtime's timers
/// still end the period.
fn spawn_watchdog(
    token: CancellationToken,
    deadline: watch::Receiver<Deadline>,
) -> Option<std::thread::JoinHandle<()>> {
    let spawned = std::thread::Builder::new().name("election-deadline".to_owned()).spawn(move || {
        loop {
            if token.is_cancelled() {
                return;
            }
            let until = deadline.borrow().boot;
            let now = BootInstant::now();
            if now >= until {
                token.cancel();
                return;
            }
            std::thread::park_timeout(until.saturating_duration_since(now));
        }
    });
    match spawned {
        Ok(handle) => Some(handle),
        Err(error) => {
            warn!(%error, "cannot start the deadline thread; the period ends by the runtime's timers only");
            None
        }
    }
}

/// Cancels whatever the connection is running and removes it from the pool.
pub(crate) fn discard(client: Object) {
    // Closed, never cancelled: PostgreSQL answers a cancel of a commit that waits for its
    // synchronous standby by committing on the primary alone (visible there, lost in a
    // failover). Each call's `statement_timeout` already ends a statement still running.
    drop(Object::take(client));
}

pub(crate) fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Who leads `key` now, by the store's clock, and the value its holder attached for its period
/// (observe): `None` while nobody holds it. Read with one query, bounded by `timeout`.
pub async fn observe(pool: &deadpool_postgres::Pool, key: &str, timeout: Duration) -> Result<Option<Leader>, Error> {
    let row = read_within(pool, timeout, key, async |client| store::get_lease(client, key).await).await?;
    Ok(row.filter(|row| !row.remaining.is_zero()).map(|row| Leader {
        value: row.value.as_deref().and_then(|text| serde_json::from_str(text).ok()),
        owner: row.owner,
        term: row.term,
        remaining: row.remaining,
    }))
}

/// The holder of a lease as [`observe`] read it.
#[derive(Debug, Clone, PartialEq)]
pub struct Leader {
    /// The holder's owner identity.
    pub owner: String,
    /// Its term.
    pub term: i64,
    /// How long it holds the lease by the store's clock (as read, rounded down).
    pub remaining: Duration,
    /// The value it attached for this term, if any.
    pub value: Option<serde_json::Value>,
}
