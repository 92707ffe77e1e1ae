//! [`SqliteJobQueue`]: the lease queue. A claim is one `UPDATE … RETURNING` in a transaction of
//! the single writer, so concurrent claimers never share a job; every outcome is a batch of
//! short statements in one operation of the writer, each guarded by its lease.
//!
//! Longer than 600 lines because every statement of the queue sits beside the code that binds
//! it, dead letters (held, requeued, removed) included: split, a reader would chase one
//! operation across files.
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
use rusqlite::{Connection, params};
use sheaf_store::{
    ClaimedJob, Cursor, DeadLetter, DeadLetterRequest, DestinationId, EventId, Job, JobId,
    JobQueue, Lease, Page, PageRequest, QueueDepth, Renewed, Reschedule, Result, TenantId,
    Timestamp, validate_job, validate_lease,
};

use crate::db::{Columns, Db, collect, first, get, get_time, get_u32, get_uuid, uuid_text};
use crate::error::{Doing, decode, from_sqlx};

/// The job columns a claim returns and a dead letter keeps.
const JOB_COLUMNS: &str =
    "id, tenant_id, event_id, destination_id, attempt_number, last_attempt_time, order_key";

/// The `next_due_at` of the row of a dead letter that holds its order key: past every claim's
/// bound, so it is never due, and still in `jobs_by_order`, so the key's later jobs wait.
const PARKED: i64 = i64::MAX;

/// The claim: due, unheld jobs in (next_due_at, id) order from the front of `jobs_due`, stamped
/// with the lease, skipping a job of an order key while an earlier one of its key is queued
/// (one probe of `jobs_by_order`, for ordered rows only). `?1` is now, `?2` the new
/// `claimed_until`, `?3` the most jobs. A row's new `claimed_until` is later than its old one
/// whatever the clock did.
const CLAIM: &str = "UPDATE jobs SET claimed_until = max(?2, coalesce(claimed_until + 1, ?2))
     WHERE id IN (SELECT id FROM jobs AS j
                  WHERE next_due_at <= ?1 AND (claimed_until IS NULL OR claimed_until < ?1)
                    AND (order_key IS NULL OR NOT EXISTS (
                         SELECT 1 FROM jobs AS e
                         WHERE e.destination_id = j.destination_id
                           AND e.order_key = j.order_key AND e.order_seq < j.order_seq))
                  ORDER BY next_due_at, id
                  LIMIT ?3)
     RETURNING id, tenant_id, event_id, destination_id, attempt_number, last_attempt_time,
               order_key, next_due_at, claimed_until";

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

fn job_from_row(row: &impl Columns, due_column: &str) -> Result<Job> {
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
        order_key: get(row, "order_key")?,
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

/// Adds one job unless its id is queued or dead-lettered already; `?8` is its `claimed_until`
/// (NULL: not leased), `?9` its order key. A job of an order key comes after the key's queued
/// ones (`order_seq`), and is not leased while one of them is queued.
const INSERT_JOB: &str =
    "INSERT INTO jobs (id, tenant_id, event_id, destination_id, attempt_number,
                                   last_attempt_time, next_due_at, claimed_until, order_key,
                                   order_seq)
     SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7,
            CASE WHEN ?9 IS NOT NULL AND EXISTS (
                      SELECT 1 FROM jobs WHERE destination_id = ?4 AND order_key = ?9)
                 THEN NULL ELSE ?8 END,
            ?9,
            CASE WHEN ?9 IS NULL THEN NULL
                 ELSE (SELECT coalesce(max(order_seq), 0) + 1 FROM jobs
                       WHERE destination_id = ?4 AND order_key = ?9) END
     WHERE NOT EXISTS (SELECT 1 FROM dead_letters WHERE id = ?1)
     ON CONFLICT (id) DO NOTHING
     RETURNING claimed_until";

/// Inserts `job` on the writer connection, leased until `claimed_until` if given and its order
/// key lets it go now; `None` when it was not new (queued or dead-lettered already), else
/// whether it was leased.
pub(crate) fn insert_job(
    connection: &Connection,
    job: &Job,
    claimed_until: Option<Timestamp>,
    doing: &str,
) -> Result<Option<bool>> {
    use rusqlite::OptionalExtension as _;
    let inserted = connection
        .prepare_cached(INSERT_JOB)
        .and_then(|mut statement| {
            statement
                .query_row(
                    params![
                        uuid_text(job.id.as_uuid()),
                        job.tenant_id.as_str(),
                        job.event_id.as_str(),
                        uuid_text(job.destination_id.as_uuid()),
                        i64::from(job.attempt_number),
                        job.last_attempt_time.map(Timestamp::as_micros),
                        job.due_at.as_micros(),
                        claimed_until.map(Timestamp::as_micros),
                        job.order_key.as_deref(),
                    ],
                    |row| row.get::<_, Option<i64>>(0),
                )
                .optional()
        })
        .doing(doing)?;
    Ok(inserted.map(|until| until.is_some()))
}

/// Adds `jobs` on the writer connection: ids already queued or dead-lettered are skipped.
pub(crate) fn enqueue_on(connection: &Connection, jobs: &[Job]) -> Result<()> {
    for job in jobs {
        insert_job(connection, job, None, "enqueueing jobs")?;
    }
    Ok(())
}

/// Runs `sql` once per distinct item through `execute`, which binds the lease (`?1` the job's
/// id, `?2` its `claimed_until`) and the item's own values, and returns the ids it changed no
/// row for: the lost leases, in the caller's order.
fn guarded<T: Clone>(
    connection: &Connection,
    doing: &str,
    sql: &str,
    items: &[T],
    lease_of: impl Fn(&T) -> Lease,
    execute: impl Fn(&mut rusqlite::CachedStatement<'_>, String, i64, &T) -> rusqlite::Result<usize>,
) -> Result<Vec<JobId>> {
    let mut statement = connection.prepare_cached(sql).doing(doing)?;
    let mut lost = Vec::new();
    for item in distinct_by_lease(items, &lease_of) {
        let lease = lease_of(&item);
        let changed = execute(
            &mut statement,
            uuid_text(lease.job_id.as_uuid()),
            lease.claimed_until.as_micros(),
            &item,
        )
        .doing(doing)?;
        if changed == 0 {
            lost.push(lease.job_id);
        }
    }
    Ok(lost)
}

/// Removes finished jobs on the writer connection; returns the lost leases' ids.
pub(crate) fn complete_on(connection: &Connection, leases: &[Lease]) -> Result<Vec<JobId>> {
    guarded(
        connection,
        "completing jobs",
        "DELETE FROM jobs WHERE id = ?1 AND claimed_until = ?2",
        leases,
        |l| *l,
        |statement, id, until, _| statement.execute(params![id, until]),
    )
}

/// Moves held jobs to a new due time on the writer connection; returns the lost leases' ids.
pub(crate) fn reschedule_on(connection: &Connection, jobs: &[Reschedule]) -> Result<Vec<JobId>> {
    guarded(
        connection,
        "rescheduling jobs",
        "UPDATE jobs SET next_due_at = ?3, attempt_number = ?4, last_attempt_time = ?5,
                         claimed_until = NULL
         WHERE id = ?1 AND claimed_until = ?2",
        jobs,
        |r| r.lease,
        |statement, id, until, r| {
            statement.execute(params![
                id,
                until,
                r.due_at.as_micros(),
                i64::from(r.attempt_number),
                r.last_attempt_time.map(Timestamp::as_micros),
            ])
        },
    )
}

/// Moves held jobs to the dead letters on the writer connection; returns the lost leases' ids.
/// A job that holds its key stays in `jobs`, parked (see [`PARKED`]).
pub(crate) fn dead_letter_on(
    connection: &Connection,
    jobs: &[DeadLetterRequest],
) -> Result<Vec<JobId>> {
    let doing = "dead-lettering jobs";
    let now = Timestamp::now().as_micros();
    let mut copy = connection
        .prepare_cached(&format!(
            "INSERT INTO dead_letters ({JOB_COLUMNS}, due_at, reason, dead_lettered_at, holds_key)
             SELECT {JOB_COLUMNS}, next_due_at, ?3, ?4, ?5 AND order_key IS NOT NULL FROM jobs
             WHERE id = ?1 AND claimed_until = ?2
             ON CONFLICT (id) DO NOTHING"
        ))
        .doing(doing)?;
    let mut park = connection
        .prepare_cached(
            "UPDATE jobs SET next_due_at = ?3, claimed_until = NULL
             WHERE id = ?1 AND claimed_until = ?2 AND order_key IS NOT NULL",
        )
        .doing(doing)?;
    let mut delete = connection
        .prepare_cached("DELETE FROM jobs WHERE id = ?1 AND claimed_until = ?2")
        .doing(doing)?;
    let mut lost = Vec::new();
    for request in distinct_by_lease(jobs, |r| r.lease) {
        let lease = request.lease;
        let (id, until) = (
            uuid_text(lease.job_id.as_uuid()),
            lease.claimed_until.as_micros(),
        );
        // Moved, not copied: the delete (or the parking) and the insert commit together.
        copy.execute(params![
            id,
            until,
            request.reason.as_str(),
            now,
            request.hold_key
        ])
        .doing(doing)?;
        let parked = request.hold_key && park.execute(params![id, until, PARKED]).doing(doing)? > 0;
        if !parked && delete.execute(params![id, until]).doing(doing)? == 0 {
            lost.push(lease.job_id);
        }
    }
    Ok(lost)
}

/// Takes these dead letters of `tenant` out of `dead_letters` on the writer connection, with
/// the parked rows of those that held their keys; returns the removed ones' jobs and whether
/// each held its key.
fn take_dead_letters(
    connection: &Connection,
    tenant: &TenantId,
    ids: &[JobId],
    doing: &str,
) -> Result<Vec<(Job, bool)>> {
    use rusqlite::OptionalExtension as _;
    let mut take = connection
        .prepare_cached(&format!(
            "DELETE FROM dead_letters WHERE tenant_id = ?1 AND id = ?2
             RETURNING {JOB_COLUMNS}, due_at, holds_key"
        ))
        .doing(doing)?;
    let mut taken = Vec::new();
    for id in ids.iter().collect::<HashSet<_>>() {
        let row = take
            .query_row(params![tenant.as_str(), uuid_text(id.as_uuid())], |row| {
                Ok((
                    job_from_row(row, "due_at"),
                    row.get::<_, bool>("holds_key")?,
                ))
            })
            .optional()
            .doing(doing)?;
        if let Some((job, holds_key)) = row {
            taken.push((job?, holds_key));
        }
    }
    Ok(taken)
}

/// Removes these dead letters of `tenant` on the writer connection; returns how many. The
/// parked row of one that held its key goes too, which lets the key's next job go.
pub(crate) fn remove_dead_letters_on(
    connection: &Connection,
    tenant: &TenantId,
    ids: &[JobId],
) -> Result<u64> {
    let doing = "removing dead letters";
    let taken = take_dead_letters(connection, tenant, ids, doing)?;
    let mut unpark = connection
        .prepare_cached("DELETE FROM jobs WHERE id = ?1 AND next_due_at = ?2")
        .doing(doing)?;
    for (job, holds_key) in &taken {
        if *holds_key {
            unpark
                .execute(params![uuid_text(job.id.as_uuid()), PARKED])
                .doing(doing)?;
        }
    }
    Ok(taken.len() as u64)
}

/// Puts these dead letters of `tenant` back in the queue on the writer connection, due `now`
/// as attempt 1; returns how many. One that held its key has its parked row moved back to
/// now, in its place; another is enqueued anew.
pub(crate) fn requeue_dead_letters_on(
    connection: &Connection,
    tenant: &TenantId,
    ids: &[JobId],
) -> Result<u64> {
    let doing = "requeueing dead letters";
    let now = Timestamp::now();
    let taken = take_dead_letters(connection, tenant, ids, doing)?;
    let mut unpark = connection
        .prepare_cached(
            "UPDATE jobs SET next_due_at = ?3, attempt_number = 1, last_attempt_time = NULL,
                             claimed_until = NULL
             WHERE id = ?1 AND next_due_at = ?2",
        )
        .doing(doing)?;
    for (job, holds_key) in taken.iter().cloned() {
        if holds_key {
            unpark
                .execute(params![
                    uuid_text(job.id.as_uuid()),
                    PARKED,
                    now.as_micros()
                ])
                .doing(doing)?;
        } else {
            let job = Job {
                attempt_number: 1,
                last_attempt_time: None,
                due_at: now,
                ..job
            };
            insert_job(connection, &job, None, doing)?;
        }
    }
    Ok(taken.len() as u64)
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
                enqueue_on(c, &jobs)
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
                let doing = "claiming jobs";
                // The clock is read when the writer runs the claim, not when it was asked.
                let now = Timestamp::now().as_micros();
                let mut statement = c.prepare_cached(CLAIM).doing(doing)?;
                let rows = statement
                    .query(params![now, now.saturating_add(lease), max])
                    .doing(doing)?;
                let mut claimed = collect(rows, doing, |row| {
                    let job = job_from_row(row, "next_due_at")?;
                    let lease = Lease {
                        job_id: job.id,
                        claimed_until: get_time(row, "claimed_until")?,
                    };
                    Ok(ClaimedJob { job, lease })
                })?;
                // RETURNING keeps no order: hand them out in (due_at, id) order.
                claimed.sort_by_key(|c| (c.job.due_at, c.job.id));
                Ok(claimed)
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
                let doing = "renewing leases";
                let until = Timestamp::now().as_micros().saturating_add(lease);
                let mut statement = c
                    .prepare_cached(
                        "UPDATE jobs SET claimed_until = max(?3, claimed_until + 1)
                         WHERE id = ?1 AND claimed_until = ?2
                         RETURNING claimed_until",
                    )
                    .doing(doing)?;
                let mut renewed = Renewed::default();
                for old in &leases {
                    let rows = statement
                        .query(params![
                            uuid_text(old.job_id.as_uuid()),
                            old.claimed_until.as_micros(),
                            until,
                        ])
                        .doing(doing)?;
                    match first(rows, doing, |row| get_time(row, "claimed_until"))? {
                        Some(claimed_until) => renewed.leases.push(Lease {
                            job_id: old.job_id,
                            claimed_until,
                        }),
                        None => renewed.lost.push(old.job_id),
                    }
                }
                Ok(renewed)
            })
            .await
    }

    async fn complete(&self, leases: &[Lease]) -> Result<Vec<JobId>> {
        let leases = leases.to_vec();
        self.db
            .writer
            .run("completing jobs", 48 * leases.len(), move |c| {
                complete_on(c, &leases)
            })
            .await
    }

    async fn reschedule(&self, jobs: &[Reschedule]) -> Result<Vec<JobId>> {
        let jobs = jobs.to_vec();
        self.db
            .writer
            .run("rescheduling jobs", 80 * jobs.len(), move |c| {
                reschedule_on(c, &jobs)
            })
            .await
    }

    async fn dead_letter(&self, jobs: &[DeadLetterRequest]) -> Result<Vec<JobId>> {
        let jobs = jobs.to_vec();
        self.db
            .writer
            .run("dead-lettering jobs", 256 * jobs.len(), move |c| {
                dead_letter_on(c, &jobs)
            })
            .await
    }

    async fn release(&self, leases: &[Lease]) -> Result<Vec<JobId>> {
        let leases = leases.to_vec();
        self.db
            .writer
            .run("releasing jobs", 48 * leases.len(), move |c| {
                guarded(
                    c,
                    "releasing jobs",
                    "UPDATE jobs SET claimed_until = NULL WHERE id = ?1 AND claimed_until = ?2",
                    &leases,
                    |l| *l,
                    |statement, id, until, _| statement.execute(params![id, until]),
                )
            })
            .await
    }

    async fn depth(&self) -> Result<QueueDepth> {
        let row = sqlx::query(
            // A job behind an earlier one of its order key is not due, whatever its time.
            "SELECT coalesce(sum(claimed_until >= ?1), 0) AS claimed,
                    coalesce(sum((claimed_until IS NULL OR claimed_until < ?1)
                                 AND next_due_at <= ?1 AND NOT behind), 0) AS due,
                    coalesce(sum((claimed_until IS NULL OR claimed_until < ?1)
                                 AND (next_due_at > ?1 OR behind)
                                 AND next_due_at < ?2), 0) AS scheduled,
                    (SELECT count(*) FROM dead_letters) AS dead_lettered
             FROM (SELECT claimed_until, next_due_at,
                          order_key IS NOT NULL AND EXISTS (
                              SELECT 1 FROM jobs AS e
                              WHERE e.destination_id = j.destination_id
                                AND e.order_key = j.order_key
                                AND e.order_seq < j.order_seq) AS behind
                   FROM jobs AS j)",
        )
        .bind(Timestamp::now().as_micros())
        .bind(PARKED)
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
            "SELECT {JOB_COLUMNS}, due_at, reason, dead_lettered_at, holds_key FROM dead_letters
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
                    holds_key: get(row, "holds_key")?,
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
                remove_dead_letters_on(c, &tenant, &ids)
            })
            .await
    }

    async fn requeue_dead_letters(&self, tenant: &TenantId, ids: &[JobId]) -> Result<u64> {
        if ids.is_empty() {
            return Ok(0);
        }
        let (tenant, ids) = (tenant.clone(), ids.to_vec());
        self.db
            .writer
            .run("requeueing dead letters", 160 * ids.len(), move |c| {
                requeue_dead_letters_on(c, &tenant, &ids)
            })
            .await
    }

    async fn purge_tenant(&self, tenant: &TenantId) -> Result<u64> {
        let tenant = tenant.clone();
        self.db
            .writer
            .run("purging a tenant's jobs", 64, move |c| {
                // A parked row is its dead letter's, so it is counted once: as the dead letter.
                let doing = "purging a tenant's jobs";
                c.execute(
                    "DELETE FROM jobs WHERE tenant_id = ?1 AND next_due_at = ?2",
                    params![tenant.as_str(), PARKED],
                )
                .doing(doing)?;
                let mut removed = 0;
                for table in ["jobs", "dead_letters"] {
                    removed += c
                        .execute(
                            &format!("DELETE FROM {table} WHERE tenant_id = ?1"),
                            [tenant.as_str()],
                        )
                        .doing(doing)?;
                }
                Ok(removed as u64)
            })
            .await
    }

    async fn heartbeat(&self, process: uuid::Uuid, ttl: Duration) -> Result<u32> {
        let ttl = micros(ttl);
        self.db
            .writer
            .run("recording a heartbeat", 64, move |c| {
                let doing = "recording a heartbeat";
                let now = Timestamp::now().as_micros();
                let id = uuid_text(process);
                c.execute(
                    "INSERT INTO processes (id, seen_at) VALUES (?1, ?2)
                     ON CONFLICT (id) DO UPDATE SET seen_at = excluded.seen_at",
                    params![id, now],
                )
                .doing(doing)?;
                // Processes that stopped beating are forgotten, so the table stays as small as
                // the number of live processes.
                let since = now.saturating_sub(ttl);
                c.execute("DELETE FROM processes WHERE seen_at < ?1", [since])
                    .doing(doing)?;
                let others: i64 = c
                    .query_row(
                        "SELECT count(*) FROM processes WHERE id <> ?1",
                        [&id],
                        |row| row.get(0),
                    )
                    .doing(doing)?;
                Ok(u32::try_from(others).unwrap_or(u32::MAX).saturating_add(1))
            })
            .await
    }

    async fn ping(&self) -> Result<()> {
        self.db.ping("job queue").await
    }
}
