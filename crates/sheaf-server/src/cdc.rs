//! The CDC source: committed changes of the application's Postgres, read through a logical
//! replication slot with `sheaf-cdc`, published as events through the service's own publish
//! path, and acknowledged to the slot only once those events are durable (seed 004).
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

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::StreamExt as _;
use futures::stream::FuturesUnordered;
use sheaf_cdc::{AckToken, CdcConfig, CdcMessage, CdcSource, CdcStream, Change, RowFilter};
use sheaf_store::{EventId, Payload, TenantId};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::core::Core;
use crate::metrics::{CdcMetrics, CdcState, Metrics};
use crate::publish::{CDC_ID_PREFIX, NewEvent, publish_events};

/// First wait before the stream is started again after an error.
const RESTART_BACKOFF_MIN: Duration = Duration::from_secs(1);
/// Longest wait between restarts: a database that is down is tried twice a minute.
const RESTART_BACKOFF_MAX: Duration = Duration::from_secs(30);
/// A session that ran this long resets the restart backoff: the last error was not a loop.
const HEALTHY_SESSION: Duration = Duration::from_secs(60);

/// First wait before a failed publish is tried again.
const PUBLISH_BACKOFF_MIN: Duration = Duration::from_millis(100);
/// Longest wait between publish attempts of one message: a log store that is down is tried
/// every few seconds, so delivery resumes soon after it is back.
const PUBLISH_BACKOFF_MAX: Duration = Duration::from_secs(5);

/// How long a publish already under way may still take once the source is stopping (bounded
/// further by `SHEAF_SHUTDOWN_TIMEOUT`). A publish is a log write and an enqueue, normally
/// milliseconds; one that takes longer is abandoned unacknowledged and read again next start.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// Which tables feed which tenant (`SHEAF_CDC_TENANTS`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableTenants {
    tables: BTreeMap<(String, String), TenantId>,
    other: Option<TenantId>,
    /// `*` does not cover this schema (Sheaf's own tables, when a store lives in Postgres).
    excluded_schema: Option<String>,
}

impl TableTenants {
    /// Parses `tenant` (every table) or `schema.table=tenant,…[,*=tenant]`.
    ///
    /// # Errors
    /// A message (lower-case) saying what is wrong.
    pub fn parse(raw: &str) -> Result<Self, String> {
        let raw = raw.trim();
        if raw.is_empty() {
            return Err("is empty".to_owned());
        }
        let tenant = |s: &str| TenantId::new(s.trim()).map_err(|e| e.to_string());
        if !raw.contains('=') {
            return Ok(Self {
                tables: BTreeMap::new(),
                other: Some(tenant(raw)?),
                excluded_schema: None,
            });
        }
        let mut tables = BTreeMap::new();
        let mut other = None;
        for entry in raw.split(',') {
            let entry = entry.trim();
            let (key, value) = entry
                .split_once('=')
                .ok_or_else(|| format!("entry {entry:?} is not `schema.table=tenant`"))?;
            let (key, value) = (key.trim(), tenant(value)?);
            if key == "*" {
                if other.replace(value).is_some() {
                    return Err("`*` appears twice".to_owned());
                }
                continue;
            }
            let (schema, table) = key
                .split_once('.')
                .filter(|(s, t)| !s.is_empty() && !t.is_empty())
                .ok_or_else(|| format!("{key:?} is not `schema.table` (the schema is required)"))?;
            if tables
                .insert((schema.to_owned(), table.to_owned()), value)
                .is_some()
            {
                return Err(format!("{key:?} appears twice"));
            }
        }
        Ok(Self {
            tables,
            other,
            excluded_schema: None,
        })
    }

    /// Keeps `*` away from `schema`: Sheaf's own tables must never feed Sheaf.
    pub fn exclude_schema(&mut self, schema: &str) {
        self.excluded_schema = Some(schema.to_owned());
    }

    /// The tables named explicitly, as `schema.table`.
    pub fn tables(&self) -> Vec<String> {
        self.tables
            .keys()
            .map(|(schema, table)| format!("{schema}.{table}"))
            .collect()
    }

    /// The schemas of the tables named explicitly.
    pub fn schemas(&self) -> BTreeSet<&str> {
        self.tables.keys().map(|(s, _)| s.as_str()).collect()
    }

    /// The tenant whose events the changes of `schema.table` become; `None`: dropped.
    pub fn tenant_for(&self, schema: &str, table: &str) -> Option<&TenantId> {
        // A lookup by borrowed (schema, table) without allocating is not possible with a
        // tuple key; maps are small, so a scan of the explicit entries is cheap enough.
        if let Some(tenant) = self
            .tables
            .iter()
            .find(|((s, t), _)| s == schema && t == table)
            .map(|(_, tenant)| tenant)
        {
            return Some(tenant);
        }
        if self.excluded_schema.as_deref() == Some(schema) {
            return None;
        }
        self.other.as_ref()
    }
}

/// Everything the CDC source runs with, from the `SHEAF_CDC_*` settings.
#[derive(Debug, Clone)]
pub struct CdcSettings {
    /// The `sheaf-cdc` configuration (validated; its filter is set when the source starts).
    pub source: CdcConfig,
    /// `SHEAF_CDC_TENANTS`.
    pub tenants: TableTenants,
    /// `SHEAF_CDC_MAX_IN_FLIGHT`.
    pub max_in_flight: usize,
}

/// The event id of a change read through `slot`: `cdc-<slot>-<commit LSN, 16 hex>-<position,
/// 8 hex>` (see [`sheaf_cdc::EventId`]). Lower-case letters, digits, `_` and `-`, at most 93
/// bytes: a valid [`EventId`].
///
/// # Errors
/// Only for a slot name `validate` would have refused.
pub fn event_id(slot: &str, change: &Change) -> sheaf_store::Result<EventId> {
    EventId::new(format!("{CDC_ID_PREFIX}{slot}-{}", change.event_id()))
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
    let mut backoff = RESTART_BACKOFF_MIN;
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
                    backoff = RESTART_BACKOFF_MIN;
                }
            }
            Err(error) => {
                tracing::error!(error = %error, slot = %config.slot, publication = %config.publication,
                    "CDC source could not start; trying again in {backoff:?}");
                metrics.set_last_error(Some(error.to_string()));
            }
        }
        metrics.set_state(CdcState::Restarting);
        Metrics::inc(&metrics.restarts);
        tokio::select! {
            biased;
            () = stop.cancelled() => break,
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(RESTART_BACKOFF_MAX);
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
enum Handled {
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
            if matches!(handled, Handled::Abandoned) {
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
    async fn handle(&self, message: CdcMessage, stop: CancellationToken) -> Handled {
        let metrics: &CdcMetrics = &self.core.metrics.cdc;
        let (changes, ack) = message.into_parts();
        Metrics::add(&metrics.changes, changes.len());
        let last_commit = changes.last().map(|c| c.commit_time);
        let mut backoff = PUBLISH_BACKOFF_MIN;
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
                    return Handled::Acked;
                }
                Some(Err(error)) => {
                    Metrics::inc(&metrics.publish_failures);
                    tracing::warn!(error = %error, changes = changes.len(),
                        "CDC publish failed; the same changes are tried again in {backoff:?}");
                }
                None => return Handled::Abandoned,
            }
            tokio::select! {
                biased;
                () = stop.cancelled() => return Handled::Abandoned,
                () = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(PUBLISH_BACKOFF_MAX);
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
                .map_err(|e| format!("change {} cannot be read: {e}", change.event_id()))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_tenant_or_a_map_with_a_fallback() {
        let one = TableTenants::parse("acme").unwrap();
        assert_eq!(one.tenant_for("public", "orders").unwrap().as_str(), "acme");
        assert!(one.tables().is_empty());

        let mut map = TableTenants::parse("public.orders=acme, app.users = beta ,*=rest").unwrap();
        assert_eq!(map.tables(), ["app.users", "public.orders"]);
        assert_eq!(map.tenant_for("app", "users").unwrap().as_str(), "beta");
        assert_eq!(map.tenant_for("x", "y").unwrap().as_str(), "rest");
        map.exclude_schema("sheaf");
        assert_eq!(
            map.tenant_for("sheaf", "events"),
            None,
            "`*` skips Sheaf's own schema"
        );

        let only = TableTenants::parse("public.orders=acme").unwrap();
        assert_eq!(only.tenant_for("public", "other"), None);

        for bad in [
            "",
            "orders=acme",
            "public.orders=acme,public.orders=beta",
            "*=a,*=b",
            "public.orders=bad tenant!",
            "public.orders=acme,",
        ] {
            assert!(TableTenants::parse(bad).is_err(), "{bad:?} must be refused");
        }
    }
}
