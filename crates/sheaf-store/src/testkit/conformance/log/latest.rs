//! The latest-attempt rules: bounds, ties, and the batched lookup against single ones.

use super::*;

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
