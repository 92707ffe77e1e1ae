//! Writing to the bucket: pipelined publishes, each a compare-and-set on its key's revision,
//! and the removal of deletion markers once every view has read them.
//!
//! Every write names the revision it expects its key to be at (`Nats-Expected-Last-Subject-
//! Sequence`; 0 for a key with no message), so the stream refuses it if anything wrote the key
//! in between: that is what makes a claim exclusive and a lost lease change nothing, across
//! processes. A call's writes are sent one after another on one connection, which keeps their
//! order in the stream, and their acknowledgements are awaited together, so a call of a
//! thousand jobs costs about one round trip rather than a thousand. Each acknowledgement comes
//! once the write is stored on a majority of the bucket's replicas.
//!
//! A finished job's key is deleted, which leaves a small marker message in the stream (the
//! other processes' views learn of the deletion from it). The process that wrote a marker
//! removes it from the stream half a minute later ([`Writer::sweep`]), so the stream holds the
//! jobs still waiting, not every job ever delivered.

use std::time::{Duration, Instant};

use async_nats::HeaderValue;
use async_nats::jetstream::Context;
use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::message::StreamMessage;
use async_nats::jetstream::stream::{LastRawMessageErrorKind, Stream};
use bytes::Bytes;
use sheaf_store::{Error, Job, JobId, Result, Timestamp};

use crate::index::Record;
use crate::view::{JOB_KEY, PROCESS_KEY, View};

/// Writes sent before their acknowledgements are awaited.
pub(crate) const CHUNK: usize = 1024;

/// A heartbeat not renewed for this long is removed from the bucket.
pub(crate) const FORGET_PROCESSES_AFTER: Duration = Duration::from_secs(24 * 3600);

/// How long a deletion marker stays in the stream after it was written: time for every
/// process's view to read it. A view that reads the stream later than that misses the deletion,
/// keeps the finished job, and drops it the first time a claim of it is refused.
pub(crate) const MARKER_KEPT: Duration = Duration::from_secs(30);

/// How many times a write refused because its key changed is read again and retried.
const RETRIES: usize = 8;

/// What a write does to its key.
#[derive(Debug, Clone)]
pub(crate) enum Change {
    /// Stores this record.
    Put(Record),
    /// Deletes the key.
    Delete,
    /// Puts a dead letter back in the queue: in its old place in its key's line, or anew.
    Requeue { record: Record, keep_place: bool },
}

impl Change {
    /// The write of this change to job `id`, whose place in its key's line is `place`.
    pub(crate) fn write(self, id: JobId, place: u64) -> Write {
        let value = match self {
            Change::Put(mut record) => {
                record.place = Some(place);
                Some(record)
            }
            Change::Requeue {
                mut record,
                keep_place,
            } => {
                record.place = keep_place.then_some(place);
                Some(record)
            }
            Change::Delete => None,
        };
        Write {
            key: format!("{JOB_KEY}{id}"),
            value: value.map(|r| Bytes::from(serde_json::to_vec(&r).expect("records serialize"))),
            expect: None,
        }
    }

    /// The write that enqueues job `id`: its key must have no message, and the write's own
    /// sequence becomes its place.
    pub(crate) fn write_new(self, id: JobId) -> Write {
        let mut write = self.write(id, 0);
        if let Some(value) = &mut write.value {
            let mut record: Record = serde_json::from_slice(value).expect("just written");
            record.place = None;
            *value = Bytes::from(serde_json::to_vec(&record).expect("records serialize"));
        }
        write.expecting(0)
    }
}

/// One publish to the bucket.
#[derive(Debug, Clone)]
pub(crate) struct Write {
    key: String,
    /// `None` deletes the key.
    value: Option<Bytes>,
    /// The revision the key must be at; `None` writes whatever it is at.
    expect: Option<u64>,
}

impl Write {
    /// Stores `value` under `key`, whatever the key holds.
    pub(crate) fn put(key: String, value: Bytes) -> Self {
        Write {
            key,
            value: Some(value),
            expect: None,
        }
    }

    /// Deletes `key`.
    pub(crate) fn delete(key: String) -> Self {
        Write {
            key,
            value: None,
            expect: None,
        }
    }

    /// The key written, without the bucket's prefix.
    pub(crate) fn key(&self) -> &str {
        &self.key
    }

    /// The value written; `None` for a deletion.
    pub(crate) fn value(&self) -> Option<&Bytes> {
        self.value.as_ref()
    }

    pub(crate) fn expecting(mut self, revision: u64) -> Self {
        self.expect = Some(revision);
        self
    }
}

impl Write {
    /// The headers of its publish: the expected revision, and the deletion mark.
    fn headers(&self) -> async_nats::HeaderMap {
        let mut headers = async_nats::HeaderMap::new();
        if let Some(revision) = self.expect {
            headers.insert(
                async_nats::header::NATS_EXPECTED_LAST_SUBJECT_SEQUENCE,
                HeaderValue::from(revision),
            );
        }
        if self.value.is_none() {
            headers.insert("KV-Operation", "DEL");
        }
        headers
    }
}

/// Most writes in one atomic batch: the server's default limit.
pub(crate) const MAX_BATCH: usize = 1000;

/// What became of one write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Written {
    /// Stored at this stream sequence.
    At(u64),
    /// Refused: the key was not at the expected revision.
    Conflict,
}

/// Writes to one bucket. See the module docs.
#[derive(Debug)]
pub(crate) struct Writer {
    context: Context,
    stream: Stream,
    /// `$KV.<bucket>.`: a key's subject is this and the key.
    prefix: String,
    /// How long a deletion marker is kept ([`MARKER_KEPT`]).
    pub(crate) marker_kept: Duration,
}

impl Writer {
    pub(crate) fn new(context: Context, stream: Stream, bucket: &str) -> Self {
        Writer {
            context,
            stream,
            prefix: format!("$KV.{bucket}."),
            marker_kept: MARKER_KEPT,
        }
    }

    pub(crate) fn context(&self) -> &Context {
        &self.context
    }

    /// The stream's last sequence: every write the bucket had when asked.
    pub(crate) async fn last_sequence(&self) -> Result<u64> {
        let info = self
            .stream
            .get_info()
            .await
            .map_err(|e| Error::unavailable("reading the queue's stream state from NATS", e))?;
        Ok(info.state.last_sequence)
    }

    /// Sends `writes` in order and waits for every acknowledgement, then for the view to have
    /// read them.
    pub(crate) async fn write(&self, writes: &[Write], view: &View) -> Result<Vec<Written>> {
        let mut results = Vec::with_capacity(writes.len());
        for chunk in writes.chunks(CHUNK) {
            let mut acks = Vec::with_capacity(chunk.len());
            for write in chunk {
                acks.push(self.send(write, write.headers()).await?.into_future());
            }
            for (write, ack) in chunk.iter().zip(futures::future::join_all(acks).await) {
                match ack {
                    Ok(ack) => {
                        if write.value.is_none() {
                            view.markers
                                .lock()
                                .push_back((Instant::now(), ack.sequence));
                        }
                        results.push(Written::At(ack.sequence));
                    }
                    Err(e) if refused_as_stale(&e) => {
                        results.push(Written::Conflict);
                    }
                    Err(e) => {
                        return Err(Error::unavailable(
                            "the queue's bucket did not acknowledge a write",
                            e,
                        ));
                    }
                }
            }
        }
        let last = results
            .iter()
            .filter_map(|r| match r {
                Written::At(s) => Some(*s),
                Written::Conflict => None,
            })
            .max();
        if let Some(last) = last {
            view.wait_for(last).await?;
        }
        Ok(results)
    }

    /// Publishes one write with `headers` to the stream; the answer is the acknowledgement to
    /// wait for.
    async fn send(
        &self,
        write: &Write,
        headers: async_nats::HeaderMap,
    ) -> Result<async_nats::jetstream::context::PublishAckFuture> {
        self.context
            .publish_with_headers(
                format!("{}{}", self.prefix, write.key),
                headers,
                write.value.clone().unwrap_or_default(),
            )
            .await
            .map_err(|e| Error::unavailable("writing to the queue's bucket", e))
    }

    /// Stores `writes` as one atomic batch (nats-server 2.12 and later, on a stream that allows
    /// it): every write is stored, or none is. Answers the stream sequence of the last write, or
    /// `None` when the stream refused the batch, which happens when a key was not at the
    /// revision its write expected (the server does not say which). Waits for the view to read
    /// the batch. At most [`MAX_BATCH`] writes.
    pub(crate) async fn write_batch(&self, writes: &[Write], view: &View) -> Result<Option<u64>> {
        debug_assert!(writes.len() <= MAX_BATCH);
        let Some((last, first)) = writes.split_last() else {
            return Ok(None);
        };
        let client = self.context.client();
        let batch = uuid::Uuid::now_v7().simple().to_string();
        let headers = |write: &Write, n: usize| {
            let mut headers = write.headers();
            headers.insert("Nats-Batch-Id", batch.as_str());
            headers.insert("Nats-Batch-Sequence", HeaderValue::from(n));
            headers
        };
        // The writes before the last go without a reply: the server answers the batch as a
        // whole, at its last write, and refuses all of it if any one failed.
        for (i, write) in first.iter().enumerate() {
            client
                .publish_with_headers(
                    format!("{}{}", self.prefix, write.key),
                    headers(write, i + 1),
                    write.value.clone().unwrap_or_default(),
                )
                .await
                .map_err(|e| Error::unavailable("writing to the queue's bucket", e))?;
        }
        let mut commit = headers(last, writes.len());
        commit.insert("Nats-Batch-Commit", "1");
        let ack = self.send(last, commit).await?.await;
        match ack {
            Ok(ack) => {
                view.wait_for(ack.sequence).await?;
                Ok(Some(ack.sequence))
            }
            Err(e) if refused_as_stale(&e) => Ok(None),
            Err(e) => Err(Error::unavailable(
                "the queue's bucket did not store a batch of writes",
                e,
            )),
        }
    }

    /// What the stream holds under `key` now: nothing, a deletion, or a value, with its
    /// revision.
    pub(crate) async fn key_state(&self, key: &str) -> Result<KeyState> {
        Ok(match self.last_message(key).await? {
            None => KeyState::Absent,
            Some((message, true)) => KeyState::Deleted(message.sequence),
            Some((message, false)) => KeyState::Stored(message.sequence),
        })
    }

    /// The key's last message in the stream, if it has one, and whether that message is a
    /// deletion.
    async fn last_message(&self, key: &str) -> Result<Option<(StreamMessage, bool)>> {
        let subject = format!("{}{key}", self.prefix);
        match self.stream.get_last_raw_message_by_subject(&subject).await {
            Ok(message) => {
                let deleted = message
                    .headers
                    .get("KV-Operation")
                    .is_some_and(|op| op.as_str() == "DEL" || op.as_str() == "PURGE");
                Ok(Some((message, deleted)))
            }
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
            Err(e) => Err(Error::unavailable(
                format!("reading the queue's key {key}"),
                e,
            )),
        }
    }

    /// The message stored at `sequence`: its value, `None` when the stream's leader does not
    /// have it (removed, a deletion, or not applied there yet).
    ///
    /// Asked of the leader, never answered by a replica (a direct get may be), so that `None`
    /// is never a lagging replica's answer. It can still be "not yet": the view reads the
    /// stream through a consumer that may sit on a replica which applied a batch before the
    /// leader did. Callers read again while the view shows the record waiting (`outbox.rs`).
    /// The delivery bench lost events to both before they did: 40 of 60,000 with two
    /// processes, 207 with three.
    pub(crate) async fn value_at(&self, sequence: u64) -> Result<Option<Bytes>> {
        match self.stream.get_raw_message(sequence).await {
            Ok(message) => {
                let deleted = message.headers.get("KV-Operation").is_some();
                Ok((!deleted).then_some(message.payload))
            }
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
            Err(e) => Err(Error::unavailable(
                format!("reading the queue's stream at sequence {sequence}"),
                e,
            )),
        }
    }

    /// The sequence of the first message the stream stored at `time` or later; `None` when
    /// there is none yet.
    pub(crate) async fn first_sequence_since(&self, time: Timestamp) -> Result<Option<u64>> {
        let subject = format!("STREAM.MSG.GET.{}", self.stream.cached_info().config.name);
        let request = serde_json::json!({ "start_time": time.to_string() });
        let answer: serde_json::Value = self
            .context
            .request(subject, &request)
            .await
            .map_err(|e| Error::unavailable("finding a time in the queue's stream", e))?;
        if let Some(sequence) = answer.pointer("/message/seq").and_then(|s| s.as_u64()) {
            return Ok(Some(sequence));
        }
        // 10037: no message at or after that time.
        if answer.pointer("/error/err_code").and_then(|c| c.as_u64()) == Some(10037) {
            return Ok(None);
        }
        Err(Error::Unavailable {
            message: format!("finding a time in the queue's stream: the server answered {answer}"),
            source: None,
        })
    }

    /// Removes every message under keys starting with `prefix` stored before `sequence`;
    /// returns how many went.
    pub(crate) async fn purge_before(&self, prefix: &str, sequence: u64) -> Result<u64> {
        let response = self
            .stream
            .purge()
            .filter(format!("{}{prefix}>", self.prefix))
            .sequence(sequence)
            .await
            .map_err(|e| Error::unavailable("removing old keys from the queue's stream", e))?;
        Ok(response.purged)
    }

    /// The key's latest message in the stream: absent, a deletion, or the record (its place
    /// resolved) and its revision.
    async fn latest(&self, key: &str) -> Result<Latest> {
        match self.last_message(key).await? {
            None => Ok(Latest::Absent),
            Some((message, true)) => Ok(Latest::Deleted(message.sequence)),
            Some((message, false)) => {
                let mut record: Record = serde_json::from_slice(&message.payload).map_err(|e| {
                    Error::backend(format!("the queue's key {key} is not a job"), e)
                })?;
                record.place.get_or_insert(message.sequence);
                Ok(Latest::Record(Box::new(record), message.sequence))
            }
        }
    }

    /// Reads job `id` from the bucket and writes what `decide` makes of it, again while the
    /// key keeps changing under the write; `false` when `decide` declines or the job is gone.
    pub(crate) async fn retry(
        &self,
        id: JobId,
        view: &View,
        decide: impl Fn(&Record) -> Option<Change>,
    ) -> Result<bool> {
        let key = format!("{JOB_KEY}{id}");
        for _ in 0..RETRIES {
            let (record, revision) = match self.latest(&key).await? {
                Latest::Record(record, revision) => (record, revision),
                Latest::Absent | Latest::Deleted(_) => return Ok(false),
            };
            let Some(change) = decide(&record) else {
                return Ok(false);
            };
            let place = record.place.expect("resolved by latest");
            let write = change.write(id, place).expecting(revision);
            if let [Written::At(_)] = self.write(&[write], view).await?[..] {
                return Ok(true);
            }
        }
        Err(Error::conflict(format!(
            "job {id} kept changing under {RETRIES} writes"
        )))
    }

    /// Enqueues `job` whose first write was refused: it is written over a deletion marker (a
    /// finished job with the same id), and left alone if it is in the bucket.
    pub(crate) async fn create_over_deleted(&self, job: &Job, view: &View) -> Result<()> {
        let key = format!("{JOB_KEY}{}", job.id);
        for _ in 0..RETRIES {
            let expect = match self.latest(&key).await? {
                Latest::Record(..) => return Ok(()),
                Latest::Absent => 0,
                Latest::Deleted(revision) => revision,
            };
            let write = Change::Put(Record::waiting(job.clone()))
                .write_new(job.id)
                .expecting(expect);
            if let [Written::At(_)] = self.write(&[write], view).await?[..] {
                return Ok(());
            }
        }
        Err(Error::conflict(format!(
            "job {} kept changing under {RETRIES} writes",
            job.id
        )))
    }

    /// Records that `process` uses the queue at `now`.
    pub(crate) async fn beat(
        &self,
        process: uuid::Uuid,
        owner: uuid::Uuid,
        now: Timestamp,
        view: &View,
    ) -> Result<()> {
        let write = Write {
            key: format!("{PROCESS_KEY}{process}"),
            value: Some(Bytes::from(format!("{} {owner}", now.as_micros()))),
            expect: None,
        };
        self.write(&[write], view).await.map(|_| ())
    }

    /// Removes the heartbeats of processes gone for good.
    pub(crate) async fn forget_processes(
        &self,
        stale: &[uuid::Uuid],
        view: &View,
    ) -> Result<usize> {
        let writes: Vec<Write> = stale
            .iter()
            .map(|p| Write {
                key: format!("{PROCESS_KEY}{p}"),
                value: None,
                expect: None,
            })
            .collect();
        self.write(&writes, view).await.map(|w| w.len())
    }

    /// Removes the deletion markers every view has had time to read, except the stream's last
    /// message (a view waits for the last sequence to arrive, so that one must stay); returns
    /// how many went.
    pub(crate) async fn sweep(&self, view: &View) -> Result<usize> {
        let due: Vec<u64> = {
            let mut markers = view.markers.lock();
            let mut due = Vec::new();
            while let Some(&(at, sequence)) = markers.front() {
                if at.elapsed() < self.marker_kept {
                    break;
                }
                markers.pop_front();
                due.push(sequence);
            }
            due
        };
        if due.is_empty() {
            return Ok(0);
        }
        let last = self.last_sequence().await?;
        let (gone, keep): (Vec<u64>, Vec<u64>) = due.into_iter().partition(|&s| s < last);
        view.markers
            .lock()
            .extend(keep.into_iter().map(|s| (Instant::now(), s)));
        let subject = format!(
            "STREAM.MSG.DELETE.{}",
            self.stream.cached_info().config.name
        );
        for chunk in gone.chunks(CHUNK) {
            let requests = chunk.iter().map(|&seq| {
                let payload = serde_json::json!({ "seq": seq, "no_erase": true });
                let subject = subject.clone();
                async move {
                    self.context
                        .request::<_, _, serde_json::Value>(subject, &payload)
                        .await
                }
            });
            for answer in futures::future::join_all(requests).await {
                // "No message found" (already gone) is as good as removed.
                if let Err(e) = answer {
                    return Err(Error::unavailable(
                        "removing deletion markers from the queue's stream",
                        e,
                    ));
                }
            }
        }
        Ok(gone.len())
    }
}

/// Whether the stream refused a write because its key was not at the expected revision: the
/// key has moved on (10071), or another write of the key is still being agreed on (10164,
/// servers from 2.10 on, which check a replicated write against the writes in flight too).
fn refused_as_stale(error: &async_nats::jetstream::context::PublishError) -> bool {
    use async_nats::jetstream::ErrorCode;
    if error.kind() == PublishErrorKind::WrongLastSequence {
        return true;
    }
    std::error::Error::source(error)
        .and_then(|source| source.downcast_ref::<async_nats::jetstream::Error>())
        .is_some_and(|e| {
            matches!(
                e.error_code(),
                ErrorCode::STREAM_WRONG_LAST_SEQUENCE
                    | ErrorCode::STREAM_WRONG_LAST_SEQUENCE_CONSTANT
            )
        })
}

/// What a key holds in the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyState {
    /// No message.
    Absent,
    /// A deletion, at this revision.
    Deleted(u64),
    /// A value, at this revision.
    Stored(u64),
}

/// A key's latest message.
enum Latest {
    Absent,
    Deleted(u64),
    Record(Box<Record>, u64),
}
