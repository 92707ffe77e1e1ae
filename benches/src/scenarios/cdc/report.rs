//! The `cdc` scenario's report: its tables, its figure and its notes, built from what
//! `measure.rs` measured.

use crate::context::Ctx;
use crate::plot::{Bar, Figure, Panel};
use crate::report::{self, PeakRss, Report, Table};

use super::measure::Service;
use super::{Buffering, QUESTION, Sizes, Throughput};

pub(super) fn build_report(
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
