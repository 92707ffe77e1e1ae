//! The test clusters of ClickHouse: 2 shards × 2 replicas, four processes of the same
//! `chdb-core` wheel as the single server (`clickhouse.rs`), each serving HTTP for Sheaf and the
//! native protocol for the other nodes' `Distributed` tables, and all four naming the cluster in
//! their `remote_servers`.
//!
//! Two clusters are run this way, each a [`Layout`]: the one `services up --cluster` runs for
//! the suites ([`Layout::shared`], cluster [`CLUSTER`] in `target/xtask/clickhouse-cluster/`),
//! and the fault suite's own, which `cargo xtask chaos` plans and its `clickhouse-replica`
//! scenario starts, kills a node of and starts that node again (`chaos.rs`). Every node keeps
//! its work directory (config, data, PID and port files) below the layout's base directory,
//! and the cluster records its ports in `ports` there, so a node started again gets the same
//! configuration and ports and finds its data.
//!
//! The replicas of a shard are plain `ReplacingMergeTree` tables that the `Distributed` table
//! writes to one by one (`internal_replication` off): the wheel never opens the interserver
//! port that `ReplicatedMergeTree` needs, and `ON CLUSTER` DDL needs a Keeper it does not run,
//! so this is the replication that can be run here. A production cluster replicates itself;
//! `docs/operations.md` says what differs.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};

use super::clickhouse::{self, ClusterNode, Instance};
use crate::process::{free_port, pid_alive, signal, state_dir};

/// The shared cluster's name in every node's `remote_servers`.
pub const CLUSTER: &str = "sheaf_test";

const SHARDS: usize = 2;
const REPLICAS: usize = 2;
const NODES: usize = SHARDS * REPLICAS;

/// Where a cluster's nodes live, what the cluster is called, and the ports it tries first.
#[derive(Debug, Clone)]
pub struct Layout {
    /// The cluster's name in every node's `remote_servers`.
    pub cluster: &'static str,
    /// One work directory per node below it, named as [`node_name`] says.
    pub base_dir: PathBuf,
    /// The ports tried first for node `i`'s HTTP and native listeners (`+ i`).
    pub preferred_http_port: u16,
    pub preferred_tcp_port: u16,
    /// The command that stops it, for error messages.
    pub stop_command: &'static str,
}

impl Layout {
    /// The cluster `services up --cluster` runs for the suites.
    pub fn shared() -> Self {
        Self {
            cluster: CLUSTER,
            base_dir: state_dir().join("clickhouse-cluster"),
            preferred_http_port: 18131,
            preferred_tcp_port: 19131,
            stop_command: "cargo xtask services down",
        }
    }

    fn ports_file(&self) -> PathBuf {
        self.base_dir.join("ports")
    }
}

/// What `up` found or started: every node's HTTP URL, shard by shard.
pub struct Up {
    pub nodes: Vec<String>,
    pub started: bool,
}

/// Node `i`'s name and work directory: shard `i / REPLICAS + 1`, replica `i % REPLICAS + 1`.
pub fn node_name(i: usize) -> String {
    format!("shard{}-replica{}", i / REPLICAS + 1, i % REPLICAS + 1)
}

/// The index of the node called `name` ([`node_name`]).
pub fn node_index(name: &str) -> Option<usize> {
    (0..NODES).find(|i| node_name(*i) == name)
}

fn url(port: u16) -> String {
    format!("http://127.0.0.1:{port}")
}

fn instance(layout: &Layout, i: usize, node: Option<ClusterNode>) -> Instance {
    Instance {
        workdir: layout.base_dir.join(node_name(i)),
        preferred_port: layout.preferred_http_port + i as u16,
        stop_command: layout.stop_command,
        cluster_node: node,
    }
}

/// Every node's HTTP and native port, as chosen when the cluster was planned or last started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ports {
    pub http: Vec<u16>,
    pub tcp: Vec<u16>,
}

impl Ports {
    /// The nodes' HTTP URLs, shard by shard.
    pub fn urls(&self) -> Vec<String> {
        self.http.iter().copied().map(url).collect()
    }

    fn text(&self) -> String {
        self.http
            .iter()
            .zip(&self.tcp)
            .map(|(http, tcp)| format!("{http} {tcp}\n"))
            .collect()
    }

    fn parse(text: &str) -> Option<Self> {
        let mut ports = Self {
            http: Vec::new(),
            tcp: Vec::new(),
        };
        for line in text.lines() {
            let (http, tcp) = line.split_once(' ')?;
            ports.http.push(http.trim().parse().ok()?);
            ports.tcp.push(tcp.trim().parse().ok()?);
        }
        (ports.http.len() == NODES).then_some(ports)
    }
}

fn recorded_ports(layout: &Layout) -> Option<Ports> {
    Ports::parse(&std::fs::read_to_string(layout.ports_file()).ok()?)
}

/// The nodes' HTTP ports, if all four run ours and answer.
fn running(layout: &Layout) -> Option<Vec<u16>> {
    (0..NODES)
        .map(|i| {
            let node = instance(layout, i, None);
            clickhouse::running_pid(&node)?;
            let port = clickhouse::recorded_port(&node)?;
            clickhouse::ping(port).then_some(port)
        })
        .collect()
}

/// `<remote_servers>` with the cluster's shards, each replica by its native port.
fn remote_servers(cluster: &str, tcp_ports: &[u16]) -> String {
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
    format!("<remote_servers><{cluster}>{shards}</{cluster}></remote_servers>")
}

/// Chooses every node's ports (the recorded ones while they are free, else the preferred ones,
/// else any free ones) and records them. Nothing is started: `cargo xtask chaos` hands the URLs
/// to the fault suite up front and starts the nodes only if a scenario asks for them.
pub fn plan(layout: &Layout) -> anyhow::Result<Ports> {
    // A running cluster keeps its ports.
    if let Some(http) = running(layout)
        && let Some(recorded) = recorded_ports(layout).filter(|r| r.http == http)
    {
        return Ok(recorded);
    }
    // A partial one is stopped: every node's configuration names the others' ports, which may
    // change now.
    down_in(layout)?;
    let recorded = recorded_ports(layout);
    let mut ports = Ports {
        http: Vec::with_capacity(NODES),
        tcp: Vec::with_capacity(NODES),
    };
    for i in 0..NODES {
        let (http, tcp) = recorded.as_ref().map_or(
            (
                layout.preferred_http_port + i as u16,
                layout.preferred_tcp_port + i as u16,
            ),
            |r| (r.http[i], r.tcp[i]),
        );
        ports.http.push(free_port(http)?);
        ports.tcp.push(free_port(tcp)?);
    }
    std::fs::create_dir_all(&layout.base_dir)?;
    std::fs::write(layout.ports_file(), ports.text())?;
    Ok(ports)
}

/// Starts node `i` on the ports of `ports` (whose `remote_servers` names every node), unless
/// it runs already; fails when its HTTP port is taken by something else.
fn start_node(layout: &Layout, ports: &Ports, i: usize) -> anyhow::Result<String> {
    let mut node = instance(
        layout,
        i,
        Some(ClusterNode {
            tcp_port: ports.tcp[i],
            remote_servers: remote_servers(layout.cluster, &ports.tcp),
        }),
    );
    node.preferred_port = ports.http[i];
    let up = clickhouse::up_in(&node)
        .with_context(|| format!("clickhouse cluster node {}", node.workdir.display()))?;
    if up.port != ports.http[i] {
        clickhouse::down_in(&node)?;
        bail!(
            "clickhouse cluster node {} must listen on port {}, but that port is taken; free it or remove {}",
            node_name(i),
            ports.http[i],
            layout.ports_file().display()
        );
    }
    Ok(up.url)
}

/// Starts every node of a planned cluster ([`plan`]) that does not run, on its recorded ports.
pub fn up_planned(layout: &Layout) -> anyhow::Result<Vec<String>> {
    let ports = recorded_ports(layout).with_context(|| {
        format!(
            "no ports recorded in {}: the cluster was never planned",
            layout.ports_file().display()
        )
    })?;
    (0..NODES).map(|i| start_node(layout, &ports, i)).collect()
}

/// Starts the four nodes unless all of them run already. A partial cluster (a node died) is
/// stopped and started afresh, with ports chosen again, since every node's configuration names
/// every other's.
pub fn up_in(layout: &Layout) -> anyhow::Result<Up> {
    if let Some(ports) = running(layout) {
        return Ok(Up {
            nodes: ports.into_iter().map(url).collect(),
            started: false,
        });
    }
    plan(layout)?;
    Ok(Up {
        nodes: up_planned(layout)?,
        started: true,
    })
}

/// The shared cluster, for `services up --cluster`.
pub fn up() -> anyhow::Result<Up> {
    up_in(&Layout::shared())
}

/// SIGKILLs node `name` by its recorded PID, as a crash would end it: its work directory, data
/// and port files stay, so [`start_node_named`] brings it back as it was. Returns the PID.
pub fn kill_node(layout: &Layout, name: &str) -> anyhow::Result<u32> {
    let i = node_index(name).with_context(|| format!("no cluster node {name}"))?;
    let node = instance(layout, i, None);
    let pid = clickhouse::running_pid(&node)
        .with_context(|| format!("clickhouse cluster node {name} is not running"))?;
    signal(pid, "KILL")?;
    for _ in 0..100 {
        if !pid_alive(pid) {
            println!("xtask: killed clickhouse cluster node {name} (pid {pid}) with SIGKILL");
            return Ok(pid);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("clickhouse cluster node {name} (pid {pid}) survived SIGKILL")
}

/// Starts node `name` again with the configuration, ports and data it had.
pub fn start_node_named(layout: &Layout, name: &str) -> anyhow::Result<String> {
    let i = node_index(name).with_context(|| format!("no cluster node {name}"))?;
    let ports = recorded_ports(layout).with_context(|| {
        format!(
            "no ports recorded in {}: the cluster was never started",
            layout.ports_file().display()
        )
    })?;
    start_node(layout, &ports, i)
}

/// Stops every node of ours that runs, by its recorded PID.
pub fn down_in(layout: &Layout) -> anyhow::Result<()> {
    let results: Vec<anyhow::Result<()>> = (0..NODES)
        .map(|i| clickhouse::down_in(&instance(layout, i, None)))
        .collect();
    results.into_iter().collect()
}

/// Stops the shared cluster, for `services down`.
pub fn down() -> anyhow::Result<()> {
    down_in(&Layout::shared())
}

pub fn status() -> anyhow::Result<()> {
    match running(&Layout::shared()) {
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
        let xml = remote_servers(CLUSTER, &[1, 2, 3, 4]);
        assert_eq!(xml.matches("<shard>").count(), 2);
        assert!(xml.contains(
            "<shard><internal_replication>false</internal_replication>\
             <replica><host>127.0.0.1</host><port>1</port></replica>\
             <replica><host>127.0.0.1</host><port>2</port></replica></shard>"
        ));
        assert!(xml.starts_with("<remote_servers><sheaf_test>"));
    }

    #[test]
    fn nodes_are_named_shard_by_shard_and_found_by_name() {
        let names: Vec<String> = (0..NODES).map(node_name).collect();
        assert_eq!(
            names,
            [
                "shard1-replica1",
                "shard1-replica2",
                "shard2-replica1",
                "shard2-replica2"
            ]
        );
        assert_eq!(node_index("shard1-replica2"), Some(1));
        assert_eq!(node_index("shard3-replica1"), None);
    }

    #[test]
    fn recorded_ports_read_back_as_written() {
        let ports = Ports {
            http: vec![1, 2, 3, 4],
            tcp: vec![5, 6, 7, 8],
        };
        assert_eq!(Ports::parse(&ports.text()), Some(ports));
        assert_eq!(Ports::parse("1 5\n2 6\n"), None, "a node short");
    }
}
