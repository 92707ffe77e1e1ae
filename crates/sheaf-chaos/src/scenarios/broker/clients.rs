//! `broker`'s clients of the two brokers: declaring the durable exchange and queue and the
//! file-storage stream before the run, a consumer of the queue for the whole run that
//! reconnects while RabbitMQ is away and records each `message_id` when it first arrives (a
//! message the broker redelivers because an acknowledgement was lost with the connection is
//! not sheaf's duplicate, and is counted apart), and a reader of every message the stream
//! stored, with the time the server stored it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use futures::StreamExt as _;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};
use sheaf_testenv::broker_clients;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The exchange and the queue bound to it (durable both), and the key that binds them: the
/// destination names it as its `routing_key`, in place of the event's topic.
pub(super) const EXCHANGE: &str = "sheaf_chaos";
pub(super) const QUEUE: &str = "sheaf_chaos";
pub(super) const ROUTING_KEY: &str = "chaos";

/// The JetStream stream (file storage) and the subject the destination publishes on.
pub(super) const STREAM: &str = "SHEAF_CHAOS";
pub(super) const SUBJECT: &str = "chaos.broker";

/// The durable exchange, the durable queue and the binding between them.
pub(super) async fn declare_queue(url: &str) -> anyhow::Result<()> {
    let connection = broker_clients::connect_rabbitmq(url).await?;
    let channel = connection.create_channel().await?;
    broker_clients::declare_bound_queue(&channel, EXCHANGE, QUEUE, ROUTING_KEY).await?;
    connection.close(200, "declared".into()).await?;
    Ok(())
}

/// The stream, on file storage so it outlives the restart.
pub(super) async fn create_stream(url: &str) -> anyhow::Result<()> {
    let jetstream = broker_clients::connect_jetstream(url).await?;
    broker_clients::create_file_stream(&jetstream, STREAM, SUBJECT).await
}

/// What the queue's consumer saw.
#[derive(Debug, Default)]
pub(super) struct Queued {
    /// When each event id first arrived.
    pub(super) first: HashMap<String, Instant>,
    /// Messages consumed, redeliveries included.
    pub(super) messages: usize,
    /// Messages beyond the first for their id, published again by sheaf.
    pub(super) duplicates: usize,
    /// Redeliveries (by the broker) of an id already seen: its acknowledgement was lost with
    /// the connection, which says nothing about sheaf.
    pub(super) redelivered: usize,
    pub(super) without_id: usize,
    /// Connections the consumer opened (one per broker run, if all goes well).
    pub(super) connections: usize,
}

/// A consumer of the queue for the whole run, reconnecting every 200 ms while the broker is
/// away.
#[derive(Debug)]
pub(super) struct QueueTap {
    seen: Arc<Mutex<Queued>>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl QueueTap {
    pub(super) fn start(url: String, queue: String) -> Self {
        let seen = Arc::new(Mutex::new(Queued::default()));
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn({
            let seen = Arc::clone(&seen);
            async move {
                while !*stopped.borrow() {
                    if consume(&url, &queue, &seen, &mut stopped).await.is_ok() {
                        return;
                    }
                    tokio::select! {
                        _ = stopped.changed() => return,
                        () = tokio::time::sleep(Duration::from_millis(200)) => {}
                    }
                }
            }
        });
        Self { seen, stop, task }
    }

    pub(super) fn has(&self, id: &str) -> bool {
        self.lock().first.contains_key(id)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queued> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stops consuming; returns what was seen.
    pub(super) async fn finish(self) -> Queued {
        let QueueTap { seen, stop, task } = self;
        let _ = stop.send(true);
        let _ = task.await;
        std::mem::take(&mut *seen.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// One connection's worth of consuming: `Ok` when told to stop, `Err` when the connection or
/// the consumer ended.
async fn consume(
    url: &str,
    queue: &str,
    seen: &Mutex<Queued>,
    stopped: &mut watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let connection = tokio::time::timeout(
        Duration::from_secs(5),
        Connection::connect(url, ConnectionProperties::default()),
    )
    .await??;
    let channel = connection.create_channel().await?;
    channel.basic_qos(200, BasicQosOptions::default()).await?;
    let mut consumer = channel
        .basic_consume(
            queue.into(),
            "sheaf-chaos".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    seen.lock().unwrap_or_else(|e| e.into_inner()).connections += 1;
    loop {
        tokio::select! {
            _ = stopped.changed() => {
                let _ = connection.close(200, "done".into()).await;
                return Ok(());
            }
            next = consumer.next() => {
                let delivery = match next {
                    Some(delivery) => delivery?,
                    None => anyhow::bail!("the consumer was cancelled"),
                };
                {
                    let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
                    seen.messages += 1;
                    match delivery.properties.message_id() {
                        None => seen.without_id += 1,
                        Some(id) if seen.first.contains_key(id.as_str()) => {
                            if delivery.redelivered {
                                seen.redelivered += 1;
                            } else {
                                seen.duplicates += 1;
                            }
                        }
                        Some(id) => {
                            seen.first.insert(id.as_str().to_owned(), Instant::now());
                        }
                    }
                }
                delivery.ack(BasicAckOptions::default()).await?;
            }
        }
    }
}

/// What the stream holds.
#[derive(Debug, Default)]
pub(super) struct Stored {
    /// When each event id was first stored, on this process's clock.
    pub(super) first: HashMap<String, Instant>,
    pub(super) messages: usize,
    pub(super) last_sequence: u64,
    pub(super) duplicates: usize,
    pub(super) without_id: usize,
}

/// Every message of the stream, read by sequence (32 at a time), with the time the server
/// stored it converted to this process's clock through (`t0`, `t0_wall`): the server runs on
/// the same machine, so its wall clock is ours.
pub(super) async fn read_stream(
    url: &str,
    t0: Instant,
    t0_wall: SystemTime,
) -> anyhow::Result<Stored> {
    let context = broker_clients::connect_jetstream(url).await?;
    let mut stream = context.get_stream(STREAM).await?;
    let state = stream.info().await?.state.clone();
    let mut stored = Stored {
        last_sequence: state.last_sequence,
        ..Stored::default()
    };
    if state.messages == 0 {
        return Ok(stored);
    }
    let t0_unix_nanos = t0_wall
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos() as i128;
    let messages =
        broker_clients::read_stream(&stream, state.first_sequence, state.last_sequence).await?;
    for message in messages {
        stored.messages += 1;
        let Some(id) = broker_clients::message_id(&message) else {
            stored.without_id += 1;
            continue;
        };
        let after_t0 = message.time.unix_timestamp_nanos() - t0_unix_nanos;
        let when = if after_t0 >= 0 {
            t0 + Duration::from_nanos(after_t0 as u64)
        } else {
            t0
        };
        match stored.first.get_mut(&id) {
            Some(first) => {
                stored.duplicates += 1;
                *first = (*first).min(when);
            }
            None => {
                stored.first.insert(id, when);
            }
        }
    }
    Ok(stored)
}
