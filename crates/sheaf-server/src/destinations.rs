//! The destination types this binary delivers to: the one file of the service that names
//! them. The engine (`state`, `ingest`, `delivery`, `http`) only ever asks the
//! [`Registry`] for the type a destination's `type` names, so adding a type is a crate that
//! implements `sheaf_destination::DestinationType` and passes its suite, plus one line here.

use std::sync::Arc;

use sheaf_destination::Registry;
use sheaf_webhook::{SetupError, Webhook, WebhookSettings};

use crate::settings::Config;

/// Every type, built from the settings they share: the delivery timeout, the private-address
/// guard, and for webhooks the egress proxy and the extra CA file.
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
    Ok(Registry::new().with(Arc::new(webhook)))
}
