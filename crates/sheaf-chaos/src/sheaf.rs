//! A `sheaf serve` child process: started with exactly the settings a scenario gives it, its
//! log kept in memory and in `target/xtask/chaos/logs/`, stopped by its PID only (SIGTERM for
//! a graceful stop, SIGKILL for a crash), and killed when dropped, so a scenario that fails
//! half-way never leaves one running. Every PID is also appended to `sheaf.pids`, from which
//! xtask stops any survivor should this binary itself die.

use std::io::{BufRead as _, BufReader, Write as _};
use std::net::SocketAddr;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use crate::env::Ctx;

/// How long a `sheaf` may take to listen: migrations on a cold ClickHouse take seconds.
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// A running `sheaf serve`.
#[derive(Debug)]
pub struct Sheaf {
    /// Who it is in the scenario's output (`a`, `b`, …).
    pub name: String,
    /// Where its HTTP API listens.
    pub addr: SocketAddr,
    /// When it started listening.
    pub listening_at: Instant,
    child: Child,
    log: Arc<Mutex<String>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

/// How a process ended.
#[derive(Debug)]
pub struct Exited {
    /// Its exit status.
    pub status: ExitStatus,
    /// Everything it logged, to the last line.
    pub log: String,
}

impl Sheaf {
    /// Starts `sheaf serve` with `settings` as its only `SHEAF_*` variables (plus an ephemeral
    /// loopback port) and waits until it listens.
    pub async fn spawn(
        ctx: &Ctx,
        scenario: &str,
        name: &str,
        settings: &[(String, String)],
    ) -> anyhow::Result<Self> {
        let logs = ctx.dir.join("logs");
        std::fs::create_dir_all(&logs)?;
        let log_path = logs.join(format!("{scenario}-{name}.log"));
        let mut file = std::fs::File::create(&log_path)?;
        let mut command = Command::new(&ctx.sheaf_bin);
        for (var, _) in std::env::vars() {
            if var.starts_with("SHEAF_") {
                command.env_remove(var);
            }
        }
        command
            .arg("serve")
            .envs(settings.iter().map(|(k, v)| (k, v)))
            .env("SHEAF_LISTEN", "127.0.0.1:0")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = command
            .spawn()
            .with_context(|| format!("cannot start {}", ctx.sheaf_bin.display()))?;
        ctx.record_pid(child.id());
        let stderr = child.stderr.take().context("sheaf's stderr is piped")?;
        let log = Arc::new(Mutex::new(String::new()));
        let sink = Arc::clone(&log);
        let (tx, rx) = mpsc::channel();
        // Drains stderr for the life of the child and reports the address it listens on.
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.split("is listening on http://").nth(1) {
                    let addr: String = rest.chars().take_while(|c| !c.is_whitespace()).collect();
                    let _ = tx.send(addr);
                }
                let _ = writeln!(file, "{line}");
                let mut log = sink.lock().unwrap_or_else(|e| e.into_inner());
                log.push_str(&line);
                log.push('\n');
            }
        });
        let waited = tokio::task::spawn_blocking(move || rx.recv_timeout(START_TIMEOUT)).await?;
        let addr: SocketAddr = match waited {
            Ok(addr) => addr.parse().context("sheaf printed a malformed address")?,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                let text = log.lock().unwrap_or_else(|e| e.into_inner()).clone();
                bail!(
                    "sheaf {name} did not listen within {START_TIMEOUT:?}; its log ({}):\n{text}",
                    log_path.display()
                );
            }
        };
        println!(
            "  sheaf {name} (pid {}) listens on {addr}; log in {}",
            child.id(),
            log_path.display()
        );
        Ok(Self {
            name: name.to_owned(),
            addr,
            listening_at: Instant::now(),
            child,
            log,
            reader: Some(reader),
        })
    }

    /// The base URL of its HTTP API.
    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Its PID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Everything it logged so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Whether it is still running.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Peak resident set size over its life, in KiB (`VmHWM`).
    pub fn peak_rss_kib(&self) -> Option<u64> {
        proc_status_kib(self.pid(), "VmHWM:")
    }

    /// SIGKILL: no graceful stop, connections cut as by a crash. Reaps it.
    pub fn kill(mut self) -> anyhow::Result<ExitStatus> {
        self.child.kill().context("SIGKILL sheaf")?;
        Ok(self.child.wait()?)
    }

    /// Sends SIGTERM (by PID, with the `kill` utility) and returns at once.
    pub fn terminate(&self) -> anyhow::Result<()> {
        let status = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status()
            .context("cannot run kill")?;
        if !status.success() {
            bail!("kill -TERM {} failed ({status})", self.pid());
        }
        Ok(())
    }

    /// Waits (at most `timeout`) for it to exit after [`terminate`](Self::terminate); kills it
    /// when the time is up and says so.
    pub async fn wait_exit(mut self, timeout: Duration) -> anyhow::Result<Exited> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                // The reader ends at the end of stderr, which the exit closed.
                if let Some(reader) = self.reader.take() {
                    let _ = tokio::task::spawn_blocking(move || reader.join()).await;
                }
                return Ok(Exited {
                    status,
                    log: self.log(),
                });
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                bail!("sheaf {} did not exit within {timeout:?}", self.name);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGTERM and a bounded wait: the normal end of a scenario's process.
    pub async fn stop(self) -> anyhow::Result<Exited> {
        self.terminate()?;
        self.wait_exit(Duration::from_secs(60)).await
    }
}

impl Drop for Sheaf {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn proc_status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}
