//! Connections from a pool within a call's deadline, without wasting the ones being opened.

use std::time::Duration;

use deadpool_postgres::{Object, Pool, PoolError};
use tokio::time::{Instant, timeout, timeout_at};

/// How long a connection the pool started to open for a call may take after that call's
/// deadline has passed, before it is given up.
pub const OPEN_LIMIT: Duration = Duration::from_secs(10);

/// A connection from `pool` by `deadline`, or `None` when the deadline passed first.
///
/// A connection the pool is still opening at the deadline is not abandoned: it is opened in a
/// task of its own, for at most [`OPEN_LIMIT`], and then goes to the pool for the next call.
/// Abandoned halfway, the server would have started and authenticated a backend for nothing,
/// and on a server too slow to open one within a call's timeout every call would start one
/// more and none would finish. (Seen: 50 nodes heartbeating every 100 ms on a loaded machine
/// opened 2,400 sessions in 10 s, and no node heard all the others.) A call that has to wait
/// for a connection another call holds waits no longer than its deadline, as before.
pub async fn connection_by(pool: &Pool, deadline: Instant) -> Option<Result<Object, PoolError>> {
    let status = pool.status();
    // Nothing idle and a free place: this get opens a new connection.
    let opens = status.available == 0 && status.size + status.waiting < status.max_size;
    if !opens {
        return timeout_at(deadline, pool.get()).await.ok();
    }
    let pool = pool.clone();
    let mut opening = tokio::spawn(async move { timeout(OPEN_LIMIT, pool.get()).await });
    match timeout_at(deadline, &mut opening).await {
        Ok(Ok(Ok(got))) => Some(got),
        // Given up after the open limit (only when the deadline is further away), or the task
        // ended without an answer (the runtime is shutting down).
        Ok(Ok(Err(_)) | Err(_)) => None,
        // The task goes on: a connection it opens is dropped with its answer, into the pool.
        Err(_) => None,
    }
}
