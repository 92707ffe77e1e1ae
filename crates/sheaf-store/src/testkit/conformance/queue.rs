//! [`JobQueue`] conformance: due order, exclusive claims, lease expiry, renewal, the outcomes, the
//! lost-lease rule and dead letters.
//!
//! Every case expects an idle queue of its own (a claim takes any due job, whatever its tenant),
//! checks that it is idle when it starts, and purges its tenants when it ends.
//!
//! Longer than 600 lines because the conformance cases read best side by side: one function per
//! rule of the [`JobQueue`] contract.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use super::assert_kind;
use crate::testkit::fixtures::{job, shift, unique_tenant};
use crate::{
    ClaimedJob, Cursor, DeadLetter, DeadLetterRequest, ErrorKind, Job, JobId, JobQueue, Lease,
    Page, PageRequest, QueueDepth, Reschedule, TenantId, Timestamp,
};

/// A lease no case outlives, for claims whose expiry is not under test.
const LONG: Duration = Duration::from_secs(30);
/// A lease short enough to wait out.
const SHORT: Duration = Duration::from_millis(250);
/// How long a case waits for an expired lease to be claimable before it gives up.
const EXPIRY_WAIT: Duration = Duration::from_secs(5);
const SECOND: i64 = 1_000_000;

async fn assert_idle(queue: &dyn JobQueue, case: &str) {
    let depth = queue.depth().await.expect("depth failed");
    assert_eq!(
        depth,
        QueueDepth::default(),
        "{case}: the queue cases need an idle queue of their own (a claim takes any tenant's job)"
    );
}

async fn claim(queue: &dyn JobQueue, max: usize, lease: Duration) -> Vec<ClaimedJob> {
    queue.claim(max, lease).await.expect("claim failed")
}

async fn purge(queue: &dyn JobQueue, tenants: &[&TenantId]) {
    for tenant in tenants {
        queue
            .purge_tenant(tenant)
            .await
            .expect("purge_tenant failed");
    }
}

fn sorted(mut ids: Vec<JobId>) -> Vec<JobId> {
    ids.sort();
    ids
}

fn jobs_of(claimed: &[ClaimedJob]) -> Vec<Job> {
    claimed.iter().map(|c| c.job.clone()).collect()
}

fn leases_of(claimed: &[ClaimedJob]) -> Vec<Lease> {
    claimed.iter().map(|c| c.lease).collect()
}

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

/// A lease that does not match (forged one microsecond off, or for an unknown job) changes
/// nothing, even in a batch where the other leases apply.
pub async fn lost_leases_change_nothing(queue: &dyn JobQueue) {
    assert_idle(queue, "lost_leases_change_nothing").await;
    let tenant = unique_tenant("queue-lost");
    let now = Timestamp::now();
    let jobs: Vec<Job> = (0..3)
        .map(|i| job(&tenant, shift(now, -(3 - i) * SECOND)))
        .collect();
    queue.enqueue(&jobs).await.expect("enqueue failed");
    let claimed = claim(queue, 3, LONG).await;
    assert_eq!(jobs_of(&claimed), jobs);
    let real = claimed[1].lease;
    let stale = Lease {
        claimed_until: shift(real.claimed_until, -1),
        ..real
    };
    let unknown = Lease {
        job_id: JobId::generate(),
        claimed_until: real.claimed_until,
    };

    let lost = queue
        .complete(&[claimed[0].lease, stale, claimed[2].lease, unknown])
        .await
        .expect("complete");
    assert_eq!(
        sorted(lost),
        sorted(vec![real.job_id, unknown.job_id]),
        "only matching leases complete"
    );
    let move_back = Reschedule {
        lease: stale,
        due_at: shift(now, -SECOND),
        attempt_number: 2,
        last_attempt_time: None,
    };
    assert_eq!(
        queue.reschedule(&[move_back]).await.expect("reschedule"),
        vec![real.job_id]
    );
    assert_eq!(
        queue.release(&[stale]).await.expect("release"),
        vec![real.job_id]
    );
    let give_up = DeadLetterRequest {
        lease: stale,
        reason: "stale".to_owned(),
    };
    assert_eq!(
        queue.dead_letter(&[give_up]).await.expect("dead_letter"),
        vec![real.job_id]
    );
    let renewed = queue.renew(&[stale], LONG).await.expect("renew");
    assert_eq!((renewed.leases, renewed.lost), (vec![], vec![real.job_id]));
    assert!(
        claim(queue, 10, LONG).await.is_empty(),
        "the job is still held by its real lease"
    );
    let depth = queue.depth().await.expect("depth failed");
    assert_eq!(
        depth,
        QueueDepth {
            due: 0,
            scheduled: 0,
            claimed: 1,
            dead_lettered: 0
        }
    );
    assert!(
        queue
            .complete(&[real])
            .await
            .expect("complete failed")
            .is_empty()
    );
    assert_idle(queue, "lost_leases_change_nothing (end)").await;
    purge(queue, &[&tenant]).await;
}

async fn all_dead_letters(queue: &dyn JobQueue, tenant: &TenantId, limit: u32) -> Vec<DeadLetter> {
    let mut items = Vec::new();
    let mut request = PageRequest::first(limit);
    loop {
        let page: Page<DeadLetter> = queue
            .list_dead_letters(tenant, &request)
            .await
            .expect("list_dead_letters failed");
        assert!(
            page.items.len() <= limit as usize,
            "a dead-letter page exceeded its limit"
        );
        items.extend(page.items);
        match page.next {
            Some(cursor) => request = PageRequest::after(limit, cursor),
            None => return items,
        }
    }
}

/// Dead-lettered jobs leave the queue for good, keep their reason and time, are listed per tenant
/// newest first, and their ids stay taken.
pub async fn dead_letters_are_kept_and_listed(queue: &dyn JobQueue) {
    assert_idle(queue, "dead_letters_are_kept_and_listed").await;
    let (ta, tb) = (unique_tenant("queue-dead-a"), unique_tenant("queue-dead-b"));
    let now = Timestamp::now();
    let a1 = Job {
        attempt_number: 6,
        last_attempt_time: Some(shift(now, -5 * SECOND)),
        ..job(&ta, shift(now, -4 * SECOND))
    };
    let a2 = job(&ta, shift(now, -3 * SECOND));
    let a3 = job(&ta, shift(now, -2 * SECOND));
    let b1 = job(&tb, shift(now, -SECOND));
    queue
        .enqueue(&[a1.clone(), a2.clone(), a3.clone(), b1.clone()])
        .await
        .expect("enqueue failed");
    let claimed = claim(queue, 10, LONG).await;
    assert_eq!(
        jobs_of(&claimed),
        vec![a1.clone(), a2.clone(), a3.clone(), b1.clone()]
    );

    let before = Timestamp::now();
    let first = DeadLetterRequest {
        lease: claimed[0].lease,
        reason: "gave up after 6 attempts".to_owned(),
    };
    assert!(
        queue
            .dead_letter(&[first])
            .await
            .expect("dead_letter failed")
            .is_empty()
    );
    let second = DeadLetterRequest {
        lease: claimed[1].lease,
        reason: "destination deleted".to_owned(),
    };
    assert!(
        queue
            .dead_letter(&[second])
            .await
            .expect("dead_letter failed")
            .is_empty()
    );
    let after = Timestamp::now();
    let rest = [claimed[2].lease, claimed[3].lease];
    assert!(
        queue
            .complete(&rest)
            .await
            .expect("complete failed")
            .is_empty()
    );
    assert!(
        claim(queue, 10, LONG).await.is_empty(),
        "dead letters are never claimed"
    );
    let depth = queue.depth().await.expect("depth failed");
    assert_eq!(
        depth,
        QueueDepth {
            due: 0,
            scheduled: 0,
            claimed: 0,
            dead_lettered: 2
        }
    );

    for limit in [1, 2, 10] {
        let listed = all_dead_letters(queue, &ta, limit).await;
        assert_eq!(
            listed.len(),
            2,
            "both dead letters are listed (limit {limit})"
        );
        assert!(
            (listed[0].dead_lettered_at, listed[0].job.id)
                > (listed[1].dead_lettered_at, listed[1].job.id),
            "dead letters are listed newest first by (dead_lettered_at, job id)"
        );
        let by_id = |id: JobId| listed.iter().find(|d| d.job.id == id).expect("listed");
        assert_eq!(
            (&by_id(a1.id).job, by_id(a1.id).reason.as_str()),
            (&a1, "gave up after 6 attempts")
        );
        assert_eq!(
            (&by_id(a2.id).job, by_id(a2.id).reason.as_str()),
            (&a2, "destination deleted")
        );
        for d in &listed {
            // The queue's clock may differ from ours by a little; a minute is generous.
            assert!(
                d.dead_lettered_at >= shift(before, -60 * SECOND)
                    && d.dead_lettered_at <= shift(after, 60 * SECOND)
            );
        }
    }
    assert!(
        all_dead_letters(queue, &tb, 10).await.is_empty(),
        "dead letters are listed per tenant"
    );
    assert_kind(
        queue.list_dead_letters(&ta, &PageRequest::first(0)).await,
        ErrorKind::InvalidInput,
        "limit 0",
    );
    let bad_cursor = PageRequest::after(10, Cursor::new(now, "not-a-uuid"));
    assert_kind(
        queue.list_dead_letters(&ta, &bad_cursor).await,
        ErrorKind::InvalidInput,
        "a bad cursor",
    );

    queue
        .enqueue(std::slice::from_ref(&a1))
        .await
        .expect("enqueue failed");
    assert!(
        claim(queue, 10, LONG).await.is_empty(),
        "a dead-lettered job's id stays taken"
    );
    assert_eq!(
        queue.purge_tenant(&ta).await.expect("purge_tenant"),
        2,
        "purge removes dead letters"
    );
    assert!(all_dead_letters(queue, &ta, 10).await.is_empty());
    assert_eq!(queue.purge_tenant(&tb).await.expect("purge_tenant"), 0);
    assert_idle(queue, "dead_letters_are_kept_and_listed (end)").await;
}

/// Purging a tenant removes its waiting and claimed jobs (their leases are lost) and nobody
/// else's.
pub async fn purge_tenant_removes_its_jobs(queue: &dyn JobQueue) {
    assert_idle(queue, "purge_tenant_removes_its_jobs").await;
    let (ta, tb) = (
        unique_tenant("queue-purge-a"),
        unique_tenant("queue-purge-b"),
    );
    let now = Timestamp::now();
    let a_due = [
        job(&ta, shift(now, -3 * SECOND)),
        job(&ta, shift(now, -2 * SECOND)),
    ];
    let a_future = job(&ta, shift(now, 3600 * SECOND));
    let b_due = job(&tb, shift(now, -SECOND));
    queue
        .enqueue(&[a_due[0].clone(), a_due[1].clone(), a_future, b_due.clone()])
        .await
        .expect("enqueue failed");
    let claimed = claim(queue, 10, LONG).await;
    assert_eq!(claimed.len(), 3);
    assert_eq!(
        queue.purge_tenant(&ta).await.expect("purge_tenant"),
        3,
        "claimed and waiting jobs go"
    );
    let a_leases = [claimed[0].lease, claimed[1].lease];
    let lost = queue.complete(&a_leases).await.expect("complete failed");
    assert_eq!(
        sorted(lost),
        sorted(vec![a_due[0].id, a_due[1].id]),
        "purged jobs' leases are lost"
    );
    assert!(
        queue
            .complete(&[claimed[2].lease])
            .await
            .expect("complete failed")
            .is_empty(),
        "other tenants keep theirs"
    );
    assert_eq!(queue.purge_tenant(&ta).await.expect("purge_tenant"), 0);
    assert_idle(queue, "purge_tenant_removes_its_jobs (end)").await;
}
