//! `queue`'s sustained phase: jobs offered at a steady rate for minutes while one claimer per
//! process claims and one completer per process deletes them in batches, as the service's
//! dispatcher and completer do (a no-op job), with three claims, each in a schema of its own, one
//! after the other in the same run:
//!
//! - *joined*: the claim `PostgresJobQueue` shipped before, one `UPDATE … FOR UPDATE SKIP
//!   LOCKED` statement joined to its subquery (`FROM (SELECT id …) AS picked`), whose generic
//!   plan can hash-join the picked ids against a sequential scan of the whole heap;
//! - *shipped*: the claim it ships now, the same statement with the ids picked in `ARRAY(…)`, an
//!   init plan run once, the update then finding them by primary key;
//! - *candidate*: the claim inside a PL/pgSQL function whose plan is pinned to `jobs_due`
//!   (`claim_jobs`, created here, not shipped).
//!
//! Every few seconds it samples the jobs table's `n_live_tup`, `n_dead_tup` and autovacuum count
//! (`pg_stat_user_tables`), the sizes of the heap and of `jobs_due`, and the claim and completion
//! statements' calls, execution time and buffers (`pg_stat_statements`, read as deltas and
//! filtered by the run's schema), so the report shows how the claim's cost follows the dead
//! tuples between autovacuum runs.
//!
//! The tables it reports are built in `report.rs`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::Serialize;
use sheaf_store::{DestinationId, EventId, Job, JobId, JobQueue, Lease, TenantId, Timestamp};
use sqlx::{Connection as _, Row as _};
use tokio::sync::{Mutex, Notify, mpsc};

use super::COMPLETER_MAX;
use crate::context::Ctx;
use crate::pg::{self, PgSchema, StatementTotals};
use crate::progress::Progress;

/// A `timestamptz` as sqlx reads it.
type UtcTime = sqlx::types::chrono::DateTime<sqlx::types::chrono::Utc>;

/// Claimers ("processes"), each with its own dispatcher, workers and completer.
pub(super) const PROCESSES: usize = 2;
/// Workers per process, which is also the capacity of the channel the dispatcher fills.
pub(super) const WORKERS: usize = 16;
/// The service's default `SHEAF_QUEUE_POLL_INTERVAL`; the completer's bounds are `queue`'s.
const POLL: Duration = Duration::from_millis(100);
const LEASE: Duration = Duration::from_secs(60);
/// How often the enqueuers offer the jobs that have come due by the clock.
const ENQUEUE_EVERY: Duration = Duration::from_millis(10);

/// Which claim a run uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(super) enum Claim {
    /// The earlier `PostgresJobQueue::claim`: [`joined_claim_sql`], one plain statement joined
    /// to its subquery, planned by Postgres from whatever its statistics say.
    Joined,
    /// `PostgresJobQueue::claim` as shipped: [`sheaf_postgres::claim_sql`], the ids picked in an init
    /// plan.
    Shipped,
    /// The candidate: [`candidate_function`], pinned to `jobs_due`.
    Function,
}

impl Claim {
    /// Every claim, in the order the runs and the report's columns take them.
    pub(super) const ALL: [Claim; 3] = [Claim::Joined, Claim::Shipped, Claim::Function];

    pub(super) fn label(self) -> &'static str {
        match self {
            Claim::Joined => "earlier: claim joined to its subquery",
            Claim::Shipped => "shipped: ids picked in an init plan",
            Claim::Function => "candidate: claim_jobs, pinned to jobs_due",
        }
    }

    /// The name in the schema's prefix and in the per-window table's columns.
    pub(super) fn short(self) -> &'static str {
        match self {
            Claim::Joined => "joined",
            Claim::Shipped => "shipped",
            Claim::Function => "candidate",
        }
    }

    /// The `pg_stat_statements` patterns (`LIKE ALL`, with the run's schema) for this claim's
    /// statement. The schema, a fresh name per run, keeps the variants apart (`claim_jobs`'s
    /// `CREATE FUNCTION`, which holds the shipped statement's words, is in the candidate's);
    /// these keep the claim apart from the schema's other statements (renewals and releases
    /// also set `claimed_until`, the outbox also locks with `SKIP LOCKED`).
    fn needles(self) -> &'static [&'static str] {
        match self {
            Claim::Joined => &["SET claimed_until", "SKIP LOCKED) AS picked"],
            Claim::Shipped => &["SET claimed_until", "= ANY (ARRAY(", "SKIP LOCKED))"],
            Claim::Function => &["SELECT id, claimed_until FROM ", "claim_jobs($"],
        }
    }
}

/// One sample, cumulative since the run started.
#[derive(Debug, Clone, Copy, Serialize)]
pub(super) struct Sample {
    pub seconds: f64,
    pub enqueued: u64,
    pub completed: u64,
    pub live_tuples: i64,
    pub dead_tuples: i64,
    pub autovacuums: i64,
    pub heap_bytes: i64,
    pub jobs_due_bytes: i64,
    pub claim: StatementTotals,
    pub complete: StatementTotals,
}

/// One configuration's sustained run.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Sustained {
    pub claim: Claim,
    pub offered_per_s: f64,
    pub seconds: f64,
    pub samples: Vec<Sample>,
}

/// The sizes of one run: how long each configuration runs, at what rate, sampled how often,
/// reported in windows of how long.
#[derive(Debug, Clone, Copy, Serialize)]
pub(super) struct Plan {
    pub rate: f64,
    pub seconds: u64,
    pub sample_s: u64,
    pub window_s: u64,
}

pub(super) fn plan(ctx: &Ctx) -> Plan {
    Plan {
        rate: ctx.size(1_500.0, 400.0),
        seconds: ctx.size(300, 16),
        sample_s: ctx.size(5, 2),
        window_s: ctx.size(30, 4),
    }
}

/// Runs every configuration, in [`Claim::ALL`]'s order.
pub(super) async fn run(url: &str, plan: Plan) -> anyhow::Result<Vec<Sustained>> {
    let mut runs = Vec::new();
    for claim in Claim::ALL {
        let schema = PgSchema::new(url, &format!("bench_queue_{}", claim.short()));
        let stores = sheaf_postgres::PostgresStores::new(schema.config(2))?;
        stores.migrate().await?;
        stores.close().await;
        if claim == Claim::Function {
            let mut conn = schema.connect().await?;
            sqlx::raw_sql(&candidate_function(&schema.schema))
                .execute(&mut conn)
                .await
                .context("create the candidate claim function")?;
        }
        let progress = Progress::new(format!("queue sustained: {}", claim.label()), plan.seconds);
        let run = run_one(&schema, claim, plan, &progress)
            .await
            .with_context(|| format!("sustained run, {}", claim.label()))?;
        progress.finish();
        runs.push(run);
    }
    Ok(runs)
}

/// The candidate claim, measured against the statements and not shipped: the same claim in a
/// PL/pgSQL function (its plan cached per connection) that turns sequential scans, bitmap scans
/// and sorts off for its own statement only, so the due jobs are always read in
/// (next_due_at, id) order from `jobs_due` and the claimed rows found again through the primary
/// key, whatever the table's statistics say. `max_jobs`: the most jobs to claim;
/// `lease_micros`: the lease in microseconds; a new lease is always later than the old one.
fn candidate_function(s: &str) -> String {
    format!(
        "CREATE FUNCTION {s}.claim_jobs(max_jobs bigint, lease_micros bigint)
         RETURNS SETOF {s}.jobs
         LANGUAGE plpgsql
         VOLATILE
         SET search_path = {s}
         SET enable_seqscan = off
         SET enable_bitmapscan = off
         SET enable_sort = off
         AS $$
         BEGIN
             RETURN QUERY
             UPDATE jobs AS j
             SET claimed_until = GREATEST(now() + lease_micros * interval '1 microsecond',
                                          j.claimed_until + interval '1 microsecond')
             WHERE j.id = ANY (ARRAY(
                 SELECT due.id FROM jobs AS due
                 WHERE due.next_due_at <= now()
                   AND (due.claimed_until IS NULL OR due.claimed_until < now())
                 ORDER BY due.next_due_at, due.id
                 LIMIT max_jobs
                 FOR UPDATE SKIP LOCKED))
             RETURNING j.*;
         END
         $$"
    )
}

/// The candidate's call.
fn candidate_claim_sql(s: &str) -> String {
    format!("SELECT id, claimed_until FROM {s}.claim_jobs($1::bigint, $2::bigint)")
}

/// The claim `PostgresJobQueue` shipped before, word for word (the bench runs each statement
/// itself so that every variant goes through the same client code).
fn joined_claim_sql(s: &str) -> String {
    format!(
        "UPDATE {s}.jobs AS j SET claimed_until = GREATEST(now() + $2::bigint * interval '1 microsecond', \
                          j.claimed_until + interval '1 microsecond')
         FROM (SELECT id FROM {s}.jobs
               WHERE next_due_at <= now()
                 AND (claimed_until IS NULL OR claimed_until < now())
               ORDER BY next_due_at, id
               LIMIT $1
               FOR UPDATE SKIP LOCKED) AS picked
         WHERE j.id = picked.id
         RETURNING j.id, j.tenant_id, j.event_id, j.destination_id, j.attempt_number,
                   j.last_attempt_time, j.next_due_at, j.claimed_until"
    )
}

/// Claims with `claim`'s statement.
#[derive(Clone)]
struct Claimer {
    pool: sqlx::PgPool,
    sql: Arc<String>,
}

impl Claimer {
    async fn claim(&self, max: usize) -> anyhow::Result<Vec<Lease>> {
        let rows = sqlx::query(&self.sql)
            .bind(max as i64)
            .bind(LEASE.as_micros() as i64)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|row| {
                let id: uuid::Uuid = row.try_get("id")?;
                let until: UtcTime = row.try_get("claimed_until")?;
                Ok(Lease {
                    job_id: JobId::from_uuid(id),
                    claimed_until: Timestamp::from_datetime(until),
                })
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()
            .map_err(Into::into)
    }
}

async fn run_one(
    schema: &PgSchema,
    claim: Claim,
    plan: Plan,
    progress: &Progress,
) -> anyhow::Result<Sustained> {
    let stores = sheaf_postgres::PostgresStores::new(schema.config(4 * PROCESSES as u32))?;
    let queue = stores.job_queue();
    queue.depth().await?;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(PROCESSES as u32)
        .connect(&schema.url)
        .await
        .context("connect the claimers' pool")?;
    let claimer = Claimer {
        pool: pool.clone(),
        sql: Arc::new(match claim {
            Claim::Joined => joined_claim_sql(&schema.schema),
            Claim::Shipped => sheaf_postgres::claim_sql(&schema.schema),
            Claim::Function => candidate_claim_sql(&schema.schema),
        }),
    };
    let enqueued = Arc::new(AtomicU64::new(0));
    let completed = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..PROCESSES {
        let wake = Arc::new(Notify::new());
        tasks.push(tokio::spawn(enqueuer(
            Arc::clone(&queue),
            plan.rate / PROCESSES as f64,
            Arc::clone(&wake),
            Arc::clone(&enqueued),
            Arc::clone(&stop),
        )));
        tasks.push(tokio::spawn(process_loop(
            claimer.clone(),
            Arc::clone(&queue),
            wake,
            Arc::clone(&completed),
            Arc::clone(&stop),
        )));
    }

    let mut conn = schema.connect().await?;
    let mut samples = vec![sample(&mut conn, schema, claim, 0.0, &enqueued, &completed).await?];
    let every = Duration::from_secs(plan.sample_s);
    let end = Duration::from_secs(plan.seconds);
    let mut next = every;
    let mut failed = None;
    while next <= end {
        tokio::time::sleep_until(tokio::time::Instant::from_std(started + next)).await;
        if let Some(done) = tasks.iter().position(|t| t.is_finished()) {
            failed = Some(tasks.swap_remove(done));
            break;
        }
        let at = started.elapsed().as_secs_f64();
        samples.push(sample(&mut conn, schema, claim, at, &enqueued, &completed).await?);
        progress.inc(plan.sample_s);
        next += every;
    }
    stop.store(true, Ordering::Relaxed);
    if let Some(task) = failed {
        task.await.context("a task panicked")??;
        anyhow::bail!("a task ended before the run did");
    }
    for task in tasks {
        task.await.context("a task panicked")??;
    }
    conn.close().await?;
    pool.close().await;
    stores.close().await;
    Ok(Sustained {
        claim,
        offered_per_s: plan.rate,
        seconds: plan.seconds as f64,
        samples,
    })
}

/// Offers `rate` jobs per second, due at once, in a batch per `ENQUEUE_EVERY`, and wakes its
/// process's dispatcher as a publish does.
async fn enqueuer(
    queue: Arc<dyn JobQueue>,
    rate: f64,
    wake: Arc<Notify>,
    enqueued: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let destination = DestinationId::generate();
    let mut sent = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let due = (started.elapsed().as_secs_f64() * rate) as u64;
        // At most a second's worth in one statement, should the enqueuer fall behind.
        let n = due.saturating_sub(sent).min(rate.ceil() as u64);
        if n > 0 {
            let now = Timestamp::now();
            let jobs = (0..n)
                .map(|i| {
                    Ok(Job {
                        id: JobId::generate(),
                        tenant_id: TenantId::new(format!("tenant-{}", (sent + i) % 20))?,
                        event_id: EventId::generate(),
                        destination_id: destination,
                        attempt_number: 1,
                        last_attempt_time: None,
                        due_at: now,
                        order_key: None,
                    })
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            queue.enqueue(&jobs).await?;
            sent += n;
            enqueued.fetch_add(n, Ordering::Relaxed);
            wake.notify_one();
        }
        tokio::time::sleep(ENQUEUE_EVERY).await;
    }
    Ok(())
}

/// One process: a dispatcher claiming as many jobs as its channel has room for, no-op workers,
/// and a completer deleting finished jobs per `COMPLETER_INTERVAL` or `COMPLETER_MAX`.
async fn process_loop(
    claimer: Claimer,
    queue: Arc<dyn JobQueue>,
    wake: Arc<Notify>,
    completed: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<()> {
    let (jobs_tx, jobs_rx) = mpsc::channel::<Lease>(WORKERS);
    let jobs_rx = Arc::new(Mutex::new(jobs_rx));
    let (done_tx, mut done_rx) = mpsc::channel::<Lease>(COMPLETER_MAX * 4);
    let completer = tokio::spawn(async move {
        let mut batch = Vec::with_capacity(COMPLETER_MAX);
        while super::measure::gather_outcomes(&mut done_rx, &mut batch).await {
            let lost = queue.complete(&batch).await?;
            anyhow::ensure!(lost.is_empty(), "{} leases lost", lost.len());
            completed.fetch_add(batch.len() as u64, Ordering::Relaxed);
            batch.clear();
        }
        anyhow::Ok(())
    });
    let workers = super::measure::noop_workers(WORKERS, &jobs_rx, done_tx);
    while !stop.load(Ordering::Relaxed) {
        let room = jobs_tx.capacity();
        if room == 0 {
            // Wait for a worker to take one; the permit is only a signal.
            drop(jobs_tx.reserve().await?);
            continue;
        }
        let claimed = claimer.claim(room).await?;
        let got = claimed.len();
        for lease in claimed {
            jobs_tx.send(lease).await?;
        }
        if got < room {
            let _ = tokio::time::timeout(POLL, wake.notified()).await;
        }
    }
    drop(jobs_tx);
    for worker in workers {
        worker.await.context("a worker panicked")?;
    }
    completer.await.context("the completer panicked")??;
    Ok(())
}

async fn sample(
    conn: &mut sqlx::PgConnection,
    schema: &PgSchema,
    claim: Claim,
    seconds: f64,
    enqueued: &AtomicU64,
    completed: &AtomicU64,
) -> anyhow::Result<Sample> {
    let (live, dead, autovacuums, heap, index): (i64, i64, i64, i64, i64) = sqlx::query_as(
        "SELECT n_live_tup, n_dead_tup, autovacuum_count, pg_relation_size(relid), \
                pg_relation_size(format('%I.jobs_due', schemaname)::regclass) \
         FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = 'jobs'",
    )
    .bind(&schema.schema)
    .fetch_one(&mut *conn)
    .await
    .context("read pg_stat_user_tables")?;
    let mut claim_needles = vec![schema.schema.as_str()];
    claim_needles.extend(claim.needles());
    let claim_totals = pg::statement_totals_all(&mut *conn, &claim_needles).await?;
    let complete_totals =
        pg::statement_totals_all(&mut *conn, &[schema.schema.as_str(), "DELETE FROM"]).await?;
    Ok(Sample {
        seconds,
        enqueued: enqueued.load(Ordering::Relaxed),
        completed: completed.load(Ordering::Relaxed),
        live_tuples: live,
        dead_tuples: dead,
        autovacuums,
        heap_bytes: heap,
        jobs_due_bytes: index,
        claim: claim_totals,
        complete: complete_totals,
    })
}
