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
    /// As many synchronous standbys as `synchronous_standby_names` asks for are connected.
    Protected(String),
    /// Standbys are named and some are connected, but this role cannot see which are synchronous
    /// (it lacks pg_read_all_stats).
    Unverified(String),
    /// The store is a primary that waits for no standby.
    NoSynchronousStandby,
    /// Standbys are named, but fewer than it asks for are connected as synchronous now: durable
    /// commits wait.
    SynchronousStandbyMissing(String),
    /// The store is itself a standby (read-only).
    InRecovery,
    /// The store did not answer; nothing is said until it does.
    Unknown,
}

const QUERY: &str = "SELECT pg_is_in_recovery(),
       current_setting('synchronous_standby_names'),
       (SELECT count(*) FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum')),
       (SELECT count(*) FROM pg_stat_replication),
       pg_has_role(current_user, 'pg_read_all_stats', 'USAGE')";

/// How many synchronous standbys `synchronous_standby_names` asks to confirm a commit:
/// `FIRST n (..)`, `ANY n (..)` and `n (..)` ask for n, a plain list for one.
fn standbys_asked(names: &str) -> i64 {
    let names = names.trim();
    let lower = names.to_ascii_lowercase();
    let rest = ["first", "any"]
        .iter()
        .find_map(|keyword| lower.strip_prefix(keyword).filter(|rest| rest.starts_with(char::is_whitespace)))
        .unwrap_or(&lower)
        .trim_start();
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    if rest[digits.len()..].trim_start().starts_with('(') { digits.parse().unwrap_or(1).max(1) } else { 1 }
}

fn verdict(in_recovery: bool, names: String, synchronous: i64, connected: i64, sees_stats: bool) -> Verdict {
    if in_recovery {
        Verdict::InRecovery
    } else if names.trim().is_empty() {
        Verdict::NoSynchronousStandby
    } else if connected == 0 || (sees_stats && synchronous < standbys_asked(&names)) {
        Verdict::SynchronousStandbyMissing(names)
    } else if sees_stats {
        Verdict::Protected(names)
    } else {
        Verdict::Unverified(names)
    }
}

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
        Ok(verdict(row.try_get(0)?, row.try_get(1)?, row.try_get(2)?, row.try_get(3)?, row.try_get(4)?))
    })();
    parsed.unwrap_or(Verdict::Unknown)
}

fn report(verdict: &Verdict) {
    match verdict {
        Verdict::Protected(names) => {
            info!(synchronous_standby_names = %names, "the fence store commits every decision to a synchronous standby");
        }
        Verdict::Unverified(names) => info!(
            synchronous_standby_names = %names,
            "the fence store names synchronous standbys and has standbys connected; this role cannot see whether \
             they are synchronous (grant it pg_read_all_stats to have that checked)"
        ),
        Verdict::NoSynchronousStandby => warn!(
            "the fence store is a primary without a synchronous standby (synchronous_standby_names is empty): \
             a failover to an asynchronous standby can lose answered terms, fences and grants, and a zombie's \
             write would then be admitted; set synchronous_standby_names (docs/operations.md: Running on Postgres HA), or \
             database.standby_check = \"off\" if this Postgres never fails over"
        ),
        Verdict::SynchronousStandbyMissing(names) => warn!(
            synchronous_standby_names = %names,
            "fewer synchronous standbys of the fence store are connected than synchronous_standby_names asks \
             for: durable commits wait for them, so fence decisions that write time out (503) until they are back"
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

#[cfg(test)]
mod tests {
    use super::{Verdict, standbys_asked, verdict};

    #[test]
    fn the_number_of_synchronous_standbys_asked_for_is_read_from_every_form_of_the_setting() {
        for (names, asked) in [
            ("s1", 1),
            ("s1, s2", 1),
            ("*", 1),
            ("FIRST 2 (s1, s2, s3)", 2),
            ("first 3 (s1,s2,s3)", 3),
            ("ANY 2 (s1, s2)", 2),
            ("2 (s1, s2)", 2),
            ("\"first\"", 1),
            ("any", 1),
        ] {
            assert_eq!(standbys_asked(names), asked, "{names}");
        }
    }

    #[test]
    fn a_named_standby_that_is_not_connected_is_missing_not_protected() {
        let names = || "ANY 2 (s1, s2)".to_owned();
        assert_eq!(verdict(false, names(), 0, 0, true), Verdict::SynchronousStandbyMissing(names()));
        assert_eq!(verdict(false, names(), 0, 0, false), Verdict::SynchronousStandbyMissing(names()));
        assert_eq!(verdict(false, names(), 1, 1, true), Verdict::SynchronousStandbyMissing(names()));
        assert_eq!(verdict(false, names(), 2, 2, true), Verdict::Protected(names()));
        assert_eq!(verdict(false, names(), 0, 2, false), Verdict::Unverified(names()));
        assert_eq!(verdict(false, String::new(), 0, 1, true), Verdict::NoSynchronousStandby);
        assert_eq!(verdict(true, names(), 0, 0, true), Verdict::InRecovery);
    }
}
