//! The test cluster of ClickHouse: 2 shards × 2 replicas, four processes of the same
//! `chdb-core` wheel as the single server (`clickhouse.rs`), each serving HTTP for Sheaf and the
//! native protocol for the other nodes' `Distributed` tables, and all four naming the cluster
//! [`CLUSTER`] in their `remote_servers`.
//!
//! The replicas of a shard are plain `ReplacingMergeTree` tables that the `Distributed` table
//! writes to one by one (`internal_replication` off): the wheel never opens the interserver
//! port that `ReplicatedMergeTree` needs, and `ON CLUSTER` DDL needs a Keeper it does not run,
//! so this is the replication that can be run here. A production cluster replicates itself;
//! `docs/operations.md` says what differs.

use anyhow::Context;

use super::clickhouse::{self, ClusterNode, Instance};
use crate::process::{free_port, state_dir};

/// The cluster's name in every node's `remote_servers`.
pub const CLUSTER: &str = "sheaf_test";

const SHARDS: usize = 2;
const REPLICAS: usize = 2;
const NODES: usize = SHARDS * REPLICAS;

/// The ports tried first for node `i`'s HTTP and native listeners (`+ i`).
const PREFERRED_HTTP_PORT: u16 = 18131;
const PREFERRED_TCP_PORT: u16 = 19131;

/// What `up` found or started: every node's HTTP URL, shard by shard.
pub struct Up {
    pub nodes: Vec<String>,
    pub started: bool,
}

/// Node `i`: shard `i / REPLICAS + 1`, replica `i % REPLICAS + 1`.
fn instance(i: usize, node: Option<ClusterNode>) -> Instance {
    Instance {
        workdir: state_dir().join("clickhouse-cluster").join(format!(
            "shard{}-replica{}",
            i / REPLICAS + 1,
            i % REPLICAS + 1
        )),
        preferred_port: PREFERRED_HTTP_PORT + i as u16,
        stop_command: "cargo xtask services down",
        cluster_node: node,
    }
}

/// The nodes' HTTP ports, if all four run ours and answer.
fn running() -> Option<Vec<u16>> {
    (0..NODES)
        .map(|i| {
            let node = instance(i, None);
            clickhouse::running_pid(&node)?;
            let port = clickhouse::recorded_port(&node)?;
            clickhouse::ping(port).then_some(port)
        })
        .collect()
}

/// `<remote_servers>` with the cluster's shards, each replica by its native port.
fn remote_servers(tcp_ports: &[u16]) -> String {
    let shards: String = tcp_ports
        .chunks(REPLICAS)
        .map(|replicas| {
            let replicas: String = replicas
                .iter()
                .map(|port| format!("<replica><host>127.0.0.1</host><port>{port}</port></replica>"))
                .collect();
            format!("<shard><internal_replication>false</internal_replication>{replicas}</shard>")
        })
        .collect();
    format!("<remote_servers><{CLUSTER}>{shards}</{CLUSTER}></remote_servers>")
}

/// Starts the four nodes unless all of them run already. A partial cluster (a node died) is
/// stopped and started afresh, with ports chosen again, since every node's configuration names
/// every other's.
pub fn up() -> anyhow::Result<Up> {
    let url = |port: u16| format!("http://127.0.0.1:{port}");
    if let Some(ports) = running() {
        return Ok(Up {
            nodes: ports.into_iter().map(url).collect(),
            started: false,
        });
    }
    down()?;
    let mut http = Vec::with_capacity(NODES);
    let mut tcp = Vec::with_capacity(NODES);
    for i in 0..NODES {
        http.push(free_port(PREFERRED_HTTP_PORT + i as u16)?);
        tcp.push(free_port(PREFERRED_TCP_PORT + i as u16)?);
    }
    let servers = remote_servers(&tcp);
    let mut nodes = Vec::with_capacity(NODES);
    for i in 0..NODES {
        let mut node = instance(
            i,
            Some(ClusterNode {
                tcp_port: tcp[i],
                remote_servers: servers.clone(),
            }),
        );
        node.preferred_port = http[i];
        let up = clickhouse::up_in(&node)
            .with_context(|| format!("clickhouse cluster node {}", node.workdir.display()))?;
        nodes.push(up.url);
    }
    Ok(Up {
        nodes,
        started: true,
    })
}

/// Stops every node of ours that runs.
pub fn down() -> anyhow::Result<()> {
    let results: Vec<anyhow::Result<()>> = (0..NODES)
        .map(|i| clickhouse::down_in(&instance(i, None)))
        .collect();
    results.into_iter().collect()
}

pub fn status() -> anyhow::Result<()> {
    match running() {
        Some(ports) => println!(
            "clickhouse cluster ({CLUSTER}, {SHARDS} shards × {REPLICAS} replicas): running on HTTP ports {ports:?}"
        ),
        None => println!("clickhouse cluster: not running (all four nodes)"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cluster_has_two_shards_of_two_replicas_by_native_port() {
        let xml = remote_servers(&[1, 2, 3, 4]);
        assert_eq!(xml.matches("<shard>").count(), 2);
        assert!(xml.contains(
            "<shard><internal_replication>false</internal_replication>\
             <replica><host>127.0.0.1</host><port>1</port></replica>\
             <replica><host>127.0.0.1</host><port>2</port></replica></shard>"
        ));
        assert!(xml.starts_with("<remote_servers><sheaf_test>"));
    }
}
