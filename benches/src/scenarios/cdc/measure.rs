//! What `cdc` measures: a slot read to its end by `CdcSource` with one of the two output
//! shapes (rows and bytes per second), the reader's buffering while its consumer stalls, and
//! the service runs, `sheaf serve` with its CDC source on a slot holding the scenario's rows, on
//! the memory backends or on Postgres + ClickHouse, until every change is published (the rate
//! read from `/metrics` between 10 % and 90 % of the rows published).

use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use serde::Serialize;
use sheaf_cdc::{CdcConfig, CdcSource};

use crate::context::Ctx;
use crate::progress::Progress;
use crate::sheaf::{Sheaf, metric};

use super::{Buffering, Sizes, Throughput};

/// Reads `rows` rows from the slot, turning each into an event's topic, id and JSON, and
/// acknowledging each message after.
pub(super) async fn read_all(
    config: CdcConfig,
    shape: &'static str,
    rows: u64,
) -> anyhow::Result<Throughput> {
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
pub(super) async fn stalled(config: CdcConfig, sizes: &Sizes) -> anyhow::Result<Buffering> {
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

#[derive(Debug, Clone, Serialize)]
pub(super) struct Service {
    pub(super) backend: &'static str,
    pub(super) shape: &'static str,
    pub(super) rows: u64,
    pub(super) rows_per_s: f64,
    /// Seconds from the tenant's creation until every row was published.
    pub(super) seconds_to_all: f64,
    pub(super) acks: f64,
    pub(super) peak_rss_mib: f64,
}

/// One run of `sheaf serve` with its CDC source.
pub(super) struct Run<'a> {
    pub(super) backend: &'static str,
    /// The stores' settings; none for the memory backends.
    pub(super) stores: &'a [(&'static str, String)],
    pub(super) slot: &'a str,
    pub(super) publication: &'a str,
    pub(super) shape: &'static str,
    pub(super) batch: bool,
}

/// Runs `sheaf serve` with its CDC source on the run's slot until `rows` events are published.
pub(super) async fn through_sheaf(
    ctx: &Ctx,
    bin: &std::path::Path,
    url: &str,
    run: Run<'_>,
    rows: u64,
) -> anyhow::Result<Service> {
    let Run {
        backend,
        stores,
        slot,
        publication,
        shape,
        batch,
    } = run;
    let mut env = vec![
        ("SHEAF_CDC_ENABLED", "true".to_owned()),
        ("SHEAF_CDC_POSTGRES_URL", url.to_owned()),
        ("SHEAF_CDC_SLOT", slot.to_owned()),
        ("SHEAF_CDC_PUBLICATION", publication.to_owned()),
        ("SHEAF_CDC_TENANTS", "bench".to_owned()),
        ("SHEAF_CDC_BATCH_TRANSACTIONS", batch.to_string()),
    ];
    env.extend(stores.iter().cloned());
    let log = ctx.out_dir.join("logs").join(format!(
        "cdc-sheaf-{}-{}.log",
        if stores.is_empty() { "memory" } else { "pgch" },
        if batch { "txns" } else { "rows" }
    ));
    let sheaf = Sheaf::start(bin, &env, &log).await?;
    sheaf.add_tenant("bench").await?;
    let started = Instant::now();
    let progress = Progress::new(format!("cdc: sheaf on {backend}, {shape}"), rows);
    let (mut at10, mut at90, mut published) = (None, None, 0.0);
    // Bounded: ten minutes at most.
    while started.elapsed() < Duration::from_secs(600) {
        let page = sheaf.metrics().await?;
        published = metric(&page, "sheaf_cdc_events_published_total", "");
        let now = started.elapsed().as_secs_f64();
        if at10.is_none() && published >= rows as f64 * 0.1 {
            at10 = Some((now, published));
        }
        if at90.is_none() && published >= rows as f64 * 0.9 {
            at90 = Some((now, published));
        }
        progress.inc((published as u64).saturating_sub(progress.done()));
        if published >= rows as f64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    progress.finish();
    let seconds_to_all = started.elapsed().as_secs_f64();
    let page = sheaf.metrics().await?;
    let acks = metric(&page, "sheaf_cdc_acks_total", "");
    let peak_rss_mib = sheaf.peak_rss_kib().unwrap_or(0) as f64 / 1024.0;
    sheaf.stop().await?;
    ensure!(
        published as u64 >= rows,
        "{published} of {rows} rows published: {log:?}"
    );
    let rows_per_s = match (at10, at90) {
        (Some((t1, p1)), Some((t2, p2))) if t2 > t1 => (p2 - p1) / (t2 - t1),
        _ => rows as f64 / seconds_to_all,
    };
    Ok(Service {
        backend,
        shape,
        rows,
        rows_per_s,
        seconds_to_all,
        acks,
        peak_rss_mib,
    })
}
