//! How one `lookup` variant is measured: its queries one at a time on keys of its own (the cost
//! per key, from `system.query_log` or `pg_stat_statements`), then from several clients at once
//! for a fixed time (lookups per second).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use anyhow::{Context as _, bail, ensure};
use sheaf_store::AttemptKey;

use super::{Measured, Runner, Sizes, Store, Variant, runner};
use crate::ch::{self, ChDb};
use crate::pg::{self, PgSchema, StatementTotals};
use crate::progress::Progress;
use crate::report;

#[allow(clippy::too_many_arguments)]
pub(super) async fn measure(
    db: &ChDb,
    stores: &sheaf_postgres::PostgresStores,
    pg_schema: &PgSchema,
    pg_conn: &mut sqlx::PgConnection,
    sizes: &Sizes,
    variant: Variant,
    keys: &[AttemptKey],
    pool: &[AttemptKey],
    progress: &Progress,
) -> anyhow::Result<Measured> {
    let per = variant.keys_per_query;
    let tag = format!("{}-{}", db.database, variant.slug());
    let sat_tag = format!("{tag}-sat");
    let is_pg = variant.store == Store::Postgres;

    // Sequential: one query at a time, distinct keys.
    let runner_seq = runner(db, stores, variant, &tag)?;
    let before = if is_pg {
        pg::statement_totals(pg_conn, &pg_schema.schema).await?
    } else {
        StatementTotals::default()
    };
    let mut latencies = Vec::with_capacity(variant.queries);
    for batch in keys.chunks(per) {
        let started = Instant::now();
        let found = runner_seq.lookup(batch).await?;
        latencies.push(started.elapsed().as_secs_f64() * 1000.0);
        ensure!(
            found == batch.len(),
            "{found} of {} keys found",
            batch.len()
        );
    }
    let (cpu_ms_per_key, read_bytes_per_key, queries) = if is_pg {
        let delta = pg::statement_totals(pg_conn, &pg_schema.schema)
            .await?
            .since(before);
        let keys = keys.len() as f64;
        (
            delta.exec_ms / keys,
            delta.blocks as f64 * 8192.0 / keys,
            Vec::new(),
        )
    } else {
        let costs = ch::query_costs(&db.client(), &tag, "Select", variant.queries).await?;
        if costs.len() != variant.queries {
            bail!(
                "{} queries logged for {} lookups: each lookup must be one query",
                costs.len(),
                variant.queries
            );
        }
        let cpu = report::median(
            costs
                .iter()
                .map(|c| c.cpu_micros as f64 / 1000.0 / per as f64)
                .collect(),
        );
        let bytes = report::median(
            costs
                .iter()
                .map(|c| c.read_bytes as f64 / per as f64)
                .collect(),
        );
        (cpu, bytes, costs)
    };
    progress.inc(1);

    // Saturation: several clients, back to back, for a fixed time, over the whole key pool.
    let runner_sat = Arc::new(runner(db, stores, variant, &sat_tag)?);
    let pool = Arc::new(pool.to_vec());
    let answered = Arc::new(AtomicU64::new(0));
    let issued = Arc::new(AtomicU64::new(0));
    let before = if is_pg {
        pg::statement_totals(pg_conn, &pg_schema.schema).await?
    } else {
        StatementTotals::default()
    };
    let started = Instant::now();
    let deadline = started + sizes.saturation;
    let windows = (pool.len() / per).max(1);
    let mut tasks = Vec::new();
    let clients = sizes.clients;
    for client in 0..clients {
        let (runner, pool, answered, issued) = (
            Arc::clone(&runner_sat),
            Arc::clone(&pool),
            Arc::clone(&answered),
            Arc::clone(&issued),
        );
        tasks.push(tokio::spawn(async move {
            // Clients start at different windows so they do not ask the same keys together.
            let first = client * windows / clients;
            // Bounded by time, and by count in case the clock misbehaves.
            for step in 0..1_000_000 {
                if Instant::now() >= deadline {
                    break;
                }
                let at = ((first + step) % windows) * per;
                let batch = &pool[at..(at + per).min(pool.len())];
                issued.fetch_add(1, Ordering::Relaxed);
                let found = runner.lookup(batch).await?;
                answered.fetch_add(found as u64, Ordering::Relaxed);
            }
            anyhow::Ok(())
        }));
    }
    for task in tasks {
        task.await.context("a saturation client panicked")??;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let answered = answered.load(Ordering::Relaxed);
    let issued = issued.load(Ordering::Relaxed);
    let saturated_cpu_ms_per_key = if is_pg {
        let delta = pg::statement_totals(pg_conn, &pg_schema.schema)
            .await?
            .since(before);
        delta.exec_ms / answered.max(1) as f64
    } else {
        let costs = ch::query_costs(&db.client(), &sat_tag, "Select", issued as usize).await?;
        costs.iter().map(|c| c.cpu_micros as f64).sum::<f64>() / 1000.0 / answered.max(1) as f64
    };
    progress.inc(1);
    if let Runner::Sheaf(store) = runner_seq {
        drop(store);
    }
    Ok(Measured {
        variant,
        cpu_ms_per_key,
        read_bytes_per_key,
        latency_ms: report::median(latencies),
        keys_per_s: answered as f64 / elapsed,
        saturated_cpu_ms_per_key,
        saturated_queries: issued,
        queries,
    })
}
