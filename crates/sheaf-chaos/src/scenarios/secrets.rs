//! `secrets`: `SHEAF_SECRETS_KEY` rotated under load, as `docs/operations.md` says to. Two
//! processes seal everything under key A; besides the destination the load goes to, other
//! tenants hold more destinations (half with a rotated secret, so a previous secret is sealed
//! too). While events are published:
//!
//! 1. each process in turn is stopped (SIGTERM) and started again with key B and A as
//!    `SHEAF_SECRETS_KEY_PREVIOUS`;
//! 2. `sheaf secrets reseal --batch 50` (the same binary) runs while both deliver and secrets
//!    of other destinations are rotated through the API;
//! 3. `sheaf secrets reseal --check` must then exit 0, and no row may hold a value that is not
//!    sealed under B;
//! 4. each process in turn is restarted with key B alone.
//!
//! Every accepted event must be delivered, with no failed attempt and no log line about a
//! credential that does not open.

use std::time::{Duration, Instant};

use futures::StreamExt as _;
use sheaf_testenv::process::SheafProcess;
use sheaf_testenv::receiver::Receiver;

use crate::api::{Api, Pace, Targets, publish_paced};
use crate::env::Ctx;
use crate::report::{Report, at, secs};
use crate::sheaf;

use super::{TENANT, cleanup, event_ids, settle, stop_clean, wait_until};

/// Key A and key B (32 bytes each, base64): fixed, the scenario is about the procedure.
const KEY_A: &str = "YWFhYWFhYWFhYWFhYWFhYWFhYWFhYWFhYWFhYWFhYWE=";
const KEY_B: &str = "YmJiYmJiYmJiYmJiYmJiYmJiYmJiYmJiYmJiYmJiYmI=";

/// Tenants that hold the destinations nothing is published to (they are there to be re-sealed).
const OTHER_TENANTS: usize = 10;

pub async fn run(ctx: &Ctx) -> anyhow::Result<Report> {
    let mut report = Report::new("secrets");
    let (events, rate, others) = if ctx.quick {
        (1_000, 100.0, 200)
    } else {
        (3_000, 100.0, 1_000)
    };
    let schema = ctx.unique("secrets");
    let base = ctx.sheaf_settings(&schema, &schema);
    let with = |keys: &[(&str, &str)]| {
        let mut settings = base.clone();
        settings.extend(keys.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
        settings
    };
    let on_a = with(&[("SHEAF_SECRETS_KEY", KEY_A)]);
    let rotating = with(&[
        ("SHEAF_SECRETS_KEY", KEY_B),
        ("SHEAF_SECRETS_KEY_PREVIOUS", KEY_A),
    ]);
    let on_b = with(&[("SHEAF_SECRETS_KEY", KEY_B)]);
    let receiver = Receiver::builder()
        .delay(Duration::from_millis(20))
        .start()
        .await?;
    let a = sheaf::spawn(ctx, "secrets", "a", &on_a).await?;
    let b = sheaf::spawn(ctx, "secrets", "b", &on_a).await?;
    let api = Api::new(Duration::from_secs(10))?;
    let id = api
        .tenant_with_destination(&a.base(), TENANT, &receiver.url())
        .await?;
    rotate(&api, &a.base(), TENANT, &id).await?;
    let made = Instant::now();
    let other_ids = other_destinations(&api, &a.base(), &receiver.url(), others).await?;
    report.note(
        "destinations under key A",
        format!(
            "{} (half with a rotated secret), made in {}",
            other_ids.len() + 1,
            secs(made.elapsed())
        ),
    );

    let targets = Targets::new(&[a.base(), b.base()]);
    let t0 = Instant::now();
    let load = publish_paced(
        api.clone(),
        targets.clone(),
        TENANT.to_owned(),
        "secrets",
        event_ids("secrets", events),
        Pace {
            rate,
            concurrency: 16,
            give_up_after: Duration::from_secs(180),
        },
    );
    wait_until(Duration::from_secs(120), || {
        receiver.delivered_ids().len() >= events / 10
    })
    .await;

    // 1. Roll both processes onto key B, A still opening.
    let a = roll(ctx, &mut report, &targets, a, "a2", &rotating, t0).await?;
    let b = roll(ctx, &mut report, &targets, b, "b2", &rotating, t0).await?;

    // 2. Re-seal while both deliver and secrets are rotated elsewhere.
    let rotations = {
        let api = api.clone();
        let base = b.base();
        let some: Vec<(String, String)> = other_ids.iter().step_by(7).cloned().collect();
        tokio::spawn(async move {
            let mut done = 0;
            for (tenant, id) in some {
                if rotate(&api, &base, &tenant, &id).await.is_ok() {
                    done += 1;
                }
            }
            done
        })
    };
    let reseal_at = Instant::now();
    let resealed = reseal(ctx, &rotating, &["--batch", "50"]).await?;
    let reseal_took = reseal_at.elapsed();
    report.note(
        "sheaf secrets reseal --batch 50",
        format!(
            "at {}, {} later: {}",
            at(t0, reseal_at),
            secs(reseal_took),
            resealed.1.trim()
        ),
    );
    report.check(
        resealed.0,
        format!("`sheaf secrets reseal` failed: {}", resealed.1.trim()),
    );
    let rotated = rotations.await?;
    report.note("secrets rotated through the API meanwhile", rotated);

    // 3. Nothing left under A.
    let checked = reseal(ctx, &rotating, &["--check"]).await?;
    report.note("sheaf secrets reseal --check", checked.1.trim());
    report.check(
        checked.0,
        format!(
            "`sheaf secrets reseal --check` found credentials left: {}",
            checked.1.trim()
        ),
    );
    let key_b = key_id(&checked.1).unwrap_or_default();
    let left = rows_not_under(ctx, &schema, &key_b).await?;
    report.note(
        "rows with a value not sealed under key B",
        format!("{left} (key {key_b})"),
    );
    report.check(
        left == 0 && !key_b.is_empty(),
        format!("{left} rows hold a value not under key B ({key_b:?})"),
    );

    // 4. Key B alone.
    let a = roll(ctx, &mut report, &targets, a, "a3", &on_b, t0).await?;
    let b = roll(ctx, &mut report, &targets, b, "b3", &on_b, t0).await?;
    let published = load.await?;
    settle(ctx, &mut report, &schema, &receiver, &published).await?;
    let failed = api
        .list_all(
            &a.base(),
            &format!("/api/v1/tenants/{TENANT}/attempts?status=failed"),
        )
        .await?
        .len();
    report.note("failed attempts", failed);
    report.check(failed == 0, format!("{failed} attempts failed"));
    let unreadable = unopened_lines(ctx, &["a", "b", "a2", "b2", "a3", "b3"]);
    report.note(
        "log lines about a credential that does not open",
        unreadable,
    );
    report.check(
        unreadable == 0,
        format!("{unreadable} log lines say a credential does not open"),
    );
    report.note(
        "publishes refused during the rolls (retried)",
        published.refused_text(),
    );
    stop_clean(&mut report, a).await?;
    stop_clean(&mut report, b).await?;
    cleanup(ctx, &mut report, &schema).await?;
    Ok(report)
}

/// `count` webhook destinations over [`OTHER_TENANTS`] tenants, every other one with its
/// secret rotated; their (tenant, id).
async fn other_destinations(
    api: &Api,
    base: &str,
    url: &str,
    count: usize,
) -> anyhow::Result<Vec<(String, String)>> {
    for t in 0..OTHER_TENANTS {
        api.tenant(base, &format!("other{t}")).await?;
    }
    let made: Vec<anyhow::Result<(String, String)>> = futures::stream::iter(0..count)
        .map(|i| async move {
            let tenant = format!("other{}", i % OTHER_TENANTS);
            let id = api
                .destination(base, &tenant, "webhook", serde_json::json!({ "url": url }))
                .await?;
            if i % 2 == 0 {
                rotate(api, base, &tenant, &id).await?;
            }
            Ok((tenant, id))
        })
        .buffer_unordered(8)
        .collect()
        .await;
    made.into_iter().collect()
}

async fn rotate(api: &Api, base: &str, tenant: &str, id: &str) -> anyhow::Result<()> {
    api.rotate_secret(base, tenant, id).await
}

/// Stops `old` (SIGTERM, taken out of the publisher's targets first) and starts `name` with
/// `settings` in its place.
async fn roll(
    ctx: &Ctx,
    report: &mut Report,
    targets: &Targets,
    old: SheafProcess,
    name: &str,
    settings: &[(String, String)],
    t0: Instant,
) -> anyhow::Result<SheafProcess> {
    targets.remove(&old.base());
    let stopped_at = Instant::now();
    stop_clean(report, old).await?;
    let new = sheaf::spawn(ctx, "secrets", name, settings).await?;
    targets.add(new.base());
    report.note(
        &format!("sheaf {name}"),
        format!(
            "stopped its predecessor at {}, listening {} later",
            at(t0, stopped_at),
            secs(new.listening_at - stopped_at)
        ),
    );
    Ok(new)
}

/// Runs `sheaf secrets reseal <args>` with `settings` as its only settings; whether it
/// succeeded, and what it printed.
async fn reseal(
    ctx: &Ctx,
    settings: &[(String, String)],
    args: &[&str],
) -> anyhow::Result<(bool, String)> {
    let mut command = std::process::Command::new(&ctx.sheaf_bin);
    command
        .args(["secrets", "reseal"])
        .args(args)
        .env_clear()
        .envs(settings.iter().cloned())
        .env("SHEAF_LOG", "warn");
    let output = tokio::task::spawn_blocking(move || command.output()).await??;
    Ok((
        output.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    ))
}

/// Lines of the scenario's process logs that say a sealed value did not open (the errors of
/// `state::secrets` name the setting or say it does not decrypt).
fn unopened_lines(ctx: &Ctx, names: &[&str]) -> usize {
    names
        .iter()
        .filter_map(|name| {
            std::fs::read_to_string(ctx.dir.join("logs").join(format!("secrets-{name}.log"))).ok()
        })
        .map(|log| {
            log.lines()
                .filter(|l| {
                    l.contains("does not decrypt")
                        || l.contains("which is neither SHEAF_SECRETS_KEY")
                        || l.contains("SHEAF_SECRETS_KEY is not set")
                })
                .count()
        })
        .sum()
}

/// The key id in `… under key <id> …`.
fn key_id(said: &str) -> Option<String> {
    let (_, rest) = said.split_once("under key ")?;
    Some(rest.split_whitespace().next()?.to_owned())
}

/// Rows whose secret or previous secret is not sealed under `key_id` (the destinations here are
/// webhooks: no password in their URLs).
async fn rows_not_under(ctx: &Ctx, schema: &str, key_id: &str) -> anyhow::Result<i64> {
    let prefix = format!("enc:v2:{key_id}:%");
    Ok(sqlx::query_scalar(&format!(
        "SELECT count(*) FROM {schema}.destinations
         WHERE secret NOT LIKE $1
            OR (previous_secret IS NOT NULL AND previous_secret NOT LIKE $1)"
    ))
    .bind(&prefix)
    .fetch_one(&ctx.pg)
    .await?)
}
