//! The scenarios, and what they share: reading the queue table directly, waiting for the
//! receiver, and the checks every scenario ends with.

mod broker;
mod cdc;
mod clickhouse;
mod clickhouse_replica;
mod disabled;
mod jetstream;
mod kill;
mod nats_node;
mod ordering;
mod outage;
mod overload;
mod postgres;
mod secrets;
mod sheaf_process;
mod shutdown;
mod sqlite;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use sheaf_testenv::process::SheafProcess;
use sheaf_testenv::receiver::Receiver;

use crate::api::{Api, Published, metric};
use crate::env::Ctx;
use crate::report::{Report, secs};

/// Every scenario, in the order `all` runs them (the list xtask checks names against).
pub use sheaf_testenv::scenarios::CHAOS as NAMES;

/// The `'static` spelling of a scenario name.
pub fn static_name(name: &str) -> &'static str {
    NAMES.iter().copied().find(|n| *n == name).unwrap_or("?")
}

/// Runs one scenario.
pub async fn run(ctx: &Ctx, name: &str) -> anyhow::Result<Report> {
    match name {
        "kill" => Box::pin(kill::run(ctx)).await,
        "ordering" => Box::pin(ordering::run(ctx)).await,
        "postgres" => Box::pin(postgres::run(ctx)).await,
        "clickhouse" => Box::pin(clickhouse::run(ctx)).await,
        "clickhouse-replica" => Box::pin(clickhouse_replica::run(ctx)).await,
        "nats-node" => Box::pin(nats_node::run(ctx)).await,
        "sheaf-process" => Box::pin(sheaf_process::run(ctx)).await,
        "shutdown" => Box::pin(shutdown::run(ctx)).await,
        "cdc" => Box::pin(cdc::run(ctx)).await,
        "broker" => Box::pin(broker::run(ctx)).await,
        "outage" => Box::pin(outage::run(ctx)).await,
        "disabled" => Box::pin(disabled::run(ctx)).await,
        "overload" => Box::pin(overload::run(ctx)).await,
        "secrets" => Box::pin(secrets::run(ctx)).await,
        "sqlite" => Box::pin(sqlite::run(ctx)).await,
        other => anyhow::bail!("unknown scenario {other}"),
    }
}

/// The tenant every scenario publishes as.
const TENANT: &str = "chaos";

/// How long the receiver may take to see every accepted event once the load is over. Generous
/// on purpose: the checks are about what is lost, not about how fast it arrives.
const SETTLE: Duration = Duration::from_secs(180);

/// Event ids `<scenario>-00000` ….
fn event_ids(scenario: &str, count: usize) -> Vec<String> {
    (0..count).map(|i| format!("{scenario}-{i:05}")).collect()
}

/// A job whose lease is running, as read from the queue table.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Leased {
    job_id: String,
    event_id: String,
    claimed_until: String,
}

/// Jobs whose lease is still running (`claimed_until` in the future), read from the queue table.
async fn claimed_jobs(ctx: &Ctx, schema: &str) -> anyhow::Result<Vec<Leased>> {
    let rows = sqlx::query_as::<_, (String, String, String)>(&format!(
        "SELECT id::text, event_id, claimed_until::text FROM {schema}.jobs WHERE claimed_until > now()"
    ))
    .fetch_all(&ctx.pg)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(job_id, event_id, claimed_until)| Leased {
            job_id,
            event_id,
            claimed_until,
        })
        .collect())
}

/// When the stranded claims' events reached the receiver after the kill, and how many of them
/// had reached it before (the victim delivered them but died before recording it: those are
/// the duplicates at-least-once allows). `victim` names the killed process (`sheaf a`).
fn stranded_recovery(
    stranded: &[String],
    receiver: &Receiver,
    killed_at: Instant,
    victim: &str,
) -> (usize, String) {
    if stranded.is_empty() {
        return (
            0,
            format!("none were stranded (the kill found {victim} between claims)"),
        );
    }
    let wanted: HashSet<&String> = stranded.iter().collect();
    let mut after: HashMap<&str, Instant> = HashMap::new();
    let mut before = HashSet::new();
    let deliveries = receiver.deliveries();
    for d in deliveries
        .iter()
        .filter(|d| d.status == 200 && wanted.contains(&d.id))
    {
        if d.answered < killed_at {
            before.insert(d.id.as_str());
        } else {
            let t = after.entry(d.id.as_str()).or_insert(d.answered);
            *t = (*t).min(d.answered);
        }
    }
    let times: Vec<Duration> = after
        .values()
        .map(|t| t.saturating_duration_since(killed_at))
        .collect();
    let text = match (times.iter().min(), times.iter().max()) {
        (Some(min), Some(max)) => format!(
            "{} of {}, between {} and {} after the kill ({} of them had been delivered by {victim} just before it died)",
            times.len(),
            stranded.len(),
            secs(*min),
            secs(*max),
            before.len()
        ),
        _ => format!(
            "0 of {} after the kill ({} had been delivered before it)",
            stranded.len(),
            before.len()
        ),
    };
    (times.len(), text)
}

/// Jobs left in the queue.
async fn jobs_left(ctx: &Ctx, schema: &str) -> anyhow::Result<i64> {
    Ok(
        sqlx::query_scalar::<_, i64>(&format!("SELECT count(*) FROM {schema}.jobs"))
            .fetch_one(&ctx.pg)
            .await?,
    )
}

/// Dead-lettered jobs.
async fn dead_letters(ctx: &Ctx, schema: &str) -> anyhow::Result<i64> {
    Ok(
        sqlx::query_scalar::<_, i64>(&format!("SELECT count(*) FROM {schema}.dead_letters"))
            .fetch_one(&ctx.pg)
            .await?,
    )
}

/// Waits until `delivered()` reaches `target`, at most `timeout`; returns whether it did.
async fn wait_until(timeout: Duration, mut reached: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if reached() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    reached()
}

/// The checks every publishing scenario ends with, once its load is over: every event accepted
/// (the publisher gave up on none), every accepted event delivered, the queue drained with no
/// dead letter. Fills in the report's figures.
async fn settle(
    ctx: &Ctx,
    report: &mut Report,
    schema: &str,
    receiver: &Receiver,
    published: &Published,
) -> anyhow::Result<()> {
    settle_deliveries(report, receiver, published).await;
    drained(ctx, report, schema).await
}

/// The first half of [`settle`], for a queue that is not in Postgres: every event accepted,
/// every accepted event delivered (waiting up to [`SETTLE`]); fills in the report's figures.
async fn settle_deliveries(report: &mut Report, receiver: &Receiver, published: &Published) {
    report.check(
        published.gave_up.is_empty(),
        format!(
            "the publisher gave up on {} events no process would accept",
            published.gave_up.len()
        ),
    );
    let missing = receiver.wait_for(published.accepted.keys(), SETTLE).await;
    if !missing.is_empty() {
        println!(
            "  {} accepted events still undelivered after {SETTLE:?}",
            missing.len()
        );
    }
    report.deliveries(
        &published.accepted,
        &receiver.first_successes(),
        receiver.duplicates(),
    );
}

/// The checks every scenario ends with once everything is delivered: no job left in the
/// queue, none dead-lettered, and the outbox shipped to the log store.
async fn drained(ctx: &Ctx, report: &mut Report, schema: &str) -> anyhow::Result<()> {
    // Completions are written a few milliseconds after the delivery; give them a moment.
    let mut left = jobs_left(ctx, schema).await?;
    for _ in 0..100 {
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        left = jobs_left(ctx, schema).await?;
    }
    report.check(
        left == 0,
        format!("{left} jobs are still queued at the end"),
    );
    let dead = dead_letters(ctx, schema).await?;
    report.check(dead == 0, format!("{dead} jobs were dead-lettered"));
    // The log shipper moves events and attempts on to ClickHouse behind the deliveries.
    let started = Instant::now();
    let mut waiting = outbox_rows(ctx, schema).await?;
    while waiting > 0 && started.elapsed() < OUTBOX_DRAIN {
        tokio::time::sleep(Duration::from_millis(100)).await;
        waiting = outbox_rows(ctx, schema).await?;
    }
    report.note(
        "outbox drained",
        format!("{waiting} rows left after {}", secs(started.elapsed())),
    );
    report.check(
        waiting == 0,
        format!("{waiting} events and attempts still wait in the outbox after {OUTBOX_DRAIN:?}"),
    );
    Ok(())
}

/// How long the outbox may take to drain once the load is over and the log store answers.
const OUTBOX_DRAIN: Duration = Duration::from_secs(60);

/// Events and attempts in the outbox, not yet shipped to the log store.
async fn outbox_rows(ctx: &Ctx, schema: &str) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar::<_, i64>(&format!(
        "SELECT (SELECT count(*) FROM {schema}.outbox_events)
              + (SELECT count(*) FROM {schema}.outbox_attempts)"
    ))
    .fetch_one(&ctx.pg)
    .await?)
}

/// Checks that every accepted event is in the log store, read back through the API.
async fn check_events_logged(
    report: &mut Report,
    api: &Api,
    sheaf: &SheafProcess,
    published: &Published,
) -> anyhow::Result<()> {
    let logged: HashSet<String> = api
        .list_all(&sheaf.base(), &format!("/api/v1/tenants/{TENANT}/events"))
        .await?
        .iter()
        .filter_map(|e| e["id"].as_str().map(str::to_owned))
        .collect();
    let missing = published
        .accepted
        .keys()
        .filter(|id| !logged.contains(*id))
        .count();
    report.note(
        "accepted events found in the log store",
        format!(
            "{} of {}",
            published.accepted.len() - missing,
            published.accepted.len()
        ),
    );
    report.check(
        missing == 0,
        format!("{missing} accepted events are missing from the log store"),
    );
    Ok(())
}

/// Events with at least one successful attempt in the log store, read back through the API.
async fn events_with_logged_success(
    api: &Api,
    sheaf: &SheafProcess,
) -> anyhow::Result<HashSet<String>> {
    Ok(api
        .list_all(
            &sheaf.base(),
            &format!("/api/v1/tenants/{TENANT}/attempts?status=success"),
        )
        .await?
        .iter()
        .filter_map(|a| a["event_id"].as_str().map(str::to_owned))
        .collect())
}

/// Log lines of `sheaf` containing `needle`.
fn log_lines(sheaf: &SheafProcess, needle: &str) -> usize {
    sheaf.log().lines().filter(|l| l.contains(needle)).count()
}

/// A few counters of one process, as `name value, …`.
/// How a crash scenario ends on the process that survived the kill at `killed_at`: the
/// recovery (from the kill until every event accepted before it was delivered), the publishes
/// refused, the survivor's `counted` metrics; then it must stop cleanly, and the stores go.
async fn after_the_kill(
    ctx: &Ctx,
    mut report: Report,
    (api, survivor, schema): (&Api, SheafProcess, &str),
    (killed_at, published, receiver): (std::time::Instant, &Published, &Receiver),
    counted: &[&str],
) -> anyhow::Result<Report> {
    report.recovery =
        crate::report::recovery_after(killed_at, &published.accepted, &receiver.first_successes());
    report.note(
        "recovery",
        "from the kill until every event accepted before it was delivered",
    );
    report.note(
        "publishes refused (retried on sheaf b)",
        published.refused_text(),
    );
    report.note("sheaf b counters", counters(api, &survivor, counted).await);
    stop_clean(&mut report, survivor).await?;
    cleanup(ctx, &mut report, schema).await?;
    Ok(report)
}

async fn counters(api: &Api, sheaf: &SheafProcess, names: &[&str]) -> String {
    match api.metrics(&sheaf.base()).await {
        Ok(page) => names
            .iter()
            .map(|n| format!("{n} {}", metric(&page, n).unwrap_or(0.0)))
            .collect::<Vec<_>>()
            .join(", "),
        Err(err) => format!("(no metrics: {err})"),
    }
}

/// Stops a scenario's last process gracefully and checks it exited cleanly.
async fn stop_clean(report: &mut Report, sheaf: SheafProcess) -> anyhow::Result<()> {
    let name = sheaf.name.clone();
    let exited = sheaf.stop(crate::sheaf::STOP_TIMEOUT).await?;
    report.check(
        exited.status.success(),
        format!("sheaf {name} exited with {} after SIGTERM", exited.status),
    );
    Ok(())
}

/// Drops a scenario's schema and database when it passed; keeps them for inspection (and says
/// so) when it failed.
async fn cleanup(ctx: &Ctx, report: &mut Report, schema: &str) -> anyhow::Result<()> {
    if report.passed() {
        ctx.drop_stores(schema, schema).await
    } else {
        report.note(
            "kept for inspection",
            format!(
                "postgres schema and clickhouse database {schema} on the fault suite's servers; `cargo xtask chaos-ctl postgres start` and `cargo xtask chaos-ctl clickhouse start` bring them up to look"
            ),
        );
        Ok(())
    }
}
