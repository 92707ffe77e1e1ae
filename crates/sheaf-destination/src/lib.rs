//! Where Sheaf delivers events: the destination-type trait, the shared address guard, and the conformance suite.
#![doc = include_str!("../README.md")]

pub mod guard;
pub mod signing;
#[cfg(feature = "testkit")]
pub mod testkit;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sheaf_store::{DestinationId, EventId, Secret, TenantId, Timestamp};

pub use signing::{SECRET_PREFIX, generate_secret};

/// One delivery: an event, to one destination, now.
#[derive(Debug, Clone, Copy)]
pub struct Message<'a> {
    /// The destination's tenant.
    pub tenant_id: &'a TenantId,
    /// The destination.
    pub destination_id: DestinationId,
    /// The event's id: receivers and brokers use it to drop a repeat.
    pub event_id: &'a EventId,
    /// The event's topic.
    pub topic: &'a str,
    /// When this attempt is made (webhooks sign it).
    pub timestamp: Timestamp,
    /// The event's `data`, serialized as JSON.
    pub payload: &'a [u8],
    /// The destination's custom headers (names already checked against
    /// [`DestinationType::reserved_headers`]).
    pub headers: &'a BTreeMap<String, String>,
    /// Trace context of this attempt (`traceparent`, `tracestate`), to pass on where the type
    /// can carry headers.
    pub trace: &'a [(String, String)],
    /// The secrets valid now: the current one, then the previous one during a rotation.
    pub secrets: &'a [&'a Secret],
    /// Which attempt this is, from 1.
    pub attempt: u32,
}

/// What a type made of one delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// What the engine does next.
    pub verdict: Verdict,
    /// The receiver's status code, where it has one (HTTP's, AMQP's reply code).
    pub code: Option<u16>,
    /// The start of the receiver's answer, for the attempt log (at most
    /// [`MAX_RESPONSE_EXCERPT`] bytes).
    pub response: Option<String>,
    /// Why it failed, in words (`None` on success).
    pub error: Option<String>,
    /// How long the delivery took.
    pub elapsed: Duration,
}

/// How much of a receiver's answer an attempt keeps: enough for an error message, little
/// enough that a receiver answering with megabytes costs the log nothing.
pub const MAX_RESPONSE_EXCERPT: usize = 1024;

impl Report {
    /// A success after `elapsed`.
    pub fn delivered(elapsed: Duration) -> Self {
        Report {
            verdict: Verdict::Delivered,
            code: None,
            response: None,
            error: None,
            elapsed,
        }
    }

    /// A failure worth retrying, for `error`.
    pub fn retry(error: impl Into<String>, elapsed: Duration) -> Self {
        Report {
            verdict: Verdict::Retry { after: None },
            code: None,
            response: None,
            error: Some(error.into()),
            elapsed,
        }
    }

    /// A failure that retrying cannot mend, for `error`.
    pub fn permanent(error: impl Into<String>, elapsed: Duration) -> Self {
        Report {
            verdict: Verdict::Permanent,
            code: None,
            response: None,
            error: Some(error.into()),
            elapsed,
        }
    }

    /// The same report with the receiver's status code.
    pub fn with_code(mut self, code: u16) -> Self {
        self.code = Some(code);
        self
    }

    /// The wait the receiver asked for, if it named one.
    pub fn retry_after(&self) -> Option<Duration> {
        match self.verdict {
            Verdict::Retry { after } | Verdict::Throttled { after } => after,
            Verdict::Delivered | Verdict::Permanent => None,
        }
    }

    /// Whether the event was delivered.
    pub fn succeeded(&self) -> bool {
        self.verdict == Verdict::Delivered
    }
}

/// What the engine does after a delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Delivered: the receiver (or broker) confirmed it.
    Delivered,
    /// Not delivered; try again on the retry schedule, or after `after` when the receiver named
    /// a time for this message.
    Retry { after: Option<Duration> },
    /// Not delivered because the receiver is shedding load (HTTP's 429, or any answer with a
    /// `Retry-After`): every delivery to this destination from the process waits `after` (a
    /// second when it names no time), and this one is retried after `after`, or on its
    /// schedule when there is none.
    Throttled { after: Option<Duration> },
    /// Not delivered, and it will not be while the destination stays as it is: dead-letter now.
    Permanent,
}

/// A `config` a type refuses: which field, and why. Shown to the API caller as
/// `config.<field>: <message>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("config{}: {message}", field_path(.field))]
pub struct ConfigError {
    /// The field at fault, as a dotted path inside `config` (empty for `config` itself).
    pub field: String,
    /// What is wrong with it.
    pub message: String,
    /// The API's error code for it: `invalid_config` unless the type has a more precise one.
    pub code: &'static str,
}

fn field_path(field: &str) -> String {
    if field.is_empty() {
        String::new()
    } else {
        format!(".{field}")
    }
}

impl ConfigError {
    /// `field` is wrong because `message`.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError {
            field: field.into(),
            message: message.into(),
            code: "invalid_config",
        }
    }

    /// The same error under another API error code.
    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = code;
        self
    }
}

/// Reads a `config` object whose fields a type knows: each field once, unknown ones refused.
/// A small helper so every type words the same mistakes the same way.
#[derive(Debug)]
pub struct ConfigReader<'a> {
    object: &'a serde_json::Map<String, serde_json::Value>,
}

impl<'a> ConfigReader<'a> {
    /// `config` must be an object with no field outside `known`.
    pub fn new(config: &'a serde_json::Value, known: &[&str]) -> Result<Self, ConfigError> {
        let object = config
            .as_object()
            .ok_or_else(|| ConfigError::new("", "must be an object"))?;
        if let Some(unknown) = object.keys().find(|k| !known.contains(&k.as_str())) {
            return Err(ConfigError::new(
                unknown.as_str(),
                format!(
                    "is not a field of this destination type (its fields: {})",
                    known.join(", ")
                ),
            ));
        }
        Ok(ConfigReader { object })
    }

    /// A string field that must be present and non-empty.
    pub fn required_str(&self, field: &str) -> Result<&'a str, ConfigError> {
        self.optional_str(field)?
            .ok_or_else(|| ConfigError::new(field, "is required"))
    }

    /// A string field that may be absent; present, it must be a non-empty string.
    pub fn optional_str(&self, field: &str) -> Result<Option<&'a str>, ConfigError> {
        match self.object.get(field) {
            None => Ok(None),
            Some(serde_json::Value::String(s)) if s.is_empty() => {
                Err(ConfigError::new(field, "must not be empty"))
            }
            Some(serde_json::Value::String(s)) => Ok(Some(s.as_str())),
            Some(_) => Err(ConfigError::new(field, "must be a string")),
        }
    }
}

/// One kind of place events go. Object-safe: the engine holds them as `Arc<dyn DestinationType>`.
#[async_trait]
pub trait DestinationType: fmt::Debug + Send + Sync + 'static {
    /// The name destinations use in their `type` field: lower case, stable.
    fn name(&self) -> &'static str;

    /// A JSON Schema of `config`, for the OpenAPI document.
    fn config_schema(&self) -> serde_json::Value;

    /// Custom header names this type sets itself and a destination may not override (compared
    /// in lower case).
    fn reserved_headers(&self) -> &'static [&'static str] {
        &[]
    }

    /// Checks a `config` when a destination is created or its `config` replaced, and returns it
    /// as it is to be stored (normalized: a URL in its canonical form, defaults left out or
    /// filled in as the type documents). Calling it again on what it returned gives the same
    /// value. A check that needs the network (a host's addresses) may make one.
    async fn validate(&self, config: &serde_json::Value) -> Result<serde_json::Value, ConfigError>;

    /// Delivers `message` to the destination `config` describes (a `config` this type validated
    /// once). Never panics on a bad answer; every failure is a [`Report`]. Returns within the
    /// delivery timeout the type was built with, plus scheduling slack.
    async fn deliver(&self, config: &serde_json::Value, message: &Message<'_>) -> Report;

    /// The destination was deleted or its `config` changed: drop what is kept for it.
    fn forget(&self, _destination: DestinationId) {}
}

/// The destination types a process delivers to, by name.
#[derive(Debug, Clone, Default)]
pub struct Registry {
    types: BTreeMap<&'static str, Arc<dyn DestinationType>>,
}

impl Registry {
    /// No types yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `kind` under its name. Panics if a type of that name is already there: two types
    /// answering to one name is a wiring mistake, found at start-up.
    pub fn with(mut self, kind: Arc<dyn DestinationType>) -> Self {
        let name = kind.name();
        assert!(
            self.types.insert(name, kind).is_none(),
            "two destination types are named {name:?}"
        );
        self
    }

    /// The type called `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn DestinationType>> {
        self.types.get(name)
    }

    /// Every type, by name.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<dyn DestinationType>> {
        self.types.values()
    }

    /// The names, sorted: for error messages and the API description.
    pub fn names(&self) -> Vec<&'static str> {
        self.types.keys().copied().collect()
    }

    /// The custom header names any type reserves, sorted: refused on every destination, so a
    /// header means the same whichever type a destination has.
    pub fn reserved_headers(&self) -> Vec<&'static str> {
        let mut names: Vec<&'static str> = self
            .types
            .values()
            .flat_map(|k| k.reserved_headers().iter().copied())
            .collect();
        names.sort_unstable();
        names.dedup();
        names
    }

    /// Tells every type to drop what it keeps for `destination`.
    pub fn forget(&self, destination: DestinationId) {
        for kind in self.types.values() {
            kind.forget(destination);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn config_errors_name_their_field() {
        let err = ConfigError::new("url", "is required");
        assert_eq!(err.to_string(), "config.url: is required");
        assert_eq!(err.code, "invalid_config");
        assert_eq!(
            ConfigError::new("", "must be an object").to_string(),
            "config: must be an object"
        );
    }

    #[test]
    fn the_reader_refuses_unknown_missing_and_mistyped_fields() {
        let config = json!({"url": "x", "extra": 1});
        let err = ConfigReader::new(&config, &["url"]).unwrap_err();
        assert_eq!(err.field, "extra");
        let config = json!({"url": 5});
        let reader = ConfigReader::new(&config, &["url", "subject"]).unwrap();
        assert_eq!(
            reader.required_str("url").unwrap_err().message,
            "must be a string"
        );
        assert_eq!(
            reader.required_str("subject").unwrap_err().message,
            "is required"
        );
        let config = json!({"url": ""});
        let reader = ConfigReader::new(&config, &["url"]).unwrap();
        assert_eq!(reader.optional_str("url").unwrap_err().field, "url");
        assert!(ConfigReader::new(&json!([1]), &["url"]).is_err());
    }

    #[test]
    fn secrets_carry_the_prefix_and_32_bytes() {
        let secret = generate_secret();
        let rest = secret.expose().strip_prefix(SECRET_PREFIX).unwrap();
        use base64::Engine as _;
        let key = base64::engine::general_purpose::STANDARD
            .decode(rest)
            .unwrap();
        assert_eq!(key.len(), 32);
        assert_ne!(generate_secret().expose(), secret.expose());
    }
}
