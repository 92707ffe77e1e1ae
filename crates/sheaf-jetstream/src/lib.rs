//! Sheaf's delivery queue on NATS JetStream: a [`JobQueue`] whose jobs live in a replicated
//! key-value bucket, so that the queue is as available as the JetStream cluster under it.
#![doc = include_str!("../README.md")]

mod index;
mod outbox;
mod outcome;
mod shipment;
mod view;
mod write;

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use async_trait::async_trait;
use sheaf_store::{
    ClaimedJob, DeadLetter, DeadLetterRequest, Error, Job, JobId, JobQueue, Lease, Page,
    PageRequest, QueueDepth, Renewed, Reschedule, Result, TenantId, Timestamp, validate_job,
    validate_lease,
};

use crate::index::Record;
use crate::outcome::{Outcome, completions, dead_letters, holds, lease_end, reschedules};
use crate::view::View;
use crate::write::{Change, Write, Written};

/// Where the queue's bucket is and how it is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JetStreamConfig {
    /// The servers to connect to, `nats://[user:password@]host:port`; any one of a cluster is
    /// enough, more let the first connection survive one server being down.
    pub urls: Vec<String>,
    /// The key-value bucket holding the jobs; created at start if missing. Processes that share
    /// work name the same bucket.
    pub bucket: String,
    /// How many servers keep the bucket, when it is created: a write is acknowledged once a
    /// majority of them has it. 3 on a cluster of three or more; 1 on a single server.
    pub replicas: usize,
}

impl JetStreamConfig {
    /// The bucket's name when none is given.
    pub const DEFAULT_BUCKET: &str = "sheaf_jobs";

    /// Checks what a connection cannot: at least one URL, a bucket name JetStream takes, and 1
    /// to 5 replicas.
    pub fn validate(&self) -> std::result::Result<(), String> {
        if self.urls.is_empty() {
            return Err("no server URL given".into());
        }
        if let Some(url) = self.urls.iter().find(|u| !u.starts_with("nats://")) {
            return Err(format!("{url:?} must start with nats://"));
        }
        if self.bucket.is_empty()
            || !self
                .bucket
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(format!(
                "bucket name {:?} must be letters, digits, `_` and `-`",
                self.bucket
            ));
        }
        if !(1..=5).contains(&self.replicas) {
            return Err(format!(
                "{} replicas: JetStream keeps 1 to 5",
                self.replicas
            ));
        }
        Ok(())
    }
}

/// The job queue in a JetStream key-value bucket. See the crate docs for how it works.
pub struct JetStreamQueue {
    config: JetStreamConfig,
    writer: Arc<write::Writer>,
    view: Arc<View>,
    /// Jobs this process is claiming right now, so two claims of one process never race for
    /// the same job.
    claiming: parking_lot::Mutex<HashSet<JobId>>,
    watcher: tokio::task::JoinHandle<()>,
    /// This queue's id: its outbox records carry it, and its heartbeats name it.
    owner: uuid::Uuid,
    /// The outbox's state in this process; `None` on a server that cannot store atomic batches.
    outbox: Option<outbox::Local>,
    /// How long another queue's records wait for it before this one ships them.
    orphaned_after: Duration,
}

impl JetStreamQueue {
    /// Connects, creates the bucket if it is missing, and reads it whole before answering.
    pub async fn connect(config: JetStreamConfig) -> Result<Self> {
        config.validate().map_err(Error::invalid_input)?;
        let client = async_nats::ConnectOptions::new()
            .name("sheaf-queue")
            .ping_interval(Duration::from_secs(10))
            .connect(config.urls.clone())
            .await
            .map_err(|e| Error::unavailable("connecting to NATS for the queue", e))?;
        let version = client.server_info().version;
        if config.replicas > 1 && !serializes_replicated_writes(&version) {
            return Err(Error::invalid_input(format!(
                "nats-server {version} cannot keep a replicated queue: before 2.10 it checks a write's expected revision before the replicas agree on the write, so two claims of one job sent together can both be stored; use nats-server 2.10 or later, or one replica"
            )));
        }
        let atomic = stores_atomic_batches(&version);
        let context = jetstream::ContextBuilder::new()
            .timeout(Duration::from_secs(10))
            .max_ack_inflight(write::CHUNK * 2)
            .build(client.clone());
        // The bucket's stream is made here rather than by async-nats's bucket creation, which
        // reads account details a 2.9 server does not send, and which forbids removing a
        // message: the deletion markers of finished jobs are removed (see `write.rs`).
        let stream_name = format!("KV_{}", config.bucket);
        if context.get_stream(&stream_name).await.is_err() {
            context
                .create_stream(jetstream::stream::Config {
                    name: stream_name.clone(),
                    description: Some("Sheaf's delivery queue: one key per job".into()),
                    subjects: vec![format!("$KV.{}.>", config.bucket)],
                    max_messages_per_subject: 1,
                    storage: jetstream::stream::StorageType::File,
                    num_replicas: config.replicas,
                    discard: jetstream::stream::DiscardPolicy::New,
                    allow_rollup: true,
                    deny_delete: false,
                    allow_direct: true,
                    allow_atomic_publish: atomic,
                    ..jetstream::stream::Config::default()
                })
                .await
                .map_err(|e| {
                    Error::unavailable(
                        format!("creating the queue's bucket {:?}", config.bucket),
                        e,
                    )
                })?;
        }
        let store = context
            .get_key_value(&config.bucket)
            .await
            .map_err(|e| Error::unavailable("opening the queue's bucket", e))?;
        let mut stream = context
            .get_stream(stream_name)
            .await
            .map_err(|e| Error::unavailable("reading the queue's bucket", e))?;
        if atomic && !stream.cached_info().config.allow_atomic_publish {
            // A bucket made before the outbox: its stream learns to store batches.
            let config = jetstream::stream::Config {
                allow_atomic_publish: true,
                ..stream.cached_info().config.clone()
            };
            context
                .update_stream(config)
                .await
                .map_err(|e| Error::unavailable("letting the queue's bucket store batches", e))?;
            stream
                .info()
                .await
                .map_err(|e| Error::unavailable("reading the queue's bucket", e))?;
        }
        let owner = uuid::Uuid::now_v7();
        let view = Arc::new(View::new(owner));
        let watcher = tokio::spawn(view::watch(store, stream.clone(), Arc::clone(&view)));
        let queue = JetStreamQueue {
            writer: Arc::new(write::Writer::new(context, stream, &config.bucket)),
            config,
            view,
            claiming: parking_lot::Mutex::new(HashSet::new()),
            watcher,
            owner,
            outbox: atomic.then(outbox::Local::default),
            orphaned_after: outbox::ORPHANED_AFTER,
        };
        queue.sync().await?;
        Ok(queue)
    }

    /// The configuration it was opened with.
    pub fn config(&self) -> &JetStreamConfig {
        &self.config
    }

    /// Deletes the bucket and everything in it (tests, and `sheaf` never).
    pub async fn delete_bucket(self) -> Result<()> {
        self.watcher.abort();
        self.writer
            .context()
            .delete_key_value(&self.config.bucket)
            .await
            .map_err(|e| Error::unavailable("deleting the queue's bucket", e))?;
        Ok(())
    }

    /// Keeps deletion markers for `age` instead of half a minute, for tests of their removal.
    #[doc(hidden)]
    pub fn keep_markers_for(&mut self, age: Duration) {
        Arc::get_mut(&mut self.writer)
            .expect("set before the queue is shared")
            .marker_kept = age;
    }

    /// Ships the outbox records of a queue that has not beaten for `age` instead of a minute,
    /// for tests of a stopped process's records.
    #[doc(hidden)]
    pub fn adopt_records_after(&mut self, age: Duration) {
        self.orphaned_after = age;
    }

    /// Waits until this process's view holds every write the bucket had when called.
    async fn sync(&self) -> Result<()> {
        let last = self.writer.last_sequence().await?;
        self.view.wait_for(last).await
    }

    /// Writes `changes` to held jobs, each under the rule that the job's stored
    /// `claimed_until` must equal the lease's; returns the jobs whose lease was lost. A lease
    /// given twice counts once. `first` (writes that expect no revision: the outbox's attempts)
    /// go before them in the same pipelined call.
    async fn settle_held(
        &self,
        first: Vec<Write>,
        items: Vec<(Lease, Outcome<'_>)>,
    ) -> Result<(Vec<JobId>, Vec<Lease>)> {
        let mut seen = HashSet::new();
        let mut lost = Vec::new();
        let mut pending = Vec::new();
        {
            let index = self.view.index();
            for (lease, change) in items {
                if !seen.insert(lease) {
                    continue;
                }
                match index.row(&lease.job_id) {
                    Some(row) if holds(&row.record, &lease) => {
                        let write = change(&row.record).write(lease.job_id, row.place);
                        pending.push((lease, change, write.expecting(row.revision)));
                    }
                    _ => lost.push(lease.job_id),
                }
            }
        }
        let skip = first.len();
        let writes: Vec<Write> = first
            .into_iter()
            .chain(pending.iter().map(|(_, _, w)| w.clone()))
            .collect();
        let results = self.writer.write(&writes, &self.view).await?;
        let mut done = Vec::new();
        for ((lease, change, _), result) in pending.into_iter().zip(results.into_iter().skip(skip))
        {
            let settled = match result {
                Written::At(_) => true,
                // The view was behind: read the job from the bucket and try again while the
                // lease still holds there.
                Written::Conflict => {
                    self.writer
                        .retry(lease.job_id, &self.view, |record| {
                            holds(record, &lease).then(|| change(record))
                        })
                        .await?
                }
            };
            if settled {
                done.push(lease);
            } else {
                lost.push(lease.job_id);
            }
        }
        Ok((lost, done))
    }
}

/// Whether a server of this version refuses the second of two compare-and-set writes to one key
/// of a replicated stream that arrive together (2.10 and later).
fn serializes_replicated_writes(version: &str) -> bool {
    let mut parts = version.split('.').map(|p| p.parse::<u64>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (major, minor) >= (2, 10)
}

/// Whether a server of this version stores atomic batches of writes (2.12 and later), which
/// the outbox needs.
fn stores_atomic_batches(version: &str) -> bool {
    let mut parts = version.split('.').map(|p| p.parse::<u64>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (major, minor) >= (2, 12)
}

impl Drop for JetStreamQueue {
    fn drop(&mut self) {
        self.watcher.abort();
    }
}

impl fmt::Debug for JetStreamQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JetStreamQueue")
            .field("bucket", &self.config.bucket)
            .field("replicas", &self.config.replicas)
            .field("applied", &self.view.index().applied())
            .finish()
    }
}

#[async_trait]
impl JobQueue for JetStreamQueue {
    async fn enqueue(&self, jobs: &[Job]) -> Result<()> {
        for job in jobs {
            validate_job(job)?;
        }
        let mut seen = HashSet::with_capacity(jobs.len());
        let fresh: Vec<&Job> = {
            let index = self.view.index();
            jobs.iter()
                .filter(|job| seen.insert(job.id) && index.row(&job.id).is_none())
                .collect()
        };
        let writes: Vec<Write> = fresh
            .iter()
            .map(|job| Change::Put(Record::waiting((*job).clone())).write_new(job.id))
            .collect();
        let results = self.writer.write(&writes, &self.view).await?;
        for (job, result) in fresh.into_iter().zip(results) {
            if result == Written::Conflict {
                // Another process enqueued it, or a finished job left its key deleted: only the
                // latter is written again.
                self.writer.create_over_deleted(job, &self.view).await?;
            }
        }
        Ok(())
    }

    async fn claim(&self, max: usize, lease: Duration) -> Result<Vec<ClaimedJob>> {
        validate_lease(lease)?;
        if max == 0 {
            return Ok(Vec::new());
        }
        let now = Timestamp::now();
        let picked: Vec<(JobId, Record, Write)> = {
            let index = self.view.index();
            let mut claiming = self.claiming.lock();
            index
                .claimable(now, max, &claiming)
                .into_iter()
                .map(|id| {
                    claiming.insert(id);
                    let row = index.row(&id).expect("claimable jobs are in the view");
                    let mut record = row.record.clone();
                    record.claimed_until = Some(lease_end(now, lease, record.claimed_until));
                    let write = Change::Put(record.clone())
                        .write(id, row.place)
                        .expecting(row.revision);
                    (id, record, write)
                })
                .collect()
        };
        let writes: Vec<Write> = picked.iter().map(|(_, _, w)| w.clone()).collect();
        let results = self.writer.write(&writes, &self.view).await;
        {
            let mut claiming = self.claiming.lock();
            for (id, _, _) in &picked {
                claiming.remove(id);
            }
        }
        // A refused write is a job another process claimed first: it is theirs.
        Ok(picked
            .into_iter()
            .zip(results?)
            .filter(|(_, result)| matches!(result, Written::At(_)))
            .map(|((id, record, _), _)| ClaimedJob {
                lease: Lease {
                    job_id: id,
                    claimed_until: record.claimed_until.expect("set above"),
                },
                job: record.job,
            })
            .collect())
    }

    async fn renew(&self, leases: &[Lease], lease: Duration) -> Result<Renewed> {
        validate_lease(lease)?;
        let until = Timestamp::now().saturating_add(lease);
        let items = leases
            .iter()
            .map(|&l| {
                let change: Outcome<'_> = Box::new(move |record: &Record| {
                    let mut record = record.clone();
                    record.claimed_until = Some(until);
                    Change::Put(record)
                });
                (l, change)
            })
            .collect();
        let (lost, done) = self.settle_held(Vec::new(), items).await?;
        Ok(Renewed {
            leases: done
                .into_iter()
                .map(|l| Lease {
                    job_id: l.job_id,
                    claimed_until: until,
                })
                .collect(),
            lost,
        })
    }

    async fn complete(&self, leases: &[Lease]) -> Result<Vec<JobId>> {
        Ok(self.settle_held(Vec::new(), completions(leases)).await?.0)
    }

    async fn reschedule(&self, jobs: &[Reschedule]) -> Result<Vec<JobId>> {
        Ok(self.settle_held(Vec::new(), reschedules(jobs)).await?.0)
    }

    async fn dead_letter(&self, jobs: &[DeadLetterRequest]) -> Result<Vec<JobId>> {
        Ok(self
            .settle_held(Vec::new(), dead_letters(jobs, Timestamp::now()))
            .await?
            .0)
    }

    async fn release(&self, leases: &[Lease]) -> Result<Vec<JobId>> {
        let items = leases
            .iter()
            .map(|&l| {
                let change: Outcome<'_> = Box::new(|record: &Record| {
                    let mut record = record.clone();
                    record.claimed_until = None;
                    Change::Put(record)
                });
                (l, change)
            })
            .collect();
        Ok(self.settle_held(Vec::new(), items).await?.0)
    }

    async fn depth(&self) -> Result<QueueDepth> {
        self.sync().await?;
        Ok(self.view.index().depth(Timestamp::now()))
    }

    async fn list_dead_letters(
        &self,
        tenant: &TenantId,
        page: &PageRequest,
    ) -> Result<Page<DeadLetter>> {
        page.validate()?;
        self.sync().await?;
        self.view.index().dead_letters(tenant, page)
    }

    async fn remove_dead_letters(&self, tenant: &TenantId, ids: &[JobId]) -> Result<u64> {
        self.sync().await?;
        let is_theirs = |record: &Record| record.dead.is_some() && record.job.tenant_id == *tenant;
        self.rewrite(ids, &is_theirs, &|_: &Record| Change::Delete)
            .await
    }

    async fn requeue_dead_letters(&self, tenant: &TenantId, ids: &[JobId]) -> Result<u64> {
        self.sync().await?;
        let now = Timestamp::now();
        let is_theirs = |record: &Record| record.dead.is_some() && record.job.tenant_id == *tenant;
        let back = move |record: &Record| {
            let holds_key = record.dead.as_ref().is_some_and(|d| d.holds_key);
            let job = Job {
                attempt_number: 1,
                last_attempt_time: None,
                due_at: now,
                ..record.job.clone()
            };
            // One that held its key goes back in its place; one that did not is enqueued anew,
            // behind the jobs of its key already waiting.
            Change::Requeue {
                record: Record::waiting(job),
                keep_place: holds_key,
            }
        };
        self.rewrite(ids, &is_theirs, &back).await
    }

    async fn purge_tenant(&self, tenant: &TenantId) -> Result<u64> {
        self.sync().await?;
        let ids: Vec<JobId> = self
            .view
            .index()
            .of_tenant(tenant)
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        let is_theirs = |record: &Record| record.job.tenant_id == *tenant;
        self.rewrite(&ids, &is_theirs, &|_: &Record| Change::Delete)
            .await
    }

    async fn heartbeat(&self, process: uuid::Uuid, ttl: Duration) -> Result<u32> {
        let now = Timestamp::now();
        self.writer
            .beat(process, self.owner, now, &self.view)
            .await?;
        let since = now.saturating_sub(ttl);
        let count = self.view.index().processes_since(since).max(1);
        Ok(u32::try_from(count).unwrap_or(u32::MAX))
    }

    async fn ping(&self) -> Result<()> {
        self.writer.last_sequence().await.map(|_| ())
    }

    async fn maintain(&self) -> Result<bool> {
        let stale = self
            .view
            .index()
            .processes_before(Timestamp::now().saturating_sub(write::FORGET_PROCESSES_AFTER));
        let forgot = self.writer.forget_processes(&stale, &self.view).await?;
        let swept = self.writer.sweep(&self.view).await?;
        Ok(forgot + swept > 0)
    }
}

impl JetStreamQueue {
    /// Writes `change` to each of `ids` whose record passes `applies` (in the view, and again in
    /// the bucket when the view was behind); returns how many were written.
    async fn rewrite(
        &self,
        ids: &[JobId],
        applies: &(dyn Fn(&Record) -> bool + Sync),
        change: &(dyn Fn(&Record) -> Change + Sync),
    ) -> Result<u64> {
        let unique: Vec<JobId> = {
            let mut seen = HashSet::new();
            ids.iter().copied().filter(|id| seen.insert(*id)).collect()
        };
        let pending: Vec<(JobId, Write)> = {
            let index = self.view.index();
            unique
                .into_iter()
                .filter_map(|id| {
                    let row = index.row(&id)?;
                    applies(&row.record).then(|| {
                        (
                            id,
                            change(&row.record)
                                .write(id, row.place)
                                .expecting(row.revision),
                        )
                    })
                })
                .collect()
        };
        let writes: Vec<Write> = pending.iter().map(|(_, w)| w.clone()).collect();
        let results = self.writer.write(&writes, &self.view).await?;
        let mut count = 0;
        for ((id, _), result) in pending.into_iter().zip(results) {
            let done = match result {
                Written::At(_) => true,
                Written::Conflict => {
                    self.writer
                        .retry(id, &self.view, |record| {
                            applies(record).then(|| change(record))
                        })
                        .await?
                }
            };
            count += u64::from(done);
        }
        Ok(count)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn replicated_buckets_need_a_server_that_serializes_their_writes() {
        for (version, serializes) in [
            ("2.9.10", false),
            ("2.9.25", false),
            ("2.10.0", true),
            ("2.15.1", true),
            ("3.0.0", true),
            ("", false),
        ] {
            assert_eq!(
                super::serializes_replicated_writes(version),
                serializes,
                "{version}"
            );
        }
    }
}
