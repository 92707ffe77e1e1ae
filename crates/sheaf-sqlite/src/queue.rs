//! [`SqliteJobQueue`]: the lease queue. A claim is one `UPDATE … RETURNING` in a transaction of
//! the single writer, so concurrent claimers never share a job; every outcome is a batch of
//! short statements in one operation of the writer, each guarded by its lease.
//!
//! # Leases on the process's clock
//!
//! A claim sets `claimed_until = now + lease` with the clock read when the writer runs it, and
//! the pair `(id, claimed_until)` is the lease (sheaf_store's `queue` module docs). An outcome
//! applies only to a row whose id and `claimed_until` both match, so a lease that no longer
//! matches (the job was re-claimed, completed or purged) changes nothing and is reported lost. A
//! new `claimed_until` is always later than the row's old one, so a lease is never handed out
//! twice even if the clock steps back or a renewal asks for a shorter lease.

use std::collections::HashSet;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sheaf_store::{
    ClaimedJob, Cursor, DeadLetter, DeadLetterRequest, DestinationId, EventId, Job, JobId,
    JobQueue, Lease, Page, PageRequest, QueueDepth, Renewed, Reschedule, Result, TenantId,
    Timestamp, validate_job, validate_lease,
};
use sqlx::SqliteConnection;
use sqlx::sqlite::SqliteRow;

use crate::db::{Db, get, get_time, get_u32, get_uuid, uuid_text};
use crate::error::{decode, from_sqlx};

/// The job columns a claim returns and a dead letter keeps.
const JOB_COLUMNS: &str =
    "id, tenant_id, event_id, destination_id, attempt_number, last_attempt_time";

/// The claim: due, unheld jobs in (next_due_at, id) order from the front of `jobs_due`, stamped
/// with the lease. `?1` is now, `?2` the new `claimed_until`, `?3` the most jobs. A row's new
/// `claimed_until` is later than its old one whatever the clock did.
const CLAIM: &str = "UPDATE jobs SET claimed_until = max(?2, coalesce(claimed_until + 1, ?2))
     WHERE id IN (SELECT id FROM jobs
                  WHERE next_due_at <= ?1 AND (claimed_until IS NULL OR claimed_until < ?1)
                  ORDER BY next_due_at, id
                  LIMIT ?3)
     RETURNING id, tenant_id, event_id, destination_id, attempt_number, last_attempt_time,
               next_due_at, claimed_until";

/// The job queue on SQLite. Cheap to clone; every clone shares the connections. Its clock is the
/// process's.
#[derive(Clone)]
pub struct SqliteJobQueue {
    db: Db,
}

impl fmt::Debug for SqliteJobQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteJobQueue")
            .field("path", &self.db.path)
            .finish_non_exhaustive()
    }
}

/// A duration in whole microseconds, saturating (leases are validated to at most a year).
fn micros(duration: Duration) -> i64 {
    i64::try_from(duration.as_micros()).unwrap_or(i64::MAX)
}

fn job_from_row(row: &SqliteRow, due_column: &str) -> Result<Job> {
    let last: Option<i64> = get(row, "last_attempt_time")?;
    Ok(Job {
        id: JobId::from_uuid(get_uuid(row, "id")?),
        tenant_id: TenantId::new(get::<String>(row, "tenant_id")?)?,
        event_id: EventId::new(get::<String>(row, "event_id")?)?,
        destination_id: DestinationId::from_uuid(get_uuid(row, "destination_id")?),
        attempt_number: get_u32(row, "attempt_number")?,
        last_attempt_time: last
            .map(|t| Timestamp::from_micros(t).map_err(|e| decode("reading a job", e)))
            .transpose()?,
        due_at: get_time(row, due_column)?,
    })
}

/// The distinct items by lease (a lease given twice counts once), in the caller's order.
fn distinct_by_lease<T: Clone>(items: &[T], lease_of: impl Fn(&T) -> Lease) -> Vec<T> {
    let mut seen = HashSet::with_capacity(items.len());
    items
        .iter()
        .filter(|item| seen.insert(lease_of(item)))
        .cloned()
        .collect()
}

/// Adds `jobs` on the writer connection: ids already queued or dead-lettered are skipped.
pub(crate) async fn enqueue_on(connection: &mut SqliteConnection, jobs: &[Job]) -> Result<()> {
    for job in jobs {
        sqlx::query(&format!(
            "INSERT INTO jobs ({JOB_COLUMNS}, next_due_at)
             SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7
             WHERE NOT EXISTS (SELECT 1 FROM dead_letters WHERE id = ?1)
             ON CONFLICT (id) DO NOTHING"
        ))
        .bind(uuid_text(job.id.as_uuid()))
        .bind(job.tenant_id.as_str())
        .bind(job.event_id.as_str())
        .bind(uuid_text(job.destination_id.as_uuid()))
        .bind(i64::from(job.attempt_number))
        .bind(job.last_attempt_time.map(Timestamp::as_micros))
        .bind(job.due_at.as_micros())
        .execute(&mut *connection)
        .await
        .map_err(|e| from_sqlx("enqueueing jobs", e))?;
    }
    Ok(())
}

/// Runs `sql` (its first two parameters the lease, then `bind_rest`'s) once per distinct item
/// and returns the ids it changed no row for: the lost leases, in the caller's order.
async fn guarded<T: Clone>(
    connection: &mut SqliteConnection,
    doing: &str,
    sql: &str,
    items: &[T],
    lease_of: impl Fn(&T) -> Lease,
    bind_rest: impl for<'q> Fn(
        sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments<'q>>,
        &'q T,
    ) -> sqlx::query::Query<
        'q,
        sqlx::Sqlite,
        sqlx::sqlite::SqliteArguments<'q>,
    >,
) -> Result<Vec<JobId>> {
    let mut lost = Vec::new();
    for item in distinct_by_lease(items, &lease_of) {
        let lease = lease_of(&item);
        let query = sqlx::query(sql)
            .bind(uuid_text(lease.job_id.as_uuid()))
            .bind(lease.claimed_until.as_micros());
        let done = bind_rest(query, &item)
            .execute(&mut *connection)
            .await
            .map_err(|e| from_sqlx(doing, e))?;
        if done.rows_affected() == 0 {
            lost.push(lease.job_id);
        }
    }
    Ok(lost)
}

/// Removes finished jobs on the writer connection; returns the lost leases' ids.
pub(crate) async fn complete_on(
    connection: &mut SqliteConnection,
    leases: &[Lease],
) -> Result<Vec<JobId>> {
    guarded(
        connection,
        "completing jobs",
        "DELETE FROM jobs WHERE id = ?1 AND claimed_until = ?2",
        leases,
        |l| *l,
        |q, _| q,
    )
    .await
}

/// Moves held jobs to a new due time on the writer connection; returns the lost leases' ids.
pub(crate) async fn reschedule_on(
    connection: &mut SqliteConnection,
    jobs: &[Reschedule],
) -> Result<Vec<JobId>> {
    guarded(
        connection,
        "rescheduling jobs",
        "UPDATE jobs SET next_due_at = ?3, attempt_number = ?4, last_attempt_time = ?5,
                         claimed_until = NULL
         WHERE id = ?1 AND claimed_until = ?2",
        jobs,
        |r| r.lease,
        |q, r| {
            q.bind(r.due_at.as_micros())
                .bind(i64::from(r.attempt_number))
                .bind(r.last_attempt_time.map(Timestamp::as_micros))
        },
    )
    .await
}

/// Moves held jobs to the dead letters on the writer connection; returns the lost leases' ids.
pub(crate) async fn dead_letter_on(
    connection: &mut SqliteConnection,
    jobs: &[DeadLetterRequest],
) -> Result<Vec<JobId>> {
    let now = Timestamp::now().as_micros();
    let mut lost = Vec::new();
    for request in distinct_by_lease(jobs, |r| r.lease) {
        let lease = request.lease;
        // Moved, not copied: the delete and the insert commit together.
        sqlx::query(&format!(
            "INSERT INTO dead_letters ({JOB_COLUMNS}, due_at, reason, dead_lettered_at)
             SELECT {JOB_COLUMNS}, next_due_at, ?3, ?4 FROM jobs
             WHERE id = ?1 AND claimed_until = ?2
             ON CONFLICT (id) DO NOTHING"
        ))
        .bind(uuid_text(lease.job_id.as_uuid()))
        .bind(lease.claimed_until.as_micros())
        .bind(request.reason.as_str())
        .bind(now)
        .execute(&mut *connection)
        .await
        .map_err(|e| from_sqlx("dead-lettering jobs", e))?;
        let deleted = sqlx::query("DELETE FROM jobs WHERE id = ?1 AND claimed_until = ?2")
            .bind(uuid_text(lease.job_id.as_uuid()))
            .bind(lease.claimed_until.as_micros())
            .execute(&mut *connection)
            .await
            .map_err(|e| from_sqlx("dead-lettering jobs", e))?;
        if deleted.rows_affected() == 0 {
            lost.push(lease.job_id);
        }
    }
    Ok(lost)
}

/// Removes these dead letters of `tenant` on the writer connection; returns how many.
pub(crate) async fn remove_dead_letters_on(
    connection: &mut SqliteConnection,
    tenant: &TenantId,
    ids: &[JobId],
) -> Result<u64> {
    let mut removed = 0;
    for id in ids.iter().collect::<HashSet<_>>() {
        removed += sqlx::query("DELETE FROM dead_letters WHERE tenant_id = ?1 AND id = ?2")
            .bind(tenant.as_str())
            .bind(uuid_text(id.as_uuid()))
            .execute(&mut *connection)
            .await
            .map_err(|e| from_sqlx("removing dead letters", e))?
            .rows_affected();
    }
    Ok(removed)
}

impl SqliteJobQueue {
    pub(crate) fn new(db: Db) -> Self {
        SqliteJobQueue { db }
    }
}

#[async_trait]
impl JobQueue for SqliteJobQueue {
    async fn enqueue(&self, jobs: &[Job]) -> Result<()> {
        for job in jobs {
            validate_job(job)?;
        }
        let mut seen = HashSet::with_capacity(jobs.len());
        let jobs: Vec<Job> = jobs.iter().filter(|j| seen.insert(j.id)).cloned().collect();
        if jobs.is_empty() {
            return Ok(());
        }
        self.db.admit("enqueueing jobs")?;
        self.db
            .writer
            .run("enqueueing jobs", 160 * jobs.len(), move |c| {
                Box::pin(async move { enqueue_on(c, &jobs).await })
            })
            .await
    }

    async fn claim(&self, max: usize, lease: Duration) -> Result<Vec<ClaimedJob>> {
        validate_lease(lease)?;
        if max == 0 {
            return Ok(Vec::new());
        }
        let max = i64::try_from(max).unwrap_or(i64::MAX);
        let lease = micros(lease);
        self.db
            .writer
            .run("claiming jobs", 64, move |c| {
                Box::pin(async move {
                    // The clock is read when the writer runs the claim, not when it was asked.
                    let now = Timestamp::now().as_micros();
                    let rows = sqlx::query(CLAIM)
                        .bind(now)
                        .bind(now.saturating_add(lease))
                        .bind(max)
                        .fetch_all(&mut *c)
                        .await
                        .map_err(|e| from_sqlx("claiming jobs", e))?;
                    let mut claimed = rows
                        .iter()
                        .map(|row| {
                            let job = job_from_row(row, "next_due_at")?;
                            let lease = Lease {
                                job_id: job.id,
                                claimed_until: get_time(row, "claimed_until")?,
                            };
                            Ok(ClaimedJob { job, lease })
                        })
                        .collect::<Result<Vec<_>>>()?;
                    // RETURNING keeps no order: hand them out in (due_at, id) order.
                    claimed.sort_by_key(|c| (c.job.due_at, c.job.id));
                    Ok(claimed)
                })
            })
            .await
    }

    async fn renew(&self, leases: &[Lease], lease: Duration) -> Result<Renewed> {
        validate_lease(lease)?;
        let leases = distinct_by_lease(leases, |l| *l);
        if leases.is_empty() {
            return Ok(Renewed::default());
        }
        let lease = micros(lease);
        self.db
            .writer
            .run("renewing leases", 64 * leases.len(), move |c| {
                Box::pin(async move {
                    let until = Timestamp::now().as_micros().saturating_add(lease);
                    let mut renewed = Renewed::default();
                    for old in &leases {
                        let row = sqlx::query(
                            "UPDATE jobs SET claimed_until = max(?3, claimed_until + 1)
                             WHERE id = ?1 AND claimed_until = ?2
                             RETURNING claimed_until",
                        )
                        .bind(uuid_text(old.job_id.as_uuid()))
                        .bind(old.claimed_until.as_micros())
                        .bind(until)
                        .fetch_optional(&mut *c)
                        .await
                        .map_err(|e| from_sqlx("renewing leases", e))?;
                        match row {
                            Some(row) => renewed.leases.push(Lease {
                                job_id: old.job_id,
                                claimed_until: get_time(&row, "claimed_until")?,
                            }),
                            None => renewed.lost.push(old.job_id),
                        }
                    }
                    Ok(renewed)
                })
            })
            .await
    }

    async fn complete(&self, leases: &[Lease]) -> Result<Vec<JobId>> {
        let leases = leases.to_vec();
        self.db
            .writer
            .run("completing jobs", 48 * leases.len(), move |c| {
                Box::pin(async move { complete_on(c, &leases).await })
            })
            .await
    }

    async fn reschedule(&self, jobs: &[Reschedule]) -> Result<Vec<JobId>> {
        let jobs = jobs.to_vec();
        self.db
            .writer
            .run("rescheduling jobs", 80 * jobs.len(), move |c| {
                Box::pin(async move { reschedule_on(c, &jobs).await })
            })
            .await
    }

    async fn dead_letter(&self, jobs: &[DeadLetterRequest]) -> Result<Vec<JobId>> {
        let jobs = jobs.to_vec();
        self.db
            .writer
            .run("dead-lettering jobs", 256 * jobs.len(), move |c| {
                Box::pin(async move { dead_letter_on(c, &jobs).await })
            })
            .await
    }

    async fn release(&self, leases: &[Lease]) -> Result<Vec<JobId>> {
        let leases = leases.to_vec();
        self.db
            .writer
            .run("releasing jobs", 48 * leases.len(), move |c| {
                Box::pin(async move {
                    guarded(
                        c,
                        "releasing jobs",
                        "UPDATE jobs SET claimed_until = NULL WHERE id = ?1 AND claimed_until = ?2",
                        &leases,
                        |l| *l,
                        |q, _| q,
                    )
                    .await
                })
            })
            .await
    }

    async fn depth(&self) -> Result<QueueDepth> {
        let row = sqlx::query(
            "SELECT coalesce(sum(claimed_until >= ?1), 0) AS claimed,
                    coalesce(sum((claimed_until IS NULL OR claimed_until < ?1)
                                 AND next_due_at <= ?1), 0) AS due,
                    coalesce(sum((claimed_until IS NULL OR claimed_until < ?1)
                                 AND next_due_at > ?1), 0) AS scheduled,
                    (SELECT count(*) FROM dead_letters) AS dead_lettered
             FROM jobs",
        )
        .bind(Timestamp::now().as_micros())
        .fetch_one(&self.db.readers)
        .await
        .map_err(|e| from_sqlx("reading the queue's depth", e))?;
        let count = |name: &str| get::<i64>(&row, name).map(|n| u64::try_from(n).unwrap_or(0));
        Ok(QueueDepth {
            due: count("due")?,
            scheduled: count("scheduled")?,
            claimed: count("claimed")?,
            dead_lettered: count("dead_lettered")?,
        })
    }

    async fn list_dead_letters(
        &self,
        tenant: &TenantId,
        page: &PageRequest,
    ) -> Result<Page<DeadLetter>> {
        page.validate()?;
        let cursor = page.cursor_position(JobId::from_str)?;
        let (time, id) = match cursor {
            Some((time, id)) => (Some(time.as_micros()), Some(uuid_text(id.as_uuid()))),
            None => (None, None),
        };
        let rows = sqlx::query(&format!(
            "SELECT {JOB_COLUMNS}, due_at, reason, dead_lettered_at FROM dead_letters
             WHERE tenant_id = ?1 AND (?2 IS NULL OR (dead_lettered_at, id) < (?2, ?3))
             ORDER BY dead_lettered_at DESC, id DESC
             LIMIT ?4"
        ))
        .bind(tenant.as_str())
        .bind(time)
        .bind(id)
        .bind(i64::from(page.limit) + 1)
        .fetch_all(&self.db.readers)
        .await
        .map_err(|e| from_sqlx("listing dead letters", e))?;
        let items = rows
            .iter()
            .map(|row| {
                Ok(DeadLetter {
                    job: job_from_row(row, "due_at")?,
                    reason: get(row, "reason")?,
                    dead_lettered_at: get_time(row, "dead_lettered_at")?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Page::from_overfetch(
            items,
            page.limit_usize(),
            |d: &DeadLetter| Cursor::new(d.dead_lettered_at, d.job.id.to_string()),
        ))
    }

    async fn remove_dead_letters(&self, tenant: &TenantId, ids: &[JobId]) -> Result<u64> {
        if ids.is_empty() {
            return Ok(0);
        }
        let (tenant, ids) = (tenant.clone(), ids.to_vec());
        self.db
            .writer
            .run("removing dead letters", 48 * ids.len(), move |c| {
                Box::pin(async move { remove_dead_letters_on(c, &tenant, &ids).await })
            })
            .await
    }

    async fn purge_tenant(&self, tenant: &TenantId) -> Result<u64> {
        let tenant = tenant.clone();
        self.db
            .writer
            .run("purging a tenant's jobs", 64, move |c| {
                Box::pin(async move {
                    let mut removed = 0;
                    for table in ["jobs", "dead_letters"] {
                        removed +=
                            sqlx::query(&format!("DELETE FROM {table} WHERE tenant_id = ?1"))
                                .bind(tenant.as_str())
                                .execute(&mut *c)
                                .await
                                .map_err(|e| from_sqlx("purging a tenant's jobs", e))?
                                .rows_affected();
                    }
                    Ok(removed)
                })
            })
            .await
    }

    async fn heartbeat(&self, process: uuid::Uuid, ttl: Duration) -> Result<u32> {
        let ttl = micros(ttl);
        self.db
            .writer
            .run("recording a heartbeat", 64, move |c| {
                Box::pin(async move {
                    let now = Timestamp::now().as_micros();
                    let id = uuid_text(process);
                    let fail = |e| from_sqlx("recording a heartbeat", e);
                    sqlx::query(
                        "INSERT INTO processes (id, seen_at) VALUES (?1, ?2)
                         ON CONFLICT (id) DO UPDATE SET seen_at = excluded.seen_at",
                    )
                    .bind(&id)
                    .bind(now)
                    .execute(&mut *c)
                    .await
                    .map_err(fail)?;
                    // Processes that stopped beating are forgotten, so the table stays as
                    // small as the number of live processes.
                    let since = now.saturating_sub(ttl);
                    sqlx::query("DELETE FROM processes WHERE seen_at < ?1")
                        .bind(since)
                        .execute(&mut *c)
                        .await
                        .map_err(fail)?;
                    let others: i64 =
                        sqlx::query_scalar("SELECT count(*) FROM processes WHERE id <> ?1")
                            .bind(&id)
                            .fetch_one(&mut *c)
                            .await
                            .map_err(fail)?;
                    Ok(u32::try_from(others).unwrap_or(u32::MAX).saturating_add(1))
                })
            })
            .await
    }

    async fn ping(&self) -> Result<()> {
        self.db.ping("job queue").await
    }
}
