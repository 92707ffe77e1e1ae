//! Migrations: applied once however many processes start together, idempotent, refusing a schema
//! migrated from different text, and building the job table the way the lease queue needs it
//! (`fillfactor = 85`, `claimed_until` in no index, so claims are HOT updates).

use sheaf_postgres::PostgresStores;
use sheaf_store::ErrorKind;
use sheaf_testenv::require_postgres;

use crate::support::{Gate, TestSchema};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_starting_together_apply_each_migration_once() {
    let url = require_postgres!("processes_starting_together_apply_each_migration_once");
    let _gate = Gate::shared(&url).await;
    let config = TestSchema::config(&url);
    let test = TestSchema::unmigrated(config.clone());
    let racers: Vec<PostgresStores> = (0..4)
        .map(|_| PostgresStores::new(config.clone()).expect("config"))
        .collect();
    let results = futures::future::join_all(racers.iter().map(|stores| stores.migrate())).await;
    let mut applied: Vec<i64> = Vec::new();
    for result in results {
        applied.extend(result.expect("a concurrent migrate failed"));
    }
    applied.sort_unstable();
    assert_eq!(
        applied,
        (1..=16).collect::<Vec<i64>>(),
        "each migration applied exactly once"
    );
    assert!(test.stores.migrate().await.expect("migrate").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_applied_from_other_text_is_refused() {
    let url = require_postgres!("a_migration_applied_from_other_text_is_refused");
    let _gate = Gate::shared(&url).await;
    let test = TestSchema::new(&url).await;
    let mut conn = test.connect().await;
    sqlx::query(&format!(
        "UPDATE {} SET checksum = 'edited' WHERE version = 2",
        test.table("sheaf_migrations")
    ))
    .execute(&mut conn)
    .await
    .expect("tamper");
    let err = test
        .stores
        .migrate()
        .await
        .expect_err("an edited migration");
    assert_eq!(err.kind(), ErrorKind::Backend);
    assert!(err.to_string().contains("migration 2"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_job_table_keeps_claims_and_renewals_hot() {
    let url = require_postgres!("the_job_table_keeps_claims_and_renewals_hot");
    let _gate = Gate::shared(&url).await;
    let test = TestSchema::new(&url).await;
    let mut conn = test.connect().await;
    let options: Vec<String> = sqlx::query_scalar(
        "SELECT unnest(c.reloptions) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = $1 AND c.relname = 'jobs'",
    )
    .bind(&test.schema)
    .fetch_all(&mut conn)
    .await
    .expect("reloptions");
    assert!(
        options.iter().any(|o| o == "fillfactor=80"),
        "jobs must leave 20 % of each page free: {options:?}"
    );
    // Every index on jobs, with the columns it keys on, its expressions and its predicate.
    let indexes: Vec<(String, String)> = sqlx::query_as(
        "SELECT i.relname::text, pg_get_indexdef(i.oid)
         FROM pg_index x
         JOIN pg_class i ON i.oid = x.indexrelid
         JOIN pg_class t ON t.oid = x.indrelid
         JOIN pg_namespace n ON n.oid = t.relnamespace
         WHERE n.nspname = $1 AND t.relname = 'jobs'",
    )
    .bind(&test.schema)
    .fetch_all(&mut conn)
    .await
    .expect("indexes");
    for (name, definition) in &indexes {
        assert!(
            !definition.contains("claimed_until"),
            "index {name} covers claimed_until, so claims would not be HOT: {definition}"
        );
    }
    assert!(
        indexes.iter().any(|(_, d)| d.contains("(next_due_at, id)")),
        "the claim needs next_due_at indexed: {indexes:?}"
    );
}
