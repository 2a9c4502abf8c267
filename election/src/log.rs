//! Replication model B on the fenced log (`fencing.append`, schema version 16): the leader
//! appends its decisions with its term ([`Appender`]), followers tail them in order into a
//! projection of their own ([`Follower`]).
//!
//! - An append is admitted by the store only for the stream's lease's current term while the
//!   lease is held: a zombie's append is refused ([`Error::NotLeader`]), and this process's own
//!   appender stops at its local deadline, like any fenced send ([`crate::Leadership::run_send`]).
//! - A follower applies entries in sequence order, each at least once: it reports the last
//!   applied sequence to the store (its durable cursor, `fencing.report_position`) after each
//!   batch, and a restarted follower resumes after it, so an entry applied and not yet reported
//!   is applied again. `apply` gets the sequence number to make that idempotent.
//! - The store numbers entries without a gap in commit order, so a follower never skips one;
//!   one behind retention is told to resnapshot ([`Error::Compacted`]).

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use fencing_schema::log as store;
pub use fencing_schema::log::Entry;
use tokio::sync::watch;
use tokio::time::{Instant, timeout, timeout_at};
use tokio_util::sync::CancellationToken;

use crate::error::Error;
use crate::runtime::{discard, error_chain};
use crate::state::Leadership;
use crate::watch::{Wake, Wakeups};

/// Counter: appends by an [`Appender`], by `stream` and `outcome`: `admitted`, `refused` (the
/// store refused the term, or this process did not lead), `unknown` (the outcome is unknown: the
/// period ended in flight or no answer came in time), `failed` (the store failed; nothing
/// appended).
pub const APPENDS: &str = "election_log_appends_total";
/// Gauge: entries of `stream` appended and not applied by `follower`, as of its last report.
pub const FOLLOWER_LAG_ENTRIES: &str = "election_follower_lag_entries";
/// Gauge: how long ago the first entry of `stream` that `follower` has not applied was appended,
/// in seconds, as of its last report (0 when it applied all).
pub const FOLLOWER_LAG_SECONDS: &str = "election_follower_lag_seconds";

/// Appends to one stream as this process's leader: see [`crate::ElectorHandle::appender`].
#[derive(Debug, Clone)]
pub struct Appender {
    key: Arc<str>,
    stream: String,
    pool: Pool,
    query_timeout: Duration,
    leadership: watch::Receiver<Option<Leadership>>,
}

impl Appender {
    pub(crate) fn new(
        key: Arc<str>,
        stream: String,
        pool: Pool,
        query_timeout: Duration,
        leadership: watch::Receiver<Option<Leadership>>,
    ) -> Appender {
        Appender { key, stream, pool, query_timeout, leadership }
    }

    /// The stream appended to.
    pub fn stream(&self) -> &str {
        &self.stream
    }

    /// Appends `payloads` (1 to 1000 JSON values) under this process's current leadership period,
    /// and returns the sequence number of the first (the others follow it without a gap). See
    /// [`Appender::append_in`].
    pub async fn append(&self, payloads: &[serde_json::Value]) -> Result<i64, Error> {
        let leadership = self.leadership.borrow().clone().filter(Leadership::is_valid);
        let Some(leadership) = leadership else {
            metrics::counter!(APPENDS, "stream" => self.stream.clone(), "outcome" => "refused").increment(1);
            return Err(Error::NotLeader { key: self.key.to_string() });
        };
        self.append_in(&leadership, payloads).await
    }

    /// Appends `payloads` with the term of `leadership`, that period only: a decision made in one
    /// period is never appended under a later one of this process ([`Error::NotLeader`] once it
    /// ended). The store admits it only while that term leads the stream's lease, and only on a
    /// stream bound to this elector's lease. One transaction, bounded by the query timeout on
    /// the server as well (`statement_timeout`, `lock_timeout`), sent as a fenced send
    /// ([`Leadership::run_send`]).
    ///
    /// - [`Error::NotLeader`]: the period ended, or the store refused the term (a newer term
    ///   leads, the lease is not held, the stream is another lease's): nothing was appended.
    /// - [`Error::OutcomeUnknown`]: the commit was sent and no answer came (the period ended, or
    ///   the query timeout passed): it may have committed, and a follower sees it if it did.
    /// - [`Error::Store`]: the store failed before the commit was sent: nothing was appended.
    pub async fn append_in(&self, leadership: &Leadership, payloads: &[serde_json::Value]) -> Result<i64, Error> {
        let texts: Vec<String> = payloads.iter().map(serde_json::Value::to_string).collect();
        let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
        let (stream, key) = (self.stream.as_str(), &*self.key);
        let result = self
            .fenced(leadership, async |client, term| store::append_for_lease(client, stream, term, key, &texts).await)
            .await;
        let outcome = match &result {
            Ok(_) => "admitted",
            Err(Error::NotLeader { .. }) => "refused",
            Err(Error::OutcomeUnknown { .. }) => "unknown",
            Err(_) => "failed",
        };
        metrics::counter!(APPENDS, "stream" => self.stream.clone(), "outcome" => outcome).increment(1);
        result
    }

    /// The new leader's barrier before it reads the stream to rebuild its state: takes the
    /// stream's fence with the term of `leadership` (`fencing.open_stream`), which waits for the
    /// old term's appends still open (they may commit) and refuses every later one, and returns
    /// the head once they are done. Read up to it, then decide and append.
    pub async fn open(&self, leadership: &Leadership) -> Result<i64, Error> {
        let (stream, key) = (self.stream.as_str(), &*self.key);
        self.fenced(leadership, async |client, term| store::open_stream(client, stream, term, Some(key)).await).await
    }

    /// One call in a transaction of its own under `leadership`'s term, bounded by the query
    /// timeout on both sides.
    async fn fenced<T>(
        &self,
        leadership: &Leadership,
        call: impl AsyncFnOnce(&tokio_postgres::Client, i64) -> Result<T, fencing_schema::Error>,
    ) -> Result<T, Error> {
        let key = self.key.to_string();
        let term = leadership.check().map_err(|_| Error::NotLeader { key: key.clone() })?;
        let failed = |message: String| Error::Store { key: key.clone(), message };
        let deadline = Instant::now() + self.query_timeout;
        let client = match crate::pool::connection_by(&self.pool, deadline).await {
            Some(Ok(client)) => client,
            Some(Err(error)) => return Err(failed(format!("get a connection from the pool: {}", error_chain(&error)))),
            None => return Err(failed("timed out getting a connection".to_owned())),
        };
        let limit = deadline.saturating_duration_since(Instant::now()).as_millis().max(1);
        let committing = std::sync::atomic::AtomicBool::new(false);
        let work = async {
            client
                .batch_execute(&format!(
                    "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL statement_timeout = {limit}; \
                     SET LOCAL lock_timeout = {limit}"
                ))
                .await
                .map_err(fencing_schema::Error::from)?;
            let value = call(&client, term).await?;
            committing.store(true, std::sync::atomic::Ordering::SeqCst);
            client.batch_execute("COMMIT").await.map_err(fencing_schema::Error::from)?;
            Ok::<T, fencing_schema::Error>(value)
        };
        let sent = leadership.run_send(timeout_at(deadline, work)).await;
        let committed_maybe = committing.load(std::sync::atomic::Ordering::SeqCst);
        let what = format!("stream {:?}", self.stream);
        // A failed or abandoned call's connection is closed, never cancelled (a cancel of a
        // commit waiting for a synchronous standby commits it on the primary alone); a
        // transaction still open is rolled back with it.
        match sent {
            Ok(Ok(Ok(value))) => Ok(value),
            Ok(Ok(Err(error))) => {
                discard(client);
                Err(match error {
                    fencing_schema::Error::Refused { .. } => Error::NotLeader { key },
                    _ if committed_maybe => Error::OutcomeUnknown { key },
                    error => failed(format!("{what}: {}; nothing was appended", error_chain(&error))),
                })
            }
            Ok(Err(_)) => {
                discard(client);
                Err(if committed_maybe {
                    Error::OutcomeUnknown { key }
                } else {
                    failed(format!("{what}: no answer in time; nothing was appended"))
                })
            }
            Err(_) => {
                discard(client);
                Err(if committed_maybe { Error::OutcomeUnknown { key } } else { Error::NotLeader { key } })
            }
        }
    }
}

/// How far a follower is behind the stream, as of its last read or report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lag {
    /// The last sequence applied (and reported).
    pub applied: i64,
    /// Entries appended and not applied, as the store said at `as_of`.
    pub entries: i64,
    /// How long ago the first entry not applied was appended, as the store said at `as_of`
    /// (zero when none).
    pub behind: Duration,
    /// When the store said so, on this process's monotonic clock (the instant the question was
    /// sent, so that the bound below errs on the safe side).
    pub as_of: Instant,
}

impl Lag {
    /// Whether the follower's state is at most `bound` behind the stream now: every entry it
    /// has not applied was appended at most `bound` ago. Counted without guessing: an entry
    /// appended since `as_of` may exist unseen, so the lag now is at most `behind` plus the time
    /// since `as_of`. A follower outside the bound says so, and the caller reads from the leader.
    pub fn within(&self, bound: Duration) -> bool {
        self.behind.saturating_add(self.as_of.elapsed()) <= bound
    }
}

/// A follower of one stream: see [`Follower::run`].
#[derive(Debug)]
pub struct Follower {
    pool: Pool,
    stream: String,
    name: String,
    wakeups: Wakeups,
    batch: i32,
    query_timeout: Duration,
    report_every: Duration,
    lag: watch::Sender<Option<Lag>>,
}

/// The most entries one read asks for.
pub const DEFAULT_BATCH: i32 = 100;

/// How long a read or report may take.
pub const DEFAULT_QUERY_TIMEOUT: Duration = Duration::from_secs(5);

/// How often a caught-up follower reads when no wake-up comes (while the wake-ups' listening
/// connection is down, or with [`Wakeups::polling`]).
pub const POLL: Duration = Duration::from_millis(250);

/// The longest a caught-up follower goes without reading and reporting, unless
/// [`Follower::report_every`] says otherwise: with the wake-ups' connection listening, a lost
/// wake-up costs at most this much, and a gateway routing reads within a bound (`[routes.reads]`)
/// counts a follower whose report is older than its bound as behind.
pub const DEFAULT_REPORT_EVERY: Duration = Duration::from_secs(1);

impl Follower {
    /// A follower named `name` (unique per stream: its cursor is kept under it) of `stream`,
    /// woken by `wakeups` on every append (`Wakeups::polling()` to poll only).
    pub fn new(pool: Pool, stream: impl Into<String>, name: impl Into<String>, wakeups: Wakeups) -> Follower {
        Follower {
            pool,
            stream: stream.into(),
            name: name.into(),
            wakeups,
            batch: DEFAULT_BATCH,
            query_timeout: DEFAULT_QUERY_TIMEOUT,
            report_every: DEFAULT_REPORT_EVERY,
            lag: watch::Sender::new(None),
        }
    }

    /// The most entries one read asks for (1 to 10,000).
    pub fn batch(mut self, entries: i32) -> Follower {
        self.batch = entries.clamp(1, 10_000);
        self
    }

    /// How long each read or report may take.
    pub fn query_timeout(mut self, limit: Duration) -> Follower {
        self.query_timeout = limit;
        self
    }

    /// The longest this follower goes without reading and reporting while caught up (10 ms to
    /// an hour; default [`DEFAULT_REPORT_EVERY`]). A gateway that routes reads to followers
    /// within a bound counts a report older than the bound as behind: report at least twice per
    /// bound.
    pub fn report_every(mut self, every: Duration) -> Follower {
        self.report_every = every.clamp(Duration::from_millis(10), Duration::from_secs(3600));
        self
    }

    /// The lag as of the last read or report; `None` before the first.
    pub fn lag(&self) -> watch::Receiver<Option<Lag>> {
        self.lag.subscribe()
    }

    /// Whether this follower's projection is within `bound` of the stream now (see
    /// [`Lag::within`]); false before its first read.
    pub fn within(&self, bound: Duration) -> bool {
        self.lag.borrow().is_some_and(|lag| lag.within(bound))
    }

    /// Tails the stream until `stop` is cancelled: from the follower's durable cursor (its last
    /// reported sequence; 0 for a new follower), calls `apply` with every entry in order, and
    /// reports the last applied sequence after each batch. An entry applied and not reported
    /// when the process stops is applied again by the next run: make `apply` idempotent with the
    /// entry's sequence. Waits for new entries on the wake-ups (an append notifies
    /// `log:<stream>`), and reads every [`POLL`] without them.
    ///
    /// Returns `Ok` when stopped, [`Error::Compacted`] when retention removed entries this
    /// follower has not applied (take a snapshot and report its position, then run again), and
    /// [`Error::Apply`] when `apply` failed (that entry was not reported; the next run applies
    /// it again). A store that fails or does not answer is retried with backoff.
    pub async fn run<F, Fut, E>(&self, mut apply: F, stop: CancellationToken) -> Result<(), Error>
    where
        F: FnMut(Entry) -> Fut,
        Fut: Future<Output = Result<(), E>>,
        E: std::fmt::Display,
    {
        let mut failures: u32 = 0;
        let mut applied = loop {
            match self.call(async |client| store::position(client, &self.stream, &self.name).await).await {
                Ok(position) => break position.unwrap_or(0),
                Err(error) => self.failed(&error, &mut failures, &stop).await?,
            }
            if stop.is_cancelled() {
                return Ok(());
            }
        };
        loop {
            if stop.is_cancelled() {
                return Ok(());
            }
            // Subscribed before the read: an append that commits after it wakes the wait.
            let mut wakes = self.wakeups.subscribe();
            let asked = Instant::now();
            let batch =
                match self.call(async |client| store::read(client, &self.stream, applied, self.batch).await).await {
                    Ok(batch) => batch,
                    Err(fencing_schema::Error::Compacted { first_seq, .. }) => {
                        return Err(Error::Compacted { stream: self.stream.clone(), applied, first_seq });
                    }
                    Err(error) => {
                        self.failed(&error, &mut failures, &stop).await?;
                        continue;
                    }
                };
            failures = 0;
            let full = batch.len() >= usize::try_from(self.batch).unwrap_or(usize::MAX);
            let had_entries = !batch.is_empty();
            for entry in batch {
                let seq = entry.seq;
                if let Err(error) = apply(entry).await {
                    // What was applied before it is reported, so the next run starts at it.
                    let _ = self.report(applied, asked).await;
                    return Err(Error::Apply { stream: self.stream.clone(), seq, message: error.to_string() });
                }
                applied = seq;
            }
            match self.report(applied, asked).await {
                Ok(()) => {}
                // Retention passed what it applied while it was away (paused between a read
                // and this report).
                Err(fencing_schema::Error::Compacted { first_seq, .. }) => {
                    return Err(Error::Compacted { stream: self.stream.clone(), applied, first_seq });
                }
                Err(error) => {
                    self.failed(&error, &mut failures, &stop).await?;
                    continue;
                }
            }
            if full || (had_entries && !self.wakeups.listening()) {
                continue;
            }
            let poll = if self.wakeups.listening() { self.report_every } else { self.report_every.min(POLL) };
            let topic = format!("log:{}", self.stream);
            let until = Instant::now() + poll;
            loop {
                tokio::select! {
                    biased;
                    () = stop.cancelled() => return Ok(()),
                    () = tokio::time::sleep_until(until) => break,
                    wake = wakes.recv() => match wake {
                        Ok(Wake::Topic(name)) if *name != *topic.as_str() => continue,
                        _ => break,
                    },
                }
            }
        }
    }

    /// Reports `applied` and publishes the lag it answers.
    async fn report(&self, applied: i64, asked: Instant) -> Result<(), fencing_schema::Error> {
        let reported =
            self.call(async |client| store::report_position(client, &self.stream, &self.name, applied).await).await?;
        let entries = (reported.head - applied).max(0);
        self.lag.send_replace(Some(Lag { applied, entries, behind: reported.lag, as_of: asked }));
        let labels = [("stream", self.stream.clone()), ("follower", self.name.clone())];
        metrics::gauge!(FOLLOWER_LAG_ENTRIES, &labels).set(entries as f64);
        metrics::gauge!(FOLLOWER_LAG_SECONDS, &labels).set(reported.lag.as_secs_f64());
        Ok(())
    }

    /// One call on a pooled connection, bounded by the query timeout.
    async fn call<T>(
        &self,
        call: impl AsyncFnOnce(&tokio_postgres::Client) -> Result<T, fencing_schema::Error>,
    ) -> Result<T, fencing_schema::Error> {
        let deadline = Instant::now() + self.query_timeout;
        let client = match crate::pool::connection_by(&self.pool, deadline).await {
            Some(Ok(client)) => client,
            Some(Err(error)) => {
                return Err(fencing_schema::Error::UnexpectedReply {
                    message: format!("get a connection from the pool: {}", error_chain(&error)),
                });
            }
            None => {
                return Err(fencing_schema::Error::UnexpectedReply {
                    message: "timed out getting a connection".to_owned(),
                });
            }
        };
        match timeout_at(deadline, call(&client)).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => {
                if error.is_store_failure() {
                    discard(client);
                }
                Err(error)
            }
            Err(_) => {
                discard(client);
                Err(fencing_schema::Error::UnexpectedReply { message: "no answer in time".to_owned() })
            }
        }
    }

    /// After a failed call: an error for bad input or a missing stream, else a backoff sleep
    /// (bounded by a second, cut short by `stop`, after which the caller sees `stop` cancelled).
    async fn failed(
        &self,
        error: &fencing_schema::Error,
        failures: &mut u32,
        stop: &CancellationToken,
    ) -> Result<(), Error> {
        if matches!(error, fencing_schema::Error::NoStream { .. } | fencing_schema::Error::InvalidArgument { .. }) {
            return Err(Error::Store { key: self.stream.clone(), message: error_chain(error) });
        }
        *failures = failures.saturating_add(1);
        let backoff = Duration::from_millis(50).saturating_mul(1 << (*failures).min(5)).min(Duration::from_secs(1));
        tracing::warn!(stream = %self.stream, follower = %self.name, error = %error_chain(error), "follower: read or report failed; retrying");
        let _ = timeout(backoff, stop.cancelled()).await;
        Ok(())
    }
}
