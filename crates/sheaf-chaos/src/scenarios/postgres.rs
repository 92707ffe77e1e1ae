//! `postgres`: Postgres (queue, tenants, destinations) is stopped (`pg_ctlcluster … stop -m
//! fast`, as a restart does) and started again after a few seconds while events are published
//! and delivered. The same `sheaf` process must carry on by itself, `/readyz` must show the
//! outage while it lasts, and nothing accepted may be lost.
//!
//! Publishes during the outage wait for a pool connection (up to its 5 s acquire timeout) and
//! are then refused (503: the event may be in the log, but its jobs cannot be enqueued); the
//! publisher retries them with the same id, and the repeat path enqueues what is missing once
//! Postgres is back.

use std::time::{Duration, Instant};

use sheaf_testenv::receiver::Receiver;

use crate::api::{Api, PROBE_TIMEOUT, Pace, ReadyzProbe, Targets, publish_paced, readiness};
use crate::env::Ctx;
use crate::report::{Report, at, recovery_after, secs};
use crate::sheaf;

use super::{
    TENANT, check_events_logged, cleanup, counters, event_ids, log_lines, settle, stop_clean,
};

pub async fn run(ctx: &Ctx) -> anyhow::Result<Report> {
    let mut report = Report::new("postgres");
    // (events, per second, load before the fault, outage)
    let (events, rate, before, outage) = if ctx.quick {
        (500, 50.0, Duration::from_secs(3), Duration::from_secs(3))
    } else {
        (
            2_000,
            50.0,
            Duration::from_secs(10),
            Duration::from_secs(15),
        )
    };
    let schema = ctx.unique("postgres");
    let settings = ctx.sheaf_settings(&schema, &schema);
    let receiver = Receiver::builder()
        .delay(Duration::from_millis(20))
        .start()
        .await?;
    let mut a = sheaf::spawn(ctx, "postgres", "a", &settings).await?;
    let api = Api::new(Duration::from_secs(10))?;
    api.tenant_with_destination(&a.base(), TENANT, &receiver.url())
        .await?;
    let probe = ReadyzProbe::start(Api::new(PROBE_TIMEOUT)?, a.base());
    let t0 = Instant::now();
    let load = publish_paced(
        api.clone(),
        Targets::new(&[a.base()]),
        TENANT.to_owned(),
        "postgres",
        event_ids("postgres", events),
        Pace {
            rate,
            concurrency: 16,
            give_up_after: Duration::from_secs(180),
        },
    );

    tokio::time::sleep(before).await;
    let fault_start = Instant::now();
    let mut restarted = ctx.ctl(&["postgres", "stop"]).await;
    if restarted.is_ok() {
        tokio::time::sleep(outage).await;
    }
    // Start it whatever happened: later scenarios need it. The outage ends when it accepts
    // connections again, which is before `pg_ctlcluster start` returns.
    let (started, back) = tokio::join!(
        ctx.ctl(&["postgres", "start"]),
        ctx.postgres_accepts(Duration::from_secs(120))
    );
    restarted = restarted.and(started);
    let fault_end = back.unwrap_or_else(Instant::now);
    restarted?;
    report.note(
        "postgres down",
        format!(
            "from {} to {} ({}; stopped with -m fast, started again)",
            at(t0, fault_start),
            at(t0, fault_end),
            secs(fault_end - fault_start)
        ),
    );

    let published = load.await?;
    settle(ctx, &mut report, &schema, &receiver, &published).await?;
    let samples = probe.finish().await;
    let seen = readiness(&samples, fault_start);
    seen.record(&mut report, t0, fault_end, "postgres accepted connections");
    report.check(
        a.running(),
        "sheaf exited during the outage instead of reconnecting",
    );
    if let Some((last, next)) = receiver.longest_pause(t0) {
        report.note(
            "longest pause in deliveries",
            format!(
                "{} (from {} to {}, postgres back at {})",
                secs(next - last),
                at(t0, last),
                at(t0, next),
                at(t0, fault_end)
            ),
        );
    }
    report.recovery = recovery_after(fault_end, &published.accepted, &receiver.first_successes());
    report.note(
        "recovery",
        "from postgres back until every event accepted before was delivered",
    );
    report.note(
        "publishes refused during the outage (retried)",
        format!(
            "{} ({}), {} accepted later as repeats of a refused try",
            published.refused_total(),
            published.refused_text(),
            published.repeats
        ),
    );
    report.note(
        "sheaf log during the outage",
        format!(
            "{} `claim failed` warnings, {} `settling attempts and outcomes failed; trying again` (completer), {} `jobs failed; they come back when their leases end`, {} slow pool acquires",
            log_lines(&a, "claim failed"),
            log_lines(&a, "settling attempts and outcomes failed; trying again"),
            log_lines(&a, "they come back when their leases end"),
            log_lines(&a, "slow_acquire_threshold")
        ),
    );
    report.note(
        "sheaf counters",
        counters(
            &api,
            &a,
            &[
                "sheaf_deliveries_total{outcome=\"success\"}",
                "sheaf_deliveries_total{outcome=\"not_ready\"}",
                "sheaf_leases_lost_total",
                "sheaf_publish_repeats_total",
            ],
        )
        .await,
    );
    check_events_logged(&mut report, &api, &a, &published).await?;
    stop_clean(&mut report, a).await?;
    cleanup(ctx, &mut report, &schema).await?;
    Ok(report)
}
