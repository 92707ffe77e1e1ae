//! [`SqliteOutbox`]: the durable intake in front of the SQLite queue (sheaf_store's `outbox`
//! module docs), with the log tables as the outbox.
//!
//! The log store is the same file, so nothing is shipped: accepting an event inserts it into
//! `events`, whose unique key is the idempotency record (kept as long as the log keeps the
//! event), together with its jobs; a settlement inserts its attempts into `attempts` together
//! with the outcomes. Each call is one operation of the writer, so it commits in one transaction
//! with whatever else the flush carries: concurrent publishes are group-committed, and a publish
//! is answered only after the commit that holds its event and its jobs.

use std::collections::{HashMap, HashSet};
use std::fmt;

use async_trait::async_trait;
use rusqlite::Connection;
use sheaf_store::{
    Accepted, ClaimedJob, Event, EventKey, Intake, JobId, Lease, LeaseOffer, Outbox, OutboxBacklog,
    Result, Settlement, Shipment, Timestamp, validate_intakes, validate_lease,
};

use crate::db::Db;
use crate::log::{GET_EVENTS, batch_bytes, dedupe, events_by_key, insert_attempts, insert_events};
use crate::queue::{complete_on, dead_letter_on, insert_job, reschedule_on};

/// The outbox over the SQLite queue and log. Cheap to clone; every clone shares the
/// connections.
#[derive(Clone)]
pub struct SqliteOutbox {
    db: Db,
}

impl fmt::Debug for SqliteOutbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteOutbox")
            .field("path", &self.db.path)
            .finish_non_exhaustive()
    }
}

impl SqliteOutbox {
    pub(crate) fn new(db: Db) -> Self {
        SqliteOutbox { db }
    }
}

/// Accepts `intakes` on the writer connection: each new event with its jobs, and up to
/// `offer.max_jobs` of the new due jobs leased, in the order of the intakes and their jobs.
fn accept_on(connection: &Connection, intakes: &[Intake], offer: LeaseOffer) -> Result<Accepted> {
    // One clock reading for the whole accept: "due" and the leases agree.
    let now = Timestamp::now();
    let until = now.saturating_add(offer.lease);
    let mut accepted = Accepted::default();
    let mut seen = HashSet::with_capacity(intakes.len());
    for intake in intakes {
        let event = &intake.event;
        // A key repeated within the call is a repeat, as one accepted before is.
        if !seen.insert(event.key()) {
            accepted.new.push(false);
            continue;
        }
        let new = insert_events(connection, std::slice::from_ref(event))? == 1;
        accepted.new.push(new);
        if !new {
            continue;
        }
        for job in &intake.jobs {
            let lease = job.due_at <= now && accepted.leased.len() < offer.max_jobs;
            let inserted = insert_job(connection, job, lease.then_some(until), "accepting jobs")?;
            if inserted == Some(true) {
                accepted.leased.push(ClaimedJob {
                    job: job.clone(),
                    lease: Lease {
                        job_id: job.id,
                        claimed_until: until,
                    },
                });
            }
        }
    }
    Ok(accepted)
}

#[async_trait]
impl Outbox for SqliteOutbox {
    async fn accept_leasing(&self, intakes: &[Intake], offer: LeaseOffer) -> Result<Accepted> {
        validate_intakes(intakes)?;
        if offer.max_jobs > 0 {
            validate_lease(offer.lease)?;
        }
        if intakes.is_empty() {
            return Ok(Accepted::default());
        }
        self.db.admit("accepting events")?;
        let events: Vec<Event> = intakes.iter().map(|i| i.event.clone()).collect();
        let jobs: usize = intakes.iter().map(|i| i.jobs.len()).sum();
        let bytes = batch_bytes(&events, &[]) + 160 * jobs;
        let intakes = intakes.to_vec();
        self.db
            .writer
            .run("accepting events", bytes, move |c| {
                accept_on(c, &intakes, offer)
            })
            .await
    }

    async fn settle(&self, settlement: &Settlement) -> Result<Vec<JobId>> {
        if settlement.is_empty() {
            return Ok(Vec::new());
        }
        let attempts = dedupe(&settlement.attempts, |a| (a.tenant_id.clone(), a.id));
        let bytes = batch_bytes(&[], &attempts)
            + 64 * (settlement.complete.len()
                + settlement.reschedule.len()
                + settlement.dead_letter.len());
        let settlement = Settlement {
            attempts,
            ..settlement.clone()
        };
        self.db
            .writer
            .run("settling attempts and outcomes", bytes, move |c| {
                // The attempts are recorded whatever their jobs' leases: they happened.
                insert_attempts(c, &settlement.attempts)?;
                let mut lost = complete_on(c, &settlement.complete)?;
                lost.extend(reschedule_on(c, &settlement.reschedule)?);
                lost.extend(dead_letter_on(c, &settlement.dead_letter)?);
                Ok(lost)
            })
            .await
    }

    async fn get_events(&self, keys: &[EventKey]) -> Result<HashMap<EventKey, Event>> {
        events_by_key(&self.db, GET_EVENTS, keys, "reading events from the outbox").await
    }

    async fn take(&self, _max_records: usize) -> Result<Option<Box<dyn Shipment>>> {
        Ok(None)
    }

    async fn prune_keys(&self, _before: Timestamp, _max: usize) -> Result<u64> {
        Ok(0)
    }

    async fn backlog(&self) -> Result<OutboxBacklog> {
        Ok(OutboxBacklog::default())
    }

    fn is_log(&self) -> bool {
        true
    }
}
