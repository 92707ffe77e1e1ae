//! RabbitMQ 3.10 from Debian's `rabbitmq-server`, run as xtask's own node on loopback.
//!
//! Not the package's service: that one runs as the `rabbitmq` user from `/var/lib/rabbitmq` on
//! 5672 on every interface, and its install is kept from starting it at all
//! (`install_without_starting` in `mod.rs`). Ours is the server script started by hand with
//! everything it reads pointed into `target/xtask/rabbitmq/`: its `rabbitmq.conf` (AMQP on
//! 127.0.0.1 only), an empty `enabled_plugins` (no management listener), the mnesia
//! directory (durable exchanges and queues survive a restart), the logs, and `HOME`, where
//! Erlang keeps the node's cookie. The system's `/etc/rabbitmq` is not read.
//!
//! A node needs Erlang distribution, and distribution needs a port mapper (`epmd`). The node
//! would start a machine-wide one on 4369 itself and leave it running, unowned, after it
//! stops; instead xtask starts its own `epmd` on loopback on a port of its own first
//! (`ERL_EPMD_PORT`, which the node then finds running), and stops it after the node. The
//! node's distribution listener is pinned to one loopback port too (`RABBITMQ_DIST_PORT`).
//!
//! Both processes are started and stopped by PID like ClickHouse, with their PID and port
//! files in the same directory. Readiness is the broker's answer to the AMQP 0-9-1 protocol
//! header (`Connection.Start`), which it sends only once it has booted and its listener is
//! open; no CLI tool is needed, so no cookie has to be shared with one.

use crate::process::{free_port, on_path, read_number, recorded_pid, state_dir, stop_pid};
use anyhow::{Context, bail};
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The Debian package with the server (it pulls in Erlang, and `epmd` with `erlang-base`).
pub const PACKAGE: &str = "rabbitmq-server";

/// The server script itself. Debian's `/usr/sbin/rabbitmq-server` is a wrapper that, run as
/// root, switches to the `rabbitmq` user in `/var/lib/rabbitmq`, where it could not use a
/// data directory of ours.
pub const SERVER: &str = "/usr/lib/rabbitmq/bin/rabbitmq-server";

/// Erlang's port mapper, from `erlang-base`.
const EPMD: &str = "epmd";

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

/// The URL the suites use: `guest`, which RabbitMQ lets in from loopback only, on the default
/// vhost `/` (`%2f`).
pub fn url(port: u16) -> String {
    format!("amqp://guest:guest@127.0.0.1:{port}/%2f")
}

/// The package to install, if the server or `epmd` is missing.
pub fn missing_package() -> Option<&'static str> {
    (!Path::new(SERVER).is_file() || !on_path(EPMD)).then_some(PACKAGE)
}

/// The node's PID, if the recorded process is still ours.
fn running_pid() -> Option<u32> {
    recorded_pid(&pid_file(), &config_file())
}

fn running_epmd_pid() -> Option<u32> {
    recorded_pid(&epmd_pid_file(), &epmd_marker())
}

/// Whether a broker on `port` answers the AMQP 0-9-1 protocol header with `Connection.Start`
/// (a method frame on channel 0, class 10, method 10), within 2 s.
pub fn amqp_answers(port: u16) -> bool {
    let attempt = || -> std::io::Result<bool> {
        let timeout = Duration::from_secs(2);
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        stream.write_all(b"AMQP\x00\x00\x09\x01")?;
        let mut head = [0u8; 11];
        stream.read_exact(&mut head)?;
        Ok(head[0] == 1 && head[1..3] == [0, 0] && head[7..11] == [0, 10, 0, 10])
    };
    attempt().unwrap_or(false)
}

/// Whether something accepts TCP connections on this loopback port.
fn accepts(port: u16) -> bool {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_ok()
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

/// `rabbitmq.conf`: AMQP on loopback only. Nothing else listens: no plugin is enabled, so
/// neither does the management UI.
fn config(port: u16) -> String {
    format!(
        "# Written by `cargo xtask services up`: xtask's RabbitMQ node for the suites.
listeners.tcp.default = 127.0.0.1:{port}
"
    )
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
    if let Some(package) = missing_package() {
        bail!("{SERVER} or {EPMD} is missing: install the Debian package {package}");
    }
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

    let epmd_pid = start_epmd(epmd_port)?;
    std::fs::write(config_file(), config(amqp_port))?;
    std::fs::write(dir().join("enabled_plugins"), "[].\n")?;
    // Sourced by the server script in place of /etc/rabbitmq/rabbitmq-env.conf.
    std::fs::write(
        dir().join("rabbitmq-env.conf"),
        "# Written by `cargo xtask services up`: empty, so the system's file is not read.\n",
    )?;
    let log_path = dir().join("server.log");
    let log = std::fs::File::create(&log_path)?;
    let mut server = Command::new(SERVER);
    // A developer's own RABBITMQ_* and ERL_* settings must not change this node.
    for (name, _) in std::env::vars_os() {
        let bytes = name.as_encoded_bytes();
        if bytes.starts_with(b"RABBITMQ_") || bytes.starts_with(b"ERL_") || name == "NOTIFY_SOCKET"
        {
            server.env_remove(name);
        }
    }
    let mut child = {
        use std::os::unix::process::CommandExt;
        server
            // A flag Erlang keeps but ignores: it puts our config's path into the VM's command
            // line, for `recorded_pid`.
            .arg("-sheaf_config")
            .arg(config_file())
            // Distribution on loopback only.
            .args(["-kernel", "inet_dist_use_interface", "{127,0,0,1}"])
            .env("HOME", dir())
            .env("RABBITMQ_NODENAME", NODE_NAME)
            .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
            .env("RABBITMQ_NODE_PORT", amqp_port.to_string())
            .env("RABBITMQ_DIST_PORT", dist_port.to_string())
            .env("ERL_EPMD_PORT", epmd_port.to_string())
            .env("RABBITMQ_CONFIG_FILE", config_file())
            .env(
                "RABBITMQ_ADVANCED_CONFIG_FILE",
                dir().join("advanced.config"),
            )
            .env("RABBITMQ_CONF_ENV_FILE", dir().join("rabbitmq-env.conf"))
            .env(
                "RABBITMQ_ENABLED_PLUGINS_FILE",
                dir().join("enabled_plugins"),
            )
            .env("RABBITMQ_MNESIA_BASE", dir().join("mnesia"))
            .env("RABBITMQ_LOG_BASE", log_dir())
            // The script then `exec`s the Erlang VM instead of waiting on it in a shell that
            // forwards signals with `rabbitmqctl`: the PID we spawn is the broker, and SIGTERM
            // to it is a graceful stop.
            .env("RUNNING_UNDER_SYSTEMD", "true")
            .current_dir(dir())
            .stdin(Stdio::null())
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
                tail(&log_dir().join(format!("{NODE_NAME}.log")), 20)
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
fn start_epmd(port: u16) -> anyhow::Result<u32> {
    let log_path = dir().join("epmd.log");
    let log = std::fs::File::create(&log_path)?;
    let mut child = {
        use std::os::unix::process::CommandExt;
        Command::new(EPMD)
            .arg0(epmd_marker())
            .args(["-address", "127.0.0.1", "-port", &port.to_string()])
            .stdin(Stdio::null())
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
