//! [`MemoryLogStore`]: events and attempts in ordered in-memory indexes, with a retention bound.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt;
use std::ops::Bound;
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::RwLock;
use sheaf_store::{
    Attempt, AttemptFilter, AttemptId, AttemptKey, Cursor, DestinationId, Event, EventFilter,
    EventId, EventKey, LogStore, Page, PageRequest, Result, TenantId, Timestamp,
};

/// How much of the log the memory store keeps.
///
/// A long-running embedded service must not grow without limit, so on every insert the store
/// drops records, oldest first by their own time, until none is older than `max_age` and there
/// are at most `max_events` events and `max_attempts` attempts. Dropping is by record time, not
/// insertion order: a late write of an old record is the first to go.
///
/// A retry whose previous attempt has been dropped finds no latest attempt and is treated like
/// one whose attempt is not logged yet, so the bounds should comfortably exceed the retry
/// schedule's span; the defaults keep three days.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogRetention {
    /// Records older than this are dropped; `None` keeps them until the count bounds apply.
    pub max_age: Option<Duration>,
    /// At most this many events are kept.
    pub max_events: usize,
    /// At most this many attempts are kept.
    pub max_attempts: usize,
}

impl Default for LogRetention {
    /// Three days, 25,000 events and 100,000 attempts. An attempt shares its payload with its
    /// stored event, so the payloads of the events dominate: at 2 KB of JSON each, the events
    /// hold on the order of 100–250 MB (a parsed `serde_json::Value` is a few times its text).
    fn default() -> Self {
        LogRetention {
            max_age: Some(Duration::from_secs(3 * 24 * 3600)),
            max_events: 25_000,
            max_attempts: 100_000,
        }
    }
}

type Triple = (TenantId, EventId, DestinationId);

#[derive(Default)]
struct LogState {
    events: HashMap<EventKey, Event>,
    /// Per tenant, for listings: `(time, id)` ascending, read backwards.
    events_by_tenant: HashMap<TenantId, BTreeSet<(Timestamp, EventId)>>,
    /// Every event, oldest first, for retention.
    events_by_age: BTreeSet<(Timestamp, TenantId, EventId)>,
    attempts: HashMap<(TenantId, AttemptId), Attempt>,
    attempts_by_tenant: HashMap<TenantId, BTreeSet<(Timestamp, AttemptId)>>,
    attempts_by_age: BTreeSet<(Timestamp, TenantId, AttemptId)>,
    /// Per (tenant, event, destination), for the latest-attempt lookup: its last entry is the
    /// newest attempt by `(time, id)`.
    by_triple: HashMap<Triple, BTreeSet<(Timestamp, AttemptId)>>,
}

impl LogState {
    fn insert_event(&mut self, event: &Event) {
        let key = event.key();
        if self.events.contains_key(&key) {
            return;
        }
        self.events_by_tenant
            .entry(event.tenant_id.clone())
            .or_default()
            .insert((event.time, event.id.clone()));
        self.events_by_age
            .insert((event.time, event.tenant_id.clone(), event.id.clone()));
        self.events.insert(key, event.clone());
    }

    fn insert_attempt(&mut self, attempt: &Attempt) {
        let key = (attempt.tenant_id.clone(), attempt.id);
        if self.attempts.contains_key(&key) {
            return;
        }
        let mut attempt = attempt.clone();
        // Share the stored event's payload instead of keeping a second copy of the same JSON.
        let event_key = EventKey {
            tenant_id: attempt.tenant_id.clone(),
            event_id: attempt.event_id.clone(),
        };
        if let Some(event) = self.events.get(&event_key)
            && event.data == attempt.event_data
        {
            attempt.event_data = event.data.clone();
        }
        self.attempts_by_tenant
            .entry(attempt.tenant_id.clone())
            .or_default()
            .insert((attempt.time, attempt.id));
        self.attempts_by_age
            .insert((attempt.time, attempt.tenant_id.clone(), attempt.id));
        self.by_triple
            .entry((
                attempt.tenant_id.clone(),
                attempt.event_id.clone(),
                attempt.destination_id,
            ))
            .or_default()
            .insert((attempt.time, attempt.id));
        self.attempts.insert(key, attempt);
    }

    fn remove_event(&mut self, time: Timestamp, tenant: TenantId, id: EventId) {
        if let Some(set) = self.events_by_tenant.get_mut(&tenant) {
            set.remove(&(time, id.clone()));
            if set.is_empty() {
                self.events_by_tenant.remove(&tenant);
            }
        }
        self.events.remove(&EventKey {
            tenant_id: tenant,
            event_id: id,
        });
    }

    fn remove_attempt(&mut self, time: Timestamp, tenant: TenantId, id: AttemptId) {
        let Some(attempt) = self.attempts.remove(&(tenant.clone(), id)) else {
            return;
        };
        if let Some(set) = self.attempts_by_tenant.get_mut(&tenant) {
            set.remove(&(time, id));
            if set.is_empty() {
                self.attempts_by_tenant.remove(&tenant);
            }
        }
        let triple = (tenant, attempt.event_id, attempt.destination_id);
        if let Some(set) = self.by_triple.get_mut(&triple) {
            set.remove(&(time, id));
            if set.is_empty() {
                self.by_triple.remove(&triple);
            }
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
            self.remove_event(time, tenant, id);
        }
        while let Some((time, _, _)) = self.attempts_by_age.first() {
            if self.attempts_by_age.len() <= retention.max_attempts && !too_old(*time) {
                break;
            }
            let (time, tenant, id) = self.attempts_by_age.pop_first().expect("checked above");
            self.remove_attempt(time, tenant, id);
        }
    }

    fn latest(&self, key: &AttemptKey) -> Option<Attempt> {
        let triple = (
            key.tenant_id.clone(),
            key.event_id.clone(),
            key.destination_id,
        );
        // The newest attempt of the triple is the answer if it is recent enough; if it is not,
        // no older one can be.
        let &(time, id) = self.by_triple.get(&triple)?.last()?;
        if time < key.attempt_time {
            return None;
        }
        self.attempts.get(&(key.tenant_id.clone(), id)).cloned()
    }
}

/// Walks `index` newest first, starting strictly after the cursor position, keeping the records
/// that pass `keep`, and builds a page of at most `limit`.
fn page_from<I, T>(
    index: Option<&BTreeSet<(Timestamp, I)>>,
    after: Option<(Timestamp, I)>,
    limit: usize,
    mut fetch: impl FnMut(&(Timestamp, I)) -> Option<T>,
    position: impl Fn(&T) -> Cursor,
) -> Page<T>
where
    I: Ord + Clone,
{
    let Some(index) = index else {
        return Page::empty();
    };
    let upper = match after {
        Some(position) => Bound::Excluded(position),
        None => Bound::Unbounded,
    };
    // One more than the limit tells whether a next page exists.
    let items: Vec<T> = index
        .range((Bound::Unbounded, upper))
        .rev()
        .filter_map(&mut fetch)
        .take(limit + 1)
        .collect();
    Page::from_overfetch(items, limit, position)
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

    /// How many events and attempts the store holds now.
    pub fn len(&self) -> (usize, usize) {
        let state = self.state.read();
        (state.events.len(), state.attempts.len())
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
        let mut state = self.state.write();
        for event in events {
            state.insert_event(event);
        }
        for attempt in attempts {
            state.insert_attempt(attempt);
        }
        state.enforce(&self.retention, Timestamp::now());
        Ok(())
    }

    async fn get_event(&self, tenant: &TenantId, id: &EventId) -> Result<Option<Event>> {
        let key = EventKey {
            tenant_id: tenant.clone(),
            event_id: id.clone(),
        };
        Ok(self.state.read().events.get(&key).cloned())
    }

    async fn get_events(&self, keys: &[EventKey]) -> Result<HashMap<EventKey, Event>> {
        let state = self.state.read();
        Ok(keys
            .iter()
            .filter_map(|key| {
                state
                    .events
                    .get(key)
                    .map(|event| (key.clone(), event.clone()))
            })
            .collect())
    }

    async fn list_events(
        &self,
        tenant: &TenantId,
        filter: &EventFilter,
        page: &PageRequest,
    ) -> Result<Page<Event>> {
        page.validate()?;
        let after = page.cursor_position(|id| EventId::new(id))?;
        let state = self.state.read();
        Ok(page_from(
            state.events_by_tenant.get(tenant),
            after,
            page.limit_usize(),
            |(_, id)| {
                let key = EventKey {
                    tenant_id: tenant.clone(),
                    event_id: id.clone(),
                };
                state
                    .events
                    .get(&key)
                    .filter(|e| filter.matches(e))
                    .cloned()
            },
            |e: &Event| Cursor::new(e.time, e.id.as_str()),
        ))
    }

    async fn get_attempt(&self, tenant: &TenantId, id: &AttemptId) -> Result<Option<Attempt>> {
        Ok(self
            .state
            .read()
            .attempts
            .get(&(tenant.clone(), *id))
            .cloned())
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
        Ok(page_from(
            state.attempts_by_tenant.get(tenant),
            after,
            page.limit_usize(),
            |(_, id)| {
                state
                    .attempts
                    .get(&(tenant.clone(), *id))
                    .filter(|a| filter.matches(a))
                    .cloned()
            },
            |a: &Attempt| Cursor::new(a.time, a.id.to_string()),
        ))
    }

    async fn latest_attempt(&self, key: &AttemptKey) -> Result<Option<Attempt>> {
        Ok(self.state.read().latest(key))
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
            if let Some(attempt) = state.latest(key) {
                found.insert(key.clone(), attempt);
            }
        }
        Ok(found)
    }
}
