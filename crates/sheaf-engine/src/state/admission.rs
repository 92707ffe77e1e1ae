//! The pending-work bound: what a process has accepted and not yet delivered is bounded at the
//! door, never by dropping what was accepted.
//!
//! While the work waiting is at its bound, a publish is refused with
//! [`Refused`] (the API answers `503` with `Retry-After`, naming the bound) and the CDC source
//! stops acknowledging, so the replication slot keeps the position until there is room. What is
//! already accepted stays until it is delivered, dead-lettered or its tenant deleted.
//!
//! - **Memory backends**: the memory log holds every event the memory queue has a job for
//!   (`sheaf_memory::PendingWork`), out of retention's reach; the bound is on those events' count
//!   (`SHEAF_MEMORY_MAX_PENDING_EVENTS`) and payload bytes (`SHEAF_MEMORY_MAX_PENDING_BYTES`).
//!   Read at every publish: two counters under the log's read lock.
//! - **Postgres queue with a log store elsewhere, or the JetStream queue with its outbox**: the
//!   bound is on the events waiting in the outbox for the log store
//!   (`SHEAF_OUTBOX_MAX_EVENTS`), which grows while the log store is down. Counting them is a
//!   query, so the housekeeping task samples it every few seconds
//!   ([`Admission::note_outbox`]) and publishes compare with the sample.
//! - **Postgres queue and log**: the log tables are the record and nothing waits to be shipped;
//!   jobs are small rows and Postgres's disk is the bound. No bound is applied here.
//!
//! In front of all three, HTTP publishes being handled at once are bounded
//! (`SHEAF_MAX_PUBLISHES_IN_FLIGHT`, [`Admission::enter`]): past the process's capacity a
//! publish would otherwise wait inside it, each one let in making every later one slower, and
//! the pending-work bound would never be reached because the work is stuck before it. One more
//! is refused at once, before its body is read.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sheaf_memory::MemoryLogStore;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How long a refused publisher is asked to wait: long enough that a flood of retries does not
/// become the load, short enough that a drained backlog takes publishes again soon.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// A publish refused because the pending work is at its bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// Which bound, with its setting and the numbers, in words.
    pub message: String,
    /// When to try again.
    pub retry_after: Duration,
}

/// What is pending and what it may reach, for `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Events accepted and not yet delivered (memory) or not yet shipped (outbox).
    pub events: u64,
    /// Their bound; 0 when none applies.
    pub max_events: u64,
    /// Their payload bytes (memory only).
    pub bytes: u64,
    /// That bound; 0 when none applies.
    pub max_bytes: u64,
    /// Publishes refused so far.
    pub refused: u64,
}

enum Bound {
    Memory {
        log: Arc<MemoryLogStore>,
        max_events: u64,
        max_bytes: u64,
    },
    Outbox {
        max_events: u64,
    },
    None,
}

/// A publish being handled: holds one of the `SHEAF_MAX_PUBLISHES_IN_FLIGHT` places until
/// dropped.
#[derive(Debug)]
pub struct InFlight(#[allow(dead_code)] OwnedSemaphorePermit);

/// The door of one process: see the module docs.
pub struct Admission {
    bound: Bound,
    in_flight: Arc<Semaphore>,
    max_in_flight: usize,
    /// The outbox's waiting events at the last sample.
    outbox_events: AtomicU64,
    refused: AtomicU64,
}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admission")
            .field("usage", &self.usage())
            .finish()
    }
}

impl Admission {
    /// Bounds the events the memory log holds for the memory queue.
    pub fn memory(log: Arc<MemoryLogStore>, max_events: u64, max_bytes: u64) -> Self {
        Self::with(Bound::Memory {
            log,
            max_events,
            max_bytes,
        })
    }

    /// Bounds the events waiting in the outbox for the log store.
    pub fn outbox(max_events: u64) -> Self {
        Self::with(Bound::Outbox { max_events })
    }

    /// No bound here (see the module docs).
    pub fn unbounded() -> Self {
        Self::with(Bound::None)
    }

    fn with(bound: Bound) -> Self {
        Self {
            bound,
            in_flight: Arc::new(Semaphore::new(Semaphore::MAX_PERMITS)),
            max_in_flight: Semaphore::MAX_PERMITS,
            outbox_events: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        }
    }

    /// At most `max` HTTP publishes handled at once ([`Self::enter`]).
    pub fn publishes_in_flight(mut self, max: usize) -> Self {
        let max = max.clamp(1, Semaphore::MAX_PERMITS);
        self.in_flight = Arc::new(Semaphore::new(max));
        self.max_in_flight = max;
        self
    }

    /// A place for one HTTP publish, or [`Refused`] while every place is taken.
    pub fn enter(&self) -> Result<InFlight, Refused> {
        match Arc::clone(&self.in_flight).try_acquire_owned() {
            Ok(permit) => Ok(InFlight(permit)),
            Err(_) => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                Err(Refused {
                    message: format!(
                        "{} publishes are being handled, the bound SHEAF_MAX_PUBLISHES_IN_FLIGHT;                          the service is at its capacity",
                        self.max_in_flight
                    ),
                    retry_after: RETRY_AFTER,
                })
            }
        }
    }

    /// Whether the outbox is what is bounded (so housekeeping should sample it).
    pub fn samples_outbox(&self) -> bool {
        matches!(self.bound, Bound::Outbox { .. })
    }

    /// Records how many events wait in the outbox now.
    pub fn note_outbox(&self, events: u64) {
        self.outbox_events.store(events, Ordering::Relaxed);
    }

    /// `Ok` when a publish may go in; [`Refused`] while the pending work is at its bound.
    pub fn check(&self) -> Result<(), Refused> {
        let refusal = match &self.bound {
            Bound::None => None,
            Bound::Memory {
                log,
                max_events,
                max_bytes,
            } => {
                let pending = log.pending();
                if pending.events >= *max_events {
                    Some(format!(
                        "{} events are accepted and not yet delivered, the bound \
                         SHEAF_MEMORY_MAX_PENDING_EVENTS={max_events}; nothing accepted is \
                         dropped, so publishes wait until deliveries make room",
                        pending.events
                    ))
                } else if pending.payload_bytes >= *max_bytes {
                    Some(format!(
                        "events accepted and not yet delivered hold {} bytes of payload, the \
                         bound SHEAF_MEMORY_MAX_PENDING_BYTES={max_bytes}; nothing accepted is \
                         dropped, so publishes wait until deliveries make room",
                        pending.payload_bytes
                    ))
                } else {
                    None
                }
            }
            Bound::Outbox { max_events } => {
                let waiting = self.outbox_events.load(Ordering::Relaxed);
                (waiting >= *max_events).then(|| {
                    format!(
                        "{waiting} events wait in the outbox for the log store, the bound \
                         SHEAF_OUTBOX_MAX_EVENTS={max_events}; publishes resume once the log \
                         store has taken them"
                    )
                })
            }
        };
        match refusal {
            None => Ok(()),
            Some(message) => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                Err(Refused {
                    message,
                    retry_after: RETRY_AFTER,
                })
            }
        }
    }

    /// What is pending now, against its bounds.
    pub fn usage(&self) -> Usage {
        let refused = self.refused.load(Ordering::Relaxed);
        match &self.bound {
            Bound::None => Usage {
                refused,
                ..Usage::default()
            },
            Bound::Memory {
                log,
                max_events,
                max_bytes,
            } => {
                let pending = log.pending();
                Usage {
                    events: pending.events,
                    max_events: *max_events,
                    bytes: pending.payload_bytes,
                    max_bytes: *max_bytes,
                    refused,
                }
            }
            Bound::Outbox { max_events } => Usage {
                events: self.outbox_events.load(Ordering::Relaxed),
                max_events: *max_events,
                refused,
                ..Usage::default()
            },
        }
    }
}
