//! `clickhouse-replica`: the log on a ClickHouse cluster of 2 shards × 2 replicas (the fault
//! suite's own, started for this scenario alone), and one replica SIGKILLed under load for 30 s
//! (5 s with `--quick`), then started again with its configuration, ports and data.
//!
//! The cluster's replicas are written by the `Distributed` tables themselves, which wait for
//! every replica (`distributed_foreground_insert`): with one replica down every log write fails
//! at once and the shipper keeps the records in the Postgres outbox, while reads go to the
//! shard's other replica. So while the replica is down the scenario requires that publishes are
//! accepted (none refused), deliveries go on, and searches through the API (the tenant's events
//! and attempts) answer; the receiver fails every fifth request, so retries look up their
//! previous attempts through the `Distributed` tables meanwhile. After the load: every accepted
//! event delivered, the outbox drained, every event and every attempt the receiver answered in
//! the log read back through the API, and, read on each node directly from its local tables,
//! both replicas of each shard holding the same events and attempts: the restarted replica lost
//! nothing and missed nothing while it was down.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use reqwest::Method;
use sheaf_testenv::process::SheafProcess;
use sheaf_testenv::receiver::{Failing, Receiver};

use crate::api::{
    Api, PROBE_TIMEOUT, Pace, Published, ReadyzProbe, Targets, metric, publish_paced, readiness,
};
use crate::env::Ctx;
use crate::report::{Report, at, recovery_after, secs};
use crate::sheaf;

use super::{
    OUTBOX_DRAIN, TENANT, check_events_logged, event_ids, events_with_logged_success, outbox_rows,
    settle, stop_clean,
};

/// The node `sheaf` sends its queries to (`SHEAF_CLICKHOUSE_URL`): shard 1, replica 1.
const QUERIED: usize = 0;
/// The node killed: the other replica of the queried node's shard, so the queries' own shard
/// has to answer from its survivor.
const VICTIM: usize = 1;
const VICTIM_NAME: &str = "shard1-replica2";
/// Replicas per shard, in the order of the node list.
const REPLICAS: usize = 2;

pub async fn run(ctx: &Ctx) -> anyhow::Result<Report> {
    let mut report = Report::new("clickhouse-replica");
    let took = ctx.ctl(&["clickhouse-cluster", "up"]).await?;
    report.note(
        "cluster",
        format!(
            "{} ({} nodes, 2 shards × 2 replicas) started in {}",
            ctx.clickhouse_cluster.name,
            ctx.clickhouse_cluster.nodes.len(),
            secs(took)
        ),
    );
    let outcome = Box::pin(on_the_cluster(ctx, &mut report)).await;
    // Down whatever happened: the nodes are this scenario's alone.
    let down = ctx.ctl(&["clickhouse-cluster", "down"]).await;
    outcome?;
    down?;
    Ok(report)
}

/// The scenario's sizes: events, per second, load before the kill, time the replica stays down.
fn sizes(quick: bool) -> (usize, f64, Duration, Duration) {
    if quick {
        (400, 40.0, Duration::from_secs(3), Duration::from_secs(5))
    } else {
        (2_000, 40.0, Duration::from_secs(8), Duration::from_secs(30))
    }
}

/// The suite's settings with the log on the cluster, queried through [`QUERIED`].
fn cluster_settings(ctx: &Ctx, schema: &str) -> Vec<(String, String)> {
    let cluster = &ctx.clickhouse_cluster;
    let mut settings = ctx.sheaf_settings(schema, schema);
    for (name, value) in &mut settings {
        if name == "SHEAF_CLICKHOUSE_URL" {
            value.clone_from(&cluster.nodes[QUERIED]);
        }
    }
    settings.push(("SHEAF_CLICKHOUSE_CLUSTER".to_owned(), cluster.name.clone()));
    settings.push((
        "SHEAF_CLICKHOUSE_CLUSTER_NODES".to_owned(),
        cluster.nodes.join(","),
    ));
    settings
}

async fn on_the_cluster(ctx: &Ctx, report: &mut Report) -> anyhow::Result<()> {
    anyhow::ensure!(
        ctx.clickhouse_cluster.nodes.len() == 2 * REPLICAS,
        "the fault suite's cluster should have 4 nodes, not {:?}",
        ctx.clickhouse_cluster.nodes
    );
    let (events, rate, before, down_for) = sizes(ctx.quick);
    let schema = ctx.unique("replica");
    let receiver = Receiver::builder()
        .delay(Duration::from_millis(20))
        .failing(Failing::EveryNth(5))
        .start()
        .await?;
    let mut a = sheaf::spawn(
        ctx,
        "clickhouse-replica",
        "a",
        &cluster_settings(ctx, &schema),
    )
    .await?;
    let api = Api::new(Duration::from_secs(10))?;
    api.tenant_with_destination(&a.base(), TENANT, &receiver.url())
        .await?;
    let probe = ReadyzProbe::start(Api::new(PROBE_TIMEOUT)?, a.base());
    let t0 = Instant::now();
    let load = publish_paced(
        api.clone(),
        Targets::new(&[a.base()]),
        TENANT.to_owned(),
        "clickhouse-replica",
        event_ids("replica", events),
        Pace {
            rate,
            concurrency: 16,
            give_up_after: Duration::from_secs(240),
        },
    );
    tokio::time::sleep(before).await;
    let before_page = api.metrics(&a.base()).await?;
    let outage = replica_down(ctx, report, (&api, &a), &schema, down_for, t0).await?;
    let published = load.await?;
    settle(ctx, report, &schema, &receiver, &published).await?;
    let end_page = api.metrics(&a.base()).await?;

    while_down(report, &outage, &published, &receiver);
    let samples = probe.finish().await;
    let seen = readiness(&samples, outage.killed_at);
    report.note(
        "/readyz",
        if seen.unready_at.is_none() {
            format!("200 throughout ({} probes)", samples.len())
        } else {
            format!("not 200 after the kill: {}", seen.answers_text())
        },
    );
    report.check(
        seen.unready_at.is_none(),
        "/readyz stopped answering 200 while only a replica was down",
    );
    report.check(a.running(), "sheaf exited while the replica was down");
    writes_and_retries(report, &before_page, &outage.page, &end_page);
    report.recovery = recovery_after(
        outage.back_at,
        &published.accepted,
        &receiver.first_successes(),
    );
    report.note(
        "recovery",
        "from the replica back until every event accepted before was delivered",
    );

    check_events_logged(report, &api, &a, &published).await?;
    let requests = receiver.deliveries().len();
    check_attempts_logged(report, &api, &a, &published, requests).await?;
    replicas_agree(ctx, report, &schema, &published, requests).await?;
    stop_clean(report, a).await?;
    cleanup(ctx, report, &schema).await
}

/// What happened while the replica was down.
struct Outage {
    killed_at: Instant,
    back_at: Instant,
    /// The process's metrics just before the replica was started again.
    page: String,
    searches: Searches,
}

/// Kills the victim, watches the service for `down_for`, starts the victim again (also when
/// the watching failed: the cluster must be whole for the checks), and waits until the outbox
/// has shipped everything it held when the victim came back.
async fn replica_down(
    ctx: &Ctx,
    report: &mut Report,
    (api, a): (&Api, &SheafProcess),
    schema: &str,
    down_for: Duration,
    t0: Instant,
) -> anyhow::Result<Outage> {
    ctx.ctl(&["clickhouse-cluster", "kill", VICTIM_NAME])
        .await?;
    let killed_at = Instant::now();
    let searches = watch(ctx, api, &a.base(), schema, killed_at + down_for).await;
    let page = api.metrics(&a.base()).await;
    let backlog = outbox_backlog(ctx, schema).await;
    let started = ctx.ctl(&["clickhouse-cluster", "start", VICTIM_NAME]).await;
    let back_at = Instant::now();
    let searches = searches?;
    let (page, backlog, took) = (page?, backlog?, started?);
    report.note(
        "replica down",
        format!(
            "{VICTIM_NAME} (node {VICTIM}) SIGKILLed at {}, answering again at {} ({} down, of which {} starting again)",
            at(t0, killed_at),
            at(t0, back_at),
            secs(back_at - killed_at),
            secs(took)
        ),
    );
    report.note(
        "outbox while the replica was down",
        format!(
            "up to {} events and attempts waiting; at its end {} events and {} attempts, the oldest {:.1} s old",
            searches.outbox_peak,
            metric(&page, "sheaf_outbox_events").unwrap_or(0.0),
            metric(&page, "sheaf_outbox_attempts").unwrap_or(0.0),
            metric(&page, "sheaf_outbox_oldest_seconds").unwrap_or(0.0),
        ),
    );
    let shipped = backlog_shipped(ctx, schema, backlog).await?;
    report.note(
        "outbox backlog shipped",
        shipped.map_or_else(
            || format!("not within {}", secs(OUTBOX_DRAIN)),
            |d| format!("{} after the replica answered again", secs(d)),
        ),
    );
    report.check(
        shipped.is_some(),
        format!(
            "the records waiting when the replica came back were not shipped within {OUTBOX_DRAIN:?}"
        ),
    );
    Ok(Outage {
        killed_at,
        back_at,
        page,
        searches,
    })
}

/// Searches made through the API while the replica was down, and the outbox meanwhile.
#[derive(Debug, Default)]
struct Searches {
    answered: usize,
    /// Answers other than 200, and requests without an answer, as text.
    failed: Vec<String>,
    slowest: Duration,
    /// Events in the last answered page of the event list.
    last_events: usize,
    outbox_peak: i64,
}

/// Until `until`: every half second, one page of the tenant's events and one of its failed
/// attempts through the API, and the outbox's size.
async fn watch(
    ctx: &Ctx,
    api: &Api,
    base: &str,
    schema: &str,
    until: Instant,
) -> anyhow::Result<Searches> {
    let mut seen = Searches::default();
    let paths = [
        format!("/api/v1/tenants/{TENANT}/events?limit=100"),
        format!("/api/v1/tenants/{TENANT}/attempts?status=failed&limit=100"),
    ];
    while Instant::now() < until {
        for path in &paths {
            let began = Instant::now();
            match api.call(Method::GET, base, path, None).await {
                Ok((200, body)) => {
                    seen.answered += 1;
                    seen.slowest = seen.slowest.max(began.elapsed());
                    if path.contains("/events") {
                        seen.last_events = body["items"].as_array().map_or(0, Vec::len);
                    }
                }
                Ok((status, body)) => seen.failed.push(format!("{path}: {status} {body}")),
                Err(err) => seen.failed.push(format!("{path}: {err}")),
            }
        }
        seen.outbox_peak = seen.outbox_peak.max(outbox_rows(ctx, schema).await?);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(seen)
}

/// The checks of what went on while the replica was down: publishes accepted, deliveries made,
/// searches answered.
fn while_down(report: &mut Report, outage: &Outage, published: &Published, receiver: &Receiver) {
    let during = |t: &Instant| *t >= outage.killed_at && *t <= outage.back_at;
    let accepted = published.accepted.values().filter(|t| during(t)).count();
    let deliveries = receiver.deliveries();
    let delivered = deliveries
        .iter()
        .filter(|d| d.status == 200 && during(&d.answered))
        .count();
    let requests = deliveries.iter().filter(|d| during(&d.answered)).count();
    report.note(
        "while the replica was down",
        format!(
            "{accepted} events accepted, {delivered} delivered ({requests} requests, retries among them)"
        ),
    );
    report.check(
        accepted > 0,
        "no publish was accepted while the replica was down",
    );
    report.check(
        delivered > 0,
        "no delivery was made while the replica was down",
    );
    report.note(
        "publishes refused (retried)",
        format!(
            "{} ({})",
            published.refused_total(),
            published.refused_text()
        ),
    );
    report.check(
        published.refused_total() == 0,
        format!(
            "{} publishes were refused; the outbox should have taken them",
            published.refused_total()
        ),
    );
    let searches = &outage.searches;
    report.note(
        "searches while the replica was down",
        format!(
            "{} answered 200 (the slowest in {} ms; the last event page held {} events), {} failed",
            searches.answered,
            searches.slowest.as_millis(),
            searches.last_events,
            searches.failed.len()
        ),
    );
    report.check(
        searches.answered > 0 && searches.failed.is_empty(),
        format!(
            "searches failed while the replica was down: {:?}",
            searches.failed.iter().take(3).collect::<Vec<_>>()
        ),
    );
}

/// The shipper's and the retries' figures; with a replica down every write must have failed at
/// least once, or the fault did not reach the log.
fn writes_and_retries(report: &mut Report, before: &str, during: &str, end: &str) {
    let count = |page: &str, name: &str| metric(page, name).unwrap_or(0.0);
    let failed_shipments = count(during, "sheaf_shipment_failures_total")
        - count(before, "sheaf_shipment_failures_total");
    report.note(
        "log writes",
        format!(
            "{} failed (of {} issued), {failed_shipments} shipments failed while the replica was down and were tried again; {} events and {} attempts shipped",
            count(end, "sheaf_log_write_failures_total"),
            count(end, "sheaf_log_writes_total"),
            count(end, "sheaf_events_shipped_total"),
            count(end, "sheaf_attempts_shipped_total"),
        ),
    );
    report.check(
        failed_shipments > 0.0,
        "no shipment failed while the replica was down (the fault did not reach the log)",
    );
    // Reads work, but a retry's previous attempt waits in the outbox with the rest, so its
    // lookup misses it and the retry waits (`not_ready`) until the attempt is shipped.
    let not_ready = "sheaf_deliveries_total{outcome=\"not_ready\"}";
    report.note(
        "retries",
        format!(
            "{} scheduled; {} waits (`not_ready`) while the replica was down, for previous attempts still in the outbox; {} dead-lettered",
            count(end, "sheaf_retries_total"),
            count(during, not_ready) - count(before, not_ready),
            count(end, "sheaf_deliveries_total{outcome=\"dead_lettered\"}"),
        ),
    );
}

/// The outbox's newest rows (event and attempt `seq`) at a moment.
async fn outbox_backlog(ctx: &Ctx, schema: &str) -> anyhow::Result<(i64, i64)> {
    Ok(sqlx::query_as::<_, (i64, i64)>(&format!(
        "SELECT (SELECT coalesce(max(seq), 0) FROM {schema}.outbox_events),
                (SELECT coalesce(max(seq), 0) FROM {schema}.outbox_attempts)"
    ))
    .fetch_one(&ctx.pg)
    .await?)
}

/// How long until no row up to `backlog` is left in the outbox (at most [`OUTBOX_DRAIN`]).
async fn backlog_shipped(
    ctx: &Ctx,
    schema: &str,
    (events, attempts): (i64, i64),
) -> anyhow::Result<Option<Duration>> {
    let started = Instant::now();
    while started.elapsed() < OUTBOX_DRAIN {
        let left = sqlx::query_scalar::<_, i64>(&format!(
            "SELECT (SELECT count(*) FROM {schema}.outbox_events WHERE seq <= $1)
                  + (SELECT count(*) FROM {schema}.outbox_attempts WHERE seq <= $2)"
        ))
        .bind(events)
        .bind(attempts)
        .fetch_one(&ctx.pg)
        .await?;
        if left == 0 {
            return Ok(Some(started.elapsed()));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(None)
}

/// Every request the receiver answered is an attempt in the log, and every event's successful
/// attempt is among them, read back through the API.
async fn check_attempts_logged(
    report: &mut Report,
    api: &Api,
    a: &SheafProcess,
    published: &Published,
    requests: usize,
) -> anyhow::Result<()> {
    let logged = api
        .list_all(&a.base(), &format!("/api/v1/tenants/{TENANT}/attempts"))
        .await?
        .len();
    report.note(
        "attempts in the log store",
        format!("{logged} of the {requests} requests the receiver answered"),
    );
    report.check(
        logged >= requests,
        format!(
            "{} attempts are missing from the log store",
            requests.saturating_sub(logged)
        ),
    );
    let succeeded = events_with_logged_success(api, a).await?;
    let unlogged = published
        .accepted
        .keys()
        .filter(|id| !succeeded.contains(*id))
        .count();
    report.check(
        unlogged == 0,
        format!("{unlogged} delivered events have no successful attempt in the log"),
    );
    Ok(())
}

/// The scenario's event ids and attempt ids in one node's local tables.
async fn held_by(
    ctx: &Ctx,
    node: &str,
    database: &str,
) -> anyhow::Result<(BTreeSet<String>, BTreeSet<String>)> {
    let ids = |sql: String| async move {
        let text = ctx.clickhouse_at(node, &sql).await?;
        anyhow::Ok(text.lines().map(str::to_owned).collect::<BTreeSet<_>>())
    };
    let events = ids(format!(
        "SELECT DISTINCT event_id FROM {database}.events_local WHERE tenant_id = '{TENANT}' FORMAT TabSeparated"
    ))
    .await?;
    let attempts = ids(format!(
        "SELECT DISTINCT toString(attempt_id) FROM {database}.attempts_local WHERE tenant_id = '{TENANT}' FORMAT TabSeparated"
    ))
    .await?;
    Ok((events, attempts))
}

/// Read on every node from its local tables: both replicas of a shard hold the same events and
/// attempts (the restarted one caught up and lost nothing), and the shards together hold every
/// accepted event and an attempt for every request the receiver answered.
async fn replicas_agree(
    ctx: &Ctx,
    report: &mut Report,
    database: &str,
    published: &Published,
    requests: usize,
) -> anyhow::Result<()> {
    let nodes = &ctx.clickhouse_cluster.nodes;
    let mut held = Vec::with_capacity(nodes.len());
    for node in nodes {
        held.push(held_by(ctx, node, database).await?);
    }
    let name = |i: usize| {
        let victim = if i == VICTIM {
            ", killed and restarted"
        } else {
            ""
        };
        format!(
            "shard{}-replica{}{victim}",
            i / REPLICAS + 1,
            i % REPLICAS + 1
        )
    };
    let counts: Vec<String> = held
        .iter()
        .enumerate()
        .map(|(i, (events, attempts))| {
            format!(
                "{} events, {} attempts ({})",
                events.len(),
                attempts.len(),
                name(i)
            )
        })
        .collect();
    report.note("on each node", counts.join("; "));
    for (shard, replicas) in held.chunks(REPLICAS).enumerate() {
        let [(events_1, attempts_1), (events_2, attempts_2)] = replicas else {
            anyhow::bail!("shard {} does not have {REPLICAS} replicas", shard + 1);
        };
        let differ = |a: &BTreeSet<String>, b: &BTreeSet<String>| {
            (a.difference(b).count(), b.difference(a).count())
        };
        let (events_only_1, events_only_2) = differ(events_1, events_2);
        let (attempts_only_1, attempts_only_2) = differ(attempts_1, attempts_2);
        report.check(
            events_only_1 + events_only_2 + attempts_only_1 + attempts_only_2 == 0,
            format!(
                "the replicas of shard {} differ: {events_only_1} events and {attempts_only_1} attempts only on replica 1, {events_only_2} events and {attempts_only_2} attempts only on replica 2",
                shard + 1
            ),
        );
    }
    let all_events: BTreeSet<&String> = held.iter().flat_map(|(events, _)| events).collect();
    let all_attempts: BTreeSet<&String> = held.iter().flat_map(|(_, attempts)| attempts).collect();
    let missing = published
        .accepted
        .keys()
        .filter(|id| !all_events.contains(id))
        .count();
    report.check(
        missing == 0,
        format!("{missing} accepted events are on no node"),
    );
    report.check(
        all_attempts.len() >= requests,
        format!(
            "the nodes hold {} attempts, fewer than the {requests} requests the receiver answered",
            all_attempts.len()
        ),
    );
    let (shard_1, shard_2) = (&held[0].0, &held[REPLICAS].0);
    report.check(shard_1.is_disjoint(shard_2), "an event is on both shards");
    Ok(())
}

/// Drops the scenario's Postgres schema and its database on every node when it passed; keeps
/// them for inspection (and says so) when it failed.
async fn cleanup(ctx: &Ctx, report: &mut Report, schema: &str) -> anyhow::Result<()> {
    if !report.passed() {
        report.note(
            "kept for inspection",
            format!(
                "postgres schema {schema} on the fault suite's postgres and clickhouse database {schema} on every node of its cluster; `cargo xtask chaos-ctl postgres start` and `cargo xtask chaos-ctl clickhouse-cluster up` bring them up to look"
            ),
        );
        return Ok(());
    }
    sqlx::query(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
        .execute(&ctx.pg)
        .await?;
    for node in &ctx.clickhouse_cluster.nodes {
        ctx.clickhouse_at(node, &format!("DROP DATABASE IF EXISTS {schema}"))
            .await?;
    }
    Ok(())
}
