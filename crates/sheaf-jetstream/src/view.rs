//! The watcher that keeps this process's [`Index`] of the bucket, and the waits on it.
//!
//! One task reads the bucket's stream through an ordered consumer: first the latest record of
//! every key, then every write as it happens. Each call that writes waits until the view has
//! read its own writes, so what a call did is visible to the next call of the process; calls
//! that answer for the whole queue (the depth, the dead-letter list) first wait for the view to
//! reach the stream's last sequence.

use std::collections::VecDeque;
use std::str::FromStr as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::kv;
use async_nats::jetstream::stream::Stream;
use futures::StreamExt as _;
use parking_lot::{Mutex, MutexGuard};
use sheaf_store::{Error, JobId, Result, Timestamp};

use crate::index::{Index, Record, Waiting};

/// Keys of jobs start with this, followed by the job id.
pub(crate) const JOB_KEY: &str = "j.";
/// Keys of process heartbeats start with this, followed by the process id.
pub(crate) const PROCESS_KEY: &str = "p.";
/// Keys of the outbox's accepted events start with this, then the queue that wrote the
/// event, `.`, and the hash of the event's key (`outbox.rs`).
pub(crate) const EVENT_KEY: &str = "e.";
/// Keys of the outbox's settled attempts start with this, then the queue that wrote the
/// attempt, `.`, and the attempt's id.
pub(crate) const ATTEMPT_KEY: &str = "a.";

/// How long a call waits for the view to catch up before it reports the queue unavailable.
const CATCH_UP: Duration = Duration::from_secs(10);

/// A deletion marker older than this, found while reading the bucket at start, was left by a
/// process that stopped before removing it; it is removed now.
const LEFT_BEHIND: Duration = Duration::from_secs(600);

/// This process's view of the bucket. See the module docs.
#[derive(Debug)]
pub(crate) struct View {
    index: Mutex<Index>,
    applied: tokio::sync::watch::Sender<u64>,
    /// Deletion markers to remove from the stream once every view has read them: the stream
    /// sequence, and when the marker was written or found.
    pub(crate) markers: Mutex<VecDeque<(Instant, u64)>>,
    /// The queue this view belongs to.
    owner: uuid::Uuid,
    /// The latest events other queues accepted, as read from the stream (`outbox.rs`).
    recent: Mutex<Recent>,
}

/// The values of the latest [`RECENT_EVENTS`] outbox events other queues wrote, by key hash.
///
/// The watcher reads every event's value anyway; keeping the latest ones lets a process that
/// claims a job another process accepted find its payload in memory, where it would otherwise
/// read it from the log store once shipped (a query per batch of claims, the largest cost of a
/// fleet on ClickHouse).
#[derive(Debug, Default)]
struct Recent {
    values: std::collections::HashMap<String, bytes::Bytes>,
    order: VecDeque<String>,
}

/// How many of other queues' events a view keeps (about 1 KB each with their payloads).
const RECENT_EVENTS: usize = 10_000;

impl View {
    pub(crate) fn new(owner: uuid::Uuid) -> Self {
        View {
            index: Mutex::new(Index::default()),
            applied: tokio::sync::watch::Sender::new(0),
            markers: Mutex::new(VecDeque::new()),
            owner,
            recent: Mutex::new(Recent::default()),
        }
    }

    /// The value of an event another queue accepted lately, by its key hash.
    pub(crate) fn recent_event(&self, hash: &str) -> Option<bytes::Bytes> {
        self.recent.lock().values.get(hash).cloned()
    }

    fn remember_event(&self, hash: &str, value: bytes::Bytes) {
        let mut recent = self.recent.lock();
        if recent.values.insert(hash.to_owned(), value).is_none() {
            recent.order.push_back(hash.to_owned());
        }
        while recent.order.len() > RECENT_EVENTS {
            if let Some(old) = recent.order.pop_front() {
                recent.values.remove(&old);
            }
        }
    }

    /// Drops the value kept for `hash`; its place in the eviction order stays and goes in turn.
    fn forget_event(&self, hash: &str) {
        self.recent.lock().values.remove(hash);
    }

    pub(crate) fn index(&self) -> MutexGuard<'_, Index> {
        self.index.lock()
    }

    /// Waits until the view has read the stream up to `sequence`.
    pub(crate) async fn wait_for(&self, sequence: u64) -> Result<()> {
        if *self.applied.borrow() >= sequence {
            return Ok(());
        }
        let mut applied = self.applied.subscribe();
        match tokio::time::timeout(CATCH_UP, applied.wait_for(|&a| a >= sequence)).await {
            Ok(Ok(_)) => Ok(()),
            _ => Err(Error::Unavailable {
                message: format!(
                    "the queue's view of its bucket did not reach stream sequence {sequence} within {CATCH_UP:?} (it is at {})",
                    *self.applied.borrow()
                ),
                source: None,
            }),
        }
    }

    /// Applies one write read from the stream.
    fn apply(&self, entry: &kv::Entry) {
        let removed = matches!(
            entry.operation,
            kv::Operation::Delete | kv::Operation::Purge
        );
        {
            let mut index = self.index.lock();
            if let Some(id) = entry.key.strip_prefix(JOB_KEY) {
                match JobId::from_str(id) {
                    Ok(id) if removed => {
                        index.remove(id);
                    }
                    Ok(id) => match serde_json::from_slice::<Record>(&entry.value) {
                        Ok(record) => index.put(id, record, entry.revision),
                        Err(e) => {
                            tracing::warn!(key = %entry.key, error = %e, "a job in the queue's bucket cannot be read; it is skipped")
                        }
                    },
                    Err(_) => {
                        tracing::warn!(key = %entry.key, "a key in the queue's bucket is not a job id; it is skipped")
                    }
                }
            } else if let Some(process) = entry.key.strip_prefix(PROCESS_KEY)
                && let Ok(process) = uuid::Uuid::from_str(process)
            {
                // `<micros>` or `<micros> <queue>`.
                let value = std::str::from_utf8(&entry.value).unwrap_or("");
                let mut parts = value.split(' ');
                let at = parts
                    .next()
                    .and_then(|v| v.parse::<i64>().ok())
                    .and_then(|micros| Timestamp::from_micros(micros).ok());
                let owner = parts.next().and_then(|o| uuid::Uuid::from_str(o).ok());
                match at {
                    Some(at) if !removed => index.beat(process, at, owner),
                    _ => index.forget_process(&process),
                }
            } else if let Some(waiting) =
                outbox_record(&entry.key, entry.created.unix_timestamp_nanos())
            {
                if removed {
                    index.remove_waiting(&entry.key);
                } else {
                    // An event of this queue's own under a key another queue's event had once
                    // (a publisher reusing an id after the idempotency window) replaces it: the
                    // older value must not answer for it once it is shipped.
                    match &waiting.event {
                        Some(hash) if waiting.owner != self.owner => {
                            self.remember_event(hash, entry.value.clone());
                        }
                        Some(hash) => self.forget_event(hash),
                        None => {}
                    }
                    index.put_waiting(waiting, entry.revision);
                }
            }
            index.advance(entry.revision);
        }
        if removed && !entry.seen_current {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64);
            let age = now.saturating_sub(entry.created.unix_timestamp());
            if age > LEFT_BEHIND.as_secs() as i64 {
                // Found while reading the bucket at start: nobody is waiting to remove it.
                let long_ago = Instant::now().checked_sub(Duration::from_secs(3600));
                if let Some(at) = long_ago {
                    self.markers.lock().push_back((at, entry.revision));
                }
            }
        }
        self.applied.send_replace(entry.revision);
    }
}

/// The outbox record a key names (`e.<queue>.<hash>` or `a.<queue>.<attempt>`), stored at
/// `created`; `None` for any other key.
fn outbox_record(key: &str, created_nanos: i128) -> Option<Waiting> {
    let (rest, event) = match key.strip_prefix(EVENT_KEY) {
        Some(rest) => (rest, true),
        None => (key.strip_prefix(ATTEMPT_KEY)?, false),
    };
    let (owner, id) = rest.split_once('.')?;
    let owner = uuid::Uuid::from_str(owner).ok()?;
    let micros = created_nanos / 1_000;
    Some(Waiting {
        key: key.to_owned(),
        owner,
        event: event.then(|| id.to_owned()),
        at: Timestamp::from_micros(i64::try_from(micros).ok()?).ok()?,
    })
}

/// Reads the bucket into `view` for as long as the queue lives, starting again after the
/// last sequence read when the consumer fails (a server of the cluster went away), or when it
/// has read nothing for [`SILENT`] while the stream holds later writes.
///
/// The second case is a watcher that is stuck without an error: after a reconnection,
/// async-nats recreates the watcher's consumer under the same name, and when the server the
/// first one was placed on has died, that name's assignment can stay with the dead server, so
/// every recreation waits on it and the view stops until that server returns (the fault
/// suite's `nats-node` saw 31 and 33 s, the whole outage). A new watch is a new consumer, which
/// the cluster places on a live server.
pub(crate) async fn watch(store: kv::Store, stream: Stream, view: Arc<View>) {
    loop {
        let from = view.index().applied();
        let watch = if from == 0 {
            store.watch_with_history(">").await
        } else {
            store.watch_from_revision(">", from + 1).await
        };
        match watch {
            Ok(mut entries) => {
                let mut last_read = Instant::now();
                loop {
                    match tokio::time::timeout(Duration::from_secs(1), entries.next()).await {
                        Ok(Some(Ok(entry))) => {
                            view.apply(&entry);
                            last_read = Instant::now();
                        }
                        Ok(Some(Err(e))) => {
                            tracing::warn!(error = %e, "reading the queue's bucket failed; reading again");
                            break;
                        }
                        Ok(None) => break,
                        Err(_) if last_read.elapsed() >= SILENT && behind(&stream, &view).await => {
                            tracing::warn!(silent_for = ?last_read.elapsed(),
                                "reading the queue's bucket stalled behind later writes; reading again");
                            break;
                        }
                        Err(_) => {}
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "watching the queue's bucket failed; trying again")
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// A watcher that has read nothing for this long, while the stream has writes it has not read,
/// is stuck: a working one delivers a write within milliseconds, and every process writes its
/// heartbeat every few seconds, so a live bucket is never quiet for long.
const SILENT: Duration = Duration::from_secs(5);

/// Whether the stream holds a write the view has not read; `false` when the stream cannot be
/// asked (during an election there is nothing new to read anyway).
async fn behind(stream: &Stream, view: &View) -> bool {
    match tokio::time::timeout(Duration::from_secs(2), stream.get_info()).await {
        Ok(Ok(info)) => info.state.last_sequence > view.index().applied(),
        _ => false,
    }
}
