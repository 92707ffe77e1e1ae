//! Events held for their jobs: the memory queue built with `holding_events_in` keeps every
//! event it has a job for out of the log's retention, until the job (or its dead letter) is gone.

use std::sync::Arc;
use std::time::Duration;

use sheaf_memory::{LogRetention, MemoryJobQueue, MemoryLogStore, PendingWork, QueueLimits};
use sheaf_store::testkit::fixtures::{ago, attempt, event, job, shift, unique_tenant};
use sheaf_store::{DeadLetterRequest, Event, Job, JobQueue, LogStore, Timestamp};

/// A job for `event`, due now.
fn job_for(event: &Event) -> Job {
    Job {
        event_id: event.id.clone(),
        ..job(&event.tenant_id, Timestamp::now())
    }
}

#[tokio::test]
async fn events_with_jobs_outlive_retention_until_their_jobs_are_gone() {
    let log = Arc::new(MemoryLogStore::new(LogRetention {
        max_age: None,
        max_events: 2,
        max_attempts: 1,
    }));
    let queue = MemoryJobQueue::holding_events_in(QueueLimits::default(), Arc::clone(&log));
    let tenant = unique_tenant("holds");
    let t = ago(Duration::from_secs(60));
    let events: Vec<_> = (0..6)
        .map(|i| event(&tenant, &format!("e{i}"), "t", shift(t, i * 1_000_000)))
        .collect();
    // The two oldest events get a job each, as a publish does: written, then enqueued.
    let (first, second) = (job_for(&events[0]), job_for(&events[1]));
    log.insert_many(&events[..2], &[]).await.expect("insert");
    queue
        .enqueue(&[first.clone(), second.clone()])
        .await
        .expect("enqueue");
    // A failed attempt of the first, then four newer events nobody waits for.
    let failed = attempt(&events[0], first.destination_id, shift(t, 500_000));
    log.insert_many(&events[2..], std::slice::from_ref(&failed))
        .await
        .expect("insert");

    let held = log.pending();
    assert_eq!(held.events, 2, "both events with jobs are held");
    assert!(held.payload_bytes > 0);
    assert_eq!(
        log.len(),
        (4, 1),
        "retention kept 2 unheld events beside the 2 held ones"
    );
    for e in &events[..2] {
        assert!(
            log.get_event(&tenant, &e.id).await.expect("get").is_some(),
            "{} is owed a delivery and must not be dropped",
            e.id
        );
    }
    assert_eq!(
        log.latest_attempt(&failed.key()).await.expect("latest"),
        Some(failed.clone()),
        "the retry's previous attempt is kept with its event"
    );

    // The first job fails for good: a dead letter can be replayed, so it still holds.
    let claimed = queue
        .claim(2, Duration::from_secs(30))
        .await
        .expect("claim");
    let lease_of = |id| {
        claimed
            .iter()
            .find(|c| c.job.id == id)
            .expect("claimed")
            .lease
    };
    queue
        .dead_letter(&[DeadLetterRequest {
            lease: lease_of(first.id),
            reason: "test".to_owned(),
            hold_key: false,
        }])
        .await
        .expect("dead letter");
    // The second is delivered: its event is free to age out now.
    queue
        .complete(&[lease_of(second.id)])
        .await
        .expect("complete");
    log.maintain().await.expect("maintain");
    assert_eq!(log.pending().events, 1);
    assert!(
        log.get_event(&tenant, &events[0].id)
            .await
            .expect("get")
            .is_some()
    );
    assert_eq!(
        log.get_event(&tenant, &events[1].id).await.expect("get"),
        None,
        "released, it is the oldest unheld event and goes first"
    );

    // Removing the dead letter (as a replay does once it has enqueued anew) releases it.
    let removed = queue
        .remove_dead_letters(&tenant, &[first.id])
        .await
        .expect("remove");
    assert_eq!(removed, 1);
    log.maintain().await.expect("maintain");
    assert_eq!(log.pending(), PendingWork::default());
    assert_eq!(
        log.get_event(&tenant, &events[0].id).await.expect("get"),
        None
    );
    assert_eq!(log.len(), (2, 0));
}
