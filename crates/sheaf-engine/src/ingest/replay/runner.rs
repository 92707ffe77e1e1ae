//! One replay run by this process: page after page of its source, each committed with its
//! progress under the replay's lease (see the [module docs](super) for what a resume repeats).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sheaf_store::{
    Attempt, AttemptFilter, AttemptKey, AttemptStatus, AttemptTrigger, Cursor, DeadLetter,
    DestinationId, EventId, EventKey, Job, PageRequest, Replay, ReplayLease, ReplayPage,
    ReplayProgress, ReplaySaved, ReplayStep, TenantId, TimeRange, Timestamp,
};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::{MAX_JOBS, PAGE, ReplayRequest, Selection, Source, check};
use crate::state::Core;
use crate::state::backoff::Backoff;
use crate::state::entities::TenantEntry;
use crate::state::jobs::replay_job_id;
use crate::state::metrics::Metrics;

pub(super) async fn run(
    core: Arc<Core>,
    replay: Replay,
    lease: ReplayLease,
    stop: CancellationToken,
) {
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
        let mut enqueued = work.jobs.len();
        if !together {
            match self.apply(&work).await {
                Ok(removed) => self.progress.dead_letters_removed += removed,
                Err(err) => {
                    step = ReplayStep::Fail {
                        error: err.to_string(),
                    };
                    enqueued = 0;
                }
            }
        }
        let page = together.then_some(&work);
        let (saved, removed) = save(&core, lease, &self.progress, &step, page, renewed_at).await?;
        // Removals the store made in the page's transaction (none without one).
        self.progress.dead_letters_removed += removed;
        if saved != ReplaySaved::Lost && enqueued > 0 {
            Metrics::add(&core.metrics.jobs_enqueued, enqueued);
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
        if self.selection.source == Source::Failed && latest.is_some_and(|l| l.status.settles()) {
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
            order_key: None,
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
