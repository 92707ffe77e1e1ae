//! The `delivery` scenario's report: its tables, its targets, the note on tracing's cost and
//! its figure, built from what [`super::measure`] measured.

use crate::context::Ctx;
use crate::plot::{Bar, Figure, Panel};
use crate::report::{self, PeakRss, Report, Table};

use super::stall::{self, SETTLE_SECONDS, STALL_P99_MS, STALL_SHARE};
use super::{Backend, Measured, PAD_BYTES, Phase, QUESTION, Sizes, SteadyRun};

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
    for (_, run, label) in runs(measured) {
        let Some(q) = &run.queue else { continue };
        let over_time: Vec<String> = q
            .samples
            .iter()
            .step_by((q.samples.len() / 12).max(1))
            .map(|s| format!("{:.0}s:{}", s.at_s, s.dead))
            .collect();
        table.row(vec![
            label,
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
        steady_target(report, &m.steady_runs);
    }
    if let Some(m) = measured.iter().find(|m| m.backend == Backend::Sqlite) {
        let s = &m.saturation;
        report.target(
            "SQLite, closed loop (32 publishers, unique ids), publish → 2xx",
            "≥ 0.8x memory in the same run, publish p50 ≤ 5 ms",
            format!(
                "{} events/s ({} memory), publish p50 {}",
                report::count(s.events_per_s),
                report::ratio(s.events_per_s / memory_rate),
                report::millis(s.publish_p50_ms)
            ),
            s.events_per_s >= 0.8 * memory_rate && s.publish_p50_ms <= 5.0,
        );
        report.target(
            "SQLite, peak RSS of `sheaf` over the run",
            "≤ 120 MiB",
            format!("{:.1} MiB", m.peak_rss_mib),
            m.peak_rss_mib <= 120.0,
        );
    }
    if let Some(m) = measured.iter().find(|m| m.backend == Backend::SqliteFull) {
        let s = &m.saturation;
        report.target(
            "SQLite with SHEAF_SQLITE_SYNC=full, closed loop, publish → 2xx",
            "≥ 0.5x memory in the same run",
            format!(
                "{} events/s ({} memory), publish p50 {}",
                report::count(s.events_per_s),
                report::ratio(s.events_per_s / memory_rate),
                report::millis(s.publish_p50_ms)
            ),
            s.events_per_s >= 0.5 * memory_rate,
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

/// Every steady run, with its label: the backend's, and the run's number when it has several.
fn runs(measured: &[Measured]) -> impl Iterator<Item = (&Measured, &SteadyRun, String)> {
    measured.iter().flat_map(|m| {
        let several = m.steady_runs.len() > 1;
        m.steady_runs.iter().enumerate().map(move |(i, run)| {
            let label = if several {
                format!("{}, run {}", m.backend.label(), i + 1)
            } else {
                m.backend.label().to_owned()
            };
            (m, run, label)
        })
    })
}

/// Postgres + ClickHouse's steady target, met only if every run meets it.
fn steady_target(report: &mut Report, runs: &[SteadyRun]) {
    let judged: Vec<(bool, String)> = runs
        .iter()
        .map(|run| {
            let st = &run.phase;
            let q = run.queue.clone().unwrap_or_default();
            let met = st.delivered >= st.published
                && st.p99_ms < 1_000.0
                && q.claim_last_ms <= 2.0 * q.claim_first_ms;
            let measured = format!(
                "{} of {} delivered, p99 {}, claim {:.3} → {:.3} ms",
                report::count(st.delivered as f64),
                report::count(st.published as f64),
                report::millis(st.p99_ms),
                q.claim_first_ms,
                q.claim_last_ms
            );
            (met, measured)
        })
        .collect();
    let mut goal = "every event delivered, publish → 2xx p99 < 1 s, claim mean in the last minute \
                    within 2x of the first"
        .to_owned();
    let measured = if let [(_, one)] = judged.as_slice() {
        one.clone()
    } else {
        let count = match judged.len() {
            2 => "two".to_owned(),
            3 => "three".to_owned(),
            n => n.to_string(),
        };
        goal.push_str(&format!(", in every one of {count} consecutive runs"));
        judged
            .iter()
            .enumerate()
            .map(|(i, (met, m))| {
                format!(
                    "run {}: {m} ({})",
                    i + 1,
                    if *met { "met" } else { "missed" }
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    };
    report.target(
        "Postgres + ClickHouse, open loop at a steady 2,000 events/s",
        &goal,
        measured,
        judged.iter().all(|(met, _)| *met),
    );
}

/// The Postgres backends' steady runs second by second: each run's p99 and its stalls, and a
/// table of the seconds around each stall.
fn seconds_report(report: &mut Report, measured: &[Measured]) {
    let mut table = Table::new(
        "The steady runs second by second (Postgres backends): publish → delivered per run, and \
         its stalls or its slowest second",
        &[
            "backend",
            "delivered / published",
            "p50 / p99 / max latency",
            "p99 < 1 s",
            "seconds read",
            "stalls",
        ],
    );
    let mut stall_tables = Vec::new();
    for (_, run, label) in runs(measured) {
        let Some(watch) = &run.seconds else { continue };
        let p = &run.phase;
        let read = watch.seconds.iter().filter(|s| s.tick.is_some()).count();
        table.row(vec![
            label.clone(),
            format!(
                "{} / {}",
                report::count(p.delivered as f64),
                report::count(p.published as f64)
            ),
            format!(
                "{} / {} / {}",
                report::millis(p.p50_ms),
                report::millis(p.p99_ms),
                report::millis(p.max_ms)
            ),
            if p.p99_ms < 1_000.0 { "yes" } else { "no" }.to_owned(),
            format!("{read} of {}", watch.seconds.len()),
            watch.verdict(),
        ]);
        stall_tables.extend(stall::stall_tables(&label, watch));
    }
    if table.rows.is_empty() {
        return;
    }
    report.tables.push(table);
    report.tables.extend(stall_tables);
    report.note(format!(
        "A stall is a second, after the first {SETTLE_SECONDS}, that delivered less than {:.0} % \
         of the offered rate while the load was publishing (also when the load itself offered \
         less: with at most 512 publishes in flight, it stops when they are held up), or whose \
         publishes took more than {:.0} s to be delivered at p99. Each second's counts come \
         from the load's and the receiver's timestamps; the readings at its end (the processes' \
         CPU from /proc, pg_stat_activity with sheaf's connections told apart by their \
         application_name, vacuums and analyzes in progress, pg_stat_bgwriter and pg_stat_wal, \
         sheaf's /metrics) are taken once a second on one Postgres connection, each waiting at \
         most 0.9 s. The role the bench connects as cannot see Postgres's own processes (the \
         checkpointer, autovacuum workers) in pg_stat_activity: checkpoints show in the \
         counters, vacuums by the lock they hold.",
        STALL_SHARE * 100.0,
        STALL_P99_MS / 1_000.0
    ));
}

pub(super) fn build_report(ctx: &Ctx, sizes: &Sizes, measured: Vec<Measured>) -> Report {
    let mut report = Report::new("delivery", QUESTION, ctx);
    let mut table = Table::new(
        format!(
            "One `sheaf serve` (the JetStream configurations: as many as they say, CPU summed, \
             peak RSS of the largest), one webhook destination on loopback, ~1 KB payloads; \
             saturation: {} events from {} publishers with unique ids; steady: {} events/s for \
             {:.0} s (Postgres + ClickHouse: {:.0} s{})",
            report::count(sizes.saturation_events as f64),
            sizes.publishers,
            report::count(sizes.steady_rate),
            sizes.steady_seconds,
            sizes.long_steady_seconds,
            if sizes.steady_repeats > 1 {
                format!(
                    ", {} runs one after another, the first shown here",
                    sizes.steady_repeats
                )
            } else {
                String::new()
            }
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
            "CPU µs/event: sheaf / Postgres / ClickHouse / NATS",
            "peak RSS (sheaf)",
        ],
    );
    let memory = measured.iter().find(|m| m.backend == Backend::Memory);
    for m in &measured {
        for (name, p) in [("saturation", &m.saturation), ("steady", m.steady())] {
            let base = memory.map_or(f64::NAN, |b| {
                if name == "steady" {
                    b.steady().events_per_s
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
                [
                    p.sheaf_cpu_us_per_event,
                    p.postgres_cpu_us_per_event,
                    p.clickhouse_cpu_us_per_event,
                    p.nats_cpu_us_per_event,
                ]
                .map(|us| us.map_or_else(|| "–".to_owned(), |us| format!("{us:.0}")))
                .join(" / "),
                format!("{:.1} MiB", m.peak_rss_mib),
            ]);
        }
    }
    report.tables.push(table);
    queue_report(&mut report, sizes, &measured);
    super::scaleout::add_to_report(&mut report, &measured);
    seconds_report(&mut report, &measured);
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
        let steady = m.steady();
        let steady_ok = steady.publish_rate >= sizes.steady_rate * 0.95
            && steady.delivered as f64 >= steady.published as f64 * 0.99;
        report.target(
            "`sheaf` on Postgres + ClickHouse, peak RSS at a steady 2,000 events/s",
            "under 150 MB",
            format!(
                "{:.1} MiB peak; {} events/s offered, {} of {} delivered",
                m.peak_rss_mib,
                report::count(steady.publish_rate),
                report::count(steady.delivered as f64),
                report::count(steady.published as f64)
            ),
            m.peak_rss_mib * 1.048_576 < 150.0 && steady_ok,
        );
    }
    if let Some(m) = measured.iter().find(|m| m.backend == Backend::Memory)
        && let Some(overhead) = m.overhead_per_event_bytes
    {
        // Not a target: RSS growth also holds the allocator's arenas, the fresh-event cache and
        // everything else the process keeps. The log store's own cost per retained event is
        // counted by the allocator in `benches/benches/memory_footprint.rs`.
        report.note(format!(
            "RSS growth on the memory backend per retained event beyond its payload: {:.0} B \
             (RSS {:.1} → {:.1} MiB over {} retained events of ~{} B payload). RSS holds more \
             than the log (allocator arenas, the fresh-event cache); the log's own bytes per \
             event are counted by `cargo bench -p sheaf-benches --bench memory_footprint`.",
            overhead,
            m.rss_before_kib as f64 / 1024.0,
            m.rss_after_saturation_kib as f64 / 1024.0,
            report::count(m.saturation.delivered as f64),
            PAD_BYTES + 20
        ));
    }
    if let (Some(plain), Some(traced)) = (
        measured.iter().find(|m| m.backend == Backend::Memory),
        measured.iter().find(|m| m.backend == Backend::MemoryTraced),
    ) {
        report.note(format!(
            "Tracing's cost: with every span exported over OTLP/HTTP (a request, publish, \
             coalesced-write and deliver span per event, batched by the SDK) the memory \
             backends delivered {} events/s at saturation against {} without ({}), publish p50 \
             {} against {}; the sink took {} exports.",
            report::count(traced.saturation.events_per_s),
            report::count(plain.saturation.events_per_s),
            report::ratio(traced.saturation.events_per_s / plain.saturation.events_per_s),
            report::millis(traced.saturation.publish_p50_ms),
            report::millis(plain.saturation.publish_p50_ms),
            traced.trace_exports.unwrap_or(0),
        ));
    }
    if let (Some(plain), Some(shaped)) = (
        measured.iter().find(|m| m.backend == Backend::Memory),
        measured
            .iter()
            .find(|m| m.backend == Backend::MemoryTransformed),
    ) {
        let cpu = |m: &Measured| m.saturation.sheaf_cpu_us_per_event;
        let extra = match (cpu(shaped), cpu(plain)) {
            (Some(with), Some(without)) => format!(
                "{with:.0} µs of CPU per event (sheaf and its runners) against {without:.0} \
                 µs, {:+.0} µs",
                with - without
            ),
            _ => "CPU not read".to_owned(),
        };
        report.note(format!(
            "A transformation's cost: with a typical jq program on the destination (`{}`), run \
             in `sheaf transform-runner` processes, the memory backends delivered {} events/s at \
             saturation against {} without ({}; target ≥ 0.8x), {extra}; publish p50 {} \
             against {}.",
            super::TRANSFORM
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" "),
            report::count(shaped.saturation.events_per_s),
            report::count(plain.saturation.events_per_s),
            report::ratio(shaped.saturation.events_per_s / plain.saturation.events_per_s),
            report::millis(shaped.saturation.publish_p50_ms),
            report::millis(plain.saturation.publish_p50_ms),
        ));
    }
    if let (Some(single), Some(cluster)) = (
        measured
            .iter()
            .find(|m| m.backend == Backend::PostgresClickHouse),
        measured
            .iter()
            .find(|m| m.backend == Backend::PostgresClickHouseCluster),
    ) {
        let cpu = |p: &Phase| {
            [
                p.sheaf_cpu_us_per_event,
                p.postgres_cpu_us_per_event,
                p.clickhouse_cpu_us_per_event,
            ]
            .map(|v| v.map_or("–".to_owned(), |us| format!("{us:.0}")))
            .join(" / ")
        };
        report.note(format!(
            "The log on a ClickHouse cluster of 2 shards × 2 replicas (Distributed tables, every \
             insert waiting for all four nodes): {} events/s at saturation against {} on one \
             server ({}), CPU µs per event `sheaf` / Postgres / ClickHouse (the four nodes' sum) \
             {} against {}. The nodes share the machine's two cores with everything else: this \
             is what the cluster costs per event, not how far it scales.",
            report::count(cluster.saturation.events_per_s),
            report::count(single.saturation.events_per_s),
            report::ratio(cluster.saturation.events_per_s / single.saturation.events_per_s),
            cpu(&cluster.saturation),
            cpu(&single.saturation),
        ));
    }
    for (plain, ordered) in [
        (Backend::Memory, Backend::MemoryOrdered),
        (
            Backend::PostgresClickHouse,
            Backend::PostgresClickHouseOrdered,
        ),
    ] {
        if let (Some(p), Some(o)) = (
            measured.iter().find(|m| m.backend == plain),
            measured.iter().find(|m| m.backend == ordered),
        ) {
            report.note(format!(
                "Ordering's cost on {}: with the destination ordered by `/data/key` (1,000 keys, \
                 each event's key its seq modulo 1,000), {} events/s at saturation against {} \
                 unordered ({}; target ≥ 0.7x), p50 publish → delivered {} against {}.",
                plain.label(),
                report::count(o.saturation.events_per_s),
                report::count(p.saturation.events_per_s),
                report::ratio(o.saturation.events_per_s / p.saturation.events_per_s),
                report::millis(o.saturation.p50_ms),
                report::millis(p.saturation.p50_ms),
            ));
        }
    }
    if let Some(profile) = measured
        .iter()
        .find(|m| m.backend == Backend::Memory)
        .and_then(|m| m.profile.as_ref())
    {
        let areas: Vec<String> = profile
            .areas
            .iter()
            .map(|(area, share)| format!("{area} {share:.1} %"))
            .collect();
        let top: Vec<String> = profile
            .top_self
            .iter()
            .take(10)
            .map(|(frame, share)| format!("`{frame}` {share:.1} %"))
            .collect();
        report.note(format!(
            "Where the memory configuration's CPU goes at saturation (a third saturation run, \
             twice as long, under `perf record -e cpu-clock -F 999 --call-graph dwarf`, outside \
             the measured phases; {} of CPU time sampled; flame graph {}): inside each area, \
             inclusive: {}. On the CPU itself, the top frames: {}.",
            report::millis(profile.sampled_ms),
            profile.svg.display(),
            areas.join("; "),
            top.join(", ")
        ));
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
                                m.steady().events_per_s,
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
                                m.steady().p50_ms,
                                m.backend as usize,
                            ),
                            Bar::new(
                                format!("{} steady p99", m.backend.label()),
                                m.steady().p99_ms,
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
