//! What `delivery` measures, per backend: its `sheaf serve` processes (`fleet.rs`), a warm-up,
//! the saturation and steady phases with their publish and delivery latencies and every
//! process's CPU per event (`servers.rs`), and, under the steady phase, what the Postgres queue
//! and ClickHouse do (`queue.rs`), and much more second by second (`watch.rs`, `stall.rs`). The
//! JetStream configurations start with a backlog in their bucket (`jetstream.rs`); every
//! configuration with a ClickHouse log ends with its tables' bytes on disk.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sheaf_testenv::receiver::Receiver;

use crate::ch::{self, ChDb};
use crate::context::Ctx;
use crate::load::{self, Pace};
use crate::pg::PgSchema;
use crate::progress::Progress;
use crate::report;
use crate::sheaf::{Publisher, Sheaf};

use super::fleet::{Counters, Fleet};
use super::jetstream::{self, Bucket};
use super::queue::Sampler;
use super::servers::{Servers, sheaf_per_event};
use super::stall::{self, SecondBySecond};
use super::watch::{Watched, Watcher};
use super::{Backend, Measured, PAD_BYTES, Phase, Sizes, SteadyRun, TRACE_PERCENT_VAR};

pub(super) async fn run_backend(
    ctx: &Ctx,
    bin: &std::path::Path,
    sizes: &Sizes,
    backend: Backend,
) -> anyhow::Result<Measured> {
    let base = Instant::now();
    let receiver = Receiver::start().await?;
    let stores = Stores::new(ctx, backend).await?;
    let mut env = stores.env.clone();
    // The OTLP sink: a second receiver, answering every export 200 (an empty response).
    let sink = match backend {
        Backend::MemoryTraced => {
            let sink = Receiver::start().await?;
            // Any path is answered; the exporter posts to `<endpoint>/v1/traces`.
            env.push((
                "SHEAF_OTLP_ENDPOINT",
                sink.url().trim_end_matches("/hook").to_owned(),
            ));
            if let Ok(percent) = std::env::var(TRACE_PERCENT_VAR) {
                env.push(("SHEAF_OTLP_SAMPLE_PERCENT", percent));
            }
            Some(sink)
        }
        _ => None,
    };
    let log = ctx
        .out_dir
        .join("logs")
        .join(format!("delivery-{backend:?}.log").to_lowercase());
    let fleet = Fleet::start(bin, &env, &log, backend.processes()).await?;
    fleet
        .first()
        .add_destination_with("bench", &receiver.url(), backend.destination_settings())
        .await?;
    let publisher = fleet.publisher("bench");
    let pad = Arc::new("x".repeat(PAD_BYTES));
    let payload_bytes =
        serde_json::to_vec(&serde_json::json!({ "seq": 12345, "pad": *pad }))?.len();

    let (steady_seconds, steady_runs) = if backend == Backend::PostgresClickHouse {
        (sizes.long_steady_seconds, sizes.steady_repeats)
    } else {
        (sizes.steady_seconds, 1)
    };
    let steady_count = (sizes.steady_rate * steady_seconds) as usize;
    let backlog_events = if stores.bucket.is_some() {
        sizes.backlog_events
    } else {
        0
    };
    let total =
        backlog_events + sizes.warmup + sizes.saturation_events + steady_count * steady_runs;
    let progress = Arc::new(Progress::new(
        format!("delivery: {}", backend.label()),
        total as u64,
    ));
    // First, in a bucket that holds nothing else yet: what a waiting job costs the stream.
    let backlog = match &stores.bucket {
        Some(bucket) => {
            let load = jetstream::Load {
                publisher: &publisher,
                receiver: &receiver,
                pad: &pad,
                progress: &progress,
                publishers: sizes.publishers,
                base,
            };
            let backlog = jetstream::backlog(bucket, &load, backlog_events).await?;
            receiver.reset();
            Some(backlog)
        }
        None => None,
    };
    // Warm-up: connections, caches, first parts; not measured.
    let warm = load::publish(
        &publisher,
        base,
        0,
        sizes.warmup,
        Pace::Saturate(8),
        Arc::clone(&pad),
        &progress,
    )
    .await;
    let warm_ok = sizes.warmup - (warm.refused + warm.errors) as usize;
    receiver
        .wait_for_count(warm_ok, Duration::from_secs(60))
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_before_kib = fleet.rss_kib().unwrap_or(0);

    let first = 1_000_000;
    receiver.reset();
    let servers = Servers::find(ctx, backend);
    let counters_before = fleet.counters().await;
    let cpu_before = fleet.cpu_times();
    let servers_before = servers.cpu_time();
    let sat = load::publish(
        &publisher,
        base,
        first,
        sizes.saturation_events,
        Pace::Saturate(sizes.publishers),
        Arc::clone(&pad),
        &progress,
    )
    .await;
    let accepted = sizes.saturation_events - (sat.refused + sat.errors) as usize;
    receiver
        .wait_for_count(accepted, Duration::from_secs(300))
        .await;
    let mut saturation = phase(&sat, first, &receiver, base);
    sheaf_per_event(&cpu_before, &fleet.cpu_times(), &mut saturation);
    servers.per_event(servers_before, &mut saturation);
    let saturation_counters = Counters::total(
        &fleet
            .counters()
            .await
            .iter()
            .zip(&counters_before)
            .map(|(after, before)| after.since(before))
            .collect::<Vec<_>>(),
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_after_saturation_kib = fleet.rss_kib().unwrap_or(0);

    // Postgres + ClickHouse's steady phase as many times as asked, one after another in this
    // process: a later run starts with what the earlier ones left (dead tuples, parts, the
    // outbox's and the log's growth), as a longer steady load would.
    let rig = Rig {
        backend,
        fleet: &fleet,
        publisher: &publisher,
        receiver: &receiver,
        stores: &stores,
        servers: &servers,
        pad: &pad,
        progress: &progress,
        base,
    };
    let mut steady = Vec::with_capacity(steady_runs);
    for run in 0..steady_runs {
        let first = 2_000_000 + run as u64 * 10_000_000;
        steady.push(steady_run(&rig, sizes, steady_count, first).await?);
    }
    // Not worth the run's other figures when the cluster does not answer: said, and left out.
    let after_steady = match &stores.bucket {
        Some(bucket) => bucket
            .state()
            .await
            .inspect_err(|e| eprintln!("sheaf-bench: the stream after the steady phase: {e:#}"))
            .ok(),
        None => None,
    };
    // Where the memory configuration's CPU goes at saturation: a third run of the saturation
    // load under perf, after the measured phases (sampling costs CPU of its own, so it is kept
    // out of their figures). Not under --quick.
    let profile = if backend == Backend::Memory && !ctx.quick {
        profile_saturation(ctx, fleet.first(), &publisher, &receiver, sizes, &pad).await
    } else {
        None
    };
    progress.finish();
    let peak_rss_mib = fleet.peak_rss_kib().unwrap_or(0) as f64 / 1024.0;
    let processes = fleet.counters().await;
    fleet.stop().await?;
    // After the processes stopped, so every row they held was written.
    let (clickhouse_disk, clickhouse_queries) = match &stores.clickhouse {
        Some(db) => (
            ch::tables_on_disk(db.servers(), &db.database).await?,
            ch::queries_by_kind(db.servers(), &db.database).await?,
        ),
        None => (Vec::new(), Vec::new()),
    };
    let accepted_events = backlog.as_ref().map_or(0, |b| b.accepted)
        + warm_ok
        + saturation.accepted()
        + steady.iter().map(|run| run.phase.accepted()).sum::<usize>();
    let jetstream = match (&stores.bucket, backlog) {
        (Some(bucket), Some(backlog)) => Some(jetstream::Stream {
            bucket: bucket.name.clone(),
            backlog,
            after_steady,
        }),
        _ => None,
    };
    drop(stores);
    let trace_exports = sink.map(|sink| sink.requests().0);

    let overhead_per_event_bytes = (backend == Backend::Memory).then(|| {
        let growth = rss_after_saturation_kib.saturating_sub(rss_before_kib) as f64 * 1024.0;
        growth / saturation.delivered.max(1) as f64 - payload_bytes as f64
    });
    Ok(Measured {
        backend,
        saturation,
        steady_runs: steady,
        rss_before_kib,
        rss_after_saturation_kib,
        overhead_per_event_bytes,
        peak_rss_mib,
        trace_exports,
        profile,
        processes,
        saturation_counters,
        clickhouse_disk,
        clickhouse_queries,
        jetstream,
        accepted_events,
    })
}

/// The stores a configuration runs on: the `SHEAF_*` variables that select them, and this run's
/// Postgres schema, ClickHouse database or SQLite directory, each removed when this is dropped
/// (after the process that used them stopped).
pub(super) struct Stores {
    pub(super) env: Vec<(&'static str, String)>,
    pub(super) schema: Option<PgSchema>,
    pub(super) clickhouse: Option<ChDb>,
    /// The JetStream configurations' bucket, one for all their processes.
    pub(super) bucket: Option<Bucket>,
    data_dir: Option<std::path::PathBuf>,
}

impl Stores {
    pub(super) async fn new(ctx: &Ctx, backend: Backend) -> anyhow::Result<Self> {
        let mut stores = Stores {
            env: Vec::new(),
            schema: None,
            clickhouse: None,
            bucket: None,
            data_dir: None,
        };
        let env = &mut stores.env;
        match backend.stores() {
            Backend::Postgres
            | Backend::PostgresClickHouse
            | Backend::PostgresClickHouseCluster
            | Backend::JetStreamCluster1 => {
                let schema = PgSchema::new(ctx.postgres()?, "bench_delivery");
                let queue = if backend.queue_in_postgres() {
                    "postgres"
                } else {
                    "jetstream"
                };
                env.push(("SHEAF_QUEUE", queue.to_owned()));
                // Named after the schema, so the steady phase's watcher tells sheaf's
                // connections in `pg_stat_activity` from those of anything else on the server.
                let sep = if schema.url.contains('?') { '&' } else { '?' };
                let url = format!("{}{sep}application_name={}", schema.url, schema.schema);
                env.push(("SHEAF_POSTGRES_URL", url));
                env.push(("SHEAF_POSTGRES_SCHEMA", schema.schema.clone()));
                stores.schema = Some(schema);
            }
            Backend::Sqlite | Backend::SqliteFull => {
                // The SQLite file, in a directory of the run's output that is removed after it.
                let dir = ctx
                    .out_dir
                    .join(format!("delivery-{backend:?}-data").to_lowercase());
                // A directory left by an interrupted run would start the file with its rows.
                let _ = std::fs::remove_dir_all(&dir);
                env.push(("SHEAF_LOG_STORE", "sqlite".to_owned()));
                env.push(("SHEAF_QUEUE", "sqlite".to_owned()));
                env.push(("SHEAF_DATA_DIR", dir.display().to_string()));
                if backend == Backend::SqliteFull {
                    env.push(("SHEAF_SQLITE_SYNC", "full".to_owned()));
                }
                stores.data_dir = Some(dir);
            }
            _ => {}
        }
        if backend.stores() == Backend::Postgres {
            env.push(("SHEAF_LOG_STORE", "postgres".to_owned()));
        }
        if backend.stores() == Backend::PostgresClickHouse {
            let db = ChDb::new(ctx.clickhouse()?, "bench_delivery");
            env.push(("SHEAF_LOG_STORE", "clickhouse".to_owned()));
            env.push(("SHEAF_CLICKHOUSE_URL", db.url.clone()));
            env.push(("SHEAF_CLICKHOUSE_DATABASE", db.database.clone()));
            stores.clickhouse = Some(db);
        }
        if backend.stores() == Backend::JetStreamCluster1 {
            // One bucket, kept on the cluster's 3 nodes, shared by every process of the run.
            let urls = ctx.nats_cluster()?;
            let bucket = Bucket::new(urls).await?;
            env.push(("SHEAF_JETSTREAM_URLS", urls.join(",")));
            env.push(("SHEAF_JETSTREAM_BUCKET", bucket.name.clone()));
            env.push(("SHEAF_JETSTREAM_REPLICAS", "3".to_owned()));
            stores.bucket = Some(bucket);
        }
        if matches!(
            backend.stores(),
            Backend::PostgresClickHouseCluster | Backend::JetStreamCluster1
        ) {
            let (name, nodes) = ctx.clickhouse_cluster()?;
            let db = ChDb::on_cluster(nodes, "bench_delivery");
            env.push(("SHEAF_LOG_STORE", "clickhouse".to_owned()));
            env.push(("SHEAF_CLICKHOUSE_URL", db.url.clone()));
            env.push(("SHEAF_CLICKHOUSE_DATABASE", db.database.clone()));
            env.push(("SHEAF_CLICKHOUSE_CLUSTER", name.to_owned()));
            env.push(("SHEAF_CLICKHOUSE_CLUSTER_NODES", nodes.join(",")));
            stores.clickhouse = Some(db);
        }
        Ok(stores)
    }
}

impl Drop for Stores {
    fn drop(&mut self) {
        if let Some(dir) = &self.data_dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// The saturation load again, with `sheaf` sampled by perf; the flame graph and its summary go
/// to the run's output directory. `None`, said why, when perf is missing or fails.
async fn profile_saturation(
    ctx: &Ctx,
    sheaf: &Sheaf,
    publisher: &Publisher,
    receiver: &Receiver,
    sizes: &Sizes,
    pad: &Arc<String>,
) -> Option<crate::profile::Summary> {
    let data = ctx.out_dir.join("delivery-memory.perf.data");
    let recording = crate::profile::start(sheaf.pid(), &data)?;
    let first = 3_000_000;
    // Twice the saturation phase's events, for a few thousand samples.
    let events = sizes.saturation_events * 2;
    receiver.reset();
    let progress = Arc::new(Progress::new(
        "delivery: memory, profiled".to_owned(),
        events as u64,
    ));
    let sent = load::publish(
        publisher,
        Instant::now(),
        first,
        events,
        Pace::Saturate(sizes.publishers),
        Arc::clone(pad),
        &progress,
    )
    .await;
    let accepted = events - (sent.refused + sent.errors) as usize;
    receiver
        .wait_for_count(accepted, Duration::from_secs(300))
        .await;
    progress.finish();
    let svg = ctx.out_dir.join("delivery-memory-profile.svg");
    match recording.finish(
        &svg,
        "sheaf serve, memory backends, 32 publishers at saturation",
    ) {
        Ok(summary) => Some(summary),
        Err(e) => {
            eprintln!("sheaf-bench: no profile: {e:#}");
            None
        }
    }
}

/// What a steady run drives and reads.
struct Rig<'a> {
    backend: Backend,
    fleet: &'a Fleet,
    publisher: &'a Publisher,
    receiver: &'a Receiver,
    stores: &'a Stores,
    servers: &'a Servers,
    pad: &'a Arc<String>,
    progress: &'a Arc<Progress>,
    base: Instant,
}

/// One steady run: `count` events at the steady rate from seq `first`, measured until the last
/// was delivered; on Postgres, with the queue sampled and the run watched second by second.
async fn steady_run(
    rig: &Rig<'_>,
    sizes: &Sizes,
    count: usize,
    first: u64,
) -> anyhow::Result<SteadyRun> {
    rig.receiver.reset();
    let cpu_before = rig.fleet.cpu_times();
    let servers_before = rig.servers.cpu_time();
    let every = Duration::from_secs_f64(sizes.sample_every_s);
    let clickhouse = rig.stores.clickhouse.as_ref();
    // The sampler and the watcher read the Postgres queue's table and claim statement.
    let watched_schema = rig
        .stores
        .schema
        .as_ref()
        .filter(|_| rig.backend.queue_in_postgres());
    let (sampler, watcher) = match watched_schema {
        Some(schema) => {
            let sheaf = rig.fleet.first();
            let watched = Watched {
                postgres_url: schema.url.clone(),
                schema: schema.schema.clone(),
                sheaf_pid: sheaf.pid(),
                postgres_pid: rig.servers.postgres,
                // On a cluster, the node Sheaf queries.
                clickhouse_pid: rig.servers.clickhouse.first().copied(),
                metrics_url: sheaf.url("/metrics"),
            };
            (
                Some(Sampler::start(schema, clickhouse, every).await?),
                Some(Watcher::start(watched).await?),
            )
        }
        None => (None, None),
    };
    let sent = load::publish(
        rig.publisher,
        rig.base,
        first,
        count,
        Pace::Rate(sizes.steady_rate),
        Arc::clone(rig.pad),
        rig.progress,
    )
    .await;
    let accepted = count - (sent.refused + sent.errors) as usize;
    rig.receiver
        .wait_for_count(accepted, Duration::from_secs(300))
        .await;
    let watched = match watcher {
        Some(watcher) => Some((watcher.started, watcher.finish().await)),
        None => None,
    };
    let delivered_at = load::delivered_at(rig.receiver, rig.base);
    let mut phase = phase_of(&sent, first, &delivered_at);
    phase.duplicates = rig.receiver.duplicates();
    sheaf_per_event(&cpu_before, &rig.fleet.cpu_times(), &mut phase);
    rig.servers.per_event(servers_before, &mut phase);
    let queue = match sampler {
        Some(sampler) => Some(sampler.finish(clickhouse).await?),
        None => None,
    };
    let seconds = watched.map(|(started, ticks)| {
        let started_micros = started.duration_since(rig.base).as_micros() as u64;
        let rows = stall::seconds(&sent, first, &delivered_at, started_micros, ticks);
        SecondBySecond::new(rows, sizes.steady_rate)
    });
    Ok(SteadyRun {
        phase,
        queue,
        seconds,
    })
}

pub(super) fn phase(sent: &load::Sent, first: u64, receiver: &Receiver, base: Instant) -> Phase {
    Phase {
        duplicates: receiver.duplicates(),
        ..phase_of(sent, first, &load::delivered_at(receiver, base))
    }
}

/// [`phase`], from the deliveries' arrival times already read.
fn phase_of(
    sent: &load::Sent,
    first: u64,
    delivered_at: &std::collections::HashMap<u64, u64>,
) -> Phase {
    let (lat, last) = load::latencies(sent, first, delivered_at);
    let start = sent.started_micros.iter().copied().min().unwrap_or(0);
    let span = last.saturating_sub(start) as f64 / 1e6;
    Phase {
        published: sent.started_micros.len(),
        refused: sent.refused,
        errors: sent.errors,
        delivered: lat.len(),
        events_per_s: if span > 0.0 {
            lat.len() as f64 / span
        } else {
            0.0
        },
        publish_rate: sent.started_micros.len() as f64 / sent.elapsed.as_secs_f64().max(1e-9),
        p50_ms: report::percentile(lat.clone(), 50.0),
        p99_ms: report::percentile(lat.clone(), 99.0),
        max_ms: report::percentile(lat, 100.0),
        publish_p50_ms: report::percentile(publish_ms(sent), 50.0),
        publish_p99_ms: report::percentile(publish_ms(sent), 99.0),
        sheaf_cpu_us_per_event: None,
        postgres_cpu_us_per_event: None,
        clickhouse_cpu_us_per_event: None,
        nats_cpu_us_per_event: None,
        nats_node_cpu_us_per_event: Vec::new(),
        sheaf_process_cpu_us_per_event: Vec::new(),
        duplicates: 0,
    }
}

fn publish_ms(sent: &load::Sent) -> Vec<f64> {
    sent.publish_micros
        .iter()
        .map(|&us| us as f64 / 1000.0)
        .collect()
}
