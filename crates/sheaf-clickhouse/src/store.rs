//! [`ClickHouseLogStore`]: construction, migrations, and the [`LogStore`] methods other than the
//! latest-attempt lookups (which live in `latest.rs`).

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::future::Future;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use clickhouse::Client;
use serde::{Serialize, Serializer};
use sheaf_coalesce::WriteCoalescer;
use sheaf_store::{
    Attempt, AttemptFilter, AttemptId, AttemptKey, Cursor, Error, Event, EventFilter, EventId,
    EventKey, LogStore, Page, PageRequest, Result, TenantId, TimeRange,
};

use crate::config::ClickHouseConfig;
use crate::error::{LAZY_LIMIT_SETTING, from_driver, from_write, timed_out};
use crate::rows::{AttemptRow, EventRow};
use crate::tuning::OptionalSettings;
use crate::write::TableWriter;

/// Keys per `IN` list in one query. The trait asks backends to accept at least 1,000 keys per
/// call; a list of 1,000 tuples is ~100 KB of SQL, well inside the server's defaults, and larger
/// calls are split into queries of this size.
pub(crate) const MAX_KEYS_PER_QUERY: usize = 1000;

/// The settings of a listing's query. Reading a projection in reverse order stops early only
/// at block boundaries, and by default it reads (and buffers) blocks of up to 65,409 rows in
/// every part: on a tenant with 200,000 attempts, the first step of a 50-item page read all of
/// them (12.8 MB, 38 ms of CPU). With blocks of 256 rows and no read-ahead buffer it read 1,856
/// rows (0.1 MB, 5 ms). 256 is the table's `index_granularity`, the most rows a granule holds.
const LISTING_READ_CLAUSE: &str = " SETTINGS max_block_size = 256, read_in_order_use_buffering = 0";

/// The names in [`LISTING_READ_CLAUSE`], as a server names them when it refuses one.
const LISTING_READ_SETTINGS: &[&str] = &["max_block_size", "read_in_order_use_buffering"];

/// The log store on ClickHouse. Share it as `Arc<dyn LogStore>`.
///
/// ```text
/// let mut config = ClickHouseConfig::new("http://127.0.0.1:8123", "sheaf");
/// config.user = Some("sheaf".into());
/// config.password = Some(password);
/// config.write.max_wait = Duration::from_millis(500);
/// let store = ClickHouseLogStore::connect(config)?; // inside a tokio runtime
/// store.migrate().await?;
/// let log: Arc<dyn LogStore> = Arc::new(store);
/// ```
pub struct ClickHouseLogStore {
    /// Every query and insert; its default database is the configured one.
    pub(crate) client: Client,
    /// The same login without a default database, for `CREATE DATABASE`.
    pub(crate) admin: Client,
    pub(crate) config: ClickHouseConfig,
    events: WriteCoalescer<TableWriter<EventRow>>,
    attempts: WriteCoalescer<TableWriter<AttemptRow>>,
    /// `query_plan_max_limit_for_lazy_materialization` on the batched lookup.
    pub(crate) lazy_limit: OptionalSettings,
    /// The small-block, unbuffered in-order read of the listings' first step.
    pub(crate) listing_read: OptionalSettings,
    /// Keys looked up one by one because a batched result reached its row limit.
    pub(crate) row_limit_fallbacks: AtomicU64,
}

impl ClickHouseLogStore {
    /// Validates `config` and builds the store: HTTP clients and one write coalescer per table.
    /// It does not talk to the server; call [`migrate`](Self::migrate) before the first use.
    ///
    /// Must be called inside a Tokio runtime (the coalescers' workers are spawned on it).
    pub fn connect(config: ClickHouseConfig) -> Result<Self> {
        config.validate()?;
        let (admin, client) = clients(&config, &config.url)?;
        let coalescer_error = |e: sheaf_coalesce::ConfigError| {
            Error::invalid_input(format!("clickhouse write coalescer: {e}"))
        };
        let events = WriteCoalescer::new(
            TableWriter::new(client.clone(), config.request_timeout),
            config.write,
        )
        .map_err(coalescer_error)?;
        let attempts = WriteCoalescer::new(
            TableWriter::new(client.clone(), config.request_timeout),
            config.write,
        )
        .map_err(coalescer_error)?;
        Ok(ClickHouseLogStore {
            client,
            admin,
            config,
            events,
            attempts,
            lazy_limit: OptionalSettings::new(
                "batched latest-attempt lookups",
                &[LAZY_LIMIT_SETTING],
            ),
            listing_read: OptionalSettings::new("listings", LISTING_READ_SETTINGS),
            row_limit_fallbacks: AtomicU64::new(0),
        })
    }

    /// Stops accepting writes and waits for the ones already handed off. Later `insert_many`
    /// calls fail as [`Unavailable`](sheaf_store::ErrorKind::Unavailable).
    pub async fn close(&self) {
        self.events.close().await;
        self.attempts.close().await;
    }

    /// The configured database.
    pub fn database(&self) -> &str {
        &self.config.database
    }

    /// Whether the server refused `query_plan_max_limit_for_lazy_materialization` (unknown,
    /// read-only or constrained), so batched lookups are sent without it.
    pub fn lazy_limit_rejected(&self) -> bool {
        self.lazy_limit.rejected()
    }

    /// Whether the server refused the listings' read settings (`max_block_size`,
    /// `read_in_order_use_buffering`), so listings are sent without them.
    pub fn listing_settings_rejected(&self) -> bool {
        self.listing_read.rejected()
    }

    /// How many keys were looked up one by one because a batched result reached its row limit
    /// (duplicated rows not merged yet), since the store was built.
    pub fn row_limit_fallbacks(&self) -> u64 {
        self.row_limit_fallbacks.load(Ordering::Relaxed)
    }

    /// `future` with the request timeout, its driver error converted.
    pub(crate) async fn timed<T>(
        &self,
        what: &str,
        future: impl Future<Output = clickhouse::error::Result<T>>,
    ) -> Result<T> {
        self.timed_raw(what, future)
            .await?
            .map_err(|e| from_driver(what, e))
    }

    /// `future` with the request timeout; the driver's error is left to the caller, which may
    /// want to look at it (the lazy-limit fallback does).
    pub(crate) async fn timed_raw<T>(
        &self,
        what: &str,
        future: impl Future<Output = clickhouse::error::Result<T>>,
    ) -> Result<clickhouse::error::Result<T>> {
        let timeout = self.config.request_timeout;
        tokio::time::timeout(timeout, future)
            .await
            .map_err(|_| timed_out(what, timeout))
    }

    /// A listing's query: `sql` (whose binds are the tenant, `args`, then the row limit), with the
    /// listing read settings when `tuned`.
    fn listing_query(
        &self,
        sql: &str,
        tuned: bool,
        tenant: &TenantId,
        args: &[Arg],
        rows: u32,
    ) -> clickhouse::query::Query {
        let sql = if tuned {
            format!("{sql}{LISTING_READ_CLAUSE}")
        } else {
            sql.to_owned()
        };
        let mut query = self.client.query(&sql).bind(tenant.as_str());
        for arg in args {
            query = query.bind(arg.clone());
        }
        query.bind(rows)
    }

    pub(crate) async fn execute_on(&self, client: &Client, what: &str, sql: &str) -> Result<()> {
        self.timed(what, client.query_raw(sql).execute()).await
    }
}

/// The clients for the server at `url`: one without a default database (for `CREATE
/// DATABASE`), and one with the configured database, which every other statement uses. Both
/// log in as configured and send the configured settings; on a cluster also the two that
/// reads and writes through its `Distributed` tables need (`migrate.rs`).
pub(crate) fn clients(config: &ClickHouseConfig, url: &str) -> Result<(Client, Client)> {
    let mut admin = crate::http::client(config.ca_file.as_deref())?.with_url(url);
    if let Some(user) = &config.user {
        admin = admin.with_user(user.as_str());
    }
    if let Some(password) = &config.password {
        admin = admin.with_password(password.as_str());
    }
    if config.cluster.is_some() {
        for (name, value) in crate::migrate::CLUSTER_SETTINGS {
            admin = admin.with_setting(*name, *value);
        }
    }
    for (name, value) in &config.settings {
        admin = admin.with_setting(name.as_str(), value.as_str());
    }
    let client = admin.clone().with_database(config.database.as_str());
    Ok((admin, client))
}

impl fmt::Debug for ClickHouseLogStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClickHouseLogStore")
            .field("config", &self.config)
            .field("lazy_limit_rejected", &self.lazy_limit_rejected())
            .field("row_limit_fallbacks", &self.row_limit_fallbacks())
            .finish_non_exhaustive()
    }
}

/// A bound value of a dynamically built query: the clickhouse crate binds anything `Serialize`,
/// and one vector of these keeps the binds in the order their `?` appear.
#[derive(Debug, Clone)]
enum Arg {
    Text(String),
    Int(i64),
}

impl Serialize for Arg {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        match self {
            Arg::Text(text) => serializer.serialize_str(text),
            Arg::Int(int) => serializer.serialize_i64(*int),
        }
    }
}

/// `AND`-ed conditions and their bound values, built in order.
#[derive(Debug, Default)]
struct Conditions {
    sql: String,
    args: Vec<Arg>,
}

impl Conditions {
    fn push(&mut self, condition: &str, args: impl IntoIterator<Item = Arg>) {
        self.sql.push_str(" AND ");
        self.sql.push_str(condition);
        self.args.extend(args);
    }

    fn time_range(&mut self, column: &str, range: &TimeRange) {
        if let Some(since) = range.since {
            self.push(
                &format!("{column} >= fromUnixTimestamp64Micro(?, 'UTC')"),
                [Arg::Int(since.as_micros())],
            );
        }
        if let Some(until) = range.until {
            self.push(
                &format!("{column} < fromUnixTimestamp64Micro(?, 'UTC')"),
                [Arg::Int(until.as_micros())],
            );
        }
    }

    /// Strictly after `(time, id)` in newest-first order. The time alone is stated too, so that
    /// partition pruning and the projection's index can use it.
    fn before_cursor(&mut self, time_column: &str, id_expression: &str, cursor: (i64, String)) {
        let (micros, id) = cursor;
        self.push(
            &format!(
                "{time_column} <= fromUnixTimestamp64Micro(?, 'UTC') \
                 AND ({time_column} < fromUnixTimestamp64Micro(?, 'UTC') OR {id_expression} < ?)"
            ),
            [Arg::Int(micros), Arg::Int(micros), Arg::Text(id)],
        );
    }
}

/// Keeps the first copy of each record (rows not merged yet repeat), sorts newest first by
/// `(time, id)` and cuts the page, with a cursor when more matched.
fn into_page<T, K: Ord + Clone + std::hash::Hash>(
    mut items: Vec<T>,
    limit: usize,
    order_key: impl Fn(&T) -> K,
    cursor_of: impl Fn(&T) -> Cursor,
) -> Page<T> {
    let mut seen = HashSet::with_capacity(items.len());
    items.retain(|item| seen.insert(order_key(item)));
    items.sort_by_key(|item| std::cmp::Reverse(order_key(item)));
    Page::from_overfetch(items, limit, cursor_of)
}

#[async_trait]
impl LogStore for ClickHouseLogStore {
    async fn insert_many(&self, events: &[Event], attempts: &[Attempt]) -> Result<()> {
        // Queue both first so the two tables' writes proceed side by side, then wait for both:
        // the call returns only when every record is durable.
        let events_done = if events.is_empty() {
            None
        } else {
            let rows = events.iter().map(EventRow::from_event).collect();
            Some(self.events.enqueue(rows).await.map_err(from_write)?)
        };
        let attempts_done = if attempts.is_empty() {
            None
        } else {
            let rows = attempts.iter().map(AttemptRow::from_attempt).collect();
            Some(self.attempts.enqueue(rows).await.map_err(from_write)?)
        };
        if let Some(done) = events_done {
            done.await.map_err(from_write)?;
        }
        if let Some(done) = attempts_done {
            done.await.map_err(from_write)?;
        }
        Ok(())
    }

    async fn get_event(&self, tenant: &TenantId, id: &EventId) -> Result<Option<Event>> {
        let row: Option<EventRow> = self
            .timed(
                "get an event",
                self.client
                    .query(
                        "SELECT ?fields FROM events WHERE tenant_id = ? AND event_id = ? LIMIT 1",
                    )
                    .bind(tenant.as_str())
                    .bind(id.as_str())
                    .fetch_optional(),
            )
            .await?;
        row.map(EventRow::into_event).transpose()
    }

    async fn get_events(&self, keys: &[EventKey]) -> Result<HashMap<EventKey, Event>> {
        let distinct: Vec<&EventKey> = {
            let mut seen = HashSet::with_capacity(keys.len());
            keys.iter().filter(|key| seen.insert(*key)).collect()
        };
        let mut found = HashMap::with_capacity(distinct.len());
        for chunk in distinct.chunks(MAX_KEYS_PER_QUERY) {
            let pairs: Vec<(&str, &str)> = chunk
                .iter()
                .map(|key| (key.tenant_id.as_str(), key.event_id.as_str()))
                .collect();
            let rows: Vec<EventRow> = self
                .timed(
                    "get events",
                    self.client
                        .query("SELECT ?fields FROM events WHERE (tenant_id, event_id) IN ?")
                        .bind(pairs)
                        .fetch_all(),
                )
                .await?;
            for row in rows {
                let event = row.into_event()?;
                found.entry(event.key()).or_insert(event);
            }
        }
        Ok(found)
    }

    async fn list_events(
        &self,
        tenant: &TenantId,
        filter: &EventFilter,
        page: &PageRequest,
    ) -> Result<Page<Event>> {
        page.validate()?;
        let mut conditions = Conditions::default();
        if let Some(topic) = &filter.topic {
            conditions.push("topic = ?", [Arg::Text(topic.clone())]);
        }
        conditions.time_range("event_time", &filter.time);
        if let Some(cursor) = &page.cursor {
            let id = EventId::new(cursor.id())?;
            conditions.before_cursor(
                "event_time",
                "event_id",
                (cursor.time().as_micros(), id.into_string()),
            );
        }
        // Step one finds the page's keys, deduplicated, newest first: the optimizer answers it
        // from the `by_tenant_time` projection, read in reverse order, so it stops after a few
        // granules however many events the tenant has. Step two reads those rows through the
        // primary key, so payloads are read for the page's rows only. (Crate docs: figures.)
        let sql = format!(
            "SELECT ?fields FROM events WHERE (tenant_id, event_id, event_time) IN ( \
                SELECT tenant_id, event_id, event_time FROM events \
                WHERE tenant_id = ?{} \
                ORDER BY event_time DESC, event_id DESC \
                LIMIT 1 BY event_id \
                LIMIT ?)",
            conditions.sql
        );
        let rows: Vec<EventRow> = self
            .fetch_all_tuned("list events", &self.listing_read, |tuned| {
                self.listing_query(&sql, tuned, tenant, &conditions.args, page.limit + 1)
            })
            .await?;
        let events = rows
            .into_iter()
            .map(EventRow::into_event)
            .collect::<Result<Vec<_>>>()?;
        Ok(into_page(
            events,
            page.limit_usize(),
            |e| (e.time, e.id.clone()),
            |e| Cursor::new(e.time, e.id.as_str()),
        ))
    }

    async fn get_attempt(&self, tenant: &TenantId, id: &AttemptId) -> Result<Option<Attempt>> {
        // The `attempt_id_bloom` skip index narrows this to the granules that may hold the id.
        let row: Option<AttemptRow> = self
            .timed(
                "get an attempt",
                self.client
                    .query(
                        "SELECT ?fields FROM attempts WHERE tenant_id = ? AND attempt_id = ? LIMIT 1",
                    )
                    .bind(tenant.as_str())
                    .bind(id.to_string())
                    .fetch_optional(),
            )
            .await?;
        row.map(AttemptRow::into_attempt).transpose()
    }

    async fn list_attempts(
        &self,
        tenant: &TenantId,
        filter: &AttemptFilter,
        page: &PageRequest,
    ) -> Result<Page<Attempt>> {
        page.validate()?;
        let mut conditions = Conditions::default();
        if let Some(event_id) = &filter.event_id {
            conditions.push("event_id = ?", [Arg::Text(event_id.as_str().to_owned())]);
        }
        if let Some(destination) = &filter.destination_id {
            conditions.push("destination_id = ?", [Arg::Text(destination.to_string())]);
        }
        if let Some(status) = filter.status {
            conditions.push("status = ?", [Arg::Text(status.as_str().to_owned())]);
        }
        if let Some(topic) = &filter.topic {
            conditions.push("event_topic = ?", [Arg::Text(topic.clone())]);
        }
        conditions.time_range("attempt_time", &filter.time);
        if let Some(cursor) = &page.cursor {
            let id = AttemptId::from_str(cursor.id())?;
            // UUIDs compare natively in an order that is not the bytes' order; their canonical
            // strings compare bytewise, which is the order every backend shares.
            conditions.before_cursor(
                "attempt_time",
                "toString(attempt_id)",
                (cursor.time().as_micros(), id.to_string()),
            );
        }
        // As for events. UUIDs sort natively in another order than bytewise, so step one orders
        // by time only (the projection's order, which lets it stop early) and keeps every row
        // tied with the last one (`WITH TIES`); the exact order is applied here, in Rust.
        let sql = format!(
            "SELECT ?fields FROM attempts \
             WHERE (tenant_id, event_id, destination_id, attempt_time, attempt_id) IN ( \
                SELECT tenant_id, event_id, destination_id, attempt_time, attempt_id FROM attempts \
                WHERE tenant_id = ?{} \
                ORDER BY attempt_time DESC \
                LIMIT 1 BY attempt_id \
                LIMIT ? WITH TIES)",
            conditions.sql
        );
        let rows: Vec<AttemptRow> = self
            .fetch_all_tuned("list attempts", &self.listing_read, |tuned| {
                self.listing_query(&sql, tuned, tenant, &conditions.args, page.limit + 1)
            })
            .await?;
        let attempts = rows
            .into_iter()
            .map(AttemptRow::into_attempt)
            .collect::<Result<Vec<_>>>()?;
        Ok(into_page(
            attempts,
            page.limit_usize(),
            |a| (a.time, a.id),
            |a| Cursor::new(a.time, a.id.to_string()),
        ))
    }

    async fn latest_attempt(&self, key: &AttemptKey) -> Result<Option<Attempt>> {
        self.latest_one(key).await
    }

    async fn latest_attempts(&self, keys: &[AttemptKey]) -> Result<HashMap<AttemptKey, Attempt>> {
        self.latest_many(keys).await
    }

    async fn count_attempts(
        &self,
        tenant: &TenantId,
        buckets: &sheaf_store::Buckets,
    ) -> Result<Vec<sheaf_store::AttemptCounts>> {
        self.count_buckets(tenant, buckets).await
    }

    async fn ping(&self) -> Result<()> {
        let answer: Result<u8> = self
            .timed("ping", self.client.query("SELECT 1").fetch_one())
            .await;
        match answer {
            Ok(_) => Ok(()),
            Err(Error::Backend { message, source }) => Err(Error::Unavailable { message, source }),
            Err(other) => Err(other),
        }
    }
}
