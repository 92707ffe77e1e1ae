//! What `destinations` measures for one type: a fresh target and the tenant's one destination
//! pointing at it, 32 closed-loop publishers, the delivered rate read from `/metrics` between
//! 10 % and 90 % of the events delivered, and what the target holds at the end.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};

use crate::load::{self, Pace};
use crate::progress::Progress;
use crate::report;
use crate::sheaf::{Sheaf, metric};

use super::target::{Arrived, Target, Urls};
use super::{DELIVER_TIMEOUT, Kind, Measured, POLL_EVERY, Sizes};

pub(super) async fn run_kind(
    sheaf: &Sheaf,
    kind: Kind,
    urls: Urls<'_>,
    sizes: &Sizes,
) -> anyhow::Result<Measured> {
    let tenant = format!("bench-{}", kind.name());
    let (target, config) = Target::prepare(kind, urls).await?;
    // Whatever happens next, what the bench created on the shared brokers is deleted.
    let outcome = Box::pin(deliver_to(sheaf, kind, &tenant, config, &target, sizes)).await;
    target.cleanup().await;
    let mut m = outcome?;
    let page = sheaf.metrics().await?;
    let labels = |result: &str| format!("type=\"{}\",result=\"{result}\"", kind.name());
    m.attempts_delivered = metric(
        &page,
        "sheaf_destination_attempts_total",
        &labels("delivered"),
    );
    m.attempts_retry = metric(&page, "sheaf_destination_attempts_total", &labels("retry"));
    m.peak_rss_mib = sheaf.peak_rss_kib().unwrap_or(0) as f64 / 1024.0;
    let a = &m.arrived;
    ensure!(
        a.messages == sizes.events && a.distinct == sizes.events && a.missing.is_empty(),
        "{} events published, but the destination holds {} messages of {} distinct events \
         (missing, first few: {:?})",
        sizes.events,
        a.messages,
        a.distinct,
        a.missing
    );
    if let Some(count) = a.queue_count {
        ensure!(
            count == sizes.events as u64,
            "the queue counted {count} messages for {} events",
            sizes.events
        );
    }
    if let Some(last) = a.last_sequence {
        ensure!(
            last == sizes.events as u64,
            "the stream's last sequence is {last} after {} events",
            sizes.events
        );
    }
    Ok(m)
}

/// Points `tenant`'s destination at `target`, delivers every event to it, and reads back what
/// arrived there.
async fn deliver_to(
    sheaf: &Sheaf,
    kind: Kind,
    tenant: &str,
    config: serde_json::Value,
    target: &Target,
    sizes: &Sizes,
) -> anyhow::Result<Measured> {
    sheaf.add_tenant(tenant).await?;
    sheaf
        .add_typed_destination(tenant, kind.name(), config)
        .await?;
    let mut m = Box::pin(deliver_all(sheaf, kind, tenant, sizes)).await?;
    // A duplicate attempt would be counted by now, and its message would have landed.
    tokio::time::sleep(Duration::from_secs(1)).await;
    m.arrived = target.arrived(sizes.events).await?;
    Ok(m)
}

/// Publishes the events from the closed loop while reading the delivered count from
/// `/metrics`; returns once every event was delivered.
async fn deliver_all(
    sheaf: &Sheaf,
    kind: Kind,
    tenant: &str,
    sizes: &Sizes,
) -> anyhow::Result<Measured> {
    let events = sizes.events;
    let labels = format!("type=\"{}\",result=\"delivered\"", kind.name());
    let delivered_now = async || -> anyhow::Result<f64> {
        let page = sheaf.metrics().await?;
        Ok(metric(&page, "sheaf_destination_attempts_total", &labels))
    };
    let before = delivered_now().await?;
    let progress = Arc::new(Progress::new(
        format!("destinations: {}", kind.name()),
        events as u64,
    ));
    let base = Instant::now();
    let load = tokio::spawn({
        let publisher = sheaf.publisher(tenant);
        let pad = Arc::new("x".repeat(sizes.pad_bytes));
        let progress = Arc::clone(&progress);
        let publishers = sizes.publishers;
        async move {
            load::publish(
                &publisher,
                base,
                0,
                events,
                Pace::Saturate(publishers),
                pad,
                &progress,
            )
            .await
        }
    });
    // (seconds since the first publish, delivered) when 10 % and 90 % were first seen.
    let (mut at10, mut at90, mut all_at) = (None, None, None);
    let mut delivered = 0.0;
    while base.elapsed() < DELIVER_TIMEOUT {
        delivered = delivered_now().await? - before;
        let now = base.elapsed().as_secs_f64();
        if at10.is_none() && delivered >= events as f64 * 0.1 {
            at10 = Some((now, delivered));
        }
        if at90.is_none() && delivered >= events as f64 * 0.9 {
            at90 = Some((now, delivered));
        }
        if delivered >= events as f64 {
            all_at = Some(now);
            break;
        }
        tokio::time::sleep(POLL_EVERY).await;
    }
    let sent = load.await.context("the publishers panicked")?;
    progress.finish();
    ensure!(
        sent.refused == 0 && sent.errors == 0,
        "{} publishes refused and {} failed of {events}",
        sent.refused,
        sent.errors
    );
    let Some(seconds) = all_at else {
        bail!("{delivered} of {events} events delivered within {DELIVER_TIMEOUT:?}");
    };
    let events_per_s = match (at10, at90) {
        (Some((t1, d1)), Some((t2, d2))) if t2 > t1 => (d2 - d1) / (t2 - t1),
        _ => events as f64 / seconds,
    };
    let publish_ms: Vec<f64> = sent
        .publish_micros
        .iter()
        .map(|&us| us as f64 / 1000.0)
        .collect();
    Ok(Measured {
        kind,
        events,
        seconds,
        events_per_s,
        publish_per_s: events as f64 / sent.elapsed.as_secs_f64().max(1e-9),
        publish_p50_ms: report::percentile(publish_ms, 50.0),
        attempts_delivered: 0.0,
        attempts_retry: 0.0,
        arrived: Arrived::default(),
        peak_rss_mib: 0.0,
    })
}
