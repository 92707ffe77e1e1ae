//! The write coalescer: batches handed off by many writers become few, larger writes.
//!
//! Why waiting helps: a worker that only takes what is already queued keeps up with its
//! source and writes every small batch as it arrives. In the write-wait experiment that
//! made 5,210 ClickHouse parts of 58 rows on average from ten workers, where one worker
//! with the whole table made parts of ~1,500 rows, and a 500 ms wait for more batches
//! brought part creation back down (docs/benchmarks.md, "parts", earlier measurements).
//! Reproduced here with ten writers, a 500 ms wait cut parts threefold, from 961 of 312
//! rows to 309 of 971 (docs/benchmarks.md, "parts").

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use tracing::Instrument as _;

use crate::config::{ConfigError, WriteConfig};
use crate::error::WriteError;
use crate::metrics::{NoopObserver, Observer, WriteFlush};

/// A sink that writes many records in one operation (one INSERT, one statement).
pub trait BatchWriter: Send + Sync + 'static {
    /// What is written.
    type Record: Send + 'static;
    /// Why a write failed. It is shared behind an `Arc` by every batch in the write.
    type Error: std::error::Error + Send + Sync + 'static;

    /// The size of one record as it counts against `max_bytes` (its encoded size,
    /// or a close estimate). Called once per record when its batch is handed off.
    fn record_bytes(&self, record: &Self::Record) -> usize;

    /// Writes all `records` as one operation. They arrive in hand-off order, batch by
    /// batch; a failure fails every batch in it.
    fn write(
        &self,
        records: Vec<Self::Record>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;
}

/// A shared writer is a writer.
impl<W: BatchWriter> BatchWriter for Arc<W> {
    type Record = W::Record;
    type Error = W::Error;

    fn record_bytes(&self, record: &Self::Record) -> usize {
        W::record_bytes(self, record)
    }

    fn write(
        &self,
        records: Vec<Self::Record>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send {
        W::write(self, records)
    }
}

type Outcome<E> = Result<(), WriteError<E>>;

/// One handed-off batch waiting in the queue or in a write being gathered.
struct Queued<W: BatchWriter> {
    records: Vec<W::Record>,
    bytes: usize,
    done: oneshot::Sender<Outcome<W::Error>>,
    /// The span it was handed off from, linked with the span of the write that carries it.
    span: tracing::Span,
}

enum Message<W: BatchWriter> {
    Batch(Queued<W>),
    Close,
}

struct Shared<W: BatchWriter> {
    writer: Arc<W>,
    config: WriteConfig,
    closed: AtomicBool,
    drained: watch::Receiver<bool>,
}

/// Coalesces handed-off batches of records into bounded writes.
///
/// A cloneable handle over a bounded queue to one worker task. The worker opens a
/// write with the oldest batch, then:
///
/// 1. adds every batch already queued, in order, while the write is under both
///    `max_records` and `max_bytes` and the next batch fits;
/// 2. if the queue ran empty and the write is still under both bounds and `max_wait`
///    is not zero, waits for more (a timed poll on the queue, its deadline `max_wait`
///    after the wait began), adding each batch that fits together with whatever was
///    queued behind it, and stops the moment a bound is reached or the deadline passes;
/// 3. writes it, then reports the outcome to each of its batches in hand-off order.
///
/// A batch that does not fit is carried over: it opens the next write, ahead of
/// anything still queued, so batches are never split or reordered. A single batch
/// larger than the bounds is written alone. Writes run one at a time, so while one runs
/// the next gathers in the queue, and outcomes across writes keep hand-off order too.
pub struct WriteCoalescer<W: BatchWriter> {
    shared: Arc<Shared<W>>,
    queue: mpsc::Sender<Message<W>>,
}

impl<W: BatchWriter> Clone for WriteCoalescer<W> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
            queue: self.queue.clone(),
        }
    }
}

impl<W: BatchWriter> std::fmt::Debug for WriteCoalescer<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteCoalescer")
            .field("config", &self.shared.config)
            .field("closed", &self.shared.closed.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// The outcome of one handed-off batch, ready when the write that carried it is done.
#[must_use = "a completion does nothing unless awaited; dropping it does not cancel the write"]
pub struct WriteCompletion<E> {
    outcome: oneshot::Receiver<Outcome<E>>,
}

impl<E> std::fmt::Debug for WriteCompletion<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteCompletion").finish_non_exhaustive()
    }
}

impl<E> Future for WriteCompletion<E> {
    type Output = Outcome<E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // A dropped sender means the worker died before reporting this batch.
        Pin::new(&mut self.outcome)
            .poll(cx)
            .map(|received| received.unwrap_or(Err(WriteError::WorkerGone)))
    }
}

impl<W: BatchWriter> WriteCoalescer<W> {
    /// A coalescer with no observer; see [`with_observer`](Self::with_observer).
    pub fn new(writer: W, config: WriteConfig) -> Result<Self, ConfigError> {
        Self::with_observer(writer, config, Arc::new(NoopObserver))
    }

    /// Validates the configuration and starts the worker task; must be called inside a
    /// Tokio runtime.
    pub fn with_observer(
        writer: W,
        config: WriteConfig,
        observer: Arc<dyn Observer>,
    ) -> Result<Self, ConfigError> {
        config.validate()?;
        let runtime =
            tokio::runtime::Handle::try_current().map_err(|_| ConfigError::NoRuntime {
                what: "WriteCoalescer",
            })?;
        let writer = Arc::new(writer);
        let (queue, receiver) = mpsc::channel(config.queue_depth);
        let (drained_tx, drained) = watch::channel(false);
        let worker = Worker {
            writer: Arc::clone(&writer),
            observer,
            config,
            receiver,
            carried: None,
            closing: false,
            drained: drained_tx,
        };
        runtime.spawn(worker.run());
        Ok(Self {
            shared: Arc::new(Shared {
                writer,
                config,
                closed: AtomicBool::new(false),
                drained,
            }),
            queue,
        })
    }

    /// The configuration it runs with.
    pub fn config(&self) -> &WriteConfig {
        &self.shared.config
    }

    /// Hands `batch` off and waits until the write that carries it is done.
    pub async fn hand_off(&self, batch: Vec<W::Record>) -> Outcome<W::Error> {
        self.enqueue(batch).await?.await
    }

    /// Hands `batch` off and returns as soon as it is queued (waiting only for room in
    /// the queue); the returned completion reports its write. Batches are written in
    /// the order their `enqueue` calls returned.
    pub async fn enqueue(
        &self,
        batch: Vec<W::Record>,
    ) -> Result<WriteCompletion<W::Error>, WriteError<W::Error>> {
        if self.shared.closed.load(Ordering::Acquire) {
            return Err(WriteError::Closed);
        }
        let bytes = batch
            .iter()
            .map(|record| self.shared.writer.record_bytes(record))
            .fold(0usize, usize::saturating_add);
        let (done, outcome) = oneshot::channel();
        let queued = Queued {
            records: batch,
            bytes,
            done,
            span: tracing::Span::current(),
        };
        if self.queue.send(Message::Batch(queued)).await.is_err() {
            return Err(if self.shared.closed.load(Ordering::Acquire) {
                WriteError::Closed
            } else {
                WriteError::WorkerGone
            });
        }
        Ok(WriteCompletion { outcome })
    }

    /// Stops accepting batches, writes everything already queued without waiting for
    /// more, and returns when those writes are done. Later hand-offs fail with
    /// [`WriteError::Closed`]. Calling it again is harmless.
    pub async fn close(&self) {
        self.shared.closed.store(true, Ordering::Release);
        // A send error means the worker already stopped taking messages.
        let _ = self.queue.send(Message::Close).await;
        let mut drained = self.shared.drained.clone();
        // An error means the worker is gone, so there is nothing left to wait for.
        let _ = drained.wait_for(|done| *done).await;
    }

    /// Whether [`close`](Self::close) has been called.
    pub fn is_closed(&self) -> bool {
        self.shared.closed.load(Ordering::Acquire)
    }
}

/// A write being gathered.
struct Gathered<W: BatchWriter> {
    batches: Vec<Queued<W>>,
    records: usize,
    bytes: usize,
}

impl<W: BatchWriter> Gathered<W> {
    fn open(first: Queued<W>) -> Self {
        let mut write = Self {
            batches: Vec::new(),
            records: 0,
            bytes: 0,
        };
        write.push(first);
        write
    }

    fn push(&mut self, batch: Queued<W>) {
        self.records = self.records.saturating_add(batch.records.len());
        self.bytes = self.bytes.saturating_add(batch.bytes);
        self.batches.push(batch);
    }

    fn under_bounds(&self, config: &WriteConfig) -> bool {
        self.records < config.max_records && self.bytes < config.max_bytes
    }

    fn fits(&self, batch: &Queued<W>, config: &WriteConfig) -> bool {
        self.records.saturating_add(batch.records.len()) <= config.max_records
            && self.bytes.saturating_add(batch.bytes) <= config.max_bytes
    }
}

struct Worker<W: BatchWriter> {
    writer: Arc<W>,
    observer: Arc<dyn Observer>,
    config: WriteConfig,
    receiver: mpsc::Receiver<Message<W>>,
    /// A batch that did not fit the previous write; it opens the next one.
    carried: Option<Queued<W>>,
    closing: bool,
    drained: watch::Sender<bool>,
}

impl<W: BatchWriter> Worker<W> {
    async fn run(mut self) {
        loop {
            let first = match self.carried.take() {
                Some(batch) => batch,
                None => match self.next_batch().await {
                    Some(batch) => batch,
                    None => break,
                },
            };
            let mut write = Gathered::open(first);
            self.take_queued(&mut write);
            let waited = if self.should_wait(&write) {
                self.wait_for_more(&mut write).await
            } else {
                Duration::ZERO
            };
            self.issue(write, waited).await;
        }
        // Nobody may be waiting on `close()`; that is fine.
        let _ = self.drained.send(true);
    }

    /// The next batch, waiting as long as it takes; `None` once closed and drained.
    async fn next_batch(&mut self) -> Option<Queued<W>> {
        loop {
            match self.receiver.recv().await? {
                Message::Batch(batch) => return Some(batch),
                Message::Close => self.begin_close(),
            }
        }
    }

    fn begin_close(&mut self) {
        // Batches already queued are still received after this; new sends fail.
        self.receiver.close();
        self.closing = true;
    }

    /// Step 1: adds what is already queued while the write is under both bounds.
    fn take_queued(&mut self, write: &mut Gathered<W>) {
        while self.carried.is_none() && write.under_bounds(&self.config) {
            match self.receiver.try_recv() {
                Ok(Message::Batch(batch)) => self.add_or_carry(write, batch),
                Ok(Message::Close) => self.begin_close(),
                Err(_) => break,
            }
        }
    }

    fn add_or_carry(&mut self, write: &mut Gathered<W>, batch: Queued<W>) {
        if write.fits(&batch, &self.config) {
            write.push(batch);
        } else {
            self.carried = Some(batch);
        }
    }

    fn should_wait(&self, write: &Gathered<W>) -> bool {
        // A carried batch means the bounds were met already; closing means the caller
        // of `close()` wants what is queued written now, not after another window.
        !self.config.max_wait.is_zero()
            && self.carried.is_none()
            && !self.closing
            && write.under_bounds(&self.config)
    }

    /// Step 2: the timed poll. Returns how long the window stayed open.
    async fn wait_for_more(&mut self, write: &mut Gathered<W>) -> Duration {
        let started = Instant::now();
        let deadline = started + self.config.max_wait;
        while self.should_wait(write) {
            match tokio::time::timeout_at(deadline, self.receiver.recv()).await {
                Ok(Some(Message::Batch(batch))) => {
                    self.add_or_carry(write, batch);
                    // Whatever arrived together with it joins too, under the same rule.
                    self.take_queued(write);
                }
                Ok(Some(Message::Close)) => self.begin_close(),
                // Every handle is gone: write what we have and let the loop end.
                Ok(None) => self.closing = true,
                Err(_elapsed) => break,
            }
        }
        started.elapsed()
    }

    /// Step 3: one write, then each batch's outcome in hand-off order.
    async fn issue(&mut self, write: Gathered<W>, waited: Duration) {
        let Gathered {
            batches,
            records: record_count,
            bytes,
        } = write;
        let batch_count = batches.len();
        let mut records = Vec::with_capacity(record_count);
        let mut completions = Vec::with_capacity(batch_count);
        // One span for the write, linked both ways with the span of every hand-off it carries:
        // a trace viewer shows which write took a caller's records, and whose records a write
        // took. Without a subscriber that wants them, both spans are disabled and this is free.
        let span = tracing::debug_span!(
            "coalesced_write",
            records = record_count,
            batches = batch_count
        );
        for batch in batches {
            span.follows_from(&batch.span);
            batch.span.follows_from(&span);
            records.extend(batch.records);
            completions.push(batch.done);
        }
        let started = Instant::now();
        // A write of only empty batches has nothing to send; its batches still complete
        // in order with the others.
        let result = if records.is_empty() {
            Ok(())
        } else {
            self.writer
                .write(records)
                .instrument(span)
                .await
                .map_err(|err| WriteError::Backend(Arc::new(err)))
        };
        self.observer.write_done(&WriteFlush {
            batches: batch_count,
            records: record_count,
            bytes,
            waited,
            carried_over: self.carried.is_some(),
            failed: result.is_err(),
            elapsed: started.elapsed(),
        });
        for done in completions {
            // A writer that stopped waiting for its outcome needs no answer.
            let _ = done.send(result.clone());
        }
    }
}
