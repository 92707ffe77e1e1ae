//! The stores' housekeeping: one task per process asks the queue and the log store every few
//! seconds for the upkeep they need while they run (`JobQueue::maintain`: on Postgres, a vacuum
//! of the jobs table once enough of its rows died, so the claim does not walk through them;
//! `LogStore::maintain`: in memory, retention by age while nothing is written), and beats the
//! queue's heartbeat, whose count of delivering processes splits rate limits between them.

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

pub(super) async fn run(core: Arc<Core>, stop: CancellationToken) {
    // The first round at once: the heartbeat's count matters from the first delivery.
    let mut first = true;
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
        match core.stores.log.maintain().await {
            Ok(true) => Metrics::inc(&core.metrics.log_maintenance),
            Ok(false) => {}
            Err(err) => {
                tracing::warn!(error = %err, "log store housekeeping failed; trying again later")
            }
        }
    }
}
