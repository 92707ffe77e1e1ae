//! Destinations' transformations end to end, on a real receiver: a program reshapes the body
//! (which is what is signed, checked by `standardwebhooks`), adds a header, drops events
//! (recorded as filtered), fails attempts for good with its message, and a runaway program is
//! stopped without stopping the service. The dry run answers what a receiver would get.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sheaf_testenv::receiver::Receiver;

use crate::support::{Client, env_with, start_server};

/// The attempts of `event`, once there are `count` of them (or after 15 s, whatever there is).
async fn attempts(client: &Client, tenant: &str, event: &str, count: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let found = client.attempts_of(tenant, event).await;
        if found.len() >= count || Instant::now() > deadline {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

const PROGRAM: &str = r#"
    if .data.kind == "internal" then empty
    else {order: .data.id, total: (.data.total + 0), event: .id}
         | with_headers({"X-Order-Total": ($event.data.total | tostring)})
    end"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transformation_reshapes_drops_and_fails_deliveries_and_the_signature_covers_its_body() {
    let receiver = Receiver::start().await.expect("the receiver binds");
    let server = start_server(env_with(&[])).await;
    let client = Client::new(server.addr);
    let destination = client
        .tenant_with_destination("shaped", &receiver.url())
        .await;
    let id = destination["id"].as_str().unwrap().to_owned();
    assert_eq!(destination["transform"], Value::Null);
    let path = format!("/api/v1/tenants/shaped/destinations/{id}");

    // A program that does not compile is refused where it is wrong; nothing changes.
    let broken = client
        .send(
            "PATCH",
            &path,
            Some(json!({ "transform": "{order: .data.id" })),
        )
        .await;
    assert_eq!(broken.status, 400, "{broken:?}");
    assert_eq!(broken.error_code(), "invalid_transform");
    let message = broken.body["error"]["message"].as_str().unwrap();
    assert!(message.contains("line 1, column 17"), "{message}");
    let undefined = client
        .send(
            "PATCH",
            &path,
            Some(json!({ "transform": "env.SHEAF_SECRETS_KEY" })),
        )
        .await;
    assert_eq!(undefined.status, 400, "env is not offered: {undefined:?}");
    let nul = client
        .send("PATCH", &path, Some(json!({ "transform": ".\u{0}" })))
        .await;
    assert_eq!(nul.status, 400, "{nul:?}");

    let patched = client
        .send("PATCH", &path, Some(json!({ "transform": PROGRAM })))
        .await;
    assert_eq!(patched.status, 200, "{patched:?}");
    assert_eq!(patched.body["transform"], PROGRAM);
    let secret = patched.body["credentials"]["secret"]
        .as_str()
        .unwrap()
        .to_owned();

    let order = json!({ "id": "ord_7", "total": 250, "card": "4242", "kind": "sale" });
    assert_eq!(client.publish("shaped", "t-sent", order).await.status, 202);
    let internal = json!({ "id": "ord_8", "total": 1, "kind": "internal" });
    assert_eq!(
        client.publish("shaped", "t-dropped", internal).await.status,
        202
    );
    // `.data.total + 0` of an object fails at run time: `total` is not what the program expects.
    let odd = json!({ "id": "ord_9", "total": {"cents": 100}, "kind": "sale" });
    assert_eq!(client.publish("shaped", "t-odd", odd).await.status, 202);

    let sent = attempts(&client, "shaped", "t-sent", 1).await;
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0]["status"], "success");
    let delivery = receiver
        .deliveries()
        .into_iter()
        .find(|d| d.id == "t-sent")
        .expect("delivered");
    assert_eq!(
        serde_json::from_slice::<Value>(&delivery.body).unwrap(),
        json!({ "order": "ord_7", "total": 250, "event": "t-sent" }),
        "the receiver gets the program's body: the card number never leaves"
    );
    assert_eq!(delivery.header("x-order-total"), "250");
    assert!(
        delivery.verifies(&secret),
        "the signature covers the transformed body"
    );
    // And a library that is not Sheaf's agrees, where xtask's Python environment is at hand.
    if let Ok(python) = std::env::var("SHEAF_TEST_PYTHON") {
        assert!(crate::signatures::verifies(&python, &secret, &delivery));
    }

    let dropped = attempts(&client, "shaped", "t-dropped", 1).await;
    assert_eq!(dropped.len(), 1, "{dropped:?}");
    assert_eq!(dropped[0]["status"], "filtered");
    assert!(
        !receiver.delivered_ids().contains("t-dropped"),
        "a filtered event is not sent"
    );

    let failed = attempts(&client, "shaped", "t-odd", 1).await;
    assert_eq!(
        failed.len(),
        1,
        "one attempt: a program's failure is not retried"
    );
    assert_eq!(failed[0]["status"], "failed");
    let error = failed[0]["error"].as_str().unwrap_or_default();
    assert!(error.contains("cannot"), "the program's message: {error}");
    let dead = client
        .every_item("/api/v1/tenants/shaped/dead-letters")
        .await;
    assert!(
        dead.iter().any(|d| d["event_id"] == "t-odd"),
        "dead-lettered at once: {dead:?}"
    );

    let stats = client.get("/api/v1/tenants/shaped/stats/attempts").await;
    assert_eq!(stats.status, 200, "{stats:?}");
    let buckets = stats.body["buckets"].as_array().unwrap();
    let sum = |field: &str| {
        buckets
            .iter()
            .map(|b| b[field].as_u64().unwrap())
            .sum::<u64>()
    };
    assert_eq!((sum("success"), sum("failed"), sum("filtered")), (1, 1, 1));

    // Removed: the event goes as published again.
    let cleared = client
        .send("PATCH", &path, Some(json!({ "transform": null })))
        .await;
    assert_eq!(cleared.body["transform"], Value::Null);
    let plain = json!({ "id": "ord_10", "kind": "internal" });
    assert_eq!(
        client
            .publish("shaped", "t-plain", plain.clone())
            .await
            .status,
        202
    );
    assert_eq!(
        attempts(&client, "shaped", "t-plain", 1).await[0]["status"],
        "success"
    );
    let delivery = receiver
        .deliveries()
        .into_iter()
        .find(|d| d.id == "t-plain")
        .expect("delivered");
    assert_eq!(
        serde_json::from_slice::<Value>(&delivery.body).unwrap(),
        plain
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runaway_or_crashing_transformation_costs_its_attempt_not_the_service() {
    let receiver = Receiver::start().await.expect("the receiver binds");
    let server = start_server(env_with(&[])).await;
    let client = Client::new(server.addr);
    let loops = client
        .tenant_with_destination("runaway", &receiver.url())
        .await;
    let path = format!(
        "/api/v1/tenants/runaway/destinations/{}",
        loops["id"].as_str().unwrap()
    );
    let forever = client
        .send("PATCH", &path, Some(json!({ "transform": "def f: f; f" })))
        .await;
    assert_eq!(forever.status, 200, "compiling runs nothing: {forever:?}");
    let started = Instant::now();
    assert_eq!(
        client.publish("runaway", "r-1", json!({})).await.status,
        202
    );
    let first = attempts(&client, "runaway", "r-1", 1).await;
    assert_eq!(first[0]["status"], "failed");
    let error = first[0]["error"].as_str().unwrap_or_default();
    assert!(error.contains("ran past"), "{error}");
    assert!(started.elapsed() < Duration::from_secs(10));

    // Refused from now on, at once; a program that overflows its runner's stack likewise.
    assert_eq!(
        client.publish("runaway", "r-2", json!({})).await.status,
        202
    );
    let second = attempts(&client, "runaway", "r-2", 1).await;
    assert!(
        second[0]["error"]
            .as_str()
            .unwrap_or_default()
            .contains("not run again"),
        "{second:?}"
    );
    let deep = client
        .send(
            "PATCH",
            &path,
            Some(json!({ "transform": "def f: 1 + f; f" })),
        )
        .await;
    assert_eq!(deep.status, 200);
    assert_eq!(
        client.publish("runaway", "r-3", json!({})).await.status,
        202
    );
    let crashed = attempts(&client, "runaway", "r-3", 1).await;
    let error = crashed[0]["error"].as_str().unwrap_or_default();
    assert!(error.contains("crashed"), "{error}");

    // The service goes on: a fixed program delivers.
    let fixed = client
        .send(
            "PATCH",
            &path,
            Some(json!({ "transform": "{fixed: true}" })),
        )
        .await;
    assert_eq!(fixed.status, 200);
    assert_eq!(
        client.publish("runaway", "r-4", json!({})).await.status,
        202
    );
    assert_eq!(
        attempts(&client, "runaway", "r-4", 1).await[0]["status"],
        "success"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dry_run_shows_what_a_receiver_would_get() {
    let server = start_server(env_with(&[])).await;
    let client = Client::new(server.addr);
    client
        .tenant_with_destination("dry", "http://127.0.0.1:9/")
        .await;
    let path = "/api/v1/tenants/dry/transformations/try";
    let event =
        json!({ "topic": "order.paid", "data": { "id": "ord_7", "total": 250, "kind": "sale" } });
    let sent = client
        .send(
            "POST",
            path,
            Some(json!({ "transform": PROGRAM, "event": event })),
        )
        .await;
    assert_eq!(sent.status, 200, "{sent:?}");
    assert_eq!(sent.body["result"], "send");
    assert_eq!(
        sent.body["body"],
        json!({ "order": "ord_7", "total": 250, "event": "evt_dry_run" })
    );
    assert_eq!(sent.body["headers"], json!({ "X-Order-Total": "250" }));

    let internal = json!({ "topic": "order.paid", "data": { "kind": "internal" } });
    let dropped = client
        .send(
            "POST",
            path,
            Some(json!({ "transform": PROGRAM, "event": internal })),
        )
        .await;
    assert_eq!(dropped.body["result"], "drop", "{dropped:?}");
    let failed = client
        .send(
            "POST",
            path,
            Some(json!({ "transform": "error(\"no \\(.data.id)\")", "event": event })),
        )
        .await;
    assert_eq!(failed.body["result"], "failed", "{failed:?}");
    assert!(failed.body["error"].as_str().unwrap().contains("no ord_7"));
    let broken = client
        .send(
            "POST",
            path,
            Some(json!({ "transform": ".data |", "event": event })),
        )
        .await;
    assert_eq!(broken.status, 400, "{broken:?}");
    assert_eq!(broken.error_code(), "invalid_transform");

    // On a logged event.
    assert_eq!(
        client
            .publish("dry", "logged-1", json!({ "id": "ord_1", "total": 5 }))
            .await
            .status,
        202
    );
    let logged = client
        .send(
            "POST",
            path,
            Some(json!({ "transform": "{id, topic, order: .data.id}", "event_id": "logged-1" })),
        )
        .await;
    assert_eq!(logged.status, 200, "{logged:?}");
    assert_eq!(
        logged.body["body"],
        json!({ "id": "logged-1", "topic": "order.created", "order": "ord_1" })
    );
    let missing = client
        .send(
            "POST",
            path,
            Some(json!({ "transform": ".", "event_id": "nope" })),
        )
        .await;
    assert_eq!(missing.status, 404, "{missing:?}");
    let both = client
        .send(
            "POST",
            path,
            Some(json!({ "transform": ".", "event_id": "logged-1", "event": event })),
        )
        .await;
    assert_eq!(both.status, 400, "{both:?}");
    server.shutdown().await;
}

#[tokio::test]
async fn a_runner_setting_that_names_no_runner_stops_start_up_naming_it() {
    let env = env_with(&[("SHEAF_TRANSFORM_RUNNER", "cat")]);
    let config = sheaf_server::Config::load(env).expect("the settings themselves are valid");
    let error = match sheaf_server::start(config).await {
        Ok(_) => panic!("a server started with `cat` as its runner"),
        Err(e) => format!("{e:#}"),
    };
    assert!(error.contains("SHEAF_TRANSFORM_RUNNER"), "{error}");
}
