//! `outage`: the receiver answers 503 for 30 s (8 s with `--quick`) under 32 closed-loop
//! publishers with unique ids, then 200 again; first on the in-memory stores (memory queue and
//! log), then on Postgres + ClickHouse.
//!
//! What must hold: every event that got a `202` is delivered (none dropped by the memory log's
//! retention, however long the backlog); a publish during the outage is either accepted or
//! refused with `503` and `Retry-After` (the memory configuration's pending-work bound, set
//! here below what the outage accumulates, so the refusal path runs, and the log's retention
//! far below it, so retention runs all through the outage); the process's memory
//! stays under what the configured bounds allow (printed); and once the backlog has drained, no
//! delivery counter moves while nothing happens (no job spins through claim and put-back).

use std::time::{Duration, Instant};

use sheaf_testenv::receiver::Receiver;

use crate::api::{Api, RssSampler, metric, peak_mib};
use crate::env::Ctx;
use crate::load::{Load, closed_loop};
use crate::report::{Report, at, recovery_after, secs};
use crate::sheaf;

use super::{SETTLE, TENANT, cleanup, drained, stop_clean};

/// Closed-loop publishers, as in the issue this scenario answers.
const PUBLISHERS: usize = 32;

/// An upper bound on what one held or retained 1 KB event costs the process (payload, log
/// record and indexes, job row, allocator slack): twice the measured ~1.7 KB.
const BYTES_PER_EVENT: f64 = 4096.0;

/// The memory log's retention of events nobody waits for, set far below what the outage
/// accumulates (the default is 25,000), so that retention runs all through it: with a debug
/// build's few hundred publishes a second, the default would not be reached in 30 s, and the
/// scenario would not show that retention leaves alone what is still owed a delivery.
const RETAINED_EVENTS: usize = 500;

/// The process before any event: a debug build with its caches and pools empty.
const BASE_MIB: f64 = 200.0;

/// How long the counters are watched for movement once everything is delivered.
const QUIET: Duration = Duration::from_secs(5);

pub async fn run(ctx: &Ctx) -> anyhow::Result<Report> {
    let mut report = Report::new("outage");
    // The pending-work bound below what the outage accumulates, so the refusals run too.
    let (outage, bound) = if ctx.quick {
        (Duration::from_secs(8), 1_000)
    } else {
        (Duration::from_secs(30), 5_000)
    };
    let mut accepted = std::collections::HashMap::new();
    let mut first_successes = std::collections::HashMap::new();
    let mut duplicates = 0;

    let mut memory = ctx.memory_settings();
    memory.extend([
        (
            "SHEAF_MEMORY_MAX_PENDING_EVENTS".to_owned(),
            bound.to_string(),
        ),
        (
            "SHEAF_MEMORY_LOG_MAX_EVENTS".to_owned(),
            RETAINED_EVENTS.to_string(),
        ),
    ]);
    let rss_limit = BASE_MIB + (bound + RETAINED_EVENTS) as f64 * BYTES_PER_EVENT / 1048576.0;
    let (load, receiver) = Box::pin(outage_on(
        ctx,
        &mut report,
        "memory",
        "outage-memory",
        &memory,
        None,
        outage,
        Some(rss_limit),
    ))
    .await?;
    accepted.extend(load.accepted);
    first_successes.extend(receiver.first_successes());
    duplicates += receiver.duplicates();

    let schema = ctx.unique("outage");
    let shared = ctx.sheaf_settings(&schema, &schema);
    let (load, receiver) = Box::pin(outage_on(
        ctx,
        &mut report,
        "postgres + clickhouse",
        "outage-pg",
        &shared,
        Some(&schema),
        outage,
        None,
    ))
    .await?;
    accepted.extend(load.accepted);
    first_successes.extend(receiver.first_successes());
    duplicates += receiver.duplicates();
    report.deliveries(&accepted, &first_successes, duplicates);
    cleanup(ctx, &mut report, &schema).await?;
    Ok(report)
}

/// One configuration's outage; returns the load and the receiver for the totals.
#[allow(clippy::too_many_arguments)]
async fn outage_on(
    ctx: &Ctx,
    report: &mut Report,
    label: &str,
    prefix: &'static str,
    settings: &[(String, String)],
    schema: Option<&str>,
    outage: Duration,
    rss_limit_mib: Option<f64>,
) -> anyhow::Result<(Load, Receiver)> {
    let receiver = Receiver::builder().start().await?;
    let mut sheaf = sheaf::spawn(ctx, "outage", prefix, settings).await?;
    let api = Api::new(Duration::from_secs(10))?;
    api.tenant_with_destination(&sheaf.base(), TENANT, &receiver.url())
        .await?;
    let rss = RssSampler::start(sheaf.pid());
    receiver.set_failing(true);
    let t0 = Instant::now();
    // The publishers go on a little past the outage, into the recovery.
    let until = t0 + outage + Duration::from_secs(2);
    let load = closed_loop(api.clone(), sheaf.base(), TENANT, prefix, PUBLISHERS, until);
    tokio::time::sleep(outage).await;
    let during = api.metrics(&sheaf.base()).await?;
    receiver.set_failing(false);
    let fault_end = Instant::now();
    let load = load.await?;
    let missing = receiver.wait_for(load.accepted.keys(), SETTLE).await;
    let settled = Instant::now();
    let count = |page: &str, name: &str| metric(page, name).unwrap_or(0.0);

    report.note(
        &format!("{label}: publishes"),
        format!(
            "{} accepted ({:.0}/s), {} refused with 503 ({} without Retry-After), other answers: {}; accepted p50 {} ms, p99 {} ms",
            load.accepted.len(),
            load.accepted_per_second(),
            load.refused,
            load.refused_without_retry_after,
            load.other_text(),
            load.latency_quantile(0.5).as_millis(),
            load.latency_quantile(0.99).as_millis(),
        ),
    );
    report.note(
        &format!("{label}: at the end of the outage"),
        format!(
            "{} events pending (bound {}), {} publishes refused so far",
            count(&during, "sheaf_pending_events"),
            count(&during, "sheaf_pending_events_limit"),
            count(&during, "sheaf_publishes_refused_total"),
        ),
    );
    report.check(
        missing.is_empty(),
        format!(
            "{label}: {} accepted events were never delivered",
            missing.len()
        ),
    );
    report.check(
        load.refused_without_retry_after == 0,
        format!(
            "{label}: {} refusals came without Retry-After",
            load.refused_without_retry_after
        ),
    );
    report.check(
        load.other_total() == 0,
        format!(
            "{label}: publishes got answers other than 202 and 503: {}",
            load.other_text()
        ),
    );
    let recovery = recovery_after(fault_end, &load.accepted, &receiver.first_successes());
    report.note(
        &format!("{label}: receiver back"),
        format!(
            "at {}; every event accepted before then delivered {} later; all delivered at {}",
            at(t0, fault_end),
            recovery.map_or_else(|| "never".to_owned(), secs),
            at(t0, settled)
        ),
    );
    if report
        .recovery
        .is_none_or(|r| recovery.is_some_and(|new| new > r))
    {
        report.recovery = recovery;
    }

    if let Some(schema) = schema {
        drained(ctx, report, schema).await?;
    }
    // Nothing left to do: no delivery counter may move.
    let quiet_from = api.metrics(&sheaf.base()).await?;
    tokio::time::sleep(QUIET).await;
    let quiet_to = api.metrics(&sheaf.base()).await?;
    let outcomes = [
        "success",
        "failed",
        "dead_lettered",
        "superseded",
        "not_ready",
        "dropped",
        "event_missing",
        "paced",
    ];
    let moved: Vec<String> = outcomes
        .iter()
        .filter_map(|o| {
            let name = format!("sheaf_deliveries_total{{outcome=\"{o}\"}}");
            let delta = count(&quiet_to, &name) - count(&quiet_from, &name);
            (delta != 0.0).then(|| format!("{o} +{delta}"))
        })
        .collect();
    report.check(
        moved.is_empty(),
        format!(
            "{label}: delivery counters moved while there was nothing to deliver: {}",
            moved.join(", ")
        ),
    );
    let missing_events = count(
        &quiet_to,
        "sheaf_deliveries_total{outcome=\"event_missing\"}",
    );
    report.note(
        &format!("{label}: delivery outcomes"),
        outcomes
            .iter()
            .map(|o| {
                let name = format!("sheaf_deliveries_total{{outcome=\"{o}\"}}");
                format!("{o} {}", count(&quiet_to, &name))
            })
            .collect::<Vec<_>>()
            .join(", "),
    );
    report.check(
        missing_events == 0.0,
        format!("{label}: {missing_events} deliveries found their event gone from the log"),
    );

    let samples = rss.finish().await;
    let hwm = sheaf.peak_rss_kib().map_or(0.0, |kib| kib as f64 / 1024.0);
    let during_mib = peak_mib(&samples, t0, fault_end);
    match rss_limit_mib {
        Some(limit) => {
            report.note(
                &format!("{label}: sheaf peak RSS"),
                format!(
                    "{hwm:.0} MiB over its life (sampled peak {during_mib:.0} MiB during the outage); the configured bounds allow {limit:.0} MiB"
                ),
            );
            report.check(
                hwm < limit,
                format!(
                    "{label}: peak RSS {hwm:.0} MiB is above the {limit:.0} MiB the bounds allow"
                ),
            );
        }
        None => report.note(
            &format!("{label}: sheaf peak RSS"),
            format!("{hwm:.0} MiB (sampled peak {during_mib:.0} MiB during the outage)"),
        ),
    }
    report.check(sheaf.running(), format!("{label}: sheaf exited"));
    stop_clean(report, sheaf).await?;
    Ok((load, receiver))
}
