//! `overload`: a process on the in-memory stores is offered twice what it can deliver, for 60 s (10 s with
//! `--quick`), by an open-loop generator that keeps its rate whatever the latency.
//!
//! First its capacity is measured on the same machine in the same run: 32 closed-loop
//! publishers for a few seconds against a receiver answering 200 at once, accepted publishes
//! per second (each is delivered as it goes). Then events start at twice that rate. What must
//! hold: every accepted event is delivered; every refused one got `503` with `Retry-After` (no
//! other answer, no timeout); the process's memory stays under what its bounds allow; and the
//! accepted publishes' latency stays bounded: printed, and checked by how it moves rather than
//! by a figure a shared machine cannot promise. Work queued in front of the door grows for as
//! long as the overload lasts, so its latency climbs from the first third of the run to the
//! last; a door that refuses the excess keeps it flat. The check: the last third's p99 at most
//! twice the first third's, or 1 s.

use std::time::{Duration, Instant};

use sheaf_testenv::receiver::Receiver;

use crate::api::{Api, metric};
use crate::env::Ctx;
use crate::load::{closed_loop, open_loop};
use crate::report::{Report, secs};
use crate::sheaf;

use super::{SETTLE, TENANT, stop_clean};

/// See `outage`: what one held or retained 1 KB event may cost at most, the log's retention
/// (set low, as there), and the process before any event.
const BYTES_PER_EVENT: f64 = 4096.0;
const RETAINED_EVENTS: usize = 500;
const BASE_MIB: f64 = 200.0;

/// Publishes handled at once: a debug build takes a few hundred a second, so the default 1,024
/// would be seconds of queueing inside the process; 64 are a fraction of a second.
const IN_FLIGHT: usize = 64;

/// Publishes the generator keeps open at once: the connections the process holds. Sheaf does
/// not bound its connections (a reverse proxy in front of it does that), so what they cost
/// (hyper's buffers and a task each, about 50 KiB measured here at 4,000 open) is counted in
/// the memory the bounds allow, at 64 KiB each.
const OPEN: usize = 4_096;
const BYTES_PER_CONNECTION: f64 = 65536.0;

/// Below this a p99 is not called growing, whatever the ratio.
const P99_FLOOR: Duration = Duration::from_secs(1);

pub async fn run(ctx: &Ctx) -> anyhow::Result<Report> {
    let mut report = Report::new("overload");
    let (measure, span, bound) = if ctx.quick {
        (Duration::from_secs(3), Duration::from_secs(10), 1_000)
    } else {
        (Duration::from_secs(5), Duration::from_secs(60), 5_000)
    };
    let mut settings = ctx.memory_settings();
    settings.extend(
        [
            ("SHEAF_MEMORY_MAX_PENDING_EVENTS", bound.to_string()),
            ("SHEAF_MEMORY_LOG_MAX_EVENTS", RETAINED_EVENTS.to_string()),
            ("SHEAF_MAX_PUBLISHES_IN_FLIGHT", IN_FLIGHT.to_string()),
        ]
        .map(|(k, v)| (k.to_owned(), v)),
    );
    let rss_limit = BASE_MIB
        + ((bound + RETAINED_EVENTS) as f64 * BYTES_PER_EVENT + OPEN as f64 * BYTES_PER_CONNECTION)
            / 1048576.0;
    let receiver = Receiver::builder().start().await?;
    let mut sheaf = sheaf::spawn(ctx, "overload", "a", &settings).await?;
    let base = sheaf.base();
    // Longer than the service's own request timeout (30 s), so every publish gets the service's
    // answer, a 503 `request_timeout` at worst, rather than the client's giving up.
    let api = Api::new(Duration::from_secs(40))?;
    api.tenant_with_destination(&base, TENANT, &receiver.url())
        .await?;

    let measured = closed_loop(
        api.clone(),
        base.clone(),
        TENANT,
        "overload-measure",
        32,
        Instant::now() + measure,
    )
    .await?;
    let capacity = measured.accepted_per_second();
    let drained = receiver.wait_for(measured.accepted.keys(), SETTLE).await;
    anyhow::ensure!(
        drained.is_empty() && capacity > 0.0,
        "measuring the capacity: {capacity:.0}/s, {} undelivered",
        drained.len()
    );
    let rate = 2.0 * capacity;
    report.note(
        "capacity",
        format!(
            "{capacity:.0} publishes/s accepted and delivered with 32 closed-loop publishers over {}; offering {rate:.0}/s",
            secs(measure)
        ),
    );

    let started = Instant::now();
    let load = open_loop(
        api.clone(),
        base.clone(),
        TENANT,
        "overload",
        rate,
        span,
        OPEN,
    )
    .await?;
    let offered = (rate * span.as_secs_f64()) as usize;
    let sent = offered - load.not_started;
    report.note(
        "offered",
        format!(
            "{offered} events over {} ({sent} sent, {:.0}/s; {} not started because {OPEN} were in flight)",
            secs(span),
            sent as f64 / started.elapsed().as_secs_f64().max(1.0),
            load.not_started
        ),
    );
    let page = api.metrics(&base).await?;
    report.note(
        "answers",
        format!(
            "{} accepted ({:.0}/s), {} refused with 503 ({} without Retry-After; the service counted {}), other: {}",
            load.accepted.len(),
            load.accepted_per_second(),
            load.refused,
            load.refused_without_retry_after,
            metric(&page, "sheaf_publishes_refused_total").unwrap_or(0.0),
            load.other_text()
        ),
    );
    let third = span / 3;
    let first = load.latency_quantile_between(0.99, None, Some(started + third));
    let last = load.latency_quantile_between(0.99, Some(started + 2 * third), None);
    report.note(
        "accepted publishes' latency",
        format!(
            "p50 {} ms, p99 {} ms, max {} ms; p99 {} ms in the first third of the run, {} ms in the last",
            load.latency_quantile(0.5).as_millis(),
            load.latency_quantile(0.99).as_millis(),
            load.latency_quantile(1.0).as_millis(),
            first.as_millis(),
            last.as_millis()
        ),
    );
    report.check(
        load.refused_without_retry_after == 0,
        format!(
            "{} refusals without Retry-After",
            load.refused_without_retry_after
        ),
    );
    report.check(
        load.other_total() == 0,
        format!("answers other than 202 and 503: {}", load.other_text()),
    );
    report.check(
        last <= (2 * first).max(P99_FLOOR),
        format!(
            "accepted publishes' p99 grew from {} ms in the first third to {} ms in the last: a queue builds up in front of the door",
            first.as_millis(),
            last.as_millis()
        ),
    );
    report.check(
        load.refused > 0,
        "nothing was refused at twice the capacity: no bound was reached",
    );

    let missing = receiver.wait_for(load.accepted.keys(), SETTLE).await;
    report.note(
        "delivered",
        format!(
            "every accepted event {} after the load began",
            if missing.is_empty() {
                secs(started.elapsed())
            } else {
                "never".to_owned()
            }
        ),
    );
    let mut accepted = measured.accepted;
    accepted.extend(load.accepted);
    report.deliveries(
        &accepted,
        &receiver.first_successes(),
        receiver.duplicates(),
    );

    let hwm = sheaf.peak_rss_kib().map_or(0.0, |kib| kib as f64 / 1024.0);
    report.note(
        "sheaf peak RSS",
        format!(
            "{hwm:.0} MiB (VmHWM); the configured bounds and the load's {OPEN} connections allow {rss_limit:.0} MiB"
        ),
    );
    report.check(
        hwm < rss_limit,
        format!("peak RSS {hwm:.0} MiB is above the {rss_limit:.0} MiB the bounds allow"),
    );
    report.check(sheaf.running(), "sheaf exited");
    stop_clean(&mut report, sheaf).await?;
    Ok(report)
}
