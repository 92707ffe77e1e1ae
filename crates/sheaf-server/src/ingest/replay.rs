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
//!   ([`replay_job_id`]), so enqueueing a job still waiting, claimed or dead-lettered is a
//!   no-op for the queue;
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

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::json;
use sheaf_store::{
    Attempt, AttemptFilter, AttemptKey, AttemptStatus, AttemptTrigger, Cursor, DeadLetter,
    DestinationId, EventId, EventKey, Job, NewReplay, PageRequest, Replay, ReplayLease, ReplayPage,
    ReplayProgress, ReplaySaved, ReplayStep, TenantId, TimeRange, Timestamp,
};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::ingest::PublishError;
use crate::state::Core;
use crate::state::backoff::Backoff;
use crate::state::entities::TenantEntry;
use crate::state::jobs::replay_job_id;
use crate::state::metrics::Metrics;
use crate::state::replays::{KEPT_FOR, ReplayView};

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

async fn run(core: Arc<Core>, replay: Replay, lease: ReplayLease, stop: CancellationToken) {
    let mut runner = match Runner::prepare(Arc::clone(&core), &replay).await {
        Ok(runner) => runner,
        Err(error) => {
            // Nothing was read: the stored progress is still the replay's.
            let runner_progress = replay.progress.clone();
            let step = ReplayStep::Fail { error };
            let saved = save(&core, &lease, &runner_progress, &step, None, Instant::now()).await;
            tracing::warn!(replay = %replay.id, ?saved, ?step, "a replay could not start");
            return;
        }
    };
    runner.drive(lease, stop).await;
}

/// Stores `progress` and `step` under `lease` (with `page`'s queue work in the same
/// transaction, when given), trying again while the lease may still hold (it was last renewed
/// by a save that began at `renewed_at`). Answers what was saved and how many dead letters the
/// page removed; `None` when it could not: the caller stops, and the lease runs out for another
/// process to take the replay over.
async fn save(
    core: &Core,
    lease: &ReplayLease,
    progress: &ReplayProgress,
    step: &ReplayStep,
    page: Option<&ReplayPage>,
    renewed_at: Instant,
) -> Option<(ReplaySaved, u64)> {
    let deadline = renewed_at + core.config.queue_lease;
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
    let replays = &core.stores.replays;
    loop {
        let saved = match page {
            Some(page) => replays.save_replay_page(lease, progress, step, page).await,
            None => replays
                .save_replay(lease, progress, step)
                .await
                .map(|saved| (saved, 0)),
        };
        match saved {
            Ok(saved) => return Some(saved),
            Err(err) if Instant::now() + backoff.peek() < deadline => {
                tracing::warn!(replay = %lease.replay_id, error = %err,
                    "storing a replay's progress failed; trying again");
                tokio::time::sleep(backoff.next_delay()).await;
            }
            Err(err) => {
                tracing::warn!(replay = %lease.replay_id, error = %err,
                    "storing a replay's progress failed until its lease ran out; another \
                     process takes it over");
                return None;
            }
        }
    }
}

/// What a page does with a match, judged on its pair's latest attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// Enqueue a delivery.
    Enqueue,
    /// This replay delivered it before a takeover: count it, enqueue nothing.
    Replayed,
    /// `failed` only: its latest attempt is a success, nothing to replay.
    Delivered,
}

/// One replay being run by this process.
struct Runner {
    core: Arc<Core>,
    replay_id: Uuid,
    tenant: TenantId,
    entry: Arc<TenantEntry>,
    selection: Selection,
    started_at: Timestamp,
    /// Taken over from another owner (or an earlier task): the pairs of pages read before are
    /// not in `seen`, and the page in flight may be enqueued already, so the log says which
    /// pairs this replay delivered.
    resumed: bool,
    progress: ReplayProgress,
    /// The pairs taken so far, each replayed once: the first one seen is its latest attempt in
    /// the window (newest first).
    seen: HashSet<(EventId, DestinationId)>,
}

impl Runner {
    /// Checks the stored request again and reads the tenant; the error says why the replay
    /// cannot run.
    async fn prepare(core: Arc<Core>, replay: &Replay) -> Result<Runner, String> {
        let request: ReplayRequest = serde_json::from_value(replay.request.clone())
            .map_err(|e| format!("the stored request does not parse: {e}"))?;
        let selection = check(&request).map_err(|e| format!("the stored request: {e}"))?;
        let entry = core
            .entities
            .get(&replay.tenant_id)
            .await
            .map_err(|e| format!("reading the tenant: {e}"))?;
        if entry.tenant.is_none() {
            return Err(format!(
                "tenant {:?} does not exist",
                replay.tenant_id.as_str()
            ));
        }
        Ok(Runner {
            core,
            replay_id: replay.id,
            tenant: replay.tenant_id.clone(),
            entry,
            selection,
            started_at: replay.started_at,
            resumed: replay.takeovers > 0,
            progress: replay.progress.clone(),
            seen: HashSet::new(),
        })
    }

    /// Reads and enqueues page after page, storing the progress after each, until the source
    /// ends, a store fails, the lease is lost or the process stops.
    async fn drive(&mut self, mut lease: ReplayLease, stop: CancellationToken) {
        let lease_for = self.core.config.queue_lease;
        let mut renewed_at = Instant::now();
        loop {
            if stop.is_cancelled() {
                let saved = save(
                    &self.core,
                    &lease,
                    &self.progress,
                    &ReplayStep::Release,
                    None,
                    renewed_at,
                )
                .await;
                tracing::info!(replay = %self.replay_id, ?saved, "replay released at shutdown");
                return;
            }
            // A page must not start on a lease that may run out under it: renew first when
            // half of it is spent (a slow store), so another process does not take over while
            // this one still enqueues.
            if renewed_at.elapsed() > lease_for / 2 {
                let began = Instant::now();
                match save(
                    &self.core,
                    &lease,
                    &self.progress,
                    &ReplayStep::Continue { lease: lease_for },
                    None,
                    renewed_at,
                )
                .await
                {
                    Some((ReplaySaved::Renewed(new), _)) => (lease, renewed_at) = (new, began),
                    other => {
                        tracing::warn!(replay = %self.replay_id, saved = ?other, "replay lease lost; stopping");
                        return;
                    }
                }
            }
            let (step, work) = match self.page().await {
                Ok((Some(next), work)) if !self.progress.limited => {
                    self.progress.position = Some(next);
                    (ReplayStep::Continue { lease: lease_for }, work)
                }
                Ok((_, work)) => (ReplayStep::Complete, work),
                Err(err) => (
                    ReplayStep::Fail {
                        error: err.to_string(),
                    },
                    ReplayPage::default(),
                ),
            };
            let began = Instant::now();
            match self.commit(&lease, step.clone(), work, renewed_at).await {
                Some(ReplaySaved::Renewed(new)) => (lease, renewed_at) = (new, began),
                Some(ReplaySaved::Ended) => {
                    let p = &self.progress;
                    tracing::info!(tenant = %self.tenant, replay = %self.replay_id, ?step,
                        jobs = p.jobs, pages = p.pages, "replay finished");
                    return;
                }
                Some(ReplaySaved::Lost) | None => {
                    tracing::warn!(replay = %self.replay_id,
                        "replay lease lost (another process took it over); stopping");
                    return;
                }
            }
        }
    }

    /// Commits a page: its jobs, its dead-letter removals and its progress. With a replay store
    /// beside the queue, in one transaction, so a page is enqueued and stored or neither;
    /// otherwise the queue work first and the progress after (a resume may then read the page
    /// in flight again).
    async fn commit(
        &mut self,
        lease: &ReplayLease,
        mut step: ReplayStep,
        work: ReplayPage,
        renewed_at: Instant,
    ) -> Option<ReplaySaved> {
        let core = Arc::clone(&self.core);
        let together = core.stores.outbox.is_some() && core.stores.replays.commits_queue_work();
        let (saved, removed) = if together {
            save(&core, lease, &self.progress, &step, Some(&work), renewed_at).await?
        } else {
            let removed = match self.apply(&work).await {
                Ok(removed) => removed,
                Err(err) => {
                    step = ReplayStep::Fail {
                        error: err.to_string(),
                    };
                    0
                }
            };
            self.progress.dead_letters_removed += removed;
            let saved = save(&core, lease, &self.progress, &step, None, renewed_at).await?;
            (saved.0, 0)
        };
        self.progress.dead_letters_removed += removed;
        if saved != ReplaySaved::Lost && !work.jobs.is_empty() {
            Metrics::add(&core.metrics.jobs_enqueued, work.jobs.len());
            core.wake.notify_one();
        }
        Some(saved)
    }

    /// A page's queue work through the queue: one enqueue, one removal. Returns how many dead
    /// letters it removed.
    async fn apply(&self, work: &ReplayPage) -> Result<u64, sheaf_store::Error> {
        let queue = &self.core.stores.queue;
        if !work.jobs.is_empty() {
            queue.enqueue(&work.jobs).await?;
        }
        if work.remove_dead_letters.is_empty() {
            return Ok(0);
        }
        queue
            .remove_dead_letters(&self.tenant, &work.remove_dead_letters)
            .await
    }

    /// One page of the source: the cursor of the next one (`None` at the end) and the page's
    /// queue work, counted in the progress but not yet done.
    async fn page(&mut self) -> Result<(Option<Cursor>, ReplayPage), sheaf_store::Error> {
        let window = self.window();
        if window.until <= window.since {
            return Ok((None, ReplayPage::default()));
        }
        match self.selection.source {
            Source::DeadLettered => self.dead_letter_page(window).await,
            Source::Failed | Source::Any => self.attempt_page(window).await,
        }
    }

    /// The requested window, ending at the replay's start at the latest: a replay takes what
    /// was there when it started, so a resume reads the same source, without the replay's own
    /// new attempts and dead letters.
    fn window(&self) -> TimeRange {
        TimeRange {
            since: self.selection.window.since,
            until: self.selection.window.until.map(|u| u.min(self.started_at)),
        }
    }

    fn page_request(&self) -> PageRequest {
        PageRequest {
            limit: PAGE,
            cursor: self.progress.position.clone(),
        }
    }

    /// How many more deliveries this replay may make.
    fn room(&self) -> u64 {
        MAX_JOBS.saturating_sub(self.progress.jobs)
    }

    /// Whether a match's destination can receive it: it exists and is enabled.
    fn deliverable(&self, destination: &DestinationId) -> bool {
        self.entry
            .destination(destination)
            .is_some_and(|d| d.enabled)
    }

    fn key(&self, event: &EventId, destination: DestinationId) -> AttemptKey {
        AttemptKey {
            tenant_id: self.tenant.clone(),
            event_id: event.clone(),
            destination_id: destination,
            attempt_time: Timestamp::UNIX_EPOCH,
        }
    }

    /// The latest attempt of each pair, in one batched lookup, when the page needs it: for
    /// `failed` (a pair delivered since needs no replay) and after a takeover.
    async fn latest_of(
        &mut self,
        pairs: &[(EventId, DestinationId)],
    ) -> Result<HashMap<AttemptKey, Attempt>, sheaf_store::Error> {
        let needed = self.resumed || self.selection.source == Source::Failed;
        if !needed || pairs.is_empty() {
            return Ok(HashMap::new());
        }
        let keys: Vec<AttemptKey> = pairs.iter().map(|(e, d)| self.key(e, *d)).collect();
        let latest = self.core.stores.log.latest_attempts(&keys).await?;
        self.progress.log_store_queries += 1;
        Ok(latest)
    }

    /// What to do with a match whose replayed delivery would be attempt `number`.
    fn verdict(&self, latest: Option<&Attempt>, number: u32) -> Verdict {
        if self.resumed
            && let Some(l) = latest
            && l.time >= self.started_at
            && (l.trigger == AttemptTrigger::Manual || l.number > number)
        {
            return Verdict::Replayed;
        }
        if self.selection.source == Source::Failed
            && latest.is_some_and(|l| l.status == AttemptStatus::Success)
        {
            return Verdict::Delivered;
        }
        Verdict::Enqueue
    }

    fn job(&self, event: &EventId, destination: DestinationId, number: u32) -> Job {
        Job {
            id: replay_job_id(&self.replay_id, &self.tenant, event, &destination),
            tenant_id: self.tenant.clone(),
            event_id: event.clone(),
            destination_id: destination,
            attempt_number: number,
            last_attempt_time: None,
            due_at: Timestamp::now(),
        }
    }

    /// Counts a page's queue work in the progress: its jobs and those found delivered already
    /// (`replayed`), one queue statement for the jobs and one for the removals.
    fn count(&mut self, work: &ReplayPage, replayed: u64) {
        let jobs = work.jobs.len() as u64;
        self.progress.jobs += jobs + replayed;
        self.progress.queue_queries +=
            u64::from(jobs > 0) + u64::from(!work.remove_dead_letters.is_empty());
    }

    /// Narrows a dead-letter page to the window, the destination and the topic (one batched
    /// event read when a topic is asked for). Also says whether the page went past the
    /// window's start, after which nothing older can match.
    async fn dead_letter_matches<'a>(
        &mut self,
        items: &'a [DeadLetter],
        window: TimeRange,
    ) -> Result<(Vec<&'a DeadLetter>, bool), sheaf_store::Error> {
        let mut past_start = false;
        let mut matches = Vec::new();
        for dead in items {
            if !window.contains(dead.dead_lettered_at) {
                past_start |= window.since.is_some_and(|s| dead.dead_lettered_at < s);
                continue;
            }
            if self
                .selection
                .destination
                .is_some_and(|d| d != dead.job.destination_id)
            {
                continue;
            }
            matches.push(dead);
        }
        if let Some(topic) = self.selection.topic.clone()
            && !matches.is_empty()
        {
            let key = |d: &DeadLetter| EventKey {
                tenant_id: self.tenant.clone(),
                event_id: d.job.event_id.clone(),
            };
            let keys: Vec<EventKey> = matches.iter().map(|d| key(d)).collect();
            let events = self.core.stores.log.get_events(&keys).await?;
            matches.retain(|d| events.get(&key(d)).is_some_and(|e| e.topic == topic));
            self.progress.log_store_queries += 1;
        }
        Ok((matches, past_start))
    }

    async fn dead_letter_page(
        &mut self,
        window: TimeRange,
    ) -> Result<(Option<Cursor>, ReplayPage), sheaf_store::Error> {
        let page = self.page_request();
        let queue = Arc::clone(&self.core.stores.queue);
        let listed = queue.list_dead_letters(&self.tenant, &page).await?;
        self.progress.pages += 1;
        self.progress.queue_queries += 1;
        let (matches, past_start) = self.dead_letter_matches(&listed.items, window).await?;
        // One delivery per pair; a pair's other dead letters leave the list with it.
        let mut remove = Vec::new();
        let mut candidates = Vec::new();
        let mut skipped = 0;
        for dead in matches {
            let pair = (dead.job.event_id.clone(), dead.job.destination_id);
            if !self.deliverable(&pair.1) {
                skipped += 1;
            } else if self.seen.contains(&pair) {
                remove.push(dead.job.id);
            } else {
                self.seen.insert(pair.clone());
                candidates.push((pair, dead));
            }
        }
        let pairs: Vec<_> = candidates.iter().map(|(p, _)| p.clone()).collect();
        let latest = self.latest_of(&pairs).await?;
        let room = self.room();
        let (mut jobs, mut replayed) = (Vec::new(), 0u64);
        for ((event, destination), dead) in candidates {
            if jobs.len() as u64 + replayed >= room {
                self.progress.limited = true;
                break;
            }
            let number = dead.job.attempt_number.saturating_add(1);
            match self.verdict(latest.get(&self.key(&event, destination)), number) {
                Verdict::Enqueue => jobs.push(self.job(&event, destination, number)),
                Verdict::Replayed => replayed += 1,
                Verdict::Delivered => {}
            }
            remove.push(dead.job.id);
        }
        let work = ReplayPage {
            jobs,
            remove_dead_letters: remove,
        };
        self.count(&work, replayed);
        self.progress.skipped += skipped;
        Ok((listed.next.filter(|_| !past_start), work))
    }

    async fn attempt_page(
        &mut self,
        window: TimeRange,
    ) -> Result<(Option<Cursor>, ReplayPage), sheaf_store::Error> {
        let filter = AttemptFilter {
            event_id: None,
            destination_id: self.selection.destination,
            status: (self.selection.source == Source::Failed).then_some(AttemptStatus::Failed),
            topic: self.selection.topic.clone(),
            time: window,
        };
        let page = self.page_request();
        let listed = self
            .core
            .stores
            .log
            .list_attempts(&self.tenant, &filter, &page)
            .await?;
        self.progress.pages += 1;
        self.progress.log_store_queries += 1;
        // Newest first, so the first attempt seen of a pair is its latest in the window.
        let mut fresh = Vec::new();
        for attempt in &listed.items {
            let pair = (attempt.event_id.clone(), attempt.destination_id);
            if !self.seen.insert(pair.clone()) {
                continue;
            }
            if !self.deliverable(&pair.1) {
                self.progress.skipped += 1;
                continue;
            }
            fresh.push((pair, attempt.number));
        }
        let pairs: Vec<_> = fresh.iter().map(|(p, _)| p.clone()).collect();
        let latest = self.latest_of(&pairs).await?;
        let room = self.room();
        let (mut jobs, mut replayed) = (Vec::new(), 0u64);
        for ((event, destination), last_number) in fresh {
            let number = last_number.saturating_add(1);
            let verdict = self.verdict(latest.get(&self.key(&event, destination)), number);
            if verdict == Verdict::Delivered {
                continue;
            }
            if jobs.len() as u64 + replayed >= room {
                self.progress.limited = true;
                break;
            }
            match verdict {
                Verdict::Enqueue => jobs.push(self.job(&event, destination, number)),
                Verdict::Replayed => replayed += 1,
                Verdict::Delivered => {}
            }
        }
        let work = ReplayPage {
            jobs,
            remove_dead_letters: Vec::new(),
        };
        self.count(&work, replayed);
        Ok((listed.next, work))
    }
}
