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
