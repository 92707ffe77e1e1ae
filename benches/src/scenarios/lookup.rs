//! `lookup`: what one looked-up key costs the server, single and batched (seed 000).
//!
//! The same attempts (~2 KB payloads over 30 days; 1,000,000 at full size) are generated
//! server-side in three places: ClickHouse in Sheaf's layout (the `attempts` table of
//! `sheaf-clickhouse`), ClickHouse in the seed's layout (ordered by `(attempt_time, attempt_id)`,
//! payload in the row, default granularity), and Postgres (Sheaf's schema, payload in `events`).
//! Both ClickHouse tables are merged to one part per partition first (`OPTIMIZE … FINAL`), so
//! background merges neither run during the measurement nor depend on timing.
//!
//! Every key is `(tenant, event, destination, time of its first attempt)`, as a retry carries it,
//! and its answer is the second attempt a minute later. Each variant first runs its queries one
//! at a time on keys no other query of the same table asked for (sequential: the cost per key),
//! then from several clients at once for a fixed time (saturation: lookups per second).
//!
//! - ClickHouse cost is read from `system.query_log` (queries tagged with a `log_comment`):
//!   `ProfileEvents` user + system CPU and `read_bytes`, the median query divided by its keys.
//! - Postgres cost is read from `pg_stat_statements` before and after each phase: execution time
//!   (`total_exec_time`, wall time inside the server; for cached index probes it is nearly all
//!   CPU) and shared buffers touched × 8 KiB, summed over the phase and divided by its keys.
//! - Sheaf's variants go through the real stores (`ClickHouseLogStore`, `PostgresStores`); the
//!   seed's layout gets the same two query shapes by hand, on its table.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use clickhouse::Client;
use serde::Serialize;
use sheaf_clickhouse::ClickHouseLogStore;
use sheaf_store::{AttemptKey, DestinationId, EventId, LogStore, TenantId, Timestamp};

use crate::ch::{self, ChDb};
use crate::context::Ctx;
use crate::pg::{self, PgSchema, StatementTotals};
use crate::plot::{Bar, Figure, Panel};
use crate::progress::Progress;
use crate::report::{self, PeakRss, Report, Table};

const QUESTION: &str = "What does one looked-up key cost the server (CPU, bytes, throughput) when \
    lookups are single or batched by 10 or 100, in Sheaf's ClickHouse layout, in the seed's \
    time-ordered layout and in Postgres?";

/// Thirty days in microseconds: the span of the generated attempts.
const SPAN_MICROS: i64 = 30 * 86_400 * 1_000_000;

/// The switch for lazy materialization (BRIEF: `…_max_limit_for_lazy_materialization = 0` means
/// "no limit", not "off").
const LAZY_SWITCH: &str = "query_plan_optimize_lazy_materialization";

#[derive(Debug, Clone, Copy)]
struct Sizes {
    /// Events; each has two destinations with two attempts each.
    events: i64,
    single_queries: usize,
    batch10_queries: usize,
    batch100_queries: usize,
    /// How long each variant runs at saturation.
    saturation: Duration,
    /// Concurrent clients at saturation: two per core keeps both cores of the server busy
    /// while one client of each pair waits on the network.
    clients: usize,
    /// The "keys close in time" window.
    near_window_days: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
enum Store {
    ClickHouseSheaf,
    ClickHouseSeed,
    Postgres,
}

impl Store {
    fn label(self) -> &'static str {
        match self {
            Store::ClickHouseSheaf => "ClickHouse, Sheaf's layout",
            Store::ClickHouseSeed => "ClickHouse, seed's layout",
            Store::Postgres => "Postgres, Sheaf's schema",
        }
    }

    fn short(self) -> &'static str {
        match self {
            Store::ClickHouseSheaf => "CH sheaf",
            Store::ClickHouseSeed => "CH seed",
            Store::Postgres => "PG",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
enum Spread {
    /// Keys drawn from the whole 30 days.
    Month,
    /// Keys whose first attempt falls within `near_window_days`.
    Near,
}

#[derive(Debug, Clone, Copy, Serialize)]
struct Variant {
    store: Store,
    keys_per_query: usize,
    spread: Spread,
    /// Lazy materialization on (ClickHouse batches only).
    lazy: bool,
    /// Projection analysis on (`optimize_use_projections`, the server's default). Off only in a
    /// diagnostic variant: planning a query against the `by_tenant_time` projection is most of
    /// a batch's CPU on a large table (`QueryPlanOptimizeMicroseconds` in `query_log`).
    projections: bool,
    queries: usize,
}

impl Variant {
    fn shape(&self) -> String {
        let base = match self.keys_per_query {
            1 => "single".to_owned(),
            n => format!("batch of {n}"),
        };
        if self.store != Store::Postgres && self.keys_per_query > 1 && !self.lazy {
            format!("{base}, lazy materialization off")
        } else if !self.projections {
            format!("{base}, projection analysis off")
        } else {
            base
        }
    }

    fn slug(&self) -> String {
        format!(
            "{:?}-{}-{:?}-{}{}",
            self.store,
            self.keys_per_query,
            self.spread,
            if self.lazy { "lazy" } else { "eager" },
            if self.projections { "" } else { "-noproj" }
        )
        .to_lowercase()
    }

    fn short(&self, sizes: &Sizes) -> String {
        let spread = match self.spread {
            Spread::Month => "30 d".to_owned(),
            Spread::Near => format!("{} d", sizes.near_window_days),
        };
        let lazy = if self.store != Store::Postgres && self.keys_per_query > 1 && !self.lazy {
            ", lazy off"
        } else if !self.projections {
            ", no proj."
        } else {
            ""
        };
        format!(
            "{} x{} {spread}{lazy}",
            self.store.short(),
            self.keys_per_query
        )
    }
}

/// What one variant measured.
#[derive(Debug, Clone, Serialize)]
struct Measured {
    variant: Variant,
    /// Server CPU per key in ms (ClickHouse: median query; Postgres: execution time, phase mean).
    cpu_ms_per_key: f64,
    /// Bytes read per key (ClickHouse `read_bytes`; Postgres buffers touched × 8 KiB).
    read_bytes_per_key: f64,
    /// Median client-side latency of one query, sequential, in ms.
    latency_ms: f64,
    /// Keys answered per second at saturation.
    keys_per_s: f64,
    /// Server CPU per key at saturation, in ms (same sources as above, mean over the phase).
    saturated_cpu_ms_per_key: f64,
    saturated_queries: u64,
    /// Per-query figures of the sequential phase (ClickHouse only).
    queries: Vec<ch::QueryCost>,
}

/// Runs a lookup of a batch of keys against one variant's store; returns the rows found.
enum Runner {
    Sheaf(Arc<dyn LogStore>),
    // Boxed: a client is large next to an `Arc`.
    Seed(Box<Client>),
}

impl Runner {
    async fn lookup(&self, keys: &[AttemptKey]) -> anyhow::Result<usize> {
        match self {
            Runner::Sheaf(store) => {
                if let [key] = keys {
                    let found = store.latest_attempt(key).await?;
                    ensure!(
                        found.as_ref().is_none_or(|a| a.number == 2),
                        "a single lookup returned an attempt other than the second"
                    );
                    Ok(usize::from(found.is_some()))
                } else {
                    let found = store.latest_attempts(keys).await?;
                    ensure!(
                        found.values().all(|a| a.number == 2),
                        "a batch returned an attempt other than the second"
                    );
                    Ok(found.len())
                }
            }
            Runner::Seed(client) => {
                let rows = if let [key] = keys {
                    client
                        .query(SEED_SINGLE)
                        .bind(key.tenant_id.as_str())
                        .bind(key.event_id.as_str())
                        .bind(key.destination_id.to_string())
                        .bind(key.attempt_time.as_micros())
                        .fetch_bytes("TabSeparated")?
                        .collect()
                        .await?
                } else {
                    let triples: Vec<(&str, &str, String)> = keys
                        .iter()
                        .map(|k| {
                            (
                                k.tenant_id.as_str(),
                                k.event_id.as_str(),
                                k.destination_id.to_string(),
                            )
                        })
                        .collect();
                    let oldest = keys
                        .iter()
                        .map(|k| k.attempt_time.as_micros())
                        .min()
                        .unwrap_or(0);
                    client
                        .query(&seed_batch(keys.len()))
                        .bind(triples)
                        .bind(oldest)
                        .bind(oldest)
                        .fetch_bytes("TabSeparated")?
                        .collect()
                        .await?
                };
                Ok(rows.iter().filter(|b| **b == b'\n').count())
            }
        }
    }
}

/// The seed's layout: the payload in the row, ordered by time, default granularity.
const SEED_TABLE: &str = r"
CREATE TABLE attempts_seed_layout
(
    tenant_id LowCardinality(String),
    event_id String,
    destination_id UUID,
    attempt_time DateTime64(6, 'UTC'),
    attempt_id UUID,
    number UInt32,
    status Enum8('failed' = 0, 'success' = 1),
    trigger Enum8('scheduled' = 0, 'manual' = 1),
    response_code Nullable(UInt16),
    duration_ms UInt32,
    response_body Nullable(String),
    error Nullable(String),
    event_topic LowCardinality(String),
    event_data String
)
ENGINE = MergeTree
PARTITION BY toYYYYMM(attempt_time)
ORDER BY (attempt_time, attempt_id)";

const COLUMNS: &str = "tenant_id, event_id, destination_id, attempt_time, attempt_id, number, \
    status, trigger, response_code, duration_ms, response_body, error, event_topic, event_data";

/// Sheaf's single-key query shape, on the seed's table.
const SEED_SINGLE: &str = "SELECT * FROM attempts_seed_layout \
    WHERE tenant_id = ? AND event_id = ? AND destination_id = ? \
        AND attempt_time >= fromUnixTimestamp64Micro(?, 'UTC') \
    ORDER BY attempt_time DESC, toString(attempt_id) DESC LIMIT 1";

/// Seed 000's batched shape (latest `(time, id)` per triple, then those rows under an outer
/// `LIMIT` with the lazy-materialization limit), on the seed's table.
fn seed_batch(limit: usize) -> String {
    format!(
        "SELECT * FROM attempts_seed_layout \
         WHERE (tenant_id, event_id, destination_id, attempt_time, attempt_id) IN ( \
            SELECT tenant_id, event_id, destination_id, \
                argMax(attempt_time, (attempt_time, toString(attempt_id))), \
                argMax(attempt_id, (attempt_time, toString(attempt_id))) \
            FROM attempts_seed_layout \
            WHERE (tenant_id, event_id, destination_id) IN ? \
                AND attempt_time >= fromUnixTimestamp64Micro(?, 'UTC') \
            GROUP BY tenant_id, event_id, destination_id) \
         AND attempt_time >= fromUnixTimestamp64Micro(?, 'UTC') \
         ORDER BY attempt_time DESC LIMIT {limit} \
         SETTINGS query_plan_max_limit_for_lazy_materialization = {limit}"
    )
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<Report> {
    let sizes = Sizes {
        events: ctx.size(250_000, 2_500),
        single_queries: ctx.size(30, 3),
        batch10_queries: ctx.size(20, 2),
        batch100_queries: ctx.size(10, 2),
        saturation: ctx.size(Duration::from_secs(8), Duration::from_millis(500)),
        clients: 4,
        near_window_days: ctx.size(1, 10),
    };
    crate::proc::reset_peak_rss();
    let ch_db = ChDb::new(ctx.clickhouse()?, "bench_lookup");
    let pg_schema = PgSchema::new(ctx.postgres()?, "bench_lookup");
    let start_micros = Timestamp::now().as_micros() - SPAN_MICROS - 3_600_000_000;
    let step = SPAN_MICROS / sizes.events;

    let setup = Progress::new("lookup: generate data", 6);
    let base = ClickHouseLogStore::connect(ch_db.config())?;
    base.migrate().await?;
    ch_db
        .execute(&format!(
            "INSERT INTO attempts ({COLUMNS}) \
             SELECT concat('tenant-', toString(k % 20)), lower(hex(MD5(toString(k)))), \
                toUUID(concat('00000000-0000-7000-8000-', leftPad(toString(n % 2), 12, '0'))), \
                fromUnixTimestamp64Micro(toInt64({start_micros} + k * {step} + a * 60000000 + (n % 2) * 1000), 'UTC'), \
                generateUUIDv7(n), toUInt32(1 + a), 'failed', 'scheduled', 503, 20, 'unavailable', NULL, \
                'order.created', concat('{{\"n\":', toString(k), ',\"blob\":\"', hex(randomString(1000)), '\"}}') \
             FROM (SELECT number AS n, intDiv(number, 4) AS k, intDiv(number % 4, 2) AS a \
                   FROM numbers({rows}))",
            rows = sizes.events * 4
        ))
        .await?;
    setup.inc(1);
    ch_db.execute(SEED_TABLE).await?;
    ch_db
        .execute(&format!(
            "INSERT INTO attempts_seed_layout ({COLUMNS}) SELECT {COLUMNS} FROM attempts"
        ))
        .await?;
    setup.inc(1);
    for table in ["attempts", "attempts_seed_layout"] {
        ch_db
            .execute(&format!("OPTIMIZE TABLE {table} FINAL"))
            .await?;
        setup.inc(1);
    }

    let stores = sheaf_postgres::PostgresStores::new(pg_schema.config(8))?;
    stores.migrate().await?;
    pg::execute(
        &pg_schema.url,
        &format!(
            "INSERT INTO {events} (tenant_id, event_id, topic, event_time, data) \
             SELECT 'tenant-' || (k % 20), md5(k::text), 'order.created', \
                timestamptz 'epoch' + ({start_micros} + k * {step}::bigint) * interval '1 microsecond', \
                json_build_object('n', k, 'blob', \
                    (SELECT string_agg(md5(random()::text || i::text || k::text), '') \
                     FROM generate_series(1, 62) AS i)) \
             FROM generate_series(0, {last_event}) AS k; \
             INSERT INTO {attempts} (tenant_id, attempt_id, event_id, destination_id, number, \
                attempt_time, status, trigger, response_code, duration_ms, response_body, error, event_topic) \
             SELECT 'tenant-' || (k % 20), md5('attempt-' || n)::uuid, md5(k::text), \
                ('00000000-0000-7000-8000-' || lpad((n % 2)::text, 12, '0'))::uuid, 1 + a, \
                timestamptz 'epoch' + ({start_micros} + k * {step}::bigint + a * 60000000 + (n % 2) * 1000) \
                    * interval '1 microsecond', \
                'failed', 'scheduled', 503, 20, 'unavailable', NULL, 'order.created' \
             FROM generate_series(0, {last_attempt}) AS n, LATERAL (SELECT n / 4 AS k, (n % 4) / 2 AS a) AS x;",
            events = pg_schema.table("events"),
            attempts = pg_schema.table("attempts"),
            last_event = sizes.events - 1,
            last_attempt = sizes.events * 4 - 1,
        ),
    )
    .await?;
    setup.inc(1);
    // VACUUM cannot share a multi-statement string (an implicit transaction) with anything.
    for table in ["events", "attempts"] {
        pg::execute(
            &pg_schema.url,
            &format!("VACUUM ANALYZE {}", pg_schema.table(table)),
        )
        .await?;
    }
    setup.inc(1);
    setup.finish();

    // Keys: distinct per variant within a table, reused across tables.
    // Sheaf's layout asks the most keys over the month: single, 10, and three batch-of-100 sets
    // (lazy, eager, projection analysis off); within the window, two.
    let month_needed =
        sizes.single_queries + 10 * sizes.batch10_queries + 3 * 100 * sizes.batch100_queries;
    let near_needed = 2 * 100 * sizes.batch100_queries;
    let month_keys = pick_keys(&ch_db, i64::MIN, i64::MAX, month_needed).await?;
    let near_from = start_micros + SPAN_MICROS / 2;
    let near_keys = pick_keys(
        &ch_db,
        near_from,
        near_from + sizes.near_window_days * 86_400_000_000,
        near_needed,
    )
    .await?;
    ensure!(
        month_keys.len() == month_needed && near_keys.len() == near_needed,
        "found {} + {} keys, wanted {month_needed} + {near_needed}",
        month_keys.len(),
        near_keys.len()
    );

    let mut variants = Vec::new();
    for store in [
        Store::ClickHouseSheaf,
        Store::ClickHouseSeed,
        Store::Postgres,
    ] {
        let ch = store != Store::Postgres;
        let v = |keys_per_query, spread, lazy, queries| Variant {
            store,
            keys_per_query,
            spread,
            lazy,
            projections: true,
            queries,
        };
        variants.push(v(1, Spread::Month, true, sizes.single_queries));
        variants.push(v(10, Spread::Month, true, sizes.batch10_queries));
        variants.push(v(100, Spread::Month, true, sizes.batch100_queries));
        variants.push(v(100, Spread::Near, true, sizes.batch100_queries));
        if ch {
            variants.push(v(100, Spread::Month, false, sizes.batch100_queries));
        }
        if store == Store::ClickHouseSheaf {
            for spread in [Spread::Month, Spread::Near] {
                variants.push(Variant {
                    projections: false,
                    ..v(100, spread, true, sizes.batch100_queries)
                });
            }
        }
    }

    let progress = Progress::new("lookup: measure", variants.len() as u64 * 2);
    let mut measured = Vec::new();
    let mut pg_conn = pg_schema.connect().await?;
    for store in [
        Store::ClickHouseSheaf,
        Store::ClickHouseSeed,
        Store::Postgres,
    ] {
        // Each table's variants take their keys in turn, so no key is asked twice of a table
        // in the sequential phase.
        let (mut month_at, mut near_at) = (0, 0);
        for variant in variants.iter().filter(|v| v.store == store) {
            let need = variant.keys_per_query * variant.queries;
            let keys: &[AttemptKey] = match variant.spread {
                Spread::Month => {
                    month_at += need;
                    &month_keys[month_at - need..month_at]
                }
                Spread::Near => {
                    near_at += need;
                    &near_keys[near_at - need..near_at]
                }
            };
            let pool: &[AttemptKey] = match variant.spread {
                Spread::Month => &month_keys,
                Spread::Near => &near_keys,
            };
            let m = measure(
                &ch_db,
                &stores,
                &pg_schema,
                &mut pg_conn,
                &sizes,
                *variant,
                keys,
                pool,
                &progress,
            )
            .await
            .with_context(|| format!("{} {}", variant.store.label(), variant.shape()))?;
            measured.push(m);
        }
    }
    progress.finish();
    stores.close().await;
    base.close().await;

    let peak = crate::proc::peak_rss_kib(None);
    Ok(build_report(ctx, &sizes, measured, peak))
}

/// Up to `n` distinct triples whose first attempt is in `[from, to)`, in a hash order (event ids
/// have nothing to do with time), each keyed with that first attempt's time.
async fn pick_keys(db: &ChDb, from: i64, to: i64, n: usize) -> anyhow::Result<Vec<AttemptKey>> {
    let rows: Vec<(String, String, String, i64)> = db
        .client()
        .query(
            "SELECT tenant_id, event_id, toString(destination_id) AS d, \
                toUnixTimestamp64Micro(min(attempt_time)) AS t \
             FROM attempts GROUP BY tenant_id, event_id, destination_id \
             HAVING t >= ? AND t < ? \
             ORDER BY cityHash64(event_id, d) LIMIT ?",
        )
        .bind(from)
        .bind(to)
        .bind(n as u64)
        .fetch_all()
        .await
        .context("pick lookup keys")?;
    rows.into_iter()
        .map(|(tenant, event, destination, micros)| {
            Ok(AttemptKey {
                tenant_id: TenantId::new(tenant)?,
                event_id: EventId::new(event)?,
                destination_id: destination
                    .parse::<DestinationId>()
                    .map_err(|e| anyhow::anyhow!("destination id {destination}: {e}"))?,
                attempt_time: Timestamp::from_micros(micros)?,
            })
        })
        .collect()
}

fn runner(
    db: &ChDb,
    stores: &sheaf_postgres::PostgresStores,
    variant: Variant,
    tag: &str,
) -> anyhow::Result<Runner> {
    Ok(match variant.store {
        Store::ClickHouseSheaf => {
            let mut config = db.config();
            config
                .settings
                .push(("log_comment".to_owned(), tag.to_owned()));
            if !variant.lazy {
                config
                    .settings
                    .push((LAZY_SWITCH.to_owned(), "0".to_owned()));
            }
            Runner::Sheaf(Arc::new(ClickHouseLogStore::connect(config)?))
        }
        Store::ClickHouseSeed => {
            let mut client = db.client().with_setting("log_comment", tag);
            if !variant.lazy {
                client = client.with_setting(LAZY_SWITCH, "0");
            }
            Runner::Seed(Box::new(client))
        }
        Store::Postgres => Runner::Sheaf(stores.log_store()),
    })
}

#[allow(clippy::too_many_arguments)]
async fn measure(
    db: &ChDb,
    stores: &sheaf_postgres::PostgresStores,
    pg_schema: &PgSchema,
    pg_conn: &mut sqlx::PgConnection,
    sizes: &Sizes,
    variant: Variant,
    keys: &[AttemptKey],
    pool: &[AttemptKey],
    progress: &Progress,
) -> anyhow::Result<Measured> {
    let per = variant.keys_per_query;
    let tag = format!("{}-{}", db.database, variant.slug());
    let sat_tag = format!("{tag}-sat");
    let is_pg = variant.store == Store::Postgres;

    // Sequential: one query at a time, distinct keys.
    let runner_seq = runner(db, stores, variant, &tag)?;
    let before = if is_pg {
        pg::statement_totals(pg_conn, &pg_schema.schema).await?
    } else {
        StatementTotals::default()
    };
    let mut latencies = Vec::with_capacity(variant.queries);
    for batch in keys.chunks(per) {
        let started = Instant::now();
        let found = runner_seq.lookup(batch).await?;
        latencies.push(started.elapsed().as_secs_f64() * 1000.0);
        ensure!(
            found == batch.len(),
            "{found} of {} keys found",
            batch.len()
        );
    }
    let (cpu_ms_per_key, read_bytes_per_key, queries) = if is_pg {
        let delta = pg::statement_totals(pg_conn, &pg_schema.schema)
            .await?
            .since(before);
        let keys = keys.len() as f64;
        (
            delta.exec_ms / keys,
            delta.blocks as f64 * 8192.0 / keys,
            Vec::new(),
        )
    } else {
        let costs = ch::query_costs(&db.client(), &tag, "Select", variant.queries).await?;
        if costs.len() != variant.queries {
            bail!(
                "{} queries logged for {} lookups: each lookup must be one query",
                costs.len(),
                variant.queries
            );
        }
        let cpu = report::median(
            costs
                .iter()
                .map(|c| c.cpu_micros as f64 / 1000.0 / per as f64)
                .collect(),
        );
        let bytes = report::median(
            costs
                .iter()
                .map(|c| c.read_bytes as f64 / per as f64)
                .collect(),
        );
        (cpu, bytes, costs)
    };
    progress.inc(1);

    // Saturation: several clients, back to back, for a fixed time, over the whole key pool.
    let runner_sat = Arc::new(runner(db, stores, variant, &sat_tag)?);
    let pool = Arc::new(pool.to_vec());
    let answered = Arc::new(AtomicU64::new(0));
    let issued = Arc::new(AtomicU64::new(0));
    let before = if is_pg {
        pg::statement_totals(pg_conn, &pg_schema.schema).await?
    } else {
        StatementTotals::default()
    };
    let started = Instant::now();
    let deadline = started + sizes.saturation;
    let windows = (pool.len() / per).max(1);
    let mut tasks = Vec::new();
    let clients = sizes.clients;
    for client in 0..clients {
        let (runner, pool, answered, issued) = (
            Arc::clone(&runner_sat),
            Arc::clone(&pool),
            Arc::clone(&answered),
            Arc::clone(&issued),
        );
        tasks.push(tokio::spawn(async move {
            // Clients start at different windows so they do not ask the same keys together.
            let first = client * windows / clients;
            // Bounded by time, and by count in case the clock misbehaves.
            for step in 0..1_000_000 {
                if Instant::now() >= deadline {
                    break;
                }
                let at = ((first + step) % windows) * per;
                let batch = &pool[at..(at + per).min(pool.len())];
                issued.fetch_add(1, Ordering::Relaxed);
                let found = runner.lookup(batch).await?;
                answered.fetch_add(found as u64, Ordering::Relaxed);
            }
            anyhow::Ok(())
        }));
    }
    for task in tasks {
        task.await.context("a saturation client panicked")??;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let answered = answered.load(Ordering::Relaxed);
    let issued = issued.load(Ordering::Relaxed);
    let saturated_cpu_ms_per_key = if is_pg {
        let delta = pg::statement_totals(pg_conn, &pg_schema.schema)
            .await?
            .since(before);
        delta.exec_ms / answered.max(1) as f64
    } else {
        let costs = ch::query_costs(&db.client(), &sat_tag, "Select", issued as usize).await?;
        costs.iter().map(|c| c.cpu_micros as f64).sum::<f64>() / 1000.0 / answered.max(1) as f64
    };
    progress.inc(1);
    if let Runner::Sheaf(store) = runner_seq {
        drop(store);
    }
    Ok(Measured {
        variant,
        cpu_ms_per_key,
        read_bytes_per_key,
        latency_ms: report::median(latencies),
        keys_per_s: answered as f64 / elapsed,
        saturated_cpu_ms_per_key,
        saturated_queries: issued,
        queries,
    })
}

fn build_report(
    ctx: &Ctx,
    sizes: &Sizes,
    measured: Vec<Measured>,
    peak_kib: Option<u64>,
) -> Report {
    let mut report = Report::new("lookup", QUESTION, ctx);
    let find = |store: Store, keys: usize, spread: Spread, lazy: bool| {
        measured.iter().find(|m| {
            m.variant.store == store
                && m.variant.keys_per_query == keys
                && m.variant.spread == spread
                && m.variant.lazy == lazy
                && m.variant.projections
        })
    };
    let seed_single =
        find(Store::ClickHouseSeed, 1, Spread::Month, true).map_or(f64::NAN, |m| m.cpu_ms_per_key);

    let near = format!(
        "within {} day{}",
        sizes.near_window_days,
        if sizes.near_window_days == 1 { "" } else { "s" }
    );
    let mut table = Table::new(
        format!(
            "Per looked-up key, {} attempts (~2 KB payloads over 30 days); sequential medians, \
             then {} clients for {:.1} s",
            report::count(sizes.events as f64 * 4.0),
            sizes.clients,
            sizes.saturation.as_secs_f64()
        ),
        &[
            "store",
            "lookup",
            "keys' spread",
            "server CPU / key",
            "read / key",
            "latency / query",
            "lookups/s saturated",
            "CPU / key saturated",
            "seed single ÷ this (CPU)",
        ],
    );
    for m in &measured {
        let v = &m.variant;
        let cpu = if v.store == Store::Postgres {
            format!("{} (exec)", report::millis(m.cpu_ms_per_key))
        } else {
            report::millis(m.cpu_ms_per_key)
        };
        table.row(vec![
            v.store.label().to_owned(),
            v.shape(),
            match v.spread {
                Spread::Month => "30 days".to_owned(),
                Spread::Near => near.clone(),
            },
            cpu,
            report::bytes(m.read_bytes_per_key),
            report::millis(m.latency_ms),
            report::count(m.keys_per_s),
            report::millis(m.saturated_cpu_ms_per_key),
            if v.store == Store::Postgres {
                "—".to_owned()
            } else {
                report::ratio(seed_single / m.cpu_ms_per_key)
            },
        ]);
    }
    report.tables.push(table);

    let b100 = [
        find(Store::ClickHouseSheaf, 100, Spread::Month, true),
        find(Store::ClickHouseSheaf, 100, Spread::Near, true),
    ];
    if let [Some(month), Some(near_m)] = b100 {
        let worst_cpu = month.cpu_ms_per_key.max(near_m.cpu_ms_per_key);
        report.target(
            "ClickHouse, Sheaf's layout, batches of 100: server CPU per key",
            "at most 1 ms whatever the keys' time spread",
            format!(
                "{} (30 days), {} ({near})",
                report::millis(month.cpu_ms_per_key),
                report::millis(near_m.cpu_ms_per_key)
            ),
            worst_cpu <= 1.0,
        );
        let worst_ratio = seed_single / worst_cpu;
        report.target(
            "ClickHouse, Sheaf's batches of 100 against single lookups on the seed's layout (CPU per key)",
            "at least 10x less",
            format!(
                "{} single on the seed's layout ÷ {} = {}",
                report::millis(seed_single),
                report::millis(worst_cpu),
                report::ratio(worst_ratio)
            ),
            worst_ratio >= 10.0,
        );
        let worst_bytes = month.read_bytes_per_key.max(near_m.read_bytes_per_key);
        report.target(
            "ClickHouse, Sheaf's layout, batches of 100: bytes read per key",
            "at most 0.1 MB",
            format!(
                "{} (30 days), {} ({near})",
                report::bytes(month.read_bytes_per_key),
                report::bytes(near_m.read_bytes_per_key)
            ),
            worst_bytes <= 100_000.0,
        );
    }
    let no_projections: Vec<&Measured> =
        measured.iter().filter(|m| !m.variant.projections).collect();
    if let ([month, near_m, ..], [Some(with_month), Some(with_near)]) =
        (no_projections.as_slice(), b100)
    {
        let share = 1.0 - month.cpu_ms_per_key / with_month.cpu_ms_per_key;
        report.note(format!(
            "Diagnostic, not the store's configuration: with projection analysis off \
             (optimize_use_projections = 0) Sheaf's batch of 100 costs {} per key over 30 days and \
             {} {near}, against {} and {} as shipped, so projection analysis accounts for {:.0} % of \
             a 30-day batch's CPU here; system.query_log's QueryPlanOptimizeMicroseconds and \
             FilteringMarksWithPrimaryKeyMicroseconds show where a batch's CPU goes.",
            report::millis(month.cpu_ms_per_key),
            report::millis(near_m.cpu_ms_per_key),
            report::millis(with_month.cpu_ms_per_key),
            report::millis(with_near.cpu_ms_per_key),
            share.max(0.0) * 100.0,
        ));
    }
    report.memory.push(PeakRss::new(
        "sheaf-bench (Sheaf's stores and clients, in process)",
        peak_kib,
    ));
    report.note(
        "ClickHouse: CPU is ProfileEvents UserTimeMicroseconds + SystemTimeMicroseconds and bytes \
         are read_bytes from system.query_log, median query ÷ keys per query; saturated CPU is the \
         sum over the saturated phase ÷ keys answered.",
    );
    report.note(
        "Postgres: CPU is pg_stat_statements total_exec_time (time inside the executor, which for \
         cached index probes is CPU) and bytes are shared buffers hit + read × 8 KiB, both summed \
         over the phase ÷ keys; lookups/s is wall time at saturation.",
    );
    report.note(
        "Both ClickHouse tables are merged to one part per month partition before measuring \
         (OPTIMIZE … FINAL); the seed's layout is MergeTree ordered by (attempt_time, attempt_id) \
         with the default granularity. Servers, clients and other work share the machine's 2 cores.",
    );

    let cpu_bars = measured
        .iter()
        .map(|m| {
            Bar::new(
                m.variant.short(sizes),
                m.cpu_ms_per_key,
                m.variant.store as usize,
            )
        })
        .collect();
    let rate_bars = measured
        .iter()
        .map(|m| {
            Bar::new(
                m.variant.short(sizes),
                m.keys_per_s,
                m.variant.store as usize,
            )
        })
        .collect();
    report.figure = Some(
        Figure::new("lookup: cost per looked-up key (blue: Sheaf on ClickHouse, orange: seed's layout, green: Postgres)")
            .panel(Panel::Bars {
                title: "server CPU per key, sequential median (Postgres: execution time)".to_owned(),
                unit: "ms".to_owned(),
                log: true,
                bars: cpu_bars,
            })
            .panel(Panel::Bars {
                title: format!("lookups per second, {} clients at saturation", sizes.clients),
                unit: "keys/s".to_owned(),
                log: true,
                bars: rate_bars,
            }),
    );
    report.raw = serde_json::json!({
        "sizes": {
            "attempts": sizes.events * 4,
            "events": sizes.events,
            "saturation_s": sizes.saturation.as_secs_f64(),
            "clients": sizes.clients,
            "near_window_days": sizes.near_window_days,
        },
        "variants": measured,
    });
    report
}
