//! [`ReplayStore`] conformance for a store that shares the queue's database: a page's jobs and
//! dead-letter removals commit with its progress, all or nothing, under the lease.

use uuid::Uuid;

use super::replay::{LONG, create, get, new_replay, progress};
use crate::testkit::fixtures::{job, unique_tenant};
use crate::{
    DeadLetterRequest, Job, JobId, JobQueue, ReplayPage, ReplayProgress, ReplaySaved, ReplayState,
    ReplayStep, ReplayStore, Timestamp,
};

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
        hold_key: false,
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
