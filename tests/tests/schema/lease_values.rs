//! A leader's value (schema version 11): only the holder sets it, at its term, while it holds
//! the lease; a zombie's call, an expired holder's and an oversized value change nothing; a new
//! term shows no value until its holder sets one.

use std::time::Duration;

use fencing_schema::store;
use fencing_tests::pg::TestDb;

const VALUE: &str = "SELECT fencing.lease_value(l)::text FROM fencing.leases l WHERE key = 'leader'";

#[tokio::test]
async fn only_the_holder_sets_the_value_at_its_term_and_a_new_term_starts_without_one() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    let a = store::acquire(&client, "leader", "a", Duration::from_millis(300)).await.unwrap();
    let term_a = a.term.unwrap();
    assert!(store::set_lease_value(&client, "leader", "a", term_a, r#"{"addr":"10.0.0.1:7000"}"#).await.unwrap());
    assert_eq!(value(&client).await.as_deref(), Some(r#"{"addr": "10.0.0.1:7000"}"#));
    let row = store::get_lease(&client, "leader").await.unwrap().unwrap();
    assert_eq!(row.value.as_deref(), Some(r#"{"addr": "10.0.0.1:7000"}"#));

    // Another owner, or the holder naming another term, changes nothing.
    assert!(!store::set_lease_value(&client, "leader", "b", term_a, r#""b""#).await.unwrap());
    assert!(!store::set_lease_value(&client, "leader", "a", term_a + 1, r#""a-next""#).await.unwrap());
    // Too large: refused with the invalid-argument SQLSTATE, nothing changed.
    let big = format!("\"{}\"", "x".repeat(4095));
    let error = store::set_lease_value(&client, "leader", "a", term_a, &big).await.unwrap_err();
    assert!(error.to_string().contains("at most 4096 bytes"), "{error}");
    assert_eq!(value(&client).await.as_deref(), Some(r#"{"addr": "10.0.0.1:7000"}"#));

    // a's lease expires; b takes over: the new term shows no value, not a's.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(
        !store::set_lease_value(&client, "leader", "a", term_a, r#""late""#).await.unwrap(),
        "an expired holder sets nothing"
    );
    let b = store::acquire(&client, "leader", "b", Duration::from_secs(60)).await.unwrap();
    let term_b = b.term.unwrap();
    assert!(term_b > term_a);
    assert_eq!(value(&client).await, None, "a new term starts with no value");
    assert!(store::set_lease_value(&client, "leader", "b", term_b, r#"{"addr":"10.0.0.2:7000"}"#).await.unwrap());
    // The zombie (a, with its old term) cannot overwrite the new leader's value.
    assert!(!store::set_lease_value(&client, "leader", "a", term_a, r#"{"addr":"zombie"}"#).await.unwrap());
    assert_eq!(value(&client).await.as_deref(), Some(r#"{"addr": "10.0.0.2:7000"}"#));
    // Renewals keep it; JSON null clears it.
    assert!(store::renew(&client, "leader", "b", Duration::from_secs(60)).await.unwrap().ok);
    assert_eq!(value(&client).await.as_deref(), Some(r#"{"addr": "10.0.0.2:7000"}"#));
    assert!(store::set_lease_value(&client, "leader", "b", term_b, "null").await.unwrap());
    assert_eq!(value(&client).await, None);
    // Not JSON: an error, nothing changed.
    assert!(store::set_lease_value(&client, "leader", "b", term_b, "{not json").await.is_err());
    assert_eq!(value(&client).await, None);
}

async fn value(client: &tokio_postgres::Client) -> Option<String> {
    client.query_one(VALUE, &[]).await.unwrap().get(0)
}

/// A role granted only what the README's privileges section grants for values (EXECUTE on
/// `fencing.set_lease_value` and `fencing.read_lease`, no privilege on any table) sets and reads
/// a value, and reads nothing else.
#[tokio::test]
async fn a_role_granted_the_documented_functions_sets_and_reads_a_value_without_table_privileges() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    let role = format!("valuer_{}", db.name);
    let term = store::acquire(&client, "leader", "a", Duration::from_secs(60)).await.unwrap().term.unwrap();
    client
        .batch_execute(&format!(
            "DROP ROLE IF EXISTS {role}; CREATE ROLE {role} NOLOGIN; GRANT USAGE ON SCHEMA fencing TO {role};
             GRANT EXECUTE ON FUNCTION fencing.set_lease_value(text, text, bigint, jsonb), fencing.read_lease(text) TO {role};
             SET ROLE {role};"
        ))
        .await
        .unwrap();
    assert!(store::set_lease_value(&client, "leader", "a", term, r#"{"addr":"a:1"}"#).await.unwrap());
    let read = store::get_lease(&client, "leader").await.unwrap().unwrap();
    assert_eq!((read.term, read.value.as_deref()), (term, Some(r#"{"addr": "a:1"}"#)));
    assert!(client.query("SELECT * FROM fencing.leases", &[]).await.is_err(), "no privilege on the table");
    client.batch_execute(&format!("RESET ROLE; DROP OWNED BY {role}; DROP ROLE {role};")).await.unwrap();
}
