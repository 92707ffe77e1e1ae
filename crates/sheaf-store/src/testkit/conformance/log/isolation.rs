//! Tenant isolation on every read.

use super::*;

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
