//! A `sheaf serve` child process, as the service's tests, the benchmarks and the fault suite
//! run it: started from a built binary with exactly the `SHEAF_*` settings the caller gives it
//! (every inherited one removed, see [`without_sheaf_env`](crate::without_sheaf_env)) and an
//! ephemeral loopback port, ready once it logs the address it listens on, its log kept in
//! memory (and, when asked, in a file), stopped by its own PID only (SIGTERM for a graceful
//! stop, SIGKILL for a crash), and killed when dropped, so a caller that fails half-way never
//! leaves one running.
//!
//! Readiness is the service's start-up line `sheaf … is listening on http://<addr>`, which it
//! logs at `info` once its listener is bound: a `SHEAF_LOG` that silences `info` must keep it
//! for the binary's own target (`warn,sheaf=info`). Reading the address from the log lets the
//! service pick its own port (`127.0.0.1:0`), so two processes started at once never race for
//! one.

use std::io::{BufRead as _, BufReader, Write as _};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use tokio::sync::oneshot;

/// What the service prints before the address it listens on.
const LISTENING: &str = "is listening on http://";

/// How a `sheaf serve` is started; [`SheafCommand::start`] starts it.
#[derive(Debug, Clone)]
pub struct SheafCommand {
    bin: PathBuf,
    name: String,
    settings: Vec<(String, String)>,
    log_file: Option<PathBuf>,
    pid_file: Option<PathBuf>,
    start_timeout: Duration,
}

impl SheafCommand {
    /// `bin serve` on the memory stores unless a later setting names others, named `sheaf` in
    /// messages, allowed 60 s to listen. The binary's own default is the SQLite file in
    /// `./sheaf-data`: a harness process that wants it says so (with a `SHEAF_DATA_DIR` of its
    /// own), and no other leaves a file behind or contends for one directory's lock.
    pub fn new(bin: impl Into<PathBuf>) -> Self {
        Self {
            bin: bin.into(),
            name: "sheaf".to_owned(),
            settings: vec![("SHEAF_LOG_STORE".to_owned(), "memory".to_owned())],
            log_file: None,
            pid_file: None,
            start_timeout: Duration::from_secs(60),
        }
    }

    /// Who the process is in messages (`sheaf a`, `sheaf b`, …).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// One setting; a later one of the same name wins. `SHEAF_LISTEN` is always replaced by an
    /// ephemeral loopback port.
    pub fn env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.settings.push((name.into(), value.into()));
        self
    }

    /// Several settings, in order (see [`env`](Self::env)).
    pub fn envs<K: Into<String>, V: Into<String>>(
        mut self,
        settings: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        self.settings
            .extend(settings.into_iter().map(|(k, v)| (k.into(), v.into())));
        self
    }

    /// Also writes every line the process logs to `path` (its directory is created).
    pub fn log_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.log_file = Some(path.into());
        self
    }

    /// Appends the process's PID to `path` as soon as it is spawned, for a supervisor to stop
    /// any survivor should the caller itself die.
    pub fn pid_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.pid_file = Some(path.into());
        self
    }

    /// How long the process may take to listen (migrations on a cold server take seconds).
    pub fn start_timeout(mut self, timeout: Duration) -> Self {
        self.start_timeout = timeout;
        self
    }

    /// Spawns the process and waits until it listens; kills it (and says why, with its log)
    /// when it exits first or does not listen in time.
    pub async fn start(self) -> anyhow::Result<SheafProcess> {
        let mut file = match &self.log_file {
            Some(path) => {
                if let Some(dir) = path.parent() {
                    std::fs::create_dir_all(dir)
                        .with_context(|| format!("cannot create {}", dir.display()))?;
                }
                let file = std::fs::File::create(path)
                    .with_context(|| format!("cannot create {}", path.display()))?;
                Some(file)
            }
            None => None,
        };
        let mut command = Command::new(&self.bin);
        crate::without_sheaf_env(&mut command)
            .arg("serve")
            .envs(self.settings.iter().map(|(k, v)| (k, v)))
            .env("SHEAF_LISTEN", "127.0.0.1:0")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = command
            .spawn()
            .with_context(|| format!("cannot start {}", self.bin.display()))?;
        if let Some(path) = &self.pid_file {
            record_pid(path, child.id());
        }
        let Some(stderr) = child.stderr.take() else {
            kill_and_reap(&mut child);
            bail!("the stderr of {} is not piped", self.name);
        };
        let log = Arc::new(Mutex::new(String::new()));
        let sink = Arc::clone(&log);
        let (tx, rx) = oneshot::channel::<String>();
        // Drains stderr for the life of the child (so it never blocks on a full pipe), keeps
        // every line, and reports the address it listens on once.
        let reader = std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.split(LISTENING).nth(1)
                    && let Some(tx) = tx.take()
                {
                    // The address ends where the text line does, or at the JSON line's quote.
                    let addr: String = rest
                        .chars()
                        .take_while(|c| {
                            c.is_ascii_alphanumeric() || matches!(c, '.' | ':' | '[' | ']')
                        })
                        .collect();
                    let _ = tx.send(addr);
                }
                if let Some(file) = file.as_mut() {
                    let _ = writeln!(file, "{line}");
                }
                let mut log = sink.lock().unwrap_or_else(PoisonError::into_inner);
                log.push_str(&line);
                log.push('\n');
            }
        });
        let mut process = SheafProcess {
            name: self.name,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            listening_at: Instant::now(),
            child,
            log,
            reader: Some(reader),
        };
        match tokio::time::timeout(self.start_timeout, rx).await {
            Ok(Ok(addr)) => {
                process.addr = addr.parse().with_context(|| {
                    format!("{} printed a malformed address {addr:?}", process.name)
                })?;
                process.listening_at = Instant::now();
                Ok(process)
            }
            // The reader ended without the line: the process closed stderr, so it exited.
            Ok(Err(_)) => {
                let status = process.wait_a_moment().await;
                bail!(
                    "{} exited during start-up ({}); its log:\n{}",
                    process.name,
                    status.map_or("no exit status yet".to_owned(), |s| s.to_string()),
                    process.log()
                )
            }
            Err(_) => {
                kill_and_reap(&mut process.child);
                bail!(
                    "{} did not listen within {:?}; its log:\n{}",
                    process.name,
                    self.start_timeout,
                    process.log()
                )
            }
        }
    }
}

/// How a process ended.
#[derive(Debug)]
pub struct Exited {
    /// Its exit status.
    pub status: ExitStatus,
    /// Everything it logged, to the last line.
    pub log: String,
}

/// A running `sheaf serve`; killed (by its PID) when dropped if it still runs.
#[derive(Debug)]
pub struct SheafProcess {
    /// Who it is in messages.
    pub name: String,
    /// Where its HTTP API listens.
    pub addr: SocketAddr,
    /// When it started listening.
    pub listening_at: Instant,
    child: Child,
    log: Arc<Mutex<String>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl SheafProcess {
    /// The base URL of its HTTP API (`http://127.0.0.1:<port>`).
    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The URL of `path` on its HTTP API.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Its PID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Everything it logged so far.
    pub fn log(&self) -> String {
        self.log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The last `lines` lines it logged, for error messages.
    pub fn log_tail(&self, lines: usize) -> String {
        let log = self.log();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Whether it is still running.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Peak resident set size over its life, in KiB (`VmHWM`).
    pub fn peak_rss_kib(&self) -> Option<u64> {
        status_kib(Some(self.pid()), "VmHWM")
    }

    /// Current resident set size, in KiB (`VmRSS`).
    pub fn rss_kib(&self) -> Option<u64> {
        status_kib(Some(self.pid()), "VmRSS")
    }

    /// CPU time it used so far, all its threads, user and system (`/proc/<pid>/stat`).
    pub fn cpu_time(&self) -> Option<Duration> {
        cpu_time(self.pid())
    }

    /// SIGKILL (`Child::kill` signals this child's PID), then reaps it: no graceful stop, no
    /// last acknowledgement, connections cut as by a crash.
    pub fn kill(mut self) -> anyhow::Result<ExitStatus> {
        self.child
            .kill()
            .with_context(|| format!("cannot SIGKILL {}", self.name))?;
        Ok(self.child.wait()?)
    }

    /// Sends SIGTERM (by PID, with the `kill` utility) and returns at once.
    pub fn terminate(&self) -> anyhow::Result<()> {
        crate::sigterm(self.pid())
    }

    /// Waits (at most `timeout`) for it to exit after [`terminate`](Self::terminate); kills it
    /// when the time is up and says so.
    pub async fn wait_exit(mut self, timeout: Duration) -> anyhow::Result<Exited> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                // The reader ends at the end of stderr, which the exit closed: wait (bounded)
                // for it, so the log holds the last line.
                if let Some(reader) = self.reader.take() {
                    let joined_by = Instant::now() + Duration::from_secs(5);
                    while !reader.is_finished() && Instant::now() < joined_by {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
                return Ok(Exited {
                    status,
                    log: self.log(),
                });
            }
            if Instant::now() >= deadline {
                kill_and_reap(&mut self.child);
                bail!(
                    "{} did not exit within {timeout:?} of SIGTERM; killed it",
                    self.name
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGTERM and a wait of at most `timeout` (then SIGKILL and an error): a graceful stop.
    pub async fn stop(self, timeout: Duration) -> anyhow::Result<Exited> {
        self.terminate()?;
        self.wait_exit(timeout).await
    }

    /// The exit status, once the process has exited (at most 1 s).
    async fn wait_a_moment(&mut self) -> Option<ExitStatus> {
        for _ in 0..50 {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        kill_and_reap(&mut self.child);
        None
    }
}

impl Drop for SheafProcess {
    fn drop(&mut self) {
        kill_and_reap(&mut self.child);
    }
}

/// Kills `child` (by its PID) if it still runs, and reaps it.
fn kill_and_reap(child: &mut Child) {
    if let Ok(None) = child.try_wait() {
        let _ = child.kill();
        let _ = child.wait();
    }
}

fn record_pid(path: &Path, pid: u32) {
    if let Ok(mut file) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = writeln!(file, "{pid}");
    }
}

/// A `kB` field of `/proc/<pid>/status` (`/proc/self/status` for `None`), such as `VmHWM` or
/// `VmRSS`, in KiB.
pub fn status_kib(pid: Option<u32>, field: &str) -> Option<u64> {
    let path = match pid {
        Some(pid) => format!("/proc/{pid}/status"),
        None => "/proc/self/status".to_owned(),
    };
    let status = std::fs::read_to_string(path).ok()?;
    status.lines().find_map(|line| {
        let rest = line.strip_prefix(field)?.strip_prefix(':')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// CPU time process `pid` used so far, all its threads, user and system: fields 14 and 15 of
/// `/proc/<pid>/stat`, in clock ticks of 1/100 s (Linux's `USER_HZ` for these fields).
pub fn cpu_time(pid: u32) -> Option<Duration> {
    let stat = ProcStat::read(pid)?;
    Some(ticks(stat.user + stat.system))
}

/// CPU time of process `pid` and all its children so far: its own, what its children that
/// exited and were reaped used (`cutime`, `cstime`), and what its live children used. For a
/// server that runs one process per connection (Postgres), this counts every connection that
/// came and went between two readings.
pub fn tree_cpu_time(pid: u32) -> Option<Duration> {
    let own = ProcStat::read(pid)?;
    let mut total = own.user + own.system + own.children_user + own.children_system;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(child) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if let Some(stat) = ProcStat::read(child).filter(|s| s.parent == pid) {
            total += stat.user + stat.system + stat.children_user + stat.children_system;
        }
    }
    Some(ticks(total))
}

/// The process listening on TCP `port` (IPv4 or IPv6), found by the socket's inode in
/// `/proc/net/tcp*` and among the open files of the processes this user can read.
pub fn listener_pid(port: u16) -> Option<u32> {
    let inode = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .find_map(|table| {
            let text = std::fs::read_to_string(table).ok()?;
            text.lines().skip(1).find_map(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                let local_port = fields.get(1)?.rsplit_once(':')?.1;
                // State 0A is LISTEN.
                let listening = fields.get(3) == Some(&"0A");
                (listening && u16::from_str_radix(local_port, 16).ok()? == port)
                    .then(|| fields.get(9).map(|inode| (*inode).to_owned()))?
            })
        })?;
    let socket = format!("socket:[{inode}]");
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?;
            fds.flatten()
                .any(|fd| {
                    std::fs::read_link(fd.path())
                        .is_ok_and(|target| target.as_os_str() == socket.as_str())
                })
                .then_some(pid)
        })
}

fn ticks(ticks: u64) -> Duration {
    Duration::from_millis(ticks * 10)
}

/// The fields of `/proc/<pid>/stat` the CPU readings need, in clock ticks.
struct ProcStat {
    parent: u32,
    user: u64,
    system: u64,
    children_user: u64,
    children_system: u64,
}

impl ProcStat {
    fn read(pid: u32) -> Option<Self> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // The command name, field 2, is in parentheses and may hold spaces: count after it,
        // from field 3 (the state).
        let fields: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
        let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
        Some(ProcStat {
            parent: u32::try_from(field(4)?).ok()?,
            user: field(14)?,
            system: field(15)?,
            children_user: field(16)?,
            children_system: field(17)?,
        })
    }
}

/// One sample of a Prometheus page: the value of the line whose name (with its labels, as
/// printed: `sheaf_deliveries_total{outcome="success"}`) is `name`.
pub fn metric_sample(page: &str, name: &str) -> Option<f64> {
    page.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|line| {
            let (key, value) = line.rsplit_once(' ')?;
            (key == name).then(|| value.parse().ok())?
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_a_resident_set() {
        assert!(status_kib(None, "VmRSS").is_some_and(|kib| kib > 0));
        assert!(status_kib(None, "VmHWM").is_some());
        assert_eq!(status_kib(None, "NoSuchField"), None);
    }
}
