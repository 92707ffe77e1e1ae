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

use crate::error::{Doing, decode, from_sqlx};
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

/// A value both drivers decode: what the tables' columns hold (integers, text, their options).
pub(crate) trait Value:
    for<'r> sqlx::Decode<'r, sqlx::Sqlite> + sqlx::Type<sqlx::Sqlite> + rusqlite::types::FromSql
{
}

impl<T> Value for T where
    T: for<'r> sqlx::Decode<'r, sqlx::Sqlite> + sqlx::Type<sqlx::Sqlite> + rusqlite::types::FromSql
{
}

/// A row of either driver: the readers' (sqlx) or the writer's (rusqlite), so that one decoder
/// reads a destination, a job or a replay whichever connection returned it.
pub(crate) trait Columns {
    /// Column `name`, as a store error on failure.
    fn column<T: Value>(&self, name: &str) -> Result<T>;
}

impl Columns for SqliteRow {
    fn column<T: Value>(&self, name: &str) -> Result<T> {
        sqlx::Row::try_get(self, name).map_err(|e| from_sqlx(&format!("reading column {name}"), e))
    }
}

impl Columns for rusqlite::Row<'_> {
    fn column<T: Value>(&self, name: &str) -> Result<T> {
        self.get(name).doing(&format!("reading column {name}"))
    }
}

/// Reads column `name` of `row`, as a store error on failure.
pub(crate) fn get<T: Value>(row: &impl Columns, name: &str) -> Result<T> {
    row.column(name)
}

/// Reads an INTEGER microseconds column as a [`Timestamp`].
pub(crate) fn get_time(row: &impl Columns, name: &str) -> Result<Timestamp> {
    let micros: i64 = get(row, name)?;
    Timestamp::from_micros(micros).map_err(|e| decode(&format!("reading column {name}"), e))
}

/// Reads a TEXT UUID column.
pub(crate) fn get_uuid(row: &impl Columns, name: &str) -> Result<Uuid> {
    let text: String = get(row, name)?;
    Uuid::parse_str(&text).map_err(|e| decode(&format!("reading column {name}"), e))
}

/// Reads an INTEGER column that holds a `u32`.
pub(crate) fn get_u32(row: &impl Columns, name: &str) -> Result<u32> {
    let value: i64 = get(row, name)?;
    u32::try_from(value).map_err(|_| decode(&format!("reading column {name}"), value))
}

/// Every row `rows` (the writer's) returns, decoded by `decode`.
pub(crate) fn collect<T>(
    mut rows: rusqlite::Rows<'_>,
    doing: &str,
    mut decode: impl FnMut(&rusqlite::Row<'_>) -> Result<T>,
) -> Result<Vec<T>> {
    let mut decoded = Vec::new();
    while let Some(row) = rows.next().doing(doing)? {
        decoded.push(decode(row)?);
    }
    Ok(decoded)
}

/// The first row `rows` (the writer's) returns, if any, decoded by `decode`.
pub(crate) fn first<T>(
    mut rows: rusqlite::Rows<'_>,
    doing: &str,
    decode: impl FnOnce(&rusqlite::Row<'_>) -> Result<T>,
) -> Result<Option<T>> {
    rows.next().doing(doing)?.map(decode).transpose()
}

/// A UUID as the text the tables hold.
pub(crate) fn uuid_text(uuid: Uuid) -> String {
    uuid.hyphenated().to_string()
}
