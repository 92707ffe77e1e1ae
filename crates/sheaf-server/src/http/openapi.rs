//! The OpenAPI 3.1 document, generated from the route table
//! ([`crate::http::routes::routes`]) that the router is built from, in plain `serde_json` (no macro crate: the machine has two cores and
//! the table already holds everything the document needs).
//!
//! Longer than 600 lines because the component schemas are one literal, read best whole beside
//! the function that places them, and each is a few lines of JSON.
//!
//! The input schemas are meant to be usable by a generator such as schemathesis (which runs
//! against this document in the test suite): every id, topic and URL has the pattern the server
//! checks, request bodies refuse unknown properties as the server does, and every error status a
//! route can answer is listed. Where JSON Schema cannot say exactly what the server accepts
//! (topics are limited in bytes, not characters; cursors are opaque), the schema describes a
//! subset, so a request that follows the document is never refused for its shape. The error
//! statuses that follow from a route's shape (`400`, `401`, `403`, `404`, `413`, `503`) are
//! added here from its [`Access`] and parameters, so they cannot drift from the router.

use serde_json::{Map, Value, json};

use crate::http::auth::Access;
use crate::http::limits::{MAX_CUSTOM_HEADERS, MAX_TOPICS};
use crate::http::routes::routes;
use crate::settings::Config;
use sheaf_destination::Registry;
use sheaf_destination::signing::SigningAlgorithm;

/// A tenant id as the server accepts it (`sheaf_store::TenantId`, without `.` and `..`, which
/// cannot be path segments).
fn tenant_id_schema() -> Value {
    json!({ "type": "string", "pattern": "^[A-Za-z0-9._-]{1,64}$", "not": { "enum": [".", ".."] } })
}

/// An event id (`sheaf_store::EventId`).
fn event_id_schema() -> Value {
    json!({ "type": "string", "pattern": "^[A-Za-z0-9._:~@+=-]{1,255}$" })
}

/// A topic: the server takes 1 to 255 bytes without control characters, other than `*`; the
/// schema says printable ASCII, which keeps the byte count equal to the length it can state.
fn topic_schema() -> Value {
    json!({ "type": "string", "pattern": "^[\\x20-\\x7e]{1,255}$", "not": { "const": "*" } })
}

fn uuid_schema() -> Value {
    json!({ "type": "string", "format": "uuid" })
}

/// Custom headers: valid names other than the ones the type reserves (in any case), printable
/// values.
fn headers_schema(reserved: &[&str]) -> Value {
    let reserved: Vec<String> = reserved
        .iter()
        .map(|name| {
            name.chars()
                .map(|c| {
                    if c.is_ascii_alphabetic() {
                        format!("[{}{}]", c.to_ascii_lowercase(), c.to_ascii_uppercase())
                    } else {
                        c.to_string()
                    }
                })
                .collect()
        })
        .collect();
    let mut names = json!({ "pattern": "^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,64}$" });
    if !reserved.is_empty() {
        names["not"] = json!({ "pattern": format!("^(?:{})$", reserved.join("|")) });
    }
    json!({
        "type": "object",
        "maxProperties": MAX_CUSTOM_HEADERS,
        "propertyNames": names,
        "additionalProperties": { "type": "string", "pattern": "^[\\t\\x20-\\x7e]{0,1024}$" },
        "description": "Sent with every delivery (as HTTP headers, AMQP headers, NATS headers); the names a type sets itself are reserved"
    })
}

fn topics_schema() -> Value {
    json!({
        "anyOf": [
            { "type": "array", "items": { "const": "*" }, "minItems": 1, "maxItems": 1 },
            { "type": "array", "items": topic_schema(), "minItems": 1, "maxItems": MAX_TOPICS }
        ],
        "description": "[\"*\"] for every topic, or the topics"
    })
}

/// The payload filter language (`sheaf_store::filter`) as JSON Schema, one component per kind of
/// condition: what the document accepts, the service accepts (up to its depth and size limits,
/// which JSON Schema cannot count). Topic conditions are the value ones without field objects.
fn filter_schemas() -> Vec<(&'static str, Value)> {
    let reference = |name: &str| json!({ "$ref": format!("#/components/schemas/{name}") });
    let literal = json!({ "type": ["string", "number", "boolean", "null", "array"] });
    let ordered = json!({ "type": ["string", "number"] });
    let listed = json!({ "type": "array", "maxItems": sheaf_store::filter::MAX_LIST });
    let operators = |condition: &str| {
        let conditions = json!({ "type": "array", "minItems": 1, "items": reference(condition) });
        json!({
            "type": "object",
            "minProperties": 1,
            "additionalProperties": false,
            "properties": {
                "$eq": {}, "$neq": {},
                "$gt": ordered, "$gte": ordered, "$lt": ordered, "$lte": ordered,
                "$in": listed, "$nin": listed,
                "$exists": { "type": "boolean" },
                "$and": conditions, "$or": conditions, "$not": reference(condition)
            }
        })
    };
    let logical = |condition: &str| {
        let conditions = json!({ "type": "array", "minItems": 1, "items": reference(condition) });
        json!({ "$and": conditions, "$or": conditions, "$not": reference(condition) })
    };
    vec![
        (
            "Filter",
            json!({
                "type": "object",
                "minProperties": 1,
                "additionalProperties": false,
                "properties": {
                    "topic": reference("FilterTopicCondition"),
                    "data": reference("FilterCondition"),
                    "$and": { "type": "array", "minItems": 1, "items": reference("Filter") },
                    "$or": { "type": "array", "minItems": 1, "items": reference("Filter") },
                    "$not": reference("Filter")
                },
                "description": "Matched against {\"topic\", \"data\"} of each event; see docs/api.md. At most 32 levels deep and 256 tests in all, each value of $in or $nin counting as one; a list holds at most 100 values."
            }),
        ),
        (
            "FilterCondition",
            json!({ "anyOf": [literal, reference("FilterOperators"), reference("FilterFields")] }),
        ),
        ("FilterOperators", operators("FilterCondition")),
        (
            "FilterFields",
            json!({
                "type": "object",
                "minProperties": 1,
                "additionalProperties": false,
                "patternProperties": { "^(?:[^$]|$)": reference("FilterCondition") },
                "properties": logical("FilterCondition")
            }),
        ),
        (
            "FilterTopicCondition",
            json!({ "anyOf": [literal, reference("FilterTopicOperators")] }),
        ),
        ("FilterTopicOperators", operators("FilterTopicCondition")),
    ]
}

/// The component schemas the route table names.
/// One object schema per destination type, each with its `type` and its `config`: a request
/// is exactly one of them.
fn destination_input(destinations: &Registry) -> Value {
    let reserved = destinations.reserved_headers();
    let one = |kind: &std::sync::Arc<dyn sheaf_destination::DestinationType>| {
        json!({
            "type": "object",
            "title": kind.name(),
            "required": ["type", "topics", "config"],
            "additionalProperties": false,
            "properties": {
                "type": { "const": kind.name() },
                "topics": topics_schema(),
                "filter": { "anyOf": [{ "$ref": "#/components/schemas/Filter" }, { "type": "null" }] },
                "rate_limit": { "anyOf": [{ "type": "object", "required": ["per_second"], "additionalProperties": false, "properties": { "per_second": { "type": "integer", "minimum": 1, "maximum": 10000 } } }, { "type": "null" }], "description": "Deliveries started per second, across every process" },
                "config": kind.config_schema(),
                "headers": headers_schema(&reserved),
                "enabled": { "type": "boolean", "default": true },
                "signing": signing_schema("How deliveries are signed; absent: hmac-sha256"),
                "transform": transform_schema("A jq program that maps each event to the body sent; absent or null: the event's data as published"),
                "ordering": ordering_schema("Deliveries of events with the same key go one at a time, in the order they were accepted; absent or null: in parallel")
            }
        })
    };
    json!({ "oneOf": destinations.iter().map(one).collect::<Vec<_>>() })
}

/// A destination's `ordering`: `{"key": "<JSON pointer>"}`, or null.
fn ordering_schema(description: &str) -> Value {
    json!({
        "anyOf": [{
            "type": "object",
            "required": ["key"],
            "additionalProperties": false,
            "properties": { "key": {
                "type": "string",
                "maxLength": sheaf_store::MAX_ORDER_KEY_LEN,
                "pattern": "^(/id|/topic|/data(/([^~]|~[01])*)*)$",
                "description": "A JSON pointer into the event {id, topic, data}, like /data/order_id: its value is the event's order key (a string as it is, another value as its JSON text; missing or null: the event goes unordered)"
            }, "on_dead_letter": {
                "type": "string",
                "enum": ["skip", "block"],
                "default": "skip",
                "description": "What a dead letter does to the later events of its key: skip (they go on without it, and its last attempt says so) or block (they wait until it is retried or discarded)"
            } }
        }, { "type": "null" }],
        "description": description
    })
}

/// A destination's `transform`: a jq program, or null.
fn transform_schema(description: &str) -> Value {
    json!({
        "type": ["string", "null"],
        "maxLength": sheaf_transform::MAX_SOURCE_BYTES,
        "description": description
    })
}

/// `{"algorithm": …}` of a destination's input.
fn signing_schema(description: &str) -> Value {
    let words: Vec<&str> = SigningAlgorithm::ALL.iter().map(|(w, _)| *w).collect();
    json!({
        "type": "object",
        "required": ["algorithm"],
        "additionalProperties": false,
        "properties": { "algorithm": { "enum": words } },
        "description": description
    })
}

/// The properties of one signing key as a destination shows it (an HMAC secret itself, an
/// Ed25519 key by its public half), and `extra` besides.
fn signing_key_properties(extra: (&str, Value)) -> Map<String, Value> {
    let words: Vec<&str> = SigningAlgorithm::ALL.iter().map(|(w, _)| *w).collect();
    let mut properties = Map::new();
    properties.insert("algorithm".to_owned(), json!({ "enum": words }));
    properties.insert("secret".to_owned(), json!({ "type": ["string", "null"], "description": "hmac-sha256: whsec_ and the base64 of the key, which the receiver verifies with; ed25519: null (the private key never leaves Sheaf)" }));
    properties.insert("public_key".to_owned(), json!({ "type": ["string", "null"], "description": "ed25519: whpk_ and the base64 of the public key, which verifies v1a signatures and may be published; hmac-sha256: null" }));
    properties.insert(extra.0.to_owned(), extra.1);
    properties
}

fn schemas(config: &Config, destinations: &Registry) -> Value {
    let timestamp = json!({ "type": "string", "format": "date-time" });
    let nullable_timestamp = json!({ "type": ["string", "null"], "format": "date-time" });
    let page = |item: &str| {
        json!({
            "type": "object",
            "required": ["items", "next"],
            "properties": {
                "items": { "type": "array", "items": { "$ref": format!("#/components/schemas/{item}") } },
                "next": { "type": ["string", "null"] }
            }
        })
    };
    json!({
        "Error": {
            "type": "object",
            "required": ["error"],
            "additionalProperties": false,
            "properties": {
                "error": {
                    "type": "object",
                    "required": ["code", "message"],
                    "additionalProperties": false,
                    "properties": {
                        "code": { "type": "string", "examples": ["not_found", "invalid_request", "malformed_json", "payload_too_large", "unauthorized", "forbidden"] },
                        "message": { "type": "string" }
                    }
                }
            }
        },
        "Status": { "type": "object", "required": ["status"], "properties": { "status": { "type": "string" } } },
        "TenantInput": {
            "type": "object",
            "additionalProperties": false,
            "properties": { "metadata": { "type": "object", "additionalProperties": { "type": "string" } } }
        },
        "Tenant": {
            "type": "object",
            "required": ["id", "metadata", "created_at", "updated_at"],
            "properties": {
                "id": { "type": "string" },
                "metadata": { "type": "object", "additionalProperties": { "type": "string" } },
                "created_at": timestamp,
                "updated_at": timestamp
            }
        },
        "TokenInput": {
            "type": "object",
            "additionalProperties": false,
            "properties": {
                "ttl_seconds": {
                    "type": "integer",
                    "minimum": 60,
                    "maximum": config.token_max_ttl.as_secs(),
                    "default": 3600,
                    "description": "Lifetime of the token; at most SHEAF_TOKEN_MAX_TTL"
                }
            }
        },
        "TenantToken": {
            "type": "object",
            "required": ["token", "id", "tenant_id", "issued_at", "expires_at"],
            "properties": {
                "token": { "type": "string", "description": "Send as Authorization: Bearer <token>; it reaches this tenant only" },
                "id": uuid_schema(),
                "tenant_id": { "type": "string" },
                "issued_at": timestamp,
                "expires_at": timestamp
            }
        },
        "PortalLink": {
            "type": "object",
            "required": ["url", "token", "tenant_id", "expires_at"],
            "properties": {
                "url": { "type": "string", "description": "The portal, signed in as the tenant: the token rides in the fragment, which browsers never send" },
                "token": { "type": "string" },
                "tenant_id": { "type": "string" },
                "expires_at": timestamp
            }
        },
        "AttemptStats": {
            "type": "object",
            "required": ["from", "to", "bucket_seconds", "buckets"],
            "properties": {
                "from": timestamp, "to": timestamp, "bucket_seconds": { "type": "integer" },
                "buckets": { "type": "array", "items": { "type": "object", "required": ["start", "success", "failed", "filtered"],
                    "properties": { "start": timestamp, "success": { "type": "integer" }, "failed": { "type": "integer" }, "filtered": { "type": "integer" } } } }
            }
        },
        "DestinationInput": destination_input(destinations),
        "TryTransformation": {
            "type": "object",
            "required": ["transform"],
            "additionalProperties": false,
            "properties": {
                "transform": transform_schema("The program to try"),
                "event": {
                    "type": "object",
                    "required": ["topic", "data"],
                    "additionalProperties": false,
                    "properties": {
                        "id": { "type": "string" },
                        "topic": { "type": "string" },
                        "data": {}
                    },
                    "description": "An event to try it on (give this or event_id)"
                },
                "event_id": { "type": "string", "description": "A logged event of the tenant to try it on (give this or event)" }
            }
        },
        "TransformationResult": {
            "type": "object",
            "required": ["result", "body", "headers", "error"],
            "properties": {
                "result": { "enum": ["send", "drop", "failed"], "description": "send: the body (and headers) a receiver would get; drop: the event is filtered; failed: the attempt would fail for good, with error" },
                "body": { "description": "The body that would be sent, as JSON; null unless result is send" },
                "headers": { "type": "object", "additionalProperties": { "type": "string" }, "description": "Headers the program adds (with_headers)" },
                "error": { "type": ["string", "null"] }
            }
        },
        "DestinationPatch": {
            "type": "object",
            "additionalProperties": false,
            "properties": {
                "topics": topics_schema(),
                "filter": {
                    "anyOf": [{ "$ref": "#/components/schemas/Filter" }, { "type": "null" }],
                    "description": "A new payload filter, or null for none"
                },
                "rate_limit": { "anyOf": [{ "type": "object", "required": ["per_second"], "additionalProperties": false, "properties": { "per_second": { "type": "integer", "minimum": 1, "maximum": 10000 } } }, { "type": "null" }], "description": "A new rate limit, or null for none" },
                "config": {
                    "anyOf": destinations.iter().map(|k| k.config_schema()).collect::<Vec<_>>(),
                    "description": "Replaces the whole config; it must be one the destination's type takes. A `url` whose password is `***` keeps the stored password (same scheme, user, host and port only)"
                },
                "headers": headers_schema(&destinations.reserved_headers()),
                "enabled": { "type": "boolean" },
                "signing": signing_schema("Another algorithm than the current key's rotates to a fresh key of it (the old one keeps signing for SHEAF_SECRET_ROTATION_GRACE); the same one changes nothing"),
                "transform": transform_schema("A new jq program, or null for none"),
                "ordering": ordering_schema("A new ordering key, or null for none")
            }
        },
        "Destination": {
            "type": "object",
            "required": ["id", "tenant_id", "type", "topics", "filter", "rate_limit", "config", "headers", "transform", "ordering", "enabled", "disabled_reason", "consecutive_failures", "credentials", "created_at", "updated_at"],
            "properties": {
                "id": uuid_schema(),
                "tenant_id": { "type": "string" },
                "type": { "enum": destinations.names() },
                "topics": { "type": "array", "items": { "type": "string" } },
                "filter": { "type": ["object", "null"], "description": "The payload filter as given, or null" },
                "rate_limit": { "type": ["object", "null"], "properties": { "per_second": { "type": "integer" } } },
                "config": { "type": "object", "description": "As its type defines it (see DestinationInput), with the password of a `url`, if any, shown as `***`" },
                "headers": { "type": "object", "additionalProperties": { "type": "string" } },
                "transform": { "type": ["string", "null"], "description": "The jq program that shapes each delivery, or null" },
                "ordering": { "anyOf": [{ "type": "object", "required": ["key", "on_dead_letter"], "properties": { "key": { "type": "string" }, "on_dead_letter": { "type": "string", "enum": ["skip", "block"] } } }, { "type": "null" }], "description": "The per-key ordering, or null" },
                "enabled": { "type": "boolean" },
                "disabled_reason": {
                    "type": ["object", "null"],
                    "required": ["reason", "since", "automatic"],
                    "properties": {
                        "reason": { "type": "string" },
                        "since": timestamp,
                        "automatic": { "type": "boolean", "description": "Disabled by Sheaf after SHEAF_DESTINATION_DISABLE_AFTER_FAILURES consecutive failed attempts" }
                    }
                },
                "consecutive_failures": { "type": "integer", "minimum": 0 },
                "credentials": {
                    "type": "object",
                    "required": ["algorithm", "secret", "public_key", "previous_secret"],
                    "properties": signing_key_properties(("previous_secret", json!({
                        "type": ["object", "null"],
                        "description": "The key that signs beside the current one until expires_at, after a rotation",
                        "required": ["algorithm", "secret", "public_key", "expires_at"],
                        "properties": signing_key_properties(("expires_at", timestamp.clone()))
                    })))
                },
                "created_at": timestamp,
                "updated_at": timestamp
            }
        },
        "DestinationList": {
            "type": "object",
            "required": ["items"],
            "properties": { "items": { "type": "array", "items": { "$ref": "#/components/schemas/Destination" } } }
        },
        "PublishInput": {
            "type": "object",
            "required": ["tenant_id", "topic", "data"],
            "additionalProperties": false,
            "properties": {
                "tenant_id": tenant_id_schema(),
                "topic": topic_schema(),
                "data": { "description": "Any JSON (at most 128 levels deep); delivered as the webhook body." },
                "id": {
                    "allOf": [event_id_schema(), { "not": { "pattern": "^cdc-" } }],
                    "description": "Idempotency key: the same id again never causes a second delivery. Ids starting with `cdc-` are reserved for the CDC source."
                }
            }
        },
        "Published": {
            "type": "object",
            "required": ["id", "duplicate"],
            "properties": { "id": { "type": "string" }, "duplicate": { "type": "boolean" } }
        },
        "Event": {
            "type": "object",
            "required": ["tenant_id", "id", "topic", "time", "data"],
            "properties": {
                "tenant_id": { "type": "string" },
                "id": { "type": "string" },
                "topic": { "type": "string" },
                "time": timestamp,
                "data": {},
                "trace": {
                    "type": "object",
                    "description": "The W3C trace context of the publish, when it was traced: the trace its deliveries join.",
                    "required": ["traceparent"],
                    "properties": {
                        "traceparent": { "type": "string" },
                        "tracestate": { "type": "string" }
                    }
                }
            }
        },
        "EventPage": page("Event"),
        "Attempt": {
            "type": "object",
            "required": ["id", "event_id", "destination_id", "number", "time", "status", "trigger"],
            "properties": {
                "id": uuid_schema(),
                "event_id": { "type": "string" },
                "destination_id": uuid_schema(),
                "number": { "type": "integer" },
                "time": timestamp,
                "status": { "enum": ["success", "failed", "filtered"] },
                "trigger": { "enum": ["scheduled", "manual"] },
                "response_code": { "type": ["integer", "null"] },
                "duration_ms": { "type": "integer" },
                "response_body": { "type": ["string", "null"] },
                "error": { "type": ["string", "null"] },
                "topic": { "type": "string" }
            }
        },
        "AttemptPage": page("Attempt"),
        "DeadLetter": {
            "type": "object",
            "required": ["job_id", "event_id", "destination_id", "attempts", "reason", "dead_lettered_at", "blocks_key"],
            "properties": {
                "job_id": { "type": "string" },
                "event_id": { "type": "string" },
                "destination_id": { "type": "string" },
                "attempts": { "type": "integer" },
                "last_attempt_time": nullable_timestamp,
                "reason": { "type": "string" },
                "dead_lettered_at": timestamp,
                "blocks_key": { "type": "boolean", "description": "Whether it holds back the later events of its ordering key until it is retried or discarded" }
            }
        },
        "DeadLetterPage": page("DeadLetter"),
        "DeadLetterRequeued": {
            "type": "object",
            "required": ["job_id"],
            "properties": { "job_id": { "type": "string" } }
        },
        "RetryInput": {
            "type": "object",
            "required": ["event_id", "destination_id"],
            "additionalProperties": false,
            "properties": { "event_id": event_id_schema(), "destination_id": uuid_schema() }
        },
        "ReplayInput": {
            "type": "object",
            "required": ["status", "since", "until"],
            "additionalProperties": false,
            "properties": {
                "destination_id": uuid_schema(),
                "topic": topic_schema(),
                "status": { "enum": ["failed", "dead_lettered", "any"] },
                "since": { "type": "string", "format": "date-time", "description": "Inclusive" },
                "until": { "type": "string", "format": "date-time", "description": "Exclusive; at most 7 days after since" }
            }
        },
        "Replay": replay_schema(&timestamp, &nullable_timestamp),
        "RetryQueued": {
            "type": "object",
            "required": ["job_id", "event_id", "destination_id"],
            "properties": {
                "job_id": { "type": "string" },
                "event_id": { "type": "string" },
                "destination_id": { "type": "string" }
            }
        }
    })
}

/// A bulk replay's progress (its own `json!`: the schemas' one is at the macro's recursion limit).
fn replay_schema(timestamp: &Value, nullable_timestamp: &Value) -> Value {
    json!({
        "type": "object",
        "required": ["replay_id", "tenant_id", "request", "state", "pages", "jobs", "dead_letters_removed", "skipped", "limited", "log_store_queries", "queue_queries", "takeovers", "started_at", "updated_at"],
        "properties": {
            "replay_id": uuid_schema(),
            "tenant_id": { "type": "string" },
            "request": { "type": "object" },
            "state": { "enum": ["running", "completed", "failed"] },
            "pages": { "type": "integer" },
            "jobs": { "type": "integer" },
            "dead_letters_removed": { "type": "integer" },
            "skipped": { "type": "integer" },
            "limited": { "type": "boolean" },
            "log_store_queries": { "type": "integer" },
            "queue_queries": { "type": "integer" },
            "error": { "type": ["string", "null"] },
            "takeovers": { "type": "integer", "description": "Times another process resumed it after its owner stopped" },
            "started_at": timestamp,
            "updated_at": timestamp,
            "finished_at": nullable_timestamp
        }
    })
}

/// The `{name}` parameters of a path, in order.
pub fn path_parameters(path: &str) -> Vec<&str> {
    path.split('/')
        .filter_map(|segment| segment.strip_prefix('{')?.strip_suffix('}'))
        .collect()
}

/// The schema of a path parameter, by name.
fn path_parameter_schema(name: &str) -> Value {
    match name {
        "tenant_id" => tenant_id_schema(),
        "event_id" => event_id_schema(),
        // Destination and attempt ids are UUIDs; anything else names nothing (404).
        _ => uuid_schema(),
    }
}

/// The schema of a query parameter, by name (the route table gives its JSON type).
fn query_parameter_schema(name: &str, kind: &str) -> Value {
    match name {
        "limit" => json!({ "type": "integer", "minimum": 1, "maximum": 1000, "default": 100 }),
        // Filters: an empty value filters nothing.
        "status" => json!({ "enum": ["success", "failed", "filtered", ""] }),
        "event_id" => json!({ "type": "string", "pattern": "^[A-Za-z0-9._:~@+=-]{0,255}$" }),
        "destination_id" => json!({ "anyOf": [uuid_schema(), { "const": "" }] }),
        "since" | "until" => json!({ "type": "string", "format": "date-time" }),
        "minutes" => json!({ "type": "integer", "minimum": 1, "maximum": 1440, "default": 60 }),
        // A filter, not a topic: any text, and an empty one filters nothing.
        _ => json!({ "type": kind }),
    }
}

fn error_response(description: &str) -> Value {
    json!({
        "description": description,
        "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } }
    })
}

/// The whole document, for a server running with `config` (it states `SHEAF_TOKEN_MAX_TTL`).
pub fn document(config: &Config, destinations: &Registry) -> Value {
    let mut paths = Map::new();
    for route in routes() {
        let path_params = path_parameters(route.path);
        let mut parameters: Vec<Value> = path_params
            .iter()
            .map(|name| {
                json!({ "name": name, "in": "path", "required": true, "schema": path_parameter_schema(name) })
            })
            .collect();
        for (name, kind, description) in route.query {
            parameters.push(json!({
                "name": name, "in": "query", "required": false,
                "description": description, "schema": query_parameter_schema(name, kind)
            }));
        }
        let mut responses = Map::new();
        for (status, description, schema) in route.responses {
            let mut response = json!({ "description": description });
            if let Some(schema) = schema {
                response["content"] = json!({
                    "application/json": { "schema": { "$ref": format!("#/components/schemas/{schema}") } }
                });
            } else if route.path == "/metrics" {
                response["content"] = json!({ "text/plain": { "schema": { "type": "string" } } });
            }
            responses.insert(status.to_string(), response);
        }
        // The statuses every route of this shape can answer, whatever its handler does.
        let mut implied: Vec<(u16, &str)> = Vec::new();
        if !path_params.is_empty() || route.request.is_some() || !route.query.is_empty() {
            implied.push((
                400,
                "Invalid request: a parameter or the body has the wrong shape or value",
            ));
        }
        if route.request.is_some() {
            implied.push((413, "Body larger than SHEAF_MAX_BODY_BYTES"));
        }
        if route.access != Access::Open {
            implied.push((
                401,
                "Missing or wrong admin key, or an invalid or expired tenant token",
            ));
            implied.push((
                403,
                "A tenant token used on an admin route, or for another tenant",
            ));
        }
        // Every route: a store may be down, and any request can outlast SHEAF_REQUEST_TIMEOUT.
        implied.push((
            503,
            "A store is unavailable, or the request outlasted SHEAF_REQUEST_TIMEOUT; retry",
        ));
        if path_params.contains(&"tenant_id") || route.access == Access::TenantBody {
            implied.push((404, "Unknown tenant or resource"));
        }
        for (status, description) in implied {
            responses
                .entry(status.to_string())
                .or_insert_with(|| error_response(description));
        }
        let mut operation = json!({
            "operationId": route.operation_id,
            "summary": route.summary,
            "tags": [route.tag],
            "parameters": parameters,
            "responses": responses,
        });
        if let Some(schema) = route.request {
            // Bodies that may be left out entirely (upsert a tenant, issue a token) say so.
            let optional = matches!(schema, "TenantInput" | "TokenInput");
            operation["requestBody"] = json!({
                "required": !optional,
                "content": { "application/json": { "schema": { "$ref": format!("#/components/schemas/{schema}") } } }
            });
        }
        operation["security"] = match route.access {
            Access::Open => json!([]),
            Access::Admin => json!([{ "adminKey": [] }]),
            Access::TenantPath | Access::TenantBody => {
                json!([{ "adminKey": [] }, { "tenantToken": [] }])
            }
        };
        let entry = paths
            .entry(route.path.to_owned())
            .or_insert_with(|| Value::Object(Map::new()));
        entry[route.method.as_str().to_ascii_lowercase()] = operation;
    }
    let mut components = schemas(config, destinations);
    for (name, schema) in filter_schemas() {
        components[name] = schema;
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Sheaf",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Event delivery: publish events, deliver them as signed webhooks (Standard Webhooks), retry on a schedule. Errors are {\"error\": {\"code\", \"message\"}}. Request bodies refuse unknown fields."
        },
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {
                "adminKey": { "type": "http", "scheme": "bearer", "description": "SHEAF_API_KEY: every protected route" },
                "tenantToken": { "type": "http", "scheme": "bearer", "description": "A tenant token (POST /api/v1/tenants/{tenant_id}/tokens): that tenant's routes and publishes only" }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_schema_reference_resolves() {
        let config = Config::load(std::collections::HashMap::new()).unwrap();
        let destinations = sheaf_engine::destination_types(&config.engine).unwrap();
        let doc = document(&config, &destinations);
        let text = doc.to_string();
        let schemas = doc["components"]["schemas"].as_object().unwrap();
        for piece in text.split("#/components/schemas/").skip(1) {
            let name: String = piece
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric())
                .collect();
            assert!(
                schemas.contains_key(&name),
                "schema {name} is referenced but not defined"
            );
        }
    }
}
