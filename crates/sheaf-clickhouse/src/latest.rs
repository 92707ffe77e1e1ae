//! The latest-attempt lookups: one key with a point query, many keys with one batched query
//! that keeps the newest row of every `(tenant, event, destination)` asked.
//!
//! The batched query reads the asked triples through the primary key, bounded by the oldest
//! key's time, sorts them newest first within each triple and keeps one row per triple
//! (`LIMIT 1 BY`), under an outer `LIMIT` of one row per triple with
//! `SETTINGS query_plan_max_limit_for_lazy_materialization = <limit>`. In Rust, each key's own
//! bound is applied to its triple's row. `LIMIT 1 BY` also keeps a single copy of a row that
//! ClickHouse has not merged yet, so copies cannot push another triple's row past the outer
//! `LIMIT`; should the result still reach the limit with a triple missing, its keys are looked
//! up one by one (a guard kept from the two-step shape, where copies did that). A server that
//! refuses the setting (unknown, read-only, constrained) gets the same query without it; the
//! store notices that once and remembers.
//!
//! Why one step and not two: the earlier shape found the newest `(time, id)` per triple in a
//! grouped subquery, then read the rows by those five-column keys. ClickHouse builds that
//! subquery's set while planning the outer query and then filters the primary key's marks a
//! second time with it, so a 100-key batch paid for mark filtering twice, and most of its CPU was
//! planning (`QueryPlanOptimizeMicroseconds`). At 1,000,000 attempts the one-step query costs
//! about 0.6 of the two-step one per key in the same run (0.89 against 1.51 ms), and reads the
//! same bytes: with 64 KiB granules, PREWHERE on the key columns already limits payload reads to
//! the granules holding the rows (docs/benchmarks.md, "`lookup`", both shapes side by side).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;

use sheaf_store::{Attempt, AttemptKey, DestinationId, EventId, Result, TenantId};

use crate::error::LAZY_LIMIT_SETTING;
use crate::rows::AttemptRow;
use crate::store::{ClickHouseLogStore, MAX_KEYS_PER_QUERY};

type Triple = (TenantId, EventId, DestinationId);

fn triple_of(key: &AttemptKey) -> Triple {
    (
        key.tenant_id.clone(),
        key.event_id.clone(),
        key.destination_id,
    )
}

/// The batched query for `limit` triples, with or without the lazy materialization limit.
/// Binds: the triples, then the oldest bound.
fn batch_sql(limit: usize, with_lazy_limit: bool) -> String {
    // Newest first within each triple; on equal times the greater id bytewise (native UUID
    // comparison is not bytewise), the order every backend shares. The triple `IN` is the
    // primary key's prefix, so the server reads only the granules that hold those rows.
    let mut sql = format!(
        "SELECT ?fields FROM attempts \
         WHERE (tenant_id, event_id, destination_id) IN ? \
            AND attempt_time >= fromUnixTimestamp64Micro(?, 'UTC') \
         ORDER BY tenant_id, event_id, destination_id, \
            attempt_time DESC, toString(attempt_id) DESC \
         LIMIT 1 BY tenant_id, event_id, destination_id \
         LIMIT {limit}"
    );
    if with_lazy_limit {
        sql.push_str(&format!(" SETTINGS {LAZY_LIMIT_SETTING} = {limit}"));
    }
    sql
}

impl ClickHouseLogStore {
    /// The single-key path: the newest row of the triple at or after the key's bound, read
    /// through the primary key.
    pub(crate) async fn latest_one(&self, key: &AttemptKey) -> Result<Option<Attempt>> {
        let row: Option<AttemptRow> = self
            .timed(
                "look up the latest attempt",
                self.client
                    .query(
                        "SELECT ?fields FROM attempts \
                         WHERE tenant_id = ? AND event_id = ? AND destination_id = ? \
                            AND attempt_time >= fromUnixTimestamp64Micro(?, 'UTC') \
                         ORDER BY attempt_time DESC, toString(attempt_id) DESC \
                         LIMIT 1",
                    )
                    .bind(key.tenant_id.as_str())
                    .bind(key.event_id.as_str())
                    .bind(key.destination_id.to_string())
                    .bind(key.attempt_time.as_micros())
                    .fetch_optional(),
            )
            .await?;
        row.map(AttemptRow::into_attempt).transpose()
    }

    pub(crate) async fn latest_many(
        &self,
        keys: &[AttemptKey],
    ) -> Result<HashMap<AttemptKey, Attempt>> {
        let mut seen = HashSet::with_capacity(keys.len());
        let distinct: Vec<&AttemptKey> = keys.iter().filter(|key| seen.insert(*key)).collect();
        let mut found = HashMap::with_capacity(distinct.len());
        match distinct.as_slice() {
            [] => return Ok(found),
            // One key is one query either way; the point query is the simpler of the two.
            [key] => {
                if let Some(attempt) = self.latest_one(key).await? {
                    found.insert((*key).clone(), attempt);
                }
                return Ok(found);
            }
            _ => {}
        }
        // Group the keys by triple, so a chunk never splits one triple's keys.
        let mut by_triple: HashMap<Triple, Vec<&AttemptKey>> = HashMap::new();
        for key in &distinct {
            by_triple.entry(triple_of(key)).or_default().push(key);
        }
        let triples: Vec<(Triple, Vec<&AttemptKey>)> = by_triple.into_iter().collect();
        for chunk in triples.chunks(MAX_KEYS_PER_QUERY) {
            self.latest_chunk(chunk, &mut found).await?;
        }
        Ok(found)
    }

    /// One batched query for `chunk`'s triples, its answers applied to every key, and the
    /// one-by-one fallback when the result reached its row limit.
    async fn latest_chunk(
        &self,
        chunk: &[(Triple, Vec<&AttemptKey>)],
        found: &mut HashMap<AttemptKey, Attempt>,
    ) -> Result<()> {
        let oldest = chunk
            .iter()
            .flat_map(|(_, keys)| keys.iter().map(|key| key.attempt_time))
            .min()
            .expect("a chunk holds at least one key");
        let rows = self.batch_rows(chunk, oldest.as_micros()).await?;
        let limit = chunk.len();
        let reached_limit = rows.len() >= limit;

        // `LIMIT 1 BY` returns one row per triple; keeping the newest per triple here as well
        // costs nothing and does not depend on it.
        let mut newest: HashMap<Triple, Attempt> = HashMap::with_capacity(limit);
        for row in rows {
            let attempt = row.into_attempt()?;
            let triple = (
                attempt.tenant_id.clone(),
                attempt.event_id.clone(),
                attempt.destination_id,
            );
            match newest.get(&triple) {
                Some(kept) if !attempt.is_newer_than(kept) => {}
                _ => {
                    newest.insert(triple, attempt);
                }
            }
        }

        for (triple, keys) in chunk {
            match newest.get(triple) {
                // The triple's newest attempt since the oldest bound; a key with a later bound
                // accepts it only if it is recent enough, and if it is not, no older one can be.
                Some(attempt) => {
                    for key in keys {
                        if attempt.time >= key.attempt_time {
                            found.insert((*key).clone(), attempt.clone());
                        }
                    }
                }
                // Below the limit a missing triple has no attempt since the oldest bound. At the
                // limit it might have been cut off (not with `LIMIT 1 BY`): ask for it alone.
                None if reached_limit => {
                    for key in keys {
                        self.row_limit_fallbacks.fetch_add(1, Ordering::Relaxed);
                        if let Some(attempt) = self.latest_one(key).await? {
                            found.insert((*key).clone(), attempt);
                        }
                    }
                }
                None => {}
            }
        }
        Ok(())
    }

    /// Runs the batched query, with the lazy materialization limit unless the server has refused
    /// it before; a first refusal is remembered and the query sent again without it.
    async fn batch_rows(
        &self,
        chunk: &[(Triple, Vec<&AttemptKey>)],
        oldest_micros: i64,
    ) -> Result<Vec<AttemptRow>> {
        let triples: Vec<(&str, &str, String)> = chunk
            .iter()
            .map(|((tenant, event, destination), _)| {
                (tenant.as_str(), event.as_str(), destination.to_string())
            })
            .collect();
        self.fetch_all_tuned(
            "look up latest attempts",
            &self.lazy_limit,
            |with_lazy_limit| {
                self.client
                    .query(&batch_sql(chunk.len(), with_lazy_limit))
                    .bind(&triples)
                    .bind(oldest_micros)
            },
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_setting_is_only_in_the_lazy_variant() {
        let with = batch_sql(7, true);
        let without = batch_sql(7, false);
        assert!(with.ends_with(&format!("LIMIT 7 SETTINGS {LAZY_LIMIT_SETTING} = 7")));
        assert!(without.ends_with("LIMIT 7"));
        assert!(!without.contains(LAZY_LIMIT_SETTING));
    }
}
