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
        // The slots are reserved before the claim, and each claimed job goes into its own:
        // the group commit takes free slots for the jobs it leases at any moment, and a send
        // that had to wait for one would wait forever at shutdown, when the workers stop
        // taking jobs before the engine waits for this task.
        let permits = match jobs.try_reserve_many(room) {
            Ok(permits) => permits,
            // The group commit took some since `capacity`: look again.
            Err(mpsc::error::TrySendError::Full(())) => continue,
            Err(mpsc::error::TrySendError::Closed(())) => break,
        };
        let room = permits.len();
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
        // The claim returns no more jobs than it was asked for; unused permits free their
        // slots when dropped.
        for (job, permit) in claimed.into_iter().zip(permits) {
            permit.send(Dispatched {
                claimed: job,
                claimed_at,
            });
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
