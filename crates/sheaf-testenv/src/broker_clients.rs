//! A harness's own view of the brokers Sheaf publishes to: what it declares on them before a
//! run and how it reads back what arrived, once for the benchmarks and the fault suite. On
//! RabbitMQ, a durable direct exchange with a durable queue bound to it by one routing key; on
//! NATS, a JetStream stream on file storage (so it outlives a server restart) that captures one
//! subject, and every message it stored, read by sequence.
//!
//! These are client connections only; the brokers themselves are xtask's shared ones or a
//! test's own (`brokers`).

use anyhow::Context as _;
use async_nats::jetstream;
use async_nats::jetstream::message::StreamMessage;
use futures::StreamExt as _;
use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties, ExchangeKind};

/// How many messages of a stream are read at once.
const READS_IN_FLIGHT: usize = 32;

/// A connection to the RabbitMQ at `url`; the error names the URL.
pub async fn connect_rabbitmq(url: &str) -> anyhow::Result<Connection> {
    Connection::connect(url, ConnectionProperties::default())
        .await
        .with_context(|| format!("cannot connect to rabbitmq at {url}"))
}

/// The durable direct exchange `exchange`, the durable queue `queue`, and the binding between
/// them with `routing_key`.
pub async fn declare_bound_queue(
    channel: &lapin::Channel,
    exchange: &str,
    queue: &str,
    routing_key: &str,
) -> anyhow::Result<()> {
    let durable = ExchangeDeclareOptions {
        durable: true,
        ..ExchangeDeclareOptions::default()
    };
    channel
        .exchange_declare(
            exchange.into(),
            ExchangeKind::Direct,
            durable,
            FieldTable::default(),
        )
        .await
        .with_context(|| format!("cannot declare exchange {exchange}"))?;
    channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions::durable(),
            FieldTable::default(),
        )
        .await
        .with_context(|| format!("cannot declare queue {queue}"))?;
    channel
        .queue_bind(
            queue.into(),
            exchange.into(),
            routing_key.into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .with_context(|| format!("cannot bind queue {queue} to exchange {exchange}"))?;
    Ok(())
}

/// JetStream on the NATS server at `url`; the error names the URL.
pub async fn connect_jetstream(url: &str) -> anyhow::Result<jetstream::Context> {
    let client = async_nats::connect(url)
        .await
        .with_context(|| format!("cannot connect to nats at {url}"))?;
    Ok(jetstream::new(client))
}

/// The stream `name` on file storage, capturing `subject`.
pub async fn create_file_stream(
    jetstream: &jetstream::Context,
    name: &str,
    subject: &str,
) -> anyhow::Result<()> {
    jetstream
        .create_stream(jetstream::stream::Config {
            name: name.to_owned(),
            subjects: vec![subject.to_owned()],
            storage: jetstream::stream::StorageType::File,
            ..jetstream::stream::Config::default()
        })
        .await
        .with_context(|| format!("cannot create stream {name}"))?;
    Ok(())
}

/// Every message of `stream` from sequence `first` to `last` (none when `last` is 0: an empty
/// stream), in order, read 32 at a time.
pub async fn read_stream(
    stream: &jetstream::stream::Stream,
    first: u64,
    last: u64,
) -> anyhow::Result<Vec<StreamMessage>> {
    if last == 0 || first > last {
        return Ok(Vec::new());
    }
    let mut reads = futures::stream::iter(first..=last)
        .map(|seq| async move {
            stream
                .get_raw_message(seq)
                .await
                .with_context(|| format!("cannot read message {seq}"))
        })
        .buffered(READS_IN_FLIGHT);
    let mut messages = Vec::with_capacity(usize::try_from(last - first + 1).unwrap_or(0));
    while let Some(message) = reads.next().await {
        messages.push(message?);
    }
    Ok(messages)
}

/// A stored message's `Nats-Msg-Id` header (the event id Sheaf publishes with), if it has one.
pub fn message_id(message: &StreamMessage) -> Option<String> {
    message
        .headers
        .get("Nats-Msg-Id")
        .map(|v| v.as_str().to_owned())
}
