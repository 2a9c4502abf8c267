//! The fault suite's durability probes: every path that moves a fence, crashed right after its
//! answer, then the lower term presented again.
//!
//! Before a crash of Postgres the injector makes one fence-moving action itself, on a resource of
//! its own, with the client processes paused (leaders, lease clients, racer: so that no durable
//! commit of theirs carries the action's record to disk by chance; the gateways go on); the
//! crash, a power cut of the server, follows its answer at once. When
//! Postgres is back, the probe presents what the action must keep out, repeated until it is
//! decided:
//!
//! | path | the action (term 2) | then |
//! | --- | --- | --- |
//! | [`ProbePath::GatewayRaise`] | a write through a gateway | a write of term 1 through a gateway or SQL |
//! | [`ProbePath::SqlRaise`] | `fencing.admit` in an application's transaction | the same |
//! | [`ProbePath::Advance`] | the admin action `fencing.advance_fence` | the same |
//! | [`ProbePath::Bind`] | `fencing.bind` of a new resource to `k1` | `fencing.admit` of a term `k1` never granted |
//! | [`ProbePath::Rebind`] | the admin action `fencing.rebind` of a resource of a lease of its own to a lease no one holds | `fencing.admit` of its own lease's term |
//!
//! For the first three, each resource's fence is first set to term 1 by a write through SQL (no
//! writes in flight to settle behind, no grants to wait for: the action is answered as soon as
//! it commits); for the rebind, the prober acquires a lease of its own (`probe-lease-<n>`, for an
//! hour, so it outlasts any step of the store's clock) and binds the resource to it. Every write
//! is recorded in `client-prober.jsonl` as the racer records its own (`checker/HISTORY.md`,
//! client `prober`), so the checker's rules see a lost action with no rule
//! of its own: a write of term 1 admitted after the term-2 action was answered (S3, in the
//! clients' order, and the action's row missing from the table, once), or a bound resource that
//! admitted a term its lease never granted (S4). The database commits asynchronously
//! (`start_cluster`) and the action's transaction commits as the session does, so only
//! `fencing.commit_durably` in the action's function makes it durable: each path has its planted
//! bug that leaves that out. Everything else the probes write commits synchronously.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use rand::Rng;
use rand::rngs::StdRng;
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::faultclient::{BoxBody, HttpClient, Log, http_client, http_write, now_us};
use crate::pg::try_connect;

/// A fence-moving path the probes crash right after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbePath {
    /// A gateway's raise of an unbound resource's fence (`fencing.gate`).
    GatewayRaise,
    /// An application's raise through SQL (`fencing.admit`, via `fencing.try_admit`).
    SqlRaise,
    /// The admin action `fencing.advance_fence`.
    Advance,
    /// A binding (`fencing.bind`).
    Bind,
    /// The admin action `fencing.rebind`.
    Rebind,
}

impl ProbePath {
    /// Every path, in the order the injector draws from.
    pub const ALL: [ProbePath; 5] =
        [ProbePath::GatewayRaise, ProbePath::SqlRaise, ProbePath::Advance, ProbePath::Bind, ProbePath::Rebind];

    /// The path whose [`ProbePath::fault_kind`] is `kind`.
    pub fn parse(kind: &str) -> Option<ProbePath> {
        ProbePath::ALL.into_iter().find(|path| path.fault_kind() == kind)
    }

    /// The fault's kind in `faults.jsonl`.
    pub fn fault_kind(self) -> &'static str {
        match self {
            ProbePath::GatewayRaise => "pg-crash-after-raise",
            ProbePath::SqlRaise => "pg-crash-after-sql-raise",
            ProbePath::Advance => "pg-crash-after-advance",
            ProbePath::Bind => "pg-crash-after-bind",
            ProbePath::Rebind => "pg-crash-after-rebind",
        }
    }
}

/// A term no lease of the schedule ever reaches: what the bind probe presents.
const NEVER_GRANTED: i64 = 1_000_000;

/// The lease the rebind probe moves its resource to: no one ever acquires it.
const NOBODYS_LEASE: &str = "probe-nobody";

/// How long one probe write through a gateway may take.
const WRITE_BOUND: Duration = Duration::from_millis(1500);

/// How long a write through SQL or an admin action may take: a raise of a fence a gateway wrote
/// waits out its grants and its writes in flight first.
const ACTION_BOUND: Duration = Duration::from_secs(3);

/// How long the probe waits after pausing the processes that commit, before its action.
const QUIET_BEFORE_ACTION: Duration = Duration::from_millis(200);

/// How long a probe presents the lower term after the store is back, until one is decided.
const FOLLOW_UP_BOUND: Duration = Duration::from_secs(6);

/// What a probe presents once the store is back.
#[derive(Debug, Clone)]
pub struct FollowUp {
    path: ProbePath,
    resource: String,
    /// The rebind probe's own lease's term (what the resource admitted before the rebind).
    lease_term: i64,
}

/// A clock-step probe between its halves: its SQL session, its resource, and the gateway that
/// holds a grant on it.
pub struct ArmedStep {
    client: tokio_postgres::Client,
    resource: String,
    gateway: usize,
}

/// The probes of one schedule: their HTTP client, log and follow-ups in flight.
pub struct Prober {
    inner: Arc<Inner>,
    next: u64,
    follow_ups: Vec<JoinHandle<()>>,
}

struct Inner {
    http: HttpClient,
    log: Log,
    gateways: Vec<SocketAddr>,
    schedule: usize,
    ids: std::sync::atomic::AtomicU64,
}

impl Prober {
    /// A prober writing `client-prober.jsonl` in `dir`, through `gateways`.
    pub fn new(dir: &Path, gateways: Vec<SocketAddr>, schedule: usize) -> anyhow::Result<Prober> {
        let path = dir.join("client-prober.jsonl");
        let log = Log::open(&path.display().to_string())?;
        Ok(Prober {
            inner: Arc::new(Inner { http: http_client(), log, gateways, schedule, ids: 0.into() }),
            next: 0,
            follow_ups: Vec::new(),
        })
    }

    /// The first half of a probe, before the crash: sets up a new resource (its fence at term 1
    /// through SQL for the paths that raise; bound to `k1` for the rebind), then makes the
    /// action (a raise through one of `usable` gateways, drawn, for [`ProbePath::GatewayRaise`]).
    /// `pause` is called right before the action with the gateway that acts, if any (it pauses
    /// every other process that writes to the store). Returns what to present when the store is
    /// back, or None when the probe could not be set up: the crash is then a plain one.
    pub async fn act(
        &mut self,
        path: ProbePath,
        url: &str,
        usable: &[usize],
        rng: &mut StdRng,
        pause: impl FnOnce(Option<usize>),
    ) -> Option<FollowUp> {
        self.next += 1;
        let resource = match path {
            ProbePath::Bind | ProbePath::Rebind => format!("probe-bound-{}", self.next),
            _ => format!("probe-{}", self.next),
        };
        let inner = &self.inner;
        // The SQL session first: connecting is not part of the window.
        let client = tokio::time::timeout(Duration::from_secs(1), try_connect(url)).await.ok()?.ok()?;
        // The fence at term 1 through SQL: an SQL admission leaves no writes in flight to settle
        // behind and no grants to wait for, so the action is answered as soon as it commits.
        let mut lease_term = 0;
        let setup = match path {
            ProbePath::Bind => true,
            ProbePath::Rebind => {
                let lease = format!("probe-lease-{}", self.next);
                let acquire = "SELECT (fencing.acquire($1, 'prober', interval '1 hour')).term, fencing.bind($2, $1)";
                match tokio::time::timeout(WRITE_BOUND, client.query_one(acquire, &[&lease, &resource])).await {
                    Ok(Ok(row)) => row.try_get::<_, i64>(0).map(|term| lease_term = term).is_ok(),
                    _ => false,
                }
            }
            _ => inner.write_sql(&client, ADMIT, &resource, None, 1, Commit::Durable).await == Some(true),
        };
        if !setup {
            return None;
        }
        // A gateway raise goes through one gateway that admits, drawn now: the others are paused.
        let acting = match path {
            ProbePath::GatewayRaise if usable.is_empty() => return None,
            ProbePath::GatewayRaise => Some(usable[rng.random_range(0..usable.len())]),
            _ => None,
        };
        pause(acting);
        // What the paused processes had in flight ends first (the acting gateway finishes the
        // decisions they asked for), so that the action is the last commit before the crash.
        tokio::time::sleep(QUIET_BEFORE_ACTION).await;
        match path {
            // Through the acting gateway (one that was ready; its link to Postgres may still be
            // faulty, and the raise then not made: the crash is a plain one). The crash comes as
            // soon as the raise is visible in the store, while the gateway still forwards the
            // write (the action's commit is then the last one, as on the other paths). The write
            // goes on in a task of its own and is answered all the same.
            ProbePath::GatewayRaise => {
                let (raising, raised) = (Arc::clone(inner), resource.clone());
                let gateway = acting.unwrap_or_default();
                let raise = tokio::spawn(async move {
                    raising.write(&raised, 2, gateway).await;
                });
                let fence = format!("/free1/{resource}");
                let until = Instant::now() + ACTION_BOUND;
                while Instant::now() < until && !raise.is_finished() {
                    let read = "SELECT max_term FROM fencing.fences WHERE resource = $1";
                    if let Ok(Ok(Some(row))) =
                        tokio::time::timeout(Duration::from_millis(200), client.query_opt(read, &[&fence])).await
                        && row.try_get::<_, i64>(0).is_ok_and(|max| max >= 2)
                    {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                self.follow_ups.push(raise);
            }
            ProbePath::SqlRaise => {
                inner.write_sql(&client, ADMIT, &resource, None, 2, Commit::AsTheSessionDoes).await;
            }
            ProbePath::Advance => {
                let advance = "SELECT fencing.advance_fence($1, $2, 'fault-suite', 'durability probe')";
                inner.write_sql(&client, advance, &resource, None, 2, Commit::AsTheSessionDoes).await;
            }
            // A binding is not a write: no record of its own, only the follow-up has one, which
            // holds the resource bound; so a binding that did not certainly happen (an error, no
            // answer in time) is no probe, and the crash a plain one.
            ProbePath::Bind => {
                tokio::time::timeout(ACTION_BOUND, client.query_one(BIND, &[&resource])).await.ok()?.ok()?;
            }
            ProbePath::Rebind => {
                let rebind = "SELECT fencing.rebind($1, $2, 'fault-suite', 'durability probe')";
                tokio::time::timeout(ACTION_BOUND, client.query_one(rebind, &[&resource, &NOBODYS_LEASE]))
                    .await
                    .ok()?
                    .ok()?;
            }
        }
        Some(FollowUp { path, resource, lease_term })
    }

    /// The second half, once the store is back: presents the lower term through the `usable`
    /// gateways (a bound resource: a term its lease never granted, through SQL at `url`), again
    /// until it is decided, in a task of its own.
    pub fn follow_up(&mut self, follow_up: FollowUp, url: String, usable: Vec<usize>, seed: u64) {
        let inner = Arc::clone(&self.inner);
        self.follow_ups.push(tokio::spawn(async move {
            let mut rng: StdRng = rand::SeedableRng::seed_from_u64(seed);
            let until = Instant::now() + FOLLOW_UP_BOUND;
            loop {
                let decided = match follow_up.path {
                    ProbePath::Bind | ProbePath::Rebind => inner.present_bound(&follow_up, &url).await,
                    // Through SQL, half of the time, or when no gateway can take it: a gateway
                    // that raised (or refused) the fence remembers its maximum and refuses the
                    // lower term on its own, so the store is asked straight too.
                    _ if usable.is_empty() || rng.random_bool(0.5) => inner.present_sql(&follow_up, &url).await,
                    _ => inner.write(&follow_up.resource, 1, usable[rng.random_range(0..usable.len())]).await.1,
                };
                if decided || Instant::now() >= until {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }));
    }

    /// The clock-step probe, its first half, before the injector slows `gateway`'s link to
    /// Postgres and steps the store's clock forward: a resource of its own (`clock-probe-N`) at
    /// term 1, admitted through `gateway` three times, so that it holds a grant on it. None when
    /// a write was not admitted (the gateway refuses everything for now): no probe.
    pub async fn grant_before_step(&mut self, url: &str, gateway: usize) -> Option<ArmedStep> {
        self.next += 1;
        let resource = format!("clock-probe-{}", self.next);
        let client = tokio::time::timeout(Duration::from_secs(1), try_connect(url)).await.ok()?.ok()?;
        // The first write creates the fence (a raise, which brings no grant); on an unbound route
        // a decision asks for a grant only when it and the two before it came within a grant of
        // each other: the third brings one.
        for _ in 0..3 {
            if !self.inner.write(&resource, 1, gateway).await.0 {
                return None;
            }
        }
        Some(ArmedStep { client, resource, gateway })
    }

    /// The clock-step probe, its second half, right after the step: a raise to term 2 through
    /// SQL, and as soon as it is answered, term 1 again through the gateway with the grant, in a
    /// task of its own. The raise must wait out the grant on the store's sleep timer, whatever
    /// its wall clock did, so the gateway has to ask the store again and is refused; a wait timed
    /// on the store's wall clock (the planted `wall-clock-waits`) ends at the step, while the
    /// gateway, which sees the step only at its next round trip through the slowed link, still
    /// admits under its grant.
    pub fn after_step(&mut self, armed: ArmedStep) {
        let inner = Arc::clone(&self.inner);
        self.follow_ups.push(tokio::spawn(async move {
            let ArmedStep { client, resource, gateway } = armed;
            if inner.write_sql(&client, ADMIT, &resource, None, 2, Commit::Durable).await == Some(true) {
                inner.write(&resource, 1, gateway).await;
            }
        }));
    }

    /// Waits (bounded) for the follow-ups still presenting.
    pub async fn finish(&mut self) {
        for task in self.follow_ups.drain(..) {
            let _ = tokio::time::timeout(FOLLOW_UP_BOUND + Duration::from_secs(2), task).await;
        }
    }
}

impl Inner {
    fn request_id(&self) -> String {
        let n = self.ids.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        format!("prober.{}.{n}", self.schedule)
    }

    /// One write of `term` to `resource` (route `/free1`, the checking upstream) through
    /// `gateway`: (ok, decided), decided meaning admitted or refused for its term (409).
    async fn write(&self, resource: &str, term: i64, gateway: usize) -> (bool, bool) {
        let request_id = self.request_id();
        let mut record = json!({
            "client": "prober", "request_id": request_id, "key": "", "path": "gateway", "mode": "verify",
            "gateway": gateway, "upstream": "checking", "resource": resource, "bound": false, "term": term,
            "invoked_us": now_us(), "completed_us": Value::Null, "outcome": "indeterminate",
            "status": Value::Null, "refused_by": Value::Null, "error": Value::Null,
        });
        self.log.write(&record);
        let request = Request::builder()
            .method(Method::POST)
            .uri(format!("http://{}/free1/{resource}", self.gateways[gateway]))
            .header("x-request-id", &request_id)
            .header("fencing-token", term.to_string())
            .body(BodyExt::boxed(Full::new(Bytes::from_static(b"{\"probe\":1}"))) as BoxBody);
        if tokio::time::timeout(WRITE_BOUND, http_write(&self.http, &mut record, request)).await.is_err() {
            record["outcome"] = json!("indeterminate");
            record["error"] = json!("timed out");
        }
        record["completed_us"] = json!(now_us());
        self.log.write(&record);
        (record["outcome"] == "ok", record["outcome"] == "ok" || record["status"] == 409)
    }

    /// The lower term of a raise probe through SQL (`fencing.admit`). True when decided.
    async fn present_sql(&self, follow_up: &FollowUp, url: &str) -> bool {
        let Ok(Ok(client)) = tokio::time::timeout(Duration::from_secs(1), try_connect(url)).await else {
            return false;
        };
        self.write_sql(&client, ADMIT, &follow_up.resource, None, 1, Commit::Durable).await.is_some()
    }

    /// What a bound probe resource must refuse, once: after a bind to `k1`, a term `k1` never
    /// granted; after a rebind to a lease no one holds, the term of the lease it was bound to
    /// before. True when decided.
    async fn present_bound(&self, follow_up: &FollowUp, url: &str) -> bool {
        let Ok(Ok(client)) = tokio::time::timeout(Duration::from_secs(1), try_connect(url)).await else {
            return false;
        };
        let (key, term) = match follow_up.path {
            ProbePath::Bind => ("k1", NEVER_GRANTED),
            _ => (NOBODYS_LEASE, follow_up.lease_term),
        };
        self.write_sql(&client, ADMIT, &follow_up.resource, Some(key), term, Commit::Durable).await.is_some()
    }

    /// One write through SQL in an application's transaction: `action` (with the fence and
    /// `term`), a ticket of the prober's own counter (row 2 of `fault_tickets`: a paused client
    /// may hold row 1 locked), and a row in `race_ledger`. `key` is the lease the resource is
    /// bound to, if it is. Whether it committed, once decided (committed, or refused by the
    /// fence: SQLSTATE class ZF); None while unknown, or failed for another reason (the store
    /// going down, a timeout), which the caller may try again.
    async fn write_sql(
        &self,
        client: &tokio_postgres::Client,
        action: &str,
        resource: &str,
        key: Option<&str>,
        term: i64,
        commit: Commit,
    ) -> Option<bool> {
        let request_id = self.request_id();
        let mut record = json!({
            "client": "prober", "request_id": request_id, "key": key.unwrap_or_default(), "path": "sql",
            "mode": "sql", "gateway": Value::Null, "upstream": Value::Null, "resource": resource,
            "bound": key.is_some(), "term": term, "invoked_us": now_us(), "completed_us": Value::Null,
            "outcome": "indeterminate", "status": Value::Null, "refused_by": Value::Null, "error": Value::Null,
        });
        // Unbound fences of the gateway's route are named by the route's prefix (the racer's way).
        let fence = if key.is_some() { resource.to_owned() } else { format!("/free1/{resource}") };
        self.log.write(&record);
        let result = tokio::time::timeout(ACTION_BOUND, async {
            let refused = |e: tokio_postgres::Error| {
                let coded = e.as_db_error().map(|db| db.code().code().to_owned());
                (coded.is_some(), format!("SQLSTATE {}: {e}", coded.unwrap_or_default()))
            };
            client.batch_execute("BEGIN").await.map_err(|e| (false, e.to_string()))?;
            if commit == Commit::Durable {
                client.batch_execute("SET LOCAL synchronous_commit = on").await.map_err(refused)?;
            }
            client.query_one(action, &[&fence, &term]).await.map_err(refused)?;
            let ticket: i64 = client
                .query_one(
                    "INSERT INTO fault_tickets AS t VALUES (2, 1)
                     ON CONFLICT (id) DO UPDATE SET n = t.n + 1 RETURNING n",
                    &[],
                )
                .await
                .map_err(refused)?
                .get(0);
            client
                .execute(
                    "INSERT INTO race_ledger (request_id, resource, term, ticket) VALUES ($1, $2, $3, $4)",
                    &[&request_id, &resource, &term, &ticket],
                )
                .await
                .map_err(refused)?;
            // A failure of the commit itself leaves the outcome unknown.
            client.batch_execute("COMMIT").await.map_err(|e| (false, e.to_string()))
        })
        .await;
        let decided = match result {
            Ok(Ok(())) => {
                record["outcome"] = json!("ok");
                Some(true)
            }
            Ok(Err((true, error))) => {
                // An error answered before the commit: the transaction did not commit.
                let fenced = error.starts_with("SQLSTATE ZF");
                record["outcome"] = json!("failed");
                record["refused_by"] = json!("store");
                record["error"] = json!(error);
                let _ = client.batch_execute("ROLLBACK").await;
                fenced.then_some(false)
            }
            Ok(Err((false, error))) => {
                record["error"] = json!(error);
                None
            }
            Err(_) => {
                record["error"] = json!("timed out");
                None
            }
        };
        record["completed_us"] = json!(now_us());
        self.log.write(&record);
        decided
    }
}

/// An application's write through SQL.
const ADMIT: &str = "SELECT fencing.admit($1, $2)";

/// How a probe's write through SQL commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Commit {
    /// As the session does (asynchronously in the suite): only the fencing function can make
    /// it durable. The probes' actions.
    AsTheSessionDoes,
    /// Synchronously: everything else the probes write, which no crash may take back.
    Durable,
}

/// A binding of a probe's resource to `k1`.
const BIND: &str = "SELECT fencing.bind($1, 'k1')";
