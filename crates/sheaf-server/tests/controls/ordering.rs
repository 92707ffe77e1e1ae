//! Per-key ordering end to end, on every backend: a destination ordered by `/data/key` gets each
//! key's events one at a time in publish order, while keys are published concurrently and the
//! receiver fails every fifth request (so retries happen in the middle of every key's run). A
//! request for an earlier event after a later one of its key is out of order; a repeat of the
//! last is a duplicate (allowed, counted).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use serde_json::{Value, json};
use sheaf_testenv::receiver::{Failing, Receiver};

use super::backends;
use crate::support::{Client, start_server};

const KEYS: usize = 10;
const PER_KEY: u64 = 12;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_key_is_delivered_in_publish_order_through_failures_and_retries() {
    const TEST: &str = "each_key_is_delivered_in_publish_order_through_failures_and_retries";
    for (name, mut env) in backends(TEST) {
        env.insert("SHEAF_RETRY_SCHEDULE".to_owned(), "200ms".to_owned());
        let receiver = Receiver::builder()
            .failing(Failing::EveryNth(5))
            .start()
            .await
            .expect("the receiver binds");
        let server = start_server(env).await;
        let client = Client::new(server.addr);
        let destination = client
            .tenant_with_destination("ordered", &receiver.url())
            .await;
        let path = format!(
            "/api/v1/tenants/ordered/destinations/{}",
            destination["id"].as_str().unwrap()
        );
        let bad = client
            .send(
                "PATCH",
                &path,
                Some(json!({ "ordering": { "key": "data/key" } })),
            )
            .await;
        assert_eq!(
            bad.status, 400,
            "{name}: a pointer without its slash: {bad:?}"
        );
        let ordered = client
            .send(
                "PATCH",
                &path,
                Some(json!({ "ordering": { "key": "/data/key" } })),
            )
            .await;
        assert_eq!(ordered.status, 200, "{name}: {ordered:?}");
        assert_eq!(ordered.body["ordering"], json!({ "key": "/data/key" }));

        // Every key's events published in sequence, the keys side by side.
        let publishers = (0..KEYS).map(|k| {
            let client = client.clone();
            async move {
                for seq in 0..PER_KEY {
                    let data = json!({ "key": format!("k{k}"), "seq": seq });
                    let answer = client
                        .publish("ordered", &format!("o-{k}-{seq}"), data)
                        .await;
                    assert_eq!(answer.status, 202, "{answer:?}");
                }
            }
        });
        futures::future::join_all(publishers).await;
        let ids: HashSet<String> = (0..KEYS)
            .flat_map(|k| (0..PER_KEY).map(move |seq| format!("o-{k}-{seq}")))
            .collect();
        assert!(
            receiver.delivers_all(&ids, Duration::from_secs(60)).await,
            "{name}: every event delivered"
        );

        // Every request the receiver got, failed or not, in the order it arrived.
        let mut last: HashMap<String, u64> = HashMap::new();
        let (mut out_of_order, mut duplicates, mut failed) = (0, 0, 0);
        for delivery in receiver.deliveries() {
            let body: Value = serde_json::from_slice(&delivery.body).expect("JSON");
            let key = body["key"].as_str().expect("a key").to_owned();
            let seq = body["seq"].as_u64().expect("a seq");
            if delivery.status != 200 {
                failed += 1;
            }
            match last.insert(key.clone(), seq) {
                Some(before) if seq < before => {
                    out_of_order += 1;
                    println!("{name}: {key}: {seq} after {before}");
                }
                Some(before) if seq == before => duplicates += 1,
                _ => {}
            }
        }
        println!(
            "{name}: {} requests, {failed} answered 503, {duplicates} repeats, {out_of_order} out of order",
            receiver.deliveries().len()
        );
        assert!(failed > 0, "{name}: the receiver failed some requests");
        assert_eq!(out_of_order, 0, "{name}: deliveries out of order");
        server.shutdown().await;
    }
}
