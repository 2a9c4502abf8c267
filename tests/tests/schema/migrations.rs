//! The migration runner: idempotent, safe from many processes at once, and refusing a schema
//! newer than the binary.

use std::process::Stdio;

use fencing_schema::{Error, FUNCTIONS, LATEST_VERSION, MIGRATIONS, check_schema_version, migrate, schema_version};
use fencing_tests::pg::TestDb;
use fencing_tests::workspace_bin;
use tokio_postgres::Client;

/// Every object of schema `fencing`, with function bodies hashed, and the recorded versions:
/// two databases with equal snapshots have the same schema.
async fn snapshot(client: &Client) -> String {
    let row = client
        .query_one(
            "SELECT coalesce(string_agg(x, E'\\n' ORDER BY x), '') FROM (
                SELECT 'function ' || p.oid::regprocedure::text || ' ' || md5(pg_get_functiondef(p.oid)) AS x
                  FROM pg_proc p WHERE p.pronamespace = 'fencing'::regnamespace
                UNION ALL
                SELECT 'column ' || c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
                  FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid
                 WHERE c.relnamespace = 'fencing'::regnamespace AND a.attnum > 0 AND NOT a.attisdropped
                UNION ALL
                SELECT 'constraint ' || conname || ' ' || pg_get_constraintdef(oid)
                  FROM pg_constraint WHERE connamespace = 'fencing'::regnamespace
                UNION ALL
                SELECT 'migration ' || version || ' ' || name FROM fencing.schema_migrations
             ) objects",
            &[],
        )
        .await
        .unwrap();
    row.get(0)
}

async fn reference_snapshot() -> String {
    let db = TestDb::new().await;
    snapshot(&db.connect().await).await
}

async fn recorded_versions(client: &Client) -> Vec<i32> {
    client
        .query("SELECT version FROM fencing.schema_migrations ORDER BY version", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
}

fn all_versions() -> Vec<i32> {
    MIGRATIONS.iter().map(|m| m.version).collect()
}

#[tokio::test]
async fn migrate_twice_applies_each_file_once_and_changes_nothing_the_second_time() {
    let db = TestDb::empty().await;
    let mut client = db.connect().await;
    assert_eq!(schema_version(&client).await.unwrap(), None);

    let first = migrate(&mut client).await.unwrap();
    assert_eq!(first.applied, all_versions());
    assert_eq!(first.version, LATEST_VERSION);
    let after_first = snapshot(&client).await;

    assert_eq!(first.functions.len(), FUNCTIONS.len(), "every function file applied on a fresh database");
    let second = migrate(&mut client).await.unwrap();
    assert!(second.applied.is_empty(), "second run applied {:?}", second.applied);
    assert!(second.functions.is_empty(), "second run re-applied {:?}", second.functions);
    assert_eq!(second.version, LATEST_VERSION);
    assert_eq!(snapshot(&client).await, after_first);
    assert_eq!(recorded_versions(&client).await, all_versions());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_from_eight_processes_at_once_leaves_one_correct_schema() {
    let db = TestDb::empty().await;
    let gateway = workspace_bin("fencing-gateway").unwrap();
    let children: Vec<_> = (0..8)
        .map(|_| {
            tokio::process::Command::new(&gateway)
                .args(["migrate", "--database-url", &db.url()])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .unwrap()
        })
        .collect();
    let mut applied: Vec<i32> = Vec::new();
    for child in children {
        let output = child.wait_with_output().await.unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "a concurrent migrate failed: {}\nstdout: {stdout}\nstderr: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        if let Some(list) = stdout.strip_prefix("applied migrations [").and_then(|rest| rest.split(']').next()) {
            applied.extend(list.split(", ").map(|v| v.parse::<i32>().unwrap()));
        } else {
            // Nothing to do, and it says so: no function file applied again (issue 31).
            assert!(
                stdout.contains("no migration to apply") && stdout.contains("every function file as recorded"),
                "unexpected output: {stdout}"
            );
        }
    }
    applied.sort_unstable();
    assert_eq!(applied, all_versions(), "each migration is applied by exactly one process");

    let client = db.connect().await;
    assert_eq!(recorded_versions(&client).await, all_versions());
    assert_eq!(snapshot(&client).await, reference_snapshot().await);
    assert_eq!(check_schema_version(&client).await.unwrap(), LATEST_VERSION);
}

#[tokio::test]
async fn a_schema_newer_than_the_binary_is_refused_and_left_alone() {
    let db = TestDb::new().await;
    let mut client = db.connect().await;
    let newer = LATEST_VERSION + 1;
    client
        .execute("INSERT INTO fencing.schema_migrations (version, name) VALUES ($1, 'from_the_future')", &[&newer])
        .await
        .unwrap();
    let before = snapshot(&client).await;

    match migrate(&mut client).await {
        Err(Error::SchemaTooNew { found, known }) => {
            assert_eq!((found, known), (newer, LATEST_VERSION));
        }
        other => panic!("expected SchemaTooNew, got {other:?}"),
    }
    assert!(matches!(check_schema_version(&client).await, Err(Error::SchemaTooNew { .. })));
    assert_eq!(snapshot(&client).await, before);

    let output = tokio::process::Command::new(workspace_bin("fencing-gateway").unwrap())
        .args(["migrate", "--database-url", &db.url()])
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "stderr: {stderr}");
    assert!(stderr.contains(&format!("at version {newer}, newer than version {LATEST_VERSION}")), "stderr: {stderr}");
    assert_eq!(snapshot(&client).await, before);
}

#[tokio::test]
async fn a_database_without_the_schema_is_reported_outdated() {
    let db = TestDb::empty().await;
    let client = db.connect().await;
    match check_schema_version(&client).await {
        Err(Error::SchemaOutdated { found: None, expected }) => assert_eq!(expected, LATEST_VERSION),
        other => panic!("expected SchemaOutdated, got {other:?}"),
    }
}

#[tokio::test]
async fn files_applied_by_hand_with_psql_are_the_same_schema_and_known_to_the_runner() {
    let db = TestDb::empty().await;
    // As the README says: the versioned files in order, then the function files in name order.
    let sql_files = |folder: &str| {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../schema").join(folder);
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .filter(|path| path.extension().is_some_and(|ext| ext == "sql"))
            .collect();
        files.sort();
        files
    };
    let versioned = sql_files("migrations");
    let functions = sql_files("functions");
    assert_eq!(versioned.len(), MIGRATIONS.len(), "every file is embedded and every embedded file is a file");
    assert_eq!(functions.len(), FUNCTIONS.len(), "every function file is embedded");
    for file in versioned.iter().chain(&functions) {
        let output = tokio::process::Command::new(db.cluster().bin("psql"))
            .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "--single-transaction", "-d", &db.url(), "-f"])
            .arg(file)
            .output()
            .await
            .unwrap();
        assert!(
            output.status.success(),
            "psql -f {} failed: {}",
            file.display(),
            String::from_utf8_lossy(&output.stderr)
        );
        // A fresh install says nothing that looks like an error (a NOTICE that some function
        // "does not exist, skipping" did, at the first `serve`).
        let said = String::from_utf8_lossy(&output.stderr);
        assert!(!said.contains("NOTICE") && !said.contains("WARNING"), "psql -f {}: {said}", file.display());
    }
    let mut client = db.connect().await;
    let report = migrate(&mut client).await.unwrap();
    assert!(report.applied.is_empty(), "the runner re-applied {:?}", report.applied);
    assert_eq!(snapshot(&client).await, reference_snapshot().await);
}

/// Version 10 names settles. A database at version 9 with a settle and a drain pending gets names
/// for both, so the next decisions of upgraded gateways can mark them, and the four-argument
/// marks, which named a settle only by its term, binding and length, are gone.
#[tokio::test]
async fn version_10_names_the_settles_pending_at_version_9_and_drops_the_unnamed_marks() {
    let db = TestDb::empty().await;
    let client = db.connect().await;
    for migration in MIGRATIONS.iter().filter(|m| m.version <= 9) {
        client.batch_execute(migration.sql).await.unwrap_or_else(|error| panic!("{}: {error}", migration.name));
    }
    // Version 9's function files made the four-argument marks (stand-ins here).
    for name in ["mark_settled", "mark_drained"] {
        let stand_in = format!(
            "CREATE FUNCTION fencing.{name}(resource text, term bigint, lease_key text, settle_ms bigint)
             RETURNS bigint LANGUAGE sql AS 'SELECT NULL::bigint'"
        );
        client.batch_execute(&stand_in).await.unwrap();
    }
    let unnamed = "SELECT to_regprocedure('fencing.mark_settled(text, bigint, text, bigint)') IS NOT NULL
                       OR to_regprocedure('fencing.mark_drained(text, bigint, text, bigint)') IS NOT NULL";
    client
        .batch_execute(
            "INSERT INTO fencing.fences (resource, max_term, updated_at, settle_ms) VALUES ('settling', 2, now(), 500);
             INSERT INTO fencing.fences (resource, max_term, updated_at, drain_ms) VALUES ('draining', 3, now(), 700);
             INSERT INTO fencing.fences (resource, max_term, updated_at) VALUES ('quiet', 1, now());",
        )
        .await
        .unwrap();
    let ten = MIGRATIONS.iter().find(|m| m.version == 10).expect("migration 10");
    client.batch_execute(ten.sql).await.unwrap();
    let rows = client.query("SELECT resource, settle_id FROM fencing.fences ORDER BY resource", &[]).await.unwrap();
    let named: Vec<(String, bool)> =
        rows.iter().map(|row| (row.get(0), row.get::<_, Option<i64>>(1).is_some())).collect();
    assert_eq!(
        named,
        [("draining".to_owned(), true), ("quiet".to_owned(), false), ("settling".to_owned(), true)],
        "every pending settle or drain is named"
    );
    let gone: bool = client.query_one(unnamed, &[]).await.unwrap().get(0);
    assert!(!gone, "the unnamed marks are dropped");
    // The rest of the schema, as migrate leaves it: a decision names the pending settle.
    let mut client = client;
    migrate(&mut client).await.unwrap();
    let gate =
        fencing_schema::store::gate(&client, "settling", 2, std::time::Duration::from_secs(1), None).await.unwrap();
    assert_eq!(gate.wait, std::time::Duration::from_millis(500));
    assert!(gate.settle_id.is_some());
}

/// Version 12 adds a column to `fencing.read_lease`, which version 11 made: a database at 11
/// migrates (the function is dropped and made again), and reads leases with their lock-delay.
#[tokio::test]
async fn version_12_migrates_a_database_at_11_whose_read_lease_has_no_lock_delay() {
    let db = TestDb::empty().await;
    let mut client = db.connect().await;
    for migration in MIGRATIONS.iter().filter(|m| m.version <= 11) {
        client.batch_execute(migration.sql).await.unwrap_or_else(|error| panic!("{}: {error}", migration.name));
    }
    // Version 11's read_lease (its function file then), without the lock-delay column.
    client
        .batch_execute(
            "CREATE FUNCTION fencing.read_lease(lease_key text)
             RETURNS TABLE (key text, owner text, term bigint, acquired_at timestamptz, renewed_at timestamptz,
                            expires_at timestamptz, remaining_ms bigint, value text)
             LANGUAGE sql AS $$ SELECT NULL::text, NULL::text, NULL::bigint, NULL::timestamptz, NULL::timestamptz,
                                       NULL::timestamptz, NULL::bigint, NULL::text WHERE false $$",
        )
        .await
        .unwrap();
    let report = migrate(&mut client).await.unwrap();
    assert_eq!(report.version, LATEST_VERSION);
    fencing_schema::store::acquire(&client, "k", "a", std::time::Duration::from_secs(60)).await.unwrap();
    let lease = fencing_schema::store::get_lease(&client, "k").await.unwrap().unwrap();
    assert_eq!((lease.term, lease.lock_delay), (1, std::time::Duration::ZERO));
}
