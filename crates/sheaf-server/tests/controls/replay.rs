//! Bulk replay: dead letters delivered once more in a few queries, and the dead-letter list
//! emptied. (A replay outliving its process is `replay_takeover`.)

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use serde_json::{Value, json};
use sheaf_testenv::receiver::{Failing, Receiver};

use super::{backends, publish};
use crate::support::{Client, start_server};

/// Every dead letter of the tenant.
pub(super) async fn dead_letters(client: &Client, tenant: &str) -> Vec<Value> {
    client
        .every_item(&format!("/api/v1/tenants/{tenant}/dead-letters?limit=1000"))
        .await
}

/// Every successful attempt of the tenant.
async fn successful_attempts(client: &Client, tenant: &str) -> Vec<Value> {
    client
        .every_item(&format!(
            "/api/v1/tenants/{tenant}/attempts?status=success&limit=1000"
        ))
        .await
}

/// Starts a replay and waits (at most 60 s) for it to complete; returns its final progress.
async fn replay(client: &Client, tenant: &str, body: Value) -> Value {
    let started = client
        .send(
            "POST",
            &format!("/api/v1/tenants/{tenant}/replay"),
            Some(body),
        )
        .await;
    assert_eq!(started.status, 202, "{started:?}");
    let id = started.body["replay_id"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let progress = client
            .get(&format!("/api/v1/tenants/{tenant}/replays/{id}"))
            .await;
        assert_eq!(progress.status, 200, "{progress:?}");
        if progress.body["state"] != "running" {
            return progress.body;
        }
        assert!(
            Instant::now() < deadline,
            "the replay still runs: {progress:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn a_replay_delivers_dead_letters_once_more(label: &str, mut env: HashMap<String, String>) {
    let receiver = Receiver::builder()
        .failing(Failing::Always)
        .start()
        .await
        .expect("the receiver binds");
    // One attempt each: every first failure is a dead letter at once.
    env.insert("SHEAF_RETRY_MAX_ATTEMPTS".to_owned(), "1".to_owned());
    let server = start_server(env).await;
    let client = Client::new(server.addr);
    let tenant = "replays";
    let destination = client
        .tenant_with_destination(tenant, &receiver.url())
        .await;
    let window_start = chrono::Utc::now() - chrono::Duration::minutes(5);
    let ids: Vec<String> = (0..500).map(|i| format!("dead-{i}")).collect();
    futures::stream::iter(&ids)
        .map(|id| {
            let client = &client;
            async move {
                publish(client, tenant, id, "order.created", &json!({ "id": id })).await;
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<()>>()
        .await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while dead_letters(&client, tenant).await.len() < ids.len() {
        assert!(
            Instant::now() < deadline,
            "{label}: 500 dead letters within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    receiver.set_failing(false);
    let window = json!({
        "since": window_start.to_rfc3339(),
        "until": (chrono::Utc::now() + chrono::Duration::minutes(1)).to_rfc3339(),
    });

    let mut body = json!({ "status": "dead_lettered", "destination_id": destination["id"] });
    body["since"] = window["since"].clone();
    body["until"] = window["until"].clone();
    let done = replay(&client, tenant, body).await;
    assert_eq!(done["state"], "completed", "{label}: {done}");
    assert_eq!(done["jobs"], 500, "{label}: {done}");
    assert_eq!(done["dead_letters_removed"], 500, "{label}: {done}");
    let queries =
        done["log_store_queries"].as_u64().unwrap() + done["queue_queries"].as_u64().unwrap();
    println!(
        "{label}: replay of 500 dead letters: {} pages, {} log-store and {} queue queries",
        done["pages"], done["log_store_queries"], done["queue_queries"]
    );
    assert!(
        queries < 500 / 50,
        "{label}: {queries} store queries for 500 dead letters"
    );
    let wanted: HashSet<String> = ids.iter().cloned().collect();
    assert!(
        receiver
            .delivers_all(&wanted, Duration::from_secs(60))
            .await,
        "{label}: every replayed delivery arrives"
    );
    assert!(
        dead_letters(&client, tenant).await.is_empty(),
        "{label}: the dead-letter list is empty"
    );
    // The log has every replayed success (with a log shipper, once it shipped them), each a
    // manual attempt.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let successes = successful_attempts(&client, tenant).await;
        if successes.len() >= 500 {
            assert!(
                successes.iter().all(|a| a["trigger"] == "manual"),
                "{label}: the replayed attempts are manual"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{label}: {} successful attempts logged after 30 s",
            successes.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Replaying what failed in the same window now finds nothing: each pair's latest attempt is
    // the replay's success.
    let mut body = json!({ "status": "failed" });
    body["since"] = window["since"].clone();
    body["until"] = window["until"].clone();
    let again = replay(&client, tenant, body).await;
    assert_eq!(again["state"], "completed", "{label}: {again}");
    assert_eq!(again["jobs"], 0, "{label}: nothing failed is left: {again}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let successes = receiver
        .deliveries()
        .iter()
        .filter(|d| d.status == 200)
        .count();
    assert_eq!(
        successes, 500,
        "{label}: each delivered once more, not twice"
    );

    // A window the service refuses, naming what is wrong.
    let refused = client
        .send(
            "POST",
            &format!("/api/v1/tenants/{tenant}/replay"),
            Some(json!({ "status": "any", "since": "2026-01-01T00:00:00Z", "until": "2026-02-01T00:00:00Z" })),
        )
        .await;
    assert_eq!(refused.status, 400, "{refused:?}");
    assert!(
        refused.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("7 days")
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_of_dead_letters_delivers_each_once_more_in_a_few_queries_on_every_backend() {
    for (label, env) in backends("replay") {
        a_replay_delivers_dead_letters_once_more(label, env).await;
    }
}
