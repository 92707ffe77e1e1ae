//! Sheaf's LogStore, JobQueue, EntityStore and ReplayStore on Postgres (sqlx), migrations embedded.
#![doc = include_str!("../README.md")]

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
