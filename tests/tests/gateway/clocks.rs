//! The clocks attacked through real gateway processes (libfaketime, as the store-faults issue
//! found them): a gateway whose clocks run at half speed, boot clock included; Postgres's wall
//! clock stepped 60 s forward and 120 s back while a gateway holds a grant; and, without
//! grants, a forward step while a lower-term write's bytes are on a slow link. Each is the probe
//! that let zombie writes through when waits compared instants of the database's clock (schema
//! version 7) or a grant's deadline allowed nothing for a clock running slow; each must hold now.

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

/// Raises `resource` to `term` through SQL while `gateway` keeps writing `term - 1` to it, then
/// sends `term - 1` through `gateway` ten times: none of those may be admitted, and none may
/// reach the upstream. Returns how long the raise took.
async fn raise_under_load(
    url: &str,
    gateway: &Gateway,
    upstream: &mut Upstream,
    resource: &str,
    term: i64,
) -> Duration {
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
    for n in 0..10 {
        let id = format!("after-{resource}-{n}");
        let status = write(gateway, resource, term - 1, &id).await;
        assert_eq!(status, StatusCode::CONFLICT, "term {} admitted after term {term} was answered ({id})", term - 1);
    }
    let _ = stop.send(true);
    load.await.unwrap();
    upstream.collect(Duration::from_millis(300)).await;
    for n in 0..10 {
        assert!(!upstream.received(&format!("after-{resource}-{n}")), "a zombie write reached the upstream");
    }
    took
}

/// A gateway whose clocks (wall, monotonic and boot) run at half speed would count its grants
/// twice as long as the store: after a term change waited out the grant, it would still admit the
/// old term. It sees the store's clock move twice as fast as its own on every round trip, never
/// trusts it, and so never uses a grant; the control gateway, at the right speed, does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_a_gateway_whose_clocks_run_at_half_speed_never_admits_a_term_after_the_next_was_answered() {
    let db = TestDb::new().await;
    let mut upstream = Upstream::start().await.unwrap();
    let faketime = faketime_library().unwrap().display().to_string();
    let slow = Gateway::start_with_env(
        &db.url(),
        &config(&upstream.url(), GRANT_MS),
        &[("LD_PRELOAD", faketime), ("FAKETIME", "+0 x0.5".to_owned())],
    )
    .await
    .unwrap();
    let control = Gateway::start(&db.url(), &config(&upstream.url(), GRANT_MS)).await.unwrap();

    let slow_writes = steady(&slow, "slow", 1, Duration::from_millis(1500), "slow").await;
    let control_writes = steady(&control, "control", 1, Duration::from_millis(1500), "control").await;
    let slow_granted = metric(&slow, "fencing_granted_writes_total").await;
    let control_granted = metric(&control, "fencing_granted_writes_total").await;
    let disagreements = metric(&slow, "fencing_clock_disagreements_total").await;
    println!(
        "slow gateway: {slow_writes} writes, {slow_granted} under a grant, {disagreements} clock disagreements; \
         control: {control_writes} writes, {control_granted} under a grant"
    );
    assert!(control_granted > 0.0, "the control gateway used no grant: the test would prove nothing");
    assert_eq!(slow_granted, 0.0, "the slow gateway admitted writes under a grant");
    assert!(disagreements >= 1.0, "the slow gateway did not see its clock disagree");
    assert_eq!(metric(&control, "fencing_clock_disagreements_total").await, 0.0);

    raise_under_load(&db.url(), &slow, &mut upstream, "slow", 2).await;
    raise_under_load(&db.url(), &control, &mut upstream, "control", 2).await;
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
    let took = raise_under_load(&url, &gateway, &mut upstream, "fwd", 2).await;
    println!("a raise 60 s after a forward step took {took:?}");
    assert!(took >= Duration::from_millis(GRANT_MS * 9 / 10), "the raise waited {took:?}, not the grant");
    assert!(metric(&gateway, "fencing_clock_disagreements_total").await >= 1.0, "the step went unseen");

    // A grant at the real time, then back 120 s (60 s behind the real time), grants renewed
    // there (a renewal measured against the end the store recorded before the step would last
    // the whole step), then right again.
    clock.step_to(0);
    steady(&gateway, "back", 1, Duration::from_millis(1500), "warm-back-before").await;
    clock.step_to(-60_000);
    tokio::time::sleep(Duration::from_millis(1500)).await; // the clocks agree again for half a grant
    steady(&gateway, "back", 1, Duration::from_millis(1500), "warm-back").await;
    clock.step_to(0);
    let took = raise_under_load(&url, &gateway, &mut upstream, "back", 2).await;
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
    let higher =
        send(second.proxy, Method::PUT, "/r/s5/item", &[("fencing-token", "6"), ("x-request-id", "higher")], "y")
            .await
            .unwrap();
    assert_eq!(higher.status, StatusCode::OK);
    assert_eq!(lower.await.unwrap().unwrap().status, StatusCode::OK, "term 5 was admitted before the raise");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_lower_arrived_before_higher(&upstream);
}
