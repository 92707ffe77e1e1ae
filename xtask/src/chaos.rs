//! `cargo xtask chaos [SCENARIO…|all] [--quick]`: the fault suite (kills, database restarts,
//! shutdown, CDC; docs/operations.md), on servers of its own.
//!
//! The scenarios stop and restart Postgres and ClickHouse under load, so they never touch the
//! servers `services up` runs for the suites (Postgres `15/main`, ClickHouse in
//! `target/xtask/clickhouse/`). The fault suite has its own:
//!
//! - a Postgres cluster `15/sheaf_chaos` (created once with `pg_createcluster`, `start.conf`
//!   manual, `wal_level = logical`, the same `sheaf` role and a `sheaf_chaos` database);
//! - a ClickHouse server in `target/xtask/chaos-clickhouse/`, the same launcher and
//!   configuration as the shared one, on a port of its own that stays the same across the
//!   stops and starts of a run;
//! - a ClickHouse cluster of 2 shards × 2 replicas in `target/xtask/chaos-clickhouse-cluster/`
//!   (`services/clickhouse_cluster.rs`, the same nodes as `services up --cluster` runs, cluster
//!   `sheaf_chaos`), for the `clickhouse-replica` scenario alone. Its ports are chosen before the
//!   binary runs, so its URLs can be handed over with the others, but its four processes start
//!   only when that scenario asks (`chaos-ctl clickhouse-cluster up`) and stop when it ends:
//!   the other scenarios never pay for them;
//! - a NATS JetStream cluster of 3 nodes in `target/xtask/chaos-nats-cluster/`
//!   (`services/nats_cluster.rs`, the same nodes as `services up --cluster` runs, cluster
//!   `sheaf_chaos`), planned the same way: its client URLs are handed over up front, and its
//!   processes run only between a scenario's `chaos-ctl nats-cluster up` and `down`.
//!
//! `chaos` takes a lock (one run at a time: runs share those servers), builds `sheaf` and
//! `sheaf-chaos`, copies both and this binary into `target/xtask/chaos/bin/` (so a rebuild by
//! someone else during a run cannot swap the `sheaf` under a scenario), starts the servers,
//! runs `sheaf-chaos` with their URLs, and stops the servers at the end, also when a scenario
//! fails. The binary injects its faults by running that copy of xtask as
//! `chaos-ctl postgres stop|start|restart`, `chaos-ctl clickhouse stop|start` and
//! `chaos-ctl clickhouse-cluster up|down|kill NODE|start NODE`, and the same for
//! `nats-cluster` (`kill` is a SIGKILL by the node's recorded PID; `start` brings that node back
//! with its configuration, ports and data, its work directory untouched). It records
//! the PID of every `sheaf` it spawns; any still alive after it exits are stopped here, by PID.

use crate::process::{
    pid_alive, pid_cmdline, run_captured, run_step, state_dir, stop_pid, target_dir, workspace_root,
};
use crate::services::clickhouse_cluster::{self, Layout};
use crate::services::{clickhouse, nats_cluster, postgres};
use anyhow::{Context, bail};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Duration;

/// Every scenario of `sheaf-chaos`, in the order `all` runs them.
use sheaf_testenv::scenarios::CHAOS as SCENARIOS;

/// The fault suite's own Postgres cluster (version [`postgres::VERSION`]).
pub const POSTGRES_CLUSTER: &str = "sheaf_chaos";
const DATABASE: &str = "sheaf_chaos";
/// Ports tried first when the cluster is created and when ClickHouse starts the first time.
const POSTGRES_PREFERRED_PORT: u16 = 15433;
const CLICKHOUSE_PREFERRED_PORT: u16 = 18124;
/// The fault suite's ClickHouse cluster's name in its nodes' `remote_servers`.
const CLICKHOUSE_CLUSTER: &str = "sheaf_chaos";
/// The fault suite's NATS cluster's name in its nodes' `cluster` block.
const NATS_CLUSTER: &str = "sheaf_chaos";

/// The variables `sheaf-chaos` reads (see docs/configuration.md).
use sheaf_testenv::{
    CHAOS_CLICKHOUSE_CLUSTER_NODES_VAR as CLICKHOUSE_CLUSTER_NODES_VAR,
    CHAOS_CLICKHOUSE_CLUSTER_VAR as CLICKHOUSE_CLUSTER_VAR,
    CHAOS_CLICKHOUSE_URL_VAR as CLICKHOUSE_URL_VAR, CHAOS_CTL_VAR as CTL_VAR,
    CHAOS_DIR_VAR as DIR_VAR, CHAOS_NATS_CLUSTER_URLS_VAR as NATS_CLUSTER_URLS_VAR,
    CHAOS_POSTGRES_URL_VAR as POSTGRES_URL_VAR, CHAOS_SHEAF_BIN_VAR as SHEAF_BIN_VAR,
};

fn chaos_dir() -> PathBuf {
    state_dir().join("chaos")
}

fn bin_dir() -> PathBuf {
    chaos_dir().join("bin")
}

/// The port the fault suite's ClickHouse was first given; later starts must reuse it, since the
/// running `sheaf` processes hold its URL.
fn clickhouse_port_file() -> PathBuf {
    chaos_dir().join("clickhouse.port")
}

/// One PID per line, appended by `sheaf-chaos` for every `sheaf` it spawns.
fn sheaf_pids_file() -> PathBuf {
    chaos_dir().join("sheaf.pids")
}

fn recorded_clickhouse_port() -> Option<u16> {
    std::fs::read_to_string(clickhouse_port_file())
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn clickhouse_instance() -> clickhouse::Instance {
    clickhouse::Instance {
        workdir: state_dir().join("chaos-clickhouse"),
        preferred_port: recorded_clickhouse_port().unwrap_or(CLICKHOUSE_PREFERRED_PORT),
        stop_command: "cargo xtask chaos-ctl clickhouse stop",
        cluster_node: None,
    }
}

/// The fault suite's ClickHouse cluster: its own directories and ports, never the shared one's.
fn cluster_layout() -> Layout {
    Layout {
        cluster: CLICKHOUSE_CLUSTER,
        base_dir: state_dir().join("chaos-clickhouse-cluster"),
        preferred_http_port: 18141,
        preferred_tcp_port: 19141,
        stop_command: "cargo xtask chaos-ctl clickhouse-cluster down",
    }
}

/// The fault suite's NATS cluster: its own directories and ports, never the shared one's
/// (`nats_cluster::Layout::shared`).
fn nats_cluster_layout() -> nats_cluster::Layout {
    nats_cluster::Layout {
        cluster: NATS_CLUSTER,
        base_dir: state_dir().join("chaos-nats-cluster"),
        preferred_client_port: 18461,
        preferred_route_port: 18561,
        preferred_monitor_port: 18661,
        stop_command: "cargo xtask chaos-ctl nats-cluster down",
    }
}

/// `cargo xtask chaos …`.
pub fn chaos(args: &[&str]) -> anyhow::Result<ExitCode> {
    let quick = args.contains(&"--quick");
    let names: Vec<&str> = args.iter().copied().filter(|a| *a != "--quick").collect();
    let names = if names.is_empty() { vec!["all"] } else { names };
    Ok(if run(&names, quick)? {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Runs the named scenarios (or `all`) on the fault suite's own servers; `Ok(false)` when one
/// failed. Starts and stops those servers itself, so it needs nothing from `services up`.
pub fn run(names: &[&str], quick: bool) -> anyhow::Result<bool> {
    for name in names {
        if *name != "all" && !SCENARIOS.contains(name) {
            bail!(
                "unknown chaos scenario `{name}`; expected one of {} or `all`",
                SCENARIOS.join(", ")
            );
        }
    }
    std::fs::create_dir_all(bin_dir()).context("cannot create target/xtask/chaos")?;
    let _lock = Lock::acquire()?;
    let Some(bins) = build()? else {
        return Ok(false);
    };
    let outcome = start_servers().and_then(|urls| run_binary(&bins, &urls, names, quick));
    let leftovers = stop_leftover_sheaf(&bins.sheaf);
    let stopped = stop_servers();
    let passed = outcome?;
    leftovers?;
    stopped.context("the fault suite ran, but stopping its servers failed")?;
    Ok(passed)
}

/// `cargo xtask chaos-ctl …`: how `sheaf-chaos` stops and starts the fault suite's servers.
pub fn ctl(args: &[&str]) -> anyhow::Result<ExitCode> {
    match args {
        ["postgres", action @ ("stop" | "start" | "restart")] => {
            let cluster = chaos_cluster()?.with_context(|| {
                format!("no postgres cluster {POSTGRES_CLUSTER}: run `cargo xtask chaos` first")
            })?;
            match *action {
                "stop" => {
                    run_captured(cluster.ctl("stop").args(["--", "-m", "fast"]))?;
                }
                "start" => {
                    run_captured(&mut cluster.ctl("start"))?;
                    cluster.wait_ready()?;
                }
                _ => {
                    run_captured(cluster.ctl("restart").args(["--", "-m", "fast"]))?;
                    cluster.wait_ready()?;
                }
            }
        }
        ["clickhouse", "stop"] => clickhouse::down_in(&clickhouse_instance())?,
        ["clickhouse", "start"] => {
            start_clickhouse()?;
        }
        ["clickhouse-cluster", "up"] => {
            clickhouse_cluster::up_planned(&cluster_layout())?;
        }
        ["clickhouse-cluster", "down"] => clickhouse_cluster::down_in(&cluster_layout())?,
        ["clickhouse-cluster", "kill", node] => {
            clickhouse_cluster::kill_node(&cluster_layout(), node)?;
        }
        ["clickhouse-cluster", "start", node] => {
            clickhouse_cluster::start_node_named(&cluster_layout(), node)?;
        }
        ["nats-cluster", "up"] => {
            nats_cluster::up_planned(&nats_cluster_layout())?;
        }
        ["nats-cluster", "down"] => nats_cluster::down_in(&nats_cluster_layout())?,
        ["nats-cluster", "kill", node] => {
            nats_cluster::kill_node(&nats_cluster_layout(), node)?;
        }
        ["nats-cluster", "start", node] => {
            nats_cluster::start_node_named(&nats_cluster_layout(), node)?;
        }
        _ => bail!(
            "usage: cargo xtask chaos-ctl postgres stop|start|restart | clickhouse stop|start | clickhouse-cluster up|down|kill NODE|start NODE | nats-cluster up|down|kill NODE|start NODE (got `{}`)",
            args.join(" ")
        ),
    }
    Ok(ExitCode::SUCCESS)
}

/// One `cargo xtask chaos` at a time: the runs share the servers they stop and start.
#[derive(Debug)]
struct Lock {
    path: PathBuf,
}

impl Lock {
    fn acquire() -> anyhow::Result<Self> {
        let path = chaos_dir().join("lock");
        if let Ok(text) = std::fs::read_to_string(&path)
            && let Ok(pid) = text.trim().parse::<u32>()
            && pid != std::process::id()
            && pid_alive(pid)
            && pid_cmdline(pid).is_some_and(|cmd| cmd.contains("xtask"))
        {
            bail!(
                "another `cargo xtask chaos` (pid {pid}) is running; its servers are this run's too, wait for it"
            );
        }
        std::fs::write(&path, std::process::id().to_string())?;
        Ok(Self { path })
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The copies a run uses.
#[derive(Debug)]
struct Bins {
    sheaf: PathBuf,
    chaos: PathBuf,
    ctl: PathBuf,
}

fn cargo(args: &[&str]) -> Command {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.args(args).current_dir(workspace_root());
    cmd
}

/// Builds `sheaf` and `sheaf-chaos` (dev profile: the same artifacts as the test build) and
/// copies them and this xtask binary into `target/xtask/chaos/bin/`; `None` when the build failed.
fn build() -> anyhow::Result<Option<Bins>> {
    let mut build = cargo(&[
        "build",
        "--package",
        "sheaf-server",
        "--bin",
        "sheaf",
        "--package",
        "sheaf-chaos",
        "--bin",
        "sheaf-chaos",
    ]);
    if !run_step(&mut build)? {
        return Ok(None);
    }
    let built = target_dir().join("debug");
    let bins = Bins {
        sheaf: copy_binary(&built.join("sheaf"), "sheaf")?,
        chaos: copy_binary(&built.join("sheaf-chaos"), "sheaf-chaos")?,
        ctl: copy_binary(&own_binary()?, "xtask")?,
    };
    Ok(Some(bins))
}

/// This process's own binary. A workspace build earlier in the same `cargo xtask test` may have
/// relinked `target/debug/xtask` (its sheaf-testenv dependency built with the features the
/// whole workspace unifies), which leaves `current_exe()` naming a deleted file; on Linux
/// `/proc/self/exe` still reads the binary this process runs.
fn own_binary() -> anyhow::Result<PathBuf> {
    let proc_exe = PathBuf::from("/proc/self/exe");
    if proc_exe.exists() {
        return Ok(proc_exe);
    }
    std::env::current_exe().context("cannot find the xtask binary")
}

fn copy_binary(from: &Path, name: &str) -> anyhow::Result<PathBuf> {
    let to = bin_dir().join(name);
    // Removing first gives the copy a new inode, so a process still running the old one is
    // not in the way ("text file busy").
    let _ = std::fs::remove_file(&to);
    std::fs::copy(from, &to)
        .with_context(|| format!("cannot copy {} to {}", from.display(), to.display()))?;
    Ok(to)
}

/// The URLs of the running servers, and of the clusters' nodes once started.
#[derive(Debug)]
struct Urls {
    postgres: String,
    clickhouse: String,
    clickhouse_cluster: Vec<String>,
    nats_cluster: Vec<String>,
}

/// Starts Postgres and ClickHouse, and plans the ClickHouse and NATS clusters (ports chosen,
/// nothing started: the scenario that needs one starts it).
fn start_servers() -> anyhow::Result<Urls> {
    let postgres = start_postgres().context("the fault suite's postgres")?;
    let clickhouse = start_clickhouse().context("the fault suite's clickhouse")?;
    let clickhouse_cluster = clickhouse_cluster::plan(&cluster_layout())
        .context("the fault suite's clickhouse cluster")?
        .urls();
    let nats_cluster = nats_cluster::plan(&nats_cluster_layout())
        .context("the fault suite's nats cluster")?
        .urls();
    Ok(Urls {
        postgres,
        clickhouse,
        clickhouse_cluster,
        nats_cluster,
    })
}

fn chaos_cluster() -> anyhow::Result<Option<postgres::Cluster>> {
    postgres::named_cluster(POSTGRES_CLUSTER)
}

/// Creates the cluster once, starts it, and makes sure of `wal_level = logical`, the role and
/// the database. Returns the URL the scenarios use.
fn start_postgres() -> anyhow::Result<String> {
    postgres::ensure_installed()?;
    let cluster = postgres::own_cluster(POSTGRES_CLUSTER, POSTGRES_PREFERRED_PORT, &[])?;
    cluster.start_if_down()?;
    if cluster.psql("postgres", "SHOW wal_level")? != "logical" {
        cluster.psql("postgres", "ALTER SYSTEM SET wal_level = logical")?;
        println!(
            "xtask: restarting postgres {}/{POSTGRES_CLUSTER} for wal_level = logical",
            postgres::VERSION
        );
        run_captured(cluster.ctl("restart").args(["--", "-m", "fast"]))?;
        cluster.wait_ready()?;
    }
    cluster.ensure_role_and_database(DATABASE)?;
    Ok(cluster.url(DATABASE))
}

/// Starts the fault suite's ClickHouse on the port it had before (the first time: a free one,
/// remembered). Fails when that port is taken by something else.
fn start_clickhouse() -> anyhow::Result<String> {
    let instance = clickhouse_instance();
    let up = clickhouse::up_in(&instance)?;
    let port = up.port;
    match recorded_clickhouse_port() {
        Some(recorded) if recorded != port => {
            clickhouse::down_in(&instance)?;
            bail!(
                "the fault suite's clickhouse must come back on port {recorded}, but that port is taken; free it or remove {}",
                clickhouse_port_file().display()
            );
        }
        Some(_) => {}
        None => std::fs::write(clickhouse_port_file(), port.to_string())?,
    }
    Ok(up.url)
}

/// Stops the servers (they are the fault suite's alone), the clusters' nodes too if a scenario
/// left one running; tries all, reports the first error.
fn stop_servers() -> anyhow::Result<()> {
    let nats = nats_cluster::down_in(&nats_cluster_layout());
    let cluster = clickhouse_cluster::down_in(&cluster_layout());
    let ch = clickhouse::down_in(&clickhouse_instance());
    let pg = match chaos_cluster() {
        Ok(Some(cluster)) if cluster.online => {
            println!(
                "xtask: stopping postgres {}/{POSTGRES_CLUSTER}",
                postgres::VERSION
            );
            run_captured(cluster.ctl("stop").args(["--", "-m", "fast"])).map(|_| ())
        }
        Ok(_) => Ok(()),
        Err(err) => Err(err),
    };
    nats.context("nats cluster")?;
    cluster.context("clickhouse cluster")?;
    ch.context("clickhouse")?;
    pg.context("postgres")?;
    Ok(())
}

fn run_binary(bins: &Bins, urls: &Urls, names: &[&str], quick: bool) -> anyhow::Result<bool> {
    let _ = std::fs::remove_file(sheaf_pids_file());
    let mut cmd = Command::new(&bins.chaos);
    cmd.args(names)
        .current_dir(workspace_root())
        .env(SHEAF_BIN_VAR, &bins.sheaf)
        .env(POSTGRES_URL_VAR, &urls.postgres)
        .env(CLICKHOUSE_URL_VAR, &urls.clickhouse)
        .env(CLICKHOUSE_CLUSTER_VAR, CLICKHOUSE_CLUSTER)
        .env(
            CLICKHOUSE_CLUSTER_NODES_VAR,
            urls.clickhouse_cluster.join(","),
        )
        .env(NATS_CLUSTER_URLS_VAR, urls.nats_cluster.join(","))
        .env(CTL_VAR, &bins.ctl)
        .env(DIR_VAR, chaos_dir());
    if quick {
        cmd.arg("--quick");
    }
    run_step(&mut cmd)
}

/// Stops, by PID, every `sheaf` the binary spawned that is still running (it ends them itself;
/// this is for a binary that crashed or was killed).
fn stop_leftover_sheaf(sheaf: &Path) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(sheaf_pids_file()).unwrap_or_default();
    let ours = sheaf.to_string_lossy().into_owned();
    let mut first_error = None;
    for pid in text.lines().filter_map(|l| l.trim().parse::<u32>().ok()) {
        if pid_alive(pid) && pid_cmdline(pid).is_some_and(|cmd| cmd.starts_with(&ours)) {
            eprintln!(
                "xtask: a sheaf process of the fault suite is still running (pid {pid}); stopping it"
            );
            if let Err(err) = stop_pid(pid, Duration::from_secs(10)) {
                first_error.get_or_insert(err);
            }
        }
    }
    let _ = std::fs::remove_file(sheaf_pids_file());
    first_error.map_or(Ok(()), Err)
}
