//! The clocks attacked through real gateway processes (libfaketime, as the store-faults issue
//! found them): a gateway whose clocks run at half speed, boot clock included; Postgres's wall
//! clock stepped 60 s forward and 120 s back while a gateway holds a grant; and, without
//! grants, a forward step while a lower-term write's bytes are on a slow link. Each is the probe
//! that let zombie writes through when waits compared instants of the database's clock (schema
//! version 7) or a grant's deadline allowed nothing for a clock running slow; each must hold now.
//! A gateway admits nothing while its clock and the store's disagree, so each step also costs a
//! short spell of 503s, which the tests wait out (bounded) and print.

use std::time::Duration;

use fencing_tests::faultproxy::{FaultProxy, Mode};
use fencing_tests::gateway::{Gateway, Upstream, send};
use fencing_tests::pg::{PgCluster, TestDb, connect, faketime_library};
use http::{Method, StatusCode};
use tokio::time::Instant;

use crate::replicas::{TimingUpstream, assert_lower_arrived_before_higher};

const GRANT_MS: u64 = 400;

fn config(upstream: &str, grant_ms: u64) -> String {
    config_forwarding(upstream, grant_ms, 1000)
}

fn config_forwarding(upstream: &str, grant_ms: u64, forward_ms: u64) -> String {
    format!(
        "[database]\nfence_check_timeout_ms = 1000\ngrant_ms = {grant_ms}\n\
         [upstream]\nforward_timeout_ms = {forward_ms}\n\
         [[routes]]\nprefix = \"/r\"\nupstream = \"{upstream}\"\nresource = {{ segment = 2 }}\n"
    )
}

async fn write(gateway: &Gateway, resource: &str, term: i64, id: &str) -> StatusCode {
    let term = term.to_string();
    let headers = [("fencing-token", term.as_str()), ("x-request-id", id)];
    send(gateway.proxy, Method::POST, &format!("/r/{resource}/entries"), &headers, "{}").await.unwrap().status
}

async fn metric(gateway: &Gateway, name: &str) -> f64 {
    gateway.metric(name).await.unwrap().unwrap_or_else(|| panic!("the gateway does not export {name}"))
}

/// Writes `term` to `resource` through `gateway` for `length`, every write admitted.
async fn steady(gateway: &Gateway, resource: &str, term: i64, length: Duration, prefix: &str) -> usize {
    let started = Instant::now();
    let mut n = 0;
    while started.elapsed() < length {
        assert_eq!(write(gateway, resource, term, &format!("{prefix}-{n}")).await, StatusCode::OK);
        n += 1;
    }
    n
}

/// After a step of the store's clock: writes `term` to `resource` through `gateway` until one is
/// admitted (each before it gets 503: the gateway saw the clocks disagree and admits nothing
/// until they agree again), within 5 s. Returns how long the 503s lasted.
async fn until_admitted(gateway: &Gateway, resource: &str, term: i64, prefix: &str) -> Duration {
    let started = Instant::now();
    for n in 0.. {
        let status = write(gateway, resource, term, &format!("{prefix}-{n}")).await;
        if status == StatusCode::OK {
            break;
        }
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{prefix}-{n}");
        assert!(started.elapsed() < Duration::from_secs(5), "the gateway admitted nothing for 5 s after a step");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    started.elapsed()
}

/// Raises `resource` to `term` through SQL while `gateway` keeps writing `term - 1` to it, then
/// sends `term - 1` through `gateway` ten times: none of those may be admitted (409, or 503 while
/// the gateway's clock and the store's disagree), and none may reach the upstream. Returns how
/// long the raise took and how many of the ten got 409.
async fn raise_under_load(
    url: &str,
    gateway: &Gateway,
    upstream: &mut Upstream,
    resource: &str,
    term: i64,
) -> (Duration, usize) {
    let client = connect(url).await;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let (proxy, fence) = (gateway.proxy, resource.to_owned());
    let load = tokio::spawn(async move {
        let mut n = 0;
        while !*stopped.borrow() {
            let headers = [("fencing-token", (term - 1).to_string()), ("x-request-id", format!("load-{n}"))];
            let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let _ = send(proxy, Method::POST, &format!("/r/{fence}/entries"), &headers, "{}").await;
            n += 1;
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    let raised: i64 =
        client.query_one("SELECT fencing.admit($1, $2)", &[&format!("/r/{resource}"), &term]).await.unwrap().get(0);
    let took = started.elapsed();
    assert_eq!(raised, term);
    let mut conflicts = 0;
    for n in 0..10 {
        let id = format!("after-{resource}-{n}");
        let status = write(gateway, resource, term - 1, &id).await;
        assert!(
            [StatusCode::CONFLICT, StatusCode::SERVICE_UNAVAILABLE].contains(&status),
            "term {} answered {status} after term {term} was answered ({id})",
            term - 1
        );
        conflicts += usize::from(status == StatusCode::CONFLICT);
    }
    let _ = stop.send(true);
    load.await.unwrap();
    upstream.collect(Duration::from_millis(300)).await;
    for n in 0..10 {
        assert!(!upstream.received(&format!("after-{resource}-{n}")), "a zombie write reached the upstream");
    }
    (took, conflicts)
}

/// A gateway whose clocks (wall, monotonic and boot) run slow or fast would count its grants,
/// settle waits and forward deadlines longer or shorter than the store and the other gateways:
/// after a term change waited out the grant, a slow one would still admit the old term, and its
/// old-term writes could reach the upstream after the next term's. At half, 0.9 times, 1.1 times
/// and twice the rate of real time, it sees the store's clock move at another rate than its own
/// (never over a span long enough to vouch for its rate), so it never trusts its clock and
/// admits nothing: every write gets 503 (problem type fence-store-unavailable, counted as kind
/// "clock"), nothing reaches the upstream, and `/readyz` says why. The control gateway, at the
/// right speed, admits and uses grants.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_s5_a_gateway_whose_clocks_run_slow_or_fast_admits_nothing() {
    let db = TestDb::new().await;
    let mut upstream = Upstream::start().await.unwrap();
    let faketime = faketime_library().unwrap().display().to_string();
    let mut sent = Vec::new();
    for rate in ["0.5", "0.9", "1.1", "2"] {
        let odd = Gateway::spawn_with_env(
            &db.url(),
            &config(&upstream.url(), GRANT_MS),
            &[("LD_PRELOAD", faketime.clone()), ("FAKETIME", format!("+0 x{rate}"))],
        )
        .await
        .unwrap();
        // Long enough for the gateway to have earned trust several times over, had it been right.
        let started = Instant::now();
        let mut writes = 0;
        while started.elapsed() < Duration::from_millis(1200) {
            let id = format!("x{rate}-{writes}");
            let headers = [("fencing-token", "1"), ("x-request-id", id.as_str())];
            let reply = send(odd.proxy, Method::POST, "/r/odd/entries", &headers, "{}").await.unwrap();
            assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "x{rate} answered {id}: {}", reply.json());
            assert_eq!(reply.json()["type"].as_str().map(|t| t.ends_with("fence-store-unavailable")), Some(true));
            sent.push(id);
            writes += 1;
        }
        let ready = send(odd.control, Method::GET, "/readyz", &[], "").await.unwrap();
        assert_eq!(ready.status, StatusCode::SERVICE_UNAVAILABLE, "x{rate}: a gateway whose clock disagrees is ready");
        let refused = metric(&odd, "fencing_store_errors_total{kind=\"clock\"}").await;
        let disagreements = metric(&odd, "fencing_clock_disagreements_total").await;
        println!("x{rate}: {writes} writes, {refused} refused for the clocks, {disagreements} clock disagreements");
        assert!(refused >= writes as f64, "x{rate}: the 503s were not counted as kind clock");
        assert!(disagreements >= 1.0, "x{rate}: the gateway did not see its clock disagree");
    }
    let control = Gateway::start(&db.url(), &config(&upstream.url(), GRANT_MS)).await.unwrap();
    let control_writes = steady(&control, "control", 1, Duration::from_millis(1500), "control").await;
    let control_granted = metric(&control, "fencing_granted_writes_total").await;
    println!("control: {control_writes} writes, {control_granted} under a grant");
    assert!(control_granted > 0.0, "the control gateway used no grant: the test would prove nothing");
    assert_eq!(metric(&control, "fencing_clock_disagreements_total").await, 0.0);
    assert_eq!(metric(&control, "fencing_store_errors_total{kind=\"clock\"}").await, 0.0);
    upstream.collect(Duration::from_millis(300)).await;
    for id in &sent {
        assert!(!upstream.received(id), "{id} reached the upstream through a gateway whose clock disagrees");
    }

    let (_, conflicts) = raise_under_load(&db.url(), &control, &mut upstream, "control", 2).await;
    assert_eq!(conflicts, 10, "the control gateway's clock agrees: its stale writes get 409");
}

/// Postgres's wall clock stepped 60 s forward while a gateway holds a grant: the raise still
/// waits the grant's length (it answered in 5 ms before), and the grant holder refuses the old
/// term at once after it; the gateway sees the step and drops its grants. Then 120 s back, and
/// right again: a grant given meanwhile is no longer than asked, and the raise after the
/// correction waits one grant, not the step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_a_step_of_the_stores_clock_lets_no_grant_outlive_its_term() {
    let clock = PgCluster::fake_clock();
    let (url, _clock) = clock.database("gateway_clock_steps").await;
    let mut upstream = Upstream::start().await.unwrap();
    let gateway = Gateway::start(&url, &config(&upstream.url(), GRANT_MS)).await.unwrap();

    steady(&gateway, "fwd", 1, Duration::from_millis(1000), "warm-fwd").await;
    assert!(metric(&gateway, "fencing_granted_writes_total").await > 0.0, "no grant in use before the step");
    clock.step_to(60_000);
    let (took, _) = raise_under_load(&url, &gateway, &mut upstream, "fwd", 2).await;
    println!("a raise 60 s after a forward step took {took:?}");
    assert!(took >= Duration::from_millis(GRANT_MS * 9 / 10), "the raise waited {took:?}, not the grant");
    assert!(metric(&gateway, "fencing_clock_disagreements_total").await >= 1.0, "the step went unseen");

    // A grant at the real time, then back 120 s (60 s behind the real time), grants renewed
    // there (a renewal measured against the end the store recorded before the step would last
    // the whole step), then right again.
    clock.step_to(0);
    let refusing = until_admitted(&gateway, "back", 1, "after-step-back").await;
    println!("after the step back to real time, the gateway answered 503 for {refusing:?}");
    steady(&gateway, "back", 1, Duration::from_millis(1500), "warm-back-before").await;
    clock.step_to(-60_000);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    until_admitted(&gateway, "back", 1, "after-step-behind").await;
    steady(&gateway, "back", 1, Duration::from_millis(1500), "warm-back").await;
    clock.step_to(0);
    let (took, _) = raise_under_load(&url, &gateway, &mut upstream, "back", 2).await;
    println!("a raise after a backward step and its correction took {took:?}");
    assert!(took < Duration::from_secs(3), "the raise waited {took:?}: a grant outlived its length");
}

/// Without grants, a forward step of Postgres's wall clock between a lower-term write's decision
/// and the next term's: the higher term still settles behind the lower-term write, whose bytes
/// are on a slow link, so the upstream never sees a byte of term 1 after term 2's head (before,
/// the step ended the settle wait at once and term 2 arrived first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s5_a_forward_step_of_the_stores_clock_does_not_end_a_settle_wait() {
    let clock = PgCluster::fake_clock();
    let (url, _clock) = clock.database("gateway_settle_step").await;
    let upstream = TimingUpstream::start(false).await;
    let slow_link = FaultProxy::start(upstream.addr).await.unwrap();
    let first =
        Gateway::start(&url, &config_forwarding(&format!("http://{}", slow_link.addr()), 0, 2000)).await.unwrap();
    let second = Gateway::start(&url, &config_forwarding(&format!("http://{}", upstream.addr), 0, 2000)).await.unwrap();
    let reply = send(first.proxy, Method::PUT, "/r/s5/item", &[("fencing-token", "5")], "").await.unwrap();
    assert_eq!(reply.status, StatusCode::OK);

    slow_link.set(Mode::Delay(Duration::from_millis(700)));
    let proxy = first.proxy;
    let lower = tokio::spawn(async move {
        send(proxy, Method::PUT, "/r/s5/item", &[("fencing-token", "5"), ("x-request-id", "lower")], "x").await
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    clock.step_to(60_000);
    // The second gateway sees the step on this very round trip: 503 (nothing is admitted while
    // the clocks disagree) until the clocks have agreed again, then admitted, behind the settle.
    let started = Instant::now();
    loop {
        let higher =
            send(second.proxy, Method::PUT, "/r/s5/item", &[("fencing-token", "6"), ("x-request-id", "higher")], "y")
                .await
                .unwrap();
        if higher.status == StatusCode::OK {
            break;
        }
        assert_eq!(higher.status, StatusCode::SERVICE_UNAVAILABLE, "{}", higher.json());
        assert!(started.elapsed() < Duration::from_secs(5), "term 6 was not admitted within 5 s of the step");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(lower.await.unwrap().unwrap().status, StatusCode::OK, "term 5 was admitted before the raise");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_lower_arrived_before_higher(&upstream);
}

/// A write admitted while the clocks agreed, waiting out its settle, is not sent once the gateway
/// has seen its clock and the store's disagree: its wait and its deadline were counted on a clock
/// that no longer stands for the store's lengths. Gateway `lower` admits term 5 (its settle is the
/// forward timeout, 2 s); gateway `higher` admits term 6 behind it and waits; meanwhile the
/// store's clock steps forward and another write through `higher` shows it the step. The term-6
/// write is then refused (503) and never reaches the upstream; the same without the step is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s5_a_write_waiting_out_its_settle_is_not_sent_after_the_gateway_saw_the_clocks_disagree() {
    let clock = PgCluster::fake_clock();
    let (url, _clock) = clock.database("gateway_ticket").await;
    let mut upstream = Upstream::start().await.unwrap();
    let lower = Gateway::start(&url, &config_forwarding(&upstream.url(), 0, 2000)).await.unwrap();
    let higher = Gateway::start(&url, &config_forwarding(&upstream.url(), 0, 2000)).await.unwrap();
    for (round, step) in [(0, false), (1, true)] {
        let resource = format!("ticket-{round}");
        assert_eq!(write(&lower, &resource, 5, &format!("lower-{round}")).await, StatusCode::OK);
        let proxy = higher.proxy;
        let (fence, id) = (resource.clone(), format!("higher-{round}"));
        let waiting = tokio::spawn(async move {
            let headers = [("fencing-token", "6"), ("x-request-id", id.as_str())];
            send(proxy, Method::POST, &format!("/r/{fence}/entries"), &headers, "{}").await.unwrap()
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!waiting.is_finished(), "term 6 did not wait out term 5's settle: the test would prove nothing");
        if step {
            clock.step_to(60_000);
            // Any round trip of `higher` shows it the step (this write's own answer is refused).
            let seen = write(&higher, &format!("{resource}-other"), 1, &format!("other-{round}")).await;
            assert_eq!(seen, StatusCode::SERVICE_UNAVAILABLE, "the gateway did not see the step");
        }
        let reply = waiting.await.unwrap();
        upstream.collect(Duration::from_millis(300)).await;
        if step {
            assert_eq!(
                reply.status,
                StatusCode::SERVICE_UNAVAILABLE,
                "sent after the clocks disagreed: {}",
                reply.json()
            );
            assert!(!upstream.received(&format!("higher-{round}")), "the refused write reached the upstream");
        } else {
            assert_eq!(reply.status, StatusCode::OK, "{}", reply.json());
            assert!(upstream.received(&format!("higher-{round}")));
        }
    }
    clock.step_to(0);
}
