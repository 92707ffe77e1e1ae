//! Bulk replays' progress, where every process sharing the stores sees it: the [`ReplayStore`]
//! trait and its rows.
//!
//! A bulk replay reads a source (the dead-letter list, or the log's attempts) page by page and
//! enqueues a manual delivery for each match. Its row holds what it was asked, how far it got
//! (its counters and the cursor of the source's next page) and who runs it: a process id and a
//! lease on the **store's clock**, as a claimed job has. So:
//!
//! - any process answers "how far is replay X" by reading the row;
//! - the process running a replay stores its progress once per page (one write per page, never
//!   one per event), and every such write renews its lease;
//! - a replay whose owner stopped renewing (it died, or lost the database for longer than a
//!   lease) is taken over by another process ([`ReplayStore::take_over_replays`]), which resumes
//!   from the stored position.
//!
//! # Leases
//!
//! The same rule as the queue's (see [`crate::queue`]): a [`ReplayLease`] is the triple
//! `(replay id, owner, lease_until)`, and a write applies only while the row is running and its
//! stored owner and `lease_until` **equal** the lease's. A lease whose time has passed but that
//! nobody took over still matches, so a slow owner may go on; once another process took the
//! replay over, the row's `lease_until` is later than any the old owner holds and the old
//! owner's writes are lost, changing nothing. A takeover happens only after
//! `lease_until < now`, or at once after the owner released the replay.
//!
//! # A page's queue work
//!
//! A store that shares the queue's database (Postgres, beside the Postgres queue) can commit a
//! page's queue work (its jobs, and the dead letters it replayed) in the same transaction as
//! the page's progress ([`ReplayStore::save_replay_page`]): then a page is either enqueued and
//! stored, or neither, and a process that resumes a replay never enqueues a page twice. Other
//! stores say so ([`ReplayStore::commits_queue_work`]); the caller then enqueues first and
//! stores the progress after, and a resume may enqueue the page in flight again.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::{Cursor, Error, Job, JobId, Result, TenantId, Timestamp};

/// Where a replay is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplayState {
    /// Pages are being read and enqueued (by its owner, or waiting for a process to take it
    /// over).
    Running,
    /// Every page was read; its counters are final.
    Completed,
    /// A store failed; `error` says which, and the jobs enqueued before it stay enqueued.
    Failed,
}

impl ReplayState {
    /// The name the API and the stores' columns use: `running`, `completed`, `failed`.
    pub fn as_str(self) -> &'static str {
        match self {
            ReplayState::Running => "running",
            ReplayState::Completed => "completed",
            ReplayState::Failed => "failed",
        }
    }

    /// The state named `name` ([`Error::InvalidInput`] for another name).
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "running" => Ok(ReplayState::Running),
            "completed" => Ok(ReplayState::Completed),
            "failed" => Ok(ReplayState::Failed),
            other => Err(Error::invalid_input(format!(
                "{other:?} is not a replay state (running, completed, failed)"
            ))),
        }
    }
}

/// How far a replay got: what its owner stores after every page.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ReplayProgress {
    /// Pages of the source read so far.
    pub pages: u64,
    /// New manual deliveries enqueued so far.
    pub jobs: u64,
    /// Dead letters replayed and removed from the dead-letter list.
    pub dead_letters_removed: u64,
    /// Matches skipped because their destination is gone or disabled.
    pub skipped: u64,
    /// It stopped at the most deliveries one replay makes.
    pub limited: bool,
    /// Calls made to the log store.
    pub log_store_queries: u64,
    /// Calls made to the queue.
    pub queue_queries: u64,
    /// Where the source's next page starts; `None` before the first page was stored (a resume
    /// then starts from the beginning).
    pub position: Option<Cursor>,
}

/// A replay to store with [`ReplayStore::create_replay`].
#[derive(Debug, Clone, PartialEq)]
pub struct NewReplay {
    /// Its id, chosen by the caller (a UUIDv7).
    pub id: Uuid,
    /// Its tenant.
    pub tenant_id: TenantId,
    /// What it was asked, normalized; the store keeps it as given.
    pub request: serde_json::Value,
}

/// A stored replay.
#[derive(Debug, Clone, PartialEq)]
pub struct Replay {
    /// Its id.
    pub id: Uuid,
    /// Its tenant.
    pub tenant_id: TenantId,
    /// What it was asked, as given to [`ReplayStore::create_replay`].
    pub request: serde_json::Value,
    /// Where it is.
    pub state: ReplayState,
    /// How far it got, as last stored.
    pub progress: ReplayProgress,
    /// Why it failed, when it did.
    pub error: Option<String>,
    /// When it was created, on the store's clock.
    pub started_at: Timestamp,
    /// When its row was last written, on the store's clock.
    pub updated_at: Timestamp,
    /// When it finished, once it has (the store's clock).
    pub finished_at: Option<Timestamp>,
    /// The process that runs it; `None` once finished or released.
    pub owner: Option<Uuid>,
    /// Until when `owner` holds it, on the store's clock; `None` once finished or released.
    pub lease_until: Option<Timestamp>,
    /// How many times a process took it over from an owner that stopped.
    pub takeovers: u32,
}

/// Proof of ownership of a running replay. See the [module docs](self).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReplayLease {
    /// The replay.
    pub replay_id: Uuid,
    /// The process that holds it.
    pub owner: Uuid,
    /// Until when, on the store's clock.
    pub lease_until: Timestamp,
}

/// What [`ReplayStore::save_replay`] does after storing the progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplayStep {
    /// The replay goes on: the lease is renewed to `now + lease`.
    Continue {
        /// How long the renewed lease holds.
        lease: Duration,
    },
    /// The owner stops without finishing (it shuts down): the replay stays running with no
    /// owner, and any process may take it over at once.
    Release,
    /// Every page was read: the replay is completed.
    Complete,
    /// A store failed for good: the replay is failed, with this error.
    Fail {
        /// What failed, for people.
        error: String,
    },
}

/// What [`ReplayStore::save_replay`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplaySaved {
    /// Stored, and the replay goes on under this new lease ([`ReplayStep::Continue`]).
    Renewed(ReplayLease),
    /// Stored, and the replay is released, completed or failed.
    Ended,
    /// The lease did not match (another process took the replay over, or it is finished):
    /// nothing was written, and the caller must stop running it.
    Lost,
}

/// A page's queue work, for [`ReplayStore::save_replay_page`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplayPage {
    /// Jobs to enqueue, as [`crate::JobQueue::enqueue`] does: an id already queued or
    /// dead-lettered is skipped.
    pub jobs: Vec<Job>,
    /// Dead letters of the replay's tenant to remove, as
    /// [`crate::JobQueue::remove_dead_letters`] does.
    pub remove_dead_letters: Vec<JobId>,
}

/// Rejects a [`ReplayStep`] a backend must not store: a lease [`crate::validate_lease`] refuses.
pub fn validate_replay_step(step: &ReplayStep) -> Result<()> {
    match step {
        ReplayStep::Continue { lease } => crate::validate_lease(*lease),
        _ => Ok(()),
    }
}

/// Bulk replays, shared by every process that shares the store. See the [module docs](self).
///
/// Rows are few (one per replay, kept a day after it finishes) and each is written once per
/// page of its source, so no call here needs batching. Every call is one round trip.
#[async_trait]
pub trait ReplayStore: fmt::Debug + Send + Sync + 'static {
    /// Stores a new running replay with zero progress, owned by `owner` until `now + lease`;
    /// `started_at` and `updated_at` are the store's `now`. Returns the replay as stored and
    /// its lease. [`Error::Conflict`] if its id is taken (in any tenant); a zero lease is
    /// [`Error::InvalidInput`] (see [`crate::validate_lease`]). The tenant need not exist in
    /// any store: replays are checked by the service, not by the store.
    async fn create_replay(
        &self,
        replay: &NewReplay,
        owner: Uuid,
        lease: Duration,
    ) -> Result<(Replay, ReplayLease)>;

    /// The tenant's replay, or `None` (also when the id belongs to another tenant, or the
    /// replay was deleted).
    async fn get_replay(&self, tenant: &TenantId, id: Uuid) -> Result<Option<Replay>>;

    /// Stores `progress` whole (counters, `limited`, position) and applies `step`, atomically,
    /// if `lease` still holds the replay (the lease rule of the [module docs](self)); sets
    /// `updated_at` to the store's `now`. Otherwise writes nothing and answers
    /// [`ReplaySaved::Lost`].
    ///
    /// - [`ReplayStep::Continue`]: `lease_until = now + lease`, answered with the new lease (a
    ///   later one than any before it on this replay).
    /// - [`ReplayStep::Release`]: owner and `lease_until` cleared; still running.
    /// - [`ReplayStep::Complete`] / [`ReplayStep::Fail`]: state completed / failed (with the
    ///   error), `finished_at = now`, owner and `lease_until` cleared.
    ///
    /// A zero lease in `Continue` is [`Error::InvalidInput`] (see [`validate_replay_step`]).
    async fn save_replay(
        &self,
        lease: &ReplayLease,
        progress: &ReplayProgress,
        step: &ReplayStep,
    ) -> Result<ReplaySaved>;

    /// Takes over up to `max` running replays nobody holds (released, or `lease_until < now`),
    /// oldest `started_at` first, for `owner` until `now + lease`, and counts a takeover on
    /// each. Returns them as stored afterwards, with their leases. Exclusive as a queue claim:
    /// two concurrent calls, from any processes, never take the same replay while its new lease
    /// holds. `max == 0` takes nothing; a zero lease is [`Error::InvalidInput`].
    async fn take_over_replays(
        &self,
        owner: Uuid,
        lease: Duration,
        max: usize,
    ) -> Result<Vec<(Replay, ReplayLease)>>;

    /// Whether [`ReplayStore::save_replay_page`] commits a page's queue work with its progress:
    /// the store shares the queue's database. The default says no.
    fn commits_queue_work(&self) -> bool {
        false
    }

    /// [`ReplayStore::save_replay`], and in the same transaction, only if the lease holds, the
    /// page's queue work: its jobs enqueued, then its dead letters removed (so a job whose id
    /// is one of them is skipped), in the queue this store shares. The stored `dead_letters_removed` is `progress`'s plus the dead letters
    /// this call removed; returns what was saved and how many it removed (0 when lost). On
    /// `Lost` or `Err` nothing of it is committed. Jobs are checked as
    /// [`crate::validate_job`] does. Stores that do not share a queue
    /// ([`ReplayStore::commits_queue_work`] is `false`) answer [`Error::InvalidInput`], the
    /// default.
    async fn save_replay_page(
        &self,
        lease: &ReplayLease,
        progress: &ReplayProgress,
        step: &ReplayStep,
        page: &ReplayPage,
    ) -> Result<(ReplaySaved, u64)> {
        let _ = (lease, progress, step, page);
        Err(Error::invalid_input(
            "this replay store does not share the queue's database; enqueue first, then save_replay",
        ))
    }

    /// Deletes up to `max` finished (completed or failed) replays whose `finished_at` is before
    /// `before`, oldest first; returns how many. Running replays are never deleted, however old.
    async fn delete_finished_replays(&self, before: Timestamp, max: usize) -> Result<u64>;
}
