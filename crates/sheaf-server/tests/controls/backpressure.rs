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
