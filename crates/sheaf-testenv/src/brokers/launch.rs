//! How a NATS server and a RabbitMQ node are launched and seen to be ready, once for both of
//! their owners: xtask's shared brokers (`cargo xtask services up`, which records their PIDs
//! and leaves them running) and a test's own ([`NatsServer`](super::NatsServer),
//! [`RabbitServer`](super::RabbitServer), which it stops and restarts). The owners differ in
//! where their directories are, how long they wait and what they record; the binaries, the
//! command lines, the files a node reads and the readiness probes are these.
//!
//! A RabbitMQ node is the server script in `/usr/lib/rabbitmq/bin/` started by hand, not
//! Debian's `/usr/sbin` wrapper (which, run as root, switches to the `rabbitmq` user and
//! `/var/lib/rabbitmq`, where it could not use a data directory of ours), with everything it
//! reads pointed into one directory: its `rabbitmq.conf` (AMQP on 127.0.0.1 only), an empty
//! `enabled_plugins` (no management listener), an empty `rabbitmq-env.conf` (so the system's
//! is not read), the mnesia directory (durable exchanges and queues survive a restart), the
//! logs, and `HOME`, where Erlang keeps the node's cookie. Its Erlang distribution needs a
//! port mapper: the node would start a machine-wide `epmd` on 4369 and leave it running,
//! unowned, so each owner starts its own on a loopback port first (`ERL_EPMD_PORT`, which the
//! node then finds running). Readiness is the broker's answer to the AMQP 0-9-1 protocol
//! header, which it sends only once it has booted and its listener is open.
//!
//! A NATS server is `nats-server -js` on 127.0.0.1 with its JetStream store in a directory of
//! the owner's; readiness is the `INFO` line it greets every client with, which says whether
//! JetStream is on.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::Context as _;

/// The Debian package with `nats-server`.
pub const NATS_PACKAGE: &str = "nats-server";
/// The Debian package with the RabbitMQ server (it pulls in Erlang, and `epmd` with
/// `erlang-base`).
pub const RABBITMQ_PACKAGE: &str = "rabbitmq-server";
/// The server script of Debian's `rabbitmq-server`.
pub const RABBITMQ_SERVER: &str = "/usr/lib/rabbitmq/bin/rabbitmq-server";
/// Where Debian puts `nats-server`; `/usr/sbin` is not on every user's `PATH`.
const NATS_DEBIAN_BINARY: &str = "/usr/sbin/nats-server";

/// The `nats-server` binary: on `PATH`, else where Debian installs it; an error naming the
/// package when there is none.
pub fn nats_server_binary() -> anyhow::Result<PathBuf> {
    on_path("nats-server")
        .or_else(|| Some(PathBuf::from(NATS_DEBIAN_BINARY)).filter(|p| p.is_file()))
        .context(
            "nats-server is not installed: install the Debian package nats-server (`cargo xtask services up` does)",
        )
}

/// The RabbitMQ server script: Debian's in `/usr/lib/rabbitmq/bin/`, else a `rabbitmq-server`
/// on `PATH` that is not Debian's wrapper; an error naming the package when there is none.
pub fn rabbitmq_server_binary() -> anyhow::Result<PathBuf> {
    let debian = PathBuf::from(RABBITMQ_SERVER);
    if debian.is_file() {
        return Ok(debian);
    }
    let on_path = on_path("rabbitmq-server").filter(|path| {
        std::fs::canonicalize(path).is_ok_and(|real| !real.ends_with("rabbitmq-script-wrapper"))
    });
    on_path.context(
        "rabbitmq-server is not installed: install the Debian package rabbitmq-server (`cargo xtask services up` does)",
    )
}

/// Erlang's port mapper, which `rabbitmq-server` depends on (package `erlang-base`).
pub fn epmd_binary() -> anyhow::Result<PathBuf> {
    on_path("epmd")
        .or_else(|| Some(PathBuf::from("/usr/lib/erlang/bin/epmd")).filter(|p| p.is_file()))
        .context("epmd is not installed: install the Debian package erlang-base")
}

/// `program` in a directory of `PATH`, if there is one.
pub fn on_path(program: &str) -> Option<PathBuf> {
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|dir| dir.join(program))
        .find(|path| path.is_file())
}

/// Whether something accepts TCP connections on this loopback port, within 1 s.
pub fn accepts(port: u16) -> bool {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_ok()
}

/// The `INFO` line a NATS server on `port` greets a client with, within 2 s.
pub fn nats_info(port: u16) -> std::io::Result<String> {
    let timeout = Duration::from_secs(2);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line)?;
    if !line.starts_with("INFO ") {
        return Err(std::io::Error::other(format!(
            "not a NATS greeting: {line:?}"
        )));
    }
    Ok(line.trim_end().to_owned())
}

/// Whether the NATS server on `port` greets a client with JetStream on.
pub fn jetstream_answers(port: u16) -> bool {
    nats_info(port).is_ok_and(|info| info.contains(r#""jetstream":true"#))
}

/// Whether a broker on `port` answers the AMQP 0-9-1 protocol header with `Connection.Start`
/// (a method frame on channel 0, class 10, method 10), within 2 s. RabbitMQ opens its listener
/// last in its boot, so this is its readiness.
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

/// `nats-server` with JetStream on 127.0.0.1:`port`, its store in `store_dir`; the caller adds
/// its own options (a name, a login) and where the output goes.
pub fn nats_command(binary: &Path, port: u16, store_dir: &Path) -> Command {
    let mut command = Command::new(binary);
    command
        .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string()])
        .arg("-sd")
        .arg(store_dir)
        .stdin(Stdio::null());
    command
}

/// The loopback ports one RabbitMQ node listens on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RabbitPorts {
    /// AMQP 0-9-1, what clients connect to.
    pub amqp: u16,
    /// Erlang distribution.
    pub dist: u16,
    /// The node's own `epmd`.
    pub epmd: u16,
}

/// Writes the files a node started by [`rabbitmq_command`] reads from `dir`: `rabbitmq.conf`
/// (AMQP on 127.0.0.1:`amqp_port`, nothing else listens), `enabled_plugins` (none, so no
/// management listener either), `rabbitmq-env.conf` (empty, in place of the system's) and the
/// `log` directory. `written_by` names the owner in the files' comments.
pub fn write_rabbitmq_files(dir: &Path, amqp_port: u16, written_by: &str) -> anyhow::Result<()> {
    let write = |name: &str, text: String| {
        let path = dir.join(name);
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))
    };
    write(
        "rabbitmq.conf",
        format!("# Written by {written_by}.\nlisteners.tcp.default = 127.0.0.1:{amqp_port}\n"),
    )?;
    write("enabled_plugins", "[].\n".to_owned())?;
    write(
        "rabbitmq-env.conf",
        format!("# Written by {written_by}: empty, so the system's file is not read.\n"),
    )?;
    let log = dir.join("log");
    std::fs::create_dir_all(&log).with_context(|| format!("cannot create {}", log.display()))
}

/// The node `node` (`<name>@localhost`: `localhost` resolves everywhere, so the short name
/// needs no DNS) from the server script `server`, with everything it reads and writes in `dir`
/// (see [`write_rabbitmq_files`]) and listening on `ports` on loopback only. The caller adds
/// where the output goes, and starts the `epmd` on `ports.epmd` first ([`epmd_command`]).
pub fn rabbitmq_command(server: &Path, dir: &Path, node: &str, ports: RabbitPorts) -> Command {
    let mut command = Command::new(server);
    // The caller's own RABBITMQ_* and ERL_* settings must not change this node.
    for (name, _) in std::env::vars_os() {
        let bytes = name.as_encoded_bytes();
        if bytes.starts_with(b"RABBITMQ_") || bytes.starts_with(b"ERL_") || name == "NOTIFY_SOCKET"
        {
            command.env_remove(name);
        }
    }
    command
        // Distribution on loopback only.
        .args(["-kernel", "inet_dist_use_interface", "{127,0,0,1}"])
        .env("HOME", dir)
        .env("RABBITMQ_NODENAME", node)
        .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
        .env("RABBITMQ_NODE_PORT", ports.amqp.to_string())
        .env("RABBITMQ_DIST_PORT", ports.dist.to_string())
        .env("ERL_EPMD_PORT", ports.epmd.to_string())
        .env("RABBITMQ_CONFIG_FILE", dir.join("rabbitmq.conf"))
        .env("RABBITMQ_ADVANCED_CONFIG_FILE", dir.join("advanced.config"))
        .env("RABBITMQ_CONF_ENV_FILE", dir.join("rabbitmq-env.conf"))
        .env("RABBITMQ_ENABLED_PLUGINS_FILE", dir.join("enabled_plugins"))
        .env("RABBITMQ_MNESIA_BASE", dir.join("mnesia"))
        .env("RABBITMQ_LOG_BASE", dir.join("log"))
        // The script then `exec`s the Erlang VM instead of waiting on it in a shell that
        // forwards signals with `rabbitmqctl`: the PID spawned is the broker's, and SIGTERM to
        // it is a graceful stop.
        .env("RUNNING_UNDER_SYSTEMD", "true")
        .current_dir(dir)
        .stdin(Stdio::null());
    command
}

/// An `epmd` on 127.0.0.1:`port`; the caller waits until it [`accepts`] connections.
pub fn epmd_command(binary: &Path, port: u16) -> Command {
    let mut command = Command::new(binary);
    command
        .args(["-address", "127.0.0.1", "-port", &port.to_string()])
        .stdin(Stdio::null());
    command
}

/// The node's own log file in its `log` directory.
pub fn rabbitmq_node_log(dir: &Path, node: &str) -> PathBuf {
    dir.join("log").join(format!("{node}.log"))
}
