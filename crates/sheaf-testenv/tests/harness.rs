//! Postgres answers and replicates logically; ClickHouse answers with a 26.x version
//! through the same `clickhouse` crate the log store uses.

use sheaf_testenv::{require_clickhouse, require_postgres};

#[tokio::test]
async fn postgres_answers_with_logical_replication() {
    let url = require_postgres!("postgres_answers_with_logical_replication");
    let pool = sqlx::PgPool::connect(&url)
        .await
        .expect("connect to the test Postgres");
    let wal_level: String = sqlx::query_scalar("SHOW wal_level")
        .fetch_one(&pool)
        .await
        .expect("SHOW wal_level");
    assert_eq!(wal_level, "logical");
    let can_replicate: bool =
        sqlx::query_scalar("SELECT rolreplication FROM pg_roles WHERE rolname = current_user")
            .fetch_one(&pool)
            .await
            .expect("read the role");
    assert!(can_replicate, "the test role must be allowed to replicate");
    let version: i32 = sqlx::query_scalar("SELECT current_setting('server_version_num')::int")
        .fetch_one(&pool)
        .await
        .expect("server version");
    println!("postgres server_version_num = {version}, wal_level = {wal_level}");
    assert!(
        version >= 150_000,
        "Sheaf is tested on Postgres 15 or newer, got {version}"
    );
}

#[tokio::test]
async fn clickhouse_answers_with_a_modern_version() {
    let url = require_clickhouse!("clickhouse_answers_with_a_modern_version");
    let client = clickhouse::Client::default().with_url(url);
    let version: String = client
        .query("SELECT version()")
        .fetch_one()
        .await
        .expect("SELECT version() through the clickhouse crate");
    println!("clickhouse version = {version}");
    assert!(
        version.starts_with("26."),
        "the suites need ClickHouse 26.x (chdb-core 26.9), got {version}"
    );
}
