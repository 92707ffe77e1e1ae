//! The log shipper: moves events and attempts from the Postgres outbox into the log store, behind
//! the publishes and deliveries that put them there.
//!
//! One shipper runs per process (several processes share the backlog: a shipment hides its rows
//! from the others). Each round takes up to `SHEAF_LOG_WRITE_MAX_RECORDS` records, hands them to
//! the log write coalescer as one batch, and commits the shipment, removing them from the outbox,
//! only once the log store acknowledged the write. A full round starts the next one at once; an
//! under-filled one waits out `SHEAF_LOG_SHIP_INTERVAL` from its start, so at a steady rate each
//! process writes one batch per interval (ClickHouse parts are bounded per interval, not per
//! publish) and an event is searchable within about one interval of its publish. The outbox
//! keeps an attempt without a copy of its payload; the shipper puts it back (from the events
//! shipped with it, the fresh-event cache, or a coalesced read) because the log store keeps it
//! in the attempt row, where a retry's lookup finds it.
//!
//! When the log store is down, the write fails, the shipment is dropped (its rows come back) and
//! the shipper tries again with a doubling pause up to 30 s. Publishes and deliveries go on
//! meanwhile; the outbox grows on disk (`sheaf_outbox_events`, `sheaf_outbox_attempts`,
//! `sheaf_outbox_oldest_seconds`) and drains by itself when the store is back. A write that
//! succeeded but whose commit failed is shipped again: the log store folds the copies.
//!
//! Once a minute the shipper also forgets event keys older than `SHEAF_IDEMPOTENCY_WINDOW`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use sheaf_store::{Attempt, Event, EventKey, Outbox, Timestamp};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::state::Core;
use crate::state::backoff::Backoff;
use crate::state::log_access::LogRecord;
use crate::state::metrics::Metrics;

/// The pause after a failed round, doubling while the log store stays away.
const SHIP_BACKOFF: Backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(30));

/// How often expired event keys are pruned.
const PRUNE_EVERY: Duration = Duration::from_secs(60);

/// Most keys one prune statement deletes; a prune round runs statements until fewer come back.
const PRUNE_BATCH: usize = 10_000;

/// The running shipper.
#[derive(Debug)]
pub struct Shipper {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Shipper {
    /// Starts the shipper when the process has an outbox that is not the log itself.
    pub fn start(core: &Arc<Core>) -> Option<Self> {
        let outbox = core.stores.outbox.clone().filter(|o| !o.is_log())?;
        let stop = CancellationToken::new();
        let task = tokio::spawn(run(Arc::clone(core), outbox, stop.clone()));
        Some(Self { stop, task })
    }

    /// Stops after shipping what waits, for at most `deadline`; what is left stays in the outbox
    /// for the next start (or another process).
    pub async fn shutdown(self, deadline: Duration) {
        self.stop.cancel();
        let mut task = self.task;
        if tokio::time::timeout(deadline, &mut task).await.is_err() {
            tracing::warn!("the log shipper did not drain the outbox within {deadline:?}");
            task.abort();
        }
    }
}

async fn run(core: Arc<Core>, outbox: Arc<dyn Outbox>, stop: CancellationToken) {
    let interval = core.config.log_ship_interval;
    let max = core.config.log_write.max_records;
    let mut backoff = SHIP_BACKOFF;
    let mut next_prune = Instant::now() + PRUNE_EVERY;
    loop {
        let started = Instant::now();
        match ship_once(&core, outbox.as_ref(), max).await {
            Ok(full) => {
                backoff.reset();
                if full {
                    continue;
                }
                if stop.is_cancelled() {
                    // The outbox is drained as far as this process can see.
                    return;
                }
            }
            Err(err) => {
                Metrics::inc(&core.metrics.shipment_failures);
                if stop.is_cancelled() {
                    tracing::warn!(error = %err, "the log shipper stops with records in the outbox");
                    return;
                }
                let pause = backoff.next_delay();
                tracing::warn!(error = %err, ?pause,
                    "shipping the outbox to the log store failed; the records stay and are tried again");
                tokio::select! {
                    () = stop.cancelled() => {}
                    () = tokio::time::sleep(pause) => {}
                }
                continue;
            }
        }
        if started >= next_prune {
            prune(&core, outbox.as_ref()).await;
            next_prune = Instant::now() + PRUNE_EVERY;
        }
        tokio::select! {
            // One last round, without waiting, then stop.
            () = stop.cancelled() => {}
            () = tokio::time::sleep_until(started + interval) => {}
        }
    }
}

/// One round: returns whether the shipment was full (more may wait).
async fn ship_once(core: &Core, outbox: &dyn Outbox, max: usize) -> anyhow::Result<bool> {
    let Some(mut shipment) = outbox.take(max).await? else {
        return Ok(false);
    };
    let (events, mut attempts) = shipment.take_records();
    let (event_count, attempt_count) = (events.len(), attempts.len());
    // Dropping the shipment on failure (the `?`s below) gives the records back.
    restore_payloads(core, &events, &mut attempts).await?;
    let records: Vec<LogRecord> = events
        .into_iter()
        .map(LogRecord::Event)
        .chain(attempts.into_iter().map(LogRecord::Attempt))
        .collect();
    core.log_writer.hand_off(records).await?;
    shipment.commit().await?;
    Metrics::add(&core.metrics.events_shipped, event_count);
    Metrics::add(&core.metrics.attempts_shipped, attempt_count);
    Ok(event_count + attempt_count >= max)
}

/// Puts back the payload (and trace context) of attempts the outbox kept without one: from the
/// events shipped with them, else from this process's fresh-event cache, else through the
/// coalesced event read (the outbox, then the log store). An event found nowhere (gone from the
/// log store by retention) leaves its attempts without payload, as a log store without the
/// event would.
async fn restore_payloads(
    core: &Core,
    events: &[Event],
    attempts: &mut [Attempt],
) -> anyhow::Result<()> {
    let shipped: HashMap<EventKey, &Event> = events.iter().map(|e| (e.key(), e)).collect();
    let mut missing: HashMap<EventKey, Option<Event>> = HashMap::new();
    for attempt in attempts.iter().filter(|a| a.event_data.value().is_null()) {
        let key = EventKey {
            tenant_id: attempt.tenant_id.clone(),
            event_id: attempt.event_id.clone(),
        };
        if !shipped.contains_key(&key) {
            missing.insert(key, None);
        }
    }
    for (key, found) in missing.iter_mut() {
        if let Some(event) = core.fresh.get(key) {
            *found = Some(event);
        }
    }
    let unknown: Vec<EventKey> = missing
        .iter()
        .filter(|(_, p)| p.is_none())
        .map(|(k, _)| k.clone())
        .collect();
    let read =
        futures::future::join_all(unknown.iter().map(|k| core.events.lookup(k.clone()))).await;
    for (key, found) in unknown.into_iter().zip(read) {
        if let Some(event) = found? {
            missing.insert(key, Some(event));
        }
    }
    for attempt in attempts
        .iter_mut()
        .filter(|a| a.event_data.value().is_null())
    {
        let key = EventKey {
            tenant_id: attempt.tenant_id.clone(),
            event_id: attempt.event_id.clone(),
        };
        let event = shipped
            .get(&key)
            .copied()
            .or(missing.get(&key).and_then(Option::as_ref));
        if let Some(event) = event {
            attempt.event_data = event.data.clone();
            attempt.event_trace = event.trace.clone();
        }
    }
    Ok(())
}

async fn prune(core: &Core, outbox: &dyn Outbox) {
    let Some(before) = Timestamp::now().checked_sub(core.config.idempotency_window) else {
        return;
    };
    loop {
        match outbox.prune_keys(before, PRUNE_BATCH).await {
            Ok(n) if (n as usize) < PRUNE_BATCH => return,
            Ok(_) => {}
            Err(err) => {
                tracing::warn!(error = %err, "pruning expired event keys failed; trying again later");
                return;
            }
        }
    }
}
