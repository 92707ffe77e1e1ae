//! Group commit for publishes: every publish in flight, HTTP or CDC, becomes one
//! `Outbox::accept` per flush.
//!
//! The [`IntakeCommit`] is a `WriteCoalescer` with no wait: while no accept is running, a publish
//! is written at once (an idle service adds no latency); while one runs, the publishes arriving
//! meanwhile queue up and become the next statement together. Batches grow with load, as a
//! database's group commit does, and one commit carries many publishes.
//!
//! The coalescer reports one outcome per hand-off, but a publish needs more: whether each of its
//! events was new. Each record carries a slot the writer fills before the write completes.
//!
//! Each accept also leases as many of its new jobs to this process as its workers' channel has
//! free slots, and puts them there itself ([`crate::state::handoff`]); it wakes the dispatcher
//! only for new jobs that did not fit.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sheaf_coalesce::{BatchWriter, WriteCoalescer, WriteConfig};
use sheaf_store::{Event, EventKey, Intake, LeaseOffer, Outbox, Timestamp};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::state::handoff::{Dispatched, JobChannel};
use crate::state::log_access::json_size;
use crate::state::metrics::Metrics;
use crate::state::recent::Recent;

/// Most events in one accept: a statement of a thousand events and their jobs stays well under a
/// second even on a busy server, and a CDC batch (at most 1,000 rows) fits whole.
const MAX_EVENTS: usize = 1_000;

/// Most payload bytes in one accept.
const MAX_BYTES: usize = 8 << 20;

/// Hand-offs queued before publishers wait for room: more than any number of concurrent
/// publishers this process serves, so the queue itself never makes a publish wait.
const QUEUE_DEPTH: usize = 4_096;

/// One event for the group commit and the slot its answer goes to.
#[derive(Debug)]
pub struct IntakeRecord {
    /// The event and its jobs.
    pub intake: Intake,
    /// Set by the writer: whether the event was new (false: its id was accepted before).
    pub new: Arc<AtomicBool>,
}

impl IntakeRecord {
    /// A record and the slot to read once its write completed.
    pub fn new(intake: Intake) -> (Self, Arc<AtomicBool>) {
        let slot = Arc::new(AtomicBool::new(false));
        (
            Self {
                intake,
                new: Arc::clone(&slot),
            },
            slot,
        )
    }
}

/// Writes a batch of intakes as one `Outbox::accept`, then puts every new event in the
/// fresh-event cache before any publisher hears back. The dispatcher may claim an event's jobs
/// the moment they commit; filled here, the cache is ready microseconds after the commit
/// instead of once each publisher's task has run again (under load most first deliveries then
/// missed it and read the outbox or the log store instead).
#[derive(Debug, Clone)]
pub struct IntakeWriter {
    /// The outbox.
    pub outbox: Arc<dyn Outbox>,
    /// The fresh-event cache the first deliveries read.
    pub fresh: Arc<Recent<EventKey, Event>>,
    /// The workers' channel the leased jobs go into.
    pub jobs: Arc<JobChannel>,
    /// How long those leases hold (`SHEAF_QUEUE_LEASE`).
    pub lease: Duration,
    /// Wakes the dispatcher for new jobs that were not leased.
    pub wake: Arc<Notify>,
    /// Counts the jobs handed over.
    pub metrics: Arc<Metrics>,
}

impl BatchWriter for IntakeWriter {
    type Record = IntakeRecord;
    type Error = sheaf_store::Error;

    fn record_bytes(&self, record: &IntakeRecord) -> usize {
        128 + record.intake.event.topic.len()
            + json_size(&record.intake.event.data)
            + 96 * record.intake.jobs.len()
    }

    async fn write(&self, records: Vec<IntakeRecord>) -> Result<(), sheaf_store::Error> {
        let (intakes, slots): (Vec<Intake>, Vec<Arc<AtomicBool>>) =
            records.into_iter().map(|r| (r.intake, r.new)).unzip();
        // Jobs due now, of events that may be new: the most the accept can lease.
        let now = Timestamp::now();
        let due = intakes
            .iter()
            .flat_map(|i| &i.jobs)
            .filter(|j| j.due_at <= now)
            .count();
        let permits = self.jobs.reserve(due);
        let offer = LeaseOffer {
            max_jobs: permits.as_ref().map_or(0, ExactSizeIterator::len),
            lease: self.lease,
        };
        let claimed_at = Instant::now();
        let accepted = self.outbox.accept_leasing(&intakes, offer).await?;
        let handed_over = accepted.leased.len();
        let mut new_jobs = 0;
        for ((intake, slot), new) in intakes.into_iter().zip(&slots).zip(accepted.new) {
            // Only a new event: a repeat's payload may differ from the one its pending
            // delivery must send.
            if new {
                new_jobs += intake.jobs.len();
                self.fresh.insert(intake.event.key(), intake.event);
            }
            slot.store(new, Ordering::Release);
        }
        if let Some(permits) = permits {
            // The outbox leased no more jobs than it was offered slots for. The workers may
            // start at once: the cache above already holds the payloads.
            for (claimed, permit) in accepted.leased.into_iter().zip(permits) {
                permit.send(Dispatched {
                    claimed,
                    claimed_at,
                });
            }
        }
        Metrics::add(&self.metrics.jobs_handed_over, handed_over);
        if new_jobs > handed_over {
            self.wake.notify_one();
        }
        Ok(())
    }
}

/// The group commit in front of the outbox.
pub type IntakeCommit = WriteCoalescer<IntakeWriter>;

/// The group commit's bounds: no wait, a thousand events or 8 MiB per statement.
pub fn intake_config() -> WriteConfig {
    WriteConfig {
        max_records: MAX_EVENTS,
        max_bytes: MAX_BYTES,
        max_wait: std::time::Duration::ZERO,
        queue_depth: QUEUE_DEPTH,
    }
}
