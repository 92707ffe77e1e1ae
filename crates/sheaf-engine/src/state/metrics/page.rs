//! The Prometheus text page: every counter of [`Metrics`], the coalescers' snapshots, the queue
//! depth and the outbox backlog read at scrape time.
//!
//! Each family's name, type and help text come from [`super::families`]; this file says only
//! which value each family shows and with what labels.

use std::fmt::Write as _;

use sheaf_coalesce::{BATCH_SIZE_BUCKETS, MetricsSnapshot};
use sheaf_store::{OutboxBacklog, QueueDepth, Timestamp};

use super::families::*;
use super::*;

struct Writer(String);

impl Writer {
    fn header(&mut self, family: &Family) {
        let Family { name, kind, help } = family;
        let _ = writeln!(self.0, "# HELP {name} {help}");
        let _ = writeln!(self.0, "# TYPE {name} {}", kind.as_str());
    }

    /// One sample of `family`; `suffix` is empty, or a histogram's `_bucket`, `_sum`, `_count`.
    fn sample(
        &mut self,
        family: &Family,
        suffix: &str,
        labels: &str,
        value: impl std::fmt::Display,
    ) {
        let name = family.name;
        if labels.is_empty() {
            let _ = writeln!(self.0, "{name}{suffix} {value}");
        } else {
            let _ = writeln!(self.0, "{name}{suffix}{{{labels}}} {value}");
        }
    }

    fn counter(&mut self, family: &Family, value: u64) {
        debug_assert_eq!(family.kind, Kind::Counter, "{}", family.name);
        self.header(family);
        self.sample(family, "", "", value);
    }

    fn seconds(&mut self, family: &Family, value: std::time::Duration) {
        debug_assert_eq!(family.kind, Kind::Counter, "{}", family.name);
        self.header(family);
        self.sample(family, "", "", value.as_secs_f64());
    }

    fn gauge(&mut self, family: &Family, value: impl std::fmt::Display) {
        debug_assert_eq!(family.kind, Kind::Gauge, "{}", family.name);
        self.header(family);
        self.sample(family, "", "", value);
    }

    fn batch_histogram(&mut self, family: &Family, snap: &MetricsSnapshot) {
        debug_assert_eq!(family.kind, Kind::Histogram, "{}", family.name);
        self.header(family);
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
            self.sample(family, "_bucket", &format!("le=\"{le}\""), cumulative);
        }
        self.sample(family, "_sum", "", snap.keys_queried);
        self.sample(family, "_count", "", count);
    }

    /// A lookup coalescer's families; `keys` overrides the keys the snapshot counts.
    fn lookup(&mut self, families: &LookupFamilies, snap: &MetricsSnapshot, keys: Option<u64>) {
        let queries = snap.batch_queries + snap.single_queries + snap.direct_lookups;
        self.counter(&families.queries_total, queries);
        self.counter(&families.batch_queries_total, snap.batch_queries);
        self.counter(&families.failed_queries_total, snap.failed_queries);
        let keys = keys.unwrap_or(snap.keys_served + snap.direct_lookups);
        self.counter(&families.keys_total, keys);
        self.counter(&families.queries_saved_total, keys.saturating_sub(queries));
        self.seconds(&families.wait_seconds_total, snap.lookup_wait);
        self.batch_histogram(&families.batch_size, snap);
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
    w.header(&DELIVERIES_TOTAL);
    for outcome in DeliveryOutcome::ALL {
        w.sample(
            &DELIVERIES_TOTAL,
            "",
            &format!("outcome=\"{}\"", outcome.label()),
            m.deliveries(outcome),
        );
    }
    w.header(&DESTINATION_ATTEMPTS_TOTAL);
    for kind in m.destination_types() {
        for result in AttemptResult::ALL {
            w.sample(
                &DESTINATION_ATTEMPTS_TOTAL,
                "",
                &format!("type=\"{}\",result=\"{}\"", kind.name, result.label()),
                kind.count(result),
            );
        }
    }
    w.header(&DESTINATION_ATTEMPT_SECONDS_TOTAL);
    for kind in m.destination_types() {
        w.sample(
            &DESTINATION_ATTEMPT_SECONDS_TOTAL,
            "",
            &format!("type=\"{}\"", kind.name),
            kind.seconds(),
        );
    }

    w.header(&ATTEMPT_DURATION_SECONDS);
    let mut cumulative = 0;
    for (i, bound) in LATENCY_BUCKETS.iter().enumerate() {
        cumulative += read(&m.latency_buckets[i]);
        w.sample(
            &ATTEMPT_DURATION_SECONDS,
            "_bucket",
            &format!("le=\"{bound}\""),
            cumulative,
        );
    }
    let count = read(&m.latency_count);
    w.sample(&ATTEMPT_DURATION_SECONDS, "_bucket", "le=\"+Inf\"", count);
    w.sample(
        &ATTEMPT_DURATION_SECONDS,
        "_sum",
        "",
        read(&m.latency_micros) as f64 / 1e6,
    );
    w.sample(&ATTEMPT_DURATION_SECONDS, "_count", "", count);
}

/// The claimer's, the completer's and housekeeping's work on the queue.
fn queue_work(w: &mut Writer, m: &Metrics) {
    w.counter(&RETRIES_TOTAL, read(&m.retries));
    w.counter(&LEASE_RENEWALS_TOTAL, read(&m.lease_renewals));
    w.counter(&LEASES_LOST_TOTAL, read(&m.leases_lost));
    w.counter(&CLAIM_QUERIES_TOTAL, read(&m.claims));
    w.counter(&JOBS_CLAIMED_TOTAL, read(&m.jobs_claimed));
    w.counter(&JOBS_HANDED_OVER_TOTAL, read(&m.jobs_handed_over));
    w.counter(&QUEUE_MAINTENANCE_TOTAL, read(&m.queue_maintenance));
    w.gauge(&QUEUE_PROCESSES, read(&m.queue_processes));
    w.counter(&LOG_MAINTENANCE_TOTAL, read(&m.log_maintenance));
    w.counter(&JOBS_RELEASED_TOTAL, read(&m.jobs_released));
    w.counter(&COMPLETER_STATEMENTS_TOTAL, read(&m.completer_statements));
    w.counter(&COMPLETER_OUTCOMES_TOTAL, read(&m.completer_outcomes));
}

/// Publishes accepted and repeated, and the log shipper behind an outbox.
fn publishes(w: &mut Writer, m: &Metrics) {
    w.counter(&EVENTS_PUBLISHED_TOTAL, read(&m.events_published));
    w.counter(&PUBLISH_REPEATS_TOTAL, read(&m.publish_repeats));
    w.counter(&EVENTS_SHIPPED_TOTAL, read(&m.events_shipped));
    w.counter(&ATTEMPTS_SHIPPED_TOTAL, read(&m.attempts_shipped));
    w.counter(&SHIPMENT_FAILURES_TOTAL, read(&m.shipment_failures));
}

/// Destinations disabled and recovered, and the operator events about them.
fn destination_health(w: &mut Writer, m: &Metrics) {
    w.counter(&DESTINATIONS_DISABLED_TOTAL, read(&m.destinations_disabled));
    w.counter(
        &DESTINATIONS_RECOVERED_TOTAL,
        read(&m.destinations_recovered),
    );
    w.counter(
        &DESTINATION_HEALTH_STATEMENTS_TOTAL,
        read(&m.health_statements),
    );
    w.counter(&OPERATOR_EVENTS_TOTAL, read(&m.operator_events));
    w.counter(
        &OPERATOR_EVENT_FAILURES_TOTAL,
        read(&m.operator_event_failures),
    );
}

/// Jobs enqueued, and where first deliveries found their payload.
fn jobs_and_payloads(w: &mut Writer, m: &Metrics) {
    w.counter(&JOBS_ENQUEUED_TOTAL, read(&m.jobs_enqueued));
    w.counter(&FRESH_EVENT_CACHE_HITS_TOTAL, read(&m.fresh_cache_hits));
    w.counter(&FRESH_EVENT_CACHE_MISSES_TOTAL, read(&m.fresh_cache_misses));
}

/// The CDC source's counters, while it is enabled.
fn cdc(w: &mut Writer, m: &Metrics) {
    let cdc = &m.cdc;
    if cdc.state() == CdcState::Disabled {
        return;
    }
    w.counter(&CDC_CHANGES_TOTAL, read(&cdc.changes));
    w.counter(&CDC_CHANGES_DROPPED_TOTAL, read(&cdc.dropped));
    w.counter(&CDC_EVENTS_PUBLISHED_TOTAL, read(&cdc.events_published));
    w.counter(&CDC_EVENT_REPEATS_TOTAL, read(&cdc.event_repeats));
    w.counter(&CDC_ACKS_TOTAL, read(&cdc.acks));
    w.counter(&CDC_PUBLISH_FAILURES_TOTAL, read(&cdc.publish_failures));
    w.counter(&CDC_RESTARTS_TOTAL, read(&cdc.restarts));
    w.gauge(&CDC_STREAMING, u8::from(cdc.state() == CdcState::Streaming));
    w.gauge(&CDC_ROWS_IN_FLIGHT, read(&cdc.rows_in_flight));
    w.gauge(
        &CDC_LAST_ACK_COMMIT_TIMESTAMP_SECONDS,
        cdc.last_ack_commit_micros.load(Ordering::Relaxed) as f64 / 1e6,
    );
}

/// The queue's jobs by state, read at scrape time.
fn queue_depth(w: &mut Writer, depth: QueueDepth) {
    w.header(&QUEUE_JOBS);
    for (state, value) in [
        ("due", depth.due),
        ("scheduled", depth.scheduled),
        ("claimed", depth.claimed),
        ("dead_lettered", depth.dead_lettered),
    ] {
        w.sample(&QUEUE_JOBS, "", &format!("state=\"{state}\""), value);
    }
}

/// The coalesced lookups: retries' latest attempts and event payloads.
fn lookups(w: &mut Writer, sources: &MetricSources) {
    let retry = sources.retry_lookup.snapshot();
    w.lookup(
        &RETRY_LOOKUP,
        &retry,
        Some(read(&sources.service.retry_lookups)),
    );
    let event = sources.event_lookup.snapshot();
    w.lookup(&EVENT_LOOKUP, &event, None);
}

/// The write coalescer in front of the log store.
fn log_writes(w: &mut Writer, sources: &MetricSources) {
    let write = sources.log_write.snapshot();
    w.counter(&LOG_WRITES_TOTAL, write.writes);
    w.counter(&LOG_WRITE_FAILURES_TOTAL, write.failed_writes);
    w.counter(&LOG_WRITE_ROWS_TOTAL, write.records_written);
    w.counter(&LOG_WRITE_BATCHES_TOTAL, write.batches_written);
    w.counter(&LOG_WRITE_BYTES_TOTAL, write.bytes_written);
    w.seconds(&LOG_WRITE_WAIT_SECONDS_TOTAL, write.write_wait);
}

/// The outbox's group commit of publishes.
fn publish_commits(w: &mut Writer, sources: &MetricSources) {
    let commit = sources.publish_commit.snapshot();
    w.counter(&PUBLISH_COMMITS_TOTAL, commit.writes);
    w.counter(&PUBLISH_COMMIT_EVENTS_TOTAL, commit.records_written);
    w.counter(&PUBLISH_COMMIT_FAILURES_TOTAL, commit.failed_writes);
}

/// The pending-work bound and what it refused.
fn pending_work(w: &mut Writer, sources: &MetricSources) {
    let usage = sources.admission.usage();
    w.gauge(&PENDING_EVENTS, usage.events);
    w.gauge(&PENDING_EVENTS_LIMIT, usage.max_events);
    w.gauge(&PENDING_PAYLOAD_BYTES, usage.bytes);
    w.gauge(&PENDING_PAYLOAD_BYTES_LIMIT, usage.max_bytes);
    w.counter(&PUBLISHES_REFUSED_TOTAL, usage.refused);
    w.counter(
        &DEAD_LETTERS_DROPPED_TOTAL,
        sources
            .memory_queue
            .as_ref()
            .map_or(0, |queue| queue.dead_letters_dropped()),
    );
}

/// What waits in the outbox for the log store.
fn outbox(w: &mut Writer, backlog: OutboxBacklog) {
    w.gauge(&OUTBOX_EVENTS, backlog.events);
    w.gauge(&OUTBOX_ATTEMPTS, backlog.attempts);
    let age = backlog.oldest.map_or(0.0, |oldest| {
        Timestamp::now()
            .as_datetime()
            .signed_duration_since(oldest.as_datetime())
            .num_milliseconds()
            .max(0) as f64
            / 1000.0
    });
    w.gauge(&OUTBOX_OLDEST_SECONDS, age);
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
