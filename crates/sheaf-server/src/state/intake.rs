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

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use moka::future::Cache;
use sheaf_coalesce::{BatchWriter, WriteCoalescer, WriteConfig};
use sheaf_store::{Event, EventKey, Intake, Outbox};

use crate::state::log_access::json_size;

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
    pub fresh: Cache<EventKey, Event>,
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
        let answers = self.outbox.accept(&intakes).await?;
        for ((intake, slot), new) in intakes.into_iter().zip(&slots).zip(answers) {
            // Only a new event: a repeat's payload may differ from the one its pending
            // delivery must send.
            if new {
                self.fresh.insert(intake.event.key(), intake.event).await;
            }
            slot.store(new, Ordering::Release);
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
