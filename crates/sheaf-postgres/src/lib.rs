//! Sheaf's stores on Postgres (sqlx): the [`LogStore`], the [`JobQueue`], the [`EntityStore`]
//! and the [`ReplayStore`] of `sheaf-store`, with their migrations embedded.
//!
//! ```text
//! let stores = PostgresStores::new(PostgresConfig::new(url))?; // no I/O yet
//! stores.migrate().await?;                                      // creates or updates the schema
//! let log: Arc<dyn LogStore> = stores.log_store();
//! let queue: Arc<dyn JobQueue> = stores.job_queue();
//! let entities: Arc<dyn EntityStore> = stores.entity_store();
//! let replays: Arc<dyn ReplayStore> = stores.replay_store();
//! ```
//!
//! - **One schema** ([`PostgresConfig::schema`], `sheaf` by default) holds every table; each
//!   statement names its tables with the schema, so several Sheaf deployments (or test runs) can
//!   share a database without sharing state.
//! - **Log**: `events` and `attempts`; a batch is one `INSERT … SELECT FROM unnest(…)` statement,
//!   and the batched latest-attempt lookup is one `LATERAL` statement, one index probe per key
//!   (the statement retries coming due together share). See `migrations/0001_log.sql` for the
//!   indexes and why each exists.
//! - **Queue**: leases instead of held transactions and savepoints, one claimer per process; see
//!   [`PostgresJobQueue`] and `migrations/0002_queue.sql`.
//! - **Outbox**: with the queue here, a publish commits its event and jobs in one statement, and an
//!   attempt commits with its job's outcome; see [`PostgresOutbox`] and
//!   `migrations/0004_outbox.sql`.
//! - **Entities**: `tenants` and `destinations`, secrets stored as given; a destination's payload
//!   filter is a `jsonb` column holding the filter as the API accepted it. Delivery health (the
//!   consecutive failures, and the automatic disable at the limit) is one statement per batch of
//!   reports, locking the rows it changes in id order so concurrent batches neither lose a
//!   failure nor deadlock, and skipping the rows it would not change; see
//!   `migrations/0006_destination_health.sql` for the columns.
//! - **Replays**: one row per bulk replay, written once per page of its source under a lease on
//!   the server's clock, taken over like a queue claim when the lease runs out; see
//!   [`PostgresReplayStore`] and `migrations/0009_replays.sql`.
//! - **Errors** are mapped in one place (`error.rs`): an unreachable, restarting or overloaded
//!   server is [`sheaf_store::Error::Unavailable`], never a panic.
//!
//! No transaction is ever held while a caller works: every trait call is one statement (a
//! latest-attempt call over more than 1,000 distinct keys is split into statements of 1,000), or
//! one short transaction (an outbox settlement). The exceptions are [`PostgresStores::migrate`]
//! and an outbox shipment, which holds its transaction while its records are written to the log
//! store, so that they leave the outbox only once they are there.

mod config;
mod db;
mod entity;
mod error;
mod log;
mod migrate;
mod outbox;
mod queue;
mod replay;

use std::sync::Arc;

use sheaf_store::{EntityStore, JobQueue, LogStore, Outbox, ReplayStore, Result};
use sqlx::PgPool;

pub use config::{DEFAULT_SCHEMA, PostgresConfig, PostgresTls};
pub use entity::PostgresEntityStore;
pub use log::PostgresLogStore;
pub use outbox::{OutboxLayout, PostgresOutbox};
pub use queue::{PostgresJobQueue, VACUUM_AFTER_DEAD_ROWS, claim_sql};
pub use replay::PostgresReplayStore;

use crate::db::Db;

/// The stores over one connection pool and one schema.
#[derive(Debug, Clone)]
pub struct PostgresStores {
    db: Db,
    schema: String,
    log: PostgresLogStore,
    queue: PostgresJobQueue,
    entities: PostgresEntityStore,
    replays: PostgresReplayStore,
}

impl PostgresStores {
    /// Validates `config` and builds the pool, which connects on first use: no I/O happens here,
    /// so a process may start before its database answers (each call then fails as
    /// `Unavailable` until it does). [`Error::InvalidInput`](sheaf_store::Error::InvalidInput)
    /// names a field that cannot work. Must be called inside a tokio runtime.
    pub fn new(config: PostgresConfig) -> Result<Self> {
        let pool = config.pool()?;
        let db = Db::new(pool, &config.schema);
        let queue = PostgresJobQueue::new(db.clone());
        Ok(PostgresStores {
            log: PostgresLogStore::new(db.clone()),
            replays: PostgresReplayStore::new(db.clone(), queue.clone()),
            queue,
            entities: PostgresEntityStore::new(db.clone()),
            schema: config.schema,
            db,
        })
    }

    /// Creates the schema if needed and applies the embedded migrations it lacks; returns the
    /// versions applied (empty when it was up to date). Safe to call from several processes at
    /// once: they take turns, and each migration is applied once.
    pub async fn migrate(&self) -> Result<Vec<i64>> {
        migrate::run(&self.db.pool, &self.schema).await
    }

    /// Whether the pool's connections are encrypted, as the server sees one of them:
    /// `Some((protocol, cipher))` from `pg_stat_ssl`, `None` for plaintext. With `sslmode=prefer`
    /// (the default) a server without TLS is answered in plaintext, so the service asks this at
    /// start-up and says which it got.
    ///
    /// # Errors
    /// `Unavailable` when no connection can be made (a TLS failure says why).
    pub async fn encryption(&self) -> Result<Option<(String, String)>> {
        let row: (bool, Option<String>, Option<String>) = sqlx::query_as(
            "SELECT ssl, version, cipher FROM pg_catalog.pg_stat_ssl WHERE pid = pg_backend_pid()",
        )
        .fetch_one(&self.db.pool)
        .await
        .map_err(|e| error::from_sqlx("reading the connection's encryption", e))?;
        Ok(match row {
            (true, version, cipher) => {
                Some((version.unwrap_or_default(), cipher.unwrap_or_default()))
            }
            (false, _, _) => None,
        })
    }

    /// The log store, as the service uses it.
    pub fn log_store(&self) -> Arc<dyn LogStore> {
        Arc::new(self.log.clone())
    }

    /// The job queue, as the service uses it.
    pub fn job_queue(&self) -> Arc<dyn JobQueue> {
        Arc::new(self.queue.clone())
    }

    /// The entity store, as the service uses it.
    pub fn entity_store(&self) -> Arc<dyn EntityStore> {
        Arc::new(self.entities.clone())
    }

    /// The replay store, as the service uses it.
    pub fn replay_store(&self) -> Arc<dyn ReplayStore> {
        Arc::new(self.replays.clone())
    }

    /// The job queue with its Postgres-only extras (e.g.
    /// [`PostgresJobQueue::explain_generic_claim`]).
    pub fn postgres_job_queue(&self) -> &PostgresJobQueue {
        &self.queue
    }

    /// The outbox beside the queue (sheaf_store's `outbox` module docs): with
    /// [`OutboxLayout::InTheLog`] this schema's log tables are the outbox, with
    /// [`OutboxLayout::Shipped`] its own tables are, shipped to a log store elsewhere.
    pub fn outbox(&self, layout: OutboxLayout) -> Arc<dyn Outbox> {
        Arc::new(PostgresOutbox::new(
            self.db.clone(),
            layout,
            self.queue.clone(),
            &self.log,
        ))
    }

    /// The log store with its Postgres-only extras (e.g.
    /// [`PostgresLogStore::explain_latest_attempts`]).
    pub fn postgres_log_store(&self) -> &PostgresLogStore {
        &self.log
    }

    /// The schema the stores use.
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// The connection pool, for health metrics and for tests that inspect the server.
    pub fn pool(&self) -> &PgPool {
        &self.db.pool
    }

    /// Closes the pool: waits for connections in use to come back, then closes every one.
    /// Later calls on any of the stores fail as `Unavailable`.
    pub async fn close(&self) {
        self.db.pool.close().await;
    }
}
