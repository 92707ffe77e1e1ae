//! [`EntityStore::record_delivery_health`] conformance: consecutive failures counted across
//! calls, disabling at the limit, recovery, and the half-open rule after re-enabling.

use super::assert_kind;
use super::entity::{get, make_tenant};
use crate::testkit::fixtures::destination;
use crate::{
    DeliveryHealth, Destination, DestinationId, DestinationPatch, DisabledReason, EntityStore,
    ErrorKind, HealthChange,
};

fn report(d: &Destination, succeeded: bool, failures_after: u32) -> DeliveryHealth {
    DeliveryHealth {
        tenant_id: d.tenant_id.clone(),
        destination_id: d.id,
        succeeded,
        failures_after,
        last_error: if failures_after > 0 {
            "status 500".to_owned()
        } else {
            String::new()
        },
    }
}

async fn record(
    store: &dyn EntityStore,
    reports: &[DeliveryHealth],
    limit: u32,
) -> Vec<HealthChange> {
    store
        .record_delivery_health(reports, limit)
        .await
        .expect("record_delivery_health failed")
}

async fn failures_of(store: &dyn EntityStore, d: &Destination) -> u32 {
    get(store, &d.tenant_id, &d.id)
        .await
        .expect("the destination exists")
        .consecutive_failures
}

/// Consecutive failures are counted across calls and reset by a success; reaching the limit
/// disables an enabled destination once, with an automatic reason; a success after the limit
/// is a recovery; a re-enabled destination still at the limit is disabled by its next failure.
/// Several destinations go in one call, unknown ones are skipped, bad arguments are refused.
pub async fn delivery_health_disables_and_recovers(store: &dyn EntityStore) {
    let tenant = make_tenant(store, "entity-health").await;
    let (a, b) = (destination(&tenant), destination(&tenant));
    for d in [&a, &b] {
        store
            .create_destination(d)
            .await
            .expect("create_destination failed");
    }
    let limit = 5;
    let missing = Destination {
        id: DestinationId::generate(),
        ..a.clone()
    };
    // Two failures for a, a success then one failure for b, and one for nobody.
    let changes = record(
        store,
        &[
            report(&a, false, 2),
            report(&b, true, 1),
            report(&missing, false, 9),
        ],
        limit,
    )
    .await;
    assert!(changes.is_empty(), "{changes:?}");
    assert_eq!(failures_of(store, &a).await, 2);
    assert_eq!(failures_of(store, &b).await, 1);
    let read = get(store, &tenant, &a.id).await.expect("a exists");
    assert_eq!(
        read.updated_at, a.updated_at,
        "counting alone leaves updated_at"
    );

    // A success resets a's count to the failures after it; then reaching the limit disables.
    assert!(
        record(store, &[report(&a, true, 0)], limit)
            .await
            .is_empty()
    );
    assert_eq!(failures_of(store, &a).await, 0);
    assert!(
        record(store, &[report(&a, false, 4)], limit)
            .await
            .is_empty()
    );
    let changes = record(store, &[report(&a, false, 1)], limit).await;
    let [HealthChange::Disabled(disabled)] = changes.as_slice() else {
        panic!("reaching the limit disables: {changes:?}");
    };
    assert_eq!(disabled.id, a.id);
    assert!(!disabled.enabled);
    assert_eq!(disabled.consecutive_failures, 5);
    let reason = disabled.disabled_reason.clone().expect("a reason");
    assert!(reason.automatic);
    assert_eq!(
        reason.reason,
        DisabledReason::after_failures(5, "status 500", reason.since).reason
    );
    assert!(
        disabled.updated_at > a.updated_at,
        "disabling moves updated_at"
    );
    assert_eq!(get(store, &tenant, &a.id).await.as_ref(), Some(disabled));

    // Disabled already: more failures count, but disable nothing again.
    assert!(
        record(store, &[report(&a, false, 3)], limit)
            .await
            .is_empty()
    );
    assert_eq!(failures_of(store, &a).await, 8);

    // Re-enabled at the limit (half-open): the next failure disables it again.
    store
        .update_destination(&tenant, &a.id, &DestinationPatch::enabled(true))
        .await
        .expect("enable");
    let changes = record(store, &[report(&a, false, 1)], limit).await;
    assert!(
        matches!(changes.as_slice(), [HealthChange::Disabled(d)] if d.id == a.id),
        "a failure after re-enabling disables again: {changes:?}"
    );
    // Re-enabled again, and this time a success: recovered, the count reset.
    store
        .update_destination(&tenant, &a.id, &DestinationPatch::enabled(true))
        .await
        .expect("enable");
    let changes = record(store, &[report(&a, true, 0), report(&b, false, 1)], limit).await;
    let [HealthChange::Recovered(recovered)] = changes.as_slice() else {
        panic!("a success after the limit is a recovery: {changes:?}");
    };
    assert_eq!(recovered.id, a.id);
    assert!(recovered.enabled);
    assert_eq!(recovered.consecutive_failures, 0);
    assert_eq!(failures_of(store, &b).await, 2);
    // Recovered and, by the failures after the success, disabled again: both, in that order.
    store
        .record_delivery_health(&[report(&a, false, 5)], limit)
        .await
        .expect("record");
    store
        .update_destination(&tenant, &a.id, &DestinationPatch::enabled(true))
        .await
        .expect("enable");
    let changes = record(store, &[report(&a, true, 6)], limit).await;
    assert!(
        matches!(
            changes.as_slice(),
            [HealthChange::Recovered(r), HealthChange::Disabled(d)]
                if r.id == a.id && d.id == a.id && d.consecutive_failures == 6
        ),
        "{changes:?}"
    );

    assert_kind(
        store
            .record_delivery_health(&[report(&b, false, 1)], 0)
            .await,
        ErrorKind::InvalidInput,
        "a limit of 0",
    );
    assert_kind(
        store
            .record_delivery_health(&[report(&b, false, 1), report(&b, true, 0)], limit)
            .await,
        ErrorKind::InvalidInput,
        "one destination reported twice",
    );
    assert_eq!(
        failures_of(store, &b).await,
        2,
        "a refused call changes nothing"
    );
    store
        .delete_tenant(&tenant)
        .await
        .expect("delete_tenant failed");
}
