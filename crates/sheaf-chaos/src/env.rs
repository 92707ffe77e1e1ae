//! What every scenario runs with: the servers' URLs and the binaries xtask prepared, names no
//! other run uses, the settings every `sheaf` gets, and the fault switches (`chaos-ctl`).

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

/// The lease every scenario's `sheaf` runs with unless it says otherwise: short, so a crashed
/// process's claims come back within seconds.
pub const QUEUE_LEASE: Duration = Duration::from_secs(4);

/// The environment of a run.
#[derive(Debug)]
pub struct Ctx {
    /// `--quick`: small loads and short outages.
    pub quick: bool,
    /// The `sheaf` binary (`SHEAF_CHAOS_SHEAF_BIN`).
    pub sheaf_bin: PathBuf,
    /// The fault suite's own Postgres (`SHEAF_CHAOS_POSTGRES_URL`).
    pub postgres_url: String,
    /// The fault suite's own ClickHouse (`SHEAF_CHAOS_CLICKHOUSE_URL`).
    pub clickhouse_url: String,
    /// The fault suite's own ClickHouse cluster, 2 shards × 2 replicas
    /// (`SHEAF_CHAOS_CLICKHOUSE_CLUSTER`, `SHEAF_CHAOS_CLICKHOUSE_CLUSTER_NODES`): its nodes run
    /// only between `chaos-ctl clickhouse-cluster up` and `down`.
    pub clickhouse_cluster: sheaf_testenv::ClickHouseClusterEnv,
    /// The client URLs of the fault suite's own NATS JetStream cluster of 3 nodes, `n1` first
    /// (`SHEAF_CHAOS_NATS_CLUSTER_URLS`): its nodes run only between `chaos-ctl nats-cluster
    /// up` and `down`.
    pub nats_cluster: Vec<String>,
    /// The xtask binary that stops and starts those servers (`SHEAF_CHAOS_CTL`).
    pub ctl: PathBuf,
    /// Logs and the PID file (`SHEAF_CHAOS_DIR`).
    pub dir: PathBuf,
    /// A suffix no earlier run used, for schemas, databases and slots.
    pub run_id: String,
    /// A small pool for reading the queue and writing the CDC scenario's rows.
    pub pg: PgPool,
    /// For ClickHouse statements (dropping a scenario's database).
    pub http: reqwest::Client,
}

fn var(name: &str) -> anyhow::Result<String> {
    std::env::var(name).with_context(|| {
        format!("{name} is not set: run the fault suite with `cargo xtask chaos`, which prepares its servers")
    })
}

impl Ctx {
    /// Reads the variables xtask sets.
    pub async fn from_env(quick: bool) -> anyhow::Result<Self> {
        let postgres_url = var(sheaf_testenv::CHAOS_POSTGRES_URL_VAR)?;
        let pg = PgPoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(10))
            .connect(&postgres_url)
            .await
            .context("cannot connect to the fault suite's postgres")?;
        let micros = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_micros();
        Ok(Self {
            quick,
            sheaf_bin: var(sheaf_testenv::CHAOS_SHEAF_BIN_VAR)?.into(),
            postgres_url,
            clickhouse_url: var(sheaf_testenv::CHAOS_CLICKHOUSE_URL_VAR)?,
            clickhouse_cluster: sheaf_testenv::ClickHouseClusterEnv {
                name: var(sheaf_testenv::CHAOS_CLICKHOUSE_CLUSTER_VAR)?,
                nodes: var(sheaf_testenv::CHAOS_CLICKHOUSE_CLUSTER_NODES_VAR)?
                    .split(',')
                    .map(|node| node.trim().to_owned())
                    .collect(),
            },
            nats_cluster: var(sheaf_testenv::CHAOS_NATS_CLUSTER_URLS_VAR)?
                .split(',')
                .map(str::trim)
                .filter(|url| !url.is_empty())
                .map(str::to_owned)
                .collect(),
            ctl: var(sheaf_testenv::CHAOS_CTL_VAR)?.into(),
            dir: var(sheaf_testenv::CHAOS_DIR_VAR)?.into(),
            run_id: format!("{:x}", micros % 0xffff_ffff_ffff),
            pg,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()?,
        })
    }

    /// A Postgres schema, ClickHouse database or slot name of this run for `what`.
    pub fn unique(&self, what: &str) -> String {
        format!("chaos_{what}_{}", self.run_id)
    }

    /// Runs `chaos-ctl <args…>` (stop or start one of the fault suite's servers); returns how
    /// long it took.
    pub async fn ctl(&self, args: &[&str]) -> anyhow::Result<Duration> {
        let mut command = Command::new(&self.ctl);
        command.arg("chaos-ctl").args(args);
        let text = format!("chaos-ctl {}", args.join(" "));
        println!("  {text}");
        let started = Instant::now();
        let status = tokio::task::spawn_blocking(move || command.status())
            .await?
            .with_context(|| format!("cannot run {text}"))?;
        if !status.success() {
            bail!("{text} failed ({status})");
        }
        Ok(started.elapsed())
    }

    /// Polls Postgres with fresh connections until one succeeds (at most `timeout`); returns
    /// when. `pg_ctlcluster start` returns seconds after the server accepts connections, so a
    /// scenario measures the end of an outage with this, run next to the start.
    pub async fn postgres_accepts(&self, timeout: Duration) -> Option<Instant> {
        use sqlx::Connection as _;
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            let attempt = tokio::time::timeout(
                Duration::from_secs(1),
                sqlx::PgConnection::connect(&self.postgres_url),
            )
            .await;
            if let Ok(Ok(connection)) = attempt {
                let at = Instant::now();
                let _ = connection.close().await;
                return Some(at);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        None
    }

    /// Polls ClickHouse's `/ping` until it answers (at most `timeout`); returns when.
    pub async fn clickhouse_answers(&self, timeout: Duration) -> Option<Instant> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            let ping = self
                .http
                .get(format!("{}/ping", self.clickhouse_url))
                .timeout(Duration::from_secs(1))
                .send()
                .await;
            if ping.is_ok_and(|r| r.status().is_success()) {
                return Some(Instant::now());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        None
    }

    /// The settings every `sheaf` of the suite runs with: the shared deployment (queue, tenants
    /// and destinations in Postgres, the log in ClickHouse) in this scenario's own schema and
    /// database, loopback receivers allowed, a short retry schedule that never dead-letters
    /// within a run, and a short lease so a crashed process's claims return within seconds.
    pub fn sheaf_settings(&self, schema: &str, database: &str) -> Vec<(String, String)> {
        let lease = format!("{}s", QUEUE_LEASE.as_secs());
        [
            ("SHEAF_QUEUE", "postgres"),
            ("SHEAF_LOG_STORE", "clickhouse"),
            ("SHEAF_POSTGRES_URL", self.postgres_url.as_str()),
            ("SHEAF_POSTGRES_SCHEMA", schema),
            ("SHEAF_CLICKHOUSE_URL", self.clickhouse_url.as_str()),
            ("SHEAF_CLICKHOUSE_DATABASE", database),
            ("SHEAF_ALLOW_PRIVATE_DESTINATIONS", "true"),
            ("SHEAF_LOG", "info"),
            ("SHEAF_QUEUE_POLL_INTERVAL", "50ms"),
            ("SHEAF_RETRY_SCHEDULE", "1s,2s,4s"),
            ("SHEAF_RETRY_MAX_ATTEMPTS", "100"),
            ("SHEAF_DELIVERY_WORKERS", "16"),
            ("SHEAF_DELIVERY_TIMEOUT", "2s"),
            ("SHEAF_QUEUE_LEASE", lease.as_str()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
    }

    /// The settings of a `sheaf` on the in-memory stores (the harness's choice when no store is
    /// set) with the rest of [`Self::sheaf_settings`].
    pub fn memory_settings(&self) -> Vec<(String, String)> {
        self.sheaf_settings("unused", "unused")
            .into_iter()
            .filter(|(k, _)| {
                !matches!(
                    k.as_str(),
                    "SHEAF_QUEUE"
                        | "SHEAF_LOG_STORE"
                        | "SHEAF_POSTGRES_URL"
                        | "SHEAF_POSTGRES_SCHEMA"
                        | "SHEAF_CLICKHOUSE_URL"
                        | "SHEAF_CLICKHOUSE_DATABASE"
                )
            })
            .collect()
    }

    /// Drops a scenario's Postgres schema and ClickHouse database.
    pub async fn drop_stores(&self, schema: &str, database: &str) -> anyhow::Result<()> {
        sqlx::query(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
            .execute(&self.pg)
            .await?;
        self.clickhouse(&format!("DROP DATABASE IF EXISTS {database}"))
            .await?;
        Ok(())
    }

    /// Runs one ClickHouse statement over HTTP; returns its output.
    pub async fn clickhouse(&self, sql: &str) -> anyhow::Result<String> {
        self.clickhouse_at(&self.clickhouse_url, sql).await
    }

    /// Runs one statement on the ClickHouse server at `url` (a node of the cluster); returns
    /// its output.
    pub async fn clickhouse_at(&self, url: &str, sql: &str) -> anyhow::Result<String> {
        let response = self.http.post(url).body(sql.to_owned()).send().await?;
        let status = response.status();
        let text = response.text().await?;
        if !status.is_success() {
            bail!("clickhouse answered {status} to {sql:?}: {text}");
        }
        Ok(text)
    }
}
