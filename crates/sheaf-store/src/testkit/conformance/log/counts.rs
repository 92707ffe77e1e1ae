//! `count_attempts`: attempts counted by status per time bucket.

use std::time::Duration;

use super::{SECOND, base_time, insert};
use crate::testkit::fixtures::{attempt, event, shift, unique_tenant};
use crate::{AttemptStatus, Buckets, DestinationId, LogStore};

/// Six one-minute buckets: attempts land in the bucket their time falls in (its start
/// included, its end not), failures and successes apart; attempts before, after and of another
/// tenant do not count, a repeated row counts once, and empty buckets are there with zeros.
pub async fn count_attempts_buckets_by_time_and_status(store: &dyn LogStore) {
    let tenant = unique_tenant("counts");
    let other = unique_tenant("counts-other");
    let since = base_time();
    let minute = 60 * SECOND;
    let buckets = Buckets::new(since, Duration::from_secs(60), 6).expect("valid buckets");
    let e = event(&tenant, "counted", "order.created", since);
    let theirs = event(&other, "counted", "order.created", since);
    let destination = DestinationId::generate();
    let at = |micros: i64, status: AttemptStatus| {
        let mut a = attempt(&e, destination, shift(since, micros));
        a.status = status;
        a
    };
    let ok = AttemptStatus::Success;
    let failed = AttemptStatus::Failed;
    let filtered = AttemptStatus::Filtered;
    let mut attempts = vec![
        at(-1, ok),                   // before the first bucket
        at(0, ok),                    // bucket 0, at its start
        at(minute - 1, failed),       // bucket 0, at its end
        at(minute, failed),           // bucket 1
        at(minute + SECOND, failed),  // bucket 1
        at(2 * minute + 5, filtered), // bucket 2: neither a success nor a failure
        at(3 * minute + 7, ok),       // bucket 3
        at(3 * minute + 9, filtered), // bucket 3
        at(6 * minute - 1, ok),       // bucket 5, the last microsecond
        at(6 * minute, failed),       // after the last bucket
    ];
    let repeated = attempts[6].clone();
    attempts.push(repeated);
    let mut elsewhere = attempt(&theirs, destination, shift(since, SECOND));
    elsewhere.status = failed;
    attempts.push(elsewhere);
    insert(store, &[e.clone(), theirs], &attempts).await;
    let counts = store
        .count_attempts(&tenant, &buckets)
        .await
        .expect("count_attempts failed");
    let got: Vec<(i64, u64, u64, u64)> = counts
        .iter()
        .map(|c| {
            (
                (c.start.as_micros() - since.as_micros()) / minute,
                c.success,
                c.failed,
                c.filtered,
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (0, 1, 1, 0),
            (1, 0, 2, 0),
            (2, 0, 0, 1),
            (3, 1, 0, 1),
            (4, 0, 0, 0),
            (5, 1, 0, 0)
        ],
        "(bucket, successes, failures, filtered) per minute"
    );
    let nobody = unique_tenant("counts-nobody");
    let none = store
        .count_attempts(&nobody, &buckets)
        .await
        .expect("count_attempts failed");
    assert_eq!(
        none.len(),
        6,
        "every bucket, even for a tenant with nothing"
    );
    assert!(
        none.iter()
            .all(|c| c.success == 0 && c.failed == 0 && c.filtered == 0)
    );
}
