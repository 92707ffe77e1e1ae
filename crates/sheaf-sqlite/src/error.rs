//! The crate's one error enum, for opening a store, and the one place where driver errors become
//! store errors.
//!
//! Once a store is open, every trait method answers with [`sheaf_store::Error`], its kind chosen
//! by what happened (sheaf_store's `Error` docs): a full disk, a read-only file or a lock held
//! too long is [`Error::Unavailable`], which callers retry with backoff; a constraint the data
//! broke is [`Error::Conflict`], [`Error::NotFound`] or [`Error::InvalidInput`]; the rest is
//! [`Error::Backend`].

use std::path::PathBuf;

use sheaf_store::Error;

/// Why [`SqliteStore::open`](crate::SqliteStore::open) failed.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum SqliteError {
    /// An option cannot work; the message names it.
    #[error("invalid sqlite option: {0}")]
    InvalidOption(String),
    /// The database file could not be opened or created (a missing directory, no permission,
    /// not a database, locked by another program for longer than the busy timeout).
    #[error("opening the sqlite database {path}: {source}")]
    Open {
        /// The database file.
        path: PathBuf,
        /// The driver's error (the readers' or the writer's driver).
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Another store (in this process or another) holds the file: two processes writing one
    /// file would take turns for every write, and a second `sheaf` on the same data is a
    /// mistake more often than a plan.
    #[error(
        "the sqlite database {path} is in use by another process (its lock file {lock} is held); \
         stop that process or give this one another data directory"
    )]
    Locked {
        /// The database file.
        path: PathBuf,
        /// The lock file.
        lock: PathBuf,
    },
    /// The lock file beside the database could not be created or locked.
    #[error("locking the sqlite database with {lock}: {source}")]
    LockFile {
        /// The lock file.
        lock: PathBuf,
        /// The file system's error.
        #[source]
        source: std::io::Error,
    },
    /// A migration failed; the file is left at the last version that applied.
    #[error("migrating the sqlite database {path} to version {version}: {source}")]
    Migrate {
        /// The database file.
        path: PathBuf,
        /// The version that failed.
        version: i64,
        /// The driver's error.
        #[source]
        source: sqlx::Error,
    },
    /// The file was written by a newer release of this crate, whose schema this one does not
    /// know.
    #[error(
        "the sqlite database {path} is at schema version {found}, newer than this build's {known}"
    )]
    TooNew {
        /// The database file.
        path: PathBuf,
        /// The file's `user_version`.
        found: i64,
        /// The newest version this build applies.
        known: i64,
    },
}

impl From<SqliteError> for Error {
    fn from(error: SqliteError) -> Self {
        match error {
            SqliteError::InvalidOption(what) => Error::invalid_input(what),
            SqliteError::Open { .. } | SqliteError::LockFile { .. } => {
                Error::unavailable("opening the sqlite database", error)
            }
            SqliteError::Locked { .. } => Error::conflict(error.to_string()),
            SqliteError::Migrate { .. } | SqliteError::TooNew { .. } => {
                Error::backend("migrating the sqlite database", error)
            }
        }
    }
}

/// Converts a driver error met while `doing` something (lower case, e.g. "claiming jobs").
pub(crate) fn from_sqlx(doing: &str, error: sqlx::Error) -> Error {
    match classify(&error) {
        // What SQLite said ("database or disk is full", "attempt to write a readonly
        // database") is what an operator needs to read in the 503 it becomes.
        Kind::Unavailable if matches!(error, sqlx::Error::Database(_)) => {
            Error::unavailable(format!("{doing}: {error}"), error)
        }
        Kind::Unavailable => Error::unavailable(doing, error),
        Kind::Backend => Error::backend(doing, error),
        Kind::Conflict => Error::conflict(format!("{doing}: {error}")),
        Kind::NotFound => Error::not_found(format!("{doing}: {error}")),
        Kind::InvalidInput => Error::invalid_input(format!("{doing}: {error}")),
    }
}

/// Converts an error of the writer's driver met while `doing` something, as [`from_sqlx`] does
/// for the readers'.
pub(crate) fn from_rusqlite(doing: &str, error: rusqlite::Error) -> Error {
    let kind = match &error {
        rusqlite::Error::SqliteFailure(failure, _) => classify_code(failure.extended_code),
        rusqlite::Error::ToSqlConversionFailure(_) | rusqlite::Error::InvalidParameterName(_) => {
            Kind::InvalidInput
        }
        _ => Kind::Backend,
    };
    match kind {
        Kind::Unavailable => Error::unavailable(format!("{doing}: {error}"), error),
        Kind::Backend => Error::backend(doing, error),
        Kind::Conflict => Error::conflict(format!("{doing}: {error}")),
        Kind::NotFound => Error::not_found(format!("{doing}: {error}")),
        Kind::InvalidInput => Error::invalid_input(format!("{doing}: {error}")),
    }
}

/// `.doing("claiming jobs")?` on the writer driver's results: the error as a store error that
/// says what was being done.
pub(crate) trait Doing<T> {
    fn doing(self, what: &str) -> Result<T, Error>;
}

impl<T> Doing<T> for rusqlite::Result<T> {
    fn doing(self, what: &str) -> Result<T, Error> {
        self.map_err(|e| from_rusqlite(what, e))
    }
}

/// A decoding failure: the row did not have the shape this crate wrote.
pub(crate) fn decode(doing: &str, detail: impl std::fmt::Display) -> Error {
    Error::Backend {
        message: format!("{doing}: {detail}"),
        source: None,
    }
}

enum Kind {
    Unavailable,
    Backend,
    Conflict,
    NotFound,
    InvalidInput,
}

fn classify(error: &sqlx::Error) -> Kind {
    match error {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::BeginFailed => Kind::Unavailable,
        sqlx::Error::Database(db) => {
            let code = db.code().and_then(|c| c.parse::<i32>().ok()).unwrap_or(1);
            classify_code(code)
        }
        sqlx::Error::Encode(_) | sqlx::Error::InvalidArgument(_) => Kind::InvalidInput,
        _ => Kind::Backend,
    }
}

/// By SQLite's extended result code (sqlite.org/rescode.html); the primary code is its low byte.
fn classify_code(code: i32) -> Kind {
    match code {
        // SQLITE_CONSTRAINT_PRIMARYKEY and _UNIQUE: the identity is taken.
        1555 | 2067 => Kind::Conflict,
        // SQLITE_CONSTRAINT_FOREIGNKEY: the row it refers to (a tenant) does not exist.
        787 => Kind::NotFound,
        _ => match code & 0xff {
            // BUSY and LOCKED (another connection held the lock past the busy timeout), READONLY
            // (the file or its directory lost write permission), IOERR, FULL (the disk), CANTOPEN
            // and NOMEM: the store cannot take writes right now and may recover by itself.
            5 | 6 | 7 | 8 | 10 | 13 | 14 => Kind::Unavailable,
            // Other constraints (NOT NULL, CHECK) and values too big: the input cannot be stored.
            19 | 18 | 20 | 25 => Kind::InvalidInput,
            _ => Kind::Backend,
        },
    }
}
