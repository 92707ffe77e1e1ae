//! `cdc`'s service runs: `sheaf serve` with its CDC source on a slot holding the scenario's rows,
//! on the memory backends or on Postgres + ClickHouse, until every change is published. The rate
//! is read from `/metrics` between 10 % and 90 % of the rows published.

use std::time::{Duration, Instant};

use anyhow::ensure;
use serde::Serialize;

use crate::context::Ctx;
use crate::progress::Progress;
use crate::sheaf::{Sheaf, metric};

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
