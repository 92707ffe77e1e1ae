//! The outbox in the queue's bucket: a publish stores its event and the event's jobs in one
//! atomic batch, and an attempt is stored beside its job's outcome; the log shipper moves both
//! to the log store later, in large writes.
//!
//! Keys it writes, beside the jobs' (`j.`) and the heartbeats (`p.`):
//!
//! - `k.<hash>`: that an event key was accepted, written with the expectation that the key has
//!   no message, so a second accept of the same key is refused by the stream. It stays for the
//!   idempotency window and is removed by [`Outbox::prune_keys`] (a purge of the `k.` keys
//!   stored before a sequence), never while its event still waits to be shipped.
//! - `e.<queue>.<hash>`: the event, payload included, until shipped. `<queue>` is the queue
//!   that accepted it, which ships it.
//! - `a.<queue>.<attempt>`: an attempt, without its event's payload (the shipper puts it back
//!   from the event), until shipped.
//!
//! `<hash>` is the SHA-256 of the tenant and the event id, cut to 128 bits, since a key holds
//! only a few characters.
//!
//! **One accept, one batch.** The `k.` key, the event and its jobs are one atomic batch
//! (nats-server 2.12 and later): every write is stored, acknowledged by a majority of the
//! bucket's replicas, or none is. A batch refused because a key was not at its expected
//! revision (the server does not say which) is checked key by key, the repeats and the jobs
//! already queued are left out, and the rest is sent again.
//!
//! **Settling.** A settlement's attempts and its jobs' outcomes are pipelined in one call,
//! attempts first; each outcome is a compare-and-set under the lease rule as in the queue.
//! They are not one atomic batch, because an outcome whose lease is lost must change nothing
//! while its attempt is still recorded. A process that stops between the two has stored the
//! attempt and not the outcome: its job is delivered again when the lease runs out (at least
//! once, never lost).
//!
//! **Reading a record.** The view may show a record before the stream's leader has applied
//! it (the view reads through a consumer that can sit on a replica which applied the batch
//! first), so "not found" is not trusted while the view shows the record waiting: an event
//! read is tried again, and a shipment leaves the record for a later round. A shipment removes
//! only records it read and handed over; removing one it could not read would lose it.
//!
//! **Shipping.** Each queue ships the records it wrote. Records of a queue that has not beaten
//! for [`ORPHANED_AFTER`] (a process that stopped) are shipped by the living queue with the
//! smallest id. Log stores take a record twice without keeping two, so two shippers of one
//! record cost a wasted write, never a duplicate. A queue keeps the values it wrote (up to
//! [`CACHED`] of them) so its shipments read nothing back; others are read from the stream.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use parking_lot::Mutex;
use sha2::{Digest as _, Sha256};
use sheaf_store::{
    Accepted, Attempt, ClaimedJob, Error, Event, EventKey, Intake, JobId, Lease, LeaseOffer,
    Outbox, OutboxBacklog, Payload, Result, Settlement, Shipment, Timestamp, validate_intakes,
    validate_lease,
};

use crate::JetStreamQueue;
use crate::index::{Record, Waiting};
use crate::outcome::{completions, dead_letters, reschedules};
use crate::shipment::JetStreamShipment;
use crate::view::{ATTEMPT_KEY, EVENT_KEY, JOB_KEY};
use crate::write::{Change, KeyState, MAX_BATCH, Write};

/// Keys of accepted event keys start with this, followed by the key's hash.
pub(crate) const KEY_KEY: &str = "k.";

/// A queue that has not beaten for this long has stopped: another ships its records.
pub(crate) const ORPHANED_AFTER: Duration = Duration::from_secs(60);

/// Most values of its own records a queue keeps in memory for its shipments.
const CACHED: usize = 50_000;

/// How many times an accept whose batch was refused is checked and sent again.
const RETRIES: usize = 8;

/// How many times (20 ms apart) an event the view shows waiting is read again when the
/// stream's leader does not have it yet.
const READ_AGAIN: usize = 50;

/// The outbox's state in this process.
#[derive(Debug, Default)]
pub(crate) struct Local {
    /// The sequences of records a shipment of this process holds.
    held: Arc<Mutex<HashSet<u64>>>,
    /// The values of records this queue wrote and has not shipped, by key.
    cache: Arc<Mutex<HashMap<String, Bytes>>>,
}

impl Local {
    fn remember(&self, key: String, value: Bytes) {
        let mut cache = self.cache.lock();
        if cache.len() < CACHED {
            cache.insert(key, value);
        }
    }

    fn forget<'a>(&self, keys: impl Iterator<Item = &'a str>) {
        let mut cache = self.cache.lock();
        for key in keys {
            cache.remove(key);
        }
    }
}

/// The hash naming an event key in the bucket.
fn key_hash(key: &EventKey) -> String {
    let mut hasher = Sha256::new();
    hasher.update(key.tenant_id.as_str().as_bytes());
    hasher.update([0]);
    hasher.update(key.event_id.as_str().as_bytes());
    hasher.finalize()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// What each write of an accept's batch is for.
enum Role {
    /// The key of intake `i`.
    Key(usize),
    /// The event of an intake.
    Event,
    /// A job.
    Job(JobId),
}

impl JetStreamQueue {
    /// Whether the outbox can be used: the server stores atomic batches (nats-server 2.12 and
    /// later). Without it, a service publishes to its log store first and enqueues after.
    pub fn has_outbox(&self) -> bool {
        self.outbox.is_some()
    }

    fn local(&self) -> Result<&Local> {
        self.outbox.as_ref().ok_or_else(|| {
            Error::invalid_input(
                "the JetStream outbox needs nats-server 2.12 or later, which stores atomic batches",
            )
        })
    }

    fn event_key(&self, hash: &str) -> String {
        format!("{EVENT_KEY}{}.{hash}", self.owner.simple())
    }

    /// Reads the values of records: from this queue's memory, else from the stream. `None`
    /// for a record gone meanwhile.
    async fn values(&self, records: &[(u64, String)]) -> Result<Vec<Option<Bytes>>> {
        let local = self.local()?;
        let reads = records.iter().map(|(sequence, key)| {
            let cached = local.cache.lock().get(key).cloned();
            async move {
                match cached {
                    Some(value) => Ok(Some(value)),
                    None => self.writer.value_at(*sequence).await,
                }
            }
        });
        futures::future::join_all(reads).await.into_iter().collect()
    }

    /// Waiting events whose value [`Self::values`] did not find: read again while the view
    /// still shows them waiting. A record the view shows and the stream's leader does not
    /// have yet (a replica applied the batch first, and the view read it there) is not an
    /// absent event, which would send the reader to the log store before the event is there;
    /// one the view no longer shows was shipped. Unavailable if one stays unreadable.
    async fn read_again(
        &self,
        mut unread: Vec<(EventKey, (u64, String))>,
    ) -> Result<Vec<(EventKey, Bytes)>> {
        let mut found = Vec::new();
        for _ in 0..READ_AGAIN {
            if unread.is_empty() {
                return Ok(found);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            {
                let index = self.view.index();
                unread.retain(|(key, (sequence, _))| {
                    index
                        .waiting_event(&key_hash(key))
                        .is_some_and(|(s, _)| s == *sequence)
                });
            }
            let records: Vec<(u64, String)> = unread.iter().map(|(_, r)| r.clone()).collect();
            let read = self.values(&records).await?;
            let mut still = Vec::new();
            for ((key, record), value) in unread.into_iter().zip(read) {
                match value {
                    Some(value) => found.push((key, value)),
                    None => still.push((key, record)),
                }
            }
            unread = still;
        }
        if unread.is_empty() {
            return Ok(found);
        }
        Err(Error::Unavailable {
            message: format!(
                "{} waiting events of the outbox could not be read from the stream",
                unread.len()
            ),
            source: None,
        })
    }

    /// Accepts the intakes `group` names (at most [`MAX_BATCH`] writes) in one batch; see the
    /// module docs.
    async fn accept_group(
        &self,
        intakes: &[Intake],
        group: &[usize],
        offer: LeaseOffer,
        accepted: &mut Accepted,
    ) -> Result<()> {
        let local = self.local()?;
        let mut repeats: HashSet<usize> = HashSet::new();
        let mut skipped: HashSet<JobId> = HashSet::new();
        let mut expect: HashMap<String, u64> = HashMap::new();
        for _ in 0..RETRIES {
            let now = Timestamp::now();
            let mut writes = Vec::new();
            let mut roles = Vec::new();
            let mut leased = Vec::new();
            {
                let index = self.view.index();
                let mut budget = offer.max_jobs.saturating_sub(accepted.leased.len());
                let mut lines = HashSet::new();
                for &i in group.iter().filter(|i| !repeats.contains(i)) {
                    let intake = &intakes[i];
                    let hash = key_hash(&intake.event.key());
                    let key = format!("{KEY_KEY}{hash}");
                    let revision = expect.get(&key).copied().unwrap_or(0);
                    let accepted_at = intake.event.time.as_micros().to_string();
                    writes.push(Write::put(key, Bytes::from(accepted_at)).expecting(revision));
                    roles.push(Role::Key(i));
                    let event = serde_json::to_vec(&intake.event).map_err(|e| {
                        Error::backend("an event cannot be written to the queue's bucket", e)
                    })?;
                    writes.push(Write::put(self.event_key(&hash), Bytes::from(event)));
                    roles.push(Role::Event);
                    for job in &intake.jobs {
                        if skipped.contains(&job.id) || index.row(&job.id).is_some() {
                            continue;
                        }
                        // A job of an order key is leased only when it is the first of its
                        // key: none waits in the bucket, none came before it in this call.
                        let first_of_key = match &job.order_key {
                            None => true,
                            Some(key) => {
                                lines.insert((job.destination_id, key.clone()))
                                    && !index.line_taken(job.destination_id, key)
                            }
                        };
                        let mut record = Record::waiting(job.clone());
                        if budget > 0 && job.due_at <= now && first_of_key {
                            budget -= 1;
                            let until = now.saturating_add(offer.lease);
                            record.claimed_until = Some(until);
                            leased.push(ClaimedJob {
                                job: job.clone(),
                                lease: Lease {
                                    job_id: job.id,
                                    claimed_until: until,
                                },
                            });
                        }
                        let key = format!("{JOB_KEY}{}", job.id);
                        let revision = expect.get(&key).copied().unwrap_or(0);
                        writes.push(Change::Put(record).write_new(job.id).expecting(revision));
                        roles.push(Role::Job(job.id));
                    }
                }
            }
            if writes.is_empty() {
                return Ok(());
            }
            // The values go into memory before the batch is sent: this process's shipper may
            // take the events as soon as its view has read them, before the batch's answer.
            let events: Vec<&Write> = writes
                .iter()
                .zip(&roles)
                .filter(|(_, role)| matches!(role, Role::Event))
                .map(|(write, _)| write)
                .collect();
            for write in &events {
                if let Some(value) = write.value() {
                    local.remember(write.key().to_owned(), value.clone());
                }
            }
            let stored = self.writer.write_batch(&writes, &self.view).await;
            if !matches!(stored, Ok(Some(_))) {
                local.forget(events.iter().map(|w| w.key()));
            }
            if stored?.is_some() {
                for &i in group.iter().filter(|i| !repeats.contains(i)) {
                    accepted.new[i] = true;
                }
                accepted.leased.extend(leased);
                return Ok(());
            }
            // Refused: find the keys that moved (a repeat, a job queued already, a deletion
            // left where the batch expected nothing) and send the rest again.
            let checks = writes
                .iter()
                .zip(&roles)
                .filter(|(_, role)| !matches!(role, Role::Event))
                .map(|(write, _)| self.writer.key_state(write.key()));
            let states = futures::future::join_all(checks).await;
            let mut moved = false;
            let checked = writes
                .iter()
                .zip(&roles)
                .filter(|(_, role)| !matches!(role, Role::Event));
            for ((write, role), state) in checked.zip(states) {
                let state = state?;
                let wanted = expect.get(write.key()).copied().unwrap_or(0);
                match (role, state) {
                    (Role::Key(i), KeyState::Stored(_)) => {
                        moved |= repeats.insert(*i);
                    }
                    (Role::Job(id), KeyState::Stored(_)) => {
                        moved |= skipped.insert(*id);
                    }
                    (_, KeyState::Deleted(revision)) if revision != wanted => {
                        expect.insert(write.key().to_owned(), revision);
                        moved = true;
                    }
                    _ => {}
                }
            }
            if !moved {
                return Err(Error::Unavailable {
                    message: "the queue's bucket refused a batch of writes though none of its keys had moved".into(),
                    source: None,
                });
            }
        }
        Err(Error::conflict(format!(
            "the keys of an accept kept changing under {RETRIES} batches"
        )))
    }
}

#[async_trait]
impl Outbox for JetStreamQueue {
    async fn accept_leasing(&self, intakes: &[Intake], offer: LeaseOffer) -> Result<Accepted> {
        validate_intakes(intakes)?;
        if offer.max_jobs > 0 {
            validate_lease(offer.lease)?;
        }
        self.local()?;
        // The first intake of each key, in groups of whole intakes that fit one batch.
        let mut seen = HashSet::new();
        let mut groups: Vec<Vec<usize>> = Vec::new();
        let mut size = 0;
        for (i, intake) in intakes.iter().enumerate() {
            if !seen.insert(intake.event.key()) {
                continue;
            }
            let writes = 2 + intake.jobs.len();
            if writes > MAX_BATCH {
                return Err(Error::invalid_input(format!(
                    "event {:?} has {} jobs; the JetStream outbox stores at most {} with one event",
                    intake.event.id.as_str(),
                    intake.jobs.len(),
                    MAX_BATCH - 2
                )));
            }
            if groups.is_empty() || size + writes > MAX_BATCH {
                groups.push(Vec::new());
                size = 0;
            }
            groups.last_mut().expect("pushed").push(i);
            size += writes;
        }
        let mut accepted = Accepted {
            new: vec![false; intakes.len()],
            leased: Vec::new(),
        };
        for group in groups {
            self.accept_group(intakes, &group, offer, &mut accepted)
                .await?;
        }
        Ok(accepted)
    }

    async fn settle(&self, settlement: &Settlement) -> Result<Vec<JobId>> {
        let local = self.local()?;
        let mut first = Vec::with_capacity(settlement.attempts.len());
        for attempt in &settlement.attempts {
            let stored = Attempt {
                event_data: Payload::new(serde_json::Value::Null),
                event_trace: None,
                ..attempt.clone()
            };
            let value = serde_json::to_vec(&stored).map_err(|e| {
                Error::backend("an attempt cannot be written to the queue's bucket", e)
            })?;
            let key = format!("{ATTEMPT_KEY}{}.{}", self.owner.simple(), attempt.id);
            first.push(Write::put(key, Bytes::from(value)));
        }
        for write in &first {
            if let Some(value) = write.value() {
                local.remember(write.key().to_owned(), value.clone());
            }
        }
        let keys: Vec<String> = first.iter().map(|w| w.key().to_owned()).collect();
        let mut items = completions(&settlement.complete);
        items.extend(reschedules(&settlement.reschedule));
        items.extend(dead_letters(&settlement.dead_letter, Timestamp::now()));
        let settled = self.settle_held(first, items).await;
        if settled.is_err() {
            local.forget(keys.iter().map(String::as_str));
        }
        Ok(settled?.0)
    }

    /// The events waiting in the bucket and, beside them, events other processes accepted
    /// lately even when shipped already (kept in memory by the view, `View::recent_event`):
    /// the same events the log store holds, found without asking it.
    async fn get_events(&self, keys: &[EventKey]) -> Result<HashMap<EventKey, Event>> {
        let mut values: Vec<(EventKey, Bytes)> = Vec::new();
        let waiting: Vec<(EventKey, (u64, String))> = {
            let index = self.view.index();
            keys.iter()
                .filter_map(|key| {
                    let hash = key_hash(key);
                    if let Some(value) = self.view.recent_event(&hash) {
                        values.push((key.clone(), value));
                        return None;
                    }
                    let (sequence, stored) = index.waiting_event(&hash)?;
                    Some((key.clone(), (sequence, stored.to_owned())))
                })
                .collect()
        };
        let records: Vec<(u64, String)> = waiting.iter().map(|(_, r)| r.clone()).collect();
        let read = self.values(&records).await?;
        let mut unread = Vec::new();
        for ((key, record), value) in waiting.into_iter().zip(read) {
            match value {
                Some(value) => values.push((key, value)),
                None => unread.push((key, record)),
            }
        }
        values.extend(self.read_again(unread).await?);
        let mut events = HashMap::with_capacity(values.len());
        for (key, value) in values {
            if let Ok(event) = serde_json::from_slice::<Event>(&value)
                && event.key() == key
            {
                events.insert(key, event);
            }
        }
        Ok(events)
    }

    async fn take(&self, max_records: usize) -> Result<Option<Box<dyn Shipment>>> {
        let local = self.local()?;
        let now = Timestamp::now();
        let picked: Vec<(u64, Waiting)> = {
            let index = self.view.index();
            let alive = index.owners_since(now.saturating_sub(self.orphaned_after));
            let adopter = alive.iter().chain([&self.owner]).min() == Some(&self.owner);
            let orphaned_before = now.saturating_sub(self.orphaned_after);
            let ships = |w: &Waiting| {
                w.owner == self.owner
                    || (adopter && !alive.contains(&w.owner) && w.at < orphaned_before)
            };
            let mut held = local.held.lock();
            let mut picked = Vec::new();
            // Events first, then attempts, each oldest first.
            for events in [true, false] {
                for (sequence, waiting) in index.waiting() {
                    if picked.len() == max_records {
                        break;
                    }
                    if waiting.event.is_some() == events
                        && !held.contains(&sequence)
                        && ships(waiting)
                    {
                        picked.push((sequence, waiting.clone()));
                    }
                }
            }
            held.extend(picked.iter().map(|(s, _)| *s));
            picked
        };
        if picked.is_empty() {
            return Ok(None);
        }
        let mut shipment = JetStreamShipment {
            writer: Arc::clone(&self.writer),
            view: Arc::clone(&self.view),
            held: Arc::clone(&local.held),
            cache: Arc::clone(&local.cache),
            records: picked.iter().map(|(s, w)| (*s, w.key.clone())).collect(),
            events: Vec::new(),
            attempts: Vec::new(),
        };
        let values = self.values(&shipment.records).await?;
        // A shipment removes only what it read: a record it could not read (the stream's
        // leader has not applied it yet, or another queue shipped it) stays for a later one.
        let mut kept = Vec::with_capacity(picked.len());
        for ((sequence, waiting), value) in picked.iter().zip(values) {
            let Some(value) = value else {
                tracing::debug!(key = %waiting.key, "a waiting record could not be read; left for a later shipment");
                continue;
            };
            let parsed = if waiting.event.is_some() {
                serde_json::from_slice(&value).map(|e| shipment.events.push(e))
            } else {
                serde_json::from_slice(&value).map(|a| shipment.attempts.push(a))
            };
            match parsed {
                Ok(()) => kept.push((*sequence, waiting.key.clone())),
                Err(e) => tracing::warn!(key = %waiting.key, error = %e,
                    "a record of the outbox cannot be read; it is left in the bucket"),
            }
        }
        // Dropping the full list gives back the records left out; the shipment keeps the rest.
        let taken = std::mem::replace(&mut shipment.records, kept);
        {
            let mut held = local.held.lock();
            for (sequence, _) in &taken {
                if !shipment.records.iter().any(|(s, _)| s == sequence) {
                    held.remove(sequence);
                }
            }
        }
        if shipment.records.is_empty() {
            return Ok(None);
        }
        Ok(Some(Box::new(shipment)))
    }

    async fn prune_keys(&self, before: Timestamp, _max: usize) -> Result<u64> {
        self.local()?;
        let mut bound = match self.writer.first_sequence_since(before).await? {
            Some(sequence) => sequence,
            None => self.writer.last_sequence().await? + 1,
        };
        // An event still waiting keeps its key: the key was written just before it.
        if let Some(oldest) = self.view.index().oldest_waiting_event() {
            bound = bound.min(oldest.saturating_sub(1));
        }
        if bound <= 1 {
            return Ok(0);
        }
        self.writer.purge_before(KEY_KEY, bound).await
    }

    async fn backlog(&self) -> Result<OutboxBacklog> {
        self.local()?;
        self.sync().await?;
        let (events, attempts, oldest) = self.view.index().waiting_counts();
        Ok(OutboxBacklog {
            events,
            attempts,
            oldest,
        })
    }

    fn is_log(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sheaf_store::{EventId, TenantId};

    #[test]
    fn an_event_key_hashes_to_32_hex_digits_that_tell_tenants_apart() {
        let key = |tenant: &str, id: &str| EventKey {
            tenant_id: TenantId::new(tenant).expect("tenant"),
            event_id: EventId::new(id).expect("id"),
        };
        let a = key_hash(&key("acme", "evt-1"));
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(a, key_hash(&key("acme", "evt-1")));
        assert_ne!(a, key_hash(&key("acme", "evt-2")));
        // The separator keeps ("ab", "c") and ("a", "bc") apart.
        assert_ne!(key_hash(&key("ab", "c")), key_hash(&key("a", "bc")));
    }
}
