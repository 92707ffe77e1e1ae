//! Nothing accepted is dropped: on the memory backends, while the events accepted and not yet
//! delivered are at `SHEAF_MEMORY_MAX_PENDING_EVENTS`, publishes are refused with `503`,
//! `Retry-After` and a message naming the bound; every event that got a `202` is delivered once
//! the receiver is back, and publishes are taken again as soon as there is room.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use serde_json::json;
use sheaf_testenv::receiver::{Failing, Receiver};

use crate::support::{Client, env_with, start_server};

const BOUND: usize = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_pending_bound_publishes_wait_and_nothing_accepted_is_lost() {
    let receiver = Receiver::builder()
        .failing(Failing::Always)
        .start()
        .await
        .expect("the receiver binds");
    let bound = BOUND.to_string();
    let server = start_server(env_with(&[
        ("SHEAF_MEMORY_MAX_PENDING_EVENTS", bound.as_str()),
        ("SHEAF_RETRY_SCHEDULE", "200ms"),
        ("SHEAF_RETRY_MAX_ATTEMPTS", "100"),
        ("SHEAF_RETRY_JITTER_PERCENT", "0"),
    ]))
    .await;
    let client = Client::new(server.addr);
    client
        .tenant_with_destination("pressure", &receiver.url())
        .await;

    let accepted: HashSet<String> = (0..BOUND).map(|i| format!("p-{i}")).collect();
    for id in &accepted {
        let answer = client.publish("pressure", id, json!({ "id": id })).await;
        assert_eq!(answer.status, 202, "{id} is within the bound: {answer:?}");
    }
    assert_eq!(client.metric("sheaf_pending_events").await, BOUND as f64);
    assert_eq!(
        client.metric("sheaf_pending_events_limit").await,
        BOUND as f64
    );

    // One more is refused at the door, and says why and when to come back.
    let refused = reqwest::Client::new()
        .post(format!("{}/api/v1/publish", client.base))
        .header("content-type", "application/json")
        .body(
            json!({ "tenant_id": "pressure", "topic": "order.created", "data": {}, "id": "late" })
                .to_string(),
        )
        .send()
        .await
        .expect("the publish reaches the server");
    assert_eq!(refused.status(), 503);
    assert_eq!(
        refused
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("1")
    );
    let body: serde_json::Value =
        serde_json::from_slice(&refused.bytes().await.expect("a body")).expect("a JSON error");
    assert_eq!(body["error"]["code"], "overloaded", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("SHEAF_MEMORY_MAX_PENDING_EVENTS=20"),
        "the refusal names the bound: {message}"
    );
    assert!(client.metric("sheaf_publishes_refused_total").await >= 1.0);
    // The receiver has been failing all along: retries came and went, nothing was given up.
    assert!(receiver.deliveries().len() >= BOUND);
    assert!(receiver.delivered_ids().is_empty());

    receiver.set_failing(false);
    assert!(
        receiver
            .delivers_all(&accepted, Duration::from_secs(20))
            .await,
        "every accepted event is delivered once the receiver is back: {} of {BOUND}",
        receiver.delivered_ids().len()
    );
    // Delivered, they no longer count, and the door opens again.
    let deadline = Instant::now() + Duration::from_secs(10);
    while client.metric("sheaf_pending_events").await > 0.0 {
        assert!(Instant::now() < deadline, "the pending count drains to 0");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let again = client.publish("pressure", "late", json!({})).await;
    assert_eq!(again.status, 202, "{again:?}");
    let late: HashSet<String> = ["late".to_owned()].into();
    assert!(receiver.delivers_all(&late, Duration::from_secs(10)).await);
    server.shutdown().await;
}

/// With the Postgres queue and ClickHouse, the bound is on the events waiting in the outbox for
/// the log store. A shipper that moves them once a minute stands in for a ClickHouse that does
/// not take them: past `SHEAF_OUTBOX_MAX_EVENTS` publishes are refused, naming it, while the
/// accepted events are delivered (a delivery needs no log store).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outbox_bound_refuses_publishes_while_the_log_store_lags() {
    let test = "the_outbox_bound_refuses_publishes_while_the_log_store_lags";
    let (Some(postgres), Some(clickhouse)) = (
        sheaf_testenv::postgres_url(test),
        sheaf_testenv::clickhouse_url(test),
    ) else {
        return;
    };
    let receiver = Receiver::start().await.expect("the receiver binds");
    let schema = sheaf_testenv::unique_name("bp");
    let database = sheaf_testenv::unique_name("bp");
    let server = start_server(env_with(&[
        ("SHEAF_QUEUE", "postgres"),
        ("SHEAF_LOG_STORE", "clickhouse"),
        ("SHEAF_POSTGRES_URL", postgres.as_str()),
        ("SHEAF_POSTGRES_SCHEMA", schema.as_str()),
        ("SHEAF_CLICKHOUSE_URL", clickhouse.as_str()),
        ("SHEAF_CLICKHOUSE_DATABASE", database.as_str()),
        ("SHEAF_LOG_SHIP_INTERVAL", "1m"),
        ("SHEAF_OUTBOX_MAX_EVENTS", "5"),
    ]))
    .await;
    let client = Client::new(server.addr);
    client
        .tenant_with_destination("outbox", &receiver.url())
        .await;
    let accepted: HashSet<String> = (0..5).map(|i| format!("o-{i}")).collect();
    for id in &accepted {
        let answer = client.publish("outbox", id, json!({})).await;
        assert_eq!(answer.status, 202, "{answer:?}");
    }
    // The housekeeping task counts the outbox every 2 s; on a loaded machine a round may come
    // late, so the bound on waiting is generous, and a miss says what the process saw.
    let deadline = Instant::now() + Duration::from_secs(30);
    let refused = loop {
        let answer = client.publish("outbox", "o-late", json!({})).await;
        if answer.status == 503 {
            break answer;
        }
        assert_eq!(answer.status, 202, "{answer:?}");
        if Instant::now() >= deadline {
            panic!(
                "never refused: sheaf_pending_events {}, events shipped {}, shipment failures {}",
                client.metric("sheaf_pending_events").await,
                client.metric("sheaf_events_shipped_total").await,
                client.metric("sheaf_shipment_failures_total").await,
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(refused.error_code(), "overloaded");
    let message = refused.body["error"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(message.contains("SHEAF_OUTBOX_MAX_EVENTS=5"), "{message}");
    assert!(client.metric("sheaf_pending_events").await >= 5.0);
    assert_eq!(client.metric("sheaf_pending_events_limit").await, 5.0);
    assert!(
        receiver
            .delivers_all(&accepted, Duration::from_secs(10))
            .await,
        "accepted events are delivered while they wait for the log store"
    );
    server.shutdown().await;
}
