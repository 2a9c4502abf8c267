//! Reads within a lag bound (replication model B): a route with `[routes.reads]` sends each
//! unfenced request to a live member of its cluster that follows its stream and is within the
//! route's `max_lag`, and to the leader otherwise.
//!
//! What the gateway knows comes from one poll of the store every [`poll_interval`] per route:
//! - the cluster's live members (`fencing.members`), each announcing in its metadata where it
//!   serves reads (`read_url`) and the follower name it reports under (`follower`, default its
//!   node id);
//! - the stream's follower reports (`fencing.followers_of`): each follower's lag in time,
//!   measured by the store against the stream's own head (not what the follower says of
//!   itself), and how long ago it reported;
//! - the leader lease (`fencing.read_lease`): its holder's value (`read_url`) and its time left.
//!
//! Nothing is guessed. A follower is within the bound at instant t only when both its lag and
//! its report's age, as the poll found them, plus the time since that poll was *sent* (on this
//! gateway's monotonic clock), are within it: entries appended since the poll are counted as not
//! applied, and a follower that stops reporting (paused, partitioned, dead) drops out one bound
//! after its last report. A lag the store cannot tell (retention removed what the follower has
//! not applied) is never within. A follower name that two live members claim is neither's. A
//! poll that fails changes nothing, so every follower ages out. While this gateway sees its
//! clock and the store's disagree, no follower is within (the ages are the store's). The leader
//! is the lease's holder while the time the poll found left has not passed; without one, the
//! read is answered 503 `no-reader`.
//!
//! A `read_url` is used only when its scheme is the route upstream's, its host one of the route's
//! `allow_hosts` (default loopback), it has no path, query or user information, and it is not one
//! of this gateway's own listeners: a member cannot send a client's read anywhere it likes. A read
//! carries its hop count (`Fencing-Read-Hops`), and one that went through gateways three times is
//! refused (508 `read-loop`). Reads carry no fencing: lag here bounds staleness, never safety
//! (S1-S8 are untouched).

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use deadpool_postgres::Pool;
use http::Uri;
use http::uri::Scheme;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::config::{Reads, Route};
use crate::error_chain;
use crate::fence::FenceStore;
use crate::proxy::forward::Destination;

/// Counter `{route, served_by}`: unfenced requests of routes with `[routes.reads]`, by who
/// answered (`follower`, `leader`) or `none` (no reader known: 503).
pub const FOLLOWER_READS: &str = "fencing_follower_reads_total";

/// The `served_by` labels of [`FOLLOWER_READS`].
pub const SERVED_BY: [&str; 3] = ["follower", "leader", "none"];

/// Who served a read, for [`FOLLOWER_READS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    /// A follower within the bound.
    Follower,
    /// The leader.
    Leader,
    /// Nobody: 503 `no-reader`.
    None,
}

/// How often a route's view is polled: a quarter of its bound, from 25 ms to a second, so a
/// follower within the bound is seen so by most reads.
pub fn poll_interval(max_lag: Duration) -> Duration {
    (max_lag / 4).clamp(Duration::from_millis(25), Duration::from_secs(1))
}

/// Where one read goes.
#[derive(Debug, Clone)]
pub enum Choice {
    /// A follower within the bound: its name and where it serves.
    Follower(Arc<str>, Arc<Destination>),
    /// The leader (the lease holder's `read_url`, or the route's upstream).
    Leader(Arc<Destination>),
    /// No follower within the bound and no leader known.
    NoReader,
}

/// A follower as the last poll found it.
#[derive(Debug)]
struct Candidate {
    name: Arc<str>,
    destination: Arc<Destination>,
    /// Since the first entry it had not applied was appended (zero when none), by the store.
    lag: Duration,
    /// Since its last report, by the store.
    report_age: Duration,
}

/// What the last poll found, and when it was sent.
#[derive(Debug)]
struct View {
    asked: Instant,
    followers: Vec<Candidate>,
    /// The lease holder's `read_url` and the time its lease had left.
    leader: Option<(Arc<Destination>, Duration)>,
}

/// One route's reads: its view, refreshed by [`ReadRouter::poll`], and the choice per read.
#[derive(Debug)]
pub struct ReadRouter {
    reads: Reads,
    prefix: String,
    https: bool,
    /// The route's upstream: the leader when no leader lease is configured.
    upstream: Arc<Destination>,
    view: RwLock<Arc<View>>,
    next: AtomicUsize,
    served: [metrics::Counter; SERVED_BY.len()],
    /// This gateway's own listeners: never a read's destination.
    own: Vec<SocketAddr>,
    /// Whether this gateway's clock and the store's agree.
    fences: Arc<FenceStore>,
}

impl ReadRouter {
    /// The router of `route`, when it has `[routes.reads]`; no follower is known until its first
    /// poll.
    pub fn new(route: &Route, own: &[SocketAddr], fences: &Arc<FenceStore>) -> Option<Arc<ReadRouter>> {
        let reads = route.reads.clone()?;
        let upstream = Arc::new(Destination::new(route.upstream.clone())?);
        let served = SERVED_BY
            .map(|label| metrics::counter!(FOLLOWER_READS, "route" => route.prefix.clone(), "served_by" => label));
        for counter in &served {
            counter.absolute(0);
        }
        Some(Arc::new(ReadRouter {
            reads,
            prefix: route.prefix.clone(),
            https: route.upstream.scheme() == Some(&Scheme::HTTPS),
            upstream,
            view: RwLock::new(Arc::new(View { asked: Instant::now(), followers: Vec::new(), leader: None })),
            next: AtomicUsize::new(0),
            served,
            own: own.to_vec(),
            fences: Arc::clone(fences),
        }))
    }

    /// Counts one read, by who served it.
    pub fn served(&self, by: Served) {
        let index = match by {
            Served::Follower => 0,
            Served::Leader => 1,
            Served::None => 2,
        };
        self.served[index].increment(1);
    }

    /// Where a read goes now: a follower within the bound (in turn), else the leader.
    pub fn choose(&self) -> Choice {
        let view = match self.view.read() {
            Ok(view) => Arc::clone(&view),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        };
        let since = view.asked.elapsed();
        let bound = self.reads.max_lag;
        let within = |candidate: &&Candidate| {
            candidate.lag.saturating_add(since) <= bound && candidate.report_age.saturating_add(since) <= bound
        };
        // The ages are the store's clock's: while this gateway sees it disagree with its own, none
        // is trusted.
        let count = if self.fences.clocks_agree() { view.followers.iter().filter(within).count() } else { 0 };
        if count > 0 {
            let turn = self.next.fetch_add(1, Ordering::Relaxed) % count;
            match view.followers.iter().filter(within).nth(turn) {
                Some(chosen) => Choice::Follower(Arc::clone(&chosen.name), Arc::clone(&chosen.destination)),
                None => Choice::NoReader,
            }
        } else if self.reads.leader_lease.is_none() {
            Choice::Leader(Arc::clone(&self.upstream))
        } else {
            match &view.leader {
                Some((leader, left)) if since < *left => Choice::Leader(Arc::clone(leader)),
                _ => Choice::NoReader,
            }
        }
    }

    /// The leader, for a read whose follower could not be reached (nothing of it was sent).
    pub fn leader(&self) -> Option<Arc<Destination>> {
        if self.reads.leader_lease.is_none() {
            return Some(Arc::clone(&self.upstream));
        }
        let view = match self.view.read() {
            Ok(view) => Arc::clone(&view),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        };
        let since = view.asked.elapsed();
        view.leader.as_ref().filter(|(_, left)| since < *left).map(|(leader, _)| Arc::clone(leader))
    }

    /// Polls the store every [`poll_interval`] until `stop` (after the listeners drained), each
    /// poll bounded by `timeout`.
    pub async fn poll(self: Arc<Self>, pool: Pool, timeout: Duration, stop: CancellationToken) {
        let every = poll_interval(self.reads.max_lag);
        let mut refused_urls = BTreeSet::new();
        let mut last_warning: Option<Instant> = None;
        loop {
            let asked = Instant::now();
            let deadline = asked + timeout.min(every.max(Duration::from_millis(250)));
            if refused_urls.len() >= 1000 {
                // Warned about again, rather than never again.
                refused_urls.clear();
            }
            match self.poll_once(&pool, deadline, asked, &mut refused_urls).await {
                Ok(view) => match self.view.write() {
                    Ok(mut current) => *current = Arc::new(view),
                    Err(poisoned) => *poisoned.into_inner() = Arc::new(view),
                },
                Err(error) => {
                    // Warned at most every 10 s; meanwhile the old view ages out by itself.
                    if last_warning.is_none_or(|at| at.elapsed() >= Duration::from_secs(10)) {
                        last_warning = Some(Instant::now());
                        warn!(route = %self.prefix, stream = %self.reads.stream, %error, "reads: the followers' positions could not be read; reads go to the leader");
                    }
                }
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep_until(asked + every) => {}
            }
        }
    }

    async fn poll_once(
        &self,
        pool: &Pool,
        deadline: Instant,
        asked: Instant,
        refused_urls: &mut BTreeSet<String>,
    ) -> Result<View, String> {
        let client = match fencing_election::pool::connection_by(pool, deadline).await {
            Some(Ok(client)) => client,
            Some(Err(error)) => return Err(format!("get a connection: {}", error_chain(&error))),
            None => return Err("no connection in time".to_owned()),
        };
        let parameters: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&self.reads.cluster, &self.reads.stream];
        // A follower name claimed by two live members is neither's: a second process started
        // with a copied name, or an old one still registered, must not borrow the other's reports.
        let followers = client.query(
            "SELECT node_id, read_url, follower, lag_ms, reported_ms_ago FROM ( \
               SELECT m.node_id, (m.metadata::jsonb) ->> 'read_url' AS read_url, f.follower, f.lag_ms, \
                      f.reported_ms_ago, count(*) OVER (PARTITION BY f.follower) AS claims \
                 FROM fencing.members($1) m \
                 JOIN fencing.followers_of($2) f \
                   ON f.follower = coalesce((m.metadata::jsonb) ->> 'follower', m.node_id)) c \
              WHERE claims = 1 AND lag_ms IS NOT NULL \
              ORDER BY node_id",
            &parameters,
        );
        let leader = async {
            match &self.reads.leader_lease {
                Some(key) => client
                    .query_opt("SELECT (value::jsonb) ->> 'read_url', remaining_ms FROM fencing.read_lease($1)", &[key])
                    .await
                    .map(Some),
                None => Ok(None),
            }
        };
        let Ok((followers, leader)) =
            tokio::time::timeout_at(deadline, async { tokio::join!(followers, leader) }).await
        else {
            // The queries may still run: the connection is not handed to a fence decision.
            let _ = deadpool_postgres::Object::take(client);
            return Err("no answer in time".to_owned());
        };
        let followers = followers.map_err(|error| format!("read the followers: {}", error_chain(&error)))?;
        let leader = leader.map_err(|error| format!("read the leader lease: {}", error_chain(&error)))?;
        let mut view = View { asked, followers: Vec::new(), leader: None };
        for row in followers {
            let (node, url, name): (String, Option<String>, String) = (row.get(0), row.get(1), row.get(2));
            let (lag_ms, age_ms): (i64, i64) = (row.get(3), row.get(4));
            let Some(destination) = self.destination(url.as_deref(), &node, refused_urls) else { continue };
            view.followers.push(Candidate {
                name: name.into(),
                destination,
                // The store floors both to the millisecond: one more errs on the safe side.
                lag: millis(lag_ms.saturating_add(1)),
                report_age: millis(age_ms.saturating_add(1)),
            });
        }
        if let Some(Some(row)) = leader {
            let (url, remaining_ms): (Option<String>, i64) = (row.get(0), row.get(1));
            if remaining_ms > 0
                && let Some(destination) = self.destination(url.as_deref(), "the leader", refused_urls)
            {
                view.leader = Some((destination, millis(remaining_ms)));
            }
        }
        Ok(view)
    }

    /// `url` as a destination when it is one this route may send reads to; each refused URL is
    /// warned about once (up to a thousand).
    fn destination(&self, url: Option<&str>, who: &str, refused: &mut BTreeSet<String>) -> Option<Arc<Destination>> {
        let url = url?;
        match self.check_url(url) {
            Ok(uri) => Destination::new(uri).map(Arc::new),
            Err(reason) => {
                if refused.len() < 1000 && refused.insert(url.to_owned()) {
                    warn!(route = %self.prefix, who, url, reason, "reads: a read_url this route may not send reads to; ignored");
                }
                None
            }
        }
    }

    fn check_url(&self, url: &str) -> Result<Uri, &'static str> {
        check_read_url(url, self.https, &self.reads.allow_hosts, &self.own)
    }
}

/// `url` when a route may send reads to it: `https` says which scheme the route's upstream
/// speaks; the host must be one of `allow_hosts`; no user information, path, query or anything
/// but a port after the host; never one of `own`, this gateway's listeners.
pub fn check_read_url(url: &str, https: bool, allow_hosts: &[String], own: &[SocketAddr]) -> Result<Uri, &'static str> {
    let uri = url.parse::<Uri>().map_err(|_| "not a URL")?;
    let (scheme_ok, default_port) = match uri.scheme() {
        Some(scheme) if *scheme == Scheme::HTTPS => (https, 443),
        Some(scheme) if *scheme == Scheme::HTTP => (!https, 80),
        _ => (false, 0),
    };
    if !scheme_ok {
        return Err("its scheme is not the route upstream's");
    }
    let authority = uri.authority().ok_or("it has no host")?;
    let host = authority.host();
    // Only `:port` may follow the host (`[::1].evil.example` parses with host `[::1]`).
    let rest = &authority.as_str()[host.len()..];
    if !authority.as_str().starts_with(host)
        || !(rest.is_empty() || rest.strip_prefix(':').is_some_and(|port| port.bytes().all(|b| b.is_ascii_digit())))
    {
        return Err("its authority is not a host and an optional port");
    }
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        return Err("it has a path or a query (a read_url is an origin)");
    }
    let host = host.to_ascii_lowercase();
    if !allow_hosts.contains(&host) {
        return Err("its host is not in the route's reads.allow_hosts");
    }
    let port = authority.port_u16().unwrap_or(default_port);
    let ip = host.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>().ok();
    let is_own = own.iter().any(|listener| {
        listener.port() == port
            && (listener.ip().is_unspecified()
                || ip == Some(listener.ip())
                || (host == "localhost" && listener.ip().is_loopback()))
    });
    if is_own {
        return Err("it is one of this gateway's own listeners");
    }
    Ok(uri)
}

fn millis(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// A router per route, in the order of `routes` (`None` for a route without reads), each polled
/// on `pool` until `stop`; `own` are this gateway's listeners, `fences` says whether its clock
/// and the store's agree.
pub fn start(
    routes: &[Route],
    own: &[SocketAddr],
    fences: &Arc<FenceStore>,
    timeout: Duration,
    stop: &CancellationToken,
) -> Arc<Vec<Option<Arc<ReadRouter>>>> {
    let routers: Vec<Option<Arc<ReadRouter>>> =
        routes.iter().map(|route| ReadRouter::new(route, own, fences)).collect();
    for router in routers.iter().flatten() {
        tokio::spawn(Arc::clone(router).poll(fences.pool().clone(), timeout, stop.clone()));
    }
    Arc::new(routers)
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use super::check_read_url;

    #[test]
    fn a_read_url_is_an_allowed_origin_that_is_not_the_gateway_itself() {
        let allow: Vec<String> = ["127.0.0.1", "[::1]", "localhost", "10.0.0.7"].map(str::to_owned).to_vec();
        let own: Vec<SocketAddr> = vec![
            "127.0.0.1:8080".parse().unwrap_or_else(|_| unreachable!()),
            "0.0.0.0:9090".parse().unwrap_or_else(|_| unreachable!()),
        ];
        let check = |url: &str| check_read_url(url, false, &allow, &own);
        for good in [
            "http://127.0.0.1:9101",
            "http://127.0.0.1:9101/",
            "http://[::1]:9101",
            "http://LOCALHOST:9101",
            "http://10.0.0.7",
        ] {
            assert!(check(good).is_ok(), "{good}: {:?}", check(good));
        }
        for (bad, why) in [
            ("https://127.0.0.1:9101", "scheme"),
            ("ftp://127.0.0.1:9101", "scheme"),
            ("http://10.0.0.8:9101", "allow_hosts"),
            ("http://user@127.0.0.1:9101", "authority"),
            ("http://[::1].evil.example:9101", "authority"),
            ("http://127.0.0.1:9101/v1/leases", "path"),
            ("http://127.0.0.1:9101/?a=b", "query"),
            ("http://127.0.0.1:8080", "own listeners"),
            ("http://localhost:8080", "own listeners"),
            ("http://10.0.0.7:9090", "own listeners"),
            ("not a url", "URL"),
        ] {
            let refused = check(bad).err().unwrap_or_default();
            assert!(refused.contains(why), "{bad}: {refused:?}");
        }
        assert!(check_read_url("https://10.0.0.7:8443", true, &allow, &own).is_ok());
    }
}
