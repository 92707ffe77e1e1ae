//! The lookup coalescer: many concurrent single-key lookups become few batch queries.
//!
//! Longer than 600 lines because the callers' handle, the worker's flush rules and the query
//! tasks share private types (`Waiter`, `Message`, `Batch`) whose invariants (every waiter
//! answered exactly once, closing answers everything queued) are checked in one place.
//!
//! Why: most of a single-key query's cost in a store such as ClickHouse is fixed per query
//! (planning, opening parts), and a batch pays it once. A time-bounded single lookup cost ~14 ms
//! of ClickHouse CPU against ~1 ms per key in batches of 100, and coalescing a burst of retries
//! cut its lookup queries from 8,416 to 1,286 and ClickHouse's mean CPU from 73 % to 29 % (from
//! 2,302 to 399 queries in Sheaf's own run); see docs/benchmarks.md, "lookup" and "burst".

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinSet;
use tokio::time::{Instant, Sleep};
use tracing::Instrument as _;

use crate::config::{ConfigError, LookupConfig};
use crate::error::LookupError;
use crate::metrics::{FlushReason, LookupFlush, LookupQuery, NoopObserver, Observer, QueryPath};
use crate::split::{NoSplit, SplitRule};

/// A backend that can look keys up one at a time and many at a time.
///
/// Both paths must agree: for every key, `lookup_many` returns in its map exactly what
/// `lookup_one` would return for that key (a key without a value is absent from the
/// map). The coalescer relies on it to give every caller the single path's answer.
pub trait BatchLookup: Send + Sync + 'static {
    /// What is looked up.
    type Key: Clone + Eq + Hash + Send + Sync + 'static;
    /// What a key finds.
    type Value: Clone + Send + Sync + 'static;
    /// Why a query failed. It is shared behind an `Arc` by every caller of a failed batch.
    type Error: std::error::Error + Send + Sync + 'static;

    /// The single-key path: what every lookup did before coalescing.
    fn lookup_one(
        &self,
        key: Self::Key,
    ) -> impl Future<Output = Result<Option<Self::Value>, Self::Error>> + Send;

    /// The batch path: one query for several distinct keys.
    fn lookup_many(
        &self,
        keys: Vec<Self::Key>,
    ) -> impl Future<Output = Result<HashMap<Self::Key, Self::Value>, Self::Error>> + Send;

    /// Whether a key may join a batch. Keys that may not (for example a key without the
    /// time bound the batch query needs) go straight to [`lookup_one`](Self::lookup_one).
    fn batchable(&self, _key: &Self::Key) -> bool {
        true
    }
}

/// A shared backend is a backend.
impl<L: BatchLookup> BatchLookup for Arc<L> {
    type Key = L::Key;
    type Value = L::Value;
    type Error = L::Error;

    fn lookup_one(
        &self,
        key: Self::Key,
    ) -> impl Future<Output = Result<Option<Self::Value>, Self::Error>> + Send {
        L::lookup_one(self, key)
    }

    fn lookup_many(
        &self,
        keys: Vec<Self::Key>,
    ) -> impl Future<Output = Result<HashMap<Self::Key, Self::Value>, Self::Error>> + Send {
        L::lookup_many(self, keys)
    }

    fn batchable(&self, key: &Self::Key) -> bool {
        L::batchable(self, key)
    }
}

type Answer<L> = Result<Option<<L as BatchLookup>::Value>, LookupError<<L as BatchLookup>::Error>>;

/// A caller waiting in a batch: where its answer goes and the span it asked from.
struct Waiter<L: BatchLookup> {
    reply: oneshot::Sender<Answer<L>>,
    span: tracing::Span,
}

enum Message<L: BatchLookup> {
    Lookup { key: L::Key, waiter: Waiter<L> },
    Close,
}

struct Shared<L: BatchLookup> {
    backend: Arc<L>,
    observer: Arc<dyn Observer>,
    config: LookupConfig,
    closed: AtomicBool,
    /// Turns `true` when the worker has answered everything it accepted; a dropped
    /// sender (the worker died) also releases `close()`.
    drained: watch::Receiver<bool>,
}

/// Coalesces concurrent lookups of a [`BatchLookup`] backend into batch queries.
///
/// A cloneable handle: clones share one worker task, which gathers keys from a bounded
/// queue and sends them to the backend. Each caller gets its own answer, exactly what
/// the backend's single path would return for its key, or an error of its own.
///
/// # When a batch is flushed
///
/// Keys gather into a batch. The worker takes a key, then everything already queued
/// behind it (up to `max_batch` distinct keys), and flushes the batch when the first
/// of these holds:
///
/// - it has `max_batch` distinct keys ([`FlushReason::Count`]);
/// - `max_wait` has passed since the batch's first key ([`FlushReason::Time`]);
///   with `max_wait = 0` that is as soon as the queue has been emptied;
/// - adaptive mode only ([`FlushReason::Adaptive`]): no batch query is in flight
///   when keys arrive, so the first keys of a quiet period are sent at once with no
///   added wait; or a batch query completes while keys are gathered, so a batch is
///   sent as soon as the store has finished the previous one (as group commit does).
///   While a query is in flight and neither happens, keys keep gathering, bounded by
///   `max_batch` and `max_wait` as in fixed mode. With `gather_under_load`, a completed
///   query flushes nothing, and keys go at once only after a quiet spell (no query in
///   flight, none finished within `max_wait`): under load the batches are the fixed
///   mode's, alone a key pays no wait;
/// - the coalescer is closing ([`FlushReason::Close`]).
///
/// A flush first drops callers that have gone away (a key nobody waits for any more is
/// not queried), then runs the split rule; each group it returns is one query:
/// `lookup_one` for a group of one distinct key, `lookup_many` otherwise
/// ([`FlushReason::Split`] marks every group after the first). Queries run on their own
/// tasks, at most `max_in_flight` at once, so the next batch gathers while they run; a
/// flush that finds them all busy waits for one to finish, and meanwhile the queue
/// fills and pushes back on callers.
///
/// With `max_batch = 0` there is no worker at all: every lookup calls `lookup_one`
/// directly. Keys the backend calls not [`batchable`](BatchLookup::batchable) do the
/// same whatever the configuration.
pub struct LookupCoalescer<L: BatchLookup> {
    shared: Arc<Shared<L>>,
    /// `None` when coalescing is disabled.
    queue: Option<mpsc::Sender<Message<L>>>,
}

impl<L: BatchLookup> Clone for LookupCoalescer<L> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
            queue: self.queue.clone(),
        }
    }
}

impl<L: BatchLookup> std::fmt::Debug for LookupCoalescer<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LookupCoalescer")
            .field("config", &self.shared.config)
            .field("closed", &self.shared.closed.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// Builds a [`LookupCoalescer`] with a split rule and an observer.
pub struct LookupCoalescerBuilder<L: BatchLookup> {
    backend: L,
    config: LookupConfig,
    split: Box<dyn SplitRule<L::Key>>,
    observer: Arc<dyn Observer>,
}

impl<L: BatchLookup> std::fmt::Debug for LookupCoalescerBuilder<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LookupCoalescerBuilder")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<L: BatchLookup> LookupCoalescerBuilder<L> {
    /// The rule that cuts each flush into groups (default: [`NoSplit`]).
    pub fn split(mut self, rule: impl SplitRule<L::Key>) -> Self {
        self.split = Box::new(rule);
        self
    }

    /// Where flushes and queries are reported (default: [`NoopObserver`]).
    pub fn observer(mut self, observer: Arc<dyn Observer>) -> Self {
        self.observer = observer;
        self
    }

    /// Validates the configuration and starts the worker task (none when disabled).
    /// Must be called inside a Tokio runtime when coalescing is enabled.
    pub fn build(self) -> Result<LookupCoalescer<L>, ConfigError> {
        self.config.validate()?;
        let backend = Arc::new(self.backend);
        if !self.config.is_enabled() {
            // No worker will ever hold the sender, so `close()` finds it drained at once.
            let (_, drained) = watch::channel(true);
            return Ok(LookupCoalescer {
                shared: Arc::new(Shared {
                    backend,
                    observer: self.observer,
                    config: self.config,
                    closed: AtomicBool::new(false),
                    drained,
                }),
                queue: None,
            });
        }
        let runtime =
            tokio::runtime::Handle::try_current().map_err(|_| ConfigError::NoRuntime {
                what: "LookupCoalescer",
            })?;
        let (queue, receiver) = mpsc::channel(self.config.queue_depth);
        let (drained_tx, drained) = watch::channel(false);
        let worker = Worker {
            backend: Arc::clone(&backend),
            observer: Arc::clone(&self.observer),
            config: self.config,
            split: self.split,
            receiver,
            batch: Batch::default(),
            timer: Box::pin(tokio::time::sleep(Duration::ZERO)),
            in_flight: JoinSet::new(),
            last_done: None,
            closing: false,
            drained: drained_tx,
        };
        runtime.spawn(worker.run());
        Ok(LookupCoalescer {
            shared: Arc::new(Shared {
                backend,
                observer: self.observer,
                config: self.config,
                closed: AtomicBool::new(false),
                drained,
            }),
            queue: Some(queue),
        })
    }
}

impl<L: BatchLookup> LookupCoalescer<L> {
    /// A coalescer with no split rule and no observer. See [`builder`](Self::builder).
    pub fn new(backend: L, config: LookupConfig) -> Result<Self, ConfigError> {
        Self::builder(backend, config).build()
    }

    /// Starts building a coalescer over `backend`.
    pub fn builder(backend: L, config: LookupConfig) -> LookupCoalescerBuilder<L> {
        LookupCoalescerBuilder {
            backend,
            config,
            split: Box::new(NoSplit),
            observer: Arc::new(NoopObserver),
        }
    }

    /// The configuration it runs with.
    pub fn config(&self) -> &LookupConfig {
        &self.shared.config
    }

    /// The backend it queries.
    pub fn backend(&self) -> &L {
        &self.shared.backend
    }

    /// Looks `key` up, through a batch when it can.
    ///
    /// Dropping the returned future withdraws the caller: its key is left out of the
    /// batch if nobody else asked for it, and an answer that arrives later is discarded.
    pub async fn lookup(&self, key: L::Key) -> Answer<L> {
        if self.shared.closed.load(Ordering::Acquire) {
            return Err(LookupError::Closed);
        }
        let queue = match &self.queue {
            Some(queue) if self.shared.backend.batchable(&key) => queue,
            _ => return self.lookup_direct(key).await,
        };
        let (reply, answer) = oneshot::channel();
        let waiter = Waiter {
            reply,
            span: tracing::Span::current(),
        };
        if queue.send(Message::Lookup { key, waiter }).await.is_err() {
            return Err(self.refusal());
        }
        // The worker always answers what it accepted, even while closing, so a dropped
        // reply means the worker or the query task died.
        answer.await.unwrap_or(Err(LookupError::WorkerGone))
    }

    /// Stops accepting lookups and waits until every key already accepted is answered.
    ///
    /// Lookups started after this call (from any clone) fail with
    /// [`LookupError::Closed`]. Calling it again, or from several clones, is harmless.
    pub async fn close(&self) {
        self.shared.closed.store(true, Ordering::Release);
        if let Some(queue) = &self.queue {
            // A send error means the worker already stopped taking messages, which is
            // what this message asks for.
            let _ = queue.send(Message::Close).await;
        }
        let mut drained = self.shared.drained.clone();
        // An error means the worker is gone, so there is nothing left to wait for.
        let _ = drained.wait_for(|done| *done).await;
    }

    /// Whether [`close`](Self::close) has been called.
    pub fn is_closed(&self) -> bool {
        self.shared.closed.load(Ordering::Acquire)
    }

    async fn lookup_direct(&self, key: L::Key) -> Answer<L> {
        let started = Instant::now();
        let result = self.shared.backend.lookup_one(key).await;
        self.shared.observer.lookup_query(&LookupQuery {
            path: QueryPath::Direct,
            keys: 1,
            callers_answered: 1,
            failed: result.is_err(),
            elapsed: started.elapsed(),
        });
        result.map_err(|err| LookupError::Backend(Arc::new(err)))
    }

    fn refusal(&self) -> LookupError<L::Error> {
        if self.shared.closed.load(Ordering::Acquire) {
            LookupError::Closed
        } else {
            LookupError::WorkerGone
        }
    }
}

/// The keys gathered since the last flush and who waits for each.
struct Batch<L: BatchLookup> {
    /// Distinct keys in arrival order, so queries are deterministic for tests and traces.
    order: Vec<L::Key>,
    waiters: HashMap<L::Key, Vec<Waiter<L>>>,
    callers: usize,
    first_key_at: Option<Instant>,
}

impl<L: BatchLookup> Default for Batch<L> {
    fn default() -> Self {
        Self {
            order: Vec::new(),
            waiters: HashMap::new(),
            callers: 0,
            first_key_at: None,
        }
    }
}

impl<L: BatchLookup> Batch<L> {
    fn distinct_keys(&self) -> usize {
        self.order.len()
    }

    fn is_empty(&self) -> bool {
        self.callers == 0
    }
}

/// Keys of one backend query with their waiters, in the order the query lists them.
type Group<L> = Vec<(<L as BatchLookup>::Key, Vec<Waiter<L>>)>;

enum Event<L: BatchLookup> {
    QueryDone,
    Deadline,
    Received(Option<Message<L>>),
}

struct Worker<L: BatchLookup> {
    backend: Arc<L>,
    observer: Arc<dyn Observer>,
    config: LookupConfig,
    split: Box<dyn SplitRule<L::Key>>,
    receiver: mpsc::Receiver<Message<L>>,
    batch: Batch<L>,
    /// Reset to the batch's deadline when its first key arrives; armed only while the
    /// batch holds keys. One timer is reused so a batch costs no timer allocation.
    timer: Pin<Box<Sleep>>,
    in_flight: JoinSet<()>,
    /// When the last batch query finished, for `gather_under_load`'s quiet spell.
    last_done: Option<Instant>,
    closing: bool,
    drained: watch::Sender<bool>,
}

impl<L: BatchLookup> Worker<L> {
    /// No batch query finished within `max_wait`: the store is idle, not between two queries.
    fn quiet(&self) -> bool {
        self.last_done
            .is_none_or(|done| done.elapsed() >= self.config.max_wait)
    }

    async fn run(mut self) {
        while !self.closing {
            let deadline_armed = !self.batch.is_empty();
            let event = tokio::select! {
                biased;
                Some(_) = self.in_flight.join_next(), if !self.in_flight.is_empty() => Event::QueryDone,
                () = &mut self.timer, if deadline_armed => Event::Deadline,
                message = self.receiver.recv() => Event::Received(message),
            };
            match event {
                Event::QueryDone => {
                    // A query task that panicked has dropped its waiters' replies, so
                    // its callers already see `WorkerGone`; the worker carries on.
                    self.last_done = Some(Instant::now());
                    if self.config.adaptive
                        && !self.config.gather_under_load
                        && !self.batch.is_empty()
                    {
                        self.flush(FlushReason::Adaptive).await;
                    }
                }
                Event::Deadline => self.flush(FlushReason::Time).await,
                Event::Received(message) => {
                    self.accept(message);
                    while !self.closing && self.batch.distinct_keys() < self.config.max_batch {
                        match self.receiver.try_recv() {
                            Ok(message) => self.accept(Some(message)),
                            Err(_) => break,
                        }
                    }
                    if self.batch.distinct_keys() >= self.config.max_batch {
                        self.flush(FlushReason::Count).await;
                    } else if self.config.adaptive
                        && self.in_flight.is_empty()
                        && !self.batch.is_empty()
                        && (!self.config.gather_under_load || self.quiet())
                    {
                        self.flush(FlushReason::Adaptive).await;
                    } else if self.config.max_wait.is_zero() && !self.batch.is_empty() {
                        self.flush(FlushReason::Time).await;
                    }
                }
            }
        }
        // Closing: refuse new messages, answer everything already queued, and wait for
        // the queries in flight so `close()` returns only when every caller has its answer.
        self.receiver.close();
        while let Some(message) = self.receiver.recv().await {
            self.accept(Some(message));
            if self.batch.distinct_keys() >= self.config.max_batch {
                self.flush(FlushReason::Close).await;
            }
        }
        if !self.batch.is_empty() {
            self.flush(FlushReason::Close).await;
        }
        while self.in_flight.join_next().await.is_some() {}
        // Nobody may be waiting on `close()`; that is fine.
        let _ = self.drained.send(true);
    }

    fn accept(&mut self, message: Option<Message<L>>) {
        match message {
            Some(Message::Lookup { key, waiter }) => {
                if self.batch.is_empty() {
                    let now = Instant::now();
                    self.batch.first_key_at = Some(now);
                    self.timer.as_mut().reset(now + self.config.max_wait);
                }
                self.batch.callers += 1;
                match self.batch.waiters.entry(key) {
                    Entry::Occupied(mut entry) => entry.get_mut().push(waiter),
                    Entry::Vacant(entry) => {
                        self.batch.order.push(entry.key().clone());
                        entry.insert(vec![waiter]);
                    }
                }
            }
            // Every handle is gone or `close()` was called: drain and stop.
            Some(Message::Close) | None => self.closing = true,
        }
    }

    async fn flush(&mut self, reason: FlushReason) {
        let Batch {
            order,
            mut waiters,
            first_key_at,
            ..
        } = std::mem::take(&mut self.batch);
        let waited = first_key_at.map_or(Duration::ZERO, |at| at.elapsed());
        // Callers that dropped their futures leave now; a key with no caller left is
        // not worth a place in the query.
        let mut keys = Vec::with_capacity(order.len());
        for key in order {
            let live = waiters.get_mut(&key).map_or(0, |list| {
                list.retain(|waiter| !waiter.reply.is_closed());
                list.len()
            });
            if live == 0 {
                waiters.remove(&key);
            } else {
                keys.push(key);
            }
        }
        if keys.is_empty() {
            return;
        }
        let mut groups: Vec<Group<L>> = self
            .split
            .split(keys)
            .into_iter()
            .map(|group| {
                group
                    .into_iter()
                    .filter_map(|key| waiters.remove_entry(&key))
                    .collect::<Group<L>>()
            })
            .filter(|group| !group.is_empty())
            .collect();
        // A split rule that lost keys must not lose callers: what it left out is one
        // more group.
        if !waiters.is_empty() {
            groups.push(waiters.into_iter().collect());
        }
        for (index, group) in groups.into_iter().enumerate() {
            let reason = if index == 0 {
                reason
            } else {
                FlushReason::Split
            };
            self.observer.lookup_flushed(&LookupFlush {
                reason,
                keys: group.len(),
                callers: group.iter().map(|(_, list)| list.len()).sum(),
                waited,
            });
            while self.in_flight.len() >= self.config.max_in_flight {
                // Waiting here stops the worker from taking messages, so the bounded
                // queue pushes back on callers instead of batches piling up.
                self.in_flight.join_next().await;
            }
            let query = run_query(Arc::clone(&self.backend), Arc::clone(&self.observer), group);
            self.in_flight.spawn(query);
        }
    }
}

/// Runs one backend query and answers its callers.
async fn run_query<L: BatchLookup>(backend: Arc<L>, observer: Arc<dyn Observer>, group: Group<L>) {
    let span = tracing::debug_span!("coalesced_lookup", keys = group.len());
    for (_, waiters) in &group {
        for waiter in waiters {
            span.follows_from(&waiter.span);
            waiter.span.follows_from(&span);
        }
    }
    let started = Instant::now();
    let keys = group.len();
    let (path, failed, answered) = match <[_; 1]>::try_from(group) {
        // A group of one distinct key takes the single path: the batch query's extra
        // shape buys nothing for one key, and the single path is what the caller would
        // have run without the coalescer.
        Ok([(key, waiters)]) => {
            let result = backend
                .lookup_one(key)
                .instrument(span)
                .await
                .map_err(|err| LookupError::Backend(Arc::new(err)));
            let failed = result.is_err();
            (QueryPath::Single, failed, answer_all(waiters, &result))
        }
        Err(group) => {
            let query_keys = group.iter().map(|(key, _)| key.clone()).collect();
            match backend.lookup_many(query_keys).instrument(span).await {
                Ok(mut found) => {
                    let mut answered = 0;
                    for (key, waiters) in group {
                        answered += answer_all(waiters, &Ok(found.remove(&key)));
                    }
                    (QueryPath::Batch, false, answered)
                }
                Err(err) => {
                    let result = Err(LookupError::Backend(Arc::new(err)));
                    let answered = group
                        .into_iter()
                        .map(|(_, waiters)| answer_all(waiters, &result))
                        .sum();
                    (QueryPath::Batch, true, answered)
                }
            }
        }
    };
    observer.lookup_query(&LookupQuery {
        path,
        keys,
        callers_answered: answered,
        failed,
        elapsed: started.elapsed(),
    });
}

/// Sends `result` to every waiter still listening; returns how many received it.
fn answer_all<L: BatchLookup>(waiters: Vec<Waiter<L>>, result: &Answer<L>) -> usize {
    waiters
        .into_iter()
        .filter(|waiter| !waiter.reply.is_closed())
        .map(|waiter| waiter.reply.send(result.clone()))
        .filter(Result::is_ok)
        .count()
}
