//! The service's counters and their Prometheus text form, written by hand from atomics; each
//! metric family's name, type and help text is declared once, in `families.rs`.
//!
//! Counters only grow. The queue depth is read from the queue at scrape time, and the
//! coalescers' own counters ([`CoalesceMetrics`]) are read from their snapshots, so nothing
//! here is sampled on a timer.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sheaf_coalesce::CoalesceMetrics;

/// How a job's turn with a worker ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryOutcome {
    /// The destination took the delivery (any type: a webhook's 2xx, a broker's acknowledgement).
    Success,
    /// The attempt failed and the job was rescheduled.
    Failed,
    /// The attempt failed and it was the last one allowed: the job was dead-lettered.
    DeadLettered,
    /// A retry found its delivery already succeeded or superseded by a newer attempt.
    Superseded,
    /// A retry's previous attempt was not logged yet (or the lookup failed): it waits a little.
    NotReady,
    /// The destination or tenant is gone: nothing was sent.
    Dropped,
    /// The event is not in the log store, which should never happen (retention keeps every
    /// event a delivery is owed): nothing was sent, and the log says so as an error.
    EventMissing,
    /// Held back by the destination's rate limit or a `Retry-After` pause: rescheduled to its
    /// turn, not an attempt.
    Paced,
    /// The destination's transformation dropped the event: nothing was sent, nothing is owed.
    Filtered,
}

impl DeliveryOutcome {
    const ALL: [DeliveryOutcome; 9] = [
        DeliveryOutcome::Success,
        DeliveryOutcome::Failed,
        DeliveryOutcome::DeadLettered,
        DeliveryOutcome::Superseded,
        DeliveryOutcome::NotReady,
        DeliveryOutcome::Dropped,
        DeliveryOutcome::EventMissing,
        DeliveryOutcome::Paced,
        DeliveryOutcome::Filtered,
    ];

    fn label(self) -> &'static str {
        match self {
            DeliveryOutcome::Success => "success",
            DeliveryOutcome::Failed => "failed",
            DeliveryOutcome::DeadLettered => "dead_lettered",
            DeliveryOutcome::Superseded => "superseded",
            DeliveryOutcome::NotReady => "not_ready",
            DeliveryOutcome::Dropped => "dropped",
            DeliveryOutcome::Filtered => "filtered",
            DeliveryOutcome::EventMissing => "event_missing",
            DeliveryOutcome::Paced => "paced",
        }
    }

    fn index(self) -> usize {
        Self::ALL.iter().position(|o| *o == self).unwrap_or(0)
    }
}

/// Upper bounds of the attempt latency histogram, in seconds.
const LATENCY_BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// What a destination type made of an attempt, for `sheaf_destination_attempts_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptResult {
    /// Delivered.
    Delivered,
    /// A failure worth retrying.
    Retry,
    /// The receiver asked to be left alone for a while.
    Throttled,
    /// A failure retrying cannot mend: dead-lettered at once.
    Permanent,
}

impl AttemptResult {
    pub(crate) const ALL: [AttemptResult; 4] = [
        AttemptResult::Delivered,
        AttemptResult::Retry,
        AttemptResult::Throttled,
        AttemptResult::Permanent,
    ];

    pub(crate) fn label(self) -> &'static str {
        match self {
            AttemptResult::Delivered => "delivered",
            AttemptResult::Retry => "retry",
            AttemptResult::Throttled => "throttled",
            AttemptResult::Permanent => "permanent",
        }
    }
}

/// One destination type's attempts, by result, and their total duration.
#[derive(Debug)]
pub struct TypeAttempts {
    /// The type's name (the `type` label).
    pub name: &'static str,
    results: [AtomicU64; 4],
    micros: AtomicU64,
}

impl TypeAttempts {
    /// Attempts of this type that ended with `result`.
    pub fn count(&self, result: AttemptResult) -> u64 {
        read(&self.results[result as usize])
    }

    /// The seconds all its attempts took together.
    pub fn seconds(&self) -> f64 {
        read(&self.micros) as f64 / 1e6
    }
}

/// Every counter the service keeps besides the coalescers'.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Attempts by destination type, for the types this process has (set once at start).
    by_type: std::sync::OnceLock<Box<[TypeAttempts]>>,
    deliveries: [AtomicU64; DeliveryOutcome::ALL.len()],
    latency_buckets: [AtomicU64; LATENCY_BUCKETS.len()],
    latency_count: AtomicU64,
    latency_micros: AtomicU64,
    /// Scheduled retry attempts made (manual retries are not counted).
    pub retries: AtomicU64,
    /// Latest-attempt lookups the retry path asked for (one per retry resolved).
    pub retry_lookups: AtomicU64,
    /// Leases renewed because more than half of them was spent when a worker took the job.
    pub lease_renewals: AtomicU64,
    /// Leases found lost (another process owns the job now).
    pub leases_lost: AtomicU64,
    /// Claim queries issued by the dispatcher.
    pub claims: AtomicU64,
    /// Jobs claimed.
    pub jobs_claimed: AtomicU64,
    /// Jobs leased to this process by the accept of their publish and handed to its workers
    /// without a claim.
    pub jobs_handed_over: AtomicU64,
    /// Housekeeping runs of the queue that did something (Postgres: vacuums of `jobs`).
    pub queue_maintenance: AtomicU64,
    /// Housekeeping runs of the log store that did something (memory: records aged out).
    pub log_maintenance: AtomicU64,
    /// Processes delivering from the queue, as the last heartbeat counted them (0 before it).
    pub queue_processes: AtomicU64,
    /// Jobs released unstarted at shutdown.
    pub jobs_released: AtomicU64,
    /// Statements the completer wrote: one per kind of outcome in a flush, or one settlement
    /// per flush with an outbox.
    pub completer_statements: AtomicU64,
    /// Outcomes written by the completer.
    pub completer_outcomes: AtomicU64,
    /// Accepted publishes (new events).
    pub events_published: AtomicU64,
    /// Publishes of an id already known (idempotent repeats).
    pub publish_repeats: AtomicU64,
    /// Events the log shipper moved from the outbox to the log store.
    pub events_shipped: AtomicU64,
    /// Attempts the log shipper moved from the outbox to the log store.
    pub attempts_shipped: AtomicU64,
    /// Shipments that failed (the log store refused or was unreachable); their records stayed.
    pub shipment_failures: AtomicU64,
    /// Jobs enqueued by publishes, manual retries and replays.
    pub jobs_enqueued: AtomicU64,
    /// First deliveries whose payload came from the fresh-event cache.
    pub fresh_cache_hits: AtomicU64,
    /// First deliveries whose payload was read from the log store.
    pub fresh_cache_misses: AtomicU64,
    /// Destinations disabled after consecutive failed attempts.
    pub destinations_disabled: AtomicU64,
    /// Destinations that succeeded after having been disabled for failures.
    pub destinations_recovered: AtomicU64,
    /// Entity-store calls that recorded destination health (one per batch of reports).
    pub health_statements: AtomicU64,
    /// Operator events published.
    pub operator_events: AtomicU64,
    /// Operator events that could not be published (after retries).
    pub operator_event_failures: AtomicU64,
    /// The CDC source's counters and state.
    pub cdc: CdcMetrics,
}

/// What the CDC source is doing, for `/readyz` and `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CdcState {
    /// Not configured (`SHEAF_CDC_ENABLED=false`).
    Disabled,
    /// Connecting, checking or creating the slot and publication.
    Starting,
    /// Reading the slot and publishing.
    Streaming,
    /// The stream failed (or could not start); it starts again after a backoff.
    Restarting,
    /// Stopped by shutdown.
    Stopped,
}

impl CdcState {
    const ALL: [CdcState; 5] = [
        CdcState::Disabled,
        CdcState::Starting,
        CdcState::Streaming,
        CdcState::Restarting,
        CdcState::Stopped,
    ];

    /// Lower-case name, as `/readyz` shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            CdcState::Disabled => "disabled",
            CdcState::Starting => "starting",
            CdcState::Streaming => "streaming",
            CdcState::Restarting => "restarting",
            CdcState::Stopped => "stopped",
        }
    }
}

/// The CDC source's counters, gauges and state.
#[derive(Debug, Default)]
pub struct CdcMetrics {
    state: std::sync::atomic::AtomicU8,
    last_error: std::sync::Mutex<Option<String>>,
    /// Row changes received from the slot (after the table filter).
    pub changes: AtomicU64,
    /// Changes of tables `SHEAF_CDC_TENANTS` does not cover, dropped (and still acknowledged).
    pub dropped: AtomicU64,
    /// Events the CDC source published for the first time.
    pub events_published: AtomicU64,
    /// Changes whose event was already known (re-read after a restart or a crash).
    pub event_repeats: AtomicU64,
    /// Messages acknowledged to the slot after their events were durable.
    pub acks: AtomicU64,
    /// Publish attempts that failed (the message is retried, never skipped).
    pub publish_failures: AtomicU64,
    /// Times the stream was started again after an error.
    pub restarts: AtomicU64,
    /// Rows read from the slot and not yet acknowledged, as of the last message.
    pub rows_in_flight: AtomicU64,
    /// Commit time (Unix microseconds) of the newest acknowledged change; 0 before the first.
    pub last_ack_commit_micros: std::sync::atomic::AtomicI64,
    /// The slot position confirmed by this process (an LSN as a number).
    pub confirmed_lsn: AtomicU64,
}

impl CdcMetrics {
    /// The current state.
    pub fn state(&self) -> CdcState {
        let i = usize::from(self.state.load(Ordering::Relaxed));
        CdcState::ALL.get(i).copied().unwrap_or(CdcState::Disabled)
    }

    /// Sets the state.
    pub fn set_state(&self, state: CdcState) {
        let i = CdcState::ALL.iter().position(|s| *s == state).unwrap_or(0);
        self.state
            .store(u8::try_from(i).unwrap_or(0), Ordering::Relaxed);
    }

    /// The error that last stopped or refused the stream, if any.
    pub fn last_error(&self) -> Option<String> {
        self.last_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Records the error that stopped or refused the stream (`None` once it streams again).
    pub fn set_last_error(&self, error: Option<String>) {
        *self.last_error.lock().unwrap_or_else(|e| e.into_inner()) = error;
    }
}

/// Everything `/metrics` renders.
#[derive(Debug, Clone)]
pub struct MetricSources {
    /// The service's own counters.
    pub service: Arc<Metrics>,
    /// The retry path's latest-attempt coalescer.
    pub retry_lookup: Arc<CoalesceMetrics>,
    /// The event-payload coalescer.
    pub event_lookup: Arc<CoalesceMetrics>,
    /// The log store's write coalescer.
    pub log_write: Arc<CoalesceMetrics>,
    /// The group commit of publishes into the outbox (zero without one).
    pub publish_commit: Arc<CoalesceMetrics>,
    /// The pending-work bound and what it holds.
    pub admission: Arc<crate::state::admission::Admission>,
    /// The memory queue, for the dead letters it dropped at its bound (none with Postgres).
    pub memory_queue: Option<Arc<sheaf_memory::MemoryJobQueue>>,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

fn read(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

impl Metrics {
    /// Counts one job's outcome.
    pub fn delivery(&self, outcome: DeliveryOutcome) {
        bump(&self.deliveries[outcome.index()]);
    }

    /// How many jobs ended with `outcome` so far.
    pub fn deliveries(&self, outcome: DeliveryOutcome) -> u64 {
        read(&self.deliveries[outcome.index()])
    }

    /// Names the destination types whose attempts are counted by type; the first call wins.
    pub fn set_destination_types(&self, names: &[&'static str]) {
        let _ = self.by_type.set(
            names
                .iter()
                .map(|name| TypeAttempts {
                    name,
                    results: Default::default(),
                    micros: AtomicU64::new(0),
                })
                .collect(),
        );
    }

    /// Counts one attempt of destination type `name` (ignored for a type not set).
    pub fn type_attempt(&self, name: &str, result: AttemptResult, elapsed: Duration) {
        if let Some(entry) = self.destination_types().iter().find(|t| t.name == name) {
            bump(&entry.results[result as usize]);
            entry.micros.fetch_add(
                u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX),
                Ordering::Relaxed,
            );
        }
    }

    /// The counts by destination type.
    pub fn destination_types(&self) -> &[TypeAttempts] {
        self.by_type.get().map(|b| &b[..]).unwrap_or(&[])
    }

    /// Records one attempt's duration.
    pub fn attempt_latency(&self, elapsed: Duration) {
        let secs = elapsed.as_secs_f64();
        if let Some(i) = LATENCY_BUCKETS.iter().position(|b| secs <= *b) {
            bump(&self.latency_buckets[i]);
        }
        bump(&self.latency_count);
        self.latency_micros.fetch_add(
            u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// Adds `n` to a counter.
    pub fn add(counter: &AtomicU64, n: usize) {
        counter.fetch_add(u64::try_from(n).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// Adds one to a counter.
    pub fn inc(counter: &AtomicU64) {
        bump(counter);
    }
}

mod docs;
mod families;
mod page;
pub use docs::metric_table;
pub use page::{render, sample_value};
