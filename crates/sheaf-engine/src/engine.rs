//! The façade: [`start`] builds one engine over its stores and starts its background tasks;
//! [`Engine`] is the handle every front door (the HTTP API, an embedding program) works through;
//! [`Tasks`] stops them in order.
//!
//! Every change of a tenant or a destination goes through [`Engine`], which keeps the per-tenant
//! cache and the destination types' per-destination clients consistent with the store itself: a
//! caller cannot forget to invalidate.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use sheaf_destination::Registry;
use sheaf_store::{
    DeadLetter, Destination, DestinationId, DestinationPatch, JobId, LogStore, Page, PageRequest,
    QueueDepth, Secret, Tenant, TenantId, TenantUpsert, Timestamp,
};

use crate::backends::Stores;
use crate::config::EngineConfig;
use crate::delivery::Delivery;
use crate::health::{HealthTask, ensure_operator_destination};
#[cfg(feature = "cdc")]
use crate::ingest::cdc::CdcRunner;
use crate::ingest::replay::{ReplayKeeper, ReplayRequest, start_replay};
use crate::ingest::retry::{RetryRequest, manual_retry};
use crate::ingest::shipper::Shipper;
use crate::ingest::{PublishError, Published, ValidPublish};
use crate::state::Core;
use crate::state::admission::{InFlight, Refused};
use crate::state::entities::TenantEntry;
use crate::state::metrics::CdcMetrics;
use crate::state::replays::ReplayView;

/// Builds the engine over `stores` and starts it: the delivery workers (unless
/// `delivery_workers` is 0), the log shipper when an outbox feeds the log store, destination
/// health and operator events when configured, the replay keeper and, when configured, the CDC
/// source. Must run inside a Tokio runtime.
pub async fn start(config: EngineConfig, stores: Stores) -> anyhow::Result<(Engine, Tasks)> {
    #[cfg(not(feature = "cdc"))]
    if config.cdc.is_some() {
        anyhow::bail!(
            "SHEAF_CDC_ENABLED is true, but this build of sheaf-engine has no CDC source (cargo feature `cdc`)"
        );
    }
    if let Some(webhook) = &config.operator_webhook {
        crate::destinations::check_operator_url(webhook, config.allow_private_destinations).await?;
    }
    let destinations = crate::destinations::installed(&config)?;
    let core = Core::new(config, stores, destinations)?;
    if let Some(webhook) = &core.config.operator_webhook {
        ensure_operator_destination(&core, webhook).await?;
    }
    let health = HealthTask::start(&core);
    let delivery = if core.config.delivery_workers > 0 {
        Some(Delivery::start(Arc::clone(&core))?)
    } else {
        None
    };
    let shipper = Shipper::start(&core);
    let replays = ReplayKeeper::start(&core);
    #[cfg(feature = "cdc")]
    let cdc = core
        .config
        .cdc
        .clone()
        .map(|settings| CdcRunner::start(Arc::clone(&core), settings));
    let tasks = Tasks {
        core: Arc::clone(&core),
        delivery,
        #[cfg(feature = "cdc")]
        cdc,
        shipper,
        health,
        replays,
    };
    Ok((Engine { core }, tasks))
}

/// The handle to a running engine: cheap to clone, shared by every request.
#[derive(Debug, Clone)]
pub struct Engine {
    core: Arc<Core>,
}

impl Engine {
    /// What it runs with.
    pub fn config(&self) -> &EngineConfig {
        &self.core.config
    }

    /// The destination types it delivers to, by the name in a destination's `type`.
    pub fn destination_types(&self) -> &Registry {
        &self.core.destinations
    }

    /// Whether publishes keep their trace context for their deliveries' spans.
    pub fn traced(&self) -> bool {
        self.core.traces.is_some()
    }

    /// Runs a transformation on `event` in a runner process, exactly as a delivery would (same
    /// runners, same limits): the API's dry run.
    pub async fn try_transform(
        &self,
        source: &str,
        event: &sheaf_transform::Event<'_>,
    ) -> Result<sheaf_transform::Output, sheaf_transform::pool::Failure> {
        let limits = sheaf_transform::Limits {
            max_body_bytes: self.core.config.transforms.max_body_bytes,
            ..sheaf_transform::Limits::default()
        };
        self.core.transforms.run(source, event, &limits).await
    }

    /// Starts a transformation runner and has it run a trivial program: whether the configured
    /// runner works (the service checks it at start when one is configured explicitly).
    pub async fn probe_transform_runner(&self) -> Result<(), String> {
        self.core.transforms.probe().await
    }

    /// A place among the publishes handled at once, or why there is none (the pending-work
    /// bound is reached, or every place is taken). Take it before reading a publish's body, and
    /// hold it until the publish returned.
    pub fn admit(&self) -> Result<InFlight, Refused> {
        self.core.admission.enter()
    }

    /// Publishes one checked event (the body parser in [`crate::body`] checks it): logged,
    /// and a job per matching enabled destination enqueued, or the earlier outcome of the same
    /// id within the idempotency window.
    pub async fn publish(&self, request: ValidPublish) -> Result<Published, PublishError> {
        crate::ingest::publish(&self.core, request).await
    }

    /// Enqueues a manual retry of an event to one destination; returns its job id.
    pub async fn retry(
        &self,
        tenant: &TenantId,
        request: RetryRequest,
    ) -> Result<JobId, PublishError> {
        manual_retry(&self.core, tenant, request).await
    }

    /// Starts a bulk replay and waits a few seconds for it; returns its progress then.
    pub async fn replay(
        &self,
        tenant: &TenantId,
        request: ReplayRequest,
    ) -> Result<ReplayView, PublishError> {
        start_replay(&self.core, tenant, request).await
    }

    /// A replay's progress as stored, or `None`.
    pub async fn replay_progress(
        &self,
        tenant: &TenantId,
        id: uuid::Uuid,
    ) -> sheaf_store::Result<Option<ReplayView>> {
        let replay = self.core.stores.replays.get_replay(tenant, id).await?;
        Ok(replay.map(ReplayView::from))
    }

    /// The log store, for searching events and attempts. Writes go through [`Engine::publish`]
    /// and the delivery workers, never through it directly.
    pub fn log(&self) -> &Arc<dyn LogStore> {
        &self.core.stores.log
    }

    /// The tenant's dead letters, newest first.
    pub async fn dead_letters(
        &self,
        tenant: &TenantId,
        page: &PageRequest,
    ) -> sheaf_store::Result<Page<DeadLetter>> {
        self.core.stores.queue.list_dead_letters(tenant, page).await
    }

    /// Puts the tenant's dead letter `id` back in the queue, due now, as attempt 1 (a user
    /// retries it). One that blocks its ordering key goes back in its place, ahead of the key's
    /// later events; another goes after the key's queued events. `false`: no such dead letter.
    pub async fn requeue_dead_letter(
        &self,
        tenant: &TenantId,
        id: JobId,
    ) -> sheaf_store::Result<bool> {
        let queue = &self.core.stores.queue;
        Ok(queue.requeue_dead_letters(tenant, &[id]).await? > 0)
    }

    /// Discards the tenant's dead letter `id` without delivering it (a user skips it): one that
    /// blocked its ordering key lets the key's next event go. `false`: no such dead letter.
    pub async fn discard_dead_letter(
        &self,
        tenant: &TenantId,
        id: JobId,
    ) -> sheaf_store::Result<bool> {
        let queue = &self.core.stores.queue;
        Ok(queue.remove_dead_letters(tenant, &[id]).await? > 0)
    }

    /// The queue's depth by state.
    pub async fn queue_depth(&self) -> sheaf_store::Result<QueueDepth> {
        self.core.stores.queue.depth().await
    }

    /// The tenant and its destinations as the engine sees them (cached for a short while).
    pub async fn tenant(&self, tenant: &TenantId) -> sheaf_store::Result<Arc<TenantEntry>> {
        self.core.entities.get(tenant).await
    }

    /// The tenant as stored, read past the cache.
    pub async fn stored_tenant(&self, tenant: &TenantId) -> sheaf_store::Result<Option<Tenant>> {
        self.core.entities.store().get_tenant(tenant).await
    }

    /// Creates the tenant or replaces its metadata.
    pub async fn upsert_tenant(
        &self,
        tenant: &TenantId,
        metadata: &BTreeMap<String, String>,
    ) -> sheaf_store::Result<TenantUpsert> {
        let upsert = self
            .core
            .entities
            .store()
            .upsert_tenant(tenant, metadata)
            .await?;
        self.core.entities.invalidate(tenant).await;
        Ok(upsert)
    }

    /// Deletes the tenant with its destinations, and drops its pending deliveries (a worker
    /// holding one of them finds no destination). `NotFound` when there is no such tenant.
    pub async fn delete_tenant(&self, tenant: &TenantId) -> sheaf_store::Result<()> {
        self.core.entities.store().delete_tenant(tenant).await?;
        self.core.entities.invalidate(tenant).await;
        self.core.stores.queue.purge_tenant(tenant).await?;
        Ok(())
    }

    /// The tenant's destinations as stored, oldest first.
    pub async fn destinations(&self, tenant: &TenantId) -> sheaf_store::Result<Vec<Destination>> {
        self.core.entities.store().list_destinations(tenant).await
    }

    /// One destination as stored, or `None`.
    pub async fn destination(
        &self,
        tenant: &TenantId,
        id: &DestinationId,
    ) -> sheaf_store::Result<Option<Destination>> {
        self.core.entities.store().get_destination(tenant, id).await
    }

    /// Stores a new destination exactly as given (sealing its secrets).
    pub async fn create_destination(&self, destination: &Destination) -> sheaf_store::Result<()> {
        self.core
            .entities
            .store()
            .create_destination(destination)
            .await?;
        self.core.entities.invalidate(&destination.tenant_id).await;
        Ok(())
    }

    /// Applies `patch`; a new `config` also drops the type's client for the old one.
    pub async fn update_destination(
        &self,
        tenant: &TenantId,
        id: &DestinationId,
        patch: &DestinationPatch,
    ) -> sheaf_store::Result<Destination> {
        let updated = self
            .core
            .entities
            .store()
            .update_destination(tenant, id, patch)
            .await?;
        self.core.entities.invalidate(tenant).await;
        if patch.config.is_some() {
            self.core.destinations.forget(*id);
        }
        Ok(updated)
    }

    /// Deletes the destination and drops its type's client.
    pub async fn delete_destination(
        &self,
        tenant: &TenantId,
        id: &DestinationId,
    ) -> sheaf_store::Result<()> {
        self.core
            .entities
            .store()
            .delete_destination(tenant, id)
            .await?;
        self.core.entities.invalidate(tenant).await;
        self.core.destinations.forget(*id);
        Ok(())
    }

    /// Makes `new_secret` the signing secret; the old one keeps signing beside it for
    /// `secret_rotation_grace`.
    pub async fn rotate_secret(
        &self,
        tenant: &TenantId,
        id: &DestinationId,
        new_secret: &Secret,
    ) -> sheaf_store::Result<Destination> {
        let expires = Timestamp::now().saturating_add(self.core.config.secret_rotation_grace);
        let rotated = self
            .core
            .entities
            .store()
            .rotate_secret(tenant, id, new_secret, expires)
            .await?;
        self.core.entities.invalidate(tenant).await;
        Ok(rotated)
    }

    /// Whether every store answers, each within a bound of its own; see [`Readiness`].
    pub async fn readiness(&self) -> Readiness {
        crate::state::stores::readiness(&self.core.stores).await
    }

    /// The CDC source's state and counters.
    pub fn cdc(&self) -> &CdcMetrics {
        &self.core.metrics.cdc
    }

    /// The Prometheus page: every counter, with the queue's depth and the outbox's backlog read
    /// now (left out when their store does not answer).
    pub async fn metrics_page(&self) -> String {
        let stores = &self.core.stores;
        let depth = stores.queue.depth().await.ok();
        let backlog = match &stores.outbox {
            Some(outbox) if !outbox.is_log() => outbox.backlog().await.ok(),
            _ => None,
        };
        crate::state::metrics::render(&self.core.metric_sources, depth, backlog)
    }

    /// Forgets the events and ids this process remembers, so the next delivery or repeated
    /// publish reads the stores: for tests that check the store-backed path.
    #[doc(hidden)]
    pub fn forget_remembered_events(&self) {
        self.core.accepted.invalidate_all();
        self.core.fresh.invalidate_all();
    }
}

pub use crate::state::stores::Readiness;

/// The engine's background tasks, stopped in order by [`Tasks::shutdown`].
#[derive(Debug)]
pub struct Tasks {
    core: Arc<Core>,
    /// `None` with `delivery_workers` 0: this process only takes publishes.
    delivery: Option<Delivery>,
    #[cfg(feature = "cdc")]
    cdc: Option<CdcRunner>,
    /// `None` unless the queue is in Postgres and the log store elsewhere.
    shipper: Option<Shipper>,
    /// `None` without automatic disabling and operator events.
    health: Option<HealthTask>,
    /// Resumes replays other processes stopped running; stops this process's replays.
    replays: ReplayKeeper,
}

impl Tasks {
    /// Stops gracefully, `front_door` first: while it drains (the HTTP server finishing its
    /// requests, so every accepted publish is durable), the CDC source stops reading, finishes
    /// the publishes under way, acknowledges them and reports its position, and bulk replays
    /// stop at their next page boundary and are released for another process to resume. Then
    /// the workers stop claiming, finish in-flight deliveries up to `shutdown_timeout` and
    /// release unstarted claims; then destination health, the log shipper and the write
    /// coalescer flush.
    pub async fn shutdown(self, front_door: impl Future<Output = ()>) {
        let deadline = self.core.config.shutdown_timeout;
        // Both publish through the write coalescer, which closes last.
        #[cfg(feature = "cdc")]
        let cdc = self.cdc;
        let stop_cdc = async move {
            #[cfg(feature = "cdc")]
            if let Some(cdc) = cdc {
                cdc.shutdown(deadline).await;
            }
        };
        // Released at once, so another process resumes them within its keeper's round, and a
        // `POST …/replay` still waiting for its replay answers instead of holding the front door.
        tokio::join!(front_door, stop_cdc, self.replays.shutdown(deadline));
        if let Some(delivery) = self.delivery {
            delivery.shutdown(deadline).await;
        }
        // The workers' last reports may publish operator events: before the shipper stops.
        if let Some(health) = self.health {
            health.shutdown(deadline).await;
        }
        // Last: every publish and settlement is in the outbox by now.
        if let Some(shipper) = self.shipper {
            shipper.shutdown(deadline).await;
        }
        self.core.close().await;
    }
}
