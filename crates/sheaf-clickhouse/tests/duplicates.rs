//! Rows that ClickHouse has not merged yet: a retried write leaves copies of a record in several
//! parts until a merge of the ReplacingMergeTree removes them, and every read must count each
//! record once meanwhile. Merges are stopped and `optimize_on_insert` (which would merge copies
//! within one insert on 26.9) is off, so the copies stay.

use std::collections::HashMap;
use std::time::Duration;

use sheaf_clickhouse::ClickHouseLogStore;
use sheaf_store::testkit::fixtures::{ago, attempt, event, shift, unique_tenant};
use sheaf_store::{AttemptFilter, DestinationId, EventFilter, EventKey, LogStore, PageRequest};
use sheaf_testenv::require_clickhouse;

use crate::support::TestDb;

const MINUTE: i64 = 60 * 1_000_000;

/// A store whose inserts keep copies, on a database whose tables do not merge.
async fn unmerged_store(db: &TestDb) -> ClickHouseLogStore {
    let mut config = db.config();
    config
        .settings
        .push(("optimize_on_insert".to_owned(), "0".to_owned()));
    let store = db.store_with(config).await;
    db.execute("SYSTEM STOP MERGES events").await;
    db.execute("SYSTEM STOP MERGES attempts").await;
    store
}

async fn copies_of(db: &TestDb, table: &str, column: &str, id: &str) -> u64 {
    db.client()
        .query(&format!(
            "SELECT count() FROM {table} WHERE toString({column}) = ?"
        ))
        .bind(id)
        .fetch_one()
        .await
        .expect("count copies")
}

/// The retry-lookup experiment's case (docs/benchmarks.md, "`lookup`", earlier measurements):
/// five unmerged copies of one key's latest row and an older second key. In the experiment's
/// two-step query the `LIMIT` (one row per key asked) was filled by copies of the newer row and
/// the second key lost; `LIMIT 1 BY` keeps one copy per triple, so both keys come from the batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_unmerged_copies_do_not_hide_another_key() {
    let url = require_clickhouse!("five_unmerged_copies_do_not_hide_another_key");
    let db = TestDb::new(&url);
    let store = unmerged_store(&db).await;

    let tenant = unique_tenant("ch-copies");
    let t = ago(Duration::from_secs(3600));
    let e = event(&tenant, "copied", "order.created", t);
    let (d1, d2) = (DestinationId::generate(), DestinationId::generate());
    let newer = attempt(&e, d1, shift(t, 30 * MINUTE));
    let older = attempt(&e, d2, shift(t, 10 * MINUTE));
    store
        .insert_many(std::slice::from_ref(&e), std::slice::from_ref(&older))
        .await
        .expect("insert");
    // Five separate calls: five writes, five parts, five copies of the same row.
    for _ in 0..5 {
        store
            .insert_many(&[], std::slice::from_ref(&newer))
            .await
            .expect("insert a copy");
    }
    assert_eq!(
        copies_of(&db, "attempts", "attempt_id", &newer.id.to_string()).await,
        5,
        "the copies must still be unmerged for this test to mean anything"
    );

    let keys = [newer.key(), older.key()];
    let found = store.latest_attempts(&keys).await.expect("latest_attempts");
    assert_eq!(
        found,
        HashMap::from([(newer.key(), newer.clone()), (older.key(), older.clone())]),
        "both keys are answered, the newer one once"
    );
    assert_eq!(
        store.row_limit_fallbacks(),
        0,
        "copies must not push the older key past the limit"
    );

    // Bounds before both attempts on the same triples: still one answer per key.
    let early = |key: &sheaf_store::AttemptKey| sheaf_store::AttemptKey {
        attempt_time: shift(t, -MINUTE),
        ..key.clone()
    };
    let found = store
        .latest_attempts(&[early(&newer.key()), early(&older.key())])
        .await
        .expect("latest_attempts");
    assert_eq!(found.get(&early(&newer.key())), Some(&newer));
    assert_eq!(found.get(&early(&older.key())), Some(&older));
    assert_eq!(
        store.latest_attempt(&newer.key()).await.expect("single"),
        Some(newer)
    );
}

/// Listings and `get_events` count a record with unmerged copies once, across page boundaries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listings_count_unmerged_copies_once() {
    let url = require_clickhouse!("listings_count_unmerged_copies_once");
    let db = TestDb::new(&url);
    let store = unmerged_store(&db).await;

    let tenant = unique_tenant("ch-copies-list");
    let t = ago(Duration::from_secs(3600));
    let events: Vec<_> = (0..7)
        .map(|i| event(&tenant, &format!("e{i}"), "t", shift(t, i * MINUTE)))
        .collect();
    let d = DestinationId::generate();
    let attempts: Vec<_> = events
        .iter()
        .enumerate()
        .map(|(i, e)| attempt(e, d, shift(t, i as i64 * MINUTE + 1)))
        .collect();
    // Three copies of everything, each in its own write.
    for _ in 0..3 {
        store.insert_many(&events, &attempts).await.expect("insert");
    }
    assert_eq!(
        copies_of(&db, "events", "event_id", "e3").await,
        3,
        "copies must be unmerged"
    );

    for limit in [1, 2, 3, 100] {
        let mut seen = Vec::new();
        let mut request = PageRequest::first(limit);
        for _ in 0..100 {
            let page = store
                .list_events(&tenant, &EventFilter::default(), &request)
                .await
                .expect("list_events");
            assert!(page.items.len() <= limit as usize);
            seen.extend(page.items.into_iter().map(|e| e.id.to_string()));
            match page.next {
                Some(cursor) => request = PageRequest::after(limit, cursor),
                None => break,
            }
        }
        let expected: Vec<String> = (0..7).rev().map(|i| format!("e{i}")).collect();
        assert_eq!(seen, expected, "events, limit {limit}");

        let mut seen = Vec::new();
        let mut request = PageRequest::first(limit);
        for _ in 0..100 {
            let page = store
                .list_attempts(&tenant, &AttemptFilter::default(), &request)
                .await
                .expect("list_attempts");
            seen.extend(page.items.into_iter().map(|a| a.id));
            match page.next {
                Some(cursor) => request = PageRequest::after(limit, cursor),
                None => break,
            }
        }
        let expected: Vec<_> = attempts.iter().rev().map(|a| a.id).collect();
        assert_eq!(seen, expected, "attempts, limit {limit}");
    }

    let keys: Vec<EventKey> = events.iter().map(|e| e.key()).collect();
    let found = store.get_events(&keys).await.expect("get_events");
    assert_eq!(found.len(), 7);
    assert_eq!(found.get(&events[2].key()), Some(&events[2]));
}
