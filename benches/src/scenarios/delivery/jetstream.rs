//! The JetStream configurations' queue: a fresh bucket per configuration run, shared by all its
//! `sheaf` processes and deleted at the end, and what its stream holds: bytes per waiting job
//! (read while a backlog waits in it, before the warm-up, in a bucket that holds nothing else
//! yet but the processes' heartbeats) and what the deletion markers of delivered jobs add up to
//! after the steady phase.
//!
//! The backlog is a short receiver outage: every request answered 503 while `count` events are
//! published at saturation, until each of their jobs was tried once and rescheduled (so each
//! waits in the bucket for its first retry, `SHEAF_RETRY_SCHEDULE`'s 5 s by default); then the
//! receiver answers 200 again and the retries deliver them all.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use async_nats::jetstream;
use serde::Serialize;
use sheaf_testenv::receiver::Receiver;

use crate::load::{self, Pace};
use crate::progress::Progress;
use crate::sheaf::Publisher;

/// The bucket of one configuration run: its name, a connection to read its stream, and its
/// removal when dropped (also when the run failed).
pub(super) struct Bucket {
    pub(super) name: String,
    urls: Vec<String>,
    context: jetstream::Context,
}

impl Bucket {
    /// A fresh bucket name on the cluster at `urls`; `sheaf` creates the bucket at start.
    pub(super) async fn new(urls: &[String]) -> anyhow::Result<Bucket> {
        let client = async_nats::connect(urls.to_vec())
            .await
            .context("connect to the NATS cluster")?;
        Ok(Bucket {
            name: sheaf_testenv::unique_name("bench_jobs"),
            urls: urls.to_vec(),
            context: jetstream::new(client),
        })
    }

    fn stream_name(&self) -> String {
        format!("KV_{}", self.name)
    }

    /// The stream's messages and bytes now, and its leader.
    pub(super) async fn state(&self) -> anyhow::Result<State> {
        let stream = self
            .context
            .get_stream_no_info(self.stream_name())
            .await
            .context("the bucket's stream")?;
        let info = stream
            .get_info()
            .await
            .context("the bucket's stream info")?;
        Ok(State {
            messages: info.state.messages,
            bytes: info.state.bytes,
            leader: info.cluster.and_then(|c| c.leader),
            replicas: info.config.num_replicas,
        })
    }
}

impl Drop for Bucket {
    fn drop(&mut self) {
        // The scenario's runtime may be the one dropping this: delete from a thread of its own.
        let (urls, stream) = (self.urls.clone(), self.stream_name());
        let deleted = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(async {
                let client = async_nats::connect(urls).await?;
                let context = jetstream::new(client);
                match tokio::time::timeout(Duration::from_secs(30), context.delete_stream(&stream))
                    .await
                {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err(e)) => Err(anyhow::anyhow!("{e}")),
                    Err(_) => Err(anyhow::anyhow!("no answer in 30 s")),
                }
            })
        })
        .join();
        match deleted {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!(
                "sheaf-bench: could not delete the stream {}: {e:#}",
                self.stream_name()
            ),
            Err(_) => eprintln!(
                "sheaf-bench: deleting the stream {} panicked",
                self.stream_name()
            ),
        }
    }
}

/// The stream at one moment.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct State {
    pub(super) messages: u64,
    pub(super) bytes: u64,
    /// The server the stream's writes go through.
    pub(super) leader: Option<String>,
    pub(super) replicas: usize,
}

/// What a configuration run found in its bucket's stream.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Stream {
    pub(super) bucket: String,
    pub(super) backlog: Backlog,
    /// Right after the steady phase's last delivery: the markers of the jobs delivered in the
    /// last half minute (and the processes' heartbeats).
    pub(super) after_steady: Option<State>,
}

/// A backlog of waiting jobs.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Backlog {
    pub(super) published: usize,
    pub(super) accepted: usize,
    /// Jobs tried (and refused) before the stream was read.
    pub(super) refused_attempts: usize,
    pub(super) delivered: usize,
    pub(super) duplicates: usize,
    pub(super) before: State,
    /// The reading with the most messages while the jobs waited.
    pub(super) peak: State,
    /// From the receiver's recovery to the last delivery.
    pub(super) drained_s: f64,
}

impl Backlog {
    /// Stream bytes per waiting job: what the backlog added, over the messages it added.
    pub(super) fn bytes_per_job(&self) -> Option<f64> {
        let messages = self.peak.messages.checked_sub(self.before.messages)?;
        let bytes = self.peak.bytes.checked_sub(self.before.bytes)?;
        (messages > 0).then(|| bytes as f64 / messages as f64)
    }
}

/// What the backlog phase drives.
pub(super) struct Load<'a> {
    pub(super) publisher: &'a Publisher,
    pub(super) receiver: &'a Receiver,
    pub(super) pad: &'a Arc<String>,
    pub(super) progress: &'a Arc<Progress>,
    pub(super) publishers: usize,
    pub(super) base: Instant,
}

/// The backlog phase: see the module docs. Events from seq 500,000.
pub(super) async fn backlog(
    bucket: &Bucket,
    load: &Load<'_>,
    count: usize,
) -> anyhow::Result<Backlog> {
    let receiver = load.receiver;
    receiver.reset();
    let before = bucket.state().await?;
    receiver.set_failing(true);
    let first = 500_000;
    let sent = load::publish(
        load.publisher,
        load.base,
        first,
        count,
        Pace::Saturate(load.publishers),
        Arc::clone(load.pad),
        load.progress,
    )
    .await;
    let accepted = count - (sent.refused + sent.errors) as usize;
    // Each refused attempt is followed by its job's reschedule; the first retries are due 5 s
    // after the first refusals, so the receiver must answer 200 again before then.
    let deadline = Instant::now() + Duration::from_secs(20);
    while receiver.requests().1 < accepted && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let refused_attempts = receiver.requests().1;
    let mut peak = bucket.state().await?;
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        let now = bucket.state().await?;
        if now.messages > peak.messages {
            peak = now;
        }
    }
    receiver.set_failing(false);
    let recovered = Instant::now();
    receiver
        .wait_for_count(accepted, Duration::from_secs(300))
        .await;
    let drained_s = recovered.elapsed().as_secs_f64();
    let delivered = load::delivered_at(receiver, load.base)
        .keys()
        .filter(|&&seq| seq >= first && seq < first + count as u64)
        .count();
    Ok(Backlog {
        published: count,
        accepted,
        refused_attempts,
        delivered,
        duplicates: receiver.duplicates(),
        before,
        peak,
        drained_s,
    })
}
