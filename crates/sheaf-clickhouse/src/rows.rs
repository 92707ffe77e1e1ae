//! The rows as ClickHouse stores them, and their conversion to and from the domain types.
//!
//! Times travel as `DateTime64(6, 'UTC')` microseconds (an `i64`), ids as `UUID` or `String`,
//! status and trigger as `Enum8`, payloads as their JSON text in a `String` column, and a trace
//! context as its two header values, empty when there is none.

use clickhouse::Row;
use serde::{Deserialize, Serialize};
use sheaf_store::{
    Attempt, AttemptId, AttemptStatus, AttemptTrigger, DestinationId, Event, EventId, Payload,
    Result, TenantId, Timestamp, TraceContext,
};
use uuid::Uuid;

use crate::error::bad_row;

/// One row of the `events` table.
#[derive(Debug, Clone, Row, Serialize, Deserialize)]
pub(crate) struct EventRow {
    pub tenant_id: String,
    pub event_id: String,
    pub topic: String,
    /// `DateTime64(6, 'UTC')` as microseconds since the epoch.
    pub event_time: i64,
    /// The event's data as JSON text.
    pub data: String,
    /// The publish's `traceparent`; empty when it was not traced.
    pub traceparent: String,
    /// The publish's `tracestate`; empty when it had none.
    pub tracestate: String,
}

/// One row of the `attempts` table.
#[derive(Debug, Clone, Row, Serialize, Deserialize)]
pub(crate) struct AttemptRow {
    pub tenant_id: String,
    pub event_id: String,
    #[serde(with = "clickhouse::serde::uuid")]
    pub destination_id: Uuid,
    /// `DateTime64(6, 'UTC')` as microseconds since the epoch.
    pub attempt_time: i64,
    #[serde(with = "clickhouse::serde::uuid")]
    pub attempt_id: Uuid,
    pub number: u32,
    /// `Enum8('failed' = 0, 'success' = 1, 'filtered' = 2)`.
    pub status: i8,
    /// `Enum8('scheduled' = 0, 'manual' = 1)`.
    pub trigger: i8,
    pub response_code: Option<u16>,
    pub duration_ms: u32,
    pub response_body: Option<String>,
    pub error: Option<String>,
    pub event_topic: String,
    /// The event's data as JSON text.
    pub event_data: String,
    /// The event's `traceparent`; empty when it was not traced.
    pub event_traceparent: String,
    /// The event's `tracestate`; empty when it had none.
    pub event_tracestate: String,
}

/// The fixed-size part of a row as the write coalescer counts it: numbers, ids, times and the
/// length prefixes of the strings. An estimate is all `max_bytes` needs.
const FIXED_ROW_BYTES: usize = 64;

fn payload_text(payload: &Payload) -> String {
    // A `serde_json::Value` always serializes; the fallback is never taken.
    serde_json::to_string(payload.value()).unwrap_or_else(|_| "null".to_owned())
}

fn payload_from(what: &str, text: &str) -> Result<Payload> {
    serde_json::from_str::<serde_json::Value>(text)
        .map(Payload::new)
        .map_err(|e| bad_row(what, format!("payload is not JSON: {e}")))
}

/// A trace context as its two columns, empty when there is none.
fn trace_columns(trace: Option<&TraceContext>) -> (String, String) {
    match trace {
        Some(trace) => (
            trace.traceparent().to_owned(),
            trace.tracestate().unwrap_or_default().to_owned(),
        ),
        None => (String::new(), String::new()),
    }
}

/// The two columns read back: no context when the `traceparent` is empty.
fn trace_from(what: &str, traceparent: &str, tracestate: &str) -> Result<Option<TraceContext>> {
    if traceparent.is_empty() {
        return Ok(None);
    }
    TraceContext::new(traceparent, Some(tracestate))
        .map(Some)
        .map_err(|e| bad_row(what, e))
}

fn time_from(what: &str, micros: i64) -> Result<Timestamp> {
    Timestamp::from_micros(micros).map_err(|e| bad_row(what, e))
}

impl EventRow {
    pub fn from_event(event: &Event) -> Self {
        let (traceparent, tracestate) = trace_columns(event.trace.as_ref());
        EventRow {
            tenant_id: event.tenant_id.as_str().to_owned(),
            event_id: event.id.as_str().to_owned(),
            topic: event.topic.clone(),
            event_time: event.time.as_micros(),
            data: payload_text(&event.data),
            traceparent,
            tracestate,
        }
    }

    /// The row's size as the write coalescer counts it.
    pub fn encoded_len(&self) -> usize {
        FIXED_ROW_BYTES
            + self.tenant_id.len()
            + self.event_id.len()
            + self.topic.len()
            + self.data.len()
            + self.traceparent.len()
            + self.tracestate.len()
    }

    pub fn into_event(self) -> Result<Event> {
        const WHAT: &str = "read an event";
        Ok(Event {
            tenant_id: TenantId::new(self.tenant_id).map_err(|e| bad_row(WHAT, e))?,
            id: EventId::new(self.event_id).map_err(|e| bad_row(WHAT, e))?,
            topic: self.topic,
            time: time_from(WHAT, self.event_time)?,
            data: payload_from(WHAT, &self.data)?,
            trace: trace_from(WHAT, &self.traceparent, &self.tracestate)?,
        })
    }
}

fn status_code(status: AttemptStatus) -> i8 {
    match status {
        AttemptStatus::Failed => 0,
        AttemptStatus::Success => 1,
        AttemptStatus::Filtered => 2,
    }
}

fn trigger_code(trigger: AttemptTrigger) -> i8 {
    match trigger {
        AttemptTrigger::Scheduled => 0,
        AttemptTrigger::Manual => 1,
    }
}

impl AttemptRow {
    pub fn from_attempt(attempt: &Attempt) -> Self {
        let (event_traceparent, event_tracestate) = trace_columns(attempt.event_trace.as_ref());
        AttemptRow {
            tenant_id: attempt.tenant_id.as_str().to_owned(),
            event_id: attempt.event_id.as_str().to_owned(),
            destination_id: attempt.destination_id.as_uuid(),
            attempt_time: attempt.time.as_micros(),
            attempt_id: attempt.id.as_uuid(),
            number: attempt.number,
            status: status_code(attempt.status),
            trigger: trigger_code(attempt.trigger),
            response_code: attempt.response_code,
            duration_ms: attempt.duration_ms,
            response_body: attempt.response_body.clone(),
            error: attempt.error.clone(),
            event_topic: attempt.event_topic.clone(),
            event_data: payload_text(&attempt.event_data),
            event_traceparent,
            event_tracestate,
        }
    }

    /// The row's size as the write coalescer counts it.
    pub fn encoded_len(&self) -> usize {
        FIXED_ROW_BYTES
            + self.tenant_id.len()
            + self.event_id.len()
            + self.response_body.as_ref().map_or(0, String::len)
            + self.error.as_ref().map_or(0, String::len)
            + self.event_topic.len()
            + self.event_data.len()
            + self.event_traceparent.len()
            + self.event_tracestate.len()
    }

    pub fn into_attempt(self) -> Result<Attempt> {
        const WHAT: &str = "read an attempt";
        let status = match self.status {
            0 => AttemptStatus::Failed,
            1 => AttemptStatus::Success,
            2 => AttemptStatus::Filtered,
            other => return Err(bad_row(WHAT, format!("status {other}"))),
        };
        let trigger = match self.trigger {
            0 => AttemptTrigger::Scheduled,
            1 => AttemptTrigger::Manual,
            other => return Err(bad_row(WHAT, format!("trigger {other}"))),
        };
        Ok(Attempt {
            tenant_id: TenantId::new(self.tenant_id).map_err(|e| bad_row(WHAT, e))?,
            id: AttemptId::from_uuid(self.attempt_id),
            event_id: EventId::new(self.event_id).map_err(|e| bad_row(WHAT, e))?,
            destination_id: DestinationId::from_uuid(self.destination_id),
            number: self.number,
            time: time_from(WHAT, self.attempt_time)?,
            status,
            trigger,
            response_code: self.response_code,
            duration_ms: self.duration_ms,
            response_body: self.response_body,
            error: self.error,
            event_topic: self.event_topic,
            event_data: payload_from(WHAT, &self.event_data)?,
            event_trace: trace_from(WHAT, &self.event_traceparent, &self.event_tracestate)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_attempt_survives_the_row() {
        let tenant = TenantId::new("t").unwrap();
        let attempt = Attempt {
            tenant_id: tenant,
            id: AttemptId::generate(),
            event_id: EventId::new("e:1").unwrap(),
            destination_id: DestinationId::generate(),
            number: 3,
            time: Timestamp::from_micros(1_700_000_000_123_456).unwrap(),
            status: AttemptStatus::Success,
            trigger: AttemptTrigger::Manual,
            response_code: Some(204),
            duration_ms: 17,
            response_body: None,
            error: Some("late".to_owned()),
            event_topic: "a.b".to_owned(),
            event_data: Payload::new(json!({"big": u64::MAX, "f": 1.5, "s": "ü"})),
            event_trace: Some(
                TraceContext::new(
                    "00-5eaf0000000000000000000000000001-feed000000000001-01",
                    Some("a=1"),
                )
                .unwrap(),
            ),
        };
        let row = AttemptRow::from_attempt(&attempt);
        assert!(row.encoded_len() > row.event_data.len());
        assert_eq!(row.into_attempt().unwrap(), attempt);
    }

    #[test]
    fn a_row_that_does_not_decode_is_a_backend_error() {
        let row = EventRow {
            tenant_id: "t".to_owned(),
            event_id: "e".to_owned(),
            topic: "x".to_owned(),
            event_time: 0,
            data: "{not json".to_owned(),
            traceparent: String::new(),
            tracestate: String::new(),
        };
        assert_eq!(
            row.into_event().unwrap_err().kind(),
            sheaf_store::ErrorKind::Backend
        );
    }
}
