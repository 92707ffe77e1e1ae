//! `cdc`: the process running the CDC source is SIGKILLed while it publishes a large
//! transaction, the application keeps writing while it is down, and a new process resumes
//! from the replication slot. No committed change may be lost, and none may be published as
//! two events: a change re-read after the crash must get the id it had (`cdc-<slot>-<commit
//! LSN>-<position>`) and be recognised as a repeat.
//!
//! The application is a table `orders` in a schema of its own in the fault suite's database.
//! Its changes: small insert transactions, then one large insert transaction (more rows than
//! the reader's cap of `SHEAF_CDC_CHECKPOINT_LIMIT / 2`, so it arrives in several batches and
//! the slot is acknowledged row by row inside it), during which the process is killed; then,
//! while no process runs, an update of many rows in one transaction and more small inserts.
//! One row is one message by default, each published (log write, enqueue) and acknowledged on
//! its own, so the large transaction takes seconds to publish and the kill, once a third of it
//! is published, lands inside it. Every change is identified at the receiver by its operation
//! and the row's id; each must arrive, and all deliveries of one change must carry one event id.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde_json::Value;
use sheaf_testenv::postgres::drop_replication_slot;
use sheaf_testenv::process::SheafProcess;
use sheaf_testenv::receiver::Receiver;

use crate::api::{Api, metric};
use crate::env::Ctx;
use crate::report::{Report, secs};
use crate::sheaf;

use super::{TENANT, cleanup, counters, stop_clean};

const PUBLISHED: &str = "sheaf_cdc_events_published_total";

pub async fn run(ctx: &Ctx) -> anyhow::Result<Report> {
    let mut report = Report::new("cdc");
    // (small transactions, rows each, rows of the large transaction, rows updated)
    let (small, rows_each, large, updated) = if ctx.quick {
        (20, 5, 1_000, 100)
    } else {
        (100, 10, 6_000, 1_000)
    };
    let schema = ctx.unique("cdc");
    let app = ctx.unique("cdcapp");
    let slot = ctx.unique("slot");
    sqlx::query(&format!("CREATE SCHEMA {app}"))
        .execute(&ctx.pg)
        .await?;
    sqlx::query(&format!(
        "CREATE TABLE {app}.orders (id bigint PRIMARY KEY, n bigint NOT NULL, note text NOT NULL)"
    ))
    .execute(&ctx.pg)
    .await?;
    let outcome = Box::pin(scenario(
        ctx,
        &mut report,
        &schema,
        &app,
        &slot,
        (small, rows_each, large, updated),
    ))
    .await;
    // The slot keeps WAL for as long as it exists: drop it whatever happened.
    let dropped = drop_slot(ctx, &slot).await;
    outcome?;
    dropped?;
    if report.passed() {
        sqlx::query(&format!("DROP SCHEMA {app} CASCADE"))
            .execute(&ctx.pg)
            .await?;
    }
    cleanup(ctx, &mut report, &schema).await?;
    Ok(report)
}

async fn scenario(
    ctx: &Ctx,
    report: &mut Report,
    schema: &str,
    app: &str,
    slot: &str,
    (small, rows_each, large, updated): (i64, i64, i64, i64),
) -> anyhow::Result<()> {
    let mut settings = ctx.sheaf_settings(schema, schema);
    for (k, v) in [
        ("SHEAF_CDC_ENABLED", "true"),
        ("SHEAF_CDC_POSTGRES_URL", ctx.postgres_url.as_str()),
        ("SHEAF_CDC_SLOT", slot),
        ("SHEAF_CDC_PUBLICATION", slot),
        ("SHEAF_CDC_CREATE_MISSING", "true"),
        ("SHEAF_CDC_TENANTS", &format!("{app}.orders={TENANT}")),
        ("SHEAF_CDC_CHECKPOINT_LIMIT", "200"),
    ] {
        settings.push((k.to_owned(), v.to_owned()));
    }
    let receiver = Receiver::start().await?;
    let a = sheaf::spawn(ctx, "cdc", "a", &settings).await?;
    let api = Api::new(Duration::from_secs(10))?;
    api.tenant_with_destination(&a.base(), TENANT, &receiver.url())
        .await?;
    wait_streaming(&api, &a).await?;

    let mut expected: HashSet<String> = HashSet::new();
    let mut next_id: i64 = 1;
    // Small transactions first.
    for _ in 0..small {
        insert(ctx, app, next_id, rows_each, "small").await?;
        expected.extend((next_id..next_id + rows_each).map(|id| format!("insert:{id}")));
        next_id += rows_each;
    }
    let base = wait_published(&api, &a, expected.len() as f64, Duration::from_secs(120)).await?;

    // The large transaction; the kill comes once a third of it is published.
    let large_first = next_id;
    insert(ctx, app, next_id, large, "large").await?;
    expected.extend((next_id..next_id + large).map(|id| format!("insert:{id}")));
    next_id += large;
    let trigger = base + large as f64 / 3.0;
    let at_kill = wait_published(&api, &a, trigger, Duration::from_secs(120)).await?;
    let killed_at = Instant::now();
    let victim = a.pid();
    a.kill()?;
    let of_large = (at_kill - base).max(0.0);
    report.note(
        "killed",
        format!(
            "sheaf a (pid {victim}) with SIGKILL when {of_large:.0} of the {large} rows of the large transaction were published: {}",
            if of_large < large as f64 {
                "mid-transaction"
            } else {
                "after it (the kill came late)"
            }
        ),
    );

    // While no process reads the slot: an update of many rows in one transaction, more inserts.
    sqlx::query(&format!(
        "UPDATE {app}.orders SET n = n + 1, note = 'updated' WHERE id < $1"
    ))
    .bind(1 + updated)
    .execute(&ctx.pg)
    .await?;
    expected.extend((1..=updated).map(|id| format!("update:{id}")));
    for _ in 0..5 {
        insert(ctx, app, next_id, rows_each, "while down").await?;
        expected.extend((next_id..next_id + rows_each).map(|id| format!("insert:{id}")));
        next_id += rows_each;
    }
    report.note(
        "changes committed",
        format!(
            "{} ({small} transactions of {rows_each} inserts, one of {large} inserts (ids {large_first}..), one of {updated} updates and 5 of {rows_each} inserts while no process ran)",
            expected.len()
        ),
    );

    let b = sheaf::spawn(ctx, "cdc", "b", &settings).await?;
    let back_at = b.listening_at;
    report.note(
        "down",
        format!(
            "{} from the kill until sheaf b listened",
            secs(back_at - killed_at)
        ),
    );
    let delivered_at = wait_changes(&receiver, &expected, Duration::from_secs(240)).await;

    // The checks: every change delivered, one event id per change.
    let deliveries = receiver.deliveries();
    let mut ids_per_change: HashMap<String, HashSet<String>> = HashMap::new();
    let mut unexpected = 0;
    for d in deliveries.iter().filter(|d| d.status == 200) {
        match change_key(&d.body) {
            Some(key) if expected.contains(&key) => {
                ids_per_change.entry(key).or_default().insert(d.id.clone());
            }
            _ => unexpected += 1,
        }
    }
    let missing: Vec<&String> = expected
        .iter()
        .filter(|k| !ids_per_change.contains_key(*k))
        .collect();
    let split: Vec<(&String, &HashSet<String>)> = ids_per_change
        .iter()
        .filter(|(_, ids)| ids.len() > 1)
        .collect();
    report.published = expected.len();
    report.delivered = expected.len() - missing.len();
    report.duplicates = receiver.duplicates();
    report.check(
        missing.is_empty(),
        format!(
            "{} committed changes were never delivered (e.g. {:?})",
            missing.len(),
            missing.iter().take(5).collect::<Vec<_>>()
        ),
    );
    report.check(
        split.is_empty(),
        format!(
            "{} changes were published as more than one event (e.g. {:?})",
            split.len(),
            split.iter().take(3).collect::<Vec<_>>()
        ),
    );
    report.check(
        unexpected == 0,
        format!("{unexpected} deliveries were not changes of this scenario"),
    );
    report.recovery = delivered_at.map(|t| t.saturating_duration_since(back_at));
    if let Some(done) = delivered_at {
        let left = expected.len() as f64 - of_large - base;
        report.note(
            "catching up",
            format!(
                "sheaf b read about {left:.0} changes not yet published (and the re-read ones) in {}: {:.0} a second",
                secs(done.saturating_duration_since(back_at)),
                left / done.saturating_duration_since(back_at).as_secs_f64().max(0.001)
            ),
        );
    }
    report.note(
        "recovery",
        "from sheaf b listening until every committed change was delivered",
    );

    // The log holds one event per change. Delivered is not yet searchable: the log shipper
    // moves the outbox to the log store once a second, so the listing is read again until it
    // holds every change or a bound passes.
    let listing = format!("/api/v1/tenants/{TENANT}/events");
    let shipped_by = Instant::now() + Duration::from_secs(30);
    let logged = loop {
        let logged = api.list_all(&b.base(), &listing).await?;
        let ids = logged.iter().filter_map(|e| e["id"].as_str());
        if ids.collect::<HashSet<_>>().len() >= expected.len() || Instant::now() >= shipped_by {
            break logged;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let distinct: HashSet<&str> = logged.iter().filter_map(|e| e["id"].as_str()).collect();
    report.note(
        "events in the log store",
        format!(
            "{} ({} distinct ids) for {} changes",
            logged.len(),
            distinct.len(),
            expected.len()
        ),
    );
    report.check(
        distinct.len() == expected.len(),
        format!(
            "the log holds {} events for {} changes",
            distinct.len(),
            expected.len()
        ),
    );
    report.note(
        "sheaf b counters",
        counters(
            &api,
            &b,
            &[
                PUBLISHED,
                "sheaf_cdc_event_repeats_total",
                "sheaf_cdc_acks_total",
                "sheaf_cdc_restarts_total",
                "sheaf_cdc_publish_failures_total",
            ],
        )
        .await,
    );
    stop_clean(report, b).await?;
    Ok(())
}

/// Inserts `count` rows from `first` in one transaction (one statement).
async fn insert(ctx: &Ctx, app: &str, first: i64, count: i64, note: &str) -> anyhow::Result<()> {
    sqlx::query(&format!(
        "INSERT INTO {app}.orders (id, n, note) SELECT g, g, $3 FROM generate_series($1::bigint, $2::bigint) g"
    ))
    .bind(first)
    .bind(first + count - 1)
    .bind(note)
    .execute(&ctx.pg)
    .await?;
    Ok(())
}

/// `insert:<id>` or `update:<id>` from a delivered change's body.
fn change_key(body: &[u8]) -> Option<String> {
    let change: Value = serde_json::from_slice(body).ok()?;
    let op = change["op"].as_str()?;
    let id = change["new"]["id"].as_i64()?;
    Some(format!("{op}:{id}"))
}

/// Waits until the CDC source of `sheaf` streams (its slot and publication exist), so no change
/// is committed before the slot that must read it.
async fn wait_streaming(api: &Api, sheaf: &SheafProcess) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let state = api
            .readyz(&sheaf.base())
            .await
            .and_then(|(_, body)| body["cdc"]["state"].as_str().map(str::to_owned));
        if state.as_deref() == Some("streaming") {
            return Ok(());
        }
        if Instant::now() > deadline {
            anyhow::bail!("the CDC source did not stream within 60 s (state {state:?})");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Polls `sheaf_cdc_events_published_total` until it reaches `target`; returns the last value.
async fn wait_published(
    api: &Api,
    sheaf: &SheafProcess,
    target: f64,
    timeout: Duration,
) -> anyhow::Result<f64> {
    let deadline = Instant::now() + timeout;
    loop {
        let page = api.metrics(&sheaf.base()).await?;
        let published = metric(&page, PUBLISHED).unwrap_or(0.0);
        if published >= target {
            return Ok(published);
        }
        if Instant::now() > deadline {
            anyhow::bail!(
                "the CDC source published {published} events, not {target}, within {timeout:?}"
            );
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Waits until every expected change reached the receiver; returns when (None: not all did).
async fn wait_changes(
    receiver: &Receiver,
    expected: &HashSet<String>,
    timeout: Duration,
) -> Option<Instant> {
    let deadline = Instant::now() + timeout;
    loop {
        let deliveries = receiver.deliveries();
        let mut first: HashMap<String, Instant> = HashMap::new();
        for d in deliveries.iter().filter(|d| d.status == 200) {
            if let Some(key) = change_key(&d.body) {
                let t = first.entry(key).or_insert(d.answered);
                *t = (*t).min(d.answered);
            }
        }
        if expected.iter().all(|k| first.contains_key(k)) {
            return expected.iter().filter_map(|k| first.get(k)).max().copied();
        }
        if Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Drops the scenario's slot (a killed process's walsender may still hold it: see
/// `drop_replication_slot`) and its publication.
async fn drop_slot(ctx: &Ctx, slot: &str) -> anyhow::Result<()> {
    let dropped = drop_replication_slot(&ctx.pg, slot, Duration::from_secs(10))
        .await
        .context("cannot drop the scenario's replication slot")?;
    if !dropped {
        println!("  replication slot {slot} is still in use after 10 s: drop it by hand");
    }
    sqlx::query(&format!("DROP PUBLICATION IF EXISTS {slot}"))
        .execute(&ctx.pg)
        .await?;
    Ok(())
}
