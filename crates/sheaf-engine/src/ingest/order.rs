//! Per-key ordering as a destination asks for it: a JSON pointer into the event, checked when
//! the destination is saved, and read from each event to give its job an order key.

use sha2::Digest as _;
use sheaf_store::{Event, MAX_ORDER_KEY_LEN};

/// The parts of the event a pointer may name.
const ROOTS: [&str; 3] = ["/id", "/topic", "/data"];

/// Checks a destination's ordering pointer: RFC 6901 syntax (`/` before each token, `~` only
/// in `~0` and `~1`), naming `/id`, `/topic`, `/data` or a place inside `/data`, at most 256
/// bytes. The error says what is wrong, for a 400.
pub fn check_ordering_key(pointer: &str) -> Result<(), String> {
    if pointer.len() > MAX_ORDER_KEY_LEN {
        return Err(format!(
            "ordering.key is at most {MAX_ORDER_KEY_LEN} bytes, got {}",
            pointer.len()
        ));
    }
    let rooted = ROOTS
        .iter()
        .any(|root| pointer == *root || (*root == "/data" && pointer.starts_with("/data/")));
    if !rooted {
        return Err(format!(
            "ordering.key must be a JSON pointer to /id, /topic, /data or inside /data (like \"/data/order_id\"), got {pointer:?}"
        ));
    }
    let mut chars = pointer.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '~' && !matches!(chars.next(), Some('0' | '1')) {
            return Err(format!(
                "ordering.key {pointer:?} has a `~` that is not `~0` or `~1` (JSON pointer escapes)"
            ));
        }
    }
    Ok(())
}

/// The order key `pointer` reads from `event`: a string as it is, any other value as its JSON
/// text; `None` when the event has nothing there (or `null`), and the event then goes unordered.
/// A key longer than a queue keeps is replaced by its SHA-256, which orders the same.
pub(crate) fn order_key(event: &Event, pointer: &str) -> Option<String> {
    let value = match pointer {
        "/id" => return Some(event.id.as_str().to_owned()),
        "/topic" => return Some(event.topic.clone()),
        "/data" => event.data.value(),
        inside => event.data.value().pointer(inside.strip_prefix("/data")?)?,
    };
    let key = match value {
        serde_json::Value::Null => return None,
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    if key.len() <= MAX_ORDER_KEY_LEN {
        return Some(key);
    }
    let digest = sha2::Sha256::digest(key.as_bytes());
    Some(format!(
        "sha256:{}",
        digest
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sheaf_store::{EventId, Payload, TenantId, Timestamp};

    fn event(data: serde_json::Value) -> Event {
        Event::new(
            TenantId::new("acme").unwrap(),
            EventId::new("evt_1").unwrap(),
            "order.paid".to_owned(),
            Timestamp::now(),
            Payload::new(data),
        )
    }

    #[test]
    fn pointers_are_checked_and_read() {
        for good in [
            "/id",
            "/topic",
            "/data",
            "/data/order/id",
            "/data/a~1b",
            "/data/0",
        ] {
            assert_eq!(check_ordering_key(good), Ok(()), "{good}");
        }
        for bad in ["", "data/x", "/metadata/x", "/data~", "/data/a~2", "/ids"] {
            assert!(check_ordering_key(bad).is_err(), "{bad}");
        }
        let e = event(
            serde_json::json!({"order": {"id": "ord_7", "n": 12}, "a/b": true, "none": null}),
        );
        assert_eq!(order_key(&e, "/id").as_deref(), Some("evt_1"));
        assert_eq!(order_key(&e, "/topic").as_deref(), Some("order.paid"));
        assert_eq!(order_key(&e, "/data/order/id").as_deref(), Some("ord_7"));
        assert_eq!(order_key(&e, "/data/order/n").as_deref(), Some("12"));
        assert_eq!(order_key(&e, "/data/a~1b").as_deref(), Some("true"));
        assert_eq!(order_key(&e, "/data/none"), None, "null: unordered");
        assert_eq!(order_key(&e, "/data/missing"), None, "missing: unordered");
        let long = event(serde_json::json!({"k": "x".repeat(300)}));
        let key = order_key(&long, "/data/k").unwrap();
        assert!(
            key.starts_with("sha256:") && key.len() <= MAX_ORDER_KEY_LEN,
            "{key}"
        );
    }
}
