//! [`PostgresReplayStore`]: bulk replays in the `replays` table (`migrations/0009_replays.sql`),
//! each call one statement, leases on the server's clock; a page's progress and its queue work
//! (jobs, removed dead letters) in one short transaction with the queue beside it.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sheaf_store::{
    Cursor, NewReplay, Replay, ReplayLease, ReplayPage, ReplayProgress, ReplaySaved, ReplayState,
    ReplayStep, ReplayStore, Result, TenantId, Timestamp, validate_job, validate_lease,
    validate_replay_step,
};
use sqlx::postgres::PgRow;
use sqlx::types::Json;
use uuid::Uuid;

use crate::db::{Db, get, get_opt_time, get_time, micros, pg_text};
use crate::error::{decode, from_sqlx};
use crate::queue::PostgresJobQueue;

const COLUMNS: &str = "id, tenant_id, request, state, pages, jobs, dead_letters_removed, \
     skipped, limited, log_store_queries, queue_queries, position, error, started_at, \
     updated_at, finished_at, owner, lease_until, takeovers";

#[derive(Debug)]
struct Statements {
    create: String,
    get: String,
    hold: String,
    save: String,
    take_over: String,
    delete_finished: String,
}

impl Statements {
    fn new(s: &str) -> Self {
        // A renewal or takeover ends later than every lease before it on the row, even if the
        // server's clock went back: that is what makes the old lease lost.
        let lease_end = |p: usize| {
            format!(
                "GREATEST(now() + ${p}::bigint * interval '1 microsecond', \
                          r.lease_until + interval '1 microsecond')"
            )
        };
        Statements {
            // A taken id fails the primary key: Conflict, whichever tenant holds it.
            create: format!(
                "INSERT INTO {s}.replays AS r (id, tenant_id, request, state, started_at,
                                              updated_at, owner, lease_until)
                 VALUES ($1, $2, $3, 'running', now(), now(), $4,
                         now() + $5::bigint * interval '1 microsecond')
                 RETURNING {COLUMNS}"
            ),
            get: format!("SELECT {COLUMNS} FROM {s}.replays WHERE tenant_id = $1 AND id = $2"),
            // A page's transaction checks the lease first and locks the row, so nothing of the
            // page is written under a lease that is lost, and a takeover waits for the commit.
            hold: format!(
                "SELECT tenant_id FROM {s}.replays
                 WHERE id = $1 AND state = 'running' AND owner = $2 AND lease_until = $3
                 FOR UPDATE"
            ),
            // The lease guard is the WHERE clause: running, same owner, same lease end. $11 says
            // what follows: 'continue' (renew by $12 µs), 'release', 'completed' or 'failed'
            // (with the error, $13). `updated_at` never goes back.
            save: format!(
                "UPDATE {s}.replays AS r
                 SET pages = $4, jobs = $5, dead_letters_removed = $6, skipped = $7,
                     limited = $8, log_store_queries = $9, queue_queries = $10, position = $14,
                     updated_at = GREATEST(now(), r.updated_at),
                     state = CASE WHEN $11 IN ('completed', 'failed') THEN $11 ELSE r.state END,
                     error = CASE WHEN $11 = 'failed' THEN $13 ELSE r.error END,
                     finished_at = CASE WHEN $11 IN ('completed', 'failed')
                                        THEN GREATEST(now(), r.updated_at) END,
                     owner = CASE WHEN $11 = 'continue' THEN r.owner END,
                     lease_until = CASE WHEN $11 = 'continue' THEN {} END
                 WHERE r.id = $1 AND r.state = 'running' AND r.owner = $2
                   AND r.lease_until = $3
                 RETURNING r.lease_until",
                lease_end(12)
            ),
            // Like the queue's claim: pick free running rows oldest first through the partial
            // index, skip rows another takeover has locked, stamp the new owner and lease.
            take_over: format!(
                "UPDATE {s}.replays AS r
                 SET owner = $1, lease_until = {}, takeovers = r.takeovers + 1,
                     updated_at = GREATEST(now(), r.updated_at)
                 WHERE r.id IN (SELECT id FROM {s}.replays
                                WHERE state = 'running'
                                  AND (lease_until IS NULL OR lease_until < now())
                                ORDER BY started_at, id
                                LIMIT $3
                                FOR UPDATE SKIP LOCKED)
                 RETURNING {COLUMNS}",
                lease_end(2)
            ),
            delete_finished: format!(
                "DELETE FROM {s}.replays
                 WHERE id IN (SELECT id FROM {s}.replays
                              WHERE finished_at IS NOT NULL AND finished_at < $1
                              ORDER BY finished_at
                              LIMIT $2
                              FOR UPDATE SKIP LOCKED)"
            ),
        }
    }
}

/// The replay store on Postgres. Cheap to clone; every clone shares the pool.
#[derive(Clone)]
pub struct PostgresReplayStore {
    db: Db,
    sql: Arc<Statements>,
    /// The queue in the same schema, whose statements a page's transaction runs.
    queue: PostgresJobQueue,
}

impl fmt::Debug for PostgresReplayStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresReplayStore")
            .field("schema", &self.db.schema())
            .finish_non_exhaustive()
    }
}

impl PostgresReplayStore {
    pub(crate) fn new(db: Db, queue: PostgresJobQueue) -> Self {
        let sql = Arc::new(Statements::new(db.schema()));
        PostgresReplayStore { db, sql, queue }
    }

    /// [`ReplayStore::save_replay`] on `exec` (the pool, or a page's transaction).
    async fn save_with<'e>(
        &self,
        exec: impl sqlx::PgExecutor<'e>,
        lease: &ReplayLease,
        progress: &ReplayProgress,
        step: &ReplayStep,
    ) -> Result<ReplaySaved> {
        let (then, renew, error) = match step {
            ReplayStep::Continue { lease } => ("continue", micros(*lease), None),
            ReplayStep::Release => ("release", 0, None),
            ReplayStep::Complete => ("completed", 0, None),
            ReplayStep::Fail { error } => ("failed", 0, Some(pg_text(error))),
        };
        let row = sqlx::query(&self.sql.save)
            .bind(lease.replay_id)
            .bind(lease.owner)
            .bind(lease.lease_until.as_datetime())
            .bind(bigint(progress.pages))
            .bind(bigint(progress.jobs))
            .bind(bigint(progress.dead_letters_removed))
            .bind(bigint(progress.skipped))
            .bind(progress.limited)
            .bind(bigint(progress.log_store_queries))
            .bind(bigint(progress.queue_queries))
            .bind(then)
            .bind(renew)
            .bind(error)
            .bind(progress.position.as_ref().map(Cursor::encode))
            .fetch_optional(exec)
            .await
            .map_err(|e| from_sqlx(&format!("saving replay {}", lease.replay_id), e))?;
        let Some(row) = row else {
            return Ok(ReplaySaved::Lost);
        };
        Ok(match get_opt_time(&row, "lease_until")? {
            Some(lease_until) if then == "continue" => ReplaySaved::Renewed(ReplayLease {
                lease_until,
                ..*lease
            }),
            _ => ReplaySaved::Ended,
        })
    }
}

fn count(row: &PgRow, name: &str) -> Result<u64> {
    let value: i64 = get(row, name)?;
    u64::try_from(value).map_err(|_| decode(&format!("reading column {name}"), value))
}

fn bigint(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn replay_from_row(row: &PgRow) -> Result<Replay> {
    let request: Json<serde_json::Value> = get(row, "request")?;
    let state: String = get(row, "state")?;
    let position: Option<String> = get(row, "position")?;
    let takeovers: i64 = get(row, "takeovers")?;
    Ok(Replay {
        id: get(row, "id")?,
        tenant_id: TenantId::new(get::<String>(row, "tenant_id")?)?,
        request: request.0,
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
        finished_at: get_opt_time(row, "finished_at")?,
        owner: get(row, "owner")?,
        lease_until: get_opt_time(row, "lease_until")?,
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

#[async_trait]
impl ReplayStore for PostgresReplayStore {
    async fn create_replay(
        &self,
        replay: &NewReplay,
        owner: Uuid,
        lease: Duration,
    ) -> Result<(Replay, ReplayLease)> {
        validate_lease(lease)?;
        let row = sqlx::query(&self.sql.create)
            .bind(replay.id)
            .bind(replay.tenant_id.as_str())
            .bind(Json(&replay.request))
            .bind(owner)
            .bind(micros(lease))
            .fetch_one(&self.db.pool)
            .await
            .map_err(|e| from_sqlx(&format!("creating replay {}", replay.id), e))?;
        let stored = replay_from_row(&row)?;
        let lease = lease_of(&stored)?;
        Ok((stored, lease))
    }

    async fn get_replay(&self, tenant: &TenantId, id: Uuid) -> Result<Option<Replay>> {
        sqlx::query(&self.sql.get)
            .bind(tenant.as_str())
            .bind(id)
            .fetch_optional(&self.db.pool)
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
        self.save_with(&self.db.pool, lease, progress, step).await
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
        let doing = format!("saving a page of replay {}", lease.replay_id);
        let mut tx = self
            .db
            .pool
            .begin()
            .await
            .map_err(|e| from_sqlx(&doing, e))?;
        let tenant: Option<String> = sqlx::query_scalar(&self.sql.hold)
            .bind(lease.replay_id)
            .bind(lease.owner)
            .bind(lease.lease_until.as_datetime())
            .fetch_optional(&mut *tx)
            .await
            .map_err(|e| from_sqlx(&doing, e))?;
        // Dropping the transaction rolls it back: a lost lease writes nothing.
        let Some(tenant) = tenant else {
            return Ok((ReplaySaved::Lost, 0));
        };
        let tenant = TenantId::new(tenant)?;
        // Enqueue first, as a caller without this method would: a job whose id is one of the
        // dead letters removed below is still skipped.
        self.queue.enqueue_with(&mut tx, &page.jobs).await?;
        let removed = self
            .queue
            .remove_dead_letters_with(&mut *tx, &tenant, &page.remove_dead_letters)
            .await?;
        let progress = ReplayProgress {
            dead_letters_removed: progress.dead_letters_removed.saturating_add(removed),
            ..progress.clone()
        };
        let saved = self.save_with(&mut *tx, lease, &progress, step).await?;
        tx.commit().await.map_err(|e| from_sqlx(&doing, e))?;
        Ok((saved, removed))
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
        let rows = sqlx::query(&self.sql.take_over)
            .bind(owner)
            .bind(micros(lease))
            .bind(i64::try_from(max).unwrap_or(i64::MAX))
            .fetch_all(&self.db.pool)
            .await
            .map_err(|e| from_sqlx("taking over replays", e))?;
        // UPDATE … RETURNING does not keep the subquery's order.
        let mut taken = rows
            .iter()
            .map(|row| {
                let replay = replay_from_row(row)?;
                let lease = lease_of(&replay)?;
                Ok((replay, lease))
            })
            .collect::<Result<Vec<_>>>()?;
        taken.sort_by_key(|(r, _)| (r.started_at, r.id));
        Ok(taken)
    }

    async fn delete_finished_replays(&self, before: Timestamp, max: usize) -> Result<u64> {
        if max == 0 {
            return Ok(0);
        }
        let done = sqlx::query(&self.sql.delete_finished)
            .bind(before.as_datetime())
            .bind(i64::try_from(max).unwrap_or(i64::MAX))
            .execute(&self.db.pool)
            .await
            .map_err(|e| from_sqlx("deleting finished replays", e))?;
        Ok(done.rows_affected())
    }
}
