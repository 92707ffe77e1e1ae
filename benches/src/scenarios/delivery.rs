//! `delivery`: events per second from publish to a 2xx at a local receiver, and publish-to-
//! delivery latency, through a real `sheaf serve` process on the memory backends, on Postgres
//! alone (queue, tenants and log) and on Postgres (queue, tenants) + ClickHouse (log). Each phase
//! also reports the publish latency a client sees (request to its 202).
//!
//! Per backend, after a warm-up: a **saturation** phase publishes a fixed number of events from
//! 32 concurrent publishers and measures from the first publish to the last delivery; a **steady**
//! phase publishes at 2,000 events/s (full size) and measures latency and the process's peak RSS,
//! the memory target for Postgres + ClickHouse (docs/benchmarks.md, "Targets at a glance"). The
//! memory backends run twice, the second time with every span exported to an OTLP sink, so
//! tracing's cost is measured beside the run without it. On the memory backend the growth of
//! the resident set over the saturation phase, divided by its events (all retained: fewer than
//! the 25,000-event retention), less the payload, is the overhead per retained event.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::Serialize;
use sheaf_testenv::receiver::Receiver;

use crate::ch::ChDb;
use crate::context::Ctx;
use crate::load::{self, Pace};
use crate::pg::PgSchema;
use crate::progress::Progress;
use crate::report::{self, Report};
use crate::sheaf::Sheaf;

use super::delivery_queue::{QueueOverTime, Sampler};
use super::delivery_report::build_report;

pub(super) const QUESTION: &str = "How many events per second does one `sheaf` process deliver from publish \
    to a 2xx at a local receiver, with what latency and memory, on the memory backends and on \
    Postgres + ClickHouse?";

/// The bytes of each event's `pad` (the payload is `{"seq": n, "pad": "…"}`).
pub(super) const PAD_BYTES: usize = 1_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(super) enum Backend {
    Memory,
    /// The memory backends with every span exported to an OTLP/HTTP sink (`SHEAF_OTLP_ENDPOINT`):
    /// what tracing costs, side by side with the run without it.
    MemoryTraced,
    Postgres,
    PostgresClickHouse,
}

impl Backend {
    pub(super) fn label(self) -> &'static str {
        match self {
            Backend::Memory => "memory",
            Backend::MemoryTraced => "memory, traces exported",
            Backend::Postgres => "Postgres + Postgres",
            Backend::PostgresClickHouse => "Postgres + ClickHouse",
        }
    }
}

/// Development knobs, for profiling one configuration without the whole run: a comma-separated
/// subset of `memory,traced,postgres,clickhouse` and a steady phase length in seconds. The figures in
/// docs/benchmarks.md always come from a run without them.
const BACKENDS_VAR: &str = "SHEAF_BENCH_DELIVERY_BACKENDS";
const STEADY_SECONDS_VAR: &str = "SHEAF_BENCH_DELIVERY_STEADY_SECONDS";
/// And the traced run's `SHEAF_OTLP_SAMPLE_PERCENT` (100 by default, as the service's).
const TRACE_PERCENT_VAR: &str = "SHEAF_BENCH_DELIVERY_TRACE_PERCENT";

fn backends() -> anyhow::Result<Vec<Backend>> {
    let all = vec![
        Backend::Memory,
        Backend::MemoryTraced,
        Backend::Postgres,
        Backend::PostgresClickHouse,
    ];
    let Ok(list) = std::env::var(BACKENDS_VAR) else {
        return Ok(all);
    };
    list.split(',')
        .map(|name| match name.trim() {
            "memory" => Ok(Backend::Memory),
            "traced" => Ok(Backend::MemoryTraced),
            "postgres" => Ok(Backend::Postgres),
            "clickhouse" => Ok(Backend::PostgresClickHouse),
            other => anyhow::bail!(
                "{BACKENDS_VAR}: unknown backend `{other}`; expected memory, traced, postgres or clickhouse"
            ),
        })
        .collect()
}

#[derive(Debug, Clone, Copy, Serialize)]
pub(super) struct Sizes {
    pub(super) warmup: usize,
    pub(super) saturation_events: usize,
    pub(super) publishers: usize,
    pub(super) steady_rate: f64,
    pub(super) steady_seconds: f64,
    /// Postgres + ClickHouse's steady phase: long enough for the queue's dead tuples, vacuum
    /// and the claim's plan to show what they do over minutes.
    pub(super) long_steady_seconds: f64,
    /// How often the queue is sampled during a steady phase.
    pub(super) sample_every_s: f64,
}

#[derive(Debug, Clone, Serialize)]
pub(super) struct Phase {
    pub(super) published: usize,
    pub(super) refused: u64,
    pub(super) errors: u64,
    pub(super) delivered: usize,
    /// Delivered events ÷ (last delivery − first publish).
    pub(super) events_per_s: f64,
    /// Publishes per second the load achieved.
    pub(super) publish_rate: f64,
    pub(super) p50_ms: f64,
    pub(super) p99_ms: f64,
    pub(super) max_ms: f64,
    /// Publish latency (request to 202) of the accepted publishes.
    pub(super) publish_p50_ms: f64,
    pub(super) publish_p99_ms: f64,
}

#[derive(Debug, Clone, Serialize)]
pub(super) struct Measured {
    pub(super) backend: Backend,
    pub(super) saturation: Phase,
    pub(super) steady: Phase,
    pub(super) rss_before_kib: u64,
    pub(super) rss_after_saturation_kib: u64,
    /// Memory backend: (RSS growth ÷ events) − payload JSON bytes.
    pub(super) overhead_per_event_bytes: Option<f64>,
    pub(super) peak_rss_mib: f64,
    /// Postgres backends: the queue over the steady phase.
    pub(super) queue: Option<QueueOverTime>,
    /// With traces exported: the exports the OTLP sink received.
    pub(super) trace_exports: Option<usize>,
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<Report> {
    let sizes = Sizes {
        warmup: ctx.size(500, 50),
        saturation_events: ctx.size(20_000, 300),
        publishers: 32,
        steady_rate: ctx.size(2_000.0, 100.0),
        steady_seconds: ctx.size(30.0, 2.0),
        long_steady_seconds: ctx.size(300.0, 3.0),
        sample_every_s: ctx.size(5.0, 0.5),
    };
    let mut sizes = sizes;
    if let Some(seconds) = std::env::var(STEADY_SECONDS_VAR)
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
    {
        sizes.steady_seconds = seconds;
        sizes.long_steady_seconds = seconds;
    }
    let bin = ctx.sheaf_bin()?.to_path_buf();
    let mut measured = Vec::new();
    for backend in backends()? {
        let m = run_backend(ctx, &bin, &sizes, backend)
            .await
            .with_context(|| backend.label())?;
        measured.push(m);
    }
    Ok(build_report(ctx, &sizes, measured))
}

async fn run_backend(
    ctx: &Ctx,
    bin: &std::path::Path,
    sizes: &Sizes,
    backend: Backend,
) -> anyhow::Result<Measured> {
    let base = Instant::now();
    let receiver = Receiver::start().await?;
    let mut env = Vec::new();
    let mut guards = (None, None);
    if backend == Backend::Postgres {
        let schema = PgSchema::new(ctx.postgres()?, "bench_delivery");
        env.push(("SHEAF_LOG_STORE", "postgres".to_owned()));
        env.push(("SHEAF_QUEUE", "postgres".to_owned()));
        env.push(("SHEAF_POSTGRES_URL", schema.url.clone()));
        env.push(("SHEAF_POSTGRES_SCHEMA", schema.schema.clone()));
        guards = (Some(schema), None);
    }
    if backend == Backend::PostgresClickHouse {
        let schema = PgSchema::new(ctx.postgres()?, "bench_delivery");
        let db = ChDb::new(ctx.clickhouse()?, "bench_delivery");
        env.push(("SHEAF_LOG_STORE", "clickhouse".to_owned()));
        env.push(("SHEAF_QUEUE", "postgres".to_owned()));
        env.push(("SHEAF_POSTGRES_URL", schema.url.clone()));
        env.push(("SHEAF_POSTGRES_SCHEMA", schema.schema.clone()));
        env.push(("SHEAF_CLICKHOUSE_URL", db.url.clone()));
        env.push(("SHEAF_CLICKHOUSE_DATABASE", db.database.clone()));
        guards = (Some(schema), Some(db));
    }
    // The OTLP sink: a second receiver, answering every export 200 (an empty response).
    let sink = match backend {
        Backend::MemoryTraced => {
            let sink = Receiver::start().await?;
            // Any path is answered; the exporter posts to `<endpoint>/v1/traces`.
            env.push((
                "SHEAF_OTLP_ENDPOINT",
                sink.url().trim_end_matches("/hook").to_owned(),
            ));
            if let Ok(percent) = std::env::var(TRACE_PERCENT_VAR) {
                env.push(("SHEAF_OTLP_SAMPLE_PERCENT", percent));
            }
            Some(sink)
        }
        _ => None,
    };
    let log = ctx
        .out_dir
        .join("logs")
        .join(format!("delivery-{backend:?}.log").to_lowercase());
    let sheaf = Sheaf::start(bin, &env, &log).await?;
    sheaf.add_destination("bench", &receiver.url()).await?;
    let publisher = sheaf.publisher("bench");
    let pad = Arc::new("x".repeat(PAD_BYTES));
    let payload_bytes =
        serde_json::to_vec(&serde_json::json!({ "seq": 12345, "pad": *pad }))?.len();

    let steady_seconds = if backend == Backend::PostgresClickHouse {
        sizes.long_steady_seconds
    } else {
        sizes.steady_seconds
    };
    let total =
        sizes.warmup + sizes.saturation_events + (sizes.steady_rate * steady_seconds) as usize;
    let progress = Arc::new(Progress::new(
        format!("delivery: {}", backend.label()),
        total as u64,
    ));
    // Warm-up: connections, caches, first parts; not measured.
    let warm = load::publish(
        &publisher,
        base,
        0,
        sizes.warmup,
        Pace::Saturate(8),
        Arc::clone(&pad),
        &progress,
    )
    .await;
    let warm_ok = sizes.warmup - (warm.refused + warm.errors) as usize;
    receiver
        .wait_for_count(warm_ok, Duration::from_secs(60))
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_before_kib = sheaf.rss_kib().unwrap_or(0);

    let first = 1_000_000;
    receiver.reset();
    let sat = load::publish(
        &publisher,
        base,
        first,
        sizes.saturation_events,
        Pace::Saturate(sizes.publishers),
        Arc::clone(&pad),
        &progress,
    )
    .await;
    let accepted = sizes.saturation_events - (sat.refused + sat.errors) as usize;
    receiver
        .wait_for_count(accepted, Duration::from_secs(300))
        .await;
    let saturation = phase(&sat, first, &receiver, base);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_after_saturation_kib = sheaf.rss_kib().unwrap_or(0);

    let first = 2_000_000;
    receiver.reset();
    let steady_count = (sizes.steady_rate * steady_seconds) as usize;
    let every = Duration::from_secs_f64(sizes.sample_every_s);
    let sampler = match &guards.0 {
        Some(schema) => Some(Sampler::start(schema, guards.1.as_ref(), every).await?),
        None => None,
    };
    let steady_sent = load::publish(
        &publisher,
        base,
        first,
        steady_count,
        Pace::Rate(sizes.steady_rate),
        Arc::clone(&pad),
        &progress,
    )
    .await;
    let accepted = steady_count - (steady_sent.refused + steady_sent.errors) as usize;
    receiver
        .wait_for_count(accepted, Duration::from_secs(300))
        .await;
    let steady = phase(&steady_sent, first, &receiver, base);
    let queue = match sampler {
        Some(sampler) => Some(sampler.finish(guards.1.as_ref()).await?),
        None => None,
    };
    progress.finish();
    let peak_rss_mib = sheaf.peak_rss_kib().unwrap_or(0) as f64 / 1024.0;
    sheaf.stop().await?;
    drop(guards);
    let trace_exports = sink.map(|sink| sink.requests().0);

    let overhead_per_event_bytes = (backend == Backend::Memory).then(|| {
        let growth = rss_after_saturation_kib.saturating_sub(rss_before_kib) as f64 * 1024.0;
        growth / saturation.delivered.max(1) as f64 - payload_bytes as f64
    });
    Ok(Measured {
        backend,
        saturation,
        steady,
        rss_before_kib,
        rss_after_saturation_kib,
        overhead_per_event_bytes,
        peak_rss_mib,
        queue,
        trace_exports,
    })
}

fn phase(sent: &load::Sent, first: u64, receiver: &Receiver, base: Instant) -> Phase {
    let delivered_at = load::delivered_at(receiver, base);
    let (lat, last) = load::latencies(sent, first, &delivered_at);
    let start = sent.started_micros.iter().copied().min().unwrap_or(0);
    let span = last.saturating_sub(start) as f64 / 1e6;
    Phase {
        published: sent.started_micros.len(),
        refused: sent.refused,
        errors: sent.errors,
        delivered: lat.len(),
        events_per_s: if span > 0.0 {
            lat.len() as f64 / span
        } else {
            0.0
        },
        publish_rate: sent.started_micros.len() as f64 / sent.elapsed.as_secs_f64().max(1e-9),
        p50_ms: report::percentile(lat.clone(), 50.0),
        p99_ms: report::percentile(lat.clone(), 99.0),
        max_ms: report::percentile(lat, 100.0),
        publish_p50_ms: report::percentile(publish_ms(sent), 50.0),
        publish_p99_ms: report::percentile(publish_ms(sent), 99.0),
    }
}

fn publish_ms(sent: &load::Sent) -> Vec<f64> {
    sent.publish_micros
        .iter()
        .map(|&us| us as f64 / 1000.0)
        .collect()
}
