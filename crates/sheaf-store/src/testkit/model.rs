//! The reference model of the latest-attempt lookup: the specification as a plain loop.
//!
//! It is deliberately naive (a scan of the whole history per key) so that it is obviously right;
//! every backend's single and batched lookups are compared against it.

use std::collections::HashMap;

use crate::{Attempt, AttemptKey};

/// The newest attempt in `history` for the key's `(tenant, event, destination)` whose time is at
/// or after the key's `attempt_time`; newest means the greatest `(time, id)`. Duplicated rows are
/// identical, so which copy is returned does not matter.
pub fn latest_attempt<'a>(history: &'a [Attempt], key: &AttemptKey) -> Option<&'a Attempt> {
    let mut best: Option<&Attempt> = None;
    for attempt in history {
        let same_triple = attempt.tenant_id == key.tenant_id
            && attempt.event_id == key.event_id
            && attempt.destination_id == key.destination_id;
        if !same_triple || attempt.time < key.attempt_time {
            continue;
        }
        if best.is_none_or(|b| attempt.is_newer_than(b)) {
            best = Some(attempt);
        }
    }
    best
}

/// [`latest_attempt`] for every key: an entry for each key with a result, none for the others.
pub fn latest_attempts(history: &[Attempt], keys: &[AttemptKey]) -> HashMap<AttemptKey, Attempt> {
    keys.iter()
        .filter_map(|key| latest_attempt(history, key).map(|a| (key.clone(), a.clone())))
        .collect()
}
