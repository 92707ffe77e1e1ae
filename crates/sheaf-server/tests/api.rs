//! The HTTP API's edges: authentication, bad input, the private-address guard, the error shape,
//! and the OpenAPI document against the routes the router really serves.

use serde_json::{Value, json};
use sheaf_server::http::routes::routes;

use crate::support::{Client, env_with, start_server};

const KEY: &str = "test-admin-key-0123456789";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_the_right_status_and_the_error_shape() {
    let server = start_server(env_with(&[
        ("SHEAF_API_KEY", KEY),
        ("SHEAF_MAX_BODY_BYTES", "2048"),
    ]))
    .await;
    let anonymous = Client::new(server.addr);
    let wrong = Client::new(server.addr).with_key("not-the-key-at-all-000");
    let admin = Client::new(server.addr).with_key(KEY);

    // 401: missing or wrong key; the open routes stay open.
    let missing = anonymous.send("PUT", "/api/v1/tenants/t1", None).await;
    assert_eq!(missing.status, 401);
    assert_eq!(missing.error_code(), "unauthorized");
    assert_eq!(wrong.get("/api/v1/tenants/t1").await.status, 401);
    assert_eq!(
        wrong
            .send("POST", "/api/v1/publish", Some(json!({})))
            .await
            .status,
        401
    );
    assert_eq!(anonymous.get("/healthz").await.status, 200);
    assert_eq!(anonymous.get("/api/v1/openapi.json").await.status, 200);

    // 404: unknown tenant, on every tenant-scoped read and on publish.
    for path in [
        "/api/v1/tenants/ghost",
        "/api/v1/tenants/ghost/destinations",
        "/api/v1/tenants/ghost/events",
        "/api/v1/tenants/ghost/attempts",
        "/api/v1/tenants/ghost/dead-letters",
    ] {
        let answer = admin.get(path).await;
        assert_eq!(answer.status, 404, "{path}: {answer:?}");
        assert_eq!(answer.error_code(), "not_found");
    }
    let unknown = admin.publish("ghost", "e1", json!({})).await;
    assert_eq!(unknown.status, 404);
    assert!(
        unknown.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("ghost")
    );

    assert_eq!(
        admin.send("PUT", "/api/v1/tenants/t1", None).await.status,
        201
    );
    assert_eq!(
        admin
            .send(
                "PUT",
                "/api/v1/tenants/t1",
                Some(json!({"metadata": {"a": "b"}}))
            )
            .await
            .status,
        200
    );

    // 413: a body over SHEAF_MAX_BODY_BYTES.
    let big = json!({ "tenant_id": "t1", "topic": "x", "data": "a".repeat(10_000) });
    let too_large = admin.send("POST", "/api/v1/publish", Some(big)).await;
    assert_eq!(too_large.status, 413, "{too_large:?}");
    assert_eq!(too_large.error_code(), "payload_too_large");

    // 400: malformed JSON, a body of the wrong shape, invalid ids and topics.
    let malformed = admin
        .send_raw(
            "POST",
            "/api/v1/publish",
            Some(b"{\"tenant_id\": \"t1\",".to_vec()),
        )
        .await;
    assert_eq!(malformed.status, 400);
    assert_eq!(malformed.error_code(), "malformed_json");
    let wrong_shape = admin
        .send("POST", "/api/v1/publish", Some(json!({ "tenant_id": 5 })))
        .await;
    assert_eq!(wrong_shape.status, 400);
    assert_eq!(wrong_shape.error_code(), "invalid_request");
    let bad_topic = admin
        .send(
            "POST",
            "/api/v1/publish",
            Some(json!({ "tenant_id": "t1", "topic": "*", "data": 1 })),
        )
        .await;
    assert_eq!(bad_topic.status, 400);
    let bad_tenant = admin.send("PUT", "/api/v1/tenants/bad%20id", None).await;
    assert_eq!(bad_tenant.status, 400);
    let bad_destination = admin
        .send(
            "POST",
            "/api/v1/tenants/t1/destinations",
            Some(json!({ "type": "carrier-pigeon", "topics": ["*"], "config": { "url": "http://127.0.0.1:1/" } })),
        )
        .await;
    assert_eq!(bad_destination.status, 400);
    let reserved = admin
        .send(
            "POST",
            "/api/v1/tenants/t1/destinations",
            Some(json!({ "type": "webhook", "topics": ["*"], "config": { "url": "http://127.0.0.1:1/" },
                         "headers": { "Webhook-Signature": "forged" } })),
        )
        .await;
    assert_eq!(reserved.status, 400, "{reserved:?}");
    let bad_cursor = admin.get("/api/v1/tenants/t1/events?next=zzz").await;
    assert_eq!(bad_cursor.status, 400);
    let bad_limit = admin.get("/api/v1/tenants/t1/events?limit=5000").await;
    assert_eq!(bad_limit.status, 400);

    // Unknown routes and methods keep the error shape.
    let no_route = admin.get("/api/v1/nothing-here").await;
    assert_eq!(no_route.status, 404);
    assert_eq!(no_route.error_code(), "route_not_found");
    let no_method = admin.send("PATCH", "/api/v1/publish", None).await;
    assert_eq!(no_method.status, 405);
    assert_eq!(no_method.error_code(), "method_not_allowed");

    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_destination_urls_are_refused_unless_allowed() {
    let server = start_server(env_with(&[("SHEAF_ALLOW_PRIVATE_DESTINATIONS", "false")])).await;
    let client = Client::new(server.addr);
    assert_eq!(
        client
            .send("PUT", "/api/v1/tenants/guarded", None)
            .await
            .status,
        201
    );
    // Refused before any request is sent: nothing here is ever contacted.
    for url in [
        "http://127.0.0.1:8080/hook",
        "http://localhost/hook",
        "http://10.0.0.5/hook",
        "http://192.168.1.10/hook",
        "http://169.254.169.254/latest/meta-data",
        "http://[::1]/hook",
        "http://[::ffff:127.0.0.1]/hook",
        "http://0.0.0.0/hook",
        "ftp://example.com/hook",
    ] {
        let answer = client
            .send(
                "POST",
                "/api/v1/tenants/guarded/destinations",
                Some(json!({ "type": "webhook", "topics": ["*"], "config": { "url": url } })),
            )
            .await;
        assert_eq!(answer.status, 400, "{url} must be refused: {answer:?}");
        assert_eq!(answer.error_code(), "invalid_destination_url", "{url}");
    }
    let listed = client.get("/api/v1/tenants/guarded/destinations").await;
    assert_eq!(listed.body["items"], json!([]));
    server.shutdown().await;
}

/// A path with every `{parameter}` filled with a plausible value.
fn concrete(path: &str) -> String {
    path.replace("{tenant_id}", "probe")
        .replace("{destination_id}", "00000000-0000-7000-8000-000000000000")
        .replace("{attempt_id}", "00000000-0000-7000-8000-000000000000")
        .replace("{event_id}", "e")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openapi_document_lists_every_route_the_router_serves() {
    let server = start_server(env_with(&[])).await;
    let client = Client::new(server.addr);
    let doc = client.get("/api/v1/openapi.json").await.body;
    assert_eq!(doc["openapi"], "3.1.0");
    let paths = doc["paths"].as_object().unwrap();

    // The document and the route table agree one to one.
    let mut documented = Vec::new();
    for (path, methods) in paths {
        for method in methods.as_object().unwrap().keys() {
            documented.push((method.to_ascii_uppercase(), path.clone()));
        }
    }
    documented.sort();
    let mut table: Vec<(String, String)> = routes()
        .iter()
        .map(|r| (r.method.as_str().to_owned(), r.path.to_owned()))
        .collect();
    table.sort();
    assert_eq!(documented, table);

    // Every documented operation is served: none falls through to the router's fallbacks.
    for (method, path) in &documented {
        let body: Option<Value> =
            matches!(method.as_str(), "POST" | "PUT" | "PATCH").then(|| json!({}));
        let answer = client.send(method, &concrete(path), body).await;
        assert!(
            !matches!(
                answer.error_code(),
                "route_not_found" | "method_not_allowed"
            ),
            "{method} {path} is documented but not served: {answer:?}"
        );
    }
    // And the router serves nothing undocumented under the API's prefix (spot checks).
    for path in [
        "/api/v1/tenants",
        "/api/v1/events",
        "/api/v1/tenants/probe/deliveries",
    ] {
        assert_eq!(
            client.get(path).await.error_code(),
            "route_not_found",
            "{path}"
        );
    }
    server.shutdown().await;
}
