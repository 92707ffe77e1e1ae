//! `destinations`: events per second from one `sheaf serve` to each destination type, side by
//! side: a webhook to a loopback receiver, a RabbitMQ exchange (persistent messages, publisher
//! confirms) bound to a durable queue, and a NATS JetStream stream on file storage (each publish
//! waits for the stream's ack).
//!
//! One process on the memory backends, one tenant per type. For each type in turn the bench
//! creates a fresh target (the receiver; a durable exchange and queue; a stream on a fresh
//! subject), points that tenant's only destination at it, and 32 closed-loop publishers publish
//! the same number of events. The delivered rate is read from `/metrics`
//! (`sheaf_destination_attempts_total{type=…,result="delivered"}`) between 10 % and 90 % of the
//! events delivered, so neither the first connections nor the last stragglers count. Then the
//! destination itself is asked what arrived: the receiver's 2xx by `webhook-id`, the queue's
//! message count (a passive declare) and every message's `message_id` (consumed), the stream's
//! message count, last sequence and every message's `Nats-Msg-Id`. Every event must be there
//! exactly once, or the scenario fails: a rate is only worth reading if it delivered everything.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use serde::Serialize;

use crate::context::Ctx;
use crate::load::{self, Pace};
use crate::plot::{Bar, Figure, Panel};
use crate::progress::Progress;
use crate::report::{self, PeakRss, Report, Table};
use crate::sheaf::{Sheaf, metric};

use super::delivery::PAD_BYTES;
use super::destinations_target::{Arrived, Target, Urls};

const QUESTION: &str = "How many events per second does one `sheaf` process deliver to each \
    destination type (a webhook, a RabbitMQ exchange with publisher confirms, a NATS JetStream \
    stream), side by side?";

/// How long one type may take to deliver all its events before the scenario gives up.
const DELIVER_TIMEOUT: Duration = Duration::from_secs(300);

/// How often `/metrics` is read while a type delivers: fine enough for the 10 %–90 % window of
/// a quick run (about a second), cheap enough not to load the process it measures.
const POLL_EVERY: Duration = Duration::from_millis(25);

/// The destination types, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum Kind {
    Webhook,
    Rabbitmq,
    Nats,
}

impl Kind {
    const ALL: [Kind; 3] = [Kind::Webhook, Kind::Rabbitmq, Kind::Nats];

    /// The destination's `type`, and the `type` label of its metrics.
    pub(super) fn name(self) -> &'static str {
        match self {
            Kind::Webhook => "webhook",
            Kind::Rabbitmq => "rabbitmq",
            Kind::Nats => "nats",
        }
    }

    /// What the destination is, for the table.
    fn label(self) -> &'static str {
        match self {
            Kind::Webhook => "webhook (loopback receiver)",
            Kind::Rabbitmq => "rabbitmq (confirms, durable queue)",
            Kind::Nats => "nats (JetStream, file storage)",
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize)]
struct Sizes {
    events: usize,
    publishers: usize,
    pad_bytes: usize,
}

/// What one type did.
#[derive(Debug, Clone, Serialize)]
struct Measured {
    kind: Kind,
    events: usize,
    /// From the first publish until every event was delivered.
    seconds: f64,
    /// Delivered events per second between 10 % and 90 % delivered.
    events_per_s: f64,
    /// Publishes per second the closed loop achieved (the rate can be no higher).
    publish_per_s: f64,
    publish_p50_ms: f64,
    /// Attempts of this type by result, at the end.
    attempts_delivered: f64,
    attempts_retry: f64,
    /// What the destination holds at the end.
    arrived: Arrived,
    /// The process's peak RSS once this type was done (a running maximum).
    peak_rss_mib: f64,
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<Report> {
    let sizes = Sizes {
        events: ctx.size(20_000, 1_000),
        publishers: 32,
        pad_bytes: PAD_BYTES,
    };
    // Both URLs first: a missing one fails before anything starts.
    let (rabbitmq, nats) = (ctx.rabbitmq()?.to_owned(), ctx.nats()?.to_owned());
    let bin = ctx.sheaf_bin()?.to_path_buf();
    let log = ctx.out_dir.join("logs").join("destinations.log");
    let sheaf = Sheaf::start(&bin, &[], &log).await?;
    let mut measured = Vec::new();
    let mut failure = None;
    for kind in Kind::ALL {
        let urls = Urls {
            rabbitmq: &rabbitmq,
            nats: &nats,
        };
        match run_kind(&sheaf, kind, urls, &sizes)
            .await
            .with_context(|| kind.name())
        {
            Ok(m) => measured.push(m),
            Err(err) => {
                failure = Some(err);
                break;
            }
        }
    }
    let peak_kib = sheaf.peak_rss_kib();
    sheaf.stop().await?;
    if let Some(err) = failure {
        return Err(err.context(format!("sheaf's log: {}", log.display())));
    }
    Ok(build_report(ctx, &sizes, measured, peak_kib))
}

async fn run_kind(
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

fn build_report(
    ctx: &Ctx,
    sizes: &Sizes,
    measured: Vec<Measured>,
    peak_kib: Option<u64>,
) -> Report {
    let mut report = Report::new("destinations", QUESTION, ctx);
    let webhook = measured
        .iter()
        .find(|m| m.kind == Kind::Webhook)
        .map_or(0.0, |m| m.events_per_s);
    let mut table = Table::new(
        format!(
            "One `sheaf serve` on the memory backends, one tenant and destination per type, \
             ~{} B payloads; per type {} events from {} closed-loop publishers, delivered rate \
             between 10 % and 90 % delivered",
            sizes.pad_bytes,
            report::count(sizes.events as f64),
            sizes.publishers
        ),
        &[
            "type",
            "events",
            "seconds",
            "events/s",
            "vs webhook",
            "publishes/s",
            "publish p50",
            "arrived (distinct)",
        ],
    );
    for m in &measured {
        table.row(vec![
            m.kind.label().to_owned(),
            report::count(m.events as f64),
            format!("{:.2}", m.seconds),
            report::count(m.events_per_s),
            report::ratio(m.events_per_s / webhook),
            report::count(m.publish_per_s),
            report::millis(m.publish_p50_ms),
            format!(
                "{} ({})",
                report::count(m.arrived.messages as f64),
                report::count(m.arrived.distinct as f64)
            ),
        ]);
    }
    report.tables.push(table);
    report.memory.push(PeakRss::new(
        "sheaf serve (memory backends, all three types)",
        peak_kib,
    ));
    report.note(
        "events/s is the growth of sheaf_destination_attempts_total{type=…,result=\"delivered\"} \
         between the first /metrics read at or past 10 % of the events delivered and the first \
         at or past 90 % (read every 25 ms), over the time between them; seconds runs from the \
         first publish until every event was delivered. publishes/s is the 32 closed-loop \
         publishers' rate over the whole run: where a type's events/s is close to it, the \
         publishers set the pace, not the type.",
    );
    report.note(
        "Every event was verified at the destination exactly once: the receiver's 2xx by \
         webhook-id; the queue's message count (passive queue.declare) and the message_id of \
         every consumed message; the stream's message count, last sequence and the Nats-Msg-Id \
         of every stored message. The RabbitMQ and NATS servers are the shared ones of \
         `cargo xtask services up`, on the same 2 cores as sheaf, the bench and its receiver.",
    );
    if measured.iter().any(|m| m.attempts_retry > 0.0) {
        report.note(format!(
            "Attempts retried: {}.",
            measured
                .iter()
                .map(|m| format!("{} {}", m.kind.name(), m.attempts_retry))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    report.figure = Some(
        Figure::new("destinations: events/s from one sheaf process, per type").panel(Panel::Bars {
            title: "delivered events per second (10 %–90 % delivered)".to_owned(),
            unit: "events/s".to_owned(),
            log: false,
            bars: measured
                .iter()
                .enumerate()
                .map(|(i, m)| Bar::new(m.kind.label(), m.events_per_s, i))
                .collect(),
        }),
    );
    report.raw = serde_json::json!({ "sizes": sizes, "measured": measured });
    report
}
