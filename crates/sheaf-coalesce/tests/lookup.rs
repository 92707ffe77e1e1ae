//! LookupCoalescer behaviour, one test per rule it promises (flush by count and by time,
//! the split rule, a failed query fanned out, callers that leave, the batch of one, keys
//! that cannot batch, identical keys, the disabled mode, closing, adaptive mode, queries in
//! flight, a dead worker, metrics and configuration), all on paused time.

use std::sync::Arc;
use std::time::Duration;

use sheaf_coalesce::{
    CoalesceMetrics, ConfigError, LookupCoalescer, LookupConfig, LookupError, SpanSplit,
};
use tokio::time::Instant;

use crate::support::{
    Call, FakeLookup, Key, adaptive, adaptive_under_load, advance, expected, finished, fixed, ms,
    settle, spawn_lookup,
};

const HOUR: Duration = Duration::from_secs(3600);

#[tokio::test(start_paused = true)]
async fn flushes_at_max_batch_without_waiting_for_the_deadline() {
    let backend = FakeLookup::new();
    let coalescer = LookupCoalescer::new(Arc::clone(&backend), fixed(3, HOUR)).unwrap();
    let keys = [Key::new(1), Key::new(2), Key::new(3), Key::new(4)];
    let handles: Vec<_> = keys
        .iter()
        .map(|k| spawn_lookup(&coalescer, k.clone()))
        .collect();
    settle().await;

    // The first three filled the batch and went out at once; the fourth opened a new
    // batch that waits for its deadline.
    assert_eq!(
        backend.timed_calls(),
        vec![(Duration::ZERO, Call::Many(keys[..3].to_vec()))]
    );
    let mut handles = handles.into_iter();
    for key in &keys[..3] {
        let handle = handles.next().unwrap();
        assert_eq!(finished(handle).await.unwrap(), expected(key));
    }
    let last = handles.next().unwrap();
    assert!(!last.is_finished());
    advance(HOUR).await;
    assert_eq!(finished(last).await.unwrap(), expected(&keys[3]));
    assert_eq!(backend.calls()[1], Call::One(keys[3].clone()));
}

#[tokio::test(start_paused = true)]
async fn flushes_max_wait_after_the_first_key_of_a_batch() {
    let backend = FakeLookup::new();
    let coalescer = LookupCoalescer::new(Arc::clone(&backend), fixed(10, ms(50))).unwrap();
    let first = spawn_lookup(&coalescer, Key::new(1));
    settle().await;
    advance(ms(30)).await;
    // A later key joins the batch but does not move its deadline.
    let second = spawn_lookup(&coalescer, Key::new(2));
    advance(ms(19)).await;
    assert!(
        backend.calls().is_empty(),
        "nothing may be queried before max_wait"
    );
    assert!(!first.is_finished() && !second.is_finished());

    advance(ms(1)).await;
    assert_eq!(
        backend.timed_calls(),
        vec![(ms(50), Call::Many(vec![Key::new(1), Key::new(2)]))]
    );
    assert_eq!(finished(first).await.unwrap(), expected(&Key::new(1)));
    assert_eq!(finished(second).await.unwrap(), expected(&Key::new(2)));
}

#[tokio::test(start_paused = true)]
async fn splits_a_flush_whose_keys_span_more_than_the_limit() {
    let backend = FakeLookup::new();
    let coalescer = LookupCoalescer::builder(Arc::clone(&backend), fixed(10, ms(50)))
        .split(SpanSplit::new(
            Duration::from_secs(15 * 60),
            Key::attempt_time,
        ))
        .build()
        .unwrap();
    // Minutes 0, 5 and 15 are within 15 minutes of each other; 16 and 30 form the next
    // group; 40 is alone and takes the single path.
    let keys = [
        Key::at(1, 16),
        Key::at(2, 0),
        Key::at(3, 40),
        Key::at(5, 5),
        Key::at(6, 30),
        Key::at(7, 15),
    ];
    let handles: Vec<_> = keys
        .iter()
        .map(|k| spawn_lookup(&coalescer, k.clone()))
        .collect();
    advance(ms(50)).await;

    assert_eq!(
        backend.sorted_calls(),
        vec![
            Call::One(Key::at(3, 40)),
            Call::Many(vec![Key::at(1, 16), Key::at(6, 30)]),
            Call::Many(vec![Key::at(2, 0), Key::at(5, 5), Key::at(7, 15)]),
        ]
    );
    for (key, handle) in keys.iter().zip(handles) {
        assert_eq!(finished(handle).await.unwrap(), expected(key));
    }
}

#[tokio::test(start_paused = true)]
async fn a_failed_batch_query_fails_every_caller_with_one_shared_error() {
    let backend = FakeLookup::new();
    backend.set_failing(true);
    let coalescer = LookupCoalescer::new(Arc::clone(&backend), fixed(10, ms(50))).unwrap();
    let handles: Vec<_> = (1..=3)
        .map(|id| spawn_lookup(&coalescer, Key::new(id)))
        .collect();
    advance(ms(50)).await;

    let mut errors = Vec::new();
    for handle in handles {
        errors.push(finished(handle).await.unwrap_err());
    }
    assert_eq!(backend.many_calls(), 1);
    let shared = match &errors[0] {
        LookupError::Backend(err) => Arc::clone(err),
        other => panic!("expected the backend's error, got {other:?}"),
    };
    for err in &errors {
        assert_eq!(err.to_string(), "lookup query failed: fake backend is down");
        assert!(matches!(err, LookupError::Backend(e) if Arc::ptr_eq(e, &shared)));
        assert!(err.backend().is_some());
        assert_eq!(err.clone().to_string(), err.to_string());
    }

    // The worker carries on once the backend recovers.
    backend.set_failing(false);
    let again = spawn_lookup(&coalescer, Key::new(5));
    advance(ms(50)).await;
    assert_eq!(finished(again).await.unwrap(), expected(&Key::new(5)));
}

#[tokio::test(start_paused = true)]
async fn a_caller_that_leaves_does_not_harm_the_batch() {
    let backend = FakeLookup::with_delay(ms(10));
    let coalescer = LookupCoalescer::new(Arc::clone(&backend), fixed(10, ms(50))).unwrap();

    // Leaving before the flush: the key nobody waits for is left out of the query.
    let one = spawn_lookup(&coalescer, Key::new(1));
    let two = spawn_lookup(&coalescer, Key::new(2));
    let three = spawn_lookup(&coalescer, Key::new(3));
    settle().await;
    two.abort();
    advance(ms(50)).await;
    assert_eq!(
        backend.calls(),
        vec![Call::Many(vec![Key::new(1), Key::new(3)])]
    );
    advance(ms(10)).await;
    assert_eq!(finished(one).await.unwrap(), expected(&Key::new(1)));
    assert_eq!(finished(three).await.unwrap(), expected(&Key::new(3)));
    assert!(two.await.unwrap_err().is_cancelled());

    // Leaving while the query runs: its answer is dropped, the others still get theirs.
    let five = spawn_lookup(&coalescer, Key::new(5));
    let six = spawn_lookup(&coalescer, Key::new(6));
    advance(ms(50)).await;
    assert_eq!(backend.calls().len(), 2, "the second batch is in flight");
    five.abort();
    advance(ms(10)).await;
    assert_eq!(finished(six).await.unwrap(), expected(&Key::new(6)));
    assert!(five.await.unwrap_err().is_cancelled());

    // Nothing panicked and the worker still answers.
    let seven = spawn_lookup(&coalescer, Key::new(7));
    advance(ms(50)).await;
    advance(ms(10)).await;
    assert_eq!(finished(seven).await.unwrap(), expected(&Key::new(7)));
}

#[tokio::test(start_paused = true)]
async fn a_batch_of_one_uses_the_single_path() {
    let backend = FakeLookup::new();
    let coalescer = LookupCoalescer::new(Arc::clone(&backend), fixed(10, ms(50))).unwrap();
    let alone = spawn_lookup(&coalescer, Key::new(3));
    advance(ms(50)).await;
    assert_eq!(finished(alone).await.unwrap(), expected(&Key::new(3)));
    assert_eq!(backend.calls(), vec![Call::One(Key::new(3))]);

    // Three callers of one key are still a batch of one distinct key.
    let handles: Vec<_> = (0..3)
        .map(|_| spawn_lookup(&coalescer, Key::new(4)))
        .collect();
    advance(ms(50)).await;
    for handle in handles {
        assert_eq!(finished(handle).await.unwrap(), None);
    }
    assert_eq!(
        backend.calls(),
        vec![Call::One(Key::new(3)), Call::One(Key::new(4))]
    );
}

#[tokio::test(start_paused = true)]
async fn keys_that_cannot_batch_bypass_the_worker() {
    let backend = FakeLookup::new();
    let metrics = Arc::new(CoalesceMetrics::new());
    let coalescer = LookupCoalescer::builder(Arc::clone(&backend), fixed(10, ms(50)))
        .observer(metrics.clone())
        .build()
        .unwrap();
    let batched = spawn_lookup(&coalescer, Key::new(1));
    let bypass = spawn_lookup(&coalescer, Key::unbatchable(9));
    settle().await;
    // The bypassing key was answered at once, without waiting for the batch.
    assert_eq!(
        finished(bypass).await.unwrap(),
        expected(&Key::unbatchable(9))
    );
    assert_eq!(
        backend.timed_calls(),
        vec![(Duration::ZERO, Call::One(Key::unbatchable(9)))]
    );
    assert!(!batched.is_finished());
    advance(ms(50)).await;
    assert_eq!(finished(batched).await.unwrap(), expected(&Key::new(1)));
    let snapshot = metrics.snapshot();
    assert_eq!(snapshot.direct_lookups, 1);
    assert_eq!(snapshot.single_queries, 1);
}

#[tokio::test(start_paused = true)]
async fn identical_keys_are_queried_once_and_answered_to_every_caller() {
    let backend = FakeLookup::new();
    let coalescer = LookupCoalescer::new(Arc::clone(&backend), fixed(10, ms(50))).unwrap();
    let keys = [
        Key::new(1),
        Key::new(2),
        Key::new(1),
        Key::new(8),
        Key::new(1),
        Key::new(8),
    ];
    let handles: Vec<_> = keys
        .iter()
        .map(|k| spawn_lookup(&coalescer, k.clone()))
        .collect();
    advance(ms(50)).await;
    assert_eq!(
        backend.calls(),
        vec![Call::Many(vec![Key::new(1), Key::new(2), Key::new(8)])]
    );
    for (key, handle) in keys.iter().zip(handles) {
        assert_eq!(finished(handle).await.unwrap(), expected(key));
    }
}

#[tokio::test(start_paused = true)]
async fn max_batch_counts_distinct_keys() {
    let backend = FakeLookup::new();
    let coalescer = LookupCoalescer::new(Arc::clone(&backend), fixed(2, HOUR)).unwrap();
    let handles: Vec<_> = [1, 1, 1, 2]
        .into_iter()
        .map(|id| spawn_lookup(&coalescer, Key::new(id)))
        .collect();
    settle().await;
    assert_eq!(
        backend.calls(),
        vec![Call::Many(vec![Key::new(1), Key::new(2)])]
    );
    for handle in handles {
        assert!(finished(handle).await.is_ok());
    }
}

#[tokio::test(start_paused = true)]
async fn disabled_goes_straight_to_the_single_path_without_a_worker() {
    let backend = FakeLookup::new();
    let runtime = tokio::runtime::Handle::current();
    let tasks_before = runtime.metrics().num_alive_tasks();
    let coalescer = LookupCoalescer::new(Arc::clone(&backend), LookupConfig::disabled()).unwrap();
    assert_eq!(
        runtime.metrics().num_alive_tasks(),
        tasks_before,
        "no worker task"
    );

    let started = Instant::now();
    for id in [1, 2, 4] {
        assert_eq!(
            coalescer.lookup(Key::new(id)).await.unwrap(),
            expected(&Key::new(id))
        );
    }
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert_eq!(
        backend.calls(),
        vec![
            Call::One(Key::new(1)),
            Call::One(Key::new(2)),
            Call::One(Key::new(4))
        ]
    );

    backend.set_failing(true);
    let err = coalescer.lookup(Key::new(5)).await.unwrap_err();
    assert_eq!(err.to_string(), "lookup query failed: fake backend is down");

    coalescer.close().await;
    assert!(matches!(
        coalescer.lookup(Key::new(1)).await,
        Err(LookupError::Closed)
    ));
}

#[tokio::test(start_paused = true)]
async fn close_drains_pending_keys_then_refuses_with_closed() {
    let backend = FakeLookup::with_delay(ms(10));
    let metrics = Arc::new(CoalesceMetrics::new());
    let coalescer = LookupCoalescer::builder(Arc::clone(&backend), fixed(10, HOUR))
        .observer(metrics.clone())
        .build()
        .unwrap();
    let one = spawn_lookup(&coalescer, Key::new(1));
    let two = spawn_lookup(&coalescer, Key::new(2));
    settle().await;

    let started = Instant::now();
    coalescer.close().await;
    // The pending batch went out at once, not after its hour, and close returned only
    // once its query had answered.
    assert_eq!(started.elapsed(), ms(10));
    assert_eq!(
        backend.calls(),
        vec![Call::Many(vec![Key::new(1), Key::new(2)])]
    );
    assert_eq!(finished(one).await.unwrap(), expected(&Key::new(1)));
    assert_eq!(finished(two).await.unwrap(), expected(&Key::new(2)));
    assert_eq!(metrics.snapshot().flushes_by_close, 1);

    let refused = coalescer.clone().lookup(Key::new(3)).await.unwrap_err();
    assert!(matches!(refused, LookupError::Closed));
    assert_eq!(
        refused.to_string(),
        "lookup coalescer is closed: no new lookups are accepted"
    );
    assert!(matches!(
        coalescer.lookup(Key::unbatchable(3)).await,
        Err(LookupError::Closed)
    ));
    assert!(coalescer.is_closed());
    coalescer.close().await;
    assert_eq!(backend.calls().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn adaptive_flushes_at_once_when_idle_and_gathers_under_load() {
    let backend = FakeLookup::with_delay(ms(10));
    let metrics = Arc::new(CoalesceMetrics::new());
    let coalescer = LookupCoalescer::builder(Arc::clone(&backend), adaptive(100, ms(50)))
        .observer(metrics.clone())
        .build()
        .unwrap();

    // Idle store: the key goes out with no added wait.
    let first = spawn_lookup(&coalescer, Key::new(1));
    settle().await;
    assert_eq!(
        backend.timed_calls(),
        vec![(Duration::ZERO, Call::One(Key::new(1)))]
    );

    // While that query runs, keys gather; they go out the moment it completes.
    let later: Vec<_> = (2..=5)
        .map(|id| spawn_lookup(&coalescer, Key::new(id)))
        .collect();
    settle().await;
    assert_eq!(backend.calls().len(), 1);
    advance(ms(10)).await;
    assert_eq!(finished(first).await.unwrap(), expected(&Key::new(1)));
    assert_eq!(
        backend.timed_calls()[1],
        (ms(10), Call::Many((2..=5).map(Key::new).collect()))
    );
    advance(ms(10)).await;
    for (id, handle) in (2..=5).zip(later) {
        assert_eq!(finished(handle).await.unwrap(), expected(&Key::new(id)));
    }

    // Idle again: no wait again.
    let again = spawn_lookup(&coalescer, Key::new(6));
    settle().await;
    assert_eq!(backend.timed_calls()[2], (ms(20), Call::One(Key::new(6))));
    advance(ms(10)).await;
    assert_eq!(finished(again).await.unwrap(), expected(&Key::new(6)));
    assert_eq!(metrics.snapshot().flushes_by_adaptive, 3);
}

#[tokio::test(start_paused = true)]
async fn gathering_under_load_batches_like_fixed_and_sends_a_lone_key_at_once() {
    let backend = FakeLookup::with_delay(ms(10));
    let metrics = Arc::new(CoalesceMetrics::new());
    let coalescer =
        LookupCoalescer::builder(Arc::clone(&backend), adaptive_under_load(100, ms(50)))
            .observer(metrics.clone())
            .build()
            .unwrap();

    // Idle store: the key goes out with no added wait.
    let first = spawn_lookup(&coalescer, Key::new(1));
    settle().await;
    assert_eq!(
        backend.timed_calls(),
        vec![(Duration::ZERO, Call::One(Key::new(1)))]
    );

    // Keys arriving while it runs are not sent when it completes (as plain adaptive does)...
    let gathered: Vec<_> = (2..=5)
        .map(|id| spawn_lookup(&coalescer, Key::new(id)))
        .collect();
    advance(ms(10)).await;
    assert_eq!(finished(first).await.unwrap(), expected(&Key::new(1)));
    // ...nor when more come right after it (the store is busy, not idle)...
    let more: Vec<_> = (6..=7)
        .map(|id| spawn_lookup(&coalescer, Key::new(id)))
        .collect();
    advance(ms(39)).await;
    assert_eq!(
        backend.calls().len(),
        1,
        "still gathering, as the fixed mode would"
    );
    // ...but once the first of them has waited `max_wait`, all of them go in one query.
    advance(ms(1)).await;
    assert_eq!(
        backend.timed_calls()[1],
        (ms(50), Call::Many((2..=7).map(Key::new).collect()))
    );
    advance(ms(10)).await;
    for (id, handle) in (2..=7).zip(gathered.into_iter().chain(more)) {
        assert_eq!(finished(handle).await.unwrap(), expected(&Key::new(id)));
    }

    // A key after a quiet spell of `max_wait` goes at once again.
    advance(ms(50)).await;
    let alone = spawn_lookup(&coalescer, Key::new(8));
    settle().await;
    assert_eq!(backend.timed_calls()[2], (ms(110), Call::One(Key::new(8))));
    advance(ms(10)).await;
    assert_eq!(finished(alone).await.unwrap(), expected(&Key::new(8)));
    let snapshot = metrics.snapshot();
    assert_eq!(snapshot.flushes_by_adaptive, 2, "the two lone keys");
    assert_eq!(snapshot.flushes_by_time, 1, "the gathered batch");
}

#[tokio::test(start_paused = true)]
async fn adaptive_still_flushes_at_max_wait_behind_a_slow_query() {
    let backend = FakeLookup::with_delay(ms(200));
    let coalescer = LookupCoalescer::new(Arc::clone(&backend), adaptive(100, ms(50))).unwrap();
    let first = spawn_lookup(&coalescer, Key::new(1));
    settle().await;
    let second = spawn_lookup(&coalescer, Key::new(2));
    let third = spawn_lookup(&coalescer, Key::new(3));
    advance(ms(49)).await;
    assert_eq!(backend.calls().len(), 1);
    advance(ms(1)).await;
    assert_eq!(
        backend.timed_calls()[1],
        (ms(50), Call::Many(vec![Key::new(2), Key::new(3)]))
    );
    advance(ms(200)).await;
    for (id, handle) in [(1, first), (2, second), (3, third)] {
        assert_eq!(finished(handle).await.unwrap(), expected(&Key::new(id)));
    }
}

#[tokio::test(start_paused = true)]
async fn batch_queries_in_flight_are_bounded() {
    let backend = FakeLookup::with_delay(ms(10));
    let config = LookupConfig {
        max_in_flight: 1,
        ..fixed(2, HOUR)
    };
    let coalescer = LookupCoalescer::new(Arc::clone(&backend), config).unwrap();
    let handles: Vec<_> = (1..=4)
        .map(|id| spawn_lookup(&coalescer, Key::new(id)))
        .collect();
    settle().await;
    assert_eq!(
        backend.calls().len(),
        1,
        "the second batch waits for a free slot"
    );
    advance(ms(10)).await;
    assert_eq!(
        backend.timed_calls(),
        vec![
            (Duration::ZERO, Call::Many(vec![Key::new(1), Key::new(2)])),
            (ms(10), Call::Many(vec![Key::new(3), Key::new(4)])),
        ]
    );
    advance(ms(10)).await;
    for handle in handles {
        assert!(finished(handle).await.is_ok());
    }
}

#[tokio::test(start_paused = true)]
async fn a_query_task_that_dies_is_an_error_value_not_a_panic() {
    let backend = FakeLookup::new();
    backend.set_panicking(true);
    let coalescer = LookupCoalescer::new(Arc::clone(&backend), fixed(10, ms(50))).unwrap();
    let one = spawn_lookup(&coalescer, Key::new(1));
    let two = spawn_lookup(&coalescer, Key::new(2));
    advance(ms(50)).await;
    for handle in [one, two] {
        let err = finished(handle).await.unwrap_err();
        assert!(matches!(err, LookupError::WorkerGone));
        assert_eq!(
            err.to_string(),
            "lookup coalescer worker stopped before answering"
        );
    }
    backend.set_panicking(false);
    let three = spawn_lookup(&coalescer, Key::new(3));
    advance(ms(50)).await;
    assert_eq!(finished(three).await.unwrap(), expected(&Key::new(3)));
}

#[tokio::test(start_paused = true)]
async fn metrics_count_flush_reasons_queries_and_keys() {
    let backend = FakeLookup::new();
    let metrics = Arc::new(CoalesceMetrics::new());
    let coalescer = LookupCoalescer::builder(Arc::clone(&backend), fixed(3, ms(50)))
        .split(SpanSplit::new(
            Duration::from_secs(15 * 60),
            Key::attempt_time,
        ))
        .observer(metrics.clone())
        .build()
        .unwrap();
    // A count flush of three keys that the split rule cuts in two groups.
    let first: Vec<_> = [Key::at(1, 0), Key::at(2, 1), Key::at(3, 60)]
        .into_iter()
        .map(|k| spawn_lookup(&coalescer, k))
        .collect();
    settle().await;
    // A time flush of one key asked by two callers.
    let second: Vec<_> = (0..2)
        .map(|_| spawn_lookup(&coalescer, Key::new(5)))
        .collect();
    advance(ms(50)).await;
    for handle in first.into_iter().chain(second) {
        assert!(finished(handle).await.is_ok());
    }

    let snapshot = metrics.snapshot();
    assert_eq!(snapshot.flushes_by_count, 1);
    assert_eq!(snapshot.flushes_by_split, 1);
    assert_eq!(snapshot.flushes_by_time, 1);
    assert_eq!(snapshot.batch_queries, 1);
    assert_eq!(snapshot.single_queries, 2);
    assert_eq!(snapshot.keys_queried, 4);
    assert_eq!(snapshot.keys_served, 5);
    assert_eq!(snapshot.batch_size_buckets[0], 2);
    assert_eq!(snapshot.batch_size_buckets[1], 1);
    assert_eq!(snapshot.lookup_wait, ms(50));
}

#[tokio::test]
async fn an_impossible_config_is_refused() {
    let config = LookupConfig {
        max_in_flight: 0,
        ..fixed(10, ms(50))
    };
    let err = LookupCoalescer::new(FakeLookup::new(), config).unwrap_err();
    assert_eq!(
        err,
        ConfigError::Zero {
            field: "lookup.max_in_flight"
        }
    );
}

#[test]
fn building_outside_a_runtime_is_an_error() {
    let err = LookupCoalescer::new(FakeLookup::new(), fixed(10, ms(50))).unwrap_err();
    assert_eq!(
        err.to_string(),
        "LookupCoalescer must be built inside a tokio runtime"
    );
    // Disabled needs no worker, so no runtime either.
    assert!(LookupCoalescer::new(FakeLookup::new(), LookupConfig::disabled()).is_ok());
}
