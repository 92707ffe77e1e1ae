//! Sheaf's `rabbitmq` destination type: each delivery is one message published to an AMQP
//! 0-9-1 exchange, confirmed by the broker.
//!
//! # A delivery, in AMQP
//!
//! `config` is `{"url": "amqp://user:pass@host:port/vhost", "exchange": "name",
//! "routing_key": "optional"}` (`amqps://` for TLS). A delivery is a `basic.publish` to
//! `exchange` with routing key `routing_key`, or, when it is absent, the event's topic (so a
//! topic exchange routes by topic pattern: bind a queue with `order.*`). The body is the
//! event's payload as it is; the properties:
//!
//! - `message_id`: the event id, so a consumer can drop a repeat (deliveries are at least once);
//! - `content_type` `application/json`, `delivery_mode` 2 (persistent), `app_id` `sheaf`,
//!   `timestamp`: the attempt's time in Unix seconds;
//! - headers, all long strings: the destination's custom headers, the trace context
//!   (`traceparent`, `tracestate`), then `sheaf-topic`, `sheaf-tenant-id`,
//!   `sheaf-destination-id` and `sheaf-attempt` (set last, so they cannot be forged by a custom
//!   header, and reserved: see [`DestinationType::reserved_headers`]).
//!
//! The publish is `mandatory` and every channel is in confirm mode: a delivery counts as
//! delivered only when the broker acks it, that is when every queue it was routed to has it
//! (on disk, for durable queues).
//!
//! # Verdicts
//!
//! - broker ack → [`Verdict::Delivered`];
//! - `basic.nack` (a queue at its `x-max-length` with `x-overflow: reject-publish`, a broker
//!   that could not store it) → [`Verdict::Retry`];
//! - message returned, `312 NO_ROUTE` (no queue is bound for that routing key) → retry, code 312:
//!   binding a queue later mends it;
//! - channel closed with `404 NOT_FOUND` (the exchange does not exist) → [`Verdict::Permanent`],
//!   code 404: the one failure that waits for someone to change the broker or the destination;
//! - a refused, lost or silent connection, a refused login (403) or vhost (530), the delivery
//!   timeout → retry. The whole delivery (connecting included) is bounded by
//!   [`RabbitMqSettings::timeout`].
//!
//! No error names the URL's password: brokers are named by host and port.
//!
//! # Connections
//!
//! Connections are kept per destination id with the `config` they were opened for (a delivery
//! with another `config` replaces them, [`DestinationType::forget`] drops them), with up to
//! eight confirm-mode channels each so concurrent deliveries do not queue behind one another's
//! confirms. A dead connection (the broker restarted) is dropped when a delivery finds it so,
//! and the next delivery reconnects; the failing delivery itself is retried like any other.
//! Connections go only to addresses the private-address guard checked when connecting, not
//! to whatever the host resolves to later. `amqps://` is verified against the bundled webpki
//! roots plus the operator's CA file ([`RabbitMq::with_ca_file`]), with rustls on ring.

mod config;
mod connect;
mod error;
mod pool;
mod publish;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use sheaf_destination::{ConfigError, DestinationType, Message, Report};
use sheaf_store::DestinationId;

#[cfg(doc)]
use sheaf_destination::Verdict;

/// How the `rabbitmq` type delivers.
#[derive(Debug, Clone)]
pub struct RabbitMqSettings {
    /// The bound on one delivery, connecting, the handshake and the broker's confirm included.
    pub timeout: Duration,
    /// Whether a destination's host may be (or resolve to) a private address
    /// (`SHEAF_ALLOW_PRIVATE_DESTINATIONS`).
    pub allow_private: bool,
}

/// The `rabbitmq` destination type.
#[derive(Debug)]
pub struct RabbitMq {
    settings: RabbitMqSettings,
    pool: pool::Pool,
    connector: connect::Connector,
}

impl RabbitMq {
    /// The type, with `amqps://` trusting the bundled webpki roots.
    pub fn new(settings: RabbitMqSettings) -> RabbitMq {
        RabbitMq::build(settings, None)
    }

    /// The same type with `amqps://` also trusting the CA certificates in `path` (PEM), for a
    /// broker with a private CA. The file is read now, so a bad one stops start-up.
    ///
    /// # Errors
    /// [`sheaf_tls::CaFileError`], naming the file and what is wrong with it.
    pub fn with_ca_file(self, path: &Path) -> Result<RabbitMq, sheaf_tls::CaFileError> {
        let tls = sheaf_tls::client_config(sheaf_tls::SslMode::VerifyFull, Some(path))?;
        Ok(RabbitMq::build(self.settings, Some(Arc::new(tls))))
    }

    fn build(settings: RabbitMqSettings, tls: Option<Arc<rustls::ClientConfig>>) -> RabbitMq {
        RabbitMq {
            connector: connect::Connector::new(settings.allow_private, tls),
            pool: pool::Pool::default(),
            settings,
        }
    }

    /// How many connections this type has opened: for tests that check connections are kept.
    #[doc(hidden)]
    pub fn connections_opened(&self) -> usize {
        self.connector.opened()
    }
}

#[async_trait]
impl DestinationType for RabbitMq {
    fn name(&self) -> &'static str {
        "rabbitmq"
    }

    fn config_schema(&self) -> Value {
        config::schema()
    }

    fn reserved_headers(&self) -> &'static [&'static str] {
        &publish::SHEAF_HEADERS
    }

    async fn validate(&self, config: &Value) -> Result<Value, ConfigError> {
        config::validate(config, self.settings.allow_private).await
    }

    async fn deliver(&self, config: &Value, message: &Message<'_>) -> Report {
        publish::deliver(
            &self.pool,
            &self.connector,
            self.settings.timeout,
            config,
            message,
        )
        .await
    }

    fn forget(&self, destination: DestinationId) {
        self.pool.forget(destination);
    }
}
