//! What `queue`'s burn-down measures: a table filled with due no-op jobs, burnt down by each
//! design with 1, 4 and 16 workers, and while it runs the connections' wait events, sampled
//! every 10 ms from `pg_stat_activity`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use anyhow::{Context as _, ensure};
use sheaf_store::Lease;
use sqlx::Connection as _;
use tokio::sync::{Mutex, mpsc};

use super::{
    COMPLETER_INTERVAL, COMPLETER_MAX, Design, LEASE, Measured, SAMPLE_EVERY, SAVEPOINT_CLAIM,
};
use crate::pg::{self, PgSchema};
use crate::progress::Progress;

/// `url` with `application_name` set, so the sampler can tell this run's backends apart.
fn tagged_url(url: &str, name: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}application_name={name}")
}

/// A fresh queue of `jobs` due jobs, due one millisecond apart in the past.
pub(super) async fn fill(schema: &PgSchema, jobs: i64) -> anyhow::Result<()> {
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

pub(super) async fn run_savepoint(
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

pub(super) async fn run_sheaf(
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
