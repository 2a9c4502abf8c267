//! The embedded migrations and the runner that applies them.
//!
//! The files in `schema/migrations/` (versioned: tables and types, applied once each, in order)
//! and `schema/functions/` (repeatable: the current text of every function, applied after the
//! versioned ones whenever a file changed) are the source of truth; they are embedded here
//! unchanged, so a DBA applying them with psql and the binary applying them agree.
//! Each versioned file records its own version in `fencing.schema_migrations` as its last
//! statement; the runner records each repeatable file's md5 in `fencing.repeatable_migrations`.

use tokio_postgres::Client;
use tracing::info;

use crate::error::Error;

/// One versioned migration file.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    /// The number the file name starts with.
    pub version: i32,
    /// The rest of the file name, without extension.
    pub name: &'static str,
    /// The file's text, applied as one transaction.
    pub sql: &'static str,
}

/// One repeatable file of `schema/functions/`: the current definition of one function (or of a
/// few small helpers that belong together).
#[derive(Debug, Clone, Copy)]
pub struct Repeatable {
    /// The file name without extension.
    pub name: &'static str,
    /// The file's text.
    pub sql: &'static str,
}

/// Every versioned migration this binary knows, in the order they apply.
pub const MIGRATIONS: &[Migration] = &[
    Migration { version: 1, name: "init", sql: include_str!("../migrations/0001_init.sql") },
    Migration { version: 2, name: "gate", sql: include_str!("../migrations/0002_gate.sql") },
    Migration { version: 3, name: "audit", sql: include_str!("../migrations/0003_audit.sql") },
    Migration { version: 4, name: "functions", sql: include_str!("../migrations/0004_functions.sql") },
    Migration { version: 5, name: "grants", sql: include_str!("../migrations/0005_grants.sql") },
    Migration { version: 6, name: "members", sql: include_str!("../migrations/0006_members.sql") },
    Migration { version: 7, name: "daemons", sql: include_str!("../migrations/0007_daemons.sql") },
    Migration { version: 8, name: "clock_safe_waits", sql: include_str!("../migrations/0008_clock_safe_waits.sql") },
    Migration { version: 9, name: "lease_grants", sql: include_str!("../migrations/0009_lease_grants.sql") },
    Migration { version: 10, name: "settle_ids", sql: include_str!("../migrations/0010_settle_ids.sql") },
    Migration { version: 11, name: "lease_values", sql: include_str!("../migrations/0011_lease_values.sql") },
    Migration { version: 12, name: "lock_delay", sql: include_str!("../migrations/0012_lock_delay.sql") },
    Migration { version: 13, name: "watch", sql: include_str!("../migrations/0013_watch.sql") },
    Migration { version: 14, name: "handover", sql: include_str!("../migrations/0014_handover.sql") },
    Migration { version: 15, name: "members_at_scale", sql: include_str!("../migrations/0015_members_at_scale.sql") },
    Migration { version: 16, name: "log", sql: include_str!("../migrations/0016_log.sql") },
];

macro_rules! repeatable {
    ($($name:literal),* $(,)?) => {
        &[$(Repeatable { name: $name, sql: include_str!(concat!("../functions/", $name, ".sql")) }),*]
    };
}

/// Every repeatable file, in name order (the order psql users apply them in).
pub const FUNCTIONS: &[Repeatable] = repeatable![
    "acquire",
    "admit",
    "advance_fence",
    "bind",
    "checks",
    "daemons",
    "force_release",
    "gate",
    "gate_lease",
    "gate_many",
    "grants",
    "guard",
    "handover",
    "lease_value",
    "lock_delay",
    "log",
    "members",
    "presented_term",
    "probe_newest",
    "protect",
    "raise_refused",
    "record_refusals",
    "release",
    "renew",
    "reset_fence",
    "try_admit",
    "watch",
    "zz_install",
];

/// The schema version this binary expects to find.
pub const LATEST_VERSION: i32 = 16;

/// The advisory lock key migrations are serialised on: "fencing" in ASCII.
pub const ADVISORY_LOCK_KEY: i64 = 0x0066_656e_6369_6e67;

/// What one call of [`migrate`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationReport {
    /// The versions this call applied, in order; empty when the schema was current.
    pub applied: Vec<i32>,
    /// The repeatable files this call (re-)applied because they were new or had changed.
    pub functions: Vec<&'static str>,
    /// The schema version after the call.
    pub version: i32,
}

/// Applies every pending versioned migration in order, then every repeatable file whose text
/// differs from the one last applied.
///
/// Every versioned migration that is not applied yet, then every repeatable file that is new or
/// changed, in one transaction that first takes a transaction-scoped advisory lock and then
/// re-reads the applied versions, so any number of processes may call this at once: one applies,
/// the others wait and then find everything applied. One transaction also means that nobody ever
/// sees a schema version whose functions are not there yet (a table that gained a column before
/// the functions that read it were replaced). A database whose schema is newer than this binary
/// knows is refused with [`Error::SchemaTooNew`] before anything runs.
pub async fn migrate(client: &mut Client) -> Result<MigrationReport, Error> {
    let mut applied = Vec::new();
    let transaction = client.transaction().await.map_err(Error::Store)?;
    transaction.execute("SELECT pg_advisory_xact_lock($1)", &[&ADVISORY_LOCK_KEY]).await.map_err(Error::Store)?;
    for migration in MIGRATIONS {
        let current = schema_version(&transaction).await?;
        if let Some(found) = current.filter(|found| *found > LATEST_VERSION) {
            return Err(Error::SchemaTooNew { found, known: LATEST_VERSION });
        }
        if current.is_some_and(|found| found >= migration.version) {
            continue;
        }
        transaction.batch_execute(migration.sql).await.map_err(|source| Error::MigrationFailed {
            version: migration.version,
            name: migration.name,
            source,
        })?;
        let recorded = transaction
            .query_opt("SELECT 1 FROM fencing.schema_migrations WHERE version = $1", &[&migration.version])
            .await
            .map_err(Error::Store)?;
        if recorded.is_none() {
            return Err(Error::MigrationUnrecorded { version: migration.version, name: migration.name });
        }
        applied.push(migration.version);
    }
    let functions = apply_functions(&transaction).await?;
    transaction.commit().await.map_err(Error::Store)?;
    for version in &applied {
        info!(version, "applied migration");
    }
    if !functions.is_empty() {
        info!(files = ?functions, "applied function files");
    }
    let version = check_schema_version(client).await?;
    Ok(MigrationReport { applied, functions, version })
}

/// Applies the repeatable files that are new or changed, inside the migration's transaction.
async fn apply_functions(transaction: &tokio_postgres::Transaction<'_>) -> Result<Vec<&'static str>, Error> {
    let mut applied = Vec::new();
    for file in FUNCTIONS {
        let current: bool = transaction
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM fencing.repeatable_migrations WHERE name = $1 AND checksum = md5($2))",
                &[&file.name, &file.sql],
            )
            .await
            .and_then(|row| row.try_get(0))
            .map_err(Error::Store)?;
        if current {
            continue;
        }
        transaction
            .batch_execute(file.sql)
            .await
            .map_err(|source| Error::FunctionsFailed { name: file.name, source })?;
        transaction
            .execute(
                "INSERT INTO fencing.repeatable_migrations (name, checksum) VALUES ($1, md5($2))
                 ON CONFLICT (name) DO UPDATE SET checksum = excluded.checksum, applied_at = clock_timestamp()",
                &[&file.name, &file.sql],
            )
            .await
            .map_err(Error::Store)?;
        applied.push(file.name);
    }
    Ok(applied)
}

/// The highest applied migration version, or `None` when the schema is not installed.
pub async fn schema_version(client: &impl tokio_postgres::GenericClient) -> Result<Option<i32>, Error> {
    let installed: bool = client
        .query_one("SELECT to_regclass('fencing.schema_migrations') IS NOT NULL", &[])
        .await
        .and_then(|row| row.try_get(0))
        .map_err(Error::Store)?;
    if !installed {
        return Ok(None);
    }
    client
        .query_one("SELECT max(version) FROM fencing.schema_migrations", &[])
        .await
        .and_then(|row| row.try_get(0))
        .map_err(Error::Store)
}

/// Returns the schema version when it is exactly the one this binary expects, else the reason.
pub async fn check_schema_version(client: &impl tokio_postgres::GenericClient) -> Result<i32, Error> {
    match schema_version(client).await? {
        Some(found) if found == LATEST_VERSION => Ok(found),
        Some(found) if found > LATEST_VERSION => Err(Error::SchemaTooNew { found, known: LATEST_VERSION }),
        found => Err(Error::SchemaOutdated { found, expected: LATEST_VERSION }),
    }
}

#[cfg(test)]
mod tests {
    use crate::migrations::{FUNCTIONS, LATEST_VERSION, MIGRATIONS};

    #[test]
    fn migrations_are_numbered_in_order_and_record_themselves() {
        for (index, migration) in MIGRATIONS.iter().enumerate() {
            let expected = i32::try_from(index + 1).expect("few migrations");
            assert_eq!(migration.version, expected, "versions start at 1 and have no gaps");
            let record = format!("VALUES ({}, '{}')", migration.version, migration.name);
            assert!(
                migration.sql.contains(&record),
                "migration {} must record itself with {record}",
                migration.version
            );
            assert!(
                !migration.sql.to_ascii_uppercase().contains("\nCOMMIT"),
                "migration files must not manage their own transaction"
            );
        }
        assert_eq!(MIGRATIONS.last().map(|m| m.version), Some(LATEST_VERSION));
    }

    #[test]
    fn every_function_file_is_embedded_once_in_name_order() {
        let names: Vec<&str> = FUNCTIONS.iter().map(|f| f.name).collect();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(names, sorted, "FUNCTIONS lists each file once, in name order");
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("functions");
        let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
            .expect("schema/functions exists")
            .filter_map(|entry| entry.ok()?.path().file_stem()?.to_str().map(str::to_owned))
            .collect();
        on_disk.sort();
        assert_eq!(names, on_disk, "every file of schema/functions is embedded");
    }
}
