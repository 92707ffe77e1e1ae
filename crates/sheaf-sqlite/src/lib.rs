//! Sheaf's LogStore, JobQueue, EntityStore, Outbox and ReplayStore on one SQLite file: a durable
//! embedded backend.
#![doc = include_str!("../README.md")]

mod db;
mod entity;
mod error;
mod log;
mod migrate;
mod options;
mod outbox;
mod queue;
mod replay;
mod retention;
mod space;
mod writer;

use std::path::Path;
use std::sync::Arc;

use sheaf_store::{EntityStore, JobQueue, LogStore, Outbox, ReplayStore};
use sqlx::sqlite::{SqliteAutoVacuum, SqliteJournalMode, SqlitePool, SqlitePoolOptions};
use sqlx::{Connection, SqliteConnection};

pub use entity::SqliteEntityStore;
pub use error::SqliteError;
pub use log::SqliteLogStore;
pub use options::{SqliteOptions, Synchronous};
pub use outbox::SqliteOutbox;
pub use queue::SqliteJobQueue;
pub use replay::SqliteReplayStore;
pub use retention::LogRetention;

use crate::db::Db;
use crate::space::Space;
use crate::writer::Writer;

/// The stores over one SQLite file: one writer connection behind a write coalescer, and a pool
/// of read-only connections.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    db: Db,
    log: SqliteLogStore,
    entities: SqliteEntityStore,
    queue: SqliteJobQueue,
    outbox: SqliteOutbox,
    replays: SqliteReplayStore,
}

impl SqliteStore {
    /// Opens (creating it if needed) the database file at `path` in WAL mode, applies the
    /// migrations it lacks, and starts the writer. The directory must exist. Must be called
    /// inside a Tokio runtime.
    ///
    /// # Errors
    /// [`SqliteError::InvalidOption`] for options that cannot work, [`SqliteError::Locked`] when
    /// another store has the file open, [`SqliteError::Open`] (or [`SqliteError::LockFile`]) when
    /// the file cannot be opened or is not a database, [`SqliteError::Migrate`] and
    /// [`SqliteError::TooNew`] when its schema cannot be brought to this build's.
    pub async fn open(path: impl AsRef<Path>, options: SqliteOptions) -> Result<Self, SqliteError> {
        let path = path.as_ref().to_owned();
        options.validate()?;
        let lock = if options.lock {
            Some(lock_file(&path)?)
        } else {
            None
        };
        let opening = |source: Box<dyn std::error::Error + Send + Sync>| SqliteError::Open {
            path: path.clone(),
            source,
        };
        // A first connection creates the file, switches it to WAL (a setting of the file, so
        // the others find it on) and migrates it before any other looks. Incremental
        // auto-vacuum must be chosen before the first table exists; it lets the store hand freed
        // pages back to the file system a batch at a time instead of rewriting the whole file.
        let create_options = options
            .connect(&path)
            .create_if_missing(true)
            .auto_vacuum(SqliteAutoVacuum::Incremental)
            .journal_mode(SqliteJournalMode::Wal);
        let mut connection = SqliteConnection::connect_with(&create_options)
            .await
            .map_err(|e| opening(e.into()))?;
        let migrated = migrate::run(&mut connection, &path).await;
        let _ = connection.close().await;
        migrated?;
        let connection = options.open_writer(&path).map_err(|e| opening(e.into()))?;
        let space = options
            .max_size_bytes
            .map(|bytes| Arc::new(Space::new(bytes)));
        if let Some(space) = &space {
            // The door starts from the file as it is; should this read fail, the first flush's
            // measurement stands in (the file is readable, migrations just ran on it).
            if let Err(e) = space.measure(&connection, true) {
                tracing::warn!(error = %e, "measuring the sqlite database at open");
            }
        }
        let readers = SqlitePoolOptions::new()
            .max_connections(options.readers)
            .min_connections(0)
            .connect_with(options.connect(&path).read_only(true))
            .await
            .map_err(|e| opening(e.into()))?;
        let writer = Writer::start(connection, options.write, space.clone())
            .map_err(|e| SqliteError::InvalidOption(e.to_string()))?;
        let db = Db::new(readers, writer, path, lock, space);
        Ok(SqliteStore {
            log: SqliteLogStore::new(db.clone(), options.retention),
            entities: SqliteEntityStore::new(db.clone()),
            queue: SqliteJobQueue::new(db.clone()),
            outbox: SqliteOutbox::new(db.clone()),
            replays: SqliteReplayStore::new(db.clone()),
            db,
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.db.path
    }

    /// The log store, as the service uses it.
    pub fn log_store(&self) -> Arc<dyn LogStore> {
        Arc::new(self.log.clone())
    }

    /// The job queue, as the service uses it.
    pub fn job_queue(&self) -> Arc<dyn JobQueue> {
        Arc::new(self.queue.clone())
    }

    /// The outbox beside the queue (sheaf_store's `outbox` module docs). The log tables are the
    /// outbox: an accepted event is in the log at once and nothing is ever shipped.
    pub fn outbox(&self) -> Arc<dyn Outbox> {
        Arc::new(self.outbox.clone())
    }

    /// The replay store, as the service uses it. It shares the queue's file, so a page's queue
    /// work commits with its progress.
    pub fn replay_store(&self) -> Arc<dyn ReplayStore> {
        Arc::new(self.replays.clone())
    }

    /// The entity store, as the service uses it.
    pub fn entity_store(&self) -> Arc<dyn EntityStore> {
        Arc::new(self.entities.clone())
    }

    /// The log store with its concrete type.
    pub fn sqlite_log_store(&self) -> &SqliteLogStore {
        &self.log
    }

    /// Commits what is queued, stops the writer, and closes every connection. Later calls on any
    /// of the stores fail as `Unavailable`.
    pub async fn close(&self) {
        self.db.writer.close().await;
        self.db.readers.close().await;
        // Dropping the file lets go of the lock; a poisoned mutex only means a panic elsewhere.
        match self.db.lock.lock() {
            Ok(mut lock) => drop(lock.take()),
            Err(poisoned) => drop(poisoned.into_inner().take()),
        }
    }

    /// What the writer did so far: `writes` counts flushes (one transaction each),
    /// `records_written` the write operations they carried, `failed_writes` the flushes that
    /// could not commit. Operations per flush is how much group commit is happening.
    pub fn write_metrics(&self) -> sheaf_coalesce::MetricsSnapshot {
        self.db.writer.metrics()
    }

    /// Writes a consistent copy of the database to `destination` (a file that must not exist
    /// yet) while the store keeps serving: `VACUUM INTO` on a reader connection, which reads one
    /// snapshot and never waits for the writer (nor the writer for it). The copy is compact and
    /// complete; restoring is stopping the service and putting the copy in the file's place
    /// (without the old `-wal` and `-shm` files).
    ///
    /// # Errors
    /// `InvalidInput` when `destination` exists, `Unavailable` when it cannot be written.
    pub async fn backup(&self, destination: impl AsRef<Path>) -> sheaf_store::Result<()> {
        vacuum_into(&self.db.readers, destination.as_ref()).await
    }

    /// [`SqliteStore::backup`] of the database file at `database` from outside the process that
    /// serves it (`sheaf backup`): one read-only connection, which takes no lock of the store's
    /// and so works beside a running service, reads one snapshot and never blocks its writer.
    ///
    /// # Errors
    /// `InvalidInput` when `destination` exists, `NotFound` when `database` does not, and
    /// `Unavailable` when either file cannot be read or written.
    pub async fn backup_file(
        database: impl AsRef<Path>,
        destination: impl AsRef<Path>,
    ) -> sheaf_store::Result<()> {
        let database = database.as_ref();
        if !database.is_file() {
            return Err(sheaf_store::Error::not_found(format!(
                "no database file at {}",
                database.display()
            )));
        }
        let options = SqliteOptions::default().connect(database).read_only(true);
        let mut connection = SqliteConnection::connect_with(&options)
            .await
            .map_err(|e| error::from_sqlx(&format!("opening {}", database.display()), e))?;
        let copied = vacuum_into(&mut connection, destination.as_ref()).await;
        let _ = connection.close().await;
        copied
    }

    /// The pool of read-only connections, for tests that inspect the file.
    pub fn readers(&self) -> &SqlitePool {
        &self.db.readers
    }

    /// The schema version this build migrates files to.
    pub fn schema_version() -> i64 {
        migrate::LATEST
    }
}

/// `VACUUM INTO destination` on `connection`: a compact, consistent copy of one snapshot.
async fn vacuum_into<'c, E>(connection: E, destination: &Path) -> sheaf_store::Result<()>
where
    E: sqlx::Executor<'c, Database = sqlx::Sqlite>,
{
    if destination.exists() {
        return Err(sheaf_store::Error::invalid_input(format!(
            "the backup file {} exists already",
            destination.display()
        )));
    }
    let name = destination.to_str().ok_or_else(|| {
        sheaf_store::Error::invalid_input(format!(
            "the backup path {} is not UTF-8",
            destination.display()
        ))
    })?;
    sqlx::query("VACUUM INTO ?1")
        .bind(name)
        .execute(connection)
        .await
        .map_err(|e| error::from_sqlx(&format!("backing up to {}", destination.display()), e))?;
    Ok(())
}

/// Takes the exclusive lock on `<path>.lock`, creating the file if needed. The lock is the
/// operating system's (released when the file closes, also when the process dies), so a crash
/// never leaves a stale lock behind.
fn lock_file(path: &Path) -> Result<std::fs::File, SqliteError> {
    let mut name = path.as_os_str().to_owned();
    name.push(".lock");
    let lock = std::path::PathBuf::from(name);
    let failed = |source| SqliteError::LockFile {
        lock: lock.clone(),
        source,
    };
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock)
        .map_err(failed)?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(SqliteError::Locked {
            path: path.to_owned(),
            lock,
        }),
        Err(std::fs::TryLockError::Error(e)) => Err(failed(e)),
    }
}
