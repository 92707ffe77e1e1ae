//! The destination types this build delivers to: the one file of the engine that names them,
//! each behind its cargo feature. The rest of the engine only ever asks the [`Registry`] for
//! the type a destination's `type` names, so adding a type is a crate that implements
//! `sheaf_destination::DestinationType` and passes its suite, a feature, and one line here.

use sheaf_destination::Registry;

use crate::config::{EngineConfig, OperatorWebhook};

/// Every type this build has, built from the settings they share: the delivery timeout
/// (`SHEAF_DELIVERY_TIMEOUT`) and the private-address guard (`SHEAF_ALLOW_PRIVATE_DESTINATIONS`),
/// and for webhooks the egress proxy; the extra CA file (`SHEAF_TLS_CA_FILE`) is trusted by
/// webhooks and by the brokers' `amqps://` and `tls://` alike.
pub fn installed(config: &EngineConfig) -> anyhow::Result<Registry> {
    #[allow(unused_mut)] // without any destination feature nothing is added
    let mut registry = Registry::new();
    #[cfg(feature = "webhook")]
    {
        use sheaf_webhook::{SetupError, Webhook, WebhookSettings};
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
        registry = registry.with(std::sync::Arc::new(webhook));
    }
    // Brokers behind a private CA, as for Postgres, ClickHouse and webhooks.
    #[cfg(any(feature = "rabbitmq", feature = "nats"))]
    let named = |e: sheaf_tls::CaFileError| anyhow::anyhow!("SHEAF_TLS_CA_FILE: {e}");
    #[cfg(feature = "rabbitmq")]
    {
        use sheaf_rabbitmq::{RabbitMq, RabbitMqSettings};
        let mut rabbitmq = RabbitMq::new(RabbitMqSettings {
            timeout: config.delivery_timeout,
            allow_private: config.allow_private_destinations,
        });
        if let Some(path) = &config.tls_ca_file {
            rabbitmq = rabbitmq.with_ca_file(path).map_err(named)?;
        }
        registry = registry.with(std::sync::Arc::new(rabbitmq));
    }
    #[cfg(feature = "nats")]
    {
        use sheaf_nats::{Nats, NatsSettings};
        let mut nats = Nats::new(NatsSettings {
            timeout: config.delivery_timeout,
            allow_private: config.allow_private_destinations,
        });
        if let Some(path) = &config.tls_ca_file {
            nats = nats.with_ca_file(path).map_err(named)?;
        }
        registry = registry.with(std::sync::Arc::new(nats));
    }
    let _ = config;
    Ok(registry)
}

/// Operator events go out as signed webhooks: the URL must pass the same guard as any
/// webhook destination's, and a build without webhooks cannot send them at all.
pub async fn check_operator_url(
    webhook: &OperatorWebhook,
    allow_private: bool,
) -> anyhow::Result<()> {
    #[cfg(feature = "webhook")]
    {
        sheaf_webhook::check_url(webhook.url.as_str(), allow_private)
            .await
            .map_err(|e| anyhow::anyhow!("invalid SHEAF_OPERATOR_WEBHOOK_URL: {}", e.0))?;
        Ok(())
    }
    #[cfg(not(feature = "webhook"))]
    {
        let _ = (webhook, allow_private);
        anyhow::bail!(
            "SHEAF_OPERATOR_WEBHOOK_URL is set, but this build of sheaf-engine has no webhooks (cargo feature `webhook`)"
        )
    }
}
