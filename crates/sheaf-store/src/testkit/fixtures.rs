//! Builders for the records the suites write, and unique tenant ids that keep cases apart.

use std::collections::BTreeMap;
use std::time::Duration;

use rand::Rng;
use serde_json::json;

use crate::{
    Attempt, AttemptStatus, AttemptTrigger, Destination, DestinationId, DestinationKind, Event,
    EventId, Job, JobId, Payload, Secret, TenantId, Timestamp, Topics, TraceContext,
};

/// A tenant id no other run has used: `<label>-<12 random hex digits>`, the label cut so the id
/// stays within [`crate::ids::MAX_TENANT_ID_LEN`].
pub fn unique_tenant(label: &str) -> TenantId {
    let suffix: u64 = rand::rng().random::<u64>() & 0xffff_ffff_ffff;
    let label: String = label
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        .take(40)
        .collect();
    TenantId::new(format!("{label}-{suffix:012x}")).expect("generated tenant ids are valid")
}

/// An event id from a literal that is known to be valid.
pub fn event_id(id: &str) -> EventId {
    EventId::new(id).expect("test event ids are valid")
}

/// `base` moved by `micros` microseconds (either way).
pub fn shift(base: Timestamp, micros: i64) -> Timestamp {
    Timestamp::from_micros(base.as_micros() + micros).expect("test times are in range")
}

/// `Timestamp::now()` minus `ago`.
pub fn ago(ago: Duration) -> Timestamp {
    Timestamp::now()
        .checked_sub(ago)
        .expect("test times are in range")
}

/// A recognisable payload: it names its tenant and event, so a record returned for the wrong
/// tenant or event never compares equal to the expected one.
pub fn payload(tenant: &TenantId, id: &EventId) -> Payload {
    Payload::new(json!({
        "tenant": tenant.as_str(),
        "event": id.as_str(),
        "amount": 12.5,
        "items": [1, 2, {"sku": "ü-42"}],
    }))
}

/// An event with a [`payload`] naming it.
pub fn event(tenant: &TenantId, id: &str, topic: &str, time: Timestamp) -> Event {
    let id = event_id(id);
    Event::new(
        tenant.clone(),
        id.clone(),
        topic,
        time,
        payload(tenant, &id),
    )
}

/// A valid trace context, distinct for each `n`; odd `n` have a `tracestate` too.
pub fn trace_context(n: usize) -> TraceContext {
    let traceparent = format!("00-5eaf{n:028x}-feed{n:012x}-01");
    let tracestate = (n % 2 == 1).then(|| format!("sheaf=t{n},other=x"));
    TraceContext::new(&traceparent, tracestate.as_deref()).expect("test contexts are valid")
}

/// [`event`], published traced: it carries [`trace_context`]`(n)`.
pub fn traced_event(tenant: &TenantId, id: &str, topic: &str, time: Timestamp, n: usize) -> Event {
    Event {
        trace: Some(trace_context(n)),
        ..event(tenant, id, topic, time)
    }
}

/// A failed scheduled attempt of `event` to `destination`, carrying the event's topic, data and
/// trace context.
pub fn attempt(event: &Event, destination: DestinationId, time: Timestamp) -> Attempt {
    Attempt {
        tenant_id: event.tenant_id.clone(),
        id: crate::AttemptId::generate(),
        event_id: event.id.clone(),
        destination_id: destination,
        number: 1,
        time,
        status: AttemptStatus::Failed,
        trigger: AttemptTrigger::Scheduled,
        response_code: Some(503),
        duration_ms: 20,
        response_body: Some("unavailable".to_owned()),
        error: None,
        event_topic: event.topic.clone(),
        event_data: event.data.clone(),
        event_trace: event.trace.clone(),
    }
}

/// A first-delivery job for a fresh event id, due at `due_at`.
pub fn job(tenant: &TenantId, due_at: Timestamp) -> Job {
    Job {
        id: JobId::generate(),
        tenant_id: tenant.clone(),
        event_id: EventId::generate(),
        destination_id: DestinationId::generate(),
        attempt_number: 1,
        last_attempt_time: None,
        due_at,
        order_key: None,
    }
}

/// An enabled webhook destination of `tenant` for all topics, with one custom header.
pub fn destination(tenant: &TenantId) -> Destination {
    let now = Timestamp::now();
    Destination {
        id: DestinationId::generate(),
        tenant_id: tenant.clone(),
        kind: DestinationKind::new("webhook").expect("a type name"),
        config: serde_json::json!({ "url": "https://example.com/hooks/sheaf" }),
        topics: Topics::All,
        filter: None,
        rate_limit: None,
        headers: BTreeMap::from([("x-team".to_owned(), "payments".to_owned())]),
        transform: None,
        ordering_key: None,
        dead_letter_blocks_key: false,
        enabled: true,
        disabled_reason: None,
        consecutive_failures: 0,
        secret: secret(),
        previous_secret: None,
        created_at: now,
        updated_at: now,
    }
}

/// A fresh random secret in the Standard Webhooks shape.
pub fn secret() -> Secret {
    let bytes: [u8; 24] = rand::rng().random();
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    Secret::new(format!("whsec_{hex}")).expect("generated secrets are not empty")
}
