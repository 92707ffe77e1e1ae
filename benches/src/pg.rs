//! Postgres for the scenarios: a schema of the run's own (dropped at the end, also when the
//! scenario fails), plain connections, and what statements cost the server according to
//! `pg_stat_statements` (read before and after a phase: nothing is reset, so other users of the
//! server keep their statistics).

use std::time::Duration;

use anyhow::Context as _;
use sqlx::Connection as _;

/// A schema used by one run, dropped (with everything in it) when this guard is dropped.
#[derive(Debug)]
pub struct PgSchema {
    pub url: String,
    pub schema: String,
}

impl PgSchema {
    /// A fresh schema name (`<prefix>_<random>`); not created yet.
    pub fn new(url: &str, prefix: &str) -> Self {
        PgSchema {
            url: url.to_owned(),
            schema: sheaf_testenv::unique_name(prefix),
        }
    }

    /// Sheaf's store configuration for this schema, with `max_connections`.
    pub fn config(&self, max_connections: u32) -> sheaf_postgres::PostgresConfig {
        sheaf_postgres::PostgresConfig {
            max_connections,
            ..sheaf_postgres::PostgresConfig::new(self.url.as_str())
                .with_schema(self.schema.as_str())
        }
    }

    /// `"schema".name`.
    pub fn table(&self, name: &str) -> String {
        format!("\"{}\".{name}", self.schema)
    }

    /// A plain connection.
    pub async fn connect(&self) -> anyhow::Result<sqlx::PgConnection> {
        connect(&self.url).await
    }
}

impl Drop for PgSchema {
    fn drop(&mut self) {
        let (url, schema) = (self.url.clone(), self.schema.clone());
        let outcome = std::thread::spawn(move || -> anyhow::Result<()> {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(async {
                let mut conn = connect(&url).await?;
                sqlx::raw_sql(&format!(
                    "SET lock_timeout = '30s'; DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"
                ))
                .execute(&mut conn)
                .await?;
                conn.close().await?;
                Ok(())
            })
        })
        .join();
        if !matches!(outcome, Ok(Ok(()))) {
            eprintln!(
                "sheaf-bench: could not drop postgres schema {}",
                self.schema
            );
        }
    }
}

/// A plain connection to `url`.
pub async fn connect(url: &str) -> anyhow::Result<sqlx::PgConnection> {
    tokio::time::timeout(Duration::from_secs(30), sqlx::PgConnection::connect(url))
        .await
        .context("connecting to postgres timed out")?
        .context("connect to postgres")
}

/// Runs SQL (several statements allowed) on a fresh connection.
pub async fn execute(url: &str, sql: &str) -> anyhow::Result<()> {
    let mut conn = connect(url).await?;
    sqlx::raw_sql(sql)
        .execute(&mut conn)
        .await
        .with_context(|| {
            let start: String = sql.trim().chars().take(160).collect();
            format!("postgres: {start}…")
        })?;
    conn.close().await?;
    Ok(())
}

/// Sums over the statements whose text mentions `needle` (the run's schema: every Sheaf
/// statement is schema-qualified, so this selects exactly this run's statements).
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct StatementTotals {
    pub calls: i64,
    /// `total_exec_time`: time spent executing, in milliseconds (not CPU time: it includes
    /// waits, which are negligible for cached reads on an otherwise idle run).
    pub exec_ms: f64,
    /// Shared buffers hit plus read: pages of 8 KiB the statements touched.
    pub blocks: i64,
}

impl StatementTotals {
    /// What happened between two readings.
    pub fn since(self, before: StatementTotals) -> StatementTotals {
        StatementTotals {
            calls: self.calls - before.calls,
            exec_ms: self.exec_ms - before.exec_ms,
            blocks: self.blocks - before.blocks,
        }
    }
}

/// Reads `pg_stat_statements` for the statements mentioning `needle`.
pub async fn statement_totals(
    conn: &mut sqlx::PgConnection,
    needle: &str,
) -> anyhow::Result<StatementTotals> {
    statement_totals_all(conn, &[needle]).await
}

/// Reads `pg_stat_statements` for the statements whose text mentions every one of `needles`.
pub async fn statement_totals_all(
    conn: &mut sqlx::PgConnection,
    needles: &[&str],
) -> anyhow::Result<StatementTotals> {
    let patterns: Vec<String> = needles.iter().map(|n| format!("%{n}%")).collect();
    let (calls, exec_ms, blocks): (Option<i64>, Option<f64>, Option<i64>) = sqlx::query_as(
        "SELECT sum(calls)::bigint, sum(total_exec_time)::float8, \
                sum(shared_blks_hit + shared_blks_read)::bigint \
         FROM pg_stat_statements WHERE query LIKE ALL ($1::text[]) \
           AND query NOT LIKE '%pg_stat_statements%'",
    )
    .bind(&patterns)
    .fetch_one(conn)
    .await
    .context("read pg_stat_statements (is the extension created in this database?)")?;
    Ok(StatementTotals {
        calls: calls.unwrap_or(0),
        exec_ms: exec_ms.unwrap_or(0.0),
        blocks: blocks.unwrap_or(0),
    })
}
