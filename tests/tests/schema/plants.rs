//! Every planted bug of the fault suite installs on a database migrated to the current schema,
//! and leaves the gateway's decision callable: a plant that fails to install would make its
//! fault-suite test fail for the wrong reason, or not test what it says.

use fencing_tests::faultsuite::{Plant, plant_sql};
use fencing_tests::pg::TestDb;

#[tokio::test]
async fn every_planted_bug_installs_and_the_gateway_can_still_decide() {
    for plant in Plant::ALL {
        let db = TestDb::new().await;
        let client = db.connect().await;
        let sql = plant_sql(plant).unwrap_or_else(|error| panic!("{}: {error}", plant.name()));
        client.batch_execute(&sql).await.unwrap_or_else(|error| panic!("{} does not install: {error}", plant.name()));
        for grant_ms in [0_i64, 400] {
            let rows = client
                .query(
                    fencing_schema::store::GATE_MANY_SQL,
                    &[
                        &vec!["/r/a"],
                        &vec![Some(1_i64)],
                        &vec![None::<&str>],
                        &vec![None::<&str>],
                        &vec![None::<&str>],
                        &1000_i64,
                        &grant_ms,
                    ],
                )
                .await
                .unwrap_or_else(|error| panic!("{}: the gateway's decision fails: {error}", plant.name()));
            assert_eq!(rows.len(), 1, "{}", plant.name());
        }
    }
}

/// A cluster whose database commits asynchronously and whose WAL writer writes rarely: an
/// asynchronous commit is lost in a crash unless something forced it out.
async fn asynchronous_database() -> (fencing_tests::pg::PgCluster, String) {
    use fencing_tests::pg::{Durability, PgCluster, connect};
    let cluster =
        PgCluster::start_with_settings(Durability::Off, "synchronous_commit = off\nwal_writer_delay = 10s\n").unwrap();
    let admin = connect(&cluster.url("postgres")).await;
    admin.batch_execute("CREATE DATABASE probes").await.unwrap();
    let url = cluster.url("probes");
    let mut client = connect(&url).await;
    fencing_schema::migrate(&mut client).await.unwrap();
    client.batch_execute("CHECKPOINT").await.unwrap();
    (cluster, url)
}

/// What each durability plant of the fault suite's probes leaves out is what makes its path
/// durable: with the plant, the path's answered action is lost in a crash of Postgres right after
/// it; without it, the action survives (so the probes catch the plant for the right reason).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_durability_plant_loses_its_answered_action_in_a_crash_and_only_it() {
    use fencing_tests::pg::connect;
    let paths: [(Plant, &str, &str); 5] = [
        (
            Plant::GateAsyncCommit,
            "SELECT fencing.admit('/p/r', 1)",
            "SELECT count(*) FROM fencing.gate_many(ARRAY['/p/r'], ARRAY[2::bigint], ARRAY[NULL::text], ARRAY[NULL::text], ARRAY[NULL::text], interval '1 second', interval '0')",
        ),
        (Plant::AdmitAsyncCommit, "SELECT fencing.admit('/p/r', 1)", "SELECT fencing.admit('/p/r', 2)"),
        (
            Plant::AdvanceAsyncCommit,
            "SELECT fencing.admit('/p/r', 1)",
            "SELECT fencing.advance_fence('/p/r', 2, 'test', 'probe')",
        ),
        (Plant::BindAsyncCommit, "SELECT 1", "SELECT fencing.bind('p-r', 'k')"),
        (
            Plant::RebindAsyncCommit,
            "SELECT fencing.bind('p-r', 'k')",
            "SELECT fencing.rebind('p-r', 'other', 'test', 'probe')",
        ),
    ];
    for (plant, setup, action) in paths {
        for planted in [false, true] {
            let (cluster, url) = asynchronous_database().await;
            let client = connect(&url).await;
            if planted {
                client.batch_execute(&plant_sql(plant).unwrap()).await.unwrap();
            }
            client.batch_execute("CHECKPOINT").await.unwrap();
            client.batch_execute(setup).await.unwrap();
            client.batch_execute(action).await.unwrap();
            cluster.crash_now().unwrap();
            cluster.start_server().unwrap();
            let client = connect(&url).await;
            let state = fencing_tests::snapshot(
                &client,
                "SELECT resource, max_term, lease_key FROM fencing.fences WHERE resource IN ('/p/r', 'p-r')",
            )
            .await;
            let kept = match plant {
                Plant::BindAsyncCommit => state.iter().any(|row| row.contains("\"lease_key\":\"k\"")),
                Plant::RebindAsyncCommit => state.iter().any(|row| row.contains("\"lease_key\":\"other\"")),
                _ => state.iter().any(|row| row.contains("\"max_term\":2")),
            };
            assert_eq!(kept, !planted, "{} (planted: {planted}): after the crash {state:?}", plant.name());
        }
    }
}
