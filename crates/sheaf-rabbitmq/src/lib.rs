//! Sheaf's RabbitMQ destination type: each delivery one confirmed AMQP 0-9-1 publish.
#![doc = include_str!("../README.md")]

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
