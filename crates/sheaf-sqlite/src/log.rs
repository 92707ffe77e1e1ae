//! [`SqliteLogStore`]: events and attempts in two tables, written through the writer (one
//! savepoint per batch inside the flush's transaction) and read on the reader pool with keyset
//! pagination and a one-statement latest-attempt lookup.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::str::FromStr;

use async_trait::async_trait;
use rusqlite::{Connection, params};
use sheaf_store::{
    Attempt, AttemptCounts, AttemptFilter, AttemptId, AttemptKey, AttemptStatus, AttemptTrigger,
    Buckets, Cursor, DestinationId, Event, EventFilter, EventId, EventKey, LogStore, Page,
    PageRequest, Payload, Result, TenantId, TraceContext,
};
use sqlx::{QueryBuilder, Sqlite};

use crate::db::{Columns, Db, get, get_time, get_u32, get_uuid, uuid_text};
use crate::error::{Doing, decode, from_sqlx};
use crate::retention::{self, LogRetention};

/// Most keys one latest-attempt statement carries; larger calls are split. The keys travel as
/// one JSON parameter, so the bound is about the statement's run time, not SQLite's limit on
/// parameters; the trait asks for at least 1,000.
const LATEST_KEYS_PER_STATEMENT: usize = 1000;

/// The attempt columns every read returns, from `attempts AS a`, plus the event's data and
/// trace context from `events AS e`.
const ATTEMPT_COLUMNS: &str = "a.tenant_id, a.attempt_id, a.event_id, a.destination_id, a.number, \
     a.attempt_time, a.status, a.trigger, a.response_code, a.duration_ms, a.response_body, \
     a.error, a.event_topic, e.data, e.traceparent, e.tracestate";

/// The event columns every read returns (`event_from_row`).
pub(crate) const EVENT_COLUMNS: &str =
    "tenant_id, event_id, topic, event_time, data, traceparent, tracestate";

const INSERT_EVENT: &str = "INSERT INTO events
     (tenant_id, event_id, topic, event_time, data, traceparent, tracestate)
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
     ON CONFLICT (tenant_id, event_id) DO NOTHING";

const INSERT_ATTEMPT: &str = "INSERT INTO attempts
     (tenant_id, attempt_id, event_id, destination_id, number, attempt_time, status, trigger,
      response_code, duration_ms, response_body, error, event_topic)
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)
     ON CONFLICT (tenant_id, attempt_id) DO NOTHING";

/// `LogStore::latest_attempts` as one statement: the keys arrive as one JSON array of
/// `[tenant, event, destination, since]`, and for each a correlated subquery probes
/// `attempts_latest` for its first entry at or after its own bound. The event joins with an inner
/// join: an attempt is only useful to a retry with its payload, and the service writes the event
/// first, so a key whose event is gone reads as "not logged yet". `ord` maps rows back to keys.
const LATEST_ATTEMPTS: &str = "SELECT a.tenant_id, a.attempt_id, a.event_id, a.destination_id, \
     a.number, a.attempt_time, a.status, a.trigger, a.response_code, a.duration_ms, \
     a.response_body, a.error, a.event_topic, e.data, e.traceparent, e.tracestate, k.key AS ord
     FROM json_each(?1) AS k
     JOIN attempts AS a ON a.rowid = (
         SELECT l.rowid FROM attempts AS l
         WHERE l.tenant_id = k.value ->> 0 AND l.event_id = k.value ->> 1
           AND l.destination_id = k.value ->> 2 AND l.attempt_time >= k.value ->> 3
         ORDER BY l.attempt_time DESC, l.attempt_id DESC
         LIMIT 1)
     JOIN events AS e ON e.tenant_id = a.tenant_id AND e.event_id = a.event_id";

const LATEST_ATTEMPT: &str = "SELECT a.tenant_id, a.attempt_id, a.event_id, a.destination_id, \
     a.number, a.attempt_time, a.status, a.trigger, a.response_code, a.duration_ms, \
     a.response_body, a.error, a.event_topic, e.data, e.traceparent, e.tracestate
     FROM attempts AS a
     JOIN events AS e ON e.tenant_id = a.tenant_id AND e.event_id = a.event_id
     WHERE a.tenant_id = ?1 AND a.event_id = ?2 AND a.destination_id = ?3 AND a.attempt_time >= ?4
     ORDER BY a.attempt_time DESC, a.attempt_id DESC
     LIMIT 1";

/// `get_events` as one statement over a JSON array of `[tenant, event]`.
pub(crate) const GET_EVENTS: &str =
    "SELECT e.tenant_id, e.event_id, e.topic, e.event_time, e.data, \
     e.traceparent, e.tracestate
     FROM json_each(?1) AS k
     JOIN events AS e ON e.tenant_id = k.value ->> 0 AND e.event_id = k.value ->> 1";

/// The log store on SQLite. Cheap to clone; every clone shares the connections.
#[derive(Clone)]
pub struct SqliteLogStore {
    db: Db,
    retention: LogRetention,
}

impl fmt::Debug for SqliteLogStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteLogStore")
            .field("path", &self.db.path)
            .finish_non_exhaustive()
    }
}

impl SqliteLogStore {
    pub(crate) fn new(db: Db, retention: LogRetention) -> Self {
        SqliteLogStore { db, retention }
    }

    /// The plan SQLite chooses for [`LogStore::latest_attempts`], from `EXPLAIN QUERY PLAN`, one
    /// line per step: for the test that proves each key is one index probe.
    pub async fn explain_latest_attempts(&self) -> Result<Vec<String>> {
        let rows = sqlx::query(&format!("EXPLAIN QUERY PLAN {LATEST_ATTEMPTS}"))
            .bind("[]")
            .fetch_all(&self.db.readers)
            .await
            .map_err(|e| from_sqlx("explaining the latest-attempt lookup", e))?;
        rows.iter()
            .map(|row| get::<String>(row, "detail"))
            .collect()
    }

    async fn latest_chunk(
        &self,
        keys: &[&AttemptKey],
        found: &mut HashMap<AttemptKey, Attempt>,
    ) -> Result<()> {
        let json: Vec<serde_json::Value> = keys
            .iter()
            .map(|k| {
                serde_json::json!([
                    k.tenant_id.as_str(),
                    k.event_id.as_str(),
                    uuid_text(k.destination_id.as_uuid()),
                    k.attempt_time.as_micros(),
                ])
            })
            .collect();
        let rows = sqlx::query(LATEST_ATTEMPTS)
            .bind(serde_json::Value::Array(json).to_string())
            .fetch_all(&self.db.readers)
            .await
            .map_err(|e| from_sqlx("looking up latest attempts", e))?;
        for row in rows {
            let ord: i64 = get(&row, "ord")?;
            let key = usize::try_from(ord)
                .ok()
                .and_then(|i| keys.get(i))
                .ok_or_else(|| decode("looking up latest attempts", "key index out of range"))?;
            found.insert((*key).clone(), attempt_from_row(&row)?);
        }
        Ok(())
    }
}

/// Keeps the first record of each identity, in order.
pub(crate) fn dedupe<T: Clone, K: std::hash::Hash + Eq>(
    records: &[T],
    key: impl Fn(&T) -> K,
) -> Vec<T> {
    let mut seen = HashSet::with_capacity(records.len());
    records
        .iter()
        .filter(|r| seen.insert(key(r)))
        .cloned()
        .collect()
}

/// The bytes a batch writes, roughly, for the coalescer's bound.
pub(crate) fn batch_bytes(events: &[Event], attempts: &[Attempt]) -> usize {
    let events: usize = events.iter().map(|e| 128 + e.data.to_string().len()).sum();
    let attempts: usize = attempts
        .iter()
        .map(|a| 256 + a.response_body.as_ref().map_or(0, String::len))
        .sum();
    events + attempts
}

/// Inserts `events`, skipping identities already stored, on the writer connection; returns how
/// many were new.
pub(crate) fn insert_events(connection: &Connection, events: &[Event]) -> Result<u64> {
    let doing = "inserting events";
    let mut statement = connection.prepare_cached(INSERT_EVENT).doing(doing)?;
    let mut inserted = 0;
    for event in events {
        let data = serde_json::to_string(event.data.value())
            .map_err(|e| sheaf_store::Error::invalid_input(format!("event data: {e}")))?;
        inserted += statement
            .execute(params![
                event.tenant_id.as_str(),
                event.id.as_str(),
                event.topic.as_str(),
                event.time.as_micros(),
                data,
                event.trace.as_ref().map(TraceContext::traceparent),
                event.trace.as_ref().and_then(TraceContext::tracestate),
            ])
            .doing(doing)?;
    }
    Ok(inserted as u64)
}

/// Inserts `attempts`, skipping identities already stored, on the writer connection.
pub(crate) fn insert_attempts(connection: &Connection, attempts: &[Attempt]) -> Result<()> {
    let doing = "inserting attempts";
    let mut statement = connection.prepare_cached(INSERT_ATTEMPT).doing(doing)?;
    for a in attempts {
        statement
            .execute(params![
                a.tenant_id.as_str(),
                uuid_text(a.id.as_uuid()),
                a.event_id.as_str(),
                uuid_text(a.destination_id.as_uuid()),
                i64::from(a.number),
                a.time.as_micros(),
                a.status.as_str(),
                a.trigger.as_str(),
                a.response_code.map(i64::from),
                i64::from(a.duration_ms),
                a.response_body.as_deref(),
                a.error.as_deref(),
                a.event_topic.as_str(),
            ])
            .doing(doing)?;
    }
    Ok(())
}

pub(crate) fn event_from_row(row: &impl Columns) -> Result<Event> {
    let data: String = get(row, "data")?;
    let data: serde_json::Value =
        serde_json::from_str(&data).map_err(|e| decode("reading an event's data", e))?;
    Ok(Event {
        tenant_id: TenantId::new(get::<String>(row, "tenant_id")?)?,
        id: EventId::new(get::<String>(row, "event_id")?)?,
        topic: get(row, "topic")?,
        time: get_time(row, "event_time")?,
        data: Payload::new(data),
        trace: trace_from_row(row)?,
    })
}

/// The `traceparent` and `tracestate` columns as the event's trace context.
fn trace_from_row(row: &impl Columns) -> Result<Option<TraceContext>> {
    let parent: Option<String> = get(row, "traceparent")?;
    let state: Option<String> = get(row, "tracestate")?;
    parent
        .map(|parent| {
            TraceContext::new(&parent, state.as_deref())
                .map_err(|e| decode("reading a trace context", e))
        })
        .transpose()
}

pub(crate) fn attempt_from_row(row: &impl Columns) -> Result<Attempt> {
    let reading = "reading an attempt";
    let status: String = get(row, "status")?;
    let trigger: String = get(row, "trigger")?;
    let response_code: Option<i64> = get(row, "response_code")?;
    let response_code = response_code
        .map(|code| u16::try_from(code).map_err(|_| decode(reading, "response code out of range")))
        .transpose()?;
    // `None` only when the attempt's event is missing (the listings join it with a left join);
    // the service writes events first, so this is a record damaged by hand.
    let data: Option<String> = get(row, "data")?;
    let data = match data {
        Some(text) => serde_json::from_str(&text).map_err(|e| decode(reading, e))?,
        None => serde_json::Value::Null,
    };
    Ok(Attempt {
        tenant_id: TenantId::new(get::<String>(row, "tenant_id")?)?,
        id: AttemptId::from_uuid(get_uuid(row, "attempt_id")?),
        event_id: EventId::new(get::<String>(row, "event_id")?)?,
        destination_id: DestinationId::from_uuid(get_uuid(row, "destination_id")?),
        number: get_u32(row, "number")?,
        time: get_time(row, "attempt_time")?,
        status: AttemptStatus::from_str(&status).map_err(|e| decode(reading, e))?,
        trigger: AttemptTrigger::from_str(&trigger).map_err(|e| decode(reading, e))?,
        response_code,
        duration_ms: get_u32(row, "duration_ms")?,
        response_body: get(row, "response_body")?,
        error: get(row, "error")?,
        event_topic: get(row, "event_topic")?,
        event_data: Payload::new(data),
        event_trace: trace_from_row(row)?,
    })
}

/// Runs a `GET_EVENTS`-shaped statement for the distinct `keys`; the log store and the outbox
/// share it.
pub(crate) async fn events_by_key(
    db: &Db,
    sql: &str,
    keys: &[EventKey],
    doing: &str,
) -> Result<HashMap<EventKey, Event>> {
    let mut seen = HashSet::with_capacity(keys.len());
    let unique: Vec<serde_json::Value> = keys
        .iter()
        .filter(|k| seen.insert(*k))
        .map(|k| serde_json::json!([k.tenant_id.as_str(), k.event_id.as_str()]))
        .collect();
    if unique.is_empty() {
        return Ok(HashMap::new());
    }
    let rows = sqlx::query(sql)
        .bind(serde_json::Value::Array(unique).to_string())
        .fetch_all(&db.readers)
        .await
        .map_err(|e| from_sqlx(doing, e))?;
    rows.iter()
        .map(|row| event_from_row(row).map(|event| (event.key(), event)))
        .collect()
}

/// `limit + 1`, as the integer a `LIMIT` binds.
fn limit_plus_one(page: &PageRequest) -> i64 {
    i64::from(page.limit) + 1
}

#[async_trait]
impl LogStore for SqliteLogStore {
    async fn insert_many(&self, events: &[Event], attempts: &[Attempt]) -> Result<()> {
        let events = dedupe(events, |e| (e.tenant_id.clone(), e.id.clone()));
        let attempts = dedupe(attempts, |a| (a.tenant_id.clone(), a.id));
        if events.is_empty() && attempts.is_empty() {
            return Ok(());
        }
        // Attempts alone are deliveries' records, which the size cap's reserve is kept for.
        if !events.is_empty() {
            self.db.admit("inserting events")?;
        }
        let bytes = batch_bytes(&events, &attempts);
        self.db
            .writer
            .run("inserting events and attempts", bytes, move |c| {
                insert_events(c, &events)?;
                insert_attempts(c, &attempts)
            })
            .await
    }

    async fn get_event(&self, tenant: &TenantId, id: &EventId) -> Result<Option<Event>> {
        let row = sqlx::query(&format!(
            "SELECT {EVENT_COLUMNS} FROM events WHERE tenant_id = ?1 AND event_id = ?2"
        ))
        .bind(tenant.as_str())
        .bind(id.as_str())
        .fetch_optional(&self.db.readers)
        .await
        .map_err(|e| from_sqlx("reading an event", e))?;
        row.as_ref().map(event_from_row).transpose()
    }

    async fn get_events(&self, keys: &[EventKey]) -> Result<HashMap<EventKey, Event>> {
        events_by_key(&self.db, GET_EVENTS, keys, "reading events").await
    }

    async fn list_events(
        &self,
        tenant: &TenantId,
        filter: &EventFilter,
        page: &PageRequest,
    ) -> Result<Page<Event>> {
        page.validate()?;
        let cursor = page.cursor_position(|id| EventId::new(id))?;
        // Only the filters given become predicates, so each combination is its own prepared
        // statement with a plan fitted to it.
        let mut q = QueryBuilder::<Sqlite>::new(format!(
            "SELECT {EVENT_COLUMNS} FROM events WHERE tenant_id = "
        ));
        q.push_bind(tenant.as_str());
        if let Some(topic) = &filter.topic {
            q.push(" AND topic = ").push_bind(topic.as_str());
        }
        if let Some(since) = filter.time.since {
            q.push(" AND event_time >= ").push_bind(since.as_micros());
        }
        if let Some(until) = filter.time.until {
            q.push(" AND event_time < ").push_bind(until.as_micros());
        }
        if let Some((time, id)) = &cursor {
            q.push(" AND (event_time, event_id) < (")
                .push_bind(time.as_micros())
                .push(", ")
                .push_bind(id.as_str())
                .push(")");
        }
        q.push(" ORDER BY event_time DESC, event_id DESC LIMIT ")
            .push_bind(limit_plus_one(page));
        let rows = q
            .build()
            .fetch_all(&self.db.readers)
            .await
            .map_err(|e| from_sqlx("listing events", e))?;
        let items = rows
            .iter()
            .map(event_from_row)
            .collect::<Result<Vec<_>>>()?;
        Ok(Page::from_overfetch(
            items,
            page.limit_usize(),
            |e: &Event| Cursor::new(e.time, e.id.as_str()),
        ))
    }

    async fn get_attempt(&self, tenant: &TenantId, id: &AttemptId) -> Result<Option<Attempt>> {
        let row = sqlx::query(&format!(
            "SELECT {ATTEMPT_COLUMNS} FROM attempts AS a
             LEFT JOIN events AS e ON e.tenant_id = a.tenant_id AND e.event_id = a.event_id
             WHERE a.tenant_id = ?1 AND a.attempt_id = ?2"
        ))
        .bind(tenant.as_str())
        .bind(uuid_text(id.as_uuid()))
        .fetch_optional(&self.db.readers)
        .await
        .map_err(|e| from_sqlx("reading an attempt", e))?;
        row.as_ref().map(attempt_from_row).transpose()
    }

    async fn list_attempts(
        &self,
        tenant: &TenantId,
        filter: &AttemptFilter,
        page: &PageRequest,
    ) -> Result<Page<Attempt>> {
        page.validate()?;
        let cursor = page.cursor_position(AttemptId::from_str)?;
        let mut q = QueryBuilder::<Sqlite>::new(format!(
            "SELECT {ATTEMPT_COLUMNS} FROM attempts AS a
             LEFT JOIN events AS e ON e.tenant_id = a.tenant_id AND e.event_id = a.event_id
             WHERE a.tenant_id = "
        ));
        q.push_bind(tenant.as_str());
        if let Some(event) = &filter.event_id {
            q.push(" AND a.event_id = ").push_bind(event.as_str());
        }
        if let Some(destination) = filter.destination_id {
            q.push(" AND a.destination_id = ")
                .push_bind(uuid_text(destination.as_uuid()));
        }
        if let Some(status) = filter.status {
            // A literal, not a parameter: the planner can only match the partial index on
            // failures against a constant.
            q.push(match status {
                AttemptStatus::Failed => " AND a.status = 'failed'",
                AttemptStatus::Success => " AND a.status = 'success'",
                AttemptStatus::Filtered => " AND a.status = 'filtered'",
            });
        }
        if let Some(topic) = &filter.topic {
            q.push(" AND a.event_topic = ").push_bind(topic.as_str());
        }
        if let Some(since) = filter.time.since {
            q.push(" AND a.attempt_time >= ")
                .push_bind(since.as_micros());
        }
        if let Some(until) = filter.time.until {
            q.push(" AND a.attempt_time < ")
                .push_bind(until.as_micros());
        }
        if let Some((time, id)) = &cursor {
            q.push(" AND (a.attempt_time, a.attempt_id) < (")
                .push_bind(time.as_micros())
                .push(", ")
                .push_bind(uuid_text(id.as_uuid()))
                .push(")");
        }
        q.push(" ORDER BY a.attempt_time DESC, a.attempt_id DESC LIMIT ")
            .push_bind(limit_plus_one(page));
        let rows = q
            .build()
            .fetch_all(&self.db.readers)
            .await
            .map_err(|e| from_sqlx("listing attempts", e))?;
        let items = rows
            .iter()
            .map(attempt_from_row)
            .collect::<Result<Vec<_>>>()?;
        Ok(Page::from_overfetch(
            items,
            page.limit_usize(),
            |a: &Attempt| Cursor::new(a.time, a.id.to_string()),
        ))
    }

    async fn latest_attempt(&self, key: &AttemptKey) -> Result<Option<Attempt>> {
        let row = sqlx::query(LATEST_ATTEMPT)
            .bind(key.tenant_id.as_str())
            .bind(key.event_id.as_str())
            .bind(uuid_text(key.destination_id.as_uuid()))
            .bind(key.attempt_time.as_micros())
            .fetch_optional(&self.db.readers)
            .await
            .map_err(|e| from_sqlx("looking up the latest attempt", e))?;
        row.as_ref().map(attempt_from_row).transpose()
    }

    async fn latest_attempts(&self, keys: &[AttemptKey]) -> Result<HashMap<AttemptKey, Attempt>> {
        let mut seen = HashSet::with_capacity(keys.len());
        let unique: Vec<&AttemptKey> = keys.iter().filter(|k| seen.insert(*k)).collect();
        let mut found = HashMap::with_capacity(unique.len());
        for chunk in unique.chunks(LATEST_KEYS_PER_STATEMENT) {
            self.latest_chunk(chunk, &mut found).await?;
        }
        Ok(found)
    }

    /// One grouped scan of `attempts_by_tenant_time` over the window.
    async fn count_attempts(
        &self,
        tenant: &TenantId,
        buckets: &Buckets,
    ) -> Result<Vec<AttemptCounts>> {
        let rows = sqlx::query(
            "SELECT (attempt_time - ?2) / ?4 AS bucket,
                    sum(status = 'success') AS success,
                    sum(status = 'failed') AS failed,
                    sum(status = 'filtered') AS filtered
             FROM attempts
             WHERE tenant_id = ?1 AND attempt_time >= ?2 AND attempt_time < ?3
             GROUP BY bucket",
        )
        .bind(tenant.as_str())
        .bind(buckets.since.as_micros())
        .bind(buckets.until().as_micros())
        .bind(i64::try_from(buckets.width.as_micros()).unwrap_or(i64::MAX))
        .fetch_all(&self.db.readers)
        .await
        .map_err(|e| from_sqlx("counting attempts", e))?;
        let mut counts = buckets.empty();
        for row in &rows {
            let bucket: i64 = get(row, "bucket")?;
            if let Some(c) = usize::try_from(bucket).ok().and_then(|i| counts.get_mut(i)) {
                c.success = u64::try_from(get::<i64>(row, "success")?).unwrap_or(0);
                c.failed = u64::try_from(get::<i64>(row, "failed")?).unwrap_or(0);
                c.filtered = u64::try_from(get::<i64>(row, "filtered")?).unwrap_or(0);
            }
        }
        Ok(counts)
    }

    async fn ping(&self) -> Result<()> {
        self.db.ping("log store").await
    }

    /// Enforces [`LogRetention`] in batches behind the writer and reuses the space it frees
    /// (see `retention.rs`).
    async fn maintain(&self) -> Result<bool> {
        retention::enforce(&self.db, self.retention).await
    }
}
