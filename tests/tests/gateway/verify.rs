//! `fencing-gateway verify`, the zombie story a user points at their own setup, run as a process
//! against a real gateway, a real PostgreSQL and an upstream that applies every write it gets
//! (the recording upstream's `GET /__applied`): it passes where fencing holds, reports the
//! documented gap of an unbound route, refuses a lease or resource in use, and fails where the
//! writes do not pass the fence.

use std::process::Output;

use fencing_tests::gateway::send;
use fencing_tests::workspace_bin;
use http::{Method, StatusCode};

use crate::Setup;
use fencing_tests::pg::TestDb;

async fn verify(args: &[&str]) -> (Output, String) {
    run_verify(args, None).await
}

/// Runs `fencing-gateway verify` with `args`; with `database_url`, as DATABASE_URL (never argv),
/// and no other way to find a database.
async fn run_verify(args: &[&str], database_url: Option<String>) -> (Output, String) {
    let mut command = tokio::process::Command::new(workspace_bin("fencing-gateway").unwrap());
    command.arg("verify").args(args).env_remove("FENCING_CLIENT_TOKEN");
    if let Some(url) = database_url {
        command.env("DATABASE_URL", url).env_remove("DATABASE_URL_FILE").env_remove("FENCING_CONFIG");
    }
    let output = command.output().await.unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    println!("{stdout}{}", String::from_utf8_lossy(&output.stderr));
    (output, stdout)
}

fn lines_starting(stdout: &str, prefix: &str) -> usize {
    stdout.lines().filter(|line| line.starts_with(prefix)).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_holds_on_a_bound_route_reports_the_unbound_gap_and_refuses_a_lease_in_use() {
    let setup = Setup::new().await;
    let control = format!("http://{}", setup.gateway.control);
    let proxy = format!("http://{}", setup.gateway.proxy);
    let applied = format!("{}/__applied", setup.upstream.url());
    let target = ["--control", control.as_str(), "--proxy", proxy.as_str(), "--check-url", applied.as_str()];

    // A route bound to its lease: the zombie is refused before and after B's first write.
    let bound = [&target[..], &["--path", "/ledger/verify-acct/entries", "--resource", "verify-acct"]].concat();
    let (output, stdout) = verify(&[&bound[..], &["--lease", "ledger-writer"]].concat()).await;
    assert!(output.status.success(), "{stdout}");
    for step in ["PASS 1.", "PASS 2.", "PASS 3.", "PASS 4.", "PASS 5.", "PASS 6."] {
        assert_eq!(lines_starting(&stdout, step), 1, "{step} missing: {stdout}");
    }
    assert!(stdout.contains("fencing held on this route"), "{stdout}");
    // In stamp mode too, on another account.
    let stamp = [&target[..], &["--path", "/ledger/verify-stamp/entries", "--resource", "verify-stamp"]].concat();
    let (output, stdout) = verify(&[&stamp[..], &["--lease", "ledger-writer", "--mode", "stamp"]].concat()).await;
    assert!(output.status.success(), "{stdout}");
    assert_eq!(lines_starting(&stdout, "PASS "), 6, "{stdout}");

    // An unbound route: the zombie's write before B's first one is the documented gap; after it,
    // refused. Its fence then exists and binds no lease: a second run is refused as in use (its
    // writes could raise a fence other writers use), and plays with --yes.
    let unbound = [&target[..], &["--path", "/jobs/any", "--resource", "verify-job"]].concat();
    let gap = |output: &Output, stdout: &str| {
        assert!(output.status.success(), "{stdout}");
        assert_eq!(lines_starting(stdout, "GAP  3."), 1, "{stdout}");
        assert!(stdout.contains("documented gap of unbound routes"), "{stdout}");
        for step in ["PASS 1.", "PASS 2.", "PASS 4.", "PASS 5.", "PASS 6."] {
            assert_eq!(lines_starting(stdout, step), 1, "{step} missing: {stdout}");
        }
    };
    let (output, stdout) = verify(&unbound).await;
    gap(&output, &stdout);
    let (output, _) = verify(&unbound).await;
    assert_eq!(output.status.code(), Some(64), "{output:?}");
    assert!(String::from_utf8_lossy(&output.stderr).contains("\"/jobs/verify-job\" is at term"), "{output:?}");
    let (output, stdout) = verify(&[&unbound[..], &["--yes"]].concat()).await;
    gap(&output, &stdout);

    // A lease someone holds is refused (64) and nothing is written; --yes plays on.
    let held = send(
        setup.gateway.control,
        Method::POST,
        "/v1/leases/ledger-writer/acquire",
        &[("content-type", "application/json")],
        r#"{"owner":"the-real-leader","ttl_ms":2000}"#,
    )
    .await
    .unwrap();
    assert_eq!(held.status, StatusCode::OK);
    let before = applied_now(&setup).await;
    let (output, stdout) = verify(&[&bound[..], &["--lease", "ledger-writer"]].concat()).await;
    assert_eq!(output.status.code(), Some(64), "{stdout}");
    assert!(String::from_utf8_lossy(&output.stderr).contains("is held by"), "{output:?}");
    assert_eq!(applied_now(&setup).await, before, "a refused run wrote");
    let (output, stdout) = verify(&[&bound[..], &["--lease", "ledger-writer", "--yes"]].concat()).await;
    assert!(output.status.success(), "{stdout}");

    // A protected table's fence at term 0, of the same name as the route's resource, binds no
    // lease: in use for a route too.
    let db = setup.db.connect().await;
    db.batch_execute("CREATE TABLE shared (id int); SELECT fencing.protect('shared', 'verify-shared');").await.unwrap();
    let shared = [&target[..], &["--path", "/ledger/verify-shared/entries", "--resource", "verify-shared"]].concat();
    let (output, _) = verify(&[&shared[..], &["--lease", "ledger-writer"]].concat()).await;
    assert_eq!(output.status.code(), Some(64), "{output:?}");
    assert!(String::from_utf8_lossy(&output.stderr).contains("bound to no lease"), "{output:?}");

    // The lease is left released.
    let lease = send(setup.gateway.control, Method::GET, "/v1/leases/ledger-writer", &[], "").await.unwrap();
    assert_eq!(lease.json()["remaining_ms"], 0, "{:?}", lease.json());
}

/// The upstream's applied writes, read directly.
async fn applied_now(setup: &Setup) -> String {
    let reply = send(setup.upstream.addr, Method::GET, "/__applied", &[], "").await.unwrap();
    String::from_utf8_lossy(&reply.body).into_owned()
}

/// The classic misconfiguration: the leaders write around the gateway (here, straight to the
/// upstream). Every write is applied, the zombie's too: verify fails (exit 1) and says where.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_fails_when_the_writes_go_around_the_fence() {
    let setup = Setup::new().await;
    let control = format!("http://{}", setup.gateway.control);
    let around = setup.upstream.url();
    let applied = format!("{around}/__applied");
    let (output, stdout) = verify(&[
        "--control",
        control.as_str(),
        "--proxy",
        around.as_str(),
        "--check-url",
        applied.as_str(),
        "--path",
        "/ledger/around/entries",
        "--resource",
        "around",
        "--lease",
        "ledger-writer",
    ])
    .await;
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("has no fence after an admitted write"), "{stdout}");
    assert_eq!(lines_starting(&stdout, "FAIL 5."), 1, "{stdout}");
    assert!(stdout.contains("does not fence"), "{stdout}");
    assert!(stdout.contains("verify: FAILED"), "{stdout}");

    // Bad command lines are 64 and touch nothing.
    for args in [
        &["--control", "ftp://x", "--proxy", "http://127.0.0.1:1", "--path", "/a", "--resource", "r"][..],
        &["--control", control.as_str(), "--proxy", "http://127.0.0.1:1", "--path", "a", "--resource", "r"],
        &[
            "--control",
            control.as_str(),
            "--proxy",
            "http://127.0.0.1:1",
            "--path",
            "/a",
            "--resource",
            "r",
            "--ttl-ms",
            "5",
        ],
    ] {
        let (output, _) = verify(args).await;
        assert_eq!(output.status.code(), Some(64), "{args:?}");
    }
}

/// `verify --table` against a table protected by the SQL guard, the database given as
/// DATABASE_URL (never argv).
async fn verify_table(db: &TestDb, args: &[&str]) -> (Output, String) {
    run_verify(args, Some(db.url())).await
}

/// The SQL guard's zombie story: a bound table refuses the zombie before and after B's first
/// write, an unbound one shows the gap, the check query sees B's row and no refused one, the
/// cleanup removes the run's rows; a second run on a fence verify does not own is refused as in
/// use; and the misconfigurations a DBA can make fail: a table never protected, a guard disabled
/// or not enabled ALWAYS, a write that changes no row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_plays_the_zombie_story_in_sql_against_a_protected_table() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    client
        .batch_execute(
            "CREATE TABLE orders (id bigserial PRIMARY KEY, note text NOT NULL, term bigint);
             SELECT fencing.protect('orders', 'orders', 'term');
             CREATE TABLE ledger (id bigserial PRIMARY KEY, note text NOT NULL);
             SELECT fencing.protect('ledger', 'ledger-rows');
             SELECT fencing.bind('ledger-rows', 'ledger-writer');
             CREATE TABLE plain (id bigserial PRIMARY KEY, note text NOT NULL);
             CREATE TABLE switched_off (id bigserial PRIMARY KEY, note text NOT NULL);
             SELECT fencing.protect('switched_off', 'switched-off');
             CREATE TABLE origin_only (id bigserial PRIMARY KEY, note text NOT NULL);
             SELECT fencing.protect('origin_only', 'origin-only');
             CREATE TABLE parent (id bigserial PRIMARY KEY, note text NOT NULL);
             SELECT fencing.protect('parent', 'parent');
             CREATE TABLE insert_only (id bigserial PRIMARY KEY, note text NOT NULL);
             SELECT fencing.protect('insert_only', 'insert-only');
             -- The event trigger puts a guard back on every ALTER TABLE and guards every new
             -- child; a session that says it is protecting (as fencing.protect does) gets past
             -- it, as does a database migrated without it.
             BEGIN;
             SELECT set_config('fencing.protecting', 'on', true);
             ALTER TABLE switched_off DISABLE TRIGGER fencing_guard;
             ALTER TABLE origin_only ENABLE TRIGGER fencing_guard;
             CREATE TABLE parent_child () INHERITS (parent);
             DROP TRIGGER fencing_guard ON insert_only;
             CREATE TRIGGER fencing_guard BEFORE INSERT ON insert_only
                 FOR EACH ROW EXECUTE FUNCTION fencing.guard('insert-only');
             ALTER TABLE insert_only ENABLE ALWAYS TRIGGER fencing_guard;
             COMMIT;",
        )
        .await
        .unwrap();
    let table = |name: &'static str| -> Vec<String> {
        vec![
            "--table".into(),
            name.into(),
            "--write".into(),
            format!("INSERT INTO {name} (note) VALUES ($1)"),
            "--check-query".into(),
            // A column named like a row alias must not hide the row.
            format!("SELECT id AS q, note FROM {name}"),
        ]
    };
    let run = |args: Vec<String>| {
        let db = &db;
        async move { verify_table(db, &args.iter().map(String::as_str).collect::<Vec<_>>()).await }
    };

    // Bound to its lease: six passes, the guard found by itself (no --resource).
    let (output, stdout) = run([table("ledger"), vec!["--lease".into(), "ledger-writer".into()]].concat()).await;
    assert!(output.status.success(), "{stdout}");
    for step in ["PASS 1.", "PASS 2.", "PASS 3.", "PASS 4.", "PASS 5.", "PASS 6."] {
        assert_eq!(lines_starting(&stdout, step), 1, "{step} missing: {stdout}");
    }
    assert!(stdout.contains("ZF409 not_leader") || stdout.contains("ZF409 stale"), "{stdout}");
    assert!(stdout.contains("fencing held on this table"), "{stdout}");
    // The refused rows are not in the table; A's and B's are, and stay without --cleanup.
    let notes: Vec<String> =
        client.query("SELECT note FROM ledger", &[]).await.unwrap().iter().map(|row| row.get(0)).collect();
    assert_eq!(notes.len(), 2, "{notes:?}");
    assert!(notes.iter().any(|note| note.ends_with(" a-leads")) && notes.iter().any(|n| n.ends_with(" b-leads")));
    assert!(stdout.contains("--cleanup removes them"), "{stdout}");

    // Unbound, with a term column: the gap before B writes, the refusal after; --cleanup, as
    // B, leaves no row of the run.
    // Its fence exists (fencing.protect made it) and binds no lease: verify's terms could lock
    // out its writers, so only with --yes.
    let cleanup = ["--cleanup", "DELETE FROM orders WHERE note LIKE $1 || '%'"].map(String::from).to_vec();
    let (output, _) = run([table("orders"), cleanup.clone()].concat()).await;
    assert_eq!(output.status.code(), Some(64), "{output:?}");
    assert!(String::from_utf8_lossy(&output.stderr).contains("bound to no lease"), "{output:?}");
    let yes = vec!["--yes".to_owned()];
    let (output, stdout) = run([table("orders"), cleanup.clone(), yes.clone()].concat()).await;
    assert!(output.status.success(), "{stdout}");
    assert_eq!(lines_starting(&stdout, "GAP  3."), 1, "{stdout}");
    assert!(stdout.contains("documented gap of unbound tables"), "{stdout}");
    for step in ["PASS 1.", "PASS 2.", "PASS 4.", "PASS 5.", "PASS 6."] {
        assert_eq!(lines_starting(&stdout, step), 1, "{step} missing: {stdout}");
    }
    assert!(stdout.contains("--cleanup, as fencing-verify-b-"), "{stdout}");
    let left: i64 = client.query_one("SELECT count(*) FROM orders", &[]).await.unwrap().get(0);
    assert_eq!(left, 0, "the cleanup left rows");
    // Its fence is now unbound and written: a second run is refused (64) and writes nothing.
    let (output, _) = run([table("orders"), cleanup].concat()).await;
    assert_eq!(output.status.code(), Some(64), "{output:?}");
    assert!(String::from_utf8_lossy(&output.stderr).contains("\"orders\" is at term"), "{output:?}");

    // A cleanup that would change more rows than the run wrote is rolled back.
    client
        .batch_execute("BEGIN; SET LOCAL fencing.token = '100'; INSERT INTO orders (note) VALUES ('theirs'); COMMIT")
        .await
        .unwrap();
    let greedy = ["--cleanup", "DELETE FROM orders WHERE note LIKE $1 || '%' OR true"].map(String::from).to_vec();
    let (output, stdout) = run([table("orders"), greedy, yes.clone()].concat()).await;
    assert_eq!(output.status.code(), Some(1), "{stdout}"); // the fence is at 100 now: A's write is refused
    let (output, stdout) = run([
        table("ledger"),
        vec!["--lease".into(), "ledger-writer".into()],
        ["--cleanup", "DELETE FROM ledger WHERE $1 <> ''"].map(String::from).to_vec(),
    ]
    .concat())
    .await;
    assert!(output.status.success(), "{stdout}");
    assert!(
        stdout.contains("--cleanup would have changed 4 rows, more than the run's writes changed (2): rolled back"),
        "{stdout}"
    );
    let theirs: i64 = client.query_one("SELECT count(*) FROM orders WHERE note = 'theirs'", &[]).await.unwrap().get(0);
    assert_eq!(theirs, 1);

    // A table nothing guards gets no zombie rows unless asked: step 0 fails and the story stops.
    let (output, stdout) = run(table("plain")).await;
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("FAIL 0.") && !stdout.contains("PASS 1."), "{stdout}");
    let rows: i64 = client.query_one("SELECT count(*) FROM plain", &[]).await.unwrap().get(0);
    assert_eq!(rows, 0, "rows written into an unguarded table without --yes");

    // Misconfigurations fail (exit 1), naming why: the zombie's write is applied.
    for (name, why) in [
        ("plain", "has no fencing_guard trigger"),
        ("switched_off", "is disabled"),
        ("origin_only", "is not enabled ALWAYS"),
        ("parent", "parent_child has no fencing_guard trigger"),
        ("insert_only", "is not fencing.guard BEFORE INSERT OR UPDATE OR DELETE"),
    ] {
        let (output, stdout) = run([table(name), yes.clone()].concat()).await;
        assert_eq!(output.status.code(), Some(1), "{name}: {stdout}");
        assert_eq!(lines_starting(&stdout, "FAIL 0."), 1, "{name}: {stdout}");
        assert!(stdout.contains(why), "{name}: {stdout}");
        assert!(stdout.contains("verify: FAILED"), "{name}: {stdout}");
        if ["plain", "switched_off"].contains(&name) {
            // No guard fired: the zombie's writes went in, and the check query shows them.
            assert_eq!(lines_starting(&stdout, "FAIL 5."), 1, "{name}: {stdout}");
            let zombies: i64 = client
                .query_one(&format!("SELECT count(*) FROM {name} WHERE note LIKE '% zombie-%'"), &[])
                .await
                .unwrap()
                .get(0);
            assert_eq!(zombies, 2, "{name}");
        }
    }

    // A write that changes no row tests nothing: step 1 fails.
    let (output, stdout) = run(vec![
        "--table".into(),
        "ledger".into(),
        "--write".into(),
        "UPDATE ledger SET note = $1 WHERE false".into(),
        "--lease".into(),
        "ledger-writer".into(),
    ])
    .await;
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("FAIL 1.") && stdout.contains("changed no row"), "{stdout}");

    // Bad command lines are 64 and touch nothing.
    let before: i64 = client.query_one("SELECT count(*) FROM ledger", &[]).await.unwrap().get(0);
    for (args, said) in [
        (&["--table", "nope", "--write", "SELECT $1"][..], "no such table"),
        (&["--table", "ledger", "--write", "INSERT INTO ledger (nope) VALUES ($1)"], "--write"),
        (&["--table", "ledger", "--write", "INSERT INTO ledger (note) VALUES ($1); DELETE FROM ledger"], "--write"),
        (&["--table", "ledger", "--write", "SELECT $1", "--resource", "orders"], "fences resource"),
        (&["--table", "ledger"], "--write"),
        (&["--table", "ledger", "--write", "SELECT $1", "--control", "http://127.0.0.1:1"], "cannot be used"),
        // The marker is how the run's rows are found: $1 it must take, and nothing else.
        (&["--table", "ledger", "--write", "INSERT INTO ledger (note) VALUES ('x')"], "exactly one parameter"),
        (&["--table", "ledger", "--write", "SELECT $1", "--cleanup", "DELETE FROM ledger"], "exactly one parameter"),
        (&["--table", "ledger", "--write", "SELECT $1, $2::int"], "exactly one parameter"),
        // The check query is one query: no typo, no second statement, found before any write.
        (&["--table", "ledger", "--write", "SELECT $1", "--check-query", "SELECT nope FROM ledger"], "--check-query"),
        (
            &["--table", "ledger", "--write", "SELECT $1", "--check-query", "SELECT 1; DELETE FROM ledger"],
            "--check-query",
        ),
        (
            &["--table", "ledger", "--write", "SELECT $1", "--check-query", "DELETE FROM ledger RETURNING note"],
            "--check-query",
        ),
    ] {
        let (output, _) = verify_table(&db, args).await;
        assert_eq!(output.status.code(), Some(64), "{args:?}");
        assert!(String::from_utf8_lossy(&output.stderr).contains(said), "{args:?}: {output:?}");
    }
    let after: i64 = client.query_one("SELECT count(*) FROM ledger", &[]).await.unwrap().get(0);
    assert_eq!(before, after, "a refused command line wrote");
}

/// The failure only `--check-url` can see: a gateway that answers a zombie's write with its
/// refusal but forwards it all the same. Played by a proxy in front of the real gateway that
/// hands every refused write to the upstream too: steps 3 and 5 look right, step 6 fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_fails_when_a_refused_write_reaches_the_upstream() {
    let setup = Setup::new().await;
    let (gateway, upstream) = (setup.gateway.proxy, setup.upstream.addr);
    let leaky = axum::Router::new().fallback(move |request: axum::extract::Request| async move {
        let (parts, body) = request.into_parts();
        let body = axum::body::to_bytes(body, 1 << 20).await.unwrap_or_default();
        let body = String::from_utf8_lossy(&body).into_owned();
        let headers: Vec<(String, String)> = parts
            .headers
            .iter()
            .filter_map(|(name, value)| Some((name.to_string(), value.to_str().ok()?.to_owned())))
            .collect();
        let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let reply = send(gateway, parts.method.clone(), path, &headers, &body).await.unwrap();
        if reply.status == StatusCode::CONFLICT {
            // The bug: refused, and forwarded.
            let content = [("content-type", "application/json")];
            send(upstream, parts.method, path, &content, &body).await.unwrap();
        }
        let mut answer = axum::response::Response::new(axum::body::Body::from(reply.body));
        *answer.status_mut() = reply.status;
        *answer.headers_mut() = reply.headers;
        answer
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let leaky_addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, leaky).await });

    let control = format!("http://{}", setup.gateway.control);
    let proxy = format!("http://{leaky_addr}");
    let applied = format!("{}/__applied", setup.upstream.url());
    let args = [
        "--control",
        control.as_str(),
        "--proxy",
        proxy.as_str(),
        "--path",
        "/ledger/leaky/entries",
        "--resource",
        "leaky",
        "--lease",
        "ledger-writer",
    ];
    // Without a way to read the upstream, the answers alone look like fencing.
    let (output, stdout) = verify(&args).await;
    assert!(output.status.success(), "{stdout}");
    // With one, the refused writes are found where they must not be.
    let (output, stdout) = verify(&[&args[..], &["--check-url", applied.as_str(), "--yes"]].concat()).await;
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    for step in ["PASS 3.", "PASS 5.", "FAIL 6."] {
        assert_eq!(lines_starting(&stdout, step), 1, "{step} missing: {stdout}");
    }
    assert!(stdout.contains(r#"shows refused writes: ["zombie-before-b", "zombie-after-b"]"#), "{stdout}");
}
