//! RabbitMQ 3.10 from Debian's `rabbitmq-server`, run as xtask's own node on loopback.
//!
//! Not the package's service: that one runs as the `rabbitmq` user from `/var/lib/rabbitmq` on
//! 5672 on every interface, and its install is kept from starting it at all
//! (`install_without_starting` in `mod.rs`). Ours is the server script started by hand with
//! everything it reads pointed into `target/xtask/rabbitmq/`, and its own `epmd` on a loopback
//! port, launched by the same code as a test's own node (`sheaf_testenv::brokers::launch`,
//! which says why each setting is there). The system's `/etc/rabbitmq` is not read.
//!
//! Both processes are started and stopped by PID like ClickHouse, with their PID and port
//! files in the same directory; xtask stops the `epmd` after the node. Readiness is the
//! broker's answer to the AMQP 0-9-1 protocol header (`Connection.Start`); no CLI tool is
//! needed, so no cookie has to be shared with one.

use crate::process::{free_port, read_number, recorded_pid, state_dir, stop_pid};
use anyhow::{Context, bail};
use sheaf_testenv::brokers::launch::{
    RABBITMQ_PACKAGE as PACKAGE, RabbitPorts, accepts, amqp_answers, epmd_binary, epmd_command,
    rabbitmq_command, rabbitmq_node_log, rabbitmq_server_binary, write_rabbitmq_files,
};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The ports tried first, so a developer's URL stays the same between runs: below Linux's
/// ephemeral range (32768–60999) like the other services' 15xxx and 18xxx ones, and clear of
/// RabbitMQ's defaults (5672 AMQP, 25672 distribution, 4369 epmd, and 35672–35682, which its
/// CLI tools take for their own distribution listener).
const PREFERRED_AMQP_PORT: u16 = 18672;
const PREFERRED_DIST_PORT: u16 = 18673;
const PREFERRED_EPMD_PORT: u16 = 18674;

/// The node's name; `localhost` resolves everywhere, so the short name needs no DNS.
pub const NODE_NAME: &str = "sheaf-xtask@localhost";

/// How long a first boot may take. It creates the mnesia schema and enables the feature
/// flags; later boots read them.
const START_TIMEOUT: Duration = Duration::from_secs(120);

pub struct Up {
    pub url: String,
    pub started: bool,
}

fn dir() -> PathBuf {
    state_dir().join("rabbitmq")
}

fn config_file() -> PathBuf {
    dir().join("rabbitmq.conf")
}

fn pid_file() -> PathBuf {
    dir().join("rabbitmq.pid")
}

fn epmd_pid_file() -> PathBuf {
    dir().join("epmd.pid")
}

/// The name `epmd` is started under (its `argv[0]`): a path only ours has in its command line,
/// for [`recorded_pid`], since `epmd` takes no argument that could carry one.
fn epmd_marker() -> PathBuf {
    dir().join("epmd")
}

fn port_file(name: &str) -> PathBuf {
    dir().join(format!("{name}.port"))
}

fn log_dir() -> PathBuf {
    dir().join("log")
}

/// Who writes the node's files, for their comments.
const WRITTEN_BY: &str = "`cargo xtask services up`";

/// The URL the suites use: `guest`, which RabbitMQ lets in from loopback only, on the default
/// vhost `/` (`%2f`).
pub fn url(port: u16) -> String {
    format!("amqp://guest:guest@127.0.0.1:{port}/%2f")
}

/// The package to install, if the server or `epmd` is missing.
pub fn missing_package() -> Option<&'static str> {
    (rabbitmq_server_binary().is_err() || epmd_binary().is_err()).then_some(PACKAGE)
}

/// The node's PID, if the recorded process is still ours.
fn running_pid() -> Option<u32> {
    recorded_pid(&pid_file(), &config_file())
}

fn running_epmd_pid() -> Option<u32> {
    recorded_pid(&epmd_pid_file(), &epmd_marker())
}

/// A free port for `name`: the one an earlier `up` used, else `preferred`, else one the kernel
/// picks (and says so, since the URL changes).
fn choose_port(name: &str, preferred: u16) -> anyhow::Result<u16> {
    let wanted = read_number(&port_file(name)).unwrap_or(preferred);
    let port = free_port(wanted)?;
    if port != wanted {
        println!(
            "xtask: port {wanted} for rabbitmq's {name} is taken by another process; using {port}"
        );
    }
    std::fs::write(port_file(name), port.to_string())?;
    Ok(port)
}

/// The last `lines` lines of a log file, for an error message.
fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Starts the node unless it runs already (idempotent).
pub fn up() -> anyhow::Result<Up> {
    if let (Some(pid), Some(port)) = (running_pid(), read_number(&port_file("amqp"))) {
        if amqp_answers(port) {
            return Ok(Up {
                url: url(port),
                started: false,
            });
        }
        bail!(
            "rabbitmq (pid {pid}) is running but does not answer AMQP on port {port}; run `cargo xtask services down` and try again"
        );
    }
    let server = rabbitmq_server_binary()?;
    let epmd = epmd_binary()?;
    std::fs::create_dir_all(log_dir())?;
    // An epmd of ours whose node is gone (stopped by hand, or crashed) is stopped, so the new
    // node and its epmd are recorded together.
    if let Some(pid) = running_epmd_pid() {
        stop_pid(pid, Duration::from_secs(5))?;
    }
    let amqp_port = choose_port("amqp", PREFERRED_AMQP_PORT)?;
    let dist_port = choose_port("dist", PREFERRED_DIST_PORT)?;
    let epmd_port = choose_port("epmd", PREFERRED_EPMD_PORT)?;
    let started_at = Instant::now();

    let epmd_pid = start_epmd(&epmd, epmd_port)?;
    write_rabbitmq_files(&dir(), amqp_port, WRITTEN_BY)?;
    let log_path = dir().join("server.log");
    let log = std::fs::File::create(&log_path)?;
    let ports = RabbitPorts {
        amqp: amqp_port,
        dist: dist_port,
        epmd: epmd_port,
    };
    let mut child = {
        use std::os::unix::process::CommandExt;
        rabbitmq_command(&server, &dir(), NODE_NAME, ports)
            // A flag Erlang keeps but ignores: it puts our config's path into the VM's command
            // line, for `recorded_pid`.
            .arg("-sheaf_config")
            .arg(config_file())
            .stdout(log.try_clone()?)
            .stderr(log)
            // Its own process group: ctrl-c in the terminal that ran `up` must not stop it.
            .process_group(0)
            .spawn()
            .context("could not start rabbitmq-server")?
    };
    let pid = child.id();
    std::fs::write(pid_file(), pid.to_string())?;
    println!(
        "xtask: starting rabbitmq {NODE_NAME} (pid {pid}, epmd pid {epmd_pid} on {epmd_port}) on 127.0.0.1:{amqp_port}"
    );

    let deadline = started_at + START_TIMEOUT;
    loop {
        if let Some(status) = child.try_wait()? {
            let _ = stop_pid(epmd_pid, Duration::from_secs(5));
            bail!(
                "rabbitmq exited during start-up ({status}); last lines of {}:\n{}\nand of the node's log in {}:\n{}",
                log_path.display(),
                tail(&log_path, 20),
                log_dir().display(),
                tail(&rabbitmq_node_log(&dir(), NODE_NAME), 20)
            );
        }
        if amqp_answers(amqp_port) {
            break;
        }
        if Instant::now() > deadline {
            let _ = stop_pid(pid, Duration::from_secs(10));
            let _ = stop_pid(epmd_pid, Duration::from_secs(5));
            bail!(
                "rabbitmq did not answer AMQP on port {amqp_port} within {} s; see {} and {}",
                START_TIMEOUT.as_secs(),
                log_path.display(),
                log_dir().display()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    println!(
        "xtask: rabbitmq answered AMQP after {:.1} s",
        started_at.elapsed().as_secs_f64()
    );
    Ok(Up {
        url: url(amqp_port),
        started: true,
    })
}

/// Starts xtask's `epmd` on loopback and waits (at most 10 s) until it accepts connections.
fn start_epmd(binary: &Path, port: u16) -> anyhow::Result<u32> {
    let log_path = dir().join("epmd.log");
    let log = std::fs::File::create(&log_path)?;
    let mut child = {
        use std::os::unix::process::CommandExt;
        epmd_command(binary, port)
            .arg0(epmd_marker())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0)
            .spawn()
            .context("could not start epmd")?
    };
    let pid = child.id();
    std::fs::write(epmd_pid_file(), pid.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !accepts(port) {
        if let Some(status) = child.try_wait()? {
            bail!(
                "epmd exited during start-up ({status}); {}:\n{}",
                log_path.display(),
                tail(&log_path, 20)
            );
        }
        if Instant::now() > deadline {
            let _ = stop_pid(pid, Duration::from_secs(5));
            bail!("epmd did not listen on port {port} within 10 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(pid)
}

/// Stops the node (gracefully: SIGTERM, at most 30 s), then its `epmd`, by their recorded PIDs.
/// The port files stay, so the next `up` uses the same ports and URL.
pub fn down() -> anyhow::Result<()> {
    if let Some(pid) = running_pid() {
        println!("xtask: stopping rabbitmq {NODE_NAME} (pid {pid})");
        stop_pid(pid, Duration::from_secs(30))?;
    }
    if let Some(pid) = running_epmd_pid() {
        println!("xtask: stopping rabbitmq's epmd (pid {pid})");
        stop_pid(pid, Duration::from_secs(5))?;
    }
    let _ = std::fs::remove_file(pid_file());
    let _ = std::fs::remove_file(epmd_pid_file());
    Ok(())
}

pub fn status() -> anyhow::Result<()> {
    if missing_package().is_some() {
        println!("rabbitmq:   not installed (`cargo xtask services up` installs {PACKAGE})");
        return Ok(());
    }
    match (running_pid(), read_number::<u16>(&port_file("amqp"))) {
        (Some(pid), Some(port)) => println!(
            "rabbitmq:   {NODE_NAME} (pid {pid}; epmd {}) on 127.0.0.1:{port}, {}, started by xtask",
            running_epmd_pid().map_or("not running".to_owned(), |pid| format!("pid {pid}")),
            if amqp_answers(port) {
                "answers AMQP"
            } else {
                "does not answer AMQP"
            }
        ),
        _ => println!("rabbitmq:   not running"),
    }
    Ok(())
}
