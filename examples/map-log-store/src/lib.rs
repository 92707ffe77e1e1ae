//! A [`LogStore`] over plain maps, written the way a backend outside Sheaf's workspace would be.
//!
//! It depends on `sheaf-store` alone (and `async-trait`, which the trait is declared with), and
//! its tests run the same suites as the memory, Postgres and ClickHouse backends:
//! `sheaf_store::testkit::conformance::run_all` (with `sheaf-memory`'s queue and entity store
//! beside this log store) and the parity property. That is the proof
//! that a new backend needs nothing from inside the workspace: the traits say what to guarantee,
//! the suites check it.
//!
//! The store is deliberately plain: one lock around two maps, every listing a scan of the
//! tenant's records sorted newest first. What a real backend would index (the `(tenant, time,
//! id)` order of a listing, the `(tenant, event, destination)` triple of a latest-attempt lookup)
//! is marked where the scan stands in for it.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use async_trait::async_trait;
use sheaf_store::{
    Attempt, AttemptFilter, AttemptId, AttemptKey, Cursor, Event, EventFilter, EventId, EventKey,
    LogStore, Page, PageRequest, Result, TenantId, Timestamp,
};

/// Events and attempts in two maps, keyed by their identity, behind one lock.
#[derive(Debug, Default)]
pub struct MapLogStore {
    records: Mutex<Records>,
}

#[derive(Debug, Default)]
struct Records {
    events: HashMap<EventKey, Event>,
    attempts: HashMap<(TenantId, AttemptId), Attempt>,
}

impl MapLogStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// The maps. A panic while the lock was held cannot leave them half-written (every write is
    /// one `entry().or_insert`), so a poisoned lock is taken over rather than passed on.
    fn records(&self) -> MutexGuard<'_, Records> {
        self.records
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The page of `items` (any order) after the request's cursor, newest first by `(time, id)`.
/// `position` is an item's place in that order; a database would walk an index in it instead.
fn page_of<T, I: Ord>(
    mut items: Vec<T>,
    after: Option<(Timestamp, I)>,
    page: &PageRequest,
    position: impl Fn(&T) -> (Timestamp, I),
    cursor: impl Fn(&T) -> Cursor,
) -> Page<T> {
    items.sort_by_key(|item| std::cmp::Reverse(position(item)));
    if let Some(after) = after {
        // Strictly after the cursor in newest-first order is strictly smaller.
        items.retain(|item| position(item) < after);
    }
    // One more than the limit tells whether there is a next page.
    items.truncate(page.limit_usize().saturating_add(1));
    Page::from_overfetch(items, page.limit_usize(), cursor)
}

#[async_trait]
impl LogStore for MapLogStore {
    async fn insert_many(&self, events: &[Event], attempts: &[Attempt]) -> Result<()> {
        let mut records = self.records();
        // A record already stored is a retried write of the same record: keep the first copy.
        for event in events {
            records
                .events
                .entry(event.key())
                .or_insert_with(|| event.clone());
        }
        for attempt in attempts {
            records
                .attempts
                .entry((attempt.tenant_id.clone(), attempt.id))
                .or_insert_with(|| attempt.clone());
        }
        Ok(())
    }

    async fn get_event(&self, tenant: &TenantId, id: &EventId) -> Result<Option<Event>> {
        let key = EventKey {
            tenant_id: tenant.clone(),
            event_id: id.clone(),
        };
        Ok(self.records().events.get(&key).cloned())
    }

    async fn list_events(
        &self,
        tenant: &TenantId,
        filter: &EventFilter,
        page: &PageRequest,
    ) -> Result<Page<Event>> {
        page.validate()?;
        let after = page.cursor_position(|id| EventId::new(id))?;
        let matching = self
            .records()
            .events
            .values()
            .filter(|event| &event.tenant_id == tenant && filter.matches(event))
            .cloned()
            .collect();
        Ok(page_of(
            matching,
            after,
            page,
            |event| (event.time, event.id.clone()),
            |event| Cursor::new(event.time, event.id.as_str()),
        ))
    }

    async fn get_attempt(&self, tenant: &TenantId, id: &AttemptId) -> Result<Option<Attempt>> {
        Ok(self.records().attempts.get(&(tenant.clone(), *id)).cloned())
    }

    async fn list_attempts(
        &self,
        tenant: &TenantId,
        filter: &AttemptFilter,
        page: &PageRequest,
    ) -> Result<Page<Attempt>> {
        page.validate()?;
        let after = page.cursor_position(|id| id.parse::<AttemptId>())?;
        let matching = self
            .records()
            .attempts
            .values()
            .filter(|attempt| &attempt.tenant_id == tenant && filter.matches(attempt))
            .cloned()
            .collect();
        Ok(page_of(
            matching,
            after,
            page,
            |attempt| (attempt.time, attempt.id),
            |attempt| Cursor::new(attempt.time, attempt.id.to_string()),
        ))
    }

    async fn latest_attempt(&self, key: &AttemptKey) -> Result<Option<Attempt>> {
        // The newest `(time, id)` of the triple at or after the key's time; a database would
        // probe an index on `(tenant, event, destination, time, id)` once, from its end.
        let records = self.records();
        let newest = records
            .attempts
            .values()
            .filter(|a| {
                a.tenant_id == key.tenant_id
                    && a.event_id == key.event_id
                    && a.destination_id == key.destination_id
                    && a.time >= key.attempt_time
            })
            .max_by_key(|a| (a.time, a.id));
        Ok(newest.cloned())
    }
}
