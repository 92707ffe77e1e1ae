//! [`JobQueue`] conformance: due order, exclusive claims, lease expiry, renewal, the outcomes, the
//! lost-lease rule, dead letters, per-key ordering and heartbeats.
//!
//! Every case expects an idle queue of its own (a claim takes any due job, whatever its tenant),
//! checks that it is idle when it starts, and purges its tenants when it ends.

mod claims;
mod heartbeats;
mod leases;
mod ordering;
mod outcomes;

pub use claims::{
    claim_hands_out_due_jobs_in_order, claim_validates_input,
    concurrent_claimers_never_share_a_job, enqueue_is_idempotent_and_validated,
};
pub use heartbeats::heartbeats_count_the_processes_sharing_the_queue;
pub use leases::{
    expired_lease_returns_the_job, release_makes_jobs_claimable_again, renew_extends_the_lease,
    reschedule_moves_the_job,
};
pub use ordering::{
    a_dead_letter_that_holds_its_key_keeps_it_until_requeued_or_removed,
    concurrent_claimers_keep_each_key_in_order,
    ordered_jobs_of_a_key_go_one_at_a_time_in_enqueue_order,
};
pub use outcomes::{
    dead_letters_are_kept_and_listed, lost_leases_change_nothing, purge_tenant_removes_its_jobs,
    removed_dead_letters_leave_the_list,
};

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
