//! The servers a `delivery` configuration uses, found by the process listening on each one's
//! port, and their CPU time per delivered event over a phase: Postgres (the postmaster and
//! every process it started), each ClickHouse node, each NATS node, read from
//! `/proc/<pid>/stat` before the phase's first publish and after its last delivery.

use std::time::Duration;

use sheaf_testenv::process::tree_cpu_time;

use crate::context::Ctx;

use super::{Backend, Phase};

pub(super) struct Servers {
    pub(super) postgres: Option<u32>,
    /// Every ClickHouse process of the configuration (each node of a cluster).
    pub(super) clickhouse: Vec<u32>,
    /// Every node of the NATS cluster, in the order of their URLs, in the JetStream
    /// configurations.
    pub(super) nats: Vec<u32>,
}

/// Their CPU time at one moment.
pub(super) struct ServersCpu {
    postgres: Option<Duration>,
    clickhouse: Option<Duration>,
    nats: Vec<Option<Duration>>,
}

impl Servers {
    pub(super) fn find(ctx: &Ctx, backend: Backend) -> Self {
        let listener = |url: &str| port_of(url).and_then(sheaf_testenv::process::listener_pid);
        let nodes = |urls: anyhow::Result<&[String]>| -> Vec<u32> {
            urls.map(|urls| urls.iter().filter_map(|url| listener(url)).collect())
                .unwrap_or_default()
        };
        let postgres = matches!(
            backend.stores(),
            Backend::Postgres
                | Backend::PostgresClickHouse
                | Backend::PostgresClickHouseCluster
                | Backend::JetStreamCluster1
        );
        let clickhouse = match backend.stores() {
            Backend::PostgresClickHouse => ctx
                .clickhouse()
                .ok()
                .and_then(listener)
                .into_iter()
                .collect(),
            Backend::PostgresClickHouseCluster | Backend::JetStreamCluster1 => {
                nodes(ctx.clickhouse_cluster().map(|(_, nodes)| nodes))
            }
            _ => Vec::new(),
        };
        let nats = match backend.stores() {
            Backend::JetStreamCluster1 => nodes(ctx.nats_cluster()),
            _ => Vec::new(),
        };
        Servers {
            postgres: postgres
                .then(|| ctx.postgres().ok().and_then(listener))
                .flatten(),
            clickhouse,
            nats,
        }
    }

    pub(super) fn cpu_time(&self) -> ServersCpu {
        ServersCpu {
            postgres: self.postgres.and_then(tree_cpu_time),
            // The nodes' sum; none if any of them cannot be read.
            clickhouse: (!self.clickhouse.is_empty())
                .then(|| {
                    self.clickhouse
                        .iter()
                        .map(|&pid| tree_cpu_time(pid))
                        .sum::<Option<Duration>>()
                })
                .flatten(),
            nats: self.nats.iter().map(|&pid| tree_cpu_time(pid)).collect(),
        }
    }

    pub(super) fn per_event(&self, before: ServersCpu, phase: &mut Phase) {
        let after = self.cpu_time();
        phase.postgres_cpu_us_per_event = cpu_per_event(before.postgres, after.postgres, phase);
        phase.clickhouse_cpu_us_per_event =
            cpu_per_event(before.clickhouse, after.clickhouse, phase);
        let nodes: Vec<Option<f64>> = before
            .nats
            .iter()
            .zip(&after.nats)
            .map(|(&b, &a)| cpu_per_event(b, a, phase))
            .collect();
        phase.nats_cpu_us_per_event = if nodes.is_empty() {
            None
        } else {
            nodes.iter().copied().sum()
        };
        phase.nats_node_cpu_us_per_event = nodes.into_iter().flatten().collect();
    }
}

/// Each `sheaf` process's CPU per delivered event between two readings, and their sum.
pub(super) fn sheaf_per_event(
    before: &[Option<Duration>],
    after: &[Option<Duration>],
    phase: &mut Phase,
) {
    let each: Vec<Option<f64>> = before
        .iter()
        .zip(after)
        .map(|(&b, &a)| cpu_per_event(b, a, phase))
        .collect();
    phase.sheaf_cpu_us_per_event = each.iter().copied().sum();
    phase.sheaf_process_cpu_us_per_event = if each.len() > 1 {
        each.into_iter().flatten().collect()
    } else {
        Vec::new()
    };
}

/// The port of a `scheme://[user[:password]@]host:port/…` URL.
fn port_of(url: &str) -> Option<u16> {
    let authority = url.split_once("://")?.1.split(['/', '?']).next()?;
    let host_port = authority
        .rsplit_once('@')
        .map_or(authority, |(_, rest)| rest);
    host_port.rsplit_once(':')?.1.parse().ok()
}

/// CPU µs per delivered event between two readings of a process's CPU time. The readings
/// bracket the phase (from before its first publish to after its last delivery was seen), so
/// they include the moments the process waited for the load: idle time costs no CPU.
fn cpu_per_event(before: Option<Duration>, after: Option<Duration>, phase: &Phase) -> Option<f64> {
    let used = after?.checked_sub(before?)?;
    (phase.delivered > 0).then(|| used.as_secs_f64() * 1e6 / phase.delivered as f64)
}
