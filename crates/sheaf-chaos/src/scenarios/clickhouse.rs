//! `clickhouse`: the log store (ClickHouse) is stopped for 30 s (5 s with `--quick`) while
//! events are published and deliveries fail and retry.
//!
//! The receiver answers 503 from the start until half-way through the outage, so there are
//! failed attempts logged before the outage whose retries come due while it lasts: their
//! latest-attempt lookup fails, and they must wait (`not_ready`, not an attempt) rather than
//! fail for good. Publishes and first deliveries do not need ClickHouse: a publish is durable in
//! the Postgres outbox, and an attempt commits there with its job's outcome. So the scenario
//! requires that no publish is refused, that the outbox drains by itself once ClickHouse is back,
//! that every accepted event is in the log, and that every request the receiver answered is an
//! attempt in the log (none dropped). The process's memory must stay bounded: its RSS is sampled
//! before, during and after the outage.
//!
//! What bounds it: the outbox is on disk; a shipment holds at most
//! `SHEAF_LOG_WRITE_MAX_RECORDS` records and is dropped (its rows go back) when the write fails;
//! a publish holds its request until its commit; a worker holds one job; the completer holds at
//! most one flush while a settlement is retried; the fresh-event cache holds at most
//! `SHEAF_FRESH_EVENT_CACHE` events. Nothing queues per failed write.

use std::time::{Duration, Instant};

use sheaf_testenv::receiver::Receiver;

use crate::api::{
    Api, PROBE_TIMEOUT, Pace, ReadyzProbe, RssSampler, Targets, metric, peak_mib, publish_paced,
    readiness,
};
use crate::env::Ctx;
use crate::report::{Report, at, recovery_after, secs};
use crate::sheaf;

use super::{
    TENANT, check_events_logged, cleanup, event_ids, events_with_logged_success, settle, stop_clean,
};

/// A sanity bound on the process's peak RSS: far above what it needs (tens of MiB), far below
/// what an unbounded queue of ~1 KB events would reach over a long outage.
const RSS_LIMIT_MIB: f64 = 1024.0;

pub async fn run(ctx: &Ctx) -> anyhow::Result<Report> {
    let mut report = Report::new("clickhouse");
    // (events, per second, load before the fault, outage, load after)
    let (events, rate, before, outage) = if ctx.quick {
        (500, 40.0, Duration::from_secs(4), Duration::from_secs(5))
    } else {
        (2_000, 40.0, Duration::from_secs(8), Duration::from_secs(30))
    };
    let schema = ctx.unique("clickhouse");
    let settings = ctx.sheaf_settings(&schema, &schema);
    let receiver = Receiver::builder()
        .delay(Duration::from_millis(20))
        .start()
        .await?;
    let mut a = sheaf::spawn(ctx, "clickhouse", "a", &settings).await?;
    let api = Api::new(Duration::from_secs(10))?;
    api.tenant_with_destination(&a.base(), TENANT, &receiver.url())
        .await?;
    let probe = ReadyzProbe::start(Api::new(PROBE_TIMEOUT)?, a.base());
    let rss = RssSampler::start(a.pid());
    receiver.set_failing(true);
    let t0 = Instant::now();
    let load = publish_paced(
        api.clone(),
        Targets::new(&[a.base()]),
        TENANT.to_owned(),
        "clickhouse",
        event_ids("clickhouse", events),
        Pace {
            rate,
            concurrency: 16,
            give_up_after: Duration::from_secs(240),
        },
    );

    tokio::time::sleep(before).await;
    let before_page = api.metrics(&a.base()).await?;
    let fault_start = Instant::now();
    let mut stopped = ctx.ctl(&["clickhouse", "stop"]).await;
    let stopped_at = Instant::now();
    if stopped.is_ok() {
        tokio::time::sleep(outage / 2).await;
        receiver.set_failing(false);
        let receiver_ok_at = Instant::now();
        report.note("receiver answers 200 from", at(t0, receiver_ok_at));
        tokio::time::sleep(outage.saturating_sub(stopped_at.elapsed())).await;
    }
    receiver.set_failing(false);
    // Start it whatever happened: later scenarios need it.
    let restart_began = Instant::now();
    let (started, back) = tokio::join!(
        ctx.ctl(&["clickhouse", "start"]),
        ctx.clickhouse_answers(Duration::from_secs(180))
    );
    stopped = stopped.and(started);
    let fault_end = back.unwrap_or_else(Instant::now);
    stopped?;
    report.note(
        "clickhouse down",
        format!(
            "from {} to {} ({}, of which {} starting again)",
            at(t0, fault_start),
            at(t0, fault_end),
            secs(fault_end - fault_start),
            secs(fault_end - restart_began)
        ),
    );
    let during_page = api.metrics(&a.base()).await?;

    let published = load.await?;
    settle(ctx, &mut report, &schema, &receiver, &published).await?;
    let end_page = api.metrics(&a.base()).await?;
    let samples = probe.finish().await;
    // Publishing and delivering need no ClickHouse, so the process stays ready through it.
    let seen = readiness(&samples, fault_start);
    let ready_throughout = seen.unready_at.is_none();
    report.note(
        "/readyz",
        if ready_throughout {
            format!("200 throughout the outage ({} probes)", samples.len())
        } else {
            format!("not 200 during the outage: {}", seen.answers_text())
        },
    );
    report.check(
        ready_throughout,
        "/readyz stopped answering 200 while only clickhouse was down",
    );
    report.check(a.running(), "sheaf exited during the outage");

    // Retries that could not look up their attempt waited instead of failing.
    let count = |page: &str, name: &str| metric(page, name).unwrap_or(0.0);
    let not_ready = "sheaf_deliveries_total{outcome=\"not_ready\"}";
    let waited = count(&during_page, not_ready) - count(&before_page, not_ready);
    let lookup_failures = count(&end_page, "sheaf_retry_lookup_failed_queries_total")
        - count(&before_page, "sheaf_retry_lookup_failed_queries_total");
    report.note(
        "retries that could not look up their previous attempt",
        format!(
            "{waited} waits (`not_ready`, not counted as attempts) during the outage; {lookup_failures} failed lookup queries"
        ),
    );
    report.check(
        waited > 0.0,
        "no retry waited during the outage (the scenario did not exercise the lookup path)",
    );
    report.note(
        "log writes",
        format!(
            "{} failed (of {} issued); {} shipments failed and were tried again; {} events and {} attempts shipped",
            count(&end_page, "sheaf_log_write_failures_total"),
            count(&end_page, "sheaf_log_writes_total"),
            count(&end_page, "sheaf_shipment_failures_total"),
            count(&end_page, "sheaf_events_shipped_total"),
            count(&end_page, "sheaf_attempts_shipped_total"),
        ),
    );
    report.note(
        "outbox during the outage",
        format!(
            "{} events and {} attempts waiting, the oldest {} s old",
            count(&during_page, "sheaf_outbox_events"),
            count(&during_page, "sheaf_outbox_attempts"),
            count(&during_page, "sheaf_outbox_oldest_seconds"),
        ),
    );
    report.note(
        "retries made",
        format!(
            "{} scheduled retries, {} dead-lettered",
            count(&end_page, "sheaf_retries_total"),
            count(
                &end_page,
                "sheaf_deliveries_total{outcome=\"dead_lettered\"}"
            )
        ),
    );
    let resumed = receiver
        .deliveries()
        .iter()
        .filter(|d| d.status == 200)
        .map(|d| d.answered)
        .min();
    if let Some(resumed) = resumed {
        report.note(
            "first successful delivery",
            format!(
                "at {} (clickhouse was back at {}; the receiver answered 200 from half-way through the outage, and first deliveries need no clickhouse)",
                at(t0, resumed),
                at(t0, fault_end)
            ),
        );
    }
    report.recovery = recovery_after(fault_end, &published.accepted, &receiver.first_successes());
    report.note(
        "recovery",
        "from clickhouse back until every event accepted before was delivered",
    );
    report.note(
        "publishes refused during the outage (retried)",
        format!(
            "{} ({})",
            published.refused_total(),
            published.refused_text()
        ),
    );
    report.check(
        published.refused_total() == 0,
        format!(
            "{} publishes were refused while clickhouse was down; the outbox should have taken them",
            published.refused_total()
        ),
    );

    // Memory: bounded through the outage.
    let rss_samples = rss.finish().await;
    let end = Instant::now();
    let before_mib = peak_mib(&rss_samples, t0, fault_start);
    let during_mib = peak_mib(&rss_samples, fault_start, fault_end);
    let after_mib = peak_mib(&rss_samples, fault_end, end);
    let hwm = a.peak_rss_kib().map_or(0.0, |kib| kib as f64 / 1024.0);
    report.note(
        "sheaf peak RSS",
        format!(
            "{hwm:.0} MiB over its life (VmHWM); sampled peaks {before_mib:.0} MiB before, {during_mib:.0} MiB during, {after_mib:.0} MiB after the outage"
        ),
    );
    report.check(
        hwm < RSS_LIMIT_MIB,
        format!("sheaf's peak RSS {hwm:.0} MiB is above {RSS_LIMIT_MIB:.0} MiB"),
    );

    check_events_logged(&mut report, &api, &a, &published).await?;
    // Every request the receiver answered is an attempt, and every one must be in the log.
    let requests = receiver.deliveries().len();
    let attempts_logged = api
        .list_all(&a.base(), &format!("/api/v1/tenants/{TENANT}/attempts"))
        .await?
        .len();
    report.note(
        "attempts in the log store",
        format!("{attempts_logged} of the {requests} requests the receiver answered"),
    );
    report.check(
        attempts_logged >= requests,
        format!(
            "{} attempts are missing from the log store",
            requests.saturating_sub(attempts_logged)
        ),
    );
    let logged = events_with_logged_success(&api, &a).await?;
    let unlogged = published
        .accepted
        .keys()
        .filter(|id| !logged.contains(*id))
        .count();
    report.note(
        "delivered events whose successful attempt is not in the log",
        format!("{unlogged} of {}", published.accepted.len()),
    );
    report.check(
        unlogged == 0,
        format!("{unlogged} delivered events have no successful attempt in the log"),
    );
    stop_clean(&mut report, a).await?;
    cleanup(ctx, &mut report, &schema).await?;
    Ok(report)
}
