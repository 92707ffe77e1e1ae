//! `shutdown`: SIGTERM under load, as a deploy does. The receiver answers after 500 ms and the
//! load outruns the process (16 workers, ~32 deliveries a second), so at the signal it has
//! deliveries in flight and claims waiting in its channel.
//!
//! After it exits: it exited cleanly and in time; every delivery in flight at the signal was
//! answered and recorded as done (no job is left for an event the receiver got); and no job in
//! the queue table still carries a lease (`claimed_until` in the future): unstarted claims were
//! released, not stranded for the lease (30 s here, the default). Then a new process delivers
//! the rest, with no duplicate.

use std::time::{Duration, Instant};

use sheaf_testenv::receiver::Receiver;

use crate::api::{Api, Pace, Targets, publish_paced};
use crate::env::Ctx;
use crate::report::{Report, at, recovery_after, secs};
use crate::sheaf;

use super::{TENANT, claimed_jobs, cleanup, event_ids, settle, stop_clean, wait_until};

pub async fn run(ctx: &Ctx) -> anyhow::Result<Report> {
    let mut report = Report::new("shutdown");
    let (events, rate) = if ctx.quick {
        (300, 100.0)
    } else {
        (1_500, 100.0)
    };
    let schema = ctx.unique("shutdown");
    let mut settings = ctx.sheaf_settings(&schema, &schema);
    // The defaults: a stranded claim would hold its job for 30 s, which the checks would see.
    settings.retain(|(k, _)| k != "SHEAF_QUEUE_LEASE" && k != "SHEAF_DELIVERY_TIMEOUT");
    let receiver = Receiver::builder()
        .delay(Duration::from_millis(500))
        .start()
        .await?;
    let a = sheaf::spawn(ctx, "shutdown", "a", &settings).await?;
    let api = Api::new(Duration::from_secs(10))?;
    api.tenant_with_destination(&a.base(), TENANT, &receiver.url())
        .await?;
    let targets = Targets::new(&[a.base()]);
    let t0 = Instant::now();
    let load = publish_paced(
        api.clone(),
        targets.clone(),
        TENANT.to_owned(),
        "shutdown",
        event_ids("shutdown", events),
        Pace {
            rate,
            concurrency: 16,
            give_up_after: Duration::from_secs(180),
        },
    );

    wait_until(Duration::from_secs(120), || {
        receiver.delivered_ids().len() >= events / 5
    })
    .await;
    // The signal lands while the receiver holds requests open: deliveries in flight.
    wait_until(Duration::from_secs(30), || receiver.open_requests() >= 8).await;
    targets.remove(&a.base());
    let leased = claimed_jobs(ctx, &schema).await?.len();
    let term_at = Instant::now();
    a.terminate()?;
    let exited = a.wait_exit(Duration::from_secs(60)).await?;
    let status = exited.status;
    let exited_at = Instant::now();
    // Read the queue at once: a stranded lease would still be running for 30 s.
    let leased_after = claimed_jobs(ctx, &schema).await?;
    report.note(
        "SIGTERM",
        format!(
            "at {} with {} jobs leased; exited {} later with {status}",
            at(t0, term_at),
            leased,
            secs(exited_at - term_at)
        ),
    );
    report.check(
        status.success(),
        format!("sheaf exited with {status} after SIGTERM"),
    );
    report.check(
        leased_after.is_empty(),
        format!(
            "{} jobs still leased after the process exited (stranded until their lease ends)",
            leased_after.len()
        ),
    );

    // The deliveries in flight at the signal: answered, and recorded as done.
    let deliveries = receiver.deliveries();
    let in_flight: Vec<_> = deliveries
        .iter()
        .filter(|d| d.arrived < term_at && d.answered >= term_at)
        .collect();
    let delivered_before_exit: Vec<String> = deliveries
        .iter()
        .filter(|d| d.status == 200 && d.answered <= exited_at)
        .map(|d| d.id.clone())
        .collect();
    let jobs_left_for_delivered: i64 = sqlx::query_scalar(&format!(
        "SELECT count(*) FROM {schema}.jobs WHERE event_id = ANY($1)"
    ))
    .bind(&delivered_before_exit)
    .fetch_one(&ctx.pg)
    .await?;
    report.note(
        "deliveries in flight at SIGTERM",
        format!(
            "{} (all answered before the exit: {}); jobs left in the queue for events delivered before the exit: {jobs_left_for_delivered}",
            in_flight.len(),
            in_flight.iter().all(|d| d.answered <= exited_at)
        ),
    );
    report.check(
        jobs_left_for_delivered == 0,
        format!(
            "{jobs_left_for_delivered} events delivered before the exit still have a job: they will be delivered again"
        ),
    );
    let last_line = exited
        .log
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .to_owned();
    report.check(
        last_line.contains("stopped"),
        format!("the log does not end with `stopped` but with {last_line:?}"),
    );

    // A new process delivers the rest.
    let b = sheaf::spawn(ctx, "shutdown", "b", &settings).await?;
    targets.add(b.base());
    let back_at = b.listening_at;
    report.note(
        "no process listening",
        format!("for {}, until sheaf b started", secs(back_at - exited_at)),
    );
    let published = load.await?;
    settle(ctx, &mut report, &schema, &receiver, &published).await?;
    report.check(
        report.duplicates == 0,
        format!(
            "{} duplicate deliveries: a graceful stop must finish or release what it holds",
            report.duplicates
        ),
    );
    let resumed = receiver
        .deliveries()
        .iter()
        .filter(|d| d.status == 200 && d.arrived >= back_at)
        .map(|d| d.arrived)
        .min();
    if let Some(resumed) = resumed {
        report.note(
            "sheaf b's first delivery",
            format!(
                "reached the receiver {} after it listened",
                secs(resumed - back_at)
            ),
        );
    }
    report.recovery = recovery_after(back_at, &published.accepted, &receiver.first_successes());
    report.note(
        "recovery",
        "from sheaf b listening until every event accepted before was delivered (the backlog drains at the receiver's pace: 16 workers × 500 ms)",
    );
    report.note(
        "publishes refused while no process listened (retried)",
        published.refused_text(),
    );
    stop_clean(&mut report, b).await?;
    cleanup(ctx, &mut report, &schema).await?;
    Ok(report)
}
