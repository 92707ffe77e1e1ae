//! The Postgres queue and ClickHouse under a steady phase: the jobs table's live and dead
//! tuples and the claim statement's mean time, sampled every few seconds from
//! `pg_stat_user_tables` and `pg_stat_statements`, and ClickHouse's new parts per minute from
//! `system.part_log`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::Serialize;

use crate::ch::{self, ChDb};
use crate::pg::{self, PgSchema};

/// One reading of the jobs table and the claim statement.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct QueueSample {
    /// Seconds since the sampler started.
    pub at_s: f64,
    pub live: i64,
    pub dead: i64,
    pub autovacuums: i64,
    /// Claim statements so far, and their total execution time (ms).
    pub claim_calls: i64,
    pub claim_ms: f64,
}

/// The queue over a steady phase.
#[derive(Debug, Clone, Default, Serialize)]
pub struct QueueOverTime {
    pub samples: Vec<QueueSample>,
    /// Claim mean (ms) over the phase's first and last minute (or first and last half, if
    /// shorter).
    pub claim_first_ms: f64,
    pub claim_last_ms: f64,
    pub max_dead: i64,
    /// ClickHouse parts created per minute over the phase, all of the database's tables.
    pub parts_per_minute: Option<f64>,
}

/// Samples until stopped.
pub struct Sampler {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<anyhow::Result<Vec<QueueSample>>>,
    parts_before: Option<u64>,
    started: Instant,
}

impl Sampler {
    pub async fn start(
        schema: &PgSchema,
        clickhouse: Option<&ChDb>,
        every: Duration,
    ) -> anyhow::Result<Self> {
        let parts_before = match clickhouse {
            Some(db) => Some(new_parts(db).await?),
            None => None,
        };
        let stop = Arc::new(AtomicBool::new(false));
        let (url, name) = (schema.url.clone(), schema.schema.clone());
        let flag = Arc::clone(&stop);
        let task = tokio::spawn(async move {
            let mut conn = pg::connect(&url).await?;
            let t0 = Instant::now();
            let mut samples = Vec::new();
            loop {
                samples.push(sample(&mut conn, &name, t0).await?);
                if flag.load(Ordering::Relaxed) {
                    return Ok(samples);
                }
                let deadline = Instant::now() + every;
                while Instant::now() < deadline && !flag.load(Ordering::Relaxed) {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        });
        Ok(Self {
            stop,
            task,
            parts_before,
            started: Instant::now(),
        })
    }

    pub async fn finish(self, clickhouse: Option<&ChDb>) -> anyhow::Result<QueueOverTime> {
        self.stop.store(true, Ordering::Relaxed);
        let samples = self.task.await??;
        let minutes = self.started.elapsed().as_secs_f64() / 60.0;
        let parts_per_minute = match (clickhouse, self.parts_before) {
            (Some(db), Some(before)) => {
                Some((new_parts(db).await?.saturating_sub(before)) as f64 / minutes.max(1e-9))
            }
            _ => None,
        };
        let span = samples.last().map_or(0.0, |s| s.at_s);
        let window = 60.0_f64.min(span / 2.0);
        let mean = |from: f64, to: f64| {
            let at = |t: f64| {
                samples
                    .iter()
                    .min_by(|a, b| (a.at_s - t).abs().total_cmp(&(b.at_s - t).abs()))
                    .copied()
            };
            match (at(from), at(to)) {
                (Some(a), Some(b)) if b.claim_calls > a.claim_calls => {
                    (b.claim_ms - a.claim_ms) / (b.claim_calls - a.claim_calls) as f64
                }
                _ => f64::NAN,
            }
        };
        Ok(QueueOverTime {
            claim_first_ms: mean(0.0, window),
            claim_last_ms: mean(span - window, span),
            max_dead: samples.iter().map(|s| s.dead).max().unwrap_or(0),
            samples,
            parts_per_minute,
        })
    }
}

async fn sample(
    conn: &mut sqlx::PgConnection,
    schema: &str,
    t0: Instant,
) -> anyhow::Result<QueueSample> {
    let (live, dead, autovacuums): (i64, i64, i64) = sqlx::query_as(
        "SELECT n_live_tup, n_dead_tup, autovacuum_count FROM pg_stat_user_tables \
         WHERE schemaname = $1 AND relname = 'jobs'",
    )
    .bind(schema)
    .fetch_one(&mut *conn)
    .await
    .context("read pg_stat_user_tables")?;
    // The claim is the statement that sets `claimed_until` and skips locked rows (the outbox's
    // shipment skips locked rows too, but sets nothing).
    let claim =
        pg::statement_totals_all(&mut *conn, &[schema, "SET claimed_until", "SKIP LOCKED"]).await?;
    Ok(QueueSample {
        at_s: t0.elapsed().as_secs_f64(),
        live,
        dead,
        autovacuums,
        claim_calls: claim.calls,
        claim_ms: claim.exec_ms,
    })
}

async fn new_parts(db: &ChDb) -> anyhow::Result<u64> {
    let client = db.client();
    ch::flush_logs(&client).await?;
    client
        .query("SELECT count() FROM system.part_log WHERE database = ? AND event_type = 'NewPart'")
        .bind(db.database.as_str())
        .fetch_one::<u64>()
        .await
        .context("read system.part_log")
}
