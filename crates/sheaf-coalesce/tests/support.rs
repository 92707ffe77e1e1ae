//! Fakes shared by the tests: a lookup backend and a writer that record every call
//! and can be told to fail, be slow, or panic.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use sheaf_coalesce::{BatchLookup, BatchWriter, LookupCoalescer, LookupConfig, LookupError};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// A key shaped like the retry path's: an id, an attempt time in minutes, and whether
/// it carries that time at all (without one it cannot batch).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    pub id: u32,
    pub minute: u64,
    pub batchable: bool,
}

impl Key {
    pub fn new(id: u32) -> Self {
        Self::at(id, 0)
    }

    pub fn at(id: u32, minute: u64) -> Self {
        Self {
            id,
            minute,
            batchable: true,
        }
    }

    pub fn unbatchable(id: u32) -> Self {
        Self {
            id,
            minute: 0,
            batchable: false,
        }
    }

    pub fn attempt_time(&self) -> Duration {
        Duration::from_secs(self.minute * 60)
    }
}

/// What the single path returns for a key: ids divisible by 4 have no value, so every
/// test mixes found and missing keys.
pub fn expected(key: &Key) -> Option<String> {
    (!key.id.is_multiple_of(4)).then(|| format!("value-{}@{}", key.id, key.minute))
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Call {
    One(Key),
    Many(Vec<Key>),
}

#[derive(Debug, thiserror::Error)]
#[error("fake backend is down")]
pub struct FakeError;

pub type Answer = Result<Option<String>, LookupError<FakeError>>;

/// A lookup backend whose answers follow [`expected`] and which records each call
/// with the (paused) time it was made, relative to its creation.
#[derive(Debug)]
pub struct FakeLookup {
    created: Instant,
    calls: Mutex<Vec<(Duration, Call)>>,
    fail: AtomicBool,
    panic: AtomicBool,
    delay: Mutex<Duration>,
}

impl FakeLookup {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            created: Instant::now(),
            calls: Mutex::new(Vec::new()),
            fail: AtomicBool::new(false),
            panic: AtomicBool::new(false),
            delay: Mutex::new(Duration::ZERO),
        })
    }

    pub fn with_delay(delay: Duration) -> Arc<Self> {
        let backend = Self::new();
        *lock(&backend.delay) = delay;
        backend
    }

    pub fn set_failing(&self, fail: bool) {
        self.fail.store(fail, Ordering::SeqCst);
    }

    pub fn set_panicking(&self, panic: bool) {
        self.panic.store(panic, Ordering::SeqCst);
    }

    pub fn calls(&self) -> Vec<Call> {
        lock(&self.calls)
            .iter()
            .map(|(_, call)| call.clone())
            .collect()
    }

    pub fn timed_calls(&self) -> Vec<(Duration, Call)> {
        lock(&self.calls).clone()
    }

    /// Calls sorted, for flushes whose groups run concurrently in no fixed order.
    pub fn sorted_calls(&self) -> Vec<Call> {
        let mut calls = self.calls();
        calls.sort();
        calls
    }

    pub fn many_calls(&self) -> usize {
        self.calls()
            .iter()
            .filter(|c| matches!(c, Call::Many(_)))
            .count()
    }

    fn record(&self, call: Call) {
        lock(&self.calls).push((self.created.elapsed(), call));
    }

    async fn behave(&self) -> Result<(), FakeError> {
        let delay = *lock(&self.delay);
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        assert!(
            !self.panic.load(Ordering::SeqCst),
            "fake backend panics as told"
        );
        if self.fail.load(Ordering::SeqCst) {
            return Err(FakeError);
        }
        Ok(())
    }
}

impl BatchLookup for FakeLookup {
    type Key = Key;
    type Value = String;
    type Error = FakeError;

    async fn lookup_one(&self, key: Key) -> Result<Option<String>, FakeError> {
        self.record(Call::One(key.clone()));
        self.behave().await?;
        Ok(expected(&key))
    }

    async fn lookup_many(&self, keys: Vec<Key>) -> Result<HashMap<Key, String>, FakeError> {
        self.record(Call::Many(keys.clone()));
        self.behave().await?;
        Ok(keys
            .into_iter()
            .filter_map(|key| expected(&key).map(|value| (key, value)))
            .collect())
    }

    fn batchable(&self, key: &Key) -> bool {
        key.batchable
    }
}

pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A test that panicked while holding the lock has already failed; its data is
    // still fine to read for the report.
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A fixed-mode configuration.
pub fn fixed(max_batch: usize, max_wait: Duration) -> LookupConfig {
    LookupConfig {
        max_batch,
        max_wait,
        adaptive: false,
        gather_under_load: false,
        max_in_flight: 4,
        queue_depth: 64,
    }
}

/// An adaptive-mode configuration.
pub fn adaptive(max_batch: usize, max_wait: Duration) -> LookupConfig {
    LookupConfig {
        adaptive: true,
        ..fixed(max_batch, max_wait)
    }
}

/// An adaptive configuration that gathers like the fixed mode under load.
pub fn adaptive_under_load(max_batch: usize, max_wait: Duration) -> LookupConfig {
    LookupConfig {
        gather_under_load: true,
        ..adaptive(max_batch, max_wait)
    }
}

pub type Coalescer = LookupCoalescer<Arc<FakeLookup>>;

/// Starts a lookup on its own task, as a concurrent caller would.
pub fn spawn_lookup(coalescer: &Coalescer, key: Key) -> JoinHandle<Answer> {
    let coalescer = coalescer.clone();
    tokio::spawn(async move { coalescer.lookup(key).await })
}

/// Lets every ready task run without moving the paused clock.
pub async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

/// Lets the callers spawned so far arrive, moves the paused clock, and lets the tasks
/// it woke run.
pub async fn advance(by: Duration) {
    settle().await;
    tokio::time::advance(by).await;
    settle().await;
}

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Awaits a task that must have finished by now (it is never left to the clock).
pub async fn finished<T>(handle: JoinHandle<T>) -> T {
    assert!(handle.is_finished(), "the task should have finished by now");
    match handle.await {
        Ok(value) => value,
        Err(err) => panic!("task failed: {err}"),
    }
}

/// A record with an id, a size in bytes and whether it makes its write fail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub id: u32,
    pub bytes: usize,
    pub poison: bool,
}

pub fn rec(id: u32) -> Record {
    Record {
        id,
        bytes: 10,
        poison: false,
    }
}

pub fn sized(id: u32, bytes: usize) -> Record {
    Record {
        id,
        bytes,
        poison: false,
    }
}

pub fn poison(id: u32) -> Record {
    Record {
        id,
        bytes: 10,
        poison: true,
    }
}

/// A writer that records each write (its time and record ids), can be slow, fails any
/// write that holds a poison record, and can be told to panic.
#[derive(Debug)]
pub struct FakeWriter {
    created: Instant,
    writes: Mutex<Vec<(Duration, Vec<u32>)>>,
    delay: Duration,
    panic: AtomicBool,
}

impl FakeWriter {
    pub fn new() -> Arc<Self> {
        Self::with_delay(Duration::ZERO)
    }

    pub fn with_delay(delay: Duration) -> Arc<Self> {
        Arc::new(Self {
            created: Instant::now(),
            writes: Mutex::new(Vec::new()),
            delay,
            panic: AtomicBool::new(false),
        })
    }

    pub fn set_panicking(&self, panic: bool) {
        self.panic.store(panic, Ordering::SeqCst);
    }

    pub fn writes(&self) -> Vec<Vec<u32>> {
        lock(&self.writes)
            .iter()
            .map(|(_, ids)| ids.clone())
            .collect()
    }

    pub fn timed_writes(&self) -> Vec<(Duration, Vec<u32>)> {
        lock(&self.writes).clone()
    }
}

impl BatchWriter for FakeWriter {
    type Record = Record;
    type Error = FakeError;

    fn record_bytes(&self, record: &Record) -> usize {
        record.bytes
    }

    async fn write(&self, records: Vec<Record>) -> Result<(), FakeError> {
        let ids = records.iter().map(|r| r.id).collect();
        lock(&self.writes).push((self.created.elapsed(), ids));
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        assert!(
            !self.panic.load(Ordering::SeqCst),
            "fake writer panics as told"
        );
        if records.iter().any(|r| r.poison) {
            return Err(FakeError);
        }
        Ok(())
    }
}
