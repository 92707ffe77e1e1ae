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
//!
//! `target.rs` prepares each type's target and reads back what arrived there; `measure.rs`
//! runs one type and measures it; `report.rs` builds the table and the figure.

mod measure;
mod report;
mod target;

use measure::run_kind;
use report::build_report;

use std::time::Duration;

use anyhow::Context as _;
use serde::Serialize;

use crate::context::Ctx;
use crate::report::Report;
use crate::sheaf::Sheaf;

use super::delivery::PAD_BYTES;
use target::{Arrived, Urls};

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
