//! The fence decision: one prepared call of `fencing.gate` or `fencing.gate_lease` per fenced
//! write, bounded by the fence-check timeout, and a cache of maxima that may refuse a stale
//! term on its own but never admit one.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod};
use fencing_schema::store::{GATE_LEASE_SQL, GATE_SQL, Gate, Outcome};
use tokio::time::{Instant, timeout_at};
use tokio_postgres::NoTls;
use tokio_postgres::types::ToSql;
use tracing::{debug, warn};

use crate::metrics as names;

/// Beyond this many cached resources the cache starts over: it is only an optimisation.
const CACHE_CAPACITY: usize = 100_000;

/// What a fenced write presents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Presented {
    /// Verify mode: `Fencing-Token`.
    Token(i64),
    /// Stamp mode: `Fencing-Lease` and `Fencing-Owner`.
    Lease {
        /// The lease key.
        key: String,
        /// The owner claiming to hold it.
        owner: String,
    },
}

/// Why a decision could not be made.
#[derive(Debug, thiserror::Error)]
pub enum Undecided {
    /// No answer within the fence-check timeout.
    #[error("the fence check timed out")]
    TimedOut,
    /// The store failed or could not be reached.
    #[error("the fence store failed: {0}")]
    Failed(String),
}

/// The fence store as the proxy uses it.
#[derive(Debug)]
pub struct FenceStore {
    pool: Pool,
    check_timeout: Duration,
    forward_timeout: Duration,
    /// The highest maximum seen per resource. Maxima never decrease, so a term below it is
    /// stale for sure; a term at or above it still goes to Postgres.
    cache: Mutex<HashMap<String, i64>>,
}

/// Builds the connection pool for `url`.
pub fn pool(url: &str, size: usize) -> Result<Pool, String> {
    let config: tokio_postgres::Config = url
        .parse()
        .map_err(|error| format!("database.url: {error}"))?;
    let manager = Manager::from_config(
        config,
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(size)
        .build()
        .map_err(|error| format!("database pool: {error}"))
}

impl FenceStore {
    /// A fence store on `pool`.
    pub fn new(pool: Pool, check_timeout: Duration, forward_timeout: Duration) -> FenceStore {
        FenceStore {
            pool,
            check_timeout,
            forward_timeout,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// The pool, for the control API.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The highest maximum this gateway has seen for `resource`.
    fn cached_max(&self, resource: &str) -> Option<i64> {
        self.cache.lock().ok()?.get(resource).copied()
    }

    fn remember(&self, resource: &str, max_term: Option<i64>) {
        let (Some(max_term), Ok(mut cache)) = (max_term, self.cache.lock()) else {
            return;
        };
        if cache.len() >= CACHE_CAPACITY && !cache.contains_key(resource) {
            cache.clear();
        }
        let entry = cache.entry(resource.to_owned()).or_insert(max_term);
        *entry = (*entry).max(max_term);
    }

    /// Decides one fenced write: admitted (with how long to wait before forwarding) or refused.
    /// A stale token below the cached maximum is refused without a round trip.
    pub async fn decide(
        &self,
        resource: &str,
        presented: &Presented,
        bind_lease: Option<&str>,
    ) -> Result<Gate, Undecided> {
        if let Presented::Token(term) = presented
            && let Some(max) = self.cached_max(resource).filter(|max| term < max)
        {
            metrics::counter!(names::CACHED_REFUSALS).increment(1);
            return Ok(Gate {
                outcome: Outcome::Stale,
                term: Some(*term),
                max_term: Some(max),
                lease_key: None,
                lease_term: None,
                wait: Duration::ZERO,
            });
        }
        let started = Instant::now();
        let result = self
            .call(
                resource,
                presented,
                bind_lease,
                started + self.check_timeout,
            )
            .await;
        metrics::histogram!(names::CHECK_DURATION).record(started.elapsed().as_secs_f64());
        match &result {
            Ok(gate) => self.remember(resource, gate.max_term),
            Err(Undecided::TimedOut) => {
                metrics::counter!(names::STORE_ERRORS, "kind" => "timeout").increment(1)
            }
            Err(Undecided::Failed(_)) => {
                metrics::counter!(names::STORE_ERRORS, "kind" => "error").increment(1)
            }
        }
        result
    }

    async fn call(
        &self,
        resource: &str,
        presented: &Presented,
        bind_lease: Option<&str>,
        deadline: Instant,
    ) -> Result<Gate, Undecided> {
        let client = match timeout_at(deadline, self.pool.get()).await {
            Ok(Ok(client)) => client,
            Ok(Err(error)) => return Err(Undecided::Failed(format!("get a connection: {error}"))),
            Err(_) => return Err(Undecided::TimedOut),
        };
        let forward_ms = i64::try_from(self.forward_timeout.as_millis()).unwrap_or(i64::MAX);
        let answer = timeout_at(deadline, async {
            match presented {
                Presented::Token(term) => {
                    let statement = client.prepare_cached(GATE_SQL).await?;
                    let params: [&(dyn ToSql + Sync); 4] =
                        [&resource, term, &forward_ms, &bind_lease];
                    client.query_one(&statement, &params).await
                }
                Presented::Lease { key, owner } => {
                    let statement = client.prepare_cached(GATE_LEASE_SQL).await?;
                    let params: [&(dyn ToSql + Sync); 5] =
                        [&resource, key, owner, &forward_ms, &bind_lease];
                    client.query_one(&statement, &params).await
                }
            }
        })
        .await;
        match answer {
            Ok(Ok(row)) => {
                Gate::from_row(&row).map_err(|error| Undecided::Failed(error.to_string()))
            }
            Ok(Err(error)) => {
                let failure = fencing_schema::Error::from(error);
                if failure.is_store_failure() {
                    discard(client);
                }
                debug!(error = %failure, "fence decision failed");
                Err(Undecided::Failed(failure.to_string()))
            }
            Err(_) => {
                warn!(timeout = ?self.check_timeout, "fence decision timed out");
                discard(client);
                Err(Undecided::TimedOut)
            }
        }
    }
}

/// Cancels whatever the connection is running and removes it from the pool.
pub fn discard(client: Object) {
    let cancel = client.cancel_token();
    drop(Object::take(client));
    tokio::spawn(async move {
        let _ = cancel.cancel_query(NoTls).await;
    });
}
