//! The `destinations` scenario's report: its table, its figure and its notes, built from what
//! `measure.rs` measured.

use super::{Kind, Measured, QUESTION, Sizes};
use crate::context::Ctx;
use crate::plot::{Bar, Figure, Panel};
use crate::report::{self, PeakRss, Report, Table};

pub(super) fn build_report(
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
