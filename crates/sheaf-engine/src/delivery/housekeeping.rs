//! The stores' housekeeping: one task per process asks the queue and the log store every few
//! seconds for the upkeep they need while they run (`JobQueue::maintain`: on Postgres, a vacuum
//! of the jobs table once enough of its rows died, so the claim does not walk through them;
//! `LogStore::maintain`: in memory, retention by age while nothing is written), and beats the
//! queue's heartbeat, whose count of delivering processes splits rate limits between them. With
//! an outbox shipped to another log store, it also samples how many events wait there, for the
//! pending-work bound publishes pass (`state::admission`). With the memory queue, it says in the
//! log when dead letters were dropped at the queue's bound.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::state::Core;
use crate::state::metrics::Metrics;

/// How often the queue is asked. Asking is an atomic read when there is nothing to do.
const EVERY: Duration = Duration::from_secs(2);

/// A process whose heartbeat is older than this no longer counts as sharing the queue (and its
/// share of rate limits goes back to the others): a few missed rounds.
const HEARTBEAT_TTL: Duration = Duration::from_secs(10);

/// How long until the outbox is counted again, after it held `events`. Counting reads the
/// outbox's index, so its cost grows with the backlog: a round every 2 s while it is small,
/// and one round per 100,000 waiting events beyond that (10 million: every 200 s). The bound is
/// then overshot by at most what is published between two counts, a few percent of it.
fn outbox_count_gap(events: u64) -> Duration {
    EVERY * u32::try_from(events / 100_000).unwrap_or(u32::MAX).max(1)
}

pub(super) async fn run(core: Arc<Core>, stop: CancellationToken) {
    // The first round at once: the heartbeat's count matters from the first delivery.
    let mut first = true;
    let mut next_outbox_count = tokio::time::Instant::now();
    let mut dead_letters_dropped = 0;
    loop {
        if !first {
            tokio::select! {
                biased;
                () = stop.cancelled() => break,
                () = tokio::time::sleep(EVERY) => {}
            }
        }
        first = false;
        match core.stores.queue.maintain().await {
            Ok(true) => Metrics::inc(&core.metrics.queue_maintenance),
            Ok(false) => {}
            Err(err) => {
                tracing::warn!(error = %err, "queue housekeeping failed; trying again later")
            }
        }
        match core
            .stores
            .queue
            .heartbeat(core.process_id, HEARTBEAT_TTL)
            .await
        {
            Ok(processes) => {
                core.pacer.set_processes(processes);
                core.metrics
                    .queue_processes
                    .store(u64::from(processes), std::sync::atomic::Ordering::Relaxed);
            }
            Err(err) => tracing::warn!(error = %err, "queue heartbeat failed; trying again later"),
        }
        if core.admission.samples_outbox()
            && tokio::time::Instant::now() >= next_outbox_count
            && let Some(outbox) = &core.stores.outbox
        {
            match outbox.backlog().await {
                Ok(backlog) => {
                    core.admission.note_outbox(backlog.events);
                    next_outbox_count =
                        tokio::time::Instant::now() + outbox_count_gap(backlog.events);
                }
                Err(err) => {
                    tracing::warn!(error = %err, "could not count the outbox; trying again later")
                }
            }
        }
        if let Some(queue) = &core.stores.memory_queue {
            let dropped = queue.dead_letters_dropped();
            if dropped > dead_letters_dropped {
                tracing::warn!(
                    dropped = dropped - dead_letters_dropped,
                    total = dropped,
                    "the memory queue dropped its oldest dead letters to keep its newest 10,000; \
                     their events can no longer be replayed"
                );
                dead_letters_dropped = dropped;
            }
        }
        match core.stores.log.maintain().await {
            Ok(true) => Metrics::inc(&core.metrics.log_maintenance),
            Ok(false) => {}
            Err(err) => {
                tracing::warn!(error = %err, "log store housekeeping failed; trying again later")
            }
        }
    }
}
