//! Small helpers for running commands and talking to processes with std only.

use anyhow::{Context, bail};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The workspace root: the nearest directory at or above the current one whose
/// `Cargo.toml` declares `[workspace]`, else the one this binary was built from.
///
/// Found at run time on purpose: two checkouts that share one `CARGO_TARGET_DIR` share
/// one `target/debug/xtask`, and a root baked in at compile time would make one
/// checkout's `cargo xtask` manage the other's servers.
pub fn workspace_root() -> PathBuf {
    let is_root = |dir: &Path| {
        std::fs::read_to_string(dir.join("Cargo.toml"))
            .is_ok_and(|manifest| manifest.lines().any(|l| l.trim() == "[workspace]"))
    };
    if let Ok(cwd) = std::env::current_dir()
        && let Some(root) = cwd.ancestors().find(|dir| is_root(dir))
    {
        return root.to_path_buf();
    }
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}

/// Where xtask keeps its state: PID files, the env file, ClickHouse's work directory.
pub fn state_dir() -> PathBuf {
    workspace_root().join("target").join("xtask")
}

/// Whether a program can be found on `PATH`.
pub fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
}

/// Runs one visible step of a task: prints it, runs it with inherited output, and reports a
/// failure on stderr. `Ok(false)` means the step ran and failed; `Err` that it could not start.
pub fn run_step(cmd: &mut Command) -> anyhow::Result<bool> {
    println!("xtask: running `{}`", describe(cmd));
    let status = cmd
        .status()
        .with_context(|| format!("could not run `{}`", describe(cmd)))?;
    if !status.success() {
        eprintln!("xtask: `{}` failed ({status})", describe(cmd));
    }
    Ok(status.success())
}

/// Cargo's target directory: `CARGO_TARGET_DIR` when set, else `target/` in the workspace.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

/// Runs a command to completion, capturing its output; fails with the command line
/// and its stderr when it exits non-zero.
pub fn run_captured(cmd: &mut Command) -> anyhow::Result<String> {
    let output = output_of(cmd)?;
    if !output.status.success() {
        bail!(
            "`{}` failed ({}): {}",
            describe(cmd),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Runs a command and returns its raw output, whatever its exit status.
pub fn output_of(cmd: &mut Command) -> anyhow::Result<Output> {
    cmd.stdin(Stdio::null())
        .output()
        .with_context(|| format!("could not run `{}`", describe(cmd)))
}

/// Runs a command with inherited stdout and stderr, so its progress is visible.
pub fn run_visible(cmd: &mut Command) -> anyhow::Result<()> {
    let status = cmd
        .stdin(Stdio::null())
        .status()
        .with_context(|| format!("could not run `{}`", describe(cmd)))?;
    if !status.success() {
        bail!("`{}` failed ({status})", describe(cmd));
    }
    Ok(())
}

pub fn describe(cmd: &Command) -> String {
    let mut text = cmd.get_program().to_string_lossy().into_owned();
    for arg in cmd.get_args() {
        text.push(' ');
        text.push_str(&arg.to_string_lossy());
    }
    text
}

/// Whether we run as root; Debian's administrative steps need it (or sudo).
pub fn is_root() -> bool {
    // `id -u` keeps us free of libc; it is part of coreutils everywhere.
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
}

/// A command run as root: directly when we are root, else through `sudo -n`.
pub fn as_root(program: &str) -> Command {
    if is_root() {
        Command::new(program)
    } else {
        let mut cmd = Command::new("sudo");
        cmd.arg("-n").arg(program);
        cmd
    }
}

/// Installs Debian packages, running `apt-get update` first (a new machine has no lists).
pub fn apt_install(packages: &[&str]) -> anyhow::Result<()> {
    if !on_path("apt-get") {
        bail!(
            "{} is missing and there is no apt-get to install it: install it by hand",
            packages.join(" ")
        );
    }
    println!("xtask: installing Debian packages: {}", packages.join(" "));
    run_visible(as_root("apt-get").args(["update", "-q"]))
        .context("apt-get update failed: is the package mirror reachable?")?;
    run_visible(
        as_root("apt-get")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(packages),
    )
}

/// Whether a process with this PID exists (and is not a zombie).
pub fn pid_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state is the first field after the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// The NUL-separated command line of a process, joined by spaces.
pub fn pid_cmdline(pid: u32) -> Option<String> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(
        raw.split(|b| *b == 0)
            .map(|part| String::from_utf8_lossy(part).into_owned())
            .collect::<Vec<_>>()
            .join(" "),
    )
}

/// The number in a small state file (a PID, a port), if the file exists and holds one.
pub fn read_number<T: std::str::FromStr>(path: &Path) -> Option<T> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The PID recorded in `pid_file`, if that process is alive and still ours: its command line
/// contains `marker` (a path only our process has), so a PID the kernel reused for something
/// else is never signalled.
pub fn recorded_pid(pid_file: &Path, marker: &Path) -> Option<u32> {
    let pid: u32 = read_number(pid_file)?;
    let cmdline = pid_cmdline(pid)?;
    (pid_alive(pid) && cmdline.contains(&*marker.to_string_lossy())).then_some(pid)
}

/// Sends a signal to one process by PID, with the `kill` utility.
pub fn signal(pid: u32, signal: &str) -> anyhow::Result<()> {
    run_captured(
        Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string()),
    )
    .map(|_| ())
}

/// Sends SIGTERM, waits up to `grace`, then SIGKILL; returns once the process is gone.
pub fn stop_pid(pid: u32, grace: std::time::Duration) -> anyhow::Result<()> {
    if !pid_alive(pid) {
        return Ok(());
    }
    signal(pid, "TERM")?;
    let deadline = std::time::Instant::now() + grace;
    while std::time::Instant::now() < deadline {
        if !pid_alive(pid) {
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    signal(pid, "KILL")?;
    for _ in 0..50 {
        if !pid_alive(pid) {
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    bail!("process {pid} survived SIGKILL")
}

/// A plain HTTP/1.0 GET on loopback; returns the status code and body.
pub fn http_get(
    port: u16,
    path: &str,
    timeout: std::time::Duration,
) -> anyhow::Result<(u16, String)> {
    use std::io::{Read, Write};
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = std::net::TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("malformed HTTP response")?;
    Ok((code, body.to_owned()))
}

/// Whether something already listens on this loopback port.
pub fn port_in_use(port: u16) -> bool {
    std::net::TcpListener::bind(("127.0.0.1", port)).is_err()
}

/// A loopback port that is free right now: the preferred one if it is, else one the kernel picks.
pub fn free_port(preferred: u16) -> anyhow::Result<u16> {
    if !port_in_use(preferred) {
        return Ok(preferred);
    }
    let listener =
        std::net::TcpListener::bind(("127.0.0.1", 0)).context("no free loopback port")?;
    Ok(listener.local_addr()?.port())
}
