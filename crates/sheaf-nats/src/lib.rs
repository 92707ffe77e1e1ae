//! Sheaf's NATS destination type: a JetStream publish per delivery, acknowledged by the stream.
#![doc = include_str!("../README.md")]

mod config;
mod pool;
mod publish;
mod tls;

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use serde_json::{Value, json};
use sheaf_destination::{ConfigError, DestinationType, Message, Report, guard};
use sheaf_store::DestinationId;

pub use publish::RESERVED_HEADERS;

use crate::config::Target;

/// How NATS deliveries are made.
#[derive(Debug, Clone)]
pub struct NatsSettings {
    /// A delivery (connecting if need be, publishing, the stream's acknowledgement) gives up
    /// after this.
    pub timeout: Duration,
    /// Deliver to loopback, private and other non-public addresses too.
    pub allow_private: bool,
}

/// The NATS JetStream destination type.
#[derive(Debug)]
pub struct Nats {
    settings: NatsSettings,
    pool: pool::Pool,
    /// What `tls://` (and a `nats://` server that asks for TLS) is verified against.
    roots: Arc<rustls::RootCertStore>,
}

impl Nats {
    /// A NATS destination type with `settings`; it connects on the first delivery.
    pub fn new(settings: NatsSettings) -> Nats {
        let roots = sheaf_tls::roots(None).expect("the bundled roots need no file");
        Nats {
            settings,
            pool: pool::Pool::default(),
            roots: Arc::new(roots),
        }
    }

    /// The same type, trusting the CA certificates in `path` (PEM) besides the bundled roots
    /// for `tls://` servers behind a private CA.
    ///
    /// # Errors
    /// [`sheaf_tls::CaFileError`], naming the file and what is wrong with it.
    pub fn with_ca_file(self, path: &std::path::Path) -> Result<Nats, sheaf_tls::CaFileError> {
        Ok(Nats {
            roots: Arc::new(sheaf_tls::roots(Some(path))?),
            ..self
        })
    }

    /// How many connections were opened so far, for tests that check they are kept.
    #[doc(hidden)]
    pub fn connections_opened(&self) -> usize {
        self.pool.opened()
    }
}

/// Where a delivery that ran out of time was.
#[derive(Debug, Clone, Copy)]
enum Phase {
    Connecting,
    Acknowledging,
}

#[async_trait]
impl DestinationType for Nats {
    fn name(&self) -> &'static str {
        "nats"
    }

    fn config_schema(&self) -> Value {
        json!({
            "type": "object",
            "description": "A NATS JetStream publish, acknowledged by the stream that captures the subject; the event id is the Nats-Msg-Id.",
            "required": ["url", "subject"],
            "additionalProperties": false,
            "properties": {
                // The patterns are subsets of what `validate` takes (no IP literals, no
                // credentials, plain tokens), so every config the document admits is one the
                // service takes; the descriptions say the whole rule.
                "url": {
                    "type": "string",
                    "pattern": "^(nats|tls)://[a-z][a-z0-9-]{0,20}(\\.[a-z][a-z0-9-]{0,20}){0,3}(:[1-9][0-9]{0,3})?$",
                    "description": "nats://[user:pass@]host:port or tls://…, no path (a lone user part is a token; the port defaults to 4222). Unless SHEAF_ALLOW_PRIVATE_DESTINATIONS, the host must be public."
                },
                "subject": {
                    "type": "string",
                    "maxLength": config::MAX_SUBJECT_BYTES,
                    "pattern": "^[A-Za-z0-9_-]{1,16}(\\.[A-Za-z0-9_-]{1,16}){0,7}$",
                    "description": "The subject to publish to: non-empty tokens separated by dots, no wildcards (* >) or whitespace, not a $ API subject. A JetStream stream must capture it."
                }
            }
        })
    }

    fn reserved_headers(&self) -> &'static [&'static str] {
        &RESERVED_HEADERS
    }

    async fn validate(&self, config: &Value) -> Result<Value, ConfigError> {
        let target = Target::parse(config)?;
        if target.tls {
            tls::client_config(&target.host, &self.roots)
                .map_err(|m| ConfigError::new("url", m))?;
        }
        guard::check_host(
            &target.shown,
            &target.host,
            target.port,
            self.settings.allow_private,
        )
        .await
        .map_err(|refused| {
            ConfigError::new("url", refused.0).with_code("invalid_destination_url")
        })?;
        Ok(Target::normalized(config))
    }

    async fn deliver(&self, config: &Value, message: &Message<'_>) -> Report {
        let started = Instant::now();
        let target = match Target::parse(config) {
            Ok(target) => target,
            Err(e) => {
                return Report::permanent(
                    format!("the stored config is not valid: {e}"),
                    started.elapsed(),
                );
            }
        };
        let headers = match publish::headers(message) {
            Ok(headers) => headers,
            Err(failure) => return failure.report(started.elapsed()),
        };
        let payload = Bytes::copy_from_slice(message.payload);
        let timeout = self.settings.timeout;
        let mut phase = Phase::Connecting;
        let outcome = tokio::time::timeout(timeout, async {
            let connection = self
                .pool
                .connection(
                    message.destination_id,
                    config,
                    &target,
                    &self.settings,
                    &self.roots,
                )
                .await?;
            phase = Phase::Acknowledging;
            publish::publish(&connection.jetstream, &target, headers, payload).await
        })
        .await;
        let elapsed = started.elapsed();
        match outcome {
            Ok(Ok(ack)) => {
                let mut report = Report::delivered(elapsed);
                report.response = Some(if ack.duplicate {
                    format!(
                        "stream {} already had this event (sequence {}, dropped as a duplicate)",
                        ack.stream, ack.sequence
                    )
                } else {
                    format!(
                        "stored in stream {} at sequence {}",
                        ack.stream, ack.sequence
                    )
                });
                report
            }
            Ok(Err(failure)) => failure.report(elapsed),
            Err(_) => Report::retry(
                match phase {
                    Phase::Connecting => format!(
                        "connecting to {} timed out after {timeout:?} (no NATS server answered)",
                        target.shown
                    ),
                    Phase::Acknowledging => format!(
                        "no acknowledgement from a stream on {} within {timeout:?} (the server or its stream is down or slow)",
                        target.shown
                    ),
                },
                elapsed,
            ),
        }
    }

    fn forget(&self, destination: DestinationId) {
        self.pool.forget(destination);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nats(allow_private: bool) -> Nats {
        Nats::new(NatsSettings {
            timeout: Duration::from_secs(2),
            allow_private,
        })
    }

    #[tokio::test]
    async fn loopback_is_refused_unless_private_destinations_are_allowed() {
        let config =
            json!({"url": "nats://alice:hunter2@127.0.0.1:4222", "subject": "orders.created"});
        let err = nats(false).validate(&config).await.unwrap_err();
        assert_eq!(err.field, "url");
        assert!(err.message.contains("not a public address"), "{err}");
        assert!(!err.to_string().contains("hunter2"), "{err}");
        assert_eq!(nats(true).validate(&config).await.unwrap(), config);
    }

    #[tokio::test]
    async fn a_stored_config_that_no_longer_parses_is_permanent() {
        let report = {
            let tenant = sheaf_store::TenantId::new("t").unwrap();
            let event = sheaf_store::EventId::new("evt_1").unwrap();
            let headers = Default::default();
            let message = Message {
                tenant_id: &tenant,
                destination_id: DestinationId::generate(),
                event_id: &event,
                topic: "t",
                timestamp: sheaf_store::Timestamp::now(),
                payload: b"{}",
                headers: &headers,
                trace: &[],
                secrets: &[],
                attempt: 1,
            };
            nats(true)
                .deliver(&json!({"url": "nats://h"}), &message)
                .await
        };
        assert_eq!(report.verdict, sheaf_destination::Verdict::Permanent);
        assert!(report.error.unwrap().contains("config.subject"));
    }

    #[test]
    fn the_schema_requires_both_fields_and_nothing_else() {
        let schema = nats(true).config_schema();
        assert_eq!(schema["required"], json!(["url", "subject"]));
        assert_eq!(schema["additionalProperties"], json!(false));
    }
}
