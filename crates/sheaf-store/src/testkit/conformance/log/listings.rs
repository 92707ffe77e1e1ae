//! Listings newest first, their filters, and cursor pagination (also under concurrent inserts).

use super::*;

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
        Attempt {
            status: AttemptStatus::Filtered,
            response_code: None,
            response_body: None,
            ..attempt(&eb, d1, at(15))
        },
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
            status: Some(AttemptStatus::Filtered),
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
