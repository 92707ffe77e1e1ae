//! The destination types this binary delivers to: the one file of the service that names
//! them. The engine (`state`, `ingest`, `delivery`, `http`) only ever asks the
//! [`Registry`] for the type a destination's `type` names, so adding a type is a crate that
//! implements `sheaf_destination::DestinationType` and passes its suite, plus one line here.

use std::sync::Arc;

use sheaf_destination::Registry;
use sheaf_nats::{Nats, NatsSettings};
use sheaf_rabbitmq::{RabbitMq, RabbitMqSettings};
use sheaf_webhook::{SetupError, Webhook, WebhookSettings};

use crate::settings::Config;

/// Every type, built from the settings they share: the delivery timeout (`SHEAF_DELIVERY_TIMEOUT`)
/// and the private-address guard (`SHEAF_ALLOW_PRIVATE_DESTINATIONS`), and for webhooks the
/// egress proxy; the extra CA file (`SHEAF_TLS_CA_FILE`) is trusted by webhooks and by the
/// brokers' `amqps://` and `tls://` alike.
pub fn installed(config: &Config) -> anyhow::Result<Registry> {
    let webhook = Webhook::new(&WebhookSettings {
        timeout: config.delivery_timeout,
        allow_private: config.allow_private_destinations,
        proxy: config.egress_proxy.as_ref().map(|url| url.to_string()),
        ca_file: config.tls_ca_file.clone(),
    })
    .map_err(|err| match err {
        SetupError::CaFile(e) => anyhow::anyhow!("SHEAF_TLS_CA_FILE: {e}"),
        SetupError::Proxy(e) => anyhow::anyhow!("SHEAF_EGRESS_PROXY: {e}"),
        SetupError::Client(e) => anyhow::anyhow!("the webhook client: {e}"),
    })?;
    let mut rabbitmq = RabbitMq::new(RabbitMqSettings {
        timeout: config.delivery_timeout,
        allow_private: config.allow_private_destinations,
    });
    let mut nats = Nats::new(NatsSettings {
        timeout: config.delivery_timeout,
        allow_private: config.allow_private_destinations,
    });
    if let Some(path) = &config.tls_ca_file {
        // Brokers behind a private CA, as for Postgres, ClickHouse and webhooks.
        let named = |e: sheaf_tls::CaFileError| anyhow::anyhow!("SHEAF_TLS_CA_FILE: {e}");
        rabbitmq = rabbitmq.with_ca_file(path).map_err(named)?;
        nats = nats.with_ca_file(path).map_err(named)?;
    }
    Ok(Registry::new()
        .with(Arc::new(webhook))
        .with(Arc::new(rabbitmq))
        .with(Arc::new(nats)))
}
