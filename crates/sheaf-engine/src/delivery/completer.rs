//! The completer: gathers job outcomes from every worker and writes each kind as one statement
//! per flush (one commit per job is bound by WAL writes; batched outcomes are not).
//!
//! With an outbox, a flush is one `Outbox::settle`: the attempts and every outcome in one
//! transaction, so an attempt is recorded no later than its job's outcome. A failed settlement
//! is tried again until it commits (the workers wait on the bounded channel meanwhile, so
//! nothing piles up): giving up would drop attempt records, which the outbox exists to prevent.
//! Leases that run out meanwhile are lost to the next claimer, which delivers again; that is
//! the at-least-once rule, and the late settlement still records the attempt that was made.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Outcome, Turn};
use sheaf_store::{Outbox, Settlement};

use crate::state::Core;
use crate::state::backoff::Backoff;
use crate::state::metrics::Metrics;

/// How often a failed queue statement of the completer is tried before its jobs are left to
/// their leases (they come back when the lease ends).
const OUTCOME_TRIES: u32 = 4;

/// The wait after a queue statement's first failure, doubling for each later one.
const OUTCOME_BACKOFF: Backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(1));

/// The wait between tries of a failed settlement, doubling up to five seconds.
const SETTLE_BACKOFF: Backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(5));

pub(super) async fn run(
    core: Arc<Core>,
    mut outcomes: mpsc::Receiver<Turn>,
    give_up: CancellationToken,
) {
    let interval = core.config.completer_flush_interval;
    let max = core.config.completer_max_batch;
    let mut last_flush = Instant::now();
    while let Some(first) = outcomes.recv().await {
        let mut frees_key = first.frees_key;
        let mut batch = vec![first];
        // Under load flushes follow each other without a pause, and each batch fills its
        // window; a completer that had nothing to write for a whole window is not under load.
        let idle = last_flush.elapsed() >= interval;
        let deadline = Instant::now() + interval;
        while batch.len() < max {
            // A batch that ends an ordered job, after an idle spell, goes as soon as nothing
            // else waits: its key's next event waits for this write. Under load it fills its
            // window as any batch does, so ordered load keeps its few large writes.
            if frees_key && idle {
                match outcomes.try_recv() {
                    Ok(outcome) => {
                        frees_key |= outcome.frees_key;
                        batch.push(outcome);
                        continue;
                    }
                    Err(_) => break,
                }
            }
            match tokio::time::timeout_at(deadline, outcomes.recv()).await {
                Ok(Some(outcome)) => {
                    frees_key |= outcome.frees_key;
                    batch.push(outcome);
                }
                Ok(None) | Err(_) => break,
            }
        }
        flush(&core, batch, &give_up).await;
        last_flush = Instant::now();
    }
}

/// Writes one batch of outcomes: one settlement with an outbox, else one statement per kind
/// present.
async fn flush(core: &Core, batch: Vec<Turn>, give_up: &CancellationToken) {
    let frees_key = batch.iter().any(|turn| turn.frees_key);
    let mut settlement = Settlement::default();
    let mut reports = Vec::new();
    for turn in batch {
        settlement.attempts.extend(turn.attempt);
        reports.extend(turn.report);
        match turn.outcome {
            Outcome::Complete(lease) => settlement.complete.push(lease),
            Outcome::Reschedule(r) => settlement.reschedule.push(r),
            Outcome::DeadLetter(d) => settlement.dead_letter.push(d),
        }
    }
    if let Some(outbox) = &core.stores.outbox {
        settle(core, outbox.as_ref(), &settlement, give_up).await;
    } else {
        write_outcomes(core, settlement).await;
    }
    if frees_key {
        // An ordered job is done: its key's next job can be claimed now, not at the next poll.
        core.wake.notify_one();
    }
    // After the outcomes are written: a destination is judged on what was recorded.
    if let Some(channel) = &core.turn_reports {
        channel.send(reports).await;
    }
}

/// Without an outbox: one statement per kind of outcome present.
async fn write_outcomes(core: &Core, settlement: Settlement) {
    let Settlement {
        complete,
        reschedule,
        dead_letter: dead,
        ..
    } = settlement;
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

/// Commits a settlement, trying until it does (see the module docs) or until a shutdown that
/// cannot wait any longer gives up on it.
async fn settle(
    core: &Core,
    outbox: &dyn Outbox,
    settlement: &Settlement,
    give_up: &CancellationToken,
) {
    let outcomes =
        settlement.complete.len() + settlement.reschedule.len() + settlement.dead_letter.len();
    let mut backoff = SETTLE_BACKOFF;
    loop {
        match outbox.settle(settlement).await {
            Ok(lost) => {
                Metrics::inc(&core.metrics.completer_statements);
                Metrics::add(&core.metrics.completer_outcomes, outcomes);
                if !lost.is_empty() {
                    Metrics::add(&core.metrics.leases_lost, lost.len());
                    tracing::debug!(lost = lost.len(), "settle: leases lost to another claimer");
                }
                if !settlement.reschedule.is_empty() {
                    // A short reschedule (not ready) may be due before the dispatcher's next poll.
                    core.wake.notify_one();
                }
                return;
            }
            Err(err) => {
                tracing::warn!(error = %err, attempts = settlement.attempts.len(), outcomes,
                    "settling attempts and outcomes failed; trying again");
                tokio::select! {
                    () = give_up.cancelled() => {
                        tracing::error!(attempts = settlement.attempts.len(), outcomes,
                            "shutting down with a settlement that could not commit: its jobs \
                             come back when their leases end, its attempts are not recorded");
                        return;
                    }
                    () = tokio::time::sleep(backoff.next_delay()) => {}
                }
            }
        }
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
