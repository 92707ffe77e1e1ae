//! Destination types beyond webhooks, end to end through `sheaf serve`: 1,000 events reach a
//! RabbitMQ queue bound to the destination's exchange and a JetStream stream on its subject,
//! each exactly once, on the memory backends and on Postgres + ClickHouse; a broker nobody
//! listens for fails attempts that are retried like a webhook's; a bad `config` is refused
//! naming its field. (A broker restarted mid-run is the fault suite's `broker` scenario.)
//! `passwords`: a broker password in `config.url`, sealed at rest and redacted in the API.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use lapin::options::{
    BasicGetOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::FieldTable;
use serde_json::{Value, json};

use crate::controls::backends;
use crate::support::{Client, spawn_sheaf, stop_clean};

mod passwords;

const EVENTS: usize = 1_000;

/// A durable topic exchange with a durable queue bound to it for every routing key.
struct RabbitTarget {
    channel: lapin::Channel,
    _connection: lapin::Connection,
    exchange: String,
    queue: String,
}

impl RabbitTarget {
    async fn declare(url: &str) -> Self {
        let connection = lapin::Connection::connect(url, lapin::ConnectionProperties::default())
            .await
            .expect("the test connects to RabbitMQ");
        let channel = connection.create_channel().await.expect("a channel");
        let exchange = sheaf_testenv::unique_name("sheaf_x");
        let queue = sheaf_testenv::unique_name("sheaf_q");
        channel
            .exchange_declare(
                exchange.as_str().into(),
                lapin::ExchangeKind::Topic,
                ExchangeDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("exchange declared");
        channel
            .queue_declare(
                queue.as_str().into(),
                QueueDeclareOptions::durable(),
                FieldTable::default(),
            )
            .await
            .expect("queue declared");
        channel
            .queue_bind(
                queue.as_str().into(),
                exchange.as_str().into(),
                "#".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("queue bound");
        RabbitTarget {
            channel,
            _connection: connection,
            exchange,
            queue,
        }
    }

    /// Every message id in the queue, waiting up to `within` for `count` of them.
    async fn drain(&self, count: usize, within: Duration) -> Vec<String> {
        let deadline = Instant::now() + within;
        let mut ids = Vec::new();
        while ids.len() < count && Instant::now() < deadline {
            let got = self
                .channel
                .basic_get(self.queue.as_str().into(), BasicGetOptions { no_ack: true })
                .await
                .expect("basic.get");
            match got {
                Some(message) => ids.push(
                    message
                        .delivery
                        .properties
                        .message_id()
                        .as_ref()
                        .map(|id| id.to_string())
                        .unwrap_or_default(),
                ),
                None => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
        // Anything beyond `count` is a repeat: take what else is there.
        tokio::time::sleep(Duration::from_millis(500)).await;
        while let Some(message) = self
            .channel
            .basic_get(self.queue.as_str().into(), BasicGetOptions { no_ack: true })
            .await
            .expect("basic.get")
        {
            ids.push(
                message
                    .delivery
                    .properties
                    .message_id()
                    .as_ref()
                    .map(|id| id.to_string())
                    .unwrap_or_default(),
            );
        }
        ids
    }
}

/// A file-storage stream capturing one subject.
struct NatsTarget {
    jetstream: async_nats::jetstream::Context,
    stream: String,
    subject: String,
}

impl NatsTarget {
    async fn create(url: &str) -> Self {
        let client = async_nats::connect(url)
            .await
            .expect("the test connects to NATS");
        Self::create_on(client).await
    }

    /// [`NatsTarget::create`] through a client the caller connected (with a login, say).
    async fn create_on(client: async_nats::Client) -> Self {
        let jetstream = async_nats::jetstream::new(client);
        let stream = sheaf_testenv::unique_name("SHEAF");
        let subject = format!("sheaf.{}", sheaf_testenv::unique_name("s"));
        jetstream
            .create_stream(async_nats::jetstream::stream::Config {
                name: stream.clone(),
                subjects: vec![subject.clone()],
                storage: async_nats::jetstream::stream::StorageType::File,
                ..Default::default()
            })
            .await
            .expect("stream created");
        NatsTarget {
            jetstream,
            stream,
            subject,
        }
    }

    /// Every `Nats-Msg-Id` in the stream, once it holds at least `count` messages or `within`
    /// passed.
    async fn drain(&self, count: usize, within: Duration) -> Vec<String> {
        let deadline = Instant::now() + within;
        let mut stream = self
            .jetstream
            .get_stream(&self.stream)
            .await
            .expect("the stream");
        loop {
            let messages = stream.info().await.expect("stream info").state.messages;
            if messages as usize >= count || Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let last = stream
            .info()
            .await
            .expect("stream info")
            .state
            .last_sequence;
        let mut ids = Vec::new();
        for sequence in 1..=last {
            let message = stream
                .get_raw_message(sequence)
                .await
                .expect("a stored message");
            ids.push(
                message
                    .headers
                    .get("Nats-Msg-Id")
                    .map(|v| v.as_str().to_owned())
                    .unwrap_or_default(),
            );
        }
        ids
    }
}

fn exactly_once(label: &str, what: &str, got: &[String], ids: &[String]) {
    let distinct: HashSet<&String> = got.iter().collect();
    let wanted: HashSet<&String> = ids.iter().collect();
    assert_eq!(
        distinct.len(),
        got.len(),
        "{label}: {what}: {} repeats",
        got.len() - distinct.len()
    );
    assert_eq!(
        distinct, wanted,
        "{label}: {what}: every event, and only those"
    );
}

async fn create(client: &Client, tenant: &str, body: Value) -> Value {
    let created = client
        .send(
            "POST",
            &format!("/api/v1/tenants/{tenant}/destinations"),
            Some(body),
        )
        .await;
    assert_eq!(created.status, 201, "{created:?}");
    created.body
}

async fn every_event_reaches_each_broker_once(label: &str, env: HashMap<String, String>) {
    let test = "every_event_reaches_each_broker_once";
    let (Some(amqp), Some(nats)) = (
        sheaf_testenv::rabbitmq_url(test),
        sheaf_testenv::nats_url(test),
    ) else {
        return;
    };
    // The child logs at `info`: its start-up line is what `spawn_sheaf` waits for.
    let env: Vec<(&str, &str)> = env
        .iter()
        .filter(|(k, _)| k.as_str() != "SHEAF_LOG")
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let sheaf = spawn_sheaf(&env).await;
    let client = Client::new(sheaf.addr);
    let tenant = "brokers";
    let put = client
        .send("PUT", &format!("/api/v1/tenants/{tenant}"), None)
        .await;
    assert_eq!(put.status, 201, "{put:?}");
    let rabbit = RabbitTarget::declare(&amqp).await;
    let stream = NatsTarget::create(&nats).await;
    let created = create(
        &client,
        tenant,
        json!({ "type": "rabbitmq", "topics": ["*"],
                "config": { "url": amqp, "exchange": rabbit.exchange },
                "headers": { "x-source": "sheaf-test" } }),
    )
    .await;
    assert_eq!(created["type"], "rabbitmq");
    create(
        &client,
        tenant,
        json!({ "type": "nats", "topics": ["*"],
                "config": { "url": nats, "subject": stream.subject } }),
    )
    .await;

    let ids: Vec<String> = (0..EVENTS).map(|i| format!("broker-{i}")).collect();
    futures::stream::iter(ids.iter().enumerate())
        .map(|(i, id)| {
            let client = &client;
            async move {
                crate::controls::publish(client, tenant, id, "order.created", &json!({ "i": i }))
                    .await;
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<()>>()
        .await;

    let queued = rabbit.drain(EVENTS, Duration::from_secs(120)).await;
    exactly_once(label, "RabbitMQ", &queued, &ids);
    let streamed = stream.drain(EVENTS, Duration::from_secs(120)).await;
    exactly_once(label, "JetStream", &streamed, &ids);
    for kind in ["rabbitmq", "nats"] {
        assert_eq!(
            client
                .metric(&format!(
                    "sheaf_destination_attempts_total{{type=\"{kind}\",result=\"delivered\"}}"
                ))
                .await,
            EVENTS as f64,
            "{label}: {kind}: one delivered attempt per event"
        );
    }
    println!("{label}: {EVENTS} events reached RabbitMQ and JetStream once each");
    stop_clean(sheaf).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_reaches_rabbitmq_and_jetstream_exactly_once_on_every_backend() {
    for (label, env) in backends("every_event_reaches_rabbitmq_and_jetstream_exactly_once") {
        if label == "postgres" {
            // Postgres + ClickHouse is the configuration brokers are for; Postgres alone adds
            // nothing a destination type sees.
            continue;
        }
        every_event_reaches_each_broker_once(label, env).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_broker_fails_attempts_that_are_retried() {
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let sheaf = spawn_sheaf(&[
        ("SHEAF_ALLOW_PRIVATE_DESTINATIONS", "true"),
        ("SHEAF_RETRY_SCHEDULE", "200ms"),
        ("SHEAF_RETRY_MAX_ATTEMPTS", "3"),
        ("SHEAF_DELIVERY_TIMEOUT", "2s"),
    ])
    .await;
    let client = Client::new(sheaf.addr);
    let put = client.send("PUT", "/api/v1/tenants/down", None).await;
    assert_eq!(put.status, 201, "{put:?}");
    create(
        &client,
        "down",
        json!({ "type": "rabbitmq", "topics": ["*"],
                "config": { "url": format!("amqp://guest:guest@{closed}/%2f"), "exchange": "x" } }),
    )
    .await;
    create(
        &client,
        "down",
        json!({ "type": "nats", "topics": ["*"],
                "config": { "url": format!("nats://{closed}"), "subject": "a.b" } }),
    )
    .await;
    crate::controls::publish(&client, "down", "lost-1", "t", &json!({})).await;
    // Three attempts to each, then dead letters.
    let deadline = Instant::now() + Duration::from_secs(60);
    let attempts = loop {
        let attempts = client.attempts_of("down", "lost-1").await;
        if attempts.len() >= 6 || Instant::now() > deadline {
            break attempts;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(
        attempts.len(),
        6,
        "three attempts per destination: {attempts:#?}"
    );
    for attempt in &attempts {
        assert_eq!(attempt["status"], "failed", "{attempt}");
        let error = attempt["error"].as_str().unwrap_or_default();
        assert!(!error.is_empty(), "the attempt says why: {attempt}");
        assert!(
            !error.contains("guest:guest"),
            "no credentials in errors: {error}"
        );
    }
    for kind in ["rabbitmq", "nats"] {
        assert_eq!(
            client
                .metric(&format!(
                    "sheaf_destination_attempts_total{{type=\"{kind}\",result=\"retry\"}}"
                ))
                .await,
            3.0,
            "{kind}"
        );
    }
    stop_clean(sheaf).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_broker_config_is_refused_naming_the_field() {
    let sheaf = spawn_sheaf(&[("SHEAF_ALLOW_PRIVATE_DESTINATIONS", "true")]).await;
    let client = Client::new(sheaf.addr);
    let put = client.send("PUT", "/api/v1/tenants/bad", None).await;
    assert_eq!(put.status, 201, "{put:?}");
    for (body, field, code) in [
        (
            json!({ "type": "rabbitmq", "topics": ["*"], "config": { "url": "amqp://127.0.0.1/" } }),
            "config.exchange",
            "invalid_config",
        ),
        (
            json!({ "type": "rabbitmq", "topics": ["*"], "config": { "url": "http://127.0.0.1/", "exchange": "x" } }),
            "config.url",
            "invalid_destination_url",
        ),
        (
            json!({ "type": "nats", "topics": ["*"], "config": { "url": "nats://127.0.0.1:4222", "subject": "a.*" } }),
            "config.subject",
            "invalid_config",
        ),
        (
            json!({ "type": "nats", "topics": ["*"], "config": { "url": "nats://127.0.0.1:4222", "subject": "a", "queue": "q" } }),
            "config.queue",
            "invalid_config",
        ),
    ] {
        let answer = client
            .send(
                "POST",
                "/api/v1/tenants/bad/destinations",
                Some(body.clone()),
            )
            .await;
        assert_eq!(answer.status, 400, "{body}: {answer:?}");
        assert_eq!(answer.error_code(), code, "{body}");
        let message = answer.body["error"]["message"].as_str().unwrap();
        assert!(message.starts_with(field), "{body}: {message}");
    }
    let answer = client
        .send(
            "POST",
            "/api/v1/tenants/bad/destinations",
            Some(json!({ "type": "carrier-pigeon", "topics": ["*"], "config": {} })),
        )
        .await;
    assert_eq!(answer.status, 400, "{answer:?}");
    let message = answer.body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("nats") && message.contains("rabbitmq") && message.contains("webhook"),
        "the message names the types there are: {message}"
    );
    let listed = client.get("/api/v1/tenants/bad/destinations").await;
    assert_eq!(listed.body["items"], json!([]), "nothing was stored");
    stop_clean(sheaf).await;
}
