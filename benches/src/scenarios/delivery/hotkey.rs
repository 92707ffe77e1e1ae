//! `delivery`'s hot-key configurations: one key's rate through an ordered destination, and
//! what it does to an unordered destination beside it in the same `sheaf serve`.
//!
//! An ordered destination has at most one delivery in flight per key (docs/api.md,
//! "Ordering"), so one key's events/s is at most 1 ÷ (the receiver's latency + Sheaf's own
//! time between one answer and the next request). One tenant, two webhook destinations, each on
//! a receiver of its own that answers after the same fixed latency: **H**, ordered by
//! `/data/key`, on topic [`HOT_TOPIC`], every event's key `"hot"`; **U**, unordered, on the
//! bench's usual topic. Each destination gets only its own topic, so the load on each is set
//! apart:
//!
//! 1. U alone: a fixed rate for a fixed time; its events/s and publish → delivered latency.
//! 2. The same load on U again, with H fed beside it: its events published one after the other
//!    (so their order is defined) whenever fewer than [`Sizes::backlog`] wait, so its key
//!    always has an event waiting and the backlog left at the end is small.
//! 3. H alone: a few events published one after the other, nothing else in the process.
//!
//! For H, per phase: its events/s (first request to last answer) against 1 ÷ the latency its
//! receiver measured, the time from each answer to the next request (Sheaf's own time per
//! delivery of one key), the most requests the receiver held open at one moment (must be 1)
//! and the events that arrived before one published earlier (must be none).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;
use sheaf_testenv::receiver::{Delivery, Receiver};

use crate::context::Ctx;
use crate::load::{self, Pace};
use crate::progress::Progress;
use crate::report::{self, Report, Table};
use crate::sheaf::{Publisher, Sheaf, TOPIC};

use super::measure::{Stores, phase};
use super::{Backend, PAD_BYTES, Phase};

/// The topic only the ordered destination H receives.
const HOT_TOPIC: &str = "bench.hot";
/// The one key of every event H receives.
const HOT_KEY: &str = "hot";

#[derive(Debug, Clone, Copy, Serialize)]
pub(super) struct Sizes {
    /// How long each receiver waits before it answers 200.
    latency_ms: f64,
    /// U's load, events/s, in both of its phases.
    plain_rate: f64,
    /// How long U's phases publish.
    seconds: f64,
    /// H's events published but not delivered yet, at most, while it is fed beside U.
    backlog: usize,
    /// H's events in the phase it runs alone.
    quiet_events: usize,
    warmup: usize,
}

impl Sizes {
    pub(super) fn new(ctx: &Ctx) -> Self {
        Sizes {
            latency_ms: 5.0,
            plain_rate: ctx.size(1_000.0, 100.0),
            seconds: ctx.size(20.0, 1.0),
            backlog: 8,
            quiet_events: ctx.size(50, 10),
            warmup: ctx.size(200, 20),
        }
    }
}

/// One hot-key configuration's figures.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Measured {
    backend: Backend,
    /// U with nothing published to H.
    alone: Phase,
    /// U under the same load, H fed beside it.
    beside: Phase,
    /// The `sheaf` process's CPU over each of U's phases (until U's last delivery), in % of
    /// one core.
    cpu_alone_percent: Option<f64>,
    cpu_beside_percent: Option<f64>,
    hot: HotKey,
}

/// What H's receiver saw.
#[derive(Debug, Clone, Serialize)]
struct HotKey {
    /// How long the receiver held each request (arrival to answer), both phases.
    receiver_latency_mean_ms: f64,
    receiver_latency_p99_ms: f64,
    /// 1 ÷ the mean receiver latency: the most one key can do.
    bound_per_s: f64,
    /// Beside U (its events while U was published) and alone.
    beside: HotPhase,
    quiet: HotPhase,
    /// The most requests for the key held open at one moment, both phases.
    max_in_flight: usize,
    /// Requests that arrived after one for an event published later, both phases.
    out_of_order: usize,
}

#[derive(Debug, Clone, Serialize)]
struct HotPhase {
    published: usize,
    delivered: usize,
    /// Requests ÷ (last answer − first request); beside U, of the requests that arrived while
    /// U was published.
    events_per_s: f64,
    /// From one answer to the next request's arrival: Sheaf's time per delivery of one key.
    gap_mean_ms: f64,
    gap_p50_ms: f64,
    gap_p99_ms: f64,
}

pub(super) async fn run(
    ctx: &Ctx,
    bin: &std::path::Path,
    sizes: &Sizes,
    backend: Backend,
) -> anyhow::Result<Measured> {
    let base = Instant::now();
    let latency = Duration::from_secs_f64(sizes.latency_ms / 1_000.0);
    let plain_rx = Receiver::builder().delay(latency).start().await?;
    let hot_rx = Receiver::builder().delay(latency).start().await?;
    let stores = Stores::new(ctx, backend).await?;
    let log = ctx
        .out_dir
        .join("logs")
        .join(format!("delivery-{backend:?}.log").to_lowercase());
    let sheaf = Sheaf::start(bin, &stores.env, &log).await?;
    let plain_settings = serde_json::json!({ "topics": [TOPIC] });
    let hot_settings = serde_json::json!({
        "topics": [HOT_TOPIC],
        "ordering": { "key": "/data/key" },
    });
    sheaf
        .add_destination_with("bench", &plain_rx.url(), plain_settings)
        .await?;
    sheaf
        .add_destination_with("bench", &hot_rx.url(), hot_settings)
        .await?;
    let plain = sheaf.publisher("bench");
    let hot = sheaf
        .publisher("bench")
        .on_topic(HOT_TOPIC)
        .with_key(HOT_KEY);
    let pad = Arc::new("x".repeat(PAD_BYTES));
    let per_phase = (sizes.plain_rate * sizes.seconds) as usize;
    let hot_warmup = sizes.warmup / 40;
    let progress = Arc::new(Progress::new(
        format!("delivery: {}", backend.label()),
        (sizes.warmup + hot_warmup + 2 * per_phase + sizes.quiet_events) as u64,
    ));
    let publish = |publisher: &Publisher, first: u64, count: usize, pace: Pace| {
        let (publisher, pad, progress) =
            (publisher.clone(), Arc::clone(&pad), Arc::clone(&progress));
        async move { load::publish(&publisher, base, first, count, pace, pad, &progress).await }
    };

    // Warm-up of both destinations: connections, caches; not measured.
    let (warm, hot_warm) = tokio::join!(
        publish(&plain, 0, sizes.warmup, Pace::Saturate(8)),
        publish(&hot, 500_000, hot_warmup, Pace::Saturate(1)),
    );
    plain_rx
        .wait_for_count(accepted(&warm, sizes.warmup), Duration::from_secs(60))
        .await;
    hot_rx
        .wait_for_count(accepted(&hot_warm, hot_warmup), Duration::from_secs(60))
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;

    // 1. U alone.
    let first = 1_000_000;
    plain_rx.reset();
    let started = (Instant::now(), sheaf.cpu_time());
    let sent = publish(&plain, first, per_phase, Pace::Rate(sizes.plain_rate)).await;
    plain_rx
        .wait_for_count(accepted(&sent, per_phase), Duration::from_secs(300))
        .await;
    let cpu_alone_percent = cpu_percent(started, sheaf.cpu_time());
    let alone = phase(&sent, first, &plain_rx, base);
    tokio::time::sleep(Duration::from_millis(500)).await;

    // 2. U again, H fed beside it until U's load ends.
    let first = 2_000_000;
    plain_rx.reset();
    hot_rx.reset();
    let stop = AtomicBool::new(false);
    let started = (Instant::now(), sheaf.cpu_time());
    let plain_load = async {
        let sent = publish(&plain, first, per_phase, Pace::Rate(sizes.plain_rate)).await;
        stop.store(true, Ordering::Relaxed);
        sent
    };
    let (sent, fed) = tokio::join!(
        plain_load,
        feed(&hot, &hot_rx, 3_000_000, sizes.backlog, &stop, &pad)
    );
    let fed_until = Instant::now();
    plain_rx
        .wait_for_count(accepted(&sent, per_phase), Duration::from_secs(300))
        .await;
    let cpu_beside_percent = cpu_percent(started, sheaf.cpu_time());
    let beside = phase(&sent, first, &plain_rx, base);
    // The backlog left: at most `backlog` events.
    let drain = Duration::from_secs(60);
    if !hot_rx.wait_for_count(fed, drain).await {
        anyhow::bail!(
            "the hot key delivered {} of {fed} events in {drain:?}",
            hot_rx.delivered_count()
        );
    }
    let fed_deliveries = hot_rx.deliveries();
    tokio::time::sleep(Duration::from_millis(500)).await;

    // 3. H alone.
    hot_rx.reset();
    let quiet_sent = publish(&hot, 4_000_000, sizes.quiet_events, Pace::Saturate(1)).await;
    let quiet_accepted = accepted(&quiet_sent, sizes.quiet_events);
    if !hot_rx.wait_for_count(quiet_accepted, drain).await {
        anyhow::bail!(
            "the hot key alone delivered {} of {quiet_accepted} events in {drain:?}",
            hot_rx.delivered_count()
        );
    }
    let quiet_deliveries = hot_rx.deliveries();
    progress.finish();
    sheaf.stop().await?;
    drop(stores);

    let in_window: Vec<Delivery> = fed_deliveries
        .iter()
        .filter(|d| d.arrived <= fed_until)
        .cloned()
        .collect();
    let both: Vec<Delivery> = fed_deliveries
        .iter()
        .chain(&quiet_deliveries)
        .cloned()
        .collect();
    let latencies: Vec<f64> = both
        .iter()
        .map(|d| millis(d.answered.duration_since(d.arrived)))
        .collect();
    let latency_mean_ms = mean(&latencies);
    Ok(Measured {
        backend,
        alone,
        beside,
        cpu_alone_percent,
        cpu_beside_percent,
        hot: HotKey {
            receiver_latency_mean_ms: latency_mean_ms,
            receiver_latency_p99_ms: report::percentile(latencies, 99.0),
            bound_per_s: 1_000.0 / latency_mean_ms,
            beside: hot_phase(fed, fed_deliveries.len(), &in_window),
            quiet: hot_phase(quiet_accepted, quiet_deliveries.len(), &quiet_deliveries),
            max_in_flight: max_in_flight(&fed_deliveries).max(max_in_flight(&quiet_deliveries)),
            out_of_order: out_of_order(&fed_deliveries) + out_of_order(&quiet_deliveries),
        },
    })
}

/// Publishes H's events from `first_seq` on, each after the previous one's answer, whenever
/// fewer than `backlog` are published and not yet delivered, until `stop`; returns how many
/// were accepted.
async fn feed(
    publisher: &Publisher,
    receiver: &Receiver,
    first_seq: u64,
    backlog: usize,
    stop: &AtomicBool,
    pad: &str,
) -> usize {
    let (mut seq, mut accepted) = (first_seq, 0);
    while !stop.load(Ordering::Relaxed) {
        if accepted - receiver.delivered_count().min(accepted) >= backlog {
            tokio::time::sleep(Duration::from_millis(1)).await;
            continue;
        }
        if let Ok(true) = publisher.publish(seq, pad).await {
            accepted += 1;
        }
        seq += 1;
    }
    accepted
}

fn accepted(sent: &load::Sent, count: usize) -> usize {
    count - (sent.refused + sent.errors) as usize
}

/// CPU time used since `started` ÷ wall time, in % of one core.
fn cpu_percent(started: (Instant, Option<Duration>), now: Option<Duration>) -> Option<f64> {
    let used = now?.checked_sub(started.1?)?;
    Some(100.0 * used.as_secs_f64() / started.0.elapsed().as_secs_f64().max(1e-9))
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1_000.0
}

/// One phase of H: its rate and gaps from the requests its receiver answered 200 in the window
/// measured.
fn hot_phase(published: usize, delivered: usize, deliveries: &[Delivery]) -> HotPhase {
    let answered = by_arrival(deliveries);
    let gaps: Vec<f64> = answered
        .windows(2)
        .map(|w| millis(w[1].arrived.saturating_duration_since(w[0].answered)))
        .collect();
    let span = match (answered.first(), answered.iter().map(|d| d.answered).max()) {
        (Some(first), Some(last)) => last.duration_since(first.arrived).as_secs_f64(),
        _ => 0.0,
    };
    HotPhase {
        published,
        delivered,
        events_per_s: if span > 0.0 {
            answered.len() as f64 / span
        } else {
            0.0
        },
        gap_mean_ms: mean(&gaps),
        gap_p50_ms: report::percentile(gaps.clone(), 50.0),
        gap_p99_ms: report::percentile(gaps, 99.0),
    }
}

fn by_arrival(deliveries: &[Delivery]) -> Vec<&Delivery> {
    let mut answered: Vec<&Delivery> = deliveries.iter().filter(|d| d.status == 200).collect();
    answered.sort_by_key(|d| d.arrived);
    answered
}

/// Requests that arrived after one for a later `seq` (each phase's events are published one
/// after the other, in `seq` order).
fn out_of_order(deliveries: &[Delivery]) -> usize {
    let seq = |d: &Delivery| {
        serde_json::from_slice::<serde_json::Value>(&d.body)
            .ok()
            .and_then(|v| v.get("seq").and_then(serde_json::Value::as_u64))
            .unwrap_or(0)
    };
    let mut highest = 0;
    let mut late = 0;
    for d in by_arrival(deliveries) {
        let s = seq(d);
        if s < highest {
            late += 1;
        }
        highest = highest.max(s);
    }
    late
}

fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len().max(1) as f64
}

/// The most requests held open at one moment: each request is open from its arrival to its
/// answer (an answer and an arrival at the same instant do not overlap).
fn max_in_flight(deliveries: &[Delivery]) -> usize {
    let mut edges: Vec<(Instant, i32)> = deliveries
        .iter()
        .flat_map(|d| [(d.arrived, 1), (d.answered, -1)])
        .collect();
    edges.sort();
    let (mut open, mut most) = (0_i32, 0_i32);
    for (_, step) in edges {
        open += step;
        most = most.max(open);
    }
    most as usize
}

/// The hot-key tables, targets and note.
pub(super) fn add_to_report(report: &mut Report, sizes: &Sizes, measured: &[Measured]) {
    if measured.is_empty() {
        return;
    }
    let mut plain = Table::new(
        format!(
            "One hot key beside an unordered destination U in the same `sheaf serve`: U under \
             {} events/s for {:.0} s alone, then the same with the hot key fed beside it (at \
             most {} of its events waiting); both receivers answer after {} ms",
            report::count(sizes.plain_rate),
            sizes.seconds,
            sizes.backlog,
            sizes.latency_ms
        ),
        &[
            "configuration",
            "U delivered / published: alone, beside",
            "U events/s: alone, beside",
            "ratio",
            "U p50: alone, beside",
            "U p99: alone, beside",
            "sheaf CPU: alone, beside",
        ],
    );
    let mut hot = Table::new(
        format!(
            "The hot key: one destination ordered by `/data/key`, every event's key `\"hot\"`, \
             fed beside U, then {} events alone; its bound is 1 ÷ the receiver's measured \
             latency",
            sizes.quiet_events
        ),
        &[
            "configuration",
            "phase",
            "delivered / published",
            "events/s",
            "bound",
            "÷ bound",
            "answer → next request mean / p50 / p99",
            "receiver latency mean / p99",
            "max in flight",
            "out of order",
        ],
    );
    let percent = |p: Option<f64>| p.map_or_else(|| "–".to_owned(), |p| format!("{p:.0} %"));
    let pair = |a: String, b: String| format!("{a}, {b}");
    for m in measured {
        let (a, b, h) = (&m.alone, &m.beside, &m.hot);
        let label = m.backend.label();
        plain.row(vec![
            label.to_owned(),
            pair(
                format!("{} / {}", a.delivered, a.published),
                format!("{} / {}", b.delivered, b.published),
            ),
            pair(report::count(a.events_per_s), report::count(b.events_per_s)),
            format!("{:.3}x", b.events_per_s / a.events_per_s),
            pair(report::millis(a.p50_ms), report::millis(b.p50_ms)),
            pair(report::millis(a.p99_ms), report::millis(b.p99_ms)),
            pair(percent(m.cpu_alone_percent), percent(m.cpu_beside_percent)),
        ]);
        for (name, p) in [("beside U", &h.beside), ("alone", &h.quiet)] {
            hot.row(vec![
                label.to_owned(),
                name.to_owned(),
                format!("{} / {}", p.delivered, p.published),
                format!("{:.1}", p.events_per_s),
                format!("{:.1} /s", h.bound_per_s),
                format!("{:.3}x", p.events_per_s / h.bound_per_s),
                format!(
                    "{} / {} / {}",
                    report::millis(p.gap_mean_ms),
                    report::millis(p.gap_p50_ms),
                    report::millis(p.gap_p99_ms)
                ),
                format!(
                    "{} / {}",
                    report::millis(h.receiver_latency_mean_ms),
                    report::millis(h.receiver_latency_p99_ms)
                ),
                h.max_in_flight.to_string(),
                h.out_of_order.to_string(),
            ]);
        }
        for (name, p) in [
            ("beside an unordered destination's load", &h.beside),
            ("alone in the process", &h.quiet),
        ] {
            let fraction = p.events_per_s / h.bound_per_s;
            report.target(
                &format!("{label}: one hot key's rate, {name}"),
                "≤ 1 ÷ the receiver's latency and ≥ 0.8x of it; one delivery in flight at most, in published order",
                format!(
                    "{:.1} events/s against {:.1} ({fraction:.3}x); at most {} in flight, {} out of order",
                    p.events_per_s, h.bound_per_s, h.max_in_flight, h.out_of_order
                ),
                (0.8..=1.0).contains(&fraction) && h.max_in_flight == 1 && h.out_of_order == 0,
            );
        }
        let ratio = b.events_per_s / a.events_per_s;
        report.target(
            &format!("{label}: the unordered destination beside the hot key"),
            "≥ 0.95x its events/s alone, every event delivered, p50 publish → delivered within 1 ms of alone",
            format!(
                "{ratio:.3}x, {} of {} delivered, p50 {} against {}",
                report::count(b.delivered as f64),
                report::count(b.published as f64),
                report::millis(b.p50_ms),
                report::millis(a.p50_ms)
            ),
            ratio >= 0.95 && b.delivered >= b.published && b.p50_ms <= a.p50_ms + 1.0,
        );
    }
    report.tables.push(plain);
    report.tables.push(hot);
    report.note(
        "Hot key: U's latency is from the start of the publish request to the request's arrival \
         at its receiver (the receiver's own wait not in it); the hot key's events/s is its \
         requests ÷ (last answer − first request), beside U over the requests that arrived \
         while U was published; the receiver latency is each request's arrival to its answer, \
         measured by the receiver; 'answer → next request' is from the receiver's answer to \
         the next request's arrival, Sheaf's own time per delivery of one key. CPU is the \
         `sheaf` process's over U's phase until its last delivery, in % of one core.",
    );
    if let Some(raw) = report.raw.as_object_mut() {
        raw.insert(
            "hot_key".to_owned(),
            serde_json::json!({ "sizes": sizes, "configurations": measured }),
        );
    }
}
