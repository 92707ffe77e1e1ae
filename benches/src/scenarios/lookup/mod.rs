//! `lookup`: what one looked-up key costs the server, single and batched: the experiment behind
//! the retry path's coalesced latest-attempt lookups (docs/benchmarks.md, "`lookup`", with its
//! earlier measurements).
//!
//! Longer than 600 lines because the variants, their diagnostic tweaks and the runners that
//! query each table are one list of experiments that reads top to bottom; the measuring is in
//! `measure.rs` and the tables in `summary.rs`.
//!
//! The same attempts (~2 KB payloads over 30 days; 1,000,000 at full size) are generated
//! server-side in three places: ClickHouse in Sheaf's layout (the `attempts` table of
//! `sheaf-clickhouse`), ClickHouse in the time-ordered baseline layout (`sheaf_testenv`'s
//! `time_ordered`: ordered by `(attempt_time, attempt_id)`, payload in the row, default
//! granularity), and Postgres (Sheaf's schema, payload in `events`).
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
//!   time-ordered layout gets the same two query shapes by hand, on its table.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, ensure};
use clickhouse::Client;
use serde::Serialize;
use sheaf_clickhouse::ClickHouseLogStore;
use sheaf_store::{AttemptKey, DestinationId, EventId, LogStore, TenantId, Timestamp};
use sheaf_testenv::clickhouse::time_ordered;

use crate::ch::{self, ChDb};
use crate::context::Ctx;
use crate::pg::{self, PgSchema};
use crate::progress::Progress;
use crate::report::Report;

mod measure;
mod summary;

use measure::measure;
use summary::build_report;

const QUESTION: &str = "What does one looked-up key cost the server (CPU, bytes, throughput) when \
    lookups are single or batched by 10 or 100, in Sheaf's ClickHouse layout, in the time-ordered \
    baseline layout and in Postgres?";

/// The columns of Sheaf's `attempts` table, which the generated rows fill.
const COLUMNS: &str = "tenant_id, event_id, destination_id, attempt_time, attempt_id, number, \
    status, trigger, response_code, duration_ms, response_body, error, event_topic, event_data";

/// Thirty days in microseconds: the span of the generated attempts.
const SPAN_MICROS: i64 = 30 * 86_400 * 1_000_000;

/// The switch for lazy materialization: `…_max_limit_for_lazy_materialization = 0` means "no
/// limit", not "off" (docs/benchmarks.md, "`lookup`", earlier measurements).
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
    ClickHouseTimeOrdered,
    Postgres,
}

impl Store {
    fn label(self) -> &'static str {
        match self {
            Store::ClickHouseSheaf => "ClickHouse, Sheaf's layout",
            Store::ClickHouseTimeOrdered => "ClickHouse, time-ordered layout",
            Store::Postgres => "Postgres, Sheaf's schema",
        }
    }

    fn short(self) -> &'static str {
        match self {
            Store::ClickHouseSheaf => "CH sheaf",
            Store::ClickHouseTimeOrdered => "CH time-ordered",
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
    /// A diagnostic change to Sheaf's batch (its query settings, its shape or its table), or none.
    tweak: Tweak,
    queries: usize,
}

/// The diagnostics measured beside Sheaf's batch of 100, to show what its CPU depends on. None
/// of them is the store's configuration; each row says what it changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
enum Tweak {
    /// The store as shipped.
    None,
    /// `optimize_use_projections = 0`: no planning against the `by_tenant_time` projection.
    ProjectionsOff,
    /// `use_skip_indexes = 0, use_query_condition_cache = 0`: neither the `attempt_id` bloom
    /// filter nor the query condition cache is consulted.
    SkipIndexesOff,
    /// `optimize_read_in_order = 0`.
    ReadInOrderOff,
    /// The earlier two-step shape (the newest `(time, id)` per triple in a grouped subquery, then
    /// the rows by those keys), by hand on Sheaf's table.
    TwoStep,
    /// Sheaf's query by hand on a copy of the table with 128 KiB granules
    /// (`index_granularity_bytes = 131072`, `index_granularity = 1024`).
    Granules128K,
    /// Sheaf's query by hand on a copy of the table with a shorter primary key,
    /// `PRIMARY KEY (tenant_id, event_id, destination_id)`, the sort key unchanged.
    ShortPrimaryKey,
}

impl Tweak {
    fn label(self) -> &'static str {
        match self {
            Tweak::None => "",
            Tweak::ProjectionsOff => "projection analysis off",
            Tweak::SkipIndexesOff => "skip indexes and query condition cache off",
            Tweak::ReadInOrderOff => "read in order off",
            Tweak::TwoStep => "two-step shape (before)",
            Tweak::Granules128K => "table with 128 KiB granules",
            Tweak::ShortPrimaryKey => "table with PRIMARY KEY (tenant, event, destination)",
        }
    }

    fn short(self) -> &'static str {
        match self {
            Tweak::None => "",
            Tweak::ProjectionsOff => ", no proj.",
            Tweak::SkipIndexesOff => ", no skip idx",
            Tweak::ReadInOrderOff => ", no in-order",
            Tweak::TwoStep => ", two-step",
            Tweak::Granules128K => ", 128 KiB gran.",
            Tweak::ShortPrimaryKey => ", PK of 3",
        }
    }

    /// Query settings the tweak sends with every lookup.
    fn settings(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Tweak::ProjectionsOff => &[("optimize_use_projections", "0")],
            Tweak::SkipIndexesOff => &[
                ("use_skip_indexes", "0"),
                ("use_query_condition_cache", "0"),
            ],
            Tweak::ReadInOrderOff => &[("optimize_read_in_order", "0")],
            _ => &[],
        }
    }

    /// The table a by-hand variant reads, for those that do not go through the store.
    fn by_hand_table(self) -> Option<&'static str> {
        match self {
            Tweak::TwoStep => Some("attempts"),
            Tweak::Granules128K => Some(GRANULES_128K_TABLE),
            Tweak::ShortPrimaryKey => Some(SHORT_PK_TABLE),
            _ => None,
        }
    }
}

/// The copy of `attempts` with 128 KiB granules.
const GRANULES_128K_TABLE: &str = "attempts_granules_128k";
/// The copy of `attempts` whose primary key is the triple only.
const SHORT_PK_TABLE: &str = "attempts_short_pk";

impl Variant {
    fn shape(&self) -> String {
        let base = match self.keys_per_query {
            1 => "single".to_owned(),
            n => format!("batch of {n}"),
        };
        if self.store != Store::Postgres && self.keys_per_query > 1 && !self.lazy {
            format!("{base}, lazy materialization off")
        } else if self.tweak != Tweak::None {
            format!("{base}, {}", self.tweak.label())
        } else {
            base
        }
    }

    fn slug(&self) -> String {
        format!(
            "{:?}-{}-{:?}-{}-{:?}",
            self.store,
            self.keys_per_query,
            self.spread,
            if self.lazy { "lazy" } else { "eager" },
            self.tweak
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
        } else {
            self.tweak.short()
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
    TimeOrdered(Box<Client>),
    /// A Sheaf-layout table queried by hand: the earlier two-step shape, or Sheaf's query on a
    /// copy of the table with another layout.
    ByHand {
        client: Box<Client>,
        table: &'static str,
        two_step: bool,
    },
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
            Runner::TimeOrdered(client) => {
                let rows = time_ordered::lookup(client, keys, "TabSeparated").await?;
                Ok(rows.iter().filter(|b| **b == b'\n').count())
            }
            Runner::ByHand {
                client,
                table,
                two_step,
            } => {
                let (triples, oldest) = time_ordered::batch_binds(keys);
                let mut query = client
                    .query(&by_hand_sql(table, keys.len(), *two_step))
                    .bind(triples)
                    .bind(oldest);
                if *two_step {
                    query = query.bind(oldest);
                }
                let rows = query.fetch_bytes("TabSeparated")?.collect().await?;
                Ok(rows.iter().filter(|b| **b == b'\n').count())
            }
        }
    }
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

    let setup = Progress::new("lookup: generate data", 8);
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
    ch_db
        .execute(&time_ordered::create_table("attempts"))
        .await?;
    ch_db.execute(&time_ordered::copy_from("attempts")).await?;
    setup.inc(1);
    for table in ["attempts", time_ordered::TABLE] {
        ch_db
            .execute(&format!("OPTIMIZE TABLE {table} FINAL"))
            .await?;
        setup.inc(1);
    }

    // The layouts measured beside Sheaf's, on the same rows.
    copy_attempts(
        &ch_db,
        GRANULES_128K_TABLE,
        "index_granularity = 256, index_granularity_bytes = 65536",
        "index_granularity = 1024, index_granularity_bytes = 131072",
    )
    .await?;
    setup.inc(1);
    copy_attempts(
        &ch_db,
        SHORT_PK_TABLE,
        "ORDER BY (tenant_id, event_id, destination_id, attempt_time, attempt_id)",
        "PRIMARY KEY (tenant_id, event_id, destination_id) \
         ORDER BY (tenant_id, event_id, destination_id, attempt_time, attempt_id)",
    )
    .await?;
    setup.inc(1);

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

    let mut variants = Vec::new();
    for store in [
        Store::ClickHouseSheaf,
        Store::ClickHouseTimeOrdered,
        Store::Postgres,
    ] {
        let ch = store != Store::Postgres;
        let v = |keys_per_query, spread, lazy, queries| Variant {
            store,
            keys_per_query,
            spread,
            lazy,
            tweak: Tweak::None,
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
            let tweaked = |tweak, spread| Variant {
                tweak,
                ..v(100, spread, true, sizes.batch100_queries)
            };
            for spread in [Spread::Month, Spread::Near] {
                variants.push(tweaked(Tweak::TwoStep, spread));
                variants.push(tweaked(Tweak::ProjectionsOff, spread));
            }
            for tweak in [
                Tweak::SkipIndexesOff,
                Tweak::ReadInOrderOff,
                Tweak::Granules128K,
                Tweak::ShortPrimaryKey,
            ] {
                variants.push(tweaked(tweak, Spread::Month));
            }
        }
    }

    // Keys: distinct per variant within a table (Sheaf's variants, its copies included, share
    // one sequence), reused across tables.
    let needed = |spread: Spread| {
        [
            Store::ClickHouseSheaf,
            Store::ClickHouseTimeOrdered,
            Store::Postgres,
        ]
        .iter()
        .map(|store| {
            variants
                .iter()
                .filter(|v| v.store == *store && v.spread == spread)
                .map(|v| v.keys_per_query * v.queries)
                .sum::<usize>()
        })
        .max()
        .unwrap_or(0)
    };
    let (month_needed, near_needed) = (needed(Spread::Month), needed(Spread::Near));
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

    let progress = Progress::new("lookup: measure", variants.len() as u64 * 2);
    let mut measured = Vec::new();
    let mut pg_conn = pg_schema.connect().await?;
    for store in [
        Store::ClickHouseSheaf,
        Store::ClickHouseTimeOrdered,
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
            for (name, value) in variant.tweak.settings() {
                config
                    .settings
                    .push(((*name).to_owned(), (*value).to_owned()));
            }
            match variant.tweak.by_hand_table() {
                Some(table) => Runner::ByHand {
                    client: Box::new(db.client().with_setting("log_comment", tag)),
                    table,
                    two_step: variant.tweak == Tweak::TwoStep,
                },
                None => Runner::Sheaf(Arc::new(ClickHouseLogStore::connect(config)?)),
            }
        }
        Store::ClickHouseTimeOrdered => {
            let mut client = db.client().with_setting("log_comment", tag);
            if !variant.lazy {
                client = client.with_setting(LAZY_SWITCH, "0");
            }
            Runner::TimeOrdered(Box::new(client))
        }
        Store::Postgres => Runner::Sheaf(stores.log_store()),
    })
}

/// The by-hand batch on `table`: Sheaf's query (binds: the triples, the oldest bound), or the
/// earlier two-step shape (binds: the triples, the oldest bound twice), both with the lazy
/// materialization limit as the store sends it.
fn by_hand_sql(table: &str, limit: usize, two_step: bool) -> String {
    let body = if two_step {
        format!(
            "SELECT {COLUMNS} FROM {table} \
             WHERE (tenant_id, event_id, destination_id, attempt_time, attempt_id) IN ( \
                SELECT tenant_id, event_id, destination_id, \
                    argMax(attempt_time, (attempt_time, toString(attempt_id))), \
                    argMax(attempt_id, (attempt_time, toString(attempt_id))) \
                FROM {table} \
                WHERE (tenant_id, event_id, destination_id) IN ? \
                    AND attempt_time >= fromUnixTimestamp64Micro(?, 'UTC') \
                GROUP BY tenant_id, event_id, destination_id) \
             AND attempt_time >= fromUnixTimestamp64Micro(?, 'UTC') \
             ORDER BY attempt_time DESC"
        )
    } else {
        format!(
            "SELECT {COLUMNS} FROM {table} \
             WHERE (tenant_id, event_id, destination_id) IN ? \
                AND attempt_time >= fromUnixTimestamp64Micro(?, 'UTC') \
             ORDER BY tenant_id, event_id, destination_id, \
                attempt_time DESC, toString(attempt_id) DESC \
             LIMIT 1 BY tenant_id, event_id, destination_id"
        )
    };
    format!("{body} LIMIT {limit} SETTINGS query_plan_max_limit_for_lazy_materialization = {limit}")
}

/// Creates `copy`, a copy of Sheaf's `attempts` (its statement as the server prints it, with
/// `from` replaced by `to`), fills it with the same rows and merges it like the original.
async fn copy_attempts(db: &ChDb, copy: &str, from: &str, to: &str) -> anyhow::Result<()> {
    let statement: String = db
        .client()
        .query(
            "SELECT create_table_query FROM system.tables WHERE database = ? AND name = 'attempts'",
        )
        .bind(db.database.as_str())
        .fetch_one()
        .await
        .context("read the attempts table's statement")?;
    let name = format!("{}.attempts ", db.database);
    ensure!(
        statement.contains(&name) && statement.contains(from),
        "unexpected statement for attempts: {statement}"
    );
    let statement = statement
        .replacen(&name, &format!("{}.{copy} ", db.database), 1)
        .replacen(from, to, 1);
    db.execute(&statement).await?;
    db.execute(&format!("INSERT INTO {copy} SELECT * FROM attempts"))
        .await?;
    db.execute(&format!("OPTIMIZE TABLE {copy} FINAL")).await
}
