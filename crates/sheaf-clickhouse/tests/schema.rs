//! Migrations: versioned, idempotent, safe to run concurrently, and the retention TTL follows
//! the configuration.

use std::time::Duration;

use sheaf_testenv::require_clickhouse;

use crate::support::TestDb;

async fn engine_full(db: &TestDb, table: &str) -> String {
    db.client()
        .query("SELECT engine_full FROM system.tables WHERE database = ? AND name = ?")
        .bind(db.database.as_str())
        .bind(table)
        .fetch_one()
        .await
        .expect("read system.tables")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrations_are_versioned_idempotent_and_set_the_ttl() {
    let url = require_clickhouse!("migrations_are_versioned_idempotent_and_set_the_ttl");
    let db = TestDb::new(&url);

    // Two processes starting together.
    let (a, b) = (db.config(), db.config());
    let (a, b) = (
        sheaf_clickhouse::ClickHouseLogStore::connect(a).expect("connect"),
        sheaf_clickhouse::ClickHouseLogStore::connect(b).expect("connect"),
    );
    let (ra, rb) = futures::join!(a.migrate(), b.migrate());
    ra.expect("first migrate");
    rb.expect("concurrent migrate");
    a.migrate().await.expect("migrate again");

    let versions: Vec<u32> = db
        .client()
        .query("SELECT DISTINCT version FROM schema_migrations ORDER BY version")
        .fetch_all()
        .await
        .expect("read schema_migrations");
    assert_eq!(versions, vec![1, 2, 3, 4]);
    for table in ["events", "attempts"] {
        let engine = engine_full(&db, table).await;
        assert!(
            engine.starts_with("ReplacingMergeTree"),
            "{table}: {engine}"
        );
        assert!(
            engine.contains("index_granularity = 256"),
            "{table}: {engine}"
        );
        assert!(
            !engine.contains(" TTL "),
            "{table}: no retention configured: {engine}"
        );
    }

    let mut config = db.config();
    config.retention = Some(Duration::from_secs(30 * 24 * 3600));
    let retained = db.store_with(config.clone()).await;
    for (table, column) in [("events", "event_time"), ("attempts", "attempt_time")] {
        let engine = engine_full(&db, table).await;
        assert!(
            engine.contains(&format!(
                "TTL toDateTime({column}) + toIntervalSecond(2592000)"
            )),
            "{table}: {engine}"
        );
    }
    // Again with the same retention changes nothing; without one removes the TTL.
    retained
        .migrate()
        .await
        .expect("migrate with the same retention");
    db.store().await;
    for table in ["events", "attempts"] {
        let engine = engine_full(&db, table).await;
        assert!(
            !engine.contains(" TTL "),
            "{table}: retention removed: {engine}"
        );
    }
}
