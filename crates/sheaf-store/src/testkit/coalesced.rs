//! The parity suite's built-in extra lookup: `latest_attempts` through a `LookupCoalescer`.
//!
//! The retry path of the service never calls the store's lookups directly; it goes through a
//! [`LookupCoalescer`] with the 15-minute split rule. This lookup puts one in front of the store
//! under test, with a batch size, a wait and a mode drawn from the case's `variant` (so a failure
//! replays with the run's RNG seed), and asks for every key at once, the way a burst of retries
//! coming due together does. [`parity::run`](super::parity::run) always includes it, so
//! every backend proves that the coalesced path answers exactly what the single path does.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use sheaf_coalesce::{BatchLookup, LookupCoalescer, LookupConfig, LookupError, SpanSplit};

use super::parity::ParityLookup;
use crate::{Attempt, AttemptKey, Error, LogStore, Result};

/// The span the service's retry path splits batches at: a batch query is bounded by its oldest
/// key's time, so one old key would widen the scanned time range for every key in the batch.
pub const RETRY_SPLIT_SPAN: Duration = Duration::from_secs(15 * 60);

/// A [`LogStore`] seen as a [`BatchLookup`] of latest attempts.
#[derive(Debug, Clone)]
pub struct LatestAttemptLookup(pub Arc<dyn LogStore>);

impl BatchLookup for LatestAttemptLookup {
    type Key = AttemptKey;
    type Value = Attempt;
    type Error = Error;

    fn lookup_one(&self, key: AttemptKey) -> impl Future<Output = Result<Option<Attempt>>> + Send {
        let store = Arc::clone(&self.0);
        async move { store.latest_attempt(&key).await }
    }

    fn lookup_many(
        &self,
        keys: Vec<AttemptKey>,
    ) -> impl Future<Output = Result<HashMap<AttemptKey, Attempt>>> + Send {
        let store = Arc::clone(&self.0);
        async move { store.latest_attempts(&keys).await }
    }
}

/// The time a key is split on.
fn key_time(key: &AttemptKey) -> SystemTime {
    SystemTime::from(key.attempt_time.as_datetime())
}

/// Looks every key up concurrently through a fresh [`LookupCoalescer`] whose configuration comes
/// from `variant`: batch sizes 1 to 100 (1 means "always the single path"), a wait of 0 to 7 ms,
/// fixed or adaptive (gathering under load or not), always the 15-minute split.
#[derive(Debug, Clone, Copy, Default)]
pub struct ThroughCoalescer;

impl ThroughCoalescer {
    fn config(variant: u64) -> LookupConfig {
        LookupConfig {
            max_batch: 1 + (variant % 100) as usize,
            max_wait: Duration::from_millis((variant >> 8) % 8),
            adaptive: (variant >> 16) & 1 == 1,
            gather_under_load: (variant >> 17) & 1 == 1,
            ..LookupConfig::default()
        }
    }
}

#[async_trait]
impl ParityLookup for ThroughCoalescer {
    fn name(&self) -> String {
        "latest_attempt through a LookupCoalescer".into()
    }

    async fn lookup(
        &self,
        store: Arc<dyn LogStore>,
        keys: Vec<AttemptKey>,
        variant: u64,
    ) -> Result<HashMap<AttemptKey, Attempt>> {
        let config = Self::config(variant);
        let coalescer = LookupCoalescer::builder(LatestAttemptLookup(store), config)
            .split(SpanSplit::new(RETRY_SPLIT_SPAN, key_time))
            .build()
            .map_err(|e| Error::invalid_input(format!("coalescer config {config:?}: {e}")))?;
        let answers =
            futures::future::join_all(keys.iter().map(|key| coalescer.lookup(key.clone()))).await;
        coalescer.close().await;

        let mut found = HashMap::new();
        for (key, answer) in keys.into_iter().zip(answers) {
            match answer {
                Ok(Some(attempt)) => {
                    found.insert(key, attempt);
                }
                Ok(None) => {}
                Err(LookupError::Backend(error)) => return Err((*error).clone()),
                Err(other) => {
                    return Err(Error::unavailable("the lookup coalescer failed", other));
                }
            }
        }
        Ok(found)
    }
}
