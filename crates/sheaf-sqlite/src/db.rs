//! [`Db`]: the reader pool, the writer and the file every store of one [`crate::SqliteStore`]
//! shares, and small helpers to bind and read values.
//!
//! Values are stored so that SQLite's own comparisons match the stores' orders: times as
//! INTEGER microseconds since the epoch (sheaf_store's `Timestamp` precision), ids as TEXT, which
//! SQLite compares bytewise (its default BINARY collation), and UUIDs as their canonical
//! lower-case text, whose order is their bytes' order (sheaf_store's `ids` docs).

use std::path::PathBuf;
use std::sync::Arc;

use sheaf_store::{Result, Timestamp};
use sqlx::SqlitePool;
use sqlx::sqlite::SqliteRow;
use uuid::Uuid;

use crate::error::{decode, from_sqlx};
use crate::space::Space;
use crate::writer::Writer;

/// What the stores share. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Db {
    pub(crate) readers: SqlitePool,
    pub(crate) writer: Writer,
    pub(crate) path: Arc<PathBuf>,
    /// The lock file, held while the store is open (`SqliteOptions::lock`); `close` lets go.
    pub(crate) lock: Arc<std::sync::Mutex<Option<std::fs::File>>>,
    /// The size cap's door, when the file has a cap (`SqliteOptions::max_size_bytes`).
    pub(crate) space: Option<Arc<Space>>,
}

impl Db {
    pub(crate) fn new(
        readers: SqlitePool,
        writer: Writer,
        path: PathBuf,
        lock: Option<std::fs::File>,
        space: Option<Arc<Space>>,
    ) -> Self {
        Db {
            readers,
            writer,
            path: Arc::new(path),
            lock: Arc::new(std::sync::Mutex::new(lock)),
            space,
        }
    }

    /// `Ok` unless the size cap's door is shut to new events (`space.rs`).
    pub(crate) fn admit(&self, doing: &str) -> Result<()> {
        self.space
            .as_ref()
            .map_or(Ok(()), |space| space.admit(doing))
    }

    /// How many pages retention should free beyond its bounds (`space.rs`); 0 without a cap.
    pub(crate) fn pressure(&self) -> i64 {
        self.space.as_ref().map_or(0, |space| space.pressure())
    }

    /// `SELECT 1` on a reader, for readiness checks.
    pub(crate) async fn ping(&self, what: &str) -> Result<()> {
        sqlx::query("SELECT 1")
            .execute(&self.readers)
            .await
            .map(|_| ())
            .map_err(|e| from_sqlx(&format!("pinging the {what}"), e))
    }
}

/// Reads column `name` of `row`, as a store error on failure.
pub(crate) fn get<'r, T>(row: &'r SqliteRow, name: &str) -> Result<T>
where
    T: sqlx::Decode<'r, sqlx::Sqlite> + sqlx::Type<sqlx::Sqlite>,
{
    sqlx::Row::try_get(row, name).map_err(|e| from_sqlx(&format!("reading column {name}"), e))
}

/// Reads an INTEGER microseconds column as a [`Timestamp`].
pub(crate) fn get_time(row: &SqliteRow, name: &str) -> Result<Timestamp> {
    let micros: i64 = get(row, name)?;
    Timestamp::from_micros(micros).map_err(|e| decode(&format!("reading column {name}"), e))
}

/// Reads a TEXT UUID column.
pub(crate) fn get_uuid(row: &SqliteRow, name: &str) -> Result<Uuid> {
    let text: String = get(row, name)?;
    Uuid::parse_str(&text).map_err(|e| decode(&format!("reading column {name}"), e))
}

/// Reads an INTEGER column that holds a `u32`.
pub(crate) fn get_u32(row: &SqliteRow, name: &str) -> Result<u32> {
    let value: i64 = get(row, name)?;
    u32::try_from(value).map_err(|_| decode(&format!("reading column {name}"), value))
}

/// A UUID as the text the tables hold.
pub(crate) fn uuid_text(uuid: Uuid) -> String {
    uuid.hyphenated().to_string()
}
