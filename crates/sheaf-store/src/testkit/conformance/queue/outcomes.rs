//! Outcomes: the lost-lease rule, dead letters, purging a tenant.

use super::*;

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
        hold_key: false,
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
        hold_key: false,
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
        hold_key: false,
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

/// Removing dead letters takes exactly the named ones of the tenant: another tenant's dead
/// letter, an unknown id and a pending job's id are skipped.
pub async fn removed_dead_letters_leave_the_list(queue: &dyn JobQueue) {
    assert_idle(queue, "removed_dead_letters_leave_the_list").await;
    let (ta, tb) = (
        unique_tenant("queue-undead-a"),
        unique_tenant("queue-undead-b"),
    );
    let now = Timestamp::now();
    let mine: Vec<Job> = (0..4)
        .map(|i| job(&ta, shift(now, -(10 - i) * SECOND)))
        .collect();
    let theirs = job(&tb, shift(now, -5 * SECOND));
    let pending = job(&ta, shift(now, 3_600 * SECOND));
    let mut all = mine.clone();
    all.push(theirs.clone());
    queue.enqueue(&all).await.expect("enqueue failed");
    queue
        .enqueue(std::slice::from_ref(&pending))
        .await
        .expect("enqueue failed");
    let claimed = claim(queue, 10, LONG).await;
    assert_eq!(claimed.len(), 5, "the due ones");
    let requests: Vec<DeadLetterRequest> = claimed
        .iter()
        .map(|c| DeadLetterRequest {
            lease: c.lease,
            reason: "gave up".to_owned(),
            hold_key: false,
        })
        .collect();
    assert!(
        queue
            .dead_letter(&requests)
            .await
            .expect("dead_letter")
            .is_empty()
    );

    let named = vec![
        mine[0].id,
        mine[2].id,
        theirs.id,
        pending.id,
        JobId::generate(),
    ];
    let removed = queue
        .remove_dead_letters(&ta, &named)
        .await
        .expect("remove_dead_letters failed");
    assert_eq!(removed, 2, "only the tenant's own dead letters");
    let listed = queue
        .list_dead_letters(&ta, &PageRequest::first(100))
        .await
        .expect("list_dead_letters failed");
    let left: Vec<JobId> = sorted(listed.items.iter().map(|d| d.job.id).collect());
    assert_eq!(left, sorted(vec![mine[1].id, mine[3].id]));
    let other = queue
        .list_dead_letters(&tb, &PageRequest::first(100))
        .await
        .expect("list_dead_letters failed");
    assert_eq!(other.items.len(), 1, "another tenant's dead letter stays");
    assert_eq!(
        queue.depth().await.expect("depth").scheduled,
        1,
        "a pending job named by mistake stays pending"
    );
    assert_eq!(queue.remove_dead_letters(&ta, &[]).await.expect("empty"), 0);
    purge(queue, &[&ta, &tb]).await;
}
