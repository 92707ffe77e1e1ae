//! The store backends this build can run: the one place of the engine (and, through it, of the
//! `sheaf` binary) that names them. Everything else asks this module by word: the settings hand
//! it `SHEAF_LOG_STORE`, `SHEAF_QUEUE` and each backend's own settings through a
//! [`SettingSource`] and get a checked [`StoreConfig`]; start-up calls [`Stores::connect`]; `sheaf backup`
//! calls [`backup`]; messages about where secrets are kept ask [`EntityHome::describe`].
//!
//! Adding a backend is a crate that implements `sheaf-store`'s traits and passes its suites, a
//! cargo feature of this crate, a variant and a word here with a file beside this one that opens
//! it (as `sqlite.rs`, `postgres.rs` and `clickhouse.rs` do), and its settings' rows in the
//! binary's settings table.
//!
//! Which backends live together, and why:
//! - The SQLite file (`SHEAF_DATA_DIR`) is the embedded default; the memory backends keep
//!   everything in the process, for tests and throwaway runs.
//! - Tenants and destinations follow the shared stores ([`StoreConfig::entity_home`]): they live
//!   in Postgres whenever the queue or the log store does, because several processes sharing a
//!   queue must see the same destinations, else in the SQLite file when a store is there. Bulk
//!   replays follow them, so that any of those processes reads a replay and another resumes it
//!   when its owner stops.
//! - With the Postgres queue, publishes and attempts become durable in a Postgres outbox beside
//!   it: the log tables themselves when the log store is Postgres too, outbox tables shipped to
//!   the log store when it is ClickHouse. With the memory queue there is no outbox; the log
//!   store is the record, and so it is with the JetStream queue, whose log store must be on a
//!   server (Postgres or ClickHouse) and whose tenants live in Postgres. With the SQLite queue the log store is the SQLite file too, and its
//!   log tables are the outbox.

#[cfg(feature = "clickhouse")]
mod clickhouse;
#[cfg(feature = "jetstream")]
mod jetstream;
#[cfg(any(
    not(feature = "sqlite"),
    not(feature = "postgres"),
    not(feature = "clickhouse"),
    not(feature = "jetstream")
))]
mod missing;
mod open;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;
#[cfg(not(feature = "clickhouse"))]
use missing::clickhouse;
#[cfg(not(feature = "jetstream"))]
use missing::jetstream;
#[cfg(not(feature = "postgres"))]
use missing::postgres;
#[cfg(not(feature = "sqlite"))]
use missing::sqlite;

use std::path::PathBuf;

pub(crate) use open::open;
pub use open::{Around, Migrate, Stores, backup};

/// Where the log store lives (`SHEAF_LOG_STORE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogStoreKind {
    /// In this process.
    Memory,
    /// The SQLite file in [`SqliteSettings::data_dir`] (the default).
    Sqlite,
    /// Postgres ([`PostgresSettings::url`]).
    Postgres,
    /// ClickHouse ([`ClickHouseSettings::url`]).
    ClickHouse,
}

impl LogStoreKind {
    /// The word of each log store, as `SHEAF_LOG_STORE` takes it.
    pub const WORDS: &[(&str, Self)] = &[
        ("memory", Self::Memory),
        ("sqlite", Self::Sqlite),
        ("postgres", Self::Postgres),
        ("clickhouse", Self::ClickHouse),
    ];

    /// This store's word.
    pub fn word(self) -> &'static str {
        word_of(Self::WORDS, self)
    }
}

/// Where the job queue lives (`SHEAF_QUEUE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueKind {
    /// In this process.
    Memory,
    /// The SQLite file in [`SqliteSettings::data_dir`], with the log store there too (its log
    /// tables are the queue's outbox); the default.
    Sqlite,
    /// Postgres ([`PostgresSettings::url`]), shared by every process that points at it.
    Postgres,
    /// A NATS JetStream bucket ([`JetStreamSettings`]), shared by every process that names it.
    JetStream,
}

impl QueueKind {
    /// The word of each queue, as `SHEAF_QUEUE` takes it.
    pub const WORDS: &[(&str, Self)] = &[
        ("memory", Self::Memory),
        ("sqlite", Self::Sqlite),
        ("postgres", Self::Postgres),
        ("jetstream", Self::JetStream),
    ];

    /// This queue's word.
    pub fn word(self) -> &'static str {
        word_of(Self::WORDS, self)
    }

    /// Whether other processes take jobs from it too: only then may a process with no delivery
    /// workers leave the deliveries to them.
    pub fn is_shared(self) -> bool {
        matches!(self, Self::Postgres | Self::JetStream)
    }
}

/// Where tenants, destinations and replays live: beside the shared stores, so that every
/// process using a queue or a log sees the same destinations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntityHome {
    /// In this process: neither the queue nor the log store is in a database.
    Memory,
    /// In the SQLite file, when the queue or the log store is there and neither in Postgres.
    Sqlite,
    /// In Postgres, whenever the queue or the log store is.
    Postgres,
}

impl EntityHome {
    /// Where the entities are written, with the setting that says so, for messages; `None` when
    /// they stay in this process's memory.
    pub fn describe(self) -> Option<&'static str> {
        match self {
            Self::Memory => None,
            Self::Sqlite => Some("the SQLite file in SHEAF_DATA_DIR"),
            Self::Postgres => Some("Postgres (SHEAF_POSTGRES_URL)"),
        }
    }
}

/// When a SQLite flush counts as written (`SHEAF_SQLITE_SYNC`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SqliteSync {
    /// A commit is in the WAL file, not yet fsynced: a process crash loses nothing, a power
    /// loss may lose the last flushes.
    Normal,
    /// Every commit is fsynced before it is answered.
    Full,
}

impl SqliteSync {
    /// The word of each mode, as `SHEAF_SQLITE_SYNC` takes it.
    pub const WORDS: &[(&str, Self)] = &[("normal", Self::Normal), ("full", Self::Full)];
}

/// Who copies a ClickHouse cluster's rows to its replicas (`SHEAF_CLICKHOUSE_CLUSTER_REPLICATION`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClickHouseReplication {
    /// The `Distributed` tables write every replica; Sheaf migrates every node.
    Distributed,
    /// The servers replicate (`ReplicatedReplacingMergeTree`); Sheaf migrates `ON CLUSTER`.
    Replicated,
}

impl ClickHouseReplication {
    /// The word of each mode, as `SHEAF_CLICKHOUSE_CLUSTER_REPLICATION` takes it.
    pub const WORDS: &[(&str, Self)] = &[
        ("distributed", Self::Distributed),
        ("replicated", Self::Replicated),
    ];
}

/// The SQLite store's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqliteSettings {
    /// `SHEAF_DATA_DIR`: the directory of the SQLite file (`sheaf.db`), when a store is there.
    pub data_dir: PathBuf,
    /// `SHEAF_SQLITE_SYNC`.
    pub sync: SqliteSync,
    /// `SHEAF_SQLITE_MAX_SIZE_MIB`, in bytes: the largest the SQLite file may grow; `None`: as
    /// large as the disk allows.
    pub max_size: Option<u64>,
}

impl SqliteSettings {
    /// The database file: `sheaf.db` in [`SqliteSettings::data_dir`].
    pub fn file(&self) -> PathBuf {
        self.data_dir.join("sheaf.db")
    }
}

/// The Postgres stores' settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostgresSettings {
    /// `SHEAF_POSTGRES_URL`.
    pub url: Option<String>,
    /// `SHEAF_POSTGRES_SCHEMA`.
    pub schema: String,
}

/// The ClickHouse log store's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClickHouseSettings {
    /// `SHEAF_CLICKHOUSE_URL`.
    pub url: Option<String>,
    /// `SHEAF_CLICKHOUSE_DATABASE`.
    pub database: String,
    /// `SHEAF_CLICKHOUSE_CLUSTER`: the log on this cluster instead of one server.
    pub cluster: Option<String>,
    /// `SHEAF_CLICKHOUSE_CLUSTER_NODES`: every node's URL, when on a cluster.
    pub cluster_nodes: Vec<String>,
    /// `SHEAF_CLICKHOUSE_CLUSTER_REPLICATION`.
    pub cluster_replication: ClickHouseReplication,
}

/// The JetStream queue's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JetStreamSettings {
    /// `SHEAF_JETSTREAM_URLS`: the servers, any of which will do.
    pub urls: Vec<String>,
    /// `SHEAF_JETSTREAM_BUCKET`.
    pub bucket: String,
    /// `SHEAF_JETSTREAM_REPLICAS`.
    pub replicas: usize,
}

/// Which stores the engine runs on, and each backend's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreConfig {
    /// `SHEAF_LOG_STORE`.
    pub log: LogStoreKind,
    /// `SHEAF_QUEUE`.
    pub queue: QueueKind,
    /// The SQLite file's settings (`SHEAF_DATA_DIR`, `SHEAF_SQLITE_*`).
    pub sqlite: SqliteSettings,
    /// Postgres's settings (`SHEAF_POSTGRES_*`).
    pub postgres: PostgresSettings,
    /// ClickHouse's settings (`SHEAF_CLICKHOUSE_*`).
    pub clickhouse: ClickHouseSettings,
    /// The JetStream queue's settings (`SHEAF_JETSTREAM_*`).
    pub jetstream: JetStreamSettings,
}

/// The SQLite file when the engine is built with it (feature `sqlite`, on by default), else
/// memory.
#[cfg(feature = "sqlite")]
const EMBEDDED: (LogStoreKind, QueueKind) = (LogStoreKind::Sqlite, QueueKind::Sqlite);
#[cfg(not(feature = "sqlite"))]
const EMBEDDED: (LogStoreKind, QueueKind) = (LogStoreKind::Memory, QueueKind::Memory);

/// The embedded default: every store in `sheaf-data/sheaf.db` (memory without the `sqlite`
/// feature); the same values as the `sheaf` binary's settings when none is set.
impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            log: EMBEDDED.0,
            queue: EMBEDDED.1,
            sqlite: SqliteSettings {
                data_dir: PathBuf::from("sheaf-data"),
                sync: SqliteSync::Normal,
                max_size: None,
            },
            postgres: PostgresSettings {
                url: None,
                schema: "sheaf".to_owned(),
            },
            clickhouse: ClickHouseSettings {
                url: None,
                database: "sheaf".to_owned(),
                cluster: None,
                cluster_nodes: Vec::new(),
                cluster_replication: ClickHouseReplication::Distributed,
            },
            jetstream: JetStreamSettings {
                urls: Vec::new(),
                bucket: "sheaf_jobs".to_owned(),
                replicas: 3,
            },
        }
    }
}

/// A refused store setting: which one, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {setting}: {message}")]
pub struct SettingError {
    /// The setting at fault (`SHEAF_…`).
    pub setting: String,
    /// What is wrong with it, lower-case.
    pub message: String,
}

impl SettingError {
    /// A refusal of `setting`.
    pub fn new(setting: &str, message: impl Into<String>) -> Self {
        Self {
            setting: setting.to_owned(),
            message: message.into(),
        }
    }
}

/// Where [`StoreConfig::from_settings`] reads the store settings from. The `sheaf` binary
/// implements it over its settings table, which holds every setting's default and bounds and
/// checks a value against them before handing it over; so this module names the settings it
/// reads, and never repeats their defaults or ranges.
pub trait SettingSource {
    /// The value of `setting` (its default when not given), trimmed; `None` when unset.
    fn text(&self, setting: &'static str) -> Result<Option<String>, SettingError>;
    /// One of the words the setting lists, or `None` when it is unset and has no default.
    fn word(&self, setting: &'static str) -> Result<Option<String>, SettingError>;
    /// A whole number within the setting's bounds.
    fn integer(&self, setting: &'static str) -> Result<u64, SettingError>;
}

impl StoreConfig {
    /// Reads and checks the store settings together: each backend's required settings are
    /// there when it is chosen, and the log store and the queue can live together.
    pub fn from_settings(source: &dyn SettingSource) -> Result<Self, SettingError> {
        let log = choice(source, "SHEAF_LOG_STORE", LogStoreKind::WORDS)?
            .ok_or_else(|| SettingError::new("SHEAF_LOG_STORE", "is not set"))?;
        // Unset, the queue is the embedded store's when the log is: the SQLite file by
        // default, and memory with `SHEAF_LOG_STORE=memory` or a log store on a server.
        let queue = match choice(source, "SHEAF_QUEUE", QueueKind::WORDS)? {
            Some(queue) => queue,
            None if log == LogStoreKind::Sqlite => QueueKind::Sqlite,
            None => QueueKind::Memory,
        };
        let data_dir = PathBuf::from(source.text("SHEAF_DATA_DIR")?.unwrap_or_default());
        if data_dir.as_os_str().is_empty() {
            return Err(SettingError::new("SHEAF_DATA_DIR", "is empty"));
        }
        let sync = choice(source, "SHEAF_SQLITE_SYNC", SqliteSync::WORDS)?
            .ok_or_else(|| SettingError::new("SHEAF_SQLITE_SYNC", "is not set"))?;
        let max_size = match source.integer("SHEAF_SQLITE_MAX_SIZE_MIB")? {
            0 => None,
            mib => Some(mib.saturating_mul(1024 * 1024)),
        };
        let not_empty = |name| Ok::<_, SettingError>(source.text(name)?.filter(|v| !v.is_empty()));
        // The stores check these names themselves when they connect; checked here too so the
        // error names the setting.
        let schema = source.text("SHEAF_POSTGRES_SCHEMA")?.unwrap_or_default();
        if !is_identifier(&schema, 63, |b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'
        }) {
            return Err(SettingError::new(
                "SHEAF_POSTGRES_SCHEMA",
                format!("{schema:?} is not a plain lower-case identifier"),
            ));
        }
        let database = source
            .text("SHEAF_CLICKHOUSE_DATABASE")?
            .unwrap_or_default();
        if !is_identifier(&database, 64, |b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err(SettingError::new(
                "SHEAF_CLICKHOUSE_DATABASE",
                format!("{database:?} is not a plain identifier"),
            ));
        }
        let config = Self {
            log,
            queue,
            sqlite: SqliteSettings {
                data_dir,
                sync,
                max_size,
            },
            postgres: PostgresSettings {
                url: not_empty("SHEAF_POSTGRES_URL")?,
                schema,
            },
            clickhouse: ClickHouseSettings {
                url: not_empty("SHEAF_CLICKHOUSE_URL")?,
                database,
                cluster: not_empty("SHEAF_CLICKHOUSE_CLUSTER")?,
                cluster_nodes: not_empty("SHEAF_CLICKHOUSE_CLUSTER_NODES")?
                    .map(|nodes| {
                        nodes
                            .split(',')
                            .map(str::trim)
                            .filter(|n| !n.is_empty())
                            .map(str::to_owned)
                            .collect()
                    })
                    .unwrap_or_default(),
                cluster_replication: choice(
                    source,
                    "SHEAF_CLICKHOUSE_CLUSTER_REPLICATION",
                    ClickHouseReplication::WORDS,
                )?
                .unwrap_or(ClickHouseReplication::Distributed),
            },
            jetstream: JetStreamSettings {
                urls: not_empty("SHEAF_JETSTREAM_URLS")?
                    .map(|urls| {
                        urls.split(',')
                            .map(str::trim)
                            .filter(|u| !u.is_empty())
                            .map(str::to_owned)
                            .collect()
                    })
                    .unwrap_or_default(),
                bucket: source.text("SHEAF_JETSTREAM_BUCKET")?.unwrap_or_default(),
                replicas: usize::try_from(source.integer("SHEAF_JETSTREAM_REPLICAS")?)
                    .unwrap_or(usize::MAX),
            },
        };
        config.check()?;
        Ok(config)
    }

    /// The rules between the settings: a chosen server has its address, and the log store can
    /// hold what the queue's jobs need.
    pub fn check(&self) -> Result<(), SettingError> {
        if self.uses_postgres() && self.postgres.url.is_none() {
            return Err(SettingError::new(
                "SHEAF_POSTGRES_URL",
                if self.queue == QueueKind::JetStream {
                    "is required with SHEAF_QUEUE=jetstream: tenants and destinations live in Postgres, shared by every process of the queue"
                } else {
                    "is required when SHEAF_LOG_STORE or SHEAF_QUEUE is postgres"
                },
            ));
        }
        if self.queue == QueueKind::JetStream {
            if self.jetstream.urls.is_empty() {
                return Err(SettingError::new(
                    "SHEAF_JETSTREAM_URLS",
                    "is required when SHEAF_QUEUE is jetstream",
                ));
            }
            if let Some(url) = self
                .jetstream
                .urls
                .iter()
                .find(|u| !u.starts_with("nats://"))
            {
                return Err(SettingError::new(
                    "SHEAF_JETSTREAM_URLS",
                    format!("{url:?} must start with nats://"),
                ));
            }
            let bucket = &self.jetstream.bucket;
            if !is_identifier(bucket, 64, |b| {
                b.is_ascii_alphanumeric() || b == b'_' || b == b'-'
            }) {
                return Err(SettingError::new(
                    "SHEAF_JETSTREAM_BUCKET",
                    format!("{bucket:?} must be letters, digits, `_` and `-`"),
                ));
            }
        }
        if self.log == LogStoreKind::ClickHouse && self.clickhouse.url.is_none() {
            return Err(SettingError::new(
                "SHEAF_CLICKHOUSE_URL",
                "is required when SHEAF_LOG_STORE is clickhouse",
            ));
        }
        match (
            &self.clickhouse.cluster,
            self.clickhouse.cluster_nodes.is_empty(),
        ) {
            (Some(name), _)
                if !is_identifier(name, 64, |b| b.is_ascii_alphanumeric() || b == b'_') =>
            {
                return Err(SettingError::new(
                    "SHEAF_CLICKHOUSE_CLUSTER",
                    format!("{name:?} is not a plain identifier"),
                ));
            }
            (Some(_), true)
                if self.clickhouse.cluster_replication == ClickHouseReplication::Distributed =>
            {
                return Err(SettingError::new(
                    "SHEAF_CLICKHOUSE_CLUSTER_NODES",
                    "is required when SHEAF_CLICKHOUSE_CLUSTER is set with SHEAF_CLICKHOUSE_CLUSTER_REPLICATION=distributed: every node's URL",
                ));
            }
            (None, false) => {
                return Err(SettingError::new(
                    "SHEAF_CLICKHOUSE_CLUSTER",
                    "is required when SHEAF_CLICKHOUSE_CLUSTER_NODES is set",
                ));
            }
            _ => {}
        }
        if let Some(node) = self
            .clickhouse
            .cluster_nodes
            .iter()
            .find(|n| !(n.starts_with("http://") || n.starts_with("https://")))
        {
            return Err(SettingError::new(
                "SHEAF_CLICKHOUSE_CLUSTER_NODES",
                format!("{node:?} must start with http:// or https://"),
            ));
        }
        // Job rows carry no payload: a delivery reads its event from the log store. A durable
        // queue in front of a memory log store loses every pending delivery on a restart, and in
        // a second process finds no event at all (the fault suite saw 2 of 200 events dropped
        // that way); one process's SQLite file is as invisible to the others. So the
        // combination is refused rather than documented.
        if self.queue.is_shared() && matches!(self.log, LogStoreKind::Memory | LogStoreKind::Sqlite)
        {
            return Err(SettingError::new(
                "SHEAF_LOG_STORE",
                format!(
                    "{} cannot back SHEAF_QUEUE={}: queued jobs carry no payload and read it from the log store, which must be as durable and as shared as the queue; use postgres or clickhouse",
                    self.log.word(),
                    self.queue.word()
                ),
            ));
        }
        // The SQLite queue's outbox is the log tables of its own file: there is no shipping
        // from SQLite to another log store.
        if self.queue == QueueKind::Sqlite && self.log != LogStoreKind::Sqlite {
            return Err(SettingError::new(
                "SHEAF_LOG_STORE",
                "must be sqlite with SHEAF_QUEUE=sqlite: the queue's events are committed with its jobs in the log tables of the same file",
            ));
        }
        Ok(())
    }

    /// Where tenants, destinations and replays live (see [`EntityHome`]).
    pub fn entity_home(&self) -> EntityHome {
        if self.uses_postgres() {
            EntityHome::Postgres
        } else if self.uses_sqlite() {
            EntityHome::Sqlite
        } else {
            EntityHome::Memory
        }
    }

    /// The Postgres schema the stores use, when a store is in Postgres (the CDC source must not
    /// read from it).
    pub fn postgres_schema_in_use(&self) -> Option<&str> {
        self.uses_postgres()
            .then_some(self.postgres.schema.as_str())
    }

    pub(crate) fn uses_postgres(&self) -> bool {
        self.log == LogStoreKind::Postgres
            || matches!(self.queue, QueueKind::Postgres | QueueKind::JetStream)
    }

    pub(crate) fn uses_sqlite(&self) -> bool {
        self.log == LogStoreKind::Sqlite || self.queue == QueueKind::Sqlite
    }
}

/// A one-of setting's variant, bound by word: the order of the setting's list (the order the
/// docs show) cannot swap backends.
fn choice<T: Copy>(
    source: &dyn SettingSource,
    setting: &'static str,
    words: &[(&str, T)],
) -> Result<Option<T>, SettingError> {
    let Some(word) = source.word(setting)? else {
        return Ok(None);
    };
    words
        .iter()
        .find(|(w, _)| *w == word)
        .map(|(_, variant)| Some(*variant))
        .ok_or_else(|| {
            let known: Vec<&str> = words.iter().map(|(w, _)| *w).collect();
            SettingError::new(
                setting,
                format!("{word:?} is none of the engine's {}", known.join(", ")),
            )
        })
}

fn word_of<T: PartialEq>(words: &[(&'static str, T)], variant: T) -> &'static str {
    words
        .iter()
        .find(|(_, v)| *v == variant)
        .map_or("?", |(word, _)| word)
}

/// Not empty, at most `max_len` bytes, every byte allowed, not starting with a digit.
fn is_identifier(name: &str, max_len: usize, allowed: impl Fn(u8) -> bool) -> bool {
    !name.is_empty()
        && name.len() <= max_len
        && name.bytes().all(allowed)
        && !name.as_bytes()[0].is_ascii_digit()
}
