//! Bulk replays as the API shows them ([`ReplayView`], read from the shared `ReplayStore`, so
//! any process answers for any replay), and the replay tasks this process runs ([`Replays`]),
//! so that shutdown stops them at a page boundary and hands them over.

use std::future::Future;
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;
use sheaf_store::{Replay, ReplayState, TenantId, Timestamp};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

/// How long a finished replay can be read back; housekeeping deletes it after.
pub const KEPT_FOR: Duration = Duration::from_secs(24 * 3600);

/// One replay's progress, as the API shows it.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayView {
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
    /// How many times a process took it over from one that stopped running it.
    pub takeovers: u32,
    /// When it started.
    pub started_at: Timestamp,
    /// When its progress was last stored (once per page).
    pub updated_at: Timestamp,
    /// When it finished, once it has.
    pub finished_at: Option<Timestamp>,
}

impl From<Replay> for ReplayView {
    fn from(replay: Replay) -> Self {
        let p = replay.progress;
        ReplayView {
            replay_id: replay.id,
            tenant_id: replay.tenant_id,
            request: replay.request,
            state: replay.state,
            pages: p.pages,
            jobs: p.jobs,
            dead_letters_removed: p.dead_letters_removed,
            skipped: p.skipped,
            limited: p.limited,
            log_store_queries: p.log_store_queries,
            queue_queries: p.queue_queries,
            error: replay.error,
            takeovers: replay.takeovers,
            started_at: replay.started_at,
            updated_at: replay.updated_at,
            finished_at: replay.finished_at,
        }
    }
}

/// The replay tasks this process runs.
#[derive(Debug)]
pub struct Replays {
    stop: CancellationToken,
    tasks: TaskTracker,
}

impl Replays {
    /// No task yet.
    pub fn new() -> Self {
        Replays {
            stop: CancellationToken::new(),
            tasks: TaskTracker::new(),
        }
    }

    /// Runs a replay task, tracked for [`Replays::shutdown`]. The task gets the stop signal:
    /// it must stop at its next page boundary once the signal fires, and release its replay.
    pub fn spawn<F>(&self, task: impl FnOnce(CancellationToken) -> F) -> tokio::task::JoinHandle<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.tasks.spawn(task(self.stop.clone()))
    }

    /// Whether shutdown began (no new replay is started or taken over after it).
    pub fn stopping(&self) -> bool {
        self.stop.is_cancelled()
    }

    /// Tells every task to stop and waits up to `deadline` for them to release their replays.
    /// A task still running after it is left behind: its lease runs out and another process
    /// takes the replay over, as after a crash.
    pub async fn shutdown(&self, deadline: Duration) {
        self.stop.cancel();
        self.tasks.close();
        if tokio::time::timeout(deadline, self.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                "replays did not stop within {deadline:?}; another process takes them over \
                 once their leases run out"
            );
        }
    }
}

impl Default for Replays {
    fn default() -> Self {
        Self::new()
    }
}
