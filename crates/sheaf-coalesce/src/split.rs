//! Split rules: how one flushed lookup batch is cut into separate backend queries.
//!
//! A batch query bounded by time takes the oldest key's bound for the whole batch, so
//! one old key widens the scanned range for every other key. Splitting a flush whose
//! keys' times span more than a limit (15 minutes for Sheaf's retries) keeps each query's
//! range narrow. What that is worth depends on the store's layout: in a time-ordered
//! ClickHouse layout a batch of 100 keys spread over 30 days cost 9.8 ms of CPU per key
//! against 1.07 ms for keys within a day (docs/benchmarks.md, "lookup", earlier
//! measurements). [`SpanSplit`] is that rule, generic over the key and its time.

use std::time::{Duration, Instant, SystemTime};

/// Cuts the distinct keys of one flush into groups, each queried on its own.
///
/// The worker hands over the keys in the order they arrived. Every key should land in
/// exactly one group; a key the rule drops is still queried (in one more group), and a
/// key it repeats is queried once. Empty groups are skipped.
pub trait SplitRule<K>: Send + Sync + 'static {
    /// Returns the groups to query.
    fn split(&self, keys: Vec<K>) -> Vec<Vec<K>>;
}

/// Any `Fn(Vec<K>) -> Vec<Vec<K>>` is a split rule.
impl<K, F> SplitRule<K> for F
where
    F: Fn(Vec<K>) -> Vec<Vec<K>> + Send + Sync + 'static,
{
    fn split(&self, keys: Vec<K>) -> Vec<Vec<K>> {
        self(keys)
    }
}

/// The default rule: the whole flush is one query.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoSplit;

impl<K> SplitRule<K> for NoSplit {
    fn split(&self, keys: Vec<K>) -> Vec<Vec<K>> {
        vec![keys]
    }
}

/// A point in time whose distance to a later point can be measured.
///
/// Implemented for the standard clocks; a key holding a `chrono::DateTime<Utc>` can
/// return it as a [`SystemTime`] (`SystemTime::from(dt)`), and one holding a count of
/// microseconds since some epoch can return it as a [`Duration`].
pub trait SpanPoint: Ord + Copy + Send + 'static {
    /// How far `later` is after `self`; zero when it is not later.
    fn span_until(self, later: Self) -> Duration;
}

impl SpanPoint for SystemTime {
    fn span_until(self, later: Self) -> Duration {
        later.duration_since(self).unwrap_or(Duration::ZERO)
    }
}

impl SpanPoint for Instant {
    fn span_until(self, later: Self) -> Duration {
        later.saturating_duration_since(self)
    }
}

impl SpanPoint for tokio::time::Instant {
    fn span_until(self, later: Self) -> Duration {
        later.saturating_duration_since(self)
    }
}

impl SpanPoint for Duration {
    fn span_until(self, later: Self) -> Duration {
        later.saturating_sub(self)
    }
}

/// Cuts a flush so that no group's keys span more than `max_span` in time.
///
/// Keys are sorted by the time `time_of` gives them; a group starts at its oldest key
/// and takes every following key no more than `max_span` later (the limit is
/// inclusive); the first key past it opens the next group. Sheaf's retry path uses
/// `max_span = 15 minutes`.
#[derive(Clone, Copy)]
pub struct SpanSplit<F> {
    max_span: Duration,
    time_of: F,
}

impl<F> SpanSplit<F> {
    /// A rule with the given limit and time extractor.
    pub fn new(max_span: Duration, time_of: F) -> Self {
        Self { max_span, time_of }
    }

    /// The limit on a group's span.
    pub fn max_span(&self) -> Duration {
        self.max_span
    }
}

impl<F> std::fmt::Debug for SpanSplit<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpanSplit")
            .field("max_span", &self.max_span)
            .finish_non_exhaustive()
    }
}

impl<K, T, F> SplitRule<K> for SpanSplit<F>
where
    K: Send + 'static,
    T: SpanPoint,
    F: Fn(&K) -> T + Send + Sync + 'static,
{
    fn split(&self, keys: Vec<K>) -> Vec<Vec<K>> {
        let mut timed: Vec<(T, K)> = keys.into_iter().map(|k| ((self.time_of)(&k), k)).collect();
        // A stable sort keeps arrival order among keys with the same time.
        timed.sort_by_key(|entry| entry.0);
        let mut groups: Vec<Vec<K>> = Vec::new();
        let mut group_start: Option<T> = None;
        for (time, key) in timed {
            match (group_start, groups.last_mut()) {
                (Some(start), Some(group)) if start.span_until(time) <= self.max_span => {
                    group.push(key);
                }
                _ => {
                    group_start = Some(time);
                    groups.push(vec![key]);
                }
            }
        }
        groups
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: Duration = Duration::from_secs(60);

    fn at(minutes: u64) -> Duration {
        MINUTE * u32::try_from(minutes).expect("small test value")
    }

    #[test]
    fn keys_within_the_span_stay_together_and_the_limit_is_inclusive() {
        let rule = SpanSplit::new(15 * MINUTE, |k: &Duration| *k);
        let groups = rule.split(vec![at(15), at(0), at(7)]);
        assert_eq!(groups, vec![vec![at(0), at(7), at(15)]]);
    }

    #[test]
    fn a_key_past_the_span_opens_a_new_group_measured_from_its_own_start() {
        let rule = SpanSplit::new(15 * MINUTE, |k: &Duration| *k);
        let groups = rule.split(vec![at(40), at(0), at(16), at(5), at(30), at(31), at(100)]);
        assert_eq!(
            groups,
            vec![
                vec![at(0), at(5)],
                vec![at(16), at(30), at(31)],
                vec![at(40)],
                vec![at(100)]
            ]
        );
    }

    #[test]
    fn system_time_keys_split_like_durations() {
        let base = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let rule = SpanSplit::new(15 * MINUTE, |k: &(u32, SystemTime)| k.1);
        let groups = rule.split(vec![(1, base), (2, base + 20 * MINUTE), (3, base + MINUTE)]);
        assert_eq!(
            groups,
            vec![
                vec![(1, base), (3, base + MINUTE)],
                vec![(2, base + 20 * MINUTE)]
            ]
        );
    }

    #[test]
    fn no_split_and_closures_are_rules() {
        assert_eq!(NoSplit.split(vec![1, 2, 3]), vec![vec![1, 2, 3]]);
        let halves = |keys: Vec<u32>| keys.chunks(2).map(<[u32]>::to_vec).collect::<Vec<_>>();
        assert_eq!(
            SplitRule::split(&halves, vec![1, 2, 3]),
            vec![vec![1, 2], vec![3]]
        );
        assert!(
            SpanSplit::new(MINUTE, |k: &Duration| *k)
                .split(Vec::new())
                .is_empty()
        );
    }
}
