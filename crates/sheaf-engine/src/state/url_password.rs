//! The password in a destination's `config.url`, whatever the destination's type: a broker URL
//! (`amqp://user:password@host/vhost`, `nats://user:password@host`) or a webhook URL with basic
//! credentials. The engine names no destination type, so the rule is generic: a top-level
//! string `url` whose authority has a non-empty password after `user:` carries a credential.
//!
//! [`crate::state::secrets::SealedEntityStore`] seals that password at rest, and the API shows
//! it as [`REDACTED`]. The URL is edited as text, only between the `:` after the user and the
//! `@`, so everything else (percent-encoding, a vhost's `%2f`, the port) stays byte for byte as
//! the tenant wrote it; the password is kept as written too, percent-encoding included.

use serde_json::Value;

/// What the API shows instead of a password, and what an update sends back to keep the stored
/// one.
pub const REDACTED: &str = "***";

/// The byte range of the password in `url`, if it has a non-empty one.
fn password_range(url: &str) -> Option<std::ops::Range<usize>> {
    let start = url.find("://")? + 3;
    let end = url[start..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |i| start + i);
    let authority = &url[start..end];
    let at = authority.rfind('@')?;
    let colon = authority[..at].find(':')?;
    let range = start + colon + 1..start + at;
    (!range.is_empty()).then_some(range)
}

/// The password of `config.url`, as written (still percent-encoded), if there is one.
pub fn password(config: &Value) -> Option<&str> {
    let url = config.get("url")?.as_str()?;
    password_range(url).map(|range| &url[range])
}

/// `config` with the password of its `url` replaced by `password`; `config` itself when its
/// `url` has none.
pub fn with_password(config: &Value, password: &str) -> Value {
    let Some(url) = config.get("url").and_then(Value::as_str) else {
        return config.clone();
    };
    let Some(range) = password_range(url) else {
        return config.clone();
    };
    let mut replaced = url.to_owned();
    replaced.replace_range(range, password);
    let mut out = config.clone();
    out["url"] = Value::String(replaced);
    out
}

/// `config` as the API shows it: the password of its `url`, if any, as [`REDACTED`].
pub fn redacted(config: &Value) -> Value {
    with_password(config, REDACTED)
}

/// `url` up to the end of its authority with the password left out: its scheme, user, host and
/// port, which must stay the same for [`REDACTED`] to keep a stored password (so a changed host
/// cannot be handed a password its writer never saw).
fn place(url: &str) -> Option<String> {
    let range = password_range(url)?;
    let start = url.find("://")? + 3;
    let end = url[start..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |i| start + i);
    Some(format!("{}{}", &url[..range.start], &url[range.end..end]))
}

/// Why a new `config` that sends [`REDACTED`] back cannot keep the stored password.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeepPasswordError(pub String);

/// A new `config` for a destination whose stored config is `current`: when the new `url`'s
/// password is [`REDACTED`], the stored password is put back, provided the scheme, user, host
/// and port are the same; otherwise the new config is taken as it is.
pub fn keep_redacted_password(
    new: &Value,
    current: Option<&Value>,
) -> Result<Value, KeepPasswordError> {
    if password(new) != Some(REDACTED) {
        return Ok(new.clone());
    }
    let refuse = |why: &str| {
        KeepPasswordError(format!(
            "config.url: the password {REDACTED} stands for the stored one, {why}; send the password itself"
        ))
    };
    let Some(current) = current else {
        return Err(refuse("and a new destination has none"));
    };
    let (Some(stored), Some(new_url), Some(current_url)) = (
        password(current),
        new.get("url").and_then(Value::as_str),
        current.get("url").and_then(Value::as_str),
    ) else {
        return Err(refuse("and this destination's URL has no password"));
    };
    if place(new_url) != place(current_url) {
        return Err(refuse(
            "which is kept only for the same scheme, user, host and port",
        ));
    }
    Ok(with_password(new, stored))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_a_non_empty_password_in_the_authority_counts() {
        for (url, expected) in [
            ("amqp://user:pa%40ss@host:5672/%2f", Some("pa%40ss")),
            ("nats://u:p@127.0.0.1:4222", Some("p")),
            ("https://u:p:q@host/path?x=a:b@c", Some("p:q")),
            ("amqp://user@host/vhost", None),
            ("amqp://user:@host/vhost", None),
            ("https://host/path/user:pass@x", None),
            ("https://host?u:p@x", None),
            ("not a url", None),
        ] {
            assert_eq!(password(&json!({ "url": url })), expected, "{url}");
        }
        assert_eq!(password(&json!({ "url": 7 })), None);
        assert_eq!(password(&json!({ "other": "amqp://u:p@h" })), None);
    }

    #[test]
    fn redaction_changes_the_password_and_nothing_else() {
        let config = json!({ "url": "amqp://guest:s3cret@127.0.0.1:5672/%2f", "exchange": "x" });
        assert_eq!(
            redacted(&config),
            json!({ "url": "amqp://guest:***@127.0.0.1:5672/%2f", "exchange": "x" })
        );
        let plain = json!({ "url": "https://example.com/hook" });
        assert_eq!(redacted(&plain), plain);
    }

    #[test]
    fn the_redacted_form_keeps_the_stored_password_only_for_the_same_place() {
        let current = json!({ "url": "amqp://guest:s3cret@127.0.0.1:5672/%2f", "exchange": "x" });
        let same = json!({ "url": "amqp://guest:***@127.0.0.1:5672/other", "exchange": "y" });
        assert_eq!(
            keep_redacted_password(&same, Some(&current)).unwrap(),
            json!({ "url": "amqp://guest:s3cret@127.0.0.1:5672/other", "exchange": "y" })
        );
        let new_password = json!({ "url": "amqp://guest:n3w@127.0.0.1:5672/%2f" });
        assert_eq!(
            keep_redacted_password(&new_password, Some(&current)).unwrap(),
            new_password
        );
        for elsewhere in [
            "amqp://guest:***@attacker.example:5672/%2f",
            "amqp://admin:***@127.0.0.1:5672/%2f",
            "amqps://guest:***@127.0.0.1:5672/%2f",
            "amqp://guest:***@127.0.0.1:5673/%2f",
        ] {
            let err =
                keep_redacted_password(&json!({ "url": elsewhere }), Some(&current)).unwrap_err();
            assert!(
                err.0.contains("same scheme, user, host and port"),
                "{err:?}"
            );
        }
        let created = keep_redacted_password(&same, None).unwrap_err();
        assert!(created.0.contains("new destination"), "{created:?}");
        let no_password = json!({ "url": "amqp://guest@127.0.0.1:5672/%2f" });
        assert!(keep_redacted_password(&same, Some(&no_password)).is_err());
    }
}
