//! A manual retry: a new job with a random UUIDv7 id (delivery jobs' derived ids are version 8,
//! which is how a worker tells them apart). Its first attempt is marked `manual`, and being
//! newer than any pending automatic retry's carried attempt, it supersedes it (the automatic
//! retry finds a newer attempt and finishes).

use std::sync::Arc;

use serde::Deserialize;
use sheaf_store::{AttemptKey, DestinationId, EventId, EventKey, Job, JobId, TenantId, Timestamp};
use uuid::Uuid;

use crate::ingest::PublishError;
use crate::state::Core;
use crate::state::metrics::Metrics;

/// The body of `POST /api/v1/tenants/{tenant_id}/retry`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryRequest {
    /// The event to deliver again.
    pub event_id: String,
    /// Where to.
    pub destination_id: String,
}

/// Enqueues a manual retry; returns its job id.
pub async fn manual_retry(
    core: &Arc<Core>,
    tenant_id: &TenantId,
    request: RetryRequest,
) -> Result<JobId, PublishError> {
    let event_id = EventId::new(request.event_id)?;
    let destination_id: DestinationId = request.destination_id.parse()?;
    let entry = core.entities.get(tenant_id).await?;
    if entry.tenant.is_none() {
        return Err(PublishError::UnknownTenant(tenant_id.as_str().to_owned()));
    }
    if entry.destination(&destination_id).is_none() {
        return Err(PublishError::NotFound(format!(
            "destination {destination_id} does not exist"
        )));
    }
    let key = EventKey {
        tenant_id: tenant_id.clone(),
        event_id: event_id.clone(),
    };
    let event = core
        .events
        .lookup(key.clone())
        .await
        .map_err(|e| PublishError::Unavailable(format!("could not read the event: {e}")))?
        .ok_or_else(|| PublishError::NotFound(format!("event {event_id} does not exist")))?;
    let latest = core
        .stores
        .log
        .latest_attempt(&AttemptKey {
            tenant_id: tenant_id.clone(),
            event_id: event_id.clone(),
            destination_id,
            attempt_time: Timestamp::UNIX_EPOCH,
        })
        .await?;
    let job = Job {
        id: JobId::from_uuid(Uuid::now_v7()),
        tenant_id: tenant_id.clone(),
        event_id,
        destination_id,
        attempt_number: latest.map_or(1, |a| a.number.saturating_add(1)),
        last_attempt_time: None,
        due_at: Timestamp::now(),
        order_key: None,
    };
    core.fresh.insert(key, event);
    core.stores
        .queue
        .enqueue(std::slice::from_ref(&job))
        .await?;
    Metrics::inc(&core.metrics.jobs_enqueued);
    core.wake.notify_one();
    Ok(job.id)
}
