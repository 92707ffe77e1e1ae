//! The [`Outbox`]: where a publish becomes durable when the queue lives in a database.
//!
//! With a database queue, the log store is not on the publish path. A publish commits its
//! event (payload included) and the event's jobs together, in one transaction, in the queue's
//! database; a worker's attempt commits together with its job's outcome. A **log shipper** then
//! moves both into the log store behind the publish: it takes a [`Shipment`] of records not yet
//! shipped, writes them to the log store, and only once that write is acknowledged commits the
//! shipment, which removes them from the outbox. So:
//!
//! - a publish is answered once it is durable, and never waits for the log store;
//! - a log store outage delays searchability, never delivery or durability, and drops no
//!   attempt record: the records wait in the outbox, on disk, until the log store is back;
//! - idempotency is decided by the event's key in the same commit as the jobs, so a repeated
//!   id never delivers twice, also after its first delivery finished and its job is gone (for
//!   as long as the backend keeps the key, see [`Outbox::prune_keys`]).
//!
//! The caller of [`Outbox::accept_leasing`] may take leases on the new jobs in the same commit
//! (as many as it has idle workers for): a process then delivers the events it accepted without
//! a claim statement, and a job it leased but never finished comes back when the lease runs out,
//! as any claimed job does.
//!
//! A backend whose log store is the same database may make its log tables the outbox: an
//! accepted event is then in the log at once, a shipment is always empty, and nothing is
//! written twice.

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use async_trait::async_trait;

use crate::{
    Attempt, ClaimedJob, DeadLetterRequest, Event, EventKey, Job, JobId, Lease, Reschedule, Result,
    Timestamp,
};

/// One event to accept, with the jobs its publish enqueues (one per matching destination).
#[derive(Debug, Clone, PartialEq)]
pub struct Intake {
    /// The event, payload included.
    pub event: Event,
    /// Its jobs; every job's tenant and event are the event's.
    pub jobs: Vec<Job>,
}

/// How many of an accept's new jobs the caller leases to itself, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LeaseOffer {
    /// At most this many jobs, taken in the order of the intakes and their jobs; 0 leases none.
    pub max_jobs: usize,
    /// How long each lease holds, as [`crate::JobQueue::claim`]'s `lease`.
    pub lease: Duration,
}

impl LeaseOffer {
    /// Leases nothing: every new job waits in the queue for a claim.
    pub const NONE: LeaseOffer = LeaseOffer {
        max_jobs: 0,
        lease: Duration::ZERO,
    };
}

/// What [`Outbox::accept_leasing`] answers.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Accepted {
    /// Per intake, in order: whether its event was new.
    pub new: Vec<bool>,
    /// The new jobs leased to the caller, each exactly as a claim would have returned it; the
    /// caller delivers them and settles them under these leases.
    pub leased: Vec<ClaimedJob>,
}

/// What a worker pool's turn produced, committed together by [`Outbox::settle`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Settlement {
    /// Attempts made, with their event's topic and payload.
    pub attempts: Vec<Attempt>,
    /// Jobs to remove (see [`crate::JobQueue::complete`]).
    pub complete: Vec<Lease>,
    /// Jobs to move (see [`crate::JobQueue::reschedule`]).
    pub reschedule: Vec<Reschedule>,
    /// Jobs to give up on (see [`crate::JobQueue::dead_letter`]).
    pub dead_letter: Vec<DeadLetterRequest>,
}

impl Settlement {
    /// Whether there is nothing to commit.
    pub fn is_empty(&self) -> bool {
        self.attempts.is_empty()
            && self.complete.is_empty()
            && self.reschedule.is_empty()
            && self.dead_letter.is_empty()
    }
}

/// How much waits in the outbox for the log store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OutboxBacklog {
    /// Events not yet shipped.
    pub events: u64,
    /// Attempts not yet shipped.
    pub attempts: u64,
    /// When the oldest record still waiting was accepted; `None` when nothing waits.
    pub oldest: Option<Timestamp>,
}

/// Records taken from the outbox for the log store, held (and hidden from other shippers) until
/// [`Shipment::commit`] removes them. Dropping a shipment without committing puts every record
/// back, so a failed log write loses nothing.
#[async_trait]
pub trait Shipment: Send {
    /// The events taken, oldest first.
    fn events(&self) -> &[Event];
    /// The attempts taken, oldest first, each with its event's topic. An outbox may keep no
    /// copy of an attempt's payload (its event's is already stored once): then `event_data` is
    /// JSON `null` and `event_trace` is `None`, and the shipper puts both back from the event
    /// before writing to a log store that wants them in the attempt row.
    fn attempts(&self) -> &[Attempt];
    /// Moves the records out (for the write) and leaves the shipment empty; committing or
    /// dropping it still removes or gives back the records it took.
    fn take_records(&mut self) -> (Vec<Event>, Vec<Attempt>);
    /// Removes the records from the outbox: call it only after the log store acknowledged them.
    async fn commit(self: Box<Self>) -> Result<()>;
}

/// The durable intake in front of a database queue. See the [module docs](self).
#[async_trait]
pub trait Outbox: fmt::Debug + Send + Sync + 'static {
    /// Commits every event whose key is new together with its jobs, in one transaction, and
    /// answers, per intake in order, whether its event was new. An event whose key was accepted
    /// before (or earlier in the same call) is skipped with its jobs. A job whose id is already
    /// queued or dead-lettered is skipped, as [`crate::JobQueue::enqueue`] does. Either every new
    /// event of the call is committed with its jobs, or (on `Err`) none is.
    async fn accept(&self, intakes: &[Intake]) -> Result<Vec<bool>> {
        Ok(self.accept_leasing(intakes, LeaseOffer::NONE).await?.new)
    }

    /// [`Outbox::accept`], and in the same commit leases up to `offer.max_jobs` of the new jobs
    /// that are due (`next_due_at` not after the commit) to the caller, as
    /// [`crate::JobQueue::claim`] would. A leased job is not claimable until its lease ends.
    async fn accept_leasing(&self, intakes: &[Intake], offer: LeaseOffer) -> Result<Accepted>;

    /// Commits the attempts and applies the outcomes, all in one transaction, under the queue's
    /// lease rule: an outcome whose lease is lost changes nothing and its job id is returned.
    /// The attempts are recorded whatever their jobs' leases, because they happened.
    async fn settle(&self, settlement: &Settlement) -> Result<Vec<JobId>>;

    /// Events still in the outbox, by key, for first deliveries whose payload this process does
    /// not have; keys not found are absent (they were shipped, or never accepted). An outbox may
    /// also answer with an event shipped lately (the JetStream outbox keeps the latest events of
    /// other processes in memory): the same event the log store holds.
    async fn get_events(&self, keys: &[EventKey]) -> Result<HashMap<EventKey, Event>>;

    /// Takes up to `max_records` records (events first, then attempts, each oldest first) that
    /// no other shipment holds. `None` when nothing waits. Backends whose log tables are the
    /// outbox always return `None`.
    async fn take(&self, max_records: usize) -> Result<Option<Box<dyn Shipment>>>;

    /// Forgets event keys accepted before `before`, at most `max` per call; returns how many.
    /// After that, the same id is accepted as new again: the idempotency window is how long the
    /// caller keeps keys. An event still waiting to be shipped keeps its key however old it is
    /// (forgetting it would lose the event). Backends whose keys live in the log store keep them
    /// as long as it keeps the events, and return 0.
    async fn prune_keys(&self, before: Timestamp, max: usize) -> Result<u64>;

    /// How much waits for the log store.
    async fn backlog(&self) -> Result<OutboxBacklog>;

    /// Whether accepted events and settled attempts are in the log store at once (its tables
    /// are the outbox), so nothing is ever shipped.
    fn is_log(&self) -> bool;
}

/// Rejects intakes a backend must not store: a job of another event than its intake's, or one
/// [`crate::validate_job`] refuses. Backends call it first and then write nothing on error.
pub fn validate_intakes(intakes: &[Intake]) -> Result<()> {
    for intake in intakes {
        for job in &intake.jobs {
            crate::validate_job(job)?;
            if job.tenant_id != intake.event.tenant_id || job.event_id != intake.event.id {
                return Err(crate::Error::invalid_input(format!(
                    "job {} is for event {:?} of tenant {:?}, not for its intake's event {:?} of {:?}",
                    job.id,
                    job.event_id.as_str(),
                    job.tenant_id.as_str(),
                    intake.event.id.as_str(),
                    intake.event.tenant_id.as_str()
                )));
            }
        }
    }
    Ok(())
}
