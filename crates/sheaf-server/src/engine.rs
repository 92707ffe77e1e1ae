//! The delivery engine: one dispatcher, a pool of workers and one completer per process.
//!
//! ```text
//!  JobQueue ──claim(free slots)──> dispatcher ──bounded channel (capacity = workers)──> workers
//!     ^                                                                                   │
//!     └── complete / reschedule / dead-letter, batched ── completer <── outcome ──────────┘
//! ```
//!
//! - The **dispatcher** is the only task that claims (seed 002: claim queries drop from
//!   workers × processes to processes). It claims only as many jobs as the channel has free
//!   slots, so claimed-but-unstarted work is bounded by the worker count and a saturated
//!   process leaves due jobs to others. When a claim returns fewer jobs than it had room for
//!   it sleeps `SHEAF_QUEUE_POLL_INTERVAL`, or until a publish in this process wakes it.
//! - A **worker** takes a job from the channel (never from the database), renews its lease
//!   first when more than half of it is spent (seed 002), resolves what to send — a first
//!   delivery's payload from the fresh-event cache or the coalesced event read; a retry's
//!   through the coalesced latest-attempt lookup (seed 000) — delivers, writes the attempt
//!   through the log write coalescer, and hands the job's outcome to the completer.
//! - The **completer** gathers outcomes from every worker for `SHEAF_COMPLETER_FLUSH_INTERVAL`
//!   or `SHEAF_COMPLETER_MAX_BATCH` outcomes and writes each kind as one statement: one commit
//!   per job is WAL-bound and loses even to the savepoint design at 4–16 clients, while one
//!   batched completion ran 1.2–3.5x faster (BRIEF.md, "Queue designs measured here").
//!
//! Shutdown: stop claiming; let workers finish what they hold until `SHEAF_SHUTDOWN_TIMEOUT`,
//! then abandon it (its lease runs out and another claim picks it up); release the claims
//! still in the channel, unstarted; flush the completer.

use std::sync::Arc;
use std::time::Duration;

use rand::Rng as _;
use sheaf_store::{
    Attempt, AttemptId, AttemptStatus, AttemptTrigger, ClaimedJob, DeadLetterRequest, EventKey,
    Lease, Payload, Reschedule, Timestamp,
};
use tokio::sync::{Mutex, mpsc};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::core::Core;
use crate::logio::{LogRecord, RetryKey};
use crate::metrics::{DeliveryOutcome, Metrics};
use crate::publish::is_manual_job;
use crate::webhook::{Delivered, Sender};

/// A claimed job on its way to a worker, with when it was claimed (the lease's age is
/// measured on this process's clock, so clock skew with the database does not matter).
#[derive(Debug)]
struct Dispatched {
    claimed: ClaimedJob,
    claimed_at: Instant,
}

/// What the completer writes for one job.
#[derive(Debug)]
enum Outcome {
    Complete(Lease),
    Reschedule(Reschedule),
    DeadLetter(DeadLetterRequest),
}

/// How often a failed queue statement of the completer is tried before its jobs are left to
/// their leases (they come back when the lease ends).
const OUTCOME_TRIES: u32 = 4;

/// How often a failed attempt write is tried before the worker gives up on logging it.
const ATTEMPT_WRITE_TRIES: u32 = 3;

/// Pause after a failed claim, so a database that is down is not hammered.
const CLAIM_ERROR_BACKOFF: Duration = Duration::from_secs(1);

/// The running engine.
#[derive(Debug)]
pub struct Engine {
    core: Arc<Core>,
    stop: CancellationToken,
    abort: CancellationToken,
    dispatcher: JoinHandle<()>,
    workers: TaskTracker,
    completer: JoinHandle<()>,
    completer_tx: mpsc::Sender<Outcome>,
    jobs_rx: Arc<Mutex<mpsc::Receiver<Dispatched>>>,
}

impl Engine {
    /// Starts the dispatcher, the workers and the completer.
    pub fn start(core: Arc<Core>) -> anyhow::Result<Self> {
        let sender = Sender::new(
            core.config.delivery_timeout,
            core.config.allow_private_destinations,
        )?;
        let stop = CancellationToken::new();
        let abort = CancellationToken::new();
        let workers_count = core.config.delivery_workers;
        let (jobs_tx, jobs_rx) = mpsc::channel::<Dispatched>(workers_count);
        let jobs_rx = Arc::new(Mutex::new(jobs_rx));
        let (completer_tx, completer_rx) =
            mpsc::channel::<Outcome>(core.config.completer_max_batch.saturating_mul(4).max(64));

        let completer = tokio::spawn(run_completer(Arc::clone(&core), completer_rx));
        let dispatcher = tokio::spawn(run_dispatcher(Arc::clone(&core), jobs_tx, stop.clone()));
        let workers = TaskTracker::new();
        for _ in 0..workers_count {
            workers.spawn(run_worker(
                Arc::clone(&core),
                sender.clone(),
                Arc::clone(&jobs_rx),
                completer_tx.clone(),
                stop.clone(),
                abort.clone(),
            ));
        }
        workers.close();
        Ok(Self {
            core,
            stop,
            abort,
            dispatcher,
            workers,
            completer,
            completer_tx,
            jobs_rx,
        })
    }

    /// Stops gracefully: see the module docs. `deadline` bounds the wait for in-flight deliveries.
    pub async fn shutdown(self, deadline: Duration) {
        self.stop.cancel();
        let _ = self.dispatcher.await;
        if tokio::time::timeout(deadline, self.workers.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                "in-flight deliveries did not finish within {deadline:?}; abandoning them to their leases"
            );
            self.abort.cancel();
            self.workers.wait().await;
        }
        // Claims still in the channel were never started: give them back at once.
        let mut unstarted = Vec::new();
        {
            let mut rx = self.jobs_rx.lock().await;
            rx.close();
            while let Ok(dispatched) = rx.try_recv() {
                unstarted.push(dispatched.claimed.lease);
            }
        }
        if !unstarted.is_empty() {
            match self.core.stores.queue.release(&unstarted).await {
                Ok(_) => Metrics::add(&self.core.metrics.jobs_released, unstarted.len()),
                Err(err) => tracing::warn!(error = %err, jobs = unstarted.len(),
                    "could not release unstarted jobs; they come back when their leases end"),
            }
        }
        drop(self.completer_tx);
        let _ = self.completer.await;
    }
}

async fn run_dispatcher(core: Arc<Core>, jobs: mpsc::Sender<Dispatched>, stop: CancellationToken) {
    let lease = core.config.queue_lease;
    let poll = core.config.queue_poll_interval;
    loop {
        if stop.is_cancelled() {
            break;
        }
        let room = jobs.capacity();
        if room == 0 {
            // Wait until a worker takes a job; the permit is only a signal.
            tokio::select! {
                biased;
                () = stop.cancelled() => break,
                permit = jobs.reserve() => match permit {
                    Ok(permit) => drop(permit),
                    Err(_) => break,
                },
            }
            continue;
        }
        Metrics::inc(&core.metrics.claims);
        let claimed = match core.stores.queue.claim(room, lease).await {
            Ok(claimed) => claimed,
            Err(err) => {
                tracing::warn!(error = %err, "claim failed");
                tokio::select! {
                    () = stop.cancelled() => break,
                    () = tokio::time::sleep(CLAIM_ERROR_BACKOFF) => {}
                }
                continue;
            }
        };
        let got = claimed.len();
        Metrics::add(&core.metrics.jobs_claimed, got);
        let claimed_at = Instant::now();
        let mut refused = Vec::new();
        for job in claimed {
            // Only this task sends, and it claimed no more than the free slots: this does not wait.
            if let Err(mpsc::error::SendError(d)) = jobs
                .send(Dispatched {
                    claimed: job,
                    claimed_at,
                })
                .await
            {
                refused.push(d.claimed.lease);
            }
        }
        if !refused.is_empty() {
            let _ = core.stores.queue.release(&refused).await;
            break;
        }
        if got == room {
            // There may be more due: claim again as soon as there is room.
            continue;
        }
        tokio::select! {
            biased;
            () = stop.cancelled() => break,
            () = core.wake.notified() => {}
            () = tokio::time::sleep(poll) => {}
        }
    }
}

async fn run_worker(
    core: Arc<Core>,
    sender: Sender,
    jobs: Arc<Mutex<mpsc::Receiver<Dispatched>>>,
    outcomes: mpsc::Sender<Outcome>,
    stop: CancellationToken,
    abort: CancellationToken,
) {
    loop {
        let next = {
            let mut rx = jobs.lock().await;
            tokio::select! {
                biased;
                () = stop.cancelled() => None,
                job = rx.recv() => job,
            }
        };
        let Some(dispatched) = next else { break };
        let outcome = tokio::select! {
            biased;
            () = abort.cancelled() => break,
            outcome = handle(&core, &sender, dispatched) => outcome,
        };
        if let Some(outcome) = outcome
            && outcomes.send(outcome).await.is_err()
        {
            break;
        }
    }
}

/// A short reschedule that does not count as an attempt.
fn not_ready(core: &Core, claimed: &ClaimedJob) -> Outcome {
    core.metrics.delivery(DeliveryOutcome::NotReady);
    Outcome::Reschedule(Reschedule {
        lease: claimed.lease,
        due_at: Timestamp::now().saturating_add(core.config.retry.not_ready_delay),
        attempt_number: claimed.job.attempt_number,
        last_attempt_time: claimed.job.last_attempt_time,
    })
}

/// The payload a job delivers, or the outcome that ends its turn without a delivery.
enum Resolved {
    Deliver { topic: String, data: Payload },
    Done(Outcome),
}

/// A first delivery (or a manual retry): the fresh-event cache, else the coalesced event read.
async fn resolve_event(core: &Core, claimed: &ClaimedJob) -> Resolved {
    let job = &claimed.job;
    let key = EventKey {
        tenant_id: job.tenant_id.clone(),
        event_id: job.event_id.clone(),
    };
    if let Some(event) = core.fresh.get(&key).await {
        Metrics::inc(&core.metrics.fresh_cache_hits);
        return Resolved::Deliver {
            topic: event.topic,
            data: event.data,
        };
    }
    Metrics::inc(&core.metrics.fresh_cache_misses);
    match core.events.lookup(key).await {
        Ok(Some(event)) => Resolved::Deliver {
            topic: event.topic,
            data: event.data,
        },
        Ok(None) => {
            // Publishes write the event before they enqueue, so a missing event was dropped
            // by the log's retention (or its tenant deleted): there is nothing to send.
            tracing::warn!(tenant = %job.tenant_id, event = %job.event_id,
                "event is no longer in the log store; dropping its delivery");
            core.metrics.delivery(DeliveryOutcome::EventMissing);
            Resolved::Done(Outcome::Complete(claimed.lease))
        }
        Err(err) => {
            tracing::warn!(error = %err, "event read failed; trying again shortly");
            Resolved::Done(not_ready(core, claimed))
        }
    }
}

/// A retry: the coalesced latest-attempt lookup (seed 000, BRIEF "Data flow").
async fn resolve_retry(core: &Core, claimed: &ClaimedJob) -> Resolved {
    let job = &claimed.job;
    Metrics::inc(&core.metrics.retry_lookups);
    let key = RetryKey {
        tenant_id: job.tenant_id.clone(),
        event_id: job.event_id.clone(),
        destination_id: job.destination_id,
        attempt_time: job.last_attempt_time,
    };
    match core.retries.lookup(key).await {
        Err(err) => {
            tracing::debug!(error = %err, "latest-attempt lookup failed; retry not ready");
            Resolved::Done(not_ready(core, claimed))
        }
        // Not logged yet: exactly like a single lookup finding nothing.
        Ok(None) if job.last_attempt_time.is_some() => Resolved::Done(not_ready(core, claimed)),
        // A retry without an attempt time and no attempt at all: deliver from the event.
        Ok(None) => resolve_event(core, claimed).await,
        Ok(Some(latest)) => {
            let superseded = job.last_attempt_time.is_some_and(|t| latest.time > t);
            if latest.status == AttemptStatus::Success || superseded {
                core.metrics.delivery(DeliveryOutcome::Superseded);
                Resolved::Done(Outcome::Complete(claimed.lease))
            } else {
                Resolved::Deliver {
                    topic: latest.event_topic,
                    data: latest.event_data,
                }
            }
        }
    }
}

/// One job's turn: returns its outcome for the completer (`None` when the lease is lost).
async fn handle(core: &Core, sender: &Sender, dispatched: Dispatched) -> Option<Outcome> {
    let mut claimed = dispatched.claimed;
    let lease = core.config.queue_lease;
    if dispatched.claimed_at.elapsed() > lease / 2 {
        match core.stores.queue.renew(&[claimed.lease], lease).await {
            Ok(renewed) => match renewed.leases.first() {
                Some(new) => {
                    claimed.lease = *new;
                    Metrics::inc(&core.metrics.lease_renewals);
                }
                None => {
                    Metrics::inc(&core.metrics.leases_lost);
                    return None;
                }
            },
            Err(err) => {
                tracing::warn!(error = %err, "lease renewal failed; delivering on the old lease")
            }
        }
    }
    let job = claimed.job.clone();
    let entry = match core.entities.get(&job.tenant_id).await {
        Ok(entry) => entry,
        Err(err) => {
            tracing::warn!(error = %err, "could not read the destination; trying again shortly");
            return Some(not_ready(core, &claimed));
        }
    };
    let destination = match (&entry.tenant, entry.destination(&job.destination_id)) {
        (Some(_), Some(destination)) => destination.clone(),
        _ => {
            core.metrics.delivery(DeliveryOutcome::Dropped);
            return Some(Outcome::Complete(claimed.lease));
        }
    };
    if !destination.enabled {
        core.metrics.delivery(DeliveryOutcome::Dropped);
        return Some(Outcome::DeadLetter(DeadLetterRequest {
            lease: claimed.lease,
            reason: "the destination is disabled".to_owned(),
        }));
    }
    let manual = is_manual_job(&job.id) && job.last_attempt_time.is_none();
    let first = job.last_attempt_time.is_none() && (job.attempt_number == 1 || manual);
    let resolved = if first {
        resolve_event(core, &claimed).await
    } else {
        resolve_retry(core, &claimed).await
    };
    let (topic, data) = match resolved {
        Resolved::Deliver { topic, data } => (topic, data),
        Resolved::Done(outcome) => return Some(outcome),
    };

    let body = serde_json::to_vec(data.value()).unwrap_or_else(|_| b"null".to_vec());
    let now = Timestamp::now();
    let delivered = sender.deliver(&destination, &job.event_id, body, now).await;
    core.metrics.attempt_latency(delivered.elapsed);
    if job.attempt_number > 1 && !manual {
        Metrics::inc(&core.metrics.retries);
    }
    let attempt = Attempt {
        tenant_id: job.tenant_id.clone(),
        id: AttemptId::generate(),
        event_id: job.event_id.clone(),
        destination_id: job.destination_id,
        number: job.attempt_number,
        time: now,
        status: if delivered.success {
            AttemptStatus::Success
        } else {
            AttemptStatus::Failed
        },
        trigger: if manual {
            AttemptTrigger::Manual
        } else {
            AttemptTrigger::Scheduled
        },
        response_code: delivered.code,
        duration_ms: u32::try_from(delivered.elapsed.as_millis()).unwrap_or(u32::MAX),
        response_body: delivered.body.clone(),
        error: delivered.error.clone(),
        event_topic: topic,
        event_data: data,
    };
    let logged = write_attempt(core, attempt).await;
    Some(outcome_of(core, &claimed, &delivered, now, logged))
}

/// Writes the attempt before the job's outcome is reported: a retry's lookup must find it,
/// and a completed job must leave its attempt behind (publish's repeat check relies on it).
async fn write_attempt(core: &Core, attempt: Attempt) -> bool {
    for try_number in 1..=ATTEMPT_WRITE_TRIES {
        match core
            .log_writer
            .hand_off(vec![LogRecord::Attempt(attempt.clone())])
            .await
        {
            Ok(()) => return true,
            Err(err) if try_number < ATTEMPT_WRITE_TRIES => {
                tracing::warn!(error = %err, "attempt write failed; trying again");
                tokio::time::sleep(Duration::from_millis(200 * u64::from(try_number))).await;
            }
            Err(err) => {
                tracing::error!(error = %err, tenant = %attempt.tenant_id, event = %attempt.event_id,
                    "could not log the attempt");
            }
        }
    }
    false
}

fn outcome_of(
    core: &Core,
    claimed: &ClaimedJob,
    delivered: &Delivered,
    now: Timestamp,
    logged: bool,
) -> Outcome {
    let job = &claimed.job;
    if delivered.success {
        core.metrics.delivery(DeliveryOutcome::Success);
        return Outcome::Complete(claimed.lease);
    }
    let retry = &core.config.retry;
    if job.attempt_number >= retry.max_attempts {
        core.metrics.delivery(DeliveryOutcome::DeadLettered);
        let last = match (delivered.code, &delivered.error) {
            (Some(code), _) => format!("status {code}"),
            (None, Some(error)) => error.clone(),
            (None, None) => "no answer".to_owned(),
        };
        return Outcome::DeadLetter(DeadLetterRequest {
            lease: claimed.lease,
            reason: format!(
                "gave up after {} attempts; last: {last}",
                job.attempt_number
            ),
        });
    }
    core.metrics.delivery(DeliveryOutcome::Failed);
    let delay = match delivered.retry_after {
        Some(asked) => asked.clamp(Duration::from_secs(1), retry.retry_after_max),
        None => jittered(retry.base_delay(job.attempt_number), retry.jitter_percent),
    };
    Outcome::Reschedule(Reschedule {
        lease: claimed.lease,
        due_at: now.saturating_add(delay),
        attempt_number: job.attempt_number.saturating_add(1),
        // An attempt that could not be logged cannot be found by the retry's lookup; the retry
        // then looks without a time bound (a single, unbatched lookup) or reads the event.
        last_attempt_time: logged.then_some(now),
    })
}

/// `delay` moved randomly by up to `percent` of itself, either way.
fn jittered(delay: Duration, percent: u32) -> Duration {
    if percent == 0 {
        return delay;
    }
    let spread = delay.as_secs_f64() * f64::from(percent) / 100.0;
    let offset = rand::rng().random_range(-spread..=spread);
    Duration::from_secs_f64((delay.as_secs_f64() + offset).max(0.0))
}

async fn run_completer(core: Arc<Core>, mut outcomes: mpsc::Receiver<Outcome>) {
    let interval = core.config.completer_flush_interval;
    let max = core.config.completer_max_batch;
    while let Some(first) = outcomes.recv().await {
        let mut batch = vec![first];
        let deadline = Instant::now() + interval;
        while batch.len() < max {
            match tokio::time::timeout_at(deadline, outcomes.recv()).await {
                Ok(Some(outcome)) => batch.push(outcome),
                Ok(None) | Err(_) => break,
            }
        }
        flush(&core, batch).await;
    }
}

/// Writes one batch of outcomes: one statement per kind present.
async fn flush(core: &Core, batch: Vec<Outcome>) {
    let mut complete = Vec::new();
    let mut reschedule = Vec::new();
    let mut dead = Vec::new();
    for outcome in batch {
        match outcome {
            Outcome::Complete(lease) => complete.push(lease),
            Outcome::Reschedule(r) => reschedule.push(r),
            Outcome::DeadLetter(d) => dead.push(d),
        }
    }
    let queue = &core.stores.queue;
    if !complete.is_empty() {
        let n = complete.len();
        with_retries(core, "complete", n, || queue.complete(&complete)).await;
    }
    if !reschedule.is_empty() {
        let n = reschedule.len();
        with_retries(core, "reschedule", n, || queue.reschedule(&reschedule)).await;
        // A short reschedule (not ready) may be due before the dispatcher's next poll.
        core.wake.notify_one();
    }
    if !dead.is_empty() {
        let n = dead.len();
        with_retries(core, "dead-letter", n, || queue.dead_letter(&dead)).await;
    }
}

async fn with_retries<'a, F, Fut>(core: &Core, what: &str, jobs: usize, mut call: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = sheaf_store::Result<Vec<sheaf_store::JobId>>> + 'a,
{
    for try_number in 1..=OUTCOME_TRIES {
        match call().await {
            Ok(lost) => {
                Metrics::inc(&core.metrics.completer_statements);
                Metrics::add(&core.metrics.completer_outcomes, jobs);
                if !lost.is_empty() {
                    Metrics::add(&core.metrics.leases_lost, lost.len());
                    tracing::debug!(lost = lost.len(), "{what}: leases lost to another claimer");
                }
                return;
            }
            Err(err) if try_number < OUTCOME_TRIES => {
                tracing::warn!(error = %err, "{what} of {jobs} jobs failed; trying again");
                tokio::time::sleep(Duration::from_millis(100 << try_number)).await;
            }
            Err(err) => tracing::error!(error = %err,
                "{what} of {jobs} jobs failed; they come back when their leases end"),
        }
    }
}
