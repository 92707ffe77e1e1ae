//! NATS 2.9 with JetStream from Debian's `nats-server`, run as xtask's own process on loopback.
//!
//! Not the package's systemd unit (which the install is kept from starting, see
//! `install_without_starting` in `mod.rs`): `nats-server -js` on 127.0.0.1, with its JetStream
//! store in `target/xtask/nats/store/`, so streams outlive a restart. Started and stopped by
//! PID like ClickHouse. Readiness is the `INFO` line the server sends to every new client,
//! which says whether JetStream is on.

use crate::process::{free_port, read_number, recorded_pid, state_dir, stop_pid};
use anyhow::{Context, bail};
use sheaf_testenv::brokers::launch::{
    NATS_PACKAGE as PACKAGE, jetstream_answers, nats_command, nats_server_binary,
};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The client port tried first, so a developer's URL stays the same between runs: below
/// Linux's ephemeral range like the other services' ports, and clear of NATS's 4222.
const PREFERRED_PORT: u16 = 18422;

/// The server's name in its `INFO` line and logs.
const SERVER_NAME: &str = "sheaf-xtask";

pub struct Up {
    pub url: String,
    pub started: bool,
}

fn dir() -> PathBuf {
    state_dir().join("nats")
}

/// The JetStream store; its path is in the server's command line, for [`recorded_pid`].
fn store_dir() -> PathBuf {
    dir().join("store")
}

fn pid_file() -> PathBuf {
    dir().join("server.pid")
}

fn port_file() -> PathBuf {
    dir().join("server.port")
}

pub fn url(port: u16) -> String {
    format!("nats://127.0.0.1:{port}")
}

/// The package to install, if the server is missing.
pub fn missing_package() -> Option<&'static str> {
    nats_server_binary().is_err().then_some(PACKAGE)
}

fn running_pid() -> Option<u32> {
    recorded_pid(&pid_file(), &store_dir())
}

/// Starts the server unless it runs already (idempotent).
pub fn up() -> anyhow::Result<Up> {
    if let (Some(pid), Some(port)) = (running_pid(), read_number(&port_file())) {
        if jetstream_answers(port) {
            return Ok(Up {
                url: url(port),
                started: false,
            });
        }
        bail!(
            "nats-server (pid {pid}) is running but does not answer with JetStream on port {port}; run `cargo xtask services down` and try again"
        );
    }
    let binary = nats_server_binary()?;
    std::fs::create_dir_all(store_dir())?;
    let wanted = read_number(&port_file()).unwrap_or(PREFERRED_PORT);
    let port = free_port(wanted)?;
    if port != wanted {
        println!("xtask: port {wanted} for nats is taken by another process; using {port}");
    }
    let log_path = dir().join("server.log");
    let log = std::fs::File::create(&log_path)?;
    let started_at = Instant::now();
    let mut child = {
        use std::os::unix::process::CommandExt;
        nats_command(&binary, port, &store_dir())
            .args(["-n", SERVER_NAME])
            .stdout(log.try_clone()?)
            .stderr(log)
            // Its own process group: ctrl-c in the terminal that ran `up` must not stop it.
            .process_group(0)
            .spawn()
            .context("could not start nats-server")?
    };
    let pid = child.id();
    std::fs::write(pid_file(), pid.to_string())?;
    std::fs::write(port_file(), port.to_string())?;
    println!("xtask: starting nats-server (pid {pid}) with JetStream on 127.0.0.1:{port}");

    let deadline = started_at + Duration::from_secs(30);
    while !jetstream_answers(port) {
        if let Some(status) = child.try_wait()? {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            bail!(
                "nats-server exited during start-up ({status}); {}:\n{log}",
                log_path.display()
            );
        }
        if Instant::now() > deadline {
            let _ = stop_pid(pid, Duration::from_secs(5));
            bail!(
                "nats-server did not answer with JetStream on port {port} within 30 s; see {}",
                log_path.display()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    println!(
        "xtask: nats-server answered with JetStream after {:.1} s",
        started_at.elapsed().as_secs_f64()
    );
    Ok(Up {
        url: url(port),
        started: true,
    })
}

/// Stops the server by its recorded PID, if it runs. The port file stays, so the next `up`
/// uses the same port and URL.
pub fn down() -> anyhow::Result<()> {
    if let Some(pid) = running_pid() {
        println!("xtask: stopping nats-server (pid {pid})");
        stop_pid(pid, Duration::from_secs(10))?;
    }
    let _ = std::fs::remove_file(pid_file());
    Ok(())
}

pub fn status() -> anyhow::Result<()> {
    if missing_package().is_some() {
        println!("nats:       not installed (`cargo xtask services up` installs {PACKAGE})");
        return Ok(());
    }
    match (running_pid(), read_number::<u16>(&port_file())) {
        (Some(pid), Some(port)) => println!(
            "nats:       nats-server (pid {pid}) on {}, {}, started by xtask",
            url(port),
            if jetstream_answers(port) {
                "answers with JetStream on"
            } else {
                "does not answer with JetStream on"
            }
        ),
        _ => println!("nats:       not running"),
    }
    Ok(())
}
