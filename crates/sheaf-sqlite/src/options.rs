//! [`SqliteOptions`]: how durable each flush is, how many readers, and the writer's bounds.

use std::time::Duration;

use sheaf_coalesce::WriteConfig;

use crate::{LogRetention, SqliteError};

/// When a committed flush reaches the disk: SQLite's `synchronous` setting in WAL mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Synchronous {
    /// `synchronous=NORMAL`: a commit is written to the WAL file but not fsynced; the WAL is
    /// fsynced at each checkpoint. A process crash (kill -9) loses nothing committed, because the
    /// operating system still holds the write; a power loss or kernel crash may lose the last
    /// flushes, never corrupt the file.
    #[default]
    Normal,
    /// `synchronous=FULL`: every commit fsyncs the WAL, so a committed flush survives a power
    /// loss too, at the cost of one fsync per flush.
    Full,
}

impl Synchronous {
    fn to_sqlx(self) -> sqlx::sqlite::SqliteSynchronous {
        match self {
            Synchronous::Normal => sqlx::sqlite::SqliteSynchronous::Normal,
            Synchronous::Full => sqlx::sqlite::SqliteSynchronous::Full,
        }
    }

    fn pragma(self) -> &'static str {
        match self {
            Synchronous::Normal => "NORMAL",
            Synchronous::Full => "FULL",
        }
    }
}

/// How far a checkpoint truncates the WAL: a checkpoint restarts the WAL from its start but
/// leaves the file at its largest, so this keeps it from holding a flood's size.
const JOURNAL_SIZE_LIMIT: i64 = 64 * 1024 * 1024;

/// How [`SqliteStore::open`](crate::SqliteStore::open) opens the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqliteOptions {
    /// When a commit reaches the disk.
    pub synchronous: Synchronous,
    /// Read-only connections for lookups, listings and searches (1 to 64). Reads in WAL mode
    /// never wait for the writer, so more readers than cores only adds threads.
    pub readers: u32,
    /// How long a connection waits for a lock another one holds before failing as
    /// `Unavailable`. With one writer only checkpoints and other processes take locks.
    pub busy_timeout: Duration,
    /// Whether the store takes an exclusive lock on a file beside the database
    /// (`<file>.lock`) for as long as it is open, so that a second store on the same file, in
    /// this process or another, is refused at open ([`SqliteError::Locked`]) rather than left to
    /// share the writer lock with the first.
    pub lock: bool,
    /// The largest the database file may grow, in bytes (SQLite's `max_page_count`); `None`:
    /// as large as the disk allows. A cap below the disk's free space keeps a flood from filling
    /// the disk the rest of the machine needs. Room is kept for the queued jobs' next attempt
    /// records and a last eighth for writes in flight: new events are refused as `Unavailable`
    /// in front of it while deliveries and retention write on, and retention frees delivered
    /// history beyond its bounds as the file nears it (the crate's `space` module). Nothing a
    /// delivery waits for is deleted, and nothing committed is lost.
    pub max_size_bytes: Option<u64>,
    /// How much of the log [`LogStore::maintain`](sheaf_store::LogStore::maintain) keeps.
    pub retention: LogRetention,
    /// The write coalescer's bounds: every write of every store is one operation in a flush, and
    /// each flush is one transaction. `max_records` counts operations.
    pub write: WriteConfig,
}

impl Default for SqliteOptions {
    /// - `synchronous`: [`Synchronous::Normal`], WAL's usual pairing (see there).
    /// - `readers`: 4, two per core on the 2-core machine the suites and benches run on.
    /// - `busy_timeout`: 5 s, the driver's default.
    /// - `lock`: on.
    /// - `max_size_bytes`: none.
    /// - `retention`: [`LogRetention::default`], the memory log's.
    /// - `write`: at most 1,024 operations and 16 MiB per flush, no added wait (`max_wait` 0):
    ///   the worker writes what queued while the previous flush ran, so an idle store commits
    ///   each write at once and a busy one commits many per transaction, as group commit does.
    fn default() -> Self {
        SqliteOptions {
            synchronous: Synchronous::Normal,
            readers: 4,
            busy_timeout: Duration::from_secs(5),
            lock: true,
            max_size_bytes: None,
            retention: LogRetention::default(),
            write: WriteConfig {
                max_records: 1024,
                max_bytes: 16 * 1024 * 1024,
                max_wait: Duration::ZERO,
                queue_depth: 1024,
            },
        }
    }
}

impl SqliteOptions {
    /// [`SqliteError::InvalidOption`] naming the first field that cannot work.
    pub fn validate(&self) -> Result<(), SqliteError> {
        if !(1..=64).contains(&self.readers) {
            return Err(SqliteError::InvalidOption(format!(
                "readers must be 1 to 64, got {}",
                self.readers
            )));
        }
        if self.max_size_bytes.is_some_and(|bytes| bytes < 1024 * 1024) {
            return Err(SqliteError::InvalidOption(format!(
                "max_size_bytes must be at least 1 MiB, got {:?}",
                self.max_size_bytes
            )));
        }
        self.write
            .validate()
            .map_err(|e| SqliteError::InvalidOption(e.to_string()))
    }

    /// Opens the writer connection on the file `path` (created, in WAL mode and migrated by
    /// then), with the settings [`Self::connect`] gives the readers and the size cap, counted in
    /// pages.
    pub(crate) fn open_writer(
        &self,
        path: &std::path::Path,
    ) -> rusqlite::Result<rusqlite::Connection> {
        use rusqlite::OpenFlags;
        let connection = rusqlite::Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        connection.busy_timeout(self.busy_timeout)?;
        connection.pragma_update(None, "synchronous", self.synchronous.pragma())?;
        connection.pragma_update(None, "foreign_keys", "ON")?;
        // Both answer with their new value, which a plain update would refuse as a result.
        connection.pragma_update_and_check(
            None,
            "journal_size_limit",
            JOURNAL_SIZE_LIMIT,
            |_| Ok(()),
        )?;
        if let Some(bytes) = self.max_size_bytes {
            let pages = i64::try_from(bytes / crate::space::PAGE_BYTES).unwrap_or(i64::MAX);
            connection.pragma_update_and_check(None, "max_page_count", pages, |_| Ok(()))?;
        }
        // Every statement the stores write with stays prepared.
        connection.set_prepared_statement_cache_capacity(128);
        Ok(connection)
    }

    pub(crate) fn connect(&self, path: &std::path::Path) -> sqlx::sqlite::SqliteConnectOptions {
        sqlx::sqlite::SqliteConnectOptions::new()
            .filename(path)
            .busy_timeout(self.busy_timeout)
            .synchronous(self.synchronous.to_sqlx())
            .foreign_keys(true)
            .pragma("journal_size_limit", JOURNAL_SIZE_LIMIT.to_string())
    }
}
