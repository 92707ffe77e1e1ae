//! Runners for a service: a few runner processes ([`crate::runner`]) that run its tenants'
//! programs, so that a program that loops, overflows its stack or exhausts memory costs one
//! runner and never the service.
//!
//! [`Pool::run`] hands a request to an idle runner (starting one if fewer than the pool's size
//! are running) and waits for the reply. A runner that has not answered after
//! [`Pool::runaway_after`] is killed; a runner that dies while running a program is gone. Either
//! way the program is **refused** from then on in this process (its next runs fail at once,
//! saying why), until it is changed: a changed program is another program. Runs of other
//! programs go on in the other runners and in a fresh one started in its place.

use std::collections::HashMap;
use std::ffi::OsString;
use std::hash::{Hash as _, Hasher as _};
use std::io;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Mutex;
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::sync::Semaphore;

use crate::wire::{Reply, Request, frame_length};
use crate::{Event, Limits, Output};

/// How long a run may go before its runner is killed and its program refused: a hundred times
/// the 10 ms a run is allowed, so that a loaded machine's scheduling never stops a runner that
/// is merely slow (a run that ends past its limit fails by itself, and is not refused).
pub const RUNAWAY_AFTER: Duration = Duration::from_secs(1);

/// How many refused programs are remembered; past it the list starts afresh, and a refused
/// program gets one more run.
const REFUSED_KEPT: usize = 4096;

/// The command that starts a runner: a program and its arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunnerCommand {
    /// The executable.
    pub program: PathBuf,
    /// Its arguments (`["transform-runner"]` for `sheaf`).
    pub args: Vec<OsString>,
}

/// Why a run gave no output to send.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Failure {
    /// What went wrong, in words fit for an attempt record.
    pub message: String,
    /// Whether running it again would fail again: the program's own failure (an error, a limit,
    /// a crash, a runaway). `false` when the runner could not be started or reached: a
    /// deployment problem, worth retrying.
    pub permanent: bool,
}

impl Failure {
    fn permanent(message: impl Into<String>) -> Self {
        Failure {
            message: message.into(),
            permanent: true,
        }
    }
}

/// A pool of runner processes.
pub struct Pool {
    command: RunnerCommand,
    size: usize,
    permits: Semaphore,
    idle: Mutex<Vec<Runner>>,
    refused: Mutex<HashMap<u64, String>>,
    runaway_after: Duration,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("command", &self.command)
            .field("size", &self.size)
            .finish_non_exhaustive()
    }
}

impl Pool {
    /// A pool of at most `size` runners (at least one), started by `command` when first needed.
    pub fn new(command: RunnerCommand, size: usize) -> Self {
        let size = size.max(1);
        Pool {
            command,
            size,
            permits: Semaphore::new(size),
            idle: Mutex::new(Vec::new()),
            refused: Mutex::new(HashMap::new()),
            runaway_after: RUNAWAY_AFTER,
        }
    }

    /// The same pool, killing a run after `after` instead of [`RUNAWAY_AFTER`].
    pub fn runaway_after(mut self, after: Duration) -> Self {
        self.runaway_after = after;
        self
    }

    /// Starts a runner and runs `.` on a small event with it: whether the command starts a
    /// runner at all. The runner stays, idle, for the first real run.
    pub async fn probe(&self) -> Result<(), String> {
        let event = Event {
            id: "probe",
            topic: "probe",
            data: b"{}",
            tenant_id: "probe",
        };
        match self.run(".", &event, &Limits::default()).await {
            Ok(Output::Send { body, .. }) if body.starts_with(b"{\"id\":\"probe\"") => Ok(()),
            Ok(other) => Err(format!("it answered {other:?} to a probe")),
            Err(e) => Err(e.message),
        }
    }

    /// Runs `source` on `event` in a runner.
    pub async fn run(
        &self,
        source: &str,
        event: &Event<'_>,
        limits: &Limits,
    ) -> Result<Output, Failure> {
        let key = source_key(source);
        if let Some(reason) = lock(&self.refused).get(&key) {
            return Err(Failure::permanent(format!(
                "{reason}; it is not run again in this process until it is changed"
            )));
        }
        let request = Request {
            source: source.to_owned(),
            id: event.id.to_owned(),
            topic: event.topic.to_owned(),
            data: event.data.to_vec(),
            tenant_id: event.tenant_id.to_owned(),
            limits: *limits,
        }
        .encode();
        let _permit = self
            .permits
            .acquire()
            .await
            .expect("the pool's semaphore is never closed");
        let mut runner = self.idle_or_new()?;
        match tokio::time::timeout(self.runaway_after, runner.exchange(&request)).await {
            Ok(Ok(reply)) => {
                lock(&self.idle).push(runner);
                match reply {
                    Reply::Ran(output) => Ok(output),
                    Reply::Compile(e) => Err(Failure::permanent(format!(
                        "the transformation does not compile: {e}"
                    ))),
                    Reply::Failed(message) => Err(Failure::permanent(message)),
                }
            }
            Ok(Err(error)) => {
                let status = runner.ended().await;
                let reason = format!(
                    "the transformation crashed its runner ({status}; {error}): it recursed too deep or used too much memory"
                );
                tracing::warn!(%reason, "a transformation runner ended; another is started when needed");
                Err(self.refuse(key, reason))
            }
            Err(_) => {
                runner.kill();
                let reason = format!(
                    "the transformation ran past {:?} and its runner was stopped",
                    self.runaway_after
                );
                tracing::warn!(%reason, "a transformation runner was stopped");
                Err(self.refuse(key, reason))
            }
        }
    }

    fn refuse(&self, key: u64, reason: String) -> Failure {
        let mut refused = lock(&self.refused);
        if refused.len() >= REFUSED_KEPT {
            refused.clear();
        }
        refused.insert(key, reason.clone());
        Failure::permanent(reason)
    }

    /// An idle runner still alive, or a new one.
    fn idle_or_new(&self) -> Result<Runner, Failure> {
        while let Some(mut runner) = lock(&self.idle).pop() {
            // One that ended while idle (killed from outside) is replaced, not blamed.
            if matches!(runner.child.try_wait(), Ok(None)) {
                return Ok(runner);
            }
        }
        Runner::start(&self.command).map_err(|e| Failure {
            message: format!(
                "cannot start the transformation runner {}: {e}",
                self.command.program.display()
            ),
            permanent: false,
        })
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn source_key(source: &str) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    source.hash(&mut hasher);
    hasher.finish()
}

/// One runner process and its pipes.
struct Runner {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Runner {
    fn start(command: &RunnerCommand) -> io::Result<Self> {
        let mut child = Command::new(&command.program)
            .args(&command.args)
            // Programs can read nothing of the service: no environment (no secrets), no files
            // (jaq has no file access), no output but their replies.
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()?;
        let stdin = child.stdin.take().expect("stdin is piped");
        let stdout = BufReader::new(child.stdout.take().expect("stdout is piped"));
        Ok(Runner {
            child,
            stdin,
            stdout,
        })
    }

    async fn exchange(&mut self, request: &[u8]) -> io::Result<Reply> {
        self.stdin.write_all(request).await?;
        self.stdin.flush().await?;
        let mut prefix = [0u8; 4];
        self.stdout.read_exact(&mut prefix).await?;
        let mut frame = vec![0; frame_length(prefix)?];
        self.stdout.read_exact(&mut frame).await?;
        Reply::decode(&frame)
    }

    /// How the runner ended, once it has (it is killed if it has not within a second).
    async fn ended(mut self) -> String {
        match tokio::time::timeout(Duration::from_secs(1), self.child.wait()).await {
            Ok(Ok(status)) => status.to_string(),
            Ok(Err(e)) => format!("its status cannot be read: {e}"),
            Err(_) => {
                self.kill();
                "it stopped answering and was stopped".to_owned()
            }
        }
    }

    /// Kills the runner; Tokio reaps it.
    fn kill(mut self) {
        let _ = self.child.start_kill();
    }
}
