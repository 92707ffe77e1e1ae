//! The CDC source: committed changes of the application's Postgres, read through a logical
//! replication slot with `sheaf-cdc`, published as events through the service's own publish
//! path, and acknowledged to the slot only once those events are durable .
//!
//! ```text
//!  slot ─> sheaf-cdc (decode, batch per transaction, stamp) ─> CdcStream ─> message
//!     ─> up to SHEAF_CDC_MAX_IN_FLIGHT messages publishing at once ─> publish_events
//!        (one log write through the write coalescer, one enqueue per tenant) ─> Ok ─> ack
//! ```
//!
//! - **Event**: each [`Change`] becomes an event of the tenant `SHEAF_CDC_TENANTS` maps its
//!   table to, topic `<schema>.<table>.<insert|update|delete|truncate>` ([`Change::topic`]),
//!   data [`Change::to_json`], id `cdc-<slot>-<commit LSN>-<position>` ([`event_id`]). The id
//!   depends only on the change's place in the WAL, never on how the rows were batched, so a
//!   change read again after a crash or a restart (with the same or a different batching)
//!   gets the same id and the publish path turns it into a repeat: nothing is published twice.
//! - **Acknowledgement**: a message is acknowledged once `publish_events` returned `Ok` for
//!   all of its events (durable in the log, jobs enqueued). Messages publish concurrently and
//!   are acknowledged in any order; `sheaf-cdc` advances the slot over the acknowledged prefix
//!   only. A failed publish is retried with a bounded backoff, the same message, never skipped.
//! - **Restart**: a stream error ends the session; in-flight publishes get a short grace, then
//!   the stream is shut down and started again after a backoff (1 s doubling to 30 s, back to
//!   1 s after a session that ran a minute). Rows not acknowledged are read again: at least
//!   once from the slot, exactly once in the log thanks to the ids.
//! - **Shutdown**: stop reading; let publishes already under way finish within a short grace
//!   (and acknowledge them); leave the rest unacknowledged (read again next start); shut the
//!   stream down, which reports the confirmed position to the server.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::StreamExt as _;
use futures::stream::FuturesUnordered;
use sheaf_cdc::{AckToken, CdcMessage, CdcSource, CdcStream, Change, RowFilter};
use sheaf_store::{EventId, Payload, TenantId};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::cdc::{CdcSettings, TableTenants};
use crate::ingest::body::CDC_ID_PREFIX;
use crate::ingest::publish::{NewEvent, publish_events};
use crate::state::Core;
use crate::state::backoff::Backoff;
use crate::state::metrics::{CdcMetrics, CdcState, Metrics};
use tracing::Instrument as _;

/// Waits before the stream is started again after an error: 1 s doubling to 30 s, so a
/// database that is down is tried twice a minute.
const RESTART_BACKOFF: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
/// A session that ran this long resets the restart backoff: the last error was not a loop.
const HEALTHY_SESSION: Duration = Duration::from_secs(60);

/// Waits between publish attempts of one message: 100 ms doubling to 5 s, so a log store that
/// is down is tried every few seconds and delivery resumes soon after it is back.
const PUBLISH_BACKOFF: Backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));

/// How long a publish already under way may still take once the source is stopping (bounded
/// further by `SHEAF_SHUTDOWN_TIMEOUT`). A publish is a log write and an enqueue, normally
/// milliseconds; one that takes longer is abandoned unacknowledged and read again next start.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// The event id of a change read through `slot`: `cdc-<slot>-<commit LSN, 16 hex>-<position,
/// 8 hex>` (see [`sheaf_cdc::ChangeId`]). Lower-case letters, digits, `_` and `-`, at most 93
/// bytes: a valid [`EventId`].
///
/// # Errors
/// Only for a slot name `validate` would have refused.
pub fn event_id(slot: &str, change: &Change) -> sheaf_store::Result<EventId> {
    EventId::new(format!("{CDC_ID_PREFIX}{slot}-{}", change.id()))
}

/// Microseconds from the Unix epoch to Postgres's (2000-01-01 UTC).
const PG_EPOCH_UNIX_MICROS: i64 = 946_684_800_000_000;

/// The running source.
#[derive(Debug)]
pub struct CdcRunner {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl CdcRunner {
    /// Starts the source in the background. Connecting happens there too: a database that is
    /// down at start-up (or a missing slot) is reported in the log, `/readyz` and `/metrics`,
    /// and tried again with the restart backoff, while the rest of the service runs.
    pub fn start(core: Arc<Core>, settings: CdcSettings) -> Self {
        let stop = CancellationToken::new();
        core.metrics.cdc.set_state(CdcState::Starting);
        let task = tokio::spawn(run(core, settings, stop.clone()));
        Self { stop, task }
    }

    /// Stops gracefully: see the module docs. Waits at most `deadline` plus the stream's own
    /// stop budget.
    pub async fn shutdown(mut self, deadline: Duration) {
        self.stop.cancel();
        // The task bounds its own waits (grace, the stream's stop timeout); this is a backstop.
        let backstop = deadline + STOP_GRACE + Duration::from_secs(15);
        if tokio::time::timeout(backstop, &mut self.task)
            .await
            .is_err()
        {
            tracing::warn!("the CDC source did not stop within {backstop:?}; abandoning it");
            self.task.abort();
        }
    }
}

impl Drop for CdcRunner {
    /// A runner dropped without `shutdown` (a server dropped on an error path) still stops
    /// its stream, so the slot is released rather than held by a task nobody owns.
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// The source's loop: start a stream, run a session, start again after errors, until stopped.
async fn run(core: Arc<Core>, settings: CdcSettings, stop: CancellationToken) {
    let metrics = &core.metrics.cdc;
    let mut config = settings.source.clone();
    config.stream.filter = Some(filter(Arc::clone(&core.metrics), settings.tenants.clone()));
    let grace = core.config.shutdown_timeout.min(STOP_GRACE);
    let mut backoff = RESTART_BACKOFF;
    loop {
        metrics.set_state(CdcState::Starting);
        let started = tokio::select! {
            biased;
            () = stop.cancelled() => break,
            started = CdcSource::start(config.clone()) => started,
        };
        match started {
            Ok(stream) => {
                tracing::info!(slot = %config.slot, publication = %config.publication,
                    "CDC source is streaming");
                metrics.set_state(CdcState::Streaming);
                metrics.set_last_error(None);
                let began = Instant::now();
                let session = Session {
                    core: &core,
                    settings: &settings,
                    stop: &stop,
                    grace,
                };
                match session.run(stream).await {
                    SessionEnd::Stopped => break,
                    SessionEnd::Failed(error) => {
                        tracing::warn!(error = %error,
                            "CDC stream failed; unacknowledged rows are read again after the restart");
                        metrics.set_last_error(Some(error));
                    }
                }
                if began.elapsed() >= HEALTHY_SESSION {
                    backoff.reset();
                }
            }
            Err(error) => {
                tracing::error!(error = %error, slot = %config.slot, publication = %config.publication,
                    "CDC source could not start; trying again in {:?}", backoff.peek());
                metrics.set_last_error(Some(error.to_string()));
            }
        }
        metrics.set_state(CdcState::Restarting);
        Metrics::inc(&metrics.restarts);
        tokio::select! {
            biased;
            () = stop.cancelled() => break,
            () = tokio::time::sleep(backoff.next_delay()) => {}
        }
    }
    metrics.set_state(CdcState::Stopped);
}

/// Keeps the changes of tables some tenant is mapped to; counts the others. Runs on the
/// reader, so a flush it empties is acknowledged as a row-less checkpoint (`sheaf-cdc`).
fn filter(metrics: Arc<Metrics>, tenants: TableTenants) -> RowFilter {
    Arc::new(move |change: &Change| {
        let keep = tenants
            .tenant_for(&change.relation.schema, &change.relation.table)
            .is_some();
        if !keep {
            Metrics::inc(&metrics.cdc.dropped);
        }
        keep
    })
}

/// How a session ended.
enum SessionEnd {
    /// Shutdown.
    Stopped,
    /// The stream failed (the message, for the log and `/readyz`).
    Failed(String),
}

/// How one message ended.
enum MessageEnd {
    Acked,
    /// Stopping: left unacknowledged, read again on the next start.
    Abandoned,
}

/// One started stream, until it fails or the source stops.
struct Session<'a> {
    core: &'a Arc<Core>,
    settings: &'a CdcSettings,
    stop: &'a CancellationToken,
    grace: Duration,
}

impl Session<'_> {
    async fn run(&self, mut stream: CdcStream) -> SessionEnd {
        // Stops the publish retries of this session when it ends for any reason.
        let session_stop = self.stop.child_token();
        let mut in_flight = FuturesUnordered::new();
        let end = loop {
            tokio::select! {
                biased;
                () = self.stop.cancelled() => break SessionEnd::Stopped,
                Some(_) = in_flight.next(), if !in_flight.is_empty() => {
                    self.observe(&stream);
                }
                received = stream.recv(), if in_flight.len() < self.settings.max_in_flight => {
                    match received {
                        Ok(Some(message)) => {
                            in_flight.push(self.handle(message, session_stop.clone()));
                        }
                        Ok(None) => break SessionEnd::Failed(sheaf_cdc::Error::Closed.to_string()),
                        Err(error) => break SessionEnd::Failed(error.to_string()),
                    }
                }
            }
        };
        // Publishes under way get the grace to finish and acknowledge; then none is retried.
        session_stop.cancel();
        let mut abandoned = 0;
        let deadline = Instant::now() + self.grace;
        while let Ok(Some(handled)) = tokio::time::timeout_at(deadline, in_flight.next()).await {
            if matches!(handled, MessageEnd::Abandoned) {
                abandoned += 1;
            }
        }
        abandoned += in_flight.len();
        drop(in_flight);
        if abandoned > 0 {
            tracing::info!(
                messages = abandoned,
                "CDC messages left unacknowledged; they are read again on the next start"
            );
        }
        self.observe(&stream);
        if let Err(error) = stream.shutdown().await {
            // A failed stream returns its error here again; only a clean stop's is news.
            if matches!(end, SessionEnd::Stopped) {
                tracing::warn!(error = %error, "CDC stream did not stop cleanly");
            }
        }
        end
    }

    fn observe(&self, stream: &CdcStream) {
        let metrics = &self.core.metrics.cdc;
        metrics.rows_in_flight.store(
            u64::try_from(stream.rows_in_flight()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        metrics
            .confirmed_lsn
            .store(stream.confirmed_lsn().0, Ordering::Relaxed);
    }

    /// Publishes one message's events, retrying until they are durable, then acknowledges.
    async fn handle(&self, message: CdcMessage, stop: CancellationToken) -> MessageEnd {
        let metrics: &CdcMetrics = &self.core.metrics.cdc;
        let (changes, ack) = message.into_parts();
        Metrics::add(&metrics.changes, changes.len());
        let last_commit = changes.last().map(|c| c.commit_time);
        let mut backoff = PUBLISH_BACKOFF;
        loop {
            let attempt = self.publish(&changes);
            tokio::pin!(attempt);
            let outcome = tokio::select! {
                biased;
                outcome = &mut attempt => Some(outcome),
                () = stop.cancelled() => tokio::time::timeout(self.grace, &mut attempt).await.ok(),
            };
            match outcome {
                Some(Ok(())) => {
                    acknowledge(metrics, ack, last_commit);
                    return MessageEnd::Acked;
                }
                Some(Err(error)) => {
                    Metrics::inc(&metrics.publish_failures);
                    tracing::warn!(error = %error, changes = changes.len(),
                        "CDC publish failed; the same changes are tried again in {:?}", backoff.peek());
                }
                None => return MessageEnd::Abandoned,
            }
            tokio::select! {
                biased;
                () = stop.cancelled() => return MessageEnd::Abandoned,
                () = tokio::time::sleep(backoff.next_delay()) => {}
            }
        }
    }

    /// One attempt: the changes as events, grouped by tenant in their order, each group one
    /// `publish_events` call (one log write, one enqueue).
    async fn publish(&self, changes: &[Change]) -> Result<(), String> {
        let slot = &self.settings.source.slot;
        let mut groups: Vec<(&TenantId, Vec<NewEvent>)> = Vec::new();
        for change in changes {
            let Some(tenant) = self
                .settings
                .tenants
                .tenant_for(&change.relation.schema, &change.relation.table)
            else {
                // The reader's filter dropped these already; a change that still gets here
                // has no tenant to go to.
                continue;
            };
            let data = change
                .to_json()
                .map_err(|e| format!("change {} cannot be read: {e}", change.id()))?;
            let event = NewEvent {
                id: event_id(slot, change).map_err(|e| e.to_string())?,
                chosen: true,
                topic: change.topic(),
                data: Payload::new(data),
            };
            match groups.iter_mut().find(|(t, _)| *t == tenant) {
                Some((_, events)) => events.push(event),
                None => groups.push((tenant, vec![event])),
            }
        }
        let metrics = &self.core.metrics.cdc;
        // One span per replicated batch, naming the WAL it covers; its publishes are children.
        let span = tracing::info_span!(
            "cdc_batch",
            slot = %slot,
            changes = changes.len(),
            first_lsn = %changes.first().map(|c| c.lsn.to_string()).unwrap_or_default(),
            last_lsn = %changes.last().map(|c| c.lsn.to_string()).unwrap_or_default(),
        );
        async {
            for (tenant, events) in groups {
                let published = publish_events(self.core, tenant, events)
                    .await
                    .map_err(|e| format!("tenant {tenant}: {e}"))?;
                let repeats = published.iter().filter(|p| p.repeat).count();
                Metrics::add(&metrics.event_repeats, repeats);
                Metrics::add(&metrics.events_published, published.len() - repeats);
            }
            Ok(())
        }
        .instrument(span)
        .await
    }
}

fn acknowledge(metrics: &CdcMetrics, ack: AckToken, last_commit: Option<i64>) {
    ack.ack();
    Metrics::inc(&metrics.acks);
    if let Some(commit) = last_commit {
        metrics.last_ack_commit_micros.fetch_max(
            commit.saturating_add(PG_EPOCH_UNIX_MICROS),
            Ordering::Relaxed,
        );
    }
}
