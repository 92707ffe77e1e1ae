//! Why a delivery failed, and the [`Report`] each reason becomes.
//!
//! Driver errors are converted here and nowhere else, so the verdicts are decided in one place:
//! only a broker's `404 NOT_FOUND` (the exchange does not exist) is permanent; everything else
//! (a refused or lost connection, a nack, a returned message, a timeout) may pass later and is
//! retried. No message built here contains the URL's password: brokers are named by host and
//! port, users by name.

use std::time::Duration;

use lapin::ErrorKind;
use lapin::protocol::AMQPErrorKind;
use sheaf_destination::{MAX_RESPONSE_EXCERPT, Report};

use crate::config::Target;

/// AMQP's reply code for "no such exchange" (and queue), sent as a channel close.
pub(crate) const NOT_FOUND: u16 = 404;
/// AMQP's reply code for a mandatory message no queue was bound to receive.
pub(crate) const NO_ROUTE: u16 = 312;

/// What a delivery was doing, for a timeout's message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Phase {
    Resolving,
    Connecting,
    Handshake,
    WaitingForChannel,
    OpeningChannel,
    Publishing,
}

impl Phase {
    const ALL: [Phase; 6] = [
        Phase::Resolving,
        Phase::Connecting,
        Phase::Handshake,
        Phase::WaitingForChannel,
        Phase::OpeningChannel,
        Phase::Publishing,
    ];

    pub(crate) fn from_u8(value: u8) -> Phase {
        Phase::ALL
            .get(usize::from(value))
            .copied()
            .unwrap_or(Phase::Publishing)
    }

    fn doing(self) -> &'static str {
        match self {
            Phase::Resolving => "resolving the broker's host",
            Phase::Connecting => "connecting to the broker",
            Phase::Handshake => {
                "in the AMQP handshake (the broker accepted the connection and did not answer)"
            }
            Phase::WaitingForChannel => {
                "waiting for a channel (other deliveries to the destination held them all, or were connecting)"
            }
            Phase::OpeningChannel => "opening a channel",
            Phase::Publishing => "waiting for the broker to confirm the message",
        }
    }
}

/// Why one delivery failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum Failure {
    /// The stored `config` no longer reads (it was validated by an older version, say).
    #[error("the destination's config is not valid: {0}")]
    Config(String),
    /// The private-address guard refused the host's addresses at connect time.
    #[error("{0}")]
    Refused(String),
    /// No TCP connection to any of the host's addresses.
    #[error("cannot connect to the broker at {address}: {error}")]
    Connect { address: String, error: String },
    /// The TLS handshake failed.
    #[error("TLS with the broker at {address} failed: {error}")]
    Tls { address: String, error: String },
    /// An AMQP error from lapin, during `phase`.
    #[error("{}", describe(.error, *.phase))]
    Amqp { error: lapin::Error, phase: Phase },
    /// The broker nacked the message.
    #[error(
        "the broker refused the message (basic.nack): a queue it routes to is full and rejects \
         publishes, or the broker could not store it"
    )]
    Nacked,
    /// The message was returned: nothing is bound to receive it.
    #[error("{}", returned(exchange, routing_key, *.code, text))]
    Returned {
        exchange: String,
        routing_key: String,
        code: u16,
        text: String,
    },
    /// A name or value AMQP cannot carry (a header name over 255 bytes).
    #[error("{0}")]
    Unencodable(String),
    /// The delivery timeout ran out.
    #[error("no answer from the broker within {timeout:?} while {}", .phase.doing())]
    Timeout { timeout: Duration, phase: Phase },
}

fn returned(exchange: &str, routing_key: &str, code: u16, text: &str) -> String {
    if code == NO_ROUTE {
        format!(
            "no queue is bound to exchange {exchange:?} for routing key {routing_key:?}, so the \
             broker returned the message ({code} {text})"
        )
    } else {
        format!("the broker returned the message ({code} {text})")
    }
}

fn describe(error: &lapin::Error, phase: Phase) -> String {
    match error.kind() {
        ErrorKind::ProtocolError(amqp) => format!(
            "the broker closed the {} with {} {}",
            if matches!(amqp.kind(), AMQPErrorKind::Hard(_)) {
                "connection"
            } else {
                "channel"
            },
            amqp.get_id(),
            amqp.get_message()
        ),
        ErrorKind::IOError(io) if phase == Phase::Handshake => format!(
            "the broker closed the connection during the AMQP handshake ({io}); check the \
             URL's user, password and vhost"
        ),
        ErrorKind::IOError(io) => format!("the connection to the broker failed: {io}"),
        ErrorKind::InvalidConnectionState(state) => {
            format!("the connection to the broker is no longer open ({state:?})")
        }
        ErrorKind::InvalidChannelState(state, _) => {
            format!("the channel to the broker is no longer open ({state:?})")
        }
        ErrorKind::MissingHeartbeatError => {
            "the broker stopped sending heartbeats: the connection is lost".to_owned()
        }
        _ => format!("AMQP error while {}: {error}", phase.doing()),
    }
}

impl Failure {
    /// Whether the connection this failure happened on should be replaced: it broke, or it
    /// stopped answering. Channel-level failures (a nack, a 404) leave it usable.
    pub(crate) fn breaks_connection(&self) -> bool {
        match self {
            Failure::Amqp { error, .. } => match error.kind() {
                ErrorKind::ProtocolError(amqp) => matches!(amqp.kind(), AMQPErrorKind::Hard(_)),
                ErrorKind::InvalidChannelState(..) => false,
                _ => true,
            },
            Failure::Timeout { phase, .. } => *phase != Phase::WaitingForChannel,
            _ => false,
        }
    }

    /// The report of this failure after `elapsed`, for a delivery to `target`.
    pub(crate) fn report(&self, target: Option<&Target>, elapsed: Duration) -> Report {
        match self {
            Failure::Config(_) | Failure::Unencodable(_) => {
                Report::permanent(self.to_string(), elapsed)
            }
            Failure::Amqp { error, phase } => amqp_report(error, *phase, target, elapsed),
            Failure::Returned { code, text, .. } => Report {
                response: Some(excerpt(text)),
                ..Report::retry(self.to_string(), elapsed).with_code(*code)
            },
            _ => Report::retry(self.to_string(), elapsed),
        }
    }
}

fn amqp_report(
    error: &lapin::Error,
    phase: Phase,
    target: Option<&Target>,
    elapsed: Duration,
) -> Report {
    let ErrorKind::ProtocolError(amqp) = error.kind() else {
        return Report::retry(describe(error, phase), elapsed);
    };
    let code = amqp.get_id();
    let text = amqp.get_message().to_string();
    let exchange = target.map_or("", |t| t.exchange.as_str());
    let report = match code {
        NOT_FOUND if phase == Phase::Publishing => Report::permanent(
            format!(
                "exchange {exchange:?} does not exist on the broker (404 NOT_FOUND): declare it, \
                 or point the destination at an exchange that exists"
            ),
            elapsed,
        ),
        403 if phase == Phase::Handshake => Report::retry(
            format!(
                "the broker refused the login of user {:?} (403 ACCESS_REFUSED): check the URL's \
                 user and password",
                target.map_or("", Target::user)
            ),
            elapsed,
        ),
        403 => Report::retry(
            format!(
                "the broker refused the user access (403 ACCESS_REFUSED) to exchange {exchange:?} \
                 or the vhost: check the user's permissions"
            ),
            elapsed,
        ),
        530 => Report::retry(
            format!(
                "the broker refused the vhost {:?} (530 NOT_ALLOWED): it does not exist, or the \
                 user may not use it",
                target.map_or("", |t| t.uri.vhost.as_str())
            ),
            elapsed,
        ),
        _ => Report::retry(describe(error, phase), elapsed),
    };
    Report {
        response: Some(excerpt(&text)),
        ..report.with_code(code)
    }
}

/// `text` cut to what an attempt keeps, on a character boundary.
fn excerpt(text: &str) -> String {
    if text.len() <= MAX_RESPONSE_EXCERPT {
        return text.to_owned();
    }
    let mut end = MAX_RESPONSE_EXCERPT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::protocol::{AMQPError, AMQPSoftError};
    use sheaf_destination::Verdict;

    fn channel_closed(code: AMQPSoftError, text: &str) -> lapin::Error {
        ErrorKind::ProtocolError(AMQPError::new(AMQPErrorKind::Soft(code), text.into())).into()
    }

    #[test]
    fn a_missing_exchange_is_permanent_and_named() {
        let error = channel_closed(AMQPSoftError::NOTFOUND, "NOT_FOUND - no exchange 'orders'");
        let target = crate::config::parse(&serde_json::json!({
            "url": "amqp://u:p@h/", "exchange": "orders"
        }))
        .unwrap()
        .0;
        let failure = Failure::Amqp {
            error,
            phase: Phase::Publishing,
        };
        let report = failure.report(Some(&target), Duration::ZERO);
        assert_eq!(report.verdict, Verdict::Permanent);
        assert_eq!(report.code, Some(NOT_FOUND));
        assert!(
            report.error.as_deref().unwrap().contains("\"orders\""),
            "{report:?}"
        );
        assert!(
            !failure.breaks_connection(),
            "a channel error keeps the connection"
        );
    }

    #[test]
    fn returns_nacks_and_timeouts_are_retried() {
        let returned = Failure::Returned {
            exchange: "e".into(),
            routing_key: "order.created".into(),
            code: NO_ROUTE,
            text: "NO_ROUTE".into(),
        };
        let report = returned.report(None, Duration::ZERO);
        assert_eq!(report.verdict, Verdict::Retry { after: None });
        assert_eq!(report.code, Some(NO_ROUTE));
        assert!(report.error.unwrap().contains("no queue is bound"));
        let report = Failure::Nacked.report(None, Duration::ZERO);
        assert_eq!(report.verdict, Verdict::Retry { after: None });
        let timeout = Failure::Timeout {
            timeout: Duration::from_secs(2),
            phase: Phase::Handshake,
        };
        assert!(timeout.to_string().contains("handshake"), "{timeout}");
        assert!(timeout.breaks_connection());
    }

    #[test]
    fn phases_round_trip_through_their_number() {
        for phase in Phase::ALL {
            assert_eq!(Phase::from_u8(phase as u8), phase);
        }
        assert_eq!(excerpt(&"é".repeat(1000)).len(), MAX_RESPONSE_EXCERPT);
    }
}
