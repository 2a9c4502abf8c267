//! The story played in SQL against a table protected by `fencing.protect`: the leases through
//! `fencing.acquire` and `fencing.release`, each write one transaction that presents its term
//! with `set_config('fencing.token', term, true)` and runs the user's statement, as a writer
//! of that table would. A refusal is the guard's SQLSTATE `ZF409` for this resource and term.
//!
//! Two sessions: one for the leases and fences, one for the writes, so that a write stuck past
//! its bound never holds up the release of the run's leases.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio_postgres::types::Type;
use tokio_postgres::{Client, Statement};

use fencing_schema::store;

use super::{EXCHANGE_TIMEOUT, FenceSeen, LeaseSeen, Place, Table, Written};
use crate::Error;

/// The server ends any one statement of verify's after this (the client waits longer).
const STATEMENT_TIMEOUT: Duration = Duration::from_secs(30);

/// A protected table and the sessions verify plays in.
pub(super) struct Sql<'a> {
    lease: &'a str,
    /// Leases and fences.
    control: Client,
    /// The writes, the check query and the cleanup.
    writer: Client,
    /// The resource the table's guard fences.
    resource: String,
    /// The table as the catalog names it.
    name: String,
    role: String,
    /// Why the table is not guarded as `fencing.protect` leaves it, for each way it is not.
    unguarded: Vec<String>,
    guard: String,
    write: Statement,
    check: Option<Statement>,
    cleanup: Option<Statement>,
    /// Rows the run's committed writes changed: the most a cleanup may change.
    written: AtomicU64,
    /// A call on the writer session ran past its bound: the session is left as it is (its
    /// transaction ends with the process), and nothing more runs on it.
    stuck: AtomicBool,
}

/// One call, bounded by [`EXCHANGE_TIMEOUT`] on this side too (the session's
/// `statement_timeout` bounds each statement on the server's).
async fn bounded<T, E>(what: &str, call: impl Future<Output = Result<T, E>>) -> Result<Result<T, E>, Error> {
    tokio::time::timeout(EXCHANGE_TIMEOUT, call)
        .await
        .map_err(|_| Error::Setup(format!("{what}: no answer in {} s", EXCHANGE_TIMEOUT.as_secs())))
}

fn store_error(what: &str, error: &tokio_postgres::Error) -> Error {
    Error::Setup(format!("{what}: {}", crate::error_chain(error)))
}

/// The guard's triggers on every table of the protected tree (the table, its partitions and
/// inheritance children): each must call `fencing.guard` with the root's arguments, the row
/// trigger BEFORE INSERT, UPDATE and DELETE of every column with no WHEN, the TRUNCATE one
/// BEFORE TRUNCATE, both enabled ALWAYS, as `fencing.protect` leaves them.
const GUARDS_SQL: &str = "
WITH RECURSIVE tree(relid, depth) AS (
    SELECT to_regclass($1)::oid, 0
    UNION ALL
    SELECT i.inhrelid, t.depth + 1 FROM pg_inherits i JOIN tree t ON i.inhparent = t.relid
)
SELECT t.relid::regclass::text AS rel, t.depth,
       g.tgenabled::text AS row_enabled, g.tgargs AS row_args,
       (g.tgfoid = 'fencing.guard()'::regprocedure AND g.tgtype = 31
        AND coalesce(array_length(g.tgattr::int2[], 1), 0) = 0 AND g.tgqual IS NULL) AS row_shape,
       x.tgenabled::text AS truncate_enabled, x.tgargs AS truncate_args,
       (x.tgfoid = 'fencing.guard()'::regprocedure AND x.tgtype = 34) AS truncate_shape,
       current_user::text AS role
  FROM tree t
  LEFT JOIN pg_trigger g ON g.tgrelid = t.relid AND g.tgname = 'fencing_guard'
  LEFT JOIN pg_trigger x ON x.tgrelid = t.relid AND x.tgname = 'fencing_guard_truncate'
 WHERE t.relid IS NOT NULL
 ORDER BY t.depth, 1";

/// The trigger's arguments, each ended by a NUL byte.
fn arguments(args: Option<Vec<u8>>) -> Vec<String> {
    let args = args.unwrap_or_default();
    let mut args: Vec<String> =
        args.split(|byte| *byte == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
    if args.last().is_some_and(String::is_empty) {
        args.pop();
    }
    args
}

/// A `ZF409` DETAIL, `outcome=O resource=R presented_term=P current_term=C`, read from both
/// ends (a resource name may hold spaces and `=`): `(outcome, resource, presented, current)`.
fn refusal_detail(detail: &str) -> Option<(&str, &str, &str, &str)> {
    let rest = detail.strip_prefix("outcome=")?;
    let (outcome, rest) = rest.split_once(" resource=")?;
    let (rest, current) = rest.rsplit_once(" current_term=")?;
    let (resource, presented) = rest.rsplit_once(" presented_term=")?;
    Some((outcome, resource, presented, current))
}

impl<'a> Sql<'a> {
    /// Connects, reads the table's guards and prepares the user's statements (a statement that
    /// does not parse is a usage error, found before anything is written).
    pub(super) async fn connect(table: &'a Table, lease: &'a str) -> Result<Sql<'a>, Error> {
        let database = crate::security::database::Database::parse(&table.database_url).map_err(Error::Usage)?;
        let session = format!(
            "SET statement_timeout = {ms}; SET lock_timeout = {ms}; SET idle_in_transaction_session_timeout = {ms};
             SET default_transaction_isolation = 'read committed'",
            ms = STATEMENT_TIMEOUT.as_millis()
        );
        let mut clients = Vec::new();
        for _ in 0..2 {
            let client = bounded("connect", database.connect()).await?.map_err(Error::Connect)?;
            bounded("set up the session", client.batch_execute(&session))
                .await?
                .map_err(|error| store_error("set up the session", &error))?;
            clients.push(client);
        }
        let (Some(writer), Some(control)) = (clients.pop(), clients.pop()) else {
            return Err(Error::Setup("connect: no session".to_owned()));
        };
        bounded("check the schema", fencing_schema::check_schema_version(&control)).await??;

        let rows = bounded("read the table's guard", control.query(GUARDS_SQL, &[&table.table]))
            .await?
            .map_err(|error| Error::Usage(format!("--table {:?}: {}", table.table, crate::error_chain(&error))))?;
        let Some(root) = rows.first() else {
            return Err(Error::Usage(format!("--table {:?}: no such table", table.table)));
        };
        let get = |row: &tokio_postgres::Row, column: &str| -> Result<Option<String>, Error> {
            row.try_get(column).map_err(|error| store_error("read the table's guard", &error))
        };
        let bytes = |row: &tokio_postgres::Row, column: &str| -> Result<Option<Vec<u8>>, Error> {
            row.try_get(column).map_err(|error| store_error("read the table's guard", &error))
        };
        let flag = |row: &tokio_postgres::Row, column: &str| -> Result<bool, Error> {
            let value: Option<bool> =
                row.try_get(column).map_err(|error| store_error("read the table's guard", &error))?;
            Ok(value.unwrap_or(false))
        };
        let name = get(root, "rel")?.unwrap_or_default();
        let role = get(root, "role")?.unwrap_or_default();
        let root_args = arguments(bytes(root, "row_args")?);
        let guarded = root_args.first().filter(|resource| !resource.is_empty());
        let term_column = root_args.get(1).filter(|column| !column.is_empty());
        let resource = match (guarded, &table.resource) {
            (Some(guarded), Some(given)) if guarded != given => {
                return Err(Error::Usage(format!(
                    "--resource {given:?}: the guard of {name} fences resource {guarded:?}"
                )));
            }
            (Some(guarded), _) => guarded.clone(),
            (None, Some(given)) => given.clone(),
            (None, None) => name.clone(),
        };
        let mut unguarded = Vec::new();
        for row in &rows {
            let rel = get(row, "rel")?.unwrap_or_default();
            for (trigger, enabled, args, shape, what) in [
                (
                    "fencing_guard",
                    "row_enabled",
                    "row_args",
                    "row_shape",
                    "BEFORE INSERT OR UPDATE OR DELETE FOR EACH ROW",
                ),
                ("fencing_guard_truncate", "truncate_enabled", "truncate_args", "truncate_shape", "BEFORE TRUNCATE"),
            ] {
                let args = arguments(bytes(row, args)?);
                let problem = match get(row, enabled)?.as_deref() {
                    None => Some(format!("{rel} has no {trigger} trigger: it is not protected (run fencing.protect)")),
                    Some("D") => Some(format!("the {trigger} trigger of {rel} is disabled: writes pass unchecked")),
                    Some("A") if !flag(row, shape)? => Some(format!(
                        "the {trigger} trigger of {rel} is not fencing.guard {what} (of every column, no WHEN): \
                         some writes pass unchecked (run fencing.protect again)"
                    )),
                    Some("A") if trigger == "fencing_guard" && args != root_args => Some(format!(
                        "the {trigger} trigger of {rel} guards {args:?}, not {root_args:?} as {name} does"
                    )),
                    Some("A") if trigger == "fencing_guard_truncate" && args.first() != root_args.first() => Some(
                        format!("the {trigger} trigger of {rel} guards {args:?}, not resource {:?}", root_args.first()),
                    ),
                    Some("A") => None,
                    Some(_) => Some(format!(
                        "the {trigger} trigger of {rel} is not enabled ALWAYS: a session with \
                         session_replication_role = replica (or origin) writes past it (run fencing.protect again)"
                    )),
                };
                unguarded.extend(problem);
            }
        }
        let guard = format!(
            "{name} is guarded for resource {resource:?}{}{}",
            if rows.len() > 1 { format!(", with the {} tables below it", rows.len() - 1) } else { String::new() },
            match term_column {
                Some(column) => format!(" (term column {column:?}; verify presents the term as fencing.token)"),
                None => String::new(),
            }
        );

        // The user's statements, on the session that runs them: one statement each, $1 the
        // marker (text) where asked for.
        let prepare = async |flag: &str, given: &str, statement: &str, marker: bool| -> Result<Statement, Error> {
            let statement = if statement.is_empty() { given } else { statement };
            let prepared = bounded(flag, writer.prepare(statement))
                .await?
                .map_err(|error| Error::Usage(format!("{flag} {given:?}: {}", crate::error_chain(&error))))?;
            let statement = given;
            let takes_text =
                |ty: &Type| [Type::TEXT, Type::VARCHAR, Type::BPCHAR, Type::NAME, Type::UNKNOWN].contains(ty);
            match (marker, prepared.params()) {
                (true, [ty]) if takes_text(ty) => Ok(prepared),
                (false, []) => Ok(prepared),
                (true, _) => Err(Error::Usage(format!(
                    "{flag} {statement:?} must take exactly one parameter, $1, the marker (text): it is how the \
                     run's writes are found"
                ))),
                (false, _) => Err(Error::Usage(format!("{flag} {statement:?} must take no parameter"))),
            }
        };
        let write = prepare("--write", &table.write, "", true).await?;
        // The check reads rows, as text, through a subquery: a statement that is not a query
        // (or is several) does not parse, and nothing it does can write.
        let check = match &table.check_query {
            Some(query) => {
                let query = query.trim().trim_end_matches(';');
                Some(
                    prepare(
                        "--check-query",
                        query,
                        &format!("SELECT ROW(fencing_verify_row.*)::text FROM ({query}\n) AS fencing_verify_row"),
                        false,
                    )
                    .await?,
                )
            }
            None => None,
        };
        let cleanup = match &table.cleanup {
            Some(statement) => Some(prepare("--cleanup", statement, "", true).await?),
            None => None,
        };
        Ok(Sql {
            lease,
            control,
            writer,
            resource,
            name,
            role,
            unguarded,
            guard,
            write,
            check,
            cleanup,
            written: AtomicU64::new(0),
            stuck: AtomicBool::new(false),
        })
    }

    /// Runs `statement` with `param` in one transaction presenting `term`: the rows it changed,
    /// or the database's error (the transaction then rolled back). With `at_most`, a statement
    /// that changes more rows is rolled back (`Ok(Err(rows))`).
    async fn as_leader(
        &self,
        term: i64,
        statement: &Statement,
        param: &str,
        at_most: Option<u64>,
    ) -> Result<Result<Result<u64, u64>, tokio_postgres::Error>, Error> {
        let client = &self.writer;
        let transaction = async {
            client.batch_execute("BEGIN").await?;
            client.execute("SELECT set_config('fencing.token', $1, true)", &[&term.to_string()]).await?;
            let rows = client.execute(statement, &[&param]).await?;
            if at_most.is_some_and(|most| rows > most) {
                client.batch_execute("ROLLBACK").await?;
                return Ok(Err(rows));
            }
            client.batch_execute("COMMIT").await?;
            Ok(Ok(rows))
        };
        // Past the bound the writer session is left as it is: its transaction ends with the
        // process (and its statement at the server's statement_timeout); the leases are on the
        // other session.
        if self.stuck.load(Ordering::Relaxed) {
            return Err(Error::Setup("the writer session ran past its bound before".to_owned()));
        }
        let done = bounded("a write", transaction).await.inspect_err(|_| self.stuck.store(true, Ordering::Relaxed))?;
        if done.is_err() {
            // A failed statement left the transaction aborted: end it (a failed COMMIT has).
            // The statement's own error is the answer, whatever the rollback does.
            if !matches!(tokio::time::timeout(EXCHANGE_TIMEOUT, client.batch_execute("ROLLBACK")).await, Ok(Ok(()))) {
                self.stuck.store(true, Ordering::Relaxed);
            }
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
        let lease = bounded("read the lease", store::get_lease(&self.control, self.lease)).await?;
        let lease = lease.map_err(|error| Error::Setup(format!("read the lease: {}", crate::error_chain(&error))))?;
        Ok(lease.map(|lease| LeaseSeen { held: !lease.remaining.is_zero(), owner: lease.owner, term: lease.term }))
    }

    async fn fence(&self) -> Result<Option<FenceSeen>, Error> {
        let fence = bounded("read the fence", store::get_fence(&self.control, &self.resource)).await?;
        let fence = fence.map_err(|error| Error::Setup(format!("read the fence: {}", crate::error_chain(&error))))?;
        Ok(fence.map(|fence| FenceSeen { name: fence.resource, max_term: fence.max_term, lease_key: fence.lease_key }))
    }

    async fn acquire(&self, owner: &str, ttl: Duration) -> Result<i64, String> {
        let reply = tokio::time::timeout(EXCHANGE_TIMEOUT, store::acquire(&self.control, self.lease, owner, ttl))
            .await
            .map_err(|_| format!("{owner} could not acquire {:?}: no answer", self.lease))?
            .map_err(|error| format!("{owner} could not acquire {:?}: {}", self.lease, crate::error_chain(&error)))?;
        match (reply.ok, reply.term) {
            (true, Some(term)) => Ok(term),
            _ => Err(format!("{owner} could not acquire {:?}: held by {:?}", self.lease, reply.holder)),
        }
    }

    async fn release(&self, owner: &str) -> bool {
        let release = tokio::time::timeout(EXCHANGE_TIMEOUT, store::release(&self.control, self.lease, owner)).await;
        matches!(release, Ok(Ok(true)))
    }

    async fn write(&self, _owner: &str, term: i64, marker: &str) -> Result<Written, Error> {
        match self.as_leader(term, &self.write, marker, None).await? {
            Ok(Ok(0) | Err(_)) => Ok(Written::Unclear(
                "committed, but changed no row: this says nothing of the guard (--write must change a row)".to_owned(),
            )),
            Ok(Ok(rows)) => {
                self.written.fetch_add(rows, Ordering::Relaxed);
                Ok(Written::Admitted(format!("committed, {rows} row{}", if rows == 1 { "" } else { "s" })))
            }
            Err(error) => match error.as_db_error() {
                Some(db) if db.code().code() == "ZF409" => {
                    let detail = db.detail().unwrap_or("");
                    // Only this guard's refusal of this write: its resource, the term presented,
                    // an outcome that says a newer term exists or none is held.
                    match refusal_detail(detail) {
                        Some((outcome @ ("stale" | "not_leader" | "future_term"), resource, presented, current))
                            if resource == self.resource && presented == term.to_string() =>
                        {
                            match current.parse::<i64>() {
                                Ok(current_term) => Ok(Written::Refused {
                                    current_term,
                                    text: format!("ZF409 {outcome}, current term {current_term}"),
                                }),
                                Err(_) => Ok(Written::Unclear(format!("ZF409 {detail}: no current term"))),
                            }
                        }
                        _ => Ok(Written::Unclear(format!(
                            "ZF409 ({detail}), not this guard's refusal of this write (resource {:?}, term {term}): \
                             it says nothing of the fence",
                            self.resource
                        ))),
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
        let check = self.check.as_ref()?;
        if self.stuck.load(Ordering::Relaxed) {
            return Some((
                "the check query".to_owned(),
                Err("--check-query: not run: a write ran past its bound".to_owned()),
            ));
        }
        let client = &self.writer;
        let read = async {
            // Read only, whatever the query calls.
            client.batch_execute("BEGIN READ ONLY").await?;
            let rows = client.query(check, &[]).await;
            client.batch_execute("ROLLBACK").await?;
            let mut text = Vec::new();
            for row in rows? {
                text.push(row.try_get::<_, Option<String>>(0)?.unwrap_or_default());
            }
            Ok::<_, tokio_postgres::Error>(text.join("\n"))
        };
        let read = match tokio::time::timeout(EXCHANGE_TIMEOUT, read).await {
            Ok(Ok(text)) => Ok(text),
            Ok(Err(error)) => {
                if !matches!(tokio::time::timeout(EXCHANGE_TIMEOUT, client.batch_execute("ROLLBACK")).await, Ok(Ok(())))
                {
                    self.stuck.store(true, Ordering::Relaxed);
                }
                Err(format!("--check-query: {}", crate::error_chain(&error)))
            }
            Err(_) => {
                self.stuck.store(true, Ordering::Relaxed);
                Err(format!("--check-query: no answer in {} s", EXCHANGE_TIMEOUT.as_secs()))
            }
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
        let written = self.written.load(Ordering::Relaxed);
        match self.as_leader(term, cleanup, marker_prefix, Some(written)).await {
            Ok(Ok(Ok(rows))) => println!("verify: --cleanup, as {owner} at term {term}: {rows} rows"),
            Ok(Ok(Err(rows))) => println!(
                "verify: --cleanup would have changed {rows} rows, more than the run's writes changed ({written}): \
                 rolled back; the run's writes are marked {marker_prefix:?}"
            ),
            Ok(Err(error)) => println!(
                "verify: --cleanup failed ({}); the run's writes are marked {marker_prefix:?}",
                crate::error_chain(&error)
            ),
            Err(error) => println!("verify: --cleanup: {error}; the run's writes are marked {marker_prefix:?}"),
        }
    }

    async fn guarded(&self) -> Result<Option<String>, String> {
        match self.unguarded.as_slice() {
            [] => Ok(Some(self.guard.clone())),
            problems => Err(problems.join("; ")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::refusal_detail;

    #[test]
    fn a_refusal_detail_is_read_from_both_ends() {
        assert_eq!(
            refusal_detail("outcome=stale resource=orders presented_term=1 current_term=2"),
            Some(("stale", "orders", "1", "2"))
        );
        // A resource name with spaces and `=` in it cannot pose as the terms.
        assert_eq!(
            refusal_detail("outcome=stale resource=a current_term=7 presented_term=9 presented_term=1 current_term=2"),
            Some(("stale", "a current_term=7 presented_term=9", "1", "2"))
        );
        assert_eq!(refusal_detail("outcome=not_leader resource=r presented_term=3"), None);
        assert_eq!(refusal_detail(""), None);
    }
}
