//! The `config` of a NATS destination, `{"url": "nats://[user:pass@]host:port", "subject": "…"}`:
//! what it may say, and the [`Target`] a delivery reads from it.
//!
//! Validation and delivery parse with the same [`Target::parse`], so a delivery never works from
//! a reading of `config` that validation did not agree with. Nothing here touches the network;
//! the private-address check at validation is in `lib.rs`, the one at connect time in `pool.rs`.

use std::fmt;

use serde_json::{Value, json};
use sheaf_destination::{ConfigError, ConfigReader};
use url::Url;

/// The fields of `config`.
pub(crate) const FIELDS: [&str; 2] = ["url", "subject"];

/// The port NATS servers listen on when a URL names none.
pub(crate) const DEFAULT_PORT: u16 = 4222;

/// NATS servers refuse longer subjects in practice (and a subject is repeated in every message
/// header line the server writes), so a longer one is a mistake worth naming at validation.
pub(crate) const MAX_SUBJECT_BYTES: usize = 255;

/// The API error code of a `url` that is not a usable NATS server address, the same code the
/// webhook type gives a bad `url`.
const URL_CODE: &str = "invalid_destination_url";

/// Where one destination publishes, as read from a validated `config`.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Target {
    /// `tls://`: the connection must be TLS from the start (a `nats://` server may still
    /// require TLS, which the client then starts too).
    pub tls: bool,
    /// The host as written, IPv6 literals without brackets: what is resolved and what a TLS
    /// certificate must be issued for.
    pub host: String,
    pub port: u16,
    pub credentials: Credentials,
    /// The subject every delivery is published to.
    pub subject: String,
    /// The URL without its password, for errors and the guard's refusals.
    pub shown: String,
}

/// How the client authenticates, from the URL's user part.
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum Credentials {
    None,
    /// `nats://token@host`: NATS reads a lone user part as a token.
    Token(String),
    UserPassword {
        user: String,
        password: String,
    },
}

// Hand-written so that neither a password nor a token can reach a log line through `{:?}`.
impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Target")
            .field("url", &self.shown)
            .field("subject", &self.subject)
            .finish_non_exhaustive()
    }
}

impl Target {
    /// Reads `config`: unknown fields refused, `url` a `nats://` or `tls://` URL with a host
    /// and nothing after it, `subject` a subject one can publish to.
    pub(crate) fn parse(config: &Value) -> Result<Target, ConfigError> {
        let reader = ConfigReader::new(config, &FIELDS)?;
        let raw_url = reader.required_str("url")?;
        let raw_subject = reader.required_str("subject")?;
        let mut target =
            parse_url(raw_url).map_err(|m| ConfigError::new("url", m).with_code(URL_CODE))?;
        check_subject(raw_subject).map_err(|m| ConfigError::new("subject", m))?;
        target.subject = raw_subject.to_owned();
        Ok(target)
    }

    /// The config as it is stored: the same object (nothing in it has a canonical form worth
    /// rewriting a tenant's spelling for).
    pub(crate) fn normalized(config: &Value) -> Value {
        json!({
            "url": config.get("url").cloned().unwrap_or(Value::Null),
            "subject": config.get("subject").cloned().unwrap_or(Value::Null),
        })
    }
}

/// Parses a server URL. Messages never repeat the URL itself: it may hold a password.
fn parse_url(raw: &str) -> Result<Target, String> {
    let url = Url::parse(raw).map_err(|e| format!("is not a URL ({e})"))?;
    let tls = match url.scheme() {
        "nats" => false,
        "tls" => true,
        other => {
            return Err(format!(
                "must be a nats:// or tls:// URL, not {other}:// (write nats://[user:pass@]host:port)"
            ));
        }
    };
    let host = match url.host_str() {
        Some(h) if !h.is_empty() => h.trim_start_matches('[').trim_end_matches(']').to_owned(),
        _ => return Err("has no host (write nats://[user:pass@]host:port)".to_owned()),
    };
    if !matches!(url.path(), "" | "/") || url.query().is_some() || url.fragment().is_some() {
        return Err(
            "must not have a path, query or fragment: a NATS server URL is nats://[user:pass@]host:port"
                .to_owned(),
        );
    }
    let port = url.port().unwrap_or(DEFAULT_PORT);
    if port == 0 {
        return Err("has port 0, which no server listens on".to_owned());
    }
    let user =
        decode(url.username()).ok_or("has a user that is not valid percent-encoded UTF-8")?;
    let password = url
        .password()
        .map(decode)
        .map(|p| p.ok_or("has a password that is not valid percent-encoded UTF-8"))
        .transpose()?;
    let credentials = match (user.is_empty(), password) {
        (true, None) => Credentials::None,
        (true, Some(_)) => return Err("has a password but no user".to_owned()),
        (false, None) => Credentials::Token(user.clone()),
        (false, Some(password)) => Credentials::UserPassword {
            user: user.clone(),
            password,
        },
    };
    let bracketed = if host.contains(':') {
        format!("[{host}]")
    } else {
        host.clone()
    };
    let shown = match &credentials {
        Credentials::None => format!("{}://{bracketed}:{port}", url.scheme()),
        // A token is a secret on its own: show that there is one, not what it is.
        Credentials::Token(_) => format!("{}://***@{bracketed}:{port}", url.scheme()),
        Credentials::UserPassword { .. } => {
            format!("{}://{}@{bracketed}:{port}", url.scheme(), url.username())
        }
    };
    Ok(Target {
        tls,
        host,
        port,
        credentials,
        subject: String::new(),
        shown,
    })
}

/// Why `subject` cannot be published to, if it cannot: NATS subjects are `.`-separated
/// non-empty tokens; `*` and `>` are wildcards (a subscription's, never a message's); whitespace
/// ends a subject in the protocol; `$`-prefixed ones (`$JS`, `$SYS`, `$KV`) are the server's own
/// APIs, where a delivery's payload would be read as a command.
pub(crate) fn check_subject(subject: &str) -> Result<(), String> {
    if subject.len() > MAX_SUBJECT_BYTES {
        return Err(format!(
            "is {} bytes long; a NATS subject has at most {MAX_SUBJECT_BYTES}",
            subject.len()
        ));
    }
    if let Some(c) = subject
        .chars()
        .find(|c| c.is_whitespace() || c.is_control())
    {
        return Err(format!(
            "contains {c:?}; a NATS subject has no whitespace or control characters"
        ));
    }
    if subject.contains(['*', '>']) {
        return Err(format!(
            "{subject:?} contains a wildcard (* or >); deliveries are published to one subject, so name it in full"
        ));
    }
    if subject.split('.').any(str::is_empty) {
        return Err(format!(
            "{subject:?} has an empty token; a NATS subject is non-empty tokens separated by single dots (orders.created)"
        ));
    }
    if subject.starts_with('$') {
        return Err(format!(
            "{subject:?} starts with $, which names the server's own APIs ($JS, $SYS, $KV), not a place for events"
        ));
    }
    Ok(())
}

/// Percent-decodes a URL's user or password; `None` when the result is not UTF-8.
fn decode(part: &str) -> Option<String> {
    let bytes = part.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (
            bytes[i],
            bytes.get(i + 1).copied(),
            bytes.get(i + 2).copied(),
        ) {
            (b'%', Some(h), Some(l)) if hex(h).is_some() && hex(l).is_some() => {
                out.push((hex(h)? * 16 + hex(l)?) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(url: &str) -> Result<Target, ConfigError> {
        Target::parse(&json!({"url": url, "subject": "orders.created"}))
    }

    #[test]
    fn urls_are_read_with_their_credentials_and_defaults() {
        let t = target("nats://alice:s%40cret@broker.example:4333").unwrap();
        assert_eq!(
            (t.tls, t.host.as_str(), t.port),
            (false, "broker.example", 4333)
        );
        assert!(
            matches!(&t.credentials, Credentials::UserPassword { user, password } if user == "alice" && password == "s@cret")
        );
        assert_eq!(t.shown, "nats://alice@broker.example:4333");
        assert!(!format!("{t:?}").contains("cret"));

        let t = target("tls://[::1]").unwrap();
        assert_eq!(
            (t.tls, t.host.as_str(), t.port),
            (true, "::1", DEFAULT_PORT)
        );
        assert_eq!(t.shown, "tls://[::1]:4222");

        let t = target("nats://t0ken@127.0.0.1:4222/").unwrap();
        assert!(matches!(&t.credentials, Credentials::Token(token) if token == "t0ken"));
        assert_eq!(t.shown, "nats://***@127.0.0.1:4222");
    }

    #[test]
    fn bad_urls_are_refused_without_echoing_secrets() {
        for (url, words) in [
            ("http://user:hunter2@host:4222", "nats:// or tls://"),
            ("nats://", "no host"),
            ("nats://host:4222/stream", "path"),
            ("nats://host:4222?x=1", "path"),
            ("nats://:hunter2@host", "no user"),
            ("nats://host:0", "port 0"),
            ("not a url", "not a URL"),
        ] {
            let err = target(url).unwrap_err();
            assert_eq!(err.field, "url", "{url}");
            assert!(err.message.contains(words), "{url}: {err}");
            assert!(!err.message.contains("hunter2"), "{err}");
        }
    }

    #[test]
    fn subjects_must_be_publishable() {
        assert!(check_subject("orders.created").is_ok());
        assert!(check_subject("a").is_ok());
        for (subject, words) in [
            ("orders.*", "wildcard"),
            ("orders.>", "wildcard"),
            ("orders..created", "empty token"),
            (".orders", "empty token"),
            ("orders.", "empty token"),
            ("orders created", "whitespace"),
            ("orders\tcreated", "whitespace"),
            ("$JS.API.STREAM.DELETE.x", "server's own APIs"),
        ] {
            let err = check_subject(subject).unwrap_err();
            assert!(err.contains(words), "{subject}: {err}");
        }
        let long = "a.".repeat(128) + "a";
        assert!(check_subject(&long).unwrap_err().contains("at most 255"));
        let err = Target::parse(&json!({"url": "nats://h", "subject": "a.*"})).unwrap_err();
        assert_eq!(err.field, "subject");
    }

    #[test]
    fn fields_are_required_and_unknown_ones_refused() {
        let err = Target::parse(&json!({"subject": "a"})).unwrap_err();
        assert_eq!(
            (err.field.as_str(), err.message.as_str()),
            ("url", "is required")
        );
        let err = Target::parse(&json!({"url": "nats://h"})).unwrap_err();
        assert_eq!(err.field, "subject");
        let err =
            Target::parse(&json!({"url": "nats://h", "subject": "a", "stream": "S"})).unwrap_err();
        assert_eq!(err.field, "stream");
    }

    #[test]
    fn normalizing_keeps_the_object() {
        let config = json!({"url": "nats://h:1", "subject": "a.b"});
        assert_eq!(Target::normalized(&config), config);
    }
}
