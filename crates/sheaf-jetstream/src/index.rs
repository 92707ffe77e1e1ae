//! This process's view of the bucket: every job's latest record, indexed for the claim, the
//! depth and the dead-letter listing.
//!
//! The view is fed by one watcher that reads the bucket's stream in order, so at any instant it
//! is the bucket as it was at some stream sequence ([`Index::applied`]): a *prefix* of the
//! writes, never a mix. Every decision made from it is checked by the write that acts on it
//! (a compare-and-set on the job's revision), so a view that is behind costs a refused write,
//! never a wrong one. Why a prefix is enough for order keys: a job's place in its key is the
//! sequence of the write that enqueued it, so a job that is first of its key in a prefix has no
//! earlier job of that key anywhere later in the stream.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::ops::Bound;
use std::str::FromStr as _;

use serde::{Deserialize, Serialize};
use sheaf_store::{
    Cursor, DeadLetter, DestinationId, Job, JobId, Page, PageRequest, QueueDepth, Result, TenantId,
    Timestamp,
};

/// One job as stored under its key: the job, its claim, its place in its order key and, for a
/// dead letter, why and when.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Record {
    pub job: Job,
    /// Set while a lease holds (or held and nobody re-claimed yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claimed_until: Option<Timestamp>,
    /// The stream sequence of the write that enqueued the job: its place among the jobs of its
    /// order key. `None` on that write itself, whose own sequence is the place.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub place: Option<u64>,
    /// Set once the job is dead-lettered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead: Option<Dead>,
}

/// Why and when a job was given up on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Dead {
    pub reason: String,
    pub at: Timestamp,
    pub holds_key: bool,
}

impl Record {
    /// A job waiting for its first claim.
    pub fn waiting(job: Job) -> Self {
        Record {
            job,
            claimed_until: None,
            place: None,
            dead: None,
        }
    }

    /// Whether a lease holds the job at `now`.
    pub fn held_at(&self, now: Timestamp) -> bool {
        self.dead.is_none() && self.claimed_until.is_some_and(|until| until >= now)
    }

    /// The dead letter this record is, if it is one.
    pub fn dead_letter(&self) -> Option<DeadLetter> {
        self.dead.as_ref().map(|dead| DeadLetter {
            job: self.job.clone(),
            reason: dead.reason.clone(),
            dead_lettered_at: dead.at,
            holds_key: dead.holds_key,
        })
    }

    /// Whether it takes a place in its key's line: a waiting or claimed job of an order key, or
    /// a dead letter that holds its key.
    fn in_line(&self) -> bool {
        self.job.order_key.is_some() && self.dead.as_ref().is_none_or(|dead| dead.holds_key)
    }
}

/// A record as the view holds it: with its resolved place and the revision that wrote it.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub record: Record,
    pub place: u64,
    pub revision: u64,
}

type Line = (DestinationId, String);

/// A record of the outbox waiting in the bucket for the log store: an accepted event or a
/// settled attempt, written by `owner` (see `outbox.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Waiting {
    /// The key, without the bucket's prefix.
    pub key: String,
    /// The queue that wrote it, the one that ships it while it lives.
    pub owner: uuid::Uuid,
    /// The event's key hash for an event; `None` for an attempt.
    pub event: Option<String>,
    /// When the stream stored it.
    pub at: Timestamp,
}

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct Index {
    rows: HashMap<JobId, Row>,
    /// Every waiting or claimed job that is not behind an earlier one of its key, by
    /// `(due_at, id)`: the claim order. Held jobs stay in it; a claim walks past them.
    due: BTreeSet<(Timestamp, JobId)>,
    /// The jobs of each `(destination, order key)` that take a place in its line, by place.
    lines: HashMap<Line, BTreeMap<u64, JobId>>,
    dead_by_tenant: HashMap<TenantId, BTreeSet<(Timestamp, JobId)>>,
    dead: u64,
    /// The processes' last heartbeats.
    heartbeats: HashMap<uuid::Uuid, Timestamp>,
    /// The queues' last heartbeats (a heartbeat names the process and the queue it went
    /// through): whose outbox records have a living owner.
    owners: HashMap<uuid::Uuid, Timestamp>,
    /// The outbox's records waiting for the log store, by stream sequence: oldest first.
    waiting: BTreeMap<u64, Waiting>,
    /// The sequence of each waiting record's key.
    waiting_keys: HashMap<String, u64>,
    /// The sequence of each waiting event, by its key hash.
    waiting_events: HashMap<String, u64>,
    /// The stream sequence of the last write applied.
    applied: u64,
}

impl Index {
    /// The last stream sequence applied.
    pub fn applied(&self) -> u64 {
        self.applied
    }

    /// Notes that the view has read the stream up to `sequence` (a write it skips, such as one
    /// that is not a job's, still moves it).
    pub fn advance(&mut self, sequence: u64) {
        self.applied = self.applied.max(sequence);
    }

    pub fn row(&self, id: &JobId) -> Option<&Row> {
        self.rows.get(id)
    }

    /// Applies a job's new record, written at `revision`.
    pub fn put(&mut self, id: JobId, record: Record, revision: u64) {
        self.remove(id);
        let place = record.place.unwrap_or(revision);
        if let Some(dead) = &record.dead {
            self.dead_by_tenant
                .entry(record.job.tenant_id.clone())
                .or_default()
                .insert((dead.at, id));
            self.dead += 1;
        }
        let mut first = true;
        if record.in_line() {
            let key = line_of(&record.job);
            let line = self.lines.entry(key).or_default();
            let before = line.first_key_value().map(|(_, &j)| j);
            line.insert(place, id);
            first = line.first_key_value().map(|(_, &j)| j) == Some(id);
            if let Some(displaced) = before.filter(|_| first)
                && let Some(row) = self.rows.get(&displaced)
            {
                self.due.remove(&(row.record.job.due_at, displaced));
            }
        }
        if record.dead.is_none() && first {
            self.due.insert((record.job.due_at, id));
        }
        self.rows.insert(
            id,
            Row {
                record,
                place,
                revision,
            },
        );
    }

    /// Applies a job's removal (completed, purged, or a dead letter removed).
    pub fn remove(&mut self, id: JobId) -> Option<Row> {
        let row = self.rows.remove(&id)?;
        let job = &row.record.job;
        self.due.remove(&(job.due_at, id));
        if let Some(dead) = &row.record.dead {
            if let Some(set) = self.dead_by_tenant.get_mut(&job.tenant_id) {
                set.remove(&(dead.at, id));
                if set.is_empty() {
                    self.dead_by_tenant.remove(&job.tenant_id);
                }
            }
            self.dead -= 1;
        }
        if row.record.in_line() {
            let key = line_of(job);
            if let Some(line) = self.lines.get_mut(&key) {
                let was_first = line.first_key_value().map(|(_, &j)| j) == Some(id);
                line.remove(&row.place);
                match line.first_key_value().map(|(_, &j)| j) {
                    None => {
                        self.lines.remove(&key);
                    }
                    Some(next) if was_first => {
                        if let Some(next_row) = self.rows.get(&next)
                            && next_row.record.dead.is_none()
                        {
                            self.due.insert((next_row.record.job.due_at, next));
                        }
                    }
                    Some(_) => {}
                }
            }
        }
        Some(row)
    }

    /// Applies a process's heartbeat, made through the queue `owner` when it says so.
    pub fn beat(&mut self, process: uuid::Uuid, at: Timestamp, owner: Option<uuid::Uuid>) {
        self.heartbeats.insert(process, at);
        if let Some(owner) = owner {
            let last = self.owners.entry(owner).or_insert(at);
            *last = (*last).max(at);
        }
    }

    /// Applies an outbox record written at `sequence`.
    pub fn put_waiting(&mut self, waiting: Waiting, sequence: u64) {
        self.remove_waiting(&waiting.key);
        self.waiting_keys.insert(waiting.key.clone(), sequence);
        if let Some(hash) = &waiting.event {
            self.waiting_events.insert(hash.clone(), sequence);
        }
        self.waiting.insert(sequence, waiting);
    }

    /// Applies the removal of an outbox record (shipped).
    pub fn remove_waiting(&mut self, key: &str) {
        if let Some(sequence) = self.waiting_keys.remove(key)
            && let Some(old) = self.waiting.remove(&sequence)
            && let Some(hash) = old.event
        {
            self.waiting_events.remove(&hash);
        }
    }

    /// The outbox's waiting records, oldest first, with their sequences.
    pub fn waiting(&self) -> impl Iterator<Item = (u64, &Waiting)> {
        self.waiting.iter().map(|(&s, w)| (s, w))
    }

    /// The sequence and key of the waiting event with this key hash.
    pub fn waiting_event(&self, hash: &str) -> Option<(u64, &str)> {
        let sequence = *self.waiting_events.get(hash)?;
        Some((sequence, self.waiting[&sequence].key.as_str()))
    }

    /// How many events and attempts wait, and when the stream stored the oldest record.
    pub fn waiting_counts(&self) -> (u64, u64, Option<Timestamp>) {
        let events = self.waiting_events.len() as u64;
        let attempts = self.waiting.len() as u64 - events;
        (events, attempts, self.waiting.values().map(|w| w.at).min())
    }

    /// The stream sequence of the oldest waiting event.
    pub fn oldest_waiting_event(&self) -> Option<u64> {
        self.waiting_events.values().min().copied()
    }

    /// The queues that beat at `since` or later.
    pub fn owners_since(&self, since: Timestamp) -> Vec<uuid::Uuid> {
        self.owners
            .iter()
            .filter(|&(_, &at)| at >= since)
            .map(|(&o, _)| o)
            .collect()
    }

    /// Whether jobs of `destination`'s order key `key` wait, are held, or hold it dead.
    pub fn line_taken(&self, destination: DestinationId, key: &str) -> bool {
        self.lines.contains_key(&(destination, key.to_owned()))
    }

    /// Applies the removal of a process's heartbeat.
    pub fn forget_process(&mut self, process: &uuid::Uuid) {
        self.heartbeats.remove(process);
    }

    /// The processes whose last heartbeat is at `since` or later.
    pub fn processes_since(&self, since: Timestamp) -> usize {
        self.heartbeats.values().filter(|&&at| at >= since).count()
    }

    /// The processes whose last heartbeat is before `before`.
    pub fn processes_before(&self, before: Timestamp) -> Vec<uuid::Uuid> {
        self.heartbeats
            .iter()
            .filter(|&(_, &at)| at < before)
            .map(|(&p, _)| p)
            .collect()
    }

    /// Up to `max` jobs claimable at `now`, in claim order, skipping `skip` (claims of this
    /// process in flight): due, not held, and first of their key.
    pub fn claimable(&self, now: Timestamp, max: usize, skip: &HashSet<JobId>) -> Vec<JobId> {
        let mut picked = Vec::with_capacity(max.min(self.due.len()));
        for &(due_at, id) in &self.due {
            if due_at > now || picked.len() == max {
                break;
            }
            if skip.contains(&id) || self.rows[&id].record.held_at(now) {
                continue;
            }
            picked.push(id);
        }
        picked
    }

    /// How many jobs there are by state, at `now`.
    pub fn depth(&self, now: Timestamp) -> QueueDepth {
        let mut depth = QueueDepth {
            dead_lettered: self.dead,
            ..QueueDepth::default()
        };
        for (&id, row) in &self.rows {
            let record = &row.record;
            if record.dead.is_some() {
                continue;
            }
            if record.held_at(now) {
                depth.claimed += 1;
            } else if record.job.due_at <= now && self.due.contains(&(record.job.due_at, id)) {
                depth.due += 1;
            } else {
                depth.scheduled += 1;
            }
        }
        depth
    }

    /// A page of the tenant's dead letters, newest first.
    pub fn dead_letters(&self, tenant: &TenantId, page: &PageRequest) -> Result<Page<DeadLetter>> {
        let upper = match &page.cursor {
            Some(cursor) => Bound::Excluded((cursor.time(), JobId::from_str(cursor.id())?)),
            None => Bound::Unbounded,
        };
        let Some(index) = self.dead_by_tenant.get(tenant) else {
            return Ok(Page::empty());
        };
        let limit = page.limit_usize();
        let items: Vec<DeadLetter> = index
            .range((Bound::Unbounded, upper))
            .rev()
            .take(limit + 1)
            .filter_map(|(_, id)| self.rows[id].record.dead_letter())
            .collect();
        Ok(Page::from_overfetch(items, limit, |d| {
            Cursor::new(d.dead_lettered_at, d.job.id.to_string())
        }))
    }

    /// Every job and dead letter of a tenant, with its revision.
    pub fn of_tenant(&self, tenant: &TenantId) -> Vec<(JobId, u64)> {
        self.rows
            .iter()
            .filter(|(_, row)| row.record.job.tenant_id == *tenant)
            .map(|(&id, row)| (id, row.revision))
            .collect()
    }
}

fn line_of(job: &Job) -> Line {
    (
        job.destination_id,
        job.order_key
            .clone()
            .expect("only jobs of an order key are in a line"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use sheaf_store::testkit::fixtures::{job, shift, unique_tenant};

    fn keyed(tenant: &TenantId, destination: DestinationId, due_at: Timestamp) -> Job {
        Job {
            destination_id: destination,
            order_key: Some("k".into()),
            ..job(tenant, due_at)
        }
    }

    #[test]
    fn only_the_first_of_a_key_is_claimable_and_the_next_follows_it() {
        let tenant = unique_tenant("index");
        let now = Timestamp::now();
        let destination = DestinationId::generate();
        let (a, b) = (
            keyed(&tenant, destination, shift(now, -2_000)),
            keyed(&tenant, destination, shift(now, -3_000)),
        );
        let mut index = Index::default();
        index.put(a.id, Record::waiting(a.clone()), 1);
        index.put(b.id, Record::waiting(b.clone()), 2);
        let none = HashSet::new();
        assert_eq!(index.claimable(now, 10, &none), vec![a.id]);
        assert_eq!(index.depth(now).scheduled, 1);

        // A dead letter that holds the key keeps b waiting; removing it lets b go.
        let mut dead = Record::waiting(a.clone());
        dead.place = Some(1);
        dead.dead = Some(Dead {
            reason: "r".into(),
            at: now,
            holds_key: true,
        });
        index.put(a.id, dead, 3);
        assert!(index.claimable(now, 10, &none).is_empty());
        index.remove(a.id);
        assert_eq!(index.claimable(now, 10, &none), vec![b.id]);

        // Enqueued anew, a goes behind b; put back in its place, before it.
        index.put(a.id, Record::waiting(a.clone()), 4);
        assert_eq!(index.claimable(now, 10, &none), vec![b.id]);
        let mut back = Record::waiting(a.clone());
        back.place = Some(1);
        index.put(a.id, back, 5);
        assert_eq!(index.claimable(now, 10, &none), vec![a.id]);
        assert_eq!(
            index.depth(now),
            QueueDepth {
                due: 1,
                scheduled: 1,
                ..QueueDepth::default()
            }
        );
    }

    #[test]
    fn held_jobs_are_walked_past_and_counted_as_claimed() {
        let tenant = unique_tenant("index");
        let now = Timestamp::now();
        let (a, b) = (
            job(&tenant, shift(now, -2_000)),
            job(&tenant, shift(now, -1_000)),
        );
        let mut index = Index::default();
        let mut held = Record::waiting(a.clone());
        held.claimed_until = Some(shift(now, 30_000_000));
        index.put(a.id, held, 1);
        index.put(b.id, Record::waiting(b.clone()), 2);
        assert_eq!(index.claimable(now, 10, &HashSet::new()), vec![b.id]);
        assert_eq!(index.claimable(now, 10, &HashSet::from([b.id])), vec![]);
        assert_eq!(index.depth(now).claimed, 1);
        assert_eq!(index.of_tenant(&tenant).len(), 2);
    }
}
