//! Opening the backends [`StoreConfig`] names into the [`Stores`] the service runs on, and
//! copying the one kept in a file.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context as _;
use sheaf_coalesce::WriteConfig;
use sheaf_memory::{
    LogRetention, MemoryEntityStore, MemoryJobQueue, MemoryLogStore, MemoryReplayStore, QueueLimits,
};
use sheaf_store::{EntityStore, JobQueue, LogStore, Outbox, ReplayStore};

use super::{
    EntityHome, LogStoreKind, QueueKind, StoreConfig, clickhouse, jetstream, postgres, sqlite,
};

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
    /// Where publishes and attempts become durable, when the queue is in a database.
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
}

/// What opening the stores takes from the rest of the engine's configuration.
#[derive(Debug, Clone, Copy)]
pub struct Around<'a> {
    /// `SHEAF_MEMORY_LOG_*`: the memory log's retention, which the SQLite file keeps too (both
    /// are the embedded log, bounded the same way).
    pub retention: &'a LogRetention,
    /// `SHEAF_TLS_CA_FILE`: CA certificates the database connections trust besides the roots.
    pub tls_ca_file: Option<&'a Path>,
    /// `SHEAF_LOG_WRITE_*`: the log's write coalescing, which a log store on a server takes.
    pub log_write: WriteConfig,
}

/// Opens the stores `stores` names. With [`Migrate::Yes`], each database store creates or
/// upgrades its schema first (`sheaf serve` and `sheaf migrate` both do).
pub(crate) async fn open(
    stores: &StoreConfig,
    around: &Around<'_>,
    migrate: Migrate,
) -> anyhow::Result<Stores> {
    let migrate = migrate == Migrate::Yes;
    let memory = Stores::memory_keeping(around.retention.clone());
    let postgres = if stores.uses_postgres() {
        Some(postgres::connect(&stores.postgres, around.tls_ca_file, migrate).await?)
    } else {
        None
    };
    let sqlite = if stores.uses_sqlite() {
        Some(sqlite::open(&stores.sqlite, around.retention).await?)
    } else {
        None
    };
    let log: Arc<dyn LogStore> = match stores.log {
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
            clickhouse::connect(
                &stores.clickhouse,
                around.tls_ca_file,
                around.log_write,
                migrate,
            )
            .await?
        }
    };
    let (queue, outbox): (Arc<dyn JobQueue>, _) = match stores.queue {
        // With a database log the memory queue holds nothing there: that log keeps everything
        // for as long as its own retention says.
        QueueKind::Memory if stores.log != LogStoreKind::Memory => (
            Arc::new(MemoryJobQueue::default()) as Arc<dyn JobQueue>,
            None,
        ),
        QueueKind::Memory => (memory.queue, None),
        QueueKind::Sqlite => {
            anyhow::ensure!(
                stores.log == LogStoreKind::Sqlite,
                "SHEAF_QUEUE=sqlite needs SHEAF_LOG_STORE=sqlite: the log tables are its outbox"
            );
            let file = sqlite.as_ref().context("the sqlite file is not open")?;
            (file.queue(), Some(file.outbox()))
        }
        QueueKind::Postgres => {
            let pg = postgres.as_ref().context("postgres is not connected")?;
            let in_the_log = stores.log == LogStoreKind::Postgres;
            (pg.queue(), Some(pg.outbox(in_the_log)))
        }
        // The outbox is in the bucket on servers that store atomic batches; without it, the
        // log store is the record of publishes and attempts, written before the jobs are
        // enqueued (see `ingest::publish`).
        QueueKind::JetStream => jetstream::connect(&stores.jetstream).await?,
    };
    let (entities, replays) = match (stores.entity_home(), &postgres, &sqlite) {
        (EntityHome::Postgres, Some(pg), _) => (pg.entities(), pg.replays()),
        (EntityHome::Sqlite, _, Some(file)) => (file.entities(), file.replays()),
        (EntityHome::Memory, _, _) => (memory.entities, memory.replays),
        (home, _, _) => anyhow::bail!("the store of tenants ({home:?}) is not open"),
    };
    let memory_log = memory
        .memory_log
        .filter(|_| stores.log == LogStoreKind::Memory);
    let memory_queue = memory
        .memory_queue
        .filter(|_| stores.queue == QueueKind::Memory && memory_log.is_some());
    Ok(Stores {
        log,
        queue,
        entities,
        outbox,
        memory_log,
        memory_queue,
        replays,
    })
}

/// Writes a consistent copy of the store file `config` names to `destination` (a file that must
/// not exist yet), beside a service that keeps running on it (`sheaf backup`); returns the file
/// copied. Stores on servers are backed up with the servers' own tools, so a configuration
/// with no store in a file is refused, saying so.
pub async fn backup(stores: &StoreConfig, destination: &Path) -> anyhow::Result<PathBuf> {
    anyhow::ensure!(
        stores.uses_sqlite(),
        "nothing to back up: SHEAF_LOG_STORE and SHEAF_QUEUE name no store kept in a file (Postgres and ClickHouse are backed up with their own tools)"
    );
    sqlite::backup(&stores.sqlite, destination).await?;
    Ok(stores.sqlite.file())
}
