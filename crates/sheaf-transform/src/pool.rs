//! Runners for a service: a few runner processes ([`crate::runner`]) that run its tenants'
//! programs, so that a program that loops, overflows its stack or exhausts memory costs one
//! runner and never the service.
//!
//! Requests are **batched**, the way Sheaf coalesces database work: [`Pool::run`] queues its
//! request and, if a runner is idle (or fewer than the pool's size exist), sets one driving.
//! A driving runner takes every queued request at once (up to [`MAX_BATCH`]), writes them in one
//! write, and reads the replies in order, so under load a runner pays one pipe round trip and
//! one pair of context switches per batch, not per event; when the queue is empty it goes idle.
//!
//! Replies come in request order, and a runner writes them out whenever it has read every
//! request it was sent (not one by one: a write per event would cost a pipe wakeup per event).
//! So when a reply has not come [`Pool::runaway_after`] after the previous one, or the runner
//! dies, the culprit is one of the requests still unanswered. The runner is killed (or gone);
//! if one request was unanswered it is the culprit, and its program is **refused** from then
//! on in this process (its next runs fail at once, saying why) until it is changed (a changed
//! program is another program). If several were, they go back to the front of the queue as
//! *suspects*, which a fresh runner takes one at a time: the culprit then kills a runner alone
//! and is refused, and the others get their answers. A crash costs a runner twice, and the
//! batches that never crash pay nothing for it.

use std::collections::{HashMap, VecDeque};
use std::ffi::OsString;
use std::hash::{Hash as _, Hasher as _};
use std::io;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::sync::oneshot;

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

/// The most requests one batch carries.
pub const MAX_BATCH: usize = 64;

/// A pool of runner processes.
pub struct Pool {
    command: RunnerCommand,
    size: usize,
    runaway_after: Duration,
    shared: Arc<Shared>,
}

/// What the callers and the driving runners share.
struct Shared {
    state: Mutex<State>,
    refused: Mutex<HashMap<u64, String>>,
}

struct State {
    /// Requests no runner has taken yet, oldest first.
    waiting: VecDeque<Pending>,
    /// Runners with nothing to do.
    idle: Vec<Runner>,
    /// Runners that exist: idle, driving, or being started.
    running: usize,
}

/// One queued request and where its answer goes.
struct Pending {
    key: u64,
    frame: Vec<u8>,
    answer: oneshot::Sender<Result<Output, Failure>>,
    /// It was unanswered in a batch whose runner died: it runs alone from now on, so that if
    /// it is what killed the runner, it is blamed and nothing else is.
    suspect: bool,
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
        Pool {
            command,
            size: size.max(1),
            runaway_after: RUNAWAY_AFTER,
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    waiting: VecDeque::new(),
                    idle: Vec::new(),
                    running: 0,
                }),
                refused: Mutex::new(HashMap::new()),
            }),
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
        if let Some(refused) = self.shared.refused(key) {
            return Err(refused);
        }
        let frame = Request {
            source,
            event: *event,
            limits: *limits,
        }
        .encode();
        let (answer, answered) = oneshot::channel();
        let drive = {
            let mut state = lock(&self.shared.state);
            state.waiting.push_back(Pending {
                key,
                frame,
                answer,
                suspect: false,
            });
            match state.idle.pop() {
                Some(runner) => Some(Some(runner)),
                None if state.running < self.size => {
                    state.running += 1;
                    Some(None)
                }
                // Every runner is driving: one of them takes this request in its next batch.
                None => None,
            }
        };
        if let Some(runner) = drive {
            // A task of its own: a caller that stops waiting does not stop the batch.
            tokio::spawn(drive_runner(
                Arc::clone(&self.shared),
                self.command.clone(),
                self.runaway_after,
                runner,
            ));
        }
        answered.await.unwrap_or_else(|_| {
            Err(Failure {
                message: "the transformation's runner stopped before answering".to_owned(),
                permanent: false,
            })
        })
    }
}

impl Shared {
    /// The failure of a refused program, if `key`'s is.
    fn refused(&self, key: u64) -> Option<Failure> {
        lock(&self.refused).get(&key).map(|reason| {
            Failure::permanent(format!(
                "{reason}; it is not run again in this process until it is changed"
            ))
        })
    }

    fn refuse(&self, key: u64, reason: String) -> Failure {
        let mut refused = lock(&self.refused);
        if refused.len() >= REFUSED_KEPT {
            refused.clear();
        }
        refused.insert(key, reason.clone());
        Failure::permanent(reason)
    }
}

/// Drives one runner (`None`: start one) through batches until the queue is empty, then leaves
/// it idle. Replaces a runner that died, and gives up (failing what waits, to be retried) only
/// when none can be started.
async fn drive_runner(
    shared: Arc<Shared>,
    command: RunnerCommand,
    runaway_after: Duration,
    mut runner: Option<Runner>,
) {
    loop {
        // One that ended while idle (killed from outside) is replaced, not blamed.
        let alive = |mut r: Runner| matches!(r.child.try_wait(), Ok(None)).then_some(r);
        let mut current = match runner.take().and_then(alive) {
            Some(current) => current,
            None => match Runner::start(&command) {
                Ok(started) => started,
                Err(e) => {
                    let message = format!(
                        "cannot start the transformation runner {}: {e}",
                        command.program.display()
                    );
                    let waiting: Vec<Pending> = {
                        let mut state = lock(&shared.state);
                        state.running -= 1;
                        // An idle runner takes over what waits (it would not wake by itself);
                        // else others still driving take it; the last one answers it.
                        if let Some(idle) = state.idle.pop() {
                            runner = Some(idle);
                            continue;
                        }
                        if state.running > 0 {
                            Vec::new()
                        } else {
                            state.waiting.drain(..).collect()
                        }
                    };
                    for pending in waiting {
                        let _ = pending.answer.send(Err(Failure {
                            message: message.clone(),
                            permanent: false,
                        }));
                    }
                    return;
                }
            },
        };
        let batch: Vec<Pending> = {
            let mut state = lock(&shared.state);
            if state.waiting.is_empty() {
                state.idle.push(current);
                return;
            }
            // Suspects wait at the front and go one at a time; the rest go together.
            let n = if state.waiting[0].suspect {
                1
            } else {
                state.waiting.len().min(MAX_BATCH)
            };
            state.waiting.drain(..n).collect()
        };
        // A program refused while its request waited is not run again.
        let mut runnable = Vec::with_capacity(batch.len());
        for pending in batch {
            match shared.refused(pending.key) {
                Some(refused) => {
                    let _ = pending.answer.send(Err(refused));
                }
                None => runnable.push(pending),
            }
        }
        if runnable.is_empty() {
            runner = Some(current);
            continue;
        }
        match current.run_batch(&shared, runnable, runaway_after).await {
            Ok(()) => runner = Some(current),
            Err(rest) => {
                // The runner is gone; what it had not answered waits first for the next one.
                let mut state = lock(&shared.state);
                for pending in rest.into_iter().rev() {
                    state.waiting.push_front(pending);
                }
            }
        }
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

    /// Writes the batch and answers each request as its reply comes. `Err` with the requests
    /// not answered when the runner is gone (killed as a runaway, or dead), now suspects;
    /// empty when the only one unanswered was the culprit (answered, its program refused).
    async fn run_batch(
        &mut self,
        shared: &Shared,
        batch: Vec<Pending>,
        runaway_after: Duration,
    ) -> Result<(), Vec<Pending>> {
        let mut frames = Vec::with_capacity(batch.iter().map(|p| p.frame.len()).sum());
        for pending in &batch {
            frames.extend_from_slice(&pending.frame);
        }
        let Runner {
            child,
            stdin,
            stdout,
        } = self;
        // Written while the replies are read: a batch larger than the pipe's buffer is taken in
        // as the runner gets to it.
        let write = async {
            stdin.write_all(&frames).await?;
            stdin.flush().await
        };
        let read = async {
            let mut batch = batch.into_iter();
            while let Some(pending) = batch.next() {
                let ended = match tokio::time::timeout(runaway_after, read_reply(stdout)).await {
                    Ok(Ok(reply)) => {
                        let _ = pending.answer.send(answer(reply));
                        continue;
                    }
                    Ok(Err(error)) => {
                        let status = ended(child).await;
                        format!(
                            "the transformation crashed its runner ({status}; {error}): it recursed too deep or used too much memory"
                        )
                    }
                    Err(_) => {
                        let _ = child.start_kill();
                        format!(
                            "the transformation ran past {runaway_after:?} and its runner was stopped"
                        )
                    }
                };
                tracing::warn!(reason = %ended, "a transformation runner ended; another is started");
                let mut unanswered: Vec<Pending> = std::iter::once(pending).chain(batch).collect();
                // The runner writes its replies out when its input runs dry, not one by one, so
                // any of the unanswered may have killed it, unless only one is left.
                if let [_] = unanswered.as_slice() {
                    let culprit = unanswered.pop().expect("one");
                    let _ = culprit.answer.send(Err(shared.refuse(culprit.key, ended)));
                    return Err(Vec::new());
                }
                for pending in &mut unanswered {
                    pending.suspect = true;
                }
                return Err(unanswered);
            }
            Ok(())
        };
        let (written, read) = tokio::join!(write, read);
        match (read, written) {
            (Err(rest), _) => Err(rest),
            (Ok(()), Ok(())) => Ok(()),
            // Every reply came, yet the write failed: the runner is not to be trusted further.
            (Ok(()), Err(_)) => {
                let _ = self.child.start_kill();
                Err(Vec::new())
            }
        }
    }
}

/// Reads one reply frame.
async fn read_reply(stdout: &mut BufReader<ChildStdout>) -> io::Result<Reply> {
    let mut prefix = [0u8; 4];
    stdout.read_exact(&mut prefix).await?;
    let mut frame = vec![0; frame_length(prefix)?];
    stdout.read_exact(&mut frame).await?;
    Reply::decode(&frame)
}

/// What a reply means for its caller.
fn answer(reply: Reply) -> Result<Output, Failure> {
    match reply {
        Reply::Ran(output) => Ok(output),
        Reply::Compile(e) => Err(Failure::permanent(format!(
            "the transformation does not compile: {e}"
        ))),
        Reply::Failed(message) => Err(Failure::permanent(message)),
    }
}

/// How a runner that stopped answering ended (it is killed if it has not within a second).
async fn ended(child: &mut Child) -> String {
    match tokio::time::timeout(Duration::from_secs(1), child.wait()).await {
        Ok(Ok(status)) => status.to_string(),
        Ok(Err(e)) => format!("its status cannot be read: {e}"),
        Err(_) => {
            let _ = child.start_kill();
            "it stopped answering and was stopped".to_owned()
        }
    }
}
