//! `delivery`: events per second from publish to a 2xx at a local receiver, and publish-to-
//! delivery latency, through a real `sheaf serve` process on the memory backends, on Postgres
//! alone (queue, tenants and log) and on Postgres (queue, tenants) + ClickHouse (log). Each phase
//! also reports the publish latency a client sees (request to its 202).
//!
//! Per backend, after a warm-up: a **saturation** phase publishes a fixed number of events from
//! 32 concurrent publishers and measures from the first publish to the last delivery; a **steady**
//! phase publishes at 2,000 events/s (full size) and measures latency and the process's peak RSS,
//! the memory target for Postgres + ClickHouse (docs/benchmarks.md, "Targets at a glance"). On the
//! memory backend the growth of the
//! resident set over the saturation phase, divided by its events (all retained: fewer than the
//! 25,000-event retention), less the payload, is the overhead per retained event.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::Serialize;
use sheaf_testenv::receiver::Receiver;

use crate::ch::ChDb;
use crate::context::Ctx;
use crate::load::{self, Pace};
use crate::pg::PgSchema;
use crate::plot::{Bar, Figure, Panel};
use crate::progress::Progress;
use crate::report::{self, PeakRss, Report, Table};
use crate::sheaf::Sheaf;

use super::delivery_queue::{QueueOverTime, Sampler};

const QUESTION: &str = "How many events per second does one `sheaf` process deliver from publish \
    to a 2xx at a local receiver, with what latency and memory, on the memory backends and on \
    Postgres + ClickHouse?";

/// The bytes of each event's `pad` (the payload is `{"seq": n, "pad": "…"}`).
const PAD_BYTES: usize = 1_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
enum Backend {
    Memory,
    Postgres,
    PostgresClickHouse,
}

impl Backend {
    fn label(self) -> &'static str {
        match self {
            Backend::Memory => "memory",
            Backend::Postgres => "Postgres + Postgres",
            Backend::PostgresClickHouse => "Postgres + ClickHouse",
        }
    }
}

/// Development knobs, for profiling one configuration without the whole run: a comma-separated
/// subset of `memory,postgres,clickhouse` and a steady phase length in seconds. The figures in
/// docs/benchmarks.md always come from a run without them.
const BACKENDS_VAR: &str = "SHEAF_BENCH_DELIVERY_BACKENDS";
const STEADY_SECONDS_VAR: &str = "SHEAF_BENCH_DELIVERY_STEADY_SECONDS";

fn backends() -> anyhow::Result<Vec<Backend>> {
    let all = vec![
        Backend::Memory,
        Backend::Postgres,
        Backend::PostgresClickHouse,
    ];
    let Ok(list) = std::env::var(BACKENDS_VAR) else {
        return Ok(all);
    };
    list.split(',')
        .map(|name| match name.trim() {
            "memory" => Ok(Backend::Memory),
            "postgres" => Ok(Backend::Postgres),
            "clickhouse" => Ok(Backend::PostgresClickHouse),
            other => anyhow::bail!(
                "{BACKENDS_VAR}: unknown backend `{other}`; expected memory, postgres or clickhouse"
            ),
        })
        .collect()
}

#[derive(Debug, Clone, Copy, Serialize)]
struct Sizes {
    warmup: usize,
    saturation_events: usize,
    publishers: usize,
    steady_rate: f64,
    steady_seconds: f64,
    /// Postgres + ClickHouse's steady phase: long enough for the queue's dead tuples, vacuum
    /// and the claim's plan to show what they do over minutes.
    long_steady_seconds: f64,
    /// How often the queue is sampled during a steady phase.
    sample_every_s: f64,
}

#[derive(Debug, Clone, Serialize)]
struct Phase {
    published: usize,
    refused: u64,
    errors: u64,
    delivered: usize,
    /// Delivered events ÷ (last delivery − first publish).
    events_per_s: f64,
    /// Publishes per second the load achieved.
    publish_rate: f64,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    /// Publish latency (request to 202) of the accepted publishes.
    publish_p50_ms: f64,
    publish_p99_ms: f64,
}

#[derive(Debug, Clone, Serialize)]
struct Measured {
    backend: Backend,
    saturation: Phase,
    steady: Phase,
    rss_before_kib: u64,
    rss_after_saturation_kib: u64,
    /// Memory backend: (RSS growth ÷ events) − payload JSON bytes.
    overhead_per_event_bytes: Option<f64>,
    peak_rss_mib: f64,
    /// Postgres backends: the queue over the steady phase.
    queue: Option<QueueOverTime>,
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

/// The Postgres queue and ClickHouse over the steady phases, and the throughput targets.
fn queue_report(report: &mut Report, sizes: &Sizes, measured: &[Measured]) {
    let mut table = Table::new(
        format!(
            "The queue during the steady phase (sampled every {:.1} s): the claim statement's \
             mean time over the first and the last minute (pg_stat_statements), the jobs table's \
             dead tuples, ClickHouse parts created per minute",
            sizes.sample_every_s
        ),
        &[
            "backend",
            "claim mean, first minute",
            "claim mean, last minute",
            "last ÷ first",
            "max n_dead_tup",
            "n_dead_tup over time",
            "autovacuums",
            "ClickHouse parts/min",
        ],
    );
    for m in measured {
        let Some(q) = &m.queue else { continue };
        let over_time: Vec<String> = q
            .samples
            .iter()
            .step_by((q.samples.len() / 12).max(1))
            .map(|s| format!("{:.0}s:{}", s.at_s, s.dead))
            .collect();
        table.row(vec![
            m.backend.label().to_owned(),
            format!("{:.3} ms", q.claim_first_ms),
            format!("{:.3} ms", q.claim_last_ms),
            report::ratio(q.claim_last_ms / q.claim_first_ms),
            report::count(q.max_dead as f64),
            over_time.join(" "),
            q.samples.last().map_or(0, |s| s.autovacuums).to_string(),
            q.parts_per_minute
                .map_or("–".to_owned(), |p| format!("{p:.1}")),
        ]);
    }
    report.tables.push(table);

    let memory = measured.iter().find(|m| m.backend == Backend::Memory);
    let memory_rate = memory.map_or(f64::NAN, |m| m.saturation.events_per_s);
    if let Some(m) = measured
        .iter()
        .find(|m| m.backend == Backend::PostgresClickHouse)
    {
        let s = &m.saturation;
        report.target(
            "Postgres + ClickHouse, closed loop (32 publishers, unique ids), publish → 2xx",
            "≥ 3,000 events/s and ≥ 0.5x memory in the same run, publish p50 ≤ 10 ms",
            format!(
                "{} events/s ({} memory), publish p50 {}",
                report::count(s.events_per_s),
                report::ratio(s.events_per_s / memory_rate),
                report::millis(s.publish_p50_ms)
            ),
            s.events_per_s >= 3_000.0
                && s.events_per_s >= 0.5 * memory_rate
                && s.publish_p50_ms <= 10.0,
        );
        let st = &m.steady;
        let q = m.queue.clone().unwrap_or_default();
        report.target(
            "Postgres + ClickHouse, open loop at a steady 2,000 events/s",
            "every event delivered, publish → 2xx p99 < 1 s, claim mean in the last minute within 2x of the first",
            format!(
                "{} of {} delivered, p99 {}, claim {:.3} → {:.3} ms",
                report::count(st.delivered as f64),
                report::count(st.published as f64),
                report::millis(st.p99_ms),
                q.claim_first_ms,
                q.claim_last_ms
            ),
            st.delivered >= st.published
                && st.p99_ms < 1_000.0
                && q.claim_last_ms <= 2.0 * q.claim_first_ms,
        );
    }
    if let Some(m) = measured.iter().find(|m| m.backend == Backend::Postgres) {
        report.target(
            "Postgres + Postgres, closed loop (32 publishers, unique ids), publish → 2xx",
            "≥ 4,000 events/s",
            format!("{} events/s", report::count(m.saturation.events_per_s)),
            m.saturation.events_per_s >= 4_000.0,
        );
    }
}

fn build_report(ctx: &Ctx, sizes: &Sizes, measured: Vec<Measured>) -> Report {
    let mut report = Report::new("delivery", QUESTION, ctx);
    let mut table = Table::new(
        format!(
            "One `sheaf serve`, one webhook destination on loopback, ~1 KB payloads; saturation: \
             {} events from {} publishers with unique ids; steady: {} events/s for {:.0} s \
             (Postgres + ClickHouse: {:.0} s)",
            report::count(sizes.saturation_events as f64),
            sizes.publishers,
            report::count(sizes.steady_rate),
            sizes.steady_seconds,
            sizes.long_steady_seconds
        ),
        &[
            "backend",
            "phase",
            "delivered / published",
            "events/s publish→2xx",
            "p50 latency",
            "p99 latency",
            "max latency",
            "publish p50 / p99",
            "events/s vs memory",
            "peak RSS (sheaf)",
        ],
    );
    let memory = measured.iter().find(|m| m.backend == Backend::Memory);
    for m in &measured {
        for (name, p) in [("saturation", &m.saturation), ("steady", &m.steady)] {
            let base = memory.map_or(f64::NAN, |b| {
                if name == "steady" {
                    b.steady.events_per_s
                } else {
                    b.saturation.events_per_s
                }
            });
            table.row(vec![
                m.backend.label().to_owned(),
                if name == "steady" {
                    format!("steady ({} /s offered)", report::count(p.publish_rate))
                } else {
                    name.to_owned()
                },
                format!(
                    "{} / {}",
                    report::count(p.delivered as f64),
                    report::count(p.published as f64)
                ),
                report::count(p.events_per_s),
                report::millis(p.p50_ms),
                report::millis(p.p99_ms),
                report::millis(p.max_ms),
                format!(
                    "{} / {}",
                    report::millis(p.publish_p50_ms),
                    report::millis(p.publish_p99_ms)
                ),
                report::ratio(p.events_per_s / base),
                format!("{:.1} MiB", m.peak_rss_mib),
            ]);
        }
    }
    report.tables.push(table);
    queue_report(&mut report, sizes, &measured);
    for m in &measured {
        report.memory.push(PeakRss::new(
            format!("sheaf serve ({})", m.backend.label()),
            Some((m.peak_rss_mib * 1024.0) as u64),
        ));
    }
    if let Some(m) = measured
        .iter()
        .find(|m| m.backend == Backend::PostgresClickHouse)
    {
        let steady_ok = m.steady.publish_rate >= sizes.steady_rate * 0.95
            && m.steady.delivered as f64 >= m.steady.published as f64 * 0.99;
        report.target(
            "`sheaf` on Postgres + ClickHouse, peak RSS at a steady 2,000 events/s",
            "under 150 MB",
            format!(
                "{:.1} MiB peak; {} events/s offered, {} of {} delivered",
                m.peak_rss_mib,
                report::count(m.steady.publish_rate),
                report::count(m.steady.delivered as f64),
                report::count(m.steady.published as f64)
            ),
            m.peak_rss_mib * 1.048_576 < 150.0 && steady_ok,
        );
    }
    if let Some(m) = measured.iter().find(|m| m.backend == Backend::Memory)
        && let Some(overhead) = m.overhead_per_event_bytes
    {
        report.target(
            "`sheaf` on the memory backend, overhead per retained event beyond its payload",
            "under 1 KB",
            format!(
                "{:.0} B (RSS {:.1} → {:.1} MiB over {} retained events of ~{} B payload)",
                overhead,
                m.rss_before_kib as f64 / 1024.0,
                m.rss_after_saturation_kib as f64 / 1024.0,
                report::count(m.saturation.delivered as f64),
                PAD_BYTES + 20
            ),
            overhead < 1000.0,
        );
    }
    report.note(
        "Latency is from the start of the publish request to the receiver's first 2xx for that \
         event, both on the bench process's clock; publish latency is from the start of the \
         publish request to its 202; events/s is delivered events ÷ (last delivery − \
         first publish). Publishers, receiver, sheaf and both databases share the 2 cores.",
    );
    report.note(
        "The per-event memory overhead is VmRSS growth of the sheaf process over the saturation \
         phase ÷ events delivered − the payload's JSON size; it includes the allocator's slack, \
         the attempt and the queue's job row of each event, and the fresh-event cache.",
    );
    report.figure = Some(
        Figure::new("delivery: publish to 2xx through one sheaf process")
            .panel(Panel::Bars {
                title: "events per second, publish → 2xx".to_owned(),
                unit: "events/s".to_owned(),
                log: false,
                bars: measured
                    .iter()
                    .flat_map(|m| {
                        [
                            Bar::new(
                                format!("{} saturation", m.backend.label()),
                                m.saturation.events_per_s,
                                m.backend as usize,
                            ),
                            Bar::new(
                                format!("{} steady", m.backend.label()),
                                m.steady.events_per_s,
                                m.backend as usize,
                            ),
                        ]
                    })
                    .collect(),
            })
            .panel(Panel::Bars {
                title: "publish-to-delivery latency (p50 and p99)".to_owned(),
                unit: "ms".to_owned(),
                log: true,
                bars: measured
                    .iter()
                    .flat_map(|m| {
                        [
                            Bar::new(
                                format!("{} saturation p50", m.backend.label()),
                                m.saturation.p50_ms,
                                m.backend as usize,
                            ),
                            Bar::new(
                                format!("{} saturation p99", m.backend.label()),
                                m.saturation.p99_ms,
                                m.backend as usize,
                            ),
                            Bar::new(
                                format!("{} steady p50", m.backend.label()),
                                m.steady.p50_ms,
                                m.backend as usize,
                            ),
                            Bar::new(
                                format!("{} steady p99", m.backend.label()),
                                m.steady.p99_ms,
                                m.backend as usize,
                            ),
                        ]
                    })
                    .collect(),
            }),
    );
    report.raw = serde_json::json!({ "sizes": sizes, "backends": measured });
    report
}
