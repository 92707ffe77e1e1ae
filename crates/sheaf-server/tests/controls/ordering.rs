//! Per-key ordering end to end, on every backend: a destination ordered by `/data/key` gets each
//! key's events one at a time in publish order, while keys are published concurrently and the
//! receiver fails every fifth request (so retries happen in the middle of every key's run). A
//! request for an earlier event after a later one of its key is out of order; a repeat of the
//! last is a duplicate (allowed, counted). And what a dead letter does to its key: blocks it
//! until it is retried (back in its place) or discarded, or lets the key go on and says so in
//! its last attempt.

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
        assert_eq!(
            ordered.body["ordering"],
            json!({ "key": "/data/key", "on_dead_letter": "skip" })
        );

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

/// The events of `key` answered 200, by `seq`, in the order they arrived.
fn delivered_seqs(receiver: &Receiver, key: &str) -> Vec<u64> {
    receiver
        .deliveries()
        .iter()
        .filter(|d| d.status == 200)
        .filter_map(|d| {
            let body: Value = serde_json::from_slice(&d.body).ok()?;
            (body["key"] == key).then(|| body["seq"].as_u64().expect("a seq"))
        })
        .collect()
}

/// Waits until the tenant has a dead letter of each of `events` (at most 30 s); returns them all.
async fn dead_letters(client: &Client, events: &[&str]) -> Vec<Value> {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let listed = client
            .every_item("/api/v1/tenants/held/dead-letters?limit=100")
            .await;
        let all = events
            .iter()
            .all(|event| listed.iter().any(|d| d["event_id"] == *event));
        if all || std::time::Instant::now() > deadline {
            return listed;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The `error` of the first attempt of `event`, once the log has it (at most 30 s).
async fn first_error(client: &Client, event: &str) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let attempts = client.attempts_of("held", event).await;
        if let Some(first) = attempts.first() {
            return first["error"].as_str().unwrap_or_default().to_owned();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no attempt of {event} logged"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The dead letter of event `event` among `listed`.
fn dead_letter_of<'a>(listed: &'a [Value], event: &str) -> &'a Value {
    listed
        .iter()
        .find(|d| d["event_id"] == event)
        .unwrap_or_else(|| panic!("no dead letter of {event} in {listed:?}"))
}

/// Publishes each key's events `0..n` in sequence, the keys side by side.
async fn publish_keys(client: &Client, keys: &[(&str, u64)]) {
    let publishers = keys.iter().map(|&(key, n)| {
        let client = client.clone();
        async move {
            for seq in 0..n {
                let data = json!({ "key": key, "seq": seq });
                let answer = client.publish("held", &format!("{key}-{seq}"), data).await;
                assert_eq!(answer.status, 202, "{answer:?}");
            }
        }
    });
    futures::future::join_all(publishers).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_blocks_its_key_until_retried_or_discarded_or_lets_it_go() {
    const TEST: &str = "a_dead_letter_blocks_its_key_until_retried_or_discarded_or_lets_it_go";
    // The second event of every key whose name starts with `x` fails its transformation: a
    // permanent failure, dead-lettered at its first attempt.
    let refuse = r#"if .data.seq == 1 and (.data.key | startswith("x")) then error("refused") else .data end"#;
    for (name, env) in backends(TEST) {
        let receiver = Receiver::start().await.expect("the receiver binds");
        let server = start_server(env).await;
        let client = Client::new(server.addr);
        let destination = client
            .tenant_with_destination("held", &receiver.url())
            .await;
        let path = format!(
            "/api/v1/tenants/held/destinations/{}",
            destination["id"].as_str().unwrap()
        );
        let bad = client
            .send(
                "PATCH",
                &path,
                Some(json!({ "ordering": { "key": "/data/key", "on_dead_letter": "wait" } })),
            )
            .await;
        assert_eq!(bad.status, 400, "{name}: {bad:?}");
        let blocking = json!({ "key": "/data/key", "on_dead_letter": "block" });
        let patched = client
            .send(
                "PATCH",
                &path,
                Some(json!({ "ordering": blocking, "transform": refuse })),
            )
            .await;
        assert_eq!(patched.status, 200, "{name}: {patched:?}");
        assert_eq!(patched.body["ordering"], blocking, "{name}");

        // Blocked: `xa` and `xd` stop at their dead letters, `b` goes on.
        publish_keys(&client, &[("xa", 4), ("xd", 3), ("b", 3)]).await;
        let ids: Vec<String> = ["xa-0", "xd-0", "b-0", "b-1", "b-2"]
            .map(String::from)
            .to_vec();
        assert!(
            receiver.delivers_all(&ids, Duration::from_secs(30)).await,
            "{name}: the first of each key, and every event of the key that did not fail"
        );
        let listed = dead_letters(&client, &["xa-1", "xd-1"]).await;
        for event in ["xa-1", "xd-1"] {
            assert_eq!(
                dead_letter_of(&listed, event)["blocks_key"],
                true,
                "{name}: {listed:?}"
            );
        }
        let error = first_error(&client, "xa-1").await;
        assert!(
            error.contains("refused") && error.contains("wait until this dead letter"),
            "{name}: the attempt says the key waits: {error}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(delivered_seqs(&receiver, "xa"), [0], "{name}: xa waits");
        assert_eq!(delivered_seqs(&receiver, "xd"), [0], "{name}: xd waits");

        // Discarded: the key's next events go, the discarded one never.
        let xd1 = dead_letter_of(&listed, "xd-1")["job_id"]
            .as_str()
            .unwrap()
            .to_owned();
        let discard = format!("/api/v1/tenants/held/dead-letters/{xd1}");
        let gone = client.send("DELETE", &discard, None).await;
        assert_eq!(gone.status, 204, "{name}: {gone:?}");
        let again = client.send("DELETE", &discard, None).await;
        assert_eq!(again.status, 404, "{name}: discarded once: {again:?}");
        let rest = ["xd-2".to_owned()];
        assert!(
            receiver.delivers_all(&rest, Duration::from_secs(30)).await,
            "{name}: xd goes on once its dead letter is discarded"
        );
        assert_eq!(delivered_seqs(&receiver, "xd"), [0, 2], "{name}");

        // Retried (with the transformation fixed): back in its place, then the rest in order.
        let fixed = client
            .send("PATCH", &path, Some(json!({ "transform": null })))
            .await;
        assert_eq!(fixed.status, 200, "{name}: {fixed:?}");
        let xa1 = dead_letter_of(&listed, "xa-1")["job_id"]
            .as_str()
            .unwrap()
            .to_owned();
        let retry = format!("/api/v1/tenants/held/dead-letters/{xa1}/retry");
        let queued = client.send("POST", &retry, None).await;
        assert_eq!(queued.status, 202, "{name}: {queued:?}");
        let unknown = client
            .send(
                "POST",
                "/api/v1/tenants/held/dead-letters/not-a-job/retry",
                None,
            )
            .await;
        assert_eq!(unknown.status, 404, "{name}: {unknown:?}");
        let rest: Vec<String> = (1..4).map(|seq| format!("xa-{seq}")).collect();
        assert!(
            receiver.delivers_all(&rest, Duration::from_secs(30)).await,
            "{name}: xa goes on once its dead letter is retried"
        );
        assert_eq!(
            delivered_seqs(&receiver, "xa"),
            [0, 1, 2, 3],
            "{name}: the retried event first, then the ones it held back"
        );

        // Skipping (the default): the key goes on at once, and the last attempt says so.
        let skipping = client
            .send(
                "PATCH",
                &path,
                Some(json!({ "ordering": { "key": "/data/key" }, "transform": refuse })),
            )
            .await;
        assert_eq!(skipping.status, 200, "{name}: {skipping:?}");
        assert_eq!(
            skipping.body["ordering"]["on_dead_letter"], "skip",
            "{name}"
        );
        publish_keys(&client, &[("xs", 3)]).await;
        let ids = ["xs-0".to_owned(), "xs-2".to_owned()];
        assert!(
            receiver.delivers_all(&ids, Duration::from_secs(30)).await,
            "{name}: the key goes on past its dead letter"
        );
        assert_eq!(delivered_seqs(&receiver, "xs"), [0, 2], "{name}");
        let listed = dead_letters(&client, &["xs-1"]).await;
        assert_eq!(
            dead_letter_of(&listed, "xs-1")["blocks_key"],
            false,
            "{name}"
        );
        let error = first_error(&client, "xs-1").await;
        assert!(
            error.contains("go on without it"),
            "{name}: the attempt says the key went on: {error}"
        );
        println!("{name}: blocked, discarded, retried and skipped in order");
        server.shutdown().await;
    }
}
