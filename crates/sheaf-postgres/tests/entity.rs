//! What the Postgres entity store promises about `record_delivery_health` beyond the shared
//! suite: concurrent reports for the same destinations lose no failure and never deadlock,
//! reports that change nothing write nothing, and counts saturate at the `integer` column. And
//! the two calls of a re-sealing pass: `scan_destinations` pages every tenant's destinations in
//! id order, and `swap_credentials` swaps only what still holds the expected values.

use std::collections::BTreeMap;
use std::sync::Arc;

use sheaf_store::testkit::fixtures::{destination, unique_tenant};
use sheaf_store::{
    CredentialsSwap, DeliveryHealth, Destination, DestinationId, EntityStore, HealthChange, Secret,
    StoredCredentials, TenantId, Timestamp,
};
use sheaf_testenv::require_postgres;

use crate::support::{Gate, TestSchema};

fn report(d: &Destination, succeeded: bool, failures_after: u32, error: &str) -> DeliveryHealth {
    DeliveryHealth {
        tenant_id: d.tenant_id.clone(),
        destination_id: d.id,
        succeeded,
        failures_after,
        last_error: error.to_owned(),
    }
}

async fn tenant_with(store: &dyn EntityStore, prefix: &str, n: usize) -> Vec<Destination> {
    let tenant = unique_tenant(prefix);
    store
        .upsert_tenant(&tenant, &BTreeMap::new())
        .await
        .expect("upsert_tenant");
    let mut destinations = Vec::with_capacity(n);
    for _ in 0..n {
        let d = destination(&tenant);
        store.create_destination(&d).await.expect("create");
        destinations.push(d);
    }
    destinations
}

async fn read(store: &dyn EntityStore, tenant: &TenantId, id: &DestinationId) -> Destination {
    store
        .get_destination(tenant, id)
        .await
        .expect("get_destination")
        .expect("the destination exists")
}

/// The row version (`xmin`) of a destination: it changes exactly when the row is written.
async fn row_version(test: &TestSchema, id: &DestinationId) -> String {
    let mut conn = test.connect().await;
    sqlx::query_scalar(&format!(
        "SELECT xmin::text FROM {} WHERE id = $1",
        test.table("destinations")
    ))
    .bind(id.as_uuid())
    .fetch_one(&mut conn)
    .await
    .expect("read xmin")
}

/// Eight callers, ten calls each, every call one failure for each of six destinations, in
/// orders that differ between callers: each count ends at 80 (a lost update would leave less),
/// every call succeeds (a deadlock would be `Unavailable`), and each destination is disabled
/// exactly once, when its count reaches the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_health_reports_lose_no_failure_and_never_deadlock() {
    let url = require_postgres!("concurrent_health_reports_lose_no_failure_and_never_deadlock");
    let _gate = Gate::shared(&url).await;
    let test = TestSchema::new(&url).await;
    let store: Arc<dyn EntityStore> = test.stores.entity_store();
    let destinations = tenant_with(&*store, "pg-health-race", 6).await;
    let (callers, calls, limit) = (8, 10, 50);
    let tasks: Vec<_> = (0..callers)
        .map(|caller| {
            let store = Arc::clone(&store);
            let mut order = destinations.clone();
            order.rotate_left(caller % destinations.len());
            if caller % 2 == 1 {
                order.reverse();
            }
            tokio::spawn(async move {
                let reports: Vec<DeliveryHealth> = order
                    .iter()
                    .map(|d| report(d, false, 1, "status 503"))
                    .collect();
                let mut changes = Vec::new();
                for _ in 0..calls {
                    changes.extend(
                        store
                            .record_delivery_health(&reports, limit)
                            .await
                            .expect("a concurrent record_delivery_health failed"),
                    );
                }
                changes
            })
        })
        .collect();
    let mut disabled: BTreeMap<DestinationId, u32> = BTreeMap::new();
    for task in tasks {
        for change in task.await.expect("a caller panicked") {
            match change {
                HealthChange::Disabled(d) => {
                    assert_eq!(d.consecutive_failures, limit, "disabled at the limit");
                    *disabled.entry(d.id).or_default() += 1;
                }
                other => panic!("nothing succeeded, so nothing recovers: {other:?}"),
            }
        }
    }
    for d in &destinations {
        let stored = read(&*store, &d.tenant_id, &d.id).await;
        assert_eq!(
            usize::try_from(stored.consecutive_failures).expect("a count fits a usize"),
            callers * calls,
            "every failure counted"
        );
        assert!(!stored.enabled);
        assert_eq!(disabled.get(&d.id), Some(&1), "disabled exactly once");
    }
}

/// The common report, a healthy destination's success with no failures after it, neither locks
/// nor writes its row, and neither does any report that leaves the count and `enabled` as they
/// are below the limit; one that counts writes the row but leaves `updated_at`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_that_change_nothing_write_nothing() {
    let url = require_postgres!("reports_that_change_nothing_write_nothing");
    let _gate = Gate::shared(&url).await;
    let test = TestSchema::new(&url).await;
    let store = test.stores.entity_store();
    let [d] = <[Destination; 1]>::try_from(tenant_with(&*store, "pg-health-noop", 1).await)
        .expect("one destination");
    let created = row_version(&test, &d.id).await;
    let changes = store
        .record_delivery_health(&[report(&d, true, 0, "")], 5)
        .await
        .expect("record");
    assert!(changes.is_empty());
    assert_eq!(
        row_version(&test, &d.id).await,
        created,
        "a healthy report wrote the row"
    );

    store
        .record_delivery_health(&[report(&d, false, 2, "timeout")], 5)
        .await
        .expect("record");
    let counted = row_version(&test, &d.id).await;
    assert_ne!(counted, created, "counting writes the row");
    let stored = read(&*store, &d.tenant_id, &d.id).await;
    assert_eq!(stored.consecutive_failures, 2);
    assert_eq!(
        stored.updated_at, d.updated_at,
        "counting alone leaves updated_at"
    );

    // A success followed by as many failures as were counted leaves the count at 2.
    store
        .record_delivery_health(&[report(&d, true, 2, "timeout")], 5)
        .await
        .expect("record");
    assert_eq!(row_version(&test, &d.id).await, counted);
    assert_eq!(
        read(&*store, &d.tenant_id, &d.id)
            .await
            .consecutive_failures,
        2
    );
}

/// `consecutive_failures` is an `integer`: a larger count, created or counted, is kept as
/// `i32::MAX`, and a limit above it counts as `i32::MAX`, so the destination is still disabled.
/// An error text with a NUL (which Postgres `text` cannot hold) is kept with U+FFFD instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_saturate_at_the_integer_column() {
    let url = require_postgres!("counts_saturate_at_the_integer_column");
    let _gate = Gate::shared(&url).await;
    let test = TestSchema::new(&url).await;
    let store = test.stores.entity_store();
    let [d] = <[Destination; 1]>::try_from(tenant_with(&*store, "pg-health-max", 1).await)
        .expect("one destination");
    let max = u32::try_from(i32::MAX).expect("i32::MAX fits a u32");

    let big = Destination {
        id: DestinationId::generate(),
        consecutive_failures: u32::MAX,
        ..d.clone()
    };
    store.create_destination(&big).await.expect("create");
    assert_eq!(
        read(&*store, &big.tenant_id, &big.id)
            .await
            .consecutive_failures,
        max
    );

    let changes = store
        .record_delivery_health(&[report(&d, false, u32::MAX, "bad\0byte")], u32::MAX)
        .await
        .expect("record");
    let [HealthChange::Disabled(disabled)] = changes.as_slice() else {
        panic!("a saturated count reaches any limit: {changes:?}");
    };
    assert_eq!(disabled.consecutive_failures, max);
    let reason = disabled.disabled_reason.as_ref().expect("a reason");
    assert_eq!(
        reason.reason,
        format!("{max} consecutive failed attempts; the last: bad\u{FFFD}byte")
    );
    assert!(reason.automatic);
}

/// Three tenants' destinations come back in id order across pages of two; a swap whose expected
/// values are still stored happens (and leaves `updated_at`), one whose destination was rotated
/// in between does not, and neither does one naming another tenant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_swap_only_where_they_are_still_the_expected_ones() {
    let url = require_postgres!("credentials_swap_only_where_they_are_still_the_expected_ones");
    let test = TestSchema::new(&url).await;
    let store = test.stores.entity_store();
    let mut all = Vec::new();
    for prefix in ["pg-scan-a", "pg-scan-b", "pg-scan-c"] {
        all.extend(tenant_with(&*store, prefix, 2).await);
    }
    let mut pages = Vec::new();
    let mut after = None;
    loop {
        let page = store.scan_destinations(after, 2).await.expect("scan");
        let Some(last) = page.last() else { break };
        assert!(page.len() <= 2);
        after = Some(last.id);
        pages.extend(page.into_iter().map(|d| d.id));
    }
    let mut expected: Vec<DestinationId> = all.iter().map(|d| d.id).collect();
    expected.sort_by_key(|id| id.as_uuid());
    assert_eq!(pages, expected, "every destination once, in id order");

    let swap_of = |d: &Destination, tag: &str| CredentialsSwap {
        tenant_id: d.tenant_id.clone(),
        destination_id: d.id,
        expected: StoredCredentials::of(d),
        replacement: StoredCredentials {
            secret: Secret::new(format!("swapped-{tag}")).unwrap(),
            previous_secret: None,
            config: serde_json::json!({ "url": format!("https://swapped.example/{tag}") }),
        },
    };
    let (kept, rotated, foreign) = (&all[0], &all[1], &all[2]);
    store
        .rotate_secret(
            &rotated.tenant_id,
            &rotated.id,
            &Secret::new("rotated-meanwhile").unwrap(),
            Timestamp::now(),
        )
        .await
        .expect("rotate");
    let mut wrong_tenant = swap_of(foreign, "foreign");
    wrong_tenant.tenant_id = kept.tenant_id.clone();
    let swapped = store
        .swap_credentials(&[
            swap_of(kept, "kept"),
            swap_of(rotated, "rotated"),
            wrong_tenant,
        ])
        .await
        .expect("swap");
    assert_eq!(swapped, vec![kept.id]);
    let now = read(&*store, &kept.tenant_id, &kept.id).await;
    assert_eq!(now.secret.expose(), "swapped-kept");
    assert_eq!(now.config["url"], "https://swapped.example/kept");
    assert_eq!(now.updated_at, kept.updated_at, "a swap leaves updated_at");
    let now = read(&*store, &rotated.tenant_id, &rotated.id).await;
    assert_eq!(now.secret.expose(), "rotated-meanwhile");
    let now = read(&*store, &foreign.tenant_id, &foreign.id).await;
    assert_eq!(now.secret, foreign.secret);
    assert!(
        store
            .swap_credentials(&[])
            .await
            .expect("nothing")
            .is_empty()
    );
}
