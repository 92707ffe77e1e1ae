//! What the Postgres log store promises beyond the shared suite: the latest-attempt lookup is one
//! index probe per key on a realistic table, batches larger than one statement, text that
//! Postgres cannot hold as-is, and overlapping concurrent batches.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::json;
use sheaf_store::testkit::fixtures::{ago, attempt, event, shift, unique_tenant};
use sheaf_store::{Attempt, AttemptKey, DestinationId, Event, LogStore, Payload};
use sheaf_testenv::require_postgres;

use crate::support::{Gate, TestSchema};

/// Every node of an `EXPLAIN (FORMAT JSON)` plan, depth first.
fn plan_nodes(node: &serde_json::Value, out: &mut Vec<serde_json::Value>) {
    out.push(node.clone());
    if let Some(children) = node.get("Plans").and_then(|p| p.as_array()) {
        for child in children {
            plan_nodes(child, out);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latest_attempts_probes_the_index_once_per_key_over_200000_attempts() {
    let url =
        require_postgres!("latest_attempts_probes_the_index_once_per_key_over_200000_attempts");
    let _gate = Gate::shared(&url).await;
    let test = TestSchema::new(&url).await;
    let keys = crate::support::fill_attempts(&test).await;

    let log = test.stores.postgres_log_store();
    let explained = log.explain_latest_attempts(&keys).await.expect("explain");
    let root = &explained[0];
    let mut nodes = Vec::new();
    plan_nodes(&root["Plan"], &mut nodes);
    let on_attempts: Vec<&serde_json::Value> = nodes
        .iter()
        .filter(|n| n["Relation Name"] == "attempts")
        .collect();
    assert!(
        !on_attempts.is_empty(),
        "the plan never reads attempts: {root:#}"
    );
    for node in &on_attempts {
        assert!(
            matches!(
                node["Node Type"].as_str(),
                Some("Index Scan" | "Index Only Scan")
            ) && node["Index Name"] == "attempts_latest",
            "attempts must be read by probes of attempts_latest, not {} ({}): {root:#}",
            node["Node Type"],
            node["Index Name"]
        );
        assert_eq!(
            node["Actual Loops"].as_u64(),
            Some(keys.len() as u64),
            "one probe per key: {root:#}"
        );
    }
    let execution_ms = root["Execution Time"].as_f64().expect("execution time");
    println!(
        "latest_attempts over 200,000 attempts: {} keys in {execution_ms:.3} ms of server \
         execution ({:.1} µs per key, EXPLAIN ANALYZE's own timing overhead included)",
        keys.len(),
        execution_ms * 1000.0 / keys.len() as f64
    );

    // And the answers are right: 90 found, the latest attempt of each.
    let found = log.latest_attempts(&keys).await.expect("latest_attempts");
    assert_eq!(found.len(), 90);
    for key in keys.iter().step_by(7) {
        let single = log.latest_attempt(key).await.expect("latest_attempt");
        assert_eq!(found.get(key), single.as_ref(), "{key:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latest_attempts_answers_more_keys_than_one_statement_carries() {
    let url = require_postgres!("latest_attempts_answers_more_keys_than_one_statement_carries");
    let _gate = Gate::shared(&url).await;
    let test = TestSchema::new(&url).await;
    let log = test.stores.log_store();
    let tenant = unique_tenant("pg-many-keys");
    let t = ago(Duration::from_secs(600));
    let events: Vec<Event> = (0..1_250)
        .map(|i| event(&tenant, &format!("e{i}"), "t", shift(t, i)))
        .collect();
    let d = DestinationId::generate();
    let attempts: Vec<Attempt> = events.iter().map(|e| attempt(e, d, e.time)).collect();
    log.insert_many(&events, &attempts).await.expect("insert");
    // 2,500 keys: every attempt's own key, and one a microsecond later that finds nothing.
    let mut keys: Vec<AttemptKey> = attempts.iter().map(Attempt::key).collect();
    keys.extend(attempts.iter().map(|a| AttemptKey {
        attempt_time: shift(a.time, 1),
        ..a.key()
    }));
    let found = log.latest_attempts(&keys).await.expect("latest_attempts");
    let expected: HashMap<AttemptKey, Attempt> =
        attempts.iter().map(|a| (a.key(), a.clone())).collect();
    assert_eq!(found, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_postgres_cannot_hold_is_stored_without_failing_the_batch() {
    let url = require_postgres!("text_postgres_cannot_hold_is_stored_without_failing_the_batch");
    let _gate = Gate::shared(&url).await;
    let test = TestSchema::new(&url).await;
    let log = test.stores.log_store();
    let tenant = unique_tenant("pg-nul");
    let mut e = event(&tenant, "nul", "t", ago(Duration::from_secs(60)));
    // JSON's \u0000 escape: `jsonb` would reject it; the `json` column keeps it exactly.
    e.data = Payload::new(json!({"text": "a\u{0}b", "key\u{0}": [1, 2.5, "ü"]}));
    let mut a = attempt(&e, DestinationId::generate(), ago(Duration::from_secs(30)));
    a.response_body = Some("binary\u{0}answer".to_owned());
    a.error = Some("reset\u{0}".to_owned());
    log.insert_many(std::slice::from_ref(&e), std::slice::from_ref(&a))
        .await
        .expect("a NUL anywhere must not fail the batch");
    assert_eq!(
        log.get_event(&tenant, &e.id).await.expect("get_event"),
        Some(e.clone()),
        "payloads round-trip exactly, \\u0000 included"
    );
    let stored = log
        .get_attempt(&tenant, &a.id)
        .await
        .expect("get_attempt")
        .expect("stored");
    assert_eq!(
        stored.response_body.as_deref(),
        Some("binary\u{FFFD}answer")
    );
    assert_eq!(stored.error.as_deref(), Some("reset\u{FFFD}"));
    assert_eq!(stored.event_data, e.data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_batches_written_at_once_neither_deadlock_nor_duplicate() {
    let url =
        require_postgres!("overlapping_batches_written_at_once_neither_deadlock_nor_duplicate");
    let _gate = Gate::shared(&url).await;
    let test = TestSchema::new(&url).await;
    let log = test.stores.log_store();
    let tenant = unique_tenant("pg-overlap");
    let t = ago(Duration::from_secs(600));
    let events: Vec<Event> = (0..400)
        .map(|i| event(&tenant, &format!("o{i:03}"), "t", shift(t, i)))
        .collect();
    let d = DestinationId::generate();
    let attempts: Vec<Attempt> = events.iter().map(|e| attempt(e, d, e.time)).collect();
    // Four writers, each with the same records in another order (forwards, backwards, and
    // interleaved): without a common lock order these batches deadlock each other.
    let orders: Vec<Vec<usize>> = vec![
        (0..400).collect(),
        (0..400).rev().collect(),
        (0..400).map(|i| (i * 7) % 400).collect(),
        (0..400).map(|i| (i * 13 + 5) % 400).collect(),
    ];
    let writers = orders.into_iter().map(|order| {
        let log = log.clone();
        let events: Vec<Event> = order.iter().map(|&i| events[i].clone()).collect();
        let attempts: Vec<Attempt> = order.iter().map(|&i| attempts[i].clone()).collect();
        tokio::spawn(async move {
            for _ in 0..5 {
                log.insert_many(&events, &attempts).await?;
            }
            Ok::<_, sheaf_store::Error>(())
        })
    });
    for writer in futures::future::join_all(writers).await {
        writer.expect("writer panicked").expect("insert_many");
    }
    let page = log
        .list_events(
            &tenant,
            &Default::default(),
            &sheaf_store::PageRequest::first(1000),
        )
        .await
        .expect("list");
    assert_eq!(page.items.len(), 400, "each event once");
    let page = log
        .list_attempts(
            &tenant,
            &Default::default(),
            &sheaf_store::PageRequest::first(1000),
        )
        .await
        .expect("list");
    assert_eq!(page.items.len(), 400, "each attempt once");
}
