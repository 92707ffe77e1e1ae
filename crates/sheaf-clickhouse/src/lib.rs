//! Sheaf's [`LogStore`](sheaf_store::LogStore) on ClickHouse: the record of events and delivery
//! attempts where it lives at scale.
//!
//! ```text
//! let mut config = ClickHouseConfig::new("http://127.0.0.1:8123", "sheaf");
//! config.user = Some("sheaf".into());
//! config.password = Some(password);
//! config.write.max_wait = Duration::from_millis(500);   // 1–2 s on hot partitioned tables
//! config.retention = Some(Duration::from_secs(30 * 86_400));
//! let store = ClickHouseLogStore::connect(config)?;      // inside a tokio runtime; no I/O
//! store.migrate().await?;                                // idempotent, on every start
//! let log: Arc<dyn LogStore> = Arc::new(store);
//! ```
//!
//! - **Writes** go through two [`WriteCoalescer`](sheaf_coalesce::WriteCoalescer)s, one per
//!   table, each writing what it gathered as one RowBinary `INSERT`; `insert_many` returns when
//!   the writes carrying its records are done. Parts are bounded per wait window, not per call
//!   (docs/benchmarks.md, "parts"); the bounds and the wait are [`ClickHouseConfig::write`].
//! - **Latest attempts** use one batched query (see `latest.rs`): the asked triples through the
//!   primary key since the oldest key's bound, newest first, `LIMIT 1 BY` triple under an outer
//!   `LIMIT` with `query_plan_max_limit_for_lazy_materialization`; each key's own bound in Rust,
//!   a one-by-one fallback should the result reach the limit with a triple missing, and the same
//!   query without the setting on servers that refuse it.
//! - **Errors** from the driver become the store's kinds in one place (`error.rs`): network
//!   failures, timeouts and overload are `Unavailable`.
//!
//! # Schema, and why
//!
//! Two tables (plus `schema_migrations`), both `ReplacingMergeTree` partitioned by the month of
//! the record's own time, with the record's identity in the ordering key so merges drop the
//! copies a retried write leaves; every read deduplicates the copies not merged yet. Times are
//! `DateTime64(6, 'UTC')` (the store's `Timestamp` is microseconds), ids `UUID` or `String`,
//! payloads their JSON text. UUIDs compare natively in an order that is not their bytes', so
//! wherever ids break ties the SQL compares `toString(id)` or Rust sorts. The retention TTL,
//! when configured, expires rows by their own time; ClickHouse removes them when it merges.
//!
//! **`attempts` is ordered by `(tenant_id, event_id, destination_id, attempt_time, attempt_id)`**,
//! a layout for point reads, instead of the time-ordered `(attempt_time, attempt_id)` baseline
//! (docs/benchmarks.md, "lookup", earlier measurements). A latest-attempt key is then a
//! primary-key range, so a batch costs the same whether its keys are minutes or weeks apart; in
//! the time-ordered layout a key costs a granule of payloads and a batch is cheap only when its
//! keys are close in time (hence the retry path's 15-minute split, which this backend does not
//! need but does not mind).
//!
//! **Granules: `index_granularity = 256`, `index_granularity_bytes = 65536`.** The server reads a
//! returned row's payload lazily, but a `String` column is read from its granule's start, so a
//! lookup pays for the payloads before its row in the granule: read bytes follow the granule's byte
//! size, not its row count. Measured on 200,000 attempts with ~2 KB payloads (100-key batches, keys
//! in pairs; docs/benchmarks.md, "sheaf-clickhouse's cost test"): 256 rows per granule read 177 KB
//! per key; a byte bound of 128 KiB 50 KB; 64 KiB 26–32 KB; 32 rows 26 KB; server CPU stayed at
//! 40–65 ms per batch in all of them (it is per-query work). At 64 KiB the payload skipped is about
//! the size of the key columns read, and each further halving doubles the primary index (~100 B per
//! granule) for little. A byte bound also adapts: ~30 rows per granule at 2 KB payloads, the
//! 256-row cap for small ones, one row at the ~90 KB average payload of the retry-lookup
//! experiment's table (docs/benchmarks.md, "lookup", earlier measurements).
//!
//! **Listings newest first: a projection, not a skip index.** `by_tenant_time` holds the key and
//! filter columns ordered by `(tenant_id, time, id)`. A listing finds the page's keys there
//! (read in reverse order, `LIMIT 1 BY id` over key columns only, so copies cost no payload),
//! then reads the rows through the primary key and sorts and deduplicates them in Rust. A
//! minmax index on the time did not prune at all: within a tenant's range rows follow event
//! ids, which are idempotency keys with no relation to time (11,000 rows read for a 10,000-
//! attempt tenant with or without it). The projection costs ~2% of the table on disk (4.3 MiB
//! beside 384 MiB) and is written with each insert. On a tenant with 200,000 attempts a
//! 50-item page read 2,456 rows, 0.93 MB, 19 ms of CPU through it, against 200,600 rows,
//! 13.4 MB, 58 ms scanning the tenant (the cost test prints both). Reading it in order needs
//! small blocks (`max_block_size = 256`, `read_in_order_use_buffering = 0`), otherwise every
//! part reads a 65,409-row block first; a server that refuses those settings gets the query
//! without them. Deduplicating other ways was dearer on that tenant: `LIMIT 1 BY` over whole
//! rows turns lazy materialization off (21.5 MB, 34 ms on a 10,000-attempt tenant), `FINAL`
//! read 15 MB in 33 ms on the 200,000-attempt one.
//!
//! **`get_attempt` by id** uses a `bloom_filter` skip index on `attempt_id` (1.2 bytes a row;
//! 244 rows read instead of 2,806 for a 10,000-attempt tenant).
//!
//! **`events` is ordered by `(tenant_id, event_id)`**, for `get_events`, the first-delivery
//! path's batched payload read, with the same granularity and the same kind of projection.
//!
//! # Measured cost of a lookup
//!
//! `cargo test -p sheaf-clickhouse --test main -- cost --nocapture` with the servers up
//! (`cargo xtask services up`) prints this, from `system.query_log`: 200,000 attempts, ~2 KB
//! payloads over 30 days, keys spread over the month, medians per looked-up key, the same
//! queries on both layouts, one run on 2 cores (ClickHouse 26.9; kept with the other measurements
//! in docs/benchmarks.md, "sheaf-clickhouse's cost test"):
//!
//! | layout | lookup | read bytes / key | server CPU / key |
//! |---|---|---|---|
//! | this crate's | single | 64 KB | 6.9 ms |
//! | this crate's | batch of 10 | 41 KB | 2.0 ms |
//! | this crate's | batch of 100 | 49 KB | 0.65 ms |
//! | time-ordered baseline | single | 9.9 MB | 15.5 ms |
//! | time-ordered baseline | batch of 10 | 6.5 MB | 5.0 ms |
//! | time-ordered baseline | batch of 100 | 3.3 MB | 1.6 ms |
//!
//! CPU figures moved by up to ~20% between runs on this shared machine; bytes barely moved.
//! The largest 100-key batch read 5.3 MiB (the test's bound is 16 MiB). Batching remains the
//! larger lever for CPU (a query's fixed cost is most of a single lookup), the layout the
//! larger one for bytes.

mod config;
mod counts;
mod error;
mod http;
mod latest;
mod rows;
mod schema;
mod store;
mod tuning;
mod write;

pub use config::ClickHouseConfig;
pub use store::ClickHouseLogStore;
