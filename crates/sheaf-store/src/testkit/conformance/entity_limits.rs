//! [`Destination::rate_limit`], [`Destination::transform`], [`Destination::kind`] and
//! [`Destination::config`] conformance: each is stored as given, kept by patches that do not name
//! it, and replaced (or cleared) by those that do.

use super::entity::{check_mutation, get, make_tenant};
use crate::testkit::fixtures::destination;
use crate::{Destination, DestinationKind, DestinationPatch, EntityStore, RateLimit};

fn limit(per_second: u32) -> RateLimit {
    RateLimit::new(per_second).expect("a valid rate limit")
}

/// A rate limit comes back as created (the highest one too), a patch that does not name it keeps
/// it, `Some(Some(_))` replaces it, `Some(None)` clears it, and the listing agrees.
pub async fn destination_rate_limits_are_kept_replaced_and_cleared(store: &dyn EntityStore) {
    let tenant = make_tenant(store, "entity-rate-limit").await;
    let original = Destination {
        rate_limit: Some(limit(25)),
        ..destination(&tenant)
    };
    store
        .create_destination(&original)
        .await
        .expect("create_destination failed");
    let read = get(store, &tenant, &original.id).await.expect("created");
    assert_eq!(read, original, "the destination as created, with its limit");

    let url = DestinationPatch {
        config: Some(serde_json::json!({ "url": "https://example.org/limited" })),
        ..Default::default()
    };
    let after_url = store
        .update_destination(&tenant, &original.id, &url)
        .await
        .expect("patch url");
    let expected = Destination {
        config: serde_json::json!({ "url": "https://example.org/limited" }),
        ..original.clone()
    };
    check_mutation(
        store,
        &after_url,
        &expected,
        "a patch that does not name the rate limit",
    )
    .await;

    let replace = DestinationPatch {
        rate_limit: Some(Some(limit(RateLimit::MAX))),
        ..Default::default()
    };
    let replaced = store
        .update_destination(&tenant, &original.id, &replace)
        .await
        .expect("patch rate limit");
    let expected = Destination {
        rate_limit: Some(limit(RateLimit::MAX)),
        ..after_url.clone()
    };
    check_mutation(store, &replaced, &expected, "replacing the rate limit").await;

    let clear = DestinationPatch {
        rate_limit: Some(None),
        ..Default::default()
    };
    let cleared = store
        .update_destination(&tenant, &original.id, &clear)
        .await
        .expect("clear rate limit");
    let expected = Destination {
        rate_limit: None,
        ..replaced.clone()
    };
    check_mutation(store, &cleared, &expected, "clearing the rate limit").await;

    // A second destination, created without a limit, stays without one beside the first.
    let unlimited = destination(&tenant);
    store
        .create_destination(&unlimited)
        .await
        .expect("create_destination failed");
    let listed = store
        .list_destinations(&tenant)
        .await
        .expect("list_destinations failed");
    // Listed by id, as the trait says.
    let mut expected = vec![cleared, unlimited];
    expected.sort_by_key(|d| d.id);
    assert_eq!(listed, expected, "the listing agrees");
    store
        .delete_tenant(&tenant)
        .await
        .expect("delete_tenant failed");
}

/// A destination of any type keeps its type name and its `config` exactly as given (nested
/// values, numbers, unicode), a patch of `config` replaces it whole, and other patches keep it.
pub async fn destination_types_and_configs_are_kept_as_given(store: &dyn EntityStore) {
    let tenant = make_tenant(store, "entity-config").await;
    let config = serde_json::json!({
        "url": "amqp://guest:guest@broker.example:5672/%2f",
        "exchange": "événements",
        "routing_key": "orders.#",
        "options": { "priority": 7, "ratio": 0.25, "flags": [true, null, "x"] },
    });
    let original = Destination {
        kind: DestinationKind::new("rabbitmq").expect("a type name"),
        config: config.clone(),
        ..destination(&tenant)
    };
    store
        .create_destination(&original)
        .await
        .expect("create_destination failed");
    let read = get(store, &tenant, &original.id).await.expect("created");
    assert_eq!(read, original, "the type and config as created");

    let headers = DestinationPatch {
        headers: Some(std::collections::BTreeMap::from([(
            "x-a".to_owned(),
            "1".to_owned(),
        )])),
        ..Default::default()
    };
    let after_headers = store
        .update_destination(&tenant, &original.id, &headers)
        .await
        .expect("patch headers");
    assert_eq!(
        after_headers.config, config,
        "a patch without config keeps it"
    );
    assert_eq!(after_headers.kind, original.kind);

    let replaced = serde_json::json!({ "url": "amqp://other.example/", "exchange": "e2" });
    let patch = DestinationPatch {
        config: Some(replaced.clone()),
        ..Default::default()
    };
    let after = store
        .update_destination(&tenant, &original.id, &patch)
        .await
        .expect("patch config");
    let expected = Destination {
        config: replaced,
        ..after_headers.clone()
    };
    check_mutation(store, &after, &expected, "replacing the config").await;
    store
        .delete_tenant(&tenant)
        .await
        .expect("delete_tenant failed");
}

/// A transformation's source and an ordering key come back exactly as created (several lines,
/// quotes, non-ASCII), a patch that does not name them keeps them, `Some(Some(_))` replaces
/// one, `Some(None)` removes it.
pub async fn destination_transforms_are_kept_replaced_and_cleared(store: &dyn EntityStore) {
    let tenant = make_tenant(store, "entity-transform").await;
    let source = "# Slack\n.data | {text: \"Bestellung \\(.id): \\(.total) €\"}\n| with_headers({\"x-a\": \"b\"})";
    let original = Destination {
        transform: Some(source.to_owned()),
        ordering_key: Some("/data/Bestellnummer ü".to_owned()),
        dead_letter_blocks_key: true,
        ..destination(&tenant)
    };
    store
        .create_destination(&original)
        .await
        .expect("create_destination failed");
    let read = get(store, &tenant, &original.id).await.expect("created");
    assert_eq!(
        read, original,
        "the destination as created, with its transformation"
    );

    let paid = crate::Topics::from_list(vec!["order.paid".to_owned()]).expect("a topic");
    let topics = DestinationPatch {
        topics: Some(paid.clone()),
        ..Default::default()
    };
    let kept = store
        .update_destination(&tenant, &original.id, &topics)
        .await
        .expect("patch topics");
    let expected = Destination {
        topics: paid,
        ..original.clone()
    };
    check_mutation(
        store,
        &kept,
        &expected,
        "a patch that does not name the transformation",
    )
    .await;

    let replace = DestinationPatch {
        transform: Some(Some(".data".to_owned())),
        ..Default::default()
    };
    let replaced = store
        .update_destination(&tenant, &original.id, &replace)
        .await
        .expect("patch transform");
    let expected = Destination {
        transform: Some(".data".to_owned()),
        ..kept.clone()
    };
    check_mutation(store, &replaced, &expected, "replacing the transformation").await;

    let clear = DestinationPatch {
        transform: Some(None),
        ..Default::default()
    };
    let cleared = store
        .update_destination(&tenant, &original.id, &clear)
        .await
        .expect("clear transform");
    let expected = Destination {
        transform: None,
        ..replaced.clone()
    };
    check_mutation(store, &cleared, &expected, "removing the transformation").await;

    let reorder = DestinationPatch {
        ordering_key: Some(Some("/data/customer/id".to_owned())),
        dead_letter_blocks_key: Some(false),
        ..Default::default()
    };
    let reordered = store
        .update_destination(&tenant, &original.id, &reorder)
        .await
        .expect("patch ordering");
    let expected = Destination {
        ordering_key: Some("/data/customer/id".to_owned()),
        dead_letter_blocks_key: false,
        ..cleared.clone()
    };
    check_mutation(store, &reordered, &expected, "replacing the ordering key").await;
    let unordered = store
        .update_destination(
            &tenant,
            &original.id,
            &DestinationPatch {
                ordering_key: Some(None),
                ..Default::default()
            },
        )
        .await
        .expect("clear ordering");
    let expected = Destination {
        ordering_key: None,
        ..reordered.clone()
    };
    check_mutation(store, &unordered, &expected, "removing the ordering key").await;
    store
        .delete_tenant(&tenant)
        .await
        .expect("delete_tenant failed");
}
