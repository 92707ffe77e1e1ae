//! ClickHouse helpers the suites share: dropping a scratch database from a destructor, and the
//! time-ordered attempts table that Sheaf's layout is measured against.

use std::time::Duration;

use ::clickhouse::Client;

/// Drops `database` on the server at `url` (`DROP DATABASE IF EXISTS … SYNC`), waiting at most
/// `timeout`; for the guards that own a test's or a benchmark's database and drop it in their
/// `Drop`. That may run inside the caller's runtime, which cannot be blocked on, so a thread
/// with a runtime of its own sends the statement.
///
/// # Errors
/// What went wrong, as text for the caller's message: no runtime, no answer in time, or the
/// server's refusal.
pub fn drop_database_blocking(url: &str, database: &str, timeout: Duration) -> Result<(), String> {
    let (url, database) = (url.to_owned(), database.to_owned());
    let dropped = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("no runtime for the drop: {e}"))?;
        runtime.block_on(async {
            let drop = Client::default()
                .with_url(url)
                .query_raw(&format!("DROP DATABASE IF EXISTS {database} SYNC"))
                .execute();
            match tokio::time::timeout(timeout, drop).await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err(format!("no answer within {timeout:?}")),
            }
        })
    })
    .join();
    dropped.unwrap_or_else(|_| Err("the thread dropping it panicked".to_owned()))
}

/// The attempts table in the time-ordered layout: Sheaf's attempts columns, the row holding the
/// payload, ordered by `(attempt_time, attempt_id)` and partitioned by month, with the default
/// index granularity (8,192 rows), no projection and no skip index. It is the layout a log of
/// attempts gets when it is designed for appending and for reading by time, and the baseline
/// Sheaf's own layout (ordered by the lookup key, with small granules) is compared with: a
/// latest-attempt lookup there reads whole granules of payloads, because nothing in the key
/// narrows where an event's attempts are. `docs/benchmarks.md` ("`lookup`") has the figures.
///
/// The queries are the two shapes Sheaf's store sends, written for this table: one key at a
/// time, and a batch (the latest `(time, id)` per key, then those rows under an outer `LIMIT`
/// with the lazy-materialization limit).
pub mod time_ordered {
    use ::clickhouse::Client;
    use sheaf_store::AttemptKey;

    /// The table's name, in the caller's database.
    pub const TABLE: &str = "attempts_time_ordered";

    /// Creates [`TABLE`] with the columns of `source` (Sheaf's `attempts` table), their names,
    /// types and order, and nothing else of it: no skip index, no projection, no settings.
    pub fn create_table(source: &str) -> String {
        format!(
            "CREATE TABLE {TABLE} ENGINE = MergeTree \
             PARTITION BY toYYYYMM(attempt_time) ORDER BY (attempt_time, attempt_id) \
             EMPTY AS SELECT * FROM {source}"
        )
    }

    /// Copies every row of `source` (the table [`create_table`] took its columns from) into
    /// [`TABLE`].
    pub fn copy_from(source: &str) -> String {
        format!("INSERT INTO {TABLE} SELECT * FROM {source}")
    }

    /// The single-key lookup: the latest attempt of one key at or after its time.
    pub const SINGLE: &str = "SELECT * FROM attempts_time_ordered \
        WHERE tenant_id = ? AND event_id = ? AND destination_id = ? \
            AND attempt_time >= fromUnixTimestamp64Micro(?, 'UTC') \
        ORDER BY attempt_time DESC, toString(attempt_id) DESC LIMIT 1";

    /// The batched lookup of `limit` keys: the latest `(time, id)` per key under the oldest
    /// key's time, then those rows, under an outer `LIMIT` with the lazy-materialization limit.
    pub fn batch(limit: usize) -> String {
        format!(
            "SELECT * FROM attempts_time_ordered \
             WHERE (tenant_id, event_id, destination_id, attempt_time, attempt_id) IN ( \
                SELECT tenant_id, event_id, destination_id, \
                    argMax(attempt_time, (attempt_time, toString(attempt_id))), \
                    argMax(attempt_id, (attempt_time, toString(attempt_id))) \
                FROM attempts_time_ordered \
                WHERE (tenant_id, event_id, destination_id) IN ? \
                    AND attempt_time >= fromUnixTimestamp64Micro(?, 'UTC') \
                GROUP BY tenant_id, event_id, destination_id) \
             AND attempt_time >= fromUnixTimestamp64Micro(?, 'UTC') \
             ORDER BY attempt_time DESC LIMIT {limit} \
             SETTINGS query_plan_max_limit_for_lazy_materialization = {limit}"
        )
    }

    /// What a batched lookup binds: the keys' `(tenant, event, destination)` triples, and the
    /// oldest key's time in microseconds (the batch's lower bound).
    pub fn batch_binds(keys: &[AttemptKey]) -> (Vec<(&str, &str, String)>, i64) {
        let triples = keys
            .iter()
            .map(|k| {
                (
                    k.tenant_id.as_str(),
                    k.event_id.as_str(),
                    k.destination_id.to_string(),
                )
            })
            .collect();
        let oldest = keys
            .iter()
            .map(|k| k.attempt_time.as_micros())
            .min()
            .unwrap_or(0);
        (triples, oldest)
    }

    /// Looks `keys` up in [`TABLE`] through `client` ([`SINGLE`] for one key, [`batch`] for
    /// more) and returns the answer in ClickHouse's output `format` (`TabSeparated` to count
    /// rows, `Null` to measure the server alone).
    ///
    /// # Errors
    /// The client's error when the query fails.
    pub async fn lookup(
        client: &Client,
        keys: &[AttemptKey],
        format: &str,
    ) -> ::clickhouse::error::Result<bytes::Bytes> {
        if let [key] = keys {
            client
                .query(SINGLE)
                .bind(key.tenant_id.as_str())
                .bind(key.event_id.as_str())
                .bind(key.destination_id.to_string())
                .bind(key.attempt_time.as_micros())
                .fetch_bytes(format)?
                .collect()
                .await
        } else {
            let (triples, oldest) = batch_binds(keys);
            client
                .query(&batch(keys.len()))
                .bind(triples)
                .bind(oldest)
                .bind(oldest)
                .fetch_bytes(format)?
                .collect()
                .await
        }
    }
}
