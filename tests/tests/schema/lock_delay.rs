//! Lock-delay (schema version 12): after a period that ended without a release (expiry, a forced
//! release), no new term until the key's delay has passed since the period's end, on the store's
//! clock; a released period has none; a key's own setting overrides the default; bad settings
//! change nothing and every setting is audited.

use std::time::{Duration, SystemTime};

use fencing_schema::store;
use fencing_tests::pg::TestDb;
use tokio_postgres::Client;

const DELAY: Duration = Duration::from_millis(800);
const TTL: Duration = Duration::from_millis(200);

/// Acquires `key` for `owner` until it succeeds (bounded): the store's instant of the new
/// period's start.
async fn acquire_when_free(client: &Client, key: &str, owner: &str) -> store::LeaseReply {
    let started = tokio::time::Instant::now();
    loop {
        let reply = store::acquire(client, key, owner, Duration::from_secs(60)).await.unwrap();
        if reply.ok {
            return reply;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "never acquired: {reply:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn gap(later: SystemTime, earlier: SystemTime) -> Duration {
    later.duration_since(earlier).unwrap_or_default()
}

#[tokio::test]
async fn no_new_term_until_the_lock_delay_after_an_expiry_or_a_forced_release_and_none_after_a_release() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    store::set_lock_delay(&client, None, Some(DELAY), "ops", "test").await.unwrap();

    // Expiry: a's lease runs out; b is refused, with what is left of the delay, until it passed.
    let a = store::acquire(&client, "k", "a", TTL).await.unwrap();
    tokio::time::sleep(TTL + Duration::from_millis(50)).await;
    let refused = store::acquire(&client, "k", "b", Duration::from_secs(60)).await.unwrap();
    assert!(!refused.ok);
    assert_eq!((refused.holder.as_deref(), refused.term), (None, a.term), "nobody holds it; the last term");
    assert!(refused.lock_delay > Duration::ZERO && refused.lock_delay <= DELAY, "{refused:?}");
    let row = store::get_lease(&client, "k").await.unwrap().unwrap();
    assert!(row.lock_delay > Duration::ZERO && row.remaining.is_zero(), "{row:?}");
    let ended = row.expires_at;
    acquire_when_free(&client, "k", "b").await;
    let row = store::get_lease(&client, "k").await.unwrap().unwrap();
    assert_eq!(row.term, a.term.unwrap() + 1);
    assert!(
        gap(row.acquired_at, ended) >= DELAY,
        "the new term began {:?} after the expiry",
        gap(row.acquired_at, ended)
    );
    assert_eq!(row.lock_delay, Duration::ZERO);

    // A release: the next term at once.
    assert!(store::release(&client, "k", "b").await.unwrap());
    let c = store::acquire(&client, "k", "c", Duration::from_secs(60)).await.unwrap();
    assert!(c.ok, "a released period has no lock-delay: {c:?}");

    // A forced release: the delay counts from the operator's action.
    store::force_release(&client, "k", "ops", "incident").await.unwrap();
    let forced_at = store::get_lease(&client, "k").await.unwrap().unwrap().expires_at;
    let refused = store::acquire(&client, "k", "d", Duration::from_secs(60)).await.unwrap();
    assert!(!refused.ok && refused.lock_delay > Duration::ZERO, "{refused:?}");
    // Even the last holder waits: its own writes may be the ones still on their way.
    let own = store::acquire(&client, "k", "c", Duration::from_secs(60)).await.unwrap();
    assert!(!own.ok && own.lock_delay > Duration::ZERO, "{own:?}");
    acquire_when_free(&client, "k", "d").await;
    let row = store::get_lease(&client, "k").await.unwrap().unwrap();
    assert!(gap(row.acquired_at, forced_at) >= DELAY);

    // A key's own setting overrides the default: 0 is none.
    store::set_lock_delay(&client, Some("fast"), Some(Duration::ZERO), "ops", "test").await.unwrap();
    store::acquire(&client, "fast", "a", TTL).await.unwrap();
    tokio::time::sleep(TTL + Duration::from_millis(50)).await;
    assert!(store::acquire(&client, "fast", "b", Duration::from_secs(60)).await.unwrap().ok);
    // Removed, the default applies again.
    store::set_lock_delay(&client, Some("fast"), None, "ops", "test").await.unwrap();
    store::acquire(&client, "fast", "b", TTL).await.unwrap();
    tokio::time::sleep(TTL + Duration::from_millis(50)).await;
    assert!(!store::acquire(&client, "fast", "a", Duration::from_secs(60)).await.unwrap().ok);
}

#[tokio::test]
async fn bad_lock_delay_settings_change_nothing_and_every_setting_is_audited() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    let settings = "SELECT (SELECT lock_delay_ms FROM fencing.lease_defaults),
                           (SELECT count(*) FROM fencing.lease_settings),
                           (SELECT count(*) FROM fencing.admin_audit WHERE action = 'set_lock_delay')";
    let read = |row: tokio_postgres::Row| (row.get::<_, i64>(0), row.get::<_, i64>(1), row.get::<_, i64>(2));
    assert_eq!(read(client.query_one(settings, &[]).await.unwrap()), (0, 0, 0), "no delay by default");
    for (key, delay) in [
        (None, None),
        (None, Some(Duration::from_secs(3601))),
        (Some("k"), Some(Duration::from_secs(7200))),
        (Some(""), Some(Duration::from_secs(1))),
    ] {
        let error = store::set_lock_delay(&client, key, delay, "ops", "test").await.unwrap_err();
        assert!(matches!(error, fencing_schema::Error::InvalidArgument { .. }), "{key:?} {delay:?}: {error}");
    }
    let negative = client
        .execute("SELECT fencing.set_lock_delay('k', interval '-1 second', 'ops', 'test')", &[])
        .await
        .unwrap_err();
    assert_eq!(fencing_tests::sqlstate(&negative), Some(fencing_schema::SQLSTATE_INVALID_ARGUMENT));
    assert_eq!(read(client.query_one(settings, &[]).await.unwrap()), (0, 0, 0), "nothing changed");
    store::set_lock_delay(&client, None, Some(Duration::from_secs(5)), "ops", "default").await.unwrap();
    store::set_lock_delay(&client, Some("k"), Some(Duration::from_secs(1)), "ops", "key").await.unwrap();
    assert_eq!(read(client.query_one(settings, &[]).await.unwrap()), (5000, 1, 2));
}
