//! [`LogRetention`] and the upkeep that enforces it: the log's oldest records dropped in
//! batches behind the writer, and the space they leave reused.
//!
//! Each batch is one operation of the writer, so a large backlog of expired records is
//! deleted a thousand rows at a time between other writes, never in one long transaction that
//! would hold every publish behind it. Freed pages go to the file's free list, where new rows
//! reuse them, so a steady flood keeps the file at the size its retention allows; when more
//! than a quarter of the file is free (after a burst), incremental vacuum hands free pages back
//! to the file system. A file that nears its size cap frees more than the bounds ask, oldest
//! first (`space.rs`).

use std::time::Duration;

use rusqlite::{Connection, params};
use sheaf_store::{Result, Timestamp};

use crate::db::{Db, collect, get};
use crate::error::{Doing, decode};

/// What retention's errors say it was doing.
const RETAINING: &str = "enforcing the log's retention";

/// How long and how much of the log the store keeps, as the other backends' settings say.
///
/// The bounds apply to what no delivery waits for: an event a job is queued for is kept, with
/// its attempts, however old it is and however many others there are, so a retry always finds
/// its previous attempt and a delivery its payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogRetention {
    /// Records older than this are dropped, unless held; `None` keeps them until the count
    /// bounds apply.
    pub max_age: Option<Duration>,
    /// At most this many events are kept besides the held ones.
    pub max_events: usize,
    /// At most this many attempts are kept besides those of held events.
    pub max_attempts: usize,
}

impl Default for LogRetention {
    /// The memory log's defaults, so that choosing the durable store changes where the log is
    /// kept, not how much of it: three days, 25,000 events and 100,000 attempts.
    fn default() -> Self {
        LogRetention {
            max_age: Some(Duration::from_secs(3 * 24 * 3600)),
            max_events: 25_000,
            max_attempts: 100_000,
        }
    }
}

/// Rows one retention batch deletes, at most: a few milliseconds of the writer.
const BATCH: i64 = 1000;

/// Batches one `maintain` call runs at most, so upkeep never starves writes for long; the
/// service calls it again seconds later.
const MAX_BATCHES: usize = 20;

/// Pages incremental vacuum hands back per call once the free list is over a quarter of the
/// file (4 MiB at the default page size).
const VACUUM_PAGES: i64 = 1024;

/// An event with a job queued for it is held.
const UNHELD_EVENT: &str = "NOT EXISTS (SELECT 1 FROM jobs AS j WHERE j.tenant_id = e.tenant_id AND j.event_id = e.event_id)";

/// Runs retention until nothing is over its bounds or [`MAX_BATCHES`] ran; returns whether it
/// deleted or vacuumed anything.
pub(crate) async fn enforce(db: &Db, retention: LogRetention) -> Result<bool> {
    let mut did = false;
    for _ in 0..MAX_BATCHES {
        // The pages are read after every flush, so each batch sees what the one before freed.
        let pressure = db.pressure();
        let deleted = db
            .writer
            .run("enforcing the log's retention", 64, move |c| {
                one_batch(c, retention, pressure)
            })
            .await?;
        if deleted == 0 {
            break;
        }
        did = true;
    }
    let space = db.space.clone();
    let vacuumed = db
        .writer
        .run("reusing the log's free space", 64, move |c| {
            let vacuumed = vacuum(c)?;
            if let Some(space) = space {
                space.measure(c, true)?;
            }
            Ok(vacuumed)
        })
        .await?;
    Ok(did || vacuumed)
}

/// Deletes one batch past the bounds: the oldest unheld events over the count, then those past
/// the age (each with its attempts), then the same for attempts; returns how many rows went.
/// Under `pressure` (pages the file should free as it nears its size cap, `space.rs`), at least
/// as many of the oldest unheld events and attempts go as there are pages to free, whatever the
/// counts say: most rows take a page or less, so this rarely frees much more than asked, and
/// the next batch, measured anew, frees the rest.
fn one_batch(connection: &Connection, retention: LogRetention, pressure: i64) -> Result<u64> {
    let at_least = pressure.min(BATCH);
    let cutoff = retention
        .max_age
        .map(|age| Timestamp::now().saturating_sub(age).as_micros());
    let mut deleted = 0;
    // The bounds count what no job holds; the queue is small, so the held are counted from it.
    let over = count(connection, "events")?
        - count_held(connection, "events")?
        - bound(retention.max_events);
    let over = over.max(at_least);
    if over > 0 {
        deleted += delete_events(connection, "1", None, over.min(BATCH))?;
    }
    if let Some(cutoff) = cutoff {
        deleted += delete_events(connection, "e.event_time < ?1", Some(cutoff), BATCH)?;
    }
    let over = count(connection, "attempts")?
        - count_held(connection, "attempts")?
        - bound(retention.max_attempts);
    let over = over.max(at_least);
    if over > 0 {
        deleted += delete_attempts(connection, "1", None, over.min(BATCH))?;
    }
    if let Some(cutoff) = cutoff {
        deleted += delete_attempts(connection, "a.attempt_time < ?1", Some(cutoff), BATCH)?;
    }
    if (deleted as i64) < at_least {
        // Only what deliveries wait for is left to free: the failed attempts a later attempt
        // of the same delivery supersedes (a retry needs only the latest).
        deleted += delete_superseded_attempts(connection, at_least - deleted as i64)?;
    }
    Ok(deleted)
}

/// Deletes up to `limit` of the oldest attempts of held events that a later attempt to the same
/// destination supersedes.
fn delete_superseded_attempts(connection: &Connection, limit: i64) -> Result<u64> {
    let deleted = connection
        .prepare_cached(
            "DELETE FROM attempts WHERE rowid IN (
                 SELECT a.rowid FROM attempts AS a
                 WHERE EXISTS (SELECT 1 FROM jobs AS j
                               WHERE j.tenant_id = a.tenant_id AND j.event_id = a.event_id)
                   AND EXISTS (SELECT 1 FROM attempts AS later
                               WHERE later.tenant_id = a.tenant_id
                                 AND later.event_id = a.event_id
                                 AND later.destination_id = a.destination_id
                                 AND later.attempt_time > a.attempt_time)
                 ORDER BY a.attempt_time
                 LIMIT ?1)",
        )
        .and_then(|mut statement| statement.execute([limit]))
        .doing("freeing space near the size limit")?;
    Ok(deleted as u64)
}

fn bound(max: usize) -> i64 {
    i64::try_from(max).unwrap_or(i64::MAX)
}

/// One integer `sql` answers, as retention's error.
fn scalar(connection: &Connection, sql: &str) -> Result<i64> {
    connection
        .prepare_cached(sql)
        .and_then(|mut statement| statement.query_row([], |row| row.get(0)))
        .doing(RETAINING)
}

fn count(connection: &Connection, table: &str) -> Result<i64> {
    scalar(connection, &format!("SELECT count(*) FROM {table}"))
}

/// Rows of `table` (events or attempts) whose event a job is queued for.
fn count_held(connection: &Connection, table: &str) -> Result<i64> {
    scalar(
        connection,
        &format!(
            "SELECT count(*) FROM (SELECT DISTINCT tenant_id, event_id FROM jobs) AS j
             JOIN {table} AS r ON r.tenant_id = j.tenant_id AND r.event_id = j.event_id"
        ),
    )
}

/// Deletes up to `limit` of the oldest unheld events matching `filter` (`?1` is `cutoff`), and
/// their attempts: what goes when the event goes.
fn delete_events(
    connection: &Connection,
    filter: &str,
    cutoff: Option<i64>,
    limit: i64,
) -> Result<u64> {
    let mut statement = connection
        .prepare_cached(&format!(
            "DELETE FROM events WHERE rowid IN (
                 SELECT e.rowid FROM events AS e
                 WHERE {filter} AND {UNHELD_EVENT}
                 ORDER BY e.event_time
                 LIMIT ?2)
             RETURNING tenant_id, event_id"
        ))
        .doing(RETAINING)?;
    let rows = statement.query(params![cutoff, limit]).doing(RETAINING)?;
    let gone: Vec<(String, String)> = collect(rows, RETAINING, |row| {
        Ok((get(row, "tenant_id")?, get(row, "event_id")?))
    })?;
    if gone.is_empty() {
        return Ok(0);
    }
    // Their attempts in one statement, keyed by a JSON array of the events.
    let keys = serde_json::to_string(&gone).map_err(|e| decode(RETAINING, e))?;
    let attempts = connection
        .prepare_cached(
            "DELETE FROM attempts WHERE (tenant_id, event_id) IN (
                 SELECT value ->> 0, value ->> 1 FROM json_each(?1))",
        )
        .and_then(|mut statement| statement.execute([keys]))
        .doing(RETAINING)?;
    Ok((gone.len() + attempts) as u64)
}

/// Deletes up to `limit` of the oldest attempts of unheld events matching `filter` (`?1` is
/// `cutoff`).
fn delete_attempts(
    connection: &Connection,
    filter: &str,
    cutoff: Option<i64>,
    limit: i64,
) -> Result<u64> {
    let deleted = connection
        .prepare_cached(&format!(
            "DELETE FROM attempts WHERE rowid IN (
                 SELECT a.rowid FROM attempts AS a
                 WHERE {filter}
                   AND NOT EXISTS (SELECT 1 FROM jobs AS j
                                   WHERE j.tenant_id = a.tenant_id AND j.event_id = a.event_id)
                 ORDER BY a.attempt_time
                 LIMIT ?2)"
        ))
        .and_then(|mut statement| statement.execute(params![cutoff, limit]))
        .doing(RETAINING)?;
    Ok(deleted as u64)
}

/// Hands free pages back to the file system once they are over a quarter of the file; returns
/// whether it did.
fn vacuum(connection: &Connection) -> Result<bool> {
    let doing = "reusing the log's free space";
    let free = scalar(connection, "PRAGMA freelist_count")?;
    let pages = scalar(connection, "PRAGMA page_count")?;
    if free * 4 <= pages {
        return Ok(false);
    }
    // Stepped until it is done, whatever it answers: the pragma frees its pages as it runs.
    let mut statement = connection
        .prepare_cached(&format!("PRAGMA incremental_vacuum({VACUUM_PAGES})"))
        .doing(doing)?;
    let mut rows = statement.query([]).doing(doing)?;
    while rows.next().doing(doing)?.is_some() {}
    Ok(true)
}
