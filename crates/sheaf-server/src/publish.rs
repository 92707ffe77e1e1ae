//! Publishing an event, and a manual retry: the two ways jobs enter the queue.
//!
//! # Publish
//! 1. Validate, find the tenant (404 when unknown).
//! 2. An id accepted recently by this process is a repeat: answered at once.
//! 3. A publisher-chosen id is looked up in the log store (coalesced `get_events`); found, it
//!    is a repeat too (see below).
//! 4. The event goes into the fresh-event cache, then to the log store through the write
//!    coalescer; only when that write is durable are the jobs enqueued, one per matching,
//!    enabled destination, with ids derived from (tenant, event, destination).
//! 5. 202 once both are durable.
//!
//! Because the log write completes before the enqueue, "the event is in the log" implies
//! "its jobs were enqueued, or the publish failed in between and the client got an error".
//! A repeat therefore only re-enqueues, for each matching destination, the jobs of triples
//! that have no attempt logged yet: while such a job exists the enqueue is a no-op (the same
//! derived id), and a completed job always has its attempt logged first (workers write the
//! attempt before they report the outcome). So a repeated id never causes a second delivery,
//! including after the first delivery completed and its job is gone, and a publish that
//! failed between its two writes is repaired by the client's retry.
//!
//! # Manual retry
//! A new job with a random UUIDv7 id (delivery jobs' derived ids are version 8, which is how a
//! worker tells them apart): its first attempt is marked `manual`, and being newer than any
//! pending automatic retry's carried attempt, it supersedes it (the automatic retry finds a
//! newer attempt and finishes).

use std::sync::Arc;

use axum::http::StatusCode;
use serde::Deserialize;
use sha2::{Digest as _, Sha256};
use sheaf_store::{
    AttemptKey, Destination, DestinationId, Event, EventId, EventKey, Job, JobId, Payload,
    TenantId, Timestamp, validate_topic,
};
use uuid::Uuid;

use crate::core::Core;
use crate::error::ApiError;
use crate::logio::LogRecord;

/// The body of `POST /api/v1/publish`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PublishRequest {
    /// Whose event it is.
    pub tenant_id: String,
    /// What kind of event.
    pub topic: String,
    /// The JSON delivered to destinations.
    pub data: serde_json::Value,
    /// The idempotency key; generated when absent.
    #[serde(default)]
    pub id: Option<String>,
}

/// What a publish did.
#[derive(Debug, Clone)]
pub struct Published {
    /// The event's id.
    pub id: EventId,
    /// Whether the id was already known (nothing new was delivered).
    pub repeat: bool,
    /// Jobs enqueued.
    pub jobs: usize,
}

/// The id of the delivery job of (tenant, event, destination): a UUID version 8 whose bits
/// are the start of a SHA-256 of the triple, so enqueueing the same delivery twice is a
/// no-op for the queue (it skips an id it holds).
pub fn delivery_job_id(tenant: &TenantId, event: &EventId, destination: &DestinationId) -> JobId {
    let digest = Sha256::new()
        .chain_update(b"sheaf delivery job\0")
        .chain_update(tenant.as_str().as_bytes())
        .chain_update(b"\0")
        .chain_update(event.as_str().as_bytes())
        .chain_update(b"\0")
        .chain_update(destination.as_uuid().as_bytes())
        .finalize();
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    JobId::from_uuid(uuid::Builder::from_custom_bytes(bytes).into_uuid())
}

/// Whether a job is a manual retry (its id is a random UUIDv7, not a derived v8).
pub fn is_manual_job(id: &JobId) -> bool {
    id.as_uuid().get_version_num() == 7
}

fn job_for(event: &Event, destination: &Destination, now: Timestamp) -> Job {
    Job {
        id: delivery_job_id(&event.tenant_id, &event.id, &destination.id),
        tenant_id: event.tenant_id.clone(),
        event_id: event.id.clone(),
        destination_id: destination.id,
        attempt_number: 1,
        last_attempt_time: None,
        due_at: now,
    }
}

fn matches(destination: &Destination, event: &Event) -> bool {
    destination.enabled && destination.topics.matches(&event.topic)
}

/// Publishes an event: see the module docs.
pub async fn publish(core: &Arc<Core>, request: PublishRequest) -> Result<Published, ApiError> {
    let tenant_id = TenantId::new(request.tenant_id)?;
    validate_topic(&request.topic)?;
    let (id, chosen) = match request.id {
        Some(id) => (EventId::new(id)?, true),
        None => (EventId::generate(), false),
    };
    let entry = core.entities.get(&tenant_id).await?;
    if entry.tenant.is_none() {
        return Err(ApiError::unknown_tenant(tenant_id.as_str()));
    }
    let key = EventKey {
        tenant_id: tenant_id.clone(),
        event_id: id.clone(),
    };
    if core.accepted.contains_key(&key) {
        core.metrics
            .publish_repeats
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        return Ok(Published {
            id,
            repeat: true,
            jobs: 0,
        });
    }
    if chosen {
        let known = core.events.lookup(key.clone()).await.map_err(|e| {
            ApiError::unavailable(format!(
                "could not check whether the event id is known: {e}"
            ))
        })?;
        if let Some(event) = known {
            let jobs = repair(core, &event, &entry.destinations).await?;
            core.accepted.insert(key, ()).await;
            core.metrics
                .publish_repeats
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return Ok(Published {
                id,
                repeat: true,
                jobs,
            });
        }
    }
    let now = Timestamp::now();
    let event = Event {
        tenant_id: tenant_id.clone(),
        id: id.clone(),
        topic: request.topic,
        time: now,
        data: Payload::new(request.data),
    };
    core.fresh.insert(key.clone(), event.clone()).await;
    core.log_writer
        .hand_off(vec![LogRecord::Event(event.clone())])
        .await
        .map_err(|e| ApiError::unavailable(format!("could not record the event: {e}")))?;
    let jobs: Vec<Job> = entry
        .destinations
        .iter()
        .filter(|d| matches(d, &event))
        .map(|d| job_for(&event, d, now))
        .collect();
    if !jobs.is_empty() {
        core.stores
            .queue
            .enqueue(&jobs)
            .await
            .map_err(|e| ApiError::unavailable(format!("could not enqueue deliveries: {e}")))?;
        core.wake.notify_one();
    }
    core.accepted.insert(key, ()).await;
    crate::metrics::Metrics::inc(&core.metrics.events_published);
    crate::metrics::Metrics::add(&core.metrics.jobs_enqueued, jobs.len());
    Ok(Published {
        id,
        repeat: false,
        jobs: jobs.len(),
    })
}

/// A repeat of an event already in the log: enqueues the jobs of matching destinations (that
/// existed when it was published) which have no attempt logged. See the module docs.
async fn repair(
    core: &Arc<Core>,
    event: &Event,
    destinations: &[Destination],
) -> Result<usize, ApiError> {
    let candidates: Vec<&Destination> = destinations
        .iter()
        .filter(|d| matches(d, event) && d.created_at <= event.time)
        .collect();
    if candidates.is_empty() {
        return Ok(0);
    }
    let keys: Vec<AttemptKey> = candidates
        .iter()
        .map(|d| AttemptKey {
            tenant_id: event.tenant_id.clone(),
            event_id: event.id.clone(),
            destination_id: d.id,
            attempt_time: Timestamp::UNIX_EPOCH,
        })
        .collect();
    let attempted = core.stores.log.latest_attempts(&keys).await?;
    let now = Timestamp::now();
    let jobs: Vec<Job> = candidates
        .iter()
        .zip(&keys)
        .filter(|(_, key)| !attempted.contains_key(*key))
        .map(|(d, _)| job_for(event, d, now))
        .collect();
    if !jobs.is_empty() {
        core.fresh.insert(event.key(), event.clone()).await;
        core.stores.queue.enqueue(&jobs).await?;
        core.wake.notify_one();
    }
    Ok(jobs.len())
}

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
) -> Result<JobId, ApiError> {
    let event_id = EventId::new(request.event_id)?;
    let destination_id: DestinationId = request.destination_id.parse()?;
    let entry = core.entities.get(tenant_id).await?;
    if entry.tenant.is_none() {
        return Err(ApiError::unknown_tenant(tenant_id.as_str()));
    }
    if entry.destination(&destination_id).is_none() {
        return Err(ApiError::not_found(format!(
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
        .map_err(|e| ApiError::unavailable(format!("could not read the event: {e}")))?
        .ok_or_else(|| ApiError::not_found(format!("event {event_id} does not exist")))?;
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
    };
    core.fresh.insert(key, event).await;
    core.stores
        .queue
        .enqueue(std::slice::from_ref(&job))
        .await?;
    crate::metrics::Metrics::inc(&core.metrics.jobs_enqueued);
    core.wake.notify_one();
    Ok(job.id)
}

/// Maps a JSON body's deserialization error to the API's 400.
pub fn bad_body(err: &serde_json::Error) -> ApiError {
    let code = if err.is_syntax() || err.is_eof() {
        "malformed_json"
    } else {
        "invalid_request"
    };
    ApiError::new(
        StatusCode::BAD_REQUEST,
        code,
        format!("request body: {err}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delivery_job_ids_are_derived_and_version_8() {
        let t = TenantId::new("t").unwrap();
        let e = EventId::new("e").unwrap();
        let d = DestinationId::generate();
        let a = delivery_job_id(&t, &e, &d);
        assert_eq!(a, delivery_job_id(&t, &e, &d));
        assert_ne!(a, delivery_job_id(&t, &EventId::new("f").unwrap(), &d));
        assert!(!is_manual_job(&a));
        assert!(is_manual_job(&JobId::generate()));
    }
}
