//! ClickHouse for the scenarios: a database of the run's own (dropped at the end, also when the
//! scenario fails), raw statements, and what a tagged query cost the server according to
//! `system.query_log` (`ProfileEvents` user + system CPU, `read_bytes`).

use std::time::Duration;

use anyhow::Context as _;
use clickhouse::Client;
use sheaf_testenv::clickhouse::drop_database_blocking;

/// A database used by one run, dropped when this guard is dropped.
#[derive(Debug)]
pub struct ChDb {
    pub url: String,
    pub database: String,
    /// On a cluster, every node: the database is dropped on each.
    pub nodes: Vec<String>,
}

impl ChDb {
    /// A fresh database name (`<prefix>_<random>`) on the server at `url`; not created yet.
    pub fn new(url: &str, prefix: &str) -> Self {
        ChDb {
            url: url.to_owned(),
            database: sheaf_testenv::unique_name(prefix),
            nodes: Vec::new(),
        }
    }

    /// A fresh database name on every node of a cluster, reached through its first node.
    pub fn on_cluster(nodes: &[String], prefix: &str) -> Self {
        ChDb {
            url: nodes.first().cloned().unwrap_or_default(),
            database: sheaf_testenv::unique_name(prefix),
            nodes: nodes.to_vec(),
        }
    }

    /// Every server holding the database: the cluster's nodes, or the one server.
    pub fn servers(&self) -> &[String] {
        if self.nodes.is_empty() {
            std::slice::from_ref(&self.url)
        } else {
            &self.nodes
        }
    }

    /// A client whose default database is this one.
    pub fn client(&self) -> Client {
        Client::default()
            .with_url(self.url.as_str())
            .with_database(self.database.as_str())
    }

    /// Sheaf's store configuration for this database.
    pub fn config(&self) -> sheaf_clickhouse::ClickHouseConfig {
        sheaf_clickhouse::ClickHouseConfig::new(self.url.as_str(), self.database.as_str())
    }

    /// Runs one statement with extra settings.
    pub async fn execute_with(&self, sql: &str, settings: &[(&str, &str)]) -> anyhow::Result<()> {
        let mut client = self.client();
        for (name, value) in settings {
            client = client.with_setting(*name, *value);
        }
        client
            .query_raw(sql)
            .execute()
            .await
            .with_context(|| format!("clickhouse: {}", first_line(sql)))
    }

    /// Runs one statement.
    pub async fn execute(&self, sql: &str) -> anyhow::Result<()> {
        self.execute_with(sql, &[]).await
    }
}

impl Drop for ChDb {
    fn drop(&mut self) {
        for url in self.servers() {
            let dropped = drop_database_blocking(url, &self.database, Duration::from_secs(120));
            if let Err(why) = dropped {
                eprintln!(
                    "sheaf-bench: could not drop clickhouse database {} on {url}: {why}",
                    self.database
                );
            }
        }
    }
}

fn first_line(sql: &str) -> String {
    let line = sql.trim().lines().next().unwrap_or_default();
    line.chars().take(120).collect()
}

/// One finished query's cost, from `system.query_log`.
#[derive(Debug, Clone, clickhouse::Row, serde::Deserialize, serde::Serialize)]
pub struct QueryCost {
    pub read_bytes: u64,
    pub read_rows: u64,
    /// `ProfileEvents` user plus system CPU time, in microseconds.
    pub cpu_micros: u64,
    pub result_rows: u64,
    pub duration_ms: u64,
    /// Unix time in microseconds at which the query started.
    pub start_micros: i64,
}

/// Flushes the server's log buffers so `system.query_log` and `system.part_log` are complete.
pub async fn flush_logs(client: &Client) -> anyhow::Result<()> {
    client
        .query_raw("SYSTEM FLUSH LOGS")
        .execute()
        .await
        .context("SYSTEM FLUSH LOGS")
}

/// The finished queries tagged with `log_comment` (of `kind`, `Select` or `Insert`), in the order
/// they started, once at least `expected` are logged (or after ~10 s, with what there is: the
/// server logs a query after answering it, so the last ones may lag behind a flush).
pub async fn query_costs(
    client: &Client,
    log_comment: &str,
    kind: &str,
    expected: usize,
) -> anyhow::Result<Vec<QueryCost>> {
    let mut costs = Vec::new();
    for _ in 0..50 {
        flush_logs(client).await?;
        costs = client
            .query(
                "SELECT read_bytes, read_rows, \
                    ProfileEvents['UserTimeMicroseconds'] + ProfileEvents['SystemTimeMicroseconds'] AS cpu_micros, \
                    result_rows, query_duration_ms AS duration_ms, \
                    toUnixTimestamp64Micro(query_start_time_microseconds) AS start_micros \
                 FROM system.query_log \
                 WHERE type = 'QueryFinish' AND interface = 'HTTP' AND log_comment = ? \
                    AND query_kind = ? AND event_date >= yesterday() \
                 ORDER BY query_start_time_microseconds",
            )
            .bind(log_comment)
            .bind(kind)
            .fetch_all()
            .await
            .context("read system.query_log")?;
        if costs.len() >= expected {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(costs)
}

/// One table of a database on disk, every node of a cluster added up: its active parts'
/// rows and bytes (`system.parts`).
#[derive(Debug, Clone, clickhouse::Row, serde::Deserialize, serde::Serialize)]
pub struct TableOnDisk {
    pub table: String,
    /// Rows in the active parts, every replica's copy counted.
    pub rows: u64,
    pub bytes_on_disk: u64,
    /// Uncompressed bytes of the columns.
    pub bytes_uncompressed: u64,
    pub parts: u64,
}

/// The active parts of every table of `database`, summed over `nodes` (each replica counted:
/// what the cluster holds on its disks). Tables with no part are left out.
pub async fn tables_on_disk(nodes: &[String], database: &str) -> anyhow::Result<Vec<TableOnDisk>> {
    let mut total: Vec<TableOnDisk> = Vec::new();
    for node in nodes {
        let rows: Vec<TableOnDisk> = Client::default()
            .with_url(node.as_str())
            .query(
                "SELECT table, sum(rows) AS rows, sum(bytes_on_disk) AS bytes_on_disk, \
                    sum(data_uncompressed_bytes) AS bytes_uncompressed, count() AS parts \
                 FROM system.parts WHERE database = ? AND active \
                 GROUP BY table ORDER BY table",
            )
            .bind(database)
            .fetch_all()
            .await
            .with_context(|| format!("read system.parts on {node}"))?;
        for row in rows {
            match total.iter_mut().find(|t| t.table == row.table) {
                Some(t) => {
                    t.rows += row.rows;
                    t.bytes_on_disk += row.bytes_on_disk;
                    t.bytes_uncompressed += row.bytes_uncompressed;
                    t.parts += row.parts;
                }
                None => total.push(row),
            }
        }
    }
    Ok(total)
}

/// One kind of query a database received, every node added up, from `system.query_log`.
#[derive(Debug, Clone, clickhouse::Row, serde::Deserialize, serde::Serialize)]
pub struct QueriesOfKind {
    /// `Insert` or `Select`.
    pub kind: String,
    /// 1: a query a client sent; 0: one a node sent another (a `Distributed` table's insert
    /// into a replica, or its query to the other shard).
    pub initial: u8,
    pub queries: u64,
    /// `ProfileEvents` user plus system CPU time, in microseconds.
    pub cpu_micros: u64,
    /// Rows written, as the log counts them (an insert into a `Distributed` table counts its
    /// own replica's rows on top of the batch's).
    pub written_rows: u64,
}

/// The finished inserts and selects that touched `database` on each of `nodes`, by kind and
/// by whether a client or a node sent them, summed over the nodes (after `SYSTEM FLUSH LOGS`
/// on each).
pub async fn queries_by_kind(
    nodes: &[String],
    database: &str,
) -> anyhow::Result<Vec<QueriesOfKind>> {
    let mut total: Vec<QueriesOfKind> = Vec::new();
    for node in nodes {
        let client = Client::default().with_url(node.as_str());
        flush_logs(&client).await?;
        let rows: Vec<QueriesOfKind> = client
            .query(
                "SELECT toString(query_kind) AS kind, is_initial_query AS initial, \
                    count() AS queries, \
                    sum(ProfileEvents['UserTimeMicroseconds'] + ProfileEvents['SystemTimeMicroseconds']) AS cpu_micros, \
                    sum(written_rows) AS written_rows \
                 FROM system.query_log \
                 WHERE type = 'QueryFinish' AND has(databases, ?) \
                    AND query_kind IN ('Insert', 'Select') AND event_date >= yesterday() \
                 GROUP BY kind, initial ORDER BY kind, initial DESC",
            )
            .bind(database)
            .fetch_all()
            .await
            .with_context(|| format!("read system.query_log on {node}"))?;
        for row in rows {
            match total
                .iter_mut()
                .find(|t| t.kind == row.kind && t.initial == row.initial)
            {
                Some(t) => {
                    t.queries += row.queries;
                    t.cpu_micros += row.cpu_micros;
                    t.written_rows += row.written_rows;
                }
                None => total.push(row),
            }
        }
    }
    Ok(total)
}
