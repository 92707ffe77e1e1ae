//! One delivery: lease a channel, publish the event as a persistent message, wait for the
//! broker's confirm.

use std::time::{Duration, Instant};

use lapin::options::BasicPublishOptions;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Confirmation};
use sheaf_destination::{Message, Report};

use crate::config::Target;
use crate::connect::Connector;
use crate::error::{Failure, Phase};
use crate::pool::{Link, PhaseCell, Pool, Session};

/// AMQP's `delivery-mode` for a message the broker writes to disk (in a durable queue).
const PERSISTENT: u8 = 2;

/// The header names Sheaf sets on every message (a destination's custom headers may not).
pub(crate) const SHEAF_HEADERS: [&str; 4] = [
    "sheaf-topic",
    "sheaf-tenant-id",
    "sheaf-destination-id",
    "sheaf-attempt",
];

/// Delivers `message` to the destination `config` describes, within `timeout`.
pub(crate) async fn deliver(
    pool: &Pool,
    connector: &Connector,
    timeout: Duration,
    config: &serde_json::Value,
    message: &Message<'_>,
) -> Report {
    let started = Instant::now();
    let link = match pool.link(message.destination_id, config) {
        Ok(link) => link,
        Err(failure) => return failure.report(None, started.elapsed()),
    };
    let phase = PhaseCell::default();
    // The session the attempt used, visible here if the timeout drops the attempt.
    let used = parking_lot::Mutex::new(None);
    let attempt = Box::pin(attempt(&link, connector, message, &phase, &used));
    let failure = match tokio::time::timeout(timeout, attempt).await {
        Ok(Ok(())) => return Report::delivered(started.elapsed()),
        Ok(Err(failure)) => failure,
        Err(_) => Failure::Timeout {
            timeout,
            phase: phase.get(),
        },
    };
    if failure.breaks_connection()
        && let Some(session) = used.lock().take()
    {
        session.poison();
    }
    tracing::debug!(destination = %message.destination_id, error = %failure, "RabbitMQ delivery failed");
    failure.report(Some(&link.target), started.elapsed())
}

async fn attempt(
    link: &Link,
    connector: &Connector,
    message: &Message<'_>,
    phase: &PhaseCell,
    used: &parking_lot::Mutex<Option<std::sync::Arc<Session>>>,
) -> Result<(), Failure> {
    let properties = properties(message)?;
    let routing_key = link.target.routing_key.as_deref().unwrap_or(message.topic);
    let lease = link.lease(connector, phase).await?;
    *used.lock() = Some(lease.session.clone());
    phase.set(Phase::Publishing);
    match publish(
        &lease.channel,
        &link.target,
        routing_key,
        message.payload,
        properties,
    )
    .await
    {
        Ok(()) => {
            lease.give_back();
            Ok(())
        }
        // The channel is still good after these: the broker answered for this message alone.
        Err(failure @ (Failure::Nacked | Failure::Returned { .. })) => {
            lease.give_back();
            Err(failure)
        }
        Err(failure) => Err(failure),
    }
}

async fn publish(
    channel: &Channel,
    target: &Target,
    routing_key: &str,
    payload: &[u8],
    properties: BasicProperties,
) -> Result<(), Failure> {
    let failed = |error| Failure::Amqp {
        error,
        phase: Phase::Publishing,
    };
    let exchange = short("the exchange", &target.exchange)?;
    let key = short("the routing key", routing_key)?;
    // `mandatory`: a message no queue receives comes back (312 NO_ROUTE) instead of vanishing.
    let options = BasicPublishOptions {
        mandatory: true,
        ..BasicPublishOptions::default()
    };
    let confirm = channel
        .basic_publish(exchange, key, options, payload, properties)
        .await
        .map_err(failed)?;
    match confirm.await.map_err(failed)? {
        Confirmation::Ack(None) => Ok(()),
        Confirmation::Ack(Some(returned)) | Confirmation::Nack(Some(returned)) => {
            Err(Failure::Returned {
                exchange: target.exchange.clone(),
                routing_key: routing_key.to_owned(),
                code: returned.reply_code,
                text: returned.reply_text.to_string(),
            })
        }
        Confirmation::Nack(None) => Err(Failure::Nacked),
        // Every pooled channel is in confirm mode; a channel that is not cannot prove delivery.
        Confirmation::NotRequested => Err(Failure::Amqp {
            error: lapin::ErrorKind::InvalidChannelState(
                lapin::ChannelState::Connected,
                "publisher confirms are not enabled",
            )
            .into(),
            phase: Phase::Publishing,
        }),
    }
}

/// The AMQP properties of `message`: its id, JSON, persistent, the attempt's time in Unix
/// seconds, and Sheaf's headers after the destination's own and the trace context (so a
/// custom header can never pose as one of Sheaf's).
fn properties(message: &Message<'_>) -> Result<BasicProperties, Failure> {
    let mut headers = FieldTable::default();
    let mut put = |name: &str, value: &str| -> Result<(), Failure> {
        headers.insert(
            short("a header name", name)?,
            AMQPValue::LongString(LongString::from(value.as_bytes())),
        );
        Ok(())
    };
    for (name, value) in message.headers {
        put(name, value)?;
    }
    for (name, value) in message.trace {
        put(name, value)?;
    }
    let [topic, tenant, destination, attempt] = SHEAF_HEADERS;
    put(topic, message.topic)?;
    put(tenant, message.tenant_id.as_str())?;
    put(destination, &message.destination_id.to_string())?;
    put(attempt, &message.attempt.to_string())?;
    let seconds = message.timestamp.as_micros().div_euclid(1_000_000);
    Ok(BasicProperties::default()
        .with_message_id(short("the event id", message.event_id.as_str())?)
        .with_content_type("application/json".into())
        .with_delivery_mode(PERSISTENT)
        .with_timestamp(u64::try_from(seconds).unwrap_or(0))
        .with_app_id("sheaf".into())
        .with_headers(headers))
}

/// `value` as an AMQP short string, or why it cannot be one (it is over 255 bytes).
fn short(what: &str, value: &str) -> Result<ShortString, Failure> {
    ShortString::try_new(value).map_err(|_| {
        Failure::Unencodable(format!(
            "{what} is {} bytes long, and AMQP carries at most 255 in that field",
            value.len()
        ))
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use sheaf_store::{DestinationId, EventId, TenantId, Timestamp};

    use super::*;

    #[test]
    fn properties_carry_the_event_and_sheaf_headers_win() {
        let tenant = TenantId::new("acme").unwrap();
        let id = EventId::new("evt_1").unwrap();
        let headers = BTreeMap::from([
            ("x-team".to_owned(), "billing".to_owned()),
            ("sheaf-topic".to_owned(), "forged".to_owned()),
        ]);
        let trace = [("traceparent".to_owned(), "00-abc-def-01".to_owned())];
        let message = Message {
            tenant_id: &tenant,
            destination_id: DestinationId::generate(),
            event_id: &id,
            topic: "order.created",
            timestamp: Timestamp::from_micros(1_700_000_000_999_999).unwrap(),
            payload: b"{}",
            headers: &headers,
            trace: &trace,
            secrets: &[],
            attempt: 3,
        };
        let properties = properties(&message).unwrap();
        assert_eq!(properties.message_id().as_ref().unwrap().as_str(), "evt_1");
        assert_eq!(properties.delivery_mode(), &Some(PERSISTENT));
        assert_eq!(properties.timestamp(), &Some(1_700_000_000));
        let table = properties.headers().as_ref().unwrap().inner();
        let text = |name: &str| match table.get(name) {
            Some(AMQPValue::LongString(s)) => s.to_string(),
            other => panic!("{name}: {other:?}"),
        };
        assert_eq!(text("sheaf-topic"), "order.created");
        assert_eq!(text("sheaf-tenant-id"), "acme");
        assert_eq!(text("sheaf-attempt"), "3");
        assert_eq!(text("x-team"), "billing");
        assert_eq!(text("traceparent"), "00-abc-def-01");
    }

    #[test]
    fn names_over_255_bytes_are_refused_not_truncated() {
        let err = short("a header name", &"h".repeat(256)).unwrap_err();
        assert!(matches!(err, Failure::Unencodable(_)), "{err}");
    }
}
