//! The SQLite stores: every trait over one file in `SHEAF_DATA_DIR`.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use sheaf_sqlite::{LogRetention, SqliteOptions, SqliteStore, Synchronous};
use sheaf_store::{EntityStore, JobQueue, LogStore, Outbox, ReplayStore};

use super::{SqliteSettings, SqliteSync};

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
pub(super) async fn open(
    settings: &SqliteSettings,
    retention: &sheaf_memory::LogRetention,
) -> anyhow::Result<SqliteStores> {
    let dir = &settings.data_dir;
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create SHEAF_DATA_DIR {}", dir.display()))?;
    let options = SqliteOptions {
        synchronous: match settings.sync {
            SqliteSync::Normal => Synchronous::Normal,
            SqliteSync::Full => Synchronous::Full,
        },
        retention: LogRetention {
            max_age: retention.max_age,
            max_events: retention.max_events,
            max_attempts: retention.max_attempts,
        },
        max_size_bytes: settings.max_size,
        ..SqliteOptions::default()
    };
    let file = settings.file();
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
    tracing::info!(file = %file.display(), sync = ?settings.sync, "sqlite store open");
    Ok(SqliteStores(store))
}

pub(super) async fn backup(settings: &SqliteSettings, destination: &Path) -> anyhow::Result<()> {
    let file = settings.file();
    SqliteStore::backup_file(&file, destination)
        .await
        .with_context(|| format!("cannot back up {} (SHEAF_DATA_DIR)", file.display()))
}
