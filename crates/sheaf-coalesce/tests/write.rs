//! WriteCoalescer behaviour, one test per rule it promises (the timed wait for more,
//! carry-over at a bound without splitting or reordering, the byte bound and an oversized
//! batch, outcomes per batch in hand-off order, a failed write failing exactly its batches,
//! closing, empty batches, a dead worker, configuration), on paused time.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sheaf_coalesce::{
    CoalesceMetrics, ConfigError, Observer, WriteCoalescer, WriteConfig, WriteError, WriteFlush,
};
use tokio::time::Instant;

use crate::support::{FakeWriter, Record, advance, finished, lock, ms, poison, rec, settle, sized};

fn config(max_records: usize, max_bytes: usize, max_wait: Duration) -> WriteConfig {
    WriteConfig {
        max_records,
        max_bytes,
        max_wait,
        queue_depth: 64,
    }
}

/// Keeps every write report, to check the time each window took.
#[derive(Debug, Default)]
struct Reports(Mutex<Vec<WriteFlush>>);

impl Observer for Reports {
    fn write_done(&self, write: &WriteFlush) {
        lock(&self.0).push(*write);
    }
}

fn records(ids: std::ops::RangeInclusive<u32>) -> Vec<Record> {
    ids.map(rec).collect()
}

#[tokio::test(start_paused = true)]
async fn a_batch_arriving_during_the_window_joins_the_write() {
    let writer = FakeWriter::new();
    let coalescer =
        WriteCoalescer::new(Arc::clone(&writer), config(100, 1 << 20, ms(400))).unwrap();
    let first = coalescer.enqueue(vec![rec(1)]).await.unwrap();
    let first = tokio::spawn(first);
    settle().await;
    advance(ms(80)).await;
    let second = tokio::spawn(coalescer.enqueue(vec![rec(2)]).await.unwrap());
    advance(ms(319)).await;
    assert!(
        writer.writes().is_empty(),
        "the window is 400 ms from its start"
    );
    advance(ms(1)).await;
    assert_eq!(writer.timed_writes(), vec![(ms(400), vec![1, 2])]);
    finished(first).await.unwrap();
    finished(second).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn with_no_wait_a_later_batch_is_a_second_write() {
    let writer = FakeWriter::new();
    let coalescer =
        WriteCoalescer::new(Arc::clone(&writer), config(100, 1 << 20, Duration::ZERO)).unwrap();
    let first = tokio::spawn(coalescer.enqueue(vec![rec(1)]).await.unwrap());
    settle().await;
    advance(ms(80)).await;
    let second = tokio::spawn(coalescer.enqueue(vec![rec(2)]).await.unwrap());
    settle().await;
    assert_eq!(
        writer.timed_writes(),
        vec![(Duration::ZERO, vec![1]), (ms(80), vec![2])]
    );
    finished(first).await.unwrap();
    finished(second).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn at_the_record_bound_the_next_batch_is_carried_over_and_one_window_is_spent() {
    let writer = FakeWriter::new();
    let reports = Arc::new(Reports::default());
    let coalescer = WriteCoalescer::with_observer(
        Arc::clone(&writer),
        config(3, 1 << 20, Duration::from_secs(4)),
        reports.clone(),
    )
    .unwrap();
    let a = tokio::spawn(coalescer.enqueue(records(1..=2)).await.unwrap());
    settle().await;
    advance(ms(80)).await;
    // B does not fit beside A (2 + 3 > 3); C is queued behind B.
    let b = tokio::spawn(coalescer.enqueue(records(3..=5)).await.unwrap());
    let c = tokio::spawn(coalescer.enqueue(records(6..=6)).await.unwrap());
    settle().await;

    // A's window ended the moment B showed it was full: A is written at 80 ms, not 4 s.
    // B, carried over, opens the next write ahead of C; it is at the bound, so no
    // second window opens for it.
    assert_eq!(
        writer.timed_writes(),
        vec![(ms(80), vec![1, 2]), (ms(80), vec![3, 4, 5])]
    );
    {
        let reports = lock(&reports.0);
        assert_eq!(reports[0].waited, ms(80));
        assert!(reports[0].carried_over);
        assert_eq!(reports[1].waited, Duration::ZERO);
    }
    finished(a).await.unwrap();
    finished(b).await.unwrap();

    // C is alone and under the bounds, so it waits its own window.
    assert!(!c.is_finished());
    advance(Duration::from_secs(4)).await;
    assert_eq!(writer.timed_writes()[2], (ms(4080), vec![6]));
    finished(c).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn completions_are_reported_per_batch_in_hand_off_order() {
    let writer = FakeWriter::with_delay(ms(5));
    let coalescer =
        WriteCoalescer::new(Arc::clone(&writer), config(4, 1 << 20, Duration::ZERO)).unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let sizes = [1u32, 2, 3, 1, 4, 2, 1, 1];
    let mut next_id = 0;
    let mut tasks = Vec::new();
    for (index, size) in sizes.into_iter().enumerate() {
        let batch = (next_id..next_id + size).map(rec).collect();
        next_id += size;
        let completion = coalescer.enqueue(batch).await.unwrap();
        let order = Arc::clone(&order);
        tasks.push(tokio::spawn(async move {
            let outcome = completion.await;
            lock(&order).push(index);
            outcome
        }));
    }
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    assert_eq!(*lock(&order), (0..sizes.len()).collect::<Vec<_>>());
    // Batches are never split or reordered: 1+2 (3 does not fit), 3+1, 4, 2+1+1.
    assert_eq!(
        writer.writes(),
        vec![
            vec![0, 1, 2],
            vec![3, 4, 5, 6],
            vec![7, 8, 9, 10],
            vec![11, 12, 13, 14]
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_failed_write_fails_exactly_the_batches_in_it() {
    let writer = FakeWriter::new();
    let metrics = Arc::new(CoalesceMetrics::new());
    let coalescer = WriteCoalescer::with_observer(
        Arc::clone(&writer),
        config(3, 1 << 20, Duration::ZERO),
        metrics.clone(),
    )
    .unwrap();
    let a = coalescer.enqueue(records(1..=2)).await.unwrap();
    let b = coalescer.enqueue(vec![poison(3)]).await.unwrap();
    let c = coalescer.enqueue(records(4..=5)).await.unwrap();
    let (a, b, c) = tokio::join!(a, b, c);
    assert_eq!(writer.writes(), vec![vec![1, 2, 3], vec![4, 5]]);
    let (a, b) = (a.unwrap_err(), b.unwrap_err());
    for err in [&a, &b] {
        assert_eq!(
            err.to_string(),
            "coalesced write failed: fake backend is down"
        );
        assert!(err.backend().is_some());
    }
    match (&a, &b) {
        (WriteError::Backend(x), WriteError::Backend(y)) => assert!(Arc::ptr_eq(x, y)),
        other => panic!("expected the writer's error twice, got {other:?}"),
    }
    c.unwrap();
    let snapshot = metrics.snapshot();
    assert_eq!(snapshot.writes, 2);
    assert_eq!(snapshot.failed_writes, 1);
    assert_eq!(snapshot.batches_written, 3);
    assert_eq!(snapshot.records_written, 5);
    assert_eq!(snapshot.bytes_written, 50);
}

#[tokio::test(start_paused = true)]
async fn the_byte_bound_closes_a_write_and_an_oversized_batch_is_written_alone() {
    let writer = FakeWriter::new();
    let coalescer = WriteCoalescer::new(
        Arc::clone(&writer),
        config(100, 100, Duration::from_secs(1)),
    )
    .unwrap();
    let batches = [
        vec![sized(1, 40)],
        vec![sized(2, 40)],
        vec![sized(3, 40)],
        vec![sized(4, 40), sized(5, 40), sized(6, 40)],
        vec![sized(7, 40)],
    ];
    let mut tasks = Vec::new();
    for batch in batches {
        tasks.push(tokio::spawn(coalescer.enqueue(batch).await.unwrap()));
    }
    settle().await;
    // 40 + 40 fit, a third 40 would pass 100 bytes; the 120-byte batch goes alone.
    // None of these writes waits: each ended at a bound or with a carried-over batch.
    assert_eq!(
        writer.timed_writes(),
        vec![
            (Duration::ZERO, vec![1, 2]),
            (Duration::ZERO, vec![3]),
            (Duration::ZERO, vec![4, 5, 6]),
        ]
    );
    // The last batch is alone and under both bounds: it waits for company.
    advance(Duration::from_secs(1)).await;
    assert_eq!(writer.timed_writes()[3], (Duration::from_secs(1), vec![7]));
    for task in tasks {
        finished(task).await.unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn close_writes_what_is_queued_without_waiting_then_refuses() {
    let writer = FakeWriter::new();
    let coalescer = WriteCoalescer::new(
        Arc::clone(&writer),
        config(100, 1 << 20, Duration::from_secs(3600)),
    )
    .unwrap();
    let a = tokio::spawn(coalescer.enqueue(vec![rec(1)]).await.unwrap());
    settle().await;
    let started = Instant::now();
    coalescer.close().await;
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert_eq!(writer.writes(), vec![vec![1]]);
    finished(a).await.unwrap();

    let refused = coalescer.hand_off(vec![rec(2)]).await.unwrap_err();
    assert!(matches!(refused, WriteError::Closed));
    assert_eq!(
        refused.to_string(),
        "write coalescer is closed: no new batches are accepted"
    );
    assert!(coalescer.is_closed());
    coalescer.clone().close().await;
    assert_eq!(writer.writes().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn close_drains_a_backlog_in_bounded_writes() {
    let writer = FakeWriter::with_delay(ms(5));
    let coalescer = WriteCoalescer::new(Arc::clone(&writer), config(2, 1 << 20, ms(100))).unwrap();
    let mut tasks = Vec::new();
    for id in 1..=5 {
        tasks.push(tokio::spawn(
            coalescer.enqueue(vec![rec(id)]).await.unwrap(),
        ));
    }
    coalescer.close().await;
    assert_eq!(writer.writes(), vec![vec![1, 2], vec![3, 4], vec![5]]);
    for task in tasks {
        finished(task).await.unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn empty_batches_complete_without_a_write() {
    let writer = FakeWriter::new();
    let coalescer = WriteCoalescer::new(Arc::clone(&writer), WriteConfig::default()).unwrap();
    coalescer.hand_off(Vec::new()).await.unwrap();
    assert!(writer.writes().is_empty());
    coalescer.hand_off(vec![rec(1)]).await.unwrap();
    assert_eq!(writer.writes(), vec![vec![1]]);
}

#[tokio::test(start_paused = true)]
async fn a_worker_that_dies_is_an_error_value_not_a_panic() {
    let writer = FakeWriter::new();
    writer.set_panicking(true);
    let coalescer =
        WriteCoalescer::new(Arc::clone(&writer), config(10, 1 << 20, Duration::ZERO)).unwrap();
    let err = coalescer.hand_off(vec![rec(1)]).await.unwrap_err();
    assert!(matches!(err, WriteError::WorkerGone));
    assert_eq!(
        err.to_string(),
        "write coalescer worker stopped before reporting the write"
    );
    let later = coalescer.hand_off(vec![rec(2)]).await.unwrap_err();
    assert!(matches!(later, WriteError::WorkerGone));
    // Close does not hang on a dead worker.
    coalescer.close().await;
}

#[tokio::test]
async fn zero_bounds_are_refused() {
    let err = WriteCoalescer::new(FakeWriter::new(), config(0, 1, Duration::ZERO)).unwrap_err();
    assert_eq!(
        err,
        ConfigError::Zero {
            field: "write.max_records"
        }
    );
    let err = WriteCoalescer::new(FakeWriter::new(), config(1, 0, Duration::ZERO)).unwrap_err();
    assert_eq!(err.to_string(), "write.max_bytes must be greater than zero");
}
