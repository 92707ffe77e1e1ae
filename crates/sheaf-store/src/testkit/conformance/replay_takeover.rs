//! [`ReplayStore`] conformance for takeovers: a replay whose lease ran out (or that was
//! released) is taken over by exactly one caller and keeps its position; the old owner's
//! writes are then lost.

use std::time::{Duration, Instant};

use uuid::Uuid;

use super::assert_kind;
use super::replay::{EXPIRY_WAIT, LONG, SHORT, create, finish, get, new_replay, progress, save};
use crate::testkit::fixtures::unique_tenant;
use crate::{ErrorKind, Replay, ReplayLease, ReplaySaved, ReplayState, ReplayStep, ReplayStore};

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
