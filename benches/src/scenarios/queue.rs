//! `queue`: burning down no-op jobs on Postgres, Sheaf's lease queue against the savepoint
//! design it replaces (docs/benchmarks.md, "`queue`", with its earlier measurements), with 1, 4
//! and 16 workers, in the same run.
//!
//! - **Sheaf**: `PostgresJobQueue` driven the way the service's engine drives it: one dispatcher
//!   claims (`UPDATE … FOR UPDATE SKIP LOCKED … RETURNING`, a lease, no transaction held) only
//!   as many jobs as the channel to the workers has free slots (capacity = workers, as
//!   `SHEAF_DELIVERY_WORKERS` sizes it); workers take jobs from the channel and hand their
//!   outcome to one completer, which deletes the finished jobs in one statement per 5 ms or 256
//!   jobs (the service's `SHEAF_COMPLETER_*` defaults).
//! - **Savepoints**: each worker, on its own connection, opens a transaction, claims 10 due jobs
//!   with `SELECT … FOR UPDATE SKIP LOCKED`, and completes each inside its own `SAVEPOINT`
//!   (`DELETE`, `RELEASE`), then commits: one MultiXact per job, as in the production queue the
//!   lease design comes from.
//!
//! Every run starts from the same 100,000 due jobs (full size) in a fresh table state
//! (`TRUNCATE`, insert, `VACUUM ANALYZE`), in a schema of its own per design. Throughput is wall
//! time from the first claim to the last completion. While it runs, `pg_stat_activity` is
//! sampled every 10 ms for the run's own connections (tagged by `application_name`), counting
//! active backends per wait event, MultiXact LWLock waits among them.
//!
//! Then the sustained phase (`queue_sustained`): jobs offered at a steady rate for minutes, with
//! the claim as the earlier statement (joined to its subquery), as the one Sheaf ships (ids
//! picked in an init plan) and as a candidate pinned to the index (`claim_jobs`, defined in
//! `queue_sustained.rs`), side by side.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use serde::Serialize;
use sheaf_store::Lease;
use sqlx::Connection as _;
use tokio::sync::{Mutex, mpsc};

use crate::context::Ctx;
use crate::pg::{self, PgSchema};
use crate::plot::{Bar, Figure, Panel};
use crate::progress::Progress;
use crate::report::{self, PeakRss, Report, Table};
use crate::scenarios::queue_sustained;

const QUESTION: &str = "How fast do 1, 4 and 16 workers burn down 100,000 no-op jobs on Postgres \
    with Sheaf's queue (leases, one claimer, batched completion) and with the savepoint design \
    it replaces, and which waits show up?";

/// Jobs per claim in the savepoint design: 10, as in the hand measurement of both designs
/// (docs/benchmarks.md, "`queue`", earlier measurements).
const SAVEPOINT_CLAIM: i64 = 10;
/// The service's defaults for the completer (`SHEAF_COMPLETER_FLUSH_INTERVAL`, `…_MAX_BATCH`).
pub(super) const COMPLETER_INTERVAL: Duration = Duration::from_millis(5);
pub(super) const COMPLETER_MAX: usize = 256;
const LEASE: Duration = Duration::from_secs(60);
const SAMPLE_EVERY: Duration = Duration::from_millis(10);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
enum Design {
    Savepoint,
    Sheaf,
}

impl Design {
    fn label(self) -> &'static str {
        match self {
            Design::Savepoint => "savepoint per job",
            Design::Sheaf => "Sheaf: leases, one claimer, batched completion",
        }
    }
}

#[derive(Debug, Clone, Serialize)]
struct Measured {
    design: Design,
    workers: usize,
    jobs: u64,
    seconds: f64,
    jobs_per_s: f64,
    /// Claim statements (Sheaf) or claiming transactions (savepoints).
    claims: u64,
    samples: u64,
    /// Active backends seen per wait event (`type:event`), summed over the samples.
    waits: BTreeMap<String, u64>,
    multixact_waits: u64,
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<Report> {
    let jobs: i64 = ctx.size(100_000, 2_000);
    let worker_counts = [1usize, 4, 16];
    crate::proc::reset_peak_rss();
    let url = ctx.postgres()?;
    let sheaf_schema = PgSchema::new(url, "bench_queue_sheaf");
    let savepoint_schema = PgSchema::new(url, "bench_queue_savepoint");
    for schema in [&sheaf_schema, &savepoint_schema] {
        let stores = sheaf_postgres::PostgresStores::new(schema.config(2))?;
        stores.migrate().await?;
        stores.close().await;
    }

    let progress = Progress::new(
        "queue: 6 runs",
        jobs as u64 * worker_counts.len() as u64 * 2,
    );
    let progress = Arc::new(progress);
    let mut measured = Vec::new();
    for workers in worker_counts {
        for design in [Design::Savepoint, Design::Sheaf] {
            let schema = match design {
                Design::Savepoint => &savepoint_schema,
                Design::Sheaf => &sheaf_schema,
            };
            fill(schema, jobs).await?;
            let m = match design {
                Design::Savepoint => run_savepoint(schema, jobs, workers, &progress).await,
                Design::Sheaf => run_sheaf(schema, jobs, workers, &progress).await,
            }
            .with_context(|| format!("{} with {workers} workers", design.label()))?;
            measured.push(m);
        }
    }
    progress.finish();
    let peak = crate::proc::peak_rss_kib(None);
    let plan = queue_sustained::plan(ctx);
    let sustained = queue_sustained::run(url, plan).await?;
    let mut report = build_report(ctx, jobs, measured, peak);
    report
        .tables
        .extend(queue_sustained::tables(&sustained, plan));
    report.note(
        "Sustained: claim and completion means are pg_stat_statements total_exec_time per call \
         over each window (deltas, filtered by the run's schema); dead and live tuples are \
         pg_stat_user_tables; the server's autovacuum_naptime bounds how often autovacuum visits \
         the table.",
    );
    if let serde_json::Value::Object(raw) = &mut report.raw {
        raw.insert(
            "sustained".to_owned(),
            serde_json::json!({ "plan": plan, "runs": sustained }),
        );
    }
    Ok(report)
}

/// `url` with `application_name` set, so the sampler can tell this run's backends apart.
fn tagged_url(url: &str, name: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}application_name={name}")
}

/// A fresh queue of `jobs` due jobs, due one millisecond apart in the past.
async fn fill(schema: &PgSchema, jobs: i64) -> anyhow::Result<()> {
    let table = schema.table("jobs");
    pg::execute(
        &schema.url,
        &format!(
            "TRUNCATE {table}; \
             INSERT INTO {table} (id, tenant_id, event_id, destination_id, attempt_number, \
                last_attempt_time, next_due_at) \
             SELECT gen_random_uuid(), 'tenant-' || (g % 20), 'evt-' || g, \
                '00000000-0000-7000-8000-000000000001'::uuid, 1, NULL, \
                now() - interval '1 hour' + g * interval '1 millisecond' \
             FROM generate_series(1, {jobs}) AS g"
        ),
    )
    .await?;
    // VACUUM cannot share a multi-statement string (an implicit transaction) with anything.
    pg::execute(&schema.url, &format!("VACUUM ANALYZE {table}")).await
}

/// Samples `pg_stat_activity` for backends named `app` until `stop` is set.
fn spawn_sampler(
    url: String,
    app: String,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<anyhow::Result<(u64, BTreeMap<String, u64>)>> {
    tokio::spawn(async move {
        let mut conn = pg::connect(&url).await?;
        let mut samples = 0;
        let mut waits = BTreeMap::new();
        // Bounded: an hour of samples at most, even if the stop signal were lost.
        for _ in 0..360_000 {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let rows: Vec<(String, String, i64)> = sqlx::query_as(
                "SELECT coalesce(wait_event_type, 'CPU'), coalesce(wait_event, 'running'), count(*) \
                 FROM pg_stat_activity WHERE application_name = $1 AND state = 'active' \
                 GROUP BY 1, 2",
            )
            .bind(&app)
            .fetch_all(&mut conn)
            .await?;
            samples += 1;
            for (kind, event, n) in rows {
                *waits.entry(format!("{kind}:{event}")).or_insert(0) += n as u64;
            }
            tokio::time::sleep(SAMPLE_EVERY).await;
        }
        conn.close().await?;
        Ok((samples, waits))
    })
}

fn multixact(waits: &BTreeMap<String, u64>) -> u64 {
    waits
        .iter()
        .filter(|(k, _)| k.starts_with("LWLock:MultiXact"))
        .map(|(_, n)| n)
        .sum()
}

async fn run_savepoint(
    schema: &PgSchema,
    jobs: i64,
    workers: usize,
    progress: &Arc<Progress>,
) -> anyhow::Result<Measured> {
    let app = format!("{}_w{workers}", schema.schema);
    let url = tagged_url(&schema.url, &app);
    let table = schema.table("jobs");
    let mut conns = Vec::with_capacity(workers);
    for _ in 0..workers {
        conns.push(pg::connect(&url).await?);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = spawn_sampler(schema.url.clone(), app, Arc::clone(&stop));
    let claim_sql = format!(
        "SELECT id FROM {table} WHERE next_due_at <= now() \
         ORDER BY next_due_at, id LIMIT {SAVEPOINT_CLAIM} FOR UPDATE SKIP LOCKED"
    );
    let delete_sql = format!("DELETE FROM {table} WHERE id = $1");
    let started = Instant::now();
    let mut tasks = Vec::new();
    for mut conn in conns {
        let (claim_sql, delete_sql, progress) =
            (claim_sql.clone(), delete_sql.clone(), Arc::clone(progress));
        tasks.push(tokio::spawn(async move {
            let (mut done, mut claims) = (0u64, 0u64);
            // Bounded by the job count: every round completes at least one job or ends.
            for _ in 0..=jobs {
                let mut tx = conn.begin().await?;
                let ids: Vec<uuid::Uuid> =
                    sqlx::query_scalar(&claim_sql).fetch_all(&mut *tx).await?;
                if ids.is_empty() {
                    // Whatever is left is held by other workers, who will finish it.
                    tx.commit().await?;
                    break;
                }
                claims += 1;
                for id in &ids {
                    sqlx::query("SAVEPOINT job").execute(&mut *tx).await?;
                    sqlx::query(&delete_sql).bind(id).execute(&mut *tx).await?;
                    sqlx::query("RELEASE SAVEPOINT job")
                        .execute(&mut *tx)
                        .await?;
                }
                tx.commit().await?;
                done += ids.len() as u64;
                progress.inc(ids.len() as u64);
            }
            conn.close().await?;
            anyhow::Ok((done, claims))
        }));
    }
    let (mut done, mut claims) = (0, 0);
    for task in tasks {
        let (d, c) = task.await.context("a savepoint worker panicked")??;
        done += d;
        claims += c;
    }
    let seconds = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let (samples, waits) = sampler.await.context("the sampler panicked")??;
    ensure!(done == jobs as u64, "{done} of {jobs} jobs completed");
    Ok(Measured {
        design: Design::Savepoint,
        workers,
        jobs: done,
        seconds,
        jobs_per_s: done as f64 / seconds,
        claims,
        samples,
        multixact_waits: multixact(&waits),
        waits,
    })
}

async fn run_sheaf(
    schema: &PgSchema,
    jobs: i64,
    workers: usize,
    progress: &Arc<Progress>,
) -> anyhow::Result<Measured> {
    let app = format!("{}_w{workers}", schema.schema);
    let mut config = schema.config(10);
    config.url = tagged_url(&schema.url, &app);
    let stores = sheaf_postgres::PostgresStores::new(config)?;
    let queue = stores.job_queue();
    // Open the connections before the clock starts: connecting is not what is measured.
    queue.depth().await?;

    let stop = Arc::new(AtomicBool::new(false));
    let sampler = spawn_sampler(schema.url.clone(), app, Arc::clone(&stop));
    let started = Instant::now();

    let (jobs_tx, jobs_rx) = mpsc::channel::<Lease>(workers);
    let jobs_rx = Arc::new(Mutex::new(jobs_rx));
    let (done_tx, mut done_rx) = mpsc::channel::<Lease>(COMPLETER_MAX * 4);

    let completer = {
        let (queue, progress) = (Arc::clone(&queue), Arc::clone(progress));
        tokio::spawn(async move {
            let mut completed = 0u64;
            let mut batch = Vec::with_capacity(COMPLETER_MAX);
            while gather_outcomes(&mut done_rx, &mut batch).await {
                let lost = queue.complete(&batch).await?;
                ensure!(lost.is_empty(), "{} leases lost", lost.len());
                completed += batch.len() as u64;
                progress.inc(batch.len() as u64);
                batch.clear();
            }
            anyhow::Ok(completed)
        })
    };

    let worker_tasks = noop_workers(workers, &jobs_rx, done_tx);

    let dispatcher = {
        let queue = Arc::clone(&queue);
        tokio::spawn(async move {
            let mut claims = 0u64;
            let mut claimed_total = 0u64;
            // Bounded: each round claims at least one job or ends the loop.
            for _ in 0..=(jobs as u64 * 2) {
                let room = jobs_tx.capacity();
                if room == 0 {
                    // Wait for a worker to take one; the permit is only a signal.
                    drop(jobs_tx.reserve().await?);
                    continue;
                }
                let claimed = queue.claim(room, LEASE).await?;
                claims += 1;
                if claimed.is_empty() {
                    break;
                }
                claimed_total += claimed.len() as u64;
                for job in claimed {
                    jobs_tx.send(job.lease).await?;
                }
            }
            anyhow::Ok((claims, claimed_total))
        })
    };

    let (claims, claimed) = dispatcher.await.context("the dispatcher panicked")??;
    for task in worker_tasks {
        task.await.context("a worker panicked")?;
    }
    let completed = completer.await.context("the completer panicked")??;
    let seconds = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let (samples, waits) = sampler.await.context("the sampler panicked")??;
    stores.close().await;
    ensure!(
        claimed == jobs as u64 && completed == jobs as u64,
        "{claimed} claimed and {completed} completed of {jobs}"
    );
    Ok(Measured {
        design: Design::Sheaf,
        workers,
        jobs: completed,
        seconds,
        jobs_per_s: completed as f64 / seconds,
        claims,
        samples,
        multixact_waits: multixact(&waits),
        waits,
    })
}

/// The three most frequent wait events other than plain running, as `event (n)`.
fn top_waits(waits: &BTreeMap<String, u64>) -> String {
    let mut list: Vec<(&String, &u64)> = waits
        .iter()
        .filter(|(k, _)| k.as_str() != "CPU:running")
        .collect();
    list.sort_by(|a, b| b.1.cmp(a.1));
    let shown: Vec<String> = list
        .iter()
        .take(3)
        .map(|(k, n)| format!("{k} ({n})"))
        .collect();
    if shown.is_empty() {
        "—".to_owned()
    } else {
        shown.join(", ")
    }
}

fn build_report(ctx: &Ctx, jobs: i64, measured: Vec<Measured>, peak_kib: Option<u64>) -> Report {
    let mut report = Report::new("queue", QUESTION, ctx);
    let find = |design: Design, workers: usize| {
        measured
            .iter()
            .find(|m| m.design == design && m.workers == workers)
    };
    let mut table = Table::new(
        format!(
            "{} no-op jobs per run, wall time from first claim to last completion; waits sampled every {} ms",
            report::count(jobs as f64),
            SAMPLE_EVERY.as_millis()
        ),
        &[
            "workers",
            "savepoint jobs/s",
            "Sheaf jobs/s",
            "Sheaf ÷ savepoint",
            "MultiXact LWLock waits (savepoint / Sheaf)",
            "top waits, savepoint",
            "top waits, Sheaf",
        ],
    );
    let mut workers_seen: Vec<usize> = measured.iter().map(|m| m.workers).collect();
    workers_seen.dedup();
    for workers in &workers_seen {
        let (Some(s), Some(q)) = (
            find(Design::Savepoint, *workers),
            find(Design::Sheaf, *workers),
        ) else {
            continue;
        };
        table.row(vec![
            workers.to_string(),
            report::count(s.jobs_per_s),
            report::count(q.jobs_per_s),
            report::ratio(q.jobs_per_s / s.jobs_per_s),
            format!("{} / {}", s.multixact_waits, q.multixact_waits),
            top_waits(&s.waits),
            top_waits(&q.waits),
        ]);
    }
    report.tables.push(table);
    if let (Some(s), Some(q)) = (find(Design::Savepoint, 16), find(Design::Sheaf, 16)) {
        let ratio = q.jobs_per_s / s.jobs_per_s;
        report.target(
            "queue throughput at 16 workers, Sheaf against savepoints",
            "at least 3.5x",
            format!(
                "{} vs {} jobs/s = {}",
                report::count(q.jobs_per_s),
                report::count(s.jobs_per_s),
                report::ratio(ratio)
            ),
            ratio >= 3.5,
        );
    }
    report.memory.push(PeakRss::new(
        "sheaf-bench (Sheaf's queue client, in process)",
        peak_kib,
    ));
    report.note(
        "Postgres cost is wall time at saturation (jobs/s over the whole burn-down), not \
         pg_stat_statements; the bench process, its workers and Postgres share the 2 cores.",
    );
    report.note(
        "Waits count active backends of the run per pg_stat_activity sample; CPU:running is a \
         backend with no wait event (on CPU, or between statements).",
    );
    let series = |design: Design| {
        (
            design.label().to_owned(),
            measured
                .iter()
                .filter(|m| m.design == design)
                .map(|m| (m.workers as f64, m.jobs_per_s))
                .collect::<Vec<_>>(),
        )
    };
    report.figure = Some(
        Figure::new("queue: no-op jobs burned down on Postgres")
            .panel(Panel::Lines {
                title: "jobs per second by workers".to_owned(),
                x_label: "workers".to_owned(),
                y_label: "jobs/s".to_owned(),
                log_y: false,
                series: vec![series(Design::Savepoint), series(Design::Sheaf)],
            })
            .panel(Panel::Bars {
                title: "MultiXact LWLock waits sampled".to_owned(),
                unit: "active backends waiting, summed over samples".to_owned(),
                log: false,
                bars: measured
                    .iter()
                    .map(|m| {
                        Bar::new(
                            format!(
                                "{}, {} workers",
                                match m.design {
                                    Design::Savepoint => "savepoint",
                                    Design::Sheaf => "Sheaf",
                                },
                                m.workers
                            ),
                            m.multixact_waits as f64,
                            m.design as usize,
                        )
                    })
                    .collect(),
            }),
    );
    report.raw = serde_json::json!({ "jobs": jobs, "runs": measured });
    report
}

/// Fills `batch` the way the service's completer does: waits for a first finished job, then
/// gathers more for `COMPLETER_INTERVAL` or up to `COMPLETER_MAX`. `false` once the channel is
/// closed and empty.
pub(super) async fn gather_outcomes(
    done: &mut mpsc::Receiver<Lease>,
    batch: &mut Vec<Lease>,
) -> bool {
    let Some(first) = done.recv().await else {
        return false;
    };
    batch.push(first);
    let deadline = tokio::time::Instant::now() + COMPLETER_INTERVAL;
    while batch.len() < COMPLETER_MAX {
        match tokio::time::timeout_at(deadline, done.recv()).await {
            Ok(Some(lease)) => batch.push(lease),
            Ok(None) | Err(_) => break,
        }
    }
    true
}

/// `count` workers that take claimed jobs from `jobs` and hand each straight to `done`: the job
/// itself does nothing, so what is measured is the queue. They stop when either channel closes.
pub(super) fn noop_workers(
    count: usize,
    jobs: &Arc<Mutex<mpsc::Receiver<Lease>>>,
    done: mpsc::Sender<Lease>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..count)
        .map(|_| {
            let (jobs, done) = (Arc::clone(jobs), done.clone());
            tokio::spawn(async move {
                loop {
                    let next = jobs.lock().await.recv().await;
                    let Some(lease) = next else { break };
                    if done.send(lease).await.is_err() {
                        break;
                    }
                }
            })
        })
        .collect()
}
