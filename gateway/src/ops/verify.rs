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

/// What `verify` is pointed at (its `Debug` leaves the token out).
#[derive(Clone)]
pub struct Target {
    /// The control listener's base URL.
    pub control: Uri,
    /// The proxy listener's base URL.
    pub proxy: Uri,
    /// The path (and query) of a write through the proxy.
    pub path: String,
    /// The resource that path writes to.
    pub resource: String,
    /// The lease A and B compete for.
    pub lease: String,
    /// The write's method.
    pub method: Method,
    /// How the leaders present their term.
    pub mode: Mode,
    /// A's lease ttl.
    pub ttl: Duration,
    /// A URL whose body shows the upstream's state.
    pub check_url: Option<Uri>,
    /// The client's bearer token.
    pub token: Option<String>,
    /// A CA file for `https://` listeners.
    pub ca_file: Option<PathBuf>,
    /// Run although the lease or the resource is in use.
    pub yes: bool,
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

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("control", &self.control)
            .field("proxy", &self.proxy)
            .field("path", &self.path)
            .field("resource", &self.resource)
            .field("lease", &self.lease)
            .field("method", &self.method)
            .field("mode", &self.mode)
            .field("check_url", &self.check_url)
            .field("token", &self.token.as_ref().map(|_| "(set)"))
            .finish_non_exhaustive()
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

/// What a zombie's write got.
enum Zombie {
    Refused,
    Admitted,
    /// Neither: the gateway's answer does not say whether the write was forwarded.
    Unclear,
}

fn zombie(answer: &Answer) -> Zombie {
    if answer.fenced() {
        Zombie::Refused
    } else if answer.status.is_success() {
        Zombie::Admitted
    } else {
        Zombie::Unclear
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

/// The run's fixed parts.
struct Story<'a> {
    target: &'a Target,
    http: Http,
    control: String,
    lease_url: String,
    run_id: String,
    /// The names the write's fence may have: the resource (a bound route's), and
    /// `<prefix>/<resource>` for every prefix `--path` may be under (an unbound route's).
    fence_names: Vec<String>,
}

impl Story<'_> {
    async fn find_fence(&self) -> Result<Option<(String, Value)>, Error> {
        for name in &self.fence_names {
            let url = format!("{}/v1/fences/{}", self.control, segment(name));
            let answer =
                self.http.send(Method::GET, url.clone(), &[], Bytes::new(), true).await.map_err(Error::Setup)?;
            match answer.status {
                StatusCode::OK => return Ok(Some((name.clone(), answer.json()))),
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
            _ => Err(format!("{owner} could not acquire {:?}: {}", self.target.lease, answer.problem())),
        }
    }

    /// Acquires, retrying while the lease is held or delayed, for at most [`LEASE_WAIT`].
    async fn acquire_within(&self, owner: &str, ttl: Duration, waiting: &str) -> Result<i64, Error> {
        let started = tokio::time::Instant::now();
        let mut said = false;
        loop {
            match self.acquire(owner, ttl).await {
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

    async fn release(&self, owner: &str) -> bool {
        let body = serde_json::json!({ "owner": owner }).to_string();
        let json = [("content-type", "application/json".to_owned())];
        let url = format!("{}/release", self.lease_url);
        self.http.send(Method::POST, url, &json, Bytes::from(body), true).await.is_ok_and(|a| a.status.is_success())
    }

    async fn write(&self, owner: &str, term: i64, step: &str) -> Result<Answer, Error> {
        let target = self.target;
        let mut headers = match target.mode {
            Mode::Verify => vec![("fencing-token", term.to_string())],
            Mode::Stamp => vec![("fencing-lease", target.lease.clone()), ("fencing-owner", owner.to_owned())],
        };
        headers.push(("fencing-resource", target.resource.clone()));
        // A body only where writes carry one by default.
        let body = if matches!(target.method, Method::POST | Method::PUT | Method::PATCH) {
            headers.push(("content-type", "application/json".to_owned()));
            let marker = format!("fencing-verify {} {step}", self.run_id);
            Bytes::from(serde_json::json!({ "fencing_verify": marker, "owner": owner, "term": term }).to_string())
        } else {
            Bytes::new()
        };
        let url = format!("{}{}", base(&target.proxy), target.path);
        self.http.send(target.method.clone(), url, &headers, body, true).await.map_err(Error::Setup)
    }
}

/// Plays the story; the report says what held. An error means it could not be played; the
/// leases verify took are released either way.
pub async fn run(target: &Target) -> Result<Report, Error> {
    let any_https = [&target.control, &target.proxy].iter().any(|uri| uri.scheme_str() == Some("https"))
        || target.check_url.as_ref().is_some_and(|uri| uri.scheme_str() == Some("https"));
    let tls =
        crate::security::tls::upstream_client_config(target.ca_file.as_deref(), any_https).map_err(Error::Setup)?;
    let http = Http {
        client: Client::builder(TokioExecutor::new()).build(connector(Duration::from_secs(5), tls)),
        token: target.token.clone(),
    };
    let control = base(&target.control);
    let lease_url = format!("{control}/v1/leases/{}", segment(&target.lease));
    let mut fence_names = vec![target.resource.clone(), format!("/{}", target.resource)];
    let parts: Vec<&str> = target.path.split('?').next().unwrap_or("").split('/').filter(|p| !p.is_empty()).collect();
    for end in 1..=parts.len() {
        fence_names.push(format!("/{}/{}", parts[..end].join("/"), target.resource));
    }
    let run_id = format!("{:08x}", rand::random::<u32>());
    let story = Story { target, http, control, lease_url, run_id, fence_names };
    let (a, b) = (format!("fencing-verify-a-{}", story.run_id), format!("fencing-verify-b-{}", story.run_id));
    println!(
        "verify: lease {:?}, resource {:?}, {} {}{} in {} mode, run {}",
        target.lease,
        target.resource,
        target.method,
        base(&target.proxy),
        target.path,
        if target.mode == Mode::Verify { "verify" } else { "stamp" },
        story.run_id
    );
    let played = play(&story, &a, &b).await;
    // Whatever happened, leave no lease of this run held.
    let released = story.release(&b).await | story.release(&a).await;
    let fence = story.find_fence().await.ok().flatten();
    println!(
        "verify: lease {:?} {}; {}",
        target.lease,
        if released { "released" } else { "not held by this run (any it held runs out)" },
        match fence {
            Some((name, json)) => {
                format!("the fence {name:?} stays at term {}: it keeps protecting the resource", json["max_term"])
            }
            None => "no fence of the resource was found".to_owned(),
        }
    );
    played
}

async fn play(story: &Story<'_>, a: &str, b: &str) -> Result<Report, Error> {
    let target = story.target;
    let http = &story.http;
    // In use? A held lease, or a fence that is not this lease's (an unbound route's fence, or
    // one bound to another lease: its writers' terms are not ours), or above our terms.
    let lease = http.send(Method::GET, story.lease_url.clone(), &[], Bytes::new(), true).await.map_err(Error::Setup)?;
    let lease_term = match lease.status {
        StatusCode::OK => {
            let json = lease.json();
            if json["remaining_ms"].as_u64().unwrap_or(0) > 0 && !target.yes {
                return Err(Error::InUse(format!(
                    "lease {:?} is held by {} at term {}",
                    target.lease, json["owner"], json["term"]
                )));
            }
            json["term"].as_i64().unwrap_or(0)
        }
        StatusCode::NOT_FOUND => 0,
        _ => return Err(Error::Setup(format!("GET {}: {}", story.lease_url, lease.problem()))),
    };
    if let (Some((name, json)), false) = (story.find_fence().await?, target.yes) {
        let ours = json["lease_key"].as_str() == Some(target.lease.as_str());
        if !ours || json["max_term"].as_i64().unwrap_or(0) > lease_term {
            return Err(Error::InUse(format!(
                "resource {:?} is in use: its fence {name:?} is at term {}, bound to {} (writes of this run could \
                 raise it above its writers' terms)",
                target.resource, json["max_term"], json["lease_key"]
            )));
        }
    }

    let mut report = Report::default();
    // 1. A leads and writes (with --yes, once whoever holds the lease let it run out).
    let term_a = story
        .acquire_within(a, target.ttl, &format!("waiting up to 30 s for lease {:?} to be free", target.lease))
        .await?;
    let first = story.write(a, term_a, "a-leads").await?;
    if !first.status.is_success() {
        report.step(
            Verdict::Fail,
            format!(
                "1. A leads at term {term_a} and writes: {} (the leader's write must be admitted)",
                first.problem()
            ),
        );
        return Ok(report);
    }
    report.step(Verdict::Pass, format!("1. A leads at term {term_a} and writes: {}", first.status.as_u16()));
    let fence = story.find_fence().await?;
    let bound = fence.as_ref().is_some_and(|(_, json)| json["lease_key"].as_str() == Some(target.lease.as_str()));
    match &fence {
        Some((name, json)) => println!(
            "verify: the write's fence is {name:?}, at term {}, {}",
            json["max_term"],
            if bound { "bound to the lease" } else { "not bound to a lease" }
        ),
        None => report.step(
            Verdict::Fail,
            format!(
                "   the resource {:?} has no fence after an admitted write: the write did not pass the fence, or \
                 --resource names another resource",
                target.resource
            ),
        ),
    }

    // 2. A's lease runs out, as if A were paused; B takes over.
    tokio::time::sleep(target.ttl + Duration::from_millis(200)).await;
    let term_b = story.acquire_within(b, Duration::from_secs(30), "waiting for B to get the lease").await?;
    report.step(
        if term_b > term_a { Verdict::Pass } else { Verdict::Fail },
        format!("2. A's lease ran out (A is a zombie now); B takes over at term {term_b} (must be above {term_a})"),
    );

    // 3. The zombie writes before B's first write.
    let early = story.write(a, term_a, "zombie-before-b").await?;
    let step = format!("3. zombie A writes with term {term_a} before B's first write");
    match (zombie(&early), bound) {
        (Zombie::Refused, _) => report.step(Verdict::Pass, format!("{step}: refused, {}", early.problem())),
        (Zombie::Admitted, true) => report.step(
            Verdict::Fail,
            format!("{step}: {} ADMITTED on a route bound to {:?}", early.status.as_u16(), target.lease),
        ),
        (Zombie::Admitted, false) => report.step(
            Verdict::Gap,
            format!(
                "{step}: {} admitted. The resource is not bound to a lease, so it admits any term at or above the \
                 highest it admitted, until the new leader writes (the documented gap of unbound routes; bind the \
                 route to the lease to close it)",
                early.status.as_u16()
            ),
        ),
        (Zombie::Unclear, _) => report.step(
            Verdict::Fail,
            format!("{step}: {}, not the gateway's refusal: the write may have been forwarded", early.problem()),
        ),
    }

    // 4. B writes.
    let b_writes = story.write(b, term_b, "b-leads").await?;
    report.step(
        if b_writes.status.is_success() { Verdict::Pass } else { Verdict::Fail },
        format!(
            "4. B writes with term {term_b}: {}",
            if b_writes.status.is_success() { b_writes.status.as_u16().to_string() } else { b_writes.problem() }
        ),
    );

    // 5. The zombie writes again: the gateway's refusal, naming B's term.
    let late = story.write(a, term_a, "zombie-after-b").await?;
    let step = format!("5. zombie A writes with term {term_a} after B's write");
    match zombie(&late) {
        Zombie::Refused if late.current_term.as_deref() == Some(term_b.to_string().as_str()) => {
            report.step(Verdict::Pass, format!("{step}: refused, {}", late.problem()))
        }
        Zombie::Refused => report
            .step(Verdict::Fail, format!("{step}: refused, but {} does not name B's term {term_b}", late.problem())),
        Zombie::Admitted => report.step(
            Verdict::Fail,
            format!("{step}: {} (must be 409): this route does not fence these writes", late.status.as_u16()),
        ),
        Zombie::Unclear => report.step(
            Verdict::Fail,
            format!("{step}: {}, not the gateway's refusal: the write may have been forwarded", late.problem()),
        ),
    }

    // 6. What the upstream shows (its URL gets no token: it is not the gateway).
    if let Some(check) = &target.check_url {
        let state = http.send(Method::GET, check.to_string(), &[], Bytes::new(), false).await.map_err(Error::Setup)?;
        let text = String::from_utf8_lossy(&state.body);
        let has = |step: &str| text.contains(&format!("fencing-verify {} {step}", story.run_id));
        let refused_there: Vec<&str> = [("zombie-before-b", early.fenced()), ("zombie-after-b", late.fenced())]
            .into_iter()
            .filter(|(step, refused)| *refused && has(step))
            .map(|(step, _)| step)
            .collect();
        if !state.status.is_success() {
            report.step(Verdict::Fail, format!("6. GET {check}: {}", state.status.as_u16()));
        } else if !refused_there.is_empty() {
            report.step(Verdict::Fail, format!("6. the upstream shows refused writes: {refused_there:?}"));
        } else if !has("b-leads") && b_writes.status.is_success() {
            report.step(
                Verdict::Fail,
                format!("6. the upstream does not show B's write ({check} must show every write applied, by marker)"),
            );
        } else {
            report.step(Verdict::Pass, "6. the upstream shows B's write and no refused write".to_owned());
        }
    }
    Ok(report)
}
