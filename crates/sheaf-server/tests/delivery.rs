//! Delivery end to end on the memory backends: an outage and its recovery, idempotent
//! publishing, manual retry, dead letters.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use serde_json::json;
use sheaf_testenv::receiver::{Failing, Receiver};

use crate::support::{Client, env_with, publish_many, start_server};

/// What an outage run measured.
#[derive(Debug)]
pub struct Report {
    pub events: usize,
    pub requests: usize,
    pub duplicates: usize,
    pub retries: f64,
    pub lookup_queries: f64,
    pub lookup_keys: f64,
}

impl Report {
    /// Prints the figures under `label`.
    pub fn print(&self, label: &str) {
        println!(
            "{label}: {} events, {} webhook requests, {} duplicate deliveries, {} retries, {} retry lookup queries for {} lookups",
            self.events,
            self.requests,
            self.duplicates,
            self.retries,
            self.lookup_queries,
            self.lookup_keys
        );
    }
}

/// The retry settings every outage run uses: short delays so the run ends well within a
/// minute, enough attempts to outlast the receiver's 3 s of 503s.
pub const OUTAGE_SETTINGS: [(&str, &str); 4] = [
    ("SHEAF_RETRY_SCHEDULE", "1s,1s,2s"),
    ("SHEAF_RETRY_MAX_ATTEMPTS", "12"),
    ("SHEAF_RETRY_LOOKUP_BATCH_SIZE", "50"),
    ("SHEAF_DELIVERY_WORKERS", "32"),
];

/// Publishes `count` events to a receiver that answers 503 for its first 3 seconds, waits
/// until every event was answered 200 (bounded), checks the attempts API for one event that
/// failed first, and reads the retry figures from `/metrics`.
pub async fn outage_run(env: HashMap<String, String>, tenant: &str, count: usize) -> Report {
    let receiver = Receiver::builder()
        .failing(Failing::ForAfterFirst(Duration::from_secs(3)))
        .start()
        .await
        .expect("the receiver binds");
    let server = start_server(env).await;
    let client = Client::new(server.addr);
    client
        .tenant_with_destination(tenant, &receiver.url())
        .await;

    let ids = publish_many(&client, tenant, "evt", count, 32).await;
    let all_delivered = receiver.delivers_all(&ids, Duration::from_secs(45)).await;
    assert!(
        all_delivered,
        "every event is delivered after the receiver recovers"
    );

    // Every attempt, first or retry, carried the event's own payload.
    let deliveries = receiver.deliveries();
    for d in &deliveries {
        let body: serde_json::Value = serde_json::from_slice(&d.body).expect("a JSON body");
        assert_eq!(
            body,
            json!({ "n": d.id }),
            "the payload delivered for {}",
            d.id
        );
    }
    // An event whose first delivery failed: its attempts show the failures, then the success.
    let failed_first: HashSet<&str> = deliveries
        .iter()
        .filter(|d| d.status == 503)
        .map(|d| d.id.as_str())
        .collect();
    assert!(
        !failed_first.is_empty(),
        "the receiver failed some deliveries"
    );
    let sample = *failed_first.iter().next().unwrap();
    // With an outbox the log store receives attempts behind the deliveries (within about one
    // SHEAF_LOG_SHIP_INTERVAL): wait, boundedly, for the successful one to be searchable.
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let attempts = loop {
        let attempts = client.attempts_of(tenant, sample).await;
        let settled = attempts.first().is_some_and(|a| a["status"] == "success");
        if settled || std::time::Instant::now() > deadline {
            break attempts;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        attempts.len() >= 2,
        "failures and the success are listed: {attempts:?}"
    );
    assert_eq!(
        attempts[0]["status"], "success",
        "the newest attempt succeeded: {attempts:?}"
    );
    assert_eq!(attempts[0]["response_code"], 200);
    assert!(
        attempts[1..]
            .iter()
            .all(|a| a["status"] == "failed" && a["response_code"] == 503),
        "older attempts are the 503s: {attempts:?}"
    );
    let numbers: Vec<u64> = attempts
        .iter()
        .map(|a| a["number"].as_u64().unwrap())
        .collect();
    let mut expected: Vec<u64> = (1..=attempts.len() as u64).collect();
    expected.reverse();
    assert_eq!(
        numbers, expected,
        "attempt numbers count down from the newest"
    );

    // Nothing was given up on.
    let dead = client
        .get(&format!("/api/v1/tenants/{tenant}/dead-letters"))
        .await;
    assert_eq!(dead.body["items"], json!([]), "{dead:?}");

    let report = Report {
        events: count,
        requests: deliveries.len(),
        duplicates: receiver.duplicates(),
        retries: client.metric("sheaf_retries_total").await,
        lookup_queries: client.metric("sheaf_retry_lookup_queries_total").await,
        lookup_keys: client.metric("sheaf_retry_lookup_keys_total").await,
    };
    server.shutdown().await;
    report
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_backends_deliver_every_event_through_an_outage() {
    let report = outage_run(env_with(&OUTAGE_SETTINGS), "outage", 2_000).await;
    report.print("memory");
    assert!(report.retries > 0.0, "the outage caused retries");
    assert!(
        report.lookup_queries < report.retries,
        "coalescing sent fewer lookup queries ({}) than retries ({})",
        report.lookup_queries,
        report.retries
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_id_is_delivered_once_even_after_its_job_is_gone() {
    let receiver = Receiver::start().await.expect("the receiver binds");
    let server = start_server(env_with(&[])).await;
    let client = Client::new(server.addr);
    client
        .tenant_with_destination("idem", &receiver.url())
        .await;

    let first = client
        .publish("idem", "order-1", json!({ "total": 5 }))
        .await;
    assert_eq!(first.status, 202);
    assert_eq!(first.body, json!({ "id": "order-1", "duplicate": false }));
    let ids: HashSet<String> = ["order-1".to_owned()].into();
    assert!(receiver.delivers_all(&ids, Duration::from_secs(10)).await);
    // Let the completer remove the job.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let depth = server.engine.queue_depth().await.unwrap();
    assert_eq!(
        depth.due + depth.scheduled + depth.claimed,
        0,
        "the job is gone"
    );

    // Repeats: first recognised by this process's memory of accepted ids, then (with that
    // memory cleared, as in another process) through the log store.
    let again = client
        .publish("idem", "order-1", json!({ "total": 5 }))
        .await;
    assert_eq!(again.body, json!({ "id": "order-1", "duplicate": true }));
    server.engine.forget_remembered_events();
    let again = client
        .publish("idem", "order-1", json!({ "total": 5 }))
        .await;
    assert_eq!(again.status, 202);
    assert_eq!(again.body, json!({ "id": "order-1", "duplicate": true }));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(receiver.deliveries().len(), 1, "one delivery for one id");

    // A publish without an id gets a generated one.
    let generated = client
        .send(
            "POST",
            "/api/v1/publish",
            Some(json!({ "tenant_id": "idem", "topic": "t", "data": null })),
        )
        .await;
    assert_eq!(generated.status, 202);
    assert!(generated.body["id"].as_str().unwrap().starts_with("evt_"));
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_retry_delivers_again_and_is_marked_manual() {
    let receiver = Receiver::start().await.expect("the receiver binds");
    let server = start_server(env_with(&[])).await;
    let client = Client::new(server.addr);
    let destination = client
        .tenant_with_destination("manual", &receiver.url())
        .await;
    let destination_id = destination["id"].as_str().unwrap();
    assert_eq!(client.publish("manual", "m-1", json!(1)).await.status, 202);
    let ids: HashSet<String> = ["m-1".to_owned()].into();
    assert!(receiver.delivers_all(&ids, Duration::from_secs(10)).await);
    // The attempt is logged just after the receiver answered; a manual retry numbers itself
    // after the latest logged attempt, so wait (bounded) until the first one is there.
    for _ in 0..100 {
        if !client.attempts_of("manual", "m-1").await.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let retry = client
        .send(
            "POST",
            "/api/v1/tenants/manual/retry",
            Some(json!({ "event_id": "m-1", "destination_id": destination_id })),
        )
        .await;
    assert_eq!(retry.status, 202, "{retry:?}");
    let mut attempts = Vec::new();
    for _ in 0..100 {
        attempts = client.attempts_of("manual", "m-1").await;
        if attempts.len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(attempts.len(), 2, "{attempts:?}");
    assert_eq!(attempts[0]["trigger"], "manual");
    assert_eq!(attempts[0]["number"], 2);
    assert_eq!(attempts[1]["trigger"], "scheduled");
    assert_eq!(receiver.deliveries().len(), 2);

    let missing = client
        .send(
            "POST",
            "/api/v1/tenants/manual/retry",
            Some(json!({ "event_id": "nope", "destination_id": destination_id })),
        )
        .await;
    assert_eq!(missing.status, 404);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_last_attempt_a_delivery_is_dead_lettered_and_listed() {
    let receiver = Receiver::builder()
        .failing(Failing::Always)
        .start()
        .await
        .expect("the receiver binds");
    let server = start_server(env_with(&[
        ("SHEAF_RETRY_SCHEDULE", "100ms"),
        ("SHEAF_RETRY_MAX_ATTEMPTS", "3"),
        ("SHEAF_RETRY_JITTER_PERCENT", "0"),
    ]))
    .await;
    let client = Client::new(server.addr);
    client
        .tenant_with_destination("dead", &receiver.url())
        .await;
    assert_eq!(client.publish("dead", "d-1", json!({})).await.status, 202);

    let mut dead = json!([]);
    for _ in 0..100 {
        dead = client.get("/api/v1/tenants/dead/dead-letters").await.body["items"].clone();
        if dead.as_array().is_some_and(|a| !a.is_empty()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(dead[0]["event_id"], "d-1", "{dead}");
    assert_eq!(dead[0]["attempts"], 3);
    assert!(
        dead[0]["reason"].as_str().unwrap().contains("503"),
        "{dead}"
    );
    let attempts = client.attempts_of("dead", "d-1").await;
    assert_eq!(attempts.len(), 3);
    assert!(attempts.iter().all(|a| a["status"] == "failed"));
    let failed = client
        .get("/api/v1/tenants/dead/attempts?status=failed&limit=10")
        .await;
    assert_eq!(failed.body["items"].as_array().unwrap().len(), 3);
    assert_eq!(receiver.deliveries().len(), 3);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disabled_and_deleted_destinations_receive_nothing() {
    let receiver = Receiver::start().await.expect("the receiver binds");
    let server = start_server(env_with(&[])).await;
    let client = Client::new(server.addr);
    let destination = client
        .tenant_with_destination("quiet", &receiver.url())
        .await;
    let id = destination["id"].as_str().unwrap();
    let disabled = client
        .send(
            "PUT",
            &format!("/api/v1/tenants/quiet/destinations/{id}/disable"),
            None,
        )
        .await;
    assert_eq!(disabled.body["enabled"], false);
    assert_eq!(client.publish("quiet", "q-1", json!(1)).await.status, 202);
    // What is published while it is disabled is not lost: it waits as a dead letter.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let dead = loop {
        let dead = client
            .get("/api/v1/tenants/quiet/dead-letters?limit=10")
            .await;
        if dead.body["items"].as_array().is_some_and(|i| !i.is_empty()) {
            break dead;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no dead letter: {dead:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let items = dead.body["items"]
        .as_array()
        .expect("a page of dead letters");
    assert_eq!(items.len(), 1, "{dead:?}");
    assert_eq!(items[0]["event_id"], "q-1");
    assert_eq!(items[0]["reason"], "destination disabled");
    let enabled = client
        .send(
            "PUT",
            &format!("/api/v1/tenants/quiet/destinations/{id}/enable"),
            None,
        )
        .await;
    assert_eq!(enabled.body["enabled"], true);
    assert_eq!(client.publish("quiet", "q-2", json!(2)).await.status, 202);
    let ids: HashSet<String> = ["q-2".to_owned()].into();
    assert!(receiver.delivers_all(&ids, Duration::from_secs(10)).await);

    let deleted = client.send("DELETE", "/api/v1/tenants/quiet", None).await;
    assert_eq!(deleted.status, 204);
    assert_eq!(client.publish("quiet", "q-3", json!(3)).await.status, 404);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let seen: Vec<String> = receiver.deliveries().iter().map(|d| d.id.clone()).collect();
    assert_eq!(seen, vec!["q-2".to_owned()]);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_finishes_in_flight_deliveries_and_releases_the_rest() {
    // Two workers, each delivery takes 700 ms: at shutdown two are in flight, two more are
    // claimed in the channel, the rest wait in the queue.
    let receiver = Receiver::builder()
        .delay(Duration::from_millis(700))
        .start()
        .await
        .expect("the receiver binds");
    let server = start_server(env_with(&[("SHEAF_DELIVERY_WORKERS", "2")])).await;
    let client = Client::new(server.addr);
    client
        .tenant_with_destination("graceful", &receiver.url())
        .await;
    let ids = publish_many(&client, "graceful", "g", 10, 10).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let engine = server.engine.clone();
    server.shutdown().await;

    let delivered = receiver.delivered_ids();
    assert!(
        (2..ids.len()).contains(&delivered.len()),
        "in-flight deliveries finished, the rest did not start: {delivered:?}"
    );
    let depth = engine.queue_depth().await.unwrap();
    assert_eq!(depth.claimed, 0, "no claim is left held: {depth:?}");
    assert_eq!(
        depth.due as usize,
        ids.len() - delivered.len(),
        "every undelivered job is claimable again at once: {depth:?}"
    );
    let page = engine.metrics_page().await;
    assert!(
        sheaf_engine::metrics::sample_value(&page, "sheaf_jobs_released_total").unwrap_or(0.0)
            > 0.0,
        "unstarted claims were released"
    );
    // The write coalescer was flushed: every delivery made is in the log.
    let logged = engine
        .log()
        .list_attempts(
            &"graceful".parse().unwrap(),
            &Default::default(),
            &sheaf_store::PageRequest::first(100),
        )
        .await
        .unwrap();
    assert_eq!(logged.items.len(), delivered.len());
}
