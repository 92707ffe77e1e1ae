//! [`Db`]: the pool and the schema every store of one [`crate::PostgresStores`] shares, and small
//! helpers the stores use to bind and read values.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use sheaf_store::{Result, Timestamp};
use sqlx::PgPool;
use sqlx::postgres::PgRow;

use crate::error::{decode, from_sqlx};

/// A pool and the quoted schema name that prefixes every table in every statement.
///
/// Qualifying tables, instead of setting `search_path` per connection, keeps statements
/// independent of session state: a prepared statement can never resolve to another schema's
/// table, and nothing depends on a connection-level setting a pooler might drop.
#[derive(Debug, Clone)]
pub(crate) struct Db {
    pub(crate) pool: PgPool,
    schema: Arc<str>,
}

impl Db {
    /// `schema` must be validated (see `PostgresConfig::validate`).
    pub(crate) fn new(pool: PgPool, schema: &str) -> Self {
        Db {
            pool,
            schema: Arc::from(format!("\"{schema}\"")),
        }
    }

    /// The quoted schema, e.g. `"sheaf"`, for `format!`ing statements.
    pub(crate) fn schema(&self) -> &str {
        &self.schema
    }

    /// `SELECT 1`, for readiness checks.
    pub(crate) async fn ping(&self, what: &str) -> Result<()> {
        sqlx::query("SELECT 1")
            .execute(&self.pool)
            .await
            .map(|_| ())
            .map_err(|e| from_sqlx(&format!("pinging the {what}"), e))
    }
}

/// A statement planned anew at every execution, for the values and the table sizes of that
/// moment: for statements over the tables whose size swings (the queue's `jobs`, the outbox).
///
/// sqlx prepares a statement once per connection, and after five executions Postgres may keep
/// one generic plan, costed with the statistics of that moment, until the next ANALYZE. `jobs`
/// swings from empty to a backlog of 100,000 rows within a minute: a completion planned while
/// it was nearly empty (a hash join over a sequential scan) then read the whole table for every
/// batch, 1.3–1.7 s per 256 jobs at a steady 2,000 events/s (`cargo xtask bench delivery`), and
/// the completer fell behind for good. Sent unnamed, the statement is parsed and planned each
/// time (about a tenth of a millisecond for these, small beside a batch). Statements whose plan
/// does not depend on such a table (the accept's inserts, for one, which costs ~0.9 ms to plan)
/// stay prepared.
pub(crate) fn planned_each_time(sql: &str) -> PgQuery<'_> {
    sqlx::query(sql).persistent(false)
}

/// A query with its arguments still to bind.
pub(crate) type PgQuery<'q> = sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>;

/// Reads column `name` of `row`, as a store error on failure.
pub(crate) fn get<'r, T>(row: &'r PgRow, name: &str) -> Result<T>
where
    T: sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    sqlx::Row::try_get(row, name).map_err(|e| from_sqlx(&format!("reading column {name}"), e))
}

/// Reads a `timestamptz` column as a [`Timestamp`] (Postgres keeps microseconds, as it does).
pub(crate) fn get_time(row: &PgRow, name: &str) -> Result<Timestamp> {
    get::<DateTime<Utc>>(row, name).map(Timestamp::from)
}

/// Reads a nullable `timestamptz` column.
pub(crate) fn get_opt_time(row: &PgRow, name: &str) -> Result<Option<Timestamp>> {
    get::<Option<DateTime<Utc>>>(row, name).map(|t| t.map(Timestamp::from))
}

/// Reads a `bigint` column that holds a `u32`.
pub(crate) fn get_u32(row: &PgRow, name: &str) -> Result<u32> {
    let value: i64 = get(row, name)?;
    u32::try_from(value).map_err(|_| decode(&format!("reading column {name}"), value))
}

/// Postgres `text` cannot hold NUL. Free-form strings that come from outside (a destination's
/// response body, an error message, a reason) have it replaced by U+FFFD, so one odd response
/// cannot fail a whole write batch; everything else is kept exactly.
pub(crate) fn pg_text(s: &str) -> String {
    s.replace('\0', "\u{FFFD}")
}

/// Microseconds in a lease, for `$n * interval '1 microsecond'` (exact, unlike float seconds).
/// Leases are validated to at most a year, so this never saturates in practice.
pub(crate) fn micros(duration: std::time::Duration) -> i64 {
    i64::try_from(duration.as_micros()).unwrap_or(i64::MAX)
}
