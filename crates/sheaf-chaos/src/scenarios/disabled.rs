//! `disabled`: a destination is disabled automatically mid-stream (its receiver keeps answering
//! 503 and `SHEAF_DESTINATION_DISABLE_AFTER_FAILURES=5`), 1,000 events are published while it is
//! disabled (100 with `--quick`), the receiver recovers, and the operator recovers the way
//! `docs/operations.md` says, in three calls: enable the destination, replay its dead letters
//! of the window, watch. Every event accepted, before and during the disabled spell, must be
//! delivered. Runs on the in-memory stores and on Postgres + ClickHouse.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use serde_json::{Value, json};
use sheaf_store::Timestamp;
use sheaf_testenv::receiver::Receiver;

use crate::api::{Api, TOPIC, event_data};
use crate::env::Ctx;
use crate::report::{Report, secs};
use crate::sheaf;

use super::{SETTLE, TENANT, cleanup, stop_clean};

pub async fn run(ctx: &Ctx) -> anyhow::Result<Report> {
    let mut report = Report::new("disabled");
    let events = if ctx.quick { 100 } else { 1_000 };
    let mut accepted = HashMap::new();
    let mut first_successes = HashMap::new();
    let mut duplicates = 0;

    let mut memory = ctx.memory_settings();
    memory.push((
        "SHEAF_DESTINATION_DISABLE_AFTER_FAILURES".to_owned(),
        "5".to_owned(),
    ));
    let schema = ctx.unique("disabled");
    let mut shared = ctx.sheaf_settings(&schema, &schema);
    shared.push((
        "SHEAF_DESTINATION_DISABLE_AFTER_FAILURES".to_owned(),
        "5".to_owned(),
    ));
    for (label, prefix, settings) in [
        ("memory", "disabled-memory", &memory),
        ("postgres + clickhouse", "disabled-pg", &shared),
    ] {
        let receiver = Receiver::builder().start().await?;
        let ids = Box::pin(disabled_on(
            ctx,
            &mut report,
            label,
            prefix,
            settings,
            &receiver,
            events,
        ))
        .await?;
        accepted.extend(ids);
        first_successes.extend(receiver.first_successes());
        duplicates += receiver.duplicates();
    }
    report.deliveries(&accepted, &first_successes, duplicates);
    cleanup(ctx, &mut report, &schema).await?;
    Ok(report)
}

/// One configuration; returns the accepted events and when each was accepted.
async fn disabled_on(
    ctx: &Ctx,
    report: &mut Report,
    label: &str,
    prefix: &'static str,
    settings: &[(String, String)],
    receiver: &Receiver,
    events: usize,
) -> anyhow::Result<HashMap<String, Instant>> {
    let mut sheaf = sheaf::spawn(ctx, "disabled", prefix, settings).await?;
    let base = sheaf.base();
    let api = Api::new(Duration::from_secs(10))?;
    let destination = api
        .tenant_with_destination(&base, TENANT, &receiver.url())
        .await?;
    let path = format!("/api/v1/tenants/{TENANT}/destinations/{destination}");
    let since = Timestamp::now();
    let mut accepted = HashMap::new();
    receiver.set_failing(true);

    // A stream of events until the destination is disabled by its failures.
    let t0 = Instant::now();
    let mut n = 0;
    loop {
        let id = format!("{prefix}-before-{n:04}");
        let (status, _) = api
            .publish(&base, TENANT, TOPIC, &id, &event_data(prefix, n))
            .await?;
        anyhow::ensure!(status == 202, "{label}: publish {id} answered {status}");
        accepted.insert(id, Instant::now());
        n += 1;
        let (_, read) = api.call(reqwest::Method::GET, &base, &path, None).await?;
        if read["enabled"] == Value::Bool(false) {
            break;
        }
        anyhow::ensure!(
            t0.elapsed() < Duration::from_secs(60),
            "{label}: the destination was not disabled within a minute of failures"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    report.note(
        &format!("{label}: disabled automatically"),
        format!("after {n} events and {}", secs(t0.elapsed())),
    );

    // The spell: every event is accepted and must be accounted for.
    let during: Vec<String> = (0..events).map(|i| format!("{prefix}-{i:04}")).collect();
    let answers: Vec<(String, anyhow::Result<(u16, Value)>)> = futures::stream::iter(&during)
        .enumerate()
        .map(|(i, id)| {
            let api = api.clone();
            let base = base.clone();
            async move {
                let answer = api
                    .publish(&base, TENANT, TOPIC, id, &event_data(prefix, i))
                    .await;
                (id.clone(), answer)
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    for (id, answer) in answers {
        match answer {
            Ok((202, _)) => {
                accepted.insert(id, Instant::now());
            }
            Ok((status, body)) => anyhow::bail!("{label}: publish {id} answered {status}: {body}"),
            Err(err) => anyhow::bail!("{label}: publish {id} got no answer: {err}"),
        }
    }
    // Each waits as a dead letter, found by the listing.
    let wait_from = Instant::now();
    let dead_path = format!("/api/v1/tenants/{TENANT}/dead-letters");
    let dead = loop {
        let dead = api.list_all(&base, &dead_path).await?;
        if dead.len() >= accepted.len() || wait_from.elapsed() > Duration::from_secs(120) {
            break dead;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let disabled_reason = dead
        .iter()
        .filter(|d| d["reason"] == "destination disabled")
        .count();
    report.note(
        &format!("{label}: dead letters while disabled"),
        format!(
            "{} of {} accepted events ({disabled_reason} with reason \"destination disabled\")",
            dead.len(),
            accepted.len()
        ),
    );
    report.check(
        dead.len() == accepted.len(),
        format!(
            "{label}: {} accepted events are not in the dead-letter list",
            accepted.len().saturating_sub(dead.len())
        ),
    );

    // The receiver is mended; the operator's three calls.
    receiver.set_failing(false);
    let recovery = Instant::now();
    let (status, body) = api
        .call(reqwest::Method::PUT, &base, &format!("{path}/enable"), None)
        .await?;
    anyhow::ensure!(status == 200, "{label}: enable answered {status}: {body}");
    let until = Timestamp::now().saturating_add(Duration::from_secs(1));
    let request = json!({
        "destination_id": destination,
        "status": "dead_lettered",
        "since": since.to_string(),
        "until": until.to_string(),
    });
    let (status, replay) = api
        .call(
            reqwest::Method::POST,
            &base,
            &format!("/api/v1/tenants/{TENANT}/replay"),
            Some(&request),
        )
        .await?;
    anyhow::ensure!(status == 202, "{label}: replay answered {status}: {replay}");
    let missing = receiver.wait_for(accepted.keys(), SETTLE).await;
    report.note(
        &format!("{label}: recovered"),
        format!(
            "enable, replay ({} jobs, state {}), all delivered {} after the receiver was mended",
            replay["jobs"],
            replay["state"],
            secs(recovery.elapsed())
        ),
    );
    report.check(
        missing.is_empty(),
        format!(
            "{label}: {} of {} accepted events were never delivered",
            missing.len(),
            accepted.len()
        ),
    );
    report.check(sheaf.running(), format!("{label}: sheaf exited"));
    stop_clean(report, sheaf).await?;
    Ok(accepted)
}
