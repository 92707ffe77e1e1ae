//! [`SqliteReplayStore`]: bulk replays in the `replays` table, each write one operation of the
//! writer, leases on the process's clock; a page's progress and its queue work (jobs, removed
//! dead letters) commit together, since the queue is in the same file.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::{Connection, params};
use sheaf_store::{
    Cursor, NewReplay, Replay, ReplayLease, ReplayPage, ReplayProgress, ReplaySaved, ReplayState,
    ReplayStep, ReplayStore, Result, TenantId, Timestamp, validate_job, validate_lease,
    validate_replay_step,
};
use uuid::Uuid;

use crate::db::{Columns, Db, collect, first, get, get_time, get_uuid, uuid_text};
use crate::error::{Doing, decode, from_sqlx};
use crate::queue::{enqueue_on, remove_dead_letters_on};

const COLUMNS: &str = "id, tenant_id, request, state, pages, jobs, dead_letters_removed, \
     skipped, limited, log_store_queries, queue_queries, position, error, started_at, \
     updated_at, finished_at, owner, lease_until, takeovers";

/// The replay store on SQLite. Cheap to clone; every clone shares the connections.
#[derive(Clone)]
pub struct SqliteReplayStore {
    db: Db,
}

impl fmt::Debug for SqliteReplayStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteReplayStore")
            .field("path", &self.db.path)
            .finish_non_exhaustive()
    }
}

impl SqliteReplayStore {
    pub(crate) fn new(db: Db) -> Self {
        SqliteReplayStore { db }
    }
}

fn micros(duration: Duration) -> i64 {
    i64::try_from(duration.as_micros()).unwrap_or(i64::MAX)
}

fn int(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn count(row: &impl Columns, name: &str) -> Result<u64> {
    let value: i64 = get(row, name)?;
    u64::try_from(value).map_err(|_| decode(&format!("reading column {name}"), value))
}

fn opt_time(row: &impl Columns, name: &str) -> Result<Option<Timestamp>> {
    let micros: Option<i64> = get(row, name)?;
    micros
        .map(|m| Timestamp::from_micros(m).map_err(|e| decode(&format!("reading {name}"), e)))
        .transpose()
}

fn replay_from_row(row: &impl Columns) -> Result<Replay> {
    let request: String = get(row, "request")?;
    let state: String = get(row, "state")?;
    let position: Option<String> = get(row, "position")?;
    let owner: Option<String> = get(row, "owner")?;
    let takeovers: i64 = get(row, "takeovers")?;
    Ok(Replay {
        id: get_uuid(row, "id")?,
        tenant_id: TenantId::new(get::<String>(row, "tenant_id")?)?,
        request: serde_json::from_str(&request).map_err(|e| decode("reading a replay", e))?,
        state: ReplayState::parse(&state)?,
        progress: ReplayProgress {
            pages: count(row, "pages")?,
            jobs: count(row, "jobs")?,
            dead_letters_removed: count(row, "dead_letters_removed")?,
            skipped: count(row, "skipped")?,
            limited: get(row, "limited")?,
            log_store_queries: count(row, "log_store_queries")?,
            queue_queries: count(row, "queue_queries")?,
            position: position.as_deref().map(Cursor::decode).transpose()?,
        },
        error: get(row, "error")?,
        started_at: get_time(row, "started_at")?,
        updated_at: get_time(row, "updated_at")?,
        finished_at: opt_time(row, "finished_at")?,
        owner: owner
            .map(|o| Uuid::parse_str(&o).map_err(|e| decode("reading a replay's owner", e)))
            .transpose()?,
        lease_until: opt_time(row, "lease_until")?,
        takeovers: u32::try_from(takeovers).unwrap_or(u32::MAX),
    })
}

/// The replay's lease as the row holds it; a row without one was not stamped by this crate.
fn lease_of(replay: &Replay) -> Result<ReplayLease> {
    match (replay.owner, replay.lease_until) {
        (Some(owner), Some(lease_until)) => Ok(ReplayLease {
            replay_id: replay.id,
            owner,
            lease_until,
        }),
        _ => Err(decode(
            "reading a replay's lease",
            format!("replay {} has no owner", replay.id),
        )),
    }
}

/// `save_replay` on the writer connection. The lease guard is the WHERE clause: running, same
/// owner, same lease end. A renewal ends later than every lease before it on the row, even if
/// the clock went back, and `updated_at` never goes back.
fn save_on(
    connection: &Connection,
    lease: &ReplayLease,
    progress: &ReplayProgress,
    step: &ReplayStep,
) -> Result<ReplaySaved> {
    let (then, renew, error) = match step {
        ReplayStep::Continue { lease } => ("continue", micros(*lease), None),
        ReplayStep::Release => ("release", 0, None),
        ReplayStep::Complete => ("completed", 0, None),
        ReplayStep::Fail { error } => ("failed", 0, Some(error.as_str())),
    };
    let now = Timestamp::now().as_micros();
    let doing = format!("saving replay {}", lease.replay_id);
    let mut statement = connection
        .prepare_cached(
            "UPDATE replays
         SET pages = ?4, jobs = ?5, dead_letters_removed = ?6, skipped = ?7, limited = ?8,
             log_store_queries = ?9, queue_queries = ?10, position = ?14,
             updated_at = max(?15, updated_at),
             state = CASE WHEN ?11 IN ('completed', 'failed') THEN ?11 ELSE state END,
             error = CASE WHEN ?11 = 'failed' THEN ?13 ELSE error END,
             finished_at = CASE WHEN ?11 IN ('completed', 'failed')
                                THEN max(?15, updated_at) END,
             owner = CASE WHEN ?11 = 'continue' THEN owner END,
             lease_until = CASE WHEN ?11 = 'continue'
                                THEN max(?15 + ?12, lease_until + 1) END
         WHERE id = ?1 AND state = 'running' AND owner = ?2 AND lease_until = ?3
         RETURNING lease_until",
        )
        .doing(&doing)?;
    let rows = statement
        .query(params![
            uuid_text(lease.replay_id),
            uuid_text(lease.owner),
            lease.lease_until.as_micros(),
            int(progress.pages),
            int(progress.jobs),
            int(progress.dead_letters_removed),
            int(progress.skipped),
            progress.limited,
            int(progress.log_store_queries),
            int(progress.queue_queries),
            then,
            renew,
            error,
            progress.position.as_ref().map(Cursor::encode),
            now,
        ])
        .doing(&doing)?;
    let Some(lease_until) = first(rows, &doing, |row| opt_time(row, "lease_until"))? else {
        return Ok(ReplaySaved::Lost);
    };
    Ok(match lease_until {
        Some(lease_until) if then == "continue" => ReplaySaved::Renewed(ReplayLease {
            lease_until,
            ..*lease
        }),
        _ => ReplaySaved::Ended,
    })
}

#[async_trait]
impl ReplayStore for SqliteReplayStore {
    async fn create_replay(
        &self,
        replay: &NewReplay,
        owner: Uuid,
        lease: Duration,
    ) -> Result<(Replay, ReplayLease)> {
        validate_lease(lease)?;
        let request = serde_json::to_string(&replay.request)
            .map_err(|e| sheaf_store::Error::invalid_input(format!("replay request: {e}")))?;
        let (id, tenant, lease) = (replay.id, replay.tenant_id.clone(), micros(lease));
        self.db
            .writer
            .run("creating a replay", 256 + request.len(), move |c| {
                let doing = format!("creating replay {id}");
                let now = Timestamp::now().as_micros();
                // A taken id fails the primary key: Conflict, whichever tenant holds it.
                let mut statement = c
                    .prepare_cached(&format!(
                        "INSERT INTO replays (id, tenant_id, request, state, started_at,
                                              updated_at, owner, lease_until)
                         VALUES (?1, ?2, ?3, 'running', ?4, ?4, ?5, ?6)
                         RETURNING {COLUMNS}"
                    ))
                    .doing(&doing)?;
                let rows = statement
                    .query(params![
                        uuid_text(id),
                        tenant.as_str(),
                        request,
                        now,
                        uuid_text(owner),
                        now.saturating_add(lease),
                    ])
                    .doing(&doing)?;
                let stored = first(rows, &doing, |row| replay_from_row(row))?
                    .ok_or_else(|| decode(&doing, "the insert returned no row"))?;
                let lease = lease_of(&stored)?;
                Ok((stored, lease))
            })
            .await
    }

    async fn get_replay(&self, tenant: &TenantId, id: Uuid) -> Result<Option<Replay>> {
        sqlx::query(&format!(
            "SELECT {COLUMNS} FROM replays WHERE tenant_id = ?1 AND id = ?2"
        ))
        .bind(tenant.as_str())
        .bind(uuid_text(id))
        .fetch_optional(&self.db.readers)
        .await
        .map_err(|e| from_sqlx(&format!("reading replay {id}"), e))?
        .as_ref()
        .map(replay_from_row)
        .transpose()
    }

    async fn save_replay(
        &self,
        lease: &ReplayLease,
        progress: &ReplayProgress,
        step: &ReplayStep,
    ) -> Result<ReplaySaved> {
        validate_replay_step(step)?;
        let (lease, progress, step) = (*lease, progress.clone(), step.clone());
        self.db
            .writer
            .run("saving a replay", 256, move |c| {
                save_on(c, &lease, &progress, &step)
            })
            .await
    }

    fn commits_queue_work(&self) -> bool {
        true
    }

    async fn save_replay_page(
        &self,
        lease: &ReplayLease,
        progress: &ReplayProgress,
        step: &ReplayStep,
        page: &ReplayPage,
    ) -> Result<(ReplaySaved, u64)> {
        validate_replay_step(step)?;
        for job in &page.jobs {
            validate_job(job)?;
        }
        let (lease, progress, step, page) = (*lease, progress.clone(), step.clone(), page.clone());
        let bytes = 256 + 160 * (page.jobs.len() + page.remove_dead_letters.len());
        self.db
            .writer
            .run("saving a replay's page", bytes, move |c| {
                let doing = format!("saving a page of replay {}", lease.replay_id);
                // The lease is checked first, so nothing of the page is written under a lease
                // that is lost. The writer runs one operation at a time, so no takeover can
                // come between this check and the save.
                let mut statement = c
                    .prepare_cached(
                        "SELECT tenant_id FROM replays
                         WHERE id = ?1 AND state = 'running' AND owner = ?2 AND lease_until = ?3",
                    )
                    .doing(&doing)?;
                let rows = statement
                    .query(params![
                        uuid_text(lease.replay_id),
                        uuid_text(lease.owner),
                        lease.lease_until.as_micros(),
                    ])
                    .doing(&doing)?;
                let Some(tenant) = first(rows, &doing, |row| get::<String>(row, "tenant_id"))?
                else {
                    return Ok((ReplaySaved::Lost, 0));
                };
                let tenant = TenantId::new(tenant)?;
                // Enqueue first, as a caller without this method would: a job whose id is one
                // of the dead letters removed below is still skipped.
                enqueue_on(c, &page.jobs)?;
                let removed = remove_dead_letters_on(c, &tenant, &page.remove_dead_letters)?;
                let progress = ReplayProgress {
                    dead_letters_removed: progress.dead_letters_removed.saturating_add(removed),
                    ..progress
                };
                let saved = save_on(c, &lease, &progress, &step)?;
                Ok((saved, removed))
            })
            .await
    }

    async fn take_over_replays(
        &self,
        owner: Uuid,
        lease: Duration,
        max: usize,
    ) -> Result<Vec<(Replay, ReplayLease)>> {
        validate_lease(lease)?;
        if max == 0 {
            return Ok(Vec::new());
        }
        let (lease, max) = (micros(lease), i64::try_from(max).unwrap_or(i64::MAX));
        self.db
            .writer
            .run("taking over replays", 64, move |c| {
                let doing = "taking over replays";
                let now = Timestamp::now().as_micros();
                let until = now.saturating_add(lease);
                let mut statement = c
                    .prepare_cached(&format!(
                        "UPDATE replays
                         SET owner = ?1, lease_until = max(?3, coalesce(lease_until + 1, ?3)),
                             takeovers = takeovers + 1, updated_at = max(?2, updated_at)
                         WHERE id IN (SELECT id FROM replays
                                      WHERE state = 'running'
                                        AND (lease_until IS NULL OR lease_until < ?2)
                                      ORDER BY started_at, id
                                      LIMIT ?4)
                         RETURNING {COLUMNS}"
                    ))
                    .doing(doing)?;
                let rows = statement
                    .query(params![uuid_text(owner), now, until, max])
                    .doing(doing)?;
                let mut taken = collect(rows, doing, |row| {
                    let replay = replay_from_row(row)?;
                    let lease = lease_of(&replay)?;
                    Ok((replay, lease))
                })?;
                // RETURNING keeps no order.
                taken.sort_by_key(|(r, _)| (r.started_at, r.id));
                Ok(taken)
            })
            .await
    }

    async fn delete_finished_replays(&self, before: Timestamp, max: usize) -> Result<u64> {
        if max == 0 {
            return Ok(0);
        }
        let max = i64::try_from(max).unwrap_or(i64::MAX);
        self.db
            .writer
            .run("deleting finished replays", 64, move |c| {
                let deleted = c
                    .execute(
                        "DELETE FROM replays
                         WHERE id IN (SELECT id FROM replays
                                      WHERE finished_at IS NOT NULL AND finished_at < ?1
                                      ORDER BY finished_at
                                      LIMIT ?2)",
                        params![before.as_micros(), max],
                    )
                    .doing("deleting finished replays")?;
                Ok(deleted as u64)
            })
            .await
    }
}
