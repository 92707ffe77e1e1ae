//! What every scenario is given: the size to run at, where results go, and where the servers are.

use std::path::{Path, PathBuf};

use anyhow::Context as _;

/// The variable naming the `sheaf` binary the service scenarios spawn (`cargo xtask bench` builds
/// it and sets this).
pub use sheaf_testenv::BENCH_SHEAF_BIN_VAR as SHEAF_BIN_VAR;

/// One run's settings.
#[derive(Debug, Clone)]
pub struct Ctx {
    /// Small sizes that finish in seconds: proves a scenario still works, measures nothing.
    pub quick: bool,
    /// Where `<scenario>.json` and `<scenario>.svg` go.
    pub out_dir: PathBuf,
    postgres_url: Option<String>,
    clickhouse_url: Option<String>,
    /// The ClickHouse cluster's name and its nodes' URLs (`services up --cluster`).
    clickhouse_cluster: Option<(String, Vec<String>)>,
    rabbitmq_url: Option<String>,
    nats_url: Option<String>,
    /// Every client URL of the NATS JetStream cluster (`services up --cluster`).
    nats_cluster_urls: Option<Vec<String>>,
    sheaf_bin: Option<PathBuf>,
}

impl Ctx {
    /// Reads the servers' URLs from the variables `cargo xtask services up` writes.
    pub fn from_env(quick: bool, out: Option<String>) -> anyhow::Result<Self> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let out_dir = match out {
            Some(dir) => PathBuf::from(dir),
            // benches/ sits one level below the workspace root.
            None => Path::new(env!("CARGO_MANIFEST_DIR"))
                .parent()
                .context("benches/ has a parent")?
                .join("target")
                .join("bench"),
        };
        Ok(Ctx {
            quick,
            out_dir,
            postgres_url: var(sheaf_testenv::POSTGRES_URL_VAR),
            clickhouse_url: var(sheaf_testenv::CLICKHOUSE_URL_VAR),
            clickhouse_cluster: var(sheaf_testenv::CLICKHOUSE_CLUSTER_VAR).zip(
                var(sheaf_testenv::CLICKHOUSE_CLUSTER_NODES_VAR)
                    .map(|nodes| nodes.split(',').map(|n| n.trim().to_owned()).collect()),
            ),
            rabbitmq_url: var(sheaf_testenv::RABBITMQ_URL_VAR),
            nats_url: var(sheaf_testenv::NATS_URL_VAR),
            nats_cluster_urls: var(sheaf_testenv::NATS_CLUSTER_URLS_VAR)
                .map(|urls| urls.split(',').map(|u| u.trim().to_owned()).collect()),
            sheaf_bin: var(SHEAF_BIN_VAR).map(PathBuf::from),
        })
    }

    /// The Postgres URL, or an error that says how to get one.
    pub fn postgres(&self) -> anyhow::Result<&str> {
        self.postgres_url.as_deref().with_context(|| {
            format!(
                "{} is not set: run through `cargo xtask bench`, which starts the servers",
                sheaf_testenv::POSTGRES_URL_VAR
            )
        })
    }

    /// The ClickHouse cluster's name and every node's HTTP URL, or an error that says how to
    /// get them.
    pub fn clickhouse_cluster(&self) -> anyhow::Result<(&str, &[String])> {
        self.clickhouse_cluster
            .as_ref()
            .map(|(name, nodes)| (name.as_str(), nodes.as_slice()))
            .with_context(|| {
                format!(
                    "{} is not set: run through `cargo xtask bench`, which starts the cluster for `delivery`, `burst` and `clickhouse-insert`",
                    sheaf_testenv::CLICKHOUSE_CLUSTER_VAR
                )
            })
    }

    /// The ClickHouse HTTP URL, or an error that says how to get one.
    pub fn clickhouse(&self) -> anyhow::Result<&str> {
        self.clickhouse_url.as_deref().with_context(|| {
            format!(
                "{} is not set: run through `cargo xtask bench`, which starts the servers",
                sheaf_testenv::CLICKHOUSE_URL_VAR
            )
        })
    }

    /// The RabbitMQ URL (`amqp://…/%2f`), or an error that says how to get one.
    pub fn rabbitmq(&self) -> anyhow::Result<&str> {
        self.rabbitmq_url.as_deref().with_context(|| {
            format!(
                "{} is not set: run through `cargo xtask bench`, which starts the servers",
                sheaf_testenv::RABBITMQ_URL_VAR
            )
        })
    }

    /// The NATS URL (`nats://…`, JetStream enabled), or an error that says how to get one.
    pub fn nats(&self) -> anyhow::Result<&str> {
        self.nats_url.as_deref().with_context(|| {
            format!(
                "{} is not set: run through `cargo xtask bench`, which starts the servers",
                sheaf_testenv::NATS_URL_VAR
            )
        })
    }

    /// Every client URL of the NATS JetStream cluster (3 nodes, `n1` first), or an error that
    /// says how to get them.
    pub fn nats_cluster(&self) -> anyhow::Result<&[String]> {
        self.nats_cluster_urls.as_deref().with_context(|| {
            format!(
                "{} is not set: run through `cargo xtask bench`, which starts the cluster for `delivery`",
                sheaf_testenv::NATS_CLUSTER_URLS_VAR
            )
        })
    }

    /// The `sheaf` binary, or an error that says how to get one.
    pub fn sheaf_bin(&self) -> anyhow::Result<&Path> {
        let bin = self.sheaf_bin.as_deref().with_context(|| {
            format!(
                "{SHEAF_BIN_VAR} is not set: run through `cargo xtask bench`, which builds `sheaf`"
            )
        })?;
        anyhow::ensure!(
            bin.is_file(),
            "{SHEAF_BIN_VAR}={} is not a file",
            bin.display()
        );
        Ok(bin)
    }

    /// `full` at full size, `quick` under `--quick`.
    pub fn size<T>(&self, full: T, quick: T) -> T {
        if self.quick { quick } else { full }
    }
}
