//! Per-destination rate limits: a destination limited to 50 deliveries a second receives 1,000
//! events at no more than that, measured over every 5-second window at the receiver, with one
//! process on the memory backends and with two processes sharing the Postgres queue; and a
//! `Retry-After` holds back every delivery to its destination.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use serde_json::{Value, json};
use sheaf_testenv::receiver::{Failing, Receiver};

use super::publish;
use crate::support::{Client, env_with, spawn_sheaf, start_server, stop_clean};

const LIMIT: u32 = 50;
const EVENTS: usize = 1_000;

/// The most deliveries that arrived within any 5-second window, per second.
fn busiest_five_seconds(receiver: &Receiver) -> f64 {
    let mut arrivals: Vec<Instant> = receiver.deliveries().iter().map(|d| d.arrived).collect();
    arrivals.sort();
    let window = Duration::from_secs(5);
    let mut most = 0;
    let mut start = 0;
    for end in 0..arrivals.len() {
        while arrivals[end] - arrivals[start] >= window {
            start += 1;
        }
        most = most.max(end - start + 1);
    }
    most as f64 / 5.0
}

async fn limited_destination(client: &Client, tenant: &str, receiver: &Receiver) -> Value {
    let put = client
        .send("PUT", &format!("/api/v1/tenants/{tenant}"), None)
        .await;
    assert!(put.status == 201 || put.status == 200, "{put:?}");
    let created = client
        .send(
            "POST",
            &format!("/api/v1/tenants/{tenant}/destinations"),
            Some(
                json!({ "type": "webhook", "topics": ["*"], "rate_limit": { "per_second": LIMIT },
                         "config": { "url": receiver.url() } }),
            ),
        )
        .await;
    assert_eq!(created.status, 201, "{created:?}");
    assert_eq!(created.body["rate_limit"], json!({ "per_second": LIMIT }));
    created.body
}

async fn publish_all(clients: &[Client], tenant: &str, ids: &[String]) {
    futures::stream::iter(ids.iter().enumerate())
        .map(|(i, id)| {
            let client = &clients[i % clients.len()];
            async move {
                publish(client, tenant, id, "order.created", &json!({ "i": i })).await;
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<()>>()
        .await;
}

fn check(label: &str, receiver: &Receiver, started: Instant) {
    let rate = busiest_five_seconds(receiver);
    let took = started.elapsed();
    println!(
        "{label}: {EVENTS} events to a destination limited to {LIMIT}/s: busiest 5 s window \
         {rate:.1}/s, all delivered in {:.1} s ({:.1}/s overall), {} requests",
        took.as_secs_f64(),
        EVENTS as f64 / took.as_secs_f64(),
        receiver.deliveries().len()
    );
    assert!(
        rate <= 55.0,
        "{label}: {rate}/s in the busiest 5-second window"
    );
    assert_eq!(
        receiver.deliveries().len(),
        EVENTS,
        "{label}: one request per event (a held delivery is no attempt)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limited_destination_receives_at_most_its_limit_on_memory() {
    let receiver = Receiver::start().await.expect("the receiver binds");
    // One attempt each: a held delivery counted as an attempt would be dead-lettered.
    let server = start_server(env_with(&[("SHEAF_RETRY_MAX_ATTEMPTS", "1")])).await;
    let client = Client::new(server.addr);
    limited_destination(&client, "limited", &receiver).await;
    let ids: Vec<String> = (0..EVENTS).map(|i| format!("limited-{i}")).collect();
    let started = Instant::now();
    publish_all(std::slice::from_ref(&client), "limited", &ids).await;
    let wanted: HashSet<String> = ids.iter().cloned().collect();
    assert!(
        receiver
            .delivers_all(&wanted, Duration::from_secs(90))
            .await
    );
    check("memory", &receiver, started);
    assert!(
        client
            .metric("sheaf_deliveries_total{outcome=\"paced\"}")
            .await
            > 0.0,
        "the limit held deliveries back"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_share_a_destination_s_rate_limit() {
    const TEST: &str = "two_processes_share_a_destination_s_rate_limit";
    let postgres = sheaf_testenv::require_postgres!(TEST);
    let clickhouse = sheaf_testenv::require_clickhouse!(TEST);
    let schema = sheaf_testenv::unique_name("lim");
    let database = sheaf_testenv::unique_name("lim");
    let env = [
        ("SHEAF_QUEUE", "postgres"),
        ("SHEAF_LOG_STORE", "clickhouse"),
        ("SHEAF_POSTGRES_URL", postgres.as_str()),
        ("SHEAF_POSTGRES_SCHEMA", schema.as_str()),
        ("SHEAF_CLICKHOUSE_URL", clickhouse.as_str()),
        ("SHEAF_CLICKHOUSE_DATABASE", database.as_str()),
        ("SHEAF_ALLOW_PRIVATE_DESTINATIONS", "true"),
        ("SHEAF_QUEUE_POLL_INTERVAL", "50ms"),
        ("SHEAF_RETRY_MAX_ATTEMPTS", "1"),
    ];
    let first = spawn_sheaf(&env).await;
    let second = spawn_sheaf(&env).await;
    let clients = [Client::new(first.addr), Client::new(second.addr)];
    // Both count two processes before anything is published.
    let deadline = Instant::now() + Duration::from_secs(30);
    for client in &clients {
        while client.metric("sheaf_queue_processes").await < 2.0 {
            assert!(Instant::now() < deadline, "the processes see each other");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let receiver = Receiver::start().await.expect("the receiver binds");
    limited_destination(&clients[0], "shared-limit", &receiver).await;
    let ids: Vec<String> = (0..EVENTS).map(|i| format!("shared-{i}")).collect();
    let started = Instant::now();
    publish_all(&clients, "shared-limit", &ids).await;
    let wanted: HashSet<String> = ids.iter().cloned().collect();
    assert!(
        receiver
            .delivers_all(&wanted, Duration::from_secs(90))
            .await
    );
    check("two processes on postgres + clickhouse", &receiver, started);
    let mut paced = 0.0;
    for client in &clients {
        paced += client
            .metric("sheaf_deliveries_total{outcome=\"paced\"}")
            .await;
    }
    assert!(paced > 0.0, "the limit held deliveries back");
    stop_clean(first).await;
    stop_clean(second).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_out_of_range_is_refused_by_name_and_null_clears_it() {
    let server = start_server(env_with(&[])).await;
    let client = Client::new(server.addr);
    let receiver = Receiver::start().await.expect("the receiver binds");
    let created = limited_destination(&client, "bad-limits", &receiver).await;
    for per_second in [json!(0), json!(10_001), json!(2.5), json!(-1), json!("50")] {
        let answer = client
            .send(
                "POST",
                "/api/v1/tenants/bad-limits/destinations",
                Some(json!({ "type": "webhook", "topics": ["*"],
                             "rate_limit": { "per_second": per_second },
                             "config": { "url": receiver.url() } })),
            )
            .await;
        assert_eq!(answer.status, 400, "{per_second}: {answer:?}");
        let message = answer.body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("rate_limit.per_second") || message.contains("invalid type"),
            "{per_second}: {message}"
        );
    }
    let path = format!(
        "/api/v1/tenants/bad-limits/destinations/{}",
        created["id"].as_str().unwrap()
    );
    let whole = client
        .send(
            "PATCH",
            &path,
            Some(json!({ "rate_limit": { "per_second": 7.0 } })),
        )
        .await;
    assert_eq!(
        whole.body["rate_limit"],
        json!({ "per_second": 7 }),
        "{whole:?}"
    );
    let cleared = client
        .send("PATCH", &path, Some(json!({ "rate_limit": null })))
        .await;
    assert_eq!(cleared.body["rate_limit"], Value::Null, "{cleared:?}");
    server.shutdown().await;
}

/// A 429 with `Retry-After` to one delivery holds back every delivery to its destination until
/// the pause is over, and the held ones are not attempts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_pauses_every_delivery_to_the_destination() {
    let receiver = Receiver::builder()
        .failing(Failing::ForAfterFirst(Duration::from_millis(100)))
        .busy_with_retry_after(2)
        .start()
        .await
        .expect("the receiver binds");
    let server = start_server(env_with(&[
        ("SHEAF_RETRY_MAX_ATTEMPTS", "2"),
        ("SHEAF_RETRY_JITTER_PERCENT", "0"),
    ]))
    .await;
    let client = Client::new(server.addr);
    client
        .tenant_with_destination("paused", &receiver.url())
        .await;
    publish(&client, "paused", "first", "order.created", &json!({})).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while receiver.deliveries().is_empty() {
        assert!(Instant::now() < deadline, "the first delivery arrives");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let busy = receiver.deliveries()[0].clone();
    assert_eq!(busy.status, 429);
    // Published after the 429: none of these may start before the 2 s are over.
    let ids: Vec<String> = (0..10).map(|i| format!("after-{i}")).collect();
    for id in &ids {
        publish(&client, "paused", id, "order.created", &json!({})).await;
    }
    let mut wanted: HashSet<String> = ids.iter().cloned().collect();
    wanted.insert("first".to_owned());
    assert!(
        receiver
            .delivers_all(&wanted, Duration::from_secs(30))
            .await
    );
    let deliveries = receiver.deliveries();
    let later = deliveries.iter().skip(1);
    for d in later {
        assert!(
            d.arrived.duration_since(busy.answered) >= Duration::from_millis(1_900),
            "{} arrived {:?} after the 429",
            d.id,
            d.arrived.duration_since(busy.answered)
        );
    }
    assert_eq!(deliveries.len(), 12, "one 429, then one request per event");
    assert!(
        client
            .metric("sheaf_deliveries_total{outcome=\"paced\"}")
            .await
            > 0.0
    );
    server.shutdown().await;
}
