//! Sheaf's webhook destination type: Standard Webhooks signatures, the private-address guard, no redirects.
#![doc = include_str!("../README.md")]

mod guard;
mod send;
mod sign;

use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use sheaf_destination::{ConfigError, ConfigReader, DestinationType, Message, Report};

pub use guard::{UrlRefused, check_url};
pub use send::parse_retry_after;
pub use sign::{Signer, sign};

/// Header names a destination's custom headers may not set: the signature's and the body's.
pub const RESERVED_HEADERS: [&str; 5] = [
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
    "content-type",
    "content-length",
];

/// How webhooks are sent.
#[derive(Debug, Clone)]
pub struct WebhookSettings {
    /// A delivery (connect, send, first bytes of the answer) gives up after this.
    pub timeout: Duration,
    /// Deliver to loopback, private and other non-public addresses too.
    pub allow_private: bool,
    /// Send every delivery through this HTTP(S) proxy.
    pub proxy: Option<String>,
    /// Trust the CAs in this PEM file besides the system's and the bundled roots.
    pub ca_file: Option<PathBuf>,
}

/// Why the webhook client could not be built; each names the setting at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SetupError {
    /// The CA file does not load.
    #[error("the CA file: {0}")]
    CaFile(String),
    /// The proxy URL is not one.
    #[error("the proxy: {0}")]
    Proxy(String),
    /// The HTTP client refused its configuration.
    #[error("the HTTP client: {0}")]
    Client(String),
}

/// The webhook destination type.
#[derive(Debug, Clone)]
pub struct Webhook {
    sender: send::Sender,
    allow_private: bool,
}

impl Webhook {
    /// A webhook sender with `settings`.
    pub fn new(settings: &WebhookSettings) -> Result<Self, SetupError> {
        Ok(Webhook {
            sender: send::Sender::new(settings)?,
            allow_private: settings.allow_private,
        })
    }
}

#[async_trait]
impl DestinationType for Webhook {
    fn name(&self) -> &'static str {
        "webhook"
    }

    fn config_schema(&self) -> Value {
        json!({
            "type": "object",
            "description": "A signed HTTP POST (Standard Webhooks).",
            "required": ["url"],
            "additionalProperties": false,
            "properties": {
                // The service takes any http(s) URL with a host (and, with the guard on, a public
                // one); the pattern is a subset that never names an IP address or a label of
                // digits alone (which URL parsing reads as an IPv4 address), so every URL it
                // admits is one the service takes.
                "url": {
                    "type": "string",
                    "pattern": "^https?://[a-z][a-z0-9-]{0,20}(\\.[a-z][a-z0-9-]{0,20}){0,3}(:[1-9][0-9]{0,3})?(/[A-Za-z0-9._~-]{0,20}){0,4}$",
                    "description": "http or https, no credentials; unless SHEAF_ALLOW_PRIVATE_DESTINATIONS=true the host must resolve to public addresses only"
                }
            }
        })
    }

    fn reserved_headers(&self) -> &'static [&'static str] {
        &RESERVED_HEADERS
    }

    async fn validate(&self, config: &Value) -> Result<Value, ConfigError> {
        let reader = ConfigReader::new(config, &["url"])?;
        let raw = reader.required_str("url")?;
        let url = check_url(raw, self.allow_private)
            .await
            .map_err(|e| ConfigError::new("url", e.0).with_code("invalid_destination_url"))?;
        Ok(json!({ "url": url.as_str() }))
    }

    async fn deliver(&self, config: &Value, message: &Message<'_>) -> Report {
        match config.get("url").and_then(Value::as_str) {
            Some(url) => self.sender.deliver(url, message).await,
            None => Report::permanent("the stored config has no url", Duration::ZERO),
        }
    }
}
