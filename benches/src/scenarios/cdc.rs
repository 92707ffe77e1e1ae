//! `cdc`: how fast rows inserted into Postgres come out of Sheaf's CDC reader as events ready to
//! publish, one row per message against `batch_transactions` (the per-transaction batching
//! experiment: docs/benchmarks.md, "`cdc`", with its earlier measurements), and how much the
//! reader buffers when its consumer stalls.
//!
//! Rows are inserted first (full size: 200,000 rows of ~1.2 KB in transactions of 100, the shape
//! of that experiment's reader benchmark) while two replication slots hold the WAL; then each slot is read by `CdcSource` (the
//! real transport, `pgwire-replication`, and Sheaf's decoder) with one of the two output shapes,
//! and every change is turned into what a publish needs (topic, event id, JSON) and acknowledged.
//! Throughput is rows and bytes from the first `recv` to the last row.
//!
//! The same two shapes then run end to end through a `sheaf serve` process with its CDC source
//! (`SHEAF_CDC_*`), each on a slot of its own holding the same rows: every change is published as
//! an event and acknowledged once durable. On the memory backends (log write through the write
//! coalescer, enqueue) the figure is the CDC path's, not a database's; on Postgres + ClickHouse
//! each batch is accepted into the Postgres outbox (one group-committed statement) and shipped
//! to ClickHouse behind. The rate is taken between 10 % and 90 % of the rows published (from `/metrics`, polled every
//! 100 ms), which leaves out start-up and the tenant being created after the process is up.
//!
//! The memory check reads a third slot holding large rows (~8 KB, so the 4 MiB byte cap closes
//! batches before the row cap) with a consumer that takes one message, acknowledges it and then
//! stalls: the WAL bytes of the rows the reader has handed over unacknowledged
//! (`CdcStream::wal_bytes_in_flight`) are what it buffers, against `StreamOptions::buffer_bound`
//! in the same unit: (channel depth + 1) × (byte cap + one row) with `batch_transactions`.

use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use serde::Serialize;
use sheaf_cdc::{CdcConfig, CdcSource, ConnectionConfig, StreamOptions};
use sheaf_testenv::postgres::drop_replication_slot;

use super::cdc_service::{Run, Service, through_sheaf};
use crate::ch::ChDb;
use crate::context::Ctx;
use crate::pg::{self, PgSchema};
use crate::plot::{Bar, Figure, Panel};
use crate::progress::Progress;
use crate::report::{self, PeakRss, Report, Table};

const QUESTION: &str = "How many rows and megabytes per second go from Postgres inserts to events \
    ready to publish through Sheaf's CDC reader, one row per message against whole transactions \
    per message, and does the reader's buffer stay within (channel depth + 1) × (byte cap + one \
    row) of WAL?";

/// Large rows per transaction: 2,000 rows of ~8 KB are ~16 MB of WAL, so the reader closes
/// batches at the 4 MiB byte cap (~520 rows), well before the commit or the row cap.
const BIG_TXN_ROWS: i64 = 2_000;

#[derive(Debug, Clone, Copy, Serialize)]
struct Sizes {
    rows: i64,
    rows_per_txn: i64,
    row_bytes: usize,
    big_rows: i64,
    big_row_bytes: usize,
    stall: Duration,
}

#[derive(Debug, Clone, Serialize)]
struct Throughput {
    shape: &'static str,
    rows: u64,
    messages: u64,
    seconds: f64,
    rows_per_s: f64,
    wal_mb_per_s: f64,
    json_mb_per_s: f64,
}

#[derive(Debug, Clone, Serialize)]
struct Buffering {
    peak_rows_unacked: usize,
    bound_rows: usize,
    bound_batches: usize,
    wal_bytes_per_row: f64,
    largest_row_wal_bytes: usize,
    /// WAL bytes of the rows handed over and unacknowledged, as the tracker sums them.
    peak_buffered_bytes: f64,
    bound_bytes: f64,
    rss_growth_mib: f64,
}

/// Slots and publications of the run, dropped when this guard is (slots hold WAL forever
/// otherwise). Declared before the streams, so it is dropped after them.
#[derive(Debug)]
struct ReplicationObjects {
    url: String,
    slots: Vec<String>,
    publications: Vec<String>,
}

impl Drop for ReplicationObjects {
    fn drop(&mut self) {
        let (url, slots, publications) = (
            self.url.clone(),
            self.slots.clone(),
            self.publications.clone(),
        );
        let outcome = std::thread::spawn(move || -> anyhow::Result<()> {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(async {
                let pool = sqlx::postgres::PgPoolOptions::new()
                    .max_connections(1)
                    .connect(&url)
                    .await?;
                for slot in &slots {
                    // A slot is busy for a moment after its stream stops: retried, bounded.
                    let dropped =
                        drop_replication_slot(&pool, slot, Duration::from_secs(10)).await?;
                    anyhow::ensure!(dropped, "slot {slot} could not be dropped");
                }
                pool.close().await;
                for publication in &publications {
                    pg::execute(&url, &format!("DROP PUBLICATION IF EXISTS {publication}")).await?;
                }
                Ok(())
            })
        })
        .join();
        if !matches!(outcome, Ok(Ok(()))) {
            eprintln!(
                "sheaf-bench: could not drop replication slots {:?} / publications {:?}: drop them by hand",
                self.slots, self.publications
            );
        }
    }
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<Report> {
    let sizes = Sizes {
        rows: ctx.size(200_000, 2_000),
        rows_per_txn: 100,
        row_bytes: 1_200,
        big_rows: ctx.size(10_000, 2_000),
        big_row_bytes: 8_000,
        stall: ctx.size(Duration::from_secs(3), Duration::from_millis(500)),
    };
    crate::proc::reset_peak_rss();
    let url = ctx.postgres()?;
    let schema = PgSchema::new(url, "bench_cdc");
    let name = |what: &str| format!("{}_{what}", schema.schema);
    let objects = ReplicationObjects {
        url: url.to_owned(),
        slots: vec![
            name("rows"),
            name("txns"),
            name("big"),
            name("svc_rows"),
            name("svc_txns"),
            name("pgch_rows"),
            name("pgch_txns"),
        ],
        publications: vec![name("orders"), name("blobs")],
    };
    let (orders, blobs) = (schema.table("orders"), schema.table("blobs"));
    pg::execute(
        url,
        &format!(
            "CREATE SCHEMA \"{s}\"; \
             CREATE TABLE {orders} (id bigint PRIMARY KEY, customer text NOT NULL, \
                amount numeric(12, 2) NOT NULL, note text NOT NULL); \
             CREATE TABLE {blobs} (id bigint PRIMARY KEY, body text NOT NULL); \
             CREATE PUBLICATION {po} FOR TABLE {orders}; \
             CREATE PUBLICATION {pb} FOR TABLE {blobs};",
            s = schema.schema,
            po = objects.publications[0],
            pb = objects.publications[1],
        ),
    )
    .await?;
    for slot in &objects.slots {
        pg::execute(
            url,
            &format!("SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')"),
        )
        .await?;
    }

    // The WAL to read: inserted before any reader runs, so the readers measure themselves.
    let txns = sizes.rows / sizes.rows_per_txn;
    let big_txns = sizes.big_rows / BIG_TXN_ROWS;
    let fill = Progress::new("cdc: insert rows", (txns + big_txns) as u64);
    let mut conn = pg::connect(url).await?;
    let note_len = sizes.row_bytes - 60;
    for t in 0..txns {
        let (a, b) = (t * sizes.rows_per_txn, (t + 1) * sizes.rows_per_txn - 1);
        sqlx::raw_sql(&format!(
            "INSERT INTO {orders} (id, customer, amount, note) \
             SELECT g, 'customer-' || (g % 1000), (g % 10000) / 100.0, \
                left(repeat(md5(g::text), {reps}), {note_len}) \
             FROM generate_series({a}, {b}) AS g",
            reps = note_len / 32 + 1
        ))
        .execute(&mut conn)
        .await?;
        fill.inc(1);
    }
    for t in 0..big_txns {
        let (a, b) = (t * BIG_TXN_ROWS, (t + 1) * BIG_TXN_ROWS - 1);
        sqlx::raw_sql(&format!(
            "INSERT INTO {blobs} (id, body) \
             SELECT g, left(repeat(md5(g::text), {reps}), {len}) FROM generate_series({a}, {b}) AS g",
            reps = sizes.big_row_bytes / 32 + 1,
            len = sizes.big_row_bytes
        ))
        .execute(&mut conn)
        .await?;
        fill.inc(1);
    }
    fill.finish();

    let connection = ConnectionConfig::from_url(url)?;
    let mut throughput = Vec::new();
    for (shape, slot, batch) in [
        ("one row per message (default)", &objects.slots[0], false),
        ("batch_transactions", &objects.slots[1], true),
    ] {
        let mut config = CdcConfig::new(
            connection.clone(),
            slot.as_str(),
            objects.publications[0].as_str(),
        );
        config.stream = StreamOptions {
            batch_transactions: batch,
            ..StreamOptions::default()
        };
        throughput.push(
            read_all(config, shape, sizes.rows as u64)
                .await
                .with_context(|| shape.to_owned())?,
        );
    }

    let mut config = CdcConfig::new(
        connection,
        objects.slots[2].as_str(),
        objects.publications[1].as_str(),
    );
    config.stream = StreamOptions {
        // One message per reader batch, so the consumer's acknowledged first message leaves
        // nothing on the stream's side: the bound is (channel depth + 1) batches.
        batch_transactions: true,
        // Large enough that the byte cap, not the in-flight row limit, bounds the buffer.
        checkpoint_limit: 100_000,
        ..StreamOptions::default()
    };
    let buffering = stalled(config, &sizes).await.context("stalled consumer")?;
    let peak = crate::proc::peak_rss_kib(None);

    let bin = ctx.sheaf_bin()?.to_path_buf();
    let mut service = Vec::new();
    // The stores of the Postgres + ClickHouse runs: queue, tenants and outbox in a schema of
    // their own, the log in a ClickHouse database of its own.
    let store_schema = PgSchema::new(url, "bench_cdc_stores");
    let store_db = ChDb::new(ctx.clickhouse()?, "bench_cdc");
    let pg_ch = [
        ("SHEAF_QUEUE", "postgres".to_owned()),
        ("SHEAF_LOG_STORE", "clickhouse".to_owned()),
        ("SHEAF_POSTGRES_URL", store_schema.url.clone()),
        ("SHEAF_POSTGRES_SCHEMA", store_schema.schema.clone()),
        ("SHEAF_CLICKHOUSE_URL", store_db.url.clone()),
        ("SHEAF_CLICKHOUSE_DATABASE", store_db.database.clone()),
    ];
    for (backend, stores, shape, slot, batch) in [
        (
            "memory",
            &[][..],
            "one row per message (default)",
            &objects.slots[3],
            false,
        ),
        (
            "memory",
            &[][..],
            "batch_transactions",
            &objects.slots[4],
            true,
        ),
        (
            "Postgres + ClickHouse",
            &pg_ch[..],
            "one row per message (default)",
            &objects.slots[5],
            false,
        ),
        (
            "Postgres + ClickHouse",
            &pg_ch[..],
            "batch_transactions",
            &objects.slots[6],
            true,
        ),
    ] {
        service.push(
            through_sheaf(
                ctx,
                &bin,
                url,
                Run {
                    backend,
                    stores,
                    slot,
                    publication: &objects.publications[0],
                    shape,
                    batch,
                },
                sizes.rows as u64,
            )
            .await
            .with_context(|| format!("sheaf on {backend}, {shape}"))?,
        );
    }
    drop(store_db);
    drop(store_schema);
    drop(objects);
    drop(schema);
    Ok(build_report(
        ctx, &sizes, throughput, service, buffering, peak,
    ))
}

/// Reads `rows` rows from the slot, turning each into an event's topic, id and JSON, and
/// acknowledging each message after.
async fn read_all(config: CdcConfig, shape: &'static str, rows: u64) -> anyhow::Result<Throughput> {
    let progress = Progress::new(format!("cdc: {shape}"), rows);
    let mut stream = CdcSource::start(config).await?;
    let (mut got, mut messages, mut wal, mut json) = (0u64, 0u64, 0u64, 0u64);
    let started = Instant::now();
    // Bounded: every message carries at least one row, and at most 10 minutes.
    while got < rows && started.elapsed() < Duration::from_secs(600) {
        let Some(message) = tokio::time::timeout(Duration::from_secs(60), stream.recv())
            .await
            .context("no message for 60 s")??
        else {
            break;
        };
        let (changes, ack) = message.into_parts();
        for change in &changes {
            let topic = change.topic();
            let id = change.id().to_string();
            let body = serde_json::to_vec(&change.to_json()?)?;
            json += (topic.len() + id.len() + body.len()) as u64;
            wal += change.wal_bytes as u64;
        }
        got += changes.len() as u64;
        messages += 1;
        ack.ack();
        progress.inc(changes.len() as u64);
    }
    let seconds = started.elapsed().as_secs_f64();
    progress.finish();
    stream.shutdown().await?;
    ensure!(got == rows, "{got} of {rows} rows read");
    Ok(Throughput {
        shape,
        rows: got,
        messages,
        seconds,
        rows_per_s: got as f64 / seconds,
        wal_mb_per_s: wal as f64 / seconds / 1e6,
        json_mb_per_s: json as f64 / seconds / 1e6,
    })
}

/// Takes one message, acknowledges it, stalls while sampling what the reader holds, then drains.
async fn stalled(config: CdcConfig, sizes: &Sizes) -> anyhow::Result<Buffering> {
    let bound = config.stream.buffer_bound();
    let rss_before = crate::proc::rss_kib(None).unwrap_or(0);
    let mut stream = CdcSource::start(config).await?;
    let first = tokio::time::timeout(Duration::from_secs(60), stream.recv())
        .await
        .context("no first message for 60 s")??
        .context("the stream ended before its first message")?;
    let mut rows = first.changes().len() as u64;
    let mut wal: u64 = first.changes().iter().map(|c| c.wal_bytes as u64).sum();
    let mut largest = first
        .changes()
        .iter()
        .map(|c| c.wal_bytes)
        .max()
        .unwrap_or(0);
    first.ack();
    let (mut peak_rows, mut peak_bytes, mut peak_rss) = (0usize, 0usize, rss_before);
    let until = Instant::now() + sizes.stall;
    while Instant::now() < until {
        peak_rows = peak_rows.max(stream.rows_in_flight());
        peak_bytes = peak_bytes.max(stream.wal_bytes_in_flight());
        peak_rss = peak_rss.max(crate::proc::rss_kib(None).unwrap_or(0));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let started = Instant::now();
    while rows < sizes.big_rows as u64 && started.elapsed() < Duration::from_secs(300) {
        let Some(message) = tokio::time::timeout(Duration::from_secs(60), stream.recv())
            .await
            .context("no message for 60 s")??
        else {
            break;
        };
        rows += message.changes().len() as u64;
        for change in message.changes() {
            wal += change.wal_bytes as u64;
            largest = largest.max(change.wal_bytes);
        }
        message.ack();
    }
    stream.shutdown().await?;
    ensure!(
        rows == sizes.big_rows as u64,
        "{rows} of {} large rows read",
        sizes.big_rows
    );
    Ok(Buffering {
        peak_rows_unacked: peak_rows,
        bound_rows: bound.rows,
        bound_batches: bound.batches,
        wal_bytes_per_row: wal as f64 / rows.max(1) as f64,
        largest_row_wal_bytes: largest,
        peak_buffered_bytes: peak_bytes as f64,
        // The reader's own bound for these options, in WAL bytes for the largest row read.
        bound_bytes: bound.wal_bytes(largest) as f64,
        rss_growth_mib: peak_rss.saturating_sub(rss_before) as f64 / 1024.0,
    })
}

fn build_report(
    ctx: &Ctx,
    sizes: &Sizes,
    throughput: Vec<Throughput>,
    service: Vec<Service>,
    buffering: Buffering,
    peak_kib: Option<u64>,
) -> Report {
    let mut report = Report::new("cdc", QUESTION, ctx);
    let base = throughput.first().map_or(1.0, |t| t.rows_per_s);
    let mut table = Table::new(
        format!(
            "{} rows of ~{} B in transactions of {}, read from a replication slot by CdcSource; \
             each change turned into topic, event id and JSON, then acknowledged",
            report::count(sizes.rows as f64),
            sizes.row_bytes,
            sizes.rows_per_txn
        ),
        &[
            "output",
            "messages",
            "rows/s",
            "WAL MB/s",
            "event JSON MB/s",
            "vs one row per message",
        ],
    );
    for t in &throughput {
        table.row(vec![
            t.shape.to_owned(),
            report::count(t.messages as f64),
            report::count(t.rows_per_s),
            format!("{:.1}", t.wal_mb_per_s),
            format!("{:.1}", t.json_mb_per_s),
            report::ratio(t.rows_per_s / base),
        ]);
    }
    report.tables.push(table);
    let service_base = service.first().map_or(1.0, |t| t.rows_per_s);
    let mut through = Table::new(
        format!(
            "The same {} rows through `sheaf serve`'s CDC source, on the memory backends and on \
             Postgres (queue, outbox) + ClickHouse (log): each change published as an event and \
             acknowledged once durable",
            report::count(sizes.rows as f64)
        ),
        &[
            "backend",
            "SHEAF_CDC_BATCH_TRANSACTIONS",
            "events/s (10–90 %)",
            "all published after",
            "acknowledgements",
            "vs one row per message",
            "peak RSS (sheaf)",
        ],
    );
    for t in &service {
        through.row(vec![
            t.backend.to_owned(),
            t.shape.to_owned(),
            report::count(t.rows_per_s),
            format!("{:.1} s", t.seconds_to_all),
            report::count(t.acks),
            report::ratio(t.rows_per_s / service_base),
            format!("{:.1} MiB", t.peak_rss_mib),
        ]);
        report.memory.push(PeakRss::new(
            format!("sheaf serve with CDC ({}, {})", t.backend, t.shape),
            Some((t.peak_rss_mib * 1024.0) as u64),
        ));
    }
    report.tables.push(through);
    let best = service
        .iter()
        .filter(|t| t.backend != "memory")
        .map(|t| t.rows_per_s)
        .fold(0.0_f64, f64::max);
    report.target(
        "CDC catch-up through `sheaf serve` on Postgres + ClickHouse",
        "≥ 5,000 changes/s",
        format!(
            "{} changes/s (the faster output shape)",
            report::count(best)
        ),
        best >= 5_000.0,
    );
    let mut buffer = Table::new(
        format!(
            "Consumer stalled for {:.1} s after its first message; {} rows of ~{} B",
            sizes.stall.as_secs_f64(),
            report::count(sizes.big_rows as f64),
            sizes.big_row_bytes
        ),
        &[
            "rows handed over, unacknowledged (peak)",
            "bound: rows",
            "WAL bytes per row (mean, largest)",
            "buffered WAL (peak)",
            "bound: (depth + 1) × (byte cap + one row)",
            "process RSS growth",
        ],
    );
    buffer.row(vec![
        report::count(buffering.peak_rows_unacked as f64),
        report::count(buffering.bound_rows as f64),
        format!(
            "{}, {}",
            report::count(buffering.wal_bytes_per_row),
            report::count(buffering.largest_row_wal_bytes as f64)
        ),
        report::bytes(buffering.peak_buffered_bytes),
        report::bytes(buffering.bound_bytes),
        format!("{:.1} MiB", buffering.rss_growth_mib),
    ]);
    report.tables.push(buffer);
    report.target(
        "CDC reader's buffered data with a stalled consumer",
        &format!(
            "never above (channel depth + 1) × (byte cap + one row) of WAL: {} × ({} MiB + {} B)",
            buffering.bound_batches,
            sheaf_cdc::reader::MAX_BATCH_WAL_BYTES / (1024 * 1024),
            report::count(buffering.largest_row_wal_bytes as f64)
        ),
        format!(
            "{} of WAL buffered at peak against {}",
            report::bytes(buffering.peak_buffered_bytes),
            report::bytes(buffering.bound_bytes)
        ),
        buffering.peak_buffered_bytes <= buffering.bound_bytes,
    );
    report.memory.push(PeakRss::new(
        "sheaf-bench (CdcSource reader and consumer, in process)",
        peak_kib,
    ));
    report.note(
        "The first table is sheaf-cdc's CdcSource alone (\"published\" = turned into the topic, \
         id and JSON a publish carries, then acknowledged); the second is the service: written to \
         the (memory) log store and queue, then acknowledged.",
    );
    report.note(
        "WAL MB/s counts pgoutput message bytes as the reader receives them (Change::wal_bytes); \
         the buffered figure is the WAL bytes of the rows the reader handed over and the consumer \
         has not acknowledged (CdcStream::wal_bytes_in_flight), sampled every 20 ms while the \
         consumer did not read, and its bound is StreamOptions::buffer_bound for the run's \
         options, in the same unit, with the largest row read. Process RSS growth also counts \
         the transport's queue of undecoded messages and the decoded rows' size, which the \
         bound does not.",
    );
    report.figure = Some(
        Figure::new("cdc: Postgres inserts to events").panel(Panel::Bars {
            title: "rows per second: the reader alone, and through sheaf serve".to_owned(),
            unit: "rows/s".to_owned(),
            log: false,
            bars: throughput
                .iter()
                .enumerate()
                .map(|(i, t)| Bar::new(format!("reader, {}", t.shape), t.rows_per_s, i))
                .chain(service.iter().enumerate().map(|(i, t)| {
                    Bar::new(
                        format!("sheaf on {}, {}", t.backend, t.shape),
                        t.rows_per_s,
                        i,
                    )
                }))
                .collect(),
        }),
    );
    report.raw =
        serde_json::json!({ "sizes": sizes, "throughput": throughput, "buffering": buffering });
    report
}
