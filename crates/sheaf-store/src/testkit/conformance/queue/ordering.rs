//! Per-key ordering: jobs of one destination with the same order key go one at a time, in the
//! order they were enqueued, through retries, lease expiry and dead letters, while other keys,
//! other destinations and unordered jobs go in parallel; and concurrent claimers never hold two
//! jobs of one key at once.

use std::collections::{HashMap, HashSet};

use super::*;
use crate::DestinationId;

fn keyed(tenant: &TenantId, destination: DestinationId, key: &str, due_at: Timestamp) -> Job {
    Job {
        destination_id: destination,
        order_key: Some(key.to_owned()),
        ..job(tenant, due_at)
    }
}

/// Completes held jobs, none of whose leases may be lost.
async fn done(queue: &dyn JobQueue, leases: &[Lease]) {
    let lost = queue.complete(leases).await.expect("complete failed");
    assert!(lost.is_empty(), "leases lost: {lost:?}");
}

fn ids(claimed: &[ClaimedJob]) -> HashSet<JobId> {
    claimed.iter().map(|c| c.job.id).collect()
}

pub async fn ordered_jobs_of_a_key_go_one_at_a_time_in_enqueue_order(queue: &dyn JobQueue) {
    let case = "ordered_jobs_of_a_key_go_one_at_a_time_in_enqueue_order";
    assert_idle(queue, case).await;
    let tenant = unique_tenant("queue-ordered");
    let now = Timestamp::now();
    let (d, other) = (DestinationId::generate(), DestinationId::generate());
    // Enqueued in this order; each later job of `order-1` is due earlier than the one before,
    // so due order alone would hand them out reversed.
    let a1 = keyed(&tenant, d, "order-1", shift(now, -SECOND));
    let a2 = keyed(&tenant, d, "order-1", shift(now, -2 * SECOND));
    let a3 = keyed(&tenant, d, "order-1", shift(now, -3 * SECOND));
    let b1 = keyed(&tenant, d, "order-2", shift(now, -SECOND));
    let c1 = keyed(&tenant, other, "order-1", shift(now, -SECOND));
    let free = Job {
        destination_id: d,
        ..job(&tenant, shift(now, -SECOND))
    };
    let free2 = Job {
        destination_id: d,
        ..job(&tenant, shift(now, -SECOND))
    };
    queue
        .enqueue(&[a1.clone(), a2.clone()])
        .await
        .expect("enqueue failed");
    queue
        .enqueue(&[
            a3.clone(),
            b1.clone(),
            c1.clone(),
            free.clone(),
            free2.clone(),
        ])
        .await
        .expect("enqueue failed");

    let first = claim(queue, 10, LONG).await;
    assert_eq!(
        ids(&first),
        HashSet::from([a1.id, b1.id, c1.id, free.id, free2.id]),
        "{case}: the first of each key, the other destination's and the unordered jobs"
    );
    assert!(
        claim(queue, 10, LONG).await.is_empty(),
        "{case}: nothing more of order-1 while its first job is held"
    );
    let held = |job: &Job| {
        first
            .iter()
            .find(|c| c.job.id == job.id)
            .expect("claimed")
            .lease
    };
    let others: Vec<Lease> = [&b1, &c1, &free, &free2].into_iter().map(held).collect();
    done(queue, &others).await;

    // A retry keeps its place: rescheduled, the first job still holds the key back, and comes
    // back before the second.
    let lost = queue
        .reschedule(&[Reschedule {
            lease: held(&a1),
            due_at: shift(Timestamp::now(), SECOND / 5),
            attempt_number: 2,
            last_attempt_time: Some(Timestamp::now()),
        }])
        .await
        .expect("reschedule failed");
    assert!(lost.is_empty());
    assert!(
        claim(queue, 10, LONG).await.is_empty(),
        "{case}: the second job waits while the first waits for its retry"
    );
    let retried = claim_within(queue, EXPIRY_WAIT, SHORT).await;
    assert_eq!(
        ids(&retried),
        HashSet::from([a1.id]),
        "{case}: the retry comes first"
    );

    // A lease that runs out: the first job is claimed again, still before the second.
    tokio::time::sleep(SHORT + Duration::from_millis(50)).await;
    let again = claim_within(queue, EXPIRY_WAIT, LONG).await;
    assert_eq!(
        ids(&again),
        HashSet::from([a1.id]),
        "{case}: after its lease ran out, the first job again, not the second"
    );
    done(queue, &leases_of(&again)).await;

    // Done: the second goes; dead-lettered, the third goes.
    let second = claim(queue, 10, LONG).await;
    assert_eq!(
        ids(&second),
        HashSet::from([a2.id]),
        "{case}: then the second"
    );
    let lost = queue
        .dead_letter(&[DeadLetterRequest {
            lease: second[0].lease,
            reason: "gave up".to_owned(),
            hold_key: false,
        }])
        .await
        .expect("dead_letter failed");
    assert!(lost.is_empty());
    let third = claim(queue, 10, LONG).await;
    assert_eq!(
        ids(&third),
        HashSet::from([a3.id]),
        "{case}: a dead letter lets the next go"
    );
    done(queue, &leases_of(&third)).await;
    purge(queue, &[&tenant]).await;
    assert_idle(queue, case).await;
}

/// Claims until something comes, for at most `wait`.
async fn claim_within(queue: &dyn JobQueue, wait: Duration, lease: Duration) -> Vec<ClaimedJob> {
    let deadline = Instant::now() + wait;
    loop {
        let claimed = claim(queue, 10, lease).await;
        if !claimed.is_empty() || Instant::now() > deadline {
            return claimed;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub async fn concurrent_claimers_keep_each_key_in_order(queue: &dyn JobQueue) {
    let case = "concurrent_claimers_keep_each_key_in_order";
    assert_idle(queue, case).await;
    let tenant = unique_tenant("queue-ordered-concurrent");
    let now = Timestamp::now();
    let destination = DestinationId::generate();
    // Ten keys of eight jobs, enqueued in calls of a few, interleaved, each due earlier than
    // the one before.
    let mut jobs = Vec::new();
    for n in 0..8i64 {
        for k in 0..10 {
            jobs.push(keyed(
                &tenant,
                destination,
                &format!("key-{k}"),
                shift(now, -(n * 10 + k) * 1000),
            ));
        }
    }
    let position: HashMap<JobId, (String, usize)> = jobs
        .iter()
        .enumerate()
        .map(|(i, j)| (j.id, (j.order_key.clone().expect("keyed"), i)))
        .collect();
    for chunk in jobs.chunks(7) {
        queue.enqueue(chunk).await.expect("enqueue failed");
    }
    let held: std::sync::Mutex<HashSet<String>> = std::sync::Mutex::new(HashSet::new());
    let done: std::sync::Mutex<Vec<JobId>> = std::sync::Mutex::new(Vec::new());
    let claimer = || async {
        let mut idle_rounds = 0;
        while idle_rounds < 20 {
            let batch = claim(queue, 4, LONG).await;
            if batch.is_empty() {
                idle_rounds += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
                continue;
            }
            idle_rounds = 0;
            for c in &batch {
                let key = c.job.order_key.clone().expect("keyed");
                assert!(
                    held.lock().expect("lock").insert(key.clone()),
                    "{case}: two jobs of {key} held at once"
                );
            }
            tokio::task::yield_now().await;
            for c in &batch {
                held.lock()
                    .expect("lock")
                    .remove(c.job.order_key.as_deref().expect("keyed"));
                done.lock().expect("lock").push(c.job.id);
            }
            assert!(
                queue
                    .complete(&leases_of(&batch))
                    .await
                    .expect("complete failed")
                    .is_empty()
            );
        }
    };
    futures::future::join_all((0..4).map(|_| claimer())).await;
    let done = done.into_inner().expect("lock");
    assert_eq!(done.len(), jobs.len(), "{case}: every job was claimed once");
    let mut last: HashMap<&str, usize> = HashMap::new();
    for id in &done {
        let (key, at) = &position[id];
        if let Some(before) = last.insert(key, *at) {
            assert!(before < *at, "{case}: {key} went out of order");
        }
    }
    purge(queue, &[&tenant]).await;
    assert_idle(queue, case).await;
}

/// Dead-lettered with `hold_key`, an ordered job keeps its key: the key's later jobs wait
/// while other keys and unordered jobs go; requeued, it comes back first of its key as attempt
/// 1; removed, it lets the next go. Without `hold_key`, a requeued job goes after its key's
/// queued ones. A job without a key never holds anything.
pub async fn a_dead_letter_that_holds_its_key_keeps_it_until_requeued_or_removed(
    queue: &dyn JobQueue,
) {
    let case = "a_dead_letter_that_holds_its_key_keeps_it_until_requeued_or_removed";
    assert_idle(queue, case).await;
    let tenant = unique_tenant("queue-ordered-held");
    let past = shift(Timestamp::now(), -SECOND);
    let d = DestinationId::generate();
    let [a1, a2, a3] = [0, 1, 2].map(|_| keyed(&tenant, d, "held", past));
    let [b1, b2] = [0, 1].map(|_| keyed(&tenant, d, "let-go", past));
    let free = Job {
        destination_id: d,
        ..job(&tenant, past)
    };
    let all = [&a1, &a2, &a3, &b1, &b2, &free].map(|j| (*j).clone());
    queue.enqueue(&all).await.expect("enqueue failed");
    let give_up = |claimed: &[ClaimedJob], job: &Job, hold_key: bool| DeadLetterRequest {
        lease: claimed
            .iter()
            .find(|c| c.job.id == job.id)
            .expect("claimed")
            .lease,
        reason: "gave up".to_owned(),
        hold_key,
    };

    let first = claim(queue, 10, LONG).await;
    assert_eq!(
        ids(&first),
        HashSet::from([a1.id, b1.id, free.id]),
        "{case}"
    );
    let lost = queue
        .dead_letter(&[
            give_up(&first, &a1, true),
            give_up(&first, &b1, false),
            give_up(&first, &free, true),
        ])
        .await
        .expect("dead_letter failed");
    assert!(lost.is_empty(), "{case}: leases lost: {lost:?}");
    let next = claim(queue, 10, LONG).await;
    assert_eq!(
        ids(&next),
        HashSet::from([b2.id]),
        "{case}: the key let go moves on; the held key's second job waits for its dead letter"
    );
    assert_eq!(
        queue.depth().await.expect("depth failed"),
        QueueDepth {
            due: 0,
            scheduled: 2,
            claimed: 1,
            dead_lettered: 3,
        },
        "{case}: the held key's two jobs wait; the dead letter that holds it counts once, as a \
         dead letter"
    );
    let listed = queue
        .list_dead_letters(&tenant, &PageRequest::first(10))
        .await
        .expect("list_dead_letters failed");
    let holds: HashMap<JobId, bool> = listed
        .items
        .iter()
        .map(|d| (d.job.id, d.holds_key))
        .collect();
    assert_eq!(
        holds,
        HashMap::from([(a1.id, true), (b1.id, false), (free.id, false)]),
        "{case}: which dead letters hold their keys (one without a key holds nothing)"
    );
    queue
        .enqueue(std::slice::from_ref(&a1))
        .await
        .expect("enqueue failed");
    assert!(
        claim(queue, 10, LONG).await.is_empty(),
        "{case}: a held dead letter's id stays taken"
    );

    // Requeued: the held job comes back first of its key, as attempt 1; the one that let its
    // key go comes back after its key's queued job (b2, still held).
    let other = unique_tenant("queue-ordered-held-other");
    assert_eq!(
        queue
            .requeue_dead_letters(&other, &[a1.id, b1.id])
            .await
            .expect("requeue_dead_letters failed"),
        0,
        "{case}: another tenant's dead letters are not requeued"
    );
    let requeued = queue
        .requeue_dead_letters(&tenant, &[a1.id, b1.id, free.id, JobId::generate()])
        .await
        .expect("requeue_dead_letters failed");
    assert_eq!(requeued, 3, "{case}: three dead letters went back");
    let back = claim(queue, 10, LONG).await;
    assert_eq!(
        ids(&back),
        HashSet::from([a1.id, free.id]),
        "{case}: the held job before its key's later ones; b1 behind b2"
    );
    let a1_back = &back.iter().find(|c| c.job.id == a1.id).expect("a1").job;
    assert_eq!(
        (a1_back.attempt_number, a1_back.last_attempt_time),
        (1, None),
        "{case}: a requeued job starts again at attempt 1"
    );
    done(queue, &leases_of(&next)).await;
    assert_eq!(
        ids(&claim(queue, 10, LONG).await),
        HashSet::from([b1.id]),
        "{case}: the requeued job of the key let go comes after b2"
    );

    // Held again, then removed (skipped): the key's next job goes.
    let free_lease = back.iter().find(|c| c.job.id == free.id).expect("free");
    done(queue, &[free_lease.lease]).await;
    queue
        .dead_letter(&[give_up(&back, &a1, true)])
        .await
        .expect("dead_letter failed");
    assert!(
        claim(queue, 10, LONG).await.is_empty(),
        "{case}: held again"
    );
    assert_eq!(
        queue
            .remove_dead_letters(&tenant, &[a1.id])
            .await
            .expect("remove_dead_letters failed"),
        1,
        "{case}"
    );
    let after = claim(queue, 10, LONG).await;
    assert_eq!(
        ids(&after),
        HashSet::from([a2.id]),
        "{case}: a removed dead letter lets its key's next job go"
    );

    // Purged while a dead letter holds the key: its job and dead letter count once.
    queue
        .dead_letter(&[give_up(&after, &a2, true)])
        .await
        .expect("dead_letter failed");
    let removed = queue
        .purge_tenant(&tenant)
        .await
        .expect("purge_tenant failed");
    assert_eq!(
        removed, 3,
        "{case}: a3, b1 (still held) and a2's dead letter"
    );
    assert_idle(queue, case).await;
}
