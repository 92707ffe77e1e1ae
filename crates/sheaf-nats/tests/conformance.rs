//! The `nats` type against a real `nats-server -js` of the test's own (`sheaf-testenv`'s
//! `NatsServer`, on its own loopback port and store): the shared conformance suite, then what
//! is particular to JetStream (one kept connection, the duplicate window).
//!
//! Without `nats-server` the tests print why and pass, except under `CI`, where they fail.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, stream};
use async_trait::async_trait;
use serde_json::{Value, json};
use sheaf_destination::testkit::{self, Arrival, Harness};
use sheaf_destination::{DestinationType, Message, Verdict};
use sheaf_nats::{Nats, NatsSettings};
use sheaf_store::{DestinationId, EventId, TenantId, Timestamp};
use sheaf_testenv::brokers::{NatsServer, nats_server_binary};

/// The test's NATS server and the streams it made on it.
struct NatsHarness {
    server: Mutex<NatsServer>,
    url: String,
}

impl NatsHarness {
    /// A fresh server, or `None` (skip, with a printed line) when `nats-server` is not
    /// installed outside CI.
    fn start(test: &str) -> Option<NatsHarness> {
        if let Err(missing) = nats_server_binary() {
            assert!(
                !sheaf_testenv::in_ci(),
                "{test}: under CI nats-server must be installed: {missing:#}"
            );
            println!("skipping {test}: {missing:#}");
            return None;
        }
        let server = NatsServer::start().unwrap_or_else(|e| panic!("{test}: {e:#}"));
        Some(NatsHarness {
            url: server.url(),
            server: Mutex::new(server),
        })
    }

    fn server(&self) -> std::sync::MutexGuard<'_, NatsServer> {
        self.server.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A JetStream context of the test's own (not the type's), connected for one use: the
    /// server restarts during the suite, and a fresh client never waits on a reconnect.
    async fn admin(&self) -> anyhow::Result<jetstream::Context> {
        let client = async_nats::ConnectOptions::new()
            .connection_timeout(Duration::from_secs(5))
            .connect(self.url.as_str())
            .await?;
        Ok(jetstream::new(client))
    }

    /// A new file-storage stream capturing a new subject, made with `tweak` applied to its
    /// config; returns the destination config publishing there.
    async fn stream(&self, tweak: impl FnOnce(&mut stream::Config)) -> anyhow::Result<Value> {
        let name = sheaf_testenv::unique_name("sheaf");
        let subject = format!("{name}.events");
        let mut config = stream::Config {
            name: stream_name(&subject),
            subjects: vec![subject.clone()],
            storage: stream::StorageType::File,
            ..Default::default()
        };
        tweak(&mut config);
        self.admin().await?.create_stream(config).await?;
        Ok(json!({"url": self.url, "subject": subject}))
    }

    /// Every message of the stream behind `config`, by sequence.
    async fn messages(
        &self,
        config: &Value,
    ) -> anyhow::Result<Vec<jetstream::message::StreamMessage>> {
        let subject = config["subject"].as_str().unwrap_or_default();
        let mut stream = self.admin().await?.get_stream(stream_name(subject)).await?;
        let state = stream.info().await?.state.clone();
        let mut messages = Vec::new();
        if state.messages > 0 {
            for sequence in state.first_sequence..=state.last_sequence {
                messages.push(stream.get_raw_message(sequence).await?);
            }
        }
        Ok(messages)
    }
}

/// The stream that captures `subject` in these tests: its name with dots as underscores.
fn stream_name(subject: &str) -> String {
    subject.replace('.', "_").to_uppercase()
}

fn arrival(message: &jetstream::message::StreamMessage) -> Arrival {
    let headers: BTreeMap<String, String> = message
        .headers
        .iter()
        .filter_map(|(name, values)| {
            Some((
                name.to_string().to_lowercase(),
                values.first()?.as_str().to_owned(),
            ))
        })
        .collect();
    Arrival {
        event_id: headers.get("nats-msg-id").cloned().unwrap_or_default(),
        topic: headers.get("sheaf-topic").cloned().unwrap_or_default(),
        payload: message.payload.to_vec(),
        headers,
    }
}

fn nats(timeout: Duration) -> Nats {
    // The server is on loopback, which only private destinations may be.
    Nats::new(NatsSettings {
        timeout,
        allow_private: true,
    })
}

#[async_trait]
impl Harness for NatsHarness {
    fn destination(&self, timeout: Duration) -> Arc<dyn DestinationType> {
        Arc::new(nats(timeout))
    }

    async fn target(&self) -> anyhow::Result<Value> {
        self.stream(|_| {}).await
    }

    async fn arrivals(
        &self,
        config: &Value,
        count: usize,
        within: Duration,
    ) -> anyhow::Result<Vec<Arrival>> {
        let deadline = Instant::now() + within;
        loop {
            // Right after a restart the server may not answer yet: keep asking until `within`.
            match self.messages(config).await {
                Ok(messages) if messages.len() >= count || Instant::now() > deadline => {
                    return Ok(messages.iter().map(arrival).collect());
                }
                Err(e) if Instant::now() > deadline => return Err(e),
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }

    fn config_at(&self, address: SocketAddr) -> Value {
        json!({"url": format!("nats://{address}"), "subject": "x.y"})
    }

    async fn refusing_target(&self) -> anyhow::Result<Option<(Value, Option<Duration>)>> {
        // `max_messages: 0` is "no limit" to JetStream; a stream holding its one allowed
        // message and discarding new ones refuses every further one ("maximum messages
        // exceeded", a 503), until a consumer or an operator makes room.
        let config = self
            .stream(|c| {
                c.max_messages = 1;
                c.discard = stream::DiscardPolicy::New;
            })
            .await?;
        let subject = config["subject"].as_str().unwrap_or_default().to_owned();
        self.admin()
            .await?
            .publish(subject, "{}".into())
            .await?
            .await?;
        Ok(Some((config, None)))
    }

    async fn permanent_target(&self) -> anyhow::Result<Option<Value>> {
        let subject = format!("{}.nobody", sheaf_testenv::unique_name("sheaf"));
        Ok(Some(json!({"url": self.url, "subject": subject})))
    }

    async fn stop_receiver(&self) -> anyhow::Result<()> {
        tokio::task::block_in_place(|| self.server().stop())
    }

    async fn start_receiver(&self) -> anyhow::Result<()> {
        tokio::task::block_in_place(|| self.server().restart())
    }

    fn invalid_configs(&self) -> Vec<(Value, &'static str)> {
        vec![
            (json!({"subject": "a.b"}), "url"),
            (
                json!({"url": "http://127.0.0.1:4222", "subject": "a.b"}),
                "url",
            ),
            (json!({"url": "nats://", "subject": "a.b"}), "url"),
            (json!({"url": self.url}), "subject"),
            (json!({"url": self.url, "subject": "orders.*"}), "subject"),
            (json!({"url": self.url, "subject": "orders.>"}), "subject"),
            (
                json!({"url": self.url, "subject": "orders..created"}),
                "subject",
            ),
            (
                json!({"url": self.url, "subject": "orders created"}),
                "subject",
            ),
            (
                json!({"url": self.url, "subject": "a.b", "stream": "S"}),
                "stream",
            ),
        ]
    }
}

/// One destination's deliveries, as the engine would make them.
struct Deliveries {
    tenant: TenantId,
    destination: DestinationId,
    headers: BTreeMap<String, String>,
}

impl Deliveries {
    fn new() -> Self {
        Deliveries {
            tenant: TenantId::new("nats-tests").unwrap(),
            destination: DestinationId::generate(),
            headers: BTreeMap::new(),
        }
    }

    async fn deliver(
        &self,
        kind: &Nats,
        config: &Value,
        id: &EventId,
    ) -> sheaf_destination::Report {
        let message = Message {
            tenant_id: &self.tenant,
            destination_id: self.destination,
            event_id: id,
            topic: "order.created",
            timestamp: Timestamp::now(),
            payload: br#"{"n":1}"#,
            headers: &self.headers,
            trace: &[],
            secrets: &[],
            attempt: 1,
        };
        kind.deliver(config, &message).await
    }
}

fn event(i: usize) -> EventId {
    EventId::new(format!("evt_{}_{i}", sheaf_testenv::unique_name("nats"))).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance() {
    let Some(harness) = NatsHarness::start("conformance") else {
        return;
    };
    testkit::run_all(&harness).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequential_deliveries_share_one_connection() {
    let Some(harness) = NatsHarness::start("sequential_deliveries_share_one_connection") else {
        return;
    };
    let kind = nats(testkit::TIMEOUT);
    let config = kind
        .validate(&harness.target().await.unwrap())
        .await
        .unwrap();
    let deliveries = Deliveries::new();
    for i in 0..20 {
        let report = deliveries.deliver(&kind, &config, &event(i)).await;
        assert_eq!(report.verdict, Verdict::Delivered, "{report:?}");
    }
    assert_eq!(
        kind.connections_opened(),
        1,
        "one connection for the destination"
    );
    assert_eq!(harness.messages(&config).await.unwrap().len(), 20);

    // A forgotten destination connects again; a changed config gets a connection of its own.
    kind.forget(deliveries.destination);
    let report = deliveries.deliver(&kind, &config, &event(20)).await;
    assert!(report.succeeded(), "{report:?}");
    assert_eq!(kind.connections_opened(), 2);
    let other = kind
        .validate(&harness.target().await.unwrap())
        .await
        .unwrap();
    let report = deliveries.deliver(&kind, &other, &event(21)).await;
    assert!(report.succeeded(), "{report:?}");
    assert_eq!(kind.connections_opened(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_event_twice_is_stored_once() {
    let Some(harness) = NatsHarness::start("the_same_event_twice_is_stored_once") else {
        return;
    };
    let kind = nats(testkit::TIMEOUT);
    let config = kind
        .validate(&harness.target().await.unwrap())
        .await
        .unwrap();
    let deliveries = Deliveries::new();
    let id = event(0);
    let first = deliveries.deliver(&kind, &config, &id).await;
    assert!(first.succeeded(), "{first:?}");
    let again = deliveries.deliver(&kind, &config, &id).await;
    assert!(
        again.succeeded(),
        "a duplicate is delivered: the stream has it: {again:?}"
    );
    assert!(
        again
            .response
            .as_deref()
            .is_some_and(|r| r.contains("duplicate")),
        "{again:?}"
    );
    let stored = harness.messages(&config).await.unwrap();
    assert_eq!(stored.len(), 1, "JetStream's duplicate window keeps one");
    assert_eq!(arrival(&stored[0]).event_id, id.as_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_name_the_subject_and_the_stream_error() {
    let Some(harness) = NatsHarness::start("failures_name_the_subject_and_the_stream_error") else {
        return;
    };
    let kind = nats(testkit::TIMEOUT);
    let deliveries = Deliveries::new();
    let nobody = harness.permanent_target().await.unwrap().unwrap();
    let report = deliveries.deliver(&kind, &nobody, &event(0)).await;
    assert_eq!(report.verdict, Verdict::Permanent, "{report:?}");
    let error = report.error.unwrap();
    assert!(
        error.contains("no JetStream stream captures the subject"),
        "{error}"
    );
    assert!(
        error.contains(nobody["subject"].as_str().unwrap()),
        "{error}"
    );

    let (full, _) = harness.refusing_target().await.unwrap().unwrap();
    let report = Deliveries::new().deliver(&kind, &full, &event(1)).await;
    assert_eq!(report.verdict, Verdict::Retry { after: None }, "{report:?}");
    assert_eq!(report.code, Some(503), "{report:?}");
    let error = report.error.unwrap();
    assert!(error.contains("maximum messages"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_is_reconnected_to_without_leaking_credentials() {
    let Some(harness) = NatsHarness::start("a_restarted_server_is_reconnected_to") else {
        return;
    };
    let kind = nats(testkit::TIMEOUT);
    let mut config = harness.target().await.unwrap();
    // The server has no accounts, so it accepts any credentials; they must never be shown.
    config["url"] = json!(harness.url.replace("nats://", "nats://sheaf:hunter2@"));
    let config = kind.validate(&config).await.unwrap();
    let deliveries = Deliveries::new();
    assert!(
        deliveries
            .deliver(&kind, &config, &event(0))
            .await
            .succeeded()
    );

    harness.stop_receiver().await.unwrap();
    for i in 1..=2 {
        let started = Instant::now();
        let report = deliveries.deliver(&kind, &config, &event(i)).await;
        println!(
            "stopped server, delivery {i}: {report:?} after {:?}",
            started.elapsed()
        );
        assert_eq!(report.verdict, Verdict::Retry { after: None }, "{report:?}");
        let error = report.error.unwrap();
        assert!(!error.contains("hunter2"), "{error}");
        assert!(error.contains("nats://sheaf@127.0.0.1"), "{error}");
        assert!(started.elapsed() < testkit::TIMEOUT + Duration::from_secs(1));
    }

    harness.start_receiver().await.unwrap();
    let report = deliveries.deliver(&kind, &config, &event(3)).await;
    println!("restarted server: {report:?}");
    assert!(report.succeeded(), "{report:?}");
    assert_eq!(
        kind.connections_opened(),
        2,
        "the lost connection is replaced once"
    );
}
