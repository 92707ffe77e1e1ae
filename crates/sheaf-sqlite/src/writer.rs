//! The single writer: every write of every store is an operation handed to one
//! [`WriteCoalescer`], whose worker commits each flush as one transaction on the one writer
//! connection.
//!
//! SQLite lets one connection write at a time, and a commit is the expensive part of a write (a
//! WAL append, and with `synchronous=FULL` an fsync). Funnelling every write into one queue that
//! commits whatever gathered while the previous commit ran turns concurrent writers into group
//! commits: the coalescer runs without an added wait, so an idle store commits a write at once
//! and a loaded one commits many per transaction.
//!
//! Each operation runs inside a savepoint of the flush's transaction, so an operation that fails
//! (a conflict, a missing tenant) is rolled back alone and answered with its own error while the
//! others commit. A flush whose transaction cannot begin or commit (a full disk, a read-only
//! file) fails every operation in it, with that error. An operation's answer is handed back only
//! after its flush committed: nothing is reported written that a crash could take back.

use std::sync::{Arc, Mutex, PoisonError};

use rusqlite::Connection;
use sheaf_coalesce::{
    BatchWriter, CoalesceMetrics, MetricsSnapshot, WriteCoalescer, WriteConfig, WriteError,
};
use sheaf_store::{Error, Result};
use tokio::sync::oneshot;

use crate::error::Doing;
use crate::space::Space;

/// What an operation leaves behind once it ran: its error if it failed (its savepoint is then
/// rolled back) and how to deliver its answer once the flush's fate is known.
struct Ran {
    error: Option<Error>,
    answer: Box<dyn FnOnce() + Send>,
}

type Run = Box<dyn FnOnce(&Connection) -> Ran + Send>;

/// One write operation, queued in the coalescer.
pub(crate) struct WriteOp {
    bytes: usize,
    run: Run,
}

/// The coalescer's sink: the writer connection.
///
/// A flush runs start to finish on a thread of Tokio's blocking pool with a synchronous driver,
/// so each statement is a call into SQLite on that thread. (An asynchronous driver runs each
/// statement on its own worker thread and answers over a channel: two thread wake-ups per
/// statement, which cost more than most of these statements do.)
struct Flusher {
    connection: Arc<Mutex<Connection>>,
    /// Measured after committed flushes (`space.rs` says how often), when the file has a
    /// size cap.
    space: Option<Arc<Space>>,
}

impl BatchWriter for Flusher {
    type Record = WriteOp;
    type Error = Error;

    fn record_bytes(&self, op: &WriteOp) -> usize {
        op.bytes
    }

    async fn write(&self, ops: Vec<WriteOp>) -> Result<()> {
        let connection = self.connection.clone();
        let space = self.space.clone();
        tokio::task::spawn_blocking(move || {
            // A poisoned lock only means an operation panicked; `flush` ends any transaction
            // it left open.
            let connection = connection.lock().unwrap_or_else(PoisonError::into_inner);
            flush(&connection, ops)?;
            if let Some(space) = &space {
                // The flush committed; a failed measurement leaves the last one standing.
                if let Err(e) = space.measure(&connection, false) {
                    tracing::debug!(error = %e, "measuring the sqlite database after a flush");
                }
            }
            Ok(())
        })
        .await
        .map_err(|e| Error::Unavailable {
            message: format!("the sqlite writer's flush did not finish: {e}"),
            source: None,
        })?
    }
}

fn execute(connection: &Connection, sql: &str, doing: &str) -> Result<()> {
    connection
        .prepare_cached(sql)
        .and_then(|mut statement| statement.execute([]))
        .map(|_| ())
        .doing(doing)
}

/// One transaction for every operation of the flush.
fn flush(connection: &Connection, ops: Vec<WriteOp>) -> Result<()> {
    if !connection.is_autocommit() {
        // Only an operation that panicked half-way leaves a transaction open.
        rollback(connection);
    }
    // IMMEDIATE takes the write lock up front: a checkpoint or another process holding it makes
    // the flush wait (up to the busy timeout) here, not fail half-way.
    execute(
        connection,
        "BEGIN IMMEDIATE",
        "beginning a write transaction",
    )?;
    let mut answers = Vec::with_capacity(ops.len());
    for op in ops {
        match run_one(connection, op) {
            Ok(answer) => answers.push(answer),
            Err(e) => {
                rollback(connection);
                return Err(e);
            }
        }
    }
    if let Err(e) = execute(connection, "COMMIT", "committing a write transaction") {
        rollback(connection);
        return Err(e);
    }
    for answer in answers {
        answer();
    }
    Ok(())
}

fn run_one(connection: &Connection, op: WriteOp) -> Result<Box<dyn FnOnce() + Send>> {
    execute(connection, "SAVEPOINT op", "opening a savepoint")?;
    let ran = (op.run)(connection);
    if let Some(error) = ran.error {
        // A failure that already ended the transaction (SQLite rolls back by itself on a full
        // disk or an I/O error) leaves no savepoint to go back to: the flush fails, with the
        // operation's error, which says what happened.
        if execute(connection, "ROLLBACK TO op", "rolling back a failed write").is_err() {
            return Err(error);
        }
    }
    execute(connection, "RELEASE op", "releasing a savepoint")?;
    Ok(ran.answer)
}

fn rollback(connection: &Connection) {
    // An error here means there is no transaction left to roll back (SQLite ended it itself).
    if let Err(e) = connection.execute_batch("ROLLBACK") {
        tracing::debug!(error = %e, "rolling back a failed flush");
    }
}

/// The handle every store writes through. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Writer {
    coalescer: WriteCoalescer<Flusher>,
    metrics: Arc<CoalesceMetrics>,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer")
            .field("coalescer", &self.coalescer)
            .finish_non_exhaustive()
    }
}

impl Writer {
    /// Starts the coalescer's worker over `connection`, measuring `space` after its flushes;
    /// must be called inside a Tokio runtime.
    pub(crate) fn start(
        connection: Connection,
        config: WriteConfig,
        space: Option<Arc<Space>>,
    ) -> Result<Self> {
        let flusher = Flusher {
            connection: Arc::new(Mutex::new(connection)),
            space,
        };
        let metrics = Arc::new(CoalesceMetrics::new());
        let coalescer = WriteCoalescer::with_observer(flusher, config, metrics.clone())
            .map_err(|e| Error::invalid_input(format!("sqlite write options: {e}")))?;
        Ok(Writer { coalescer, metrics })
    }

    /// Runs `op` on the writer connection, inside a savepoint of the next flush's transaction,
    /// and answers once that transaction committed. `bytes` estimates the data the operation
    /// writes, for the coalescer's `max_bytes`.
    ///
    /// The operation owns what it writes (`'static`): it may run after the caller stopped
    /// waiting, as a statement sent to a server may. It runs synchronously on the writer's
    /// thread, so it must not wait for anything but SQLite.
    pub(crate) async fn run<T, F>(&self, doing: &'static str, bytes: usize, op: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let run: Run = Box::new(move |connection| {
            let result = op(connection);
            Ran {
                error: result.as_ref().err().cloned(),
                answer: Box::new(move || {
                    // A caller that stopped waiting needs no answer.
                    let _ = reply.send(result);
                }),
            }
        });
        self.coalescer
            .hand_off(vec![WriteOp { bytes, run }])
            .await
            .map_err(|e| write_error(doing, e))?;
        answer.await.map_err(|_| Error::Unavailable {
            message: format!("{doing}: the writer stopped before answering"),
            source: None,
        })?
    }

    /// What the coalescer did so far: flushes (`writes`, each one transaction), operations
    /// (`records_written`) and failures.
    pub(crate) fn metrics(&self) -> MetricsSnapshot {
        self.metrics.snapshot()
    }

    /// Writes what is queued, then stops taking writes (later ones fail as `Unavailable`).
    pub(crate) async fn close(&self) {
        self.coalescer.close().await;
    }
}

fn write_error(doing: &str, error: WriteError<Error>) -> Error {
    match error {
        WriteError::Backend(e) => (*e).clone(),
        WriteError::Closed => Error::Unavailable {
            message: format!("{doing}: the sqlite store is closed"),
            source: None,
        },
        _ => Error::Unavailable {
            message: format!("{doing}: the sqlite writer stopped"),
            source: None,
        },
    }
}
