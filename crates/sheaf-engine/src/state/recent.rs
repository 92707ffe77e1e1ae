//! A cache of what this process handled a moment ago: the fresh-event cache (payloads a first
//! delivery reads) and the accepted-ids cache (repeats answered without a read). Entries are
//! read about once, soon after they are written, and in the order they were written, because
//! the queue hands out the oldest jobs first; so the oldest entry is the one to forget, and an
//! entry past its time to live is a miss.
//!
//! A general-purpose cache pays for what these do not need: the profile of the memory
//! configuration at saturation (`docs/benchmarks.md`, "Where the memory configuration's time
//! goes") put moka's two caches at 16 % of the process's CPU, with recency and frequency
//! bookkeeping on every read. This one is a map and a queue of insertion order under a few
//! locks (shards chosen by the key's hash), each held for one map operation.

use std::collections::hash_map::RandomState;
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, Hash};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// How many independently locked parts a cache has: enough that 32 workers and the publishes
/// on two cores rarely wait for one another.
const SHARDS: usize = 16;

/// A bounded map that forgets the oldest entries first and entries older than its time to
/// live.
pub struct Recent<K, V> {
    shards: Box<[Mutex<Shard<K, V>>]>,
    hasher: RandomState,
    per_shard: usize,
    ttl: Duration,
}

struct Shard<K, V> {
    /// Each entry with when it was written and its place in `order`.
    map: HashMap<K, (V, Instant, u64)>,
    /// Keys in the order they were written, with the write's number: a key written again is
    /// queued again, and its older place is skipped when it comes up.
    order: VecDeque<(K, u64)>,
    next: u64,
}

impl<K: Hash + Eq + Clone, V: Clone> Recent<K, V> {
    /// About `capacity` entries (rounded up to a multiple of the shards; 0 holds nothing), each
    /// for at most `ttl`.
    pub fn new(capacity: u64, ttl: Duration) -> Self {
        let per_shard = usize::try_from(capacity)
            .unwrap_or(usize::MAX)
            .div_ceil(SHARDS);
        Self {
            shards: (0..SHARDS)
                .map(|_| {
                    Mutex::new(Shard {
                        map: HashMap::new(),
                        order: VecDeque::new(),
                        next: 0,
                    })
                })
                .collect(),
            hasher: RandomState::new(),
            per_shard,
            ttl,
        }
    }

    fn shard(&self, key: &K) -> MutexGuard<'_, Shard<K, V>> {
        let index = (self.hasher.hash_one(key) as usize) % SHARDS;
        self.shards[index]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The value of `key`, unless it was forgotten or is older than the time to live.
    pub fn get(&self, key: &K) -> Option<V> {
        let shard = self.shard(key);
        let (value, written, _) = shard.map.get(key)?;
        (written.elapsed() <= self.ttl).then(|| value.clone())
    }

    /// Whether `key` is held and younger than the time to live.
    pub fn contains_key(&self, key: &K) -> bool {
        let shard = self.shard(key);
        shard
            .map
            .get(key)
            .is_some_and(|(_, written, _)| written.elapsed() <= self.ttl)
    }

    /// Writes `value` for `key`, forgetting the oldest entries of its shard past the bound.
    pub fn insert(&self, key: K, value: V) {
        if self.per_shard == 0 {
            return;
        }
        let mut shard = self.shard(&key);
        let shard = &mut *shard;
        let number = shard.next;
        shard.next += 1;
        shard.order.push_back((key.clone(), number));
        shard.map.insert(key, (value, Instant::now(), number));
        while shard.map.len() > self.per_shard
            || shard.order.len() > self.per_shard.saturating_mul(2)
        {
            let Some((oldest, written)) = shard.order.pop_front() else {
                break;
            };
            // A key written again since has a later number: this place is stale.
            if shard
                .map
                .get(&oldest)
                .is_some_and(|(_, _, n)| *n == written)
            {
                shard.map.remove(&oldest);
            }
        }
    }

    /// Forgets everything.
    pub fn invalidate_all(&self) {
        for shard in &*self.shards {
            let mut shard = shard.lock().unwrap_or_else(PoisonError::into_inner);
            shard.map.clear();
            shard.order.clear();
        }
    }

    /// How many entries are held (expired ones included until they are pushed out).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(PoisonError::into_inner).map.len())
            .sum()
    }
}

impl<K, V> std::fmt::Debug for Recent<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recent")
            .field("capacity", &(self.per_shard * SHARDS))
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_go_first_and_the_bound_holds() {
        let cache = Recent::new(160, Duration::from_secs(60));
        for i in 0..1_000u32 {
            cache.insert(i, i * 2);
        }
        assert!(cache.len() <= 160, "{}", cache.len());
        // Each of the 16 shards keeps its newest 10 of about 62 keys: the newest 40 keys are
        // all there (about 2.5 per shard), the oldest 100 all gone.
        for i in 960..1_000 {
            assert_eq!(cache.get(&i), Some(i * 2), "{i}");
        }
        for i in 0..100 {
            assert_eq!(cache.get(&i), None, "{i}");
        }
    }

    #[test]
    fn a_key_written_again_keeps_its_newest_value() {
        // One key written many times: its older places in the order come up and are skipped,
        // never taking away the newest write.
        let cache = Recent::new(16 * 4, Duration::from_secs(60));
        for i in 0..100u32 {
            cache.insert("a", i);
            assert_eq!(cache.get(&"a"), Some(i), "after write {i}");
        }
        assert!(cache.contains_key(&"a"));
        assert_eq!(cache.len(), 1);
    }

    #[test]
    fn an_entry_past_its_time_to_live_is_a_miss() {
        let cache = Recent::new(100, Duration::from_millis(20));
        cache.insert(1, "one");
        assert_eq!(cache.get(&1), Some("one"));
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(cache.get(&1), None);
        assert!(!cache.contains_key(&1));
        cache.insert(2, "two");
        cache.invalidate_all();
        assert_eq!(cache.get(&2), None);
        // A capacity of 0 (`SHEAF_FRESH_EVENT_CACHE=0`) holds nothing.
        let none = Recent::new(0, Duration::from_secs(60));
        none.insert(1, "one");
        assert_eq!(none.get(&1), None);
    }
}
