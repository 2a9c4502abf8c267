//! Graceful handover over HTTP: `POST /v1/leases/{key}/resign-request` reaches the holder in its
//! renewal and in `GET`; after its release the named successor comes first; with
//! `force_after_ms`, a holder that does not step down has its period ended; bad input is
//! refused and changes nothing.

use std::time::Duration;

use fencing_tests::gateway::{JSON, Reply, send};
use http::{Method, StatusCode};
use tokio::time::Instant;

use crate::Setup;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resign_request_reaches_the_holder_and_the_successor_comes_first_or_the_holder_is_forced() {
    let setup = Setup::new().await;
    let control = setup.gateway.control;
    let call = |method: Method, path: &'static str, body: String| async move {
        send(control, method, path, &[JSON], &body).await.unwrap()
    };
    let post = |path: &'static str, body: &str| call(Method::POST, path, body.to_owned());
    let acquire =
        |owner: &str| call(Method::POST, "/v1/leases/jobs/acquire", format!(r#"{{"owner":"{owner}","ttl_ms":30000}}"#));

    let none = post("/v1/leases/jobs/resign-request", r#"{"reason":"deploy"}"#).await;
    assert_eq!((none.status, problem_type(&none).as_deref()), (StatusCode::CONFLICT, Some("not-held")));
    let a = acquire("a").await;
    let term = a.json()["term"].as_i64().unwrap();
    assert_eq!(a.json()["resign_requested"], false);
    for (body, status) in [
        (r#"{"successor":"b"}"#, StatusCode::UNPROCESSABLE_ENTITY),
        (r#"{"reason":""}"#, StatusCode::UNPROCESSABLE_ENTITY),
        (r#"{"reason":"x","force_after_ms":600001}"#, StatusCode::UNPROCESSABLE_ENTITY),
        (r#"{"reason":"x","later":true}"#, StatusCode::UNPROCESSABLE_ENTITY),
        ("{", StatusCode::BAD_REQUEST),
    ] {
        let refused = post("/v1/leases/jobs/resign-request", body).await;
        assert_eq!(refused.status, status, "{body}");
        assert_eq!(refused.header("content-type"), Some("application/problem+json"));
    }
    let unchanged = call(Method::GET, "/v1/leases/jobs", String::new()).await.json();
    assert_eq!(unchanged["resign_requested"], false, "bad input changed nothing: {unchanged}");

    let asked = post("/v1/leases/jobs/resign-request", r#"{"reason":"deploy","successor":"b"}"#).await;
    assert_eq!(asked.status, StatusCode::ACCEPTED);
    assert_eq!((asked.json()["term"].as_i64(), asked.json()["outcome"].as_str()), (Some(term), Some("requested")));
    let renewed = post("/v1/leases/jobs/renew", r#"{"owner":"a","ttl_ms":30000}"#).await;
    assert_eq!((renewed.status, renewed.json()["resign_requested"].as_bool()), (StatusCode::OK, Some(true)));
    let got = call(Method::GET, "/v1/leases/jobs", String::new()).await.json();
    assert_eq!((got["resign_requested"].as_bool(), got["successor"].as_str()), (Some(true), Some("b")), "{got}");
    assert_eq!(post("/v1/leases/jobs/release", r#"{"owner":"a"}"#).await.status, StatusCode::NO_CONTENT);
    let reserved = acquire("c").await;
    assert_eq!((reserved.status, reserved.json()["holder"].as_str()), (StatusCode::CONFLICT, Some("b")));
    let b = acquire("b").await;
    assert_eq!((b.status, b.json()["term"].as_i64()), (StatusCode::OK, Some(term + 1)));

    // b never renews (a paused holder): forced after 500 ms, never earlier.
    let started = Instant::now();
    let forced = post("/v1/leases/jobs/resign-request", r#"{"reason":"deploy","force_after_ms":500}"#).await;
    assert_eq!(
        (forced.status, forced.json()["outcome"].as_str()),
        (StatusCode::OK, Some("forced")),
        "{}",
        forced.json()
    );
    assert!(started.elapsed() >= Duration::from_millis(500));
    let c = acquire("c").await;
    assert_eq!((c.status, c.json()["term"].as_i64()), (StatusCode::OK, Some(term + 2)));

    // A holder that steps down within the time: answered as soon as it does, not forced.
    let asking = tokio::spawn(async move {
        send(
            control,
            Method::POST,
            "/v1/leases/jobs/resign-request",
            &[JSON],
            r#"{"reason":"deploy","force_after_ms":20000}"#,
        )
        .await
        .unwrap()
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released_at = Instant::now();
    assert_eq!(post("/v1/leases/jobs/release", r#"{"owner":"c"}"#).await.status, StatusCode::NO_CONTENT);
    let stepped = asking.await.unwrap();
    assert!(released_at.elapsed() < Duration::from_secs(5), "answered at the release, not at the 20 s force");
    assert_eq!(stepped.json()["outcome"].as_str(), Some("stepped_down"), "{}", stepped.json());
    let client = setup.db.connect().await;
    let reasons: Vec<String> = client
        .query("SELECT end_reason FROM fencing.lease_history WHERE key = 'jobs' ORDER BY term", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(reasons, ["handed_over", "force_released", "handed_over"]);
}

fn problem_type(reply: &Reply) -> Option<String> {
    reply.json()["type"].as_str().and_then(|t| t.rsplit(':').next()).map(str::to_owned)
}
