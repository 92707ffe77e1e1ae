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
//!
//! `measure.rs` runs the readers and the service and measures them; `report.rs` builds the
//! tables and the figure from what they measured.

mod measure;
mod report;

use measure::{Run, read_all, stalled, through_sheaf};
use report::build_report;

use std::time::Duration;

use anyhow::Context as _;
use serde::Serialize;
use sheaf_cdc::{CdcConfig, ConnectionConfig, StreamOptions};
use sheaf_testenv::postgres::drop_replication_slot;

use crate::ch::ChDb;
use crate::context::Ctx;
use crate::pg::{self, PgSchema};
use crate::progress::Progress;
use crate::report::Report;

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
