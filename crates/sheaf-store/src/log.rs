//! The delivery log: [`Event`]s, [`Attempt`]s and the [`LogStore`] trait that records and reads them.

use std::collections::HashMap;
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::counts::{AttemptCounts, Buckets};
use crate::{
    AttemptId, DestinationId, Error, EventId, Page, PageRequest, Result, TenantId, Timestamp,
    TraceContext,
};

/// Longest accepted topic, in bytes.
pub const MAX_TOPIC_LEN: usize = 255;

/// [`Error::InvalidInput`] unless `topic` is 1 to [`MAX_TOPIC_LEN`] bytes without control
/// characters and is not `*` (which means "every topic" in a destination's filter).
pub fn validate_topic(topic: &str) -> Result<()> {
    if topic.is_empty() || topic.len() > MAX_TOPIC_LEN {
        return Err(Error::invalid_input(format!(
            "topic must be 1 to {MAX_TOPIC_LEN} bytes, got {}",
            topic.len()
        )));
    }
    if topic.chars().any(char::is_control) {
        return Err(Error::invalid_input(format!(
            "topic {topic:?} contains a control character"
        )));
    }
    if topic == "*" {
        return Err(Error::invalid_input("\"*\" is a topic filter, not a topic"));
    }
    Ok(())
}

/// An event's JSON data, shared rather than copied.
///
/// The same payload travels in the event, in every attempt made for it and through a batched
/// lookup to each caller that asked for it; cloning a `Payload` is a reference count increment.
/// It compares by value, so a payload read back from a store equals the one written.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Payload(Arc<serde_json::Value>);

impl Payload {
    /// Wraps a JSON value.
    pub fn new(value: serde_json::Value) -> Self {
        Payload(Arc::new(value))
    }

    /// The JSON value.
    pub fn value(&self) -> &serde_json::Value {
        &self.0
    }

    /// Whether both handles share one allocation (a cheap equality test that may say `false` for
    /// equal payloads).
    pub fn ptr_eq(&self, other: &Payload) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Deref for Payload {
    type Target = serde_json::Value;
    fn deref(&self) -> &serde_json::Value {
        &self.0
    }
}

impl From<serde_json::Value> for Payload {
    fn from(value: serde_json::Value) -> Self {
        Payload::new(value)
    }
}

impl fmt::Debug for Payload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Payload({})", self.0)
    }
}

impl Serialize for Payload {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Payload {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        serde_json::Value::deserialize(deserializer).map(Payload::new)
    }
}

/// A published event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// The tenant that published it.
    pub tenant_id: TenantId,
    /// Unique within the tenant; publishing the same id again is the same event.
    pub id: EventId,
    /// What kind of event it is; destinations filter on it. See [`validate_topic`].
    pub topic: String,
    /// When it was published.
    pub time: Timestamp,
    /// The JSON body delivered to destinations.
    pub data: Payload,
    /// The trace context of the publish that made it, when that publish was traced: its
    /// deliveries' spans join that trace (see [`TraceContext`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<TraceContext>,
}

impl Event {
    /// An event without a trace context.
    pub fn new(
        tenant_id: TenantId,
        id: EventId,
        topic: impl Into<String>,
        time: Timestamp,
        data: Payload,
    ) -> Self {
        Event {
            tenant_id,
            id,
            topic: topic.into(),
            time,
            data,
            trace: None,
        }
    }

    /// The `(tenant, id)` pair that identifies this event.
    pub fn key(&self) -> EventKey {
        EventKey {
            tenant_id: self.tenant_id.clone(),
            event_id: self.id.clone(),
        }
    }
}

/// Identifies one event: its tenant and its id.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct EventKey {
    /// The event's tenant.
    pub tenant_id: TenantId,
    /// The event's id within that tenant.
    pub event_id: EventId,
}

/// How a delivery attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptStatus {
    /// The destination accepted the event (a 2xx answer).
    Success,
    /// Anything else: another status, a timeout, a connection error.
    Failed,
    /// The destination's transformation dropped the event: nothing was sent, and nothing is
    /// owed.
    Filtered,
}

impl AttemptStatus {
    /// The lower-case name used in the API and in stores' columns.
    pub fn as_str(self) -> &'static str {
        match self {
            AttemptStatus::Success => "success",
            AttemptStatus::Failed => "failed",
            AttemptStatus::Filtered => "filtered",
        }
    }

    /// Whether the delivery is settled by this attempt: the receiver took the event, or the
    /// destination's transformation dropped it. A failed one leaves a delivery owed.
    pub fn settles(self) -> bool {
        match self {
            AttemptStatus::Success | AttemptStatus::Filtered => true,
            AttemptStatus::Failed => false,
        }
    }
}

impl std::str::FromStr for AttemptStatus {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "success" => Ok(AttemptStatus::Success),
            "failed" => Ok(AttemptStatus::Failed),
            "filtered" => Ok(AttemptStatus::Filtered),
            _ => Err(Error::invalid_input(format!(
                "{s:?} is not an attempt status"
            ))),
        }
    }
}

/// What made an attempt happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptTrigger {
    /// The queue: a first delivery or a scheduled retry.
    Scheduled,
    /// An operator's manual retry through the API; it supersedes a pending scheduled retry.
    Manual,
}

impl AttemptTrigger {
    /// The lower-case name used in the API and in stores' columns.
    pub fn as_str(self) -> &'static str {
        match self {
            AttemptTrigger::Scheduled => "scheduled",
            AttemptTrigger::Manual => "manual",
        }
    }
}

impl std::str::FromStr for AttemptTrigger {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "scheduled" => Ok(AttemptTrigger::Scheduled),
            "manual" => Ok(AttemptTrigger::Manual),
            _ => Err(Error::invalid_input(format!(
                "{s:?} is not an attempt trigger"
            ))),
        }
    }
}

/// One delivery attempt of one event to one destination.
///
/// It carries its event's topic, data and trace context, so that the latest-attempt lookup of a
/// retry returns everything needed to deliver again without a second read (in ClickHouse the
/// payload lives in the attempt row). A backend may instead read them from the stored event,
/// because the service guarantees, and the suites only generate histories where, an attempt's
/// event is inserted (in the same or an earlier `insert_many`) with the same topic, data and
/// trace context.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Attempt {
    /// The tenant of the event and destination.
    pub tenant_id: TenantId,
    /// Generated when the attempt is made.
    pub id: AttemptId,
    /// The event delivered.
    pub event_id: EventId,
    /// Where it was delivered.
    pub destination_id: DestinationId,
    /// 1 for the first delivery, 2 for the first retry, and so on.
    pub number: u32,
    /// When the attempt was made (when the request started).
    pub time: Timestamp,
    /// How it ended.
    pub status: AttemptStatus,
    /// What made it happen.
    pub trigger: AttemptTrigger,
    /// The HTTP status the destination answered with, if it answered.
    pub response_code: Option<u16>,
    /// How long the request took, in milliseconds.
    pub duration_ms: u32,
    /// The start of the response body, truncated by the service.
    pub response_body: Option<String>,
    /// What went wrong, in words, where the response does not say it: no response (timeout,
    /// connection refused), a redirect not followed, the transformation's failure; on the last
    /// attempt of an ordered job, also what became of its key (it waits, or goes on without it).
    pub error: Option<String>,
    /// The event's topic.
    pub event_topic: String,
    /// The event's data.
    pub event_data: Payload,
    /// The event's trace context ([`Event::trace`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_trace: Option<TraceContext>,
}

impl Attempt {
    /// The key that finds this attempt (or a newer one) by its own time.
    pub fn key(&self) -> AttemptKey {
        AttemptKey {
            tenant_id: self.tenant_id.clone(),
            event_id: self.event_id.clone(),
            destination_id: self.destination_id,
            attempt_time: self.time,
        }
    }

    /// Whether `self` is newer than `other` in the order every backend uses to pick the latest
    /// attempt: later `time`, and on equal times the greater `id` (bytewise).
    pub fn is_newer_than(&self, other: &Attempt) -> bool {
        (self.time, self.id) > (other.time, other.id)
    }
}

/// A latest-attempt lookup: the newest attempt of `(tenant, event, destination)` whose time is
/// at or after `attempt_time`.
///
/// A retry carries the time of its previous attempt; the lookup finds that attempt, or a newer
/// one (a manual retry that superseded it), and never an older one.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct AttemptKey {
    /// The tenant.
    pub tenant_id: TenantId,
    /// The event.
    pub event_id: EventId,
    /// The destination.
    pub destination_id: DestinationId,
    /// The lower bound (inclusive) on the attempt's time.
    pub attempt_time: Timestamp,
}

/// A time window, `since` inclusive and `until` exclusive; either end may be open. A window whose
/// `since` is not before its `until` matches nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TimeRange {
    /// Only times at or after this.
    pub since: Option<Timestamp>,
    /// Only times strictly before this.
    pub until: Option<Timestamp>,
}

impl TimeRange {
    /// Whether `time` lies in the window.
    pub fn contains(&self, time: Timestamp) -> bool {
        self.since.is_none_or(|since| time >= since) && self.until.is_none_or(|until| time < until)
    }
}

/// Which of a tenant's events [`LogStore::list_events`] returns. Every field narrows; the default
/// matches all. An event has no status or destination of its own: those filters are on
/// [`AttemptFilter`].
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct EventFilter {
    /// Only events with exactly this topic.
    pub topic: Option<String>,
    /// Only events whose time lies in this window.
    pub time: TimeRange,
}

impl EventFilter {
    /// Whether `event` passes this filter (the tenant is checked by the caller).
    pub fn matches(&self, event: &Event) -> bool {
        self.topic.as_ref().is_none_or(|t| *t == event.topic) && self.time.contains(event.time)
    }
}

/// Which of a tenant's attempts [`LogStore::list_attempts`] returns. Every field narrows; the
/// default matches all.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct AttemptFilter {
    /// Only attempts of this event.
    pub event_id: Option<EventId>,
    /// Only attempts to this destination.
    pub destination_id: Option<DestinationId>,
    /// Only attempts that ended this way.
    pub status: Option<AttemptStatus>,
    /// Only attempts of events with exactly this topic.
    pub topic: Option<String>,
    /// Only attempts whose time lies in this window.
    pub time: TimeRange,
}

impl AttemptFilter {
    /// Whether `attempt` passes this filter (the tenant is checked by the caller).
    pub fn matches(&self, attempt: &Attempt) -> bool {
        self.event_id
            .as_ref()
            .is_none_or(|e| *e == attempt.event_id)
            && self
                .destination_id
                .is_none_or(|d| d == attempt.destination_id)
            && self.status.is_none_or(|s| s == attempt.status)
            && self
                .topic
                .as_ref()
                .is_none_or(|t| *t == attempt.event_topic)
            && self.time.contains(attempt.time)
    }
}

/// The record of events and delivery attempts, payloads included.
///
/// Every read is scoped to one tenant (or, for the batched calls, to each key's tenant): no
/// method ever returns another tenant's record, even when ids coincide across tenants.
///
/// Every successful write is visible to every read that starts after it returns
/// (read-your-writes), on every handle of the same store.
#[async_trait]
pub trait LogStore: fmt::Debug + Send + Sync + 'static {
    /// Records events and attempts, idempotently.
    ///
    /// Events are identified by `(tenant_id, id)`, attempts by `(tenant_id, id)`. A record whose
    /// identity is already stored, or appears earlier in the same call, is a duplicate: afterwards
    /// exactly one record exists for it, and every read (lists, lookups) returns it once. Callers
    /// only ever repeat identical records (a retried write); which copy a backend keeps when two
    /// differ is unspecified. Either slice may be empty; a call with both empty does nothing.
    ///
    /// When it returns `Ok`, every record is durable and visible. On `Err`, any subset may have
    /// been written, which is why the call must be idempotent: the caller writes the whole batch
    /// again.
    async fn insert_many(&self, events: &[Event], attempts: &[Attempt]) -> Result<()>;

    /// The event `(tenant, id)`, or `None` if it is not stored.
    async fn get_event(&self, tenant: &TenantId, id: &EventId) -> Result<Option<Event>>;

    /// Many events in one call: the map holds an entry for each key whose event is stored, and
    /// nothing for the others. Keys may repeat and may name different tenants.
    ///
    /// Backends override the default (one [`LogStore::get_event`] per distinct key) with a single
    /// query: the first-delivery path reads payloads in batches through it.
    async fn get_events(&self, keys: &[EventKey]) -> Result<HashMap<EventKey, Event>> {
        let mut found = HashMap::with_capacity(keys.len());
        for key in keys {
            if found.contains_key(key) {
                continue;
            }
            if let Some(event) = self.get_event(&key.tenant_id, &key.event_id).await? {
                found.insert(key.clone(), event);
            }
        }
        Ok(found)
    }

    /// A page of the tenant's events that match `filter`, newest first by `(time, id)`.
    ///
    /// Must: reject a request that fails [`PageRequest::validate`] or whose cursor id is not an
    /// [`EventId`] with [`Error::InvalidInput`]; return items strictly after the cursor in that
    /// order; set `next` exactly when more items matched (see [`Page::next`]). Paging through a
    /// listing while records are inserted never skips nor repeats an item that existed when the
    /// first page was read.
    async fn list_events(
        &self,
        tenant: &TenantId,
        filter: &EventFilter,
        page: &PageRequest,
    ) -> Result<Page<Event>>;

    /// The attempt `(tenant, id)`, or `None` if it is not stored.
    async fn get_attempt(&self, tenant: &TenantId, id: &AttemptId) -> Result<Option<Attempt>>;

    /// A page of the tenant's attempts that match `filter`, newest first by `(time, id)`, under the
    /// same rules as [`LogStore::list_events`] (a cursor id must be an [`AttemptId`]).
    async fn list_attempts(
        &self,
        tenant: &TenantId,
        filter: &AttemptFilter,
        page: &PageRequest,
    ) -> Result<Page<Attempt>>;

    /// The newest attempt for `(key.tenant_id, key.event_id, key.destination_id)` whose time is at
    /// or after `key.attempt_time`, or `None` when there is none.
    ///
    /// "Newest" is the greatest `(time, id)`: later time first, the greater id (bytewise) on equal
    /// times. Attempts of the same event to other destinations, and of an event with the same id
    /// in another tenant, never match. A duplicated attempt row is one attempt.
    async fn latest_attempt(&self, key: &AttemptKey) -> Result<Option<Attempt>>;

    /// [`LogStore::latest_attempt`] for many keys in one call.
    ///
    /// The map holds, for each distinct key with a result, exactly what `latest_attempt(key)`
    /// would return, and nothing for keys without one: a missing key means "not logged yet", the
    /// same as a single lookup's `None`. Keys may repeat (answered once), may name different
    /// tenants, and may span any time range; backends must accept at least 1,000 keys per call
    /// (splitting internally if they need to). Either every key is answered or the call fails.
    ///
    /// The default asks [`LogStore::latest_attempt`] once per distinct key. Backends override it
    /// with one query (one grouped query in ClickHouse, `LATERAL unnest` in Postgres);
    /// the parity suite checks that the override agrees with the single calls.
    async fn latest_attempts(&self, keys: &[AttemptKey]) -> Result<HashMap<AttemptKey, Attempt>> {
        let mut found = HashMap::with_capacity(keys.len());
        let mut asked = std::collections::HashSet::with_capacity(keys.len());
        for key in keys {
            if !asked.insert(key) {
                continue;
            }
            if let Some(attempt) = self.latest_attempt(key).await? {
                found.insert(key.clone(), attempt);
            }
        }
        Ok(found)
    }

    /// Counts a tenant's attempts by status in each of `buckets`, by attempt time: what a chart
    /// of deliveries over time needs, without reading the attempts out. The answer has every
    /// bucket, oldest first, empty ones counted zero; a duplicated attempt row counts once.
    ///
    /// The default pages through [`LogStore::list_attempts`], which reads every attempt in the
    /// window; backends override it with one grouped query.
    async fn count_attempts(
        &self,
        tenant: &TenantId,
        buckets: &Buckets,
    ) -> Result<Vec<AttemptCounts>> {
        let mut counts = buckets.empty();
        let filter = AttemptFilter {
            time: TimeRange {
                since: Some(buckets.since),
                until: Some(buckets.until()),
            },
            ..AttemptFilter::default()
        };
        let mut page = PageRequest::first(crate::MAX_PAGE_LIMIT);
        loop {
            let found = self.list_attempts(tenant, &filter, &page).await?;
            for attempt in &found.items {
                if let Some(bucket) = buckets.index(attempt.time).and_then(|i| counts.get_mut(i)) {
                    bucket.add(attempt.status);
                }
            }
            match found.next {
                Some(next) => page = PageRequest::after(crate::MAX_PAGE_LIMIT, next),
                None => return Ok(counts),
            }
        }
    }

    /// Whether the store is reachable, for readiness checks. The default says yes; backends with a
    /// server run a trivial query and return [`Error::Unavailable`] when it fails.
    async fn ping(&self) -> Result<()> {
        Ok(())
    }

    /// Upkeep the store does on its own while the service runs; the service asks every few
    /// seconds, whether or not anything was written. Returns whether it did anything. The
    /// default has nothing to do; the memory store drops what its retention no longer allows, so
    /// an idle store shrinks as its records age too, not only when the next write comes.
    async fn maintain(&self) -> Result<bool> {
        Ok(false)
    }
}
