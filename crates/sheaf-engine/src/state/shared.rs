//! [`Core`]: everything the HTTP handlers and the delivery engine share, built once at start.

use std::sync::Arc;
use std::time::Duration;

use sheaf_coalesce::{CoalesceMetrics, LookupCoalescer, WriteCoalescer};
use sheaf_destination::Registry;
use sheaf_store::{Event, EventKey};
use tokio::sync::Notify;

use crate::backends::Stores;
use crate::config::{EngineConfig, TransformConfig, TransformRunner};
use crate::state::admission::Admission;
use crate::state::entities::EntityCache;
use crate::state::handoff::JobChannel;
use crate::state::intake::{IntakeCommit, IntakeWriter, intake_config};
use crate::state::log_access::{
    EventCoalescer, EventLookup, LogCoalescer, LogWriter, RetryCoalescer, RetryLookup, retry_split,
};
use crate::state::metrics::{MetricSources, Metrics};
use crate::state::pacer::Pacer;
use crate::state::recent::Recent;
use crate::state::replays::Replays;
use crate::state::secrets::SealedEntityStore;
use crate::state::trace::EventTraces;
use crate::state::turns::TurnReports;

/// How long a freshly published event stays in the payload cache. Its first delivery
/// normally starts within milliseconds; a backlog longer than this reads the log store.
const FRESH_EVENT_TTL: Duration = Duration::from_secs(10 * 60);

/// How long an accepted event id is remembered in memory; older repeats are recognised
/// through the log store instead.
const ACCEPTED_ID_TTL: Duration = Duration::from_secs(60 * 60);

/// The shared state of one `sheaf` process.
#[derive(Debug)]
pub struct Core {
    /// The configuration it runs with.
    pub config: Arc<EngineConfig>,
    /// The stores.
    pub stores: Stores,
    /// Tenants and destinations, cached.
    pub entities: EntityCache,
    /// Every log write goes through it (with an outbox, only the log shipper's).
    pub log_writer: LogCoalescer,
    /// With an outbox: the group commit every publish goes through.
    pub intake: Option<IntakeCommit>,
    /// Event reads by key (`get_events`), coalesced.
    pub events: EventCoalescer,
    /// Retries' latest-attempt lookups (`latest_attempts`), coalesced and split at 15 minutes.
    pub retries: RetryCoalescer,
    /// Freshly published events, so a first delivery needs no read of the log store.
    pub fresh: Arc<Recent<EventKey, Event>>,
    /// Event ids accepted recently by this process: a repeat is answered without a read.
    pub accepted: Recent<EventKey, ()>,
    /// The service's counters.
    pub metrics: Arc<Metrics>,
    /// The pending-work bound every publish passes first.
    pub admission: Arc<Admission>,
    /// What `/metrics` reads.
    pub metric_sources: MetricSources,
    /// Wakes the dispatcher when a publish has enqueued jobs.
    pub wake: Arc<Notify>,
    /// The workers' channel of claimed jobs, which the dispatcher and the group commit fill.
    pub jobs: Arc<JobChannel>,
    /// Publishes' trace contexts for their deliveries' spans; only while traces are exported.
    pub traces: Option<EventTraces>,
    /// Where the completer reports finished turns; `None` when nothing needs them (no automatic
    /// disabling, no operator webhook).
    pub turn_reports: Option<TurnReports>,
    /// The bulk replays this process ran, by id.
    pub replays: Replays,
    /// When deliveries to each destination may start (rate limits, `Retry-After` pauses).
    pub pacer: Pacer,
    /// This process's id in the queue's heartbeats.
    pub process_id: uuid::Uuid,
    /// The destination types this process delivers to, by the name in a destination's `type`.
    pub destinations: Registry,
    /// The runner processes destinations' transformations run in.
    pub transforms: sheaf_transform::pool::Pool,
}

impl Core {
    /// Builds the coalescers and caches over `stores`, delivering through `destinations`. Must
    /// run inside a Tokio runtime.
    pub fn new(
        config: EngineConfig,
        mut stores: Stores,
        destinations: Registry,
    ) -> anyhow::Result<Arc<Self>> {
        // Every backend stores destination secrets sealed (SHEAF_SECRETS_KEY): the wrapper sits
        // at the one boundary every secret crosses on its way to storage.
        stores.entities = Arc::new(SealedEntityStore::new(
            Arc::clone(&stores.entities),
            config.secrets_key.clone(),
        ));
        let retry_metrics = Arc::new(CoalesceMetrics::new());
        let event_metrics = Arc::new(CoalesceMetrics::new());
        let write_metrics = Arc::new(CoalesceMetrics::new());
        // Payloads are read from the outbox first while they wait there; when the log tables
        // are the outbox, the log store read is that read.
        let waiting = stores.outbox.clone().filter(|o| !o.is_log());
        let log_writer = WriteCoalescer::with_observer(
            LogWriter(Arc::clone(&stores.log)),
            config.log_write,
            write_metrics.clone(),
        )?;
        let events = LookupCoalescer::builder(
            EventLookup {
                outbox: waiting,
                log: Arc::clone(&stores.log),
            },
            config.event_lookup,
        )
        .observer(event_metrics.clone())
        .build()?;
        let retries =
            LookupCoalescer::builder(RetryLookup(Arc::clone(&stores.log)), config.retry_lookup)
                .split(retry_split())
                .observer(retry_metrics.clone())
                .build()?;
        // Oldest first: each entry is read about once, soon after it was written, in the order
        // it was written (see `state::recent`).
        let fresh = Arc::new(Recent::new(config.fresh_event_cache, FRESH_EVENT_TTL));
        // Ids are small: ten times as many as fresh events, at least 10,000.
        let accepted = Recent::new(
            config.fresh_event_cache.saturating_mul(10).max(10_000),
            ACCEPTED_ID_TTL,
        );
        let metrics = Arc::new(Metrics::default());
        metrics.set_destination_types(&destinations.names());
        let wake = Arc::new(Notify::new());
        let jobs = Arc::new(JobChannel::new(config.delivery_workers));
        let intake_metrics = Arc::new(CoalesceMetrics::new());
        let intake = match &stores.outbox {
            Some(outbox) => Some(WriteCoalescer::with_observer(
                IntakeWriter {
                    outbox: Arc::clone(outbox),
                    fresh: Arc::clone(&fresh),
                    jobs: Arc::clone(&jobs),
                    lease: config.queue_lease,
                    wake: Arc::clone(&wake),
                    metrics: Arc::clone(&metrics),
                },
                intake_config(),
                intake_metrics.clone(),
            )?),
            None => None,
        };

        let entities = EntityCache::new(Arc::clone(&stores.entities), config.entity_cache_ttl);
        let traces = config
            .traces
            .then(|| EventTraces::new(config.fresh_event_cache));
        let turn_reports = (config.disable_after_failures > 0 || config.operator_webhook.is_some())
            .then(TurnReports::new);
        let admission = Arc::new(
            match (&stores.memory_log, &stores.outbox) {
                (Some(log), _) => Admission::memory(
                    Arc::clone(log),
                    config.memory_max_pending_events,
                    config.memory_max_pending_bytes,
                ),
                (None, Some(outbox)) if !outbox.is_log() => {
                    Admission::outbox(config.outbox_max_events)
                }
                _ => Admission::unbounded(),
            }
            .publishes_in_flight(config.max_publishes_in_flight),
        );
        let transforms = transform_pool(&config.transforms)?;
        Ok(Arc::new(Self {
            metric_sources: MetricSources {
                service: Arc::clone(&metrics),
                retry_lookup: retry_metrics,
                event_lookup: event_metrics,
                log_write: write_metrics,
                publish_commit: intake_metrics,
                admission: Arc::clone(&admission),
                memory_queue: stores.memory_queue.clone(),
            },
            config: Arc::new(config),
            stores,
            entities,
            log_writer,
            intake,
            events,
            retries,
            fresh,
            accepted,
            metrics,
            admission,
            wake,
            jobs,
            traces,
            turn_reports,
            replays: Replays::new(),
            pacer: Pacer::new(),
            process_id: uuid::Uuid::now_v7(),
            destinations,
            transforms,
        }))
    }

    /// Flushes and stops the coalescers (after the engine and the HTTP server stopped).
    pub async fn close(&self) {
        if let Some(intake) = &self.intake {
            intake.close().await;
        }
        self.log_writer.close().await;
        self.events.close().await;
        self.retries.close().await;
    }
}

/// The pool of transformation runners `config` asks for (none is started before a run needs
/// one).
fn transform_pool(config: &TransformConfig) -> anyhow::Result<sheaf_transform::pool::Pool> {
    use sheaf_transform::pool::{Pool, RunnerCommand};
    let command = match &config.runner {
        TransformRunner::Command(command) => command.clone(),
        TransformRunner::ThisExecutable => RunnerCommand {
            program: std::env::current_exe().map_err(|e| {
                anyhow::anyhow!(
                    "cannot find this process's executable, which runs transformations: {e}"
                )
            })?,
            args: vec!["transform-runner".into()],
        },
    };
    Ok(Pool::new(command, config.runners))
}
