//! The one error type of `fencing-schema`.

use tokio_postgres::error::SqlState;

/// The SQLSTATE every refused write raises (class `ZF`, implementation-defined: "fencing").
///
/// Raised by `fencing.admit` and the `fencing.guard` trigger when a term is lower than the
/// resource's maximum, when a bound resource is written with a term other than its lease's
/// current term or while that lease is not held, and when a guarded write presents no term.
pub const SQLSTATE_REFUSED: &str = "ZF409";

/// The SQLSTATE of a read of a fenced log's entries that retention removed (schema version 16).
pub const SQLSTATE_COMPACTED: &str = "ZF410";

/// The SQLSTATE of a fenced log's stream that does not exist (`undefined_object`).
pub const SQLSTATE_NO_STREAM: &str = "42704";

/// The SQLSTATE every invalid argument raises (`invalid_parameter_value`).
pub const SQLSTATE_INVALID_ARGUMENT: &str = "22023";

/// What can go wrong when migrating or calling the fencing functions.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The database was migrated by a newer release: this binary must not touch it.
    #[error(
        "the database's fencing schema is at version {found}, newer than version {known} that this binary knows; \
         upgrade fencing-gateway before using this database"
    )]
    SchemaTooNew {
        /// The highest version recorded in `fencing.schema_migrations`.
        found: i32,
        /// The highest version embedded in this binary.
        known: i32,
    },

    /// The database lacks migrations this binary needs.
    #[error(
        "the database's fencing schema is at version {}, this binary needs version {expected}; \
         run `fencing-gateway migrate`",
        found.map_or_else(|| "none".to_owned(), |v| v.to_string())
    )]
    SchemaOutdated {
        /// The highest version recorded, if any.
        found: Option<i32>,
        /// The version this binary needs.
        expected: i32,
    },

    /// A migration file ran but did not record its version, so it would run again.
    #[error("migration {version} ({name}) ran but did not record itself in fencing.schema_migrations")]
    MigrationUnrecorded {
        /// The migration's version.
        version: i32,
        /// The migration's name.
        name: &'static str,
    },

    /// A migration file failed; its transaction was rolled back.
    #[error("apply migration {version} ({name})")]
    MigrationFailed {
        /// The migration's version.
        version: i32,
        /// The migration's name.
        name: &'static str,
        /// What Postgres said.
        #[source]
        source: tokio_postgres::Error,
    },

    /// A repeatable function file failed; nothing of the repeatable pass was applied.
    #[error("apply function file {name}.sql")]
    FunctionsFailed {
        /// The file's name, without extension.
        name: &'static str,
        /// What Postgres said.
        #[source]
        source: tokio_postgres::Error,
    },

    /// A fencing function refused a write (SQLSTATE `ZF409`).
    #[error("write refused by the fence: {message}")]
    Refused {
        /// Postgres's message, naming the resource, the presented and the current term.
        message: String,
        /// The refusal's outcome from its DETAIL (`stale`, `not_leader`, `future_term`,
        /// `missing_token`, ...), when it has one.
        outcome: Option<String>,
        /// The current term from its DETAIL, when it names one.
        current_term: Option<i64>,
    },

    /// A fencing function refused an argument (SQLSTATE `22023`).
    #[error("invalid argument: {message}")]
    InvalidArgument {
        /// Postgres's message, naming the argument and the bound it broke.
        message: String,
    },

    /// A read of a fenced log asked for entries retention removed (SQLSTATE `ZF410`): the reader
    /// must take a snapshot of the state up to `first_seq - 1` and read after it.
    #[error("{message}")]
    Compacted {
        /// Postgres's message.
        message: String,
        /// The stream's oldest kept entry.
        first_seq: i64,
    },

    /// A fenced log's stream that does not exist (SQLSTATE `42704`).
    #[error("{message}")]
    NoStream {
        /// Postgres's message, naming the stream.
        message: String,
    },

    /// A function answered in a shape this binary does not know (a schema from another release).
    #[error("unexpected reply from the fence store: {message}")]
    UnexpectedReply {
        /// What was unexpected.
        message: String,
    },

    /// The store could not be reached or failed otherwise.
    #[error("fence store")]
    Store(#[source] tokio_postgres::Error),
}

impl Error {
    /// True when the store itself failed (unreachable, closed connection, timeout), as opposed to
    /// a decision or a bad argument.
    pub fn is_store_failure(&self) -> bool {
        matches!(self, Error::Store(_))
    }
}

impl From<tokio_postgres::Error> for Error {
    /// The one place our documented SQLSTATEs become variants.
    fn from(error: tokio_postgres::Error) -> Self {
        let Some(db) = error.as_db_error() else {
            return Error::Store(error);
        };
        let code = db.code();
        if code == &SqlState::from_code(SQLSTATE_REFUSED) {
            // DETAIL: "outcome=<o> resource=<r> presented_term=<t> current_term=<c>"; the
            // resource may hold spaces and '=', so the outcome is read from the front and the
            // current term from the back.
            let detail = db.detail().unwrap_or_default();
            let outcome = detail
                .strip_prefix("outcome=")
                .and_then(|rest| rest.split(' ').next())
                .filter(|outcome| !outcome.is_empty())
                .map(str::to_owned);
            let current_term = detail.rsplit_once(" current_term=").and_then(|(_, term)| term.parse().ok());
            Error::Refused { message: db.message().to_owned(), outcome, current_term }
        } else if code == &SqlState::from_code(SQLSTATE_COMPACTED) {
            let first_seq = db.detail().and_then(|detail| detail.strip_prefix("first_seq=")?.parse().ok());
            match first_seq {
                Some(first_seq) => Error::Compacted { message: db.message().to_owned(), first_seq },
                None => Error::UnexpectedReply {
                    message: format!("a compacted stream without its first_seq: {}", db.message()),
                },
            }
        } else if code == &SqlState::from_code(SQLSTATE_NO_STREAM) && db.message().starts_with("fencing: no stream") {
            Error::NoStream { message: db.message().to_owned() }
        } else if code == &SqlState::from_code(SQLSTATE_INVALID_ARGUMENT)
            // Text a caller sent that Postgres cannot read as the type asked for (a lease value
            // that is no JSON Postgres accepts: a \u0000 in a string): bad input too.
            || code == &SqlState::INVALID_TEXT_REPRESENTATION
            || code == &SqlState::UNTRANSLATABLE_CHARACTER
        {
            Error::InvalidArgument { message: db.message().to_owned() }
        } else {
            Error::Store(error)
        }
    }
}
