//! `parts`: how many ClickHouse parts ten writers make on a month-partitioned table, the
//! write-wait experiment behind the write coalescer's `max_wait` (docs/benchmarks.md, "`parts`",
//! with its earlier measurements).
//!
//! A source emits 300,000 attempts (full size) in time order over 24 months, in polls of 3,000
//! rows every 60 ms (50,000 rows/s). Each poll is split by event id over ten writers (the
//! key-aware routing that multiplied part creation there), and each writer hands its share to its
//! own `ClickHouseLogStore` (so each has its own `WriteCoalescer`, as each worker of that
//! experiment had its own write path) without waiting for the write: hand-offs follow the
//! source, writes follow the coalescer.
//!
//! The same run is repeated in a fresh database per variant: the write coalescer's `max_wait`
//! at 0, 500 ms and 2 s, and ClickHouse's own server-side buffering as a peer (`async_insert = 1`,
//! `wait_for_async_insert = 1`, coalescer wait 0). Parts created and their rows come from
//! `system.part_log` (`NewPart`), INSERT statements from `system.query_log`, and the most active
//! parts in one partition from sampling `system.parts` every 250 ms.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use serde::Serialize;
use sheaf_clickhouse::ClickHouseLogStore;
use sheaf_store::{
    Attempt, AttemptId, AttemptStatus, AttemptTrigger, DestinationId, EventId, LogStore, Payload,
    TenantId, Timestamp,
};

use crate::ch::{self, ChDb};
use crate::context::Ctx;
use crate::plot::{Bar, Figure, Panel};
use crate::progress::Progress;
use crate::report::{self, PeakRss, Report, Table};

const QUESTION: &str = "How many ClickHouse parts do ten concurrent writers create for 300,000 rows \
    spanning 24 months of a month-partitioned table, with the write coalescer's wait at 0, 500 ms \
    and 2 s, and with ClickHouse's server-side async_insert instead?";

const WRITERS: usize = 10;
const MONTHS_SPANNED_DAYS: i64 = 730;

#[derive(Debug, Clone, Copy, Serialize)]
struct Sizes {
    rows: usize,
    rows_per_poll: usize,
    poll_interval_ms: u64,
}

#[derive(Debug, Clone, Copy, Serialize)]
enum Variant {
    Wait(u64),
    AsyncInsert,
}

impl Variant {
    fn label(self) -> String {
        match self {
            Variant::Wait(0) => "coalescer, max_wait 0".to_owned(),
            Variant::Wait(ms) if ms % 1000 == 0 => format!("coalescer, max_wait {} s", ms / 1000),
            Variant::Wait(ms) => format!("coalescer, max_wait {ms} ms"),
            Variant::AsyncInsert => "server async_insert (coalescer wait 0)".to_owned(),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
struct Measured {
    variant: Variant,
    inserts: u64,
    parts: u64,
    rows_in_parts: u64,
    merges: u64,
    peak_parts_in_partition: u64,
    peak_active_parts: u64,
    end_to_end_s: f64,
}

#[derive(clickhouse::Row, serde::Deserialize)]
struct PartLog {
    new_parts: u64,
    new_rows: u64,
    merges: u64,
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<Report> {
    let sizes = Sizes {
        rows: ctx.size(300_000, 3_000),
        rows_per_poll: ctx.size(3_000, 300),
        poll_interval_ms: 60,
    };
    crate::proc::reset_peak_rss();
    let url = ctx.clickhouse()?;
    let variants = [
        Variant::Wait(0),
        Variant::Wait(500),
        Variant::Wait(2_000),
        Variant::AsyncInsert,
    ];
    let polls = sizes.rows.div_ceil(sizes.rows_per_poll);
    let progress = Progress::new("parts: 4 variants", (variants.len() * polls) as u64);
    let mut measured = Vec::new();
    for variant in variants {
        let m = run_variant(url, &sizes, variant, &progress)
            .await
            .with_context(|| variant.label())?;
        measured.push(m);
    }
    progress.finish();
    let peak = crate::proc::peak_rss_kib(None);
    Ok(build_report(ctx, &sizes, measured, peak))
}

/// The rows of the source, in time order: attempt `i` of `rows`.
fn attempt(i: usize, rows: usize, start_micros: i64, payload: &Payload) -> anyhow::Result<Attempt> {
    let span = MONTHS_SPANNED_DAYS * 86_400_000_000;
    let time = start_micros + (span / rows as i64) * i as i64;
    Ok(Attempt {
        tenant_id: TenantId::new(format!("tenant-{}", i % 20))?,
        id: AttemptId::generate(),
        event_id: EventId::new(format!("evt-{i}"))?,
        destination_id: DestinationId::from_uuid(uuid::Uuid::from_u128(7)),
        number: 1,
        time: Timestamp::from_micros(time)?,
        status: AttemptStatus::Failed,
        trigger: AttemptTrigger::Scheduled,
        response_code: Some(503),
        duration_ms: 20,
        response_body: Some("unavailable".to_owned()),
        error: None,
        event_topic: "order.created".to_owned(),
        event_data: payload.clone(),
        event_trace: None,
    })
}

/// Key-aware routing: a row always goes to the same writer (a multiplicative hash of its index,
/// so neighbouring rows go to different writers as keys would).
fn writer_of(i: usize) -> usize {
    ((i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize % WRITERS
}

async fn run_variant(
    url: &str,
    sizes: &Sizes,
    variant: Variant,
    progress: &Progress,
) -> anyhow::Result<Measured> {
    let db = ChDb::new(url, "bench_parts");
    let tag = format!("{}-insert", db.database);
    let admin = ClickHouseLogStore::connect(db.config())?;
    admin.migrate().await?;
    admin.close().await;

    let mut writers = Vec::with_capacity(WRITERS);
    for _ in 0..WRITERS {
        let mut config = db.config();
        config
            .settings
            .push(("log_comment".to_owned(), tag.clone()));
        match variant {
            Variant::Wait(ms) => config.write.max_wait = Duration::from_millis(ms),
            Variant::AsyncInsert => {
                config.write.max_wait = Duration::ZERO;
                config
                    .settings
                    .push(("async_insert".to_owned(), "1".to_owned()));
                config
                    .settings
                    .push(("wait_for_async_insert".to_owned(), "1".to_owned()));
            }
        }
        writers.push(Arc::new(ClickHouseLogStore::connect(config)?));
    }

    // Sample the active parts while the writes run.
    let sampling = Arc::new(StopFlag::default());
    let peak_partition = Arc::new(AtomicU64::new(0));
    let peak_total = Arc::new(AtomicU64::new(0));
    let sampler = {
        let (client, database) = (db.client(), db.database.clone());
        let (stop, peak_partition, peak_total) = (
            Arc::clone(&sampling),
            Arc::clone(&peak_partition),
            Arc::clone(&peak_total),
        );
        tokio::spawn(async move {
            // Bounded: at most an hour of samples even if the stop signal were lost.
            for _ in 0..14_400 {
                if stop.is_set() {
                    break;
                }
                let sample: Result<(u64, u64), _> = client
                    .query(
                        "SELECT toUInt64(max(c)), toUInt64(sum(c)) FROM ( \
                            SELECT partition, count() AS c FROM system.parts \
                            WHERE database = ? AND table = 'attempts' AND active \
                            GROUP BY partition)",
                    )
                    .bind(database.as_str())
                    .fetch_one()
                    .await;
                if let Ok((in_partition, total)) = sample {
                    peak_partition.fetch_max(in_partition, Ordering::Relaxed);
                    peak_total.fetch_max(total, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
    };

    let payload = Payload::new(serde_json::json!({ "order": "x".repeat(160) }));
    let start_micros = Timestamp::now().as_micros() - MONTHS_SPANNED_DAYS * 86_400_000_000;
    let started = Instant::now();
    let mut handoffs = Vec::new();
    let polls = sizes.rows.div_ceil(sizes.rows_per_poll);
    for poll in 0..polls {
        tokio::time::sleep_until(
            (started + Duration::from_millis(sizes.poll_interval_ms * poll as u64)).into(),
        )
        .await;
        let mut shares: Vec<Vec<Attempt>> = vec![Vec::new(); WRITERS];
        let first = poll * sizes.rows_per_poll;
        for i in first..(first + sizes.rows_per_poll).min(sizes.rows) {
            shares[writer_of(i)].push(attempt(i, sizes.rows, start_micros, &payload)?);
        }
        for (writer, share) in shares.into_iter().enumerate() {
            if share.is_empty() {
                continue;
            }
            let store = Arc::clone(&writers[writer]);
            handoffs.push(tokio::spawn(
                async move { store.insert_many(&[], &share).await },
            ));
        }
        progress.inc(1);
    }
    for handoff in handoffs {
        handoff.await.context("a writer task panicked")??;
    }
    let end_to_end_s = started.elapsed().as_secs_f64();
    sampling.set();
    sampler.await.context("the parts sampler panicked")?;
    for writer in &writers {
        writer.close().await;
    }

    let client = db.client();
    let rows: u64 = client
        .query("SELECT count() FROM attempts")
        .fetch_one()
        .await?;
    ensure!(
        rows == sizes.rows as u64,
        "{rows} rows landed, {} sent",
        sizes.rows
    );
    let inserts = ch::query_costs(&client, &tag, "Insert", 1).await?.len() as u64;
    ch::flush_logs(&client).await?;
    let log: PartLog = client
        .query(
            "SELECT countIf(event_type = 'NewPart') AS new_parts, \
                toUInt64(sumIf(rows, event_type = 'NewPart')) AS new_rows, \
                countIf(event_type = 'MergeParts') AS merges \
             FROM system.part_log WHERE database = ? AND table = 'attempts'",
        )
        .bind(db.database.as_str())
        .fetch_one()
        .await
        .context("read system.part_log")?;
    Ok(Measured {
        variant,
        inserts,
        parts: log.new_parts,
        rows_in_parts: log.new_rows,
        merges: log.merges,
        peak_parts_in_partition: peak_partition.load(Ordering::Relaxed),
        peak_active_parts: peak_total.load(Ordering::Relaxed),
        end_to_end_s,
    })
}

/// A one-way stop signal for the sampler.
#[derive(Debug, Default)]
struct StopFlag(std::sync::atomic::AtomicBool);

impl StopFlag {
    fn set(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    fn is_set(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

fn build_report(
    ctx: &Ctx,
    sizes: &Sizes,
    measured: Vec<Measured>,
    peak_kib: Option<u64>,
) -> Report {
    let mut report = Report::new("parts", QUESTION, ctx);
    let baseline = measured.first().map_or(1.0, |m| m.parts.max(1) as f64);
    let mut table = Table::new(
        format!(
            "{} rows over 24 months, {} writers, polls of {} rows every {} ms",
            report::count(sizes.rows as f64),
            WRITERS,
            report::count(sizes.rows_per_poll as f64),
            sizes.poll_interval_ms
        ),
        &[
            "variant",
            "INSERTs",
            "parts created",
            "rows / part",
            "parts vs wait 0",
            "peak active parts in a partition",
            "merges by the end",
            "end-to-end",
        ],
    );
    for m in &measured {
        table.row(vec![
            m.variant.label(),
            report::count(m.inserts as f64),
            report::count(m.parts as f64),
            report::count(m.rows_in_parts as f64 / m.parts.max(1) as f64),
            report::ratio(m.parts as f64 / baseline),
            report::count(m.peak_parts_in_partition as f64),
            report::count(m.merges as f64),
            format!("{:.1} s", m.end_to_end_s),
        ]);
    }
    report.tables.push(table);
    report.memory.push(PeakRss::new(
        "sheaf-bench (ten ClickHouseLogStore writers, in process)",
        peak_kib,
    ));
    report.note(
        "Parts and their rows are system.part_log NewPart events of the run's attempts table \
         (its by_tenant_time projection is written inside each part, not counted apart); INSERTs \
         are the client INSERT statements in system.query_log (with async_insert the server \
         buffers them and writes its own parts).",
    );
    report.note(
        "Merges are the MergeParts events logged by the time the last write returned: a figure \
         of the moment, not a total.",
    );
    report.figure = Some(
        Figure::new("parts: ten writers, month-partitioned table")
            .panel(Panel::Bars {
                title: "parts created".to_owned(),
                unit: "parts".to_owned(),
                log: false,
                bars: measured
                    .iter()
                    .enumerate()
                    .map(|(i, m)| Bar::new(m.variant.label(), m.parts as f64, i))
                    .collect(),
            })
            .panel(Panel::Bars {
                title: "rows per part".to_owned(),
                unit: "rows".to_owned(),
                log: false,
                bars: measured
                    .iter()
                    .enumerate()
                    .map(|(i, m)| {
                        Bar::new(
                            m.variant.label(),
                            m.rows_in_parts as f64 / m.parts.max(1) as f64,
                            i,
                        )
                    })
                    .collect(),
            }),
    );
    report.raw = serde_json::json!({ "sizes": sizes, "variants": measured });
    report
}
