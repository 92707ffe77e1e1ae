//! Retention on the SQLite log: counts and age, held events kept, space reused.

use std::time::Duration;

use sheaf_sqlite::{LogRetention, SqliteOptions};
use sheaf_store::testkit::fixtures::{ago, attempt, event, shift, unique_tenant};
use sheaf_store::{DestinationId, EventFilter, Job, JobId, PageRequest, Payload, Timestamp};

use crate::support::TestDb;

fn retaining(retention: LogRetention) -> SqliteOptions {
    SqliteOptions {
        retention,
        ..SqliteOptions::default()
    }
}

/// The oldest records go first, down to the counts; an event a job waits for stays, with its
/// attempts; an event's attempts go with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_keeps_the_newest_and_the_held() {
    let db = TestDb::with_options(
        "retention-count",
        retaining(LogRetention {
            max_age: None,
            max_events: 5,
            max_attempts: 3,
        }),
    )
    .await;
    let (log, queue) = (db.store.log_store(), db.store.job_queue());
    let tenant = unique_tenant("retention");
    let t = ago(Duration::from_secs(60));
    let events: Vec<_> = (0..8)
        .map(|i| event(&tenant, &format!("e{i}"), "t", shift(t, i * 1_000_000)))
        .collect();
    let d = DestinationId::generate();
    // e0 is held by a job and has an attempt; e1 has one and is not held.
    let attempts = vec![
        attempt(&events[0], d, shift(t, 100)),
        attempt(&events[1], d, shift(t, 1_000_100)),
    ];
    log.insert_many(&events, &attempts).await.expect("insert");
    queue
        .enqueue(&[Job {
            id: JobId::generate(),
            tenant_id: tenant.clone(),
            event_id: events[0].id.clone(),
            destination_id: d,
            attempt_number: 2,
            last_attempt_time: Some(attempts[0].time),
            due_at: Timestamp::now().saturating_add(Duration::from_secs(3600)),
        }])
        .await
        .expect("enqueue");

    assert!(
        log.maintain().await.expect("maintain"),
        "it deleted something"
    );
    let page = log
        .list_events(&tenant, &EventFilter::default(), &PageRequest::first(100))
        .await
        .expect("list");
    let ids: Vec<&str> = page.items.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(
        ids,
        ["e7", "e6", "e5", "e4", "e3", "e0"],
        "the newest five and the held one"
    );
    assert_eq!(
        log.get_attempt(&tenant, &attempts[0].id)
            .await
            .expect("get"),
        Some(attempts[0].clone()),
        "the held event's attempt stays"
    );
    assert_eq!(
        log.get_attempt(&tenant, &attempts[1].id)
            .await
            .expect("get"),
        None,
        "an attempt goes with its event"
    );
    assert!(
        !log.maintain().await.expect("maintain"),
        "nothing more to do"
    );
    db.store.close().await;
}

/// Records past the age go, whatever the counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_drops_what_is_too_old() {
    let db = TestDb::with_options(
        "retention-age",
        retaining(LogRetention {
            max_age: Some(Duration::from_secs(60)),
            max_events: 1000,
            max_attempts: 1000,
        }),
    )
    .await;
    let log = db.store.log_store();
    let tenant = unique_tenant("age");
    let old = event(&tenant, "old", "t", ago(Duration::from_secs(120)));
    let new = event(&tenant, "new", "t", Timestamp::now());
    let d = DestinationId::generate();
    let old_attempt = attempt(&new, d, ago(Duration::from_secs(90)));
    let new_attempt = attempt(&new, d, Timestamp::now());
    log.insert_many(
        &[old.clone(), new.clone()],
        &[old_attempt.clone(), new_attempt.clone()],
    )
    .await
    .expect("insert");
    assert!(log.maintain().await.expect("maintain"));
    assert_eq!(log.get_event(&tenant, &old.id).await.expect("get"), None);
    assert_eq!(
        log.get_event(&tenant, &new.id).await.expect("get"),
        Some(new)
    );
    assert_eq!(
        log.get_attempt(&tenant, &old_attempt.id)
            .await
            .expect("get"),
        None
    );
    assert!(
        log.get_attempt(&tenant, &new_attempt.id)
            .await
            .expect("get")
            .is_some()
    );
    db.store.close().await;
}

/// A flood under a count bound reuses the space retention frees: the file stops growing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_under_retention_keeps_the_file_bounded() {
    let db = TestDb::with_options(
        "retention-flood",
        retaining(LogRetention {
            max_age: None,
            max_events: 1000,
            max_attempts: 1000,
        }),
    )
    .await;
    let log = db.store.log_store();
    let tenant = unique_tenant("flood");
    let payload = Payload::new(serde_json::json!({ "blob": "x".repeat(2000) }));
    let mut sizes = Vec::new();
    for round in 0..10 {
        let events: Vec<_> = (0..1000)
            .map(|i| {
                let mut e = event(&tenant, &format!("r{round}-{i}"), "t", Timestamp::now());
                e.data = payload.clone();
                e
            })
            .collect();
        log.insert_many(&events, &[]).await.expect("insert");
        while log.maintain().await.expect("maintain") {}
        let pages: i64 = sqlx::query_scalar("PRAGMA page_count")
            .fetch_one(db.store.readers())
            .await
            .expect("page_count");
        sizes.push(pages);
    }
    eprintln!("pages after each round of 1,000 events: {sizes:?}");
    let (second, last) = (sizes[1], sizes[sizes.len() - 1]);
    assert!(
        last * 2 <= second * 3,
        "the file grew past 1.5x of its size after the second round: {sizes:?}"
    );
    db.store.close().await;
}
