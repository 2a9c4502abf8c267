//! What the control handlers share: the configuration, the fence store, the control API's own
//! connections, and the answers computed once for many callers.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use metrics_exporter_prometheus::PrometheusHandle;

use crate::config::Config;
use crate::fence::FenceStore;
use crate::problem::Problem;

/// What the control handlers share.
#[derive(Debug, Clone)]
pub struct ControlState {
    /// The configuration (ttl bounds, timeouts).
    pub config: Arc<Config>,
    /// The fence store.
    pub fences: Arc<FenceStore>,
    /// The control API's own connections (`database.control_pool_size`).
    pub pool: deadpool_postgres::Pool,
    /// Renders `/metrics`.
    pub metrics: PrometheusHandle,
    /// The last term this gateway granted per key, to count leadership transitions.
    pub granted_terms: Arc<Mutex<HashMap<String, i64>>>,
    /// The lease keys counted under their own name in `fencing_lease_transitions_total`.
    pub named_keys: Arc<std::collections::BTreeSet<String>>,
    /// `/readyz`'s answer: one query at a time, shared by the callers that wait for it.
    pub readiness: Arc<Cached<Result<i32, Problem>>>,
    /// The count of refusals inside Postgres for `/metrics`, likewise.
    pub sql_refusals: Arc<Cached<Option<i64>>>,
    /// Membership calls in flight at once: at most all but one of the control pool's
    /// connections, so heartbeats can never take the connection a lease renewal needs.
    pub membership_calls: Arc<tokio::sync::Semaphore>,
    /// What wakes watches: this gateway's connection listening for changes.
    pub wakeups: fencing_election::watch::Wakeups,
    /// The watches waiting now, per client.
    pub watchers: Arc<crate::control::watch::Watchers>,
    /// Cancelled when the gateway stops: every waiting watch answers at once.
    pub shutdown: tokio_util::sync::CancellationToken,
}

/// A value computed by one caller at a time: callers that arrive while a computation is under
/// way wait for it and share its result, so a flood of probes or scrapes (no token or only a
/// read permission needed) holds at most one of the connections that renewals need.
#[derive(Debug)]
pub struct Cached<T> {
    value: tokio::sync::Mutex<Option<T>>,
    finished: std::sync::atomic::AtomicU64,
}

impl<T> Default for Cached<T> {
    fn default() -> Self {
        Cached { value: tokio::sync::Mutex::new(None), finished: std::sync::atomic::AtomicU64::new(0) }
    }
}

impl<T: Clone> Cached<T> {
    pub(super) async fn get<F: Future<Output = T>>(&self, compute: impl FnOnce() -> F) -> T {
        use std::sync::atomic::Ordering;
        let finished_before = self.finished.load(Ordering::SeqCst);
        let mut slot = match self.value.try_lock() {
            Ok(slot) => slot,
            Err(_) => {
                let slot = self.value.lock().await;
                // The computation that was under way when this caller came has finished.
                if self.finished.load(Ordering::SeqCst) > finished_before
                    && let Some(value) = slot.as_ref()
                {
                    return value.clone();
                }
                slot
            }
        };
        let value = compute().await;
        *slot = Some(value.clone());
        self.finished.fetch_add(1, Ordering::SeqCst);
        value
    }
}
