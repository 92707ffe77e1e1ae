//! The embedded schema migrations and the small runner that applies them inside one schema.
//!
//! sqlx's own migrator keeps one history per database and takes a database-wide lock; Sheaf needs
//! one history per schema (tests give every run its own), so the runner is ours and short:
//!
//! 1. one transaction, holding a transaction-level advisory lock keyed by the schema name, so
//!    processes that start together apply each migration once and the others wait, then see it;
//! 2. the schema and the `sheaf_migrations` history table are created if missing;
//! 3. migrations already applied are checked against their embedded text (an md5 computed by the
//!    server), so an edited migration is an error instead of a silent divergence;
//! 4. the missing ones run in version order, and commit together with their history rows.
//!
//! Everything is transactional DDL: a failure leaves the schema exactly as it was.

use sheaf_store::{Error, Result};
use sqlx::{PgPool, Row};

use crate::error::from_sqlx;

/// One embedded migration.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Migration {
    pub(crate) version: i64,
    pub(crate) name: &'static str,
    pub(crate) sql: &'static str,
}

/// Every migration, in version order. Applied migrations are never edited: add a new one.
pub(crate) const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "log",
        sql: include_str!("../migrations/0001_log.sql"),
    },
    Migration {
        version: 2,
        name: "queue",
        sql: include_str!("../migrations/0002_queue.sql"),
    },
    Migration {
        version: 3,
        name: "entities",
        sql: include_str!("../migrations/0003_entities.sql"),
    },
    Migration {
        version: 4,
        name: "outbox",
        sql: include_str!("../migrations/0004_outbox.sql"),
    },
    Migration {
        version: 5,
        name: "destination_filter",
        sql: include_str!("../migrations/0005_destination_filter.sql"),
    },
    Migration {
        version: 6,
        name: "destination_health",
        sql: include_str!("../migrations/0006_destination_health.sql"),
    },
    Migration {
        version: 7,
        name: "rate_limits_and_processes",
        sql: include_str!("../migrations/0007_rate_limits_and_processes.sql"),
    },
    Migration {
        version: 8,
        name: "destination_config",
        sql: include_str!("../migrations/0008_destination_config.sql"),
    },
    Migration {
        version: 9,
        name: "event_trace",
        sql: include_str!("../migrations/0009_event_trace.sql"),
    },
    Migration {
        version: 10,
        name: "replays",
        sql: include_str!("../migrations/0010_replays.sql"),
    },
    Migration {
        version: 11,
        name: "destination_transform",
        sql: include_str!("../migrations/0011_destination_transform.sql"),
    },
    Migration {
        version: 12,
        name: "job_order",
        sql: include_str!("../migrations/0012_job_order.sql"),
    },
    Migration {
        version: 13,
        name: "destination_ordering",
        sql: include_str!("../migrations/0013_destination_ordering.sql"),
    },
    Migration {
        version: 14,
        name: "jobs_fillfactor",
        sql: include_str!("../migrations/0014_jobs_fillfactor.sql"),
    },
    Migration {
        version: 15,
        name: "dead_letters_holding_keys",
        sql: include_str!("../migrations/0015_dead_letters_holding_keys.sql"),
    },
    Migration {
        version: 16,
        name: "outbox_events_without_key_index",
        sql: include_str!("../migrations/0016_outbox_events_without_key_index.sql"),
    },
];

/// Applies the missing migrations to `schema` (a validated identifier) and returns the versions
/// it applied, oldest first.
pub(crate) async fn run(pool: &PgPool, schema: &str) -> Result<Vec<i64>> {
    let fail = |e| from_sqlx("migrating the schema", e);
    let mut tx = pool.begin().await.map_err(fail)?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
        .bind(format!("sheaf-migrate:{schema}"))
        .execute(&mut *tx)
        .await
        .map_err(fail)?;
    // A role that may not create schemas can still use one made for it by an administrator, so
    // ask before creating.
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)")
            .bind(schema)
            .fetch_one(&mut *tx)
            .await
            .map_err(fail)?;
    if !exists {
        sqlx::raw_sql(&format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\""))
            .execute(&mut *tx)
            .await
            .map_err(fail)?;
    }
    // The migrations are written without a schema: they land in this one. Migrations may build
    // indexes on big tables, which the pool's statement timeout must not cut short.
    sqlx::raw_sql(&format!(
        "SET LOCAL search_path TO \"{schema}\"; SET LOCAL statement_timeout = 0;
         CREATE TABLE IF NOT EXISTS sheaf_migrations (
             version    bigint      PRIMARY KEY,
             name       text        NOT NULL,
             checksum   text        NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now()
         );"
    ))
    .execute(&mut *tx)
    .await
    .map_err(fail)?;

    let versions: Vec<i64> = MIGRATIONS.iter().map(|m| m.version).collect();
    let texts: Vec<&str> = MIGRATIONS.iter().map(|m| m.sql).collect();
    // Qualified names (and unprepared statements) below: a pooled connection must not keep a
    // statement planned for another schema.
    let history = format!("\"{schema}\".sheaf_migrations");
    let rows = sqlx::query(&format!(
        "SELECT m.version, m.checksum = md5(e.sql) AS unchanged
         FROM {history} AS m
         LEFT JOIN unnest($1::bigint[], $2::text[]) AS e(version, sql) USING (version)
         ORDER BY m.version"
    ))
    .persistent(false)
    .bind(&versions)
    .bind(&texts)
    .fetch_all(&mut *tx)
    .await
    .map_err(fail)?;
    let mut applied = Vec::with_capacity(rows.len());
    for row in rows {
        let version: i64 = row.try_get("version").map_err(fail)?;
        let unchanged: Option<bool> = row.try_get("unchanged").map_err(fail)?;
        match unchanged {
            Some(true) => applied.push(version),
            Some(false) => {
                return Err(Error::Backend {
                    message: format!(
                        "migration {version} of schema {schema} was applied from a different \
                         text than this build embeds; migrations must never be edited once applied"
                    ),
                    source: None,
                });
            }
            // A newer build migrated this schema. Migrations only add, so an older process keeps
            // working during a rolling deploy; say so and go on.
            None => tracing::warn!(
                schema,
                version,
                "the schema has a migration this build does not know; a newer build applied it"
            ),
        }
    }

    let mut newly = Vec::new();
    for migration in MIGRATIONS {
        if applied.contains(&migration.version) {
            continue;
        }
        sqlx::raw_sql(migration.sql)
            .execute(&mut *tx)
            .await
            .map_err(|e| from_sqlx(&format!("applying migration {}", migration.version), e))?;
        sqlx::query(&format!(
            "INSERT INTO {history} (version, name, checksum) VALUES ($1, $2, md5($3))"
        ))
        .persistent(false)
        .bind(migration.version)
        .bind(migration.name)
        .bind(migration.sql)
        .execute(&mut *tx)
        .await
        .map_err(fail)?;
        newly.push(migration.version);
    }
    tx.commit().await.map_err(fail)?;
    if !newly.is_empty() {
        tracing::info!(schema, versions = ?newly, "applied migrations");
    }
    Ok(newly)
}
