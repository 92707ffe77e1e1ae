//! Leases: expiry, renewal, reschedule and release.

use super::*;

/// Polls `claim(1, LONG)` until it returns something or `EXPIRY_WAIT` passes.
async fn claim_when_expired(queue: &dyn JobQueue, started: Instant) -> Vec<ClaimedJob> {
    loop {
        tokio::time::sleep(Duration::from_millis(25)).await;
        let claimed = claim(queue, 1, LONG).await;
        if !claimed.is_empty() {
            return claimed;
        }
        assert!(
            started.elapsed() < EXPIRY_WAIT,
            "a job whose {SHORT:?} lease ran out was not claimable within {EXPIRY_WAIT:?}"
        );
    }
}

/// A job whose lease runs out is claimable again, not before; the new claim holds and the old
/// lease is lost for every operation.
pub async fn expired_lease_returns_the_job(queue: &dyn JobQueue) {
    assert_idle(queue, "expired_lease_returns_the_job").await;
    let tenant = unique_tenant("queue-expiry");
    let j = job(&tenant, shift(Timestamp::now(), -SECOND));
    queue
        .enqueue(std::slice::from_ref(&j))
        .await
        .expect("enqueue failed");

    let started = Instant::now();
    let first = claim(queue, 1, SHORT).await;
    assert_eq!(jobs_of(&first), vec![j.clone()]);
    let early = claim(queue, 1, LONG).await;
    // The lease ends at least SHORT after `started`, so a claim that returns the job sooner broke
    // it. (On a stalled machine the lease may really have run out already; that is no failure.)
    let second = if early.is_empty() {
        claim_when_expired(queue, started).await
    } else {
        early
    };
    assert!(
        started.elapsed() >= SHORT,
        "the job was claimed again while its lease held"
    );
    assert_eq!(jobs_of(&second), vec![j.clone()]);
    let (old, new) = (first[0].lease, second[0].lease);
    assert!(
        new.claimed_until > old.claimed_until,
        "a new claim must end later than the old one"
    );

    let ids = vec![j.id];
    let renewed = queue.renew(&[old], LONG).await.expect("renew failed");
    assert_eq!(
        (renewed.leases, renewed.lost),
        (vec![], ids.clone()),
        "renew with a lost lease"
    );
    assert_eq!(
        queue.complete(&[old]).await.expect("complete"),
        ids,
        "complete with a lost lease"
    );
    let move_back = Reschedule {
        lease: old,
        due_at: Timestamp::now(),
        attempt_number: 2,
        last_attempt_time: None,
    };
    assert_eq!(
        queue.reschedule(&[move_back]).await.expect("reschedule"),
        ids
    );
    assert_eq!(
        queue.release(&[old]).await.expect("release"),
        ids,
        "release with a lost lease"
    );
    let give_up = DeadLetterRequest {
        lease: old,
        reason: "stale".to_owned(),
        hold_key: false,
    };
    assert_eq!(
        queue.dead_letter(&[give_up]).await.expect("dead_letter"),
        ids
    );
    assert!(
        claim(queue, 1, LONG).await.is_empty(),
        "the new owner's claim must survive lost operations"
    );
    assert!(
        queue
            .complete(&[new])
            .await
            .expect("complete failed")
            .is_empty()
    );
    assert_idle(queue, "expired_lease_returns_the_job (end)").await;
    purge(queue, &[&tenant]).await;
}

/// Renewal moves `claimed_until` past the original lease and returns the new lease; the old one
/// is lost afterwards, and renewing a completed job reports it lost.
pub async fn renew_extends_the_lease(queue: &dyn JobQueue) {
    assert_idle(queue, "renew_extends_the_lease").await;
    let tenant = unique_tenant("queue-renew");
    let j = job(&tenant, shift(Timestamp::now(), -SECOND));
    queue
        .enqueue(std::slice::from_ref(&j))
        .await
        .expect("enqueue failed");
    let claimed = claim(queue, 1, Duration::from_millis(300)).await;
    let old = claimed[0].lease;
    let renewed = queue.renew(&[old], LONG).await.expect("renew failed");
    assert!(renewed.lost.is_empty(), "a held lease renews");
    assert_eq!(renewed.leases.len(), 1);
    let new = renewed.leases[0];
    assert_eq!(new.job_id, j.id);
    assert!(
        new.claimed_until > old.claimed_until,
        "renewal extends the lease"
    );

    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(
        claim(queue, 1, LONG).await.is_empty(),
        "a renewed job stays held past its first lease"
    );
    let stale = queue.renew(&[old], LONG).await.expect("renew failed");
    assert_eq!(
        (stale.leases, stale.lost),
        (vec![], vec![j.id]),
        "the pre-renewal lease is lost"
    );
    assert!(
        queue
            .complete(&[new])
            .await
            .expect("complete failed")
            .is_empty()
    );
    let gone = queue.renew(&[new], LONG).await.expect("renew failed");
    assert_eq!(
        gone.lost,
        vec![j.id],
        "renewing a completed job reports it lost"
    );
    purge(queue, &[&tenant]).await;
}

/// Reschedule moves a job to its new due time with its new attempt number and carried attempt
/// time, and unclaims it.
pub async fn reschedule_moves_the_job(queue: &dyn JobQueue) {
    assert_idle(queue, "reschedule_moves_the_job").await;
    let tenant = unique_tenant("queue-reschedule");
    let now = Timestamp::now();
    let (later, soon) = (
        job(&tenant, shift(now, -2 * SECOND)),
        job(&tenant, shift(now, -SECOND)),
    );
    queue
        .enqueue(&[later.clone(), soon.clone()])
        .await
        .expect("enqueue failed");
    let claimed = claim(queue, 2, LONG).await;
    assert_eq!(jobs_of(&claimed), vec![later.clone(), soon.clone()]);

    let attempt_time = shift(Timestamp::now(), -SECOND + 7);
    let moves = [
        Reschedule {
            lease: claimed[0].lease,
            due_at: shift(now, 3600 * SECOND),
            attempt_number: 2,
            last_attempt_time: Some(attempt_time),
        },
        Reschedule {
            lease: claimed[1].lease,
            due_at: shift(now, -500_000),
            attempt_number: 3,
            last_attempt_time: Some(shift(attempt_time, 1)),
        },
    ];
    assert!(
        queue
            .reschedule(&moves)
            .await
            .expect("reschedule failed")
            .is_empty()
    );
    let again = claim(queue, 10, LONG).await;
    let moved = Job {
        attempt_number: 3,
        last_attempt_time: Some(shift(attempt_time, 1)),
        due_at: shift(now, -500_000),
        ..soon
    };
    assert_eq!(
        jobs_of(&again),
        vec![moved],
        "only the job rescheduled into the past is due, as moved"
    );
    let depth = queue.depth().await.expect("depth failed");
    assert_eq!(
        depth,
        QueueDepth {
            due: 0,
            scheduled: 1,
            claimed: 1,
            dead_lettered: 0
        }
    );
    assert!(
        queue
            .complete(&leases_of(&again))
            .await
            .expect("complete failed")
            .is_empty()
    );
    purge(queue, &[&tenant]).await;
}

/// Release unclaims a job without changing it; it is claimable at once.
pub async fn release_makes_jobs_claimable_again(queue: &dyn JobQueue) {
    assert_idle(queue, "release_makes_jobs_claimable_again").await;
    let tenant = unique_tenant("queue-release");
    let now = Timestamp::now();
    let (j1, j2) = (
        job(&tenant, shift(now, -2 * SECOND)),
        job(&tenant, shift(now, -SECOND)),
    );
    queue
        .enqueue(&[j1.clone(), j2.clone()])
        .await
        .expect("enqueue failed");
    let claimed = claim(queue, 2, LONG).await;
    assert!(
        queue
            .release(&[claimed[0].lease])
            .await
            .expect("release failed")
            .is_empty()
    );
    let again = claim(queue, 10, LONG).await;
    assert_eq!(
        jobs_of(&again),
        vec![j1.clone()],
        "a released job is due again, unchanged"
    );
    assert_eq!(
        queue
            .release(&[claimed[0].lease])
            .await
            .expect("release failed"),
        vec![j1.id],
        "the lease from before the release is lost once the job is claimed again"
    );
    let leases = [again[0].lease, claimed[1].lease];
    assert!(
        queue
            .complete(&leases)
            .await
            .expect("complete failed")
            .is_empty()
    );
    assert_idle(queue, "release_makes_jobs_claimable_again (end)").await;
    purge(queue, &[&tenant]).await;
}
