//! [`MemoryJobQueue`]: the delivery queue with leases, in memory.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::fmt;
use std::ops::Bound;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::MemoryLogStore;
use async_trait::async_trait;
use parking_lot::Mutex;
use sheaf_store::{
    ClaimedJob, Cursor, DeadLetter, DeadLetterRequest, DestinationId, Job, JobId, JobQueue, Lease,
    Page, PageRequest, QueueDepth, Renewed, Reschedule, Result, TenantId, Timestamp, validate_job,
    validate_lease,
};

/// Bounds on what the memory queue keeps besides pending jobs.
///
/// Pending jobs are never dropped: each is a delivery somebody is owed, and the queue holds only
/// small rows (ids and times, never payloads). Dead letters are kept for operators to look at and
/// replay, and a destination that is down for good would otherwise add one per event forever, so
/// only the newest `max_dead_letters` are kept; the service says in its log and its metrics when
/// one goes (`MemoryJobQueue::dead_letters_dropped`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueLimits {
    /// At most this many dead letters are kept; the oldest go first.
    pub max_dead_letters: usize,
}

impl Default for QueueLimits {
    /// 10,000 dead letters.
    fn default() -> Self {
        QueueLimits {
            max_dead_letters: 10_000,
        }
    }
}

struct Row {
    job: Job,
    claimed_until: Option<Timestamp>,
}

#[derive(Default)]
struct QueueState {
    jobs: HashMap<JobId, Row>,
    /// Every claimable-in-time job by `(due_at, id)`: the claim order. A job of an order key
    /// is here only while it is the first of its key; the ones behind it wait in `chains`.
    due: BTreeSet<(Timestamp, JobId)>,
    /// The pending jobs of each `(destination, order key)`, in the order they were enqueued.
    chains: HashMap<(DestinationId, String), VecDeque<JobId>>,
    dead: HashMap<JobId, DeadLetter>,
    dead_by_tenant: HashMap<TenantId, BTreeSet<(Timestamp, JobId)>>,
    dead_by_age: BTreeSet<(Timestamp, JobId)>,
}

impl QueueState {
    /// The row of a job the lease still holds, or `None` when the lease is lost.
    fn held(&mut self, lease: &Lease) -> Option<&mut Row> {
        self.jobs
            .get_mut(&lease.job_id)
            .filter(|row| row.claimed_until == Some(lease.claimed_until))
    }

    /// Adds a new job: to the due index, unless an earlier job of its order key is pending.
    fn add_job(&mut self, job: &Job) {
        let first = match &job.order_key {
            None => true,
            Some(key) => {
                let chain = self
                    .chains
                    .entry((job.destination_id, key.clone()))
                    .or_default();
                chain.push_back(job.id);
                chain.len() == 1
            }
        };
        if first {
            self.due.insert((job.due_at, job.id));
        }
        self.jobs.insert(
            job.id,
            Row {
                job: job.clone(),
                claimed_until: None,
            },
        );
    }

    /// Removes a job; if it was the first of its order key, the next of that key becomes
    /// claimable.
    fn remove_job(&mut self, id: JobId) -> Option<Job> {
        let row = self.jobs.remove(&id)?;
        self.due.remove(&(row.job.due_at, id));
        self.leave_chain(&row.job);
        Some(row.job)
    }

    /// Takes `job` out of its order key's chain (a job that is not there is left alone); if it
    /// was the first, the next of the key becomes claimable.
    fn leave_chain(&mut self, job: &Job) {
        let Some(key) = &job.order_key else {
            return;
        };
        let chain_key = (job.destination_id, key.clone());
        let Some(chain) = self.chains.get_mut(&chain_key) else {
            return;
        };
        let was_first = chain.front() == Some(&job.id);
        chain.retain(|j| *j != job.id);
        match chain.front().copied() {
            None => {
                self.chains.remove(&chain_key);
            }
            Some(next) if was_first => {
                let due_at = self.jobs[&next].job.due_at;
                self.due.insert((due_at, next));
            }
            Some(_) => {}
        }
    }

    /// Whether `job` waits behind an earlier job of its order key.
    fn behind(&self, job: &Job) -> bool {
        job.order_key.as_ref().is_some_and(|key| {
            self.chains
                .get(&(job.destination_id, key.clone()))
                .and_then(|chain| chain.front())
                != Some(&job.id)
        })
    }

    /// Removes a dead letter; one that held its key lets the key's next job go.
    fn remove_dead(&mut self, id: JobId) -> Option<DeadLetter> {
        let dead = self.take_dead(id)?;
        if dead.holds_key {
            self.leave_chain(&dead.job);
        }
        Some(dead)
    }

    /// Removes a dead letter from the dead-letter indexes only: one that holds its key stays
    /// first of its key's chain.
    fn take_dead(&mut self, id: JobId) -> Option<DeadLetter> {
        let dead = self.dead.remove(&id)?;
        let key = (dead.dead_lettered_at, id);
        self.dead_by_age.remove(&key);
        if let Some(set) = self.dead_by_tenant.get_mut(&dead.job.tenant_id) {
            set.remove(&key);
            if set.is_empty() {
                self.dead_by_tenant.remove(&dead.job.tenant_id);
            }
        }
        Some(dead)
    }

    /// Runs `apply` for every lease that still holds (once per job), and returns the ids of those
    /// that do not.
    fn for_held<T>(
        &mut self,
        items: &[T],
        lease_of: impl Fn(&T) -> Lease,
        mut apply: impl FnMut(&mut Self, &T),
    ) -> Vec<JobId> {
        let mut lost = Vec::new();
        let mut done = HashSet::new();
        for item in items {
            let lease = lease_of(item);
            if done.contains(&lease) {
                continue;
            }
            if self.held(&lease).is_some() {
                apply(self, item);
                done.insert(lease);
            } else {
                lost.push(lease.job_id);
            }
        }
        lost
    }
}

/// The job queue in memory. Cheap to share: wrap it in an `Arc` (`Arc<dyn JobQueue>`).
///
/// Its clock is this process's (`Timestamp::now()`). A new `claimed_until` is always later than
/// the job's previous one, even if the system clock steps back, so a lease is never reissued.
///
/// Built with [`Self::holding_events_in`], it holds each job's event in the memory log for as
/// long as it keeps the job (waiting, leased, or as a dead letter), so retention never drops the
/// payload of a delivery still owed (see [`MemoryLogStore`]'s module docs). The holds are taken
/// and released under the queue's lock, in the order the jobs come and go.
pub struct MemoryJobQueue {
    state: Mutex<QueueState>,
    limits: QueueLimits,
    log: Option<Arc<MemoryLogStore>>,
    dead_letters_dropped: AtomicU64,
}

impl MemoryJobQueue {
    /// An empty queue that keeps what `limits` allows.
    pub fn new(limits: QueueLimits) -> Self {
        MemoryJobQueue {
            state: Mutex::new(QueueState::default()),
            limits,
            log: None,
            dead_letters_dropped: AtomicU64::new(0),
        }
    }

    /// An empty queue that holds its jobs' events in `log` (see the type's docs).
    pub fn holding_events_in(limits: QueueLimits, log: Arc<MemoryLogStore>) -> Self {
        MemoryJobQueue {
            log: Some(log),
            ..Self::new(limits)
        }
    }

    /// How many dead letters went to keep `max_dead_letters`, since the queue was made.
    pub fn dead_letters_dropped(&self) -> u64 {
        self.dead_letters_dropped.load(Ordering::Relaxed)
    }

    fn hold(&self, jobs: &[&Job]) {
        if let Some(log) = &self.log {
            log.hold(jobs);
        }
    }

    fn release(&self, jobs: &[&Job]) {
        if let Some(log) = &self.log {
            log.release(jobs);
        }
    }

    /// `now + lease`, moved past `previous` if the clock would not get there.
    fn lease_end(now: Timestamp, lease: Duration, previous: Option<Timestamp>) -> Timestamp {
        let end = now.saturating_add(lease);
        match previous {
            Some(previous) if end <= previous => previous.saturating_add(Duration::from_micros(1)),
            _ => end,
        }
    }
}

impl Default for MemoryJobQueue {
    fn default() -> Self {
        Self::new(QueueLimits::default())
    }
}

impl fmt::Debug for MemoryJobQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.state.lock();
        f.debug_struct("MemoryJobQueue")
            .field("jobs", &state.jobs.len())
            .field("dead_letters", &state.dead.len())
            .field("limits", &self.limits)
            .finish()
    }
}

#[async_trait]
impl JobQueue for MemoryJobQueue {
    async fn enqueue(&self, jobs: &[Job]) -> Result<()> {
        for job in jobs {
            validate_job(job)?;
        }
        let mut state = self.state.lock();
        let mut added = Vec::with_capacity(jobs.len());
        for job in jobs {
            if state.jobs.contains_key(&job.id) || state.dead.contains_key(&job.id) {
                continue;
            }
            state.add_job(job);
            added.push(job);
        }
        self.hold(&added);
        Ok(())
    }

    async fn claim(&self, max: usize, lease: Duration) -> Result<Vec<ClaimedJob>> {
        validate_lease(lease)?;
        if max == 0 {
            return Ok(Vec::new());
        }
        let mut state = self.state.lock();
        let now = Timestamp::now();
        let mut picked = Vec::with_capacity(max);
        // Held jobs stay in the due index (like rows skipped by `SKIP LOCKED`); there are at most
        // as many as there are workers, so walking past them is cheap.
        for &(due_at, id) in &state.due {
            if due_at > now || picked.len() == max {
                break;
            }
            let held = state.jobs[&id]
                .claimed_until
                .is_some_and(|until| until >= now);
            if !held {
                picked.push(id);
            }
        }
        let mut claimed = Vec::with_capacity(picked.len());
        for id in picked {
            let row = state.jobs.get_mut(&id).expect("picked from the index");
            let claimed_until = Self::lease_end(now, lease, row.claimed_until);
            row.claimed_until = Some(claimed_until);
            claimed.push(ClaimedJob {
                job: row.job.clone(),
                lease: Lease {
                    job_id: id,
                    claimed_until,
                },
            });
        }
        Ok(claimed)
    }

    async fn renew(&self, leases: &[Lease], lease: Duration) -> Result<Renewed> {
        validate_lease(lease)?;
        let mut state = self.state.lock();
        let now = Timestamp::now();
        let mut renewed = Vec::new();
        let lost = state.for_held(
            leases,
            |l| *l,
            |state, old| {
                let row = state.jobs.get_mut(&old.job_id).expect("held");
                // The same owner keeps the job, so unlike a claim a renewal need not move forward.
                let claimed_until = now.saturating_add(lease);
                row.claimed_until = Some(claimed_until);
                renewed.push(Lease {
                    job_id: old.job_id,
                    claimed_until,
                });
            },
        );
        Ok(Renewed {
            leases: renewed,
            lost,
        })
    }

    async fn complete(&self, leases: &[Lease]) -> Result<Vec<JobId>> {
        let mut state = self.state.lock();
        let mut done = Vec::with_capacity(leases.len());
        let lost = state.for_held(
            leases,
            |l| *l,
            |state, lease| done.extend(state.remove_job(lease.job_id)),
        );
        self.release(&done.iter().collect::<Vec<_>>());
        Ok(lost)
    }

    async fn reschedule(&self, jobs: &[Reschedule]) -> Result<Vec<JobId>> {
        let mut state = self.state.lock();
        Ok(state.for_held(
            jobs,
            |r| r.lease,
            |state, r| {
                let id = r.lease.job_id;
                let row = state.jobs.get_mut(&id).expect("held");
                let old_due = row.job.due_at;
                row.job.due_at = r.due_at;
                row.job.attempt_number = r.attempt_number;
                row.job.last_attempt_time = r.last_attempt_time;
                row.claimed_until = None;
                state.due.remove(&(old_due, id));
                state.due.insert((r.due_at, id));
            },
        ))
    }

    async fn dead_letter(&self, jobs: &[DeadLetterRequest]) -> Result<Vec<JobId>> {
        let mut state = self.state.lock();
        let now = Timestamp::now();
        let lost = state.for_held(
            jobs,
            |r| r.lease,
            |state, r| {
                let id = r.lease.job_id;
                let holds_key = r.hold_key && state.jobs[&id].job.order_key.is_some();
                let job = if holds_key {
                    // Out of the queue, but still first of its key's chain: the key waits.
                    let row = state.jobs.remove(&id).expect("held");
                    state.due.remove(&(row.job.due_at, id));
                    row.job
                } else {
                    state.remove_job(id).expect("held")
                };
                state
                    .dead_by_tenant
                    .entry(job.tenant_id.clone())
                    .or_default()
                    .insert((now, id));
                state.dead_by_age.insert((now, id));
                state.dead.insert(
                    id,
                    DeadLetter {
                        job,
                        reason: r.reason.clone(),
                        dead_lettered_at: now,
                        holds_key,
                    },
                );
            },
        );
        let mut dropped = Vec::new();
        while state.dead.len() > self.limits.max_dead_letters {
            let Some(&(_, oldest)) = state.dead_by_age.first() else {
                break;
            };
            dropped.extend(state.remove_dead(oldest).map(|d| d.job));
        }
        if !dropped.is_empty() {
            self.dead_letters_dropped
                .fetch_add(dropped.len() as u64, Ordering::Relaxed);
            self.release(&dropped.iter().collect::<Vec<_>>());
        }
        Ok(lost)
    }

    async fn release(&self, leases: &[Lease]) -> Result<Vec<JobId>> {
        let mut state = self.state.lock();
        Ok(state.for_held(
            leases,
            |l| *l,
            |state, lease| {
                // The job keeps its due time, which has passed: it is claimable again at once.
                state
                    .jobs
                    .get_mut(&lease.job_id)
                    .expect("held")
                    .claimed_until = None;
            },
        ))
    }

    async fn depth(&self) -> Result<QueueDepth> {
        let state = self.state.lock();
        let now = Timestamp::now();
        let mut depth = QueueDepth {
            dead_lettered: state.dead.len() as u64,
            ..QueueDepth::default()
        };
        for row in state.jobs.values() {
            if row.claimed_until.is_some_and(|until| until >= now) {
                depth.claimed += 1;
            } else if row.job.due_at <= now && !state.behind(&row.job) {
                depth.due += 1;
            } else {
                depth.scheduled += 1;
            }
        }
        Ok(depth)
    }

    async fn remove_dead_letters(&self, tenant: &TenantId, ids: &[JobId]) -> Result<u64> {
        let mut state = self.state.lock();
        let mut removed = Vec::new();
        for id in ids {
            if state
                .dead
                .get(id)
                .is_some_and(|d| d.job.tenant_id == *tenant)
            {
                removed.extend(state.remove_dead(*id).map(|d| d.job));
            }
        }
        self.release(&removed.iter().collect::<Vec<_>>());
        Ok(removed.len() as u64)
    }

    async fn requeue_dead_letters(&self, tenant: &TenantId, ids: &[JobId]) -> Result<u64> {
        let mut state = self.state.lock();
        let now = Timestamp::now();
        let mut requeued = 0;
        for id in ids {
            if state
                .dead
                .get(id)
                .is_none_or(|d| d.job.tenant_id != *tenant)
            {
                continue;
            }
            let dead = state.take_dead(*id).expect("checked");
            let job = Job {
                attempt_number: 1,
                last_attempt_time: None,
                due_at: now,
                ..dead.job
            };
            if dead.holds_key {
                // Still first of its key's chain: back in the due index, in its place.
                state.due.insert((job.due_at, job.id));
                state.jobs.insert(
                    job.id,
                    Row {
                        job,
                        claimed_until: None,
                    },
                );
            } else {
                state.add_job(&job);
            }
            requeued += 1;
        }
        // The queue held the events while they were dead letters and goes on holding them.
        Ok(requeued)
    }

    async fn list_dead_letters(
        &self,
        tenant: &TenantId,
        page: &PageRequest,
    ) -> Result<Page<DeadLetter>> {
        page.validate()?;
        let upper = match &page.cursor {
            Some(cursor) => Bound::Excluded((cursor.time(), JobId::from_str(cursor.id())?)),
            None => Bound::Unbounded,
        };
        let state = self.state.lock();
        let Some(index) = state.dead_by_tenant.get(tenant) else {
            return Ok(Page::empty());
        };
        let limit = page.limit_usize();
        let items: Vec<DeadLetter> = index
            .range((Bound::Unbounded, upper))
            .rev()
            .take(limit + 1)
            .map(|(_, id)| state.dead[id].clone())
            .collect();
        Ok(Page::from_overfetch(items, limit, |d| {
            Cursor::new(d.dead_lettered_at, d.job.id.to_string())
        }))
    }

    async fn purge_tenant(&self, tenant: &TenantId) -> Result<u64> {
        let mut state = self.state.lock();
        let jobs: Vec<JobId> = state
            .jobs
            .values()
            .filter(|row| row.job.tenant_id == *tenant)
            .map(|row| row.job.id)
            .collect();
        let dead: Vec<JobId> = state
            .dead_by_tenant
            .get(tenant)
            .map(|set| set.iter().map(|&(_, id)| id).collect())
            .unwrap_or_default();
        let mut removed = Vec::with_capacity(jobs.len() + dead.len());
        for &id in &jobs {
            removed.extend(state.remove_job(id));
        }
        for &id in &dead {
            removed.extend(state.remove_dead(id).map(|d| d.job));
        }
        self.release(&removed.iter().collect::<Vec<_>>());
        Ok(removed.len() as u64)
    }
}
