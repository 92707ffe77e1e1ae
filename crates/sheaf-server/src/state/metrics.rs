//! The service's counters and their Prometheus text form, written by hand from atomics.
//!
//! Counters only grow. The queue depth is read from the queue at scrape time, and the
//! coalescers' own counters ([`CoalesceMetrics`]) are read from their snapshots, so nothing
//! here is sampled on a timer.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sheaf_coalesce::{BATCH_SIZE_BUCKETS, CoalesceMetrics, MetricsSnapshot};
use sheaf_store::QueueDepth;

/// How a job's turn with a worker ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryOutcome {
    /// The destination answered 2xx.
    Success,
    /// The attempt failed and the job was rescheduled.
    Failed,
    /// The attempt failed and it was the last one allowed: the job was dead-lettered.
    DeadLettered,
    /// A retry found its delivery already succeeded or superseded by a newer attempt.
    Superseded,
    /// A retry's previous attempt was not logged yet (or the lookup failed): it waits a little.
    NotReady,
    /// The destination or tenant is gone, or the destination is disabled: nothing was sent.
    Dropped,
    /// The event is not in the log store any more (retention): nothing was sent.
    EventMissing,
}

impl DeliveryOutcome {
    const ALL: [DeliveryOutcome; 7] = [
        DeliveryOutcome::Success,
        DeliveryOutcome::Failed,
        DeliveryOutcome::DeadLettered,
        DeliveryOutcome::Superseded,
        DeliveryOutcome::NotReady,
        DeliveryOutcome::Dropped,
        DeliveryOutcome::EventMissing,
    ];

    fn label(self) -> &'static str {
        match self {
            DeliveryOutcome::Success => "success",
            DeliveryOutcome::Failed => "failed",
            DeliveryOutcome::DeadLettered => "dead_lettered",
            DeliveryOutcome::Superseded => "superseded",
            DeliveryOutcome::NotReady => "not_ready",
            DeliveryOutcome::Dropped => "dropped",
            DeliveryOutcome::EventMissing => "event_missing",
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

/// Every counter the service keeps besides the coalescers'.
#[derive(Debug, Default)]
pub struct Metrics {
    deliveries: [AtomicU64; 7],
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
    /// Claim queries and the jobs they returned.
    pub claims: AtomicU64,
    /// Jobs claimed.
    pub jobs_claimed: AtomicU64,
    /// Jobs released unstarted at shutdown.
    pub jobs_released: AtomicU64,
    /// Completer flushes (one per kind of outcome present) and the outcomes they carried.
    pub completer_statements: AtomicU64,
    /// Outcomes written by the completer.
    pub completer_outcomes: AtomicU64,
    /// Accepted publishes (new events).
    pub events_published: AtomicU64,
    /// Publishes of an id already known (idempotent repeats).
    pub publish_repeats: AtomicU64,
    /// Jobs enqueued by publishes and manual retries.
    pub jobs_enqueued: AtomicU64,
    /// First deliveries whose payload came from the fresh-event cache.
    pub fresh_cache_hits: AtomicU64,
    /// First deliveries whose payload was read from the log store.
    pub fresh_cache_misses: AtomicU64,
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

struct Writer(String);

impl Writer {
    fn header(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {help}");
        let _ = writeln!(self.0, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &str, value: impl std::fmt::Display) {
        if labels.is_empty() {
            let _ = writeln!(self.0, "{name} {value}");
        } else {
            let _ = writeln!(self.0, "{name}{{{labels}}} {value}");
        }
    }

    fn counter(&mut self, name: &str, help: &str, value: u64) {
        self.header(name, "counter", help);
        self.sample(name, "", value);
    }

    fn batch_histogram(&mut self, name: &str, help: &str, snap: &MetricsSnapshot) {
        self.header(name, "histogram", help);
        let mut cumulative = 0;
        let mut count = 0;
        for (i, bound) in BATCH_SIZE_BUCKETS.iter().enumerate() {
            cumulative += snap.batch_size_buckets[i];
            count += snap.batch_size_buckets[i];
            let le = if *bound == usize::MAX {
                "+Inf".to_owned()
            } else {
                bound.to_string()
            };
            self.sample(
                &format!("{name}_bucket"),
                &format!("le=\"{le}\""),
                cumulative,
            );
        }
        self.sample(&format!("{name}_sum"), "", snap.keys_queried);
        self.sample(&format!("{name}_count"), "", count);
    }

    fn lookup(&mut self, prefix: &str, what: &str, snap: &MetricsSnapshot, keys: Option<u64>) {
        let queries = snap.batch_queries + snap.single_queries + snap.direct_lookups;
        self.counter(
            &format!("{prefix}_queries_total"),
            &format!("Queries sent to the log store for {what} (batch, single and direct)."),
            queries,
        );
        self.counter(
            &format!("{prefix}_batch_queries_total"),
            &format!("Batch queries for {what}."),
            snap.batch_queries,
        );
        self.counter(
            &format!("{prefix}_failed_queries_total"),
            &format!("Failed queries for {what}."),
            snap.failed_queries,
        );
        let keys = keys.unwrap_or(snap.keys_served + snap.direct_lookups);
        self.counter(
            &format!("{prefix}_keys_total"),
            &format!("Keys looked up for {what}; keys minus queries is the queries saved."),
            keys,
        );
        self.counter(
            &format!("{prefix}_queries_saved_total"),
            &format!("Queries coalescing saved for {what} (keys answered minus queries sent)."),
            keys.saturating_sub(queries),
        );
        self.batch_histogram(
            &format!("{prefix}_batch_size"),
            &format!("Distinct keys per flushed batch for {what}."),
            snap,
        );
    }
}

/// Renders every metric in the Prometheus text format (version 0.0.4).
pub fn render(sources: &MetricSources, depth: Option<QueueDepth>) -> String {
    let m = &sources.service;
    let mut w = Writer(String::with_capacity(8 * 1024));

    w.header(
        "sheaf_deliveries_total",
        "counter",
        "Jobs handled by workers, by outcome.",
    );
    for outcome in DeliveryOutcome::ALL {
        w.sample(
            "sheaf_deliveries_total",
            &format!("outcome=\"{}\"", outcome.label()),
            m.deliveries(outcome),
        );
    }

    w.header(
        "sheaf_attempt_duration_seconds",
        "histogram",
        "Duration of webhook attempts.",
    );
    let mut cumulative = 0;
    for (i, bound) in LATENCY_BUCKETS.iter().enumerate() {
        cumulative += read(&m.latency_buckets[i]);
        w.sample(
            "sheaf_attempt_duration_seconds_bucket",
            &format!("le=\"{bound}\""),
            cumulative,
        );
    }
    let count = read(&m.latency_count);
    w.sample(
        "sheaf_attempt_duration_seconds_bucket",
        "le=\"+Inf\"",
        count,
    );
    w.sample(
        "sheaf_attempt_duration_seconds_sum",
        "",
        read(&m.latency_micros) as f64 / 1e6,
    );
    w.sample("sheaf_attempt_duration_seconds_count", "", count);

    w.counter(
        "sheaf_retries_total",
        "Scheduled retry attempts made (attempts after the first; manual retries not included).",
        read(&m.retries),
    );
    w.counter(
        "sheaf_lease_renewals_total",
        "Leases renewed because more than half was spent before the worker started.",
        read(&m.lease_renewals),
    );
    w.counter(
        "sheaf_leases_lost_total",
        "Leases found lost: another claimer owns the job.",
        read(&m.leases_lost),
    );
    w.counter(
        "sheaf_claim_queries_total",
        "Claim queries issued by the dispatcher.",
        read(&m.claims),
    );
    w.counter(
        "sheaf_jobs_claimed_total",
        "Jobs claimed by the dispatcher.",
        read(&m.jobs_claimed),
    );
    w.counter(
        "sheaf_jobs_released_total",
        "Claimed jobs released unstarted at shutdown.",
        read(&m.jobs_released),
    );
    w.counter(
        "sheaf_completer_statements_total",
        "Queue statements written by the completer (complete, reschedule, dead-letter, release).",
        read(&m.completer_statements),
    );
    w.counter(
        "sheaf_completer_outcomes_total",
        "Job outcomes written by the completer.",
        read(&m.completer_outcomes),
    );
    w.counter(
        "sheaf_events_published_total",
        "Events accepted by publish.",
        read(&m.events_published),
    );
    w.counter(
        "sheaf_publish_repeats_total",
        "Publishes of an event id already known (no second delivery).",
        read(&m.publish_repeats),
    );
    w.counter(
        "sheaf_jobs_enqueued_total",
        "Jobs handed to the queue by publishes and manual retries.",
        read(&m.jobs_enqueued),
    );
    w.counter(
        "sheaf_fresh_event_cache_hits_total",
        "First deliveries whose payload came from the fresh-event cache.",
        read(&m.fresh_cache_hits),
    );
    w.counter(
        "sheaf_fresh_event_cache_misses_total",
        "First deliveries whose payload was read from the log store.",
        read(&m.fresh_cache_misses),
    );

    let cdc = &m.cdc;
    if cdc.state() != CdcState::Disabled {
        w.counter(
            "sheaf_cdc_changes_total",
            "Row changes received from the replication slot.",
            read(&cdc.changes),
        );
        w.counter(
            "sheaf_cdc_changes_dropped_total",
            "Changes of tables SHEAF_CDC_TENANTS does not cover (dropped, still acknowledged).",
            read(&cdc.dropped),
        );
        w.counter(
            "sheaf_cdc_events_published_total",
            "Events the CDC source published for the first time.",
            read(&cdc.events_published),
        );
        w.counter(
            "sheaf_cdc_event_repeats_total",
            "Changes whose event was already known (re-read after a restart): not published twice.",
            read(&cdc.event_repeats),
        );
        w.counter(
            "sheaf_cdc_acks_total",
            "Messages acknowledged to the slot after their events were durable.",
            read(&cdc.acks),
        );
        w.counter(
            "sheaf_cdc_publish_failures_total",
            "CDC publish attempts that failed; the message is retried, never skipped.",
            read(&cdc.publish_failures),
        );
        w.counter(
            "sheaf_cdc_restarts_total",
            "Times the replication stream was started again after an error.",
            read(&cdc.restarts),
        );
        w.header(
            "sheaf_cdc_streaming",
            "gauge",
            "1 while the CDC source reads its slot, 0 otherwise.",
        );
        w.sample(
            "sheaf_cdc_streaming",
            "",
            u8::from(cdc.state() == CdcState::Streaming),
        );
        w.header(
            "sheaf_cdc_rows_in_flight",
            "gauge",
            "Rows read from the slot and not yet acknowledged.",
        );
        w.sample("sheaf_cdc_rows_in_flight", "", read(&cdc.rows_in_flight));
        w.header(
            "sheaf_cdc_last_ack_commit_timestamp_seconds",
            "gauge",
            "Commit time of the newest acknowledged change (Unix seconds); time() minus it is the lag while changes flow.",
        );
        w.sample(
            "sheaf_cdc_last_ack_commit_timestamp_seconds",
            "",
            cdc.last_ack_commit_micros.load(Ordering::Relaxed) as f64 / 1e6,
        );
    }

    if let Some(depth) = depth {
        w.header(
            "sheaf_queue_jobs",
            "gauge",
            "Jobs in the queue by state, read at scrape time.",
        );
        for (state, value) in [
            ("due", depth.due),
            ("scheduled", depth.scheduled),
            ("claimed", depth.claimed),
            ("dead_lettered", depth.dead_lettered),
        ] {
            w.sample("sheaf_queue_jobs", &format!("state=\"{state}\""), value);
        }
    }

    let retry = sources.retry_lookup.snapshot();
    w.lookup(
        "sheaf_retry_lookup",
        "retries' latest attempts",
        &retry,
        Some(read(&m.retry_lookups)),
    );
    let event = sources.event_lookup.snapshot();
    w.lookup("sheaf_event_lookup", "event payloads and ids", &event, None);

    let write = sources.log_write.snapshot();
    w.counter(
        "sheaf_log_writes_total",
        "Writes issued to the log store by the write coalescer.",
        write.writes,
    );
    w.counter(
        "sheaf_log_write_failures_total",
        "Log store writes that failed.",
        write.failed_writes,
    );
    w.counter(
        "sheaf_log_write_rows_total",
        "Events and attempts written; divided by writes, the rows per write.",
        write.records_written,
    );
    w.counter(
        "sheaf_log_write_batches_total",
        "Handed-off batches carried by those writes.",
        write.batches_written,
    );
    w.counter(
        "sheaf_log_write_bytes_total",
        "Bytes (JSON size) written to the log store.",
        write.bytes_written,
    );
    w.0
}

/// Reads one sample's value from a Prometheus text page (for tests and tools).
pub fn sample_value(page: &str, name_and_labels: &str) -> Option<f64> {
    page.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|line| {
            let (key, value) = line.rsplit_once(' ')?;
            (key == name_and_labels).then(|| value.parse().ok())?
        })
}
