//! The completer: gathers job outcomes from every worker and writes each kind as one statement
//! per flush (one commit per job is bound by WAL writes; batched outcomes are not).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::Outcome;
use crate::state::Core;
use crate::state::backoff::Backoff;
use crate::state::metrics::Metrics;

/// How often a failed queue statement of the completer is tried before its jobs are left to
/// their leases (they come back when the lease ends).
const OUTCOME_TRIES: u32 = 4;

/// The wait after a queue statement's first failure, doubling for each later one.
const OUTCOME_BACKOFF: Backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(1));

pub(super) async fn run(core: Arc<Core>, mut outcomes: mpsc::Receiver<Outcome>) {
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
    let mut backoff = OUTCOME_BACKOFF;
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
                tokio::time::sleep(backoff.next_delay()).await;
            }
            Err(err) => tracing::error!(error = %err,
                "{what} of {jobs} jobs failed; they come back when their leases end"),
        }
    }
}
