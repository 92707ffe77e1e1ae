//! Creating and upgrading the schema, on one server or on every node of a cluster.
//!
//! **One server:** the database, `schema_migrations`, then every migration of `schema.rs` not
//! recorded yet, then the retention TTL.
//!
//! **A cluster** ([`ClickHouseCluster`]): the same on every node, with the log tables renamed
//! `events_local` and `attempts_local` (the statements are the single server's, so the two
//! layouts cannot drift apart), then on every node `events` and `attempts` as `Distributed`
//! tables over them, with the local tables' columns. The store's queries and inserts name
//! `events` and `attempts` either way. Migrating node by node is deliberate: `ON CLUSTER` DDL
//! needs a coordination service (ClickHouse Keeper) that not every cluster runs, and each
//! statement is idempotent, so a node that was down catches up on the next start.
//!
//! **A cluster whose servers replicate** ([`ClusterReplication::Replicated`]): the same
//! statements once, through [`ClickHouseConfig::url`](crate::ClickHouseConfig::url), with
//! `ON CLUSTER` and `ReplicatedReplacingMergeTree` local tables (`schema.rs`, `replicated`), and
//! `schema_migrations` replicated to every node. This is for a real clickhouse-server cluster
//! with Keeper; the wheel the suites run cannot host it, so only its DDL text is tested.
//!
//! Rows are sharded by `sipHash64(tenant_id, event_id)`: an event and every attempt at it live on
//! one shard. The reads depend on that. Deduplicating copies not merged yet, the latest attempt
//! of a key and a listing's keys are all found by a subquery on the same table, which each shard
//! answers over its own rows (`distributed_product_mode = 'local'`), and the outer query merges
//! the shards' answers. Inserts wait until every shard and replica has its rows
//! (`distributed_foreground_insert`), so an acknowledged write is on disk everywhere, as on one
//! server, and the outbox keeps what was not acknowledged.

use clickhouse::Client;
use sheaf_store::Result;

use crate::config::{ClickHouseCluster, ClusterReplication};
use crate::schema;
use crate::store::{ClickHouseLogStore, clients};

/// Settings every query and insert sends on a cluster (module docs).
pub(crate) const CLUSTER_SETTINGS: &[(&str, &str)] = &[
    ("distributed_product_mode", "local"),
    ("distributed_foreground_insert", "1"),
];

/// Which names the log tables get, and how the DDL reaches the nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout<'a> {
    /// One server: `events`, `attempts`.
    Single,
    /// A cluster node: `events_local`, `attempts_local`, under `Distributed` tables.
    Local,
    /// Every node of the named cluster at once, `ON CLUSTER`, the local tables replicated.
    Replicated(&'a str),
}

impl Layout<'_> {
    fn table(self, table: &str) -> String {
        match self {
            Layout::Single => table.to_owned(),
            Layout::Local => format!("{table}_local"),
            Layout::Replicated(cluster) => format!("{table}_local ON CLUSTER {cluster}"),
        }
    }

    fn render(self, statement: &str, database: &str) -> String {
        match self {
            Layout::Single => schema::render(statement, database),
            Layout::Local => schema::render(&schema::localized(statement), database),
            Layout::Replicated(cluster) => {
                schema::render(&schema::replicated(statement, cluster), database)
            }
        }
    }

    /// `CREATE DATABASE`, and the `schema_migrations` table.
    fn bootstrap(self, database: &str) -> (String, String) {
        match self {
            Layout::Replicated(cluster) => (
                format!("CREATE DATABASE IF NOT EXISTS {database} ON CLUSTER {cluster}"),
                schema::render(&schema::replicated_migrations_table(cluster), database),
            ),
            _ => (
                format!("CREATE DATABASE IF NOT EXISTS {database}"),
                schema::render(schema::CREATE_MIGRATIONS_TABLE, database),
            ),
        }
    }
}

impl ClickHouseLogStore {
    /// Creates the database and applies every migration not applied yet, then makes the
    /// tables' retention TTL match [`ClickHouseConfig::retention`]. Safe to run on every start,
    /// by several processes at once. On a cluster, it does so on every node and then creates
    /// the `Distributed` tables (module docs); a node that does not answer fails it.
    ///
    /// [`ClickHouseConfig::retention`]: crate::ClickHouseConfig::retention
    pub async fn migrate(&self) -> Result<()> {
        let Some(cluster) = &self.config.cluster else {
            return self
                .migrate_node(&self.admin, &self.client, Layout::Single)
                .await;
        };
        if cluster.replication == ClusterReplication::Replicated {
            let layout = Layout::Replicated(&cluster.name);
            self.migrate_node(&self.admin, &self.client, layout).await?;
            return self.distribute(&self.client, cluster, true).await;
        }
        for node in &cluster.nodes {
            let (admin, client) = clients(&self.config, node)?;
            self.migrate_node(&admin, &client, Layout::Local).await?;
            self.distribute(&client, cluster, false).await?;
        }
        Ok(())
    }

    async fn migrate_node(
        &self,
        admin: &Client,
        client: &Client,
        layout: Layout<'_>,
    ) -> Result<()> {
        let db = &self.config.database;
        let (database, migrations) = layout.bootstrap(db);
        self.execute_on(admin, "create the database", &database)
            .await?;
        self.execute_on(client, "create schema_migrations", &migrations)
            .await?;
        let applied: Vec<u32> = self
            .timed(
                "read schema_migrations",
                client
                    .query_raw("SELECT DISTINCT version FROM schema_migrations")
                    .fetch_all(),
            )
            .await?;
        for migration in schema::MIGRATIONS {
            if applied.contains(&migration.version) {
                continue;
            }
            let what = format!("migration {} ({})", migration.version, migration.name);
            for statement in migration.statements {
                self.execute_on(client, &what, &layout.render(statement, db))
                    .await?;
            }
            self.timed(
                &what,
                client
                    .query("INSERT INTO schema_migrations (version, name) VALUES (?, ?)")
                    .bind(migration.version)
                    .bind(migration.name)
                    .execute(),
            )
            .await?;
            tracing::info!(database = %db, version = migration.version, name = migration.name, "applied clickhouse migration");
        }
        self.apply_retention(client, layout).await
    }

    /// Sets, changes or removes the TTL of both tables so it matches the configuration.
    async fn apply_retention(&self, client: &Client, layout: Layout<'_>) -> Result<()> {
        let tables: Vec<(String, String)> = self
            .timed(
                "read table definitions",
                client
                    .query("SELECT name, engine_full FROM system.tables WHERE database = ?")
                    .bind(self.config.database.as_str())
                    .fetch_all(),
            )
            .await?;
        let seconds = self.config.retention.map(|r| r.as_secs());
        for (table, column) in schema::RETAINED_TABLES {
            let name = match layout {
                Layout::Single => (*table).to_owned(),
                _ => format!("{table}_local"),
            };
            let table = layout.table(table);
            let wanted = seconds.map(|s| schema::ttl_expression(column, s));
            let current = tables
                .iter()
                .find(|(found, _)| *found == name)
                .map(|(_, engine)| engine.as_str())
                .unwrap_or_default();
            if schema::ttl_is_current(current, wanted.as_deref()) {
                continue;
            }
            // Rewriting every existing part to apply the TTL at once would be a long mutation on
            // a big table; with `materialize_ttl_after_modify = 0` old parts expire as they merge.
            let statement = match &wanted {
                Some(expression) => format!(
                    "ALTER TABLE {table} MODIFY TTL {expression} SETTINGS materialize_ttl_after_modify = 0"
                ),
                None => format!("ALTER TABLE {table} REMOVE TTL"),
            };
            self.execute_on(client, "set the retention ttl", &statement)
                .await?;
        }
        Ok(())
    }

    /// Makes `events` and `attempts` on this node (on every node, `on_cluster`) `Distributed`
    /// tables with their local tables' columns: created if missing, replaced if a migration
    /// changed the local columns.
    async fn distribute(
        &self,
        client: &Client,
        cluster: &ClickHouseCluster,
        on_cluster: bool,
    ) -> Result<()> {
        let db = &self.config.database;
        for (table, _) in schema::RETAINED_TABLES {
            let local = self.columns(client, &Layout::Local.table(table)).await?;
            if self.columns(client, table).await? == local {
                continue;
            }
            let statement = schema::distributed_table(db, &cluster.name, table, &local, on_cluster);
            self.execute_on(client, "create a distributed table", &statement)
                .await?;
            tracing::info!(database = %db, table = %table, cluster = %cluster.name, "created the distributed table");
        }
        Ok(())
    }

    /// A table's columns as DDL, in order; empty if the table does not exist.
    async fn columns(&self, client: &Client, table: &str) -> Result<Vec<String>> {
        let rows: Vec<(String, String, String, String)> = self
            .timed(
                "read a table's columns",
                client
                    .query(
                        "SELECT name, type, default_kind, default_expression FROM system.columns \
                         WHERE database = ? AND table = ? ORDER BY position",
                    )
                    .bind(self.config.database.as_str())
                    .bind(table)
                    .fetch_all(),
            )
            .await?;
        Ok(rows
            .into_iter()
            .map(|(name, kind, default_kind, default)| {
                schema::column_ddl(&name, &kind, &default_kind, &default)
            })
            .collect())
    }
}
