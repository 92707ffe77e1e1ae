//! Backend selection: which `LogStore`, `JobQueue` and `EntityStore` the service runs on.
//!
//! The memory backends are the embedded default. Tenants and destinations follow the shared
//! stores: they live in Postgres whenever the queue or the log store does, because several
//! processes sharing a queue must see the same destinations. Bulk replays follow them, so that
//! any of those processes reads a replay and another resumes it when its owner stops.
//!
//! With the Postgres queue, publishes and attempts become durable in a Postgres outbox beside
//! it: the log tables themselves when the log store is Postgres too, outbox tables shipped to
//! the log store when it is ClickHouse. With the memory queue there is no outbox; the log store
//! is the record, as it is for the memory backends.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use sheaf_memory::{
    LogRetention, MemoryEntityStore, MemoryJobQueue, MemoryLogStore, MemoryReplayStore, QueueLimits,
};
use sheaf_store::{EntityStore, JobQueue, LogStore, Outbox, ReplayStore};

use crate::settings::{Config, LogStoreKind, QueueKind};
use sheaf_postgres::OutboxLayout;

/// Whether connecting creates or upgrades the database schemas first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Migrate {
    /// Create or upgrade them (`sheaf serve` and `sheaf migrate`).
    Yes,
    /// Use them as they are.
    No,
}

/// The stores the service uses, chosen at run time.
#[derive(Debug, Clone)]
pub struct Stores {
    /// Events and attempts.
    pub log: Arc<dyn LogStore>,
    /// Pending deliveries.
    pub queue: Arc<dyn JobQueue>,
    /// Tenants and destinations.
    pub entities: Arc<dyn EntityStore>,
    /// Where publishes and attempts become durable, when the queue is in Postgres.
    pub outbox: Option<Arc<dyn Outbox>>,
    /// The memory log, when it is the log and the memory queue holds its jobs' events in it:
    /// what the pending-work bound reads (`state::admission`).
    pub memory_log: Option<Arc<MemoryLogStore>>,
    /// The memory queue, when it is the queue: for the dead letters it dropped at its bound.
    pub memory_queue: Option<Arc<MemoryJobQueue>>,
    /// Bulk replays' progress and owners.
    pub replays: Arc<dyn ReplayStore>,
}

impl Stores {
    /// Everything in this process's memory, with the log's default retention.
    pub fn memory() -> Self {
        Self::memory_keeping(LogRetention::default())
    }

    /// Everything in this process's memory: the queue holds the events of its jobs in the log,
    /// so `retention` never drops an event a delivery is still owed.
    pub fn memory_keeping(retention: LogRetention) -> Self {
        let log = Arc::new(MemoryLogStore::new(retention));
        let queue = Arc::new(MemoryJobQueue::holding_events_in(
            QueueLimits::default(),
            Arc::clone(&log),
        ));
        Self {
            log: Arc::clone(&log) as Arc<dyn LogStore>,
            queue: Arc::clone(&queue) as Arc<dyn JobQueue>,
            entities: Arc::new(MemoryEntityStore::new()),
            outbox: None,
            memory_log: Some(log),
            memory_queue: Some(queue),
            replays: Arc::new(MemoryReplayStore::new()),
        }
    }

    /// Connects the stores `config` names. With [`Migrate::Yes`], each database store creates
    /// or upgrades its schema first (`sheaf serve` and `sheaf migrate` both do).
    pub async fn connect(config: &Config, migrate: Migrate) -> anyhow::Result<Self> {
        let migrate = migrate == Migrate::Yes;
        let memory = Self::memory_keeping(config.memory_log_retention.clone());
        let needs_postgres =
            config.log_store == LogStoreKind::Postgres || config.queue == QueueKind::Postgres;
        let postgres = if needs_postgres {
            let url = config
                .postgres_url
                .as_deref()
                .context("SHEAF_POSTGRES_URL is required")?;
            Some(
                postgres::connect(
                    url,
                    &config.postgres_schema,
                    config.tls_ca_file.as_deref(),
                    migrate,
                )
                .await?,
            )
        } else {
            None
        };
        let log: Arc<dyn LogStore> = match config.log_store {
            LogStoreKind::Memory => memory.log,
            LogStoreKind::Postgres => postgres
                .as_ref()
                .map(|pg| Arc::clone(&pg.log))
                .context("postgres is not connected")?,
            LogStoreKind::ClickHouse => {
                let url = config
                    .clickhouse_url
                    .as_deref()
                    .context("SHEAF_CLICKHOUSE_URL is required")?;
                clickhouse::connect(
                    url,
                    &config.clickhouse_database,
                    config.tls_ca_file.as_deref(),
                    config.log_write,
                    migrate,
                )
                .await?
            }
        };
        let (queue, outbox): (Arc<dyn JobQueue>, _) = match config.queue {
            // With a database log the memory queue holds nothing there: that log keeps
            // everything for as long as its own retention says.
            QueueKind::Memory if config.log_store != LogStoreKind::Memory => (
                Arc::new(MemoryJobQueue::default()) as Arc<dyn JobQueue>,
                None,
            ),
            QueueKind::Memory => (memory.queue, None),
            QueueKind::Postgres => {
                let pg = postgres.as_ref().context("postgres is not connected")?;
                let layout = if config.log_store == LogStoreKind::Postgres {
                    OutboxLayout::InTheLog
                } else {
                    OutboxLayout::Shipped
                };
                (Arc::clone(&pg.queue), Some(pg.stores.outbox(layout)))
            }
        };
        let (entities, replays) = match &postgres {
            Some(pg) => (Arc::clone(&pg.entities), pg.stores.replay_store()),
            None => (memory.entities, memory.replays),
        };
        let memory_log = memory
            .memory_log
            .filter(|_| config.log_store == LogStoreKind::Memory);
        let memory_queue = memory
            .memory_queue
            .filter(|_| config.queue == QueueKind::Memory && memory_log.is_some());
        Ok(Self {
            log,
            queue,
            entities,
            outbox,
            memory_log,
            memory_queue,
            replays,
        })
    }
}

/// The Postgres stores: every trait over one pool and one schema.
mod postgres {
    use super::*;
    use sheaf_postgres::{PostgresConfig, PostgresStores as Stores};
    use sheaf_tls::SslMode;

    pub(super) struct PostgresStores {
        pub log: Arc<dyn LogStore>,
        pub queue: Arc<dyn JobQueue>,
        pub entities: Arc<dyn EntityStore>,
        pub stores: Stores,
    }

    pub(super) async fn connect(
        url: &str,
        schema: &str,
        ca_file: Option<&Path>,
        migrate: bool,
    ) -> anyhow::Result<PostgresStores> {
        let mut config = PostgresConfig::new(url).with_schema(schema);
        config.ca_file = ca_file.map(Path::to_owned);
        let tls = config
            .tls()
            .context("invalid SHEAF_POSTGRES_URL or SHEAF_TLS_CA_FILE")?;
        let stores =
            Stores::new(config).context("invalid SHEAF_POSTGRES_URL or SHEAF_POSTGRES_SCHEMA")?;
        if migrate {
            let applied = stores
                .migrate()
                .await
                .context("cannot migrate the postgres schema (SHEAF_POSTGRES_URL)")?;
            if !applied.is_empty() {
                tracing::info!(?applied, schema, "postgres migrations applied");
            }
        }
        report_encryption(&stores, tls.mode).await;
        Ok(PostgresStores {
            log: stores.log_store(),
            queue: stores.job_queue(),
            entities: stores.entity_store(),
            stores,
        })
    }

    /// Says in the log whether the pool's connections are encrypted: `sslmode=prefer` (the
    /// default) quietly settles for plaintext when the server offers no TLS, and an operator
    /// should not have to guess which happened.
    async fn report_encryption(stores: &Stores, mode: SslMode) {
        let verified = match mode {
            SslMode::VerifyFull => "chain and host name",
            SslMode::VerifyCa => "chain only",
            _ => "not verified",
        };
        match stores.encryption().await {
            Ok(Some((version, cipher))) => tracing::info!(
                sslmode = %mode,
                version,
                cipher,
                certificate = verified,
                "postgres connection encrypted"
            ),
            Ok(None) if mode == SslMode::Disable => {
                tracing::info!(sslmode = %mode, "postgres connection not encrypted");
            }
            Ok(None) => tracing::warn!(
                sslmode = %mode,
                "postgres connection is NOT encrypted: the server offers no TLS and sslmode=prefer \
                 accepts that; set sslmode=verify-full in SHEAF_POSTGRES_URL to insist"
            ),
            Err(e) => tracing::warn!(
                error = %e,
                "could not tell whether the postgres connection is encrypted"
            ),
        }
    }
}

/// The ClickHouse log store.
mod clickhouse {
    use super::*;
    use sheaf_clickhouse::{ClickHouseConfig, ClickHouseLogStore};
    use sheaf_coalesce::WriteConfig;

    /// `url` may carry `user:password@`; the store takes them as separate fields.
    pub(super) async fn connect(
        url: &str,
        database: &str,
        ca_file: Option<&Path>,
        write: WriteConfig,
        migrate: bool,
    ) -> anyhow::Result<Arc<dyn LogStore>> {
        let mut parsed = reqwest::Url::parse(url)
            .map_err(|e| anyhow::anyhow!("invalid SHEAF_CLICKHOUSE_URL: {e}"))?;
        let user = (!parsed.username().is_empty()).then(|| parsed.username().to_owned());
        let password = parsed.password().map(str::to_owned);
        let _ = parsed.set_username("");
        let _ = parsed.set_password(None);
        let mut config = ClickHouseConfig::new(parsed.as_str().trim_end_matches('/'), database);
        config.user = user;
        config.password = password;
        config.ca_file = ca_file.map(Path::to_owned);
        let encrypted = parsed.scheme() == "https";
        // The service's own write coalescer in front of the store issues one `insert_many` at a
        // time, already gathered and bounded; the store's per-table coalescers then only ever see
        // one batch queued, so waiting there would add latency and gather nothing.
        config.write = WriteConfig {
            max_wait: std::time::Duration::ZERO,
            ..write
        };
        let store = ClickHouseLogStore::connect(config)
            .context("invalid SHEAF_CLICKHOUSE_URL or SHEAF_CLICKHOUSE_DATABASE")?;
        if migrate {
            store
                .migrate()
                .await
                .context("cannot migrate the clickhouse log tables (SHEAF_CLICKHOUSE_URL)")?;
        }
        if encrypted {
            tracing::info!(
                certificate = "chain and host name",
                "clickhouse connection encrypted (https)"
            );
        } else {
            tracing::info!("clickhouse connection not encrypted (http)");
        }
        Ok(Arc::new(store))
    }
}
