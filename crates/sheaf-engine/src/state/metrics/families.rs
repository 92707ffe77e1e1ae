//! Every metric family of the Prometheus page, declared once: its name, its type and its
//! `# HELP` text.
//!
//! [`render`](super::render) takes each family's `# HELP` and `# TYPE` lines from here, and
//! [`metric_table`](super::metric_table) writes `docs/operations.md`'s table from [`FAMILIES`],
//! so a help text is written in exactly one place. The test beside the generator renders a page
//! with every section present and checks it declares exactly these families, in this order: a
//! family rendered but not listed, listed but not rendered, or moved on one side only fails it.
//!
//! A family's constant is its name without `sheaf_`, upper-case (`sheaf_retries_total` is
//! [`RETRIES_TOTAL`]); the two lookup coalescers' families are one [`LookupFamilies`] each, a
//! field per family named by the part after the coalescer's prefix. Help texts describe every
//! destination type, not one.

/// A family's Prometheus type, the word its `# TYPE` line carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// Only grows; names end in `_total`.
    Counter,
    /// Read as it is now.
    Gauge,
    /// Cumulative `_bucket` samples with their `_sum` and `_count`.
    Histogram,
}

impl Kind {
    /// The word of the `# TYPE` line.
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// One metric family: every sample of it shares the name (histograms add their suffixes).
#[derive(Debug, Clone, Copy)]
pub(super) struct Family {
    /// The metric name, `sheaf_…`.
    pub(super) name: &'static str,
    /// Its Prometheus type.
    pub(super) kind: Kind,
    /// The `# HELP` text: one line, no backslash (the text format would need them escaped).
    pub(super) help: &'static str,
}

const fn counter(name: &'static str, help: &'static str) -> Family {
    Family {
        name,
        kind: Kind::Counter,
        help,
    }
}

const fn gauge(name: &'static str, help: &'static str) -> Family {
    Family {
        name,
        kind: Kind::Gauge,
        help,
    }
}

const fn histogram(name: &'static str, help: &'static str) -> Family {
    Family {
        name,
        kind: Kind::Histogram,
        help,
    }
}

/// The families of one lookup coalescer, written from its snapshot in this order.
#[derive(Debug, Clone, Copy)]
pub(super) struct LookupFamilies {
    /// Every query sent: batch, single and direct.
    pub(super) queries_total: Family,
    /// Batch queries only.
    pub(super) batch_queries_total: Family,
    /// Queries that failed.
    pub(super) failed_queries_total: Family,
    /// Keys asked for.
    pub(super) keys_total: Family,
    /// Keys minus queries.
    pub(super) queries_saved_total: Family,
    /// Time batches spent gathering.
    pub(super) wait_seconds_total: Family,
    /// Distinct keys per flushed batch.
    pub(super) batch_size: Family,
}

// Jobs handled, attempts by destination type, and how long attempts took (`deliveries` in page.rs).
pub(super) const DELIVERIES_TOTAL: Family = counter(
    "sheaf_deliveries_total",
    "Jobs handled by workers, by outcome.",
);
pub(super) const DESTINATION_ATTEMPTS_TOTAL: Family = counter(
    "sheaf_destination_attempts_total",
    "Attempts by destination type and what the type made of them (delivered, retry, throttled, permanent).",
);
pub(super) const DESTINATION_ATTEMPT_SECONDS_TOTAL: Family = counter(
    "sheaf_destination_attempt_seconds_total",
    "Time attempts took, by destination type; divided by the attempts, their mean duration.",
);
pub(super) const ATTEMPT_DURATION_SECONDS: Family = histogram(
    "sheaf_attempt_duration_seconds",
    "Duration of delivery attempts, every destination type.",
);

// The claimer's, the completer's and housekeeping's work on the queue (`queue_work` in page.rs).
pub(super) const RETRIES_TOTAL: Family = counter(
    "sheaf_retries_total",
    "Scheduled retry attempts made (attempts after the first; manual retries not included).",
);
pub(super) const LEASE_RENEWALS_TOTAL: Family = counter(
    "sheaf_lease_renewals_total",
    "Leases renewed because more than half was spent before the worker started.",
);
pub(super) const LEASES_LOST_TOTAL: Family = counter(
    "sheaf_leases_lost_total",
    "Leases found lost: another claimer owns the job.",
);
pub(super) const CLAIM_QUERIES_TOTAL: Family = counter(
    "sheaf_claim_queries_total",
    "Claim queries issued by the dispatcher.",
);
pub(super) const JOBS_CLAIMED_TOTAL: Family = counter(
    "sheaf_jobs_claimed_total",
    "Jobs claimed by the dispatcher.",
);
pub(super) const JOBS_HANDED_OVER_TOTAL: Family = counter(
    "sheaf_jobs_handed_over_total",
    "Jobs leased by their publish's accept and handed to the workers without a claim.",
);
pub(super) const QUEUE_MAINTENANCE_TOTAL: Family = counter(
    "sheaf_queue_maintenance_total",
    "Queue housekeeping runs that did something (Postgres: vacuums of the jobs table).",
);
pub(super) const QUEUE_PROCESSES: Family = gauge(
    "sheaf_queue_processes",
    "Processes delivering from the queue, as this process's last heartbeat counted them; rate limits are split between them.",
);
pub(super) const LOG_MAINTENANCE_TOTAL: Family = counter(
    "sheaf_log_maintenance_total",
    "Log store housekeeping runs that did something (memory: records past their retention age dropped while idle).",
);
pub(super) const JOBS_RELEASED_TOTAL: Family = counter(
    "sheaf_jobs_released_total",
    "Claimed jobs released unstarted at shutdown.",
);
pub(super) const COMPLETER_STATEMENTS_TOTAL: Family = counter(
    "sheaf_completer_statements_total",
    "Statements the completer wrote to the queue: one per kind of outcome (complete, reschedule, dead-letter) in each flush, or with an outbox one settlement per flush, attempts included.",
);
pub(super) const COMPLETER_OUTCOMES_TOTAL: Family = counter(
    "sheaf_completer_outcomes_total",
    "Job outcomes written by the completer.",
);

// Publishes accepted and repeated, and the log shipper behind an outbox (`publishes` in page.rs).
pub(super) const EVENTS_PUBLISHED_TOTAL: Family = counter(
    "sheaf_events_published_total",
    "New events accepted by publish: HTTP, CDC and operator events alike.",
);
pub(super) const PUBLISH_REPEATS_TOTAL: Family = counter(
    "sheaf_publish_repeats_total",
    "Publishes of an event id already known (no second delivery).",
);
pub(super) const EVENTS_SHIPPED_TOTAL: Family = counter(
    "sheaf_events_shipped_total",
    "Events moved from the outbox to the log store by the log shipper.",
);
pub(super) const ATTEMPTS_SHIPPED_TOTAL: Family = counter(
    "sheaf_attempts_shipped_total",
    "Attempts moved from the outbox to the log store by the log shipper.",
);
pub(super) const SHIPMENT_FAILURES_TOTAL: Family = counter(
    "sheaf_shipment_failures_total",
    "Shipments the log store did not take; their records stayed in the outbox.",
);

// Destinations disabled and recovered, and the operator events about them (`destination_health` in page.rs).
pub(super) const DESTINATIONS_DISABLED_TOTAL: Family = counter(
    "sheaf_destinations_disabled_total",
    "Destinations disabled after SHEAF_DESTINATION_DISABLE_AFTER_FAILURES consecutive failed attempts.",
);
pub(super) const DESTINATIONS_RECOVERED_TOTAL: Family = counter(
    "sheaf_destinations_recovered_total",
    "Destinations whose attempt succeeded after they had been disabled for failures.",
);
pub(super) const DESTINATION_HEALTH_STATEMENTS_TOTAL: Family = counter(
    "sheaf_destination_health_statements_total",
    "Entity-store calls that counted consecutive failures, one per batch of delivery outcomes.",
);
pub(super) const OPERATOR_EVENTS_TOTAL: Family = counter(
    "sheaf_operator_events_total",
    "Operator events (destination.disabled, destination.recovered, delivery.dead_lettered) published for SHEAF_OPERATOR_WEBHOOK_URL.",
);
pub(super) const OPERATOR_EVENT_FAILURES_TOTAL: Family = counter(
    "sheaf_operator_event_failures_total",
    "Operator events that could not be published after retries.",
);

// Jobs enqueued, and where first deliveries found their payload (`jobs_and_payloads` in page.rs).
pub(super) const JOBS_ENQUEUED_TOTAL: Family = counter(
    "sheaf_jobs_enqueued_total",
    "Jobs handed to the queue by publishes (HTTP, CDC and operator events), manual retries and replays.",
);
pub(super) const FRESH_EVENT_CACHE_HITS_TOTAL: Family = counter(
    "sheaf_fresh_event_cache_hits_total",
    "First deliveries whose payload came from the fresh-event cache.",
);
pub(super) const FRESH_EVENT_CACHE_MISSES_TOTAL: Family = counter(
    "sheaf_fresh_event_cache_misses_total",
    "First deliveries whose payload was read from the log store.",
);

// The CDC source, while it is enabled (`cdc` in page.rs).
pub(super) const CDC_CHANGES_TOTAL: Family = counter(
    "sheaf_cdc_changes_total",
    "Row changes received from the replication slot.",
);
pub(super) const CDC_CHANGES_DROPPED_TOTAL: Family = counter(
    "sheaf_cdc_changes_dropped_total",
    "Changes of tables SHEAF_CDC_TENANTS does not cover (dropped, still acknowledged).",
);
pub(super) const CDC_EVENTS_PUBLISHED_TOTAL: Family = counter(
    "sheaf_cdc_events_published_total",
    "Events the CDC source published for the first time.",
);
pub(super) const CDC_EVENT_REPEATS_TOTAL: Family = counter(
    "sheaf_cdc_event_repeats_total",
    "Changes whose event was already known (re-read after a restart): not published twice.",
);
pub(super) const CDC_ACKS_TOTAL: Family = counter(
    "sheaf_cdc_acks_total",
    "Messages acknowledged to the slot after their events were durable.",
);
pub(super) const CDC_PUBLISH_FAILURES_TOTAL: Family = counter(
    "sheaf_cdc_publish_failures_total",
    "CDC publish attempts that failed; the message is retried, never skipped.",
);
pub(super) const CDC_RESTARTS_TOTAL: Family = counter(
    "sheaf_cdc_restarts_total",
    "Times the replication stream was started again after an error.",
);
pub(super) const CDC_STREAMING: Family = gauge(
    "sheaf_cdc_streaming",
    "1 while the CDC source reads its slot, 0 otherwise.",
);
pub(super) const CDC_ROWS_IN_FLIGHT: Family = gauge(
    "sheaf_cdc_rows_in_flight",
    "Rows read from the slot and not yet acknowledged.",
);
pub(super) const CDC_LAST_ACK_COMMIT_TIMESTAMP_SECONDS: Family = gauge(
    "sheaf_cdc_last_ack_commit_timestamp_seconds",
    "Commit time of the newest acknowledged change (Unix seconds); time() minus it is the lag while changes flow.",
);

// The queue's jobs by state, read at scrape time (`queue_depth` in page.rs).
pub(super) const QUEUE_JOBS: Family = gauge(
    "sheaf_queue_jobs",
    "Jobs in the queue by state, read at scrape time.",
);

// The coalesced lookups: retries' latest attempts and event payloads (`lookups` in page.rs).
/// `sheaf_retry_lookup_*`.
pub(super) const RETRY_LOOKUP: LookupFamilies = LookupFamilies {
    queries_total: counter(
        "sheaf_retry_lookup_queries_total",
        "Queries sent to the log store for retries' latest attempts (batch, single and direct).",
    ),
    batch_queries_total: counter(
        "sheaf_retry_lookup_batch_queries_total",
        "Batch queries for retries' latest attempts.",
    ),
    failed_queries_total: counter(
        "sheaf_retry_lookup_failed_queries_total",
        "Failed queries for retries' latest attempts.",
    ),
    keys_total: counter(
        "sheaf_retry_lookup_keys_total",
        "Keys looked up for retries' latest attempts; keys minus queries is the queries saved.",
    ),
    queries_saved_total: counter(
        "sheaf_retry_lookup_queries_saved_total",
        "Queries coalescing saved for retries' latest attempts (keys answered minus queries sent).",
    ),
    wait_seconds_total: counter(
        "sheaf_retry_lookup_wait_seconds_total",
        "Time batches for retries' latest attempts spent gathering keys before their query; divided by batch queries, the mean wait.",
    ),
    batch_size: histogram(
        "sheaf_retry_lookup_batch_size",
        "Distinct keys per flushed batch for retries' latest attempts.",
    ),
};
/// `sheaf_event_lookup_*`.
pub(super) const EVENT_LOOKUP: LookupFamilies = LookupFamilies {
    queries_total: counter(
        "sheaf_event_lookup_queries_total",
        "Queries sent to the log store for event payloads and ids (batch, single and direct).",
    ),
    batch_queries_total: counter(
        "sheaf_event_lookup_batch_queries_total",
        "Batch queries for event payloads and ids.",
    ),
    failed_queries_total: counter(
        "sheaf_event_lookup_failed_queries_total",
        "Failed queries for event payloads and ids.",
    ),
    keys_total: counter(
        "sheaf_event_lookup_keys_total",
        "Keys looked up for event payloads and ids; keys minus queries is the queries saved.",
    ),
    queries_saved_total: counter(
        "sheaf_event_lookup_queries_saved_total",
        "Queries coalescing saved for event payloads and ids (keys answered minus queries sent).",
    ),
    wait_seconds_total: counter(
        "sheaf_event_lookup_wait_seconds_total",
        "Time batches for event payloads and ids spent gathering keys before their query; divided by batch queries, the mean wait.",
    ),
    batch_size: histogram(
        "sheaf_event_lookup_batch_size",
        "Distinct keys per flushed batch for event payloads and ids.",
    ),
};

// The write coalescer in front of the log store (`log_writes` in page.rs).
pub(super) const LOG_WRITES_TOTAL: Family = counter(
    "sheaf_log_writes_total",
    "Writes issued to the log store by the write coalescer.",
);
pub(super) const LOG_WRITE_FAILURES_TOTAL: Family = counter(
    "sheaf_log_write_failures_total",
    "Log store writes that failed.",
);
pub(super) const LOG_WRITE_ROWS_TOTAL: Family = counter(
    "sheaf_log_write_rows_total",
    "Events and attempts written; divided by writes, the rows per write.",
);
pub(super) const LOG_WRITE_BATCHES_TOTAL: Family = counter(
    "sheaf_log_write_batches_total",
    "Handed-off batches carried by those writes.",
);
pub(super) const LOG_WRITE_BYTES_TOTAL: Family = counter(
    "sheaf_log_write_bytes_total",
    "Bytes (JSON size) written to the log store.",
);
pub(super) const LOG_WRITE_WAIT_SECONDS_TOTAL: Family = counter(
    "sheaf_log_write_wait_seconds_total",
    "Time log store writes spent waiting for more rows (SHEAF_LOG_WRITE_MAX_WAIT windows); divided by writes, the mean wait.",
);

// The outbox's group commit of publishes (`publish_commits` in page.rs).
pub(super) const PUBLISH_COMMITS_TOTAL: Family = counter(
    "sheaf_publish_commits_total",
    "Outbox statements that committed publishes (group commit).",
);
pub(super) const PUBLISH_COMMIT_EVENTS_TOTAL: Family = counter(
    "sheaf_publish_commit_events_total",
    "Events carried by those statements; divided by commits, the events per commit.",
);
pub(super) const PUBLISH_COMMIT_FAILURES_TOTAL: Family = counter(
    "sheaf_publish_commit_failures_total",
    "Outbox statements of publishes that failed.",
);

// The pending-work bound and what it refused (`pending_work` in page.rs).
pub(super) const PENDING_EVENTS: Family = gauge(
    "sheaf_pending_events",
    "Events accepted and not yet delivered that the pending-work bound counts: held in the memory log (memory backends) or waiting in the outbox for the log store (Postgres queue, log elsewhere); 0 where no bound applies.",
);
pub(super) const PENDING_EVENTS_LIMIT: Family = gauge(
    "sheaf_pending_events_limit",
    "The bound on sheaf_pending_events (SHEAF_MEMORY_MAX_PENDING_EVENTS or SHEAF_OUTBOX_MAX_EVENTS); at it publishes are refused with 503. 0: no bound applies.",
);
pub(super) const PENDING_PAYLOAD_BYTES: Family = gauge(
    "sheaf_pending_payload_bytes",
    "Payload bytes of the events held for deliveries in the memory log.",
);
pub(super) const PENDING_PAYLOAD_BYTES_LIMIT: Family = gauge(
    "sheaf_pending_payload_bytes_limit",
    "The bound on sheaf_pending_payload_bytes (SHEAF_MEMORY_MAX_PENDING_BYTES); 0: no bound applies.",
);
pub(super) const PUBLISHES_REFUSED_TOTAL: Family = counter(
    "sheaf_publishes_refused_total",
    "Publishes (HTTP and CDC) refused with 503 because the pending work was at its bound; nothing accepted is dropped instead.",
);
pub(super) const DEAD_LETTERS_DROPPED_TOTAL: Family = counter(
    "sheaf_dead_letters_dropped_total",
    "Dead letters the memory queue dropped, oldest first, to keep its newest 10,000 (their events leave the log's protection with them).",
);

// What waits in the outbox for the log store (`outbox` in page.rs).
pub(super) const OUTBOX_EVENTS: Family = gauge(
    "sheaf_outbox_events",
    "Events in the outbox, not yet in the log store.",
);
pub(super) const OUTBOX_ATTEMPTS: Family = gauge(
    "sheaf_outbox_attempts",
    "Attempts in the outbox, not yet in the log store.",
);
pub(super) const OUTBOX_OLDEST_SECONDS: Family = gauge(
    "sheaf_outbox_oldest_seconds",
    "Age of the oldest record waiting for the log store; 0 when none waits.",
);

/// Every family, in the order the page writes them (and `docs/operations.md` lists them).
pub(super) const FAMILIES: &[Family] = &[
    DELIVERIES_TOTAL,
    DESTINATION_ATTEMPTS_TOTAL,
    DESTINATION_ATTEMPT_SECONDS_TOTAL,
    ATTEMPT_DURATION_SECONDS,
    RETRIES_TOTAL,
    LEASE_RENEWALS_TOTAL,
    LEASES_LOST_TOTAL,
    CLAIM_QUERIES_TOTAL,
    JOBS_CLAIMED_TOTAL,
    JOBS_HANDED_OVER_TOTAL,
    QUEUE_MAINTENANCE_TOTAL,
    QUEUE_PROCESSES,
    LOG_MAINTENANCE_TOTAL,
    JOBS_RELEASED_TOTAL,
    COMPLETER_STATEMENTS_TOTAL,
    COMPLETER_OUTCOMES_TOTAL,
    EVENTS_PUBLISHED_TOTAL,
    PUBLISH_REPEATS_TOTAL,
    EVENTS_SHIPPED_TOTAL,
    ATTEMPTS_SHIPPED_TOTAL,
    SHIPMENT_FAILURES_TOTAL,
    DESTINATIONS_DISABLED_TOTAL,
    DESTINATIONS_RECOVERED_TOTAL,
    DESTINATION_HEALTH_STATEMENTS_TOTAL,
    OPERATOR_EVENTS_TOTAL,
    OPERATOR_EVENT_FAILURES_TOTAL,
    JOBS_ENQUEUED_TOTAL,
    FRESH_EVENT_CACHE_HITS_TOTAL,
    FRESH_EVENT_CACHE_MISSES_TOTAL,
    CDC_CHANGES_TOTAL,
    CDC_CHANGES_DROPPED_TOTAL,
    CDC_EVENTS_PUBLISHED_TOTAL,
    CDC_EVENT_REPEATS_TOTAL,
    CDC_ACKS_TOTAL,
    CDC_PUBLISH_FAILURES_TOTAL,
    CDC_RESTARTS_TOTAL,
    CDC_STREAMING,
    CDC_ROWS_IN_FLIGHT,
    CDC_LAST_ACK_COMMIT_TIMESTAMP_SECONDS,
    QUEUE_JOBS,
    RETRY_LOOKUP.queries_total,
    RETRY_LOOKUP.batch_queries_total,
    RETRY_LOOKUP.failed_queries_total,
    RETRY_LOOKUP.keys_total,
    RETRY_LOOKUP.queries_saved_total,
    RETRY_LOOKUP.wait_seconds_total,
    RETRY_LOOKUP.batch_size,
    EVENT_LOOKUP.queries_total,
    EVENT_LOOKUP.batch_queries_total,
    EVENT_LOOKUP.failed_queries_total,
    EVENT_LOOKUP.keys_total,
    EVENT_LOOKUP.queries_saved_total,
    EVENT_LOOKUP.wait_seconds_total,
    EVENT_LOOKUP.batch_size,
    LOG_WRITES_TOTAL,
    LOG_WRITE_FAILURES_TOTAL,
    LOG_WRITE_ROWS_TOTAL,
    LOG_WRITE_BATCHES_TOTAL,
    LOG_WRITE_BYTES_TOTAL,
    LOG_WRITE_WAIT_SECONDS_TOTAL,
    PUBLISH_COMMITS_TOTAL,
    PUBLISH_COMMIT_EVENTS_TOTAL,
    PUBLISH_COMMIT_FAILURES_TOTAL,
    PENDING_EVENTS,
    PENDING_EVENTS_LIMIT,
    PENDING_PAYLOAD_BYTES,
    PENDING_PAYLOAD_BYTES_LIMIT,
    PUBLISHES_REFUSED_TOTAL,
    DEAD_LETTERS_DROPPED_TOTAL,
    OUTBOX_EVENTS,
    OUTBOX_ATTEMPTS,
    OUTBOX_OLDEST_SECONDS,
];
