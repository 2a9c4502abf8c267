//! Whether a failover of the fence store could lose answered decisions: `serve` reads the
//! store's replication settings at start and every [`EVERY`] after, and warns while it is a
//! primary that no synchronous standby confirms commits to (`database.standby_check`).
//!
//! Every fencing function commits durably (`fencing.commit_durably`). With a synchronous
//! standby, that commit returns only once the standby has the decision, so a promoted standby
//! knows every term, fence and grant anyone was told of. With an asynchronous one it may not: a
//! term already answered is granted again, a fence goes back below an admitted term, a grant a
//! gateway still uses is forgotten (S2-S4 broken; `tests/tests/schema/failover.rs` shows it).
//! A single Postgres that never fails over loses nothing: `standby_check = "off"` silences this.

use std::time::Duration;

use deadpool_postgres::Pool;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// How often the store's replication is read again (a failover changes it).
pub const EVERY: Duration = Duration::from_secs(10);

/// What the store's replication means for answered decisions.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Verdict {
    /// A synchronous standby confirms every durable commit.
    Protected(String),
    /// The store is a primary that waits for no standby.
    NoSynchronousStandby,
    /// Standbys are named, but none of them is connected as synchronous now: durable commits wait.
    SynchronousStandbyMissing(String),
    /// The store is itself a standby (read-only).
    InRecovery,
    /// The store did not answer; nothing is said until it does.
    Unknown,
}

const QUERY: &str = "SELECT pg_is_in_recovery(),
       current_setting('synchronous_standby_names'),
       (SELECT count(*) FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum')),
       (SELECT count(*) FROM pg_stat_replication WHERE sync_state IS NOT NULL)";

async fn read(pool: &Pool, timeout: Duration) -> Verdict {
    let answer = tokio::time::timeout(timeout, async {
        let client = pool.get().await.map_err(|error| error.to_string())?;
        client.query_one(QUERY, &[]).await.map_err(|error| error.to_string())
    })
    .await;
    let Ok(Ok(row)) = answer else {
        return Verdict::Unknown;
    };
    let parsed = (|| -> Result<Verdict, tokio_postgres::Error> {
        let in_recovery: bool = row.try_get(0)?;
        let names: String = row.try_get(1)?;
        let synchronous: i64 = row.try_get(2)?;
        // Without pg_read_all_stats, the replication view shows no sync_state: go by the setting.
        let visible: i64 = row.try_get(3)?;
        Ok(if in_recovery {
            Verdict::InRecovery
        } else if names.trim().is_empty() {
            Verdict::NoSynchronousStandby
        } else if visible > 0 && synchronous == 0 {
            Verdict::SynchronousStandbyMissing(names)
        } else {
            Verdict::Protected(names)
        })
    })();
    parsed.unwrap_or(Verdict::Unknown)
}

fn report(verdict: &Verdict) {
    match verdict {
        Verdict::Protected(names) => {
            info!(synchronous_standby_names = %names, "the fence store commits every decision to a synchronous standby");
        }
        Verdict::NoSynchronousStandby => warn!(
            "the fence store is a primary without a synchronous standby (synchronous_standby_names is empty): \
             a failover to an asynchronous standby can lose answered terms, fences and grants, and a zombie's \
             write would then be admitted; set synchronous_standby_names (README: Running on Postgres HA), or \
             database.standby_check = \"off\" if this Postgres never fails over"
        ),
        Verdict::SynchronousStandbyMissing(names) => warn!(
            synchronous_standby_names = %names,
            "no synchronous standby of the fence store is connected: durable commits wait for one, so fence \
             decisions time out (503) until it is back"
        ),
        Verdict::InRecovery => warn!(
            "the fence store is a standby (read-only): fenced writes get 503; point database.url at the primary, \
             or list every host with target_session_attrs=read-write"
        ),
        Verdict::Unknown => {}
    }
}

/// Reads the store's replication now and every [`EVERY`] until `shutdown`; logs the verdict the
/// first time it is known and whenever it changes.
pub async fn watch(pool: Pool, timeout: Duration, shutdown: CancellationToken) {
    let mut last = Verdict::Unknown;
    loop {
        let verdict = read(&pool, timeout).await;
        if verdict != Verdict::Unknown && verdict != last {
            report(&verdict);
            last = verdict;
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(EVERY) => {}
        }
    }
}
