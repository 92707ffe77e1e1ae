//! The versioned schema: each migration is a list of idempotent statements, recorded in
//! `schema_migrations` once applied, plus the retention TTL, which follows the configuration
//! on every [`migrate`](crate::ClickHouseLogStore::migrate).
//!
//! Why the tables look the way they do is in the crate documentation.

/// One step of the schema. Statements name the database as `{db}`, replaced by the configured
/// (validated) database name, and each one is safe to run again (`IF NOT EXISTS`), so a
/// migration interrupted half-way, or run by two processes at once, converges.
pub(crate) struct Migration {
    /// Applied in increasing order; never reused.
    pub version: u32,
    /// What it does, recorded with the version.
    pub name: &'static str,
    /// The statements, in order.
    pub statements: &'static [&'static str],
}

/// Every migration, oldest first. Append only: an applied migration is never edited, a change
/// is a new version.
pub(crate) const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "events table",
        statements: &[r"
CREATE TABLE IF NOT EXISTS {db}.events
(
    tenant_id LowCardinality(String),
    event_id String,
    topic LowCardinality(String),
    event_time DateTime64(6, 'UTC'),
    data String,
    PROJECTION by_tenant_time
    (
        SELECT tenant_id, event_time, event_id, topic
        ORDER BY tenant_id, event_time, event_id
    )
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(event_time)
ORDER BY (tenant_id, event_id)
SETTINGS index_granularity = 256, index_granularity_bytes = 65536,
    deduplicate_merge_projection_mode = 'rebuild'"],
    },
    Migration {
        version: 2,
        name: "attempts table",
        statements: &[r"
CREATE TABLE IF NOT EXISTS {db}.attempts
(
    tenant_id LowCardinality(String),
    event_id String,
    destination_id UUID,
    attempt_time DateTime64(6, 'UTC'),
    attempt_id UUID,
    number UInt32,
    status Enum8('failed' = 0, 'success' = 1),
    trigger Enum8('scheduled' = 0, 'manual' = 1),
    response_code Nullable(UInt16),
    duration_ms UInt32,
    response_body Nullable(String),
    error Nullable(String),
    event_topic LowCardinality(String),
    event_data String,
    INDEX attempt_id_bloom attempt_id TYPE bloom_filter(0.01) GRANULARITY 1,
    PROJECTION by_tenant_time
    (
        SELECT tenant_id, attempt_time, attempt_id, event_id, destination_id, status, event_topic
        ORDER BY tenant_id, attempt_time, attempt_id
    )
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(attempt_time)
ORDER BY (tenant_id, event_id, destination_id, attempt_time, attempt_id)
SETTINGS index_granularity = 256, index_granularity_bytes = 65536,
    deduplicate_merge_projection_mode = 'rebuild'"],
    },
    // The publish's W3C trace context (`sheaf_store::TraceContext`), empty for an untraced
    // publish (and for rows written before): in the event, and in each attempt beside the
    // payload, where a retry's latest-attempt lookup reads it. A `String` with an empty default,
    // not `Nullable`: no null map to write, and an absent context is never an empty one.
    Migration {
        version: 3,
        name: "trace context",
        statements: &[
            r"
ALTER TABLE {db}.events
    ADD COLUMN IF NOT EXISTS traceparent String DEFAULT '',
    ADD COLUMN IF NOT EXISTS tracestate String DEFAULT ''",
            r"
ALTER TABLE {db}.attempts
    ADD COLUMN IF NOT EXISTS event_traceparent String DEFAULT '',
    ADD COLUMN IF NOT EXISTS event_tracestate String DEFAULT ''",
        ],
    },
    // An attempt whose destination's transformation dropped the event. Adding a value at the
    // end of an `Enum8` changes only the column's metadata (no part is rewritten), and running
    // it again is a no-op.
    Migration {
        version: 4,
        name: "filtered attempts",
        statements: &[r"
ALTER TABLE {db}.attempts
    MODIFY COLUMN IF EXISTS status Enum8('failed' = 0, 'success' = 1, 'filtered' = 2)"],
    },
];

/// Where applied versions are recorded. A version may be recorded twice when two processes
/// migrate at once; both ran idempotent statements, so that is harmless.
pub(crate) const CREATE_MIGRATIONS_TABLE: &str = r"
CREATE TABLE IF NOT EXISTS {db}.schema_migrations
(
    version UInt32,
    name String,
    applied_at DateTime64(6, 'UTC') DEFAULT now64(6)
)
ENGINE = ReplacingMergeTree
ORDER BY version";

/// The tables with a retention TTL, and the time column each expires by.
pub(crate) const RETAINED_TABLES: &[(&str, &str)] =
    &[("events", "event_time"), ("attempts", "attempt_time")];

/// `statement` with the database filled in.
pub(crate) fn render(statement: &str, database: &str) -> String {
    statement.replace("{db}", database)
}

/// `statement` for a cluster node, where the log tables are `events_local` and
/// `attempts_local` under `Distributed` tables of the plain names (`migrate.rs`).
pub(crate) fn localized(statement: &str) -> String {
    RETAINED_TABLES
        .iter()
        .fold(statement.to_owned(), |statement, (table, _)| {
            statement.replace(&format!("{{db}}.{table}"), &format!("{{db}}.{table}_local"))
        })
}

/// `statement` for a cluster whose servers replicate: [`localized`], run once with `ON CLUSTER
/// cluster`, its `ReplacingMergeTree` a `ReplicatedReplacingMergeTree` in Keeper at
/// `/clickhouse/tables/{shard}/<database>/<table>` with replica `{replica}` (macros every node
/// defines). Each log table statement names its table once, right after `TABLE`.
pub(crate) fn replicated(statement: &str, cluster: &str) -> String {
    let mut statement = localized(statement);
    for (table, _) in RETAINED_TABLES {
        let local = format!("{{db}}.{table}_local");
        if !statement.contains(&local) {
            continue;
        }
        statement = statement
            .replacen(&local, &format!("{local} ON CLUSTER {cluster}"), 1)
            .replace(
                "ENGINE = ReplacingMergeTree",
                &format!(
                    "ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{{shard}}/{{db}}/{table}_local', '{{replica}}')"
                ),
            );
    }
    statement
}

/// [`CREATE_MIGRATIONS_TABLE`] on a replicating cluster: one table replicated to every node, so
/// whichever node a process migrates through knows what was applied.
pub(crate) fn replicated_migrations_table(cluster: &str) -> String {
    CREATE_MIGRATIONS_TABLE
        .replace(
            "{db}.schema_migrations",
            &format!("{{db}}.schema_migrations ON CLUSTER {cluster}"),
        )
        .replace(
            "ENGINE = ReplacingMergeTree",
            "ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/all/{db}/schema_migrations', '{replica}')",
        )
}

/// One column of `system.columns` as DDL: its name quoted, its type and its default.
pub(crate) fn column_ddl(name: &str, kind: &str, default_kind: &str, default: &str) -> String {
    let name = name.replace('`', "\\`");
    if default_kind.is_empty() {
        format!("`{name}` {kind}")
    } else {
        format!("`{name}` {kind} {default_kind} {default}")
    }
}

/// The `Distributed` table `table` over `{table}_local` on cluster `cluster`, with `columns`
/// (the local table's, [`column_ddl`]), sharded so that an event and its attempts share a
/// shard. `CREATE OR REPLACE` swaps it atomically when a migration changed the columns.
/// `on_cluster` adds `ON CLUSTER cluster` (a replicating cluster creates it on every node at
/// once).
pub(crate) fn distributed_table(
    database: &str,
    cluster: &str,
    table: &str,
    columns: &[String],
    on_cluster: bool,
) -> String {
    let on = if on_cluster {
        format!(" ON CLUSTER {cluster}")
    } else {
        String::new()
    };
    format!(
        "CREATE OR REPLACE TABLE {database}.{table}{on} ({}) \
         ENGINE = Distributed({cluster}, {database}, {table}_local, sipHash64(tenant_id, event_id))",
        columns.join(", ")
    )
}

/// The TTL expression for `column` kept for `seconds`, as the server prints it back in
/// `system.tables.engine_full` (so [`ttl_is_current`] can compare).
pub(crate) fn ttl_expression(column: &str, seconds: u64) -> String {
    format!("toDateTime({column}) + toIntervalSecond({seconds})")
}

/// Whether a table's `engine_full` already carries exactly the wanted TTL (or none, when none
/// is wanted).
pub(crate) fn ttl_is_current(engine_full: &str, wanted: Option<&str>) -> bool {
    match wanted {
        Some(expression) => engine_full.contains(&format!("TTL {expression}")),
        None => !engine_full.contains(" TTL "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Written for a real clickhouse-server cluster with Keeper, which cannot run here: the text
    /// is all that can be checked.
    #[test]
    fn a_replicating_cluster_gets_on_cluster_ddl_and_replicated_engines() {
        let events = render(&replicated(MIGRATIONS[0].statements[0], "prod"), "db");
        assert!(
            events.contains("CREATE TABLE IF NOT EXISTS db.events_local ON CLUSTER prod\n("),
            "{events}"
        );
        assert!(
            events.contains(
                "ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/db/events_local', '{replica}')"
            ),
            "{events}"
        );
        for migration in MIGRATIONS {
            for statement in migration.statements {
                let sql = render(&replicated(statement, "prod"), "db");
                assert_eq!(sql.matches("ON CLUSTER prod").count(), 1, "{sql}");
                assert!(!sql.contains("ENGINE = ReplacingMergeTree"), "{sql}");
            }
        }
        let migrations = render(&replicated_migrations_table("prod"), "db");
        assert!(
            migrations.contains("db.schema_migrations ON CLUSTER prod"),
            "{migrations}"
        );
        assert!(
            migrations.contains("ReplicatedReplacingMergeTree('/clickhouse/tables/all/db/schema_migrations', '{replica}')"),
            "{migrations}"
        );
        let distributed = distributed_table("db", "prod", "events", &["`x` String".into()], true);
        assert!(distributed.starts_with("CREATE OR REPLACE TABLE db.events ON CLUSTER prod ("));
    }

    #[test]
    fn a_cluster_node_gets_every_log_table_statement_on_its_local_table() {
        for migration in MIGRATIONS {
            for statement in migration.statements {
                let local = render(&localized(statement), "db");
                assert!(
                    !local.contains("db.events ") && !local.contains("db.events\n"),
                    "{local}"
                );
                assert!(
                    !local.contains("db.attempts ") && !local.contains("db.attempts\n"),
                    "{local}"
                );
                assert!(
                    local.contains("db.events_local") || local.contains("db.attempts_local"),
                    "{local}"
                );
            }
        }
        let ddl = distributed_table(
            "db",
            "sheaf",
            "attempts",
            &[
                column_ddl("tenant_id", "String", "", ""),
                column_ddl("t", "String", "DEFAULT", "''"),
            ],
            false,
        );
        assert_eq!(
            ddl,
            "CREATE OR REPLACE TABLE db.attempts (`tenant_id` String, `t` String DEFAULT '') \
             ENGINE = Distributed(sheaf, db, attempts_local, sipHash64(tenant_id, event_id))"
        );
    }

    #[test]
    fn versions_increase_and_statements_are_idempotent() {
        let mut last = 0;
        for migration in MIGRATIONS {
            assert!(migration.version > last, "{}", migration.name);
            last = migration.version;
            for statement in migration.statements {
                // Creating and adding are guarded; a column set to a stated type is the same
                // after a second run.
                assert!(
                    statement.contains("IF NOT EXISTS")
                        || statement.contains("MODIFY COLUMN IF EXISTS"),
                    "{}: {statement}",
                    migration.name
                );
                assert!(statement.contains("{db}."));
            }
        }
    }

    #[test]
    fn ttl_comparison() {
        let wanted = ttl_expression("attempt_time", 86400);
        let with_ttl = format!(
            "ReplacingMergeTree PARTITION BY toYYYYMM(attempt_time) ORDER BY (a) TTL {wanted} SETTINGS index_granularity = 256"
        );
        assert!(ttl_is_current(&with_ttl, Some(&wanted)));
        assert!(!ttl_is_current(&with_ttl, None));
        let other = ttl_expression("attempt_time", 3600);
        assert!(!ttl_is_current(&with_ttl, Some(&other)));
        let without = "ReplacingMergeTree ORDER BY (a) SETTINGS index_granularity = 256";
        assert!(ttl_is_current(without, None));
        assert!(!ttl_is_current(without, Some(&wanted)));
    }
}
