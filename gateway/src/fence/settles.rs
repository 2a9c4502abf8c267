//! Settle waits, as lengths (S5). A store decision at a term that is still settling says how long
//! a write must wait, counted from the decision: every lower-term write through any gateway may
//! be forwarded until then. The store cannot say how much of that length is left (it would need
//! an instant of its wall clock), so this gateway remembers, per fence, the earliest end it has
//! seen for that settle on its own monotonic clock: a later decision at the same term waits only
//! until then. Once that end has passed (plus the settle margin), every lower-term write has
//! passed its deadline, and this gateway tells the store (`fencing.mark_settled`), so that the
//! next decisions, through any gateway, wait no more.
//!
//! The writes decided before that mark still wait the settle, so the store keeps it (drain_ms) and
//! the next term settles behind it, until this gateway has seen the settle and the longest
//! forward timeout pass since the mark and says so too (`fencing.mark_drained`). So a settle
//! grows from term to term (by the forward timeout each time) only while terms change faster
//! than a settle drains: each new term waits for every lower term's writes that may still be sent.
//!
//! A settle length is stretched by the clock-rate allowance: the lower-term gateways counted
//! their deadlines on their own clocks, which may run slower than this one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_postgres::Pool;
use tokio::time::{Instant, sleep, sleep_until, timeout};
use tracing::debug;

use fencing_schema::store::Gate;

use crate::fence::decision::ClockTicket;

/// Beyond this many settling fences the table starts over (a forgotten settle is waited again).
const CAPACITY: usize = 100_000;

/// What the store said of one fence's settle, and what this gateway made of it.
#[derive(Debug, Clone)]
struct Settle {
    term: i64,
    lease_key: Option<String>,
    /// The length the store recorded (what `fencing.mark_settled` names).
    settle_ms: i64,
    /// The store's name of this settle: a later settle of the same term, binding and length has
    /// another (a rebinding away and back), and a mark of this one never ends it.
    settle_id: i64,
    /// The earliest end seen, on this gateway's monotonic clock.
    end: Instant,
    /// The store has been (or is being) told.
    marking: bool,
    /// The clocks' agreement `end` was counted under: an end from before a disagreement is not
    /// used after it.
    generation: u64,
}

/// What a mark of a settle names (`fencing.mark_settled`, `fencing.mark_drained`).
#[derive(Debug)]
struct Mark {
    resource: String,
    term: i64,
    lease_key: Option<String>,
    settle_ms: i64,
    settle_id: i64,
}

/// The fences this gateway has seen settling (cheap to clone: one table).
#[derive(Debug, Clone)]
pub(super) struct Settles {
    table: Arc<Mutex<HashMap<String, Settle>>>,
    pool: Pool,
    /// Added to the end before the store is told: bytes sent just before a deadline may still be
    /// on their way.
    margin: Duration,
    /// A length another gateway counted on its clock, counted on this one: (1 + rho) / (1 - rho)
    /// for the clock-rate allowance rho (one clock may run that much slow, the other as fast).
    stretch: f64,
    check_timeout: Duration,
    /// The runtime the store was made on: the marks are sent from there.
    runtime: tokio::runtime::Handle,
}

/// Remembers `fresh`, a decision's view of `resource`'s settle, in `table`: the earliest end seen
/// for that very settle (same name, term, binding, length and clocks' agreement), or `fresh`'s own
/// end when the settle is another one, even one equal in all but its name. Returns the end to
/// wait for, and the mark to send once it has passed, if none is on its way yet.
fn remember(table: &mut HashMap<String, Settle>, resource: &str, fresh: Settle) -> (Instant, Option<Mark>) {
    if table.len() >= CAPACITY && !table.contains_key(resource) {
        table.clear();
    }
    let same = |held: &Settle| {
        held.settle_id == fresh.settle_id
            && held.term == fresh.term
            && held.lease_key == fresh.lease_key
            && held.settle_ms == fresh.settle_ms
            && held.generation == fresh.generation
    };
    let entry = table.entry(resource.to_owned()).or_insert_with(|| fresh.clone());
    if same(entry) {
        entry.end = entry.end.min(fresh.end);
    } else {
        *entry = fresh;
    }
    if entry.marking {
        return (entry.end, None);
    }
    entry.marking = true;
    let mark = Mark {
        resource: resource.to_owned(),
        term: entry.term,
        lease_key: entry.lease_key.clone(),
        settle_ms: entry.settle_ms,
        settle_id: entry.settle_id,
    };
    (entry.end, Some(mark))
}

impl Settles {
    pub(super) fn new(pool: Pool, margin: Duration, rho: f64, check_timeout: Duration) -> Settles {
        let stretch = (1.0 + rho) / (1.0 - rho);
        Settles {
            table: Arc::default(),
            pool,
            margin,
            stretch,
            check_timeout,
            runtime: tokio::runtime::Handle::current(),
        }
    }

    /// The wait of a write whose decision, answered at `answered` under the clocks' agreement
    /// `clocks`, said `gate.wait` at `term` of `resource` (bound to `gate.lease_key`), in the
    /// settle `gate.settle_id`: until the earliest end this gateway has seen for that settle,
    /// stretched by the clock-rate allowance. Zero when there is nothing to wait for. (A wait
    /// without a settle's name cannot come from a store of version 10, which names every settle;
    /// it would be waited in full and never marked.)
    pub(super) fn wait(
        &self,
        resource: &str,
        term: i64,
        gate: &Gate,
        (answered, clocks): (Instant, &ClockTicket),
    ) -> Duration {
        let (lease_key, wait) = (gate.lease_key.as_deref(), gate.wait);
        if wait.is_zero() {
            return Duration::ZERO;
        }
        let end = answered + wait.mul_f64(self.stretch);
        let Some(settle_id) = gate.settle_id else { return end.saturating_duration_since(answered) };
        let settle_ms = i64::try_from(wait.as_millis()).unwrap_or(i64::MAX);
        let Ok(mut table) = self.table.lock() else { return end.saturating_duration_since(answered) };
        let fresh = Settle {
            term,
            lease_key: lease_key.map(str::to_owned),
            settle_ms,
            settle_id,
            end,
            marking: false,
            generation: clocks.generation(),
        };
        let (end, mark) = remember(&mut table, resource, fresh);
        drop(table);
        if let Some(mark) = mark {
            self.mark_after(end + self.margin, mark, clocks.clone());
        }
        end.saturating_duration_since(answered)
    }

    /// Tells the store, once `at` has passed, that the settle `mark` is over; then, once the length the store answers has passed since, that the
    /// writes decided before that mark (which still waited the settle) have passed their
    /// deadlines too, so the next term need not settle behind them. A failure costs only waits:
    /// decisions keep saying the length, and this gateway's table still knows its end.
    ///
    /// Both lengths are counted on this gateway's clock, and a mark ends the settle for every
    /// gateway: so neither is sent unless the clocks have agreed with the store's all along
    /// (`clocks`). Otherwise the entry is forgotten and the settle waits on, its full length,
    /// until a decision under agreeing clocks marks it.
    fn mark_after(
        &self,
        at: Instant,
        Mark { resource, term, lease_key, settle_ms, settle_id }: Mark,
        clocks: ClockTicket,
    ) {
        let (pool, check_timeout, table) = (self.pool.clone(), self.check_timeout, Arc::clone(&self.table));
        let (margin, stretch) = (self.margin, self.stretch);
        self.runtime.spawn(async move {
            sleep_until(at).await;
            let forget = || {
                if let Ok(mut table) = table.lock()
                    && table
                        .get(&resource)
                        .is_some_and(|held| held.settle_id == settle_id && held.generation == clocks.generation())
                {
                    table.remove(&resource);
                }
            };
            if !clocks.holds() {
                forget();
                return;
            }
            let call = |sql: &'static str| {
                let (pool, resource, lease_key) = (pool.clone(), resource.clone(), lease_key.clone());
                async move {
                    let client = pool.get().await.map_err(|error| error.to_string())?;
                    client
                        .query_one(sql, &[&resource, &term, &lease_key, &settle_ms, &settle_id])
                        .await
                        .map_err(|error| error.to_string())
                }
            };
            let marked = timeout(check_timeout, call("SELECT fencing.mark_settled($1, $2, $3, $4, $5)")).await;
            let drain = match marked {
                // The store says no wait any more: the entry is of no further use.
                Ok(Ok(row)) => {
                    if let Ok(mut table) = table.lock()
                        && table.get(&resource).is_some_and(|held| held.settle_id == settle_id)
                    {
                        table.remove(&resource);
                    }
                    row.try_get::<_, Option<i64>>(0).ok().flatten()
                }
                // The store goes on saying the length; this gateway's entry keeps its end, so its
                // own writes wait no more, and another gateway marks it after its own wait.
                Ok(Err(error)) => {
                    debug!(%resource, term, %error, "could not mark a settle as over");
                    None
                }
                Err(_) => {
                    debug!(%resource, term, "marking a settle as over timed out");
                    None
                }
            };
            // Counted from now, after the mark: the writes decided before it were sent within
            // `drain` of it, each on its own gateway's clock.
            let Some(drain) = drain.and_then(|ms| u64::try_from(ms).ok()) else { return };
            sleep(Duration::from_millis(drain).mul_f64(stretch) + margin).await;
            if !clocks.holds() {
                return;
            }
            match timeout(check_timeout, call("SELECT fencing.mark_drained($1, $2, $3, $4, $5)")).await {
                Ok(Ok(_)) => {}
                Ok(Err(error)) => debug!(%resource, term, %error, "could not mark a settle as drained"),
                Err(_) => debug!(%resource, term, "marking a settle as drained timed out"),
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::time::Duration;

    use tokio::time::Instant;

    use super::{Settle, remember};

    fn settle(settle_id: i64, end: Instant) -> Settle {
        Settle {
            term: 7,
            lease_key: Some("k".to_owned()),
            settle_ms: 1000,
            settle_id,
            end,
            marking: false,
            generation: 1,
        }
    }

    /// One settle seen twice: the earlier end counts, and one mark is sent.
    #[test]
    fn the_earliest_end_of_one_settle_is_kept_and_marked_once() {
        let mut table = HashMap::new();
        let now = Instant::now();
        let (end, mark) = remember(&mut table, "r", settle(1, now + Duration::from_secs(2)));
        assert_eq!(end, now + Duration::from_secs(2));
        assert!(mark.is_some_and(|mark| mark.settle_id == 1));
        let (end, mark) = remember(&mut table, "r", settle(1, now + Duration::from_secs(1)));
        assert_eq!(end, now + Duration::from_secs(1), "the earlier end of the same settle");
        assert!(mark.is_none(), "its mark is on its way already");
        let (end, _) = remember(&mut table, "r", settle(1, now + Duration::from_secs(3)));
        assert_eq!(end, now + Duration::from_secs(1));
    }

    /// A settle equal to an older one in term, binding and length but not in name (a rebinding
    /// away and back at one term): its writes wait its own end, never the older settle's earlier
    /// one, and it gets its own mark. Before settle names, the older end was kept, and a write of
    /// the newer binding could be sent while one of the previous binding was still on its way.
    #[test]
    fn a_newer_settle_equal_but_for_its_name_never_inherits_an_older_end() {
        let mut table = HashMap::new();
        let now = Instant::now();
        let (_, older_mark) = remember(&mut table, "r", settle(1, now + Duration::from_millis(100)));
        assert!(older_mark.is_some());
        let (end, mark) = remember(&mut table, "r", settle(2, now + Duration::from_secs(5)));
        assert_eq!(end, now + Duration::from_secs(5), "the newer settle's own end");
        assert!(mark.is_some_and(|mark| mark.settle_id == 2), "the newer settle is marked by its own name");
    }
}
