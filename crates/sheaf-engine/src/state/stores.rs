//! Backend selection: which `LogStore`, `JobQueue` and `EntityStore` the service runs on.
//!
//! The SQLite file (`SHEAF_DATA_DIR`) is the embedded default; the memory backends keep
//! everything in the process, for tests and throwaway runs. Tenants and destinations follow the shared stores
//! ([`EngineConfig::entity_home`]): they live in Postgres whenever the queue or the log store
//! does, because several processes sharing a queue must see the same destinations, else in the
//! SQLite file when a store is there. Bulk replays follow them, so that any of those processes
//! reads a replay and another resumes it when its owner stops.
//!
//! With the Postgres queue, publishes and attempts become durable in a Postgres outbox beside
//! it: the log tables themselves when the log store is Postgres too, outbox tables shipped to
//! the log store when it is ClickHouse. With the memory queue there is no outbox; the log store
//! is the record, as it is for the memory backends. With the SQLite queue the log store is the
//! SQLite file too, and its log tables are the outbox, as with Postgres for both.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use sheaf_memory::{
    LogRetention, MemoryEntityStore, MemoryJobQueue, MemoryLogStore, MemoryReplayStore, QueueLimits,
};
use sheaf_store::{EntityStore, JobQueue, LogStore, Outbox, ReplayStore};

use crate::config::{EngineConfig, EntityHome, LogStoreKind, QueueKind};

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
    pub async fn connect(config: &EngineConfig, migrate: Migrate) -> anyhow::Result<Self> {
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
        let needs_sqlite =
            config.log_store == LogStoreKind::Sqlite || config.queue == QueueKind::Sqlite;
        let sqlite = if needs_sqlite {
            Some(sqlite::open(config).await?)
        } else {
            None
        };
        let log: Arc<dyn LogStore> = match config.log_store {
            LogStoreKind::Memory => memory.log,
            LogStoreKind::Sqlite => sqlite
                .as_ref()
                .map(|file| file.log())
                .context("the sqlite file is not open")?,
            LogStoreKind::Postgres => postgres
                .as_ref()
                .map(|pg| pg.log())
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
            QueueKind::Sqlite => {
                anyhow::ensure!(
                    config.log_store == LogStoreKind::Sqlite,
                    "SHEAF_QUEUE=sqlite needs SHEAF_LOG_STORE=sqlite: the log tables are its outbox"
                );
                let file = sqlite.as_ref().context("the sqlite file is not open")?;
                (file.queue(), Some(file.outbox()))
            }
            QueueKind::Postgres => {
                let pg = postgres.as_ref().context("postgres is not connected")?;
                let in_the_log = config.log_store == LogStoreKind::Postgres;
                (pg.queue(), Some(pg.outbox(in_the_log)))
            }
        };
        let (entities, replays) = match (config.entity_home(), &postgres, &sqlite) {
            (EntityHome::Postgres, Some(pg), _) => (pg.entities(), pg.replays()),
            (EntityHome::Sqlite, _, Some(file)) => (file.entities(), file.replays()),
            (EntityHome::Memory, _, _) => (memory.entities, memory.replays),
            (home, _, _) => anyhow::bail!("the store of tenants ({home:?}) is not open"),
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

/// Writes a consistent copy of the SQLite file `config` names to `destination` (a file that
/// must not exist yet), beside a service that keeps running on it (`sheaf backup`).
pub async fn backup_sqlite(config: &EngineConfig, destination: &Path) -> anyhow::Result<()> {
    anyhow::ensure!(
        config.log_store == LogStoreKind::Sqlite || config.queue == QueueKind::Sqlite,
        "nothing to back up: SHEAF_LOG_STORE and SHEAF_QUEUE name no sqlite store (Postgres and ClickHouse are backed up with their own tools)"
    );
    sqlite::backup(&config.sqlite_file(), destination).await
}

/// The SQLite stores: every trait over one file in `SHEAF_DATA_DIR`.
#[cfg(feature = "sqlite")]
mod sqlite {
    use super::*;
    use sheaf_sqlite::{LogRetention, SqliteOptions, SqliteStore, Synchronous};

    use crate::config::SqliteSync;

    pub(super) struct SqliteStores(SqliteStore);

    impl SqliteStores {
        pub(super) fn log(&self) -> Arc<dyn LogStore> {
            self.0.log_store()
        }

        pub(super) fn queue(&self) -> Arc<dyn JobQueue> {
            self.0.job_queue()
        }

        pub(super) fn outbox(&self) -> Arc<dyn Outbox> {
            self.0.outbox()
        }

        pub(super) fn entities(&self) -> Arc<dyn EntityStore> {
            self.0.entity_store()
        }

        pub(super) fn replays(&self) -> Arc<dyn ReplayStore> {
            self.0.replay_store()
        }
    }

    /// Opens (creating them if needed) `SHEAF_DATA_DIR` and its `sheaf.db`, migrated. The file
    /// keeps the memory log's retention settings (`SHEAF_MEMORY_LOG_*`): both are the embedded
    /// log, bounded the same way.
    pub(super) async fn open(config: &EngineConfig) -> anyhow::Result<SqliteStores> {
        let dir = &config.data_dir;
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create SHEAF_DATA_DIR {}", dir.display()))?;
        let retention = &config.memory_log_retention;
        let options = SqliteOptions {
            synchronous: match config.sqlite_sync {
                SqliteSync::Normal => Synchronous::Normal,
                SqliteSync::Full => Synchronous::Full,
            },
            retention: LogRetention {
                max_age: retention.max_age,
                max_events: retention.max_events,
                max_attempts: retention.max_attempts,
            },
            max_size_bytes: config.sqlite_max_size,
            ..SqliteOptions::default()
        };
        let file = config.sqlite_file();
        let store = SqliteStore::open(&file, options)
            .await
            .map_err(|e| match e {
                // The error names the file and its lock, and what to do.
                sheaf_sqlite::SqliteError::Locked { .. } => {
                    anyhow::anyhow!("SHEAF_DATA_DIR {}: {e}", dir.display())
                }
                e => anyhow::Error::new(e).context(format!(
                    "cannot open the sqlite file in SHEAF_DATA_DIR {}",
                    dir.display()
                )),
            })?;
        tracing::info!(file = %file.display(), sync = ?config.sqlite_sync, "sqlite store open");
        Ok(SqliteStores(store))
    }

    pub(super) async fn backup(file: &Path, destination: &Path) -> anyhow::Result<()> {
        SqliteStore::backup_file(file, destination)
            .await
            .with_context(|| format!("cannot back up {} (SHEAF_DATA_DIR)", file.display()))
    }
}

/// Without the `sqlite` feature: a configuration that names SQLite is refused by name.
#[cfg(not(feature = "sqlite"))]
mod sqlite {
    use super::*;

    /// Never built: [`open`] refuses.
    pub(super) enum SqliteStores {}

    impl SqliteStores {
        pub(super) fn log(&self) -> Arc<dyn LogStore> {
            match *self {}
        }

        pub(super) fn queue(&self) -> Arc<dyn JobQueue> {
            match *self {}
        }

        pub(super) fn outbox(&self) -> Arc<dyn Outbox> {
            match *self {}
        }

        pub(super) fn entities(&self) -> Arc<dyn EntityStore> {
            match *self {}
        }

        pub(super) fn replays(&self) -> Arc<dyn ReplayStore> {
            match *self {}
        }
    }

    const MISSING: &str = "SHEAF_LOG_STORE or SHEAF_QUEUE names sqlite, but this build of sheaf-engine has no SQLite support (cargo feature `sqlite`)";

    pub(super) async fn open(_config: &EngineConfig) -> anyhow::Result<SqliteStores> {
        anyhow::bail!(MISSING)
    }

    pub(super) async fn backup(_file: &Path, _destination: &Path) -> anyhow::Result<()> {
        anyhow::bail!(MISSING)
    }
}

/// The Postgres stores: every trait over one pool and one schema.
#[cfg(feature = "postgres")]
mod postgres {
    use super::*;
    use sheaf_postgres::{OutboxLayout, PostgresConfig, PostgresStores as Stores};
    use sheaf_tls::SslMode;

    pub(super) struct PostgresStores {
        log: Arc<dyn LogStore>,
        queue: Arc<dyn JobQueue>,
        entities: Arc<dyn EntityStore>,
        stores: Stores,
    }

    impl PostgresStores {
        pub(super) fn log(&self) -> Arc<dyn LogStore> {
            Arc::clone(&self.log)
        }

        pub(super) fn queue(&self) -> Arc<dyn JobQueue> {
            Arc::clone(&self.queue)
        }

        pub(super) fn entities(&self) -> Arc<dyn EntityStore> {
            Arc::clone(&self.entities)
        }

        pub(super) fn replays(&self) -> Arc<dyn ReplayStore> {
            self.stores.replay_store()
        }

        /// The outbox: the log tables themselves when the log store is Postgres too, outbox
        /// tables shipped to the log store otherwise.
        pub(super) fn outbox(&self, in_the_log: bool) -> Arc<dyn Outbox> {
            self.stores.outbox(if in_the_log {
                OutboxLayout::InTheLog
            } else {
                OutboxLayout::Shipped
            })
        }
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

/// Without the `postgres` feature: a configuration that names Postgres is refused by name.
#[cfg(not(feature = "postgres"))]
mod postgres {
    use super::*;

    /// Never built: [`connect`] refuses.
    pub(super) enum PostgresStores {}

    impl PostgresStores {
        pub(super) fn log(&self) -> Arc<dyn LogStore> {
            match *self {}
        }

        pub(super) fn queue(&self) -> Arc<dyn JobQueue> {
            match *self {}
        }

        pub(super) fn entities(&self) -> Arc<dyn EntityStore> {
            match *self {}
        }

        pub(super) fn replays(&self) -> Arc<dyn ReplayStore> {
            match *self {}
        }

        pub(super) fn outbox(&self, _in_the_log: bool) -> Arc<dyn Outbox> {
            match *self {}
        }
    }

    pub(super) async fn connect(
        _url: &str,
        _schema: &str,
        _ca_file: Option<&Path>,
        _migrate: bool,
    ) -> anyhow::Result<PostgresStores> {
        anyhow::bail!(
            "SHEAF_LOG_STORE or SHEAF_QUEUE names postgres, but this build of sheaf-engine has no Postgres support (cargo feature `postgres`)"
        )
    }
}

/// Without the `clickhouse` feature: a configuration that names ClickHouse is refused by name.
#[cfg(not(feature = "clickhouse"))]
mod clickhouse {
    use super::*;
    use sheaf_coalesce::WriteConfig;

    pub(super) async fn connect(
        _url: &str,
        _database: &str,
        _ca_file: Option<&Path>,
        _write: WriteConfig,
        _migrate: bool,
    ) -> anyhow::Result<Arc<dyn LogStore>> {
        anyhow::bail!(
            "SHEAF_LOG_STORE is clickhouse, but this build of sheaf-engine has no ClickHouse support (cargo feature `clickhouse`)"
        )
    }
}

/// The ClickHouse log store.
#[cfg(feature = "clickhouse")]
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
        let mut parsed = url::Url::parse(url)
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

/// What a readiness probe found: each store's ping, each bounded by a second.
#[derive(Debug)]
pub struct Readiness {
    /// The log store's ping.
    pub log: sheaf_store::Result<()>,
    /// The queue's ping.
    pub queue: sheaf_store::Result<()>,
    /// The entity store's ping.
    pub entities: sheaf_store::Result<()>,
    /// An outbox ships to the log store: its outage delays searches, not publishes and
    /// deliveries, so it is reported rather than a reason to take the process out.
    pub log_behind_outbox: bool,
}

/// How long a readiness probe waits for each store's ping before calling it unreachable.
const READY_PING_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// A store's ping, bounded by [`READY_PING_TIMEOUT`].
async fn bounded(
    ping: impl std::future::Future<Output = sheaf_store::Result<()>>,
) -> sheaf_store::Result<()> {
    tokio::time::timeout(READY_PING_TIMEOUT, ping)
        .await
        .unwrap_or_else(|_| {
            Err(sheaf_store::Error::Unavailable {
                message: format!("no answer within {READY_PING_TIMEOUT:?}"),
                source: None,
            })
        })
}

/// Pings the three stores at once. A store that is down may make a ping wait for its pool's
/// acquire timeout; a probe must get its answer sooner than that (the fault suite saw 8 of 9
/// probes time out during a Postgres outage), so each ping has its own bound.
pub(crate) async fn readiness(stores: &Stores) -> Readiness {
    let (log, queue, entities) = tokio::join!(
        bounded(stores.log.ping()),
        bounded(stores.queue.ping()),
        bounded(stores.entities.ping()),
    );
    Readiness {
        log,
        queue,
        entities,
        log_behind_outbox: stores.outbox.as_ref().is_some_and(|o| !o.is_log()),
    }
}
