//! `sqlite`: the embedded default (every store in one SQLite file, `SHEAF_DATA_DIR`) under the
//! faults one process on one machine meets, in three parts, each on a data directory of its own:
//!
//! - **kill**: SIGKILL mid-burst, then a new process on the same directory. Every event whose
//!   publish got a `202` is delivered, and every attempt record the API listed just before the
//!   kill is still listed after it: a `202` and a listed record both mean committed.
//! - **full**: the file's size limit (`SHEAF_SQLITE_MAX_SIZE_MIB`) stands in for a full disk,
//!   which SQLite reports the same way ("database or disk is full") and which a scenario cannot
//!   make without mounting a file system. The receiver fails while 32 closed-loop publishers
//!   fill the file: publishes are refused with `503` and `Retry-After` and never answered
//!   otherwise, reads go on, and once the receiver is back everything accepted is delivered and
//!   publishes are taken again, without a restart.
//! - **retries**: the receiver fails, SIGKILL while every event waits for its next retry, a new
//!   process on the same directory. The schedule goes on where it was (attempt numbers continue
//!   from the last recorded one, none starts again at 1) and everything is delivered once the
//!   receiver is back.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::{Duration, Instant};

use sheaf_testenv::process::SheafProcess;
use sheaf_testenv::receiver::Receiver;

use crate::api::{Api, Pace, Published, TOPIC, Targets, event_data, publish_paced};
use crate::env::Ctx;
use crate::load::closed_loop;
use crate::report::{Report, secs};
use crate::sheaf;

use super::{
    SETTLE, TENANT, check_events_logged, event_ids, events_with_logged_success, stop_clean,
    wait_until,
};

/// What the parts add up to, for the report's delivery figures.
#[derive(Default)]
struct Totals {
    accepted: HashMap<String, Instant>,
    first_successes: HashMap<String, Instant>,
    duplicates: usize,
}

impl Totals {
    fn add(&mut self, accepted: HashMap<String, Instant>, receiver: &Receiver) {
        self.accepted.extend(accepted);
        self.first_successes.extend(receiver.first_successes());
        self.duplicates += receiver.duplicates();
    }
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<Report> {
    let mut report = Report::new("sqlite");
    let root = ctx.dir.join(ctx.unique("sqlite"));
    let mut totals = Totals::default();
    Box::pin(kill(ctx, &mut report, &root.join("kill"), &mut totals)).await?;
    Box::pin(full(ctx, &mut report, &root.join("full"), &mut totals)).await?;
    Box::pin(retries(
        ctx,
        &mut report,
        &root.join("retries"),
        &mut totals,
    ))
    .await?;
    report.deliveries(&totals.accepted, &totals.first_successes, totals.duplicates);
    if report.passed() {
        std::fs::remove_dir_all(&root)?;
    } else {
        report.note("kept for inspection", root.display());
    }
    Ok(report)
}

/// The scenario's settings on the SQLite store in `dir`.
fn settings(ctx: &Ctx, dir: &Path, extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut settings = ctx.memory_settings();
    settings.push(("SHEAF_LOG_STORE".to_owned(), "sqlite".to_owned()));
    settings.push(("SHEAF_DATA_DIR".to_owned(), dir.display().to_string()));
    settings.extend(
        extra
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    settings
}

/// The ids of every attempt record the process lists.
async fn attempt_ids(api: &Api, sheaf: &SheafProcess) -> anyhow::Result<HashSet<String>> {
    Ok(api
        .list_all(&sheaf.base(), &format!("/api/v1/tenants/{TENANT}/attempts"))
        .await?
        .iter()
        .filter_map(|a| a["id"].as_str().map(str::to_owned))
        .collect())
}

async fn kill(
    ctx: &Ctx,
    report: &mut Report,
    dir: &Path,
    totals: &mut Totals,
) -> anyhow::Result<()> {
    let (events, rate) = if ctx.quick {
        (400, 100.0)
    } else {
        (3_000, 150.0)
    };
    let settings = settings(ctx, dir, &[]);
    let receiver = Receiver::builder()
        .delay(Duration::from_millis(100))
        .start()
        .await?;
    let a = sheaf::spawn(ctx, "sqlite", "kill-a", &settings).await?;
    let api = Api::new(Duration::from_secs(10))?;
    api.tenant_with_destination(&a.base(), TENANT, &receiver.url())
        .await?;
    let targets = Targets::new(&[a.base()]);
    let load = publish_paced(
        api.clone(),
        targets.clone(),
        TENANT.to_owned(),
        "sqlite-kill",
        event_ids("sqlite-kill", events),
        Pace {
            rate,
            concurrency: 32,
            give_up_after: Duration::from_secs(180),
        },
    );
    wait_until(Duration::from_secs(120), || {
        receiver.delivered_ids().len() >= events / 4
    })
    .await;
    let listed = attempt_ids(&api, &a).await?;
    targets.remove(&a.base());
    let killed_at = Instant::now();
    a.kill()?;
    let b = sheaf::spawn(ctx, "sqlite", "kill-b", &settings).await?;
    report.note(
        "kill: restart",
        format!(
            "SIGKILL mid-burst with {} attempt records listed; the new process on the same file listened {} later",
            listed.len(),
            secs(killed_at.elapsed())
        ),
    );
    targets.add(b.base());
    let published: Published = load.await?;
    report.check(
        published.gave_up.is_empty(),
        format!(
            "kill: the publisher gave up on {} events",
            published.gave_up.len()
        ),
    );
    let missing = receiver.wait_for(published.accepted.keys(), SETTLE).await;
    report.check(
        missing.is_empty(),
        format!(
            "kill: {} accepted events were never delivered",
            missing.len()
        ),
    );
    let kept = attempt_ids(&api, &b).await?;
    let lost = listed.difference(&kept).count();
    report.note(
        "kill: attempt records",
        format!(
            "{} listed before the kill, {lost} of them missing after it; {} listed at the end",
            listed.len(),
            kept.len()
        ),
    );
    report.check(
        lost == 0,
        format!("kill: {lost} attempt records listed before the kill were lost"),
    );
    check_events_logged(report, &api, &b, &published).await?;
    // A success is recorded a few milliseconds after the receiver saw it.
    let mut unrecorded = Vec::new();
    for _ in 0..50 {
        let recorded = events_with_logged_success(&api, &b).await?;
        unrecorded = published
            .accepted
            .keys()
            .filter(|id| !recorded.contains(*id))
            .cloned()
            .collect();
        if unrecorded.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    report.check(
        unrecorded.is_empty(),
        format!(
            "kill: {} delivered events have no successful attempt recorded",
            unrecorded.len()
        ),
    );
    totals.add(published.accepted, &receiver);
    stop_clean(report, b).await
}

async fn full(
    ctx: &Ctx,
    report: &mut Report,
    dir: &Path,
    totals: &mut Totals,
) -> anyhow::Result<()> {
    // Small enough that a debug build fills it in seconds while its receiver fails.
    let (limit_mib, fault) = if ctx.quick {
        (4, Duration::from_secs(20))
    } else {
        (16, Duration::from_secs(60))
    };
    let settings = settings(
        ctx,
        dir,
        &[("SHEAF_SQLITE_MAX_SIZE_MIB", &limit_mib.to_string())],
    );
    let receiver = Receiver::start().await?;
    let mut sheaf = sheaf::spawn(ctx, "sqlite", "full", &settings).await?;
    let api = Api::new(Duration::from_secs(10))?;
    api.tenant_with_destination(&sheaf.base(), TENANT, &receiver.url())
        .await?;
    receiver.set_failing(true);
    let t0 = Instant::now();
    let until = t0 + fault;
    let load = closed_loop(api.clone(), sheaf.base(), TENANT, "sqlite-full", 32, until);

    // Beside the load, one probe publish every half second until one is refused: its answer
    // says why, and the reads must go on meanwhile.
    let mut accepted = HashMap::new();
    let mut refusal = None;
    for n in 0.. {
        if Instant::now() >= until {
            break;
        }
        let id = format!("sqlite-full-probe-{n:04}");
        match api
            .publish(&sheaf.base(), TENANT, TOPIC, &id, &event_data("full", n))
            .await?
        {
            (202, _) => {
                accepted.insert(id, Instant::now());
            }
            (503, body) => {
                refusal = Some((Instant::now(), body));
                break;
            }
            (status, body) => {
                report.check(false, format!("full: a probe publish got {status}: {body}"));
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let message = refusal
        .as_ref()
        .map(|(_, body)| body["error"]["message"].as_str().unwrap_or("").to_owned());
    report.note(
        "full: first refusal",
        match &refusal {
            Some((at, _)) => format!(
                "after {}: {}",
                secs(at.duration_since(t0)),
                message.as_deref().unwrap_or("")
            ),
            None => "none: the file never reached its limit".to_owned(),
        },
    );
    report.check(
        message.as_deref().is_some_and(|m| m.contains("size limit")),
        "full: no publish was refused for the size limit",
    );
    let (status, _) = api
        .call(
            reqwest::Method::GET,
            &sheaf.base(),
            &format!("/api/v1/tenants/{TENANT}/events?limit=10"),
            None,
        )
        .await?;
    report.check(
        status == 200,
        format!("full: listing events answered {status} while the file was full"),
    );

    let load = load.await?;
    receiver.set_failing(false);
    let fault_end = Instant::now();
    report.note(
        "full: publishes during the fault",
        format!(
            "{} accepted, {} refused with 503 ({} without Retry-After), other answers: {}",
            load.accepted.len(),
            load.refused,
            load.refused_without_retry_after,
            load.other_text()
        ),
    );
    report.check(
        load.refused > 0 && load.refused_without_retry_after == 0,
        format!(
            "full: {} refusals, {} of them without Retry-After",
            load.refused, load.refused_without_retry_after
        ),
    );
    report.check(
        load.other_total() == 0,
        format!(
            "full: publishes got answers other than 202 and 503: {}",
            load.other_text()
        ),
    );
    accepted.extend(load.accepted);
    let missing = receiver.wait_for(accepted.keys(), SETTLE).await;
    report.check(
        missing.is_empty(),
        format!(
            "full: {} accepted events were never delivered",
            missing.len()
        ),
    );

    // Without a restart: retention frees the delivered events, and publishes are taken again.
    let mut recovered = None;
    for n in 0..240 {
        let id = format!("sqlite-full-after-{n:04}");
        if let (202, _) = api
            .publish(&sheaf.base(), TENANT, TOPIC, &id, &event_data("full", n))
            .await?
        {
            accepted.insert(id, Instant::now());
            recovered = Some(fault_end.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    report.note(
        "full: publishes taken again",
        recovered.map_or_else(
            || "never, within 2 minutes".to_owned(),
            |d| format!("{} after the receiver was back", secs(d)),
        ),
    );
    report.check(
        recovered.is_some(),
        "full: publishes were still refused 2 minutes after the receiver came back",
    );
    let missing = receiver.wait_for(accepted.keys(), SETTLE).await;
    report.check(
        missing.is_empty(),
        format!(
            "full: {} events accepted after recovery were never delivered",
            missing.len()
        ),
    );
    let file = std::fs::metadata(dir.join("sheaf.db"))?.len();
    report.note(
        "full: database file",
        format!(
            "{:.1} MiB with a {limit_mib} MiB limit",
            file as f64 / 1048576.0
        ),
    );
    report.check(
        file <= limit_mib << 20,
        format!("full: the file ({file} bytes) is larger than its {limit_mib} MiB limit"),
    );
    report.check(sheaf.running(), "full: sheaf exited");
    totals.add(accepted, &receiver);
    stop_clean(report, sheaf).await
}

/// The highest attempt number listed for each event (`status` filter optional).
async fn attempt_numbers(
    api: &Api,
    sheaf: &SheafProcess,
    status: Option<&str>,
) -> anyhow::Result<HashMap<String, u64>> {
    let filter = status.map_or_else(String::new, |s| format!("?status={s}"));
    let mut numbers = HashMap::new();
    for a in api
        .list_all(
            &sheaf.base(),
            &format!("/api/v1/tenants/{TENANT}/attempts{filter}"),
        )
        .await?
    {
        if let (Some(event), Some(number)) = (a["event_id"].as_str(), a["number"].as_u64()) {
            let highest = numbers.entry(event.to_owned()).or_insert(0);
            *highest = (*highest).max(number);
        }
    }
    Ok(numbers)
}

async fn retries(
    ctx: &Ctx,
    report: &mut Report,
    dir: &Path,
    totals: &mut Totals,
) -> anyhow::Result<()> {
    let events = if ctx.quick { 50 } else { 300 };
    let settings = settings(ctx, dir, &[]);
    let receiver = Receiver::start().await?;
    receiver.set_failing(true);
    let a = sheaf::spawn(ctx, "sqlite", "retries-a", &settings).await?;
    let api = Api::new(Duration::from_secs(10))?;
    api.tenant_with_destination(&a.base(), TENANT, &receiver.url())
        .await?;
    let mut accepted = HashMap::new();
    for (n, id) in event_ids("sqlite-retries", events).into_iter().enumerate() {
        let (status, body) = api
            .publish(&a.base(), TENANT, TOPIC, &id, &event_data("retries", n))
            .await?;
        anyhow::ensure!(
            status == 202,
            "retries: publishing {id} got {status}: {body}"
        );
        accepted.insert(id, Instant::now());
    }
    // Two failed attempts each (the schedule is 1s, 2s, 4s): every event is in its schedule.
    let deadline = Instant::now() + Duration::from_secs(60);
    let (before, in_schedule) = loop {
        let numbers = attempt_numbers(&api, &a, None).await?;
        let ready = numbers.len() == events && numbers.values().all(|n| *n >= 2);
        if ready || Instant::now() >= deadline {
            break (numbers, ready);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    report.check(
        in_schedule,
        "retries: not every event had two failed attempts within a minute",
    );
    a.kill()?;
    let b = sheaf::spawn(ctx, "sqlite", "retries-b", &settings).await?;
    // One more round fails after the restart, then the receiver is back.
    tokio::time::sleep(Duration::from_secs(3)).await;
    receiver.set_failing(false);
    let missing = receiver.wait_for(accepted.keys(), SETTLE).await;
    report.check(
        missing.is_empty(),
        format!(
            "retries: {} accepted events were never delivered",
            missing.len()
        ),
    );
    let mut succeeded = HashMap::new();
    for _ in 0..50 {
        succeeded = attempt_numbers(&api, &b, Some("success")).await?;
        if succeeded.len() == events {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let restarted: Vec<&String> = before
        .iter()
        .filter(|(id, n)| succeeded.get(*id).is_none_or(|s| s <= n))
        .map(|(id, _)| id)
        .collect();
    let (low, high) = (
        succeeded.values().min().copied().unwrap_or(0),
        succeeded.values().max().copied().unwrap_or(0),
    );
    report.note(
        "retries: schedule across the restart",
        format!(
            "{events} events killed after 2 or more failed attempts each; delivered by attempt {low} to {high}; {} without a later successful attempt",
            restarted.len()
        ),
    );
    report.check(
        restarted.is_empty(),
        format!(
            "retries: {} events have no successful attempt numbered after their last failed one",
            restarted.len()
        ),
    );
    totals.add(accepted, &receiver);
    stop_clean(report, b).await
}
