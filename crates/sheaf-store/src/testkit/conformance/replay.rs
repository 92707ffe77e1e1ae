//! [`ReplayStore`] conformance: replays round-trip and are tenant-scoped, progress is stored
//! whole under the lease rule, a replay whose lease ran out (or that was released) is taken
//! over by exactly one caller and keeps its position, and finished replays are deleted by age
//! while running ones never are.
//!
//! A store that shares the queue's database also commits a page's queue work with its
//! progress, all or nothing ([`page_work_commits_with_progress`]).
//!
//! Cases make their own tenants and only assert on the replays they created, so they may share
//! a store with each other and with earlier runs. A takeover may also hand a case replays that
//! earlier cases left behind; cases ignore them (they are finished or expire again).

use std::time::{Duration, Instant};

use serde_json::json;
use uuid::Uuid;

use super::assert_kind;
use crate::testkit::fixtures::{job, unique_tenant};
use crate::{
    Cursor, DeadLetterRequest, ErrorKind, Job, JobId, JobQueue, NewReplay, Replay, ReplayLease,
    ReplayPage, ReplayProgress, ReplaySaved, ReplayState, ReplayStep, ReplayStore, TenantId,
    Timestamp,
};

/// A lease long enough that it never runs out during a case.
const LONG: Duration = Duration::from_secs(60);

/// A lease that runs out within a case.
const SHORT: Duration = Duration::from_millis(300);

/// How long a case waits for a short lease to run out on the store's clock.
const EXPIRY_WAIT: Duration = Duration::from_secs(10);

fn new_replay(tenant: &TenantId) -> NewReplay {
    NewReplay {
        id: Uuid::now_v7(),
        tenant_id: tenant.clone(),
        request: json!({
            "status": "failed",
            "since": "2026-12-01T00:00:00Z",
            "until": "2026-12-02T00:00:00Z",
            "topic": "order.ü",
            "destination_id": null,
        }),
    }
}

fn progress(pages: u64) -> ReplayProgress {
    ReplayProgress {
        pages,
        jobs: pages * 1_000,
        dead_letters_removed: pages * 999,
        skipped: 3,
        limited: pages > 2,
        log_store_queries: u64::from(u32::MAX) + pages,
        queue_queries: 2 * pages,
        position: Some(Cursor::new(
            Timestamp::from_micros(1_764_547_200_123_456).expect("a valid time"),
            Uuid::now_v7().to_string(),
        )),
    }
}

async fn create(
    store: &dyn ReplayStore,
    replay: &NewReplay,
    owner: Uuid,
    lease: Duration,
) -> (Replay, ReplayLease) {
    store
        .create_replay(replay, owner, lease)
        .await
        .expect("create_replay failed")
}

async fn get(store: &dyn ReplayStore, tenant: &TenantId, id: Uuid) -> Option<Replay> {
    store
        .get_replay(tenant, id)
        .await
        .expect("get_replay failed")
}

async fn save(
    store: &dyn ReplayStore,
    lease: &ReplayLease,
    progress: &ReplayProgress,
    step: ReplayStep,
) -> ReplaySaved {
    store
        .save_replay(lease, progress, &step)
        .await
        .expect("save_replay failed")
}

/// Takes over replays until one of `ids` comes back or [`EXPIRY_WAIT`] passes; returns what
/// the call that got them returned, restricted to `ids`.
async fn take_over_when_expired(
    store: &dyn ReplayStore,
    owner: Uuid,
    ids: &[Uuid],
) -> Vec<(Replay, ReplayLease)> {
    let deadline = Instant::now() + EXPIRY_WAIT;
    loop {
        let taken: Vec<_> = store
            .take_over_replays(owner, LONG, 100)
            .await
            .expect("take_over_replays failed")
            .into_iter()
            .filter(|(r, _)| ids.contains(&r.id))
            .collect();
        if !taken.is_empty() {
            return taken;
        }
        assert!(
            Instant::now() < deadline,
            "a replay whose lease ran out was not taken over within {EXPIRY_WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Finishes what a case holds, so later cases' takeovers do not keep handing it out.
async fn finish(store: &dyn ReplayStore, lease: &ReplayLease) {
    let saved = save(
        store,
        lease,
        &ReplayProgress::default(),
        ReplayStep::Complete,
    )
    .await;
    assert_eq!(saved, ReplaySaved::Ended, "finishing a held replay");
}

/// A new replay comes back as given, running with zero progress under its owner's lease;
/// another tenant cannot see it; its id cannot be reused (in any tenant); a zero lease is
/// refused.
pub async fn replays_round_trip_and_are_tenant_scoped(store: &dyn ReplayStore) {
    let tenant = unique_tenant("replay-roundtrip");
    let other = unique_tenant("replay-other");
    let owner = Uuid::now_v7();
    let new = new_replay(&tenant);
    let before = Timestamp::now();
    let (created, lease) = create(store, &new, owner, LONG).await;
    assert_eq!(created.id, new.id);
    assert_eq!(created.tenant_id, tenant);
    assert_eq!(created.request, new.request, "the request is kept as given");
    assert_eq!(created.state, ReplayState::Running);
    assert_eq!(created.progress, ReplayProgress::default());
    assert_eq!(created.error, None);
    assert_eq!(created.finished_at, None);
    assert_eq!(created.owner, Some(owner));
    assert_eq!(created.lease_until, Some(lease.lease_until));
    assert_eq!(created.takeovers, 0);
    assert_eq!((lease.replay_id, lease.owner), (new.id, owner));
    assert!(
        lease.lease_until >= before.saturating_add(LONG - Duration::from_secs(5)),
        "the lease ends about `lease` after now (allowing for clock skew with the store)"
    );
    assert_eq!(created.updated_at, created.started_at);

    let read = get(store, &tenant, new.id)
        .await
        .expect("the replay is stored");
    assert_eq!(read, created, "the replay reads back as created");
    assert_eq!(
        get(store, &other, new.id).await,
        None,
        "another tenant's view"
    );
    assert_eq!(
        get(store, &tenant, Uuid::now_v7()).await,
        None,
        "an unknown id"
    );

    assert_kind(
        store.create_replay(&new, owner, LONG).await,
        ErrorKind::Conflict,
        "creating a replay whose id is taken",
    );
    let elsewhere = NewReplay {
        tenant_id: other.clone(),
        ..new.clone()
    };
    assert_kind(
        store.create_replay(&elsewhere, owner, LONG).await,
        ErrorKind::Conflict,
        "creating a replay whose id another tenant took",
    );
    assert_kind(
        store
            .create_replay(&new_replay(&tenant), owner, Duration::ZERO)
            .await,
        ErrorKind::InvalidInput,
        "a zero lease",
    );
    finish(store, &lease).await;
}

/// Progress is stored whole and every save renews the lease to a later end; an old lease is
/// lost after a renewal; completing sets the state and `finished_at` and clears the owner, and
/// then nothing can be saved; failing keeps the error.
pub async fn progress_is_saved_under_the_lease(store: &dyn ReplayStore) {
    let tenant = unique_tenant("replay-progress");
    let owner = Uuid::now_v7();
    let (created, first) = create(store, &new_replay(&tenant), owner, LONG).await;

    let one = progress(1);
    let renewed = match save(store, &first, &one, ReplayStep::Continue { lease: LONG }).await {
        ReplaySaved::Renewed(lease) => lease,
        other => panic!("saving under a held lease: expected Renewed, got {other:?}"),
    };
    assert_eq!((renewed.replay_id, renewed.owner), (created.id, owner));
    assert!(
        renewed.lease_until > first.lease_until,
        "a renewal ends later than the lease it renews"
    );
    let read = get(store, &tenant, created.id).await.expect("stored");
    assert_eq!(read.progress, one, "the progress is stored whole");
    assert_eq!(read.state, ReplayState::Running);
    assert_eq!(read.lease_until, Some(renewed.lease_until));
    assert!(read.updated_at >= created.updated_at);
    assert_eq!(
        read.started_at, created.started_at,
        "started_at never moves"
    );

    assert_eq!(
        save(
            store,
            &first,
            &progress(9),
            ReplayStep::Continue { lease: LONG }
        )
        .await,
        ReplaySaved::Lost,
        "the lease a renewal replaced is lost"
    );
    let stranger = ReplayLease {
        owner: Uuid::now_v7(),
        ..renewed
    };
    assert_eq!(
        save(store, &stranger, &progress(9), ReplayStep::Complete).await,
        ReplaySaved::Lost,
        "another owner with the same lease end"
    );
    assert_eq!(
        get(store, &tenant, created.id)
            .await
            .expect("stored")
            .progress,
        one,
        "lost saves write nothing"
    );
    assert_kind(
        store
            .save_replay(
                &renewed,
                &one,
                &ReplayStep::Continue {
                    lease: Duration::ZERO,
                },
            )
            .await,
        ErrorKind::InvalidInput,
        "a zero renewal",
    );

    let last = ReplayProgress {
        position: None,
        ..progress(3)
    };
    assert_eq!(
        save(store, &renewed, &last, ReplayStep::Complete).await,
        ReplaySaved::Ended,
        "completing under a held lease"
    );
    let done = get(store, &tenant, created.id).await.expect("stored");
    assert_eq!(done.state, ReplayState::Completed);
    assert_eq!(done.progress, last);
    assert_eq!(
        (done.owner, done.lease_until),
        (None, None),
        "a finished replay has no owner"
    );
    let finished_at = done.finished_at.expect("a finished replay has finished_at");
    assert!(finished_at >= read.updated_at);
    assert_eq!(done.error, None);
    assert_eq!(
        save(
            store,
            &renewed,
            &progress(7),
            ReplayStep::Continue { lease: LONG }
        )
        .await,
        ReplaySaved::Lost,
        "a finished replay takes no more progress"
    );

    // Failing keeps the error, exactly.
    let (_, lease) = create(store, &new_replay(&tenant), owner, LONG).await;
    let error = "the queue is unavailable: connection refused (ü)".to_owned();
    assert_eq!(
        save(
            store,
            &lease,
            &progress(2),
            ReplayStep::Fail {
                error: error.clone()
            }
        )
        .await,
        ReplaySaved::Ended
    );
    let failed = get(store, &tenant, lease.replay_id).await.expect("stored");
    assert_eq!(failed.state, ReplayState::Failed);
    assert_eq!(failed.error, Some(error));
    assert!(failed.finished_at.is_some());
    assert_eq!(failed.owner, None);
}

/// A replay is not taken over while its lease holds; once it ran out, exactly one of two
/// concurrent takeovers gets it, with its stored progress, a later lease and one more
/// takeover; the old owner's saves are then lost.
pub async fn expired_replays_are_taken_over_once(store: &dyn ReplayStore) {
    let tenant = unique_tenant("replay-takeover");
    let (old_owner, a, b) = (Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7());
    let started = Instant::now();
    let (created, first) = create(store, &new_replay(&tenant), old_owner, SHORT).await;
    let stored = progress(2);
    let old = match save(
        store,
        &first,
        &stored,
        ReplayStep::Continue { lease: SHORT },
    )
    .await
    {
        ReplaySaved::Renewed(lease) => lease,
        other => panic!("expected Renewed, got {other:?}"),
    };
    let early = store
        .take_over_replays(a, LONG, 100)
        .await
        .expect("take_over_replays failed");
    if let Some((_, lease)) = early.iter().find(|(r, _)| r.id == created.id) {
        assert!(
            started.elapsed() >= SHORT,
            "a replay was taken over while its lease held"
        );
        // On a stalled machine the lease may really have run out already: that is no failure,
        // but this run cannot judge the race of two takeovers.
        finish(store, lease).await;
        return;
    }
    assert_eq!(
        store
            .take_over_replays(a, LONG, 0)
            .await
            .expect("take_over_replays failed"),
        vec![],
        "max 0 takes nothing"
    );
    assert_kind(
        store.take_over_replays(a, Duration::ZERO, 1).await,
        ErrorKind::InvalidInput,
        "a zero lease",
    );

    tokio::time::sleep(SHORT).await;
    let deadline = Instant::now() + EXPIRY_WAIT;
    let (mut got_a, mut got_b) = (Vec::new(), Vec::new());
    while got_a.is_empty() && got_b.is_empty() {
        let (ra, rb) = futures::join!(
            store.take_over_replays(a, LONG, 100),
            store.take_over_replays(b, LONG, 100)
        );
        let mine = |taken: Vec<(Replay, ReplayLease)>| -> Vec<(Replay, ReplayLease)> {
            taken
                .into_iter()
                .filter(|(r, _)| r.id == created.id)
                .collect()
        };
        got_a = mine(ra.expect("take_over_replays failed"));
        got_b = mine(rb.expect("take_over_replays failed"));
        assert!(
            Instant::now() < deadline,
            "an expired replay was not taken over within {EXPIRY_WAIT:?}"
        );
        if got_a.is_empty() && got_b.is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    assert_eq!(
        got_a.len() + got_b.len(),
        1,
        "exactly one of two concurrent takeovers gets the replay"
    );
    let (winner, (taken, lease)) = if got_a.is_empty() {
        (b, got_b.remove(0))
    } else {
        (a, got_a.remove(0))
    };
    assert_eq!(
        taken.progress, stored,
        "a takeover resumes from the stored progress"
    );
    assert_eq!(taken.state, ReplayState::Running);
    assert_eq!(taken.owner, Some(winner));
    assert_eq!(taken.takeovers, 1);
    assert_eq!(taken.lease_until, Some(lease.lease_until));
    assert_eq!((lease.replay_id, lease.owner), (created.id, winner));
    assert!(
        lease.lease_until > old.lease_until,
        "the new lease ends later"
    );
    assert_eq!(
        get(store, &tenant, created.id).await.expect("stored"),
        taken,
        "the takeover as stored"
    );

    assert_eq!(
        save(
            store,
            &old,
            &progress(5),
            ReplayStep::Continue { lease: LONG }
        )
        .await,
        ReplaySaved::Lost,
        "the old owner's save after a takeover"
    );
    assert_eq!(
        save(store, &old, &progress(5), ReplayStep::Complete).await,
        ReplaySaved::Lost,
        "the old owner's completion after a takeover"
    );
    let again = store
        .take_over_replays(a, LONG, 100)
        .await
        .expect("take_over_replays failed");
    assert!(
        again.iter().all(|(r, _)| r.id != created.id),
        "a replay taken over is not taken again while its new lease holds"
    );
    finish(store, &lease).await;
}

/// A released replay stays running with no owner and is taken over at once, oldest first, from
/// where it was; finished replays are never taken over.
pub async fn released_replays_are_taken_over_at_once(store: &dyn ReplayStore) {
    let tenant = unique_tenant("replay-release");
    let owner = Uuid::now_v7();
    let (older, older_lease) = create(store, &new_replay(&tenant), owner, LONG).await;
    let (newer, newer_lease) = create(store, &new_replay(&tenant), owner, LONG).await;
    let (done, done_lease) = create(store, &new_replay(&tenant), owner, LONG).await;
    finish(store, &done_lease).await;
    let stored = progress(4);
    for lease in [&newer_lease, &older_lease] {
        assert_eq!(
            save(store, lease, &stored, ReplayStep::Release).await,
            ReplaySaved::Ended,
            "releasing a held replay"
        );
    }
    let released = get(store, &tenant, older.id).await.expect("stored");
    assert_eq!(
        released.state,
        ReplayState::Running,
        "a released replay still runs"
    );
    assert_eq!((released.owner, released.lease_until), (None, None));
    assert_eq!(released.progress, stored);
    assert_eq!(
        save(
            store,
            &older_lease,
            &progress(6),
            ReplayStep::Continue { lease: LONG }
        )
        .await,
        ReplaySaved::Lost,
        "a released lease is lost"
    );

    let taker = Uuid::now_v7();
    let taken = take_over_when_expired(store, taker, &[older.id, newer.id, done.id]).await;
    let ids: Vec<Uuid> = taken.iter().map(|(r, _)| r.id).collect();
    assert_eq!(
        ids,
        vec![older.id, newer.id],
        "released replays are taken over at once, oldest first, and finished ones never"
    );
    for (replay, lease) in &taken {
        assert_eq!(replay.progress, stored);
        assert_eq!(replay.takeovers, 1);
        assert_eq!(replay.owner, Some(taker));
        finish(store, lease).await;
    }
}

/// Finished replays older than the bound are deleted, at most `max` per call; newer ones and
/// running ones, however old, stay.
pub async fn finished_replays_are_deleted_by_age(store: &dyn ReplayStore) {
    let tenant = unique_tenant("replay-delete");
    let owner = Uuid::now_v7();
    let mut finished = Vec::new();
    for _ in 0..3 {
        let (replay, lease) = create(store, &new_replay(&tenant), owner, LONG).await;
        finish(store, &lease).await;
        finished.push(replay.id);
    }
    let (running, running_lease) = create(store, &new_replay(&tenant), owner, LONG).await;
    let last_finished = get(store, &tenant, finished[2])
        .await
        .expect("stored")
        .finished_at
        .expect("finished");
    let first_finished = get(store, &tenant, finished[0])
        .await
        .expect("stored")
        .finished_at
        .expect("finished");

    store
        .delete_finished_replays(first_finished, 100)
        .await
        .expect("delete_finished_replays failed");
    assert!(
        get(store, &tenant, finished[0]).await.is_some(),
        "a replay finished at the bound is kept (the bound is exclusive)"
    );
    // Others' finished replays may go first (the store is shared, oldest go first), so delete
    // one at a time until ours are gone, each call deleting exactly one while any is left.
    let bound = last_finished.saturating_add(Duration::from_micros(1));
    let deadline = Instant::now() + EXPIRY_WAIT;
    loop {
        let deleted = store
            .delete_finished_replays(bound, 1)
            .await
            .expect("delete_finished_replays failed");
        assert!(deleted <= 1, "max 1 deleted {deleted}");
        let mut left = 0;
        for id in &finished {
            left += usize::from(get(store, &tenant, *id).await.is_some());
        }
        if left == 0 {
            break;
        }
        assert_eq!(
            deleted, 1,
            "a call deleted nothing while {left} old replays were left"
        );
        assert!(
            Instant::now() < deadline,
            "finished replays were not deleted"
        );
    }
    let far_future = Timestamp::now().saturating_add(Duration::from_secs(365 * 24 * 3600));
    store
        .delete_finished_replays(far_future, 1_000)
        .await
        .expect("delete_finished_replays failed");
    let still = get(store, &tenant, running.id)
        .await
        .expect("a running replay is never deleted");
    assert_eq!(still.state, ReplayState::Running);
    finish(store, &running_lease).await;
}

/// A replay store that shares a queue ([`ReplayStore::commits_queue_work`]), and that queue.
#[derive(Debug, Clone, Copy)]
pub struct PageStores<'a> {
    /// The replay store under test.
    pub replays: &'a dyn ReplayStore,
    /// The queue it commits a page's jobs and dead-letter removals into: idle, used by nobody
    /// else (a claim takes any due job).
    pub queue: &'a dyn JobQueue,
}

/// Claims everything due, for checking what a page enqueued, and completes it.
async fn drain(queue: &dyn JobQueue) -> Vec<Job> {
    let claimed = queue.claim(100, LONG).await.expect("claim failed");
    let leases: Vec<_> = claimed.iter().map(|c| c.lease).collect();
    queue.complete(&leases).await.expect("complete failed");
    let mut jobs: Vec<Job> = claimed.into_iter().map(|c| c.job).collect();
    jobs.sort_by_key(|j| j.id);
    jobs
}

/// A page's jobs and dead-letter removals commit with its progress, only under a held lease:
/// a lost lease enqueues and removes nothing; ids already queued or dead-lettered are skipped;
/// the stored `dead_letters_removed` adds the removals; a page that completes the replay still
/// commits its work.
pub async fn page_work_commits_with_progress(stores: PageStores<'_>) {
    let PageStores { replays, queue } = stores;
    assert!(
        replays.commits_queue_work(),
        "the store says it shares the queue"
    );
    let depth = queue.depth().await.expect("depth");
    assert_eq!(
        depth.due + depth.scheduled + depth.claimed,
        0,
        "the queue must start idle"
    );
    let tenant = unique_tenant("replay-page");
    let owner = Uuid::now_v7();
    let (_, first) = create(replays, &new_replay(&tenant), owner, LONG).await;

    // A dead letter to replay, and a job already queued that the page names again.
    let dead = job(&tenant, Timestamp::now());
    queue
        .enqueue(std::slice::from_ref(&dead))
        .await
        .expect("enqueue");
    let claimed = queue.claim(1, LONG).await.expect("claim");
    assert_eq!(claimed.len(), 1);
    let request = DeadLetterRequest {
        lease: claimed[0].lease,
        reason: "gave up".to_owned(),
    };
    queue.dead_letter(&[request]).await.expect("dead_letter");
    let queued = job(&tenant, Timestamp::now());
    queue
        .enqueue(std::slice::from_ref(&queued))
        .await
        .expect("enqueue");

    let fresh = job(&tenant, Timestamp::now());
    let first_page = ReplayProgress {
        dead_letters_removed: 10,
        ..progress(1)
    };
    let page = ReplayPage {
        jobs: vec![
            fresh.clone(),
            queued.clone(),
            Job {
                id: dead.id,
                ..fresh.clone()
            },
        ],
        remove_dead_letters: vec![dead.id, JobId::generate()],
    };
    let step = ReplayStep::Continue { lease: LONG };
    let (saved, removed) = replays
        .save_replay_page(&first, &first_page, &step, &page)
        .await
        .expect("save_replay_page failed");
    let renewed = match saved {
        ReplaySaved::Renewed(lease) => lease,
        other => panic!("a page under a held lease: expected Renewed, got {other:?}"),
    };
    assert_eq!(
        removed, 1,
        "the one dead letter of the tenant named is removed"
    );
    let stored = get(replays, &tenant, first.replay_id)
        .await
        .expect("stored");
    assert_eq!(
        stored.progress,
        ReplayProgress {
            dead_letters_removed: 11,
            ..first_page.clone()
        },
        "the progress is stored, its removals added"
    );
    let dead_letters = queue
        .list_dead_letters(&tenant, &crate::PageRequest::first(10))
        .await
        .expect("list_dead_letters");
    assert!(
        dead_letters.items.is_empty(),
        "the dead letter left the list"
    );
    let mut expected = vec![fresh.clone(), queued.clone()];
    expected.sort_by_key(|j| j.id);
    assert_eq!(
        drain(queue).await,
        expected,
        "the new job is enqueued, the queued one once, the dead-lettered id not at all"
    );

    // Under a lost lease nothing of the page is committed.
    let lost_job = job(&tenant, Timestamp::now());
    let lost_page = ReplayPage {
        jobs: vec![lost_job],
        remove_dead_letters: vec![],
    };
    let (saved, removed) = replays
        .save_replay_page(&first, &progress(9), &step, &lost_page)
        .await
        .expect("save_replay_page failed");
    assert_eq!(
        (saved, removed),
        (ReplaySaved::Lost, 0),
        "a page under a lost lease"
    );
    assert_eq!(drain(queue).await, vec![], "a lost page enqueues nothing");
    assert_eq!(
        get(replays, &tenant, first.replay_id)
            .await
            .expect("stored")
            .progress
            .pages,
        1,
        "a lost page stores nothing"
    );

    // The last page completes the replay and commits its work.
    let last = job(&tenant, Timestamp::now());
    let last_page = ReplayPage {
        jobs: vec![last.clone()],
        remove_dead_letters: vec![],
    };
    let (saved, _) = replays
        .save_replay_page(&renewed, &progress(2), &ReplayStep::Complete, &last_page)
        .await
        .expect("save_replay_page failed");
    assert_eq!(saved, ReplaySaved::Ended);
    assert_eq!(drain(queue).await, vec![last]);
    let done = get(replays, &tenant, first.replay_id)
        .await
        .expect("stored");
    assert_eq!(done.state, ReplayState::Completed);
    queue.purge_tenant(&tenant).await.expect("purge_tenant");
}
