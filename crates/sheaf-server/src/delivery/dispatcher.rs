//! The dispatcher: the one task per process that claims jobs, only as many as the channel to
//! the workers has free slots.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::state::Core;
use crate::state::handoff::Dispatched;
use crate::state::metrics::Metrics;

/// Pause after a failed claim, so a database that is down is not hammered.
const CLAIM_ERROR_BACKOFF: Duration = Duration::from_secs(1);

pub(super) async fn run(core: Arc<Core>, jobs: mpsc::Sender<Dispatched>, stop: CancellationToken) {
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
        // Before the statement: a lease's age is never underestimated.
        let claimed_at = Instant::now();
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
        let mut refused = Vec::new();
        for job in claimed {
            // It claimed no more than the free slots, and the group commit sends only into
            // slots it reserved: this does not wait.
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
