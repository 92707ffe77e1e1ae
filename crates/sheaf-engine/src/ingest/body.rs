//! Request bodies as pure functions: bytes in, a validated value or a [`BodyError`] out, with no
//! server, store, runtime or clock involved.
//!
//! The publish body is the one strangers send most, so it is fuzzed: the `publish_body` target in
//! `fuzz/` compiles this very file (`#[path]`) rather than linking the whole service, so the
//! fuzzer runs the code the API runs without building axum, reqwest and the database drivers
//! under the sanitizer. That is why this module uses nothing from the rest of the crate: only
//! `serde`, `serde_json` and `sheaf-store`.
//!
//! What the parsing guarantees, whatever the bytes:
//! - Bodies are read as JSON whatever their `Content-Type` says. Bytes that are not JSON,
//!   including invalid UTF-8 anywhere in them, are `malformed_json`.
//! - Nesting is bounded: `serde_json` refuses more than 128 levels of arrays and objects with an
//!   error ("recursion limit exceeded", `malformed_json`), before it recurses further, so ten
//!   thousand `[` are a 400 and never a stack overflow. Nothing else in the service recurses over
//!   a payload deeper than what was accepted here.
//! - Unknown fields are refused, naming the field (`invalid_request`, "unknown field `x`,
//!   expected one of ..."): a misspelt `idempotency_key` must not silently publish without one.
//! - A body that parses has valid ids and topics (the same checks the stores rely on), and a
//!   publisher-chosen id never starts with [`CDC_ID_PREFIX`].

use serde::Deserialize;
use serde::de::DeserializeOwned;
use sheaf_store::{EventId, TenantId, validate_topic};

/// Why a body was refused; the API answers it as a 400 with this code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BodyError {
    /// `malformed_json` (not JSON at all) or `invalid_request` (JSON of the wrong shape or value).
    pub code: &'static str,
    /// What is wrong, for a person.
    pub message: String,
}

impl BodyError {
    fn invalid(message: impl Into<String>) -> Self {
        Self {
            code: "invalid_request",
            message: message.into(),
        }
    }
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for BodyError {}

/// The error of a body that `serde_json` refused.
pub fn json_error(err: &serde_json::Error) -> BodyError {
    let code = if err.is_syntax() || err.is_eof() || err.is_io() {
        "malformed_json"
    } else {
        "invalid_request"
    };
    BodyError {
        code,
        message: format!("request body: {err}"),
    }
}

/// Parses a JSON body into `T`, which the API's bodies all are: a JSON object. Anything else
/// is refused even where serde would take it (a struct also deserializes from an array of its
/// fields, so `[null, null]` would otherwise be an empty patch).
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, BodyError> {
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    if first != Some(&b'{') {
        // Bytes that are not JSON at all keep their `malformed_json`.
        serde_json::from_slice::<serde::de::IgnoredAny>(bytes).map_err(|e| json_error(&e))?;
        return Err(BodyError::invalid("the request body must be a JSON object"));
    }
    serde_json::from_slice(bytes).map_err(|e| json_error(&e))
}

/// The prefix of the event ids the CDC source derives (`cdc-<slot>-<commit LSN>-<position>`).
/// Publishers may not choose ids that start with it, so a CDC event never collides with a
/// published one.
pub const CDC_ID_PREFIX: &str = "cdc-";

/// The body of `POST /api/v1/publish`, as sent.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PublishRequest {
    /// Whose event it is.
    pub tenant_id: String,
    /// What kind of event.
    pub topic: String,
    /// The JSON delivered to destinations.
    pub data: serde_json::Value,
    /// The idempotency key; generated when absent.
    #[serde(default)]
    pub id: Option<String>,
}

/// A publish body that passed every check.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidPublish {
    /// Whose event it is.
    pub tenant_id: TenantId,
    /// What kind of event (checked by `validate_topic`).
    pub topic: String,
    /// The publisher's idempotency key, if it chose one.
    pub id: Option<EventId>,
    /// The JSON delivered to destinations.
    pub data: serde_json::Value,
}

/// A tenant id as the API accepts it: a valid `TenantId` other than `.` and `..`, which a URL
/// path cannot carry (clients and proxies fold them away as dot segments).
pub fn api_tenant_id(raw: String) -> Result<TenantId, BodyError> {
    if raw == "." || raw == ".." {
        return Err(BodyError::invalid(format!(
            "tenant id {raw:?} is not allowed: it cannot be a URL path segment"
        )));
    }
    TenantId::new(raw).map_err(|e| BodyError::invalid(e.to_string()))
}

/// Checks a parsed publish body.
pub fn validate_publish(request: PublishRequest) -> Result<ValidPublish, BodyError> {
    let tenant_id = api_tenant_id(request.tenant_id)?;
    validate_topic(&request.topic).map_err(|e| BodyError::invalid(e.to_string()))?;
    let id = match request.id {
        Some(id) if id.starts_with(CDC_ID_PREFIX) => {
            return Err(BodyError::invalid(format!(
                "event ids starting with {CDC_ID_PREFIX:?} are reserved for the CDC source"
            )));
        }
        Some(id) => Some(EventId::new(id).map_err(|e| BodyError::invalid(e.to_string()))?),
        None => None,
    };
    Ok(ValidPublish {
        tenant_id,
        topic: request.topic,
        id,
        data: request.data,
    })
}

/// Parses and checks the bytes of a publish body: exactly what `POST /api/v1/publish` does
/// before it looks at the tenant.
pub fn parse_publish(bytes: &[u8]) -> Result<ValidPublish, BodyError> {
    validate_publish(parse_json(bytes)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_good_body_parses() {
        let p =
            parse_publish(br#"{"tenant_id":"acme","topic":"a.b","data":{"x":[1,2]},"id":"k-1"}"#)
                .unwrap();
        assert_eq!(p.tenant_id.as_str(), "acme");
        assert_eq!(p.id.unwrap().as_str(), "k-1");
        assert_eq!(p.data["x"][1], 2);
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_stack_overflow() {
        for depth in [129, 10_000, 1_000_000] {
            let mut body = br#"{"tenant_id":"a","topic":"t","data":"#.to_vec();
            body.extend(std::iter::repeat_n(b'[', depth));
            body.extend(std::iter::repeat_n(b']', depth));
            body.push(b'}');
            let err = parse_publish(&body).unwrap_err();
            assert_eq!(err.code, "malformed_json", "{depth}: {err}");
            assert!(err.message.contains("recursion limit"), "{err}");
        }
        // 100 levels are fine.
        let mut body = br#"{"tenant_id":"a","topic":"t","data":"#.to_vec();
        body.extend(std::iter::repeat_n(b'[', 100));
        body.extend(std::iter::repeat_n(b']', 100));
        body.push(b'}');
        assert!(parse_publish(&body).is_ok());
    }

    #[test]
    fn bad_bytes_and_bad_values_are_refused_with_their_code() {
        let cases: [(&[u8], &str, &str); 11] = [
            (b"[null, null]", "invalid_request", "JSON object"),
            (b" [1,", "malformed_json", ""),
            (
                br#"{"tenant_id":"..","topic":"t","data":1}"#,
                "invalid_request",
                "path segment",
            ),
            (b"", "malformed_json", "EOF"),
            (b"\xff\xfe", "malformed_json", ""),
            (
                b"{\"tenant_id\":\"a\",\"topic\":\"t\",\"data\":\"\xc3\x28\"}",
                "malformed_json",
                "",
            ),
            (
                br#"{"tenant_id":"a","topic":"t","data":1,"idempotency_key":"x"}"#,
                "invalid_request",
                "unknown field `idempotency_key`",
            ),
            (br#"{"tenant_id":5}"#, "invalid_request", "invalid type"),
            (
                br#"{"tenant_id":"a b","topic":"t","data":1}"#,
                "invalid_request",
                "tenant id",
            ),
            (
                br#"{"tenant_id":"a","topic":"*","data":1}"#,
                "invalid_request",
                "topic filter",
            ),
            (
                br#"{"tenant_id":"a","topic":"t","data":1,"id":"cdc-x"}"#,
                "invalid_request",
                "reserved",
            ),
        ];
        for (bytes, code, text) in cases {
            let err = parse_publish(bytes).unwrap_err();
            assert_eq!(
                err.code,
                code,
                "{:?}: {err}",
                String::from_utf8_lossy(bytes)
            );
            assert!(err.message.contains(text), "{err} lacks {text:?}");
        }
    }
}
