//! [`PostgresLogStore`]: events and attempts in two tables, written in one statement per batch and
//! read with keyset pagination and a `LATERAL` latest-attempt lookup.
//!
//! Longer than 600 lines because every SQL statement of the store sits beside the code that
//! binds its arrays and reads its rows, so a statement's columns and their use are read in one
//! place.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::str::FromStr;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sheaf_store::{
    Attempt, AttemptCounts, AttemptFilter, AttemptId, AttemptKey, AttemptStatus, AttemptTrigger,
    Buckets, Cursor, DestinationId, Event, EventFilter, EventId, EventKey, LogStore, Page,
    PageRequest, Payload, Result, TenantId, TraceContext,
};
use sqlx::postgres::PgRow;
use sqlx::types::Json;
use sqlx::{Postgres, QueryBuilder};
use uuid::Uuid;

use crate::db::{Db, get, get_time, get_u32, pg_text, planned_each_time};
use crate::error::{decode, from_sqlx};

/// Most keys one latest-attempt statement carries; larger calls are split. At the 20–50 µs per key
/// measured on this machine for batched lookups (docs/benchmarks.md, "lookup": ~20 µs in the
/// earlier measurements, 30–50 µs per key of a 100-key statement in the benchmark) a full
/// statement takes some 20–50 ms, far inside the statement timeout, and the trait asks for at
/// least 1,000.
const LATEST_KEYS_PER_STATEMENT: usize = 1000;

/// The attempt columns every read returns, from `attempts AS a`, plus the event's data and
/// trace context from `events AS e`.
const ATTEMPT_COLUMNS: &str = "a.tenant_id, a.attempt_id, a.event_id, a.destination_id, a.number, \
     a.attempt_time, a.status, a.trigger, a.response_code, a.duration_ms, a.response_body, \
     a.error, a.event_topic, e.data, e.traceparent, e.tracestate";

/// The event columns every read returns (`event_from_row`).
pub(crate) const EVENT_COLUMNS: &str =
    "tenant_id, event_id, topic, event_time, data, traceparent, tracestate";

/// The event arrays `bind_events` binds, from parameter `$first`, as `unnest(…)`'s arguments.
pub(crate) fn event_arrays(first: usize) -> String {
    [
        "text",
        "text",
        "text",
        "timestamptz",
        "text",
        "text",
        "text",
    ]
    .iter()
    .enumerate()
    .map(|(i, ty)| format!("${}::{ty}[]", first + i))
    .collect::<Vec<_>>()
    .join(", ")
}

/// `INSERT INTO {s}.{table}` of the thirteen attempt columns (`bind_attempts`), unnested from
/// parameters `$first`…, with `tail` after (the log's skips attempt ids it has). The log's
/// `attempts` and the outbox's `outbox_attempts` share it.
pub(crate) fn insert_attempts_into(s: &str, table: &str, first: usize, tail: &str) -> String {
    let params: Vec<String> = [
        "text",
        "uuid",
        "text",
        "uuid",
        "bigint",
        "timestamptz",
        "text",
        "text",
        "integer",
        "bigint",
        "text",
        "text",
        "text",
    ]
    .iter()
    .enumerate()
    .map(|(i, ty)| format!("${}::{ty}[]", first + i))
    .collect();
    format!(
        "INSERT INTO {s}.{table} (tenant_id, attempt_id, event_id, destination_id, number,
             attempt_time, status, trigger, response_code, duration_ms, response_body,
             error, event_topic)
         SELECT * FROM unnest({}) {tail}",
        params.join(", ")
    )
}

/// The statements whose text does not depend on the call, built once per store.
#[derive(Debug)]
struct Statements {
    insert_events: String,
    insert_attempts: String,
    insert_both: String,
    get_event: String,
    get_events: String,
    get_attempt: String,
    latest_attempt: String,
    latest_attempts: String,
}

impl Statements {
    fn new(s: &str) -> Self {
        let insert_events = format!(
            "INSERT INTO {s}.events ({EVENT_COLUMNS})
             SELECT tenant_id, event_id, topic, event_time, data::json, traceparent, tracestate
             FROM unnest({}) AS u({EVENT_COLUMNS})
             ON CONFLICT (tenant_id, event_id) DO NOTHING",
            event_arrays(1)
        );
        let attempts_from = |p: usize| {
            insert_attempts_into(
                s,
                "attempts",
                p,
                "ON CONFLICT (tenant_id, attempt_id) DO NOTHING",
            )
        };
        // Both tables in one statement: one round trip and one commit per batch, and the
        // attempts never become visible without their events.
        let insert_both = format!("WITH new_events AS ({insert_events}) {}", attempts_from(8));
        let attempts_join = format!(
            "LEFT JOIN {s}.events AS e ON e.tenant_id = a.tenant_id AND e.event_id = a.event_id"
        );
        Statements {
            insert_attempts: attempts_from(1),
            insert_both,
            get_event: format!(
                "SELECT {EVENT_COLUMNS} FROM {s}.events WHERE tenant_id = $1 AND event_id = $2"
            ),
            get_events: format!(
                "SELECT e.tenant_id, e.event_id, e.topic, e.event_time, e.data, e.traceparent,
                        e.tracestate
                 FROM unnest($1::text[], $2::text[]) AS k(tenant_id, event_id)
                 JOIN {s}.events AS e ON e.tenant_id = k.tenant_id AND e.event_id = k.event_id"
            ),
            get_attempt: format!(
                "SELECT {ATTEMPT_COLUMNS} FROM {s}.attempts AS a {attempts_join}
                 WHERE a.tenant_id = $1 AND a.attempt_id = $2"
            ),
            // The lookups join the event with an inner join: an attempt is only useful to a retry
            // with its payload, and the service always writes the event first (sheaf_store's
            // `Attempt` docs). A key whose event is gone reads as "not logged yet".
            latest_attempt: format!(
                "SELECT {ATTEMPT_COLUMNS}
                 FROM (SELECT * FROM {s}.attempts
                       WHERE tenant_id = $1 AND event_id = $2 AND destination_id = $3
                         AND attempt_time >= $4
                       ORDER BY attempt_time DESC, attempt_id DESC
                       LIMIT 1) AS a
                 JOIN {s}.events AS e ON e.tenant_id = a.tenant_id AND e.event_id = a.event_id"
            ),
            // `LogStore::latest_attempts` as one statement: LATERAL over the unnested keys, each
            // with its own bound, so each key is one probe of `attempts_latest` that stops at its
            // first entry. `ord` maps rows back to keys.
            latest_attempts: format!(
                "SELECT {ATTEMPT_COLUMNS}, k.ord
                 FROM unnest($1::text[], $2::text[], $3::uuid[], $4::timestamptz[])
                      WITH ORDINALITY AS k(tenant_id, event_id, destination_id, since, ord)
                 CROSS JOIN LATERAL (
                     SELECT * FROM {s}.attempts AS l
                     WHERE l.tenant_id = k.tenant_id AND l.event_id = k.event_id
                       AND l.destination_id = k.destination_id AND l.attempt_time >= k.since
                     ORDER BY l.attempt_time DESC, l.attempt_id DESC
                     LIMIT 1) AS a
                 JOIN {s}.events AS e ON e.tenant_id = a.tenant_id AND e.event_id = a.event_id"
            ),
            insert_events,
        }
    }
}

/// The log store on Postgres. Cheap to clone; every clone shares the pool.
#[derive(Clone)]
pub struct PostgresLogStore {
    db: Db,
    sql: std::sync::Arc<Statements>,
}

impl fmt::Debug for PostgresLogStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresLogStore")
            .field("schema", &self.db.schema())
            .finish_non_exhaustive()
    }
}

impl PostgresLogStore {
    pub(crate) fn new(db: Db) -> Self {
        let sql = std::sync::Arc::new(Statements::new(db.schema()));
        PostgresLogStore { db, sql }
    }

    /// The statement that inserts attempts (13 column arrays, `bind_attempts`), for the outbox's
    /// settlements when this store's tables are the outbox.
    pub(crate) fn insert_attempts_sql(&self) -> &str {
        &self.sql.insert_attempts
    }

    /// The plan Postgres runs for [`LogStore::latest_attempts`] over `keys`, from
    /// `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)`: the same statement with the same parameters,
    /// executed (it only reads). For diagnostics, and for the test that proves each key is one
    /// index probe.
    pub async fn explain_latest_attempts(&self, keys: &[AttemptKey]) -> Result<serde_json::Value> {
        let unique = distinct(keys);
        let sql = format!(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {}",
            self.sql.latest_attempts
        );
        let columns = KeyColumns::new(&unique);
        let row = columns
            .bind(sqlx::query(&sql).persistent(false))
            .fetch_one(&self.db.pool)
            .await
            .map_err(|e| from_sqlx("explaining the latest-attempt lookup", e))?;
        let plan: Json<serde_json::Value> = get(&row, "QUERY PLAN")?;
        Ok(plan.0)
    }

    async fn latest_chunk(
        &self,
        keys: &[&AttemptKey],
        found: &mut HashMap<AttemptKey, Attempt>,
    ) -> Result<()> {
        let columns = KeyColumns::new(keys);
        let rows = columns
            .bind(sqlx::query(&self.sql.latest_attempts))
            .fetch_all(&self.db.pool)
            .await
            .map_err(|e| from_sqlx("looking up latest attempts", e))?;
        for row in rows {
            let ord: i64 = get(&row, "ord")?;
            let key = usize::try_from(ord - 1)
                .ok()
                .and_then(|i| keys.get(i))
                .ok_or_else(|| decode("looking up latest attempts", "ordinality out of range"))?;
            found.insert((*key).clone(), attempt_from_row(&row)?);
        }
        Ok(())
    }
}

/// The distinct keys of `keys`, in first-seen order.
fn distinct(keys: &[AttemptKey]) -> Vec<&AttemptKey> {
    let mut seen = HashSet::with_capacity(keys.len());
    keys.iter().filter(|k| seen.insert(*k)).collect()
}

/// Latest-attempt keys as the four parallel arrays the statement unnests.
struct KeyColumns<'a> {
    tenants: Vec<&'a str>,
    events: Vec<&'a str>,
    destinations: Vec<Uuid>,
    since: Vec<DateTime<Utc>>,
}

impl<'a> KeyColumns<'a> {
    fn new(keys: &[&'a AttemptKey]) -> Self {
        KeyColumns {
            tenants: keys.iter().map(|k| k.tenant_id.as_str()).collect(),
            events: keys.iter().map(|k| k.event_id.as_str()).collect(),
            destinations: keys.iter().map(|k| k.destination_id.as_uuid()).collect(),
            since: keys.iter().map(|k| k.attempt_time.as_datetime()).collect(),
        }
    }

    fn bind<'q>(
        &'q self,
        query: sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>,
    ) -> sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments> {
        query
            .bind(&self.tenants)
            .bind(&self.events)
            .bind(&self.destinations)
            .bind(&self.since)
    }
}

/// Runs `sql`, a `get_events` statement over `unnest($1::text[], $2::text[])` of tenant and event
/// ids returning the five event columns, for the distinct `keys`; the log store and the outbox
/// share it.
pub(crate) async fn events_by_key(
    db: &Db,
    sql: &str,
    keys: &[EventKey],
    doing: &str,
) -> Result<HashMap<EventKey, Event>> {
    let mut seen = HashSet::with_capacity(keys.len());
    let unique: Vec<&EventKey> = keys.iter().filter(|k| seen.insert(*k)).collect();
    if unique.is_empty() {
        return Ok(HashMap::new());
    }
    // The outbox's events swing from empty to a backlog: planned each time.
    let rows = planned_each_time(sql)
        .bind(
            unique
                .iter()
                .map(|k| k.tenant_id.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(
            unique
                .iter()
                .map(|k| k.event_id.as_str())
                .collect::<Vec<_>>(),
        )
        .fetch_all(&db.pool)
        .await
        .map_err(|e| from_sqlx(doing, e))?;
    rows.iter()
        .map(|row| event_from_row(row).map(|event| (event.key(), event)))
        .collect()
}

pub(crate) fn event_from_row(row: &PgRow) -> Result<Event> {
    let data: Json<serde_json::Value> = get(row, "data")?;
    Ok(Event {
        tenant_id: TenantId::new(get::<String>(row, "tenant_id")?)?,
        id: EventId::new(get::<String>(row, "event_id")?)?,
        topic: get(row, "topic")?,
        time: get_time(row, "event_time")?,
        data: Payload::new(data.0),
        trace: trace_from_row(row)?,
    })
}

/// The `traceparent` and `tracestate` columns as the event's trace context.
fn trace_from_row(row: &PgRow) -> Result<Option<TraceContext>> {
    let parent: Option<String> = get(row, "traceparent")?;
    let state: Option<String> = get(row, "tracestate")?;
    parent
        .map(|parent| {
            TraceContext::new(&parent, state.as_deref())
                .map_err(|e| decode("reading a trace context", e))
        })
        .transpose()
}

pub(crate) fn attempt_from_row(row: &PgRow) -> Result<Attempt> {
    let reading = "reading an attempt";
    let status: String = get(row, "status")?;
    let trigger: String = get(row, "trigger")?;
    let response_code: Option<i32> = get(row, "response_code")?;
    let response_code = response_code
        .map(|code| u16::try_from(code).map_err(|_| decode(reading, "response code out of range")))
        .transpose()?;
    // `None` only when the attempt's event is missing (the listings join it with a left join);
    // the service writes events first, so this is a record damaged by hand.
    let data: Option<Json<serde_json::Value>> = get(row, "data")?;
    Ok(Attempt {
        tenant_id: TenantId::new(get::<String>(row, "tenant_id")?)?,
        id: AttemptId::from_uuid(get(row, "attempt_id")?),
        event_id: EventId::new(get::<String>(row, "event_id")?)?,
        destination_id: DestinationId::from_uuid(get(row, "destination_id")?),
        number: get_u32(row, "number")?,
        time: get_time(row, "attempt_time")?,
        status: AttemptStatus::from_str(&status).map_err(|e| decode(reading, e))?,
        trigger: AttemptTrigger::from_str(&trigger).map_err(|e| decode(reading, e))?,
        response_code,
        duration_ms: get_u32(row, "duration_ms")?,
        response_body: get(row, "response_body")?,
        error: get(row, "error")?,
        event_topic: get(row, "event_topic")?,
        event_data: Payload::new(data.map_or(serde_json::Value::Null, |d| d.0)),
        event_trace: trace_from_row(row)?,
    })
}

/// Keeps the first record of each identity and sorts by it. Every writer then takes row locks in
/// the same order, so two batches that share records wait for each other instead of deadlocking.
pub(crate) fn dedupe_sorted<'a, T, K: Ord>(
    records: &'a [T],
    key: impl Fn(&'a T) -> K,
) -> Vec<&'a T> {
    let mut keyed: Vec<(K, usize, &T)> = records
        .iter()
        .enumerate()
        .map(|(i, r)| (key(r), i, r))
        .collect();
    keyed.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
    keyed.dedup_by(|later, first| later.0 == first.0);
    keyed.into_iter().map(|(_, _, r)| r).collect()
}

/// Binds the seven event columns (`event_arrays`).
pub(crate) fn bind_events<'q>(
    query: sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>,
    events: &[&'q Event],
) -> Result<sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>> {
    let data = events
        .iter()
        .map(|e| serde_json::to_string(e.data.value()))
        .collect::<Result<Vec<String>, _>>()
        .map_err(|e| sheaf_store::Error::invalid_input(format!("event data: {e}")))?;
    Ok(query
        .bind(
            events
                .iter()
                .map(|e| e.tenant_id.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(events.iter().map(|e| e.id.as_str()).collect::<Vec<_>>())
        .bind(events.iter().map(|e| e.topic.as_str()).collect::<Vec<_>>())
        .bind(
            events
                .iter()
                .map(|e| e.time.as_datetime())
                .collect::<Vec<_>>(),
        )
        .bind(data)
        .bind(
            events
                .iter()
                .map(|e| e.trace.as_ref().map(TraceContext::traceparent))
                .collect::<Vec<_>>(),
        )
        .bind(
            events
                .iter()
                .map(|e| e.trace.as_ref().and_then(TraceContext::tracestate))
                .collect::<Vec<_>>(),
        ))
}

/// Binds the thirteen attempt columns.
pub(crate) fn bind_attempts<'q>(
    query: sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>,
    attempts: &[&'q Attempt],
) -> sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments> {
    query
        .bind(
            attempts
                .iter()
                .map(|a| a.tenant_id.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(attempts.iter().map(|a| a.id.as_uuid()).collect::<Vec<_>>())
        .bind(
            attempts
                .iter()
                .map(|a| a.event_id.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(
            attempts
                .iter()
                .map(|a| a.destination_id.as_uuid())
                .collect::<Vec<_>>(),
        )
        .bind(
            attempts
                .iter()
                .map(|a| i64::from(a.number))
                .collect::<Vec<_>>(),
        )
        .bind(
            attempts
                .iter()
                .map(|a| a.time.as_datetime())
                .collect::<Vec<_>>(),
        )
        .bind(
            attempts
                .iter()
                .map(|a| a.status.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(
            attempts
                .iter()
                .map(|a| a.trigger.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(
            attempts
                .iter()
                .map(|a| a.response_code.map(i32::from))
                .collect::<Vec<_>>(),
        )
        .bind(
            attempts
                .iter()
                .map(|a| i64::from(a.duration_ms))
                .collect::<Vec<_>>(),
        )
        .bind(
            attempts
                .iter()
                .map(|a| a.response_body.as_deref().map(pg_text))
                .collect::<Vec<_>>(),
        )
        .bind(
            attempts
                .iter()
                .map(|a| a.error.as_deref().map(pg_text))
                .collect::<Vec<_>>(),
        )
        .bind(
            attempts
                .iter()
                .map(|a| a.event_topic.as_str())
                .collect::<Vec<_>>(),
        )
}

/// `limit + 1`, as the `bigint` a `LIMIT` binds.
fn limit_plus_one(page: &PageRequest) -> i64 {
    i64::from(page.limit) + 1
}

#[async_trait]
impl LogStore for PostgresLogStore {
    async fn insert_many(&self, events: &[Event], attempts: &[Attempt]) -> Result<()> {
        let events = dedupe_sorted(events, |e| (e.tenant_id.as_str(), e.id.as_str()));
        let attempts = dedupe_sorted(attempts, |a| (a.tenant_id.as_str(), a.id));
        let query = match (events.is_empty(), attempts.is_empty()) {
            (true, true) => return Ok(()),
            (false, true) => bind_events(sqlx::query(&self.sql.insert_events), &events)?,
            (true, false) => bind_attempts(sqlx::query(&self.sql.insert_attempts), &attempts),
            (false, false) => bind_attempts(
                bind_events(sqlx::query(&self.sql.insert_both), &events)?,
                &attempts,
            ),
        };
        query
            .execute(&self.db.pool)
            .await
            .map_err(|e| from_sqlx("inserting events and attempts", e))?;
        Ok(())
    }

    async fn get_event(&self, tenant: &TenantId, id: &EventId) -> Result<Option<Event>> {
        let row = sqlx::query(&self.sql.get_event)
            .bind(tenant.as_str())
            .bind(id.as_str())
            .fetch_optional(&self.db.pool)
            .await
            .map_err(|e| from_sqlx("reading an event", e))?;
        row.as_ref().map(event_from_row).transpose()
    }

    async fn get_events(&self, keys: &[EventKey]) -> Result<HashMap<EventKey, Event>> {
        events_by_key(&self.db, &self.sql.get_events, keys, "reading events").await
    }

    async fn list_events(
        &self,
        tenant: &TenantId,
        filter: &EventFilter,
        page: &PageRequest,
    ) -> Result<Page<Event>> {
        page.validate()?;
        let cursor = page.cursor_position(|id| EventId::new(id))?;
        let s = self.db.schema();
        // Only the filters given become predicates, so each combination is its own prepared
        // statement with a plan fitted to it (a generic `$n IS NULL OR …` plan would not use
        // the topic index).
        let mut q = QueryBuilder::<Postgres>::new(format!(
            "SELECT {EVENT_COLUMNS} FROM {s}.events WHERE tenant_id = "
        ));
        q.push_bind(tenant.as_str());
        if let Some(topic) = &filter.topic {
            q.push(" AND topic = ").push_bind(topic.as_str());
        }
        if let Some(since) = filter.time.since {
            q.push(" AND event_time >= ").push_bind(since.as_datetime());
        }
        if let Some(until) = filter.time.until {
            q.push(" AND event_time < ").push_bind(until.as_datetime());
        }
        if let Some((time, id)) = &cursor {
            q.push(" AND (event_time, event_id) < (")
                .push_bind(time.as_datetime())
                .push(", ")
                .push_bind(id.as_str())
                .push(")");
        }
        q.push(" ORDER BY event_time DESC, event_id DESC LIMIT ")
            .push_bind(limit_plus_one(page));
        let rows = q
            .build()
            .fetch_all(&self.db.pool)
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
        let row = sqlx::query(&self.sql.get_attempt)
            .bind(tenant.as_str())
            .bind(id.as_uuid())
            .fetch_optional(&self.db.pool)
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
        let s = self.db.schema();
        let mut q = QueryBuilder::<Postgres>::new(format!(
            "SELECT {ATTEMPT_COLUMNS} FROM {s}.attempts AS a
             LEFT JOIN {s}.events AS e ON e.tenant_id = a.tenant_id AND e.event_id = a.event_id
             WHERE a.tenant_id = "
        ));
        q.push_bind(tenant.as_str());
        if let Some(event) = &filter.event_id {
            q.push(" AND a.event_id = ").push_bind(event.as_str());
        }
        if let Some(destination) = filter.destination_id {
            q.push(" AND a.destination_id = ")
                .push_bind(destination.as_uuid());
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
                .push_bind(since.as_datetime());
        }
        if let Some(until) = filter.time.until {
            q.push(" AND a.attempt_time < ")
                .push_bind(until.as_datetime());
        }
        if let Some((time, id)) = &cursor {
            q.push(" AND (a.attempt_time, a.attempt_id) < (")
                .push_bind(time.as_datetime())
                .push(", ")
                .push_bind(id.as_uuid())
                .push(")");
        }
        q.push(" ORDER BY a.attempt_time DESC, a.attempt_id DESC LIMIT ")
            .push_bind(limit_plus_one(page));
        let rows = q
            .build()
            .fetch_all(&self.db.pool)
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
        let row = sqlx::query(&self.sql.latest_attempt)
            .bind(key.tenant_id.as_str())
            .bind(key.event_id.as_str())
            .bind(key.destination_id.as_uuid())
            .bind(key.attempt_time.as_datetime())
            .fetch_optional(&self.db.pool)
            .await
            .map_err(|e| from_sqlx("looking up the latest attempt", e))?;
        row.as_ref().map(attempt_from_row).transpose()
    }

    async fn latest_attempts(&self, keys: &[AttemptKey]) -> Result<HashMap<AttemptKey, Attempt>> {
        let unique = distinct(keys);
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
        let s = self.db.schema();
        let rows = sqlx::query(&format!(
            "SELECT floor(extract(epoch FROM attempt_time - $2) * 1000000 / $4)::bigint AS bucket,
                    count(*) FILTER (WHERE status = 'success') AS success,
                    count(*) FILTER (WHERE status = 'failed') AS failed,
                    count(*) FILTER (WHERE status = 'filtered') AS filtered
             FROM {s}.attempts
             WHERE tenant_id = $1 AND attempt_time >= $2 AND attempt_time < $3
             GROUP BY bucket"
        ))
        .bind(tenant.as_str())
        .bind(buckets.since.as_datetime())
        .bind(buckets.until().as_datetime())
        .bind(buckets.width.as_micros() as i64)
        .fetch_all(&self.db.pool)
        .await
        .map_err(|e| from_sqlx("counting attempts", e))?;
        let mut counts = buckets.empty();
        for row in &rows {
            let bucket: i64 = get(row, "bucket")?;
            if let Some(c) = usize::try_from(bucket).ok().and_then(|i| counts.get_mut(i)) {
                c.success = get::<i64>(row, "success")? as u64;
                c.failed = get::<i64>(row, "failed")? as u64;
                c.filtered = get::<i64>(row, "filtered")? as u64;
            }
        }
        Ok(counts)
    }

    async fn ping(&self) -> Result<()> {
        self.db.ping("log store").await
    }
}
