//! The `rabbitmq` type against a real RabbitMQ node of the test's own (`brokers::RabbitServer`,
//! on a loopback port, stopped and restarted by the suite): the shared conformance suite, then
//! what only AMQP has (returned messages, kept connections, refused logins, `amqps://`).
//!
//! Without `rabbitmq-server` installed the tests skip with a printed line, except under `CI`,
//! where a missing broker is a failure.

mod amqp;
mod tls;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use async_trait::async_trait;
use lapin::options::{
    BasicGetOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};
use serde_json::{Value, json};
use sheaf_destination::DestinationType;
use sheaf_destination::testkit::{self, Arrival, Harness};
use sheaf_rabbitmq::{RabbitMq, RabbitMqSettings};
use sheaf_testenv::brokers::{self, RabbitServer};

/// A RabbitMQ node for `test`, or `None` (after saying why) when none is installed outside CI.
async fn broker(test: &str) -> Option<RabbitServer> {
    if let Err(missing) = brokers::rabbitmq_server_binary() {
        assert!(
            !sheaf_testenv::in_ci(),
            "{test}: {missing:#}; under CI a missing broker is a failure, not a skip"
        );
        println!("skipping {test}: {missing:#}");
        return None;
    }
    let started = Instant::now();
    let server = tokio::task::spawn_blocking(RabbitServer::start)
        .await
        .expect("the start-up thread")
        .unwrap_or_else(|e| panic!("{test}: cannot start RabbitMQ: {e:#}"));
    println!("{test}: RabbitMQ answered after {:?}", started.elapsed());
    Some(server)
}

/// A type as the suites build it: private addresses allowed, the broker being on loopback.
fn rabbitmq(timeout: Duration) -> RabbitMq {
    RabbitMq::new(RabbitMqSettings {
        timeout,
        allow_private: true,
    })
}

/// The suite's view of one RabbitMQ node, with a lapin client of its own to set up exchanges
/// and queues and read what arrived.
struct RabbitHarness {
    server: Arc<StdMutex<RabbitServer>>,
    url: String,
    /// The broker's AMQP port, the same across restarts.
    port: u16,
    client: tokio::sync::Mutex<Option<(Connection, Channel)>>,
    /// The queue bound to each target's exchange.
    queues: StdMutex<HashMap<String, String>>,
    /// What was read from each queue so far (a `basic_get` takes a message away).
    read: tokio::sync::Mutex<HashMap<String, Vec<Arrival>>>,
}

impl RabbitHarness {
    fn new(server: RabbitServer) -> Self {
        RabbitHarness {
            url: server.url(),
            port: server.port(),
            server: Arc::new(StdMutex::new(server)),
            client: tokio::sync::Mutex::new(None),
            queues: StdMutex::new(HashMap::new()),
            read: tokio::sync::Mutex::new(HashMap::new()),
        }
    }

    /// The harness's channel, reconnecting after the broker restarted.
    async fn channel(&self) -> anyhow::Result<Channel> {
        let mut client = self.client.lock().await;
        if let Some((connection, channel)) = client.as_ref()
            && connection.status().connected()
            && channel.status().connected()
        {
            return Ok(channel.clone());
        }
        let connection = Connection::connect(&self.url, ConnectionProperties::default())
            .await
            .context("the harness cannot connect to RabbitMQ")?;
        let channel = connection.create_channel().await?;
        *client = Some((connection, channel.clone()));
        Ok(channel)
    }

    /// A durable topic exchange and a durable queue bound to it with `#` (queue `arguments`
    /// as given); the exchange's name.
    async fn exchange_with_queue(&self, arguments: FieldTable) -> anyhow::Result<String> {
        let channel = self.channel().await?;
        let exchange = sheaf_testenv::unique_name("sheaf_x");
        let queue = sheaf_testenv::unique_name("sheaf_q");
        let durable_exchange = ExchangeDeclareOptions {
            durable: true,
            ..ExchangeDeclareOptions::default()
        };
        channel
            .exchange_declare(
                exchange.as_str().into(),
                ExchangeKind::Topic,
                durable_exchange,
                FieldTable::default(),
            )
            .await?;
        let durable_queue = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        channel
            .queue_declare(queue.as_str().into(), durable_queue, arguments)
            .await?;
        channel
            .queue_bind(
                queue.as_str().into(),
                exchange.as_str().into(),
                "#".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;
        self.queues
            .lock()
            .expect("the queue map")
            .insert(exchange.clone(), queue);
        Ok(exchange)
    }

    /// A durable topic exchange nothing is bound to.
    async fn lonely_exchange(&self) -> anyhow::Result<String> {
        let exchange = sheaf_testenv::unique_name("sheaf_lonely");
        let options = ExchangeDeclareOptions {
            durable: true,
            ..ExchangeDeclareOptions::default()
        };
        self.channel()
            .await?
            .exchange_declare(
                exchange.as_str().into(),
                ExchangeKind::Topic,
                options,
                FieldTable::default(),
            )
            .await?;
        Ok(exchange)
    }

    fn config(&self, exchange: &str) -> Value {
        json!({ "url": self.url, "exchange": exchange })
    }

    async fn blocking(
        &self,
        what: fn(&mut RabbitServer) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        let server = self.server.clone();
        tokio::task::spawn_blocking(move || what(&mut server.lock().expect("the server")))
            .await
            .context("the broker thread")?
    }
}

fn arrival(message: &lapin::message::BasicGetMessage) -> Arrival {
    let properties = &message.delivery.properties;
    let mut headers = BTreeMap::new();
    if let Some(table) = properties.headers() {
        for (name, value) in table.inner() {
            let text = match value {
                AMQPValue::LongString(s) => s.to_string(),
                AMQPValue::ShortString(s) => s.to_string(),
                other => format!("{other:?}"),
            };
            headers.insert(name.as_str().to_lowercase(), text);
        }
    }
    Arrival {
        event_id: properties
            .message_id()
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default(),
        topic: headers.get("sheaf-topic").cloned().unwrap_or_default(),
        payload: message.delivery.data.clone(),
        headers,
    }
}

#[async_trait]
impl Harness for RabbitHarness {
    fn destination(&self, timeout: Duration) -> Arc<dyn DestinationType> {
        Arc::new(rabbitmq(timeout))
    }

    async fn target(&self) -> anyhow::Result<Value> {
        let exchange = self.exchange_with_queue(FieldTable::default()).await?;
        Ok(self.config(&exchange))
    }

    async fn arrivals(
        &self,
        config: &Value,
        count: usize,
        within: Duration,
    ) -> anyhow::Result<Vec<Arrival>> {
        let exchange = config["exchange"]
            .as_str()
            .context("a config with an exchange")?;
        let queue = self
            .queues
            .lock()
            .expect("the queue map")
            .get(exchange)
            .cloned()
            .with_context(|| format!("no queue is bound to {exchange}"))?;
        let deadline = Instant::now() + within;
        let mut read = self.read.lock().await;
        let got = read.entry(queue.clone()).or_default();
        loop {
            let options = BasicGetOptions { no_ack: true };
            match self
                .channel()
                .await?
                .basic_get(queue.as_str().into(), options)
                .await?
            {
                Some(message) => got.push(arrival(&message)),
                None if got.len() >= count || Instant::now() >= deadline => {
                    return Ok(got.clone());
                }
                None => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    fn config_at(&self, address: std::net::SocketAddr) -> Value {
        json!({ "url": format!("amqp://guest:guest@{address}/%2f"), "exchange": "x" })
    }

    async fn refusing_target(&self) -> anyhow::Result<Option<(Value, Option<Duration>)>> {
        // A queue that holds nothing and refuses what it cannot hold: the broker nacks.
        let mut arguments = FieldTable::default();
        arguments.insert("x-max-length".into(), AMQPValue::LongInt(0));
        arguments.insert(
            "x-overflow".into(),
            AMQPValue::LongString("reject-publish".into()),
        );
        let exchange = self.exchange_with_queue(arguments).await?;
        Ok(Some((self.config(&exchange), None)))
    }

    async fn permanent_target(&self) -> anyhow::Result<Option<Value>> {
        Ok(Some(self.config(&sheaf_testenv::unique_name(
            "sheaf_never_declared",
        ))))
    }

    async fn stop_receiver(&self) -> anyhow::Result<()> {
        self.blocking(RabbitServer::stop).await
    }

    async fn start_receiver(&self) -> anyhow::Result<()> {
        self.blocking(RabbitServer::restart).await
    }

    fn invalid_configs(&self) -> Vec<(Value, &'static str)> {
        let url = self.url.as_str();
        vec![
            (json!({ "exchange": "x" }), "url"),
            (
                json!({ "url": "http://guest:guest@127.0.0.1:5672/", "exchange": "x" }),
                "url",
            ),
            (
                json!({ "url": "amqp://guest:guest@/%2f", "exchange": "x" }),
                "url",
            ),
            (json!({ "url": url }), "exchange"),
            (json!({ "url": url, "exchange": "" }), "exchange"),
            (
                json!({ "url": url, "exchange": "x", "queue": "q" }),
                "queue",
            ),
            (
                json!({ "url": url, "exchange": "x", "routing_key": "k".repeat(256) }),
                "routing_key",
            ),
        ]
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance() {
    let Some(server) = broker("conformance").await else {
        return;
    };
    let started = Instant::now();
    testkit::run_all(&RabbitHarness::new(server)).await;
    println!("conformance: the suite took {:?}", started.elapsed());
}
