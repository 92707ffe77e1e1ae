//! The ClickHouse log store.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use sheaf_clickhouse::{
    ClickHouseCluster, ClickHouseConfig, ClickHouseLogStore, ClusterReplication,
};
use sheaf_coalesce::WriteConfig;
use sheaf_store::LogStore;

use super::{ClickHouseReplication, ClickHouseSettings};

/// The URL may carry `user:password@`; the store takes them as separate fields.
pub(super) async fn connect(
    settings: &ClickHouseSettings,
    ca_file: Option<&Path>,
    write: WriteConfig,
    migrate: bool,
) -> anyhow::Result<Arc<dyn LogStore>> {
    let url = settings
        .url
        .as_deref()
        .context("SHEAF_CLICKHOUSE_URL is required")?;
    let database = settings.database.as_str();
    let mut parsed =
        url::Url::parse(url).map_err(|e| anyhow::anyhow!("invalid SHEAF_CLICKHOUSE_URL: {e}"))?;
    let user = (!parsed.username().is_empty()).then(|| parsed.username().to_owned());
    let password = parsed.password().map(str::to_owned);
    let _ = parsed.set_username("");
    let _ = parsed.set_password(None);
    let mut config = ClickHouseConfig::new(parsed.as_str().trim_end_matches('/'), database);
    config.user = user;
    config.password = password;
    config.ca_file = ca_file.map(Path::to_owned);
    if let Some(name) = &settings.cluster {
        // The nodes log in as the URL does; a login written into a node's URL is not used.
        let nodes = settings
            .cluster_nodes
            .iter()
            .map(|node| {
                let mut node = url::Url::parse(node).map_err(|e| {
                    anyhow::anyhow!("invalid SHEAF_CLICKHOUSE_CLUSTER_NODES entry: {e}")
                })?;
                let _ = node.set_username("");
                let _ = node.set_password(None);
                Ok(node.as_str().trim_end_matches('/').to_owned())
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        config.cluster = Some(ClickHouseCluster {
            name: name.clone(),
            nodes,
            replication: match settings.cluster_replication {
                ClickHouseReplication::Distributed => ClusterReplication::Distributed,
                ClickHouseReplication::Replicated => ClusterReplication::Replicated,
            },
        });
    }
    let encrypted = parsed.scheme() == "https";
    // The service's own write coalescer in front of the store issues one `insert_many` at a
    // time, already gathered and bounded; the store's per-table coalescers then only ever see
    // one batch queued, so waiting there would add latency and gather nothing.
    config.write = WriteConfig {
        max_wait: std::time::Duration::ZERO,
        ..write
    };
    let store = ClickHouseLogStore::connect(config)
        .context("invalid SHEAF_CLICKHOUSE_URL or SHEAF_CLICKHOUSE_DATABASE")?;
    if migrate {
        store
            .migrate()
            .await
            .context(if settings.cluster.is_some() {
                "cannot migrate the clickhouse log tables on every node (SHEAF_CLICKHOUSE_CLUSTER_NODES)"
            } else {
                "cannot migrate the clickhouse log tables (SHEAF_CLICKHOUSE_URL)"
            })?;
    }
    if encrypted {
        tracing::info!(
            certificate = "chain and host name",
            "clickhouse connection encrypted (https)"
        );
    } else {
        tracing::info!("clickhouse connection not encrypted (http)");
    }
    Ok(Arc::new(store))
}
