//! `fencing-gateway verify`: the zombie story, played against the user's own gateway, route and
//! upstream, to show that fencing works there and not only in this project's tests.
//!
//! Leader A acquires a lease through the control API and writes; its lease runs out (as if A
//! were paused) and leader B takes over with a higher term; on a route bound to the lease, A
//! writes with its old term before B's first write (refused: only the lease's current term is
//! admitted); B writes; A writes again with its old term (refused). Every answer is checked, and
//! with `--check-url` the upstream's state is read to show that no refused write reached it. On
//! an unbound route, A's write before B's first one is admitted: that is the documented gap of
//! unbound routes (a resource admits terms at or above the highest it admitted), reported as such.
//!
//! It takes its own lease (`fencing-verify` unless told), refuses a lease that is held or a
//! resource another writer uses unless `--yes`, releases the lease at the end, and names what it
//! leaves behind (the resource's fence row, which keeps protecting it).

mod table;

use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

use crate::Error;
use crate::proxy::upstream::{UpstreamConnector, connector};

/// How a leader presents its term.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// `Fencing-Token: <term>`.
    Verify,
    /// `Fencing-Lease` and `Fencing-Owner`: the gateway reads the term.
    Stamp,
}

/// What `verify` is pointed at.
#[derive(Debug, Clone)]
pub struct Target {
    /// The lease A and B compete for.
    pub lease: String,
    /// A's lease ttl.
    pub ttl: Duration,
    /// Run although the lease or the resource is in use.
    pub yes: bool,
    /// Where the leaders write.
    pub side: Side,
}

/// Where the leaders write: through a gateway's route, or into a protected table.
#[derive(Debug, Clone)]
pub enum Side {
    /// Through the proxy of a running gateway; leases through its control API.
    Gateway(Box<Route>),
    /// Into a table protected by `fencing.protect` (the SQL guard); leases with the SQL functions.
    Table(Table),
}

/// A gateway route to verify (its `Debug` leaves the token out).
#[derive(Clone)]
pub struct Route {
    /// The control listener's base URL.
    pub control: Uri,
    /// The proxy listener's base URL.
    pub proxy: Uri,
    /// The path (and query) of a write through the proxy.
    pub path: String,
    /// The resource that path writes to.
    pub resource: String,
    /// The write's method.
    pub method: Method,
    /// How the leaders present their term.
    pub mode: Mode,
    /// A URL whose body shows the upstream's state.
    pub check_url: Option<Uri>,
    /// The client's bearer token.
    pub token: Option<String>,
    /// A CA file for `https://` listeners.
    pub ca_file: Option<PathBuf>,
}

/// A protected table to verify (its `Debug` leaves the database URL out).
#[derive(Clone)]
pub struct Table {
    /// The database, as a libpq URL or key=value string.
    pub database_url: String,
    /// The table, as SQL names it (`orders`, `shop.orders`).
    pub table: String,
    /// The resource its guard fences; default: the one its `fencing_guard` trigger names.
    pub resource: Option<String>,
    /// The write each leader makes: one statement that changes at least one row; `$1` is the
    /// write's marker (text).
    pub write: String,
    /// A query whose rows show what the table holds, read after the story.
    pub check_query: Option<String>,
    /// A statement B runs with its term at the end, `$1` the run's marker prefix: removes the
    /// run's rows.
    pub cleanup: Option<String>,
}

impl Target {
    /// What the verdict is about: "route" or "table".
    pub fn what(&self) -> &'static str {
        match self.side {
            Side::Gateway(_) => "route",
            Side::Table(_) => "table",
        }
    }
}

/// The target the command line names, checked: a route or a table.
pub fn target(args: crate::ops::cli::VerifyArgs) -> Result<Target, String> {
    if !(100..=60_000).contains(&args.ttl_ms) {
        return Err(format!("--ttl-ms {} must be 100 to 60000", args.ttl_ms));
    }
    let side = match (args.control, args.table) {
        (Some(control), None) => {
            let parse = |name: &str, text: &str| -> Result<Uri, String> {
                let uri: Uri = text.parse().map_err(|error| format!("--{name} {text:?}: {error}"))?;
                match (uri.scheme_str(), uri.authority()) {
                    (Some("http" | "https"), Some(_)) => Ok(uri),
                    _ => Err(format!("--{name} {text:?} must be an http:// or https:// URL")),
                }
            };
            let (Some(proxy), Some(path), Some(resource)) = (args.proxy, args.path, args.resource) else {
                return Err("--control needs --proxy, --path and --resource".to_owned());
            };
            let method = args.method.unwrap_or_else(|| "POST".to_owned());
            let Ok(method) = method.to_ascii_uppercase().parse::<Method>() else {
                return Err(format!("--method {method:?} is not an HTTP method"));
            };
            if !path.starts_with('/') {
                return Err(format!("--path {path:?} must start with /"));
            }
            let token = match args.token_file {
                Some(file) => Some(
                    std::fs::read_to_string(&file)
                        .map_err(|error| format!("--token-file {}: {error}", file.display()))?
                        .trim()
                        .to_owned(),
                ),
                None => std::env::var("FENCING_CLIENT_TOKEN").ok().filter(|token| !token.is_empty()),
            };
            Side::Gateway(Box::new(Route {
                control: parse("control", &control)?,
                proxy: parse("proxy", &proxy)?,
                check_url: args.check_url.as_deref().map(|url| parse("check-url", url)).transpose()?,
                path,
                resource,
                method,
                mode: args.mode.unwrap_or(Mode::Verify),
                token,
                ca_file: args.ca_file,
            }))
        }
        (None, Some(table)) => {
            let Some(write) = args.write else { return Err("--table needs --write".to_owned()) };
            Side::Table(Table {
                database_url: crate::ops::serve::find_database(args.database_url, None)?,
                table,
                resource: args.resource,
                write,
                check_query: args.check_query,
                cleanup: args.cleanup,
            })
        }
        _ => {
            return Err(
                "give a route (--control, --proxy, --path, --resource) or a table (--table, --write)".to_owned()
            );
        }
    };
    Ok(Target { lease: args.lease, ttl: Duration::from_millis(args.ttl_ms), yes: args.yes, side })
}

/// The verdict of one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// As fencing requires.
    Pass,
    /// Not as fencing requires.
    Fail,
    /// The documented gap of unbound routes.
    Gap,
}

/// What `verify` found: a line per step and whether any failed.
#[derive(Debug, Default)]
pub struct Report {
    /// `(verdict, text)` per step, in order.
    pub steps: Vec<(Verdict, String)>,
}

impl Report {
    fn step(&mut self, verdict: Verdict, text: String) {
        let label = match verdict {
            Verdict::Pass => "PASS",
            Verdict::Fail => "FAIL",
            Verdict::Gap => "GAP ",
        };
        println!("{label} {text}");
        self.steps.push((verdict, text));
    }

    /// True when no step failed.
    pub fn passed(&self) -> bool {
        self.steps.iter().all(|(verdict, _)| *verdict != Verdict::Fail)
    }
}

/// Percent-encodes one path segment (every byte but the unreserved ones).
fn segment(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (byte as char).to_string(),
            other => format!("%{other:02X}"),
        })
        .collect()
}

impl std::fmt::Debug for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Route")
            .field("control", &self.control)
            .field("proxy", &self.proxy)
            .field("path", &self.path)
            .field("resource", &self.resource)
            .field("method", &self.method)
            .field("mode", &self.mode)
            .field("check_url", &self.check_url)
            .field("token", &self.token.as_ref().map(|_| "(set)"))
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Table")
            .field("database_url", &"(set)")
            .field("table", &self.table)
            .field("resource", &self.resource)
            .field("write", &self.write)
            .field("check_query", &self.check_query)
            .field("cleanup", &self.cleanup)
            .finish()
    }
}

/// How long one exchange may take: longer than a first write of a new term, which waits for
/// the old term's writes to settle.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long verify waits for a lease to be free (`--yes`) or for B to get it.
const LEASE_WAIT: Duration = Duration::from_secs(30);

struct Http {
    client: Client<UpstreamConnector, Full<Bytes>>,
    token: Option<String>,
}

/// An answer: status, the `Fencing-Current-Term` header, the body.
struct Answer {
    status: StatusCode,
    current_term: Option<String>,
    body: Bytes,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    fn kind(&self) -> String {
        self.json()["type"].as_str().and_then(|t| t.rsplit(':').next()).unwrap_or("-").to_owned()
    }

    fn problem(&self) -> String {
        match self.current_term.as_deref() {
            Some(current) => format!("{} {}, current term {current}", self.status.as_u16(), self.kind()),
            None => format!("{} {}", self.status.as_u16(), self.kind()),
        }
    }

    /// The gateway's fence refusal, not another 409 (the upstream's) nor another failure.
    fn fenced(&self) -> bool {
        self.status == StatusCode::CONFLICT
            && matches!(self.kind().as_str(), "stale-term" | "not-leader" | "future-term")
            && self.current_term.is_some()
    }
}

/// What a write got.
enum Written {
    /// Admitted and applied: the gateway's 2xx, or a committed transaction that changed rows.
    Admitted(String),
    /// The fence's own refusal, naming the current term.
    Refused { current_term: i64, text: String },
    /// Neither: the answer does not say that the fence refused it (it may have been applied),
    /// or the write could not test the fence; the text says which.
    Unclear(String),
}

impl Written {
    fn from_answer(answer: &Answer) -> Written {
        let current_term = answer.current_term.as_deref().and_then(|term| term.parse::<i64>().ok());
        match current_term {
            Some(current_term) if answer.fenced() => Written::Refused { current_term, text: answer.problem() },
            _ if answer.status.is_success() => Written::Admitted(answer.status.as_u16().to_string()),
            _ => Written::Unclear(format!(
                "{}, not the gateway's refusal: the write may have been forwarded",
                answer.problem()
            )),
        }
    }

    fn admitted(&self) -> bool {
        matches!(self, Written::Admitted(_))
    }

    fn refused(&self) -> bool {
        matches!(self, Written::Refused { .. })
    }

    fn text(&self) -> &str {
        match self {
            Written::Admitted(text) | Written::Refused { text, .. } | Written::Unclear(text) => text,
        }
    }
}

/// A lease as verify sees it.
struct LeaseSeen {
    /// Held right now.
    held: bool,
    owner: String,
    term: i64,
}

/// A fence as verify sees it.
struct FenceSeen {
    name: String,
    max_term: i64,
    lease_key: Option<String>,
}

/// Where the story is played: leases, fences and writes, through a gateway or in SQL.
trait Place {
    /// The story's first line.
    fn describe(&self) -> String;
    /// The lease, `None` when never acquired.
    async fn lease(&self) -> Result<Option<LeaseSeen>, Error>;
    /// The fence of the resource the writes go to, `None` when there is none.
    async fn fence(&self) -> Result<Option<FenceSeen>, Error>;
    /// Acquires the lease for `owner`: its term, or why not.
    async fn acquire(&self, owner: &str, ttl: Duration) -> Result<i64, String>;
    /// Releases the lease if `owner` holds it: whether it did.
    async fn release(&self, owner: &str) -> bool;
    /// One write as `owner` presenting `term`, carrying `marker`.
    async fn write(&self, owner: &str, term: i64, marker: &str) -> Result<Written, Error>;
    /// What the upstream or table shows after the story (`None` when not asked to read it),
    /// and where that was read.
    async fn applied(&self) -> Option<(String, Result<String, String>)>;
    /// Removes the run's writes as the leader `owner` at `term` (where the user said how).
    async fn clean_up(&self, _owner: &str, _term: i64, _marker_prefix: &str) {}
    /// The resource is fenced at all: a one-off check before the story (the SQL guard's
    /// trigger), `Err` with why not.
    async fn guarded(&self) -> Result<Option<String>, String> {
        Ok(None)
    }
}

impl Http {
    /// One exchange; the token goes only where `authorized` says (the gateway's listeners).
    async fn send(
        &self,
        method: Method,
        uri: String,
        headers: &[(&str, String)],
        body: Bytes,
        authorized: bool,
    ) -> Result<Answer, String> {
        let mut request = Request::builder().method(method).uri(&uri);
        if let (Some(token), true) = (&self.token, authorized) {
            request = request.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
        }
        for (name, value) in headers {
            request = request.header(*name, value);
        }
        let request = request.body(Full::new(body)).map_err(|error| format!("{uri}: {error}"))?;
        let exchange = async {
            let response = self.client.request(request).await.map_err(|error| format!("{uri}: {error}"))?;
            let status = response.status();
            let current_term =
                response.headers().get("fencing-current-term").and_then(|v| v.to_str().ok()).map(str::to_owned);
            let body = response.into_body().collect().await.map_err(|error| format!("{uri}: {error}"))?.to_bytes();
            Ok(Answer { status, current_term, body })
        };
        tokio::time::timeout(EXCHANGE_TIMEOUT, exchange)
            .await
            .map_err(|_| format!("{uri}: no answer in {} s", EXCHANGE_TIMEOUT.as_secs()))?
    }
}

fn base(uri: &Uri) -> String {
    uri.to_string().trim_end_matches('/').to_owned()
}

/// A gateway: leases through its control API, writes through its proxy.
struct Gateway<'a> {
    route: &'a Route,
    lease: &'a str,
    http: Http,
    control: String,
    lease_url: String,
    /// The names the write's fence may have: the resource (a bound route's), and
    /// `<prefix>/<resource>` for every prefix `--path` may be under (an unbound route's).
    fence_names: Vec<String>,
}

impl<'a> Gateway<'a> {
    fn new(route: &'a Route, lease: &'a str) -> Result<Gateway<'a>, Error> {
        let any_https = [&route.control, &route.proxy].iter().any(|uri| uri.scheme_str() == Some("https"))
            || route.check_url.as_ref().is_some_and(|uri| uri.scheme_str() == Some("https"));
        let tls =
            crate::security::tls::upstream_client_config(route.ca_file.as_deref(), any_https).map_err(Error::Setup)?;
        let http = Http {
            client: Client::builder(TokioExecutor::new()).build(connector(Duration::from_secs(5), tls)),
            token: route.token.clone(),
        };
        let control = base(&route.control);
        let lease_url = format!("{control}/v1/leases/{}", segment(lease));
        let mut fence_names = vec![route.resource.clone(), format!("/{}", route.resource)];
        let parts: Vec<&str> =
            route.path.split('?').next().unwrap_or("").split('/').filter(|p| !p.is_empty()).collect();
        for end in 1..=parts.len() {
            fence_names.push(format!("/{}/{}", parts[..end].join("/"), route.resource));
        }
        Ok(Gateway { route, lease, http, control, lease_url, fence_names })
    }
}

impl Place for Gateway<'_> {
    fn describe(&self) -> String {
        let route = self.route;
        format!(
            "lease {:?}, resource {:?}, {} {}{} in {} mode",
            self.lease,
            route.resource,
            route.method,
            base(&route.proxy),
            route.path,
            if route.mode == Mode::Verify { "verify" } else { "stamp" },
        )
    }

    async fn lease(&self) -> Result<Option<LeaseSeen>, Error> {
        let url = self.lease_url.clone();
        let answer = self.http.send(Method::GET, url.clone(), &[], Bytes::new(), true).await.map_err(Error::Setup)?;
        match answer.status {
            StatusCode::OK => {
                let json = answer.json();
                Ok(Some(LeaseSeen {
                    held: json["remaining_ms"].as_u64().unwrap_or(0) > 0,
                    owner: json["owner"].as_str().unwrap_or("-").to_owned(),
                    term: json["term"].as_i64().unwrap_or(0),
                }))
            }
            StatusCode::NOT_FOUND => Ok(None),
            _ => Err(Error::Setup(format!("GET {url}: {}", answer.problem()))),
        }
    }

    async fn fence(&self) -> Result<Option<FenceSeen>, Error> {
        for name in &self.fence_names {
            let url = format!("{}/v1/fences/{}", self.control, segment(name));
            let answer =
                self.http.send(Method::GET, url.clone(), &[], Bytes::new(), true).await.map_err(Error::Setup)?;
            match answer.status {
                StatusCode::OK => {
                    let json = answer.json();
                    return Ok(Some(FenceSeen {
                        name: name.clone(),
                        max_term: json["max_term"].as_i64().unwrap_or(0),
                        lease_key: json["lease_key"].as_str().map(str::to_owned),
                    }));
                }
                StatusCode::NOT_FOUND => {}
                _ => return Err(Error::Setup(format!("GET {url}: {}", answer.problem()))),
            }
        }
        Ok(None)
    }

    async fn acquire(&self, owner: &str, ttl: Duration) -> Result<i64, String> {
        let body = serde_json::json!({ "owner": owner, "ttl_ms": ttl.as_millis() as u64 }).to_string();
        let json = [("content-type", "application/json".to_owned())];
        let answer =
            self.http.send(Method::POST, format!("{}/acquire", self.lease_url), &json, Bytes::from(body), true).await?;
        match (answer.status, answer.json()["term"].as_i64()) {
            (StatusCode::OK, Some(term)) => Ok(term),
            _ => Err(format!("{owner} could not acquire {:?}: {}", self.lease, answer.problem())),
        }
    }

    async fn release(&self, owner: &str) -> bool {
        let body = serde_json::json!({ "owner": owner }).to_string();
        let json = [("content-type", "application/json".to_owned())];
        let url = format!("{}/release", self.lease_url);
        self.http.send(Method::POST, url, &json, Bytes::from(body), true).await.is_ok_and(|a| a.status.is_success())
    }

    async fn write(&self, owner: &str, term: i64, marker: &str) -> Result<Written, Error> {
        let route = self.route;
        let mut headers = match route.mode {
            Mode::Verify => vec![("fencing-token", term.to_string())],
            Mode::Stamp => vec![("fencing-lease", self.lease.to_owned()), ("fencing-owner", owner.to_owned())],
        };
        headers.push(("fencing-resource", route.resource.clone()));
        // A body only where writes carry one by default.
        let body = if matches!(route.method, Method::POST | Method::PUT | Method::PATCH) {
            headers.push(("content-type", "application/json".to_owned()));
            Bytes::from(serde_json::json!({ "fencing_verify": marker, "owner": owner, "term": term }).to_string())
        } else {
            Bytes::new()
        };
        let url = format!("{}{}", base(&route.proxy), route.path);
        let answer = self.http.send(route.method.clone(), url, &headers, body, true).await.map_err(Error::Setup)?;
        Ok(Written::from_answer(&answer))
    }

    async fn applied(&self) -> Option<(String, Result<String, String>)> {
        // The upstream's URL gets no token: it is not the gateway.
        let check = self.route.check_url.as_ref()?;
        let read = match self.http.send(Method::GET, check.to_string(), &[], Bytes::new(), false).await {
            Ok(state) if state.status.is_success() => Ok(String::from_utf8_lossy(&state.body).into_owned()),
            Ok(state) => Err(format!("GET {check}: {}", state.status.as_u16())),
            Err(error) => Err(error),
        };
        Some((check.to_string(), read))
    }
}

/// Plays the story; the report says what held. An error means it could not be played; the
/// leases verify took are released either way.
pub async fn run(target: &Target) -> Result<Report, Error> {
    match &target.side {
        Side::Gateway(route) => tell(target, &Gateway::new(route, &target.lease)?).await,
        Side::Table(table) => tell(target, &table::Sql::connect(table, &target.lease).await?).await,
    }
}

async fn tell(target: &Target, place: &impl Place) -> Result<Report, Error> {
    let run_id = format!("{:08x}", rand::random::<u32>());
    let (a, b) = (format!("fencing-verify-a-{run_id}"), format!("fencing-verify-b-{run_id}"));
    println!("verify: {}, run {run_id}", place.describe());
    let played = play(target, place, &run_id, &a, &b).await;
    if let Err(error) = &played
        && !matches!(error, Error::InUse(_) | Error::Usage(_))
    {
        println!(
            "verify: the story stopped; writes of this run that were applied are marked \"fencing-verify {run_id}\""
        );
    }
    // Whatever happened, leave no lease of this run held.
    let released = place.release(&b).await | place.release(&a).await;
    let fence = place.fence().await.ok().flatten();
    println!(
        "verify: lease {:?} {}; {}",
        target.lease,
        if released { "released" } else { "not held by this run (any it held runs out)" },
        match fence {
            Some(fence) =>
                format!("the fence {:?} stays at term {}: it keeps protecting the resource", fence.name, fence.max_term),
            None => "no fence of the resource was found".to_owned(),
        }
    );
    played
}

/// Acquires, retrying while the lease is held or delayed, for at most [`LEASE_WAIT`].
async fn acquire_within(place: &impl Place, owner: &str, ttl: Duration, waiting: &str) -> Result<i64, Error> {
    let started = tokio::time::Instant::now();
    let mut said = false;
    loop {
        match place.acquire(owner, ttl).await {
            Ok(term) => return Ok(term),
            Err(error) if started.elapsed() >= LEASE_WAIT => {
                return Err(Error::Setup(format!("{error} (waited {} s)", LEASE_WAIT.as_secs())));
            }
            Err(_) => {
                if !said {
                    println!("verify: {waiting}");
                    said = true;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

async fn play(target: &Target, place: &impl Place, run_id: &str, a: &str, b: &str) -> Result<Report, Error> {
    // In use? A held lease, or a fence that is not this lease's (bound to another lease, or
    // unbound and written: its writers' terms are not ours, and ours could raise it above
    // theirs), or above our terms.
    let lease_term = match place.lease().await? {
        Some(lease) if lease.held && !target.yes => {
            return Err(Error::InUse(format!(
                "lease {:?} is held by {:?} at term {}",
                target.lease, lease.owner, lease.term
            )));
        }
        Some(lease) => lease.term,
        None => 0,
    };
    // An unbound fence is never verify's own, even at term 0 (a protected table's before its
    // first write): this run would raise it to B's term, above the terms of writers that use
    // another lease, which would then be refused.
    if let (Some(fence), false) = (place.fence().await?, target.yes) {
        let ours = fence.lease_key.as_deref() == Some(target.lease.as_str());
        if !ours || fence.max_term > lease_term {
            return Err(Error::InUse(format!(
                "the resource's fence {:?} is at term {}, {}: this run's writes (lease {:?}, now at term \
                 {lease_term}) would raise it to about term {}, and writers of lower terms would be refused; verify \
                 with the lease it is bound to, or a resource of its own",
                fence.name,
                fence.max_term,
                match &fence.lease_key {
                    Some(key) => format!("bound to {key:?}"),
                    None => "bound to no lease".to_owned(),
                },
                target.lease,
                lease_term.max(fence.max_term) + 2,
            )));
        }
    }

    let mut report = Report::default();
    match place.guarded().await {
        Ok(Some(guard)) => println!("verify: {guard}"),
        Ok(None) => {}
        // Nothing would refuse the zombie's writes: played only when asked to.
        Err(why) if !target.yes => {
            report.step(Verdict::Fail, format!("0. {why}"));
            println!("verify: not writing a zombie's rows into an unguarded table (--yes plays the story anyway)");
            return Ok(report);
        }
        Err(why) => report.step(Verdict::Fail, format!("0. {why}")),
    }
    let marker = |step: &str| format!("fencing-verify {run_id} {step}");
    // 1. A leads and writes (with --yes, once whoever holds the lease let it run out).
    let term_a =
        acquire_within(place, a, target.ttl, &format!("waiting up to 30 s for lease {:?} to be free", target.lease))
            .await?;
    let first = place.write(a, term_a, &marker("a-leads")).await?;
    let step = format!("1. A leads at term {term_a} and writes");
    if !first.admitted() {
        report.step(Verdict::Fail, format!("{step}: {} (the leader's write must be admitted)", first.text()));
        return Ok(report);
    }
    report.step(Verdict::Pass, format!("{step}: {}", first.text()));
    let fence = place.fence().await?;
    let bound = fence.as_ref().is_some_and(|fence| fence.lease_key.as_deref() == Some(target.lease.as_str()));
    match &fence {
        Some(fence) if !bound && fence.max_term < term_a => report.step(
            Verdict::Fail,
            format!(
                "   the resource's fence {:?} is at term {} after an admitted write of term {term_a}: the write did \
                 not pass it",
                fence.name, fence.max_term
            ),
        ),
        Some(fence) => println!(
            "verify: the write's fence is {:?}, at term {}, {}",
            fence.name,
            fence.max_term,
            if bound { "bound to the lease" } else { "not bound to a lease" }
        ),
        None => report.step(
            Verdict::Fail,
            "   the resource has no fence after an admitted write: the write did not pass the fence, or the \
             resource named is another one"
                .to_owned(),
        ),
    }

    // 2. A's lease runs out, as if A were paused; B takes over.
    tokio::time::sleep(target.ttl + Duration::from_millis(200)).await;
    let term_b = acquire_within(place, b, Duration::from_secs(30), "waiting for B to get the lease").await?;
    report.step(
        if term_b > term_a { Verdict::Pass } else { Verdict::Fail },
        format!("2. A's lease ran out (A is a zombie now); B takes over at term {term_b} (must be above {term_a})"),
    );

    // 3. The zombie writes before B's first write.
    let early = place.write(a, term_a, &marker("zombie-before-b")).await?;
    let step = format!("3. zombie A writes with term {term_a} before B's first write");
    match (&early, bound) {
        (Written::Refused { text, .. }, _) => report.step(Verdict::Pass, format!("{step}: refused, {text}")),
        (Written::Admitted(text), true) => {
            report.step(Verdict::Fail, format!("{step}: {text}, ADMITTED for a resource bound to {:?}", target.lease))
        }
        (Written::Admitted(text), false) => report.step(
            Verdict::Gap,
            format!(
                "{step}: {text}, admitted. The resource is not bound to a lease, so it admits any term at or above \
                 the highest it admitted, until the new leader writes (the documented gap of unbound {what}s; bind \
                 the {what} to the lease to close it)",
                what = target.what()
            ),
        ),
        (Written::Unclear(text), _) => report.step(Verdict::Fail, format!("{step}: {text}")),
    }

    // 4. B writes.
    let b_writes = place.write(b, term_b, &marker("b-leads")).await?;
    report.step(
        if b_writes.admitted() { Verdict::Pass } else { Verdict::Fail },
        format!("4. B writes with term {term_b}: {}", b_writes.text()),
    );
    if let (true, false, Some(fence)) = (b_writes.admitted(), bound, place.fence().await?)
        && fence.max_term < term_b
    {
        report.step(
            Verdict::Fail,
            format!(
                "   the resource's fence {:?} is at term {} after B's admitted write of term {term_b}: the write did \
                 not pass it",
                fence.name, fence.max_term
            ),
        );
    }

    // 5. The zombie writes again: the fence's refusal, naming B's term.
    let late = place.write(a, term_a, &marker("zombie-after-b")).await?;
    let step = format!("5. zombie A writes with term {term_a} after B's write");
    match &late {
        Written::Refused { current_term, text } if *current_term == term_b => {
            report.step(Verdict::Pass, format!("{step}: refused, {text}"))
        }
        Written::Refused { text, .. } => {
            report.step(Verdict::Fail, format!("{step}: refused, but {text} does not name B's term {term_b}"))
        }
        Written::Admitted(text) => report.step(
            Verdict::Fail,
            format!("{step}: {text} (must be refused): this {} does not fence these writes", target.what()),
        ),
        Written::Unclear(text) => report.step(Verdict::Fail, format!("{step}: {text}")),
    }

    // 6. What the upstream (or the table) shows.
    if let Some((source, state)) = place.applied().await {
        let has = |step: &str| state.as_ref().is_ok_and(|text| text.contains(&marker(step)));
        let refused_there: Vec<&str> = [("zombie-before-b", early.refused()), ("zombie-after-b", late.refused())]
            .into_iter()
            .filter(|(step, refused)| *refused && has(step))
            .map(|(step, _)| step)
            .collect();
        if let Err(error) = &state {
            report.step(Verdict::Fail, format!("6. {error}"));
        } else if !refused_there.is_empty() {
            report.step(Verdict::Fail, format!("6. {source} shows refused writes: {refused_there:?}"));
        } else if !has("b-leads") && b_writes.admitted() {
            report.step(
                Verdict::Fail,
                format!("6. {source} does not show B's write (it must show every write applied, by marker)"),
            );
        } else {
            report.step(Verdict::Pass, format!("6. {source} shows B's write and no refused write"));
        }
    }
    place.clean_up(b, term_b, &format!("fencing-verify {run_id}")).await;
    Ok(report)
}
