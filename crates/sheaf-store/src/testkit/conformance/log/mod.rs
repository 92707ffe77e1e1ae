//! [`LogStore`] conformance: idempotent inserts, exact round trips, listings and their cursors,
//! tenant isolation, and the latest-attempt rules.

mod counts;
mod isolation;
mod latest;
mod listings;
mod records;

pub use counts::count_attempts_buckets_by_time_and_status;
pub use isolation::reads_are_tenant_isolated;
pub use latest::{
    latest_attempt_breaks_time_ties_by_id, latest_attempt_follows_the_rules,
    latest_attempts_agrees_with_single_lookups,
};
pub use listings::{
    list_attempts_orders_newest_first_and_filters, list_events_orders_newest_first_and_filters,
    pagination_rejects_bad_requests, pagination_survives_concurrent_inserts,
    pagination_survives_interleaved_inserts, pagination_visits_every_item_once,
};
pub use records::{
    get_events_returns_only_stored_keys, insert_many_is_idempotent, records_round_trip_exactly,
    trace_contexts_round_trip,
};

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use serde_json::json;

use super::assert_kind;
use crate::testkit::fixtures::{ago, attempt, event, event_id, shift, traced_event, unique_tenant};
use crate::testkit::model;
use crate::{
    Attempt, AttemptFilter, AttemptId, AttemptKey, AttemptStatus, AttemptTrigger, Cursor,
    DestinationId, ErrorKind, Event, EventFilter, EventKey, LogStore, MAX_PAGE_LIMIT, Page,
    PageRequest, Payload, TenantId, TimeRange, Timestamp,
};

const SECOND: i64 = 1_000_000;

/// An hour ago, well inside any retention bound, with a sub-second part so that microseconds
/// are exercised everywhere.
fn base_time() -> Timestamp {
    ago(Duration::from_secs(3600))
}

async fn insert(store: &dyn LogStore, events: &[Event], attempts: &[Attempt]) {
    store
        .insert_many(events, attempts)
        .await
        .expect("insert_many failed");
}

/// Checks the paging rules on one page: at most `limit` items, `next` only on a full page.
fn check_page<T>(page: &Page<T>, limit: u32, what: &str) {
    assert!(
        page.items.len() <= limit as usize,
        "{what}: a page with limit {limit} returned {} items",
        page.items.len()
    );
    if page.next.is_some() {
        assert_eq!(
            page.items.len(),
            limit as usize,
            "{what}: a page with a next cursor must be full"
        );
    }
}

/// Walks a listing to its end, checking every page, and returns the items in order.
async fn walk<T, F, Fut>(limit: u32, what: &str, mut fetch: F) -> Vec<T>
where
    F: FnMut(PageRequest) -> Fut,
    Fut: std::future::Future<Output = crate::Result<Page<T>>>,
{
    let mut items = Vec::new();
    let mut request = PageRequest::first(limit);
    for _ in 0..10_000 {
        let page = fetch(request.clone())
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        check_page(&page, limit, what);
        if request.cursor.is_some() {
            assert!(
                !page.items.is_empty(),
                "{what}: a next cursor led to an empty page"
            );
        }
        items.extend(page.items);
        match page.next {
            Some(cursor) => request = PageRequest::after(limit, cursor),
            None => return items,
        }
    }
    panic!("{what}: the listing did not end after 10,000 pages");
}

async fn all_events(
    store: &dyn LogStore,
    tenant: &TenantId,
    filter: &EventFilter,
    limit: u32,
) -> Vec<Event> {
    let what = format!("list_events({tenant}, {filter:?}, limit {limit})");
    walk(limit, &what, |page| async move {
        store.list_events(tenant, filter, &page).await
    })
    .await
}

async fn all_attempts(
    store: &dyn LogStore,
    tenant: &TenantId,
    filter: &AttemptFilter,
    limit: u32,
) -> Vec<Attempt> {
    let what = format!("list_attempts({tenant}, {filter:?}, limit {limit})");
    walk(limit, &what, |page| async move {
        store.list_attempts(tenant, filter, &page).await
    })
    .await
}

fn event_ids(events: &[Event]) -> Vec<&str> {
    events.iter().map(|e| e.id.as_str()).collect()
}

fn newest_first_attempts(attempts: &[Attempt], filter: &AttemptFilter) -> Vec<Attempt> {
    let mut expected: Vec<Attempt> = attempts
        .iter()
        .filter(|a| filter.matches(a))
        .cloned()
        .collect();
    expected.sort_by_key(|a| std::cmp::Reverse((a.time, a.id)));
    expected
}
