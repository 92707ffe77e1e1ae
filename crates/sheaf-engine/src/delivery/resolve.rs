//! What a job's turn delivers: a first delivery's payload from the fresh-event cache or the
//! coalesced event read, a retry's through the coalesced latest-attempt lookup, or the
//! reschedule of a job that is not ready for its turn yet.

use std::time::Duration;

use sheaf_store::{
    Attempt, AttemptTrigger, ClaimedJob, EventKey, Job, Payload, Reschedule, Timestamp,
    TraceContext,
};

use super::Outcome;
use super::worker::jittered;
use crate::state::Core;
use crate::state::log_access::RetryKey;
use crate::state::metrics::{DeliveryOutcome, Metrics};

/// How long after a retry's previous attempt its lookup may still miss it because it is not
/// logged yet (an outbox ships attempts to the log store every second or so; a backlog after a
/// log store outage takes longer, and its lookups fail rather than miss meanwhile). Past it the
/// attempt is not coming: the retry delivers from the event instead of waiting for it.
const ATTEMPT_LOGGED_WITHIN: Duration = Duration::from_secs(60);

/// The longest a job waits for what it is not ready for before it looks again.
const NOT_READY_MAX_DELAY: Duration = Duration::from_secs(10);

/// A reschedule that does not count as an attempt, after `SHEAF_RETRY_NOT_READY_DELAY`, or,
/// for a retry whose previous attempt is a while old, a quarter of that age (at most
/// [`NOT_READY_MAX_DELAY`], unless the setting is longer): a job that waits on something slow is
/// looked at a few times, not claimed and put back in a loop.
pub(super) fn not_ready(core: &Core, claimed: &ClaimedJob) -> Outcome {
    core.metrics.delivery(DeliveryOutcome::NotReady);
    let waited = claimed.job.last_attempt_time.map(age).unwrap_or_default();
    // The setting is the floor even where it is longer than the usual ceiling.
    let floor = core.config.retry.not_ready_delay;
    let delay = (waited / 4).min(NOT_READY_MAX_DELAY).max(floor);
    Outcome::Reschedule(Reschedule {
        lease: claimed.lease,
        due_at: Timestamp::now().saturating_add(jittered(delay, 20)),
        attempt_number: claimed.job.attempt_number,
        last_attempt_time: claimed.job.last_attempt_time,
    })
}

/// The payload a job delivers (with its publish's trace context), or the outcome that ends its
/// turn without a delivery.
pub(super) enum Resolved {
    Deliver {
        topic: String,
        data: Payload,
        trace: Option<TraceContext>,
    },
    Done(Outcome),
}

/// A first delivery (or a manual retry): the fresh-event cache, else the coalesced event read.
pub(super) async fn resolve_event(core: &Core, claimed: &ClaimedJob) -> Resolved {
    let job = &claimed.job;
    let key = EventKey {
        tenant_id: job.tenant_id.clone(),
        event_id: job.event_id.clone(),
    };
    if let Some(event) = core.fresh.get(&key) {
        Metrics::inc(&core.metrics.fresh_cache_hits);
        return Resolved::Deliver {
            topic: event.topic,
            data: event.data,
            trace: event.trace,
        };
    }
    Metrics::inc(&core.metrics.fresh_cache_misses);
    match core.events.lookup(key.clone()).await {
        Ok(Some(event)) => {
            // Cached again for the log shipper, which puts the payload back into this
            // delivery's attempt within a ship interval (the outbox keeps none).
            if core.stores.outbox.is_some() {
                core.fresh.insert(key, event.clone());
            }
            Resolved::Deliver {
                topic: event.topic,
                data: event.data,
                trace: event.trace,
            }
        }
        Ok(None) => {
            // Publishes write the event before they enqueue, and no log store drops an event a
            // delivery is owed (the memory log holds it for its jobs; the service sets no
            // retention on the Postgres and ClickHouse logs, which drop nothing). A missing
            // event means the store lost data, or the tenant was deleted meanwhile.
            tracing::error!(tenant = %job.tenant_id, event = %job.event_id,
                "the event of a pending delivery is not in the log store; the delivery cannot                  be made");
            core.metrics.delivery(DeliveryOutcome::EventMissing);
            Resolved::Done(Outcome::Complete(claimed.lease))
        }
        Err(err) => {
            tracing::warn!(error = %err, "event read failed; trying again shortly");
            Resolved::Done(not_ready(core, claimed))
        }
    }
}

/// A retry: the coalesced latest-attempt lookup. Found and not yet successful: deliver again
/// with the payload it returned; successful or superseded by a newer attempt: finish; missing:
/// the previous attempt is not logged yet, so the retry is not ready and comes back shortly.
pub(super) async fn resolve_retry(core: &Core, claimed: &ClaimedJob) -> Resolved {
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
        // Not logged yet: exactly like a single lookup finding nothing. Long after the attempt
        // it will not be: deliver from the event, as a retry that carries no attempt time does.
        Ok(None) if job.last_attempt_time.is_some_and(|t| !logged_by_now(t)) => {
            Resolved::Done(not_ready(core, claimed))
        }
        // A retry without an attempt time, or whose attempt never showed: from the event.
        Ok(None) => resolve_event(core, claimed).await,
        Ok(Some(latest)) => {
            if latest.status.settles() || superseded(job, &latest) {
                core.metrics.delivery(DeliveryOutcome::Superseded);
                Resolved::Done(Outcome::Complete(claimed.lease))
            } else {
                Resolved::Deliver {
                    topic: latest.event_topic,
                    data: latest.event_data,
                    trace: latest.event_trace,
                }
            }
        }
    }
}

/// Whether `latest`, newer than the attempt `job` carries, makes `job` unneeded: only when an
/// operator made it (a manual retry or a replay, whose first attempt is marked manual), which
/// goes on delivering on its own. A newer scheduled attempt that did not settle is this job's
/// own, whose outcome was never written (the queue refused the write through an election, or
/// the process died before it), so the job still carries the attempt before it: finishing
/// would drop an event that was never delivered, so it is delivered again instead.
fn superseded(job: &Job, latest: &Attempt) -> bool {
    latest.trigger == AttemptTrigger::Manual
        && job.last_attempt_time.is_some_and(|t| latest.time > t)
}

/// Whether an attempt made at `time` should be found in the log store by now.
fn logged_by_now(time: Timestamp) -> bool {
    age(time) > ATTEMPT_LOGGED_WITHIN
}

/// How long ago `time` was; zero for a time in the future.
fn age(time: Timestamp) -> Duration {
    let since = Timestamp::now()
        .as_datetime()
        .signed_duration_since(time.as_datetime());
    since.to_std().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use sheaf_store::testkit::fixtures::{attempt, event, job, shift, unique_tenant};
    use sheaf_store::{AttemptTrigger, Timestamp};

    #[test]
    fn only_an_operators_newer_attempt_supersedes_a_retry() {
        let tenant = unique_tenant("resolve");
        let now = Timestamp::now();
        let earlier = shift(now, -10_000_000);
        let retry = sheaf_store::Job {
            attempt_number: 3,
            last_attempt_time: Some(earlier),
            ..job(&tenant, now)
        };
        let event = event(&tenant, retry.event_id.as_str(), "t", earlier);
        // The job's own third attempt, whose outcome was never written: deliver again.
        let own = attempt(&event, retry.destination_id, now);
        assert!(!super::superseded(&retry, &own));
        // An operator's retry after the job's attempt: it goes on by itself.
        let manual = sheaf_store::Attempt {
            trigger: AttemptTrigger::Manual,
            ..own.clone()
        };
        assert!(super::superseded(&retry, &manual));
        // The attempt the job carries, or an older one, never supersedes it.
        let carried = sheaf_store::Attempt {
            time: earlier,
            ..manual
        };
        assert!(!super::superseded(&retry, &carried));
    }
}
