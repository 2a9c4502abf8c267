//! Graceful handover (schema version 14): a request reaches the holder through its renewal and
//! moves the lease's revision; its release is recorded as handed over and reserves the next term
//! for the named successor (an elector's `<owner>#<incarnation>` included) for least(ttl, 10 s);
//! a forced handover ends only the term it names; every request is audited.

use std::time::Duration;

use fencing_schema::store;
use fencing_tests::pg::TestDb;

const KEY: &str = "ledger";

#[tokio::test]
async fn a_request_reaches_the_holder_and_its_release_reserves_the_next_term_for_the_successor() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    assert_eq!(store::request_resign(&client, KEY, ("op", "deploy"), None, None).await.unwrap(), None, "no lease");
    let a = store::acquire(&client, KEY, "a#1", Duration::from_secs(2)).await.unwrap();
    let term = a.term.unwrap();
    assert!(!store::renew(&client, KEY, "a#1", Duration::from_secs(2)).await.unwrap().resign_requested);
    let before = store::observe_lease(&client, KEY).await.unwrap().unwrap();
    assert!(!before.resign_requested && before.successor.is_none());

    assert_eq!(store::request_resign(&client, KEY, ("op", "deploy"), Some("c"), None).await.unwrap(), Some(term));
    let asked = store::observe_lease(&client, KEY).await.unwrap().unwrap();
    assert!(asked.resign_requested && asked.successor.as_deref() == Some("c"), "{asked:?}");
    assert!(asked.revision > before.revision, "a request is a change: the holder's watch wakes");
    let renewed = store::renew(&client, KEY, "a#1", Duration::from_secs(2)).await.unwrap();
    assert!(renewed.ok && renewed.resign_requested, "the holder hears it from its renewal: {renewed:?}");

    assert!(store::release(&client, KEY, "a#1").await.unwrap());
    let reason = fencing_tests::end_reason(&client, KEY, term).await.unwrap_or_default();
    assert_eq!(reason, "handed_over");
    let released = store::observe_lease(&client, KEY).await.unwrap().unwrap();
    assert!(!released.resign_requested && released.successor.as_deref() == Some("c"), "{released:?}");
    assert!(!released.reserved.is_zero() && released.reserved <= Duration::from_secs(2), "{released:?}");
    // Anyone else is refused as if the successor held it; the old holder too.
    for other in ["b#7", "a#1", "cc", "c-other#1"] {
        let refused = store::acquire(&client, KEY, other, Duration::from_secs(2)).await.unwrap();
        assert!(!refused.ok && refused.holder.as_deref() == Some("c"), "{other}: {refused:?}");
    }
    // An incarnation of the successor takes the next term; the reservation is gone with it.
    let c = store::acquire(&client, KEY, "c#9", Duration::from_secs(2)).await.unwrap();
    assert_eq!((c.ok, c.term), (true, Some(term + 1)));
    let led = store::observe_lease(&client, KEY).await.unwrap().unwrap();
    assert!(!led.resign_requested && led.successor.is_none() && led.reserved.is_zero(), "{led:?}");
    assert!(!store::renew(&client, KEY, "c#9", Duration::from_secs(2)).await.unwrap().resign_requested);
    let audited: i64 = client
        .query_one("SELECT count(*) FROM fencing.admin_audit WHERE action = 'request_resign' AND target = $1", &[&KEY])
        .await
        .unwrap()
        .get(0);
    assert_eq!(audited, 1, "a request of a lease nobody holds changes and records nothing");
}

#[tokio::test]
async fn a_reservation_ends_with_its_window_and_a_request_without_successor_reserves_nothing() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    store::acquire(&client, KEY, "a", Duration::from_millis(300)).await.unwrap();
    store::request_resign(&client, KEY, ("op", "deploy"), Some("ghost"), None).await.unwrap();
    assert!(store::release(&client, KEY, "a").await.unwrap());
    assert!(!store::acquire(&client, KEY, "b", Duration::from_secs(2)).await.unwrap().ok, "reserved for ghost");
    // The window is the last period's ttl (300 ms): then anyone may lead.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let b = store::acquire(&client, KEY, "b", Duration::from_secs(2)).await.unwrap();
    assert!(b.ok, "{b:?}");
    store::request_resign(&client, KEY, ("op", "deploy"), None, None).await.unwrap();
    assert!(store::release(&client, KEY, "b").await.unwrap());
    assert!(
        store::acquire(&client, KEY, "d", Duration::from_secs(2)).await.unwrap().ok,
        "no successor: no reservation"
    );
}

#[tokio::test]
async fn a_forced_handover_ends_only_the_term_it_names_and_the_successor_still_comes_first() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    let term = store::acquire(&client, KEY, "a", Duration::from_secs(30)).await.unwrap().term.unwrap();
    store::request_resign(&client, KEY, ("op", "deploy"), Some("c"), None).await.unwrap();
    assert!(!store::force_handover(&client, KEY, term + 1, "op", "wrong term").await.unwrap());
    assert!(store::get_lease(&client, KEY).await.unwrap().unwrap().remaining > Duration::ZERO, "a held");
    assert!(store::force_handover(&client, KEY, term, "op", "did not step down").await.unwrap());
    let ended = store::observe_lease(&client, KEY).await.unwrap().unwrap();
    assert!(ended.lease.remaining.is_zero() && ended.successor.as_deref() == Some("c"), "{ended:?}");
    let reason = fencing_tests::end_reason(&client, KEY, term).await.unwrap_or_default();
    assert_eq!(reason, "force_released");
    assert!(!store::acquire(&client, KEY, "b", Duration::from_secs(2)).await.unwrap().ok, "c comes first");
    let c = store::acquire(&client, KEY, "c", Duration::from_secs(2)).await.unwrap();
    assert_eq!(c.term, Some(term + 1));
    // A forced handover of the old term now ends nothing: never the successor's period.
    assert!(!store::force_handover(&client, KEY, term, "op", "late").await.unwrap());
    assert!(store::renew(&client, KEY, "c", Duration::from_secs(2)).await.unwrap().ok);
    let actions = fencing_tests::audit_actions(&client, KEY).await;
    assert_eq!(actions, ["request_resign", "force_release"]);
}

/// A handover is a release: the key's lock-delay does not hold its successor back; an owner
/// matches a successor only as itself or one incarnation of it (`<successor>#<one part>`); with
/// a holder prefix, only such a holder is asked.
#[tokio::test]
async fn a_handover_skips_the_lock_delay_and_matches_successors_and_holders_strictly() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    store::set_lock_delay(&client, Some(KEY), Some(Duration::from_secs(30)), "op", "legacy").await.unwrap();
    store::acquire(&client, KEY, "svc#blue#1", Duration::from_secs(5)).await.unwrap();
    assert_eq!(
        store::request_resign(&client, KEY, ("op", "deploy"), Some("svc"), Some("other/")).await.unwrap(),
        None,
        "a holder outside the prefix is not asked"
    );
    assert!(!store::renew(&client, KEY, "svc#blue#1", Duration::from_secs(5)).await.unwrap().resign_requested);
    assert!(
        store::request_resign(&client, KEY, ("op", "deploy"), Some("svc#blue"), Some("svc#")).await.unwrap().is_some()
    );
    assert!(store::release(&client, KEY, "svc#blue#1").await.unwrap());
    for other in ["svc#blue#1#x", "svc", "svc#blue#", "svc#bluex#1"] {
        let refused = store::acquire(&client, KEY, other, Duration::from_secs(5)).await.unwrap();
        assert!(!refused.ok && refused.lock_delay.is_zero(), "{other}: {refused:?}");
    }
    let next = store::acquire(&client, KEY, "svc#blue#2", Duration::from_secs(5)).await.unwrap();
    assert!(next.ok, "no lock-delay after a handover: {next:?}");
}

/// The holder that asks for a new period of its own while a handover is requested of its term
/// (the Rust elector after a failed renewal) does not drop the request: its period ends there
/// as a handover, and the named successor comes first. An acquire that extends the holder's
/// lease answers the request too.
#[tokio::test]
async fn a_holder_cannot_drop_a_request_by_starting_a_new_period() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    let term = store::acquire(&client, KEY, "a#1", Duration::from_secs(5)).await.unwrap().term.unwrap();
    store::request_resign(&client, KEY, ("op", "deploy"), Some("b"), None).await.unwrap();
    let extended = store::acquire(&client, KEY, "a#1", Duration::from_secs(5)).await.unwrap();
    assert!(extended.ok && extended.resign_requested, "{extended:?}");
    let again = store::acquire_new_period(&client, KEY, "a#1", Duration::from_secs(5)).await.unwrap();
    assert!(!again.ok && again.holder.as_deref() == Some("b") && again.resign_requested, "{again:?}");
    let reason = fencing_tests::end_reason(&client, KEY, term).await.unwrap_or_default();
    assert_eq!(reason, "handed_over");
    assert!(!store::acquire_new_period(&client, KEY, "a#1", Duration::from_secs(5)).await.unwrap().ok);
    let b = store::acquire_new_period(&client, KEY, "b#7", Duration::from_secs(5)).await.unwrap();
    assert_eq!((b.ok, b.term), (true, Some(term + 1)));
}
