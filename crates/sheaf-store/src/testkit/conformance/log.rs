//! [`LogStore`] conformance: idempotent inserts, exact round trips, listings and their cursors,
//! tenant isolation, and the latest-attempt rules.
//!
//! Longer than 600 lines because the conformance cases read best side by side: one function per
//! rule of the [`LogStore`] contract.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use serde_json::json;

use super::assert_kind;
use crate::testkit::fixtures::{ago, attempt, event, event_id, shift, unique_tenant};
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

/// The same event or attempt written twice in one call, again in later calls, and in calls with
/// only events or only attempts, is stored once.
pub async fn insert_many_is_idempotent(store: &dyn LogStore) {
    let tenant = unique_tenant("log-idempotent");
    let t = base_time();
    let e1 = event(&tenant, "order-1", "order.created", shift(t, SECOND));
    let e2 = event(&tenant, "order-2", "order.created", shift(t, 2 * SECOND));
    let (d1, d2) = (DestinationId::generate(), DestinationId::generate());
    let a1 = attempt(&e1, d1, shift(t, 3 * SECOND));
    let a2 = attempt(&e1, d2, shift(t, 4 * SECOND));

    insert(
        store,
        &[e1.clone(), e1.clone(), e2.clone()],
        &[a1.clone(), a2.clone(), a1.clone()],
    )
    .await;
    insert(store, &[e2.clone(), e1.clone()], std::slice::from_ref(&a2)).await;
    insert(store, &[], &[a1.clone(), a1.clone()]).await;
    insert(store, std::slice::from_ref(&e1), &[]).await;
    insert(store, &[], &[]).await;

    let got = store
        .get_event(&tenant, &e1.id)
        .await
        .expect("get_event failed");
    assert_eq!(
        got.as_ref(),
        Some(&e1),
        "get_event after duplicated inserts"
    );
    let events = all_events(store, &tenant, &EventFilter::default(), 10).await;
    assert_eq!(
        events,
        vec![e2, e1.clone()],
        "each event is listed once, newest first"
    );
    let attempts = all_attempts(store, &tenant, &AttemptFilter::default(), 10).await;
    assert_eq!(
        attempts,
        vec![a2.clone(), a1.clone()],
        "each attempt is listed once, newest first"
    );
    let by_event = AttemptFilter {
        event_id: Some(e1.id.clone()),
        ..Default::default()
    };
    assert_eq!(all_attempts(store, &tenant, &by_event, 1).await.len(), 2);

    let latest = store
        .latest_attempts(&[a1.key(), a2.key()])
        .await
        .expect("latest_attempts");
    assert_eq!(latest.get(&a1.key()), Some(&a1));
    assert_eq!(latest.get(&a2.key()), Some(&a2));
    assert_eq!(latest.len(), 2);
}

/// `get_events` answers exactly the stored keys, each with its own tenant's event, once per
/// distinct key.
pub async fn get_events_returns_only_stored_keys(store: &dyn LogStore) {
    let (ta, tb) = (
        unique_tenant("log-get-events-a"),
        unique_tenant("log-get-events-b"),
    );
    let t = base_time();
    let shared_a = event(&ta, "shared", "order.created", t);
    let shared_b = event(&tb, "shared", "order.created", shift(t, SECOND));
    let only_a = event(&ta, "only-a", "order.paid", shift(t, 2 * SECOND));
    insert(
        store,
        &[shared_a.clone(), shared_b.clone(), only_a.clone()],
        &[],
    )
    .await;

    let key = |tenant: &TenantId, id: &str| EventKey {
        tenant_id: tenant.clone(),
        event_id: event_id(id),
    };
    let keys = [
        key(&ta, "shared"),
        key(&tb, "shared"),
        key(&ta, "only-a"),
        key(&tb, "only-a"),
        key(&ta, "missing"),
        key(&ta, "shared"),
    ];
    let found = store.get_events(&keys).await.expect("get_events failed");
    let expected = HashMap::from([
        (key(&ta, "shared"), shared_a.clone()),
        (key(&tb, "shared"), shared_b),
        (key(&ta, "only-a"), only_a),
    ]);
    assert_eq!(
        found, expected,
        "get_events must answer stored keys only, per tenant"
    );
    assert!(
        store
            .get_events(&[])
            .await
            .expect("get_events(&[])")
            .is_empty()
    );
    assert_eq!(
        store
            .get_event(&tb, &event_id("only-a"))
            .await
            .expect("get_event"),
        None
    );
    assert_eq!(
        store
            .get_event(&ta, &event_id("shared"))
            .await
            .expect("get_event"),
        Some(shared_a)
    );
}

/// Every field of events and attempts comes back exactly as written: microsecond times, nested
/// and unusual JSON, optional fields both set and unset.
pub async fn records_round_trip_exactly(store: &dyn LogStore) {
    let tenant = unique_tenant("log-round-trip");
    let whole_second = base_time().as_micros() / SECOND * SECOND;
    let t = Timestamp::from_micros(whole_second + 123_457).expect("in range");

    let mut rich = event(&tenant, "rich:1~a@b+c=d", "billing.invoice.paid", t);
    rich.data = Payload::new(json!({
        "text": "quote \" backslash \\ newline \n tab \t ü 雪 😀",
        "float": 1.5,
        "negative": -2.25,
        "big": u64::MAX,
        "small": i64::MIN,
        "none": null,
        "yes": true,
        "nested": {"list": [[], {}, [1, "two", 3.5]], "empty": ""},
    }));
    let mut list = event(&tenant, "list", "t", shift(t, 1));
    list.data = Payload::new(json!([1, 2, 3]));
    let mut null = event(&tenant, "null", "t", shift(t, 999_999));
    null.data = Payload::new(json!(null));

    let full = Attempt {
        number: 7,
        status: AttemptStatus::Success,
        trigger: AttemptTrigger::Manual,
        response_code: Some(299),
        duration_ms: 1234,
        response_body: Some("ok ✓ \"quoted\"\n".to_owned()),
        error: None,
        ..attempt(&rich, DestinationId::generate(), shift(t, 1))
    };
    let bare = Attempt {
        response_code: None,
        duration_ms: 0,
        response_body: None,
        error: Some("connection refused".to_owned()),
        ..attempt(&null, DestinationId::generate(), shift(t, 2))
    };
    insert(
        store,
        &[rich.clone(), list.clone(), null.clone()],
        &[full.clone(), bare.clone()],
    )
    .await;

    for e in [&rich, &list, &null] {
        let got = store
            .get_event(&tenant, &e.id)
            .await
            .expect("get_event failed");
        assert_eq!(
            got.as_ref(),
            Some(e),
            "event {} must round-trip exactly",
            e.id
        );
    }
    for a in [&full, &bare] {
        let got = store
            .get_attempt(&tenant, &a.id)
            .await
            .expect("get_attempt failed");
        assert_eq!(
            got.as_ref(),
            Some(a),
            "attempt {} must round-trip exactly",
            a.id
        );
        let latest = store
            .latest_attempt(&a.key())
            .await
            .expect("latest_attempt failed");
        assert_eq!(
            latest.as_ref(),
            Some(a),
            "latest_attempt must return the attempt exactly"
        );
    }
    let events = all_events(store, &tenant, &EventFilter::default(), 100).await;
    assert_eq!(
        events,
        vec![null, list, rich],
        "listed events must round-trip exactly"
    );
    let attempts = all_attempts(store, &tenant, &AttemptFilter::default(), 100).await;
    assert_eq!(
        attempts,
        vec![bare, full],
        "listed attempts must round-trip exactly"
    );
    assert_eq!(
        store
            .get_event(&tenant, &event_id("absent"))
            .await
            .expect("get_event"),
        None
    );
    assert_eq!(
        store
            .get_attempt(&tenant, &AttemptId::generate())
            .await
            .expect("get_attempt"),
        None
    );
}

/// Events are listed newest first by `(time, id)`, ids compared bytewise, and every filter
/// narrows as documented (`since` inclusive, `until` exclusive).
pub async fn list_events_orders_newest_first_and_filters(store: &dyn LogStore) {
    let tenant = unique_tenant("log-list-events");
    let other = unique_tenant("log-list-events-other");
    let t = base_time();
    let at = |s: i64| shift(t, s * SECOND);
    let events = [
        event(&tenant, "B1", "order.created", at(10)),
        event(&tenant, "a1", "order.created", at(10)),
        event(&tenant, "a-2", "order.paid", at(10)),
        event(&tenant, "_x", "order.paid", at(10)),
        event(&tenant, "z9", "order.created", at(5)),
        event(&tenant, "old", "order.paid", at(0)),
        event(&tenant, "new", "order.created", at(20)),
    ];
    insert(store, &events, &[]).await;
    insert(store, &[event(&other, "a1", "order.created", at(10))], &[]).await;

    let range = |since: Option<i64>, until: Option<i64>| TimeRange {
        since: since.map(at),
        until: until.map(at),
    };
    let topic = |t: &str| Some(t.to_owned());
    let cases: Vec<(EventFilter, Vec<&str>)> = vec![
        // Bytewise: "a1" > "a-2" ('1' > '-') > "_x" ('a' > '_') > "B1" ('_' > 'B').
        (
            EventFilter::default(),
            vec!["new", "a1", "a-2", "_x", "B1", "z9", "old"],
        ),
        (
            EventFilter {
                topic: topic("order.paid"),
                ..Default::default()
            },
            vec!["a-2", "_x", "old"],
        ),
        (
            EventFilter {
                time: range(Some(10), None),
                ..Default::default()
            },
            vec!["new", "a1", "a-2", "_x", "B1"],
        ),
        (
            EventFilter {
                time: range(None, Some(10)),
                ..Default::default()
            },
            vec!["z9", "old"],
        ),
        (
            EventFilter {
                time: range(Some(5), Some(20)),
                ..Default::default()
            },
            vec!["a1", "a-2", "_x", "B1", "z9"],
        ),
        (
            EventFilter {
                topic: topic("order.created"),
                time: range(Some(10), None),
            },
            vec!["new", "a1", "B1"],
        ),
        (
            EventFilter {
                time: range(Some(10), Some(10)),
                ..Default::default()
            },
            vec![],
        ),
        (
            EventFilter {
                time: range(Some(20), Some(5)),
                ..Default::default()
            },
            vec![],
        ),
        (
            EventFilter {
                topic: topic("no.such.topic"),
                ..Default::default()
            },
            vec![],
        ),
    ];
    for (filter, expected) in cases {
        for limit in [3, 1000] {
            let got = all_events(store, &tenant, &filter, limit).await;
            assert_eq!(
                event_ids(&got),
                expected,
                "list_events with {filter:?}, limit {limit}"
            );
        }
    }
}

/// Attempts are listed newest first by `(time, id)` and every filter narrows as documented.
pub async fn list_attempts_orders_newest_first_and_filters(store: &dyn LogStore) {
    let tenant = unique_tenant("log-list-attempts");
    let other = unique_tenant("log-list-attempts-other");
    let t = base_time();
    let at = |s: i64| shift(t, s * SECOND);
    let ea = event(&tenant, "ea", "order.created", t);
    let eb = event(&tenant, "eb", "order.paid", t);
    let (d1, d2) = (DestinationId::generate(), DestinationId::generate());
    let success = |a: Attempt| Attempt {
        status: AttemptStatus::Success,
        response_code: Some(200),
        ..a
    };
    let attempts = vec![
        attempt(&ea, d1, at(0)),
        success(attempt(&ea, d1, at(10))),
        attempt(&ea, d2, at(10)),
        attempt(&eb, d1, at(5)),
        success(attempt(&eb, d2, at(20))),
    ];
    insert(store, &[ea.clone(), eb.clone()], &attempts).await;
    let foreign = event(&other, "ea", "order.created", t);
    insert(
        store,
        std::slice::from_ref(&foreign),
        &[attempt(&foreign, d1, at(10))],
    )
    .await;

    let filters = [
        AttemptFilter::default(),
        AttemptFilter {
            event_id: Some(ea.id.clone()),
            ..Default::default()
        },
        AttemptFilter {
            destination_id: Some(d1),
            ..Default::default()
        },
        AttemptFilter {
            status: Some(AttemptStatus::Failed),
            ..Default::default()
        },
        AttemptFilter {
            status: Some(AttemptStatus::Success),
            ..Default::default()
        },
        AttemptFilter {
            topic: Some("order.paid".to_owned()),
            ..Default::default()
        },
        AttemptFilter {
            time: TimeRange {
                since: Some(at(5)),
                until: Some(at(20)),
            },
            ..Default::default()
        },
        AttemptFilter {
            event_id: Some(ea.id.clone()),
            destination_id: Some(d1),
            status: Some(AttemptStatus::Failed),
            ..Default::default()
        },
        AttemptFilter {
            event_id: Some(event_id("no-such-event")),
            ..Default::default()
        },
        AttemptFilter {
            destination_id: Some(DestinationId::generate()),
            ..Default::default()
        },
    ];
    for filter in filters {
        let expected = newest_first_attempts(&attempts, &filter);
        for limit in [2, 1000] {
            let got = all_attempts(store, &tenant, &filter, limit).await;
            assert_eq!(
                got, expected,
                "list_attempts with {filter:?}, limit {limit}"
            );
        }
    }
    let combined = AttemptFilter {
        event_id: Some(ea.id.clone()),
        destination_id: Some(d1),
        status: Some(AttemptStatus::Failed),
        ..Default::default()
    };
    assert_eq!(
        all_attempts(store, &tenant, &combined, 10).await,
        vec![attempts[0].clone()]
    );
}

/// Walking a listing with any page size visits every item exactly once, in order, including
/// across runs of equal times, and the last page has no next cursor, even when it is full.
pub async fn pagination_visits_every_item_once(store: &dyn LogStore) {
    let tenant = unique_tenant("log-paging");
    let t = base_time();
    // Groups of four share a time, so page boundaries fall inside runs of equal times.
    let events: Vec<Event> = (0..23)
        .map(|i| {
            event(
                &tenant,
                &format!("p{i:02}"),
                "page.test",
                shift(t, (i / 4) * SECOND),
            )
        })
        .collect();
    let d = DestinationId::generate();
    let attempts: Vec<Attempt> = (0..13)
        .map(|i| attempt(&events[0], d, shift(t, (i / 3) * SECOND)))
        .collect();
    insert(store, &events, &attempts).await;

    let mut expected_events = events.clone();
    expected_events.sort_by(|a, b| (b.time, &b.id).cmp(&(a.time, &a.id)));
    for limit in [1, 2, 4, 5, 22, 23, 24, 1000] {
        let got = all_events(store, &tenant, &EventFilter::default(), limit).await;
        assert_eq!(
            event_ids(&got),
            event_ids(&expected_events),
            "events with limit {limit}"
        );
    }
    let full = store
        .list_events(&tenant, &EventFilter::default(), &PageRequest::first(23))
        .await
        .expect("list_events failed");
    assert_eq!(full.items.len(), 23);
    assert_eq!(
        full.next, None,
        "a full page holding the last item must not have a next cursor"
    );

    let expected_attempts = newest_first_attempts(&attempts, &AttemptFilter::default());
    for limit in [1, 3, 12, 13, 100] {
        let got = all_attempts(store, &tenant, &AttemptFilter::default(), limit).await;
        assert_eq!(got, expected_attempts, "attempts with limit {limit}");
    }
}

/// Page limits outside 1..=1000 and cursors whose id cannot belong to the listing are
/// `InvalidInput`, not an empty page.
pub async fn pagination_rejects_bad_requests(store: &dyn LogStore) {
    let tenant = unique_tenant("log-bad-pages");
    let events = EventFilter::default();
    let attempts = AttemptFilter::default();
    for limit in [0, MAX_PAGE_LIMIT + 1] {
        let page = PageRequest::first(limit);
        assert_kind(
            store.list_events(&tenant, &events, &page).await,
            ErrorKind::InvalidInput,
            &format!("list_events with limit {limit}"),
        );
        assert_kind(
            store.list_attempts(&tenant, &attempts, &page).await,
            ErrorKind::InvalidInput,
            &format!("list_attempts with limit {limit}"),
        );
    }
    let bad_event_cursor = PageRequest::after(10, Cursor::new(base_time(), "not an id!"));
    assert_kind(
        store.list_events(&tenant, &events, &bad_event_cursor).await,
        ErrorKind::InvalidInput,
        "list_events with a cursor whose id is not an event id",
    );
    let bad_attempt_cursor = PageRequest::after(10, Cursor::new(base_time(), "not-a-uuid"));
    assert_kind(
        store
            .list_attempts(&tenant, &attempts, &bad_attempt_cursor)
            .await,
        ErrorKind::InvalidInput,
        "list_attempts with a cursor whose id is not an attempt id",
    );
}

/// Checks a walk made while inserts went on: strictly descending `(time, id)` (so no repeats),
/// and every id in `must_see` seen.
fn check_walk(seen: &[Event], must_see: &HashSet<String>, what: &str) {
    for pair in seen.windows(2) {
        assert!(
            (pair[0].time, &pair[0].id) > (pair[1].time, &pair[1].id),
            "{what}: {} then {} is not strictly newest first (a repeat or a step back)",
            pair[0].id,
            pair[1].id
        );
    }
    let seen_ids: HashSet<&str> = seen.iter().map(|e| e.id.as_str()).collect();
    let missed: Vec<&String> = must_see
        .iter()
        .filter(|id| !seen_ids.contains(id.as_str()))
        .collect();
    assert!(missed.is_empty(), "{what}: skipped {missed:?}");
}

/// Inserting between pages, newer and older than the cursor and at the cursor's own time on
/// both sides of its id, never makes the walk skip or repeat: items behind the cursor are not
/// seen, items ahead of it are.
pub async fn pagination_survives_interleaved_inserts(store: &dyn LogStore) {
    let tenant = unique_tenant("log-paging-interleaved");
    let t = base_time();
    let pre: Vec<Event> = (0..20)
        .map(|i| {
            event(
                &tenant,
                &format!("pre-{i:02}"),
                "t",
                shift(t, (i - i % 3) * SECOND),
            )
        })
        .collect();
    insert(store, &pre, &[]).await;

    let mut must_see: HashSet<String> = pre.iter().map(|e| e.id.to_string()).collect();
    let mut must_not_see = HashSet::new();
    let mut seen = Vec::new();
    let mut request = PageRequest::first(3);
    for round in 0..100 {
        let page = store
            .list_events(&tenant, &EventFilter::default(), &request)
            .await
            .expect("list_events failed");
        check_page(&page, 3, "interleaved paging");
        let last = page.items.last().cloned();
        seen.extend(page.items);
        let (Some(cursor), Some(last)) = (page.next, last) else {
            break;
        };

        let mut inserted = vec![
            (
                event(
                    &tenant,
                    &format!("newer-{round}"),
                    "t",
                    shift(t, (3600 + round) * SECOND),
                ),
                false,
            ),
            (
                event(
                    &tenant,
                    &format!("older-{round}"),
                    "t",
                    shift(t, -(100 + round) * SECOND),
                ),
                true,
            ),
        ];
        // At the cursor's own time, "zzz" sorts after a "pre" id and "aaa" before it, so the
        // first lands behind the cursor and the second ahead of it.
        if last.id.as_str().starts_with("pre-") {
            inserted.push((
                event(&tenant, &format!("zzz-{round}"), "t", last.time),
                false,
            ));
            inserted.push((
                event(&tenant, &format!("aaa-{round}"), "t", last.time),
                true,
            ));
        }
        for (e, ahead) in &inserted {
            if *ahead {
                must_see.insert(e.id.to_string());
            } else {
                must_not_see.insert(e.id.to_string());
            }
        }
        let batch: Vec<Event> = inserted.into_iter().map(|(e, _)| e).collect();
        insert(store, &batch, &[]).await;
        request = PageRequest::after(3, cursor);
    }
    check_walk(&seen, &must_see, "interleaved paging");
    let wrongly_seen: Vec<&str> = seen
        .iter()
        .map(|e| e.id.as_str())
        .filter(|id| must_not_see.contains(*id))
        .collect();
    assert!(
        wrongly_seen.is_empty(),
        "items inserted behind the cursor were seen: {wrongly_seen:?}"
    );
}

/// Paging while another task inserts concurrently never skips an item that existed before the
/// walk began, nor repeats one.
pub async fn pagination_survives_concurrent_inserts(store: &dyn LogStore) {
    let tenant = unique_tenant("log-paging-concurrent");
    let t = base_time();
    let pre: Vec<Event> = (0..30)
        .map(|i| {
            event(
                &tenant,
                &format!("pre-{i:02}"),
                "t",
                shift(t, (i / 2) * SECOND),
            )
        })
        .collect();
    insert(store, &pre, &[]).await;
    let must_see: HashSet<String> = pre.iter().map(|e| e.id.to_string()).collect();

    let writer = async {
        for i in 0..30i64 {
            // Spread over the listing's whole range, ties with existing times included.
            let time = shift(t, ((i * 7) % 25 - 5) * SECOND);
            let batch = [event(&tenant, &format!("during-{i:02}"), "t", time)];
            store
                .insert_many(&batch, &[])
                .await
                .expect("concurrent insert_many failed");
            tokio::task::yield_now().await;
        }
    };
    let reader = async {
        let mut seen = Vec::new();
        let mut request = PageRequest::first(4);
        loop {
            let page = store
                .list_events(&tenant, &EventFilter::default(), &request)
                .await
                .expect("list_events failed");
            check_page(&page, 4, "concurrent paging");
            seen.extend(page.items);
            match page.next {
                Some(cursor) => request = PageRequest::after(4, cursor),
                None => break seen,
            }
            tokio::task::yield_now().await;
        }
    };
    let ((), seen) = futures::join!(writer, reader);
    check_walk(&seen, &must_see, "concurrent paging");
}

/// No read returns another tenant's record, even when event ids, destination ids and attempt
/// ids coincide across tenants.
pub async fn reads_are_tenant_isolated(store: &dyn LogStore) {
    let (ta, tb) = (
        unique_tenant("log-isolation-a"),
        unique_tenant("log-isolation-b"),
    );
    let empty = unique_tenant("log-isolation-empty");
    let t = base_time();
    let d = DestinationId::generate();
    let ea = event(&ta, "same", "order.created", t);
    let eb = event(&tb, "same", "order.created", shift(t, SECOND));
    let aa = attempt(&ea, d, shift(t, 2 * SECOND));
    // The same attempt id in another tenant is another attempt: identity is (tenant, id).
    let ab = Attempt {
        id: aa.id,
        ..attempt(&eb, d, shift(t, 3 * SECOND))
    };
    insert(store, &[ea.clone(), eb.clone()], &[aa.clone(), ab.clone()]).await;

    assert_eq!(
        store.get_event(&ta, &ea.id).await.expect("get_event"),
        Some(ea.clone())
    );
    assert_eq!(
        store.get_event(&tb, &eb.id).await.expect("get_event"),
        Some(eb.clone())
    );
    assert_eq!(
        store.get_event(&empty, &ea.id).await.expect("get_event"),
        None
    );
    assert_eq!(
        store.get_attempt(&ta, &aa.id).await.expect("get_attempt"),
        Some(aa.clone())
    );
    assert_eq!(
        store.get_attempt(&tb, &aa.id).await.expect("get_attempt"),
        Some(ab.clone())
    );
    assert_eq!(
        store
            .get_attempt(&empty, &aa.id)
            .await
            .expect("get_attempt"),
        None
    );

    assert_eq!(
        all_events(store, &ta, &EventFilter::default(), 10).await,
        vec![ea.clone()]
    );
    assert_eq!(
        all_events(store, &tb, &EventFilter::default(), 10).await,
        vec![eb.clone()]
    );
    assert!(
        all_events(store, &empty, &EventFilter::default(), 10)
            .await
            .is_empty()
    );
    let narrow = AttemptFilter {
        event_id: Some(ea.id.clone()),
        destination_id: Some(d),
        ..Default::default()
    };
    assert_eq!(
        all_attempts(store, &ta, &narrow, 10).await,
        vec![aa.clone()]
    );
    assert_eq!(
        all_attempts(store, &tb, &narrow, 10).await,
        vec![ab.clone()]
    );
    assert!(
        all_attempts(store, &empty, &AttemptFilter::default(), 10)
            .await
            .is_empty()
    );

    // ta's attempt is older than tb's: a lookup that ignored the tenant would return tb's.
    let key_a = AttemptKey {
        attempt_time: t,
        ..aa.key()
    };
    let key_empty = AttemptKey {
        tenant_id: empty.clone(),
        ..key_a.clone()
    };
    assert_eq!(
        store.latest_attempt(&key_a).await.expect("latest_attempt"),
        Some(aa.clone())
    );
    assert_eq!(
        store
            .latest_attempt(&key_empty)
            .await
            .expect("latest_attempt"),
        None
    );
    let late_a = AttemptKey {
        attempt_time: shift(t, 3 * SECOND),
        ..key_a.clone()
    };
    assert_eq!(
        store.latest_attempt(&late_a).await.expect("latest_attempt"),
        None
    );
    let batch = store
        .latest_attempts(&[key_a.clone(), ab.key(), key_empty.clone(), late_a.clone()])
        .await
        .expect("latest_attempts");
    assert_eq!(batch, HashMap::from([(key_a, aa), (ab.key(), ab)]));
}

/// The latest-attempt rules, through both the single and the batched call: newer than the
/// carried time found, an attempt exactly at the carried time found, older ones excluded,
/// absent keys missing, other destinations and other events never matched, duplicated rows
/// counted once.
pub async fn latest_attempt_follows_the_rules(store: &dyn LogStore) {
    let tenant = unique_tenant("log-latest");
    let t = base_time();
    let at = |s: i64| shift(t, s * SECOND);
    let e = event(&tenant, "evt-1", "order.created", t);
    let e2 = event(&tenant, "evt-2", "order.created", t);
    let (d1, d2, d3) = (
        DestinationId::generate(),
        DestinationId::generate(),
        DestinationId::generate(),
    );
    let a1 = attempt(&e, d1, at(0));
    let a2 = attempt(&e, d1, at(10));
    let a3 = Attempt {
        status: AttemptStatus::Success,
        response_code: Some(200),
        ..attempt(&e, d1, at(20))
    };
    let b1 = attempt(&e, d2, at(30));
    let c1 = attempt(&e2, d1, at(40));
    insert(
        store,
        &[e.clone(), e2.clone()],
        &[a1.clone(), a2.clone(), a3.clone(), a3.clone()],
    )
    .await;
    insert(
        store,
        &[],
        &[b1.clone(), c1.clone(), a3.clone(), a2.clone()],
    )
    .await;

    let key = |event: &Event, d: DestinationId, time: Timestamp| AttemptKey {
        tenant_id: tenant.clone(),
        event_id: event.id.clone(),
        destination_id: d,
        attempt_time: time,
    };
    let cases: Vec<(&str, AttemptKey, Option<&Attempt>)> = vec![
        (
            "carried time of the first attempt finds the newest",
            key(&e, d1, at(0)),
            Some(&a3),
        ),
        (
            "carried time between attempts finds the newest",
            key(&e, d1, at(5)),
            Some(&a3),
        ),
        (
            "an attempt exactly at the carried time is found",
            key(&e, d1, at(20)),
            Some(&a3),
        ),
        (
            "attempts older than the carried time are excluded",
            key(&e, d1, shift(at(20), 1)),
            None,
        ),
        (
            "a bound long before everything finds the newest",
            key(&e, d1, at(-3600)),
            Some(&a3),
        ),
        (
            "another destination's newer attempt is not matched",
            key(&e, d1, at(25)),
            None,
        ),
        (
            "each destination gets its own attempt",
            key(&e, d2, at(0)),
            Some(&b1),
        ),
        (
            "another event's newer attempt is not matched",
            key(&e2, d2, at(0)),
            None,
        ),
        (
            "another event's attempt is its own",
            key(&e2, d1, at(0)),
            Some(&c1),
        ),
        (
            "a destination without attempts is missing",
            key(&e, d3, at(0)),
            None,
        ),
        (
            "an event without attempts is missing",
            key(&event(&tenant, "evt-0", "t", t), d1, at(0)),
            None,
        ),
    ];
    for (what, key, expected) in &cases {
        let got = store
            .latest_attempt(key)
            .await
            .expect("latest_attempt failed");
        assert_eq!(got.as_ref(), *expected, "latest_attempt: {what}");
    }
    let mut keys: Vec<AttemptKey> = cases.iter().map(|(_, key, _)| key.clone()).collect();
    keys.extend(keys.clone()); // Every key twice: repeats are answered once.
    let batch = store
        .latest_attempts(&keys)
        .await
        .expect("latest_attempts failed");
    let expected: HashMap<AttemptKey, Attempt> = cases
        .iter()
        .filter_map(|(_, key, expected)| expected.map(|a| (key.clone(), a.clone())))
        .collect();
    assert_eq!(
        batch, expected,
        "latest_attempts must answer each key like latest_attempt"
    );
    assert!(
        store
            .latest_attempts(&[])
            .await
            .expect("latest_attempts(&[])")
            .is_empty()
    );

    let by_pair = AttemptFilter {
        event_id: Some(e.id.clone()),
        destination_id: Some(d1),
        ..Default::default()
    };
    let listed = all_attempts(store, &tenant, &by_pair, 10).await;
    assert_eq!(
        listed,
        vec![a3, a2, a1],
        "a duplicated attempt row is one attempt"
    );
}

/// Attempts of one key with the same time: the greater id (bytewise) is the latest.
pub async fn latest_attempt_breaks_time_ties_by_id(store: &dyn LogStore) {
    let tenant = unique_tenant("log-latest-ties");
    let t = base_time();
    let e = event(&tenant, "tie", "t", t);
    let d = DestinationId::generate();
    let mut ids = [
        AttemptId::generate(),
        AttemptId::generate(),
        AttemptId::generate(),
    ];
    ids.sort();
    let older = Attempt {
        id: ids[2],
        ..attempt(&e, d, shift(t, -SECOND))
    };
    let low = Attempt {
        id: ids[0],
        ..attempt(&e, d, t)
    };
    let high = Attempt {
        id: ids[1],
        ..attempt(&e, d, t)
    };
    // The high one first, so "the last written wins" is not mistaken for the rule.
    insert(
        store,
        std::slice::from_ref(&e),
        &[high.clone(), older.clone(), low.clone()],
    )
    .await;
    let key = AttemptKey {
        attempt_time: shift(t, -2 * SECOND),
        ..low.key()
    };
    assert_eq!(
        store.latest_attempt(&key).await.expect("latest_attempt"),
        Some(high.clone())
    );
    assert_eq!(
        store
            .latest_attempt(&low.key())
            .await
            .expect("latest_attempt"),
        Some(high.clone())
    );
    let batch = store
        .latest_attempts(&[key.clone(), low.key()])
        .await
        .expect("latest_attempts");
    assert_eq!(
        batch,
        HashMap::from([(key, high.clone()), (low.key(), high)])
    );
}

/// A large batch (1,000 keys: many events and destinations, bounds before, at, between and after
/// attempts, repeats and absent keys) agrees with the reference model, and a sample of its keys
/// with the single lookup.
pub async fn latest_attempts_agrees_with_single_lookups(store: &dyn LogStore) {
    let tenant = unique_tenant("log-latest-batch");
    let t = base_time();
    let destinations: Vec<DestinationId> = (0..4).map(|_| DestinationId::generate()).collect();
    let events: Vec<Event> = (0..10)
        .map(|i| event(&tenant, &format!("batch-{i}"), "t", shift(t, i * SECOND)))
        .collect();
    let mut history = Vec::new();
    for (i, e) in events.iter().enumerate() {
        for (j, d) in destinations.iter().enumerate() {
            if (i + j) % 3 == 0 {
                continue; // Some pairs have no attempts at all.
            }
            for k in 0..(1 + (i * j) % 3) {
                let minutes = (i * 7 + j * 3 + k * 11) % 40;
                let time = shift(t, (minutes as i64) * 60 * SECOND);
                history.push(attempt(e, *d, time));
            }
        }
    }
    insert(store, &events, &history).await;

    let mut keys = Vec::with_capacity(1000);
    let mut n = 0i64;
    while keys.len() < 1000 {
        let e = &events[(n % 11) as usize % events.len()];
        let id = if n % 11 == 10 {
            event_id("batch-absent")
        } else {
            e.id.clone()
        };
        let destination = destinations[(n % 4) as usize];
        let bound = shift(t, ((n * 13) % 45 - 2) * 60 * SECOND + (n % 3 - 1));
        keys.push(AttemptKey {
            tenant_id: tenant.clone(),
            event_id: id,
            destination_id: destination,
            attempt_time: bound,
        });
        n += 1;
    }
    // Bounds exactly at attempt times, where `>` and `>=` differ.
    for (i, a) in history.iter().enumerate().step_by(3) {
        keys[i] = a.key();
    }
    let expected = model::latest_attempts(&history, &keys);
    assert!(
        !expected.is_empty() && expected.len() < keys.len(),
        "the case needs hits and misses"
    );
    let batch = store
        .latest_attempts(&keys)
        .await
        .expect("latest_attempts failed");
    if batch != expected {
        for key in &keys {
            assert_eq!(
                batch.get(key),
                expected.get(key),
                "latest_attempts for {key:?}"
            );
        }
        assert_eq!(
            batch.len(),
            expected.len(),
            "latest_attempts answered keys it was not asked"
        );
    }
    for key in keys.iter().step_by(20) {
        let single = store
            .latest_attempt(key)
            .await
            .expect("latest_attempt failed");
        assert_eq!(
            single.as_ref(),
            expected.get(key),
            "latest_attempt for {key:?}"
        );
    }
}
