//! `burst`: the retry-lookup experiment (docs/benchmarks.md, "`burst`", with its earlier
//! measurements) scaled to this machine, through a real `sheaf serve` process on ClickHouse
//! (log) and Postgres (queue, tenants), again with the log on the ClickHouse cluster of
//! `services up --cluster` (2 shards × 2 replicas), then on the SQLite store (the default),
//! whose retries go through the same coalesced lookup.
//!
//! Events are published at a steady rate for 60 s (full size) to one webhook that answers 503
//! for the first 20 s and 200 after, with a retry schedule of 1 s, 5 s, 15 s, 30 s (the original
//! experiment's climb, compressed so every retry lands within the run). The run is repeated with
//! a fresh process, schema and database for each retry-lookup setting: coalescing off
//! (`SHEAF_RETRY_LOOKUP_BATCH_SIZE=0`, one query per retry), a fixed batch of 50 with a 50 ms wait
//! (the original experiment's setting), and adaptive (batch of 50, no wait while no lookup is in
//! flight).
//!
//! Lookup queries, keys and retries come from the process's `/metrics` (on every store);
//! ClickHouse CPU is the `ProfileEvents` user + system time of every query about the run's
//! database in `system.query_log` (on a cluster, every node's, including the queries a node
//! sent the others), per second of the run: the mean and the busiest second. Background merges
//! are not queries and are not in it. Each node's query log also counts the lookups (the
//! `SELECT`s reading `attempts`, or on a cluster `attempts_local`): the initial queries Sheaf
//! sent, and the queries a node running one sent to the other shards (`is_initial_query` 0; a
//! node answers its own shard inside the initial query).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::Serialize;
use sheaf_testenv::receiver::Receiver;

use crate::ch::{self, ChDb};
use crate::context::Ctx;
use crate::load::{self, Pace};
use crate::pg::PgSchema;
use crate::plot::{Figure, Panel};
use crate::progress::Progress;
use crate::report::{self, PeakRss, Report, Table};
use crate::sheaf::{Sheaf, metric};

const QUESTION: &str = "When a webhook fails for the first 20 s of a 60 s publishing run, how many \
    latest-attempt queries do the retries cost ClickHouse, and how much CPU, with lookup \
    coalescing off, fixed (50 keys / 50 ms) and adaptive? How many queries per retry reach the \
    shards when the log is on a ClickHouse cluster? And how many on the SQLite store?";

const PAD_BYTES: usize = 1_000;
const SCHEDULE: &str = "1s,5s,15s,30s";

/// A development knob, for one store without the whole run: a comma-separated subset of
/// `clickhouse,clickhouse-cluster,sqlite`. The figures in docs/benchmarks.md always come from a
/// run without it.
const STORES_VAR: &str = "SHEAF_BENCH_BURST_STORES";

#[derive(Debug, Clone, Copy, Serialize)]
struct Sizes {
    rate: f64,
    seconds: f64,
    failing_seconds: f64,
    drain_limit_s: u64,
}

/// Where the log and the queue are: the original experiment's ClickHouse log with a Postgres
/// queue, the same with the log on the ClickHouse cluster, or the SQLite file (the default),
/// whose lookups are the same coalesced query on an index of the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
enum Store {
    ClickHouse,
    ClickHouseCluster,
    Sqlite,
}

impl Store {
    fn label(self) -> &'static str {
        match self {
            Store::ClickHouse => "ClickHouse + Postgres",
            Store::ClickHouseCluster => "ClickHouse cluster (2 × 2) + Postgres",
            Store::Sqlite => "SQLite",
        }
    }

    fn on_clickhouse(self) -> bool {
        self != Store::Sqlite
    }
}

fn stores() -> anyhow::Result<Vec<Store>> {
    let Ok(list) = std::env::var(STORES_VAR) else {
        return Ok(vec![
            Store::ClickHouse,
            Store::ClickHouseCluster,
            Store::Sqlite,
        ]);
    };
    list.split(',')
        .map(|name| match name.trim() {
            "clickhouse" => Ok(Store::ClickHouse),
            "clickhouse-cluster" => Ok(Store::ClickHouseCluster),
            "sqlite" => Ok(Store::Sqlite),
            other => anyhow::bail!(
                "{STORES_VAR}: unknown store `{other}`; expected clickhouse, clickhouse-cluster or sqlite"
            ),
        })
        .collect()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
enum Variant {
    Off,
    Fixed,
    Adaptive,
}

impl Variant {
    fn label(self) -> &'static str {
        match self {
            Variant::Off => "batching off",
            Variant::Fixed => "batch 50, wait 50 ms",
            Variant::Adaptive => "adaptive, batch 50",
        }
    }

    fn env(self) -> Vec<(&'static str, String)> {
        match self {
            Variant::Off => vec![("SHEAF_RETRY_LOOKUP_BATCH_SIZE", "0".to_owned())],
            Variant::Fixed => vec![
                ("SHEAF_RETRY_LOOKUP_BATCH_SIZE", "50".to_owned()),
                ("SHEAF_RETRY_LOOKUP_BATCH_WAIT", "50ms".to_owned()),
                ("SHEAF_RETRY_LOOKUP_ADAPTIVE", "false".to_owned()),
            ],
            Variant::Adaptive => vec![
                ("SHEAF_RETRY_LOOKUP_BATCH_SIZE", "50".to_owned()),
                ("SHEAF_RETRY_LOOKUP_ADAPTIVE", "true".to_owned()),
            ],
        }
    }
}

#[derive(Debug, Clone, Serialize)]
struct Measured {
    store: Store,
    variant: Variant,
    published: usize,
    delivered: usize,
    webhook_requests: u64,
    webhook_503s: u64,
    retries: f64,
    lookup_keys: f64,
    lookup_queries: f64,
    lookup_batch_queries: f64,
    /// ClickHouse queries of the process that read `attempts` (the lookups), from query_log:
    /// the initial ones, summed over the nodes.
    lookup_queries_logged: u64,
    /// Per node (one on a single server), the lookups it logged: (initial, sent by another
    /// node to its shard).
    lookups_by_node: Vec<NodeLookups>,
    lookup_cpu_s: f64,
    total_cpu_s: f64,
    mean_cpu_percent: f64,
    peak_cpu_percent: f64,
    /// (second of the run, CPU % of ClickHouse spent on this process's queries).
    cpu_series: Vec<(f64, f64)>,
    run_seconds: f64,
    peak_rss_mib: f64,
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<Report> {
    let sizes = Sizes {
        rate: ctx.size(100.0, 20.0),
        seconds: ctx.size(60.0, 5.0),
        failing_seconds: ctx.size(20.0, 2.0),
        drain_limit_s: ctx.size(120, 60),
    };
    let bin = ctx.sheaf_bin()?.to_path_buf();
    let mut measured = Vec::new();
    for store in stores()? {
        for variant in [Variant::Off, Variant::Fixed, Variant::Adaptive] {
            let m = run_variant(ctx, &bin, &sizes, store, variant)
                .await
                .with_context(|| format!("{}, {}", store.label(), variant.label()))?;
            measured.push(m);
        }
    }
    Ok(build_report(ctx, &sizes, measured))
}

#[derive(clickhouse::Row, serde::Deserialize)]
struct CpuSecond {
    second: u32,
    cpu_micros: u64,
    lookup_micros: u64,
}

/// One node's lookups in its `system.query_log`.
#[derive(Debug, Clone, Copy, Default, Serialize, clickhouse::Row, serde::Deserialize)]
struct NodeLookups {
    /// Sent by Sheaf to this node.
    initial: u64,
    /// Sent by another node, answering for this node's shard.
    secondary: u64,
}

async fn run_variant(
    ctx: &Ctx,
    bin: &std::path::Path,
    sizes: &Sizes,
    store: Store,
    variant: Variant,
) -> anyhow::Result<Measured> {
    let base = Instant::now();
    let receiver = Receiver::start().await?;
    let name = format!("burst-{store:?}-{variant:?}").to_lowercase();
    let data_dir = ctx.out_dir.join(format!("{name}-data"));
    let mut servers = None;
    let mut env = match store {
        Store::ClickHouse => {
            let schema = PgSchema::new(ctx.postgres()?, "bench_burst");
            let db = ChDb::new(ctx.clickhouse()?, "bench_burst");
            let env = vec![
                ("SHEAF_LOG_STORE", "clickhouse".to_owned()),
                ("SHEAF_QUEUE", "postgres".to_owned()),
                ("SHEAF_POSTGRES_URL", schema.url.clone()),
                ("SHEAF_POSTGRES_SCHEMA", schema.schema.clone()),
                ("SHEAF_CLICKHOUSE_URL", db.url.clone()),
                ("SHEAF_CLICKHOUSE_DATABASE", db.database.clone()),
            ];
            servers = Some((schema, db));
            env
        }
        Store::ClickHouseCluster => {
            let (cluster, nodes) = ctx.clickhouse_cluster()?;
            let schema = PgSchema::new(ctx.postgres()?, "bench_burst");
            let db = ChDb::on_cluster(nodes, "bench_burst");
            let env = vec![
                ("SHEAF_LOG_STORE", "clickhouse".to_owned()),
                ("SHEAF_QUEUE", "postgres".to_owned()),
                ("SHEAF_POSTGRES_URL", schema.url.clone()),
                ("SHEAF_POSTGRES_SCHEMA", schema.schema.clone()),
                ("SHEAF_CLICKHOUSE_URL", db.url.clone()),
                ("SHEAF_CLICKHOUSE_DATABASE", db.database.clone()),
                ("SHEAF_CLICKHOUSE_CLUSTER", cluster.to_owned()),
                ("SHEAF_CLICKHOUSE_CLUSTER_NODES", nodes.join(",")),
            ];
            servers = Some((schema, db));
            env
        }
        Store::Sqlite => {
            let _ = std::fs::remove_dir_all(&data_dir);
            vec![
                ("SHEAF_LOG_STORE", "sqlite".to_owned()),
                ("SHEAF_DATA_DIR", data_dir.display().to_string()),
            ]
        }
    };
    env.push(("SHEAF_RETRY_SCHEDULE", SCHEDULE.to_owned()));
    env.extend(variant.env());
    let log = ctx.out_dir.join("logs").join(format!("{name}.log"));
    let sheaf = Sheaf::start(bin, &env, &log).await?;
    sheaf.add_destination("bench", &receiver.url()).await?;
    let publisher = sheaf.publisher("bench");
    let pad = Arc::new("x".repeat(PAD_BYTES));

    let count = (sizes.rate * sizes.seconds) as usize;
    let progress = Arc::new(Progress::new(
        format!("burst: {}, {}", store.label(), variant.label()),
        count as u64,
    ));
    let run_start_unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    receiver.fail_until(Instant::now() + Duration::from_secs_f64(sizes.failing_seconds));
    let started = Instant::now();
    let sent = load::publish(
        &publisher,
        base,
        0,
        count,
        Pace::Rate(sizes.rate),
        pad,
        &progress,
    )
    .await;
    progress.finish();
    let accepted = count - (sent.refused + sent.errors) as usize;
    receiver
        .wait_for_count(accepted, Duration::from_secs(sizes.drain_limit_s))
        .await;
    let run_seconds = started.elapsed().as_secs_f64();
    let page = sheaf.metrics().await?;
    let peak_rss_mib = sheaf.peak_rss_kib().unwrap_or(0) as f64 / 1024.0;
    sheaf.stop().await?;
    let (webhook_requests, webhook_503s) = receiver.requests();
    let (webhook_requests, webhook_503s) = (webhook_requests as u64, webhook_503s as u64);

    let (seconds, lookups_by_node) = match &servers {
        Some((_, db)) => clickhouse_queries(db, run_start_unix).await?,
        None => (Vec::new(), Vec::new()),
    };
    let span = run_seconds.ceil().max(1.0) as usize;
    let mut series = vec![0.0; span];
    let (mut total, mut lookup_cpu) = (0u64, 0u64);
    let lookups = lookups_by_node.iter().map(|n| n.initial).sum();
    for s in &seconds {
        total += s.cpu_micros;
        lookup_cpu += s.lookup_micros;
        if let Some(slot) = series.get_mut(s.second as usize) {
            *slot += s.cpu_micros as f64 / 1e6 * 100.0;
        }
    }
    let peak = series.iter().copied().fold(0.0, f64::max);
    drop(servers);
    if store == Store::Sqlite {
        std::fs::remove_dir_all(&data_dir)?;
    }
    Ok(Measured {
        store,
        variant,
        published: accepted,
        delivered: receiver.delivered_count(),
        webhook_requests,
        webhook_503s,
        retries: metric(&page, "sheaf_retries_total", ""),
        lookup_keys: metric(&page, "sheaf_retry_lookup_keys_total", ""),
        lookup_queries: metric(&page, "sheaf_retry_lookup_queries_total", ""),
        lookup_batch_queries: metric(&page, "sheaf_retry_lookup_batch_queries_total", ""),
        lookup_queries_logged: lookups,
        lookups_by_node,
        lookup_cpu_s: lookup_cpu as f64 / 1e6,
        total_cpu_s: total as f64 / 1e6,
        mean_cpu_percent: total as f64 / 1e6 / run_seconds * 100.0,
        peak_cpu_percent: peak,
        cpu_series: series
            .iter()
            .enumerate()
            .map(|(i, v)| (i as f64, *v))
            .collect(),
        run_seconds,
        peak_rss_mib,
    })
}

/// From every node's `system.query_log` (one node on a single server), after `SYSTEM FLUSH
/// LOGS` on each: ClickHouse CPU per second of the run, from every query about the run's
/// database (on a cluster also the queries one node sent another for it), and each node's
/// lookups. A lookup is a `SELECT` reading `attempts` (Sheaf's initial query, to the
/// `Distributed` table on a cluster) or `attempts_local` (a node's query to another shard).
async fn clickhouse_queries(
    db: &ChDb,
    run_start_unix: u64,
) -> anyhow::Result<(Vec<CpuSecond>, Vec<NodeLookups>)> {
    let nodes = if db.nodes.is_empty() {
        std::slice::from_ref(&db.url)
    } else {
        db.nodes.as_slice()
    };
    // A `Vec`, which binds as an array (a Rust array binds as a tuple).
    let attempts = vec![
        format!("{}.attempts", db.database),
        format!("{}.attempts_local", db.database),
    ];
    let mut by_second: std::collections::BTreeMap<u32, CpuSecond> = Default::default();
    let mut lookups = Vec::with_capacity(nodes.len());
    for url in nodes {
        let client = clickhouse::Client::default().with_url(url.as_str());
        ch::flush_logs(&client).await?;
        let seconds: Vec<CpuSecond> = client
            .query(
                "SELECT toUInt32(toUnixTimestamp(event_time) - ?) AS second, \
                    toUInt64(sum(ProfileEvents['UserTimeMicroseconds'] + ProfileEvents['SystemTimeMicroseconds'])) AS cpu_micros, \
                    toUInt64(sumIf(ProfileEvents['UserTimeMicroseconds'] + ProfileEvents['SystemTimeMicroseconds'], \
                        query_kind = 'Select' AND hasAny(tables, ?))) AS lookup_micros \
                 FROM system.query_log \
                 WHERE type = 'QueryFinish' AND (current_database = ? OR has(databases, ?)) \
                    AND event_date >= yesterday() AND event_time >= toDateTime(?) \
                 GROUP BY second ORDER BY second",
            )
            .bind(run_start_unix)
            .bind(&attempts)
            .bind(db.database.as_str())
            .bind(db.database.as_str())
            .bind(run_start_unix)
            .fetch_all()
            .await
            .with_context(|| format!("read system.query_log on {url}"))?;
        for s in seconds {
            let slot = by_second.entry(s.second).or_insert(CpuSecond {
                second: s.second,
                cpu_micros: 0,
                lookup_micros: 0,
            });
            slot.cpu_micros += s.cpu_micros;
            slot.lookup_micros += s.lookup_micros;
        }
        let node: NodeLookups = client
            .query(
                "SELECT countIf(is_initial_query) AS initial, \
                    countIf(NOT is_initial_query) AS secondary \
                 FROM system.query_log \
                 WHERE type = 'QueryFinish' AND query_kind = 'Select' AND hasAny(tables, ?) \
                    AND event_date >= yesterday() AND event_time >= toDateTime(?)",
            )
            .bind(&attempts)
            .bind(run_start_unix)
            .fetch_one()
            .await
            .with_context(|| format!("count lookups in system.query_log on {url}"))?;
        lookups.push(node);
    }
    Ok((by_second.into_values().collect(), lookups))
}

fn build_report(ctx: &Ctx, sizes: &Sizes, measured: Vec<Measured>) -> Report {
    let mut report = Report::new("burst", QUESTION, ctx);
    let off_queries = |store| {
        measured
            .iter()
            .find(|m| m.store == store && m.variant == Variant::Off)
            .map_or(f64::NAN, |m| m.lookup_queries)
    };
    let mut table = Table::new(
        format!(
            "{} events/s for {:.0} s (~1 KB payloads), webhook failing for the first {:.0} s, \
             retries after {SCHEDULE}; ClickHouse log with a Postgres queue, the same log on \
             the 2 × 2 cluster (CPU: the four nodes' sum), then the SQLite store (no ClickHouse \
             there: its CPU columns are empty)",
            report::count(sizes.rate),
            sizes.seconds,
            sizes.failing_seconds
        ),
        &[
            "store",
            "retry lookups",
            "lookup queries",
            "retries looked up",
            "retries per query",
            "queries vs off",
            "lookup CPU (ClickHouse)",
            "ClickHouse CPU, mean",
            "ClickHouse CPU, busiest second",
            "delivered / published",
            "peak RSS (sheaf)",
        ],
    );
    for m in &measured {
        let clickhouse = m.store.on_clickhouse();
        let cpu = |text: String| if clickhouse { text } else { "–".to_owned() };
        table.row(vec![
            m.store.label().to_owned(),
            m.variant.label().to_owned(),
            report::count(m.lookup_queries),
            report::count(m.lookup_keys),
            format!("{:.1}", m.lookup_keys / m.lookup_queries.max(1.0)),
            report::ratio(m.lookup_queries / off_queries(m.store)),
            cpu(format!("{:.2} s", m.lookup_cpu_s)),
            cpu(format!("{:.0} %", m.mean_cpu_percent)),
            cpu(format!("{:.0} %", m.peak_cpu_percent)),
            format!(
                "{} / {}",
                report::count(m.delivered as f64),
                report::count(m.published as f64)
            ),
            format!("{:.1} MiB", m.peak_rss_mib),
        ]);
        report.memory.push(PeakRss::new(
            format!("sheaf serve ({}, {})", m.store.label(), m.variant.label()),
            Some((m.peak_rss_mib * 1024.0) as u64),
        ));
    }
    report.tables.push(table);
    report.tables.push(lookups_per_retry(&measured));
    report.note(
        "Lookup queries and keys are the process's sheaf_retry_lookup_queries_total and \
         sheaf_retry_lookup_keys_total; ClickHouse CPU is ProfileEvents user + system time of \
         the queries about the run's database (system.query_log; on the cluster every \
         node's, summed), per second of the run (100 % = one core), merges excluded; lookup CPU \
         is the part spent in SELECTs reading attempts (attempts_local on the cluster's nodes).",
    );
    report.note(
        "Lookups per retry: each node's system.query_log after SYSTEM FLUSH LOGS, SELECTs \
         reading the run's attempts or attempts_local, is_initial_query 1 (sent by sheaf) or 0 \
         (sent by the node sheaf asked, to a replica of another shard; the asked node answers \
         its own shard inside the initial query), over the retries looked up (the process's \
         sheaf_retry_lookup_keys_total).",
    );
    report.note(
        "Everything (publisher, receiver, sheaf, Postgres, ClickHouse) shares 2 cores, so the \
         rate is a third of the original experiment's 300 events/s on three 2-CPU instances and a \
         3-vCPU server.",
    );
    report.figure = Some(
        Figure::new("burst: ClickHouse CPU spent on the sheaf process's queries").panel(
            Panel::Lines {
                title: format!(
                    "CPU per second of the run (webhook failing for the first {:.0} s)",
                    sizes.failing_seconds
                ),
                x_label: "second of the run".to_owned(),
                y_label: "% of one core".to_owned(),
                log_y: false,
                series: measured
                    .iter()
                    .filter(|m| m.store.on_clickhouse())
                    .map(|m| {
                        let store = match m.store {
                            Store::ClickHouseCluster => "cluster",
                            _ => "one server",
                        };
                        (
                            format!("{store}, {}", m.variant.label()),
                            m.cpu_series.clone(),
                        )
                    })
                    .collect(),
            },
        ),
    );
    report.raw = serde_json::json!({ "sizes": sizes, "schedule": SCHEDULE, "variants": measured });
    report
}

/// The lookups each ClickHouse configuration ran per retry, from the nodes' query logs: the
/// initial queries sheaf sent and the per-shard queries the asked node sent on, with each
/// node's share.
fn lookups_per_retry(measured: &[Measured]) -> Table {
    let mut table = Table::new(
        "lookup queries per retry, from every node's system.query_log (initial: sent by sheaf; \
         per shard: sent by the node sheaf asked to another shard's replica)",
        &[
            "store",
            "retry lookups",
            "retries looked up",
            "initial queries",
            "initial per retry",
            "per-shard queries",
            "per-shard per retry",
            "per node, initial / per shard",
        ],
    );
    for m in measured.iter().filter(|m| m.store.on_clickhouse()) {
        let initial: u64 = m.lookups_by_node.iter().map(|n| n.initial).sum();
        let secondary: u64 = m.lookups_by_node.iter().map(|n| n.secondary).sum();
        let retries = m.lookup_keys.max(1.0);
        let per_node = m
            .lookups_by_node
            .iter()
            .map(|n| {
                format!(
                    "{} / {}",
                    report::count(n.initial as f64),
                    report::count(n.secondary as f64)
                )
            })
            .collect::<Vec<_>>()
            .join("; ");
        table.row(vec![
            m.store.label().to_owned(),
            m.variant.label().to_owned(),
            report::count(m.lookup_keys),
            report::count(initial as f64),
            format!("{:.3}", initial as f64 / retries),
            report::count(secondary as f64),
            format!("{:.3}", secondary as f64 / retries),
            per_node,
        ]);
    }
    table
}
