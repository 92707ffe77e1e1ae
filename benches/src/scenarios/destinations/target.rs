//! `destinations`' targets: what each type's events go to, created fresh by the bench (a
//! receiver; a durable exchange and queue on the shared RabbitMQ; a file-storage stream on a
//! fresh subject on the shared NATS), the destination configuration pointing at it, and what
//! arrived there, read back at the broker itself.

use std::collections::HashSet;
use std::time::Duration;

use anyhow::bail;
use async_nats::jetstream;
use futures::StreamExt as _;
use lapin::Connection;
use lapin::options::{
    BasicConsumeOptions, ExchangeDeleteOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use serde::Serialize;
use sheaf_testenv::broker_clients;
use sheaf_testenv::receiver::Receiver;

use super::Kind;

/// The topic every event is published with (`Publisher::publish`), and so the routing key of
/// the RabbitMQ messages: the destination leaves `routing_key` out, and the queue is bound
/// with it.
use crate::sheaf::TOPIC;

/// What a destination held once its type was done.
#[derive(Debug, Clone, Default, Serialize)]
pub(super) struct Arrived {
    /// Messages (2xx for the webhook) in total.
    pub(super) messages: usize,
    /// Distinct event ids among them.
    pub(super) distinct: usize,
    /// NATS: the stream's last sequence (every accepted publish takes one).
    pub(super) last_sequence: Option<u64>,
    /// RabbitMQ: the queue's message count from a passive declare, before consuming.
    pub(super) queue_count: Option<u64>,
    /// Expected event ids that were not there (the first few).
    pub(super) missing: Vec<String>,
}

/// The shared brokers.
#[derive(Debug, Clone, Copy)]
pub(super) struct Urls<'a> {
    pub(super) rabbitmq: &'a str,
    pub(super) nats: &'a str,
}

/// Where one type's events go, prepared by the bench and read back by it.
pub(super) enum Target {
    Webhook(Receiver),
    Rabbitmq {
        connection: Connection,
        channel: lapin::Channel,
        /// The exchange and the queue bound to it share this name.
        name: String,
    },
    Nats {
        jetstream: jetstream::Context,
        stream: String,
    },
}

impl Target {
    /// A fresh target for `kind`, and the destination `config` that points at it.
    pub(super) async fn prepare(
        kind: Kind,
        urls: Urls<'_>,
    ) -> anyhow::Result<(Self, serde_json::Value)> {
        match kind {
            Kind::Webhook => {
                let receiver = Receiver::start().await?;
                let config = serde_json::json!({ "url": receiver.url() });
                Ok((Target::Webhook(receiver), config))
            }
            Kind::Rabbitmq => {
                let url = urls.rabbitmq;
                let connection = broker_clients::connect_rabbitmq(url).await?;
                let channel = connection.create_channel().await?;
                let name = sheaf_testenv::unique_name("bench_destinations");
                broker_clients::declare_bound_queue(&channel, &name, &name, TOPIC).await?;
                // No `routing_key`: the event's topic is, and the queue is bound to it.
                let config = serde_json::json!({ "url": url, "exchange": name });
                Ok((
                    Target::Rabbitmq {
                        connection,
                        channel,
                        name,
                    },
                    config,
                ))
            }
            Kind::Nats => {
                let url = urls.nats;
                let jetstream = broker_clients::connect_jetstream(url).await?;
                let stream = sheaf_testenv::unique_name("bench_destinations");
                let subject = format!("bench.{stream}");
                broker_clients::create_file_stream(&jetstream, &stream, &subject).await?;
                let config = serde_json::json!({ "url": url, "subject": subject });
                Ok((Target::Nats { jetstream, stream }, config))
            }
        }
    }

    /// What arrived, checked against the ids `bench-0` … `bench-{events - 1}`.
    pub(super) async fn arrived(&self, events: usize) -> anyhow::Result<Arrived> {
        let mut arrived = Arrived::default();
        let ids: Vec<String> = match self {
            Target::Webhook(receiver) => receiver
                .deliveries()
                .into_iter()
                .filter(|d| (200..300).contains(&d.status))
                .map(|d| d.id)
                .collect(),
            Target::Rabbitmq { channel, name, .. } => {
                let passive = QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                };
                let queue = channel
                    .queue_declare(name.as_str().into(), passive, FieldTable::default())
                    .await?;
                let count = u64::from(queue.message_count());
                arrived.queue_count = Some(count);
                consume_ids(channel, name, count).await?
            }
            Target::Nats { jetstream, stream } => {
                let mut stream = jetstream.get_stream(stream).await?;
                let state = stream.info().await?.state.clone();
                arrived.last_sequence = Some(state.last_sequence);
                broker_clients::read_stream(&stream, state.first_sequence, state.last_sequence)
                    .await?
                    .iter()
                    .map(|message| broker_clients::message_id(message).unwrap_or_default())
                    .collect()
            }
        };
        let distinct: HashSet<&str> = ids.iter().map(String::as_str).collect();
        arrived.messages = ids.len();
        arrived.distinct = distinct.len();
        arrived.missing = (0..events)
            .map(|seq| format!("bench-{seq}"))
            .filter(|id| !distinct.contains(id.as_str()))
            .take(5)
            .collect();
        Ok(arrived)
    }

    /// Deletes what the bench created on the shared brokers; failures are printed, not raised
    /// (the figures are already read).
    pub(super) async fn cleanup(self) {
        match self {
            Target::Webhook(_) => {}
            Target::Rabbitmq {
                connection,
                channel,
                name,
            } => {
                let queue = channel
                    .queue_delete(name.as_str().into(), QueueDeleteOptions::default())
                    .await;
                let exchange = channel
                    .exchange_delete(name.as_str().into(), ExchangeDeleteOptions::default())
                    .await;
                if let Err(err) = queue.map(|_| ()).and(exchange) {
                    eprintln!("destinations: cannot delete rabbitmq queue/exchange {name}: {err}");
                }
                let _ = connection.close(200, "bench done".into()).await;
            }
            Target::Nats { jetstream, stream } => {
                if let Err(err) = jetstream.delete_stream(&stream).await {
                    eprintln!("destinations: cannot delete nats stream {stream}: {err}");
                }
            }
        }
    }
}

/// The `message_id` of every message in queue `queue` (`count` of them), consumed without
/// acknowledgements; at most 60 s.
async fn consume_ids(
    channel: &lapin::Channel,
    queue: &str,
    count: u64,
) -> anyhow::Result<Vec<String>> {
    let options = BasicConsumeOptions {
        no_ack: true,
        ..BasicConsumeOptions::default()
    };
    let mut consumer = channel
        .basic_consume(
            queue.into(),
            "sheaf-bench".into(),
            options,
            FieldTable::default(),
        )
        .await?;
    let mut ids = Vec::with_capacity(count as usize);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while (ids.len() as u64) < count {
        let next = tokio::time::timeout_at(deadline, consumer.next()).await;
        match next {
            Ok(Some(delivery)) => {
                let delivery = delivery?;
                let id = delivery.properties.message_id().as_ref();
                ids.push(id.map(|id| id.as_str().to_owned()).unwrap_or_default());
            }
            Ok(None) => bail!("the consumer of {queue} was cancelled"),
            Err(_) => bail!(
                "only {} of {count} messages consumed from {queue} in 60 s",
                ids.len()
            ),
        }
    }
    Ok(ids)
}
