//! [`ReplayStore`] conformance: replays round-trip and are tenant-scoped, progress is stored
//! whole under the lease rule, and finished replays are deleted by age while running ones never
//! are. Takeovers are in [`super::replay_takeover`], a page's queue work in
//! [`super::replay_pages`]; the helpers here serve all three.
//!
//! Cases make their own tenants and only assert on the replays they created, so they may share
//! a store with each other and with earlier runs. A takeover may also hand a case replays that
//! earlier cases left behind; cases ignore them (they are finished or expire again).

use std::time::{Duration, Instant};

use serde_json::json;
use uuid::Uuid;

use super::assert_kind;
use crate::testkit::fixtures::unique_tenant;
use crate::{
    Cursor, ErrorKind, NewReplay, Replay, ReplayLease, ReplayProgress, ReplaySaved, ReplayState,
    ReplayStep, ReplayStore, TenantId, Timestamp,
};

/// A lease long enough that it never runs out during a case.
pub(super) const LONG: Duration = Duration::from_secs(60);

/// A lease that runs out within a case.
pub(super) const SHORT: Duration = Duration::from_millis(300);

/// How long a case waits for a short lease to run out on the store's clock.
pub(super) const EXPIRY_WAIT: Duration = Duration::from_secs(10);

pub(super) fn new_replay(tenant: &TenantId) -> NewReplay {
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

pub(super) fn progress(pages: u64) -> ReplayProgress {
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

pub(super) async fn create(
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

pub(super) async fn get(store: &dyn ReplayStore, tenant: &TenantId, id: Uuid) -> Option<Replay> {
    store
        .get_replay(tenant, id)
        .await
        .expect("get_replay failed")
}

pub(super) async fn save(
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

/// Finishes what a case holds, so later cases' takeovers do not keep handing it out.
pub(super) async fn finish(store: &dyn ReplayStore, lease: &ReplayLease) {
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
