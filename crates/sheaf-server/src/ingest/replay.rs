//! Bulk replay: one new manual delivery for every (event, destination) of a tenant that matches a
//! filter, in pages, never one query per event.
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
//! are manual jobs, exactly as `POST …/retry` makes: their first attempt is marked `manual`, and
//! it supersedes any automatic retry still pending. A replay's window is at most
//! [`MAX_WINDOW`], and it makes at most [`MAX_JOBS`] deliveries; the rest of a larger match is
//! left for another call with a narrower window (`limited` says so).

use std::collections::HashSet;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use serde::Deserialize;
use serde_json::json;
use sheaf_store::{
    AttemptFilter, AttemptKey, AttemptStatus, DestinationId, EventKey, Job, JobId, PageRequest,
    TenantId, TimeRange, Timestamp,
};
use uuid::Uuid;

use crate::ingest::PublishError;
use crate::state::Core;
use crate::state::entities::TenantEntry;
use crate::state::metrics::Metrics;
use crate::state::replays::{ReplayProgress, ReplayState, SharedProgress};

/// Items read per page of the source.
pub const PAGE: u32 = 1_000;

/// The widest window one replay may cover.
pub const MAX_WINDOW: Duration = Duration::from_secs(7 * 24 * 3600);

/// The most deliveries one replay makes.
pub const MAX_JOBS: u64 = 100_000;

/// How long `POST …/replay` waits for the replay to finish before it answers with its progress.
pub const ANSWER_WITHIN: Duration = Duration::from_secs(5);

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
    window: TimeRange,
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
        window: TimeRange {
            since: Some(since),
            until: Some(until),
        },
    })
}

/// Checks the request, registers the replay and starts it; waits up to [`ANSWER_WITHIN`] for
/// it and returns its progress then (finished, or still running).
pub async fn start_replay(
    core: &Arc<Core>,
    tenant: &TenantId,
    request: ReplayRequest,
) -> Result<ReplayProgress, PublishError> {
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
    let progress = core
        .replays
        .insert(ReplayProgress {
            replay_id: Uuid::now_v7(),
            tenant_id: tenant.clone(),
            request: json!({
                "destination_id": selection.destination,
                "topic": selection.topic,
                "status": request.status,
                "since": selection.window.since,
                "until": selection.window.until,
            }),
            state: ReplayState::Running,
            pages: 0,
            jobs: 0,
            dead_letters_removed: 0,
            skipped: 0,
            limited: false,
            log_store_queries: 0,
            queue_queries: 0,
            error: None,
            started_at: Timestamp::now(),
            finished_at: None,
        })
        .await;
    let task = tokio::spawn(run(
        Arc::clone(core),
        tenant.clone(),
        entry,
        selection,
        Arc::clone(&progress),
    ));
    let _ = tokio::time::timeout(ANSWER_WITHIN, task).await;
    Ok(snapshot(&progress))
}

fn snapshot(progress: &SharedProgress) -> ReplayProgress {
    progress
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
}

fn update(progress: &SharedProgress, change: impl FnOnce(&mut ReplayProgress)) {
    change(&mut progress.lock().unwrap_or_else(PoisonError::into_inner));
}

async fn run(
    core: Arc<Core>,
    tenant: TenantId,
    entry: Arc<TenantEntry>,
    selection: Selection,
    progress: SharedProgress,
) {
    let result = match selection.source {
        Source::DeadLettered => {
            from_dead_letters(&core, &tenant, &entry, &selection, &progress).await
        }
        Source::Failed | Source::Any => {
            from_attempts(&core, &tenant, &entry, &selection, &progress).await
        }
    };
    update(&progress, |p| {
        p.finished_at = Some(Timestamp::now());
        match result {
            Ok(()) => p.state = ReplayState::Completed,
            Err(err) => {
                p.state = ReplayState::Failed;
                p.error = Some(err.to_string());
            }
        }
    });
    let done = snapshot(&progress);
    tracing::info!(tenant = %tenant, replay = %done.replay_id, state = ?done.state,
        jobs = done.jobs, pages = done.pages, "replay finished");
}

/// Whether a match's destination can receive it: it exists and is enabled.
fn deliverable(entry: &TenantEntry, destination: &DestinationId) -> bool {
    entry.destination(destination).is_some_and(|d| d.enabled)
}

fn manual_job(tenant: &TenantId, key: &AttemptKey, attempt_number: u32) -> Job {
    Job {
        id: JobId::from_uuid(Uuid::now_v7()),
        tenant_id: tenant.clone(),
        event_id: key.event_id.clone(),
        destination_id: key.destination_id,
        attempt_number,
        last_attempt_time: None,
        due_at: Timestamp::now(),
    }
}

/// Enqueues a page's jobs (one call), counting them against [`MAX_JOBS`]; returns how many
/// may still follow.
async fn enqueue(
    core: &Core,
    jobs: &[Job],
    progress: &SharedProgress,
) -> Result<(), sheaf_store::Error> {
    if jobs.is_empty() {
        return Ok(());
    }
    core.stores.queue.enqueue(jobs).await?;
    Metrics::add(&core.metrics.jobs_enqueued, jobs.len());
    core.wake.notify_one();
    update(progress, |p| {
        p.queue_queries += 1;
        p.jobs += jobs.len() as u64;
    });
    Ok(())
}

fn room(progress: &SharedProgress) -> u64 {
    MAX_JOBS.saturating_sub(snapshot(progress).jobs)
}

async fn from_dead_letters(
    core: &Core,
    tenant: &TenantId,
    entry: &TenantEntry,
    selection: &Selection,
    progress: &SharedProgress,
) -> Result<(), sheaf_store::Error> {
    let mut page = PageRequest::first(PAGE);
    loop {
        let listed = core.stores.queue.list_dead_letters(tenant, &page).await?;
        update(progress, |p| {
            p.pages += 1;
            p.queue_queries += 1;
        });
        // Newest first: past the window's start, nothing older can match.
        let mut past_start = false;
        let mut matches = Vec::new();
        for dead in &listed.items {
            if !selection.window.contains(dead.dead_lettered_at) {
                past_start |= selection
                    .window
                    .since
                    .is_some_and(|since| dead.dead_lettered_at < since);
                continue;
            }
            if selection
                .destination
                .is_some_and(|d| d != dead.job.destination_id)
            {
                continue;
            }
            matches.push(dead);
        }
        if let Some(topic) = &selection.topic
            && !matches.is_empty()
        {
            let keys: Vec<EventKey> = matches
                .iter()
                .map(|d| EventKey {
                    tenant_id: tenant.clone(),
                    event_id: d.job.event_id.clone(),
                })
                .collect();
            let events = core.stores.log.get_events(&keys).await?;
            update(progress, |p| p.log_store_queries += 1);
            matches.retain(|d| {
                events
                    .get(&EventKey {
                        tenant_id: tenant.clone(),
                        event_id: d.job.event_id.clone(),
                    })
                    .is_some_and(|e| e.topic == *topic)
            });
        }
        let mut jobs = Vec::new();
        let mut replayed = Vec::new();
        let mut skipped = 0;
        let room = room(progress);
        for dead in matches {
            if !deliverable(entry, &dead.job.destination_id) {
                skipped += 1;
                continue;
            }
            if jobs.len() as u64 >= room {
                update(progress, |p| p.limited = true);
                break;
            }
            let key = AttemptKey {
                tenant_id: tenant.clone(),
                event_id: dead.job.event_id.clone(),
                destination_id: dead.job.destination_id,
                attempt_time: Timestamp::UNIX_EPOCH,
            };
            jobs.push(manual_job(
                tenant,
                &key,
                dead.job.attempt_number.saturating_add(1),
            ));
            replayed.push(dead.job.id);
        }
        enqueue(core, &jobs, progress).await?;
        if !replayed.is_empty() {
            let removed = core
                .stores
                .queue
                .remove_dead_letters(tenant, &replayed)
                .await?;
            update(progress, |p| {
                p.queue_queries += 1;
                p.dead_letters_removed += removed;
            });
        }
        update(progress, |p| p.skipped += skipped);
        match listed.next {
            Some(next) if !past_start && !snapshot(progress).limited => {
                page = PageRequest::after(PAGE, next);
            }
            _ => return Ok(()),
        }
    }
}

async fn from_attempts(
    core: &Core,
    tenant: &TenantId,
    entry: &TenantEntry,
    selection: &Selection,
    progress: &SharedProgress,
) -> Result<(), sheaf_store::Error> {
    let filter = AttemptFilter {
        event_id: None,
        destination_id: selection.destination,
        status: (selection.source == Source::Failed).then_some(AttemptStatus::Failed),
        topic: selection.topic.clone(),
        time: selection.window,
    };
    let mut seen: HashSet<(sheaf_store::EventId, DestinationId)> = HashSet::new();
    let mut page = PageRequest::first(PAGE);
    loop {
        let listed = core
            .stores
            .log
            .list_attempts(tenant, &filter, &page)
            .await?;
        update(progress, |p| {
            p.pages += 1;
            p.log_store_queries += 1;
        });
        // Newest first, so the first attempt seen of a pair is its latest in the window.
        let mut fresh = Vec::new();
        let mut skipped = 0;
        for attempt in &listed.items {
            if !seen.insert((attempt.event_id.clone(), attempt.destination_id)) {
                continue;
            }
            if !deliverable(entry, &attempt.destination_id) {
                skipped += 1;
                continue;
            }
            fresh.push(attempt);
        }
        if selection.source == Source::Failed && !fresh.is_empty() {
            // A pair delivered since (its latest attempt a success) needs no replay.
            let keys: Vec<AttemptKey> = fresh
                .iter()
                .map(|a| AttemptKey {
                    tenant_id: tenant.clone(),
                    event_id: a.event_id.clone(),
                    destination_id: a.destination_id,
                    attempt_time: Timestamp::UNIX_EPOCH,
                })
                .collect();
            let latest = core.stores.log.latest_attempts(&keys).await?;
            update(progress, |p| p.log_store_queries += 1);
            fresh.retain(|a| {
                let key = AttemptKey {
                    tenant_id: tenant.clone(),
                    event_id: a.event_id.clone(),
                    destination_id: a.destination_id,
                    attempt_time: Timestamp::UNIX_EPOCH,
                };
                latest
                    .get(&key)
                    .is_none_or(|l| l.status != AttemptStatus::Success)
            });
        }
        let room = room(progress);
        let mut jobs = Vec::new();
        for attempt in fresh {
            if jobs.len() as u64 >= room {
                update(progress, |p| p.limited = true);
                break;
            }
            let key = AttemptKey {
                tenant_id: tenant.clone(),
                event_id: attempt.event_id.clone(),
                destination_id: attempt.destination_id,
                attempt_time: Timestamp::UNIX_EPOCH,
            };
            jobs.push(manual_job(tenant, &key, attempt.number.saturating_add(1)));
        }
        enqueue(core, &jobs, progress).await?;
        update(progress, |p| p.skipped += skipped);
        match listed.next {
            Some(next) if !snapshot(progress).limited => page = PageRequest::after(PAGE, next),
            _ => return Ok(()),
        }
    }
}
