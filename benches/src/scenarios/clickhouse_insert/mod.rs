//! `clickhouse-insert`: on the ClickHouse cluster of `services up --cluster` (2 shards × 2
//! replicas, `internal_replication` off), the same kind of batch of log rows written two ways,
//! alternated batch by batch in one run:
//!
//! - **through the `Distributed` table**, as the store writes: one `INSERT` per batch into
//!   `events` or `attempts` on the node Sheaf talks to, with `distributed_foreground_insert = 1`,
//!   so that node splits the batch by `sipHash64(tenant_id, event_id)` and writes every replica
//!   of each shard before it answers;
//! - **per shard from the client**: the batch split by the same hash in the bench, and one
//!   `INSERT` per replica of each shard straight into `events_local` / `attempts_local`, the four
//!   sent at once (with `internal_replication` off nothing else copies a shard's rows to its
//!   other replica).
//!
//! Rows are shaped like the store's (the tables are the store's own, migrated by
//! `ClickHouseLogStore::migrate` in cluster mode), with JSON payloads of ~300 bytes. For each
//! table and batch size, after a few unmeasured batches, each round writes one fresh batch each
//! way, the order swapped every round. Per batch: wall time from the first byte sent to the last
//! answer, and the CPU time the four node processes used meanwhile (`/proc/<pid>/stat`, found by
//! the process listening on each node's HTTP port), and the bench process's own CPU. Background
//! merges run whenever they run; alternating spreads them over both ways alike.
//!
//! The bench places a row with its own SipHash-2-4 of the two columns, combined as ClickHouse
//! combines the hashes of several arguments; before measuring it checks the placement of a whole
//! batch against the server's `sipHash64`, and after the run it counts every node's rows: each
//! node must hold exactly the rows of its shard, both ways, and no row whose hash belongs to the
//! other shard.
//!
//! `rows.rs` makes the rows and places them; `summary.rs` builds the tables from what was
//! measured.

use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use clickhouse::Client;
use serde::Serialize;
use sheaf_clickhouse::{ClickHouseCluster, ClickHouseLogStore, ClusterReplication};

use crate::ch::ChDb;
use crate::context::Ctx;
use crate::progress::Progress;
use crate::report::{self, Report};

mod rows;
mod summary;

use rows::{Generator, LogRow, shard_of, sip_hash64};
use summary::build_report;

const QUESTION: &str = "On a ClickHouse cluster of 2 shards × 2 replicas, does the client \
    writing each shard's replicas itself (one INSERT per replica into the local tables) beat one \
    INSERT per batch into the Distributed table with distributed_foreground_insert = 1, in rows/s \
    or in the nodes' CPU per row?";

/// Replicas per shard in the test cluster (xtask's `clickhouse_cluster.rs`); its nodes are
/// listed shard by shard.
const REPLICAS: usize = 2;

/// Each way's event ids start with its tag, so the rows can be counted per way afterwards.
const DISTRIBUTED_TAG: &str = "evt_d";
const PER_SHARD_TAG: &str = "evt_s";

#[derive(Debug, Clone, Serialize)]
struct Sizes {
    batch_rows: Vec<usize>,
    /// Measured batches per way, for each batch size (same order).
    batches: Vec<usize>,
    warmup_batches: usize,
    tenants: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
enum Way {
    Distributed,
    PerShard,
}

impl Way {
    fn label(self) -> &'static str {
        match self {
            Way::Distributed => "Distributed table, foreground",
            Way::PerShard => "per shard, every replica",
        }
    }

    fn tag(self) -> &'static str {
        match self {
            Way::Distributed => DISTRIBUTED_TAG,
            Way::PerShard => PER_SHARD_TAG,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
enum Kind {
    Events,
    Attempts,
}

impl Kind {
    fn table(self) -> &'static str {
        match self {
            Kind::Events => "events",
            Kind::Attempts => "attempts",
        }
    }
}

/// What one way's measured batches of one table and size took.
#[derive(Debug, Clone, Default, Serialize)]
struct Sample {
    /// Wall time of each batch, in ms.
    batch_ms: Vec<f64>,
    /// The four node processes' CPU over the batches, summed, in seconds.
    node_cpu_s: f64,
    /// The bench process's CPU over the batches (serializing, sending), in seconds.
    client_cpu_s: f64,
}

/// What one table, batch size and way measured.
#[derive(Debug, Clone, Serialize)]
struct Measured {
    kind: Kind,
    batch_rows: usize,
    way: Way,
    batches: usize,
    rows: usize,
    sample: Sample,
    /// The measured batches' `INSERT` queries in every node's `system.query_log`.
    logged: LoggedInserts,
}

/// The `INSERT` queries of one table, batch size and way in the nodes' query logs (tagged with
/// `log_comment`, which the `Distributed` table passes on to the inserts it sends), summed.
#[derive(Debug, Clone, Copy, Default, Serialize, clickhouse::Row, serde::Deserialize)]
struct LoggedInserts {
    queries: u64,
    /// Sent by the bench (the others by the node that received a Distributed insert).
    initial: u64,
    /// `ProfileEvents` user + system time, in µs: the queries' own CPU, merges excluded.
    cpu_micros: u64,
}

impl Measured {
    fn rows_per_s(&self) -> f64 {
        self.rows as f64 / (self.sample.batch_ms.iter().sum::<f64>() / 1000.0).max(1e-9)
    }

    fn median_ms(&self) -> f64 {
        report::median(self.sample.batch_ms.clone())
    }

    fn p90_ms(&self) -> f64 {
        report::percentile(self.sample.batch_ms.clone(), 90.0)
    }

    fn node_cpu_per_1000(&self) -> f64 {
        self.sample.node_cpu_s / self.rows.max(1) as f64 * 1000.0
    }

    fn client_cpu_per_1000(&self) -> f64 {
        self.sample.client_cpu_s / self.rows.max(1) as f64 * 1000.0
    }

    fn query_cpu_per_1000(&self) -> f64 {
        self.logged.cpu_micros as f64 / 1e6 / self.rows.max(1) as f64 * 1000.0
    }

    /// The `log_comment` of its measured batches' inserts.
    fn tag(database: &str, kind: Kind, rows: usize, way: Way) -> String {
        format!("{database}/{}/{rows}/{way:?}", kind.table())
    }
}

/// One node's rows after the run, per table.
#[derive(Debug, Clone, Serialize, clickhouse::Row, serde::Deserialize)]
struct NodeRows {
    rows: u64,
    /// Rows whose `sipHash64(tenant_id, event_id)` belongs to the other shard.
    misplaced: u64,
    distributed: u64,
    per_shard: u64,
}

/// The cluster as the bench writes it: a client per node, and the one the store's inserts go
/// through.
struct Cluster {
    database: String,
    /// Node `i` is replica `i % REPLICAS` of shard `i / REPLICAS`.
    nodes: Vec<Client>,
    /// The first node, with `distributed_foreground_insert = 1`, as the store's client.
    distributed: Client,
    /// The node processes, for their CPU time.
    pids: Vec<u32>,
}

impl Cluster {
    fn shards(&self) -> usize {
        self.nodes.len() / REPLICAS
    }

    /// The node processes' CPU time so far, summed; an error if one cannot be read.
    fn node_cpu(&self) -> anyhow::Result<Duration> {
        self.pids
            .iter()
            .map(|&pid| {
                sheaf_testenv::process::cpu_time(pid)
                    .with_context(|| format!("cannot read /proc/{pid}/stat"))
            })
            .sum()
    }
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<Report> {
    let sizes = Sizes {
        batch_rows: ctx.size(vec![100, 1_000, 10_000], vec![100, 1_000]),
        batches: ctx.size(vec![100, 100, 30], vec![3, 2]),
        warmup_batches: ctx.size(3, 1),
        tenants: 50,
    };
    crate::proc::reset_peak_rss();
    let (name, urls) = ctx.clickhouse_cluster()?;
    ensure!(
        urls.len() >= REPLICAS && urls.len().is_multiple_of(REPLICAS),
        "expected the nodes of {REPLICAS} replicas per shard, shard by shard; got {}",
        urls.len()
    );
    let db = ChDb::on_cluster(urls, "bench_insert");
    let mut config = db.config();
    config.cluster = Some(ClickHouseCluster {
        name: name.to_owned(),
        nodes: urls.to_vec(),
        replication: ClusterReplication::Distributed,
    });
    let store = ClickHouseLogStore::connect(config)?;
    store.migrate().await.context("migrate the cluster")?;
    store.close().await;

    let node = |url: &str| {
        Client::default()
            .with_url(url)
            .with_database(db.database.as_str())
    };
    let cluster = Cluster {
        database: db.database.clone(),
        nodes: urls.iter().map(|u| node(u)).collect(),
        distributed: node(&urls[0]).with_setting("distributed_foreground_insert", "1"),
        pids: urls
            .iter()
            .map(|u| {
                port_of(u)
                    .and_then(sheaf_testenv::process::listener_pid)
                    .with_context(|| format!("no process listens at {u}"))
            })
            .collect::<anyhow::Result<_>>()?,
    };
    let mut generator = Generator::new(sizes.tenants, cluster.shards());
    check_hash(&cluster, &generator.keys(1_000)).await?;

    let total: usize = 2 * 2 * sizes.batches.iter().sum::<usize>();
    let progress = Progress::new("clickhouse-insert: 2 tables, 2 ways", total as u64);
    let mut measured = Vec::new();
    for (&rows, &batches) in sizes.batch_rows.iter().zip(&sizes.batches) {
        for kind in [Kind::Events, Kind::Attempts] {
            let pair = match kind {
                Kind::Events => {
                    measure(&cluster, &sizes, (kind, rows, batches), &progress, |way| {
                        generator.events(way, rows)
                    })
                    .await
                }
                Kind::Attempts => {
                    measure(&cluster, &sizes, (kind, rows, batches), &progress, |way| {
                        generator.attempts(way, rows)
                    })
                    .await
                }
            };
            let [distributed, per_shard] =
                pair.with_context(|| format!("{} in batches of {rows}", kind.table()))?;
            for (way, sample) in [(Way::Distributed, distributed), (Way::PerShard, per_shard)] {
                measured.push(Measured {
                    kind,
                    batch_rows: rows,
                    way,
                    batches,
                    rows: rows * batches,
                    sample,
                    logged: LoggedInserts::default(),
                });
            }
        }
    }
    progress.finish();
    let placement = check_placement(&cluster, &generator).await?;
    logged_inserts(&cluster, &mut measured).await?;
    let peak = crate::proc::peak_rss_kib(None);
    let payload_bytes = generator.mean_payload_bytes();
    Ok(build_report(
        ctx,
        &sizes,
        &measured,
        &placement,
        payload_bytes,
        peak,
    ))
}

/// Warm-up batches, then `batches` rounds of one fresh batch each way (the order swapped every
/// round); returns what the Distributed way and the per-shard way measured, in that order.
async fn measure<R: LogRow>(
    cluster: &Cluster,
    sizes: &Sizes,
    (kind, batch_rows, batches): (Kind, usize, usize),
    progress: &Progress,
    mut batch: impl FnMut(Way) -> Vec<R>,
) -> anyhow::Result<[Sample; 2]> {
    let mut out = [Sample::default(), Sample::default()];
    for round in 0..sizes.warmup_batches + batches {
        let order = if round % 2 == 0 {
            [Way::Distributed, Way::PerShard]
        } else {
            [Way::PerShard, Way::Distributed]
        };
        for way in order {
            let rows = batch(way);
            let tag = if round < sizes.warmup_batches {
                format!("{}/warm-up", cluster.database)
            } else {
                Measured::tag(&cluster.database, kind, batch_rows, way)
            };
            let nodes_before = cluster.node_cpu()?;
            let client_before = own_cpu()?;
            let started = Instant::now();
            match way {
                Way::Distributed => {
                    insert(&cluster.distributed, &tag, R::TABLE, rows.iter()).await?;
                }
                Way::PerShard => insert_per_shard(cluster, &tag, &rows).await?,
            }
            let wall = started.elapsed();
            let client_cpu = own_cpu()?.saturating_sub(client_before);
            let node_cpu = cluster.node_cpu()?.saturating_sub(nodes_before);
            if round < sizes.warmup_batches {
                continue;
            }
            let m = &mut out[way as usize];
            m.batch_ms.push(wall.as_secs_f64() * 1000.0);
            m.node_cpu_s += node_cpu.as_secs_f64();
            m.client_cpu_s += client_cpu.as_secs_f64();
            progress.inc(1);
        }
    }
    Ok(out)
}

/// One `INSERT` of `rows` into `table` through `client`, tagged `tag` in the query logs.
async fn insert<'a, R: LogRow>(
    client: &Client,
    tag: &str,
    table: &str,
    rows: impl Iterator<Item = &'a R>,
) -> anyhow::Result<()> {
    // A clone shares the client's cached table schema; only the setting differs.
    let mut insert = client
        .clone()
        .with_setting("log_comment", tag)
        .insert::<R>(table)
        .await
        .with_context(|| format!("insert into {table}"))?;
    for row in rows {
        insert
            .write(row)
            .await
            .with_context(|| format!("insert into {table}"))?;
    }
    insert
        .end()
        .await
        .with_context(|| format!("insert into {table}"))
}

/// The batch split by shard, and one `INSERT` per replica of each shard into its local table,
/// all at once.
async fn insert_per_shard<R: LogRow>(
    cluster: &Cluster,
    tag: &str,
    rows: &[R],
) -> anyhow::Result<()> {
    let mut by_shard: Vec<Vec<&R>> = vec![Vec::new(); cluster.shards()];
    for row in rows {
        let (tenant, event) = row.shard_key();
        by_shard[shard_of(tenant, event, cluster.shards())].push(row);
    }
    let local = format!("{}_local", R::TABLE);
    let inserts = cluster.nodes.iter().enumerate().filter_map(|(i, client)| {
        let shard = &by_shard[i / REPLICAS];
        (!shard.is_empty()).then(|| insert(client, tag, &local, shard.iter().copied()))
    });
    futures::future::try_join_all(inserts).await?;
    Ok(())
}

/// Checks the bench's placement of `rows` against the server's `sipHash64` of the same keys.
async fn check_hash(cluster: &Cluster, keys: &[(String, String)]) -> anyhow::Result<()> {
    let hashes: Vec<(String, String, u64)> = cluster.nodes[0]
        .query("SELECT k.1, k.2, sipHash64(toLowCardinality(k.1), k.2) FROM (SELECT arrayJoin(?) AS k)")
        .bind(keys)
        .fetch_all()
        .await
        .context("sipHash64 of a batch's keys")?;
    ensure!(hashes.len() == keys.len(), "a hash per key");
    for (tenant, event, hash) in &hashes {
        ensure!(
            sip_hash64(tenant, event) == *hash,
            "the bench's sipHash64({tenant}, {event}) is {}, the server's {hash}",
            sip_hash64(tenant, event)
        );
    }
    Ok(())
}

/// Every node's rows of each table after the run: each must hold exactly what the bench placed
/// on its shard, both ways, and nothing the server's hash places on the other shard.
async fn check_placement(
    cluster: &Cluster,
    generator: &Generator,
) -> anyhow::Result<Vec<(Kind, usize, NodeRows)>> {
    let shards = cluster.shards();
    let mut found = Vec::new();
    for kind in [Kind::Events, Kind::Attempts] {
        for (i, client) in cluster.nodes.iter().enumerate() {
            let shard = i / REPLICAS;
            let rows: NodeRows = client
                .query(&format!(
                    "SELECT count() AS rows, \
                        countIf(sipHash64(tenant_id, event_id) % {shards} != {shard}) AS misplaced, \
                        countIf(startsWith(event_id, ?)) AS distributed, \
                        countIf(startsWith(event_id, ?)) AS per_shard \
                     FROM {}_local",
                    kind.table()
                ))
                .bind(DISTRIBUTED_TAG)
                .bind(PER_SHARD_TAG)
                .fetch_one()
                .await
                .with_context(|| format!("count {}_local on node {i}", kind.table()))?;
            let expected = [
                generator.placed(kind, Way::Distributed, shard),
                generator.placed(kind, Way::PerShard, shard),
            ];
            ensure!(
                rows.misplaced == 0
                    && rows.distributed == expected[0]
                    && rows.per_shard == expected[1],
                "node {i} (shard {}) holds {rows:?} in {}_local; the bench placed {expected:?} \
                 (Distributed, per shard) there",
                shard + 1,
                kind.table()
            );
            found.push((kind, i, rows));
        }
    }
    Ok(found)
}

/// Fills in each measurement's inserts from every node's `system.query_log`, after `SYSTEM
/// FLUSH LOGS` on each.
async fn logged_inserts(cluster: &Cluster, measured: &mut [Measured]) -> anyhow::Result<()> {
    for (i, client) in cluster.nodes.iter().enumerate() {
        crate::ch::flush_logs(client).await?;
        for m in measured.iter_mut() {
            let tag = Measured::tag(&cluster.database, m.kind, m.batch_rows, m.way);
            let logged: LoggedInserts = client
                .query(
                    "SELECT count() AS queries, countIf(is_initial_query) AS initial, \
                        toUInt64(sum(ProfileEvents['UserTimeMicroseconds'] \
                            + ProfileEvents['SystemTimeMicroseconds'])) AS cpu_micros \
                     FROM system.query_log \
                     WHERE type = 'QueryFinish' AND query_kind = 'Insert' AND log_comment = ? \
                        AND event_date >= yesterday()",
                )
                .bind(tag.as_str())
                .fetch_one()
                .await
                .with_context(|| format!("read system.query_log on node {i}"))?;
            m.logged.queries += logged.queries;
            m.logged.initial += logged.initial;
            m.logged.cpu_micros += logged.cpu_micros;
        }
    }
    Ok(())
}

/// The bench process's CPU time so far.
fn own_cpu() -> anyhow::Result<Duration> {
    sheaf_testenv::process::cpu_time(std::process::id()).context("cannot read /proc/self/stat")
}

/// The port of an `http://host:port` URL.
fn port_of(url: &str) -> Option<u16> {
    let authority = url.split_once("://")?.1.split(['/', '?']).next()?;
    authority.rsplit_once(':')?.1.parse().ok()
}
