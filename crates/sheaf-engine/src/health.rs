//! Destination health and operator events: the task that reads the completer's reports of
//! finished turns (`state::turns`), counts consecutive failures per destination, disables the
//! destinations that reach `SHEAF_DESTINATION_DISABLE_AFTER_FAILURES`, and publishes operator
//! events to `SHEAF_OPERATOR_WEBHOOK_URL`.
//!
//! # Cost
//!
//! One entity-store call per batch of reports (`EntityStore::record_delivery_health`, one
//! statement on Postgres), never one per attempt: the task takes every batch waiting in the
//! channel before it calls, so a busy process sends fewer, larger calls. Successes are reported
//! too, since they reset the count.
//!
//! # Operator events
//!
//! `destination.disabled`, `destination.recovered` and `delivery.dead_lettered` are ordinary
//! events of the tenant [`OPERATOR_TENANT`], published through the same path as any event (log,
//! queue, retries, Standard Webhooks signature) to its one destination, which start-up points at
//! the configured URL with the configured secret ([`ensure_operator_destination`]). Deliveries
//! of that tenant are neither counted nor reported, so an operator endpoint that fails cannot
//! feed events about itself. The topic is the event's type; the payload names the tenant, the
//! destination and, for a dead letter, the event.
//!
//! This lives at the crate's root because it joins the two halves the folders keep apart: it
//! reads what `delivery` reports and publishes through `ingest`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use sheaf_store::{
    DeliveryHealth, Destination, DestinationId, DestinationKind, DestinationPatch, ErrorKind,
    EventId, HealthChange, Payload, TenantId, Timestamp, Topics,
};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::OperatorWebhook;
use crate::ingest::publish::{NewEvent, publish_events};
use crate::state::Core;
use crate::state::backoff::Backoff;
use crate::state::metrics::Metrics;
use crate::state::turns::{OPERATOR_TENANT, TurnReport};

/// The operator tenant's one destination: a fixed id, so processes starting together agree on
/// it (the second one's create finds it taken and updates it instead).
const OPERATOR_DESTINATION: u128 = 0x0190_0000_0000_7000_8000_0000_0000_5eaf;

/// Operator events go out as signed webhooks (`SHEAF_OPERATOR_WEBHOOK_URL`): the one place
/// besides `destinations.rs` that names a type, because the setting is a webhook's.
const OPERATOR_DESTINATION_TYPE: &str = "webhook";

/// Most reports one entity-store call takes; more waiting go in the next call.
const MAX_REPORTS_PER_CALL: usize = 10_000;

/// Tries of a failed entity-store call or operator publish before the task gives up on it.
const TRIES: u32 = 5;

/// The wait between those tries, doubling.
const BACKOFF: Backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(5));

/// The running health task.
#[derive(Debug)]
pub(crate) struct HealthTask {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl HealthTask {
    /// Starts the task when the core has a report channel.
    pub(crate) fn start(core: &Arc<Core>) -> Option<HealthTask> {
        let reports = core.turn_reports.as_ref()?.take_receiver()?;
        let stop = CancellationToken::new();
        let task = tokio::spawn(run(Arc::clone(core), reports, stop.clone()));
        Some(HealthTask { stop, task })
    }

    /// Handles what is still in the channel (the engine has stopped, so nothing more comes),
    /// waiting at most `deadline`.
    pub(crate) async fn shutdown(self, deadline: Duration) {
        self.stop.cancel();
        if tokio::time::timeout(deadline, self.task).await.is_err() {
            tracing::warn!("destination health reports were not all handled within {deadline:?}");
        }
    }
}

async fn run(
    core: Arc<Core>,
    mut reports: mpsc::Receiver<Vec<TurnReport>>,
    stop: CancellationToken,
) {
    loop {
        let first = tokio::select! {
            batch = reports.recv() => batch,
            () = stop.cancelled() => reports.try_recv().ok(),
        };
        let Some(mut batch) = first else { return };
        while batch.len() < MAX_REPORTS_PER_CALL {
            match reports.try_recv() {
                Ok(more) => batch.extend(more),
                Err(_) => break,
            }
        }
        handle(&core, batch).await;
    }
}

async fn handle(core: &Arc<Core>, reports: Vec<TurnReport>) {
    let operator = TenantId::new(OPERATOR_TENANT).expect("a valid tenant id");
    let reports: Vec<TurnReport> = reports
        .into_iter()
        .filter(|r| r.tenant_id != operator)
        .collect();
    let mut events = Vec::new();
    let limit = core.config.disable_after_failures;
    if limit > 0 {
        for change in record(core, &reports, limit).await {
            let (kind, destination) = match &change {
                HealthChange::Disabled(d) => {
                    Metrics::inc(&core.metrics.destinations_disabled);
                    tracing::warn!(tenant = %d.tenant_id, destination = %d.id,
                        reason = d.disabled_reason.as_ref().map(|r| r.reason.as_str()),
                        "destination disabled after consecutive failed attempts");
                    ("destination.disabled", d)
                }
                HealthChange::Recovered(d) => {
                    Metrics::inc(&core.metrics.destinations_recovered);
                    tracing::info!(tenant = %d.tenant_id, destination = %d.id,
                        "destination recovered: a success after it had been disabled");
                    ("destination.recovered", d)
                }
            };
            core.entities.invalidate(&destination.tenant_id).await;
            events.push(destination_event(kind, destination));
        }
    }
    if core.config.operator_webhook.is_none() {
        return;
    }
    for report in &reports {
        if let Some(reason) = &report.dead_lettered {
            events.push(operator_event(
                "delivery.dead_lettered",
                json!({
                    "type": "delivery.dead_lettered",
                    "tenant_id": report.tenant_id,
                    "event_id": report.event_id,
                    "destination_id": report.destination_id,
                    "attempts": report.attempt_number,
                    "reason": reason,
                }),
            ));
        }
    }
    publish(core, &operator, events).await;
}

/// The reports as one `record_delivery_health` call: per destination, in the order the turns
/// finished, whether one succeeded and how many failed after the last success.
fn summarize(reports: &[TurnReport]) -> Vec<DeliveryHealth> {
    let mut order: Vec<DestinationId> = Vec::new();
    let mut by_destination: HashMap<DestinationId, DeliveryHealth> = HashMap::new();
    for report in reports {
        let Some(result) = &report.attempt else {
            continue;
        };
        let health = by_destination
            .entry(report.destination_id)
            .or_insert_with(|| {
                order.push(report.destination_id);
                DeliveryHealth {
                    tenant_id: report.tenant_id.clone(),
                    destination_id: report.destination_id,
                    succeeded: false,
                    failures_after: 0,
                    last_error: String::new(),
                }
            });
        match result {
            Ok(()) => {
                health.succeeded = true;
                health.failures_after = 0;
            }
            Err(error) => {
                health.failures_after = health.failures_after.saturating_add(1);
                health.last_error.clone_from(error);
            }
        }
    }
    order
        .into_iter()
        .filter_map(|id| by_destination.remove(&id))
        .collect()
}

async fn record(core: &Core, reports: &[TurnReport], limit: u32) -> Vec<HealthChange> {
    let summary = summarize(reports);
    if summary.is_empty() {
        return Vec::new();
    }
    let mut backoff = BACKOFF;
    for try_number in 1..=TRIES {
        match core
            .entities
            .store()
            .record_delivery_health(&summary, limit)
            .await
        {
            Ok(changes) => {
                Metrics::inc(&core.metrics.health_statements);
                return changes;
            }
            Err(err) if try_number < TRIES && err.kind() == ErrorKind::Unavailable => {
                tracing::warn!(error = %err, "recording destination health failed; trying again");
                tokio::time::sleep(backoff.next_delay()).await;
            }
            Err(err) => {
                tracing::error!(error = %err, destinations = summary.len(),
                    "could not record destination health; these outcomes are not counted");
                return Vec::new();
            }
        }
    }
    Vec::new()
}

fn destination_event(kind: &str, d: &Destination) -> NewEvent {
    let reason = d.disabled_reason.as_ref();
    operator_event(
        kind,
        json!({
            "type": kind,
            "tenant_id": d.tenant_id,
            "destination_id": d.id,
            "destination_type": d.kind,
            "enabled": d.enabled,
            "consecutive_failures": d.consecutive_failures,
            "reason": reason.map(|r| r.reason.as_str()),
            "since": reason.map(|r| r.since),
            "at": Timestamp::now(),
        }),
    )
}

fn operator_event(topic: &str, data: serde_json::Value) -> NewEvent {
    NewEvent {
        id: EventId::generate(),
        chosen: false,
        topic: topic.to_owned(),
        data: Payload::new(data),
    }
}

async fn publish(core: &Arc<Core>, operator: &TenantId, events: Vec<NewEvent>) {
    if events.is_empty() {
        return;
    }
    let count = events.len();
    let mut backoff = BACKOFF;
    for try_number in 1..=TRIES {
        match publish_events(core, operator, events.clone()).await {
            Ok(_) => {
                Metrics::add(&core.metrics.operator_events, count);
                return;
            }
            Err(err) if try_number < TRIES => {
                tracing::warn!(error = %err, events = count,
                    "publishing operator events failed; trying again");
                tokio::time::sleep(backoff.next_delay()).await;
            }
            Err(err) => {
                Metrics::add(&core.metrics.operator_event_failures, count);
                tracing::error!(error = %err, events = count, "operator events were not published");
            }
        }
    }
}

/// Makes the operator tenant and its one destination match the configuration: created when
/// missing, else pointed at the configured URL, enabled, and signing with the configured secret
/// only (a replaced secret stops signing at once).
pub(crate) async fn ensure_operator_destination(
    core: &Core,
    webhook: &OperatorWebhook,
) -> anyhow::Result<()> {
    let store = core.entities.store();
    let tenant = TenantId::new(OPERATOR_TENANT).expect("a valid tenant id");
    let id = DestinationId::from_uuid(uuid::Uuid::from_u128(OPERATOR_DESTINATION));
    store
        .upsert_tenant(&tenant, &Default::default())
        .await
        .map_err(|e| anyhow::anyhow!("creating the operator tenant {OPERATOR_TENANT}: {e}"))?;
    let now = Timestamp::now();
    let destination = Destination {
        id,
        tenant_id: tenant.clone(),
        kind: DestinationKind::new(OPERATOR_DESTINATION_TYPE).expect("a type name"),
        config: json!({ "url": webhook.url.as_str() }),
        topics: Topics::All,
        filter: None,
        rate_limit: None,
        headers: Default::default(),
        transform: None,
        ordering_key: None,
        dead_letter_blocks_key: false,
        enabled: true,
        disabled_reason: None,
        consecutive_failures: 0,
        secret: webhook.secret.clone(),
        previous_secret: None,
        created_at: now,
        updated_at: now,
    };
    let fail = |e: sheaf_store::Error| {
        anyhow::anyhow!("setting up the destination of SHEAF_OPERATOR_WEBHOOK_URL: {e}")
    };
    match store.create_destination(&destination).await {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::Conflict => {
            let patch = DestinationPatch {
                config: Some(destination.config.clone()),
                enabled: Some(true),
                ..Default::default()
            };
            let current = store
                .update_destination(&tenant, &id, &patch)
                .await
                .map_err(fail)?;
            if current.secret != webhook.secret {
                store
                    .rotate_secret(&tenant, &id, &webhook.secret, now)
                    .await
                    .map_err(fail)?;
            }
        }
        Err(e) => return Err(fail(e)),
    }
    core.entities.invalidate(&tenant).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(destination: DestinationId, attempt: Option<Result<(), &str>>) -> TurnReport {
        TurnReport {
            tenant_id: TenantId::new("t").unwrap(),
            destination_id: destination,
            event_id: EventId::generate(),
            attempt: attempt.map(|r| r.map_err(str::to_owned)),
            attempt_number: 1,
            dead_lettered: None,
        }
    }

    #[test]
    fn a_summary_counts_the_failures_after_the_last_success_per_destination() {
        let (a, b, c) = (
            DestinationId::generate(),
            DestinationId::generate(),
            DestinationId::generate(),
        );
        let summary = summarize(&[
            report(a, Some(Err("status 500"))),
            report(b, Some(Ok(()))),
            report(a, Some(Ok(()))),
            report(c, None),
            report(a, Some(Err("status 502"))),
            report(a, Some(Err("status 503"))),
            report(b, Some(Err("timed out"))),
        ]);
        let by: HashMap<DestinationId, &DeliveryHealth> =
            summary.iter().map(|h| (h.destination_id, h)).collect();
        assert_eq!(summary.len(), 2, "c made no attempt: {summary:?}");
        assert_eq!(summary[0].destination_id, a, "in the order turns finished");
        assert!(by[&a].succeeded);
        assert_eq!(by[&a].failures_after, 2);
        assert_eq!(by[&a].last_error, "status 503");
        assert!(by[&b].succeeded);
        assert_eq!(by[&b].failures_after, 1);
        assert_eq!(by[&b].last_error, "timed out");
        let failing = summarize(&[report(c, Some(Err("x"))), report(c, Some(Err("y")))]);
        assert!(!failing[0].succeeded);
        assert_eq!(failing[0].failures_after, 2);
    }
}
