//! [`ClickHouseConfig`]: where the server is, which database holds the log, how writes coalesce
//! and how long records are kept.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use sheaf_coalesce::WriteConfig;
use sheaf_store::{Error, Result};

/// Longest accepted database name; ClickHouse allows more, but a name this long is a mistake.
const MAX_DATABASE_LEN: usize = 64;

/// Everything [`ClickHouseLogStore::connect`](crate::ClickHouseLogStore::connect) needs.
///
/// Plain data, filled by the service from its own configuration. Start from
/// [`ClickHouseConfig::new`] and change the fields that differ.
#[derive(Clone)]
pub struct ClickHouseConfig {
    /// The server's HTTP endpoint, e.g. `http://127.0.0.1:8123`, or `https://…:8443` for TLS
    /// (the certificate is always verified, name included).
    pub url: String,
    /// A PEM file of CA certificates trusted for `https://` besides the bundled public roots
    /// (a private CA, a self-managed server's CA).
    pub ca_file: Option<PathBuf>,
    /// The database that holds the `events` and `attempts` tables; [`migrate`] creates it.
    /// ASCII letters, digits and `_`, not starting with a digit.
    ///
    /// [`migrate`]: crate::ClickHouseLogStore::migrate
    pub database: String,
    /// The user to log in as; `None` is the server's `default` user.
    pub user: Option<String>,
    /// That user's password.
    pub password: Option<String>,
    /// How long records are kept, by their own time (a table TTL applied by
    /// [`migrate`](crate::ClickHouseLogStore::migrate)); `None` keeps them forever. ClickHouse
    /// removes expired rows when it merges parts, so they may stay readable for a while after.
    pub retention: Option<Duration>,
    /// Bounds and wait of the write coalescers. Each table (`events`, `attempts`) has its own
    /// coalescer with these settings, so each ClickHouse part is bounded by them.
    pub write: WriteConfig,
    /// How long one request (query or insert) may take before it fails as
    /// [`Unavailable`](sheaf_store::ErrorKind::Unavailable).
    pub request_timeout: Duration,
    /// Server settings sent with every query and insert, e.g. `max_execution_time`. Tests use
    /// it for `log_comment` and `optimize_on_insert`.
    pub settings: Vec<(String, String)>,
    /// A sharded cluster instead of one server; `None` is one server at [`url`](Self::url).
    pub cluster: Option<ClickHouseCluster>,
}

/// The log on a ClickHouse cluster: on every node, local tables with the single-server layout
/// (`events_local`, `attempts_local`), and `events` and `attempts` as `Distributed` tables over
/// them, sharded by a hash of `(tenant_id, event_id)` so that an event and all its attempts
/// live on one shard, where deduplication and the latest-attempt lookup stay local. The
/// cluster itself (its shards and replicas) is the servers' `remote_servers` configuration;
/// Sheaf names it and lists the nodes, and queries go to [`ClickHouseConfig::url`], which may
/// be any node (or a load balancer in front of them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClickHouseCluster {
    /// The cluster's name in the servers' `remote_servers`.
    pub name: String,
    /// Every node's HTTP endpoint (every replica of every shard): with
    /// [`ClusterReplication::Distributed`] migrations run on each, since they create the local
    /// tables. Same login, CA file and settings as the store's. Unused (may be empty) with
    /// [`ClusterReplication::Replicated`].
    pub nodes: Vec<String>,
    /// Who copies a shard's rows to its replicas.
    pub replication: ClusterReplication,
}

/// How a cluster's replicas get their rows, which decides the local tables' engine and how the
/// schema reaches the nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClusterReplication {
    /// The `Distributed` table writes every replica itself (the cluster's
    /// `internal_replication` off); the local tables are `ReplacingMergeTree`, created node by
    /// node from [`ClickHouseCluster::nodes`]. Needs nothing but the servers; an insert needs
    /// every replica up.
    #[default]
    Distributed,
    /// The servers replicate (`internal_replication` on): the local tables are
    /// `ReplicatedReplacingMergeTree` at `/clickhouse/tables/{shard}/<database>/<table>` with
    /// replica `{replica}` (the servers' macros), and the schema is created with `ON CLUSTER`
    /// DDL from [`ClickHouseConfig::url`] alone. Needs ClickHouse Keeper and the two macros on
    /// every node; an insert needs one replica per shard.
    Replicated,
}

impl ClickHouseConfig {
    /// The server at `url`, database `database`, the `default` user, no retention, the write
    /// coalescer's defaults and a 30 s request timeout.
    ///
    /// 30 s is far above a healthy lookup (a few milliseconds here, see the crate docs) and an
    /// insert of a full 16 MiB write, and short enough that a hung server shows up as
    /// `Unavailable` before the service's own health checks give up on it.
    pub fn new(url: impl Into<String>, database: impl Into<String>) -> Self {
        ClickHouseConfig {
            url: url.into(),
            ca_file: None,
            database: database.into(),
            user: None,
            password: None,
            retention: None,
            write: WriteConfig::default(),
            request_timeout: Duration::from_secs(30),
            settings: Vec::new(),
            cluster: None,
        }
    }

    /// [`Error::InvalidInput`] unless the database name is a plain identifier, the URL is
    /// HTTP(S), the timeout is not zero, the retention is at least a second, and a cluster has
    /// a plain name and at least one node, each an HTTP(S) URL.
    pub fn validate(&self) -> Result<()> {
        validate_database(&self.database)?;
        validate_url("url", &self.url)?;
        if let Some(cluster) = &self.cluster {
            validate_identifier("cluster name", &cluster.name)?;
            if cluster.nodes.is_empty() && cluster.replication == ClusterReplication::Distributed {
                return Err(Error::invalid_input(
                    "clickhouse cluster nodes must list every node's HTTP URL; none was given",
                ));
            }
            for node in &cluster.nodes {
                validate_url("cluster node", node)?;
            }
        }
        if let Some(path) = &self.ca_file {
            sheaf_tls::roots(Some(path))
                .map_err(|e| Error::invalid_input(format!("clickhouse {e}")))?;
        }
        if self.request_timeout.is_zero() {
            return Err(Error::invalid_input(
                "clickhouse request_timeout must be greater than zero",
            ));
        }
        if self.retention.is_some_and(|r| r.as_secs() == 0) {
            return Err(Error::invalid_input(
                "clickhouse retention must be at least one second",
            ));
        }
        self.write
            .validate()
            .map_err(|e| Error::invalid_input(format!("clickhouse {e}")))?;
        Ok(())
    }
}

/// The database name as the DDL needs it: a bare identifier, so it can be written into
/// statements without quoting rules to get wrong.
pub(crate) fn validate_database(name: &str) -> Result<()> {
    validate_identifier("database", name)
}

/// A name written into DDL: 1 to 64 ASCII letters, digits or `_`, not starting with a digit.
fn validate_identifier(what: &str, name: &str) -> Result<()> {
    let valid = !name.is_empty()
        && name.len() <= MAX_DATABASE_LEN
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && !name.as_bytes()[0].is_ascii_digit();
    if valid {
        Ok(())
    } else {
        Err(Error::invalid_input(format!(
            "clickhouse {what} {name:?} must be 1 to {MAX_DATABASE_LEN} ASCII letters, digits or '_', not starting with a digit"
        )))
    }
}

fn validate_url(what: &str, url: &str) -> Result<()> {
    if url.starts_with("http://") || url.starts_with("https://") {
        Ok(())
    } else {
        Err(Error::invalid_input(format!(
            "clickhouse {what} {:?} must start with http:// or https://",
            redact_url(url)
        )))
    }
}

/// The URL without its query string and user info, for messages.
fn redact_url(url: &str) -> String {
    let without_query = url.split('?').next().unwrap_or_default();
    match without_query.split_once('@') {
        Some((_, host)) => format!("…@{host}"),
        None => without_query.to_owned(),
    }
}

impl fmt::Debug for ClickHouseConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClickHouseConfig")
            .field("url", &redact_url(&self.url))
            .field("ca_file", &self.ca_file)
            .field("database", &self.database)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("retention", &self.retention)
            .field("write", &self.write)
            .field("request_timeout", &self.request_timeout)
            .field("settings", &self.settings)
            .field(
                "cluster",
                &self.cluster.as_ref().map(|c| {
                    (
                        &c.name,
                        c.nodes.iter().map(|n| redact_url(n)).collect::<Vec<_>>(),
                    )
                }),
            )
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sheaf_store::ErrorKind;

    #[test]
    fn database_names_are_plain_identifiers() {
        for good in ["sheaf", "sheaf_log_2", "_x", "A1"] {
            assert!(validate_database(good).is_ok(), "{good}");
        }
        for bad in ["", "1abc", "a-b", "a.b", "a b", "x`y", &"a".repeat(65)] {
            assert_eq!(
                validate_database(bad).map_err(|e| e.kind()),
                Err(ErrorKind::InvalidInput),
                "{bad}"
            );
        }
    }

    #[test]
    fn validation_names_the_field() {
        let mut config = ClickHouseConfig::new("http://127.0.0.1:8123", "sheaf");
        assert!(config.validate().is_ok());
        config.request_timeout = Duration::ZERO;
        let err = config.validate().unwrap_err();
        assert!(err.to_string().contains("request_timeout"), "{err}");
        config = ClickHouseConfig::new("tcp://127.0.0.1:9000", "sheaf");
        assert_eq!(
            config.validate().unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
        config = ClickHouseConfig::new("http://127.0.0.1:8123", "sheaf");
        config.write.max_records = 0;
        let err = config.validate().unwrap_err();
        assert!(err.to_string().contains("write.max_records"), "{err}");
    }

    #[test]
    fn a_cluster_needs_a_plain_name_and_http_nodes() {
        let mut config = ClickHouseConfig::new("http://127.0.0.1:8123", "sheaf");
        config.cluster = Some(ClickHouseCluster {
            name: "sheaf".into(),
            nodes: vec![
                "http://127.0.0.1:8123".into(),
                "http://127.0.0.1:8124".into(),
            ],
            replication: ClusterReplication::Distributed,
        });
        assert!(config.validate().is_ok());
        // The servers replicate and take ON CLUSTER DDL: no node list needed.
        config.cluster = Some(ClickHouseCluster {
            name: "sheaf".into(),
            nodes: vec![],
            replication: ClusterReplication::Replicated,
        });
        assert!(config.validate().is_ok());
        for (name, nodes, named) in [
            ("a-b", vec!["http://127.0.0.1:8123"], "cluster name"),
            ("sheaf", vec![], "cluster nodes"),
            ("sheaf", vec!["127.0.0.1:9000"], "cluster node"),
        ] {
            config.cluster = Some(ClickHouseCluster {
                name: name.into(),
                nodes: nodes.into_iter().map(String::from).collect(),
                replication: ClusterReplication::Distributed,
            });
            let err = config.validate().unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidInput);
            assert!(err.to_string().contains(named), "{err}");
        }
    }

    #[test]
    fn debug_hides_the_password() {
        let mut config = ClickHouseConfig::new("http://u:secret@127.0.0.1:8123", "sheaf");
        config.password = Some("hunter2".to_owned());
        let shown = format!("{config:?}");
        assert!(
            !shown.contains("hunter2") && !shown.contains("secret"),
            "{shown}"
        );
    }
}
