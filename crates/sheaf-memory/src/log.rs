//! [`MemoryLogStore`]: events and attempts in ordered in-memory indexes, with a retention bound.
//!
//! Longer than 600 lines because the lean records, their indexes, retention and the rebuilding
//! of the trait's types on every read are one representation, and splitting them would spread
//! its invariants (an attempt lives no longer than its event) over several files. The holds
//! (below) took it past 800 and stay here for the same reason: a hold decides which records the
//! age indexes carry, so holding, releasing and retention must be read together to see that an
//! event owed a delivery is never dropped.
//!
//! The store keeps records lean, because in the embedded default its size is most of the
//! process's memory and nothing else bounds it:
//!
//! - a tenant's id is kept once, in its `TenantLog`, and a topic once, in an interning set:
//!   every record and index entry shares them (`Arc<str>`);
//! - an event's id is one `Arc<str>` shared by its map entry and its two index entries;
//! - a payload is kept once, as the compact JSON text of its event (a parsed
//!   `serde_json::Value` is a few times its text), and decoded when it is read;
//! - an attempt keeps neither its event's topic nor its data: a read rebuilds the full
//!   [`Attempt`] from the stored event. An attempt therefore lives no longer than its event:
//!   when retention drops an event its attempts go with it, and an attempt written after its
//!   event was dropped is not kept. Every read then returns what a store returns for an attempt
//!   it never held (`None`, no list entry, no latest attempt), which is what a retry sees when
//!   its previous attempt aged out anyway.
//!
//! An event with deliveries still owed is **held**: [`MemoryJobQueue`](crate::MemoryJobQueue),
//! built with [`MemoryJobQueue::holding_events_in`](crate::MemoryJobQueue::holding_events_in),
//! holds an event for every job it keeps for it (waiting, leased or dead-lettered, since a dead
//! letter can be replayed) and releases it when the job leaves. A held event and its attempts
//! are out of retention's reach: they leave the age indexes while held and go back into them,
//! with their own times, when the last hold goes. Retention's bounds therefore count only what
//! nobody waits for, and what is held is bounded where it comes in: the service refuses
//! publishes while [`MemoryLogStore::pending`] is at its bound, instead of dropping events it
//! has accepted.
//!
//! [`MemoryLogStore::footprint`] estimates what the records hold, for tests to bound.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt;
use std::ops::Bound;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::RwLock;
use sheaf_store::{
    Attempt, AttemptCounts, AttemptFilter, AttemptId, AttemptKey, AttemptStatus, AttemptTrigger,
    Buckets, Cursor, DestinationId, Error, Event, EventFilter, EventId, EventKey, Job, LogStore,
    Page, PageRequest, Payload, Result, TenantId, Timestamp, TraceContext,
};

/// How much of the log the memory store keeps.
///
/// A long-running embedded service must not grow without limit, so on every insert, and in
/// [`LogStore::maintain`] (which the service calls every few seconds, written to or not), the
/// store drops records, oldest first by their own time, until none is older than `max_age` and
/// there are at most `max_events` events and `max_attempts` attempts. Dropping is by record time,
/// not insertion order: a late write of an old record is the first to go. An attempt goes with
/// its event (it keeps no copy of the event's topic and payload), so `max_attempts` bounds the
/// attempts of the events kept: retries and fan-out to several destinations.
///
/// The bounds apply to what no delivery waits for: an event held by a job (see the module docs)
/// is kept, with its attempts, however old it is and however many others there are, so a retry
/// always finds its previous attempt and a delivery its payload. Held events are bounded where
/// they come in, by the service's pending-work bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogRetention {
    /// Records older than this are dropped, unless held; `None` keeps them until the count
    /// bounds apply.
    pub max_age: Option<Duration>,
    /// At most this many events are kept besides the held ones.
    pub max_events: usize,
    /// At most this many attempts are kept besides those of held events.
    pub max_attempts: usize,
}

impl Default for LogRetention {
    /// Three days, 25,000 events and 100,000 attempts. Each payload is kept once, as its JSON
    /// text; the rest of an event with one attempt, its records and index entries, is about
    /// 0.7 KB (686 B of live heap per retained event beyond its payload, counted by the
    /// allocator at 25,000 retained events after 125,000 written: docs/benchmarks.md,
    /// "`memory`"), so at 2 KB of JSON each the log holds on the order of 70 MB.
    fn default() -> Self {
        LogRetention {
            max_age: Some(Duration::from_secs(3 * 24 * 3600)),
            max_events: 25_000,
            max_attempts: 100_000,
        }
    }
}

/// An event as the store keeps it; its tenant and id are the keys it is stored under.
struct StoredEvent {
    /// Interned: shared with every event of the same topic.
    topic: Arc<str>,
    time: Timestamp,
    /// The payload as compact JSON text.
    data: Box<[u8]>,
    /// The publish's trace context, shared with the event it came in: one pointer when none.
    trace: Option<TraceContext>,
    /// Its attempts by `(destination, time, id)`, ascending: the latest-attempt index (the last
    /// entry of a destination is its newest attempt), and what goes when the event goes. Most
    /// events have one or two, so a tight vector beats a tree.
    attempts: Vec<(DestinationId, Timestamp, AttemptId)>,
    /// How many jobs the queue keeps for it; while above zero, neither the event nor its attempts
    /// are in the age indexes retention walks.
    holds: u32,
}

/// An attempt as the store keeps it: without its event's topic and data.
struct StoredAttempt {
    /// Shared with the event's own key.
    event_id: Arc<str>,
    destination_id: DestinationId,
    number: u32,
    time: Timestamp,
    status: AttemptStatus,
    trigger: AttemptTrigger,
    response_code: Option<u16>,
    duration_ms: u32,
    response_body: Option<Box<str>>,
    error: Option<Box<str>>,
}

/// One tenant's records and its listing indexes.
struct TenantLog {
    /// The id once, cloned into the records a read rebuilds.
    id: TenantId,
    /// The same id, shared by the store-wide age indexes.
    name: Arc<str>,
    events: HashMap<Arc<str>, StoredEvent>,
    /// For listings: `(time, id)` ascending, read backwards.
    events_by_time: BTreeSet<(Timestamp, Arc<str>)>,
    attempts: HashMap<AttemptId, StoredAttempt>,
    attempts_by_time: BTreeSet<(Timestamp, AttemptId)>,
}

impl TenantLog {
    fn new(id: &TenantId) -> Self {
        TenantLog {
            id: id.clone(),
            name: Arc::from(id.as_str()),
            events: HashMap::new(),
            events_by_time: BTreeSet::new(),
            attempts: HashMap::new(),
            attempts_by_time: BTreeSet::new(),
        }
    }

    fn is_empty(&self) -> bool {
        self.events.is_empty() && self.attempts.is_empty()
    }

    /// The event `id` as the trait's type, its payload decoded only `with_data` (listings check
    /// their filter first, which reads no payload, and decode only what they return).
    fn event(&self, id: &str, stored: &StoredEvent, with_data: bool) -> Result<Event> {
        Ok(Event {
            tenant_id: self.id.clone(),
            id: EventId::new(id)?,
            topic: stored.topic.to_string(),
            time: stored.time,
            data: if with_data {
                decode(&stored.data)?
            } else {
                Payload::default()
            },
            trace: stored.trace.clone(),
        })
    }

    /// The attempt `id` as the trait's type, its topic and data (only `with_data`) read from its
    /// event; `None` if the event is not stored, which retention never leaves behind.
    fn attempt(
        &self,
        id: AttemptId,
        stored: &StoredAttempt,
        with_data: bool,
    ) -> Result<Option<Attempt>> {
        let Some(event) = self.events.get(&*stored.event_id) else {
            return Ok(None);
        };
        Ok(Some(Attempt {
            tenant_id: self.id.clone(),
            id,
            event_id: EventId::new(&*stored.event_id)?,
            destination_id: stored.destination_id,
            number: stored.number,
            time: stored.time,
            status: stored.status,
            trigger: stored.trigger,
            response_code: stored.response_code,
            duration_ms: stored.duration_ms,
            response_body: stored.response_body.as_deref().map(str::to_owned),
            error: stored.error.as_deref().map(str::to_owned),
            event_topic: event.topic.to_string(),
            event_data: if with_data {
                decode(&event.data)?
            } else {
                Payload::default()
            },
            event_trace: event.trace.clone(),
        }))
    }
}

/// A payload as the store keeps it: compact JSON text.
fn encode(data: &Payload) -> Result<Box<[u8]>> {
    serde_json::to_vec(data.value())
        .map(Vec::into_boxed_slice)
        .map_err(|err| Error::backend("encode a payload", err))
}

/// A stored payload read back: equal to the one written, as a database backend's is.
fn decode(data: &[u8]) -> Result<Payload> {
    serde_json::from_slice(data)
        .map(Payload::new)
        .map_err(|err| Error::backend("decode a stored payload", err))
}

/// What the log holds for deliveries still owed: the events the queue has jobs for, and the
/// bytes of their payloads (as stored, compact JSON). Retention never drops these; they are
/// bounded at the door instead (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PendingWork {
    /// Events held by at least one job.
    pub events: u64,
    /// Their payloads' bytes.
    pub payload_bytes: u64,
}

#[derive(Default)]
struct LogState {
    tenants: HashMap<Arc<str>, TenantLog>,
    /// Held events and their payload bytes (kept out of the age indexes).
    pending: PendingWork,
    /// Attempts of held events (kept out of `attempts_by_age`).
    held_attempts: usize,
    /// Every topic a stored event has, once; a topic leaves with its last event.
    topics: HashSet<Arc<str>>,
    /// Every event, oldest first, for retention: `(time, tenant, id)`.
    events_by_age: BTreeSet<(Timestamp, Arc<str>, Arc<str>)>,
    /// Every attempt, oldest first, for retention: `(time, tenant, id)`.
    attempts_by_age: BTreeSet<(Timestamp, Arc<str>, AttemptId)>,
}

/// A hash map's table: one control byte and one slot per bucket (buckets run at least 8/7 of the
/// capacity).
fn map_bytes<K, V>(map: &HashMap<K, V>) -> usize {
    map.capacity() * 8 / 7 * (size_of::<(K, V)>() + 1)
}

/// Gives a hash map back what removals took from it. A map that retention keeps at a steady
/// size fills with the tombstones of removed entries, and when they leave no free slot the map
/// grows to twice its buckets although it holds no more entries than before: the memory
/// benchmark (`benches/benches/memory_footprint.rs`, docs/benchmarks.md, "`memory`") measured
/// 654 B per retained event beyond its payload before retention first ran and 950 B after
/// 100,000 more events, nearly all of it the two tables per tenant at twice their size. So a map
/// less than half full is rehashed to fit, if that leaves it room for an eighth more entries
/// (buckets are a power of two, at most 7/8 full): a map that has just grown for real is about
/// half full, and one whose fitted size would be nearly full would only grow again at the next
/// insert. At a steady 25,000 entries that is one rehash per ~3,600 inserts. It runs after every
/// insert (where the growth happens) and every removal (a tenant whose traffic stopped shrinks
/// as its records age out); the check itself is two comparisons.
fn compact<K: Eq + std::hash::Hash, V>(map: &mut HashMap<K, V>) {
    let len = map.len();
    if len < 64 || map.capacity() <= 2 * len {
        return;
    }
    let fitted = (len * 8 / 7).next_power_of_two() * 7 / 8;
    if fitted >= len + len / 8 {
        map.shrink_to_fit();
    }
}

/// A B-tree's nodes, which run at least half full: an estimate of 1.5 slots per entry.
fn set_bytes<T>(set: &BTreeSet<T>) -> usize {
    set.len() * size_of::<T>() * 3 / 2
}

/// An `Arc<str>`'s allocation: two counts and the text.
fn arc_str_bytes(s: &str) -> usize {
    2 * size_of::<usize>() + s.len()
}

impl LogState {
    fn footprint(&self) -> usize {
        let mut bytes = map_bytes(&self.tenants)
            + set_bytes(&self.events_by_age)
            + set_bytes(&self.attempts_by_age)
            + self.topics.capacity() * 8 / 7 * (size_of::<Arc<str>>() + 1)
            + self.topics.iter().map(|t| arc_str_bytes(t)).sum::<usize>();
        for tenant in self.tenants.values() {
            bytes += arc_str_bytes(&tenant.name)
                + tenant.id.as_str().len()
                + map_bytes(&tenant.events)
                + set_bytes(&tenant.events_by_time)
                + map_bytes(&tenant.attempts)
                + set_bytes(&tenant.attempts_by_time);
            for (id, event) in &tenant.events {
                bytes += arc_str_bytes(id)
                    + event.data.len()
                    // A context's allocation: two counts and two boxed strings, then their text.
                    + event.trace.as_ref().map_or(0, |t| 48 + t.text_len())
                    + event.attempts.capacity()
                        * size_of::<(DestinationId, Timestamp, AttemptId)>();
            }
            for attempt in tenant.attempts.values() {
                bytes += attempt.response_body.as_deref().map_or(0, str::len)
                    + attempt.error.as_deref().map_or(0, str::len);
            }
        }
        bytes
    }

    fn insert_event(&mut self, event: &Event, data: Box<[u8]>) {
        let tenant = self
            .tenants
            .entry(Arc::from(event.tenant_id.as_str()))
            .or_insert_with(|| TenantLog::new(&event.tenant_id));
        if tenant.events.contains_key(event.id.as_str()) {
            return;
        }
        let topic = match self.topics.get(event.topic.as_str()) {
            Some(topic) => Arc::clone(topic),
            None => {
                let topic: Arc<str> = Arc::from(event.topic.as_str());
                self.topics.insert(Arc::clone(&topic));
                topic
            }
        };
        let id: Arc<str> = Arc::from(event.id.as_str());
        tenant.events_by_time.insert((event.time, Arc::clone(&id)));
        self.events_by_age
            .insert((event.time, Arc::clone(&tenant.name), Arc::clone(&id)));
        tenant.events.insert(
            id,
            StoredEvent {
                topic,
                time: event.time,
                data,
                trace: event.trace.clone(),
                attempts: Vec::new(),
                holds: 0,
            },
        );
        compact(&mut tenant.events);
    }

    /// Keeps the attempt if its event is stored (see the module's documentation for why one
    /// whose event is not is dropped at once).
    fn insert_attempt(&mut self, attempt: &Attempt) {
        let Some(tenant) = self.tenants.get_mut(attempt.tenant_id.as_str()) else {
            return;
        };
        if tenant.attempts.contains_key(&attempt.id) {
            return;
        }
        let Some((event_id, _)) = tenant.events.get_key_value(attempt.event_id.as_str()) else {
            return;
        };
        let event_id = Arc::clone(event_id);
        let Some(event) = tenant.events.get_mut(&*event_id) else {
            return;
        };
        let entry = (attempt.destination_id, attempt.time, attempt.id);
        let at = event.attempts.partition_point(|e| *e < entry);
        // Exactly one more: the vector stays as small as its attempts.
        event.attempts.reserve_exact(1);
        event.attempts.insert(at, entry);
        tenant.attempts_by_time.insert((attempt.time, attempt.id));
        if event.holds == 0 {
            self.attempts_by_age
                .insert((attempt.time, Arc::clone(&tenant.name), attempt.id));
        } else {
            self.held_attempts += 1;
        }
        tenant.attempts.insert(
            attempt.id,
            StoredAttempt {
                event_id,
                destination_id: attempt.destination_id,
                number: attempt.number,
                time: attempt.time,
                status: attempt.status,
                trigger: attempt.trigger,
                response_code: attempt.response_code,
                duration_ms: attempt.duration_ms,
                response_body: attempt.response_body.as_deref().map(Box::from),
                error: attempt.error.as_deref().map(Box::from),
            },
        );
        compact(&mut tenant.attempts);
    }

    /// One more job keeps `(tenant, event)`: on its first hold the event and its attempts leave
    /// the age indexes, so retention cannot reach them. An event the log does not have is left
    /// alone (its job will find nothing to deliver, which the service reports as an error).
    fn hold(&mut self, tenant_id: &str, event_id: &str) {
        let Some((tenant, id, event)) = stored_event(&mut self.tenants, tenant_id, event_id) else {
            return;
        };
        event.holds += 1;
        if event.holds > 1 {
            return;
        }
        self.events_by_age
            .remove(&(event.time, Arc::clone(&tenant), id));
        for &(_, time, attempt) in &event.attempts {
            if self
                .attempts_by_age
                .remove(&(time, Arc::clone(&tenant), attempt))
            {
                self.held_attempts += 1;
            }
        }
        self.pending.events += 1;
        self.pending.payload_bytes += event.data.len() as u64;
    }

    /// A job that kept `(tenant, event)` is gone: when it was the last, the event and its
    /// attempts go back into the age indexes with their own times, and retention treats them
    /// like any other record from then on.
    fn release(&mut self, tenant_id: &str, event_id: &str) {
        let Some((tenant, id, event)) = stored_event(&mut self.tenants, tenant_id, event_id) else {
            return;
        };
        if event.holds == 0 {
            return;
        }
        event.holds -= 1;
        if event.holds > 0 {
            return;
        }
        self.events_by_age
            .insert((event.time, Arc::clone(&tenant), id));
        for &(_, time, attempt) in &event.attempts {
            self.attempts_by_age
                .insert((time, Arc::clone(&tenant), attempt));
        }
        self.held_attempts -= event.attempts.len();
        self.pending.events -= 1;
        self.pending.payload_bytes -= event.data.len() as u64;
    }

    /// Removes an event that has just left `events_by_age`, and its attempts with it.
    fn remove_event(&mut self, time: Timestamp, tenant_name: &Arc<str>, id: &Arc<str>) {
        let Some(tenant) = self.tenants.get_mut(&**tenant_name) else {
            return;
        };
        let Some(event) = tenant.events.remove(&**id) else {
            return;
        };
        tenant.events_by_time.remove(&(time, Arc::clone(id)));
        for (_, attempt_time, attempt_id) in event.attempts {
            tenant.attempts.remove(&attempt_id);
            tenant.attempts_by_time.remove(&(attempt_time, attempt_id));
            self.attempts_by_age
                .remove(&(attempt_time, Arc::clone(tenant_name), attempt_id));
        }
        compact(&mut tenant.events);
        compact(&mut tenant.attempts);
        // The interning set's reference and this event's are the last two: no event has it now.
        if Arc::strong_count(&event.topic) <= 2 {
            self.topics.remove(&*event.topic);
        }
        if tenant.is_empty() {
            self.tenants.remove(&**tenant_name);
        }
    }

    /// Removes an attempt that has just left `attempts_by_age`.
    fn remove_attempt(&mut self, time: Timestamp, tenant_name: &Arc<str>, id: AttemptId) {
        let Some(tenant) = self.tenants.get_mut(&**tenant_name) else {
            return;
        };
        let Some(attempt) = tenant.attempts.remove(&id) else {
            return;
        };
        tenant.attempts_by_time.remove(&(time, id));
        if let Some(event) = tenant.events.get_mut(&*attempt.event_id) {
            event.attempts.retain(|(_, _, a)| *a != id);
        }
        compact(&mut tenant.attempts);
        if tenant.is_empty() {
            self.tenants.remove(&**tenant_name);
        }
    }

    /// Whether [`Self::enforce`] would drop anything at `now`: the oldest record of either kind is
    /// too old, or there are too many. Cheap: it looks at the first entry of each index.
    fn over(&self, retention: &LogRetention, now: Timestamp) -> bool {
        let cutoff = retention.max_age.and_then(|age| now.checked_sub(age));
        let too_old = |oldest: Option<Timestamp>| matches!((cutoff, oldest), (Some(cutoff), Some(time)) if time < cutoff);
        self.events_by_age.len() > retention.max_events
            || self.attempts_by_age.len() > retention.max_attempts
            || too_old(self.events_by_age.first().map(|(time, _, _)| *time))
            || too_old(self.attempts_by_age.first().map(|(time, _, _)| *time))
    }

    fn enforce(&mut self, retention: &LogRetention, now: Timestamp) {
        let cutoff = retention.max_age.and_then(|age| now.checked_sub(age));
        let too_old = |time: Timestamp| cutoff.is_some_and(|cutoff| time < cutoff);
        while let Some((time, _, _)) = self.events_by_age.first() {
            if self.events_by_age.len() <= retention.max_events && !too_old(*time) {
                break;
            }
            let (time, tenant, id) = self.events_by_age.pop_first().expect("checked above");
            self.remove_event(time, &tenant, &id);
        }
        while let Some((time, _, _)) = self.attempts_by_age.first() {
            if self.attempts_by_age.len() <= retention.max_attempts && !too_old(*time) {
                break;
            }
            let (time, tenant, id) = self.attempts_by_age.pop_first().expect("checked above");
            self.remove_attempt(time, &tenant, id);
        }
    }

    fn latest(&self, key: &AttemptKey) -> Result<Option<Attempt>> {
        let Some(tenant) = self.tenants.get(key.tenant_id.as_str()) else {
            return Ok(None);
        };
        let Some(event) = tenant.events.get(key.event_id.as_str()) else {
            return Ok(None);
        };
        // The newest attempt to the destination is the answer if it is recent enough; if it is
        // not, no older one can be.
        let end = event
            .attempts
            .partition_point(|(d, _, _)| *d <= key.destination_id);
        let Some(&(destination, time, id)) = event.attempts[..end].last() else {
            return Ok(None);
        };
        if destination != key.destination_id || time < key.attempt_time {
            return Ok(None);
        }
        match tenant.attempts.get(&id) {
            Some(stored) => tenant.attempt(id, stored, true),
            None => Ok(None),
        }
    }
}

/// The stored event `(tenant_id, event_id)` with its tenant's shared name and its own shared id,
/// the keys it has in the store-wide age indexes.
fn stored_event<'a>(
    tenants: &'a mut HashMap<Arc<str>, TenantLog>,
    tenant_id: &str,
    event_id: &str,
) -> Option<(Arc<str>, Arc<str>, &'a mut StoredEvent)> {
    let tenant = tenants.get_mut(tenant_id)?;
    let id = Arc::clone(tenant.events.get_key_value(event_id)?.0);
    let event = tenant.events.get_mut(event_id)?;
    Some((Arc::clone(&tenant.name), id, event))
}

/// Walks `index` newest first, starting strictly after the cursor position, keeping the records
/// `fetch` returns, and builds a page of at most `limit`.
fn page_from<I, T>(
    index: Option<&BTreeSet<(Timestamp, I)>>,
    after: Option<(Timestamp, I)>,
    limit: usize,
    mut fetch: impl FnMut(&(Timestamp, I)) -> Result<Option<T>>,
    position: impl Fn(&T) -> Cursor,
) -> Result<Page<T>>
where
    I: Ord + Clone,
{
    let Some(index) = index else {
        return Ok(Page::empty());
    };
    let upper = match after {
        Some(position) => Bound::Excluded(position),
        None => Bound::Unbounded,
    };
    // One more than the limit tells whether a next page exists.
    let mut items = Vec::new();
    for entry in index.range((Bound::Unbounded, upper)).rev() {
        if items.len() > limit {
            break;
        }
        if let Some(item) = fetch(entry)? {
            items.push(item);
        }
    }
    Ok(Page::from_overfetch(items, limit, position))
}

/// The log store in memory. Cheap to share: wrap it in an `Arc` (`Arc<dyn LogStore>`).
pub struct MemoryLogStore {
    state: RwLock<LogState>,
    retention: LogRetention,
}

impl MemoryLogStore {
    /// An empty store that keeps what `retention` allows.
    pub fn new(retention: LogRetention) -> Self {
        MemoryLogStore {
            state: RwLock::new(LogState::default()),
            retention,
        }
    }

    /// The retention bound in force.
    pub fn retention(&self) -> &LogRetention {
        &self.retention
    }

    /// How many events and attempts the store holds now, held ones included.
    pub fn len(&self) -> (usize, usize) {
        let state = self.state.read();
        (
            state.events_by_age.len() + state.pending.events as usize,
            state.attempts_by_age.len() + state.held_attempts,
        )
    }

    /// What is held for deliveries still owed (see the module docs): the number the service
    /// bounds publishes by. One read of two counters under the read lock.
    pub fn pending(&self) -> PendingWork {
        self.state.read().pending
    }

    /// Holds the event of each job, once per job (see the module docs). The queue calls it
    /// under its own lock, so holds and releases of one job are never reordered.
    pub fn hold(&self, jobs: &[&Job]) {
        if jobs.is_empty() {
            return;
        }
        let mut state = self.state.write();
        for job in jobs {
            state.hold(job.tenant_id.as_str(), job.event_id.as_str());
        }
    }

    /// Releases one hold per job, taken by [`Self::hold`].
    pub fn release(&self, jobs: &[&Job]) {
        if jobs.is_empty() {
            return;
        }
        let mut state = self.state.write();
        for job in jobs {
            state.release(job.tenant_id.as_str(), job.event_id.as_str());
        }
    }

    /// About how many bytes of memory the records and their indexes hold, counted from the
    /// structures' lengths and capacities (payload text included, the allocator's rounding and
    /// the B-trees' exact node layout estimated): what the retention bounds, for tests and
    /// benchmarks to watch without an allocator of their own.
    pub fn footprint(&self) -> usize {
        self.state.read().footprint()
    }

    /// Whether the store holds no events and no attempts.
    pub fn is_empty(&self) -> bool {
        self.len() == (0, 0)
    }
}

impl Default for MemoryLogStore {
    fn default() -> Self {
        Self::new(LogRetention::default())
    }
}

impl fmt::Debug for MemoryLogStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (events, attempts) = self.len();
        f.debug_struct("MemoryLogStore")
            .field("events", &events)
            .field("attempts", &attempts)
            .field("retention", &self.retention)
            .finish()
    }
}

#[async_trait]
impl LogStore for MemoryLogStore {
    /// Drops what the retention no longer allows: records past `max_age` age out even while
    /// nothing is written. The check takes the read lock only, so a store within its bounds costs
    /// its readers nothing.
    async fn maintain(&self) -> Result<bool> {
        let now = Timestamp::now();
        if !self.state.read().over(&self.retention, now) {
            return Ok(false);
        }
        self.state.write().enforce(&self.retention, now);
        Ok(true)
    }

    async fn insert_many(&self, events: &[Event], attempts: &[Attempt]) -> Result<()> {
        // Encoding before the lock keeps readers from waiting on it.
        let encoded = events
            .iter()
            .map(|event| encode(&event.data))
            .collect::<Result<Vec<_>>>()?;
        let mut state = self.state.write();
        for (event, data) in events.iter().zip(encoded) {
            state.insert_event(event, data);
        }
        for attempt in attempts {
            state.insert_attempt(attempt);
        }
        state.enforce(&self.retention, Timestamp::now());
        Ok(())
    }

    async fn get_event(&self, tenant: &TenantId, id: &EventId) -> Result<Option<Event>> {
        let state = self.state.read();
        let Some(log) = state.tenants.get(tenant.as_str()) else {
            return Ok(None);
        };
        log.events
            .get(id.as_str())
            .map(|stored| log.event(id.as_str(), stored, true))
            .transpose()
    }

    async fn get_events(&self, keys: &[EventKey]) -> Result<HashMap<EventKey, Event>> {
        let state = self.state.read();
        let mut found = HashMap::with_capacity(keys.len());
        for key in keys {
            if found.contains_key(key) {
                continue;
            }
            let Some(log) = state.tenants.get(key.tenant_id.as_str()) else {
                continue;
            };
            if let Some(stored) = log.events.get(key.event_id.as_str()) {
                found.insert(key.clone(), log.event(key.event_id.as_str(), stored, true)?);
            }
        }
        Ok(found)
    }

    async fn list_events(
        &self,
        tenant: &TenantId,
        filter: &EventFilter,
        page: &PageRequest,
    ) -> Result<Page<Event>> {
        page.validate()?;
        let after = page
            .cursor_position(|id| EventId::new(id))?
            .map(|(time, id)| (time, Arc::<str>::from(id.as_str())));
        let state = self.state.read();
        let log = state.tenants.get(tenant.as_str());
        page_from(
            log.map(|log| &log.events_by_time),
            after,
            page.limit_usize(),
            |(_, id)| {
                let Some((log, stored)) = log.and_then(|log| Some((log, log.events.get(id)?)))
                else {
                    return Ok(None);
                };
                // The filter reads no payload (a suite case would catch one that started to):
                // decode only what is returned.
                let mut event = log.event(id, stored, false)?;
                if !filter.matches(&event) {
                    return Ok(None);
                }
                event.data = decode(&stored.data)?;
                Ok(Some(event))
            },
            |e: &Event| Cursor::new(e.time, e.id.as_str()),
        )
    }

    async fn get_attempt(&self, tenant: &TenantId, id: &AttemptId) -> Result<Option<Attempt>> {
        let state = self.state.read();
        let Some(log) = state.tenants.get(tenant.as_str()) else {
            return Ok(None);
        };
        match log.attempts.get(id) {
            Some(stored) => log.attempt(*id, stored, true),
            None => Ok(None),
        }
    }

    async fn list_attempts(
        &self,
        tenant: &TenantId,
        filter: &AttemptFilter,
        page: &PageRequest,
    ) -> Result<Page<Attempt>> {
        page.validate()?;
        let after = page.cursor_position(AttemptId::from_str)?;
        let state = self.state.read();
        let log = state.tenants.get(tenant.as_str());
        page_from(
            log.map(|log| &log.attempts_by_time),
            after,
            page.limit_usize(),
            |(_, id)| {
                let Some((log, stored)) = log.and_then(|log| Some((log, log.attempts.get(id)?)))
                else {
                    return Ok(None);
                };
                // As for events: filter first, decode only what is returned.
                let Some(mut attempt) = log.attempt(*id, stored, false)? else {
                    return Ok(None);
                };
                if !filter.matches(&attempt) {
                    return Ok(None);
                }
                if let Some(event) = log.events.get(&*stored.event_id) {
                    attempt.event_data = decode(&event.data)?;
                }
                Ok(Some(attempt))
            },
            |a: &Attempt| Cursor::new(a.time, a.id.to_string()),
        )
    }

    async fn count_attempts(
        &self,
        tenant: &TenantId,
        buckets: &Buckets,
    ) -> Result<Vec<AttemptCounts>> {
        // The time index gives the window; only the status of each attempt in it is read, no
        // record is rebuilt and no payload decoded.
        let mut counts = buckets.empty();
        let state = self.state.read();
        let Some(log) = state.tenants.get(tenant.as_str()) else {
            return Ok(counts);
        };
        let window = (
            Bound::Included((buckets.since, AttemptId::MIN)),
            Bound::Excluded((buckets.until(), AttemptId::MIN)),
        );
        for (time, id) in log.attempts_by_time.range(window) {
            let (Some(bucket), Some(stored)) = (
                buckets.index(*time).and_then(|i| counts.get_mut(i)),
                log.attempts.get(id),
            ) else {
                continue;
            };
            bucket.add(stored.status);
        }
        Ok(counts)
    }

    async fn latest_attempt(&self, key: &AttemptKey) -> Result<Option<Attempt>> {
        self.state.read().latest(key)
    }

    async fn latest_attempts(&self, keys: &[AttemptKey]) -> Result<HashMap<AttemptKey, Attempt>> {
        // One read lock for the whole batch: every key sees the same snapshot.
        let state = self.state.read();
        let mut found = HashMap::with_capacity(keys.len());
        let mut asked = HashSet::with_capacity(keys.len());
        for key in keys {
            if !asked.insert(key) {
                continue;
            }
            if let Some(attempt) = state.latest(key)? {
                found.insert(key.clone(), attempt);
            }
        }
        Ok(found)
    }
}
