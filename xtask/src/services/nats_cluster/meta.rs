//! What a NATS cluster's monitoring endpoints say of its JetStream meta cluster, and when that
//! makes the cluster formed ([`quorum`]): read from `/jsz` and `/healthz` over plain HTTP,
//! since xtask builds on std alone.
//!
//! Formed means: every node expected to run answers `/healthz` (which fails while the node has
//! no meta leader or lags behind it) and names one meta leader, whose own `/jsz` lists it as
//! current. Only the leader's `/jsz` lists its followers, and a follower keeps naming a killed
//! leader for the seconds until the next election, so the leader is the node that names itself
//! and answers `/jsz?leader-only=true` (the others answer 400).

use std::time::Duration;

use super::node_name;
use crate::process::http_get;

/// What one node's `/jsz` says of the JetStream meta cluster.
#[derive(Debug, Default, PartialEq, Eq)]
struct MetaView {
    /// The meta leader's `server_name`, as this node last heard of it.
    leader: Option<String>,
    /// The leader's followers and whether each is current; listed only by the leader itself.
    replicas: Vec<(String, bool)>,
}

impl MetaView {
    /// Reads the `meta_cluster` object of a `/jsz` answer. xtask builds on std alone, so this
    /// reads the few fields it needs as text: `leader` is the only key of that name in the
    /// answer, and every replica is an object with its `name` before its `current`.
    fn parse(jsz: &str) -> Self {
        let Some((_, meta)) = jsz.split_once("\"meta_cluster\"") else {
            return Self::default();
        };
        let leader = after_key(meta, "leader")
            .and_then(string_value)
            .filter(|l| !l.is_empty())
            .map(str::to_owned);
        let mut replicas = Vec::new();
        if let Some(mut rest) = after_key(meta, "replicas") {
            while let Some(value) = after_key(rest, "name") {
                let name = string_value(value).unwrap_or_default().to_owned();
                let current = after_key(value, "current").is_some_and(|v| v.starts_with("true"));
                replicas.push((name, current));
                rest = value;
            }
        }
        Self { leader, replicas }
    }
}

/// The text of `json` just after the first `"key":`, where its value starts.
fn after_key<'a>(json: &'a str, key: &str) -> Option<&'a str> {
    let (_, rest) = json.split_once(&format!("\"{key}\""))?;
    Some(rest.trim_start().strip_prefix(':')?.trim_start())
}

/// The string a value starts with, without its quotes (the names here have no escapes).
fn string_value(value: &str) -> Option<&str> {
    let value = value.strip_prefix('"')?;
    Some(&value[..value.find('"')?])
}

fn monitor_get(port: u16, path: &str) -> anyhow::Result<(u16, String)> {
    http_get(port, path, Duration::from_secs(2))
}

/// The meta leader's index when every node of `expected` is healthy, names that leader, and is
/// listed as current by it; else the first node that is not, with why.
pub fn quorum(monitor_ports: &[u16], expected: &[usize]) -> Result<usize, (usize, String)> {
    // The leader first: a node's `/healthz` logs a warning each time it fails, and before an
    // election every one would.
    let views: Vec<Option<MetaView>> = (0..monitor_ports.len())
        .map(|i| {
            monitor_get(monitor_ports[i], "/jsz?leader-only=true")
                .ok()
                .filter(|(code, _)| *code == 200)
                .map(|(_, body)| MetaView::parse(&body))
        })
        .collect();
    let Some(leader) = (0..monitor_ports.len()).find(|&i| {
        views[i]
            .as_ref()
            .is_some_and(|v| v.leader.as_deref() == Some(&node_name(i)))
    }) else {
        return Err((
            expected.first().copied().unwrap_or(0),
            "no node answers as the JetStream meta leader".to_owned(),
        ));
    };
    let listed = views[leader].as_ref().map(|v| &v.replicas);
    for &i in expected {
        match monitor_get(monitor_ports[i], "/healthz") {
            Ok((200, _)) => {}
            Ok((code, body)) => {
                return Err((i, format!("/healthz answers {code}: {}", body.trim())));
            }
            Err(err) => return Err((i, format!("/healthz does not answer: {err:#}"))),
        }
        if i == leader {
            continue;
        }
        let current = listed.is_some_and(|replicas| {
            replicas
                .iter()
                .any(|(name, current)| *name == node_name(i) && *current)
        });
        if !current {
            return Err((
                i,
                format!(
                    "the meta leader {} does not list it as current",
                    node_name(leader)
                ),
            ));
        }
        let named = monitor_get(monitor_ports[i], "/jsz")
            .ok()
            .map(|(_, body)| MetaView::parse(&body).leader);
        if named != Some(Some(node_name(leader))) {
            return Err((
                i,
                format!("it does not name {} as the meta leader", node_name(leader)),
            ));
        }
    }
    Ok(leader)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `meta_cluster` of a leader's `/jsz`, as nats-server 2.9.10 answers it.
    const LEADER_JSZ: &str = r#"{
  "server_id": "NCM5KMH4Q6GCRVPYE2W3QFLLEBBE37ELN6UQFKU3HPKQESWGLX5Y7EMI",
  "config": {
    "store_dir": "/tmp/n3/store/jetstream"
  },
  "streams": 0,
  "meta_cluster": {
    "name": "sheaf",
    "leader": "n3",
    "peer": "BXScrY9i",
    "replicas": [
      {
        "name": "n1",
        "current": true,
        "active": 519395516,
        "peer": "fjFyEjc1"
      },
      {
        "name": "n2",
        "current": false,
        "active": 21847025139,
        "lag": 5,
        "peer": "44jzkV9D"
      }
    ],
    "cluster_size": 3
  }
}"#;

    #[test]
    fn a_leader_s_jsz_names_it_and_its_followers_with_whether_each_is_current() {
        assert_eq!(
            MetaView::parse(LEADER_JSZ),
            MetaView {
                leader: Some("n3".to_owned()),
                replicas: vec![("n1".to_owned(), true), ("n2".to_owned(), false)],
            }
        );
    }

    #[test]
    fn a_follower_s_jsz_names_the_leader_and_no_replicas() {
        let follower = r#"{"meta_cluster": {"name": "sheaf", "leader": "n3", "peer": "BXScrY9i", "cluster_size": 3}}"#;
        assert_eq!(
            MetaView::parse(follower),
            MetaView {
                leader: Some("n3".to_owned()),
                replicas: Vec::new(),
            }
        );
        let no_leader = r#"{"meta_cluster": {"name": "sheaf", "leader": "", "cluster_size": 3}}"#;
        assert_eq!(MetaView::parse(no_leader), MetaView::default());
        assert_eq!(
            MetaView::parse("filtered response: not leader"),
            MetaView::default()
        );
    }
}
