//! Publishing events: an HTTP publish, or a batch of the CDC source, one path.
//!
//! 1. Validate, find the tenant (404 when unknown), and pass the pending-work bound
//!    (`state::admission`: refused with [`PublishError::Overloaded`] while what is accepted and
//!    not yet delivered is at its bound; nothing accepted is ever dropped to make room).
//! 2. An id accepted recently by this process is a repeat: answered at once.
//! 3. A publisher-chosen id is looked up in the log store (coalesced `get_events`); found, it
//!    is a repeat too (see below).
//! 4. The event goes into the fresh-event cache, then to the log store through the write
//!    coalescer; only when that write is durable are the jobs enqueued, one per destination
//!    whose topics and payload filter match (`matches`), with ids derived from
//!    (tenant, event, destination). An event no destination wants costs no job. A disabled
//!    destination gets its job too: the worker dead-letters it at once, with the reason
//!    "destination disabled", so every event published while a destination was off is in its
//!    dead-letter list and a replay of that list delivers them once it is on again.
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
//! [`publish_events`] runs the same steps for many events of one tenant at once, with one log
//! write and one enqueue: it is the CDC source's path. Ids starting with [`crate::ingest::body::CDC_ID_PREFIX`] are
//! the CDC source's and refused from publishers.
//!
//! # With an outbox (the Postgres queue)
//!
//! Steps 3 to 5 become one: every new event goes, with its jobs, to the group commit
//! (`state::intake`), which accepts it in the outbox in the same statement as the publishes
//! around it. The outbox decides idempotency by the event's key in that statement, so a repeated
//! id is known without reading the log store, its jobs are never enqueued twice, and there is no
//! gap between "recorded" and "enqueued" for a repeat to repair. The answer is 202 once that
//! statement committed; the log store receives the event afterwards, from the log shipper.

use std::sync::Arc;

use tracing::Instrument as _;

use sheaf_store::{
    AttemptKey, Destination, Event, EventId, EventKey, Intake, Job, Payload, TenantId, Timestamp,
    TraceContext, validate_topic,
};

pub use crate::ingest::body::ValidPublish;
use crate::state::Core;
use crate::state::admission::Refused;
use crate::state::intake::{IntakeCommit, IntakeRecord};
use crate::state::jobs::delivery_job_id;
use crate::state::log_access::LogRecord;
use crate::state::metrics::Metrics;
use crate::state::trace::publish_context;

/// Why a publish or a manual retry did not go through. The HTTP layer answers each kind with
/// its status; the CDC source logs it and tries again.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum PublishError {
    /// The tenant does not exist.
    #[error("tenant {0:?} does not exist")]
    UnknownTenant(String),
    /// Something the request names does not exist (a destination, an event).
    #[error("{0}")]
    NotFound(String),
    /// A store could not be reached; the same call may succeed later.
    #[error("{0}")]
    Unavailable(String),
    /// A store refused or failed the call; its kind says why.
    #[error(transparent)]
    Store(#[from] sheaf_store::Error),
    /// The pending work is at its bound (`state::admission`): try again after `retry_after`.
    #[error("{message}")]
    Overloaded {
        /// Which bound, in words.
        message: String,
        /// When to try again.
        retry_after: std::time::Duration,
    },
    /// A bug: what should not happen did.
    #[error("{0}")]
    Internal(String),
}

impl From<Refused> for PublishError {
    fn from(refused: Refused) -> Self {
        PublishError::Overloaded {
            message: refused.message,
            retry_after: refused.retry_after,
        }
    }
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

pub(crate) fn job_for(event: &Event, destination: &Destination, now: Timestamp) -> Job {
    Job {
        id: delivery_job_id(&event.tenant_id, &event.id, &destination.id),
        tenant_id: event.tenant_id.clone(),
        event_id: event.id.clone(),
        destination_id: destination.id,
        attempt_number: 1,
        last_attempt_time: None,
        due_at: now,
        order_key: destination
            .ordering_key
            .as_deref()
            .and_then(|pointer| super::order::order_key(event, pointer)),
    }
}

/// Whether `event` gets a job for `destination`: a topic it receives, and its payload filter
/// (if any) matches. Decided here, at publish, so an event a filter refuses costs no job.
/// Whether the destination is enabled is not asked: a disabled one's job is dead-lettered by
/// the worker (see the module docs), so the event is accounted for, not silently skipped.
pub(crate) fn matches(destination: &Destination, event: &Event) -> bool {
    destination.wants(&event.topic, &event.data)
}

/// Publishes an event whose body passed [`crate::ingest::body::validate_publish`]: see the
/// module docs.
pub async fn publish(core: &Arc<Core>, request: ValidPublish) -> Result<Published, PublishError> {
    let tenant_id = request.tenant_id;
    let (id, chosen) = match request.id {
        Some(id) => (id, true),
        None => (EventId::generate(), false),
    };
    let event = NewEvent {
        id,
        chosen,
        topic: request.topic,
        data: Payload::new(request.data),
    };
    let mut published = publish_events(core, &tenant_id, vec![event]).await?;
    published
        .pop()
        .ok_or_else(|| PublishError::Internal("publish returned no result".to_owned()))
}

/// One event for [`publish_events`], its id already decided.
#[derive(Debug, Clone)]
pub struct NewEvent {
    /// The event's id.
    pub id: EventId,
    /// Whether the id came from outside (a publisher's idempotency key, a CDC position), so it
    /// may be known already and is looked up; a generated id is new by construction.
    pub chosen: bool,
    /// What kind of event.
    pub topic: String,
    /// The JSON delivered to destinations.
    pub data: Payload,
}

/// Publishes several events of one tenant: the module docs' steps, with every new event of the
/// call in one log write (one hand-off to the write coalescer) and every job in one enqueue.
/// Returns one [`Published`] per event, in order. The CDC source publishes a replicated
/// transaction this way; `publish` is the call with one event.
///
/// `Ok` means every event is durable in the log and its jobs are enqueued (or it was a repeat).
/// On `Err` any subset may have been written; calling again with the same events is safe, as
/// for a client retrying a publish: known ids become repeats.
pub async fn publish_events(
    core: &Arc<Core>,
    tenant_id: &TenantId,
    events: Vec<NewEvent>,
) -> Result<Vec<Published>, PublishError> {
    // Traced only while spans are exported: a disabled span costs nothing.
    let span = match core.traces {
        Some(_) => tracing::info_span!("publish", tenant_id = %tenant_id, events = events.len()),
        None => tracing::Span::none(),
    };
    publish_in_span(core, tenant_id, events)
        .instrument(span)
        .await
}

async fn publish_in_span(
    core: &Arc<Core>,
    tenant_id: &TenantId,
    events: Vec<NewEvent>,
) -> Result<Vec<Published>, PublishError> {
    for event in &events {
        validate_topic(&event.topic)?;
    }
    let entry = core.entities.get(tenant_id).await?;
    if entry.tenant.is_none() {
        return Err(PublishError::UnknownTenant(tenant_id.as_str().to_owned()));
    }
    core.admission.check()?;
    let trace = remember_trace(core, tenant_id, &events).await;
    match &core.intake {
        Some(intake) => {
            publish_durably(core, intake, tenant_id, &entry.destinations, events, trace).await
        }
        None => publish_directly(core, tenant_id, &entry.destinations, events, trace).await,
    }
}

/// The publish's trace context, stored with each event so that every delivery continues this
/// publish's trace, and kept in memory before anything can deliver them, for this process's
/// deliveries (`state::trace`). `None` unless spans are exported.
async fn remember_trace(
    core: &Core,
    tenant_id: &TenantId,
    events: &[NewEvent],
) -> Option<TraceContext> {
    let traces = core.traces.as_ref()?;
    for event in events {
        traces
            .remember(EventKey {
                tenant_id: tenant_id.clone(),
                event_id: event.id.clone(),
            })
            .await;
    }
    publish_context()
}

/// [`publish_events`] without an outbox: steps 2 to 5 of the module docs.
async fn publish_directly(
    core: &Arc<Core>,
    tenant_id: &TenantId,
    destinations: &[Destination],
    events: Vec<NewEvent>,
    trace: Option<TraceContext>,
) -> Result<Vec<Published>, PublishError> {
    let mut results = repeats_among(core, tenant_id, destinations, &events).await?;
    let now = Timestamp::now();
    let fresh: Vec<(usize, Event)> = events
        .into_iter()
        .enumerate()
        .filter(|(i, _)| results[*i].is_none())
        .map(|(i, e)| {
            (
                i,
                Event {
                    tenant_id: tenant_id.clone(),
                    id: e.id,
                    topic: e.topic,
                    time: now,
                    data: e.data,
                    trace: trace.clone(),
                },
            )
        })
        .collect();
    if !fresh.is_empty() {
        let counts = record_and_enqueue(core, destinations, &fresh, now).await?;
        for ((i, event), jobs) in fresh.into_iter().zip(counts) {
            core.accepted.insert(event.key(), ());
            results[i] = Some(Published {
                id: event.id,
                repeat: false,
                jobs,
            });
        }
    }
    Ok(results.into_iter().flatten().collect())
}

/// Steps 2 and 3: one entry per event, `Some` for a repeat (an id accepted recently by this
/// process, repeated within this call, or found in the log store, whose missing jobs are
/// repaired), `None` for an event to publish.
async fn repeats_among(
    core: &Arc<Core>,
    tenant_id: &TenantId,
    destinations: &[Destination],
    events: &[NewEvent],
) -> Result<Vec<Option<Published>>, PublishError> {
    let key_of = |id: &EventId| EventKey {
        tenant_id: tenant_id.clone(),
        event_id: id.clone(),
    };
    let mut results: Vec<Option<Published>> = vec![None; events.len()];
    let repeat = |id: &EventId, jobs: usize| Published {
        id: id.clone(),
        repeat: true,
        jobs,
    };
    let mut seen = std::collections::HashSet::with_capacity(events.len());
    let mut to_check = Vec::new();
    for (i, event) in events.iter().enumerate() {
        if !seen.insert(event.id.clone()) || core.accepted.contains_key(&key_of(&event.id)) {
            results[i] = Some(repeat(&event.id, 0));
        } else if event.chosen {
            to_check.push(i);
        }
    }
    // Chosen ids are looked up in the log store; the lookups go through the event coalescer
    // together, so a batch of ids costs a few `get_events` queries, not one per id.
    let known = futures::future::join_all(
        to_check
            .iter()
            .map(|&i| core.events.lookup(key_of(&events[i].id))),
    )
    .await;
    let mut repeats = Vec::new();
    for (&i, found) in to_check.iter().zip(known) {
        let found = found.map_err(|e| {
            PublishError::Unavailable(format!(
                "could not check whether the event id is known: {e}"
            ))
        })?;
        if let Some(stored) = found {
            repeats.push((i, stored));
        }
    }
    if !repeats.is_empty() {
        let stored: Vec<Event> = repeats.iter().map(|(_, e)| e.clone()).collect();
        let jobs = repair(core, &stored, destinations).await?;
        for ((i, event), jobs) in repeats.into_iter().zip(jobs) {
            core.accepted.insert(event.key(), ());
            results[i] = Some(repeat(&event.id, jobs));
        }
    }
    Metrics::add(
        &core.metrics.publish_repeats,
        results.iter().flatten().count(),
    );
    Ok(results)
}

/// Step 4: the new events into the fresh-event cache and, durably, the log store; then their
/// jobs into the queue. Returns how many jobs each event got, in order.
async fn record_and_enqueue(
    core: &Core,
    destinations: &[Destination],
    fresh: &[(usize, Event)],
    now: Timestamp,
) -> Result<Vec<usize>, PublishError> {
    for (_, event) in fresh {
        core.fresh.insert(event.key(), event.clone());
    }
    core.log_writer
        .hand_off(
            fresh
                .iter()
                .map(|(_, e)| LogRecord::Event(e.clone()))
                .collect(),
        )
        .await
        .map_err(|e| PublishError::Unavailable(format!("could not record the event: {e}")))?;
    let mut jobs: Vec<Job> = Vec::new();
    let mut counts = Vec::with_capacity(fresh.len());
    for (_, event) in fresh {
        let before = jobs.len();
        jobs.extend(
            destinations
                .iter()
                .filter(|d| matches(d, event))
                .map(|d| job_for(event, d, now)),
        );
        counts.push(jobs.len() - before);
    }
    if !jobs.is_empty() {
        // A child of the publish, while spans are exported (the Postgres queue's enqueue is
        // part of the group commit's `coalesced_write` instead).
        let span = match core.traces {
            Some(_) => tracing::info_span!("enqueue", jobs = jobs.len()),
            None => tracing::Span::none(),
        };
        core.stores
            .queue
            .enqueue(&jobs)
            .instrument(span)
            .await
            .map_err(|e| PublishError::Unavailable(format!("could not enqueue deliveries: {e}")))?;
        core.wake.notify_one();
    }
    Metrics::add(&core.metrics.events_published, fresh.len());
    Metrics::add(&core.metrics.jobs_enqueued, jobs.len());
    Ok(counts)
}

/// [`publish_events`] through the outbox's group commit: see the module docs.
async fn publish_durably(
    core: &Arc<Core>,
    intake: &IntakeCommit,
    tenant_id: &TenantId,
    destinations: &[Destination],
    events: Vec<NewEvent>,
    trace: Option<TraceContext>,
) -> Result<Vec<Published>, PublishError> {
    let now = Timestamp::now();
    let mut results: Vec<Option<Published>> = vec![None; events.len()];
    let mut seen = std::collections::HashSet::with_capacity(events.len());
    let mut records = Vec::with_capacity(events.len());
    let mut pending = Vec::with_capacity(events.len());
    for (i, new) in events.into_iter().enumerate() {
        let event = Event {
            tenant_id: tenant_id.clone(),
            id: new.id,
            topic: new.topic,
            time: now,
            data: new.data,
            trace: trace.clone(),
        };
        // Repeated within the call, or accepted recently by this process: known already.
        if !seen.insert(event.id.clone()) || core.accepted.contains_key(&event.key()) {
            results[i] = Some(Published {
                id: event.id,
                repeat: true,
                jobs: 0,
            });
            continue;
        }
        let jobs: Vec<Job> = destinations
            .iter()
            .filter(|d| matches(d, &event))
            .map(|d| job_for(&event, d, now))
            .collect();
        let job_count = jobs.len();
        let (record, slot) = IntakeRecord::new(Intake {
            event: event.clone(),
            jobs,
        });
        records.push(record);
        pending.push((i, event, slot, job_count));
    }
    if !records.is_empty() {
        intake
            .hand_off(records)
            .await
            .map_err(|e| PublishError::Unavailable(format!("could not record the event: {e}")))?;
        let (mut published, mut enqueued) = (0, 0);
        for (i, event, slot, jobs) in pending {
            let new = slot.load(std::sync::atomic::Ordering::Acquire);
            core.accepted.insert(event.key(), ());
            if new {
                // The group commit's writer has put it in the fresh-event cache already.
                published += 1;
                enqueued += jobs;
            }
            results[i] = Some(Published {
                id: event.id,
                repeat: !new,
                jobs: if new { jobs } else { 0 },
            });
        }
        // The group commit has woken the dispatcher for the jobs it did not hand over itself.
        Metrics::add(&core.metrics.events_published, published);
        Metrics::add(&core.metrics.jobs_enqueued, enqueued);
    }
    let repeats = results.iter().flatten().filter(|p| p.repeat).count();
    Metrics::add(&core.metrics.publish_repeats, repeats);
    Ok(results.into_iter().flatten().collect())
}

/// Most keys per `latest_attempts` call of a repair: every backend accepts 1,000.
const REPAIR_KEYS_PER_QUERY: usize = 1_000;

/// Repeats of events already in the log: enqueues the jobs of matching destinations (that
/// existed when each was published) which have no attempt logged, all in one enqueue; returns
/// the jobs enqueued per event. See the module docs.
async fn repair(
    core: &Arc<Core>,
    events: &[Event],
    destinations: &[Destination],
) -> Result<Vec<usize>, PublishError> {
    let mut candidates: Vec<(usize, &Destination, AttemptKey)> = Vec::new();
    for (i, event) in events.iter().enumerate() {
        for d in destinations
            .iter()
            .filter(|d| matches(d, event) && d.created_at <= event.time)
        {
            let key = AttemptKey {
                tenant_id: event.tenant_id.clone(),
                event_id: event.id.clone(),
                destination_id: d.id,
                attempt_time: Timestamp::UNIX_EPOCH,
            };
            candidates.push((i, d, key));
        }
    }
    let mut counts = vec![0; events.len()];
    if candidates.is_empty() {
        return Ok(counts);
    }
    let mut attempted = std::collections::HashMap::new();
    for chunk in candidates.chunks(REPAIR_KEYS_PER_QUERY) {
        let keys: Vec<AttemptKey> = chunk.iter().map(|(_, _, k)| k.clone()).collect();
        attempted.extend(core.stores.log.latest_attempts(&keys).await?);
    }
    let now = Timestamp::now();
    let mut jobs = Vec::new();
    for (i, d, key) in &candidates {
        if !attempted.contains_key(key) {
            jobs.push(job_for(&events[*i], d, now));
            counts[*i] += 1;
        }
    }
    if !jobs.is_empty() {
        for (i, event) in events.iter().enumerate() {
            if counts[i] > 0 {
                core.fresh.insert(event.key(), event.clone());
            }
        }
        core.stores.queue.enqueue(&jobs).await?;
        core.wake.notify_one();
    }
    Ok(counts)
}
