//! Attempts counted per time bucket and status, for the portal's chart: one grouped query over
//! the tenant's window, which the `by_tenant_time` projection serves (ordered by tenant and
//! time), reading two small columns. Rows not merged yet are counted once: the inner query keeps
//! one row per attempt id.

use clickhouse::Row;
use serde::Deserialize;
use sheaf_store::{AttemptCounts, Buckets, Result, TenantId};

use crate::store::ClickHouseLogStore;

#[derive(Debug, Row, Deserialize)]
struct BucketRow {
    bucket: i64,
    success: u64,
    failed: u64,
    filtered: u64,
}

impl ClickHouseLogStore {
    pub(crate) async fn count_buckets(
        &self,
        tenant: &TenantId,
        buckets: &Buckets,
    ) -> Result<Vec<AttemptCounts>> {
        let since = buckets.since.as_micros();
        let rows: Vec<BucketRow> = self
            .timed(
                "count attempts",
                self.client
                    .query(
                        "SELECT intDiv(toUnixTimestamp64Micro(time) - ?, ?) AS bucket, \
                                countIf(status = 'success') AS success, \
                                countIf(status = 'failed') AS failed, \
                                countIf(status = 'filtered') AS filtered \
                         FROM ( \
                            SELECT attempt_id, any(attempt_time) AS time, any(status) AS status \
                            FROM attempts \
                            WHERE tenant_id = ? \
                              AND attempt_time >= fromUnixTimestamp64Micro(?, 'UTC') \
                              AND attempt_time < fromUnixTimestamp64Micro(?, 'UTC') \
                            GROUP BY attempt_id) \
                         GROUP BY bucket",
                    )
                    .bind(since)
                    .bind(buckets.width.as_micros() as i64)
                    .bind(tenant.as_str())
                    .bind(since)
                    .bind(buckets.until().as_micros())
                    .fetch_all(),
            )
            .await?;
        let mut counts = buckets.empty();
        for row in rows {
            if let Some(c) = usize::try_from(row.bucket)
                .ok()
                .and_then(|i| counts.get_mut(i))
            {
                c.success = row.success;
                c.failed = row.failed;
                c.filtered = row.filtered;
            }
        }
        Ok(counts)
    }
}
