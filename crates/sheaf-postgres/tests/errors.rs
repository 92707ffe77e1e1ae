//! Configuration is validated up front, and a server that cannot be reached, goes away, or does
//! not answer in time is `Unavailable` (callers retry), never a panic and never another kind.

use std::collections::BTreeMap;
use std::time::Duration;

use sheaf_postgres::{PostgresConfig, PostgresStores};
use sheaf_store::testkit::fixtures::unique_tenant;
use sheaf_store::{ErrorKind, EventId, TenantId};
use sheaf_testenv::require_postgres;
use sqlx::Connection;

use crate::support::{Gate, TestSchema, wait_for};

fn kind_of<T: std::fmt::Debug>(result: sheaf_store::Result<T>) -> ErrorKind {
    result.expect_err("expected an error").kind()
}

#[tokio::test]
async fn a_bad_configuration_is_invalid_input_and_never_prints_the_password() {
    let url = "postgres://sheaf:hunter2@127.0.0.1:5432/sheaf_test";
    for schema in [
        "",
        "Sheaf",
        "1abc",
        "a-b",
        "a\"b",
        "pg_sheaf",
        &"s".repeat(64),
    ] {
        let config = PostgresConfig::new(url).with_schema(schema);
        assert_eq!(
            kind_of(PostgresStores::new(config)),
            ErrorKind::InvalidInput,
            "schema {schema:?}"
        );
    }
    let zero = PostgresConfig {
        max_connections: 0,
        ..PostgresConfig::new(url)
    };
    assert_eq!(kind_of(PostgresStores::new(zero)), ErrorKind::InvalidInput);
    let bad_url = PostgresConfig::new("postgres://sheaf:hunter2@127.0.0.1:notaport/x");
    let err = PostgresStores::new(bad_url).expect_err("a bad port");
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert!(
        !err.to_string().contains("hunter2"),
        "the error shows the password: {err}"
    );
    let with_query = PostgresConfig::new("postgres://127.0.0.1/x?user=a&password=hunter2");
    for shown in [
        format!("{:?}", PostgresConfig::new(url)),
        format!("{with_query:?}"),
    ] {
        assert!(
            !shown.contains("hunter2"),
            "Debug shows the password: {shown}"
        );
    }
    let stores = PostgresStores::new(PostgresConfig::new(url).with_schema("sheaf_2"))
        .expect("a good config");
    let shown = format!("{stores:?} {:?}", stores.log_store());
    assert!(
        !shown.contains("hunter2"),
        "Debug shows the password: {shown}"
    );
}

#[tokio::test]
async fn an_unreachable_server_is_unavailable() {
    // Nothing listens on port 1: every call fails to connect, within the acquire timeout.
    let config = PostgresConfig {
        acquire_timeout: Duration::from_millis(500),
        ..PostgresConfig::new("postgres://sheaf:sheaf@127.0.0.1:1/sheaf_test")
    };
    let stores = PostgresStores::new(config).expect("config");
    assert_eq!(kind_of(stores.migrate().await), ErrorKind::Unavailable);
    let tenant = unique_tenant("pg-unreachable");
    let event = EventId::new("e1").expect("valid");
    assert_eq!(
        kind_of(stores.log_store().get_event(&tenant, &event).await),
        ErrorKind::Unavailable
    );
    assert_eq!(
        kind_of(stores.job_queue().claim(10, Duration::from_secs(30)).await),
        ErrorKind::Unavailable
    );
    assert_eq!(
        kind_of(stores.entity_store().get_tenant(&tenant).await),
        ErrorKind::Unavailable
    );
    assert_eq!(
        kind_of(stores.log_store().ping().await),
        ErrorKind::Unavailable
    );
}

/// Holds a row lock on `tenant` from a connection of its own until dropped, so that a store's
/// statement on that row waits.
async fn lock_tenant_row(
    test: &TestSchema,
    tenant: &TenantId,
) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let pool = sqlx::PgPool::connect(&test.url).await.expect("connect");
    let mut tx = pool.begin().await.expect("begin");
    sqlx::query(&format!(
        "SELECT 1 FROM {} WHERE id = $1 FOR UPDATE",
        test.table("tenants")
    ))
    .bind(tenant.as_str())
    .execute(&mut *tx)
    .await
    .expect("lock the tenant row");
    tx
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_past_the_timeout_is_unavailable() {
    let url = require_postgres!("a_statement_past_the_timeout_is_unavailable");
    let _gate = Gate::shared(&url).await;
    let config = PostgresConfig {
        statement_timeout: Some(Duration::from_millis(300)),
        ..TestSchema::config(&url)
    };
    let test = TestSchema::with_config(config).await;
    let entities = test.stores.entity_store();
    let tenant = unique_tenant("pg-timeout");
    entities
        .upsert_tenant(&tenant, &BTreeMap::new())
        .await
        .expect("upsert");
    let held = lock_tenant_row(&test, &tenant).await;
    // The upsert waits for the lock until the server cancels it.
    let started = std::time::Instant::now();
    let err = entities
        .upsert_tenant(&tenant, &BTreeMap::new())
        .await
        .expect_err("the statement must time out");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(started.elapsed() >= Duration::from_millis(250));
    held.rollback().await.expect("rollback");
    entities
        .upsert_tenant(&tenant, &BTreeMap::new())
        .await
        .expect("works again once the lock is gone");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_killed_mid_statement_is_unavailable_and_the_pool_recovers() {
    let url =
        require_postgres!("a_connection_killed_mid_statement_is_unavailable_and_the_pool_recovers");
    let _gate = Gate::shared(&url).await;
    let config = PostgresConfig {
        max_connections: 1,
        ..TestSchema::config(&url)
    };
    let test = TestSchema::with_config(config).await;
    let entities = test.stores.entity_store();
    let tenant = unique_tenant("pg-killed");
    entities
        .upsert_tenant(&tenant, &BTreeMap::new())
        .await
        .expect("upsert");
    // The pool's only connection, by its server process id.
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(test.stores.pool())
        .await
        .expect("backend pid");

    // Park a store statement on a lock, then end its server process, as an administrator (or a
    // failover) would: the caller gets Unavailable.
    let held = lock_tenant_row(&test, &tenant).await;
    let parked = {
        let entities = entities.clone();
        let tenant = tenant.clone();
        tokio::spawn(async move { entities.upsert_tenant(&tenant, &BTreeMap::new()).await })
    };
    let mut admin = test.connect().await;
    let waiting = wait_for(Duration::from_secs(10), Duration::from_millis(50), || {
        let url = test.url.clone();
        async move {
            let mut conn = sqlx::PgConnection::connect(&url).await.ok()?;
            let state: Option<String> =
                sqlx::query_scalar("SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1")
                    .bind(pid)
                    .fetch_optional(&mut conn)
                    .await
                    .ok()?;
            (state.as_deref() == Some("Lock")).then_some(())
        }
    })
    .await;
    assert!(waiting.is_some(), "the upsert never waited on the lock");
    let terminated: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(&mut admin)
        .await
        .expect("terminate");
    assert!(terminated);
    let err = parked
        .await
        .expect("the caller must not panic")
        .expect_err("its connection was killed");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    held.rollback().await.expect("rollback");

    // The pool replaces the dead connection: the next calls work.
    let again = wait_for(Duration::from_secs(10), Duration::from_millis(100), || {
        let entities = entities.clone();
        let tenant = tenant.clone();
        async move { entities.get_tenant(&tenant).await.ok() }
    })
    .await;
    assert!(
        matches!(again, Some(Some(_))),
        "the store did not recover after its connection was killed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_died_while_idle_costs_one_unavailable_call_at_most() {
    let url =
        require_postgres!("a_connection_that_died_while_idle_costs_one_unavailable_call_at_most");
    let _gate = Gate::shared(&url).await;
    let config = PostgresConfig {
        max_connections: 1,
        ..TestSchema::config(&url)
    };
    let test = TestSchema::with_config(config).await;
    let queue = test.stores.job_queue();
    queue.depth().await.expect("depth");
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(test.stores.pool())
        .await
        .expect("backend pid");
    // As a server restart would: the pool's only connection ends while it sits idle.
    let mut admin = test.connect().await;
    let terminated: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1, 5000)")
        .bind(pid)
        .fetch_one(&mut admin)
        .await
        .expect("terminate");
    assert!(terminated);
    // The pool does not ping before each statement (config.rs says why), so the first call may
    // meet the dead connection: it must be Unavailable, and the pool must then replace it.
    match queue.depth().await {
        Ok(_) => println!("the first call after the kill succeeded"),
        Err(e) => {
            assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
            println!(
                "the first call after the kill: {e} ({:?})",
                std::error::Error::source(&e)
            );
        }
    }
    queue
        .depth()
        .await
        .expect("the dead connection is replaced after one failure");
}
