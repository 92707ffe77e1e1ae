//! Message brokers a test owns: a NATS server with JetStream ([`NatsServer`]) and a RabbitMQ
//! node ([`RabbitServer`]), each a child process on loopback ports of its own with its data in
//! a scratch directory, for the tests and fault scenarios that must see a broker go away and
//! come back. The shared brokers of `cargo xtask services up` are for everything else: stopping
//! one of those would break every other suite that uses it.
//!
//! [`stop`](NatsServer::stop) is a graceful stop (SIGTERM by PID, a bounded wait, then
//! SIGKILL), [`kill`](NatsServer::kill) a crash (SIGKILL), and
//! [`restart`](NatsServer::restart) starts the broker again on the same port with the same
//! data directory, so JetStream streams and RabbitMQ's durable exchanges and queues are there
//! again, and a client that reconnects to the same URL finds the same broker. Dropping the
//! value kills the broker and removes its directory. Everything here is std and synchronous:
//! starting a broker is a matter of seconds, not something to overlap with other work.
//!
//! The binaries come from Debian's packages, which `cargo xtask services up` installs, and are
//! launched the way xtask launches its own brokers, by the same code ([`launch`], which says
//! why each setting is there): a node's config, plugins file, mnesia, logs and `HOME` (the
//! Erlang cookie) are in the scratch directory, and its `epmd` on a loopback port of its own
//! stays up across the node's restarts.

pub mod launch;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use launch::{RabbitPorts, epmd_command, nats_command, rabbitmq_command, write_rabbitmq_files};
pub use launch::{
    accepts, amqp_answers, epmd_binary, jetstream_answers, nats_info, nats_server_binary,
    rabbitmq_server_binary,
};

/// How long a NATS server may take to answer (it answers within a fraction of a second).
const NATS_START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a RabbitMQ node may take to boot: about 6 s on a 2-core machine, the first boot
/// (which creates the schema) included; the rest is room for a loaded machine.
const RABBIT_START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a graceful stop may take before SIGKILL: NATS exits at once, RabbitMQ in seconds.
const NATS_STOP_GRACE: Duration = Duration::from_secs(10);
const RABBIT_STOP_GRACE: Duration = Duration::from_secs(30);

/// `N` distinct loopback ports that are free right now: all are held until all are
/// chosen, so the kernel never hands out one twice.
fn free_ports<const N: usize>() -> anyhow::Result<[u16; N]> {
    let listeners: Vec<TcpListener> = (0..N)
        .map(|_| TcpListener::bind(("127.0.0.1", 0)))
        .collect::<Result<_, _>>()
        .context("no free loopback port")?;
    let mut ports = [0; N];
    for (port, listener) in ports.iter_mut().zip(&listeners) {
        *port = listener.local_addr()?.port();
    }
    Ok(ports)
}

/// A new directory under the system's temporary directory, named `prefix_<random>`.
fn scratch_dir(prefix: &str) -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(crate::unique_name(prefix));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    Ok(dir)
}

/// The last `lines` lines of a log file, for an error message.
fn tail(path: &Path, lines: usize) -> String {
    tail_of(&std::fs::read_to_string(path).unwrap_or_default(), lines)
}

/// The last `lines` lines of `text`.
fn tail_of(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A log file the child appends to, so a restart keeps what the last run said.
fn append_to(path: &Path) -> anyhow::Result<(Stdio, Stdio)> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    Ok((file.try_clone()?.into(), file.into()))
}

/// SIGTERM (by PID, with the `kill` utility), a wait of at most `grace`, then SIGKILL; returns
/// once the child is reaped.
fn terminate(child: &mut Child, grace: Duration) -> anyhow::Result<()> {
    if child.try_wait()?.is_some() {
        return Ok(());
    }
    crate::sigterm(child.id())?;
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if child.try_wait()?.is_some() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    kill_and_reap(child);
    Ok(())
}

/// Kills `child` (SIGKILL to its PID) if it still runs, and reaps it.
fn kill_and_reap(child: &mut Child) {
    if let Ok(None) = child.try_wait() {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// A NATS server with JetStream on 127.0.0.1, owned by the test; killed and its store removed
/// when dropped.
#[derive(Debug)]
pub struct NatsServer {
    binary: PathBuf,
    dir: PathBuf,
    port: u16,
    login: Option<(String, String)>,
    child: Option<Child>,
}

impl NatsServer {
    /// Starts a server on a free loopback port with its JetStream store in a new scratch
    /// directory, and waits until it greets a client with JetStream on.
    pub fn start() -> anyhow::Result<Self> {
        Self::start_with(None)
    }

    /// [`NatsServer::start`], with clients required to log in as `user` with `password`
    /// ([`NatsServer::url_with_login`] carries them).
    pub fn start_with_login(user: &str, password: &str) -> anyhow::Result<Self> {
        Self::start_with(Some((user.to_owned(), password.to_owned())))
    }

    fn start_with(login: Option<(String, String)>) -> anyhow::Result<Self> {
        let binary = nats_server_binary()?;
        let [port] = free_ports()?;
        let mut server = Self {
            binary,
            dir: scratch_dir("sheaf_nats")?,
            port,
            login,
            child: None,
        };
        server.spawn()?;
        Ok(server)
    }

    /// `nats://user:password@127.0.0.1:<port>` for a server started with a login, else
    /// [`NatsServer::url`].
    pub fn url_with_login(&self) -> String {
        match &self.login {
            Some((user, password)) => format!("nats://{user}:{password}@127.0.0.1:{}", self.port),
            None => self.url(),
        }
    }

    /// `nats://127.0.0.1:<port>`, the same across restarts.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The client port, the same across restarts.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The JetStream store directory, the same across restarts.
    pub fn store_dir(&self) -> PathBuf {
        self.dir.join("store")
    }

    /// The PID of the running server, if it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Everything the server logged, over all its runs.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }

    /// A graceful stop: SIGTERM, at most 10 s, then SIGKILL. Returns once the process is gone.
    pub fn stop(&mut self) -> anyhow::Result<()> {
        match self.child.take() {
            Some(mut child) => terminate(&mut child, NATS_STOP_GRACE),
            None => Ok(()),
        }
    }

    /// A crash: SIGKILL, no chance to flush or say goodbye. Returns once the process is gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill_and_reap(&mut child);
        }
    }

    /// Starts the server again on the same port with the same store (stopping it first if it
    /// runs), and waits until it answers.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.stop()?;
        self.spawn()
    }

    fn spawn(&mut self) -> anyhow::Result<()> {
        let log_path = self.dir.join("server.log");
        let (stdout, stderr) = append_to(&log_path)?;
        let mut command = nats_command(&self.binary, self.port, &self.store_dir());
        if let Some((user, password)) = &self.login {
            command.args(["--user", user, "--pass", password]);
        }
        let mut child = command
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .with_context(|| format!("cannot start {}", self.binary.display()))?;
        let deadline = Instant::now() + NATS_START_TIMEOUT;
        loop {
            if let Some(status) = child.try_wait()? {
                bail!(
                    "nats-server exited during start-up on port {} ({status}); is the port taken? its log:\n{}",
                    self.port,
                    tail(&log_path, 20)
                );
            }
            if jetstream_answers(self.port) {
                self.child = Some(child);
                return Ok(());
            }
            if Instant::now() > deadline {
                kill_and_reap(&mut child);
                bail!(
                    "nats-server did not answer with JetStream on port {} within {NATS_START_TIMEOUT:?}; its log:\n{}",
                    self.port,
                    tail(&log_path, 20)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A RabbitMQ node on 127.0.0.1 (AMQP 0-9-1, `guest` on the default vhost), owned by the test,
/// with an `epmd` of its own; both killed and the node's directory removed when dropped.
#[derive(Debug)]
pub struct RabbitServer {
    server: PathBuf,
    dir: PathBuf,
    node: String,
    amqp_port: u16,
    dist_port: u16,
    epmd_port: u16,
    epmd: Child,
    child: Option<Child>,
}

impl RabbitServer {
    /// Starts a node with its own name, ports and data directory, and waits (at most 60 s)
    /// until it answers AMQP.
    pub fn start() -> anyhow::Result<Self> {
        let server = rabbitmq_server_binary()?;
        let epmd_bin = epmd_binary()?;
        let [amqp_port, dist_port, epmd_port] = free_ports()?;
        let dir = scratch_dir("sheaf_rabbitmq")?;
        let epmd = match start_epmd(&epmd_bin, &dir, epmd_port) {
            Ok(epmd) => epmd,
            Err(err) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(err);
            }
        };
        let node = format!(
            "{}@localhost",
            dir.file_name()
                .and_then(|name| name.to_str())
                .unwrap_or("sheaf_rabbitmq")
        );
        let mut rabbit = Self {
            server,
            dir,
            node,
            amqp_port,
            dist_port,
            epmd_port,
            epmd,
            child: None,
        };
        rabbit.write_config()?;
        rabbit.spawn()?;
        Ok(rabbit)
    }

    /// `amqp://guest:guest@127.0.0.1:<port>/%2f`, the same across restarts.
    pub fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.amqp_port)
    }

    /// The AMQP port, the same across restarts.
    pub fn port(&self) -> u16 {
        self.amqp_port
    }

    /// The node's name (`<name>@localhost`).
    pub fn node(&self) -> &str {
        &self.node
    }

    /// The node's data directory (mnesia, the message stores), the same across restarts.
    pub fn data_dir(&self) -> PathBuf {
        self.dir.join("mnesia")
    }

    /// The PID of the running node (the Erlang VM), if it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// What the node logged, over all its runs (its own log file, then its stdout and stderr).
    pub fn log(&self) -> String {
        let node_log = launch::rabbitmq_node_log(&self.dir, &self.node);
        let read = |path: &Path| std::fs::read_to_string(path).unwrap_or_default();
        format!("{}{}", read(&node_log), read(&self.dir.join("server.log")))
    }

    /// A graceful stop: SIGTERM (RabbitMQ then closes its connections and flushes its
    /// queues), at most 30 s, then SIGKILL. Returns once the process is gone; `epmd` stays.
    pub fn stop(&mut self) -> anyhow::Result<()> {
        match self.child.take() {
            Some(mut child) => terminate(&mut child, RABBIT_STOP_GRACE),
            None => Ok(()),
        }
    }

    /// A crash: SIGKILL. Returns once the process is gone; the next start recovers the
    /// durable state from disk.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill_and_reap(&mut child);
        }
    }

    /// Starts the node again with the same name, ports and data (stopping it first if it
    /// runs), and waits until it answers AMQP.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.stop()?;
        if self.epmd.try_wait()?.is_some() {
            self.epmd = start_epmd(&epmd_binary()?, &self.dir, self.epmd_port)?;
        }
        self.spawn()
    }

    fn write_config(&self) -> anyhow::Result<()> {
        write_rabbitmq_files(&self.dir, self.amqp_port, "sheaf-testenv's RabbitServer")
    }

    fn ports(&self) -> RabbitPorts {
        RabbitPorts {
            amqp: self.amqp_port,
            dist: self.dist_port,
            epmd: self.epmd_port,
        }
    }

    fn spawn(&mut self) -> anyhow::Result<()> {
        let log_path = self.dir.join("server.log");
        let (stdout, stderr) = append_to(&log_path)?;
        let mut child = rabbitmq_command(&self.server, &self.dir, &self.node, self.ports())
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .with_context(|| format!("cannot start {}", self.server.display()))?;
        let deadline = Instant::now() + RABBIT_START_TIMEOUT;
        loop {
            if let Some(status) = child.try_wait()? {
                bail!(
                    "rabbitmq {} exited during start-up on port {} ({status}); is a port taken? its log:\n{}",
                    self.node,
                    self.amqp_port,
                    tail_of(&self.log(), 30)
                );
            }
            if amqp_answers(self.amqp_port) {
                self.child = Some(child);
                return Ok(());
            }
            if Instant::now() > deadline {
                kill_and_reap(&mut child);
                bail!(
                    "rabbitmq {} did not answer AMQP on port {} within {RABBIT_START_TIMEOUT:?}; its log:\n{}",
                    self.node,
                    self.amqp_port,
                    tail_of(&self.log(), 30)
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for RabbitServer {
    fn drop(&mut self) {
        self.kill();
        kill_and_reap(&mut self.epmd);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// An `epmd` on 127.0.0.1:`port`, once it accepts connections (at most 10 s).
fn start_epmd(binary: &Path, dir: &Path, port: u16) -> anyhow::Result<Child> {
    let log_path = dir.join("epmd.log");
    let (stdout, stderr) = append_to(&log_path)?;
    let mut child = epmd_command(binary, port)
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .with_context(|| format!("cannot start {}", binary.display()))?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !accepts(port) {
        if let Some(status) = child.try_wait()? {
            bail!(
                "epmd exited during start-up on port {port} ({status}); its log:\n{}",
                tail(&log_path, 20)
            );
        }
        if Instant::now() > deadline {
            kill_and_reap(&mut child);
            bail!("epmd did not listen on port {port} within 10 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(child)
}
