//! The HTTP POST of a webhook, and what its answer means.
//!
//! A 2xx answer is success. Anything else fails the attempt, redirects included: following a
//! redirect would send a signed event to a URL nobody validated, so a 3xx is a failure whose
//! `Location` the operator sees in the attempt's `error`. (Following only redirects that pass
//! the guard was the alternative; receivers that move can update their destination instead,
//! and a policy that is never followed cannot be talked into an internal address.) A 429, or
//! any answer with a `Retry-After`, is [`Verdict::Throttled`]; every other failure is
//! [`Verdict::Retry`]: a receiver's answer says nothing about whether it will take the event
//! later, so webhooks have no permanent failures.
//!
//! While the private-destination guard is on, the client resolves names through
//! [`GuardedResolver`] and ignores the environment's proxies, and IP literals are checked before
//! the request, so the address a delivery connects to is the address that was checked (see
//! `guard.rs`). With a proxy the client connects to the proxy instead, which the operator chose
//! and which may be private; the guard then checks each destination's own name and addresses
//! before the request is handed to the proxy ([`check_url`]).
//!
//! TLS: rustls on ring, trusting the system's roots, the bundled webpki roots and the
//! settings' CA file (a receiver behind a private CA).

use std::time::{Duration, Instant};

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use sheaf_destination::{MAX_RESPONSE_EXCERPT, Message, Report, Verdict};

use crate::guard::{GuardedResolver, check_literal, check_url};
use crate::sign::Signer;
use crate::{SetupError, WebhookSettings};

/// Sends webhooks. One per process: it holds the connection pool.
#[derive(Debug, Clone)]
pub(crate) struct Sender {
    client: reqwest::Client,
    guard: Guard,
    /// Shared by the clones: the Ed25519 key pairs read so far.
    signer: std::sync::Arc<Signer>,
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
    /// A sender whose requests give up after the settings' timeout, through their proxy if
    /// set, trusting their CA file besides the system's and the bundled roots. Unless private
    /// destinations are allowed, it delivers only to public addresses.
    pub(crate) fn new(settings: &WebhookSettings) -> Result<Self, SetupError> {
        let timeout = settings.timeout;
        let mut builder = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("sheaf/", env!("CARGO_PKG_VERSION")));
        if let Some(path) = &settings.ca_file {
            let certificates = sheaf_tls::load_certificates(path)
                .map_err(|e| SetupError::CaFile(e.to_string()))?;
            for certificate in certificates {
                builder = builder.add_root_certificate(
                    reqwest::Certificate::from_der(&certificate)
                        .map_err(|e| SetupError::CaFile(e.to_string()))?,
                );
            }
        }
        let guard = match (&settings.proxy, settings.allow_private) {
            (Some(proxy), allow_private) => {
                builder = builder.no_proxy().proxy(
                    reqwest::Proxy::all(proxy.clone())
                        .map_err(|e| SetupError::Proxy(e.to_string()))?,
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
            client: builder
                .build()
                .map_err(|e| SetupError::Client(e.to_string()))?,
            guard,
            signer: std::sync::Arc::default(),
        })
    }

    /// POSTs the message's payload to `url`, signed with its secrets.
    pub(crate) async fn deliver(&self, url: &str, message: &Message<'_>) -> Report {
        let timestamp = message.timestamp.as_micros().div_euclid(1_000_000);
        let signature = self.signer.sign(
            message.secrets,
            message.event_id.as_str(),
            timestamp,
            message.payload,
        );
        let mut headers = HeaderMap::new();
        for (name, value) in message.headers {
            if let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(value),
            ) {
                headers.insert(name, value);
            }
        }
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        if let Ok(v) = HeaderValue::from_str(message.event_id.as_str()) {
            headers.insert("webhook-id", v);
        }
        headers.insert("webhook-timestamp", HeaderValue::from(timestamp));
        if let Ok(v) = HeaderValue::from_str(&signature) {
            headers.insert("webhook-signature", v);
        }
        // `traceparent` (and `tracestate`) of this attempt's span, outside the signed content.
        for (name, value) in message.trace {
            if let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(value),
            ) {
                headers.insert(name, value);
            }
        }
        let started = Instant::now();
        let refused = match self.guard {
            Guard::Off => None,
            Guard::AtConnect => match reqwest::Url::parse(url) {
                Ok(url) => check_literal(&url).err().map(|e| e.0),
                Err(err) => Some(format!("the destination URL does not parse: {err}")),
            },
            Guard::BeforeProxy => check_url(url, false).await.err().map(|e| e.0),
        };
        if let Some(reason) = refused {
            return Report::retry(
                format!("refused before connecting: {reason}"),
                started.elapsed(),
            );
        }
        let sent = self
            .client
            .post(url)
            .headers(headers)
            .body(message.payload.to_vec())
            .send()
            .await;
        let mut response = match sent {
            Ok(response) => response,
            Err(err) => return Report::retry(describe(&err), started.elapsed()),
        };
        let status = response.status();
        let retry_after = response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(parse_retry_after);
        let redirect = status.is_redirection().then(|| {
            let location = response
                .headers()
                .get("location")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            format!("redirects are not followed (location {location:?})")
        });
        let mut kept: Vec<u8> = Vec::new();
        let mut read_error = None;
        while kept.len() < MAX_RESPONSE_EXCERPT {
            match response.chunk().await {
                Ok(Some(chunk)) => {
                    let room = MAX_RESPONSE_EXCERPT - kept.len();
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
        let verdict = if status.is_success() {
            Verdict::Delivered
        } else if status.as_u16() == 429 || retry_after.is_some() {
            Verdict::Throttled { after: retry_after }
        } else {
            Verdict::Retry { after: None }
        };
        Report {
            verdict,
            code: Some(status.as_u16()),
            response: (!text.is_empty()).then_some(text),
            error: if status.is_success() {
                None
            } else {
                redirect.or(read_error)
            },
            elapsed: started.elapsed(),
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
    fn retry_after_reads_seconds_and_dates() {
        assert_eq!(parse_retry_after("120"), Some(Duration::from_secs(120)));
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT"),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("soon"), None);
    }
}
