//! `delivery`: events per second from publish to a 2xx at a local receiver, and publish-to-
//! delivery latency, through a real `sheaf serve` process on the memory backends, on Postgres
//! alone (queue, tenants and log) and on Postgres (queue, tenants) + ClickHouse (log). Each phase
//! also reports the publish latency a client sees (request to its 202).
//!
//! Per backend, after a warm-up: a **saturation** phase publishes a fixed number of events from
//! 32 concurrent publishers and measures from the first publish to the last delivery; a **steady**
//! phase publishes at 2,000 events/s (full size) and measures latency and the process's peak RSS,
//! the memory target for Postgres + ClickHouse (docs/benchmarks.md, "Targets at a glance"). The
//! memory backends run twice, the second time with every span exported to an OTLP sink, so
//! tracing's cost is measured beside the run without it. On the memory backend the growth of
//! the resident set over the saturation phase, divided by its events (all retained: fewer than
//! the 25,000-event retention), less the payload, is the overhead per retained event. A full
//! run ends the memory backends with a profiled saturation run (`crate::profile`: perf, a flame
//! graph and where the time goes), outside the measured phases.
//!
//! Per backend list, last, **one hot key** (`hotkey.rs`): an ordered destination whose events
//! all carry one key, so one delivery at a time, beside an unordered destination in the same
//! process, on the memory backends and on Postgres + ClickHouse.
//!
//! In the configurations whose queue is in Postgres, the steady phase is also recorded second by
//! second (`stall.rs`): deliveries and publishes, the processes' CPU, `pg_stat_activity`,
//! checkpoints, vacuums and sheaf's `/metrics` (read by `watch.rs`), and any second that stalled
//! is printed with the seconds around it. Postgres + ClickHouse's steady phase runs
//! `SHEAF_BENCH_DELIVERY_STEADY_REPEATS` times (1 by default) one after another in the same
//! process, and its target holds only if every run meets it.
//!
//! `measure.rs` runs one backend and measures it (with the queue and ClickHouse sampler of the
//! steady phase, `queue.rs`); `report.rs` builds the tables, targets and figure from what it
//! measured.

use anyhow::Context as _;
use serde::Serialize;

use crate::context::Ctx;
use crate::report::Report;

mod fleet;
mod hotkey;
mod jetstream;
mod measure;
mod queue;
mod report;
mod scaleout;
mod servers;
mod stall;
mod watch;

use measure::run_backend;
use queue::QueueOverTime;
use report::build_report;

pub(super) const QUESTION: &str = "How many events per second does one `sheaf` process deliver from publish \
    to a 2xx at a local receiver, with what latency and memory, on the memory backends, on one \
    SQLite file and on Postgres + ClickHouse?";

/// A transformation of typical size: the body reshaped (the `seq` the receiver reads kept), the
/// event's id and topic added, a header set from the data.
pub(super) const TRANSFORM: &str = r#"{seq: .data.seq, event: {id, topic, tenant: .metadata.tenant_id}, pad: .data.pad}
    | with_headers({"x-seq": ($event.data.seq | tostring)})"#;

/// The bytes of each event's `pad` (the payload is `{"seq": n, "pad": "…"}`).
pub(super) const PAD_BYTES: usize = 1_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(super) enum Backend {
    Memory,
    /// The memory backends with every span exported to an OTLP/HTTP sink (`SHEAF_OTLP_ENDPOINT`):
    /// what tracing costs, side by side with the run without it.
    MemoryTraced,
    /// The memory backends with [`TRANSFORM`] on the destination: what a transformation costs
    /// end to end (its runner processes' CPU counted with the `sheaf` process's).
    MemoryTransformed,
    /// The memory backends with the destination ordered by `/data/key` (1,000 keys).
    MemoryOrdered,
    /// Every store in one SQLite file (`SHEAF_SQLITE_SYNC=normal`, the default).
    Sqlite,
    /// The same with `SHEAF_SQLITE_SYNC=full`: an fsync per group commit.
    SqliteFull,
    Postgres,
    PostgresClickHouse,
    /// Postgres + ClickHouse with the destination ordered by `/data/key` (1,000 keys).
    PostgresClickHouseOrdered,
    /// The Postgres queue with the log on the ClickHouse cluster of `services up --cluster`
    /// (2 shards × 2 replicas), beside the single server in the same run.
    PostgresClickHouseCluster,
    /// The memory backends with one hot key (`hotkey.rs`): an ordered destination whose events
    /// all have one key, beside an unordered one.
    MemoryHotKey,
    /// The same on Postgres + ClickHouse.
    PostgresClickHouseHotKey,
    /// The JetStream queue, its bucket kept on the 3 nodes of the NATS cluster of `services up
    /// --cluster`, with the log on the ClickHouse cluster and tenants in Postgres, through one
    /// `sheaf` process (`jetstream.rs`).
    JetStreamCluster1,
    /// The same through two processes sharing the bucket, the schema and the database; the
    /// load spreads its publishes over them.
    JetStreamCluster2,
    /// The same through three.
    JetStreamCluster3,
}

impl Backend {
    pub(super) fn label(self) -> &'static str {
        match self {
            Backend::Memory => "memory",
            Backend::MemoryTraced => "memory, traces exported",
            Backend::MemoryTransformed => "memory, transformed",
            Backend::MemoryOrdered => "memory, ordered",
            Backend::PostgresClickHouseOrdered => "Postgres + ClickHouse, ordered",
            Backend::Sqlite => "SQLite",
            Backend::SqliteFull => "SQLite, sync full",
            Backend::Postgres => "Postgres + Postgres",
            Backend::PostgresClickHouse => "Postgres + ClickHouse",
            Backend::PostgresClickHouseCluster => "Postgres + ClickHouse cluster (2 × 2)",
            Backend::MemoryHotKey => "memory, one hot key",
            Backend::PostgresClickHouseHotKey => "Postgres + ClickHouse, one hot key",
            Backend::JetStreamCluster1 => "JetStream (3 replicas) + ClickHouse cluster, 1 process",
            Backend::JetStreamCluster2 => {
                "JetStream (3 replicas) + ClickHouse cluster, 2 processes"
            }
            Backend::JetStreamCluster3 => {
                "JetStream (3 replicas) + ClickHouse cluster, 3 processes"
            }
        }
    }

    /// Its name in `SHEAF_BENCH_DELIVERY_BACKENDS`.
    pub(super) fn name(self) -> &'static str {
        match self {
            Backend::Memory => "memory",
            Backend::MemoryTraced => "traced",
            Backend::MemoryTransformed => "transformed",
            Backend::MemoryOrdered => "ordered",
            Backend::Sqlite => "sqlite",
            Backend::SqliteFull => "sqlite-full",
            Backend::Postgres => "postgres",
            Backend::PostgresClickHouse => "clickhouse",
            Backend::PostgresClickHouseCluster => "clickhouse-cluster",
            Backend::PostgresClickHouseOrdered => "clickhouse-ordered",
            Backend::MemoryHotKey => "hot-key",
            Backend::PostgresClickHouseHotKey => "clickhouse-hot-key",
            Backend::JetStreamCluster1 => "jetstream-cluster-1",
            Backend::JetStreamCluster2 => "jetstream-cluster-2",
            Backend::JetStreamCluster3 => "jetstream-cluster-3",
        }
    }

    /// How many `sheaf serve` processes it runs.
    pub(super) fn processes(self) -> usize {
        match self {
            Backend::JetStreamCluster2 => 2,
            Backend::JetStreamCluster3 => 3,
            _ => 1,
        }
    }

    /// Whether its queue is in Postgres: the steady phase's queue sampler and second-by-second
    /// watcher read the jobs table and the claim statement.
    pub(super) fn queue_in_postgres(self) -> bool {
        matches!(
            self.stores(),
            Backend::Postgres | Backend::PostgresClickHouse | Backend::PostgresClickHouseCluster
        )
    }

    /// The stores it runs on: a variant's plain configuration.
    pub(super) fn stores(self) -> Backend {
        match self {
            Backend::MemoryOrdered
            | Backend::MemoryTransformed
            | Backend::MemoryTraced
            | Backend::MemoryHotKey => Backend::Memory,
            Backend::PostgresClickHouseOrdered | Backend::PostgresClickHouseHotKey => {
                Backend::PostgresClickHouse
            }
            Backend::JetStreamCluster2 | Backend::JetStreamCluster3 => Backend::JetStreamCluster1,
            other => other,
        }
    }

    /// Whether it is a hot-key configuration, measured by `hotkey.rs` rather than `measure.rs`.
    pub(super) fn is_hot_key(self) -> bool {
        matches!(
            self,
            Backend::MemoryHotKey | Backend::PostgresClickHouseHotKey
        )
    }

    /// The destination's settings besides its URL.
    pub(super) fn destination_settings(self) -> serde_json::Value {
        match self {
            Backend::MemoryTransformed => serde_json::json!({ "transform": TRANSFORM }),
            Backend::MemoryOrdered | Backend::PostgresClickHouseOrdered => {
                serde_json::json!({ "ordering": { "key": "/data/key" } })
            }
            _ => serde_json::json!({}),
        }
    }
}

/// Development knobs, for profiling one configuration without the whole run: a comma-separated
/// subset of the configurations' names ([`Backend::name`]; a name ending in `*` selects every
/// configuration it begins, so `jetstream-cluster*` is the three JetStream ones) and a steady
/// phase length in seconds. The figures in docs/benchmarks.md always come from a run without
/// them, or say so.
const BACKENDS_VAR: &str = "SHEAF_BENCH_DELIVERY_BACKENDS";
const STEADY_SECONDS_VAR: &str = "SHEAF_BENCH_DELIVERY_STEADY_SECONDS";
/// And the traced run's `SHEAF_OTLP_SAMPLE_PERCENT` (100 by default, as the service's).
const TRACE_PERCENT_VAR: &str = "SHEAF_BENCH_DELIVERY_TRACE_PERCENT";
/// How many times Postgres + ClickHouse's steady phase runs, one after another in the same
/// `sheaf` process (1 by default). Not a development knob: the steady target asks for p99 under
/// 1 s "in every one of three consecutive runs", which
/// `SHEAF_BENCH_DELIVERY_STEADY_REPEATS=3` measures in one invocation.
const STEADY_REPEATS_VAR: &str = "SHEAF_BENCH_DELIVERY_STEADY_REPEATS";

/// Every configuration, in the order a full run measures them.
const ALL: [Backend; 15] = [
    Backend::Memory,
    Backend::MemoryTraced,
    Backend::MemoryTransformed,
    Backend::MemoryOrdered,
    Backend::Sqlite,
    Backend::SqliteFull,
    Backend::Postgres,
    Backend::PostgresClickHouse,
    Backend::PostgresClickHouseCluster,
    Backend::JetStreamCluster1,
    Backend::JetStreamCluster2,
    Backend::JetStreamCluster3,
    Backend::PostgresClickHouseOrdered,
    Backend::MemoryHotKey,
    Backend::PostgresClickHouseHotKey,
];

fn backends() -> anyhow::Result<Vec<Backend>> {
    match std::env::var(BACKENDS_VAR) {
        Ok(list) => select(&list),
        Err(_) => Ok(ALL.to_vec()),
    }
}

/// The configurations a `SHEAF_BENCH_DELIVERY_BACKENDS` list names, in its order.
fn select(list: &str) -> anyhow::Result<Vec<Backend>> {
    let mut selected = Vec::new();
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let matching: Vec<Backend> = match name.strip_suffix('*') {
            Some(prefix) => ALL
                .into_iter()
                .filter(|b| b.name().starts_with(prefix))
                .collect(),
            None => ALL.into_iter().filter(|b| b.name() == name).collect(),
        };
        anyhow::ensure!(
            !matching.is_empty(),
            "{BACKENDS_VAR}: unknown backend `{name}`; expected one of {} (a name may end in `*`)",
            ALL.map(Backend::name).join(", ")
        );
        for backend in matching {
            if !selected.contains(&backend) {
                selected.push(backend);
            }
        }
    }
    Ok(selected)
}

#[derive(Debug, Clone, Copy, Serialize)]
pub(super) struct Sizes {
    pub(super) warmup: usize,
    pub(super) saturation_events: usize,
    pub(super) publishers: usize,
    pub(super) steady_rate: f64,
    pub(super) steady_seconds: f64,
    /// Postgres + ClickHouse's steady phase: long enough for the queue's dead tuples, vacuum
    /// and the claim's plan to show what they do over minutes.
    pub(super) long_steady_seconds: f64,
    /// How often the queue is sampled during a steady phase.
    pub(super) sample_every_s: f64,
    /// Postgres + ClickHouse's steady runs, one after another.
    pub(super) steady_repeats: usize,
    /// The JetStream configurations' backlog: events published while the receiver refuses
    /// every delivery (`jetstream.rs`).
    pub(super) backlog_events: usize,
}

#[derive(Debug, Clone, Serialize)]
pub(super) struct Phase {
    pub(super) published: usize,
    pub(super) refused: u64,
    pub(super) errors: u64,
    pub(super) delivered: usize,
    /// Delivered events ÷ (last delivery − first publish).
    pub(super) events_per_s: f64,
    /// Publishes per second the load achieved.
    pub(super) publish_rate: f64,
    pub(super) p50_ms: f64,
    pub(super) p99_ms: f64,
    pub(super) max_ms: f64,
    /// Publish latency (request to 202) of the accepted publishes.
    pub(super) publish_p50_ms: f64,
    pub(super) publish_p99_ms: f64,
    /// CPU time of the `sheaf` process (all threads) from the phase's first publish until its
    /// last delivery was seen, per delivered event, in µs.
    pub(super) sheaf_cpu_us_per_event: Option<f64>,
    /// The same for Postgres (the postmaster and every process it started) and ClickHouse, in
    /// the configurations that use them.
    pub(super) postgres_cpu_us_per_event: Option<f64>,
    pub(super) clickhouse_cpu_us_per_event: Option<f64>,
    /// The NATS cluster's three nodes, summed, in the JetStream configurations.
    pub(super) nats_cpu_us_per_event: Option<f64>,
    /// The same per node, in the order of their URLs (`n1` first); empty when not read.
    pub(super) nats_node_cpu_us_per_event: Vec<f64>,
    /// Each `sheaf` process's own share (they add up to `sheaf_cpu_us_per_event`).
    pub(super) sheaf_process_cpu_us_per_event: Vec<f64>,
    /// Deliveries answered 200 beyond the first for their event.
    pub(super) duplicates: usize,
}

impl Phase {
    /// Publishes answered 202.
    pub(super) fn accepted(&self) -> usize {
        self.published
            .saturating_sub((self.refused + self.errors) as usize)
    }

    /// CPU µs per delivered event of every process the configuration runs, summed; `None`
    /// unless `sheaf`'s was read (the servers it does not use count as none).
    pub(super) fn total_cpu_us_per_event(&self) -> Option<f64> {
        let sheaf = self.sheaf_cpu_us_per_event?;
        Some(
            sheaf
                + self.postgres_cpu_us_per_event.unwrap_or(0.0)
                + self.clickhouse_cpu_us_per_event.unwrap_or(0.0)
                + self.nats_cpu_us_per_event.unwrap_or(0.0),
        )
    }
}

/// One steady run.
#[derive(Debug, Clone, Serialize)]
pub(super) struct SteadyRun {
    pub(super) phase: Phase,
    /// Postgres backends: the queue over the run.
    pub(super) queue: Option<QueueOverTime>,
    /// Postgres backends: the run second by second, and its stalls.
    pub(super) seconds: Option<stall::SecondBySecond>,
}

#[derive(Debug, Clone, Serialize)]
pub(super) struct Measured {
    pub(super) backend: Backend,
    pub(super) saturation: Phase,
    /// At least one; more for Postgres + ClickHouse with `SHEAF_BENCH_DELIVERY_STEADY_REPEATS`.
    pub(super) steady_runs: Vec<SteadyRun>,
    pub(super) rss_before_kib: u64,
    pub(super) rss_after_saturation_kib: u64,
    /// Memory backend: (RSS growth ÷ events) − payload JSON bytes.
    pub(super) overhead_per_event_bytes: Option<f64>,
    pub(super) peak_rss_mib: f64,
    /// With traces exported: the exports the OTLP sink received.
    pub(super) trace_exports: Option<usize>,
    /// The memory configuration's profile at saturation (full runs, with perf).
    pub(super) profile: Option<crate::profile::Summary>,
    /// Each `sheaf` process's counters over the whole run (one per process).
    pub(super) processes: Vec<fleet::Counters>,
    /// The same over the saturation phase alone, every process added up.
    pub(super) saturation_counters: fleet::Counters,
    /// The log's tables on disk after the run, every node of a cluster counted.
    pub(super) clickhouse_disk: Vec<crate::ch::TableOnDisk>,
    /// The inserts and selects the log's database received over the run, every node counted.
    pub(super) clickhouse_queries: Vec<crate::ch::QueriesOfKind>,
    /// The JetStream configurations: the bucket's stream, and a backlog of waiting jobs in it.
    pub(super) jetstream: Option<jetstream::Stream>,
    /// Events accepted over the whole run, every phase (the warm-up and the backlog included):
    /// what the log's tables hold.
    pub(super) accepted_events: usize,
}

impl Measured {
    /// The first steady run: the one the main table, the figure and the memory target show.
    pub(super) fn steady(&self) -> &Phase {
        &self.steady_runs[0].phase
    }
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<Report> {
    let sizes = Sizes {
        warmup: ctx.size(500, 50),
        saturation_events: ctx.size(20_000, 300),
        publishers: 32,
        steady_rate: ctx.size(2_000.0, 100.0),
        steady_seconds: ctx.size(30.0, 2.0),
        long_steady_seconds: ctx.size(300.0, 3.0),
        sample_every_s: ctx.size(5.0, 0.5),
        steady_repeats: 1,
        backlog_events: ctx.size(1_000, 50),
    };
    let mut sizes = sizes;
    if let Some(seconds) = std::env::var(STEADY_SECONDS_VAR)
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
    {
        sizes.steady_seconds = seconds;
        sizes.long_steady_seconds = seconds;
    }
    if let Ok(repeats) = std::env::var(STEADY_REPEATS_VAR) {
        sizes.steady_repeats = repeats
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|&n| n >= 1)
            .with_context(|| {
                format!("{STEADY_REPEATS_VAR}: expected a number of runs ≥ 1, not `{repeats}`")
            })?;
    }
    let bin = ctx.sheaf_bin()?.to_path_buf();
    let hot_sizes = hotkey::Sizes::new(ctx);
    let mut measured = Vec::new();
    let mut hot = Vec::new();
    for backend in backends()? {
        if backend.is_hot_key() {
            let m = hotkey::run(ctx, &bin, &hot_sizes, backend)
                .await
                .with_context(|| backend.label())?;
            hot.push(m);
            continue;
        }
        let m = run_backend(ctx, &bin, &sizes, backend)
            .await
            .with_context(|| backend.label())?;
        measured.push(m);
    }
    let mut report = build_report(ctx, &sizes, measured);
    hotkey::add_to_report(&mut report, &hot_sizes, &hot);
    Ok(report)
}
