//! Retention on the SQLite log: counts and age, held events kept, space reused.

use std::time::Duration;

use sheaf_sqlite::{LogRetention, SqliteOptions};
use sheaf_store::testkit::fixtures::{ago, attempt, event, shift, unique_tenant};
use sheaf_store::{
    DestinationId, Event, EventFilter, Job, JobId, JobQueue, LogStore, PageRequest, Payload,
    TenantId, Timestamp,
};

use crate::support::{TestDb, fill_until_refused};

/// Inserts event `id` with a job for destination `d` due in an hour: an event retention must
/// keep.
async fn insert_held(
    log: &dyn LogStore,
    queue: &dyn JobQueue,
    tenant: &TenantId,
    id: &str,
    d: DestinationId,
) -> Event {
    let e = event(tenant, id, "t", Timestamp::now());
    log.insert_many(std::slice::from_ref(&e), &[])
        .await
        .expect("insert");
    queue
        .enqueue(&[Job {
            id: JobId::generate(),
            tenant_id: tenant.clone(),
            event_id: e.id.clone(),
            destination_id: d,
            attempt_number: 1,
            last_attempt_time: None,
            due_at: Timestamp::now().saturating_add(Duration::from_secs(3600)),
            order_key: None,
        }])
        .await
        .expect("enqueue");
    e
}

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
            order_key: None,
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

/// Under a size cap, new events stop at the door while deliveries' attempts still write into
/// the reserve; retention then frees the oldest delivered history beyond its bounds (which
/// would keep everything here), never an event a job waits for, and new events fit again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capped_file_refuses_new_events_first_and_frees_history_by_itself() {
    let db = TestDb::with_options(
        "retention-cap",
        SqliteOptions {
            max_size_bytes: Some(2 * 1024 * 1024),
            retention: LogRetention {
                max_age: None,
                max_events: 1_000_000,
                max_attempts: 1_000_000,
            },
            ..SqliteOptions::default()
        },
    )
    .await;
    let (log, queue) = (db.store.log_store(), db.store.job_queue());
    let tenant = unique_tenant("cap");
    let d = DestinationId::generate();
    // This event waits for a delivery: retention must keep it.
    let held = insert_held(log.as_ref(), queue.as_ref(), &tenant, "held", d).await;
    let (written, refusal) = fill_until_refused(log.as_ref(), &tenant, 2000, 10, 200).await;
    let refusal = refusal.expect("the door shut before 2,000 events of 2 KB");
    assert_eq!(refusal.kind(), sheaf_store::ErrorKind::Unavailable);
    assert!(
        refusal.to_string().contains("size limit"),
        "the refusal says why: {refusal}"
    );
    eprintln!("refused after {} events: {refusal}", written.len());

    // Deliveries write on into the reserve: attempts alone are taken.
    let attempts: Vec<_> = written[..20]
        .iter()
        .map(|e| attempt(e, d, Timestamp::now()))
        .collect();
    log.insert_many(&[], &attempts)
        .await
        .expect("attempts are written behind a shut door");

    while log.maintain().await.expect("maintain") {}
    let again = event(&tenant, "after", "t", Timestamp::now());
    log.insert_many(std::slice::from_ref(&again), &[])
        .await
        .expect("new events fit once retention freed history");
    let kept = |e: &sheaf_store::Event| {
        let log = log.clone();
        let (tenant, id) = (e.tenant_id.clone(), e.id.clone());
        async move { log.get_event(&tenant, &id).await.expect("read").is_some() }
    };
    assert!(kept(&held).await, "the held event stays");
    assert!(
        !kept(&written[0]).await,
        "the oldest delivered history went"
    );
    assert!(
        kept(written.last().expect("some")).await,
        "the newest stays"
    );
    db.store.close().await;
}

/// When only waiting deliveries fill a capped file, their superseded failed attempts make room
/// (a retry reads only the latest), so recording attempts never stalls for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capped_file_full_of_retries_keeps_only_the_latest_attempts() {
    let db = TestDb::with_options(
        "retention-retries",
        SqliteOptions {
            max_size_bytes: Some(1024 * 1024),
            ..SqliteOptions::default()
        },
    )
    .await;
    let (log, queue) = (db.store.log_store(), db.store.job_queue());
    let tenant = unique_tenant("retries");
    let d = DestinationId::generate();
    let e = insert_held(log.as_ref(), queue.as_ref(), &tenant, "waiting", d).await;
    let t = ago(Duration::from_secs(3600));
    let failing = |n: i64| {
        let mut a = attempt(&e, d, shift(t, n * 1000));
        a.response_body = Some("no".repeat(1000));
        a
    };
    let mut n = 0;
    let full = loop {
        let batch: Vec<_> = (n..n + 20).map(failing).collect();
        match log.insert_many(&[], &batch).await {
            Ok(()) => n += 20,
            Err(e) => break e,
        }
        assert!(n < 10_000, "the 1 MiB limit was never reached");
    };
    assert_eq!(full.kind(), sheaf_store::ErrorKind::Unavailable, "{full}");
    eprintln!("{n} attempts filled the file: {full}");
    while log.maintain().await.expect("maintain") {}
    let latest = failing(n - 1);
    let kept = log
        .list_attempts(
            &tenant,
            &sheaf_store::AttemptFilter::default(),
            &PageRequest::first(500),
        )
        .await
        .expect("list");
    eprintln!("{} of {n} attempts kept", kept.items.len());
    assert!(
        kept.items.len() < n as usize,
        "superseded attempts went: all {n} kept"
    );
    assert!(
        kept.items.iter().all(|a| a.time != t),
        "the oldest attempt went first"
    );
    let newest = log
        .latest_attempt(&sheaf_store::AttemptKey {
            tenant_id: tenant.clone(),
            event_id: e.id.clone(),
            destination_id: d,
            attempt_time: t,
        })
        .await
        .expect("latest")
        .expect("the latest attempt stays");
    assert_eq!(newest.time, latest.time);
    log.insert_many(&[], &[failing(n)])
        .await
        .expect("attempts are recorded again");
    db.store.close().await;
}
