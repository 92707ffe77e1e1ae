//! Writes and reads by key: idempotent inserts, `get_events`, exact round trips.

use super::*;

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

/// A publish's trace context comes back with its event from every read, and with each of its
/// attempts (as their topic and data do), also through the batched lookups; an untraced event
/// and its attempts have none.
pub async fn trace_contexts_round_trip(store: &dyn LogStore) {
    let tenant = unique_tenant("log-trace");
    let t = base_time();
    let with_state = traced_event(&tenant, "with-state", "order.created", t, 1);
    let without_state = traced_event(&tenant, "without-state", "order.created", shift(t, 1), 2);
    let untraced = event(&tenant, "untraced", "order.created", shift(t, 2));
    assert!(
        with_state
            .trace
            .as_ref()
            .is_some_and(|c| c.tracestate().is_some())
    );
    assert!(
        without_state
            .trace
            .as_ref()
            .is_some_and(|c| c.tracestate().is_none())
    );
    let events = [with_state.clone(), without_state.clone(), untraced.clone()];
    let attempts: Vec<Attempt> = events
        .iter()
        .enumerate()
        .map(|(i, e)| attempt(e, DestinationId::generate(), shift(t, SECOND + i as i64)))
        .collect();
    // Events first, attempts in a later call: each read finds the context however it was written.
    insert(store, &events, &[]).await;
    insert(store, &[], &attempts).await;

    for e in &events {
        let got = store.get_event(&tenant, &e.id).await.expect("get_event");
        assert_eq!(
            got.as_ref().map(|g| &g.trace),
            Some(&e.trace),
            "get_event {}",
            e.id
        );
    }
    let keys: Vec<EventKey> = events.iter().map(Event::key).collect();
    let found = store.get_events(&keys).await.expect("get_events");
    for e in &events {
        assert_eq!(found.get(&e.key()), Some(e), "get_events {}", e.id);
    }
    let listed = all_events(store, &tenant, &EventFilter::default(), 2).await;
    assert_eq!(
        listed,
        vec![untraced, without_state, with_state],
        "list_events"
    );

    for a in &attempts {
        let got = store
            .get_attempt(&tenant, &a.id)
            .await
            .expect("get_attempt");
        assert_eq!(got.as_ref(), Some(a), "get_attempt {}", a.event_id);
        let latest = store
            .latest_attempt(&a.key())
            .await
            .expect("latest_attempt");
        assert_eq!(latest.as_ref(), Some(a), "latest_attempt {}", a.event_id);
    }
    let keys: Vec<AttemptKey> = attempts.iter().map(Attempt::key).collect();
    let latest = store.latest_attempts(&keys).await.expect("latest_attempts");
    for a in &attempts {
        assert_eq!(
            latest.get(&a.key()),
            Some(a),
            "latest_attempts {}",
            a.event_id
        );
    }
    let listed = all_attempts(store, &tenant, &AttemptFilter::default(), 2).await;
    let mut expected = attempts.clone();
    expected.reverse();
    assert_eq!(listed, expected, "list_attempts");
}
