//! The Prometheus text page: every counter of [`Metrics`], the coalescers' snapshots, the queue
//! depth and the outbox backlog read at scrape time.

use std::fmt::Write as _;

use sheaf_coalesce::{BATCH_SIZE_BUCKETS, MetricsSnapshot};
use sheaf_store::{OutboxBacklog, QueueDepth, Timestamp};

use super::*;

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

    fn seconds(&mut self, name: &str, help: &str, value: std::time::Duration) {
        self.header(name, "counter", help);
        self.sample(name, "", value.as_secs_f64());
    }

    fn gauge(&mut self, name: &str, help: &str, value: impl std::fmt::Display) {
        self.header(name, "gauge", help);
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
        self.seconds(
            &format!("{prefix}_wait_seconds_total"),
            &format!(
                "Time batches for {what} spent gathering keys before their query; divided by \
                 batch queries, the mean wait."
            ),
            snap.lookup_wait,
        );
        self.batch_histogram(
            &format!("{prefix}_batch_size"),
            &format!("Distinct keys per flushed batch for {what}."),
            snap,
        );
    }
}

/// Renders every metric in the Prometheus text format (version 0.0.4), section by section.
pub fn render(
    sources: &MetricSources,
    depth: Option<QueueDepth>,
    backlog: Option<OutboxBacklog>,
) -> String {
    let m = &sources.service;
    let mut w = Writer(String::with_capacity(8 * 1024));
    deliveries(&mut w, m);
    queue_work(&mut w, m);
    publishes(&mut w, m);
    destination_health(&mut w, m);
    jobs_and_payloads(&mut w, m);
    cdc(&mut w, m);
    if let Some(depth) = depth {
        queue_depth(&mut w, depth);
    }
    lookups(&mut w, sources);
    log_writes(&mut w, sources);
    publish_commits(&mut w, sources);
    pending_work(&mut w, sources);
    if let Some(backlog) = backlog {
        outbox(&mut w, backlog);
    }
    w.0
}

/// Jobs handled, attempts by destination type, and how long attempts took.
fn deliveries(w: &mut Writer, m: &Metrics) {
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
        "sheaf_destination_attempts_total",
        "counter",
        "Attempts by destination type and what the type made of them (delivered, retry, throttled, permanent).",
    );
    for kind in m.destination_types() {
        for result in AttemptResult::ALL {
            w.sample(
                "sheaf_destination_attempts_total",
                &format!("type=\"{}\",result=\"{}\"", kind.name, result.label()),
                kind.count(result),
            );
        }
    }
    w.header(
        "sheaf_destination_attempt_seconds_total",
        "counter",
        "Time attempts took, by destination type; divided by the attempts, their mean duration.",
    );
    for kind in m.destination_types() {
        w.sample(
            "sheaf_destination_attempt_seconds_total",
            &format!("type=\"{}\"", kind.name),
            kind.seconds(),
        );
    }

    w.header(
        "sheaf_attempt_duration_seconds",
        "histogram",
        "Duration of delivery attempts, every destination type.",
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
}

/// The claimer's, the completer's and housekeeping's work on the queue.
fn queue_work(w: &mut Writer, m: &Metrics) {
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
        "sheaf_jobs_handed_over_total",
        "Jobs leased by their publish's accept and handed to the workers without a claim.",
        read(&m.jobs_handed_over),
    );
    w.counter(
        "sheaf_queue_maintenance_total",
        "Queue housekeeping runs that did something (Postgres: vacuums of the jobs table).",
        read(&m.queue_maintenance),
    );
    w.gauge(
        "sheaf_queue_processes",
        "Processes delivering from the queue, as this process's last heartbeat counted them; rate limits are split between them.",
        read(&m.queue_processes),
    );
    w.counter(
        "sheaf_log_maintenance_total",
        "Log store housekeeping runs that did something (memory: records past their retention age dropped while idle).",
        read(&m.log_maintenance),
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
}

/// Publishes accepted and repeated, and the log shipper behind an outbox.
fn publishes(w: &mut Writer, m: &Metrics) {
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
        "sheaf_events_shipped_total",
        "Events moved from the outbox to the log store by the log shipper.",
        read(&m.events_shipped),
    );
    w.counter(
        "sheaf_attempts_shipped_total",
        "Attempts moved from the outbox to the log store by the log shipper.",
        read(&m.attempts_shipped),
    );
    w.counter(
        "sheaf_shipment_failures_total",
        "Shipments the log store did not take; their records stayed in the outbox.",
        read(&m.shipment_failures),
    );
}

/// Destinations disabled and recovered, and the operator events about them.
fn destination_health(w: &mut Writer, m: &Metrics) {
    w.counter(
        "sheaf_destinations_disabled_total",
        "Destinations disabled after SHEAF_DESTINATION_DISABLE_AFTER_FAILURES consecutive failed attempts.",
        read(&m.destinations_disabled),
    );
    w.counter(
        "sheaf_destinations_recovered_total",
        "Destinations whose attempt succeeded after they had been disabled for failures.",
        read(&m.destinations_recovered),
    );
    w.counter(
        "sheaf_destination_health_statements_total",
        "Entity-store calls that counted consecutive failures, one per batch of delivery outcomes.",
        read(&m.health_statements),
    );
    w.counter(
        "sheaf_operator_events_total",
        "Operator events (destination.disabled, destination.recovered, delivery.dead_lettered) published for SHEAF_OPERATOR_WEBHOOK_URL.",
        read(&m.operator_events),
    );
    w.counter(
        "sheaf_operator_event_failures_total",
        "Operator events that could not be published after retries.",
        read(&m.operator_event_failures),
    );
}

/// Jobs enqueued, and where first deliveries found their payload.
fn jobs_and_payloads(w: &mut Writer, m: &Metrics) {
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
}

/// The CDC source's counters, while it is enabled.
fn cdc(w: &mut Writer, m: &Metrics) {
    let cdc = &m.cdc;
    if cdc.state() == CdcState::Disabled {
        return;
    }
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

/// The queue's jobs by state, read at scrape time.
fn queue_depth(w: &mut Writer, depth: QueueDepth) {
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

/// The coalesced lookups: retries' latest attempts and event payloads.
fn lookups(w: &mut Writer, sources: &MetricSources) {
    let retry = sources.retry_lookup.snapshot();
    w.lookup(
        "sheaf_retry_lookup",
        "retries' latest attempts",
        &retry,
        Some(read(&sources.service.retry_lookups)),
    );
    let event = sources.event_lookup.snapshot();
    w.lookup("sheaf_event_lookup", "event payloads and ids", &event, None);
}

/// The write coalescer in front of the log store.
fn log_writes(w: &mut Writer, sources: &MetricSources) {
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
    w.seconds(
        "sheaf_log_write_wait_seconds_total",
        "Time log store writes spent waiting for more rows (SHEAF_LOG_WRITE_MAX_WAIT windows); divided by writes, the mean wait.",
        write.write_wait,
    );
}

/// The outbox's group commit of publishes.
fn publish_commits(w: &mut Writer, sources: &MetricSources) {
    let commit = sources.publish_commit.snapshot();
    w.counter(
        "sheaf_publish_commits_total",
        "Outbox statements that committed publishes (group commit).",
        commit.writes,
    );
    w.counter(
        "sheaf_publish_commit_events_total",
        "Events carried by those statements; divided by commits, the events per commit.",
        commit.records_written,
    );
    w.counter(
        "sheaf_publish_commit_failures_total",
        "Outbox statements of publishes that failed.",
        commit.failed_writes,
    );
}

/// The pending-work bound and what it refused.
fn pending_work(w: &mut Writer, sources: &MetricSources) {
    let usage = sources.admission.usage();
    w.gauge(
        "sheaf_pending_events",
        "Events accepted and not yet delivered that the pending-work bound counts: held in the memory log (memory backends) or waiting in the outbox for the log store (Postgres queue, log elsewhere); 0 where no bound applies.",
        usage.events,
    );
    w.gauge(
        "sheaf_pending_events_limit",
        "The bound on sheaf_pending_events (SHEAF_MEMORY_MAX_PENDING_EVENTS or SHEAF_OUTBOX_MAX_EVENTS); at it publishes are refused with 503. 0: no bound applies.",
        usage.max_events,
    );
    w.gauge(
        "sheaf_pending_payload_bytes",
        "Payload bytes of the events held for deliveries in the memory log.",
        usage.bytes,
    );
    w.gauge(
        "sheaf_pending_payload_bytes_limit",
        "The bound on sheaf_pending_payload_bytes (SHEAF_MEMORY_MAX_PENDING_BYTES); 0: no bound applies.",
        usage.max_bytes,
    );
    w.counter(
        "sheaf_publishes_refused_total",
        "Publishes (HTTP and CDC) refused with 503 because the pending work was at its bound; nothing accepted is dropped instead.",
        usage.refused,
    );
    w.counter(
        "sheaf_dead_letters_dropped_total",
        "Dead letters the memory queue dropped, oldest first, to keep its newest 10,000 (their events leave the log's protection with them).",
        sources
            .memory_queue
            .as_ref()
            .map_or(0, |queue| queue.dead_letters_dropped()),
    );
}

/// What waits in the outbox for the log store.
fn outbox(w: &mut Writer, backlog: OutboxBacklog) {
    w.gauge(
        "sheaf_outbox_events",
        "Events in the outbox, not yet in the log store.",
        backlog.events,
    );
    w.gauge(
        "sheaf_outbox_attempts",
        "Attempts in the outbox, not yet in the log store.",
        backlog.attempts,
    );
    let age = backlog.oldest.map_or(0.0, |oldest| {
        Timestamp::now()
            .as_datetime()
            .signed_duration_since(oldest.as_datetime())
            .num_milliseconds()
            .max(0) as f64
            / 1000.0
    });
    w.gauge(
        "sheaf_outbox_oldest_seconds",
        "Age of the oldest record waiting for the log store; 0 when none waits.",
        age,
    );
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
