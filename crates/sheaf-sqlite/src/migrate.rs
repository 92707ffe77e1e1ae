//! The embedded schema and its migrations, tracked in SQLite's `user_version`.
//!
//! Each migration runs in its own transaction together with the `user_version` it sets, so a file
//! is always at exactly one version: a migration that fails leaves it at the previous one. The
//! first connection `SqliteStore::open` makes runs them, before the writer and the readers open,
//! so nothing reads a half-made schema.

use std::path::Path;

use sqlx::SqliteConnection;

use crate::SqliteError;

/// The migrations, in order; version `i + 1` is `MIGRATIONS[i]`. Never edit one that shipped:
/// add the next.
const MIGRATIONS: &[&str] = &[
    include_str!("../migrations/0001_log.sql"),
    include_str!("../migrations/0002_entities.sql"),
    include_str!("../migrations/0003_queue.sql"),
    include_str!("../migrations/0004_replays.sql"),
    include_str!("../migrations/0005_retention.sql"),
    include_str!("../migrations/0006_jobs_without_rowid.sql"),
    include_str!("../migrations/0007_destination_transform.sql"),
    include_str!("../migrations/0008_job_order.sql"),
    include_str!("../migrations/0009_destination_ordering.sql"),
    include_str!("../migrations/0010_dead_letters_holding_keys.sql"),
];

/// The newest schema version this build knows.
pub(crate) const LATEST: i64 = MIGRATIONS.len() as i64;

/// Applies the migrations the file lacks; returns the versions applied.
pub(crate) async fn run(
    connection: &mut SqliteConnection,
    path: &Path,
) -> Result<Vec<i64>, SqliteError> {
    let failed = |version: i64| {
        move |source: sqlx::Error| SqliteError::Migrate {
            path: path.to_owned(),
            version,
            source,
        }
    };
    let current: i64 = sqlx::query_scalar("PRAGMA user_version")
        .fetch_one(&mut *connection)
        .await
        .map_err(failed(0))?;
    if current > LATEST {
        return Err(SqliteError::TooNew {
            path: path.to_owned(),
            found: current,
            known: LATEST,
        });
    }
    let mut applied = Vec::new();
    for (version, sql) in (1..).zip(MIGRATIONS).skip(current as usize) {
        let script = format!("BEGIN IMMEDIATE; {sql}; PRAGMA user_version = {version}; COMMIT;");
        if let Err(e) = sqlx::raw_sql(&script).execute(&mut *connection).await {
            // Leave no transaction open on the connection; there may be none left to end.
            let _ = sqlx::raw_sql("ROLLBACK").execute(&mut *connection).await;
            return Err(failed(version)(e));
        }
        applied.push(version);
    }
    Ok(applied)
}
