//! What the coalescers themselves cost, against backends that do no work.
//!
//! `lookup_overhead`: N concurrent callers each look up `LOOKUPS_PER_CALLER` distinct
//! keys, either by calling a no-op backend directly or through a `LookupCoalescer` over
//! the same backend. Throughput is in keys, so criterion's per-element time is the time
//! per key and the difference between `direct` and a coalesced line is the overhead
//! per key. The target is under 1 µs per key at 64 callers on the 2-core machine.
//!
//! - `fixed`: `max_batch` equals the number of callers, so every batch closes by count
//!   as soon as each caller has a key in it; the 50 ms wait never runs out. This is the
//!   worker's own cost, with none of the wait a fixed batch adds at low load by design.
//! - `adaptive`: `max_batch = 100`, the service's limit; batches form only while a query
//!   is in flight.
//!
//! `lone_lookup_at_idle`: one lookup at a time, each after a quiet spell longer than the
//! batch wait, against a backend whose query takes 2 ms: what a single retry lookup costs on
//! an idle service with coalescing off, fixed (50 keys / 50 ms) and adaptive gathering under
//! load (the service's `SHEAF_RETRY_LOOKUP_ADAPTIVE=true`). Only the lookups are timed, not the
//! quiet spells between them.
//!
//! `write_throughput`: 8 writers hand off batches to a `WriteCoalescer` over a no-op
//! writer; throughput is in records.
//!
//! Both run on a multi-thread Tokio runtime with 2 workers, like the service here.

use std::collections::HashMap;
use std::convert::Infallible;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use sheaf_coalesce::{
    BatchLookup, BatchWriter, LookupCoalescer, LookupConfig, WriteCoalescer, WriteConfig,
};
use tokio::runtime::Runtime;

const LOOKUPS_PER_CALLER: u64 = 64;
const CALLERS: [u64; 3] = [1, 8, 64];

/// A backend that answers every key with itself, at once.
#[derive(Debug)]
struct NoopLookup;

impl BatchLookup for NoopLookup {
    type Key = u64;
    type Value = u64;
    type Error = Infallible;

    async fn lookup_one(&self, key: u64) -> Result<Option<u64>, Infallible> {
        Ok(Some(key))
    }

    async fn lookup_many(&self, keys: Vec<u64>) -> Result<HashMap<u64, u64>, Infallible> {
        Ok(keys.into_iter().map(|key| (key, key)).collect())
    }
}

/// A backend whose every query takes `QUERY_TIME`, like a store's round trip.
#[derive(Debug)]
struct SlowLookup;

const QUERY_TIME: Duration = Duration::from_millis(2);

impl BatchLookup for SlowLookup {
    type Key = u64;
    type Value = u64;
    type Error = Infallible;

    async fn lookup_one(&self, key: u64) -> Result<Option<u64>, Infallible> {
        tokio::time::sleep(QUERY_TIME).await;
        Ok(Some(key))
    }

    async fn lookup_many(&self, keys: Vec<u64>) -> Result<HashMap<u64, u64>, Infallible> {
        tokio::time::sleep(QUERY_TIME).await;
        Ok(keys.into_iter().map(|key| (key, key)).collect())
    }
}

/// A writer that accepts every write at once.
#[derive(Debug)]
struct NoopWriter;

impl BatchWriter for NoopWriter {
    type Record = u64;
    type Error = Infallible;

    fn record_bytes(&self, _record: &u64) -> usize {
        8
    }

    async fn write(&self, records: Vec<u64>) -> Result<(), Infallible> {
        black_box(records);
        Ok(())
    }
}

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .expect("the benchmark runtime builds")
}

/// Runs `callers` tasks that each look up their own `LOOKUPS_PER_CALLER` keys with
/// `lookup`, and waits for all of them.
async fn run_callers<F, Fut>(callers: u64, lookup: F)
where
    F: Fn(u64) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Option<u64>> + Send,
{
    let tasks: Vec<_> = (0..callers)
        .map(|caller| {
            let lookup = lookup.clone();
            tokio::spawn(async move {
                for i in 0..LOOKUPS_PER_CALLER {
                    let key = caller * LOOKUPS_PER_CALLER + i;
                    assert_eq!(lookup(key).await, Some(key));
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("a caller task never panics");
    }
}

fn lookup_overhead(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("lookup_overhead");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for callers in CALLERS {
        group.throughput(Throughput::Elements(callers * LOOKUPS_PER_CALLER));

        let backend = Arc::new(NoopLookup);
        group.bench_with_input(BenchmarkId::new("direct", callers), &callers, |b, &n| {
            b.to_async(&rt).iter(|| {
                let backend = Arc::clone(&backend);
                run_callers(n, move |key| {
                    let backend = Arc::clone(&backend);
                    async move { backend.lookup_one(key).await.ok().flatten() }
                })
            });
        });

        let configs = [
            (
                "fixed",
                LookupConfig {
                    max_batch: usize::try_from(callers).expect("small"),
                    max_wait: Duration::from_millis(50),
                    adaptive: false,
                    ..LookupConfig::default()
                },
            ),
            (
                "adaptive",
                LookupConfig {
                    max_batch: 100,
                    max_wait: Duration::from_millis(50),
                    adaptive: true,
                    ..LookupConfig::default()
                },
            ),
        ];
        for (name, config) in configs {
            let coalescer = {
                let _runtime = rt.enter();
                LookupCoalescer::new(NoopLookup, config).expect("valid config")
            };
            group.bench_with_input(BenchmarkId::new(name, callers), &callers, |b, &n| {
                b.to_async(&rt).iter(|| {
                    let coalescer = coalescer.clone();
                    run_callers(n, move |key| {
                        let coalescer = coalescer.clone();
                        async move { coalescer.lookup(key).await.ok().flatten() }
                    })
                });
            });
            rt.block_on(coalescer.close());
        }
    }
    group.finish();
}

fn lone_lookup_at_idle(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("lone_lookup_at_idle");
    // Few iterations: each is preceded by a 60 ms quiet spell that is not timed.
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(100))
        .measurement_time(Duration::from_millis(300));
    let wait = Duration::from_millis(50);
    let configs = [
        ("off", LookupConfig::disabled()),
        (
            "fixed",
            LookupConfig {
                max_batch: 50,
                max_wait: wait,
                ..LookupConfig::default()
            },
        ),
        (
            "adaptive",
            LookupConfig {
                max_batch: 50,
                max_wait: wait,
                adaptive: true,
                gather_under_load: true,
                ..LookupConfig::default()
            },
        ),
    ];
    for (name, config) in configs {
        let coalescer = {
            let _runtime = rt.enter();
            LookupCoalescer::new(SlowLookup, config).expect("valid config")
        };
        group.bench_function(name, |b| {
            b.to_async(&rt).iter_custom(|iters| {
                let coalescer = coalescer.clone();
                async move {
                    let mut timed = Duration::ZERO;
                    for key in 0..iters {
                        tokio::time::sleep(wait + Duration::from_millis(10)).await;
                        let started = std::time::Instant::now();
                        assert_eq!(coalescer.lookup(key).await.ok().flatten(), Some(key));
                        timed += started.elapsed();
                    }
                    timed
                }
            });
        });
        rt.block_on(coalescer.close());
    }
    group.finish();
}

const WRITERS: u64 = 8;
const HAND_OFFS_PER_WRITER: u64 = 64;

fn write_throughput(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("write_throughput");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    let coalescer = {
        let _runtime = rt.enter();
        WriteCoalescer::new(NoopWriter, WriteConfig::default()).expect("valid config")
    };
    for rows_per_batch in [1u64, 100] {
        group.throughput(Throughput::Elements(
            WRITERS * HAND_OFFS_PER_WRITER * rows_per_batch,
        ));
        group.bench_with_input(
            BenchmarkId::new("rows_per_batch", rows_per_batch),
            &rows_per_batch,
            |b, &rows| {
                b.to_async(&rt).iter(|| {
                    let coalescer = coalescer.clone();
                    async move {
                        let writers: Vec<_> = (0..WRITERS)
                            .map(|_| {
                                let coalescer = coalescer.clone();
                                tokio::spawn(async move {
                                    for _ in 0..HAND_OFFS_PER_WRITER {
                                        let batch = (0..rows).collect();
                                        coalescer.hand_off(batch).await.expect("no-op write");
                                    }
                                })
                            })
                            .collect();
                        for writer in writers {
                            writer.await.expect("a writer task never panics");
                        }
                    }
                });
            },
        );
    }
    rt.block_on(coalescer.close());
    group.finish();
}

criterion_group!(
    benches,
    lookup_overhead,
    lone_lookup_at_idle,
    write_throughput
);
criterion_main!(benches);
