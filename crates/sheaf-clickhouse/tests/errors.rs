//! Driver errors reach callers as the store's kinds: a server that cannot be reached is
//! `Unavailable` on every path, a query the server rejects is `Backend`, bad input is
//! `InvalidInput` before anything is sent.

use std::time::Duration;

use sheaf_clickhouse::{ClickHouseConfig, ClickHouseLogStore};
use sheaf_store::testkit::fixtures::{ago, attempt, event, unique_tenant};
use sheaf_store::{DestinationId, ErrorKind, EventFilter, LogStore, PageRequest};
use sheaf_testenv::require_clickhouse;

use crate::support::TestDb;

/// Needs no server: nothing listens on port 9 of the loopback interface (discard), so every
/// request fails to connect.
#[tokio::test]
async fn an_unreachable_server_is_unavailable_everywhere() {
    let mut config = ClickHouseConfig::new("http://127.0.0.1:9", "sheaf_unreachable");
    config.request_timeout = Duration::from_secs(5);
    let store = ClickHouseLogStore::connect(config).expect("connect does not talk to the server");
    let tenant = unique_tenant("ch-unreachable");
    let e = event(&tenant, "e", "t", ago(Duration::from_secs(60)));
    let a = attempt(&e, DestinationId::generate(), ago(Duration::from_secs(30)));

    let kind = |result: sheaf_store::Result<()>| result.expect_err("must fail").kind();
    assert_eq!(kind(store.ping().await), ErrorKind::Unavailable);
    assert_eq!(kind(store.migrate().await), ErrorKind::Unavailable);
    assert_eq!(
        kind(
            store
                .insert_many(std::slice::from_ref(&e), std::slice::from_ref(&a))
                .await
        ),
        ErrorKind::Unavailable
    );
    assert_eq!(
        kind(store.latest_attempt(&a.key()).await.map(drop)),
        ErrorKind::Unavailable
    );
    let two = [
        a.key(),
        attempt(&e, DestinationId::generate(), a.time).key(),
    ];
    assert_eq!(
        kind(store.latest_attempts(&two).await.map(drop)),
        ErrorKind::Unavailable
    );
    assert_eq!(
        kind(
            store
                .list_events(&tenant, &EventFilter::default(), &PageRequest::first(10))
                .await
                .map(drop)
        ),
        ErrorKind::Unavailable
    );
}

#[tokio::test]
async fn bad_configuration_is_invalid_input() {
    let bad_name = ClickHouseConfig::new("http://127.0.0.1:8123", "drop table x; --");
    assert_eq!(
        ClickHouseLogStore::connect(bad_name).unwrap_err().kind(),
        ErrorKind::InvalidInput
    );
    let no_runtime = std::thread::spawn(|| {
        ClickHouseLogStore::connect(ClickHouseConfig::new("http://127.0.0.1:8123", "sheaf"))
            .map(drop)
            .map_err(|e| e.kind())
    })
    .join()
    .expect("thread");
    assert_eq!(
        no_runtime,
        Err(ErrorKind::InvalidInput),
        "outside a runtime the coalescers cannot start"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_the_server_rejects_is_a_backend_error() {
    let url = require_clickhouse!("a_query_the_server_rejects_is_a_backend_error");
    let db = TestDb::new(&url);
    // Connected but never migrated: the tables do not exist.
    let store = ClickHouseLogStore::connect(db.config()).expect("connect");
    // Readiness needs the database, not just a server that answers.
    let ping = store.ping().await.expect_err("the database does not exist");
    assert_eq!(ping.kind(), ErrorKind::Unavailable, "{ping}");
    let tenant = unique_tenant("ch-no-tables");
    let err = store
        .list_events(&tenant, &EventFilter::default(), &PageRequest::first(10))
        .await
        .expect_err("no such table");
    assert_eq!(err.kind(), ErrorKind::Backend, "{err}");
}
