//! HTTPS for the shared ClickHouse: Debian's `stunnel4` terminates TLS with the test server
//! certificate (`tls.rs`) and forwards the bytes to ClickHouse's plain HTTP port.
//!
//! Why a front rather than ClickHouse itself: the server is the engine of the `chdb-core` wheel
//! (`clickhouse.rs`), which runs as clickhouse-local. Its build has OpenSSL, but there
//! `SYSTEM START LISTEN` starts only the TCP and HTTP listeners (`HTTPS` is refused with
//! "supports only TCP and HTTP listeners", and `QUERIES ALL` opens no `<https_port>`), so
//! nothing would serve an HTTPS port in its config. stunnel works on the byte stream below
//! HTTP, so the suites see over HTTPS exactly what the HTTP port answers (streaming,
//! compression, error bodies), and the plain URL keeps working beside it.
//!
//! Started and stopped by PID like ClickHouse, from `target/xtask/clickhouse-https/` (its
//! configuration, PID, port and log). The configuration names ClickHouse's port and the
//! certificate's fingerprint, so a ClickHouse on a new port, or a certificate made again,
//! restarts the front on the next `up`. The fault suite's ClickHouse has no front.

use super::tls;
use crate::process::{
    apt_install, free_port, on_path, read_number, recorded_pid, state_dir, stop_pid,
};
use anyhow::{Context, bail};
use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The port tried first, so a developer's HTTPS URL stays the same between runs.
const PREFERRED_PORT: u16 = 18443;

pub struct Up {
    pub url: String,
    /// Whether this call started the front (as opposed to found it running, or restarted the
    /// one an earlier `up` started, which stays that one's to stop).
    pub started: bool,
}

fn dir() -> PathBuf {
    state_dir().join("clickhouse-https")
}

fn config_file() -> PathBuf {
    dir().join("stunnel.conf")
}

fn pid_file() -> PathBuf {
    dir().join("stunnel.pid")
}

fn port_file() -> PathBuf {
    dir().join("stunnel.port")
}

fn url(port: u16) -> String {
    format!("https://127.0.0.1:{port}")
}

/// stunnel's configuration: in the foreground (so the PID we spawn is the server, logging to
/// stderr), no PID file of its own, one service.
fn config(port: u16, backend: u16, tls: &tls::Files, fingerprint: &str) -> String {
    format!(
        "; Written by `cargo xtask services up`: HTTPS on 127.0.0.1:{port} for ClickHouse's HTTP port {backend}.
; Server certificate SHA-256 {fingerprint}
foreground = yes
pid =
debug = warning

[clickhouse-https]
accept = 127.0.0.1:{port}
connect = 127.0.0.1:{backend}
cert = {cert}
key = {key}
sslVersionMin = TLSv1.2
",
        cert = tls.cert.display(),
        key = tls.key.display(),
    )
}

/// `GET /ping` over TLS, verifying the certificate against the test CA and `127.0.0.1`, with
/// `openssl s_client` (which `tls.rs` installs), within 5 s.
fn https_ping(port: u16, tls: &tls::Files) -> bool {
    let child = Command::new("timeout")
        .args(["5", "openssl", "s_client", "-quiet", "-verify_return_error"])
        .args([
            "-verify_ip",
            "127.0.0.1",
            "-connect",
            &format!("127.0.0.1:{port}"),
        ])
        .arg("-CAfile")
        .arg(&tls.ca)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn();
    let Ok(mut child) = child else {
        return false;
    };
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(b"GET /ping HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
    }
    child.wait_with_output().is_ok_and(|out| {
        let text = String::from_utf8_lossy(&out.stdout);
        text.starts_with("HTTP/1.") && text.contains(" 200 ") && text.trim_end().ends_with("Ok.")
    })
}

/// Serves HTTPS in front of ClickHouse's HTTP port `backend` (idempotent).
pub fn up(backend: u16, tls: &tls::Files) -> anyhow::Result<Up> {
    if !on_path("stunnel4") {
        apt_install(&["stunnel4"]).context("stunnel4 is missing and installing it failed")?;
    }
    std::fs::create_dir_all(dir())?;
    let fingerprint = tls.fingerprint()?;
    let mut restarted = false;
    if let (Some(pid), Some(port)) = (
        recorded_pid(&pid_file(), &config_file()),
        read_number(&port_file()),
    ) {
        let current = std::fs::read_to_string(config_file()).unwrap_or_default();
        if current == config(port, backend, tls, &fingerprint) && https_ping(port, tls) {
            return Ok(Up {
                url: url(port),
                started: false,
            });
        }
        println!(
            "xtask: restarting the https front of clickhouse (pid {pid}): new port, certificate or no answer"
        );
        stop_pid(pid, Duration::from_secs(5))?;
        restarted = true;
    }

    let port = free_port(read_number(&port_file()).unwrap_or(PREFERRED_PORT))?;
    std::fs::write(config_file(), config(port, backend, tls, &fingerprint))?;
    let log_path = dir().join("stunnel.log");
    let log = std::fs::File::create(&log_path)?;
    let mut child = {
        use std::os::unix::process::CommandExt;
        Command::new("stunnel4")
            .arg(config_file())
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            // Its own process group: ctrl-c in the terminal that ran `up` must not stop it.
            .process_group(0)
            .spawn()
            .context("could not start stunnel4")?
    };
    let pid = child.id();
    std::fs::write(pid_file(), pid.to_string())?;
    std::fs::write(port_file(), port.to_string())?;
    println!(
        "xtask: starting the https front of clickhouse (stunnel4, pid {pid}) on 127.0.0.1:{port}"
    );

    let deadline = Instant::now() + Duration::from_secs(20);
    while !https_ping(port, tls) {
        if let Some(status) = child.try_wait()? {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            bail!(
                "stunnel4 exited during start-up ({status}); {}:\n{log}",
                log_path.display()
            );
        }
        if Instant::now() > deadline {
            let _ = stop_pid(pid, Duration::from_secs(5));
            bail!(
                "the https front did not answer /ping on port {port} within 20 s; see {}",
                log_path.display()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(Up {
        url: url(port),
        started: !restarted,
    })
}

/// Stops the front by its recorded PID, if it runs.
pub fn down() -> anyhow::Result<()> {
    if let Some(pid) = recorded_pid(&pid_file(), &config_file()) {
        println!("xtask: stopping the https front of clickhouse (stunnel4, pid {pid})");
        stop_pid(pid, Duration::from_secs(5))?;
    }
    let _ = std::fs::remove_file(pid_file());
    let _ = std::fs::remove_file(port_file());
    Ok(())
}

pub fn status() -> anyhow::Result<()> {
    let tls = tls::Files::in_cache_dir();
    match (
        recorded_pid(&pid_file(), &config_file()),
        read_number::<u16>(&port_file()),
    ) {
        (Some(pid), Some(port)) => println!(
            "clickhouse: https front (stunnel4, pid {pid}) on {}, {}, started by xtask",
            url(port),
            if https_ping(port, &tls) {
                "answers /ping over TLS"
            } else {
                "does not answer /ping over TLS"
            }
        ),
        _ => println!("clickhouse: no https front running"),
    }
    Ok(())
}
