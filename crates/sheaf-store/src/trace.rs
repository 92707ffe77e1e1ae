//! [`TraceContext`]: the W3C trace context of the publish that made an event, stored with it.
//!
//! A delivery runs long after its publish, maybe in another process or after a restart, and a
//! retry hours later. Stored with the event (and carried in its attempts, as their topic and
//! data are), the publish's `traceparent` reaches every delivery the same way its payload does,
//! so each delivery's span can join the publish's trace. An untraced event has none: the field
//! is an `Option` that stays `None`, and a traced one shares one allocation between the event,
//! its attempts and every lookup that returns them.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// Longest accepted `traceparent`, in bytes. Version `00` is 55; later versions may append
/// fields, so there is room for them.
pub const MAX_TRACEPARENT_LEN: usize = 256;

/// Longest accepted `tracestate`, in bytes: the 512 characters W3C asks every vendor to pass on.
/// A longer one is not stored (the service keeps the `traceparent` alone).
pub const MAX_TRACESTATE_LEN: usize = 512;

/// A publish's W3C trace context: its `traceparent` and, when it has one, its `tracestate`,
/// as the headers carry them.
///
/// Both are checked when made (not empty, bounded, visible ASCII; the `tracestate` may hold
/// spaces), so every backend stores them as they are: a stored context reads back equal. Cloning
/// is a reference count increment.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct TraceContext(Arc<Headers>);

#[derive(PartialEq, Eq, Hash, Serialize, Deserialize)]
struct Headers {
    traceparent: Box<str>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tracestate: Option<Box<str>>,
}

impl TraceContext {
    /// A context from its header values. An empty `tracestate` is none.
    ///
    /// [`Error::InvalidInput`] when the `traceparent` is empty or either value is longer than
    /// its bound ([`MAX_TRACEPARENT_LEN`], [`MAX_TRACESTATE_LEN`]) or holds a character a header
    /// value of its kind cannot.
    pub fn new(traceparent: &str, tracestate: Option<&str>) -> Result<Self> {
        check("traceparent", traceparent, MAX_TRACEPARENT_LEN, false)?;
        let tracestate = tracestate.filter(|s| !s.is_empty());
        if let Some(state) = tracestate {
            check("tracestate", state, MAX_TRACESTATE_LEN, true)?;
        }
        Ok(TraceContext(Arc::new(Headers {
            traceparent: traceparent.into(),
            tracestate: tracestate.map(Box::from),
        })))
    }

    /// The `traceparent` header's value.
    pub fn traceparent(&self) -> &str {
        &self.0.traceparent
    }

    /// The `tracestate` header's value, if there is one.
    pub fn tracestate(&self) -> Option<&str> {
        self.0.tracestate.as_deref()
    }

    /// The bytes of text it holds, for stores that estimate their footprint.
    pub fn text_len(&self) -> usize {
        self.0.traceparent.len() + self.0.tracestate.as_deref().map_or(0, str::len)
    }
}

fn check(name: &str, value: &str, max: usize, spaces: bool) -> Result<()> {
    if value.is_empty() || value.len() > max {
        return Err(Error::invalid_input(format!(
            "{name} must be 1 to {max} bytes, got {}",
            value.len()
        )));
    }
    let allowed = |b: u8| b.is_ascii_graphic() || (spaces && b == b' ');
    if !value.bytes().all(allowed) {
        return Err(Error::invalid_input(format!(
            "{name} {value:?} holds a character a header value cannot"
        )));
    }
    Ok(())
}

impl fmt::Debug for TraceContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = f.debug_struct("TraceContext");
        out.field("traceparent", &self.traceparent());
        if let Some(state) = self.tracestate() {
            out.field("tracestate", &state);
        }
        out.finish()
    }
}

impl Serialize for TraceContext {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for TraceContext {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let headers = Headers::deserialize(deserializer)?;
        TraceContext::new(&headers.traceparent, headers.tracestate.as_deref())
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARENT: &str = "00-5eaf0000000000000000000000000001-feed000000000001-01";

    #[test]
    fn header_values_are_kept_as_given_and_an_empty_state_is_none() {
        let context = TraceContext::new(PARENT, Some("a=1, b=2")).unwrap();
        assert_eq!(context.traceparent(), PARENT);
        assert_eq!(context.tracestate(), Some("a=1, b=2"));
        assert_eq!(context.text_len(), PARENT.len() + 8);
        assert_eq!(
            TraceContext::new(PARENT, Some("")).unwrap().tracestate(),
            None
        );
        let json = serde_json::to_value(&context).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"traceparent": PARENT, "tracestate": "a=1, b=2"})
        );
        assert_eq!(
            serde_json::from_value::<TraceContext>(json).unwrap(),
            context
        );
    }

    #[test]
    fn values_a_header_cannot_carry_are_refused() {
        for (parent, state) in [
            ("", None),
            ("00 -x", None),
            (PARENT, Some("a=1\n")),
            (&*"f".repeat(MAX_TRACEPARENT_LEN + 1), None),
            (PARENT, Some(&*"s".repeat(MAX_TRACESTATE_LEN + 1))),
        ] {
            let err = TraceContext::new(parent, state).unwrap_err();
            assert_eq!(
                err.kind(),
                crate::ErrorKind::InvalidInput,
                "{parent:?} {state:?}"
            );
        }
        assert!(
            serde_json::from_value::<TraceContext>(serde_json::json!({"traceparent": ""})).is_err()
        );
    }
}
