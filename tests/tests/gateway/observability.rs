//! The dashboards and alerts proven on a real Prometheus: it scrapes a gateway and two elector
//! processes while a calm run and then a scripted failover run (a paused zombie, a takeover,
//! refused writes, an upstream failure, a slow fence store) play; every dashboard query returns
//! data, and the stale-write alert fires in the failover run and not in the calm one.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use fencing_tests::gateway::{JSON, Reply, send};
use fencing_tests::process::{ElectorProcess, Timing, event, int};
use http::{Method, StatusCode};
use nix::sys::signal::Signal;
use serde_json::Value;
use tokio::process::{Child, Command};

use crate::Setup;

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn dashboards_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../dashboards")
}

/// Prometheus with the project's alerting rules, their `for:` durations set to zero so that a
/// test need not wait minutes: the expressions are the ones operators run.
struct Prometheus {
    port: u16,
    _child: Child,
    dir: PathBuf,
}

impl Prometheus {
    async fn start(gateway: &str, electors: &[String]) -> Prometheus {
        let dir =
            std::env::temp_dir().join(format!("fencing-prometheus-{}-{}", std::process::id(), rand::random::<u32>()));
        std::fs::create_dir_all(&dir).unwrap();
        let rules = std::fs::read_to_string(dashboards_dir().join("alerts.yml")).unwrap();
        let rules: String = rules
            .lines()
            .map(|line| if line.trim_start().starts_with("for:") { "        for: 0s" } else { line })
            .collect::<Vec<_>>()
            .join("\n");
        std::fs::write(dir.join("alerts.yml"), rules).unwrap();
        let targets = electors.iter().map(|t| format!("'{t}'")).collect::<Vec<_>>().join(", ");
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files: ['alerts.yml']\n\
             scrape_configs:\n  - job_name: fencing-gateway\n    static_configs: [{{ targets: ['{gateway}'] }}]\n\
             \x20 - job_name: elector\n    static_configs: [{{ targets: [{targets}] }}]\n"
        );
        std::fs::write(dir.join("prometheus.yml"), config).unwrap();
        let port = free_port();
        let child = match Command::new("prometheus")
            .arg(format!("--config.file={}", dir.join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
        {
            Ok(child) => child,
            Err(error) => panic!("prometheus is needed ({error}): install it, e.g. `apt-get install prometheus`"),
        };
        let prometheus = Prometheus { port, _child: child, dir };
        for _ in 0..300 {
            if prometheus.get("/-/ready").await.is_some_and(|r| r.status == StatusCode::OK) {
                return prometheus;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("prometheus did not become ready");
    }

    async fn get(&self, path: &str) -> Option<Reply> {
        send(([127, 0, 0, 1], self.port).into(), Method::GET, path, &[], "").await.ok()
    }

    /// The result vector of an instant query.
    async fn query(&self, expr: &str) -> Vec<Value> {
        let encoded: String = expr
            .bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
                _ => format!("%{b:02X}"),
            })
            .collect();
        let reply = self.get(&format!("/api/v1/query?query={encoded}")).await.expect("prometheus answers");
        let body = reply.json();
        assert_eq!(body["status"], "success", "{expr}: {body}");
        body["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    /// The names of the alerts firing now.
    async fn firing(&self) -> Vec<String> {
        let reply = self.get("/api/v1/alerts").await.expect("prometheus answers");
        reply.json()["data"]["alerts"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .filter(|alert| alert["state"] == "firing")
            .filter_map(|alert| alert["labels"]["alertname"].as_str().map(str::to_owned))
            .collect()
    }

    /// Waits (bounded) until `expr` returns data.
    async fn wait_for_data(&self, expr: &str) {
        for _ in 0..300 {
            if !self.query(expr).await.is_empty() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("no data for {expr} within 30 s");
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboards_and_alerts_work_on_a_real_prometheus_scraping_a_gateway_and_electors() {
    let setup = Setup::new().await;
    let url = setup.db.url();
    let (port_a, port_b) = (free_port(), free_port());
    // Both electors append to a fenced log while they lead, and each follows it, for the log's
    // panels.
    let admin = setup.db.connect().await;
    fencing_schema::log::create_stream(
        &admin,
        "ledger-log",
        "ledger-writer",
        fencing_schema::log::Retention::default(),
    )
    .await
    .unwrap();
    let projections =
        std::env::temp_dir().join(format!("fencing-observability-{}-{}", std::process::id(), setup.db.name));
    std::fs::create_dir_all(&projections).unwrap();
    let elector = |owner: &'static str, port: u16| {
        let listen = format!("127.0.0.1:{port}");
        let projection = projections.join(format!("{owner}.jsonl")).display().to_string();
        let args = [
            "--metrics-listen",
            &listen,
            "--append-stream",
            "ledger-log",
            "--follow-stream",
            "ledger-log",
            "--follower",
            owner,
            "--projection",
            &projection,
        ];
        ElectorProcess::spawn_with(&url, "ledger-writer", owner, Timing::FAST, &args).unwrap()
    };
    let mut a = elector("a", port_a);
    let term_a = int(&a.wait_for("a elected", |l| event(l) == "elected").await.unwrap(), "term");
    let mut b = elector("b", port_b);
    b.wait_for("b started", |l| event(l) == "started").await.unwrap();
    // A node of a cluster running a daemon, for the membership and daemon panels.
    let port_n = free_port();
    setup
        .db
        .connect()
        .await
        .batch_execute(
            "CREATE TABLE daemon_runs (daemon text, generation bigint, node_id text, at timestamptz);
             CREATE TABLE daemon_ticks (daemon text, generation bigint, node_id text, at timestamptz);",
        )
        .await
        .unwrap();
    let node_args: Vec<String> = [
        "--database-url",
        &url,
        "--cluster",
        "workers",
        "--node-id",
        "n1",
        "--daemons",
        "1",
        "--heartbeat-ms",
        "500",
        "--registration-ttl-ms",
        "2000",
        "--ttl-ms",
        "2000",
        "--ack-ms",
        "1500",
        "--drain-ms",
        "1500",
        "--metrics-listen",
        &format!("127.0.0.1:{port_n}"),
    ]
    .iter()
    .map(|arg| (*arg).to_owned())
    .collect();
    let _node = ElectorProcess::spawn_daemon_node("n1", &node_args).unwrap();

    let prometheus = Prometheus::start(
        &setup.gateway.control.to_string(),
        &[format!("127.0.0.1:{port_a}"), format!("127.0.0.1:{port_b}"), format!("127.0.0.1:{port_n}")],
    )
    .await;
    let proxy = setup.gateway.proxy;
    let write = move |term: i64| async move {
        send(proxy, Method::POST, "/ledger/acct-1/entries", &[("fencing-token", &term.to_string())], "").await.unwrap()
    };

    // The calm run: the leader writes, nothing is refused, no alert fires.
    for _ in 0..20 {
        assert_eq!(write(term_a).await.status, StatusCode::OK);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    prometheus.wait_for_data(r#"fencing_writes_total{outcome="admitted"}"#).await;
    prometheus.wait_for_data("election_is_leader").await;
    prometheus.wait_for_data("election_daemon_assign_seconds_bucket").await;
    prometheus.wait_for_data("election_follower_lag_seconds").await;
    prometheus.wait_for_data("election_log_appends_total").await;
    prometheus.wait_for_data(r#"election_daemons{state="active"} > 0"#).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let calm = prometheus.firing().await;
    assert!(calm.is_empty(), "alerts fired in a calm run: {calm:?}");
    // Every panel has data in a calm run too: series known in advance are exported at 0.
    every_panel_has_data(&prometheus).await;

    // The failover run: A is paused, B takes over, A's term is refused as a zombie's would be.
    a.signal(Signal::SIGSTOP).unwrap();
    let term_b = int(&b.wait_for("b elected", |l| event(l) == "elected").await.unwrap(), "term");
    assert_eq!(write(term_b).await.status, StatusCode::OK);
    a.signal(Signal::SIGCONT).unwrap();
    a.wait_for("a reports loss", |l| event(l) == "lost").await.unwrap();
    // The zombie keeps trying, as a stalled leader does: a sustained stream of refusals.
    let zombie = tokio::spawn(async move {
        for _ in 0..100 {
            assert_eq!(write(term_a).await.status, StatusCode::CONFLICT);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    // An upstream that cannot be reached, a lease taken through the control API, and a fence
    // store too slow to answer (its row held locked while a new term is presented).
    let dead = send(proxy, Method::POST, "/dead", &[("fencing-token", "1")], "").await.unwrap();
    assert_eq!(dead.status, StatusCode::BAD_GATEWAY);
    let lease = send(
        setup.gateway.control,
        Method::POST,
        "/v1/leases/other/acquire",
        &[JSON],
        r#"{"owner":"x","ttl_ms":60000}"#,
    )
    .await
    .unwrap();
    assert_eq!(lease.status, StatusCode::OK);
    assert_eq!(
        send(proxy, Method::POST, "/fixed", &[("fencing-token", "1")], "").await.unwrap().status,
        StatusCode::OK
    );
    let mut locker = setup.db.connect().await;
    let lock = locker.transaction().await.unwrap();
    lock.execute("SELECT 1 FROM fencing.fences WHERE resource = '/fixed/the-fixed-one' FOR UPDATE", &[]).await.unwrap();
    let slow = send(proxy, Method::POST, "/fixed", &[("fencing-token", "2")], "").await.unwrap();
    assert_eq!(slow.status, StatusCode::SERVICE_UNAVAILABLE);
    lock.rollback().await.unwrap();

    // The stale-write alert fires.
    let mut fired = false;
    for _ in 0..300 {
        if prometheus.firing().await.iter().any(|name| name == "FencingStaleWritesSustained") {
            fired = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(fired, "FencingStaleWritesSustained did not fire; firing: {:?}", prometheus.firing().await);
    zombie.abort();

    // Every query of every dashboard panel returns data.
    prometheus.wait_for_data("election_renew_failures_total").await;
    prometheus.wait_for_data("fencing_store_errors_total").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    every_panel_has_data(&prometheus).await;
    std::fs::remove_dir_all(&projections).ok();
}

async fn every_panel_has_data(prometheus: &Prometheus) {
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(dashboards_dir().join("fencing-gateway.json")).unwrap()).unwrap();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap().replace("$__rate_interval", "1m");
            let result = prometheus.query(&expr).await;
            assert!(!result.is_empty(), "panel {:?}: no data for {expr}", panel["title"]);
        }
    }
}
