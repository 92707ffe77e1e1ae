//! [`PostgresJobQueue`]: the lease queue. Minimal job rows, a single-statement claim with
//! `FOR UPDATE SKIP LOCKED`, leases instead of held transactions, and every outcome one statement
//! per batch, guarded by the lease.
//!
//! Longer than 600 lines because every statement of the queue sits beside the code that binds
//! its arrays and reads its rows, and the outcomes have variants that run inside an outbox's
//! transaction; splitting them would put a statement's columns and their use in two files.
//!
//! # Leases on the server's clock
//!
//! A claim sets `claimed_until = now() + lease` with the database's `now()`, and the pair
//! `(id, claimed_until)` is the lease (sheaf_store's `queue` module docs). Every outcome joins its
//! batch of leases (arrays, `unnest`) to the job rows on **both** columns, so a lease that no
//! longer matches (the job was re-claimed, completed or purged) changes nothing, and the ids it
//! did not touch are reported lost. A new `claimed_until` is always later than the row's old one
//! (`GREATEST(now() + lease, claimed_until + 1 µs)`), so a lease is never handed out twice even if
//! the server's clock steps back or a renewal asks for a shorter lease.
//!
//! # What stays HOT
//!
//! Claims, renewals and releases write only `claimed_until`, which is in no index: they are HOT
//! updates (the table has `fillfactor = 80`). Reschedules move the indexed `next_due_at` and are
//! not; completions and dead letters delete the row.
//!
//! Nothing here opens a transaction: each call is one statement, so no lock or snapshot is held
//! while a job's work runs, and no savepoint ever mints a MultiXact. That matters because a row
//! locked by a transaction and its savepoint carries a MultiXact, which every `SKIP LOCKED` claim
//! walking past the row must look up behind one lightweight lock: the savepoint design's throughput
//! stops growing with workers (docs/benchmarks.md, "queue").

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sheaf_store::{
    ClaimedJob, Cursor, DeadLetter, DeadLetterRequest, DestinationId, EventId, Job, JobId,
    JobQueue, Lease, Page, PageRequest, QueueDepth, Renewed, Reschedule, Result, TenantId,
    Timestamp, validate_job, validate_lease,
};
use sqlx::postgres::PgRow;

use crate::db::{
    Db, PgQuery, get, get_opt_time, get_time, get_u32, micros, pg_text, planned_each_time,
};
use crate::error::from_sqlx;

/// The job columns a claim returns and a dead letter keeps.
pub(crate) const JOB_COLUMNS: &str =
    "id, tenant_id, event_id, destination_id, attempt_number, last_attempt_time, order_key";

/// The columns an insert of jobs writes besides `claimed_until`, in the order of the arrays
/// [`bind_jobs`] and [`bind_order`] bind.
pub(crate) const INSERTED_COLUMNS: &str = "id, tenant_id, event_id, destination_id, \
     attempt_number, last_attempt_time, next_due_at, order_key, order_seq";

/// The `order_seq` of a job `j` being inserted (with `j.order_key` and `j.order_rank`, its place
/// among the key's jobs in the same call): one past the key's highest queued, plus its rank.
/// Correct only after the key's advisory lock was taken by an earlier statement of the
/// transaction ([`order_locks`]): this statement's snapshot then holds every earlier job.
pub(crate) fn order_seq(s: &str) -> String {
    format!(
        "CASE WHEN j.order_key IS NULL THEN NULL
              ELSE coalesce((SELECT max(e.order_seq) FROM {s}.jobs AS e
                             WHERE e.destination_id = j.destination_id
                               AND e.order_key = j.order_key), 0) + j.order_rank END"
    )
}

/// Takes the advisory locks of the order keys `$1` (sorted, so concurrent transactions take
/// them in the same order), held until the transaction ends.
pub(crate) const LOCK_ORDER_KEYS: &str =
    "SELECT count(pg_advisory_xact_lock(k)) FROM unnest($1::bigint[]) AS k";

/// The lock of each distinct `(destination, order key)` among `jobs`, sorted: a stable 64-bit
/// hash (FNV-1a) of the destination's bytes and the key. Two keys sharing a hash only wait for
/// each other.
pub(crate) fn order_locks<'a>(jobs: impl IntoIterator<Item = &'a Job>) -> Vec<i64> {
    let mut locks: Vec<i64> = jobs
        .into_iter()
        .filter_map(|j| {
            let key = j.order_key.as_ref()?;
            let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
            for byte in j
                .destination_id
                .as_uuid()
                .as_bytes()
                .iter()
                .chain(key.as_bytes())
            {
                hash ^= u64::from(*byte);
                hash = hash.wrapping_mul(0x0100_0000_01b3);
            }
            Some(hash as i64)
        })
        .collect();
    locks.sort_unstable();
    locks.dedup();
    locks
}

/// Each ordered job's place among the jobs of its `(destination, order key)` in `jobs`, from 1,
/// in `jobs`' order (the order they were given in).
pub(crate) fn order_ranks<'a>(jobs: impl IntoIterator<Item = &'a Job>) -> HashMap<JobId, i64> {
    let mut next: HashMap<(DestinationId, &str), i64> = HashMap::new();
    let mut ranks = HashMap::new();
    for job in jobs {
        if let Some(key) = &job.order_key {
            let rank = next.entry((job.destination_id, key.as_str())).or_insert(0);
            *rank += 1;
            ranks.entry(job.id).or_insert(*rank);
        }
    }
    ranks
}

/// Binds the order key and rank of each job (after [`bind_jobs`]' arrays and whatever follows
/// them), as two arrays.
pub(crate) fn bind_order<'q>(
    query: PgQuery<'q>,
    unique: &[&'q Job],
    ranks: &HashMap<JobId, i64>,
) -> PgQuery<'q> {
    query
        .bind(
            unique
                .iter()
                .map(|j| j.order_key.as_deref())
                .collect::<Vec<_>>(),
        )
        .bind(
            unique
                .iter()
                .map(|j| ranks.get(&j.id).copied())
                .collect::<Vec<_>>(),
        )
}

/// A new `claimed_until` from the lease length in parameter `$p`: exact microseconds
/// (`$p * interval '1 microsecond'`, never float seconds), and always later than the row's old
/// one.
fn lease_end(p: usize) -> String {
    format!(
        "GREATEST(now() + ${p}::bigint * interval '1 microsecond', \
                  j.claimed_until + interval '1 microsecond')"
    )
}

/// The lease claim [`PostgresJobQueue`] runs on the tables of `schema`, one statement: pick due,
/// unheld jobs in (next_due_at, id) order from the `jobs_due` index, skip rows another claimer
/// has locked, stamp the lease. `$1` is the most jobs to claim, `$2` the lease in microseconds.
/// Public so that the queue benchmark measures this very statement.
///
/// The picked ids are an `ARRAY(…)`, which Postgres runs once as an init plan, and the update
/// finds them by primary key. Joined as `FROM (SELECT …) AS picked`, the statement's generic
/// plan (a prepared statement's plan after five runs, made without knowing `$1`) guesses the
/// subquery returns a tenth of the table and hash-joins it against a sequential scan of the
/// whole heap: every claim then reads every live and dead row, and under a backlog of 170,000
/// rows that is what slowed claims to seconds (docs/ARCHITECTURE.md, "Why the claim stays
/// fast").
pub fn claim_sql(schema: &str) -> String {
    let s = schema;
    format!(
        "UPDATE {s}.jobs AS j SET claimed_until = {}
         WHERE j.id = ANY (ARRAY(
               SELECT id FROM {s}.jobs AS q
               WHERE next_due_at <= now()
                 AND (claimed_until IS NULL OR claimed_until < now())
                 AND (order_key IS NULL OR NOT EXISTS (
                      SELECT 1 FROM {s}.jobs AS e
                      WHERE e.destination_id = q.destination_id
                        AND e.order_key = q.order_key AND e.order_seq < q.order_seq))
               ORDER BY next_due_at, id
               LIMIT $1
               FOR UPDATE SKIP LOCKED))
         RETURNING j.id, j.tenant_id, j.event_id, j.destination_id, j.attempt_number,
                   j.last_attempt_time, j.order_key, j.next_due_at, j.claimed_until",
        lease_end(2)
    )
}

#[derive(Debug)]
struct Statements {
    enqueue: String,
    claim: String,
    renew: String,
    complete: String,
    reschedule: String,
    dead_letter: String,
    release: String,
    depth: String,
    purge: String,
    remove_dead_letters: String,
    take_dead_letters: String,
    unpark: String,
    heartbeat: String,
    vacuum: String,
}

impl Statements {
    fn new(s: &str) -> Self {
        // Outcomes join the leases on (id, claimed_until): the lease guard.
        let leases = "unnest($1::uuid[], $2::timestamptz[]) AS l(id, claimed_until)";
        let held = "j.id = l.id AND j.claimed_until = l.claimed_until";
        Statements {
            // A dead-lettered id stays taken. (A dead letter committing between this statement's
            // snapshot and its insert could let the id in again; that needs an enqueue retried at
            // the very moment its job is given up on, and would deliver once more, not lose.)
            enqueue: format!(
                "INSERT INTO {s}.jobs ({INSERTED_COLUMNS})
                 SELECT j.id, j.tenant_id, j.event_id, j.destination_id, j.attempt_number,
                        j.last_attempt_time, j.next_due_at, j.order_key, {}
                 FROM unnest($1::uuid[], $2::text[], $3::text[], $4::uuid[],
                             $5::bigint[], $6::timestamptz[], $7::timestamptz[], $8::text[],
                             $9::bigint[])
                      AS j(id, tenant_id, event_id, destination_id, attempt_number,
                           last_attempt_time, next_due_at, order_key, order_rank)
                 WHERE NOT EXISTS (SELECT 1 FROM {s}.dead_letters AS d WHERE d.id = j.id)
                 ON CONFLICT (id) DO NOTHING",
                order_seq(s)
            ),
            claim: claim_sql(s),
            renew: format!(
                "UPDATE {s}.jobs AS j SET claimed_until = {}
                 FROM {leases} WHERE {held}
                 RETURNING j.id, l.claimed_until AS old_until, j.claimed_until AS new_until",
                lease_end(3)
            ),
            complete: format!(
                "DELETE FROM {s}.jobs AS j USING {leases} WHERE {held}
                 RETURNING j.id, l.claimed_until AS old_until"
            ),
            reschedule: format!(
                "UPDATE {s}.jobs AS j
                 SET next_due_at = l.due_at, attempt_number = l.attempt_number,
                     last_attempt_time = l.last_attempt_time, claimed_until = NULL
                 FROM unnest($1::uuid[], $2::timestamptz[], $3::timestamptz[], $4::bigint[],
                             $5::timestamptz[])
                      AS l(id, claimed_until, due_at, attempt_number, last_attempt_time)
                 WHERE {held}
                 RETURNING j.id, l.claimed_until AS old_until"
            ),
            // Moved, not copied: the delete and the insert commit together. A job that holds
            // its key stays, parked at 'infinity' (migration 15); its dead letter keeps the due
            // time it had, read from the row's version before the update (`old`).
            dead_letter: format!(
                "WITH l AS (
                     SELECT * FROM unnest($1::uuid[], $2::timestamptz[], $3::text[], $4::bool[])
                                   AS l(id, claimed_until, reason, hold)
                 ), gone AS (
                     DELETE FROM {s}.jobs AS j USING l
                     WHERE {held} AND NOT (l.hold AND j.order_key IS NOT NULL)
                     RETURNING j.id, j.tenant_id, j.event_id, j.destination_id, j.attempt_number,
                               j.last_attempt_time, j.order_key, j.next_due_at, l.reason,
                               l.claimed_until AS old_until, false AS holds_key
                 ), parked AS (
                     UPDATE {s}.jobs AS j SET next_due_at = 'infinity', claimed_until = NULL
                     FROM l, {s}.jobs AS old
                     WHERE {held} AND l.hold AND j.order_key IS NOT NULL AND old.id = j.id
                     RETURNING j.id, j.tenant_id, j.event_id, j.destination_id, j.attempt_number,
                               j.last_attempt_time, j.order_key, old.next_due_at, l.reason,
                               l.claimed_until AS old_until, true AS holds_key
                 ), given_up AS (
                     SELECT * FROM gone UNION ALL SELECT * FROM parked
                 ), kept AS (
                     INSERT INTO {s}.dead_letters
                         ({JOB_COLUMNS}, due_at, reason, dead_lettered_at, holds_key)
                     SELECT {JOB_COLUMNS}, next_due_at, reason, now(), holds_key FROM given_up
                     ON CONFLICT (id) DO NOTHING
                 )
                 SELECT id, old_until FROM given_up"
            ),
            release: format!(
                "UPDATE {s}.jobs AS j SET claimed_until = NULL FROM {leases} WHERE {held}
                 RETURNING j.id, l.claimed_until AS old_until"
            ),
            // One pass over the (small) queue table, all states at one `now()`.
            // A job behind an earlier one of its order key is not due, whatever its time.
            depth: format!(
                "SELECT count(*) FILTER (WHERE claimed_until >= now()) AS claimed,
                        count(*) FILTER (WHERE (claimed_until IS NULL OR claimed_until < now())
                                           AND next_due_at <= now() AND NOT behind) AS due,
                        count(*) FILTER (WHERE (claimed_until IS NULL OR claimed_until < now())
                                           AND (next_due_at > now() OR behind)
                                           AND next_due_at <> 'infinity') AS scheduled,
                        (SELECT count(*) FROM {s}.dead_letters) AS dead_lettered
                 FROM (SELECT j.claimed_until, j.next_due_at,
                              j.order_key IS NOT NULL AND EXISTS (
                                  SELECT 1 FROM {s}.jobs AS e
                                  WHERE e.destination_id = j.destination_id
                                    AND e.order_key = j.order_key
                                    AND e.order_seq < j.order_seq) AS behind
                       FROM {s}.jobs AS j) AS q"
            ),
            // The parked row of a dead letter that held its key goes with it.
            remove_dead_letters: format!(
                "WITH gone AS (
                     DELETE FROM {s}.dead_letters WHERE tenant_id = $1 AND id = ANY($2::uuid[])
                     RETURNING id, holds_key
                 ), unparked AS (
                     DELETE FROM {s}.jobs AS j USING gone
                     WHERE j.id = gone.id AND gone.holds_key AND j.next_due_at = 'infinity'
                 )
                 SELECT count(*) AS removed FROM gone"
            ),
            take_dead_letters: format!(
                "DELETE FROM {s}.dead_letters WHERE tenant_id = $1 AND id = ANY($2::uuid[])
                 RETURNING {JOB_COLUMNS}, due_at, holds_key"
            ),
            unpark: format!(
                "UPDATE {s}.jobs SET next_due_at = now(), attempt_number = 1,
                                     last_attempt_time = NULL, claimed_until = NULL
                 WHERE id = ANY($1::uuid[]) AND next_due_at = 'infinity'"
            ),
            // A parked row is its dead letter's, so it is counted once: as the dead letter.
            purge: format!(
                "WITH jobs_gone AS (DELETE FROM {s}.jobs WHERE tenant_id = $1
                                    RETURNING next_due_at = 'infinity' AS parked),
                      dead_gone AS (DELETE FROM {s}.dead_letters WHERE tenant_id = $1 RETURNING 1)
                 SELECT (SELECT count(*) FROM jobs_gone WHERE NOT parked)
                        + (SELECT count(*) FROM dead_gone)
                        AS removed"
            ),
            // `JobQueue::heartbeat` in one round trip: stamp this process ($1) with the server's
            // `now()`, delete the rows older than the ttl ($2 µs), and count the processes.
            // Every part of a statement reads the same snapshot, taken before any of its
            // changes, so the count cannot come from the table as modified: it is the other
            // processes the snapshot holds within the ttl, plus this one, whether its row was
            // new, stale or fresh. The delete leaves this process's row to the upsert (one
            // statement may not change a row twice), and skips rows another heartbeat is
            // deleting, so concurrent heartbeats neither wait for nor deadlock with each other.
            heartbeat: format!(
                "WITH seen AS (
                     INSERT INTO {s}.processes AS p (id, seen_at) VALUES ($1, now())
                     ON CONFLICT (id) DO UPDATE SET seen_at = EXCLUDED.seen_at
                 ), gone AS (
                     DELETE FROM {s}.processes
                     WHERE id IN (SELECT id FROM {s}.processes
                                  WHERE seen_at < now() - $2::bigint * interval '1 microsecond'
                                    AND id <> $1
                                  FOR UPDATE SKIP LOCKED)
                 )
                 SELECT 1 + count(*) AS processes FROM {s}.processes
                 WHERE seen_at >= now() - $2::bigint * interval '1 microsecond' AND id <> $1"
            ),
            // TRUNCATE false: giving empty tail pages back to the file system needs an
            // exclusive lock on the table, which stops every claim and outcome while it is
            // held, and a queue grows those pages again a moment later.
            vacuum: format!("VACUUM (SKIP_LOCKED, TRUNCATE false) {s}.jobs"),
        }
    }
}

/// The job queue on Postgres. Cheap to clone; every clone shares the pool. Its clock is the
/// database server's.
#[derive(Clone)]
pub struct PostgresJobQueue {
    db: Db,
    sql: std::sync::Arc<Statements>,
    /// Job rows this handle (and its clones) deleted or moved since its last vacuum.
    dead_rows: std::sync::Arc<AtomicU64>,
}

/// Dead job rows after which [`JobQueue::maintain`] vacuums the jobs table.
///
/// The claim walks `jobs_due` from its oldest entry, and every completed job leaves a dead
/// entry there, at the front, until a vacuum removes it. Autovacuum visits a database once per
/// `autovacuum_naptime` (a minute by default), so at 2,000 deliveries a second the claim walked
/// through up to 130,000 dead entries before each visit, and its mean time tripled within the
/// cycle (`cargo xtask bench delivery`). Vacuuming a queue of a few hundred live rows takes
/// milliseconds; after 10,000 deaths it keeps the dead entries below that bound.
pub const VACUUM_AFTER_DEAD_ROWS: u64 = 10_000;

impl fmt::Debug for PostgresJobQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresJobQueue")
            .field("schema", &self.db.schema())
            .finish_non_exhaustive()
    }
}

/// The distinct leases of `items` (a lease given twice counts once), sorted by job id so that
/// concurrent batches lock rows in the same order, with the position each first appeared at.
fn distinct_leases<T>(items: &[T], lease_of: impl Fn(&T) -> Lease) -> Vec<(usize, &T)> {
    let mut seen = HashSet::with_capacity(items.len());
    let mut unique: Vec<(usize, &T)> = items
        .iter()
        .enumerate()
        .filter(|(_, item)| seen.insert(lease_of(item)))
        .collect();
    unique.sort_by_key(|(i, item)| (lease_of(item).job_id, *i));
    unique
}

/// The ids of the leases in `unique` that the statement did not apply (it returned `applied`),
/// in the order the caller gave them.
fn lost_ids(unique: &[Lease], applied: &HashSet<Lease>, order: &[usize]) -> Vec<JobId> {
    let mut lost: Vec<(usize, JobId)> = unique
        .iter()
        .zip(order)
        .filter(|(lease, _)| !applied.contains(lease))
        .map(|(lease, &at)| (at, lease.job_id))
        .collect();
    lost.sort_by_key(|(at, _)| *at);
    lost.into_iter().map(|(_, id)| id).collect()
}

/// The `(id, old_until)` pairs an outcome statement returned, as the leases it applied.
fn applied_leases(rows: &[PgRow]) -> Result<HashSet<Lease>> {
    rows.iter()
        .map(|row| {
            Ok(Lease {
                job_id: JobId::from_uuid(get(row, "id")?),
                claimed_until: get_time(row, "old_until")?,
            })
        })
        .collect()
}

fn job_from_row(row: &PgRow, due_column: &str) -> Result<Job> {
    Ok(Job {
        id: JobId::from_uuid(get(row, "id")?),
        tenant_id: TenantId::new(get::<String>(row, "tenant_id")?)?,
        event_id: EventId::new(get::<String>(row, "event_id")?)?,
        destination_id: DestinationId::from_uuid(get(row, "destination_id")?),
        attempt_number: get_u32(row, "attempt_number")?,
        last_attempt_time: get_opt_time(row, "last_attempt_time")?,
        due_at: get_time(row, due_column)?,
        order_key: get(row, "order_key")?,
    })
}

/// Binds the seven job columns of an enqueue, in `JOB_COLUMNS` order and then `next_due_at`.
pub(crate) fn bind_jobs<'q>(query: PgQuery<'q>, unique: &[&'q Job]) -> PgQuery<'q> {
    query
        .bind(unique.iter().map(|j| j.id.as_uuid()).collect::<Vec<_>>())
        .bind(
            unique
                .iter()
                .map(|j| j.tenant_id.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(
            unique
                .iter()
                .map(|j| j.event_id.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(
            unique
                .iter()
                .map(|j| j.destination_id.as_uuid())
                .collect::<Vec<_>>(),
        )
        .bind(
            unique
                .iter()
                .map(|j| i64::from(j.attempt_number))
                .collect::<Vec<_>>(),
        )
        .bind(
            unique
                .iter()
                .map(|j| j.last_attempt_time.map(|t| t.as_datetime()))
                .collect::<Vec<_>>(),
        )
        .bind(
            unique
                .iter()
                .map(|j| j.due_at.as_datetime())
                .collect::<Vec<_>>(),
        )
}

fn count(row: &PgRow, name: &str) -> Result<u64> {
    let n: i64 = get(row, name)?;
    Ok(u64::try_from(n).unwrap_or(0))
}

impl PostgresJobQueue {
    pub(crate) fn new(db: Db) -> Self {
        let sql = std::sync::Arc::new(Statements::new(db.schema()));
        PostgresJobQueue {
            db,
            sql,
            dead_rows: std::sync::Arc::new(AtomicU64::new(0)),
        }
    }

    /// The plan Postgres makes for the claim statement once it stops planning each call and
    /// reuses a generic plan (one made without knowing `$1`, as for a prepared statement after
    /// five runs), from `EXPLAIN (FORMAT JSON)`. Nothing is executed. For diagnostics, and for
    /// the test that proves the claim never reads the whole table.
    pub async fn explain_generic_claim(&self) -> Result<serde_json::Value> {
        let fail = |e| from_sqlx("explaining the claim", e);
        let mut tx = self.db.pool.begin().await.map_err(fail)?;
        sqlx::raw_sql("SET LOCAL plan_cache_mode = force_generic_plan")
            .execute(&mut *tx)
            .await
            .map_err(fail)?;
        sqlx::raw_sql(&format!(
            "PREPARE sheaf_explained_claim(bigint, bigint) AS {}",
            self.sql.claim
        ))
        .execute(&mut *tx)
        .await
        .map_err(fail)?;
        let row = sqlx::query("EXPLAIN (FORMAT JSON) EXECUTE sheaf_explained_claim(32, 30000000)")
            .persistent(false)
            .fetch_one(&mut *tx)
            .await
            .map_err(fail)?;
        sqlx::raw_sql("DEALLOCATE sheaf_explained_claim")
            .execute(&mut *tx)
            .await
            .map_err(fail)?;
        tx.rollback().await.map_err(fail)?;
        let plan: sqlx::types::Json<serde_json::Value> = get(&row, "QUERY PLAN")?;
        Ok(plan.0)
    }

    /// Runs an outcome statement whose first two parameters are the lease arrays, binding the
    /// rest with `bind_rest`, and returns the lost ids in the caller's order.
    async fn outcome<'s, 'e, T: Sync>(
        &'s self,
        exec: impl sqlx::PgExecutor<'e>,
        doing: &str,
        sql: &'s str,
        items: &[T],
        lease_of: impl Fn(&T) -> Lease,
        bind_rest: impl FnOnce(PgQuery<'s>, &[&T]) -> PgQuery<'s>,
    ) -> Result<Vec<JobId>> {
        let unique = distinct_leases(items, &lease_of);
        if unique.is_empty() {
            return Ok(Vec::new());
        }
        let order: Vec<usize> = unique.iter().map(|(at, _)| *at).collect();
        let records: Vec<&T> = unique.iter().map(|(_, item)| *item).collect();
        let leases: Vec<Lease> = records.iter().map(|item| lease_of(item)).collect();
        let query = planned_each_time(sql)
            .bind(
                leases
                    .iter()
                    .map(|l| l.job_id.as_uuid())
                    .collect::<Vec<_>>(),
            )
            .bind(
                leases
                    .iter()
                    .map(|l| l.claimed_until.as_datetime())
                    .collect::<Vec<_>>(),
            );
        let rows = bind_rest(query, &records)
            .fetch_all(exec)
            .await
            .map_err(|e| from_sqlx(doing, e))?;
        let applied = applied_leases(&rows)?;
        // Every applied outcome leaves a dead row version: a delete, a non-HOT move, or a
        // release (HOT, but dead all the same).
        self.dead_rows
            .fetch_add(applied.len() as u64, Ordering::Relaxed);
        Ok(lost_ids(&leases, &applied, &order))
    }

    /// [`JobQueue::enqueue`] on `conn` (a connection of the pool, or a transaction that commits
    /// more). Ordered jobs need a transaction: their keys are locked first (see `order_seq`).
    pub(crate) async fn enqueue_with(
        &self,
        conn: &mut sqlx::PgConnection,
        jobs: &[Job],
    ) -> Result<()> {
        for job in jobs {
            validate_job(job)?;
        }
        let mut seen = HashSet::with_capacity(jobs.len());
        let mut unique: Vec<&Job> = jobs.iter().filter(|j| seen.insert(j.id)).collect();
        if unique.is_empty() {
            return Ok(());
        }
        let ranks = order_ranks(unique.iter().copied());
        let locks = order_locks(unique.iter().copied());
        if !locks.is_empty() {
            sqlx::query(LOCK_ORDER_KEYS)
                .bind(locks)
                .execute(&mut *conn)
                .await
                .map_err(|e| from_sqlx("locking order keys", e))?;
        }
        // Sorted by id: concurrent enqueues of overlapping jobs take locks in the same order.
        unique.sort_by_key(|j| j.id);
        bind_order(
            bind_jobs(sqlx::query(&self.sql.enqueue), &unique),
            &unique,
            &ranks,
        )
        .execute(&mut *conn)
        .await
        .map_err(|e| from_sqlx("enqueueing jobs", e))?;
        Ok(())
    }

    /// [`JobQueue::remove_dead_letters`] on `exec`.
    pub(crate) async fn remove_dead_letters_with<'e>(
        &self,
        exec: impl sqlx::PgExecutor<'e>,
        tenant: &TenantId,
        ids: &[JobId],
    ) -> Result<u64> {
        if ids.is_empty() {
            return Ok(0);
        }
        let ids: Vec<uuid::Uuid> = ids.iter().map(JobId::as_uuid).collect();
        let row = sqlx::query(&self.sql.remove_dead_letters)
            .bind(tenant.as_str())
            .bind(&ids)
            .fetch_one(exec)
            .await
            .map_err(|e| from_sqlx("removing dead letters", e))?;
        count(&row, "removed")
    }

    /// [`JobQueue::complete`] on `exec` (the pool, or a transaction that commits more).
    pub(crate) async fn complete_with<'e>(
        &self,
        exec: impl sqlx::PgExecutor<'e>,
        leases: &[Lease],
    ) -> Result<Vec<JobId>> {
        self.outcome(
            exec,
            "completing jobs",
            &self.sql.complete,
            leases,
            |l| *l,
            |q, _| q,
        )
        .await
    }

    /// [`JobQueue::reschedule`] on `exec`.
    pub(crate) async fn reschedule_with<'e>(
        &self,
        exec: impl sqlx::PgExecutor<'e>,
        jobs: &[Reschedule],
    ) -> Result<Vec<JobId>> {
        self.outcome(
            exec,
            "rescheduling jobs",
            &self.sql.reschedule,
            jobs,
            |r| r.lease,
            |q, records| {
                q.bind(
                    records
                        .iter()
                        .map(|r| r.due_at.as_datetime())
                        .collect::<Vec<_>>(),
                )
                .bind(
                    records
                        .iter()
                        .map(|r| i64::from(r.attempt_number))
                        .collect::<Vec<_>>(),
                )
                .bind(
                    records
                        .iter()
                        .map(|r| r.last_attempt_time.map(|t| t.as_datetime()))
                        .collect::<Vec<Option<DateTime<Utc>>>>(),
                )
            },
        )
        .await
    }

    /// [`JobQueue::dead_letter`] on `exec`.
    pub(crate) async fn dead_letter_with<'e>(
        &self,
        exec: impl sqlx::PgExecutor<'e>,
        jobs: &[DeadLetterRequest],
    ) -> Result<Vec<JobId>> {
        self.outcome(
            exec,
            "dead-lettering jobs",
            &self.sql.dead_letter,
            jobs,
            |r| r.lease,
            |q, records| {
                q.bind(
                    records
                        .iter()
                        .map(|r| pg_text(&r.reason))
                        .collect::<Vec<_>>(),
                )
                .bind(records.iter().map(|r| r.hold_key).collect::<Vec<_>>())
            },
        )
        .await
    }
}

#[async_trait]
impl JobQueue for PostgresJobQueue {
    async fn enqueue(&self, jobs: &[Job]) -> Result<()> {
        let fail = |e| from_sqlx("enqueueing jobs", e);
        if jobs.iter().any(|j| j.order_key.is_some()) {
            let mut tx = self.db.pool.begin().await.map_err(fail)?;
            self.enqueue_with(&mut tx, jobs).await?;
            tx.commit().await.map_err(fail)
        } else {
            let mut conn = self.db.pool.acquire().await.map_err(fail)?;
            self.enqueue_with(&mut conn, jobs).await
        }
    }

    async fn claim(&self, max: usize, lease: Duration) -> Result<Vec<ClaimedJob>> {
        validate_lease(lease)?;
        if max == 0 {
            return Ok(Vec::new());
        }
        let rows = planned_each_time(&self.sql.claim)
            .bind(i64::try_from(max).unwrap_or(i64::MAX))
            .bind(micros(lease))
            .fetch_all(&self.db.pool)
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
        // RETURNING follows no order; the trait's is (due_at, id).
        claimed.sort_by_key(|c| (c.job.due_at, c.job.id));
        Ok(claimed)
    }

    async fn renew(&self, leases: &[Lease], lease: Duration) -> Result<Renewed> {
        validate_lease(lease)?;
        let unique = distinct_leases(leases, |l| *l);
        if unique.is_empty() {
            return Ok(Renewed::default());
        }
        let order: Vec<usize> = unique.iter().map(|(at, _)| *at).collect();
        let old: Vec<Lease> = unique.iter().map(|(_, l)| **l).collect();
        let rows = planned_each_time(&self.sql.renew)
            .bind(old.iter().map(|l| l.job_id.as_uuid()).collect::<Vec<_>>())
            .bind(
                old.iter()
                    .map(|l| l.claimed_until.as_datetime())
                    .collect::<Vec<_>>(),
            )
            .bind(micros(lease))
            .fetch_all(&self.db.pool)
            .await
            .map_err(|e| from_sqlx("renewing leases", e))?;
        let mut renewed: HashMap<Lease, Lease> = HashMap::with_capacity(rows.len());
        for row in &rows {
            let job_id = JobId::from_uuid(get(row, "id")?);
            let before = Lease {
                job_id,
                claimed_until: get_time(row, "old_until")?,
            };
            let after = Lease {
                job_id,
                claimed_until: get_time(row, "new_until")?,
            };
            renewed.insert(before, after);
        }
        let applied: HashSet<Lease> = renewed.keys().copied().collect();
        let lost = lost_ids(&old, &applied, &order);
        let mut in_order: Vec<(usize, Lease)> = old
            .iter()
            .zip(&order)
            .filter_map(|(l, &at)| renewed.get(l).map(|new| (at, *new)))
            .collect();
        in_order.sort_by_key(|(at, _)| *at);
        Ok(Renewed {
            leases: in_order.into_iter().map(|(_, l)| l).collect(),
            lost,
        })
    }

    async fn complete(&self, leases: &[Lease]) -> Result<Vec<JobId>> {
        self.complete_with(&self.db.pool, leases).await
    }

    async fn reschedule(&self, jobs: &[Reschedule]) -> Result<Vec<JobId>> {
        self.reschedule_with(&self.db.pool, jobs).await
    }

    async fn dead_letter(&self, jobs: &[DeadLetterRequest]) -> Result<Vec<JobId>> {
        self.dead_letter_with(&self.db.pool, jobs).await
    }

    async fn release(&self, leases: &[Lease]) -> Result<Vec<JobId>> {
        self.outcome(
            &self.db.pool,
            "releasing jobs",
            &self.sql.release,
            leases,
            |l| *l,
            |q, _| q,
        )
        .await
    }

    async fn depth(&self) -> Result<QueueDepth> {
        let row = sqlx::query(&self.sql.depth)
            .fetch_one(&self.db.pool)
            .await
            .map_err(|e| from_sqlx("measuring the queue", e))?;
        Ok(QueueDepth {
            due: count(&row, "due")?,
            scheduled: count(&row, "scheduled")?,
            claimed: count(&row, "claimed")?,
            dead_lettered: count(&row, "dead_lettered")?,
        })
    }

    async fn list_dead_letters(
        &self,
        tenant: &TenantId,
        page: &PageRequest,
    ) -> Result<Page<DeadLetter>> {
        page.validate()?;
        let cursor = page.cursor_position(JobId::from_str)?;
        let s = self.db.schema();
        let select = format!(
            "SELECT {JOB_COLUMNS}, due_at, reason, dead_lettered_at, holds_key
             FROM {s}.dead_letters WHERE tenant_id = $1"
        );
        let order = "ORDER BY dead_lettered_at DESC, id DESC LIMIT";
        let limit = i64::from(page.limit) + 1;
        let sql = match &cursor {
            None => format!("{select} {order} $2"),
            Some(_) => format!("{select} AND (dead_lettered_at, id) < ($3, $4) {order} $2"),
        };
        let mut query = sqlx::query(&sql).bind(tenant.as_str()).bind(limit);
        if let Some((time, id)) = &cursor {
            query = query.bind(time.as_datetime()).bind(id.as_uuid());
        }
        let rows = query
            .fetch_all(&self.db.pool)
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
        let limit = page.limit_usize();
        Ok(Page::from_overfetch(items, limit, |d| {
            Cursor::new(d.dead_lettered_at, d.job.id.to_string())
        }))
    }

    async fn remove_dead_letters(&self, tenant: &TenantId, ids: &[JobId]) -> Result<u64> {
        self.remove_dead_letters_with(&self.db.pool, tenant, ids)
            .await
    }

    async fn requeue_dead_letters(&self, tenant: &TenantId, ids: &[JobId]) -> Result<u64> {
        if ids.is_empty() {
            return Ok(0);
        }
        let fail = |e| from_sqlx("requeueing dead letters", e);
        let ids: Vec<uuid::Uuid> = ids.iter().map(JobId::as_uuid).collect();
        let mut tx = self.db.pool.begin().await.map_err(fail)?;
        let rows = sqlx::query(&self.sql.take_dead_letters)
            .bind(tenant.as_str())
            .bind(&ids)
            .fetch_all(&mut *tx)
            .await
            .map_err(fail)?;
        let now = Timestamp::now();
        let (mut parked, mut anew) = (Vec::new(), Vec::new());
        for row in &rows {
            let job = job_from_row(row, "due_at")?;
            if get::<bool>(row, "holds_key")? {
                parked.push(job.id.as_uuid());
            } else {
                anew.push(Job {
                    attempt_number: 1,
                    last_attempt_time: None,
                    due_at: now,
                    ..job
                });
            }
        }
        if !parked.is_empty() {
            sqlx::query(&self.sql.unpark)
                .bind(&parked)
                .execute(&mut *tx)
                .await
                .map_err(fail)?;
        }
        // Its dead letter is gone in this transaction, so the enqueue takes the id again.
        self.enqueue_with(&mut tx, &anew).await?;
        tx.commit().await.map_err(fail)?;
        Ok(rows.len() as u64)
    }

    async fn purge_tenant(&self, tenant: &TenantId) -> Result<u64> {
        let row = sqlx::query(&self.sql.purge)
            .bind(tenant.as_str())
            .fetch_one(&self.db.pool)
            .await
            .map_err(|e| from_sqlx("purging a tenant's jobs", e))?;
        count(&row, "removed")
    }

    async fn heartbeat(&self, process: uuid::Uuid, ttl: Duration) -> Result<u32> {
        let row = sqlx::query(&self.sql.heartbeat)
            .bind(process)
            .bind(micros(ttl))
            .fetch_one(&self.db.pool)
            .await
            .map_err(|e| from_sqlx("recording a heartbeat", e))?;
        // At least this process; more processes than a u32 counts is not a real deployment.
        let processes = count(&row, "processes")?;
        Ok(u32::try_from(processes).unwrap_or(u32::MAX).max(1))
    }

    async fn ping(&self) -> Result<()> {
        self.db.ping("job queue").await
    }

    async fn maintain(&self) -> Result<bool> {
        let dead = self.dead_rows.load(Ordering::Relaxed);
        if dead < VACUUM_AFTER_DEAD_ROWS {
            return Ok(false);
        }
        // SKIP_LOCKED: when autovacuum or another process is vacuuming it already, skip.
        sqlx::raw_sql(&self.sql.vacuum)
            .execute(&self.db.pool)
            .await
            .map_err(|e| from_sqlx("vacuuming the jobs table", e))?;
        self.dead_rows.fetch_sub(dead, Ordering::Relaxed);
        Ok(true)
    }
}
