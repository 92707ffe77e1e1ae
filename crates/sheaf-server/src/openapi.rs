//! The OpenAPI 3.1 document, generated from the route table ([`crate::api::routes`]) that the
//! router is built from, in plain `serde_json` (no macro crate: the machine has two cores and
//! the table already holds everything the document needs).

use serde_json::{Map, Value, json};

use crate::api::routes;

/// The component schemas the route table names.
fn schemas() -> Value {
    let timestamp = json!({ "type": "string", "format": "date-time" });
    json!({
        "Error": {
            "type": "object",
            "required": ["error"],
            "properties": {
                "error": {
                    "type": "object",
                    "required": ["code", "message"],
                    "properties": {
                        "code": { "type": "string", "examples": ["not_found", "invalid_request", "malformed_json", "payload_too_large", "unauthorized"] },
                        "message": { "type": "string" }
                    }
                }
            }
        },
        "Status": { "type": "object", "properties": { "status": { "type": "string" } } },
        "TenantInput": {
            "type": "object",
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
        "DestinationInput": {
            "type": "object",
            "required": ["type", "topics", "config"],
            "properties": {
                "type": { "const": "webhook" },
                "topics": { "type": "array", "items": { "type": "string" }, "description": "[\"*\"] for every topic" },
                "config": { "type": "object", "required": ["url"], "properties": { "url": { "type": "string", "format": "uri" } } },
                "headers": { "type": "object", "additionalProperties": { "type": "string" } },
                "enabled": { "type": "boolean", "default": true }
            }
        },
        "DestinationPatch": {
            "type": "object",
            "properties": {
                "topics": { "type": "array", "items": { "type": "string" } },
                "config": { "type": "object", "properties": { "url": { "type": "string", "format": "uri" } } },
                "headers": { "type": "object", "additionalProperties": { "type": "string" } },
                "enabled": { "type": "boolean" }
            }
        },
        "Destination": {
            "type": "object",
            "required": ["id", "tenant_id", "type", "topics", "config", "headers", "enabled", "credentials", "created_at", "updated_at"],
            "properties": {
                "id": { "type": "string", "format": "uuid" },
                "tenant_id": { "type": "string" },
                "type": { "const": "webhook" },
                "topics": { "type": "array", "items": { "type": "string" } },
                "config": { "type": "object", "properties": { "url": { "type": "string" } } },
                "headers": { "type": "object", "additionalProperties": { "type": "string" } },
                "enabled": { "type": "boolean" },
                "credentials": {
                    "type": "object",
                    "properties": {
                        "secret": { "type": "string", "description": "whsec_ and base64 of the key" },
                        "previous_secret": {
                            "type": ["object", "null"],
                            "properties": { "secret": { "type": "string" }, "expires_at": timestamp }
                        }
                    }
                },
                "created_at": timestamp,
                "updated_at": timestamp
            }
        },
        "DestinationList": {
            "type": "object",
            "properties": { "items": { "type": "array", "items": { "$ref": "#/components/schemas/Destination" } } }
        },
        "PublishInput": {
            "type": "object",
            "required": ["tenant_id", "topic", "data"],
            "properties": {
                "tenant_id": { "type": "string" },
                "topic": { "type": "string" },
                "data": { "description": "Any JSON; delivered as the webhook body." },
                "id": { "type": "string", "description": "Idempotency key: the same id again never causes a second delivery. Ids starting with `cdc-` are reserved for the CDC source." }
            }
        },
        "Published": {
            "type": "object",
            "properties": { "id": { "type": "string" }, "duplicate": { "type": "boolean" } }
        },
        "Event": {
            "type": "object",
            "properties": {
                "tenant_id": { "type": "string" },
                "id": { "type": "string" },
                "topic": { "type": "string" },
                "time": timestamp,
                "data": {}
            }
        },
        "EventPage": {
            "type": "object",
            "properties": {
                "items": { "type": "array", "items": { "$ref": "#/components/schemas/Event" } },
                "next": { "type": ["string", "null"] }
            }
        },
        "Attempt": {
            "type": "object",
            "properties": {
                "id": { "type": "string", "format": "uuid" },
                "event_id": { "type": "string" },
                "destination_id": { "type": "string", "format": "uuid" },
                "number": { "type": "integer" },
                "time": timestamp,
                "status": { "enum": ["success", "failed"] },
                "trigger": { "enum": ["scheduled", "manual"] },
                "response_code": { "type": ["integer", "null"] },
                "duration_ms": { "type": "integer" },
                "response_body": { "type": ["string", "null"] },
                "error": { "type": ["string", "null"] },
                "topic": { "type": "string" }
            }
        },
        "AttemptPage": {
            "type": "object",
            "properties": {
                "items": { "type": "array", "items": { "$ref": "#/components/schemas/Attempt" } },
                "next": { "type": ["string", "null"] }
            }
        },
        "DeadLetter": {
            "type": "object",
            "properties": {
                "job_id": { "type": "string" },
                "event_id": { "type": "string" },
                "destination_id": { "type": "string" },
                "attempts": { "type": "integer" },
                "last_attempt_time": { "type": ["string", "null"], "format": "date-time" },
                "reason": { "type": "string" },
                "dead_lettered_at": timestamp
            }
        },
        "DeadLetterPage": {
            "type": "object",
            "properties": {
                "items": { "type": "array", "items": { "$ref": "#/components/schemas/DeadLetter" } },
                "next": { "type": ["string", "null"] }
            }
        },
        "RetryInput": {
            "type": "object",
            "required": ["event_id", "destination_id"],
            "properties": { "event_id": { "type": "string" }, "destination_id": { "type": "string" } }
        },
        "RetryQueued": {
            "type": "object",
            "properties": {
                "job_id": { "type": "string" },
                "event_id": { "type": "string" },
                "destination_id": { "type": "string" }
            }
        }
    })
}

/// The `{name}` parameters of a path, in order.
pub fn path_parameters(path: &str) -> Vec<&str> {
    path.split('/')
        .filter_map(|segment| segment.strip_prefix('{')?.strip_suffix('}'))
        .collect()
}

/// The whole document.
pub fn document() -> Value {
    let mut paths = Map::new();
    for route in routes() {
        let mut parameters: Vec<Value> = path_parameters(route.path)
            .into_iter()
            .map(|name| {
                json!({ "name": name, "in": "path", "required": true, "schema": { "type": "string" } })
            })
            .collect();
        for (name, kind, description) in route.query {
            parameters.push(json!({
                "name": name, "in": "query", "required": false,
                "description": description, "schema": { "type": kind }
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
        let mut operation = json!({
            "operationId": route.operation_id,
            "summary": route.summary,
            "tags": [route.tag],
            "parameters": parameters,
            "responses": responses,
        });
        if let Some(schema) = route.request {
            operation["requestBody"] = json!({
                "required": true,
                "content": { "application/json": { "schema": { "$ref": format!("#/components/schemas/{schema}") } } }
            });
        }
        operation["security"] = if route.auth {
            json!([{ "adminKey": [] }])
        } else {
            json!([])
        };
        let entry = paths
            .entry(route.path.to_owned())
            .or_insert_with(|| Value::Object(Map::new()));
        entry[route.method.as_str().to_ascii_lowercase()] = operation;
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Sheaf",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Event delivery: publish events, deliver them as signed webhooks (Standard Webhooks), retry on a schedule. Errors are {\"error\": {\"code\", \"message\"}}."
        },
        "paths": paths,
        "components": {
            "schemas": schemas(),
            "securitySchemes": {
                "adminKey": { "type": "http", "scheme": "bearer", "description": "SHEAF_API_KEY" }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_schema_reference_resolves() {
        let doc = document();
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
