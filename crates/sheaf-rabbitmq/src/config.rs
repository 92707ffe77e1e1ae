//! A RabbitMQ destination's `config`: `{"url", "exchange", "routing_key"?}`, read into a
//! [`Target`] once per kept connection.
//!
//! The URL's password is a secret: no error built here contains it. Messages name the URL as
//! [`Target::redacted`] (the URL without its password), and errors of the AMQP URI parser, which
//! quote the input whole, are rewritten before they are shown.

use lapin::uri::{AMQPScheme, AMQPUri};
use serde_json::{Value, json};
use sheaf_destination::{ConfigError, ConfigReader, guard};

/// The fields a RabbitMQ destination's `config` may have.
pub(crate) const FIELDS: [&str; 3] = ["url", "exchange", "routing_key"];

/// AMQP's `shortstr`, the type of exchange names and routing keys, holds at most 255 bytes.
pub(crate) const MAX_SHORT_STRING: usize = 255;

/// A bound on the URL, so a config cannot carry kilobytes of query string into every log line.
/// Credentials, a host name (253 bytes at most) and a vhost fit easily.
pub(crate) const MAX_URL_LEN: usize = 2048;

/// The error code of a refused URL, the same as the webhook type's.
const URL_CODE: &str = "invalid_destination_url";

/// Where a destination's deliveries go, as read from its `config`.
#[derive(Clone)]
pub(crate) struct Target {
    /// The URI lapin opens (credentials, vhost, `heartbeat`/`channel_max`/`frame_max`).
    pub uri: AMQPUri,
    /// `amqps://`: TLS, verified against the bundled roots (and the operator's CA file).
    pub tls: bool,
    /// The host as written in the URL (an IPv6 literal keeps its brackets).
    pub host: String,
    /// The port, or the scheme's default (5672, 5671 for `amqps`).
    pub port: u16,
    /// The URL without its password, for messages.
    pub redacted: String,
    /// The exchange every delivery is published to.
    pub exchange: String,
    /// The routing key; `None`: each event's topic.
    pub routing_key: Option<String>,
}

impl std::fmt::Debug for Target {
    // By hand: the URI holds the password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("url", &self.redacted)
            .field("exchange", &self.exchange)
            .field("routing_key", &self.routing_key)
            .finish()
    }
}

impl Target {
    /// The host and port, as messages name the broker (`[::1]:5672`, `mq.example.com:5671`).
    pub fn address(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    /// The name TLS verifies the broker's certificate against: the host without brackets.
    pub fn server_name(&self) -> &str {
        self.host.trim_start_matches('[').trim_end_matches(']')
    }

    /// The user the URL logs in as, for a refused login.
    pub fn user(&self) -> &str {
        &self.uri.authority.userinfo.username
    }

    /// The `config` as stored: the given fields only, the URL as written.
    pub fn normalized(&self, raw_url: &str) -> Value {
        let mut config = json!({ "url": raw_url, "exchange": self.exchange });
        if let Some(key) = &self.routing_key {
            config["routing_key"] = json!(key);
        }
        config
    }
}

/// Reads `config` without touching the network: every check but the private-address guard.
pub(crate) fn parse(config: &Value) -> Result<(Target, &str), ConfigError> {
    let reader = ConfigReader::new(config, &FIELDS)?;
    let raw_url = reader.required_str("url")?;
    let (uri, tls, host, port, redacted) = parse_url(raw_url)?;

    if config.get("exchange").and_then(Value::as_str) == Some("") {
        return Err(ConfigError::new(
            "exchange",
            "must not be empty: the default exchange \"\" routes by queue name, so every topic \
             would need a queue named after it; name a topic, direct, fanout or headers exchange",
        ));
    }
    let exchange = reader.required_str("exchange")?;
    check_short_string("exchange", exchange)?;

    if config.get("routing_key").and_then(Value::as_str) == Some("") {
        return Err(ConfigError::new(
            "routing_key",
            "must not be empty: leave it out to use each event's topic as the routing key",
        ));
    }
    let routing_key = reader.optional_str("routing_key")?;
    if let Some(key) = routing_key {
        check_short_string("routing_key", key)?;
    }

    let target = Target {
        uri,
        tls,
        host,
        port,
        redacted,
        exchange: exchange.to_owned(),
        routing_key: routing_key.map(str::to_owned),
    };
    Ok((target, raw_url))
}

/// [`parse`], then the private-address guard on the URL's host; the `config` to store.
pub(crate) async fn validate(config: &Value, allow_private: bool) -> Result<Value, ConfigError> {
    let (target, raw_url) = parse(config)?;
    guard::check_host(&target.redacted, &target.host, target.port, allow_private)
        .await
        .map_err(|refused| ConfigError::new("url", refused.0).with_code(URL_CODE))?;
    Ok(target.normalized(raw_url))
}

fn check_short_string(field: &str, value: &str) -> Result<(), ConfigError> {
    if value.len() > MAX_SHORT_STRING {
        return Err(ConfigError::new(
            field,
            format!(
                "must be at most {MAX_SHORT_STRING} bytes (an AMQP short string), got {}",
                value.len()
            ),
        ));
    }
    Ok(())
}

type ParsedUrl = (AMQPUri, bool, String, u16, String);

fn parse_url(raw: &str) -> Result<ParsedUrl, ConfigError> {
    let refuse = |message: String| ConfigError::new("url", message).with_code(URL_CODE);
    if raw.len() > MAX_URL_LEN {
        return Err(refuse(format!(
            "must be at most {MAX_URL_LEN} bytes, got {}",
            raw.len()
        )));
    }
    // `url`'s errors never quote the input, so they are safe to show.
    let url = url::Url::parse(raw).map_err(|e| refuse(format!("is not a URL: {e}")))?;
    let tls = match url.scheme() {
        "amqp" => false,
        "amqps" => true,
        other => {
            return Err(refuse(format!(
                "must be an amqp:// or amqps:// URL, not {other}://"
            )));
        }
    };
    let mut without_password = url.clone();
    // Only fails for URLs that cannot have credentials, which have no host either.
    let _ = without_password.set_password(None);
    let redacted = without_password.to_string();
    let host = match url.host_str() {
        Some(host) if !host.is_empty() => host.to_owned(),
        _ => return Err(refuse(format!("{redacted:?} has no host"))),
    };
    if host.contains('%') {
        return Err(refuse(format!(
            "the host of {redacted:?} must not be percent-encoded"
        )));
    }
    if url.fragment().is_some() {
        return Err(refuse(format!("{redacted:?} must not have a #fragment")));
    }
    let port = url.port().unwrap_or(
        if tls {
            AMQPScheme::AMQPS
        } else {
            AMQPScheme::AMQP
        }
        .default_port(),
    );
    if port == 0 {
        return Err(refuse(format!("{redacted:?} has port 0")));
    }
    let mut uri: AMQPUri = raw.parse().map_err(|e: String| {
        let mut shown = e.replace(raw, &redacted);
        if let Some(password) = url.password().filter(|p| !p.is_empty())
            && shown.contains(password)
        {
            shown = "its credentials, vhost or query parameters do not parse".to_owned();
        }
        refuse(format!("is not a valid AMQP URI: {shown}"))
    })?;
    // The AMQP URI parser reads only domain names and puts `localhost` in place of an IP
    // literal; the connection goes to the address the guard checked anyway, but the URI should
    // say where that is.
    uri.authority.host = host.clone();
    uri.authority.port = port;
    Ok((uri, tls, host, port, redacted))
}

/// The JSON Schema of `config`.
pub(crate) fn schema() -> Value {
    json!({
        "type": "object",
        "required": ["url", "exchange"],
        "additionalProperties": false,
        // The patterns are subsets of what validation takes (a host name, no IP literal, plain
        // names), so every config the document admits is one the service takes; the
        // descriptions say the whole rule.
        "properties": {
            "url": {
                "type": "string",
                "maxLength": MAX_URL_LEN,
                "pattern": "^amqps?://[a-z][a-z0-9-]{0,20}(\\.[a-z][a-z0-9-]{0,20}){0,3}(:[1-9][0-9]{0,3})?(/[a-z0-9]{1,16})?$",
                "description": "The broker: amqp://user:password@host:port/vhost (the vhost percent-encoded, %2f for \"/\"), or amqps:// for TLS. Query parameters heartbeat, channel_max and frame_max are honoured. Unless SHEAF_ALLOW_PRIVATE_DESTINATIONS, the host must be public."
            },
            "exchange": {
                "type": "string",
                "maxLength": MAX_SHORT_STRING,
                "pattern": "^[A-Za-z0-9_.:-]{1,64}$",
                "description": "The exchange each event is published to (at most 255 bytes); it must exist. The default exchange \"\" is not allowed."
            },
            "routing_key": {
                "type": "string",
                "maxLength": MAX_SHORT_STRING,
                "pattern": "^[A-Za-z0-9_.:#*-]{1,64}$",
                "description": "The routing key of every message (at most 255 bytes). Absent: each event's topic is its routing key, so a topic exchange can route by topic pattern."
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWORD: &str = "pw-never-shown";

    fn config(url: &str) -> Value {
        json!({ "url": url, "exchange": "events" })
    }

    fn refused(config: Value) -> ConfigError {
        match parse(&config) {
            Ok((target, _)) => panic!("{config} was accepted as {target:?}"),
            Err(err) => err,
        }
    }

    #[test]
    fn a_full_url_is_read_with_its_parts() {
        let raw = format!("amqp://sheaf:{PASSWORD}@mq.example.com:5673/orders?heartbeat=10");
        let (target, _) = parse(&config(&raw)).unwrap();
        assert!(!target.tls);
        assert_eq!(target.address(), "mq.example.com:5673");
        assert_eq!(target.uri.vhost, "orders");
        assert_eq!(target.uri.authority.userinfo.password, PASSWORD);
        assert_eq!(target.uri.query.heartbeat, Some(10));
        assert!(!target.redacted.contains(PASSWORD), "{}", target.redacted);
        assert!(!format!("{target:?}").contains(PASSWORD));
        assert_eq!(target.routing_key, None);
    }

    #[test]
    fn ports_default_by_scheme_and_ip_literals_are_kept() {
        let (plain, _) = parse(&config("amqp://10.0.0.1")).unwrap();
        assert_eq!((plain.host.as_str(), plain.port), ("10.0.0.1", 5672));
        let (tls, _) = parse(&config("amqps://[::1]/%2f")).unwrap();
        assert!(tls.tls);
        assert_eq!(tls.port, 5671);
        assert_eq!(tls.server_name(), "::1");
        assert_eq!(tls.uri.vhost, "/");
    }

    #[test]
    fn bad_urls_are_refused_without_the_password() {
        for url in [
            format!("http://u:{PASSWORD}@host/"),
            format!("amqp://u:{PASSWORD}@/vhost"),
            format!("amqp://u:{PASSWORD}@host:99999/"),
            format!("amqp://u:{PASSWORD}@host/?heartbeat=often"),
            format!("amqp://u:{PASSWORD}@host/#frag"),
            "not a url".to_owned(),
        ] {
            let err = refused(config(&url));
            assert_eq!(err.field, "url", "{url}: {err}");
            assert_eq!(err.code, URL_CODE);
            assert!(!err.to_string().contains(PASSWORD), "{err}");
        }
    }

    #[test]
    fn exchange_and_routing_key_are_short_strings() {
        let long = "x".repeat(256);
        let cases = [
            (json!({"url": "amqp://h"}), "exchange"),
            (json!({"url": "amqp://h", "exchange": ""}), "exchange"),
            (json!({"url": "amqp://h", "exchange": long}), "exchange"),
            (json!({"url": "amqp://h", "exchange": 7}), "exchange"),
            (
                json!({"url": "amqp://h", "exchange": "e", "routing_key": ""}),
                "routing_key",
            ),
            (
                json!({"url": "amqp://h", "exchange": "e", "routing_key": long}),
                "routing_key",
            ),
            (
                json!({"url": "amqp://h", "exchange": "e", "queue": "q"}),
                "queue",
            ),
            (json!({"exchange": "e"}), "url"),
        ];
        for (config, field) in cases {
            assert_eq!(refused(config.clone()).field, field, "{config}");
        }
        let err = refused(json!({"url": "amqp://h", "exchange": ""}));
        assert!(err.message.contains("default exchange"), "{err}");
        let max = "k".repeat(255);
        assert!(parse(&json!({"url": "amqp://h", "exchange": max, "routing_key": max})).is_ok());
    }

    #[test]
    fn normalized_configs_keep_only_the_given_fields() {
        let given = json!({"url": "amqp://u:p@h/v", "exchange": "e"});
        let (target, raw) = parse(&given).unwrap();
        assert_eq!(target.normalized(raw), given);
        let given = json!({"url": "amqp://h", "exchange": "e", "routing_key": "k"});
        let (target, raw) = parse(&given).unwrap();
        assert_eq!(target.normalized(raw), given);
    }

    #[tokio::test]
    async fn a_private_host_is_refused_unless_allowed() {
        let given = config(&format!("amqp://guest:{PASSWORD}@127.0.0.1:5672/%2f"));
        let err = validate(&given, false).await.unwrap_err();
        assert_eq!(err.field, "url");
        assert!(err.message.contains("not a public address"), "{err}");
        assert!(!err.to_string().contains(PASSWORD), "{err}");
        assert_eq!(validate(&given, true).await.unwrap(), given);
    }
}
