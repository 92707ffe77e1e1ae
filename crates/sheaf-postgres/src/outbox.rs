//! [`PostgresOutbox`]: the durable intake in front of the Postgres queue (sheaf_store's `outbox`
//! module docs), in one of two layouts.
//!
//! - **Shipped** (the log store is elsewhere, e.g. ClickHouse): an accepted event's key goes into
//!   `accepted_events` (the idempotency record, pointing at its payload's `seq`), its payload
//!   into `outbox_events` and its jobs into `jobs`, all in one statement; a settlement writes
//!   attempts into `outbox_attempts` (without a copy of the payload, like the Postgres log's
//!   `attempts`) together with the outcomes. A [`Shipment`] deletes the rows it takes inside a transaction
//!   it holds open until the log store acknowledged them: committing removes them for good,
//!   dropping it rolls the delete back. `FOR UPDATE SKIP LOCKED` lets the shippers of several
//!   processes share the backlog without waiting for each other.
//! - **In the log** (the log store is this schema's `events` and `attempts`): the log tables are
//!   the outbox. Accepting inserts into `events` (its primary key is the idempotency record, kept
//!   as long as the log keeps the event), a settlement inserts into `attempts`, and nothing is
//!   ever shipped.
//!
//! Either way a publish is one statement and one commit per batch, and a settlement one
//! transaction: the service coalesces concurrent publishes into one call (group commit).

use std::collections::{HashMap, HashSet};
use std::fmt;

use async_trait::async_trait;
use sheaf_store::{
    Accepted, Attempt, ClaimedJob, Event, EventKey, Intake, Job, JobId, Lease, LeaseOffer, Outbox,
    OutboxBacklog, Result, Settlement, Shipment, Timestamp, validate_intakes, validate_lease,
};
use sqlx::postgres::PgRow;
use sqlx::{Postgres, Transaction};

use crate::db::{Db, get, get_opt_time, get_time, micros, planned_each_time};
use crate::error::from_sqlx;
use crate::log::{
    EVENT_COLUMNS, PostgresLogStore, attempt_from_row, bind_attempts, bind_events, dedupe_sorted,
    event_arrays, event_from_row, events_by_key, insert_attempts_into,
};
use crate::queue::{
    INSERTED_COLUMNS, LOCK_ORDER_KEYS, PostgresJobQueue, bind_jobs, bind_order, order_locks,
    order_ranks, order_seq,
};

/// Where accepted events and settled attempts go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutboxLayout {
    /// Into outbox tables, shipped to a log store elsewhere.
    Shipped,
    /// Into this schema's log tables, which are then the outbox.
    InTheLog,
}

#[derive(Debug)]
struct Statements {
    accept: String,
    insert_attempts: String,
    get_events: String,
    take_events: String,
    take_attempts: String,
    prune: String,
    backlog: String,
}

impl Statements {
    fn new(s: &str, layout: OutboxLayout, log: &PostgresLogStore) -> Self {
        // Events in $1..$7 (bind_events), jobs in $8..$14 (bind_jobs).
        let events = format!("unnest({}) AS e({EVENT_COLUMNS})", event_arrays(1));
        let new_keys = match layout {
            OutboxLayout::Shipped => format!(
                "INSERT INTO {s}.accepted_events (tenant_id, event_id, accepted_at, seq)
                 SELECT e.tenant_id, e.event_id, now(), nextval('{s}.outbox_events_seq_seq')
                 FROM {events}
                 ON CONFLICT (tenant_id, event_id) DO NOTHING
                 RETURNING tenant_id, event_id, seq"
            ),
            OutboxLayout::InTheLog => format!(
                "INSERT INTO {s}.events ({EVENT_COLUMNS})
                 SELECT e.tenant_id, e.event_id, e.topic, e.event_time, e.data::json,
                        e.traceparent, e.tracestate
                 FROM {events}
                 ON CONFLICT (tenant_id, event_id) DO NOTHING
                 RETURNING tenant_id, event_id, NULL::bigint AS seq"
            ),
        };
        // The payload row takes the `seq` its key row drew (the identity's own sequence), so the
        // key finds it without an index of its own (`migrations/0016_…`).
        let payloads = match layout {
            OutboxLayout::Shipped => format!(
                ", payloads AS (
                     INSERT INTO {s}.outbox_events (seq, {EVENT_COLUMNS})
                     OVERRIDING SYSTEM VALUE
                     SELECT new.seq, e.tenant_id, e.event_id, e.topic, e.event_time,
                            e.data::json, e.traceparent, e.tracestate
                     FROM {events}
                     JOIN new USING (tenant_id, event_id)
                     ORDER BY e.tenant_id, e.event_id
                 )"
            ),
            OutboxLayout::InTheLog => String::new(),
        };
        // Only the new events' jobs, and never an id that is dead-lettered (as `enqueue`). The
        // first $15 of them that are due are inserted leased for $16 microseconds (the lease
        // offer): a running count over the due ones, in id order. A job of an order key ($17,
        // its rank among the call's jobs of that key $18) is leased only if it is the key's
        // first, in the call and in the table: the key's lock was taken by the transaction
        // before this statement began, so its snapshot holds every earlier job of the key. The
        // answer is one row per new key and one per leased job.
        let accept = format!(
            "WITH new AS ({new_keys}){payloads}, queued AS (
                 INSERT INTO {s}.jobs ({INSERTED_COLUMNS}, claimed_until)
                 SELECT j.id, j.tenant_id, j.event_id, j.destination_id, j.attempt_number,
                        j.last_attempt_time, j.next_due_at, j.order_key, {},
                        CASE WHEN j.next_due_at <= now() AND {first}
                                  AND count(*) FILTER (WHERE j.next_due_at <= now() AND {first})
                                          OVER (ORDER BY j.id) <= $15
                             THEN now() + $16::bigint * interval '1 microsecond'
                        END
                 FROM unnest($8::uuid[], $9::text[], $10::text[], $11::uuid[],
                             $12::bigint[], $13::timestamptz[], $14::timestamptz[],
                             $17::text[], $18::bigint[])
                      AS j(id, tenant_id, event_id, destination_id, attempt_number,
                           last_attempt_time, next_due_at, order_key, order_rank)
                 JOIN new USING (tenant_id, event_id)
                 WHERE NOT EXISTS (SELECT 1 FROM {s}.dead_letters AS d WHERE d.id = j.id)
                 ON CONFLICT (id) DO NOTHING
                 RETURNING id, claimed_until
             )
             SELECT tenant_id, event_id, NULL::uuid AS job_id, NULL::timestamptz AS claimed_until
             FROM new
             UNION ALL
             SELECT NULL, NULL, id, claimed_until FROM queued WHERE claimed_until IS NOT NULL",
            order_seq(s),
            first = format!(
                "(j.order_key IS NULL OR (j.order_rank = 1 AND NOT EXISTS (
                      SELECT 1 FROM {s}.jobs AS e
                      WHERE e.destination_id = j.destination_id AND e.order_key = j.order_key)))"
            ),
        );
        // Shipped: the same 13 columns into the outbox, without the payload (see
        // `migrations/0004_outbox.sql`).
        let insert_attempts = match layout {
            OutboxLayout::Shipped => insert_attempts_into(s, "outbox_attempts", 1, ""),
            OutboxLayout::InTheLog => log.insert_attempts_sql().to_owned(),
        };
        // Shipped: a waiting payload is found through its key's row, which points at it.
        let event_rows = match layout {
            OutboxLayout::Shipped => format!(
                "{s}.accepted_events AS a
                 ON a.tenant_id = k.tenant_id AND a.event_id = k.event_id
                 JOIN {s}.outbox_events AS e ON e.seq = a.seq"
            ),
            OutboxLayout::InTheLog => {
                format!("{s}.events AS e ON e.tenant_id = k.tenant_id AND e.event_id = k.event_id")
            }
        };
        Statements {
            accept,
            insert_attempts,
            get_events: format!(
                "SELECT e.tenant_id, e.event_id, e.topic, e.event_time, e.data, e.traceparent,
                        e.tracestate
                 FROM unnest($1::text[], $2::text[]) AS k(tenant_id, event_id)
                 JOIN {event_rows}"
            ),
            // The oldest rows no other shipment holds, picked once (an uncorrelated
            // `ARRAY(…)` is an init plan) and deleted by primary key. Written as `IN (SELECT …)`
            // it lets the planner, trusting the statistics of an outbox that was empty when
            // last analyzed, run the picking subquery again for every row of the table: a
            // shipment of a 100,000-row backlog then ran into the 30 s statement timeout
            // (`cargo xtask bench delivery`).
            take_events: format!(
                "DELETE FROM {s}.outbox_events
                 WHERE seq = ANY (ARRAY(SELECT seq FROM {s}.outbox_events ORDER BY seq LIMIT $1
                                        FOR UPDATE SKIP LOCKED))
                 RETURNING seq, {EVENT_COLUMNS}"
            ),
            take_attempts: format!(
                "DELETE FROM {s}.outbox_attempts AS a
                 WHERE seq = ANY (ARRAY(SELECT seq FROM {s}.outbox_attempts ORDER BY seq
                                        LIMIT $1 FOR UPDATE SKIP LOCKED))
                 RETURNING a.seq, a.tenant_id, a.attempt_id, a.event_id, a.destination_id,
                           a.number, a.attempt_time, a.status, a.trigger, a.response_code,
                           a.duration_ms, a.response_body, a.error, a.event_topic,
                           NULL::json AS data, NULL::text AS traceparent,
                           NULL::text AS tracestate"
            ),
            // Bounded per call, so a long-expired backlog is pruned in steps that each hold
            // their locks for a short time. A key whose payload still waits to be shipped stays:
            // it is how the payload is found.
            prune: format!(
                "WITH gone AS (
                     DELETE FROM {s}.accepted_events
                     WHERE ctid = ANY (ARRAY(
                         SELECT ctid FROM {s}.accepted_events AS a
                         WHERE accepted_at < $1
                           AND NOT EXISTS (SELECT 1 FROM {s}.outbox_events AS o
                                           WHERE o.seq = a.seq)
                         LIMIT $2))
                     RETURNING 1)
                 SELECT count(*) AS pruned FROM gone"
            ),
            backlog: format!(
                "SELECT (SELECT count(*) FROM {s}.outbox_events) AS events,
                        (SELECT count(*) FROM {s}.outbox_attempts) AS attempts,
                        LEAST((SELECT event_time FROM {s}.outbox_events ORDER BY seq LIMIT 1),
                              (SELECT attempt_time FROM {s}.outbox_attempts ORDER BY seq LIMIT 1))
                            AS oldest"
            ),
        }
    }
}

/// The outbox on Postgres, beside the queue in the same schema. Cheap to clone.
#[derive(Clone)]
pub struct PostgresOutbox {
    db: Db,
    layout: OutboxLayout,
    queue: PostgresJobQueue,
    sql: std::sync::Arc<Statements>,
}

impl fmt::Debug for PostgresOutbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresOutbox")
            .field("schema", &self.db.schema())
            .field("layout", &self.layout)
            .finish_non_exhaustive()
    }
}

impl PostgresOutbox {
    pub(crate) fn new(
        db: Db,
        layout: OutboxLayout,
        queue: PostgresJobQueue,
        log: &PostgresLogStore,
    ) -> Self {
        let sql = std::sync::Arc::new(Statements::new(db.schema(), layout, log));
        PostgresOutbox {
            db,
            layout,
            queue,
            sql,
        }
    }

    /// The layout it writes.
    pub fn layout(&self) -> OutboxLayout {
        self.layout
    }
}

#[async_trait]
impl Outbox for PostgresOutbox {
    async fn accept_leasing(&self, intakes: &[Intake], offer: LeaseOffer) -> Result<Accepted> {
        validate_intakes(intakes)?;
        if offer.max_jobs > 0 {
            validate_lease(offer.lease)?;
        }
        let events: Vec<Event> = intakes.iter().map(|i| i.event.clone()).collect();
        // One row per key, sorted: concurrent batches take their locks in the same order.
        let unique = dedupe_sorted(&events, |e| (e.tenant_id.as_str(), e.id.as_str()));
        if unique.is_empty() {
            return Ok(Accepted::default());
        }
        // Only the first intake of a key brings its jobs: a later one is a repeat.
        let mut first_of_key = HashSet::new();
        let mut seen_jobs = HashSet::new();
        let mut jobs: Vec<&Job> = intakes
            .iter()
            .filter(|i| first_of_key.insert((i.event.tenant_id.as_str(), i.event.id.as_str())))
            .flat_map(|i| &i.jobs)
            .filter(|j| seen_jobs.insert(j.id))
            .collect();
        // Ranked in the order of the intakes: the order of acceptance.
        let ranks = order_ranks(jobs.iter().copied());
        let locks = order_locks(jobs.iter().copied());
        jobs.sort_by_key(|j| j.id);
        let query = bind_events(sqlx::query(&self.sql.accept), &unique)?;
        let query = bind_jobs(query, &jobs)
            .bind(i64::try_from(offer.max_jobs).unwrap_or(i64::MAX))
            .bind(micros(offer.lease));
        let query = bind_order(query, &jobs, &ranks);
        let fail = |e| from_sqlx("accepting events", e);
        let rows = if locks.is_empty() {
            query.fetch_all(&self.db.pool).await.map_err(fail)?
        } else {
            // Ordered jobs: their keys are locked before the statement that numbers them.
            let mut tx = self.db.pool.begin().await.map_err(fail)?;
            sqlx::query(LOCK_ORDER_KEYS)
                .bind(locks)
                .execute(&mut *tx)
                .await
                .map_err(fail)?;
            let rows = query.fetch_all(&mut *tx).await.map_err(fail)?;
            tx.commit().await.map_err(fail)?;
            rows
        };
        let mut new = HashSet::new();
        let mut leased = Vec::new();
        for row in &rows {
            match get::<Option<uuid::Uuid>>(row, "job_id")? {
                Some(id) => {
                    let id = JobId::from_uuid(id);
                    let claimed_until = get_time(row, "claimed_until")?;
                    // The statement inserted only the jobs it was given.
                    let Ok(at) = jobs.binary_search_by_key(&id, |j| j.id) else {
                        continue;
                    };
                    leased.push(ClaimedJob {
                        job: jobs[at].clone(),
                        lease: Lease {
                            job_id: id,
                            claimed_until,
                        },
                    });
                }
                None => {
                    new.insert((get::<String>(row, "tenant_id")?, get(row, "event_id")?));
                }
            }
        }
        // As a claim answers: in (due_at, id) order.
        leased.sort_by_key(|c| (c.job.due_at, c.job.id));
        // The first intake of a key takes its answer; a later one in the call is a repeat.
        let new = intakes
            .iter()
            .map(|i| {
                new.remove(&(
                    i.event.tenant_id.as_str().to_owned(),
                    i.event.id.as_str().to_owned(),
                ))
            })
            .collect();
        Ok(Accepted { new, leased })
    }

    async fn settle(&self, settlement: &Settlement) -> Result<Vec<JobId>> {
        if settlement.is_empty() {
            return Ok(Vec::new());
        }
        let fail = |e| from_sqlx("settling attempts and outcomes", e);
        let mut tx = self.db.pool.begin().await.map_err(fail)?;
        let attempts = dedupe_sorted(&settlement.attempts, |a| (a.tenant_id.as_str(), a.id));
        if !attempts.is_empty() {
            bind_attempts(sqlx::query(&self.sql.insert_attempts), &attempts)
                .execute(&mut *tx)
                .await
                .map_err(fail)?;
        }
        let mut lost = self
            .queue
            .complete_with(&mut *tx, &settlement.complete)
            .await?;
        lost.extend(
            self.queue
                .reschedule_with(&mut *tx, &settlement.reschedule)
                .await?,
        );
        lost.extend(
            self.queue
                .dead_letter_with(&mut *tx, &settlement.dead_letter)
                .await?,
        );
        tx.commit().await.map_err(fail)?;
        Ok(lost)
    }

    async fn get_events(&self, keys: &[EventKey]) -> Result<HashMap<EventKey, Event>> {
        let doing = "reading events from the outbox";
        events_by_key(&self.db, &self.sql.get_events, keys, doing).await
    }

    async fn take(&self, max_records: usize) -> Result<Option<Box<dyn Shipment>>> {
        if self.layout == OutboxLayout::InTheLog || max_records == 0 {
            return Ok(None);
        }
        let fail = |e| from_sqlx("taking records from the outbox", e);
        let mut tx = self.db.pool.begin().await.map_err(fail)?;
        let limit = i64::try_from(max_records).unwrap_or(i64::MAX);
        let mut rows = planned_each_time(&self.sql.take_events)
            .bind(limit)
            .fetch_all(&mut *tx)
            .await
            .map_err(fail)?;
        // RETURNING follows no order; shipping keeps the outbox's.
        rows.sort_by_cached_key(|row| get::<i64>(row, "seq").unwrap_or(0));
        let events = rows
            .iter()
            .map(event_from_row)
            .collect::<Result<Vec<_>>>()?;
        let mut attempts = Vec::new();
        let room = max_records - events.len();
        if room > 0 {
            let mut rows = planned_each_time(&self.sql.take_attempts)
                .bind(i64::try_from(room).unwrap_or(i64::MAX))
                .fetch_all(&mut *tx)
                .await
                .map_err(fail)?;
            rows.sort_by_cached_key(|row| get::<i64>(row, "seq").unwrap_or(0));
            attempts = rows
                .iter()
                .map(attempt_from_row)
                .collect::<Result<Vec<_>>>()?;
        }
        if events.is_empty() && attempts.is_empty() {
            // Nothing was deleted; ending the transaction either way is the same.
            tx.rollback().await.map_err(fail)?;
            return Ok(None);
        }
        Ok(Some(Box::new(PostgresShipment {
            tx,
            events,
            attempts,
        })))
    }

    async fn prune_keys(&self, before: Timestamp, max: usize) -> Result<u64> {
        if self.layout == OutboxLayout::InTheLog || max == 0 {
            return Ok(0);
        }
        let row = sqlx::query(&self.sql.prune)
            .bind(before.as_datetime())
            .bind(i64::try_from(max).unwrap_or(i64::MAX))
            .fetch_one(&self.db.pool)
            .await
            .map_err(|e| from_sqlx("pruning accepted event keys", e))?;
        let pruned: i64 = get(&row, "pruned")?;
        Ok(u64::try_from(pruned).unwrap_or(0))
    }

    async fn backlog(&self) -> Result<OutboxBacklog> {
        if self.layout == OutboxLayout::InTheLog {
            return Ok(OutboxBacklog::default());
        }
        let row: PgRow = sqlx::query(&self.sql.backlog)
            .fetch_one(&self.db.pool)
            .await
            .map_err(|e| from_sqlx("measuring the outbox", e))?;
        let count = |name: &str| -> Result<u64> {
            let n: i64 = get(&row, name)?;
            Ok(u64::try_from(n).unwrap_or(0))
        };
        Ok(OutboxBacklog {
            events: count("events")?,
            attempts: count("attempts")?,
            oldest: get_opt_time(&row, "oldest")?,
        })
    }

    fn is_log(&self) -> bool {
        self.layout == OutboxLayout::InTheLog
    }
}

/// Rows deleted inside an open transaction: committed once shipped, rolled back when dropped.
struct PostgresShipment {
    tx: Transaction<'static, Postgres>,
    events: Vec<Event>,
    attempts: Vec<Attempt>,
}

#[async_trait]
impl Shipment for PostgresShipment {
    fn events(&self) -> &[Event] {
        &self.events
    }

    fn attempts(&self) -> &[Attempt] {
        &self.attempts
    }

    fn take_records(&mut self) -> (Vec<Event>, Vec<Attempt>) {
        (
            std::mem::take(&mut self.events),
            std::mem::take(&mut self.attempts),
        )
    }

    async fn commit(self: Box<Self>) -> Result<()> {
        self.tx
            .commit()
            .await
            .map_err(|e| from_sqlx("removing shipped records from the outbox", e))
    }
}
