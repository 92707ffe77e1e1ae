//! Webhook delivery: Standard Webhooks signatures and the HTTP POST itself.
//!
//! A delivery is a POST of the event's `data` as JSON with `webhook-id` (the event id),
//! `webhook-timestamp` (Unix seconds) and `webhook-signature`: `v1,` and the base64
//! HMAC-SHA256 of `{id}.{timestamp}.{body}` under the secret's key (the base64 after
//! `whsec_`), one such signature per valid secret, space-separated, so a receiver that knows
//! either secret of a rotation verifies it. The destination's custom headers follow.
//!
//! A 2xx answer is success. Anything else fails the attempt, redirects included: following a
//! redirect would send a signed event to a URL nobody validated, so a 3xx is a failure whose
//! `Location` the operator sees in the attempt's `error`. (Following only redirects that pass
//! the guard was the alternative; receivers that move can update their destination instead,
//! and a policy that is never followed cannot be talked into an internal address.)
//!
//! While the private-destination guard is on, the client resolves names through
//! [`GuardedResolver`] and ignores the environment's proxies, and IP literals are checked before
//! the request, so the address a delivery connects to is the address that was checked (see
//! `guard.rs`). With `SHEAF_EGRESS_PROXY` the client connects to the proxy instead, which the
//! operator chose and which may be private; the guard then checks each destination's own
//! name and addresses before the request is handed to the proxy ([`check_url`]).
//!
//! TLS: rustls on ring, trusting the system's roots, the bundled webpki roots and
//! `SHEAF_TLS_CA_FILE` (a receiver behind a private CA).

use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{Hmac, Mac};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use sha2::Sha256;
use sheaf_store::{Destination, EventId, Secret, Timestamp};

use crate::delivery::guard::{GuardedResolver, check_literal, check_url};
use crate::settings::Config;

/// Header names a destination's custom headers may not set: the signature's and the body's.
pub const RESERVED_HEADERS: [&str; 5] = [
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
    "content-type",
    "content-length",
];

/// How much of a response body an attempt keeps; enough for an error message, little enough
/// that a receiver answering with megabytes costs the log nothing.
pub const MAX_RESPONSE_BODY: usize = 1024;

/// The prefix of every Sheaf secret (Standard Webhooks).
pub const SECRET_PREFIX: &str = "whsec_";

/// A fresh secret: `whsec_` and the base64 of 32 random bytes (Standard Webhooks asks for
/// 24 to 64 bytes of key; 32 matches the HMAC-SHA256 block size's half and Svix's choice).
pub fn generate_secret() -> Secret {
    let key: [u8; 32] = rand::random();
    Secret::new(format!("{SECRET_PREFIX}{}", BASE64.encode(key))).expect("a non-empty secret")
}

/// The HMAC key of a secret: the base64 after `whsec_` (a secret without the prefix, or
/// whose rest is not base64, is used as raw bytes, as the reference libraries do).
fn secret_key(secret: &Secret) -> Vec<u8> {
    let text = secret.expose();
    let rest = text.strip_prefix(SECRET_PREFIX).unwrap_or(text);
    BASE64
        .decode(rest)
        .unwrap_or_else(|_| rest.as_bytes().to_vec())
}

/// `v1,<base64 signature>` for each secret, space-separated.
pub fn sign(secrets: &[&Secret], id: &str, timestamp: i64, body: &[u8]) -> String {
    let mut out = Vec::with_capacity(secrets.len());
    for secret in secrets {
        let mut mac = Hmac::<Sha256>::new_from_slice(&secret_key(secret))
            .expect("HMAC takes keys of any length");
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        out.push(format!("v1,{}", BASE64.encode(mac.finalize().into_bytes())));
    }
    out.join(" ")
}

/// What one attempt produced.
#[derive(Debug, Clone)]
pub struct Delivered {
    /// The HTTP status, if the destination answered.
    pub code: Option<u16>,
    /// Whether it counts as delivered (2xx).
    pub success: bool,
    /// The start of the response body.
    pub body: Option<String>,
    /// Why there was no answer (timeout, connection refused), or why a redirect was refused.
    pub error: Option<String>,
    /// How long the request took.
    pub elapsed: Duration,
    /// The destination's `Retry-After`, if it sent one we could read.
    pub retry_after: Option<Duration>,
}

/// Sends webhooks. One per process: it holds the connection pool.
#[derive(Debug, Clone)]
pub struct Sender {
    client: reqwest::Client,
    guard: Guard,
}

/// Where the private-destination guard looks, if anywhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Guard {
    /// `SHEAF_ALLOW_PRIVATE_DESTINATIONS=true`.
    Off,
    /// Direct connections: the resolver checks what it returns, literals are checked here.
    AtConnect,
    /// Through the egress proxy: the destination is resolved and checked before each request.
    BeforeProxy,
}

impl Sender {
    /// A sender whose requests give up after `SHEAF_DELIVERY_TIMEOUT`, through
    /// `SHEAF_EGRESS_PROXY` if set, trusting `SHEAF_TLS_CA_FILE` besides the system's and the
    /// bundled roots. Unless `SHEAF_ALLOW_PRIVATE_DESTINATIONS`, it delivers only to public
    /// addresses.
    pub fn new(config: &Config) -> anyhow::Result<Self> {
        let timeout = config.delivery_timeout;
        let mut builder = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("sheaf/", env!("CARGO_PKG_VERSION")));
        if let Some(path) = &config.tls_ca_file {
            let certificates = sheaf_tls::load_certificates(path)
                .map_err(|e| anyhow::anyhow!("SHEAF_TLS_CA_FILE: {e}"))?;
            for certificate in certificates {
                builder = builder.add_root_certificate(
                    reqwest::Certificate::from_der(&certificate)
                        .map_err(|e| anyhow::anyhow!("SHEAF_TLS_CA_FILE: {e}"))?,
                );
            }
        }
        let guard = match (&config.egress_proxy, config.allow_private_destinations) {
            (Some(proxy), allow_private) => {
                builder = builder.no_proxy().proxy(
                    reqwest::Proxy::all(proxy.clone())
                        .map_err(|e| anyhow::anyhow!("SHEAF_EGRESS_PROXY: {e}"))?,
                );
                if allow_private {
                    Guard::Off
                } else {
                    Guard::BeforeProxy
                }
            }
            (None, true) => Guard::Off,
            (None, false) => {
                builder = builder
                    .dns_resolver(std::sync::Arc::new(GuardedResolver))
                    .no_proxy();
                Guard::AtConnect
            }
        };
        Ok(Self {
            client: builder.build()?,
            guard,
        })
    }

    /// POSTs `body` (the event's data as JSON) to the destination, signed with its secrets
    /// valid at `now`.
    pub async fn deliver(
        &self,
        destination: &Destination,
        event_id: &EventId,
        body: Vec<u8>,
        now: Timestamp,
        trace: Vec<(HeaderName, HeaderValue)>,
    ) -> Delivered {
        let timestamp = now.as_micros().div_euclid(1_000_000);
        let signature = sign(
            &destination.signing_secrets(now),
            event_id.as_str(),
            timestamp,
            &body,
        );
        let mut headers = HeaderMap::new();
        for (name, value) in &destination.headers {
            if let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(value),
            ) {
                headers.insert(name, value);
            }
        }
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        if let Ok(v) = HeaderValue::from_str(event_id.as_str()) {
            headers.insert("webhook-id", v);
        }
        headers.insert("webhook-timestamp", HeaderValue::from(timestamp));
        if let Ok(v) = HeaderValue::from_str(&signature) {
            headers.insert("webhook-signature", v);
        }
        // `traceparent` (and `tracestate`) of this attempt's span, outside the signed content.
        for (name, value) in trace {
            headers.insert(name, value);
        }
        let started = Instant::now();
        let refused = match self.guard {
            Guard::Off => None,
            Guard::AtConnect => match reqwest::Url::parse(&destination.url) {
                Ok(url) => check_literal(&url).err().map(|e| e.0),
                Err(err) => Some(format!("the destination URL does not parse: {err}")),
            },
            Guard::BeforeProxy => check_url(&destination.url, false).await.err().map(|e| e.0),
        };
        if let Some(reason) = refused {
            return Delivered {
                code: None,
                success: false,
                body: None,
                error: Some(format!("refused before connecting: {reason}")),
                elapsed: started.elapsed(),
                retry_after: None,
            };
        }
        let sent = self
            .client
            .post(&destination.url)
            .headers(headers)
            .body(body)
            .send()
            .await;
        let mut response = match sent {
            Ok(response) => response,
            Err(err) => {
                return Delivered {
                    code: None,
                    success: false,
                    body: None,
                    error: Some(describe(&err)),
                    elapsed: started.elapsed(),
                    retry_after: None,
                };
            }
        };
        let status = response.status();
        let retry_after = response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(parse_retry_after);
        let error = status.is_redirection().then(|| {
            let location = response
                .headers()
                .get("location")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            format!("redirects are not followed (location {location:?})")
        });
        let mut kept: Vec<u8> = Vec::new();
        let mut read_error = None;
        while kept.len() < MAX_RESPONSE_BODY {
            match response.chunk().await {
                Ok(Some(chunk)) => {
                    let room = MAX_RESPONSE_BODY - kept.len();
                    kept.extend_from_slice(&chunk[..chunk.len().min(room)]);
                }
                Ok(None) => break,
                Err(err) => {
                    read_error = Some(describe(&err));
                    break;
                }
            }
        }
        let text = String::from_utf8_lossy(&kept).into_owned();
        Delivered {
            code: Some(status.as_u16()),
            success: status.is_success(),
            body: (!text.is_empty()).then_some(text),
            error: error.or(if status.is_success() {
                None
            } else {
                read_error
            }),
            elapsed: started.elapsed(),
            retry_after,
        }
    }
}

/// A short reason for a failed request, without the URL (the attempt names the destination).
fn describe(err: &reqwest::Error) -> String {
    if let Some(cause) = sheaf_tls::tls_cause(err) {
        return format!("TLS handshake failed: {cause}");
    }
    let kind = if err.is_timeout() {
        "timed out"
    } else if err.is_connect() {
        "could not connect"
    } else if err.is_body() || err.is_decode() {
        "failed reading the response"
    } else {
        "request failed"
    };
    let mut message = kind.to_owned();
    let mut source = std::error::Error::source(err);
    while let Some(inner) = source {
        message = format!("{message}: {inner}");
        source = inner.source();
    }
    message
}

/// `Retry-After` as delay-seconds or an HTTP date.
pub fn parse_retry_after(value: &str) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let date = chrono::DateTime::parse_from_rfc2822(value).ok()?;
    let delta = date.with_timezone(&chrono::Utc) - chrono::Utc::now();
    Some(delta.to_std().unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signature_matches_the_standard_webhooks_example() {
        // The example of the Standard Webhooks specification.
        let secret = Secret::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let body = br#"{"test": 2432232314}"#;
        let signature = sign(
            &[&secret],
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1_614_265_330,
            body,
        );
        assert_eq!(signature, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }

    #[test]
    fn rotation_signs_with_every_secret() {
        let a = generate_secret();
        let b = generate_secret();
        assert!(a.expose().starts_with("whsec_"));
        let both = sign(&[&a, &b], "evt", 1, b"{}");
        let parts: Vec<&str> = both.split(' ').collect();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0], sign(&[&a], "evt", 1, b"{}"));
        assert_eq!(parts[1], sign(&[&b], "evt", 1, b"{}"));
    }

    #[test]
    fn retry_after_reads_seconds_and_dates() {
        assert_eq!(parse_retry_after("120"), Some(Duration::from_secs(120)));
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT"),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("soon"), None);
    }
}
