//! A destination that keeps failing is disabled, and operator events say so, and when it
//! recovers, and which deliveries were dead-lettered, as signed webhooks.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sheaf_testenv::receiver::{Delivery, Failing, Receiver};

use super::{backends, publish};
use crate::support::{Client, start_server};

const OPERATOR_SECRET: &str = "whsec_b3BlcmF0b3Itc2VjcmV0LWZvci10aGUtdGVzdHMtMDE=";

/// The operator events of `kind` the operator receiver got, their bodies parsed.
fn operator_events(operator: &Receiver, kind: &str) -> Vec<(Delivery, Value)> {
    operator
        .deliveries()
        .into_iter()
        .filter(|d| d.status == 200)
        .filter_map(|d| {
            let body: Value = serde_json::from_slice(&d.body).ok()?;
            (body["type"] == kind).then_some((d, body))
        })
        .collect()
}

async fn wait_for_operator_events(
    operator: &Receiver,
    kind: &str,
    count: usize,
) -> Vec<(Delivery, Value)> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let events = operator_events(operator, kind);
        if events.len() >= count {
            return events;
        }
        assert!(
            Instant::now() < deadline,
            "{} {kind} operator events after 60 s, wanted {count}",
            events.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn failing_destinations_are_disabled_and_recover(
    label: &str,
    python: &str,
    mut env: HashMap<String, String>,
) {
    let operator = Receiver::start().await.expect("the receiver binds");
    let receiver = Receiver::builder()
        .failing(Failing::Always)
        .start()
        .await
        .expect("the receiver binds");
    for (k, v) in [
        ("SHEAF_DESTINATION_DISABLE_AFTER_FAILURES", "5"),
        ("SHEAF_OPERATOR_WEBHOOK_URL", operator.url().as_str()),
        ("SHEAF_OPERATOR_WEBHOOK_SECRET", OPERATOR_SECRET),
        ("SHEAF_RETRY_SCHEDULE", "1s"),
        ("SHEAF_RETRY_MAX_ATTEMPTS", "3"),
        ("SHEAF_RETRY_JITTER_PERCENT", "0"),
    ] {
        env.insert(k.to_owned(), v.to_owned());
    }
    let server = start_server(env).await;
    let client = Client::new(server.addr);
    let tenant = "health";
    let destination = client
        .tenant_with_destination(tenant, &receiver.url())
        .await;
    let id = destination["id"].as_str().unwrap().to_owned();
    let path = format!("/api/v1/tenants/{tenant}/destinations/{id}");
    assert_eq!(destination["consecutive_failures"], 0);
    assert_eq!(destination["disabled_reason"], Value::Null);

    // Five events whose first attempts fail: the fifth failure disables the destination.
    for i in 0..5 {
        publish(
            &client,
            tenant,
            &format!("fail-{i}"),
            "order.created",
            &json!({ "i": i }),
        )
        .await;
    }
    let disabled = wait_for_operator_events(&operator, "destination.disabled", 1).await;
    let (delivery, body) = &disabled[0];
    assert!(
        crate::signatures::verifies(python, OPERATOR_SECRET, delivery),
        "{label}: standardwebhooks verifies the operator event"
    );
    assert_eq!(body["tenant_id"], tenant);
    assert_eq!(body["destination_id"], id.as_str());
    assert_eq!(body["enabled"], false);
    assert!(
        body["consecutive_failures"].as_u64().unwrap() >= 5,
        "{body}"
    );
    let read = client.get(&path).await;
    assert_eq!(read.body["enabled"], false, "{label}: {read:?}");
    let reason = &read.body["disabled_reason"];
    assert_eq!(reason["automatic"], true, "{reason}");
    assert!(
        reason["reason"]
            .as_str()
            .unwrap()
            .contains("consecutive failed attempts; the last: status 503"),
        "{reason}"
    );
    // Their retries find the destination disabled: dead-lettered, each an operator event.
    let dead = wait_for_operator_events(&operator, "delivery.dead_lettered", 5).await;
    let dead_ids: HashSet<&str> = dead
        .iter()
        .map(|(_, body)| body["event_id"].as_str().unwrap())
        .collect();
    assert_eq!(dead_ids.len(), 5, "{label}: one per delivery: {dead_ids:?}");
    assert!(
        dead.iter()
            .all(|(d, _)| crate::signatures::verifies(python, OPERATOR_SECRET, d))
    );
    let attempts_while_failing = receiver.deliveries().len();

    // The receiver recovers, an operator enables the destination, and the next success is a
    // recovery.
    receiver.set_failing(false);
    let enabled = client.send("PUT", &format!("{path}/enable"), None).await;
    assert_eq!(enabled.body["enabled"], true);
    assert_eq!(enabled.body["disabled_reason"], Value::Null);
    publish(&client, tenant, "after", "order.created", &json!({})).await;
    let recovered = wait_for_operator_events(&operator, "destination.recovered", 1).await;
    let (delivery, body) = &recovered[0];
    assert!(crate::signatures::verifies(
        python,
        OPERATOR_SECRET,
        delivery
    ));
    assert_eq!(body["destination_id"], id.as_str());
    assert_eq!(body["enabled"], true);
    assert_eq!(body["consecutive_failures"], 0);
    let after: HashSet<String> = ["after".to_owned()].into();
    assert!(receiver.delivers_all(&after, Duration::from_secs(10)).await);
    assert_eq!(
        receiver.deliveries().len(),
        attempts_while_failing + 1,
        "{label}: nothing reached the disabled destination"
    );
    assert_eq!(
        client.metric("sheaf_destinations_disabled_total").await,
        1.0
    );
    assert_eq!(
        client.metric("sheaf_destinations_recovered_total").await,
        1.0
    );
    assert!(client.metric("sheaf_operator_events_total").await >= 7.0);
    let statements = client
        .metric("sheaf_destination_health_statements_total")
        .await;
    assert!(
        statements >= 1.0 && statements <= receiver.deliveries().len() as f64,
        "{label}: {statements} health statements"
    );
    // The operator tenant's own log holds the events, like any tenant's (with a log shipper,
    // once it has shipped them).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let logged = client.get("/api/v1/tenants/_sheaf/events?limit=100").await;
        assert_eq!(logged.status, 200, "{logged:?}");
        let count = logged.body["items"].as_array().unwrap().len();
        if count >= 7 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{label}: {count} operator events in the log"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Only Sheaf writes the operator tenant: a forged operator event, or removing its
    // destination, is refused.
    for (method, path, body) in [
        (
            "POST",
            "/api/v1/publish".to_owned(),
            Some(json!({ "tenant_id": "_sheaf", "topic": "destination.disabled", "data": {} })),
        ),
        ("DELETE", "/api/v1/tenants/_sheaf".to_owned(), None),
        ("PUT", "/api/v1/tenants/_sheaf".to_owned(), None),
    ] {
        let refused = client.send(method, &path, body).await;
        assert_eq!(refused.status, 400, "{method} {path}: {refused:?}");
        assert!(
            refused.body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("reserved for Sheaf's operator events"),
            "{refused:?}"
        );
    }
    let operator_destinations = client.get("/api/v1/tenants/_sheaf/destinations").await;
    let listed = operator_destinations.body["items"].as_array().unwrap();
    assert_eq!(listed.len(), 1, "{operator_destinations:?}");
    let operator_path = format!(
        "/api/v1/tenants/_sheaf/destinations/{}",
        listed[0]["id"].as_str().unwrap()
    );
    let refused = client.send("DELETE", &operator_path, None).await;
    assert_eq!(refused.status, 400, "{refused:?}");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_destinations_are_disabled_and_recover_with_signed_operator_events() {
    let python = sheaf_testenv::require_python!("destination health");
    for (label, env) in backends("destination health") {
        failing_destinations_are_disabled_and_recover(label, &python, env).await;
    }
}
