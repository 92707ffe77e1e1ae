//! Every path between the service and its log store, coalesced.
//!
//! - [`LogWriter`]: the `BatchWriter` behind the write coalescer. Publishes hand off events
//!   and workers hand off attempts; each write is one `LogStore::insert_many`.
//! - [`EventLookup`]: the `BatchLookup` over `get_events` (the outbox's while an event waits
//!   there, then the log store's), for first deliveries whose payload is not in the fresh-event
//!   cache and, without an outbox, for publishes checking a known id. Even a batch of one goes
//!   through `get_events`: no path reads the log one event at a time.
//! - [`RetryLookup`]: the `BatchLookup` over `LogStore::latest_attempts` for retries that come
//!   due, split so no query spans more than 15 minutes of attempt times.

use std::collections::HashMap;
use std::io::Write as _;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use sheaf_coalesce::{BatchLookup, BatchWriter, LookupCoalescer, SpanSplit, WriteCoalescer};
use sheaf_store::{
    Attempt, AttemptKey, DestinationId, Event, EventId, EventKey, LogStore, Outbox, Payload,
    TenantId, Timestamp,
};

/// One record for the log store.
#[derive(Debug, Clone)]
pub enum LogRecord {
    /// A published event.
    Event(Event),
    /// A delivery attempt.
    Attempt(Attempt),
}

/// Counts bytes written to it, to size a JSON value without keeping its text.
struct Counter(usize);

impl std::io::Write for Counter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The JSON size of a payload.
pub fn json_size(payload: &Payload) -> usize {
    let mut counter = Counter(0);
    let _ = serde_json::to_writer(&mut counter, payload.value());
    let _ = counter.flush();
    counter.0
}

/// Writes batches of records with one `insert_many` each.
#[derive(Debug, Clone)]
pub struct LogWriter(pub Arc<dyn LogStore>);

impl BatchWriter for LogWriter {
    type Record = LogRecord;
    type Error = sheaf_store::Error;

    fn record_bytes(&self, record: &LogRecord) -> usize {
        // Ids, topic and times are a few hundred bytes at most; the payload dominates, and an
        // attempt carries its event's payload too (ClickHouse stores it in the attempt row).
        match record {
            LogRecord::Event(e) => 128 + e.topic.len() + json_size(&e.data),
            LogRecord::Attempt(a) => {
                256 + a.event_topic.len()
                    + a.response_body.as_ref().map_or(0, String::len)
                    + a.error.as_ref().map_or(0, String::len)
                    + json_size(&a.event_data)
            }
        }
    }

    async fn write(&self, records: Vec<LogRecord>) -> Result<(), sheaf_store::Error> {
        let mut events = Vec::new();
        let mut attempts = Vec::new();
        for record in records {
            match record {
                LogRecord::Event(e) => events.push(e),
                LogRecord::Attempt(a) => attempts.push(a),
            }
        }
        self.0.insert_many(&events, &attempts).await
    }
}

/// The write coalescer in front of the log store.
pub type LogCoalescer = WriteCoalescer<LogWriter>;

/// Reads events by key: from the outbox while they wait there, else from the log store, each
/// through one `get_events` per batch.
#[derive(Debug, Clone)]
pub struct EventLookup {
    /// The outbox, when it is not the log store itself.
    pub outbox: Option<Arc<dyn Outbox>>,
    /// The log store.
    pub log: Arc<dyn LogStore>,
}

impl BatchLookup for EventLookup {
    type Key = EventKey;
    type Value = Event;
    type Error = sheaf_store::Error;

    async fn lookup_one(&self, key: EventKey) -> Result<Option<Event>, sheaf_store::Error> {
        let mut found = self.lookup_many(vec![key.clone()]).await?;
        Ok(found.remove(&key))
    }

    async fn lookup_many(
        &self,
        keys: Vec<EventKey>,
    ) -> Result<HashMap<EventKey, Event>, sheaf_store::Error> {
        let Some(outbox) = &self.outbox else {
            return self.log.get_events(&keys).await;
        };
        let mut found = outbox.get_events(&keys).await?;
        let shipped: Vec<EventKey> = keys
            .into_iter()
            .filter(|k| !found.contains_key(k))
            .collect();
        if !shipped.is_empty() {
            found.extend(self.log.get_events(&shipped).await?);
        }
        Ok(found)
    }
}

/// The event coalescer.
pub type EventCoalescer = LookupCoalescer<EventLookup>;

/// A retry's lookup: the triple and, when the job carries it, the time of its previous attempt.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RetryKey {
    /// The tenant.
    pub tenant_id: TenantId,
    /// The event.
    pub event_id: EventId,
    /// The destination.
    pub destination_id: DestinationId,
    /// The previous attempt's time; `None` makes the key unbatchable (a batch is bounded by its
    /// keys' times, and this key has none) and the lookup unbounded in time.
    pub attempt_time: Option<Timestamp>,
}

impl RetryKey {
    fn attempt_key(&self) -> AttemptKey {
        AttemptKey {
            tenant_id: self.tenant_id.clone(),
            event_id: self.event_id.clone(),
            destination_id: self.destination_id,
            attempt_time: self.attempt_time.unwrap_or(Timestamp::UNIX_EPOCH),
        }
    }
}

/// Finds the latest attempt of retries through `latest_attempt(s)`.
#[derive(Debug, Clone)]
pub struct RetryLookup(pub Arc<dyn LogStore>);

impl BatchLookup for RetryLookup {
    type Key = RetryKey;
    type Value = Attempt;
    type Error = sheaf_store::Error;

    async fn lookup_one(&self, key: RetryKey) -> Result<Option<Attempt>, sheaf_store::Error> {
        self.0.latest_attempt(&key.attempt_key()).await
    }

    async fn lookup_many(
        &self,
        keys: Vec<RetryKey>,
    ) -> Result<HashMap<RetryKey, Attempt>, sheaf_store::Error> {
        let attempt_keys: Vec<AttemptKey> = keys.iter().map(RetryKey::attempt_key).collect();
        let mut found = self.0.latest_attempts(&attempt_keys).await?;
        Ok(keys
            .into_iter()
            .zip(attempt_keys)
            .filter_map(|(key, attempt_key)| found.remove(&attempt_key).map(|a| (key, a)))
            .collect())
    }

    fn batchable(&self, key: &RetryKey) -> bool {
        key.attempt_time.is_some()
    }
}

/// The retry coalescer.
pub type RetryCoalescer = LookupCoalescer<RetryLookup>;

/// A batch query's time bound is its oldest key's, so keys whose attempt times span more than
/// 15 minutes go into separate queries: one old key would widen the range scanned for all. In
/// a time-ordered layout that range is the whole cost (10.2 ms of ClickHouse CPU per key for
/// keys spread over 30 days against 1.9 ms within a day, docs/benchmarks.md, `lookup`); Sheaf's
/// own layout is far less sensitive to it, and the split keeps any layout safe.
pub const RETRY_LOOKUP_SPAN: Duration = Duration::from_secs(15 * 60);

/// The split rule of the retry coalescer.
pub fn retry_split() -> SpanSplit<impl Fn(&RetryKey) -> SystemTime + Send + Sync + 'static> {
    SpanSplit::new(RETRY_LOOKUP_SPAN, |key: &RetryKey| {
        SystemTime::from(
            key.attempt_time
                .unwrap_or(Timestamp::UNIX_EPOCH)
                .as_datetime(),
        )
    })
}
