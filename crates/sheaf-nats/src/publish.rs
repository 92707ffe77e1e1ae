//! One delivery as a JetStream publish: the headers it carries, and what the stream's answer
//! (or its silence) means for the engine.

use std::str::FromStr as _;
use std::time::Duration;

use async_nats::jetstream::context::{GetStreamByNameErrorKind, PublishError, PublishErrorKind};
use async_nats::jetstream::publish::PublishAck;
use async_nats::{HeaderMap, HeaderName, HeaderValue};
use bytes::Bytes;
use sheaf_destination::{Message, Report};

use crate::config::Target;

/// The header JetStream deduplicates on: a second message with the same id within the
/// stream's duplicate window is acknowledged as a duplicate and not stored again.
pub const MSG_ID: &str = "Nats-Msg-Id";
pub const TOPIC: &str = "Sheaf-Topic";
pub const TENANT_ID: &str = "Sheaf-Tenant-Id";
pub const DESTINATION_ID: &str = "Sheaf-Destination-Id";
pub const ATTEMPT: &str = "Sheaf-Attempt";
pub const CONTENT_TYPE: &str = "Content-Type";

/// Custom header names a destination may not set, in lower case: the ones a delivery sets
/// itself, and the `Nats-` headers with which a publisher steers JetStream (deduplication,
/// expectations, rollups, per-message TTLs, batches), which would let a custom header purge or
/// reshape the stream.
pub const RESERVED_HEADERS: [&str; 15] = [
    "nats-msg-id",
    "sheaf-topic",
    "sheaf-tenant-id",
    "sheaf-destination-id",
    "sheaf-attempt",
    "content-type",
    "nats-expected-stream",
    "nats-expected-last-msg-id",
    "nats-expected-last-sequence",
    "nats-expected-last-subject-sequence",
    "nats-rollup",
    "nats-ttl",
    "nats-batch-id",
    "nats-batch-sequence",
    "nats-batch-commit",
];

/// A delivery that did not end in an acknowledgement, before it is timed into a [`Report`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Failure {
    permanent: bool,
    error: String,
    code: Option<u16>,
}

impl Failure {
    pub(crate) fn retry(error: impl Into<String>) -> Self {
        Failure {
            permanent: false,
            error: error.into(),
            code: None,
        }
    }

    pub(crate) fn permanent(error: impl Into<String>) -> Self {
        Failure {
            permanent: true,
            error: error.into(),
            code: None,
        }
    }

    fn with_code(mut self, code: u16) -> Self {
        self.code = Some(code);
        self
    }

    pub(crate) fn report(self, elapsed: Duration) -> Report {
        let report = if self.permanent {
            Report::permanent(self.error, elapsed)
        } else {
            Report::retry(self.error, elapsed)
        };
        match self.code {
            Some(code) => report.with_code(code),
            None => report,
        }
    }
}

/// The headers of `message`: the destination's custom headers and the trace context first,
/// then Sheaf's own, which therefore win over a custom header of the same name (validation
/// refuses those names anyway, through [`RESERVED_HEADERS`]).
///
/// A name or value NATS cannot carry (a line break in a value, a `:` in a name) is a
/// [`Failure::permanent`]: the same destination would fail the same way on every retry.
pub(crate) fn headers(message: &Message<'_>) -> Result<HeaderMap, Failure> {
    let mut headers = HeaderMap::new();
    let custom = message
        .headers
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_str()));
    let trace = message.trace.iter().map(|(n, v)| (n.as_str(), v.as_str()));
    for (name, value) in custom.chain(trace) {
        insert(&mut headers, name, value)?;
    }
    let destination = message.destination_id.to_string();
    let attempt = message.attempt.to_string();
    for (name, value) in [
        (MSG_ID, message.event_id.as_str()),
        (TOPIC, message.topic),
        (TENANT_ID, message.tenant_id.as_str()),
        (DESTINATION_ID, destination.as_str()),
        (ATTEMPT, attempt.as_str()),
        (CONTENT_TYPE, "application/json"),
    ] {
        insert(&mut headers, name, value)?;
    }
    Ok(headers)
}

fn insert(headers: &mut HeaderMap, name: &str, value: &str) -> Result<(), Failure> {
    // The fallible parsers: `HeaderMap::insert` with a `&str` panics on a bad name or value.
    let header = HeaderName::from_str(name).map_err(|_| {
        Failure::permanent(format!(
            "the header name {name:?} cannot be carried by NATS (no ':', spaces or control characters)"
        ))
    })?;
    let value = HeaderValue::from_str(value).map_err(|_| {
        Failure::permanent(format!(
            "the value of header {name:?} cannot be carried by NATS (it contains a line break)"
        ))
    })?;
    headers.insert(header, value);
    Ok(())
}

/// Publishes `payload` to the target's subject and waits for the stream's acknowledgement.
/// The caller bounds the whole by the delivery timeout; the context's own ack timeout is the
/// same, so whichever fires, nothing waits longer.
pub(crate) async fn publish(
    jetstream: &async_nats::jetstream::Context,
    target: &Target,
    headers: HeaderMap,
    payload: Bytes,
) -> Result<PublishAck, Failure> {
    let answer = match jetstream
        .publish_with_headers(target.subject.clone(), headers, payload)
        .await
    {
        Ok(pending) => pending.await,
        Err(e) => Err(e),
    };
    match answer {
        Ok(ack) => Ok(ack),
        Err(e) => Err(confirmed(jetstream, target, &e).await),
    }
}

/// [`failure`], with a "no responders" answer confirmed before it is called permanent: right
/// after a server starts again, or while a stream's leader is being chosen, a subject that a
/// stream does capture gets the same answer for a moment, and dead-lettering then would drop an
/// event over a restart (the fault suite's `broker` scenario saw it: 1 of 500). So JetStream is
/// asked which stream captures the subject: none, and the failure is permanent; one, or no
/// answer to the question, and it is retried.
async fn confirmed(
    jetstream: &async_nats::jetstream::Context,
    target: &Target,
    error: &PublishError,
) -> Failure {
    let failure = failure(target, error);
    if !matches!(error.kind(), PublishErrorKind::StreamNotFound) {
        return failure;
    }
    let shown = &target.shown;
    let subject = &target.subject;
    match jetstream.stream_by_subject(subject.clone()).await {
        Err(e) if matches!(e.kind(), GetStreamByNameErrorKind::NotFound) => failure,
        Ok(stream) => Failure::retry(format!(
            "{shown}: stream {stream:?} captures {subject:?} but nothing answered the publish \
             (JetStream not ready yet)"
        ))
        .with_code(503),
        Err(e) => Failure::retry(format!(
            "{shown}: nothing answered the publish to {subject:?}, and which stream captures it \
             could not be asked: {e}"
        )),
    }
}

/// What a publish error means. Only "no stream captures the subject" and a message the server
/// can never accept are permanent: every other refusal (a full stream that discards new
/// messages, a stream without quorum, a lost connection) can pass once the server recovers.
fn failure(target: &Target, error: &PublishError) -> Failure {
    let shown = &target.shown;
    match error.kind() {
        PublishErrorKind::StreamNotFound => Failure::permanent(format!(
            "no JetStream stream captures the subject {:?} on {shown} (the server answered \"no responders\"); \
             add the subject to a stream, then replay the dead-lettered events",
            target.subject
        ))
        .with_code(503),
        PublishErrorKind::TimedOut => Failure::retry(format!(
            "{shown}: the stream did not acknowledge the message in time"
        )),
        PublishErrorKind::BrokenPipe => Failure::retry(format!(
            "the connection to {shown} was lost before the stream acknowledged the message"
        )),
        PublishErrorKind::MaxPayloadExceeded => Failure::permanent(format!(
            "{shown} accepts no message this large: {error}"
        )),
        _ => match jetstream_error(error) {
            Some(refusal) => {
                let code = u16::try_from(refusal.code()).ok();
                let failure =
                    Failure::retry(format!("the stream on {shown} refused the message: {refusal}"));
                match code {
                    Some(code) => failure.with_code(code),
                    None => failure,
                }
            }
            None => Failure::retry(format!("publishing to {shown} failed: {error}")),
        },
    }
}

/// The server's own error (`{"code": 503, "err_code": 10077, "description": …}`) behind a
/// publish error, if it answered with one.
fn jetstream_error(error: &PublishError) -> Option<&async_nats::jetstream::Error> {
    std::error::Error::source(error)?.downcast_ref::<async_nats::jetstream::Error>()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use sheaf_store::{DestinationId, EventId, TenantId, Timestamp};

    use super::*;

    fn with_message<T>(custom: &[(&str, &str)], f: impl FnOnce(&Message<'_>) -> T) -> T {
        let tenant = TenantId::new("acme").unwrap();
        let event = EventId::new("evt_1").unwrap();
        let headers: BTreeMap<String, String> = custom
            .iter()
            .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
            .collect();
        let trace = vec![("traceparent".to_owned(), "00-abc-def-01".to_owned())];
        let message = Message {
            tenant_id: &tenant,
            destination_id: DestinationId::generate(),
            event_id: &event,
            topic: "order.created",
            timestamp: Timestamp::now(),
            payload: b"{}",
            headers: &headers,
            trace: &trace,
            secrets: &[],
            attempt: 3,
        };
        f(&message)
    }

    #[test]
    fn a_delivery_carries_its_id_topic_custom_and_trace_headers() {
        let headers = with_message(&[("x-team", "billing")], |m| headers(m).unwrap());
        let get = |name: &str| headers.get(name).map(|v| v.as_str().to_owned());
        assert_eq!(get(MSG_ID).as_deref(), Some("evt_1"));
        assert_eq!(get(TOPIC).as_deref(), Some("order.created"));
        assert_eq!(get(TENANT_ID).as_deref(), Some("acme"));
        assert_eq!(get(ATTEMPT).as_deref(), Some("3"));
        assert_eq!(get(CONTENT_TYPE).as_deref(), Some("application/json"));
        assert_eq!(get("x-team").as_deref(), Some("billing"));
        assert_eq!(get("traceparent").as_deref(), Some("00-abc-def-01"));
        assert!(get(DESTINATION_ID).is_some_and(|id| !id.is_empty()));
    }

    #[test]
    fn headers_nats_cannot_carry_are_permanent_failures_not_panics() {
        let err = with_message(&[("x-bad", "a\r\nb")], |m| headers(m).unwrap_err());
        assert!(err.permanent && err.error.contains("line break"), "{err:?}");
        let err = with_message(&[("x:bad", "v")], |m| headers(m).unwrap_err());
        assert!(
            err.permanent && err.error.contains("header name"),
            "{err:?}"
        );
    }

    #[test]
    fn failures_become_reports_with_their_code() {
        let report = Failure::retry("full").with_code(503).report(Duration::ZERO);
        assert_eq!(
            report.verdict,
            sheaf_destination::Verdict::Retry { after: None }
        );
        assert_eq!(report.code, Some(503));
        let report = Failure::permanent("gone").report(Duration::ZERO);
        assert_eq!(report.verdict, sheaf_destination::Verdict::Permanent);
        assert_eq!(report.error.as_deref(), Some("gone"));
    }
}
