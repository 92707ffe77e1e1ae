//! Fuzz target `publish_body`: arbitrary bytes as the body of `POST /api/v1/publish`.
//!
//! Run with `cargo +nightly fuzz run publish_body -- -dict=dict/publish_body.dict` from `fuzz/`.
//! The target calls the engine's publish body parser (`sheaf_engine::body`, built without any
//! store or destination feature), so it runs exactly the parsing and validation the API runs
//! before it looks at the tenant, without building the service's HTTP stack or database drivers. Any panic (a stack overflow
//! on deep nesting included) is a bug; beyond that the target checks what the rest of the
//! service relies on: an accepted body has ids and a topic that pass the stores' checks again,
//! no `cdc-` id, and `data` that serializes (the webhook body) and parses back.

#![no_main]

use libfuzzer_sys::fuzz_target;

use sheaf_engine::body;

fuzz_target!(|data: &[u8]| {
    match body::parse_publish(data) {
        Ok(publish) => {
            assert!(sheaf_store::TenantId::new(publish.tenant_id.as_str()).is_ok());
            assert!(sheaf_store::validate_topic(&publish.topic).is_ok());
            if let Some(id) = &publish.id {
                assert!(!id.as_str().starts_with(body::CDC_ID_PREFIX));
                assert!(sheaf_store::EventId::new(id.as_str()).is_ok());
            }
            // What a worker sends: the data as JSON, which a receiver must be able to parse.
            let sent = serde_json::to_vec(&publish.data).expect("accepted data serializes");
            let back: serde_json::Value =
                serde_json::from_slice(&sent).expect("the webhook body parses back");
            // Numbers may differ in their last bit (serde_json parses floats fast, not exactly);
            // the shape may not.
            assert_eq!(shape(&back), shape(&publish.data));
        }
        Err(err) => {
            assert!(
                err.code == "malformed_json" || err.code == "invalid_request",
                "unexpected code {}",
                err.code
            );
            assert!(!err.message.is_empty());
        }
    }
});

/// The value with every number replaced by 0: its structure, keys and strings.
fn shape(value: &serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::Number(_) => Value::from(0),
        Value::Array(items) => Value::Array(items.iter().map(shape).collect()),
        Value::Object(map) => {
            Value::Object(map.iter().map(|(k, v)| (k.clone(), shape(v))).collect())
        }
        other => other.clone(),
    }
}
