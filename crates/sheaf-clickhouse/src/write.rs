//! Coalesced inserts: one [`WriteCoalescer`](sheaf_coalesce::WriteCoalescer) per table, each
//! writing what it gathered as one RowBinary `INSERT`.
//!
//! Every `INSERT` makes one part per partition it touches (5,210 parts of 58 rows on average when
//! every small batch was its own insert: docs/benchmarks.md, "parts", earlier measurements), so
//! `insert_many` never inserts itself: it hands its events to the `events` coalescer and its
//! attempts to the `attempts` coalescer and returns when both writes that carried them are done.
//! Parts are then bounded per wait window and per table, not per call. Two coalescers rather than
//! one mixed queue keep each table's bounds about that table's parts, and let the two inserts run
//! side by side.

use std::collections::HashSet;
use std::marker::PhantomData;
use std::time::Duration;

use clickhouse::{Client, Row, RowOwned, RowWrite};
use serde::Serialize;
use sheaf_coalesce::BatchWriter;
use sheaf_store::Error;

use crate::error::{from_driver, timed_out};
use crate::rows::{AttemptRow, EventRow};

/// A row that a [`TableWriter`] can insert.
pub(crate) trait InsertRow:
    Row + RowOwned + RowWrite + Serialize + Send + Sync + 'static
{
    /// The table it goes to.
    const TABLE: &'static str;
    /// Its identity: rows with equal identities are the same record.
    fn identity(&self) -> (&str, String);
    /// Its size as the coalescer's `max_bytes` counts it.
    fn encoded_len(&self) -> usize;
}

impl InsertRow for EventRow {
    const TABLE: &'static str = "events";
    fn identity(&self) -> (&str, String) {
        (&self.tenant_id, self.event_id.clone())
    }
    fn encoded_len(&self) -> usize {
        EventRow::encoded_len(self)
    }
}

impl InsertRow for AttemptRow {
    const TABLE: &'static str = "attempts";
    fn identity(&self) -> (&str, String) {
        (&self.tenant_id, self.attempt_id.to_string())
    }
    fn encoded_len(&self) -> usize {
        AttemptRow::encoded_len(self)
    }
}

/// Inserts gathered rows into one table.
pub(crate) struct TableWriter<R> {
    client: Client,
    timeout: Duration,
    rows: PhantomData<fn() -> R>,
}

impl<R> TableWriter<R> {
    /// `client` must have the store's database set.
    pub fn new(client: Client, timeout: Duration) -> Self {
        TableWriter {
            client,
            timeout,
            rows: PhantomData,
        }
    }
}

impl<R: InsertRow> TableWriter<R> {
    async fn insert(&self, records: Vec<R>) -> Result<(), Error> {
        let what = format!("insert into {}", R::TABLE);
        let mut insert = self
            .client
            .insert::<R>(R::TABLE)
            .await
            .map_err(|e| from_driver(&what, e))?;
        // A retried write repeats records, and several callers may hand off the same record in
        // one window. Sending each identity once keeps the part smaller; copies that still reach
        // the table in other writes are merged away later and deduplicated by every read.
        let mut seen = HashSet::with_capacity(records.len());
        for row in &records {
            let (tenant, id) = row.identity();
            if !seen.insert((tenant, id)) {
                continue;
            }
            insert.write(row).await.map_err(|e| from_driver(&what, e))?;
        }
        insert.end().await.map_err(|e| from_driver(&what, e))
    }
}

impl<R: InsertRow> BatchWriter for TableWriter<R> {
    type Record = R;
    type Error = Error;

    fn record_bytes(&self, record: &R) -> usize {
        record.encoded_len()
    }

    async fn write(&self, records: Vec<R>) -> Result<(), Error> {
        match tokio::time::timeout(self.timeout, self.insert(records)).await {
            Ok(result) => result,
            Err(_) => Err(timed_out(
                &format!("insert into {}", R::TABLE),
                self.timeout,
            )),
        }
    }
}
