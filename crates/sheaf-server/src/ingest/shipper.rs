//! The log shipper: moves events and attempts from the Postgres outbox into the log store, behind
//! the publishes and deliveries that put them there.
//!
//! One shipper runs per process (several processes share the backlog: a shipment hides its rows
//! from the others). Each round takes up to `SHEAF_LOG_WRITE_MAX_RECORDS` records, hands them to
//! the log write coalescer as one batch, and commits the shipment, removing them from the outbox,
//! only once the log store acknowledged the write. A full round starts the next one at once; an
//! under-filled one waits out `SHEAF_LOG_SHIP_INTERVAL` from its start, so at a steady rate each
//! process writes one batch per interval (ClickHouse parts are bounded per interval, not per
//! publish) and an event is searchable within about one interval of its publish.
//!
//! When the log store is down, the write fails, the shipment is dropped (its rows come back) and
//! the shipper tries again with a doubling pause up to 30 s. Publishes and deliveries go on
//! meanwhile; the outbox grows on disk (`sheaf_outbox_events`, `sheaf_outbox_attempts`,
//! `sheaf_outbox_oldest_seconds`) and drains by itself when the store is back. A write that
//! succeeded but whose commit failed is shipped again: the log store folds the copies.
//!
//! Once a minute the shipper also forgets event keys older than `SHEAF_IDEMPOTENCY_WINDOW`.

use std::sync::Arc;
use std::time::Duration;

use sheaf_store::{Outbox, Timestamp};
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
    let Some(shipment) = outbox.take(max).await? else {
        return Ok(false);
    };
    let (events, attempts) = (shipment.events().len(), shipment.attempts().len());
    let records: Vec<LogRecord> = shipment
        .events()
        .iter()
        .cloned()
        .map(LogRecord::Event)
        .chain(shipment.attempts().iter().cloned().map(LogRecord::Attempt))
        .collect();
    // Dropping the shipment on failure gives the records back.
    core.log_writer.hand_off(records).await?;
    shipment.commit().await?;
    Metrics::add(&core.metrics.events_shipped, events);
    Metrics::add(&core.metrics.attempts_shipped, attempts);
    Ok(events + attempts >= max)
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
