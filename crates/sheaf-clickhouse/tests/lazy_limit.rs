//! Servers that refuse `query_plan_max_limit_for_lazy_materialization`: xtask's users
//! `sheaf_lazy_readonly` (the profile makes the setting read-only) and `sheaf_lazy_bounded` (the
//! profile allows at most 1). Their batched lookups must answer exactly what the default user's
//! do, through the query without the setting, and the store must remember the refusal.

use std::time::Duration;

use sheaf_store::testkit::fixtures::{ago, attempt, event, shift, unique_tenant};
use sheaf_store::{AttemptFilter, AttemptKey, DestinationId, EventFilter, LogStore, PageRequest};
use sheaf_testenv::require_clickhouse;

use crate::support::TestDb;

const MINUTE: i64 = 60 * 1_000_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restricted_users_get_the_same_answers_without_the_setting() {
    let url = require_clickhouse!("restricted_users_get_the_same_answers_without_the_setting");
    let db = TestDb::new(&url);
    let store = db.store().await;

    let tenant = unique_tenant("ch-lazy");
    let t = ago(Duration::from_secs(7200));
    let destinations: Vec<DestinationId> = (0..3).map(|_| DestinationId::generate()).collect();
    let events: Vec<_> = (0..4)
        .map(|i| event(&tenant, &format!("e{i}"), "t", shift(t, i * MINUTE)))
        .collect();
    let mut history = Vec::new();
    for (i, e) in events.iter().enumerate() {
        for (j, d) in destinations.iter().enumerate() {
            for k in 0..(i + j) % 3 {
                history.push(attempt(
                    e,
                    *d,
                    shift(t, (i * 10 + j * 3 + k * 7) as i64 * MINUTE),
                ));
            }
        }
    }
    store.insert_many(&events, &history).await.expect("insert");
    let mut keys: Vec<AttemptKey> = history.iter().map(|a| a.key()).collect();
    keys.push(AttemptKey {
        attempt_time: shift(t, 500 * MINUTE),
        ..history[0].key()
    });
    keys.push(AttemptKey {
        destination_id: DestinationId::generate(),
        ..history[1].key()
    });

    let expected = store.latest_attempts(&keys).await.expect("default user");
    assert!(
        !store.lazy_limit_rejected(),
        "the default user accepts the setting"
    );
    assert!(
        !expected.is_empty() && expected.len() < keys.len(),
        "the case needs hits and misses"
    );

    for user in ["sheaf_lazy_readonly", "sheaf_lazy_bounded"] {
        let mut config = db.config();
        config.user = Some(user.to_owned());
        config.password = Some("sheaf".to_owned());
        let tag = format!("{}-{user}", db.database);
        config
            .settings
            .push(("log_comment".to_owned(), tag.clone()));
        let restricted = sheaf_clickhouse::ClickHouseLogStore::connect(config).expect("connect");
        assert!(!restricted.lazy_limit_rejected());
        let got = restricted
            .latest_attempts(&keys)
            .await
            .unwrap_or_else(|e| panic!("{user}: {e}"));
        assert_eq!(got, expected, "{user}: the fallback query answers the same");
        assert!(
            restricted.lazy_limit_rejected(),
            "{user}: the refusal is remembered"
        );
        // Once known, the setting is not sent again: the next batch succeeds at the first try.
        let again = restricted.latest_attempts(&keys).await.expect("again");
        assert_eq!(again, expected, "{user}: second batch");

        // Two batches answered, after exactly one refused query. The server logs a query after
        // answering it, so the log is read until both answers are in (bounded).
        let mut logged = (0, 0);
        for _ in 0..50 {
            db.execute("SYSTEM FLUSH LOGS").await;
            logged = db
                .client()
                .query(
                    "SELECT countIf(type = 'QueryFinish'), \
                        countIf(type IN ('ExceptionBeforeStart', 'ExceptionWhileProcessing')) \
                     FROM system.query_log WHERE log_comment = ? AND event_date >= yesterday()",
                )
                .bind(tag.as_str())
                .fetch_one::<(u64, u64)>()
                .await
                .expect("read query_log");
            if logged.0 >= 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert_eq!(
            logged,
            (2, 1),
            "{user}: (answered, refused) queries; the setting is refused once and not sent again"
        );
    }
}

/// A `readonly = 1` session may change no setting at all, so every optional setting is refused
/// (code 164): the lookups and the listings both fall back, and answer as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_readonly_session_gets_the_same_answers_without_any_setting() {
    let url = require_clickhouse!("a_readonly_session_gets_the_same_answers_without_any_setting");
    let db = TestDb::new(&url);
    let store = db.store().await;
    let tenant = unique_tenant("ch-readonly");
    let t = ago(Duration::from_secs(3600));
    let events: Vec<_> = (0..5)
        .map(|i| event(&tenant, &format!("e{i}"), "t", shift(t, i * MINUTE)))
        .collect();
    let d = DestinationId::generate();
    let attempts: Vec<_> = events
        .iter()
        .map(|e| attempt(e, d, shift(e.time, MINUTE)))
        .collect();
    store.insert_many(&events, &attempts).await.expect("insert");
    let keys: Vec<AttemptKey> = attempts.iter().map(|a| a.key()).collect();
    let page = PageRequest::first(3);

    let expected = (
        store.latest_attempts(&keys).await.expect("lookup"),
        store
            .list_events(&tenant, &EventFilter::default(), &page)
            .await
            .expect("events"),
        store
            .list_attempts(&tenant, &AttemptFilter::default(), &page)
            .await
            .expect("attempts"),
    );
    assert!(!store.listing_settings_rejected() && !store.lazy_limit_rejected());

    let mut config = db.config();
    config
        .settings
        .push(("readonly".to_owned(), "1".to_owned()));
    let readonly = sheaf_clickhouse::ClickHouseLogStore::connect(config).expect("connect");
    let got = (
        readonly.latest_attempts(&keys).await.expect("lookup"),
        readonly
            .list_events(&tenant, &EventFilter::default(), &page)
            .await
            .expect("events"),
        readonly
            .list_attempts(&tenant, &AttemptFilter::default(), &page)
            .await
            .expect("attempts"),
    );
    assert_eq!(got, expected);
    assert!(readonly.lazy_limit_rejected(), "the lookup fell back");
    assert!(
        readonly.listing_settings_rejected(),
        "the listings fell back"
    );
    assert_eq!(expected.0.len(), 5);
    assert_eq!(expected.1.items.len(), 3);
}
