//! `kill`: two `sheaf` processes share Postgres (queue) and ClickHouse (log); one is SIGKILLed
//! mid-burst. Its claimed jobs must come back to the other when their 4 s lease ends, and
//! nothing accepted may be lost.
//!
//! The receiver answers after 200 ms, so each process (16 workers) delivers about 80 events a
//! second and the burst keeps both saturated: at the kill the victim holds claims in its
//! workers and in its channel. Those claims are identified in the queue table itself: the
//! jobs leased at the kill that still carry the same lease 1.5 s later (the survivor finishes
//! its own claims within a few hundred milliseconds, and nobody can take a running lease).

use std::time::{Duration, Instant};

use sheaf_testenv::receiver::Receiver;

use crate::api::{Api, Pace, Targets, publish_paced};
use crate::env::{Ctx, QUEUE_LEASE};
use crate::report::{Report, secs};
use crate::sheaf;

use super::{
    TENANT, after_the_kill, claimed_jobs, event_ids, settle, stranded_recovery, wait_until,
};

pub async fn run(ctx: &Ctx) -> anyhow::Result<Report> {
    let mut report = Report::new("kill");
    let (events, rate) = if ctx.quick {
        (400, 100.0)
    } else {
        (3_000, 150.0)
    };
    let schema = ctx.unique("kill");
    let settings = ctx.sheaf_settings(&schema, &schema);
    let receiver = Receiver::builder()
        .delay(Duration::from_millis(200))
        .start()
        .await?;
    // Both start at once, each migrating the same schema and database.
    let (a, b) = tokio::join!(
        sheaf::spawn(ctx, "kill", "a", &settings),
        sheaf::spawn(ctx, "kill", "b", &settings)
    );
    let (a, b) = (a?, b?);
    let api = Api::new(Duration::from_secs(10))?;
    api.tenant_with_destination(&a.base(), TENANT, &receiver.url())
        .await?;
    let targets = Targets::new(&[a.base(), b.base()]);
    let load = publish_paced(
        api.clone(),
        targets.clone(),
        TENANT.to_owned(),
        "kill",
        event_ids("kill", events),
        Pace {
            rate,
            concurrency: 32,
            give_up_after: Duration::from_secs(180),
        },
    );

    // Mid-burst: once a quarter of the events arrived.
    wait_until(Duration::from_secs(120), || {
        receiver.delivered_ids().len() >= events / 4
    })
    .await;
    targets.remove(&a.base());
    let leased_at_kill = claimed_jobs(ctx, &schema).await?;
    let victim = a.pid();
    let killed_at = Instant::now();
    a.kill()?;
    report.note(
        "killed",
        format!(
            "sheaf a (pid {victim}) with SIGKILL after {} deliveries; jobs leased by both processes at that moment: {}",
            receiver.delivered_ids().len(),
            leased_at_kill.len()
        ),
    );
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let still = claimed_jobs(ctx, &schema).await?;
    let stranded: Vec<String> = leased_at_kill
        .iter()
        .filter(|job| still.contains(job))
        .map(|job| job.event_id.clone())
        .collect();
    report.note(
        "claims stranded by the killed process",
        format!(
            "{} (jobs still on the lease they had at the kill, 1.5 s later; lease {})",
            stranded.len(),
            secs(QUEUE_LEASE)
        ),
    );

    let published = load.await?;
    settle(ctx, &mut report, &schema, &receiver, &published).await?;
    let (came_back, text) = stranded_recovery(&stranded, &receiver, killed_at, "sheaf a");
    report.note("stranded claims delivered by sheaf b", text);
    report.check(
        came_back == stranded.len(),
        format!(
            "only {came_back} of the {} stranded claims were delivered after the kill",
            stranded.len()
        ),
    );
    after_the_kill(
        ctx,
        report,
        (&api, b, &schema),
        (killed_at, &published, &receiver),
        &[
            "sheaf_jobs_claimed_total",
            "sheaf_leases_lost_total",
            "sheaf_lease_renewals_total",
            "sheaf_deliveries_total{outcome=\"success\"}",
        ],
    )
    .await
}
