//! Observability hooks: what the coalescers report, and a ready counter set.
//!
//! The coalescers call an [`Observer`] at each flush, query and write. Every method
//! has an empty default, so [`NoopObserver`] costs nothing and an exporter implements
//! only what it exports. [`CoalesceMetrics`] is a set of atomic counters with a
//! [`snapshot`](CoalesceMetrics::snapshot) an exporter can turn into Prometheus series.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Why a lookup batch (or one group of it) was sent to the backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FlushReason {
    /// The batch reached `max_batch` distinct keys.
    Count,
    /// `max_wait` passed since the batch's first key.
    Time,
    /// A further group that the split rule cut off a flush; the first group of that
    /// flush carries the flush's own reason.
    Split,
    /// The coalescer was closing and drained what it held.
    Close,
    /// Adaptive mode: no batch query was in flight, or one just completed.
    Adaptive,
}

/// Which backend path answered a lookup query.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum QueryPath {
    /// One batch query (`lookup_many`) for several distinct keys.
    Batch,
    /// A batch, or a split group, of one distinct key sent to `lookup_one` by the worker.
    Single,
    /// A lookup that never entered the worker: coalescing disabled, or a key that cannot batch.
    Direct,
}

/// One group of keys leaving the lookup worker for the backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LookupFlush {
    /// Why it was sent.
    pub reason: FlushReason,
    /// Distinct keys in it (the size of the backend query).
    pub keys: usize,
    /// Callers it answers; more than `keys` when callers asked for the same key.
    pub callers: usize,
    /// Time from the batch's first key to the flush.
    pub waited: Duration,
}

/// One backend query finished on behalf of the lookup coalescer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LookupQuery {
    /// Which backend path ran it.
    pub path: QueryPath,
    /// Keys asked in that query.
    pub keys: usize,
    /// Callers still waiting when the answer came back and answered by it.
    pub callers_answered: usize,
    /// Whether the backend returned an error.
    pub failed: bool,
    /// How long the backend took.
    pub elapsed: Duration,
}

/// One write issued by the write coalescer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteFlush {
    /// Handed-off batches in it.
    pub batches: usize,
    /// Records in it.
    pub records: usize,
    /// Bytes in it, as the writer measures records.
    pub bytes: usize,
    /// Time spent in the `max_wait` window before it (zero when no window opened).
    pub waited: Duration,
    /// Whether a batch that did not fit was carried over to open the next write.
    pub carried_over: bool,
    /// Whether the writer returned an error.
    pub failed: bool,
    /// How long the writer took.
    pub elapsed: Duration,
}

/// Receives the coalescers' events. Called on the worker's task, so keep it cheap.
pub trait Observer: Send + Sync + 'static {
    /// A lookup group left the worker.
    fn lookup_flushed(&self, _flush: &LookupFlush) {}
    /// A lookup query completed (successfully or not).
    fn lookup_query(&self, _query: &LookupQuery) {}
    /// A write completed (successfully or not).
    fn write_done(&self, _write: &WriteFlush) {}
}

/// The default observer: ignores everything.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoopObserver;

impl Observer for NoopObserver {}

/// Upper bounds (inclusive) of the lookup batch-size histogram's buckets; the last
/// bucket holds everything larger. 100 is the largest batch Sheaf's retry path allows and
/// the largest measured, where a key cost ClickHouse ~1 ms of CPU against ~14 ms one by one
/// (docs/benchmarks.md, "lookup", earlier measurements).
pub const BATCH_SIZE_BUCKETS: [usize; 8] = [1, 2, 5, 10, 20, 50, 100, usize::MAX];

/// Atomic counters fed by the coalescers, read with [`snapshot`](Self::snapshot).
///
/// Share one behind an `Arc` and give a clone of that `Arc` to each coalescer as its
/// observer; counters only grow, so an exporter reads them as Prometheus counters.
#[derive(Debug, Default)]
pub struct CoalesceMetrics {
    flush_count: AtomicU64,
    flush_time: AtomicU64,
    flush_split: AtomicU64,
    flush_close: AtomicU64,
    flush_adaptive: AtomicU64,
    batch_size_buckets: [AtomicU64; BATCH_SIZE_BUCKETS.len()],
    lookup_wait_nanos: AtomicU64,
    batch_queries: AtomicU64,
    single_queries: AtomicU64,
    direct_lookups: AtomicU64,
    failed_queries: AtomicU64,
    keys_queried: AtomicU64,
    keys_served: AtomicU64,
    writes: AtomicU64,
    failed_writes: AtomicU64,
    batches_written: AtomicU64,
    records_written: AtomicU64,
    bytes_written: AtomicU64,
    carry_overs: AtomicU64,
    write_wait_nanos: AtomicU64,
}

/// A point-in-time copy of [`CoalesceMetrics`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MetricsSnapshot {
    /// Lookup groups flushed because `max_batch` was reached.
    pub flushes_by_count: u64,
    /// Lookup groups flushed because `max_wait` passed.
    pub flushes_by_time: u64,
    /// Extra lookup groups cut off by the split rule.
    pub flushes_by_split: u64,
    /// Lookup groups flushed while closing.
    pub flushes_by_close: u64,
    /// Lookup groups flushed by the adaptive rule.
    pub flushes_by_adaptive: u64,
    /// Lookup groups per batch-size bucket, see [`BATCH_SIZE_BUCKETS`].
    pub batch_size_buckets: [u64; BATCH_SIZE_BUCKETS.len()],
    /// Total time lookup batches gathered before their flush.
    pub lookup_wait: Duration,
    /// `lookup_many` queries issued.
    pub batch_queries: u64,
    /// `lookup_one` queries issued by the worker for a group of one key.
    pub single_queries: u64,
    /// Lookups that bypassed the worker (disabled, or a key that cannot batch).
    pub direct_lookups: u64,
    /// Worker queries (batch or single) that failed.
    pub failed_queries: u64,
    /// Distinct keys sent to the backend by the worker.
    pub keys_queried: u64,
    /// Callers answered by the worker's queries.
    pub keys_served: u64,
    /// Writes issued.
    pub writes: u64,
    /// Writes that failed.
    pub failed_writes: u64,
    /// Handed-off batches written (or failed) in those writes.
    pub batches_written: u64,
    /// Records in those writes.
    pub records_written: u64,
    /// Bytes in those writes.
    pub bytes_written: u64,
    /// Batches carried over to open the next write.
    pub carry_overs: u64,
    /// Total time spent in `max_wait` windows.
    pub write_wait: Duration,
}

fn add(counter: &AtomicU64, n: usize) {
    counter.fetch_add(u64::try_from(n).unwrap_or(u64::MAX), Ordering::Relaxed);
}

fn add_duration(counter: &AtomicU64, d: Duration) {
    counter.fetch_add(
        u64::try_from(d.as_nanos()).unwrap_or(u64::MAX),
        Ordering::Relaxed,
    );
}

fn read(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

impl CoalesceMetrics {
    /// Fresh counters, all zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Copies every counter. Counters are read one by one, so a snapshot taken while
    /// the coalescers run may be a few events apart between fields.
    pub fn snapshot(&self) -> MetricsSnapshot {
        MetricsSnapshot {
            flushes_by_count: read(&self.flush_count),
            flushes_by_time: read(&self.flush_time),
            flushes_by_split: read(&self.flush_split),
            flushes_by_close: read(&self.flush_close),
            flushes_by_adaptive: read(&self.flush_adaptive),
            batch_size_buckets: std::array::from_fn(|i| read(&self.batch_size_buckets[i])),
            lookup_wait: Duration::from_nanos(read(&self.lookup_wait_nanos)),
            batch_queries: read(&self.batch_queries),
            single_queries: read(&self.single_queries),
            direct_lookups: read(&self.direct_lookups),
            failed_queries: read(&self.failed_queries),
            keys_queried: read(&self.keys_queried),
            keys_served: read(&self.keys_served),
            writes: read(&self.writes),
            failed_writes: read(&self.failed_writes),
            batches_written: read(&self.batches_written),
            records_written: read(&self.records_written),
            bytes_written: read(&self.bytes_written),
            carry_overs: read(&self.carry_overs),
            write_wait: Duration::from_nanos(read(&self.write_wait_nanos)),
        }
    }
}

impl Observer for CoalesceMetrics {
    fn lookup_flushed(&self, flush: &LookupFlush) {
        let counter = match flush.reason {
            FlushReason::Count => &self.flush_count,
            FlushReason::Time => &self.flush_time,
            FlushReason::Split => &self.flush_split,
            FlushReason::Close => &self.flush_close,
            FlushReason::Adaptive => &self.flush_adaptive,
        };
        add(counter, 1);
        let bucket = BATCH_SIZE_BUCKETS
            .iter()
            .position(|&bound| flush.keys <= bound)
            .unwrap_or(BATCH_SIZE_BUCKETS.len() - 1);
        add(&self.batch_size_buckets[bucket], 1);
        add_duration(&self.lookup_wait_nanos, flush.waited);
    }

    fn lookup_query(&self, query: &LookupQuery) {
        match query.path {
            QueryPath::Batch => add(&self.batch_queries, 1),
            QueryPath::Single => add(&self.single_queries, 1),
            QueryPath::Direct => {
                add(&self.direct_lookups, 1);
                return;
            }
        }
        if query.failed {
            add(&self.failed_queries, 1);
        }
        add(&self.keys_queried, query.keys);
        add(&self.keys_served, query.callers_answered);
    }

    fn write_done(&self, write: &WriteFlush) {
        add(&self.writes, 1);
        if write.failed {
            add(&self.failed_writes, 1);
        }
        add(&self.batches_written, write.batches);
        add(&self.records_written, write.records);
        add(&self.bytes_written, write.bytes);
        if write.carried_over {
            add(&self.carry_overs, 1);
        }
        add_duration(&self.write_wait_nanos, write.waited);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_sizes_land_in_their_inclusive_bucket() {
        let metrics = CoalesceMetrics::new();
        for keys in [1, 2, 3, 100, 101] {
            metrics.lookup_flushed(&LookupFlush {
                reason: FlushReason::Count,
                keys,
                callers: keys,
                waited: Duration::from_millis(1),
            });
        }
        let snap = metrics.snapshot();
        assert_eq!(snap.batch_size_buckets, [1, 1, 1, 0, 0, 0, 1, 1]);
        assert_eq!(snap.flushes_by_count, 5);
        assert_eq!(snap.lookup_wait, Duration::from_millis(5));
    }

    #[test]
    fn direct_lookups_are_not_counted_as_worker_queries() {
        let metrics = CoalesceMetrics::new();
        metrics.lookup_query(&LookupQuery {
            path: QueryPath::Direct,
            keys: 1,
            callers_answered: 1,
            failed: false,
            elapsed: Duration::ZERO,
        });
        metrics.lookup_query(&LookupQuery {
            path: QueryPath::Batch,
            keys: 3,
            callers_answered: 4,
            failed: true,
            elapsed: Duration::ZERO,
        });
        let snap = metrics.snapshot();
        assert_eq!(snap.direct_lookups, 1);
        assert_eq!(snap.batch_queries, 1);
        assert_eq!(snap.failed_queries, 1);
        assert_eq!(snap.keys_queried, 3);
        assert_eq!(snap.keys_served, 4);
    }
}
