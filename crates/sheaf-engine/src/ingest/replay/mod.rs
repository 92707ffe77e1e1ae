//! Bulk replay: one new manual delivery for every (event, destination) of a tenant that matches a
//! filter, in pages, never one query per event; its progress in the shared `ReplayStore`, so any
//! process reads it and another resumes it when the process running it stops.
//!
//! The source depends on `status`:
//!
//! - `dead_lettered`: the queue's dead-letter list, newest first, the window applying to when
//!   each was dead-lettered. A page is one listing; its matches become one enqueue and one
//!   removal from the list: 3 queue calls per page of up to [`PAGE`] dead letters, and no
//!   log-store call unless a `topic` is asked for (then one batched event read per page).
//! - `failed` and `any`: the log's attempts in the window (of that status, or of any), newest
//!   first, each (event, destination) taken once. For `failed`, pairs whose latest attempt is a
//!   success are left out, through one batched latest-attempt lookup per page: 2 log-store calls
//!   and 1 enqueue per page.
//!
//! A match whose destination is gone or disabled is skipped (and counted). The new deliveries
//! are manual jobs, as `POST …/retry` makes: their first attempt is marked `manual`, and it
//! supersedes any automatic retry still pending. A replay's window is at most [`MAX_WINDOW`],
//! it takes only what was there when it started (the window ends at its start at the latest),
//! and it makes at most [`MAX_JOBS`] deliveries; the rest of a larger match is left for another
//! call with a narrower window (`limited` says so).
//!
//! # Ownership and resuming
//!
//! The process that starts a replay owns it by a lease (`SHEAF_QUEUE_LEASE`, on the replay
//! store's clock) and stores its progress after every page: counters and the cursor of the
//! next page, in one write that also renews the lease. [`ReplayKeeper`], one task per process,
//! takes over replays whose lease ran out (their owner died or lost the database) or that were
//! released (their owner shut down), and resumes each from its stored cursor; it also deletes
//! finished replays after [`KEPT_FOR`].
//!
//! With the Postgres queue, the replay store is in the same database and a page's jobs and
//! dead-letter removals commit in the same transaction as its progress, under the lease
//! (`ReplayStore::save_replay_page`): a page is enqueued and stored, or neither. So a resume
//! reads again only the page nothing was enqueued for, and an owner that lost its lease (it
//! stalled past it, and was taken over) commits nothing more. With the memory queue, the page's
//! queue work goes first and its progress after; a resume then enqueues the page in flight
//! again, which only a process on the same replay store with a queue of its own can do.
//!
//! What still keeps a resume from delivering twice:
//!
//! - a replay's job ids are derived from the replay and the (event, destination) pair
//!   ([`crate::state::jobs::replay_job_id`]), so enqueueing a job still waiting, claimed or
//!   dead-lettered is a no-op for the queue;
//! - a resumed runner no longer knows which pairs earlier pages took (a pair with several
//!   matching attempts, or several dead letters, shows up on more than one page), so it asks
//!   the log: a pair whose latest attempt was made since the replay started and is manual (or
//!   a later retry of one) was delivered by this replay, and is counted, not enqueued. One
//!   batched latest-attempt lookup per page after a takeover (the one `failed` makes anyway).
//!
//! What a resume can still repeat, only for such a pair seen again after a takeover (or, with
//! the memory queue, for the page in flight): a delivery whose job finished but whose attempt
//! the lookup did not see: settled between the lookup and the page's commit, waiting in the
//! outbox for the log shipper (ClickHouse log store), or timed by a worker whose clock is
//! behind the replay store's by more than the time to that delivery. A resume never skips a
//! match that no manual delivery since the replay's start has taken up.

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::json;
use sheaf_store::{DestinationId, NewReplay, Replay, ReplayLease, TenantId, TimeRange, Timestamp};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::ingest::PublishError;
use crate::state::Core;
use crate::state::replays::{KEPT_FOR, ReplayView};

mod runner;

use runner::run;

/// Items read per page of the source.
pub const PAGE: u32 = 1_000;

/// The widest window one replay may cover.
pub const MAX_WINDOW: Duration = Duration::from_secs(7 * 24 * 3600);

/// The most deliveries one replay makes.
pub const MAX_JOBS: u64 = 100_000;

/// How long `POST …/replay` waits for the replay to finish before it answers with its progress.
pub const ANSWER_WITHIN: Duration = Duration::from_secs(5);

/// How often [`ReplayKeeper`] looks for replays to take over and finished ones to delete: the
/// queue's housekeeping period, so a replay resumes within a lease and two seconds.
const KEEPER_EVERY: Duration = Duration::from_secs(2);

/// Replays one keeper round takes over at most; the rest wait for the next round (or another
/// process), so one process does not take every orphan at once.
const TAKE_AT_MOST: usize = 4;

/// Finished replays one keeper round deletes at most.
const DELETE_AT_MOST: usize = 1_000;

/// The body of `POST /api/v1/tenants/{tenant_id}/replay`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplayRequest {
    /// Only deliveries to this destination.
    #[serde(default)]
    pub destination_id: Option<String>,
    /// Only events of this topic.
    #[serde(default)]
    pub topic: Option<String>,
    /// `failed`, `dead_lettered` or `any`.
    pub status: String,
    /// The window's start (RFC 3339), inclusive.
    pub since: String,
    /// The window's end (RFC 3339), exclusive.
    pub until: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Failed,
    DeadLettered,
    Any,
}

/// A checked request.
#[derive(Debug, Clone)]
struct Selection {
    destination: Option<DestinationId>,
    topic: Option<String>,
    source: Source,
    status: String,
    window: TimeRange,
}

impl Selection {
    /// The request as stored with the replay: what a process that resumes it checks again.
    fn normalized(&self) -> serde_json::Value {
        json!({
            "destination_id": self.destination,
            "topic": self.topic,
            "status": self.status,
            "since": self.window.since,
            "until": self.window.until,
        })
    }
}

fn check(request: &ReplayRequest) -> Result<Selection, PublishError> {
    let invalid = |m: String| PublishError::Store(sheaf_store::Error::invalid_input(m));
    let source = match request.status.as_str() {
        "failed" => Source::Failed,
        "dead_lettered" => Source::DeadLettered,
        "any" => Source::Any,
        other => {
            return Err(invalid(format!(
                "status {other:?} is not one of \"failed\", \"dead_lettered\", \"any\""
            )));
        }
    };
    let since: Timestamp = request.since.parse()?;
    let until: Timestamp = request.until.parse()?;
    if until <= since {
        return Err(invalid("until must be after since".to_owned()));
    }
    if since.saturating_add(MAX_WINDOW) < until {
        return Err(invalid(format!(
            "a replay covers at most {} days; split the window",
            MAX_WINDOW.as_secs() / 86_400
        )));
    }
    let destination = request
        .destination_id
        .as_deref()
        .map(str::parse)
        .transpose()?;
    if let Some(topic) = &request.topic {
        sheaf_store::validate_topic(topic)?;
    }
    Ok(Selection {
        destination,
        topic: request.topic.clone(),
        source,
        status: request.status.clone(),
        window: TimeRange {
            since: Some(since),
            until: Some(until),
        },
    })
}

/// Checks the request, stores the replay (owned by this process) and starts it; waits up to
/// [`ANSWER_WITHIN`] for it and returns its progress as stored then (finished, or running).
pub async fn start_replay(
    core: &Arc<Core>,
    tenant: &TenantId,
    request: ReplayRequest,
) -> Result<ReplayView, PublishError> {
    let selection = check(&request)?;
    let entry = core.entities.get(tenant).await?;
    if entry.tenant.is_none() {
        return Err(PublishError::UnknownTenant(tenant.as_str().to_owned()));
    }
    if let Some(d) = selection.destination
        && entry.destination(&d).is_none()
    {
        return Err(PublishError::NotFound(format!(
            "destination {d} does not exist"
        )));
    }
    if core.replays.stopping() {
        return Err(PublishError::Unavailable(
            "this process is shutting down; start the replay on another".to_owned(),
        ));
    }
    let new = NewReplay {
        id: Uuid::now_v7(),
        tenant_id: tenant.clone(),
        request: selection.normalized(),
    };
    let (replay, lease) = core
        .stores
        .replays
        .create_replay(&new, core.process_id, core.config.queue_lease)
        .await?;
    let task = spawn_runner(core, replay, lease);
    let _ = tokio::time::timeout(ANSWER_WITHIN, task).await;
    let stored = core
        .stores
        .replays
        .get_replay(tenant, new.id)
        .await?
        .ok_or_else(|| PublishError::Internal(format!("replay {} vanished", new.id)))?;
    Ok(stored.into())
}

/// Runs a replay this process holds `lease` on, tracked by `core.replays`.
fn spawn_runner(core: &Arc<Core>, replay: Replay, lease: ReplayLease) -> JoinHandle<()> {
    let runner_core = Arc::clone(core);
    core.replays
        .spawn(move |stop| run(runner_core, replay, lease, stop))
}

/// The task that resumes other processes' replays and deletes finished ones: one per process.
#[derive(Debug)]
pub struct ReplayKeeper {
    core: Arc<Core>,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl ReplayKeeper {
    /// Starts the keeper; its first round runs at once, so a restarted process resumes what
    /// its previous life left as soon as the leases allow.
    pub fn start(core: &Arc<Core>) -> Self {
        let stop = CancellationToken::new();
        let task = tokio::spawn(keep(Arc::clone(core), stop.clone()));
        ReplayKeeper {
            core: Arc::clone(core),
            stop,
            task,
        }
    }

    /// Stops taking replays over, then stops this process's replays at their next page
    /// boundary and releases them (another process resumes them at once), for at most
    /// `deadline`.
    pub async fn shutdown(self, deadline: Duration) {
        self.stop.cancel();
        let _ = self.task.await;
        self.core.replays.shutdown(deadline).await;
    }
}

async fn keep(core: Arc<Core>, stop: CancellationToken) {
    let mut first = true;
    loop {
        if !first {
            tokio::select! {
                biased;
                () = stop.cancelled() => break,
                () = tokio::time::sleep(KEEPER_EVERY) => {}
            }
        }
        first = false;
        if core.replays.stopping() {
            break;
        }
        match core
            .stores
            .replays
            .take_over_replays(core.process_id, core.config.queue_lease, TAKE_AT_MOST)
            .await
        {
            Ok(taken) => {
                for (replay, lease) in taken {
                    tracing::info!(tenant = %replay.tenant_id, replay = %replay.id,
                        pages = replay.progress.pages, takeovers = replay.takeovers,
                        "resuming a replay its owner stopped running");
                    drop(spawn_runner(&core, replay, lease));
                }
            }
            Err(err) => {
                tracing::warn!(error = %err, "looking for replays to resume failed; trying again later")
            }
        }
        let before = Timestamp::now().saturating_sub(KEPT_FOR);
        if let Err(err) = core
            .stores
            .replays
            .delete_finished_replays(before, DELETE_AT_MOST)
            .await
        {
            tracing::warn!(error = %err, "deleting old replays failed; trying again later");
        }
    }
}
