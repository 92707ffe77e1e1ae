//! The delivery queue: [`Job`]s, leases and the [`JobQueue`] trait: minimal job rows claimed
//! with leases instead of held transactions and savepoints.
//!
//! # Leases
//!
//! A claim stamps a job with `claimed_until = now + lease` on the **queue's clock** (the database
//! server's for Postgres, the process's for memory) and hands back a [`Lease`]: the job id and that
//! `claimed_until`. The pair *is* the claim's identity; no separate token column is needed, which
//! keeps job rows minimal and lets a renewal stay a HOT update.
//!
//! - A job is held while `now <= claimed_until`; once `claimed_until < now` it is claimable again.
//! - Every operation on a claimed job ([`JobQueue::renew`], [`JobQueue::complete`],
//!   [`JobQueue::reschedule`], [`JobQueue::dead_letter`], [`JobQueue::release`]) applies only if
//!   the job still exists and its stored `claimed_until` **equals** the lease's. Otherwise the
//!   lease is *lost* and the operation leaves the job untouched and reports the job id as lost.
//! - A lease whose time has passed but that nobody has re-claimed still matches, so a slow worker
//!   can still complete it; once another claimer has claimed the job, its `claimed_until` is
//!   later than the old one (a new claim happens only after `claimed_until < now`, and leases are
//!   positive) and the slow worker's operations are lost, never clobbering the new owner.
//! - Renewal sets `claimed_until = now + lease`, so it returns a new [`Lease`]; the old one is
//!   lost after it.
//! - A lease given twice in one call counts once.
//!
//! The identity is a time, so in principle a claim could land on the exact microsecond of a much
//! older lease on the same job whose holder is still running. That needs two clock readings plus
//! leases to coincide to the microsecond; a random token column would rule it out at the cost of
//! 16 bytes per row and a wider claim, against the minimal rows the queue keeps so that its
//! table and its claim scans stay small.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::{DestinationId, Error, EventId, JobId, Page, PageRequest, Result, TenantId, Timestamp};

/// One pending delivery of one event to one destination. Rows are kept minimal, so that a queue
/// whose rows are inserted, updated and deleted all the time leaves small dead versions behind:
/// ids, the attempt number, the carried attempt time and the due time, never the payload.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Job {
    /// Generated when the delivery is first enqueued; kept across its retries.
    pub id: JobId,
    /// The event's tenant.
    pub tenant_id: TenantId,
    /// The event to deliver.
    pub event_id: EventId,
    /// Where to deliver it.
    pub destination_id: DestinationId,
    /// The number the next attempt will have: 1 for the first delivery.
    pub attempt_number: u32,
    /// The time of the previous attempt, carried by a retry so its latest-attempt lookup can be
    /// bounded by time (see [`LogStore::latest_attempt`](crate::LogStore::latest_attempt));
    /// `None` for a first delivery.
    pub last_attempt_time: Option<Timestamp>,
    /// When the job becomes claimable.
    pub due_at: Timestamp,
    /// Per-key ordering: jobs of one destination with the same key are delivered one at a time,
    /// in the order they were enqueued (see [`JobQueue::claim`]). `None`: no order, the common
    /// case.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order_key: Option<String>,
}

/// The longest order key, in bytes.
pub const MAX_ORDER_KEY_LEN: usize = 256;

/// Proof of a claim: which job, and the `claimed_until` the claim set. See the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Lease {
    /// The claimed job.
    pub job_id: JobId,
    /// Until when the claim holds, on the queue's clock.
    pub claimed_until: Timestamp,
}

/// A job handed to a claimer, with its lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimedJob {
    /// The job as stored.
    pub job: Job,
    /// The claim on it.
    pub lease: Lease,
}

/// Puts a claimed job back to wait for a later attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reschedule {
    /// The claim on the job.
    pub lease: Lease,
    /// When it becomes claimable again.
    pub due_at: Timestamp,
    /// The number the next attempt will have.
    pub attempt_number: u32,
    /// The time of the attempt just made, for the retry's lookup.
    pub last_attempt_time: Option<Timestamp>,
}

/// Gives up on a claimed job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetterRequest {
    /// The claim on the job.
    pub lease: Lease,
    /// Why, for operators (e.g. "gave up after 6 attempts").
    pub reason: String,
    /// For a job with an [`Job::order_key`]: whether the dead letter keeps its key, so that
    /// the key's later jobs wait until it is requeued ([`JobQueue::requeue_dead_letters`], back
    /// in its place) or removed ([`JobQueue::remove_dead_letters`]). `false`: the key's next
    /// job goes at once. Ignored for a job without an order key.
    #[serde(default)]
    pub hold_key: bool,
}

/// A job that was given up on, kept for the dead-letter listing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetter {
    /// The job as it was when dead-lettered (its attempt number and last attempt time included).
    pub job: Job,
    /// Why it was given up on.
    pub reason: String,
    /// When it was dead-lettered, on the queue's clock.
    pub dead_lettered_at: Timestamp,
    /// Whether it holds its order key: the key's later jobs wait for it (see
    /// [`DeadLetterRequest::hold_key`]). Always `false` for a job without an order key.
    #[serde(default)]
    pub holds_key: bool,
}

/// Renewal results: new leases for the jobs still held, and the ids whose lease was lost.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Renewed {
    /// One new lease per renewed job, in the order the old leases were given.
    pub leases: Vec<Lease>,
    /// Jobs whose lease was lost; they were not renewed.
    pub lost: Vec<JobId>,
}

/// How many jobs the queue holds, by state, at one instant of the queue's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct QueueDepth {
    /// Due and not held: claimable now.
    pub due: u64,
    /// Not held and not yet due, or waiting behind an earlier job of its order key.
    pub scheduled: u64,
    /// Held by a lease that has not run out.
    pub claimed: u64,
    /// Dead-lettered and still kept.
    pub dead_lettered: u64,
}

/// Rejects leases a backend cannot honour: zero, or too long to add to a timestamp.
pub fn validate_lease(lease: Duration) -> Result<()> {
    if lease < Duration::from_micros(1) {
        return Err(Error::invalid_input(
            "a lease must be at least one microsecond",
        ));
    }
    if lease > Duration::from_secs(365 * 24 * 3600) {
        return Err(Error::invalid_input(format!(
            "lease {lease:?} is longer than a year"
        )));
    }
    Ok(())
}

/// Rejects jobs a backend must not store: attempt number zero, an order key longer than
/// [`MAX_ORDER_KEY_LEN`].
pub fn validate_job(job: &Job) -> Result<()> {
    if job.attempt_number == 0 {
        return Err(Error::invalid_input(format!(
            "job {} has attempt number 0",
            job.id
        )));
    }
    if job
        .order_key
        .as_ref()
        .is_some_and(|k| k.len() > MAX_ORDER_KEY_LEN)
    {
        return Err(Error::invalid_input(format!(
            "job {} has an order key longer than {MAX_ORDER_KEY_LEN} bytes",
            job.id
        )));
    }
    Ok(())
}

/// The queue of pending deliveries.
///
/// Claims, renewals and every outcome are short, independent operations: no backend holds a
/// transaction or a lock while a job's work runs. Each outcome call accepts many jobs so the
/// service can batch completions across workers: one statement per batch, never one per job,
/// because one commit per job is bound by WAL writes and lost to the savepoint design it
/// replaces (docs/benchmarks.md, "queue", earlier measurements). The lease rule is in the
/// [module docs](self).
#[async_trait]
pub trait JobQueue: fmt::Debug + Send + Sync + 'static {
    /// Adds jobs. A job whose id is already in the queue (waiting, claimed or dead-lettered) is
    /// skipped, as are repeats within the call, so enqueueing is idempotent. A job whose
    /// `due_at` has passed is claimable at once. Rejects `attempt_number == 0` with
    /// [`Error::InvalidInput`] (see [`validate_job`]) and then writes nothing.
    async fn enqueue(&self, jobs: &[Job]) -> Result<()>;

    /// Claims up to `max` due jobs for `lease`.
    ///
    /// A job is due when `due_at <= now`, it is not held (`claimed_until` unset or `< now`), and,
    /// if it has an [`Job::order_key`], it is the first of its `(destination_id, order_key)`
    /// still in the queue: a job of a key waits while an earlier one of that key waits for its
    /// time, is held, is held by a lease that ran out (it is claimed again first), or is a dead
    /// letter that holds its key. Completing the earlier job, or dead-lettering it without
    /// holding the key, lets the next go. "Earlier" is the order of enqueueing:
    /// of the calls, and within a call, of the slice; calls that run at once on a queue shared by
    /// processes are ordered as they commit.
    /// Jobs are claimed, and returned, in `(due_at, id)` order (Postgres: `UPDATE … RETURNING`
    /// does not keep the subquery's order, so sort the returned rows). A claim's `claimed_until`
    /// is later than any earlier claim's on the same job. Each claim is exclusive: while its lease holds, no
    /// other `claim` call, from this handle or any other, returns the job. `max == 0` returns
    /// nothing. A zero lease is [`Error::InvalidInput`] (see [`validate_lease`]).
    async fn claim(&self, max: usize, lease: Duration) -> Result<Vec<ClaimedJob>>;

    /// Sets held jobs' `claimed_until` to `now + lease` (so it can also shorten a lease), returning
    /// a new lease for each job still held and the ids of those lost. A zero lease is
    /// [`Error::InvalidInput`].
    async fn renew(&self, leases: &[Lease], lease: Duration) -> Result<Renewed>;

    /// Removes finished jobs (delivered, superseded, or no longer deliverable). Returns the ids
    /// whose lease was lost; those jobs are untouched.
    async fn complete(&self, leases: &[Lease]) -> Result<Vec<JobId>>;

    /// Moves held jobs to a new due time, attempt number and carried attempt time, and unclaims
    /// them. Returns the ids whose lease was lost.
    async fn reschedule(&self, jobs: &[Reschedule]) -> Result<Vec<JobId>>;

    /// Takes held jobs out of the queue and keeps them, with the reason and the time, for
    /// [`JobQueue::list_dead_letters`]. A dead-lettered job is never claimed again unless it is
    /// requeued, and its id stays taken. A dead letter that holds its key
    /// ([`DeadLetterRequest::hold_key`]) still counts as the earliest job of its key for the
    /// claim, so the key's later jobs stay where they are. Returns the ids whose lease was lost.
    async fn dead_letter(&self, jobs: &[DeadLetterRequest]) -> Result<Vec<JobId>>;

    /// Unclaims held jobs without an attempt (graceful shutdown): they keep their `due_at`, which
    /// has passed, so they are claimable again at once. Returns the ids whose lease was lost.
    async fn release(&self, leases: &[Lease]) -> Result<Vec<JobId>>;

    /// How many jobs the queue holds, by state.
    async fn depth(&self) -> Result<QueueDepth>;

    /// A page of the tenant's dead letters, newest first by `(dead_lettered_at, job id)`, under the
    /// same paging rules as [`crate::LogStore::list_events`] (a cursor id must be a [`JobId`]).
    async fn list_dead_letters(
        &self,
        tenant: &TenantId,
        page: &PageRequest,
    ) -> Result<Page<DeadLetter>>;

    /// Removes these dead letters of `tenant` (a replay delivered them anew, or a user skipped
    /// them), in one round trip; ids that are not the tenant's dead letters are skipped. A
    /// removed dead letter that held its key lets the key's next job go. Returns how many were
    /// removed.
    async fn remove_dead_letters(&self, tenant: &TenantId, ids: &[JobId]) -> Result<u64>;

    /// Puts these dead letters of `tenant` back in the queue (a user retries them): due now, as
    /// attempt 1 with no carried attempt time, under their own ids. One that held its key goes
    /// back in its place, ahead of the key's later jobs; one that did not is enqueued anew,
    /// after the jobs of its key already queued. Ids that are not the tenant's dead letters
    /// are skipped. Returns how many went back.
    async fn requeue_dead_letters(&self, tenant: &TenantId, ids: &[JobId]) -> Result<u64>;

    /// Removes every job and dead letter of a tenant (it was deleted). Leases on its jobs are lost.
    /// Returns how many jobs and dead letters were removed.
    async fn purge_tenant(&self, tenant: &TenantId) -> Result<u64>;

    /// Records that the process `process` uses the queue now, and returns how many processes
    /// do: those whose last heartbeat lies within `ttl` (this one included), at least 1. Limits
    /// shared by every process (a destination's rate limit) are split by this count. The default
    /// says 1: a queue only one process can use (memory) needs no heartbeat.
    async fn heartbeat(&self, process: uuid::Uuid, ttl: Duration) -> Result<u32> {
        let _ = (process, ttl);
        Ok(1)
    }

    /// Whether the queue is reachable, for readiness checks. The default says yes.
    async fn ping(&self) -> Result<()> {
        Ok(())
    }

    /// Housekeeping the backend wants done while the queue runs (Postgres: vacuuming the jobs
    /// table once enough rows died). The service calls it every few seconds from one task per
    /// process; it must be cheap when there is nothing to do. Returns whether it did anything.
    /// The default does nothing.
    async fn maintain(&self) -> Result<bool> {
        Ok(false)
    }
}
