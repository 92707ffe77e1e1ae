//! What every ClickHouse test needs: a database of its own (dropped when the test ends, passed
//! or failed), a store on it, a raw client for setup, and `system.query_log` readings.

use std::time::Duration;

use clickhouse::Client;
use sheaf_clickhouse::{
    ClickHouseCluster, ClickHouseConfig, ClickHouseLogStore, ClusterReplication,
};
use sheaf_testenv::ClickHouseClusterEnv;
use sheaf_testenv::clickhouse::drop_database_blocking;

/// A database used by one test, dropped when this value is dropped (also when the test panics).
pub struct TestDb {
    pub url: String,
    pub database: String,
    /// On a cluster: its name and every node (the database is on each).
    pub cluster: Option<ClickHouseClusterEnv>,
}

impl TestDb {
    /// A fresh, not yet created, database name on the server at `url`.
    pub fn new(url: &str) -> Self {
        TestDb {
            url: url.to_owned(),
            database: sheaf_testenv::unique_name("sheaf_ch"),
            cluster: None,
        }
    }

    /// A fresh database name on every node of `cluster`, queried through its first node.
    pub fn on_cluster(cluster: ClickHouseClusterEnv) -> Self {
        TestDb {
            url: cluster.nodes[0].clone(),
            database: sheaf_testenv::unique_name("sheaf_chc"),
            cluster: Some(cluster),
        }
    }

    /// The store's configuration for this database, with the defaults otherwise.
    pub fn config(&self) -> ClickHouseConfig {
        let mut config = ClickHouseConfig::new(self.url.as_str(), self.database.as_str());
        config.cluster = self.cluster.as_ref().map(|c| ClickHouseCluster {
            name: c.name.clone(),
            nodes: c.nodes.clone(),
            replication: ClusterReplication::Distributed,
        });
        config
    }

    /// A client of the `default` user on node `i` of the cluster, whose default database is
    /// this one.
    pub fn node_client(&self, i: usize) -> Client {
        let cluster = self.cluster.as_ref().expect("a cluster database");
        Client::default()
            .with_url(cluster.nodes[i].as_str())
            .with_database(self.database.as_str())
    }

    /// A store on this database with `config`, migrated.
    pub async fn store_with(&self, config: ClickHouseConfig) -> ClickHouseLogStore {
        let store = ClickHouseLogStore::connect(config).expect("connect");
        store.migrate().await.expect("migrate");
        store
    }

    /// A store on this database with the default configuration, migrated.
    pub async fn store(&self) -> ClickHouseLogStore {
        self.store_with(self.config()).await
    }

    /// A client of the `default` user whose default database is this one, for setup and
    /// inspection.
    pub fn client(&self) -> Client {
        Client::default()
            .with_url(self.url.as_str())
            .with_database(self.database.as_str())
    }

    /// Runs one statement (DDL, `SYSTEM …`, `INSERT … SELECT`) as the `default` user.
    pub async fn execute(&self, sql: &str) {
        self.client()
            .query_raw(sql)
            .execute()
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let urls = match &self.cluster {
            Some(cluster) => cluster.nodes.clone(),
            None => vec![self.url.clone()],
        };
        for url in urls {
            let dropped = drop_database_blocking(&url, &self.database, Duration::from_secs(60));
            if let Err(why) = dropped {
                eprintln!(
                    "could not drop test database {} on {url}: {why}",
                    self.database
                );
            }
        }
    }
}

/// One finished query's cost, from `system.query_log`.
#[derive(Debug, Clone, clickhouse::Row, serde::Deserialize)]
pub struct QueryCost {
    pub read_bytes: u64,
    pub read_rows: u64,
    /// `ProfileEvents` user plus system CPU time, in microseconds.
    pub cpu_micros: u64,
    pub result_rows: u64,
}

/// The costs of the finished HTTP queries tagged with `log_comment`, in the order they ran,
/// once `expected` of them are logged (or after 10 s, with what there is).
///
/// The server logs a query after it has answered, so a query the caller just saw finish may
/// not be in the log buffer yet when `SYSTEM FLUSH LOGS` runs: the read is repeated until the
/// count is reached.
pub async fn query_costs(db: &TestDb, log_comment: &str, expected: usize) -> Vec<QueryCost> {
    let mut costs = Vec::new();
    for _ in 0..50 {
        db.execute("SYSTEM FLUSH LOGS").await;
        costs = db
            .client()
            .query(
                "SELECT read_bytes, read_rows, \
                    ProfileEvents['UserTimeMicroseconds'] + ProfileEvents['SystemTimeMicroseconds'] AS cpu_micros, \
                    result_rows \
                 FROM system.query_log \
                 WHERE type = 'QueryFinish' AND interface = 'HTTP' AND log_comment = ? \
                    AND event_date >= yesterday() \
                 ORDER BY event_time_microseconds",
            )
            .bind(log_comment)
            .fetch_all()
            .await
            .expect("read system.query_log");
        if costs.len() >= expected {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    costs
}

/// The median of `values` (the upper one of the middle two for an even count).
pub fn median(mut values: Vec<f64>) -> f64 {
    assert!(!values.is_empty(), "median of nothing");
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}
