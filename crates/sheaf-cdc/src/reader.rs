//! The reader core, independent of the transport: WAL events in, decoded rows grouped
//! per transaction, stamped, tracked and handed to the consumer over a buffered channel.
//!
//! ```text
//!  transport ─WalEvent─> StreamReader: ChangeDecoder ─> TransactionBatcher ─> filter,
//!                        stamp, AckTracker (≤ checkpoint_limit rows) ─> mpsc(4) ─> CdcStream ─> CdcMessage
//! ```
//!
//! The Postgres source ([`crate::CdcSource`]) drives a [`StreamReader`] from
//! `pgwire-replication`; tests and benchmarks drive it with synthetic events.
//!
//! Longer than 600 lines because the options, the transaction batcher, the reader and the stream
//! it feeds share the private reader batch and its acknowledgement stamps, which read best in one
//! place.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::ack::{AckToken, AckTracker};
use crate::change::{Change, ChangeDecoder, Decoded};
use crate::config::ConnectionSecurity;
use crate::pgoutput::{Begin, Commit};
use crate::{Error, Lsn, Result};

/// Depth of the reader → consumer channel, in reader batches. A buffered channel of
/// depth 4 lets decoding overlap downstream work, where one row per unbuffered send keeps
/// reader and consumer in lockstep (~81–85 MB/s whatever the cores in the per-transaction
/// batching experiment: docs/benchmarks.md, "cdc", earlier measurements). What it lets a
/// stalled consumer leave buffered is [`StreamOptions::buffer_bound`].
pub const CHANNEL_DEPTH: usize = 4;

/// Upper bound of the row cap, whatever `checkpoint_limit` is: the cap is
/// `min(1000, checkpoint_limit / 2)`, so a large limit still gives batches of at most
/// 1,000 rows.
pub const MAX_BATCH_ROWS: usize = 1000;

/// The byte cap of a reader batch, in bytes of WAL (pgoutput message bytes,
/// [`Change::wal_bytes`], not decoded size): 4 MiB. A batch is closed before a change is
/// appended once it holds this many bytes or more, so only its last change can take it
/// past the cap, and a batch is always below the cap plus that one change. With the
/// channel's depth it bounds the WAL a stalled consumer leaves buffered: see
/// [`StreamOptions::buffer_bound`] (docs/benchmarks.md, "cdc").
pub const MAX_BATCH_WAL_BYTES: usize = 4 * 1024 * 1024;

/// Default `checkpoint_limit`: 1024 rows in flight, which makes the default row cap
/// `min(1000, checkpoint_limit / 2)` = 512.
pub const DEFAULT_CHECKPOINT_LIMIT: usize = 1024;

/// Decides whether a change is delivered; `false` drops it. Runs on the reader, on each
/// flushed batch. A dropped row still counts for acknowledgement: when every row of a
/// flush is dropped, its position is confirmed as a row-less checkpoint.
pub type RowFilter = Arc<dyn Fn(&Change) -> bool + Send + Sync>;

/// Re-batches rows on the consumer side: up to `count` rows per message, waiting at most
/// `max_wait` after the first for more. Messages may span transactions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchingPolicy {
    /// Most rows per message (at least 1).
    pub count: usize,
    /// Longest wait for more rows once a message has its first.
    pub max_wait: Duration,
}

/// How rows are read, batched and handed over. Shared by every transport.
#[derive(Clone)]
pub struct StreamOptions {
    /// Most rows handed to the consumer and not yet confirmed (acknowledged in order).
    /// The reader waits for room beyond it; its reader batches hold at most
    /// `min(1000, checkpoint_limit / 2)` rows (at least 1) so two fit in flight. A batch is
    /// always admitted when nothing is pending, but no batch is larger than the limit, so
    /// in-flight rows never pass it. Default [`DEFAULT_CHECKPOINT_LIMIT`].
    pub checkpoint_limit: usize,
    /// Deliver each transaction as one message (default `false`: one message per row).
    ///
    /// This changes the unit of failure downstream, which is why it is opt-in. With one
    /// message per row, a row that cannot be handled (a constraint violation in a sink, a
    /// rejected payload) fails alone: its neighbours are delivered and only it is retried
    /// or dead-lettered. With one message per transaction, the same row fails the whole
    /// message: a multi-row write that rolls back takes every row of the transaction with
    /// it, a dead-letter route receives all of them, and a retry repeats all of them —
    /// a transaction with one permanently bad row stalls the stream where one row per
    /// message would have delivered the others first. For example, a sink that inserts a
    /// message's rows with one multi-row `INSERT` and routes failures to a dead-letter
    /// table: when one row of a transaction violates a unique constraint, one message per
    /// row lands the others and dead-letters that row, while one message per transaction
    /// rolls back all of them and dead-letters the whole transaction.
    /// Transactions larger than the row cap or 4 MiB of WAL still arrive in several
    /// messages. Cannot be combined with `batching`, which would re-batch them.
    pub batch_transactions: bool,
    /// Group rows into messages by count and time instead of one per row. Cannot be
    /// combined with `batch_transactions`.
    pub batching: Option<BatchingPolicy>,
    /// Drops changes on the reader; see [`RowFilter`].
    pub filter: Option<RowFilter>,
}

impl fmt::Debug for StreamOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamOptions")
            .field("checkpoint_limit", &self.checkpoint_limit)
            .field("batch_transactions", &self.batch_transactions)
            .field("batching", &self.batching)
            .field("filter", &self.filter.as_ref().map(|_| ".."))
            .finish()
    }
}

impl Default for StreamOptions {
    fn default() -> Self {
        StreamOptions {
            checkpoint_limit: DEFAULT_CHECKPOINT_LIMIT,
            batch_transactions: false,
            batching: None,
            filter: None,
        }
    }
}

impl StreamOptions {
    /// Checks the options.
    ///
    /// # Errors
    /// [`Error::Config`] naming the field: `batch_transactions` together with `batching`,
    /// a zero `checkpoint_limit`, a zero `batching.count`.
    pub fn validate(&self) -> Result<()> {
        if self.batch_transactions && self.batching.is_some() {
            return Err(Error::Config(
                "`batch_transactions` cannot be combined with `batching`: the policy would re-batch \
                 the transactions; set one or the other"
                    .into(),
            ));
        }
        if self.checkpoint_limit == 0 {
            return Err(Error::Config(
                "`checkpoint_limit` must be at least 1".into(),
            ));
        }
        if self.batching.is_some_and(|b| b.count == 0) {
            return Err(Error::Config("`batching.count` must be at least 1".into()));
        }
        Ok(())
    }

    /// Rows per reader batch: `min(1000, checkpoint_limit / 2)`, at least 1.
    pub fn row_cap(&self) -> usize {
        (self.checkpoint_limit / 2).clamp(1, MAX_BATCH_ROWS)
    }

    /// The most a stalled consumer can leave buffered with these options: rows handed over
    /// and not yet acknowledged ([`CdcStream::rows_in_flight`],
    /// [`CdcStream::wal_bytes_in_flight`]) once it has acknowledged everything it received
    /// and stopped calling [`CdcStream::recv`].
    ///
    /// That is at most [`CHANNEL_DEPTH`] + 1 reader batches: `CHANNEL_DEPTH` queued in the
    /// channel and the one the reader has tracked and is blocked handing over. Without
    /// `batch_transactions` add one: [`CdcStream`] returns a batch row by row (or
    /// re-batches it), and keeps the rest of the last one it took. Each batch holds at most
    /// [`StreamOptions::row_cap`] rows and less than [`MAX_BATCH_WAL_BYTES`] plus one change
    /// of WAL, and all of them together at most `checkpoint_limit` rows;
    /// [`BufferBound::wal_bytes`] turns this into bytes. For example, `batch_transactions`
    /// with a `checkpoint_limit` of 100,000 and rows of 8 KB of WAL: 5 × (4 MiB + 8 KB).
    ///
    /// Not counted, because nothing is handed over yet or it is the consumer's: messages
    /// the consumer holds unacknowledged; the reader's open batch (while the reader is
    /// blocked, just the change that closed the batch it is handing over, so everything
    /// decoded and not yet received stays within the bound plus one WAL message); the
    /// transport's queue of undecoded messages below the reader (`pgwire-replication`'s
    /// `buffer_events`, 8,192 messages by default); and the decoded rows' memory, larger
    /// than their WAL bytes.
    pub fn buffer_bound(&self) -> BufferBound {
        let batches = if self.batch_transactions {
            CHANNEL_DEPTH + 1
        } else {
            CHANNEL_DEPTH + 2
        };
        BufferBound {
            batches,
            rows: batches
                .saturating_mul(self.row_cap())
                .min(self.checkpoint_limit),
        }
    }
}

/// What a stalled consumer can leave buffered between the reader and itself; see
/// [`StreamOptions::buffer_bound`], which derives it from the options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferBound {
    /// Reader batches handed over and not yet received, including the rest of a batch
    /// the stream is returning row by row.
    pub batches: usize,
    /// Rows: `batches` × the row cap, and never more than `checkpoint_limit`.
    pub rows: usize,
}

impl BufferBound {
    /// The bound in bytes of WAL (pgoutput message bytes, [`Change::wal_bytes`], not
    /// decoded size), given the largest change's: each batch is below
    /// [`MAX_BATCH_WAL_BYTES`] plus one change, and `rows` changes are at most `rows` times
    /// the largest.
    pub fn wal_bytes(&self, largest_change_wal_bytes: usize) -> usize {
        let per_batch = MAX_BATCH_WAL_BYTES - 1 + largest_change_wal_bytes;
        self.batches
            .saturating_mul(per_batch)
            .min(self.rows.saturating_mul(largest_change_wal_bytes))
    }
}

/// One event from the replication transport.
#[derive(Debug, Clone, PartialEq)]
pub enum WalEvent {
    /// A transaction begins (for transports that parse `Begin` themselves).
    Begin(Begin),
    /// The open transaction commits (for transports that parse `Commit` themselves).
    Commit(Commit),
    /// One pgoutput message, starting at WAL position `lsn` (the `XLogData` start).
    Data {
        /// Where the message starts; 0/0 for some schema messages, never acknowledged.
        lsn: Lsn,
        /// The message body.
        data: Bytes,
    },
    /// The server's keepalive: everything before `wal_end` has been sent.
    KeepAlive {
        /// The server's sent position.
        wal_end: Lsn,
    },
    /// A logical decoding message parsed by the transport. Messages are not delivered as
    /// rows; a transactional one (the heartbeat) leaves a row-less transaction, whose
    /// commit is confirmed as a checkpoint.
    Message {
        /// Emitted inside a transaction.
        transactional: bool,
        /// Its LSN.
        lsn: Lsn,
    },
}

/// Groups decoded rows per transaction. Flushes at the commit, or before a row once the
/// batch holds the row cap or has met or passed the byte cap (so a batch ends less than
/// one row past the byte cap): caps are checked before a row is
/// appended, so a transaction landing exactly on the cap still closes with its commit
/// (checking after the append flushed such a transaction before its commit was seen and
/// stamped it with its last row; had another transaction been acknowledged before it, the
/// slot would have been confirmed mid-transaction and a restart would have replayed all of
/// it).
#[derive(Debug)]
pub struct TransactionBatcher {
    row_cap: usize,
    byte_cap: usize,
    rows: Vec<Change>,
    bytes: usize,
}

/// A batch flushed by the [`TransactionBatcher`].
#[derive(Debug)]
pub struct Flush {
    /// The rows, in WAL order (may be empty for a row-less transaction).
    pub changes: Vec<Change>,
    /// The commit's end LSN when the transaction closed in this batch.
    pub commit_end: Option<Lsn>,
}

impl TransactionBatcher {
    /// A batcher with these caps (each at least 1).
    pub fn new(row_cap: usize, byte_cap: usize) -> Self {
        let row_cap = row_cap.max(1);
        TransactionBatcher {
            row_cap,
            byte_cap: byte_cap.max(1),
            rows: Vec::with_capacity(row_cap),
            bytes: 0,
        }
    }

    /// Appends a row; returns the batch flushed before it when a cap was reached: the row
    /// cap, or the byte cap met or passed by the rows already in the batch. A batch
    /// therefore ends less than one row past the byte cap.
    pub fn push(&mut self, change: Change) -> Option<Flush> {
        let flushed = if self.rows.len() >= self.row_cap || self.bytes >= self.byte_cap {
            Some(self.take(None))
        } else {
            None
        };
        self.bytes += change.wal_bytes;
        self.rows.push(change);
        flushed
    }

    /// The transaction committed: everything pending is flushed, stamped with `end_lsn`.
    pub fn commit(&mut self, end_lsn: Lsn) -> Flush {
        self.take(Some(end_lsn))
    }

    /// Whether no row is pending.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    fn take(&mut self, commit_end: Option<Lsn>) -> Flush {
        self.bytes = 0;
        let changes = std::mem::replace(&mut self.rows, Vec::with_capacity(self.row_cap));
        Flush {
            changes,
            commit_end,
        }
    }
}

/// A reader batch on its way to the consumer.
#[derive(Debug)]
struct ReaderBatch {
    /// Tracker sequence number of `changes[0]`; the others follow.
    first_seq: u64,
    changes: Vec<Change>,
}

type Item = Result<ReaderBatch>;

/// The transport-independent reader. Feed it [`WalEvent`]s in stream order with
/// [`StreamReader::handle`]; report [`StreamReader::subscribe_confirmed`] positions to
/// the server.
pub struct StreamReader {
    decoder: ChangeDecoder,
    batcher: TransactionBatcher,
    tracker: Arc<AckTracker>,
    tx: mpsc::Sender<Item>,
    filter: Option<RowFilter>,
    scratch: Vec<Change>,
}

impl fmt::Debug for StreamReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamReader")
            .field("batcher", &self.batcher)
            .finish_non_exhaustive()
    }
}

/// A reader and the consumer's end of its channel.
///
/// # Errors
/// [`Error::Config`] when the options are invalid.
pub fn stream_pair(options: &StreamOptions) -> Result<(StreamReader, CdcStream)> {
    options.validate()?;
    let tracker = AckTracker::new(options.checkpoint_limit);
    let (tx, rx) = mpsc::channel(CHANNEL_DEPTH);
    let shape = if options.batch_transactions {
        Shape::Transaction
    } else if let Some(policy) = options.batching {
        Shape::Policy(policy)
    } else {
        Shape::Row
    };
    let reader = StreamReader {
        decoder: ChangeDecoder::new(),
        batcher: TransactionBatcher::new(options.row_cap(), MAX_BATCH_WAL_BYTES),
        tracker: Arc::clone(&tracker),
        tx,
        filter: options.filter.clone(),
        scratch: Vec::new(),
    };
    let stream = CdcStream {
        rx,
        tracker,
        shape,
        pending: VecDeque::new(),
        failed: None,
        source: None,
    };
    Ok((reader, stream))
}

impl StreamReader {
    /// Handles one event. Waits while `checkpoint_limit` rows are in flight, and while
    /// the channel to the consumer is full.
    ///
    /// # Errors
    /// Decoding errors, and [`Error::Closed`] when the consumer is gone.
    pub async fn handle(&mut self, event: WalEvent) -> Result<()> {
        match event {
            WalEvent::Begin(begin) => self.decoder.begin(begin),
            WalEvent::Commit(commit) => {
                self.decoder.commit(commit)?;
                let flush = self.batcher.commit(commit.end_lsn);
                self.emit(flush).await
            }
            WalEvent::Data { lsn, data } => {
                let mut scratch = std::mem::take(&mut self.scratch);
                let decoded = self.decoder.decode(lsn, &data, &mut scratch);
                let mut result = Ok(());
                for change in scratch.drain(..) {
                    if let Some(flush) = self.batcher.push(change) {
                        result = self.emit(flush).await;
                        if result.is_err() {
                            break;
                        }
                    }
                }
                scratch.clear();
                self.scratch = scratch;
                result?;
                match decoded? {
                    Decoded::Commit(commit) => {
                        let flush = self.batcher.commit(commit.end_lsn);
                        self.emit(flush).await
                    }
                    Decoded::Message {
                        transactional, lsn, ..
                    } => {
                        self.message(transactional, lsn);
                        Ok(())
                    }
                    _ => Ok(()),
                }
            }
            WalEvent::KeepAlive { wal_end } => {
                // Between transactions everything the server sent is handled once what is
                // in flight is, so its sent position is a row-less checkpoint. This is
                // what lets a database whose changes are all outside the publication
                // (Postgres 15 sends no empty transactions) still advance the slot.
                if !self.decoder.in_transaction() && self.batcher.is_empty() {
                    self.tracker.checkpoint(wal_end);
                }
                Ok(())
            }
            WalEvent::Message { transactional, lsn } => {
                self.message(transactional, lsn);
                Ok(())
            }
        }
    }

    fn message(&mut self, transactional: bool, lsn: Lsn) {
        // A transactional message is confirmed with its transaction's commit. A
        // non-transactional one outside a transaction is a checkpoint of its own.
        if !transactional && !self.decoder.in_transaction() && self.batcher.is_empty() {
            self.tracker.checkpoint(lsn);
        }
    }

    async fn emit(&mut self, flush: Flush) -> Result<()> {
        let Flush {
            mut changes,
            commit_end,
        } = flush;
        let position = commit_end.or_else(|| changes.last().map(|c| c.lsn));
        if let Some(filter) = &self.filter {
            changes.retain(|c| filter(c));
        }
        if changes.is_empty() {
            if let Some(position) = position {
                self.tracker.checkpoint(position);
            }
            return Ok(());
        }
        if let (Some(end), Some(last)) = (commit_end, changes.last_mut()) {
            last.ack_lsn = end;
        }
        if !self.tracker.reserve(changes.len()).await {
            return Err(Error::Closed);
        }
        // Tracked before the send: "emitted" means handed to the consumer, and the order
        // of the tracker is the order of the channel.
        let first_seq = self
            .tracker
            .track(changes.iter().map(|c| (c.ack_lsn, c.wal_bytes)));
        self.tx
            .send(Ok(ReaderBatch { first_seq, changes }))
            .await
            .map_err(|_| Error::Closed)
    }

    /// Hands the error that stops the reader to the consumer (if it is still there).
    pub async fn fail(&self, error: Error) {
        let _ = self.tx.send(Err(error)).await;
    }

    /// The confirmed position.
    pub fn confirmed(&self) -> Lsn {
        self.tracker.confirmed()
    }

    /// Wakes when the confirmed position moves; report it to the server.
    pub fn subscribe_confirmed(&self) -> watch::Receiver<Lsn> {
        self.tracker.subscribe()
    }

    /// Whether a transaction is open on the stream.
    pub fn in_transaction(&self) -> bool {
        self.decoder.in_transaction()
    }
}

#[derive(Debug, Clone, Copy)]
enum Shape {
    Row,
    Transaction,
    Policy(BatchingPolicy),
}

/// The task that feeds a [`CdcStream`] (the Postgres source), stopped with the stream.
#[derive(Debug)]
pub(crate) struct SourceTask {
    pub(crate) cancel: CancellationToken,
    pub(crate) task: JoinHandle<Result<()>>,
    pub(crate) stop_timeout: Duration,
    /// Whether the source's replication connection is encrypted.
    pub(crate) security: ConnectionSecurity,
}

/// What the consumer receives: one row by default, a transaction (or the part of one
/// that fit a reader batch) with `batch_transactions`, a policy's batch with `batching`.
#[derive(Debug)]
pub struct CdcMessage {
    changes: Vec<Change>,
    ack: AckToken,
}

impl CdcMessage {
    /// The changes, in WAL order.
    pub fn changes(&self) -> &[Change] {
        &self.changes
    }

    /// The position this message's acknowledgement confirms: the stamp of its last change.
    pub fn ack_lsn(&self) -> Lsn {
        self.ack.lsn()
    }

    /// Acknowledges the message (see [`AckToken::ack`]).
    pub fn ack(self) {
        self.ack.ack();
    }

    /// The changes and the acknowledgement, separately: publish the changes, then ack.
    pub fn into_parts(self) -> (Vec<Change>, AckToken) {
        (self.changes, self.ack)
    }
}

/// The consumer's end: receive [`CdcMessage`]s, acknowledge each once handled.
pub struct CdcStream {
    rx: mpsc::Receiver<Item>,
    tracker: Arc<AckTracker>,
    shape: Shape,
    /// Rows of a reader batch not yet returned, with their sequence numbers.
    pending: VecDeque<(u64, Change)>,
    /// An error received behind rows still to deliver; returned once they are.
    failed: Option<Error>,
    source: Option<SourceTask>,
}

impl fmt::Debug for CdcStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CdcStream")
            .field("shape", &self.shape)
            .field("pending", &self.pending.len())
            .finish_non_exhaustive()
    }
}

impl CdcStream {
    #[cfg(feature = "postgres")]
    pub(crate) fn attach(&mut self, source: SourceTask) {
        self.source = Some(source);
    }

    /// The next message; `Ok(None)` once the reader has stopped without error.
    ///
    /// # Errors
    /// The error that stopped the reader (returned once; then `Ok(None)`).
    pub async fn recv(&mut self) -> Result<Option<CdcMessage>> {
        if self.pending.is_empty()
            && let Some(error) = self.failed.take()
        {
            return Err(error);
        }
        match self.shape {
            Shape::Row => {
                if self.pending.is_empty() && !self.fill().await? {
                    return Ok(None);
                }
                Ok(self.take(1))
            }
            Shape::Transaction => match self.rx.recv().await {
                None => Ok(None),
                Some(Err(e)) => Err(e),
                Some(Ok(batch)) => Ok(Some(self.message(batch.first_seq, batch.changes))),
            },
            Shape::Policy(policy) => {
                if self.pending.is_empty() && !self.fill().await? {
                    return Ok(None);
                }
                let deadline = tokio::time::Instant::now() + policy.max_wait;
                while self.pending.len() < policy.count {
                    match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                        Ok(Some(Ok(batch))) => self.queue(batch),
                        // The error (or the end) is seen by the next call; deliver what we have.
                        Ok(Some(Err(e))) => {
                            self.failed = Some(e);
                            break;
                        }
                        Ok(None) | Err(_) => break,
                    }
                }
                Ok(self.take(policy.count))
            }
        }
    }

    async fn fill(&mut self) -> Result<bool> {
        match self.rx.recv().await {
            None => Ok(false),
            Some(Err(e)) => Err(e),
            Some(Ok(batch)) => {
                self.queue(batch);
                Ok(true)
            }
        }
    }

    fn queue(&mut self, batch: ReaderBatch) {
        self.pending.extend((batch.first_seq..).zip(batch.changes));
    }

    fn take(&mut self, count: usize) -> Option<CdcMessage> {
        let n = count.min(self.pending.len());
        let first = self.pending.front()?.0;
        let changes: Vec<Change> = self.pending.drain(..n).map(|(_, c)| c).collect();
        Some(self.message(first, changes))
    }

    fn message(&self, first: u64, changes: Vec<Change>) -> CdcMessage {
        // Sequence numbers of consecutive rows are contiguous except for row-less
        // checkpoints between batches, which are acknowledged already; a range over them
        // is harmless.
        let lsn = changes.last().map_or(Lsn::ZERO, Change::ack_lsn);
        let end = first + changes.len() as u64;
        CdcMessage {
            ack: AckToken::new(Arc::clone(&self.tracker), first, end, lsn),
            changes,
        }
    }

    /// The confirmed position: every message up to it is acknowledged.
    pub fn confirmed_lsn(&self) -> Lsn {
        self.tracker.confirmed()
    }

    /// Whether the replication connection feeding this stream is encrypted, as decided when
    /// it connected (its `Display` is a short description for start-up logs); `None` for a
    /// stream without a Postgres source ([`stream_pair`]).
    pub fn replication_security(&self) -> Option<&ConnectionSecurity> {
        self.source.as_ref().map(|source| &source.security)
    }

    /// Rows handed to this consumer and not yet confirmed.
    pub fn rows_in_flight(&self) -> usize {
        self.tracker.rows_pending()
    }

    /// WAL bytes ([`Change::wal_bytes`]) of the rows handed to this consumer and not yet
    /// confirmed. Once the consumer has acknowledged everything it received and stopped
    /// receiving, at most [`StreamOptions::buffer_bound`]'s [`BufferBound::wal_bytes`].
    pub fn wal_bytes_in_flight(&self) -> usize {
        self.tracker.wal_bytes_pending()
    }

    /// Stops the source (if any) gracefully: the confirmed position is reported to the
    /// server first (within the source's shutdown timeout), rows not yet acknowledged are
    /// left for the next start to re-read.
    ///
    /// # Errors
    /// The error that had stopped the source, or [`Error::Timeout`].
    pub async fn shutdown(mut self) -> Result<()> {
        self.tracker.close();
        self.rx.close();
        let Some(source) = self.source.take() else {
            return Ok(());
        };
        source.cancel.cancel();
        match tokio::time::timeout(source.stop_timeout, source.task).await {
            Ok(Ok(result)) => result,
            Ok(Err(join)) => Err(Error::Transport(Arc::new(join))),
            Err(_) => Err(Error::Timeout("stopping the replication reader")),
        }
    }
}

impl Drop for CdcStream {
    fn drop(&mut self) {
        self.tracker.close();
        if let Some(source) = &self.source {
            source.cancel.cancel();
        }
    }
}
