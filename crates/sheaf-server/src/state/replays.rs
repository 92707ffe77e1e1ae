//! The replays a process ran or is running, by id, for `GET …/replays/{replay_id}`: kept for
//! [`KEPT_FOR`] in this process (a replay is read back from the process that ran it).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use moka::future::Cache;
use serde::Serialize;
use serde_json::Value;
use sheaf_store::{TenantId, Timestamp};
use uuid::Uuid;

/// How long a finished replay can be read back.
pub const KEPT_FOR: Duration = Duration::from_secs(24 * 3600);

/// Most replays kept at once; the least recently used go first.
const KEPT_AT_MOST: u64 = 10_000;

/// Where a replay is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplayState {
    /// Pages are being read and enqueued.
    Running,
    /// Every page was read; `jobs` is final.
    Completed,
    /// A store failed; `error` says which, and the jobs enqueued before it stay enqueued.
    Failed,
}

/// One replay's progress, as the API shows it.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayProgress {
    /// Its id.
    pub replay_id: Uuid,
    /// Its tenant.
    pub tenant_id: TenantId,
    /// What it was asked (the request body, normalized).
    pub request: Value,
    /// Where it is.
    pub state: ReplayState,
    /// Pages of the source read so far (the log's attempts, or the dead-letter list).
    pub pages: u64,
    /// New manual deliveries enqueued so far.
    pub jobs: u64,
    /// Dead letters it replayed and removed from the dead-letter list.
    pub dead_letters_removed: u64,
    /// Matches skipped because their destination is gone or disabled.
    pub skipped: u64,
    /// It stopped at the most deliveries one replay makes; replay the rest with a narrower
    /// window.
    pub limited: bool,
    /// Calls it made to the log store and to the queue (each one query on a database).
    pub log_store_queries: u64,
    /// See `log_store_queries`.
    pub queue_queries: u64,
    /// Why it failed, when it did.
    pub error: Option<String>,
    /// When it started.
    pub started_at: Timestamp,
    /// When it finished, once it has.
    pub finished_at: Option<Timestamp>,
}

/// A replay's progress, shared between its task and the readers.
pub type SharedProgress = Arc<Mutex<ReplayProgress>>;

/// The process's replays.
#[derive(Debug)]
pub struct Replays {
    cache: Cache<Uuid, SharedProgress>,
}

impl Replays {
    /// An empty registry.
    pub fn new() -> Self {
        Replays {
            cache: Cache::builder()
                .max_capacity(KEPT_AT_MOST)
                .time_to_live(KEPT_FOR)
                .build(),
        }
    }

    /// Registers a new replay.
    pub async fn insert(&self, progress: ReplayProgress) -> SharedProgress {
        let id = progress.replay_id;
        let shared = Arc::new(Mutex::new(progress));
        self.cache.insert(id, Arc::clone(&shared)).await;
        shared
    }

    /// A copy of the replay's progress, if this process has it and it belongs to `tenant`.
    pub async fn get(&self, tenant: &TenantId, id: Uuid) -> Option<ReplayProgress> {
        let shared = self.cache.get(&id).await?;
        let progress = shared
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        (progress.tenant_id == *tenant).then_some(progress)
    }
}

impl Default for Replays {
    fn default() -> Self {
        Self::new()
    }
}
