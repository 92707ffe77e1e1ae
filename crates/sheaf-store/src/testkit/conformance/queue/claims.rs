//! Claims: due order, idempotent enqueues, input checks, exclusive concurrent claimers.

use super::*;

/// Claims return due jobs only, in `(due_at, id)` order, exactly as enqueued, each once; complete
/// removes them and a second completion reports them lost.
pub async fn claim_hands_out_due_jobs_in_order(queue: &dyn JobQueue) {
    assert_idle(queue, "claim_hands_out_due_jobs_in_order").await;
    let tenant = unique_tenant("queue-order");
    let now = Timestamp::now();
    let first = job(&tenant, shift(now, -3 * SECOND));
    let mut tied = [
        job(&tenant, shift(now, -2 * SECOND)),
        job(&tenant, shift(now, -2 * SECOND)),
    ];
    tied.sort_by_key(|j| j.id);
    let retry = Job {
        attempt_number: 3,
        last_attempt_time: Some(shift(now, -90 * SECOND + 123)),
        ..job(&tenant, shift(now, -SECOND))
    };
    let future = job(&tenant, shift(now, 3600 * SECOND));
    queue
        .enqueue(&[
            retry.clone(),
            future.clone(),
            tied[1].clone(),
            first.clone(),
            tied[0].clone(),
        ])
        .await
        .expect("enqueue failed");

    let one = claim(queue, 1, LONG).await;
    assert_eq!(
        jobs_of(&one),
        vec![first.clone()],
        "claim(1) takes the earliest due job"
    );
    let rest = claim(queue, 10, LONG).await;
    assert_eq!(
        jobs_of(&rest),
        vec![tied[0].clone(), tied[1].clone(), retry.clone()],
        "claims follow (due_at, id) and never return a job that is not due"
    );
    let after = Timestamp::now();
    for c in one.iter().chain(&rest) {
        assert_eq!(c.lease.job_id, c.job.id);
        assert!(
            c.lease.claimed_until > after,
            "a {LONG:?} lease must still hold right after the claim"
        );
    }
    assert!(
        claim(queue, 10, LONG).await.is_empty(),
        "claimed jobs are not claimed again"
    );
    let depth = queue.depth().await.expect("depth failed");
    assert_eq!(
        depth,
        QueueDepth {
            due: 0,
            scheduled: 1,
            claimed: 4,
            dead_lettered: 0
        }
    );

    let leases: Vec<Lease> = leases_of(&one)
        .into_iter()
        .chain(leases_of(&rest))
        .collect();
    assert!(
        queue
            .complete(&leases)
            .await
            .expect("complete failed")
            .is_empty()
    );
    let lost = queue.complete(&leases).await.expect("complete failed");
    assert_eq!(
        sorted(lost),
        sorted(leases.iter().map(|l| l.job_id).collect()),
        "completing a completed job reports its lease lost"
    );
    let depth = queue.depth().await.expect("depth failed");
    assert_eq!(
        depth,
        QueueDepth {
            due: 0,
            scheduled: 1,
            claimed: 0,
            dead_lettered: 0
        }
    );
    purge(queue, &[&tenant]).await;
}

/// Enqueueing a job id that is queued or claimed is skipped; a call with an invalid job is
/// rejected whole.
pub async fn enqueue_is_idempotent_and_validated(queue: &dyn JobQueue) {
    assert_idle(queue, "enqueue_is_idempotent_and_validated").await;
    let tenant = unique_tenant("queue-enqueue");
    let j = job(&tenant, shift(Timestamp::now(), -SECOND));
    queue
        .enqueue(&[j.clone(), j.clone()])
        .await
        .expect("enqueue failed");
    queue
        .enqueue(std::slice::from_ref(&j))
        .await
        .expect("enqueue failed");
    let claimed = claim(queue, 10, LONG).await;
    assert_eq!(
        jobs_of(&claimed),
        vec![j.clone()],
        "one job however often it is enqueued"
    );
    queue
        .enqueue(std::slice::from_ref(&j))
        .await
        .expect("enqueue failed");
    assert!(
        claim(queue, 10, LONG).await.is_empty(),
        "enqueueing a claimed job does not add one"
    );
    assert!(
        queue
            .complete(&leases_of(&claimed))
            .await
            .expect("complete failed")
            .is_empty()
    );

    let good = job(&tenant, shift(Timestamp::now(), -SECOND));
    let bad = Job {
        attempt_number: 0,
        ..job(&tenant, shift(Timestamp::now(), -SECOND))
    };
    assert_kind(
        queue.enqueue(&[good, bad]).await,
        ErrorKind::InvalidInput,
        "enqueue with attempt 0",
    );
    assert!(
        claim(queue, 10, LONG).await.is_empty(),
        "a rejected enqueue writes nothing"
    );
    assert_idle(queue, "enqueue_is_idempotent_and_validated (end)").await;
    purge(queue, &[&tenant]).await;
}

/// `claim(0, _)` is empty, a zero lease is rejected for claims and renewals alike.
pub async fn claim_validates_input(queue: &dyn JobQueue) {
    assert_idle(queue, "claim_validates_input").await;
    let tenant = unique_tenant("queue-validate");
    let j = job(&tenant, shift(Timestamp::now(), -SECOND));
    queue
        .enqueue(std::slice::from_ref(&j))
        .await
        .expect("enqueue failed");
    assert!(
        claim(queue, 0, LONG).await.is_empty(),
        "claim(0) returns nothing"
    );
    assert_kind(
        queue.claim(5, Duration::ZERO).await,
        ErrorKind::InvalidInput,
        "claim with a zero lease",
    );
    let claimed = claim(queue, 5, LONG).await;
    assert_eq!(jobs_of(&claimed), vec![j], "rejected claims took nothing");
    assert_kind(
        queue.renew(&leases_of(&claimed), Duration::ZERO).await,
        ErrorKind::InvalidInput,
        "renew with a zero lease",
    );
    assert!(
        queue
            .complete(&leases_of(&claimed))
            .await
            .expect("complete failed")
            .is_empty()
    );
    purge(queue, &[&tenant]).await;
}

/// Claimers running at the same time never hold the same job: every job is claimed exactly once.
pub async fn concurrent_claimers_never_share_a_job(queue: &dyn JobQueue) {
    assert_idle(queue, "concurrent_claimers_never_share_a_job").await;
    let tenant = unique_tenant("queue-concurrent");
    let now = Timestamp::now();
    let jobs: Vec<Job> = (0..120)
        .map(|i| job(&tenant, shift(now, -(i % 7) * 1000)))
        .collect();
    queue.enqueue(&jobs).await.expect("enqueue failed");

    let claimer = || async {
        let mut mine = Vec::new();
        loop {
            let batch = claim(queue, 7, LONG).await;
            if batch.is_empty() {
                return mine;
            }
            mine.extend(batch);
            tokio::task::yield_now().await;
        }
    };
    let per_claimer = futures::future::join_all((0..6).map(|_| claimer())).await;
    let all: Vec<ClaimedJob> = per_claimer.into_iter().flatten().collect();
    let mut seen = HashSet::new();
    for c in &all {
        assert!(
            seen.insert(c.job.id),
            "job {} was held by two claimers at once",
            c.job.id
        );
    }
    let expected: HashSet<JobId> = jobs.iter().map(|j| j.id).collect();
    assert_eq!(seen, expected, "every due job is claimed once");
    for chunk in all.chunks(50) {
        assert!(
            queue
                .complete(&leases_of(chunk))
                .await
                .expect("complete failed")
                .is_empty()
        );
    }
    assert_idle(queue, "concurrent_claimers_never_share_a_job (end)").await;
    purge(queue, &[&tenant]).await;
}
