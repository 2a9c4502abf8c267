//! Watch (schema version 13): every change of a lease or of a cluster's members takes a new
//! revision and notifies channel fencing_watch when it commits; a renewal and a heartbeat that
//! only extends are no change; an expiry, which writes nothing, is one; concurrent joins,
//! leaves and the noting of expiries never deadlock. A node's read of the members in its
//! heartbeat's transaction (schema version 15) follows the changes and never waits.

use std::time::Duration;

use fencing_schema::store;
use fencing_tests::pg::TestDb;
use futures::FutureExt;
use tokio_postgres::{AsyncMessage, NoTls};

async fn revision(client: &tokio_postgres::Client, key: &str) -> i64 {
    store::observe_lease(client, key).await.unwrap().map_or(0, |state| state.revision)
}

#[tokio::test]
async fn every_change_of_a_lease_takes_a_new_revision_and_a_renewal_none() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    assert_eq!(revision(&client, "k").await, 0, "a key never acquired");

    let mut seen = vec![];
    let a = store::acquire(&client, "k", "a", Duration::from_secs(60)).await.unwrap();
    seen.push(revision(&client, "k").await);
    assert!(store::renew(&client, "k", "a", Duration::from_secs(60)).await.unwrap().ok);
    assert!(store::acquire(&client, "k", "a", Duration::from_secs(60)).await.unwrap().ok);
    assert!(store::renew(&client, "k", "a", Duration::from_secs(30)).await.unwrap().ok);
    assert_eq!(
        revision(&client, "k").await,
        seen[0],
        "a renewal (a shorter one too), or the holder acquiring again, is no change"
    );
    assert!(store::set_lease_value(&client, "k", "a", a.term.unwrap(), r#"{"addr":"x"}"#).await.unwrap());
    seen.push(revision(&client, "k").await);
    assert!(store::set_lease_value(&client, "k", "a", a.term.unwrap(), r#"{"addr":"x"}"#).await.unwrap());
    assert_eq!(revision(&client, "k").await, seen[1], "the same value again is no change");
    assert!(store::release(&client, "k", "a").await.unwrap());
    seen.push(revision(&client, "k").await);
    assert!(store::acquire(&client, "k", "b", Duration::from_millis(300)).await.unwrap().ok);
    seen.push(revision(&client, "k").await);
    // The expiry writes nothing, yet the revision moves when it passes.
    tokio::time::sleep(Duration::from_millis(400)).await;
    seen.push(revision(&client, "k").await);
    assert!(store::acquire(&client, "k", "c", Duration::from_secs(60)).await.unwrap().ok);
    seen.push(revision(&client, "k").await);
    client.execute("SELECT fencing.force_release('k', 'op', 'test')", &[]).await.unwrap();
    seen.push(revision(&client, "k").await);
    for pair in seen.windows(2) {
        assert!(pair[1] > pair[0], "every change takes a later revision: {seen:?}");
    }
    // An ended lease is odd, a held one even: the expiry's revision is its row's, plus one.
    assert_eq!(seen.iter().map(|r| r % 2).collect::<Vec<_>>(), [0, 0, 1, 0, 1, 0, 1], "{seen:?}");
}

#[tokio::test]
async fn changes_notify_when_they_commit_and_never_when_rolled_back() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    let (listener, mut connection) = tokio_postgres::connect(&db.url(), NoTls).await.unwrap();
    let (sender, mut heard) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Ok(message)) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            if let AsyncMessage::Notification(notification) = message {
                let _ = sender.send((notification.channel().to_owned(), notification.payload().to_owned()));
            }
        }
    });
    listener.batch_execute("LISTEN fencing_watch").await.unwrap();
    let next = async |heard: &mut tokio::sync::mpsc::UnboundedReceiver<(String, String)>| {
        tokio::time::timeout(Duration::from_secs(5), heard.recv()).await.ok().flatten()
    };

    store::acquire(&client, "k", "a", Duration::from_secs(60)).await.unwrap();
    assert_eq!(next(&mut heard).await, Some(("fencing_watch".to_owned(), "lease:k".to_owned())));
    // A renewal is no change: nothing is sent (the heartbeat below is the next message).
    store::renew(&client, "k", "a", Duration::from_secs(60)).await.unwrap();
    let beat = ("c", "n1", "i1");
    assert!(store::heartbeat(&client, beat, "n1", Duration::from_secs(60), "{}").await.unwrap().ok);
    assert_eq!(next(&mut heard).await.map(|(_, payload)| payload).as_deref(), Some("nodes:c"));
    assert!(store::heartbeat(&client, beat, "n1", Duration::from_secs(60), "{}").await.unwrap().ok);
    // A change rolled back sends nothing; the leave after it is heard.
    let mut tx_client = db.connect().await;
    let tx = tx_client.transaction().await.unwrap();
    store::release(&tx, "k", "a").await.unwrap();
    tx.rollback().await.unwrap();
    assert!(store::leave(&client, "c", "n1", "i1").await.unwrap());
    assert_eq!(next(&mut heard).await.map(|(_, payload)| payload).as_deref(), Some("nodes:c"));
    assert_eq!(heard.recv().now_or_never(), None, "nothing else was sent");
}

#[tokio::test]
async fn members_take_a_revision_per_join_leave_change_and_noted_expiry() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    let rev = async || store::nodes_revision(&client, "c").await.unwrap();
    assert_eq!(rev().await, store::MembersRevision { revision: 0, next_expiry: None });
    let mut seen = vec![];
    assert!(store::heartbeat(&client, ("c", "n1", "i1"), "n1", Duration::from_secs(60), "{}").await.unwrap().ok);
    seen.push(rev().await.revision);
    assert!(store::heartbeat(&client, ("c", "n1", "i1"), "n1", Duration::from_secs(60), "{}").await.unwrap().ok);
    assert_eq!(rev().await.revision, seen[0], "a heartbeat that only extends is no change");
    assert!(
        store::heartbeat(&client, ("c", "n1", "i1"), "n1", Duration::from_secs(60), r#"{"v":2}"#).await.unwrap().ok
    );
    seen.push(rev().await.revision);
    assert!(store::heartbeat(&client, ("c", "n2", "i2"), "n2", Duration::from_millis(300), "{}").await.unwrap().ok);
    let joined = rev().await;
    seen.push(joined.revision);
    assert!(joined.next_expiry.is_some_and(|left| left <= Duration::from_millis(300)), "{joined:?}");
    // n2 runs out: noted as a change by the next read, once.
    tokio::time::sleep(Duration::from_millis(400)).await;
    seen.push(rev().await.revision);
    assert_eq!(rev().await.revision, seen[3], "an expiry is noted once");
    assert!(store::leave(&client, "c", "n1", "i1").await.unwrap());
    seen.push(rev().await.revision);
    // n2 comes back: a join.
    assert!(store::heartbeat(&client, ("c", "n2", "i3"), "n2", Duration::from_secs(60), "{}").await.unwrap().ok);
    seen.push(rev().await.revision);
    for pair in seen.windows(2) {
        assert!(pair[1] > pair[0], "every change takes a later revision: {seen:?}");
    }
    // Another cluster's changes are not this one's.
    assert!(store::heartbeat(&client, ("other", "n1", "i1"), "n1", Duration::from_secs(60), "{}").await.unwrap().ok);
    assert_eq!(rev().await.revision, *seen.last().unwrap());
}

/// Many nodes joining, leaving and running out at once, while readers note expiries: every
/// call completes (no deadlock between a heartbeat's row lock and the cluster's revision), and
/// the revision at the end is above every revision a reader saw.
#[tokio::test]
async fn concurrent_joins_leaves_and_noted_expiries_never_deadlock() {
    let db = TestDb::new().await;
    let mut tasks = tokio::task::JoinSet::new();
    for worker in 0..8 {
        let client = db.connect().await;
        tasks.spawn(async move {
            let mut seen = 0;
            for round in 0..40 {
                let node = format!("n{}", (worker * 7 + round) % 12);
                let incarnation = format!("i{worker}");
                let ttl = Duration::from_millis(if round % 3 == 0 { 50 } else { 5_000 });
                store::heartbeat(&client, ("c", node.as_str(), incarnation.as_str()), &node, ttl, "{}").await?;
                if round % 4 == 1 {
                    store::leave(&client, "c", &node, &incarnation).await?;
                }
                seen = seen.max(store::nodes_revision(&client, "c").await?.revision);
            }
            Ok::<_, fencing_schema::Error>(seen)
        });
    }
    let mut highest = 0;
    while let Some(done) = tasks.join_next().await {
        highest = highest.max(done.unwrap().unwrap());
    }
    let client = db.connect().await;
    let end = store::nodes_revision(&client, "c").await.unwrap().revision;
    assert!(end >= highest && highest > 0, "end {end}, highest seen {highest}");
}

fn ids(members: &[store::Member]) -> Vec<&str> {
    members.iter().map(|member| member.node_id.as_str()).collect()
}

/// `fencing.members_since` (schema version 15), a node's read after its heartbeat: the members
/// only when their revision moved, the same revision `fencing.nodes_revision` gives, and a node
/// that ran out marked gone by the read without moving the revision.
#[tokio::test]
async fn members_since_reads_the_members_only_when_they_changed_with_the_watchers_revision() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    let since = async |known: Option<i64>| store::members_since(&client, "c", known).await.unwrap();
    let watchers = async || store::nodes_revision(&client, "c").await.unwrap().revision;

    let empty = since(None).await;
    assert_eq!(empty, store::MembersSince { revision: Some(0), members: Some(vec![]) }, "a cluster never seen");
    assert!(store::heartbeat(&client, ("c", "n1", "i1"), "n1", Duration::from_secs(60), "{}").await.unwrap().ok);
    let first = since(None).await;
    assert_eq!(ids(first.members.as_deref().unwrap()), ["n1"]);
    assert_eq!(first.revision, Some(watchers().await));
    assert!(first.revision > Some(0));
    assert!(store::heartbeat(&client, ("c", "n1", "i1"), "n1", Duration::from_secs(60), "{}").await.unwrap().ok);
    assert_eq!(since(first.revision).await, store::MembersSince { revision: first.revision, members: None });

    assert!(store::heartbeat(&client, ("c", "n2", "i2"), "n2", Duration::from_millis(300), "{}").await.unwrap().ok);
    let joined = since(first.revision).await;
    assert_eq!(ids(joined.members.as_deref().unwrap()), ["n1", "n2"]);
    assert_eq!(joined.revision, Some(watchers().await));

    // n2 runs out: the watchers' revision moves at once; the read marks n2 gone and keeps it.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let ran_out = watchers().await;
    assert!(Some(ran_out) > joined.revision);
    let read = since(joined.revision).await;
    assert_eq!((read.revision, ids(read.members.as_deref().unwrap())), (Some(ran_out), vec!["n1"]));
    let gone: bool = client
        .query_one("SELECT gone FROM fencing.nodes WHERE cluster = 'c' AND node_id = 'n2'", &[])
        .await
        .unwrap()
        .get(0);
    assert!(gone, "the read marked the node that ran out");
    assert_eq!(watchers().await, ran_out, "marking is no change");
    assert_eq!(since(read.revision).await.members, None);

    // n2 comes back: a change for both readers.
    assert!(store::heartbeat(&client, ("c", "n2", "i3"), "n2", Duration::from_secs(60), "{}").await.unwrap().ok);
    let back = since(read.revision).await;
    assert_eq!(ids(back.members.as_deref().unwrap()), ["n1", "n2"]);
    assert_eq!(back.revision, Some(watchers().await));
    assert!(back.revision > read.revision);
    let bad = store::members_since(&client, "", None).await.unwrap_err();
    assert!(matches!(bad, fencing_schema::Error::InvalidArgument { .. }), "{bad:?}");
}

/// A node that ran out is locked by a transaction that has not committed: the read does not
/// wait for it. With its row locked by a heartbeat that is still deciding (not yet holding the
/// cluster's row), the read skips it, says it does not know the revision and returns the members
/// live at its instant. With the cluster's row held too (the heartbeat brought the node back), it
/// reads nothing now. Once the heartbeat committed, the node is in the next read. (Waiting here
/// would hold a node's heartbeat transaction behind another's.)
#[tokio::test]
async fn members_since_never_waits_for_a_committing_heartbeat_and_then_does_not_know_the_revision() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    client.batch_execute("SET lock_timeout = '5s'").await.unwrap();
    let since = async |known: Option<i64>| {
        tokio::time::timeout(Duration::from_secs(2), store::members_since(&client, "c", known))
            .await
            .expect("the read waited for a lock")
            .unwrap()
    };
    assert!(store::heartbeat(&client, ("c", "n1", "i1"), "n1", Duration::from_secs(60), "{}").await.unwrap().ok);
    for node in ["n2", "n3"] {
        assert!(store::heartbeat(&client, ("c", node, node), node, Duration::from_millis(200), "{}").await.unwrap().ok);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;

    // n2's row locked, as a heartbeat locks it before it decides: n3 is marked, n2 skipped.
    let mut holder = db.connect().await;
    let deciding = holder.transaction().await.unwrap();
    deciding.execute("SELECT 1 FROM fencing.nodes WHERE node_id = 'n2' FOR UPDATE", &[]).await.unwrap();
    let read = since(None).await;
    assert_eq!((read.revision, ids(read.members.as_deref().unwrap())), (None, vec!["n1"]));
    let marked: bool =
        client.query_one("SELECT gone FROM fencing.nodes WHERE node_id = 'n3'", &[]).await.unwrap().get(0);
    assert!(marked, "n3 was not marked");
    // The heartbeat brings n2 back (and now holds the cluster's row): nothing is read now.
    assert!(store::heartbeat(&deciding, ("c", "n2", "n2"), "n2", Duration::from_secs(60), "{}").await.unwrap().ok);
    assert_eq!(since(None).await, store::MembersSince { revision: None, members: None });
    deciding.commit().await.unwrap();
    let after = since(None).await;
    assert_eq!(ids(after.members.as_deref().unwrap()), ["n1", "n2"]);
    assert_eq!(after.revision, Some(store::nodes_revision(&client, "c").await.unwrap().revision));
}

/// Nodes that ran out come back at once, each reading the members in its heartbeat's
/// transaction (as `fencing_election::membership` does), while others leave and run out: no
/// two transactions wait for each other (a deadlock is an error here, so is a lock wait past
/// the lock timeout). Then every worker reads once more: whatever it keeps (its last list, when
/// the read says nothing changed) is the live members, and its revision the watchers'.
#[tokio::test]
async fn heartbeats_that_read_the_members_in_their_transaction_never_deadlock() {
    let db = TestDb::new().await;
    let mut tasks = tokio::task::JoinSet::new();
    let workers = 8;
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(workers + 1));
    for worker in 0..workers {
        let mut client = db.connect().await;
        let barrier = std::sync::Arc::clone(&barrier);
        tasks.spawn(async move {
            client.batch_execute("SET lock_timeout = '3s'").await?;
            let failed = |error: fencing_schema::Error| anyhow::anyhow!("{error:?}");
            let mut known = None;
            let mut kept: Vec<String> = Vec::new();
            for round in 0..40 {
                let node = format!("n{}", (worker * 5 + round) % 10);
                let incarnation = format!("i{worker}-{round}");
                let ttl = Duration::from_millis(if round % 3 == 0 { 30 } else { 3_000 });
                let transaction = client.transaction().await?;
                store::heartbeat(&transaction, ("c", node.as_str(), incarnation.as_str()), &node, ttl, "{}")
                    .await
                    .map_err(failed)?;
                let read = store::members_since(&transaction, "c", known).await.map_err(failed)?;
                transaction.commit().await?;
                if let Some(members) = read.members {
                    known = read.revision;
                    kept = members.iter().map(|member| member.node_id.clone()).collect();
                }
                if round % 4 == 1 {
                    store::leave(&client, "c", &node, &incarnation).await.map_err(failed)?;
                }
                if round % 5 == 2 {
                    tokio::time::sleep(Duration::from_millis(40)).await;
                }
            }
            barrier.wait().await;
            // All written; the short-lived nodes have run out.
            tokio::time::sleep(Duration::from_millis(100)).await;
            // A read that could not take the cluster's row at once (another worker marks) reads
            // nothing: ask again.
            for _ in 0..100 {
                let read = store::members_since(&client, "c", known).await.map_err(failed)?;
                if let Some(members) = read.members {
                    known = read.revision;
                    kept = members.iter().map(|member| member.node_id.clone()).collect();
                }
                if read.revision.is_some() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            barrier.wait().await;
            Ok::<_, anyhow::Error>((known, kept))
        });
    }
    barrier.wait().await;
    barrier.wait().await;
    let client = db.connect().await;
    let live: Vec<String> =
        store::members(&client, "c").await.unwrap().into_iter().map(|member| member.node_id).collect();
    let revision = store::nodes_revision(&client, "c").await.unwrap().revision;
    while let Some(done) = tasks.join_next().await {
        let (known, kept) = done.unwrap().unwrap();
        assert_eq!(known, Some(revision), "a worker's revision");
        assert_eq!(kept, live, "a worker keeps other members than the live ones");
    }
}

/// A watcher's read of the members (`fencing.observe_members`, schema version 15): the revision
/// and the members in one call, the same revision `fencing.nodes_revision` gives. A heartbeat of
/// a node that ran out and is committing is waited for: once it commits, the node is listed,
/// live again, under a revision that moved. A node that left is not listed.
#[tokio::test]
async fn observe_members_lists_the_nodes_of_its_revisions_instant_and_waits_for_a_committing_return() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    let (empty, none) = store::observe_members(&client, "c").await.unwrap();
    assert_eq!((empty.revision, empty.next_expiry, none.len()), (0, None, 0));
    assert!(store::heartbeat(&client, ("c", "n1", "i1"), "n1", Duration::from_secs(60), "{}").await.unwrap().ok);
    assert!(store::heartbeat(&client, ("c", "n2", "i2"), "n2", Duration::from_millis(200), "{}").await.unwrap().ok);
    let (both, members) = store::observe_members(&client, "c").await.unwrap();
    assert_eq!(ids(&members), ["n1", "n2"]);
    assert_eq!(both.revision, store::nodes_revision(&client, "c").await.unwrap().revision);
    assert!(both.next_expiry.is_some_and(|left| left <= Duration::from_millis(200)), "{both:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;

    // n2 comes back in a transaction that commits only after the read began.
    let mut holder = db.connect().await;
    let returning = holder.transaction().await.unwrap();
    assert!(store::heartbeat(&returning, ("c", "n2", "i2"), "n2", Duration::from_secs(60), "{}").await.unwrap().ok);
    let reader = db.connect().await;
    let read = tokio::spawn(async move { store::observe_members(&reader, "c").await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!read.is_finished(), "the read did not wait for the committing heartbeat");
    returning.commit().await.unwrap();
    let (back, members) = read.await.unwrap().unwrap();
    assert_eq!(ids(&members), ["n1", "n2"]);
    assert!(back.revision > both.revision, "{back:?} {both:?}");
    assert_eq!(back.revision, store::nodes_revision(&client, "c").await.unwrap().revision);

    assert!(store::leave(&client, "c", "n1", "i1").await.unwrap());
    let (left, members) = store::observe_members(&client, "c").await.unwrap();
    assert_eq!(ids(&members), ["n2"]);
    assert!(left.revision > back.revision);
}
