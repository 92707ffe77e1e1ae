//! `sheaf-process`: three `sheaf` processes share the JetStream queue (the bucket kept on the 3
//! nodes of the fault suite's NATS cluster, started for this scenario alone) and the ClickHouse
//! log; one is SIGKILLed mid-burst. Its leased jobs must come back to the two others when their
//! lease (4 s) runs out, not before and not long after, and nothing accepted may be lost.
//!
//! The receiver answers after 200 ms, so each process (16 workers) holds claims at any moment
//! of the burst. The killed process's claims are read from the bucket itself: the jobs under a
//! lease at the kill whose key was not written again 1.5 s later (the survivors settle their
//! own claims within a few hundred milliseconds, and nobody can take a running lease). A claim
//! it had delivered but not yet settled is delivered again by a survivor: the duplicates
//! at-least-once allows, counted and reported.

use std::time::{Duration, Instant};

use sheaf_testenv::receiver::Receiver;

use crate::api::{Api, Pace, Targets, metric, publish_paced};
use crate::env::{Ctx, QUEUE_LEASE};
use crate::report::{Report, recovery_after, secs};
use crate::sheaf;

use super::jetstream::{
    self, Bucket, COUNTERS, LeasedJob, check_drained, cleanup, queue_warnings, successes,
    undelivered_attempts,
};
use super::{TENANT, event_ids, settle_deliveries, stop_clean, stranded_recovery, wait_until};

/// How long after the kill the bucket is read again to tell the killed process's claims.
const STRANDED_AFTER: Duration = Duration::from_millis(1_500);

/// How soon after its lease ran out a stranded claim must be delivered again: the survivors
/// claim every 50 ms (`SHEAF_QUEUE_POLL_INTERVAL`) and deliver in 200 ms, so this is slack for
/// a loaded machine, not a target.
const PICKED_UP_WITHIN: Duration = Duration::from_secs(5);

pub async fn run(ctx: &Ctx) -> anyhow::Result<Report> {
    let mut report = Report::new("sheaf-process");
    jetstream::cluster_up(ctx, &mut report).await?;
    let outcome = Box::pin(three_processes(ctx, &mut report)).await;
    jetstream::cluster_down(ctx, outcome).await?;
    Ok(report)
}

async fn three_processes(ctx: &Ctx, report: &mut Report) -> anyhow::Result<()> {
    let (events, rate) = if ctx.quick {
        (400, 100.0)
    } else {
        (3_000, 150.0)
    };
    let schema = ctx.unique("process");
    let bucket = Bucket::connect(ctx, &schema).await?;
    let settings = jetstream::settings(ctx, &schema, &schema, &ctx.nats_cluster, QUEUE_LEASE);
    let receiver = Receiver::builder()
        .delay(Duration::from_millis(200))
        .start()
        .await?;
    // The first creates the bucket; the two others open it.
    let a = sheaf::spawn(ctx, "sheaf-process", "a", &settings).await?;
    let (b, c) = tokio::join!(
        sheaf::spawn(ctx, "sheaf-process", "b", &settings),
        sheaf::spawn(ctx, "sheaf-process", "c", &settings)
    );
    let (b, c) = (b?, c?);
    let api = Api::new(Duration::from_secs(10))?;
    api.tenant_with_destination(&a.base(), TENANT, &receiver.url())
        .await?;
    let targets = Targets::new(&[a.base(), b.base(), c.base()]);
    let load = publish_paced(
        api.clone(),
        targets.clone(),
        TENANT.to_owned(),
        "sheaf-process",
        event_ids("process", events),
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
    targets.remove(&c.base());
    let survivors_before = [api.metrics(&a.base()).await?, api.metrics(&b.base()).await?];
    let leased_at_kill = bucket.leased_jobs().await?;
    let victim = c.pid();
    let killed_at = Instant::now();
    c.kill()?;
    report.note(
        "killed",
        format!(
            "sheaf c (pid {victim}) with SIGKILL after {} deliveries; jobs under a lease in the bucket at that moment: {}",
            receiver.delivered_ids().len(),
            leased_at_kill.len()
        ),
    );
    tokio::time::sleep(STRANDED_AFTER).await;
    let still = bucket.leased_jobs().await?;
    let stranded: Vec<&LeasedJob> = leased_at_kill
        .iter()
        .filter(|(key, job)| {
            still
                .get(*key)
                .is_some_and(|now| now.revision == job.revision)
        })
        .map(|(_, job)| job)
        .collect();
    report.note(
        "claims stranded by the killed process",
        format!(
            "{} (jobs whose lease was not written again {} after the kill; lease {})",
            stranded.len(),
            secs(STRANDED_AFTER),
            secs(QUEUE_LEASE)
        ),
    );

    let published = load.await?;
    settle_deliveries(report, &receiver, &published).await;
    taken_after_the_lease(report, &receiver, &stranded, killed_at);
    report.recovery = recovery_after(killed_at, &published.accepted, &receiver.first_successes());
    report.note(
        "recovery",
        "from the kill until every event accepted before it was delivered",
    );
    report.note(
        "publishes refused (retried on another process)",
        published.refused_text(),
    );
    let survivors = [&a, &b];
    for (i, sheaf) in survivors.iter().enumerate() {
        let page = api.metrics(&sheaf.base()).await?;
        let after = successes(&page) - successes(&survivors_before[i]);
        report.note(
            &sheaf.name,
            format!(
                "{after} delivered after the kill; {}, sheaf_queue_processes {}",
                COUNTERS
                    .iter()
                    .map(|n| format!("{n} {}", metric(&page, n).unwrap_or(0.0)))
                    .collect::<Vec<_>>()
                    .join(", "),
                metric(&page, "sheaf_queue_processes").unwrap_or(0.0),
            ),
        );
        report.check(
            after > 0.0,
            format!("{} delivered nothing after the kill", sheaf.name),
        );
    }
    check_drained(report, &api, &survivors).await?;
    let undelivered = undelivered_attempts(ctx, &schema, &published, &receiver).await?;
    if !undelivered.is_empty() {
        report.note("attempts in the log of events never delivered", undelivered);
    }
    report.note("queue errors in the logs", queue_warnings(&survivors));
    stop_clean(report, a).await?;
    stop_clean(report, b).await?;
    cleanup(ctx, report, &schema, &bucket).await
}

/// Checks that every stranded claim was delivered by a survivor, none before its lease ran out
/// and none long after; notes how many of them the killed process had delivered already (the
/// duplicates).
fn taken_after_the_lease(
    report: &mut Report,
    receiver: &Receiver,
    stranded: &[&LeasedJob],
    killed_at: Instant,
) {
    let ids: Vec<String> = stranded.iter().map(|j| j.event_id.clone()).collect();
    let (came_back, text) = stranded_recovery(&ids, receiver, killed_at, "sheaf c");
    report.note("stranded claims delivered by the survivors", text);
    report.check(
        came_back == stranded.len(),
        format!(
            "only {came_back} of the {} stranded claims were delivered after the kill",
            stranded.len()
        ),
    );
    // When each stranded job's first request after the kill arrived, against its lease's end:
    // before it, a survivor held a job whose lease still ran; long after it, nobody took it.
    let deliveries = receiver.deliveries();
    let (mut early, mut late, mut after_lease) = (Vec::new(), Vec::new(), Vec::new());
    for job in stranded {
        let Some(first) = deliveries
            .iter()
            .filter(|d| d.id == job.event_id && d.arrived > killed_at)
            .map(|d| d.arrived)
            .min()
        else {
            continue;
        };
        // 5 ms of slack for the lease's end, read as wall-clock time and turned into this
        // process's clock.
        if first + Duration::from_millis(5) < job.lease_ends {
            early.push(format!(
                "{} ({} early)",
                job.event_id,
                secs(job.lease_ends - first)
            ));
        } else if first > job.lease_ends + PICKED_UP_WITHIN {
            late.push(format!(
                "{} ({} after)",
                job.event_id,
                secs(first - job.lease_ends)
            ));
        }
        after_lease.push(signed_secs(first, job.lease_ends));
    }
    after_lease.sort_by(f64::total_cmp);
    if let (Some(min), Some(max)) = (after_lease.first(), after_lease.last()) {
        report.note(
            "stranded claims taken after their lease ran out",
            format!("between {min:.1} s and {max:.1} s after it (negative: before)"),
        );
    }
    report.check(
        early.is_empty(),
        format!(
            "{} stranded claims were delivered again before their lease ran out: {:?}",
            early.len(),
            early.iter().take(5).collect::<Vec<_>>()
        ),
    );
    report.check(
        late.is_empty(),
        format!(
            "{} stranded claims were delivered again more than {PICKED_UP_WITHIN:?} after their lease ran out: {:?}",
            late.len(),
            late.iter().take(5).collect::<Vec<_>>()
        ),
    );
}

/// `a - b` in seconds, negative when `a` is earlier.
fn signed_secs(a: Instant, b: Instant) -> f64 {
    if a >= b {
        (a - b).as_secs_f64()
    } else {
        -(b - a).as_secs_f64()
    }
}
