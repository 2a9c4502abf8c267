//! S2, S3 across a crash: a raised fence that was answered survives a crash of Postgres, even
//! when the database commits asynchronously.

use std::time::Duration;

use fencing_schema::store::{self, Outcome};
use fencing_schema::{Error, migrate};
use fencing_tests::pg::{Durability, PgCluster, connect};

const FORWARD: Duration = Duration::from_secs(2);

/// A cluster whose database commits asynchronously, and whose WAL writer flushes rarely, so an
/// asynchronous commit is lost in a crash unless something forced it to disk.
pub(crate) async fn asynchronous_cluster() -> (PgCluster, String) {
    let cluster =
        PgCluster::start_with_settings(Durability::Off, "synchronous_commit = off\nwal_writer_delay = 10s\n").unwrap();
    let admin = connect(&cluster.url("postgres")).await;
    admin.batch_execute("CREATE DATABASE durable").await.unwrap();
    let url = cluster.url("durable");
    let mut client = connect(&url).await;
    migrate(&mut client).await.unwrap();
    // A checkpoint, so the schema itself is on disk whatever happens next.
    client.batch_execute("CHECKPOINT").await.unwrap();
    (cluster, url)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_a_fence_raised_under_asynchronous_commit_survives_a_crash_of_postgres() {
    let (cluster, url) = asynchronous_cluster().await;
    let client = connect(&url).await;
    let setting: String = client.query_one("SHOW synchronous_commit", &[]).await.unwrap().get(0);
    assert_eq!(setting, "off", "the database commits asynchronously");

    // Raised through the SQL surface and through the gateway's function, then a crash at once.
    assert_eq!(store::admit(&client, "ledger", 5).await.unwrap(), 5);
    let gate = store::gate(&client, "orders", 7, FORWARD, None).await.unwrap();
    assert!(gate.is_admitted());
    cluster.crash().unwrap();
    cluster.start_server().unwrap();

    let client = connect(&url).await;
    let ledger = store::get_fence(&client, "ledger").await.unwrap();
    assert_eq!(ledger.map(|f| f.max_term), Some(5), "the answered raise of ledger to 5 was lost in the crash");
    let orders = store::get_fence(&client, "orders").await.unwrap();
    assert_eq!(orders.map(|f| f.max_term), Some(7), "the answered raise of orders to 7 was lost in the crash");
    assert!(matches!(store::admit(&client, "ledger", 4).await, Err(Error::Refused { .. })));
    assert_eq!(store::gate(&client, "orders", 6, FORWARD, None).await.unwrap().outcome, Outcome::Stale);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s1_s2_a_grant_and_a_renewal_under_asynchronous_commit_survive_a_crash_of_postgres() {
    let (cluster, url) = asynchronous_cluster().await;
    let client = connect(&url).await;
    let ttl = Duration::from_secs(60);
    let granted = store::acquire(&client, "k", "a", ttl).await.unwrap();
    assert_eq!(granted.term, Some(1));
    cluster.crash().unwrap();
    cluster.start_server().unwrap();
    let client = connect(&url).await;
    let other = store::acquire(&client, "k", "b", ttl).await.unwrap();
    assert!(!other.ok, "after the crash a second owner was granted {:?} beside a's term 1", other.term);
    let lease = store::get_lease(&client, "k").await.unwrap().expect("the lease row survived the crash");
    assert_eq!((lease.owner.as_str(), lease.term), ("a", 1));

    // A renewal moves the store's expiry later; a crash must not move it back behind the
    // holder's deadline.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let renewed = store::renew(&client, "k", "a", Duration::from_secs(3000)).await.unwrap();
    assert!(renewed.ok);
    cluster.crash().unwrap();
    cluster.start_server().unwrap();
    let client = connect(&url).await;
    let lease = store::get_lease(&client, "k").await.unwrap().unwrap();
    assert!(lease.remaining > Duration::from_secs(2000), "the renewal was lost in the crash: {lease:?}");
}
