//! [`EntityStore`] conformance: tenant upserts, destination CRUD and patches, tenant scoping,
//! secret rotation, and cascading tenant deletion.

use std::collections::BTreeMap;
use std::time::Duration;

use super::assert_kind;
use crate::testkit::fixtures::{destination, secret, unique_tenant};
use crate::{
    Destination, DestinationId, DestinationPatch, DisabledReason, EntityStore, ErrorKind, Filter,
    PreviousSecret, TenantId, Timestamp, Topics,
};

fn metadata(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

pub(super) async fn make_tenant(store: &dyn EntityStore, label: &str) -> TenantId {
    let tenant = unique_tenant(label);
    store
        .upsert_tenant(&tenant, &BTreeMap::new())
        .await
        .expect("upsert_tenant failed");
    tenant
}

pub(super) async fn get(
    store: &dyn EntityStore,
    tenant: &TenantId,
    id: &DestinationId,
) -> Option<Destination> {
    store
        .get_destination(tenant, id)
        .await
        .expect("get_destination failed")
}

/// Checks what a mutation returned: `expected` in every field but `updated_at`, which must not
/// go back; and a fresh read returns the same.
pub(super) async fn check_mutation(
    store: &dyn EntityStore,
    returned: &Destination,
    expected: &Destination,
    what: &str,
) {
    assert!(
        returned.updated_at >= expected.updated_at,
        "{what}: updated_at went back"
    );
    let expected = Destination {
        updated_at: returned.updated_at,
        ..expected.clone()
    };
    assert_eq!(returned, &expected, "{what}: the returned destination");
    let read = get(store, &returned.tenant_id, &returned.id).await;
    assert_eq!(
        read.as_ref(),
        Some(returned),
        "{what}: a fresh read must match what was returned"
    );
}

/// Upsert creates, then updates the metadata keeping `created_at`; delete removes, and deleting
/// again is `NotFound`.
pub async fn tenant_upsert_get_delete(store: &dyn EntityStore) {
    let tenant = unique_tenant("entity-tenant");
    assert_eq!(store.get_tenant(&tenant).await.expect("get_tenant"), None);
    let first = store
        .upsert_tenant(&tenant, &metadata(&[("plan", "pro")]))
        .await
        .expect("upsert");
    assert!(first.created, "the first upsert creates");
    assert_eq!(first.tenant.id, tenant);
    assert_eq!(first.tenant.metadata, metadata(&[("plan", "pro")]));
    assert!(first.tenant.created_at <= first.tenant.updated_at);
    assert_eq!(
        store.get_tenant(&tenant).await.expect("get_tenant"),
        Some(first.tenant.clone())
    );

    let meta = metadata(&[("plan", "enterprise"), ("region", "eu ✓")]);
    let second = store.upsert_tenant(&tenant, &meta).await.expect("upsert");
    assert!(!second.created, "a second upsert updates");
    assert_eq!(second.tenant.metadata, meta);
    assert_eq!(
        second.tenant.created_at, first.tenant.created_at,
        "an update keeps created_at"
    );
    assert!(second.tenant.updated_at >= first.tenant.updated_at);
    assert_eq!(
        store.get_tenant(&tenant).await.expect("get_tenant"),
        Some(second.tenant)
    );

    store
        .delete_tenant(&tenant)
        .await
        .expect("delete_tenant failed");
    assert_eq!(store.get_tenant(&tenant).await.expect("get_tenant"), None);
    assert_kind(
        store.delete_tenant(&tenant).await,
        ErrorKind::NotFound,
        "deleting a deleted tenant",
    );
    let again = store
        .upsert_tenant(&tenant, &BTreeMap::new())
        .await
        .expect("upsert");
    assert!(again.created, "upserting a deleted tenant creates it anew");
    store
        .delete_tenant(&tenant)
        .await
        .expect("delete_tenant failed");
}

/// Destinations round-trip exactly, list oldest first, conflict on a taken id, and every
/// operation on one that does not exist is `NotFound`.
pub async fn destination_crud(store: &dyn EntityStore) {
    let tenant = make_tenant(store, "entity-crud").await;
    let first = Destination {
        topics: Topics::from_list(vec!["order.paid".to_owned(), "order.created".to_owned()])
            .expect("valid topics"),
        ..destination(&tenant)
    };
    store
        .create_destination(&first)
        .await
        .expect("create_destination failed");
    assert_eq!(
        get(store, &tenant, &first.id).await,
        Some(first.clone()),
        "a destination round-trips"
    );
    assert_kind(
        store.create_destination(&first).await,
        ErrorKind::Conflict,
        "creating a taken id",
    );

    let second = Destination {
        topics: Topics::All,
        enabled: false,
        disabled_reason: Some(DisabledReason {
            reason: "created disabled".to_owned(),
            since: Timestamp::now(),
            automatic: false,
        }),
        consecutive_failures: 7,
        headers: BTreeMap::new(),
        previous_secret: Some(PreviousSecret {
            secret: secret(),
            expires_at: Timestamp::now().saturating_add(Duration::from_secs(3600)),
        }),
        ..destination(&tenant)
    };
    store
        .create_destination(&second)
        .await
        .expect("create_destination failed");
    assert_eq!(get(store, &tenant, &second.id).await, Some(second.clone()));
    let listed = store
        .list_destinations(&tenant)
        .await
        .expect("list_destinations");
    assert_eq!(
        listed,
        vec![first.clone(), second.clone()],
        "destinations list oldest first"
    );

    store
        .delete_destination(&tenant, &first.id)
        .await
        .expect("delete_destination failed");
    assert_eq!(get(store, &tenant, &first.id).await, None);
    assert_kind(
        store.delete_destination(&tenant, &first.id).await,
        ErrorKind::NotFound,
        "deleting a deleted destination",
    );
    let listed = store
        .list_destinations(&tenant)
        .await
        .expect("list_destinations");
    assert_eq!(listed, vec![second.clone()]);

    let missing = DestinationId::generate();
    assert_kind(
        store
            .update_destination(&tenant, &missing, &DestinationPatch::enabled(true))
            .await,
        ErrorKind::NotFound,
        "patching a missing destination",
    );
    assert_kind(
        store
            .rotate_secret(&tenant, &missing, &secret(), Timestamp::now())
            .await,
        ErrorKind::NotFound,
        "rotating a missing destination's secret",
    );
    let orphan = destination(&unique_tenant("entity-crud-missing"));
    assert_kind(
        store.create_destination(&orphan).await,
        ErrorKind::NotFound,
        "creating a destination for a missing tenant",
    );
    assert!(
        store
            .list_destinations(&orphan.tenant_id)
            .await
            .expect("list")
            .is_empty()
    );
    store
        .delete_tenant(&tenant)
        .await
        .expect("delete_tenant failed");
}

/// A payload filter comes back as given (operators, nested paths, fractional numbers, non-ASCII
/// text), a patch replaces it or clears it, and a patch that does not name it keeps it.
pub async fn destination_filters_are_kept_replaced_and_cleared(store: &dyn EntityStore) {
    let tenant = make_tenant(store, "entity-filter").await;
    let parse = |json: serde_json::Value| Filter::parse(json).expect("a valid filter");
    let first = parse(serde_json::json!({
        "topic": { "$in": ["order.paid", "order.refunded"] },
        "data": {
            "total": { "$gte": 99.5 },
            "customer": { "country": "Österreich" },
            "$or": [{ "tags": "vip" }, { "items": { "sku": { "$exists": true } } }],
        },
    }));
    let original = Destination {
        filter: Some(first.clone()),
        ..destination(&tenant)
    };
    store
        .create_destination(&original)
        .await
        .expect("create_destination failed");
    let read = get(store, &tenant, &original.id).await.expect("created");
    assert_eq!(read.filter.as_ref(), Some(&first), "the filter as created");
    assert_eq!(
        read.filter.as_ref().map(Filter::source),
        Some(first.source())
    );

    let url = DestinationPatch {
        config: Some(serde_json::json!({ "url": "https://example.org/filtered" })),
        ..Default::default()
    };
    let after_url = store
        .update_destination(&tenant, &original.id, &url)
        .await
        .expect("patch url");
    let expected = Destination {
        config: serde_json::json!({ "url": "https://example.org/filtered" }),
        ..original.clone()
    };
    check_mutation(
        store,
        &after_url,
        &expected,
        "a patch that does not name the filter",
    )
    .await;

    let second = parse(serde_json::json!({ "data": { "kind": { "$neq": "test" } } }));
    let replace = DestinationPatch {
        filter: Some(Some(second.clone())),
        ..Default::default()
    };
    let replaced = store
        .update_destination(&tenant, &original.id, &replace)
        .await
        .expect("patch filter");
    let expected = Destination {
        filter: Some(second),
        ..after_url.clone()
    };
    check_mutation(store, &replaced, &expected, "replacing the filter").await;

    let clear = DestinationPatch {
        filter: Some(None),
        ..Default::default()
    };
    let cleared = store
        .update_destination(&tenant, &original.id, &clear)
        .await
        .expect("clear filter");
    let expected = Destination {
        filter: None,
        ..replaced.clone()
    };
    check_mutation(store, &cleared, &expected, "clearing the filter").await;
    let listed = store
        .list_destinations(&tenant)
        .await
        .expect("list_destinations failed");
    assert_eq!(listed, vec![cleared], "the listing agrees");
    store
        .delete_tenant(&tenant)
        .await
        .expect("delete_tenant failed");
}

/// A patch changes exactly the fields it names, atomically, and moves `updated_at` forward.
pub async fn destination_patch_changes_only_given_fields(store: &dyn EntityStore) {
    let tenant = make_tenant(store, "entity-patch").await;
    let original = destination(&tenant);
    store
        .create_destination(&original)
        .await
        .expect("create_destination failed");

    let url = DestinationPatch {
        config: Some(serde_json::json!({ "url": "https://example.org/v2" })),
        ..Default::default()
    };
    let after_url = store
        .update_destination(&tenant, &original.id, &url)
        .await
        .expect("patch url");
    let expected = Destination {
        config: serde_json::json!({ "url": "https://example.org/v2" }),
        ..original.clone()
    };
    check_mutation(store, &after_url, &expected, "patching the url").await;

    let topics = Topics::from_list(vec!["invoice.paid".to_owned()]).expect("valid topics");
    let headers = BTreeMap::from([
        ("x-one".to_owned(), "1".to_owned()),
        ("x-two".to_owned(), "2".to_owned()),
    ]);
    let both = DestinationPatch {
        topics: Some(topics.clone()),
        headers: Some(headers.clone()),
        ..Default::default()
    };
    let after_both = store
        .update_destination(&tenant, &original.id, &both)
        .await
        .expect("patch");
    let expected = Destination {
        topics,
        headers,
        ..after_url.clone()
    };
    check_mutation(store, &after_both, &expected, "patching topics and headers").await;

    let disable = DestinationPatch::enabled(false);
    let disabled = store
        .update_destination(&tenant, &original.id, &disable)
        .await
        .expect("disable");
    check_mutation(
        store,
        &disabled,
        &Destination {
            enabled: false,
            disabled_reason: disable.disabled_reason.clone(),
            ..after_both.clone()
        },
        "disabling",
    )
    .await;
    assert!(disabled.disabled_reason.is_some(), "disabling says why");
    let enabled = store
        .update_destination(&tenant, &original.id, &DestinationPatch::enabled(true))
        .await
        .expect("enable");
    check_mutation(
        store,
        &enabled,
        &Destination {
            enabled: true,
            disabled_reason: None,
            ..disabled.clone()
        },
        "enabling clears the reason",
    )
    .await;

    let nothing = store
        .update_destination(&tenant, &original.id, &DestinationPatch::default())
        .await
        .expect("empty patch");
    check_mutation(store, &nothing, &enabled, "an empty patch").await;
    store
        .delete_tenant(&tenant)
        .await
        .expect("delete_tenant failed");
}

/// A destination is reachable only through its own tenant; its id is taken in every tenant.
pub async fn destinations_are_tenant_scoped(store: &dyn EntityStore) {
    let owner = make_tenant(store, "entity-scope-owner").await;
    let other = make_tenant(store, "entity-scope-other").await;
    let d = destination(&owner);
    store
        .create_destination(&d)
        .await
        .expect("create_destination failed");

    assert_eq!(
        get(store, &other, &d.id).await,
        None,
        "another tenant cannot read it"
    );
    assert!(
        store
            .list_destinations(&other)
            .await
            .expect("list")
            .is_empty(),
        "nor list it"
    );
    assert_kind(
        store
            .update_destination(&other, &d.id, &DestinationPatch::enabled(false))
            .await,
        ErrorKind::NotFound,
        "patching through another tenant",
    );
    assert_kind(
        store
            .rotate_secret(&other, &d.id, &secret(), Timestamp::now())
            .await,
        ErrorKind::NotFound,
        "rotating through another tenant",
    );
    assert_kind(
        store.delete_destination(&other, &d.id).await,
        ErrorKind::NotFound,
        "deleting through another tenant",
    );
    assert_eq!(
        get(store, &owner, &d.id).await,
        Some(d.clone()),
        "the owner's destination is untouched"
    );
    let copy = Destination {
        tenant_id: other.clone(),
        ..d.clone()
    };
    assert_kind(
        store.create_destination(&copy).await,
        ErrorKind::Conflict,
        "reusing an id in another tenant",
    );
    store
        .delete_tenant(&owner)
        .await
        .expect("delete_tenant failed");
    store
        .delete_tenant(&other)
        .await
        .expect("delete_tenant failed");
}

/// Rotation makes the new secret current and keeps the replaced one with its expiry; a second
/// rotation replaces the previous secret.
pub async fn secret_rotation_keeps_the_previous_secret(store: &dyn EntityStore) {
    let tenant = make_tenant(store, "entity-rotate").await;
    let original = destination(&tenant);
    store
        .create_destination(&original)
        .await
        .expect("create_destination failed");

    let (s1, expires1) = (
        secret(),
        Timestamp::now().saturating_add(Duration::from_secs(86_400)),
    );
    let rotated = store
        .rotate_secret(&tenant, &original.id, &s1, expires1)
        .await
        .expect("rotate");
    let expected = Destination {
        secret: s1.clone(),
        previous_secret: Some(PreviousSecret {
            secret: original.secret.clone(),
            expires_at: expires1,
        }),
        ..original.clone()
    };
    check_mutation(store, &rotated, &expected, "the first rotation").await;
    assert_eq!(
        rotated.signing_secrets(Timestamp::now()),
        vec![&s1, &original.secret]
    );

    let (s2, expires2) = (
        secret(),
        Timestamp::now().saturating_add(Duration::from_secs(3600)),
    );
    let again = store
        .rotate_secret(&tenant, &original.id, &s2, expires2)
        .await
        .expect("rotate");
    let expected = Destination {
        secret: s2.clone(),
        previous_secret: Some(PreviousSecret {
            secret: s1.clone(),
            expires_at: expires2,
        }),
        ..rotated.clone()
    };
    check_mutation(store, &again, &expected, "the second rotation").await;
    store
        .delete_tenant(&tenant)
        .await
        .expect("delete_tenant failed");
}

/// Deleting a tenant deletes its destinations with it (they do not come back when the tenant is
/// created again, and their ids are free) and leaves other tenants' alone.
pub async fn deleting_a_tenant_removes_its_destinations(store: &dyn EntityStore) {
    let tenant = make_tenant(store, "entity-cascade").await;
    let bystander = make_tenant(store, "entity-cascade-other").await;
    let (d1, d2, kept) = (
        destination(&tenant),
        destination(&tenant),
        destination(&bystander),
    );
    for d in [&d1, &d2, &kept] {
        store
            .create_destination(d)
            .await
            .expect("create_destination failed");
    }
    store
        .delete_tenant(&tenant)
        .await
        .expect("delete_tenant failed");
    assert_eq!(store.get_tenant(&tenant).await.expect("get_tenant"), None);
    assert_eq!(get(store, &tenant, &d1.id).await, None);
    assert!(
        store
            .list_destinations(&tenant)
            .await
            .expect("list")
            .is_empty()
    );

    store
        .upsert_tenant(&tenant, &BTreeMap::new())
        .await
        .expect("upsert_tenant failed");
    assert!(
        store
            .list_destinations(&tenant)
            .await
            .expect("list")
            .is_empty(),
        "destinations stay deleted"
    );
    store
        .create_destination(&d1)
        .await
        .expect("a deleted destination's id is free again");
    assert_eq!(
        get(store, &bystander, &kept.id).await,
        Some(kept),
        "other tenants keep theirs"
    );
    store
        .delete_tenant(&tenant)
        .await
        .expect("delete_tenant failed");
    store
        .delete_tenant(&bystander)
        .await
        .expect("delete_tenant failed");
}
