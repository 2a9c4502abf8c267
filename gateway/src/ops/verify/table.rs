//! The story played in SQL against a table protected by `fencing.protect`: the leases through
//! `fencing.acquire` and `fencing.release`, each write one transaction that presents its term
//! with `set_config('fencing.token', term, true)` and runs the user's statement, as a writer
//! of that table would. A refusal is the guard's SQLSTATE `ZF409`.

use std::time::Duration;

use tokio_postgres::types::Type;
use tokio_postgres::{Client, SimpleQueryMessage, Statement};

use fencing_schema::store;

use super::{EXCHANGE_TIMEOUT, FenceSeen, LeaseSeen, Place, Table, Written};
use crate::Error;

/// A protected table and the session verify plays in.
pub(super) struct Sql<'a> {
    table: &'a Table,
    lease: &'a str,
    client: Client,
    /// The resource the table's guard fences.
    resource: String,
    /// The table as the catalog names it.
    name: String,
    role: String,
    /// Why the table is not fenced as `fencing.protect` leaves it, if it is not.
    unguarded: Option<String>,
    guard: String,
    write: Statement,
    cleanup: Option<Statement>,
}

/// One call, bounded by [`EXCHANGE_TIMEOUT`] on this side too (the session's
/// `statement_timeout` bounds it on the server's).
async fn bounded<T, E>(what: &str, call: impl Future<Output = Result<T, E>>) -> Result<Result<T, E>, Error> {
    tokio::time::timeout(EXCHANGE_TIMEOUT, call)
        .await
        .map_err(|_| Error::Setup(format!("{what}: no answer in {} s", EXCHANGE_TIMEOUT.as_secs())))
}

fn store_error(what: &str, error: &tokio_postgres::Error) -> Error {
    Error::Setup(format!("{what}: {}", crate::error_chain(error)))
}

impl<'a> Sql<'a> {
    /// Connects, reads the table's guard and prepares the user's statements (a statement that
    /// does not parse is a usage error, found before anything is written).
    pub(super) async fn connect(table: &'a Table, lease: &'a str) -> Result<Sql<'a>, Error> {
        let database = crate::security::database::Database::parse(&table.database_url).map_err(Error::Usage)?;
        let client = database.connect().await.map_err(Error::Connect)?;
        fencing_schema::check_schema_version(&client).await?;
        let seconds = EXCHANGE_TIMEOUT.as_secs();
        let session = format!(
            "SET statement_timeout = '{seconds}s'; SET lock_timeout = '{seconds}s';
             SET idle_in_transaction_session_timeout = '{seconds}s';
             SET default_transaction_isolation = 'read committed'"
        );
        bounded("set up the session", client.batch_execute(&session))
            .await?
            .map_err(|error| store_error("set up the session", &error))?;
        let row = bounded(
            "read the table's guard",
            client.query_opt(
                "SELECT c.oid::regclass::text AS name, current_user::text AS role,
                        g.tgenabled::text AS enabled, g.tgargs AS args,
                        t.tgenabled::text AS truncate_enabled
                   FROM pg_class c
                   LEFT JOIN pg_trigger g ON g.tgrelid = c.oid AND g.tgname = 'fencing_guard'
                   LEFT JOIN pg_trigger t ON t.tgrelid = c.oid AND t.tgname = 'fencing_guard_truncate'
                  WHERE c.oid = to_regclass($1)",
                &[&table.table],
            ),
        )
        .await?
        .map_err(|error| Error::Usage(format!("--table {:?}: {}", table.table, crate::error_chain(&error))))?;
        let Some(row) = row else {
            return Err(Error::Usage(format!("--table {:?}: no such table", table.table)));
        };
        let text = |column: &str| -> Result<Option<String>, Error> {
            row.try_get(column).map_err(|error| store_error("read the table's guard", &error))
        };
        let (name, role) = (text("name")?.unwrap_or_default(), text("role")?.unwrap_or_default());
        let (enabled, truncate_enabled) = (text("enabled")?, text("truncate_enabled")?);
        // The trigger's arguments, each ended by a NUL byte: the resource, then the term column.
        let args: Option<Vec<u8>> =
            row.try_get("args").map_err(|error| store_error("read the table's guard", &error))?;
        let args: Vec<String> = args
            .unwrap_or_default()
            .split(|byte| *byte == 0)
            .map(|arg| String::from_utf8_lossy(arg).into_owned())
            .collect();
        let guarded = args.first().filter(|resource| !resource.is_empty());
        let term_column = args.get(1).filter(|column| !column.is_empty());
        let resource = match (guarded, &table.resource) {
            (Some(guarded), Some(given)) if guarded != given => {
                return Err(Error::Usage(format!(
                    "--resource {given:?}: the guard of {name} fences resource {guarded:?}"
                )));
            }
            (Some(guarded), _) => guarded.to_owned(),
            (None, Some(given)) => given.clone(),
            (None, None) => name.clone(),
        };
        let state = |enabled: &Option<String>, trigger: &str| match enabled.as_deref() {
            Some("A") => None,
            None => Some(format!("{name} has no {trigger} trigger: it is not protected (SELECT fencing.protect(...))")),
            Some("D") => Some(format!("the {trigger} trigger of {name} is disabled: writes pass unchecked")),
            Some(_) => Some(format!(
                "the {trigger} trigger of {name} is not enabled ALWAYS: a session with session_replication_role = \
                 replica (or origin) writes past it (run fencing.protect again)"
            )),
        };
        let unguarded = state(&enabled, "fencing_guard").or_else(|| state(&truncate_enabled, "fencing_guard_truncate"));
        let guard = format!(
            "{name} is guarded for resource {resource:?}{}",
            match term_column {
                Some(column) => format!(" (term column {column:?}; verify presents the term as fencing.token)"),
                None => String::new(),
            }
        );
        let prepare = async |flag: &str, statement: &str| -> Result<Statement, Error> {
            bounded(flag, client.prepare_typed(statement, &[Type::TEXT]))
                .await?
                .map_err(|error| Error::Usage(format!("{flag} {statement:?}: {}", crate::error_chain(&error))))
        };
        let write = prepare("--write", &table.write).await?;
        let cleanup = match &table.cleanup {
            Some(statement) => Some(prepare("--cleanup", statement).await?),
            None => None,
        };
        Ok(Sql { table, lease, client, resource, name, role, unguarded, guard, write, cleanup })
    }

    /// Runs `statement` with `param` in one transaction presenting `term`: the rows it changed,
    /// or the database's error (the transaction then rolled back).
    async fn as_leader(
        &self,
        term: i64,
        statement: &Statement,
        param: &str,
    ) -> Result<Result<u64, tokio_postgres::Error>, Error> {
        let client = &self.client;
        let transaction = async {
            client.batch_execute("BEGIN").await?;
            client.execute("SELECT set_config('fencing.token', $1, true)", &[&term.to_string()]).await?;
            let rows = client.execute(statement, &[&param]).await?;
            client.batch_execute("COMMIT").await?;
            Ok(rows)
        };
        let done = bounded("a write", transaction).await?;
        if done.is_err() {
            // A failed statement left the transaction aborted: end it (a failed COMMIT has).
            let _ = bounded("roll back", client.batch_execute("ROLLBACK")).await?;
        }
        Ok(done)
    }
}

impl Place for Sql<'_> {
    fn describe(&self) -> String {
        format!(
            "lease {:?}, table {} (resource {:?}), writing as role {:?}",
            self.lease, self.name, self.resource, self.role
        )
    }

    async fn lease(&self) -> Result<Option<LeaseSeen>, Error> {
        let lease = bounded("read the lease", store::get_lease(&self.client, self.lease)).await?;
        let lease = lease.map_err(|error| Error::Setup(format!("read the lease: {}", crate::error_chain(&error))))?;
        Ok(lease.map(|lease| LeaseSeen { held: !lease.remaining.is_zero(), owner: lease.owner, term: lease.term }))
    }

    async fn fence(&self) -> Result<Option<FenceSeen>, Error> {
        let fence = bounded("read the fence", store::get_fence(&self.client, &self.resource)).await?;
        let fence = fence.map_err(|error| Error::Setup(format!("read the fence: {}", crate::error_chain(&error))))?;
        Ok(fence.map(|fence| FenceSeen { name: fence.resource, max_term: fence.max_term, lease_key: fence.lease_key }))
    }

    async fn acquire(&self, owner: &str, ttl: Duration) -> Result<i64, String> {
        let reply = tokio::time::timeout(EXCHANGE_TIMEOUT, store::acquire(&self.client, self.lease, owner, ttl))
            .await
            .map_err(|_| format!("{owner} could not acquire {:?}: no answer", self.lease))?
            .map_err(|error| format!("{owner} could not acquire {:?}: {}", self.lease, crate::error_chain(&error)))?;
        match (reply.ok, reply.term) {
            (true, Some(term)) => Ok(term),
            _ => Err(format!("{owner} could not acquire {:?}: held by {:?}", self.lease, reply.holder)),
        }
    }

    async fn release(&self, owner: &str) -> bool {
        let release = tokio::time::timeout(EXCHANGE_TIMEOUT, store::release(&self.client, self.lease, owner)).await;
        matches!(release, Ok(Ok(true)))
    }

    async fn write(&self, _owner: &str, term: i64, marker: &str) -> Result<Written, Error> {
        match self.as_leader(term, &self.write, marker).await? {
            Ok(0) => Ok(Written::Unclear(
                "committed, but changed no row: the guard was never asked (--write must change a row)".to_owned(),
            )),
            Ok(rows) => Ok(Written::Admitted(format!("committed, {rows} row{}", if rows == 1 { "" } else { "s" }))),
            Err(error) => match error.as_db_error() {
                Some(db) if db.code().code() == "ZF409" => {
                    let detail = db.detail().unwrap_or("");
                    let field = |key: &str| {
                        detail.split_whitespace().find_map(|pair| pair.strip_prefix(key)).map(str::to_owned)
                    };
                    let outcome = field("outcome=").unwrap_or_else(|| "-".to_owned());
                    match field("current_term=").and_then(|term| term.parse::<i64>().ok()) {
                        Some(current_term) => Ok(Written::Refused {
                            current_term,
                            text: format!("ZF409 {outcome}, current term {current_term}"),
                        }),
                        None => Ok(Written::Unclear(format!("ZF409 {outcome}: {}", db.message()))),
                    }
                }
                Some(db) => Ok(Written::Unclear(format!(
                    "SQLSTATE {} ({}), not the guard's refusal (ZF409): it failed for another reason, which says \
                     nothing of the fence",
                    db.code().code(),
                    db.message()
                ))),
                None => Err(store_error("a write", &error)),
            },
        }
    }

    async fn applied(&self) -> Option<(String, Result<String, String>)> {
        let query = self.table.check_query.as_ref()?;
        let client = &self.client;
        let read = async {
            // Read only: the check reads, whatever its text says.
            client.batch_execute("BEGIN READ ONLY").await?;
            let rows = client.simple_query(query).await;
            client.batch_execute("ROLLBACK").await?;
            rows
        };
        let read = match tokio::time::timeout(EXCHANGE_TIMEOUT, read).await {
            Ok(Ok(messages)) => Ok(messages
                .iter()
                .filter_map(|message| match message {
                    SimpleQueryMessage::Row(row) => {
                        Some((0..row.len()).map(|i| row.get(i).unwrap_or("")).collect::<Vec<_>>().join("\t"))
                    }
                    _ => None,
                })
                .collect::<Vec<_>>()
                .join("\n")),
            Ok(Err(error)) => {
                let _ = tokio::time::timeout(EXCHANGE_TIMEOUT, client.batch_execute("ROLLBACK")).await;
                Err(format!("--check-query: {}", crate::error_chain(&error)))
            }
            Err(_) => Err(format!("--check-query: no answer in {} s", EXCHANGE_TIMEOUT.as_secs())),
        };
        Some(("the check query".to_owned(), read))
    }

    async fn clean_up(&self, owner: &str, term: i64, marker_prefix: &str) {
        let Some(cleanup) = &self.cleanup else {
            println!(
                "verify: the run's writes stay in {}, each marked {marker_prefix:?} and a step (--cleanup removes them)",
                self.name
            );
            return;
        };
        match self.as_leader(term, cleanup, marker_prefix).await {
            Ok(Ok(rows)) => println!("verify: --cleanup, as {owner} at term {term}: {rows} rows"),
            Ok(Err(error)) => println!(
                "verify: --cleanup failed ({}); the run's writes are marked {marker_prefix:?}",
                crate::error_chain(&error)
            ),
            Err(error) => println!("verify: --cleanup: {error}; the run's writes are marked {marker_prefix:?}"),
        }
    }

    async fn guarded(&self) -> Result<Option<String>, String> {
        match &self.unguarded {
            Some(why) => Err(why.clone()),
            None => Ok(Some(self.guard.clone())),
        }
    }
}
