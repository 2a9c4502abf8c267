//! Watch over HTTP: `GET /v1/leases/{key}?wait=30s&after=<revision>` and the same on
//! `/v1/clusters/{cluster}/nodes`. The answer comes as soon as the state's revision differs from
//! `after` (at once if it already does), or when `wait` ends with the state unchanged; the
//! waiting is `fencing_election::watch::wait_for_change`, the same as the Rust library's.
//!
//! Bounded: `wait` is cut to `control.watch_max_wait_ms`, and at most
//! `control.max_watchers` watches wait at once on a gateway, `control.max_watchers_per_client`
//! per client; past either, 429.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use axum::http::StatusCode;
use serde_json::json;
use tokio::time::Instant;

use crate::config::ControlConfig;
use crate::metrics as names;
use crate::problem::Problem;
use crate::security::auth::Caller;

/// A watch's query: `after` (the revision the caller saw) and `wait` (how long to wait for a
/// change). Without `after`, the state is answered at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct WatchQuery {
    pub(super) after: Option<i64>,
    pub(super) wait: Option<Duration>,
}

impl WatchQuery {
    /// Parses the query string; 400 for anything else than `after` and `wait`, once each.
    pub(super) fn parse(query: Option<&str>) -> Result<WatchQuery, Problem> {
        let mut parsed = WatchQuery::default();
        for pair in query.unwrap_or_default().split('&').filter(|pair| !pair.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            match name {
                "after" if parsed.after.is_none() => {
                    let after = value.parse::<i64>().ok().filter(|after| *after >= 0);
                    parsed.after = Some(after.ok_or_else(|| {
                        bad_query(&format!("after must be a revision, a whole number of at least 0, got {value:?}"))
                    })?);
                }
                "wait" if parsed.wait.is_none() => parsed.wait = Some(parse_wait(value)?),
                "after" | "wait" => return Err(bad_query(&format!("{name} is given twice"))),
                other => {
                    return Err(bad_query(&format!(
                        "unknown query parameter {other:?}: only after and wait are known"
                    )));
                }
            }
        }
        if parsed.wait.is_some() && parsed.after.is_none() {
            return Err(bad_query(
                "wait needs after: the revision of the state you saw (0 for none), to wait for a change since",
            ));
        }
        Ok(parsed)
    }

    /// Whether the caller waits at all.
    pub(super) fn waits(&self) -> bool {
        self.after.is_some() && self.wait.is_some_and(|wait| !wait.is_zero())
    }
}

/// `30s`, `500ms`, `2m`: a whole number and a unit.
pub(super) fn parse_wait(value: &str) -> Result<Duration, Problem> {
    let split = value.find(|c: char| !c.is_ascii_digit()).unwrap_or(value.len());
    let (number, unit) = value.split_at(split);
    let number: Option<u64> = number.parse().ok();
    let wait = match (number, unit) {
        (Some(ms), "ms") => Some(Duration::from_millis(ms)),
        (Some(s), "s") => s.checked_mul(1000).map(Duration::from_millis),
        (Some(m), "m") => m.checked_mul(60_000).map(Duration::from_millis),
        _ => None,
    };
    wait.ok_or_else(|| {
        bad_query(&format!("wait must be a whole number with a unit (ms, s or m), e.g. 30s, got {value:?}"))
    })
}

fn bad_query(detail: &str) -> Problem {
    Problem::new(StatusCode::BAD_REQUEST, "invalid-query", "Invalid query", detail)
}

/// The watches waiting now, per client name, against the configured caps.
#[derive(Debug, Default)]
pub struct Watchers {
    counts: Mutex<HashMap<String, usize>>,
}

/// One waiting watch: counted until dropped.
pub(super) struct Slot<'a> {
    watchers: &'a Watchers,
    client: String,
}

impl Watchers {
    /// Counts a watch of `caller`'s in, or 429 past a cap.
    pub(super) fn enter<'a>(&'a self, caller: &Caller, config: &ControlConfig) -> Result<Slot<'a>, Problem> {
        let client = caller.name().to_owned();
        let Ok(mut counts) = self.counts.lock() else {
            return Err(Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "Unavailable",
                "the watch table is unusable",
            ));
        };
        let total: usize = counts.values().sum();
        let mine = counts.get(&client).copied().unwrap_or(0);
        let limit = if mine >= config.max_watchers_per_client {
            Some(("client", config.max_watchers_per_client, "this client"))
        } else if total >= config.max_watchers {
            Some(("gateway", config.max_watchers, "this gateway"))
        } else {
            None
        };
        if let Some((label, cap, whose)) = limit {
            metrics::counter!(names::WATCH_REFUSALS, "limit" => label).increment(1);
            return Err(Problem::new(
                StatusCode::TOO_MANY_REQUESTS,
                "too-many-watchers",
                "Too many watchers",
                &format!("{whose} already has {cap} watches waiting, the most it may have; retry, or watch less"),
            )
            .with("limit", json!(label))
            .with("max", json!(cap))
            .retry_after(1));
        }
        *counts.entry(client.clone()).or_default() += 1;
        metrics::gauge!(names::WATCHERS).set((total + 1) as f64);
        Ok(Slot { watchers: self, client })
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let Ok(mut counts) = self.watchers.counts.lock() else {
            return;
        };
        if let Some(count) = counts.get_mut(&self.client) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                counts.remove(&self.client);
            }
        }
        metrics::gauge!(names::WATCHERS).set(counts.values().sum::<usize>() as f64);
    }
}

/// When a watch with this query stops waiting: `wait` from now, cut to the configured longest.
pub(super) fn until(query: &WatchQuery, config: &ControlConfig) -> Instant {
    Instant::now() + query.wait.unwrap_or_default().min(config.watch_max_wait)
}

/// Exports whether `wakeups` listens (`fencing_watch_listening`) every second until `shutdown`.
pub async fn report_listening(
    wakeups: fencing_election::watch::Wakeups,
    shutdown: tokio_util::sync::CancellationToken,
) {
    loop {
        metrics::gauge!(names::WATCH_LISTENING).set(if wakeups.listening() { 1.0 } else { 0.0 });
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::WatchQuery;

    #[test]
    fn queries_parse_or_are_refused() {
        let parsed = |query: &str| WatchQuery::parse(Some(query));
        assert_eq!(parsed("").ok(), Some(WatchQuery::default()));
        assert_eq!(
            parsed("after=7&wait=30s").ok(),
            Some(WatchQuery { after: Some(7), wait: Some(Duration::from_secs(30)) })
        );
        assert_eq!(parsed("wait=250ms&after=0").ok().and_then(|q| q.wait), Some(Duration::from_millis(250)));
        assert_eq!(parsed("after=1&wait=2m").ok().and_then(|q| q.wait), Some(Duration::from_secs(120)));
        assert_eq!(parsed("after=3").ok(), Some(WatchQuery { after: Some(3), wait: None }));
        for bad in [
            "after=-1",
            "after=x",
            "after=",
            "after=1&after=2",
            "wait=30s",
            "after=1&wait=30",
            "after=1&wait=30h",
            "after=1&wait=s",
            "after=1&wait=99999999999999999999s",
            "after=1&wait=18446744073709551615m",
            "after=1&limit=3",
            "recursive",
        ] {
            let problem = parsed(bad).err();
            assert_eq!(problem.map(|p| p.status().as_u16()), Some(400), "{bad}");
        }
    }
}
