//! The conformance suite every destination type passes, against a real receiver of its kind
//! (an HTTP server, a broker).
//!
//! A destination crate implements [`Harness`] for its receiver in its own tests and calls
//! [`run_all`] (or the cases one by one):
//!
//! ```text
//! // crates/sheaf-<type>/tests/conformance.rs, with sheaf-destination's `testkit` feature
//! #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
//! async fn conformance() {
//!     let Some(harness) = MyHarness::start().await else { return }; // skips outside CI only
//!     sheaf_destination::testkit::run_all(&harness).await;
//! }
//! ```
//!
//! The cases: configs refused by field; a delivery arrives with its id, topic, payload and
//! headers; concurrent deliveries each arrive once; a receiver that refuses is retried (with its
//! `Retry-After` where the type has one); a permanent failure is permanent; an address nobody
//! listens on, and one that accepts and never answers, fail as retryable within the timeout; a
//! receiver that stops and starts again is delivered to again (kept connections recover).

mod silent;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde_json::Value;
use sheaf_store::{DestinationId, EventId, Secret, TenantId, Timestamp};

use crate::{DestinationType, Message, Report, Verdict};

pub use silent::SilentServer;

/// The delivery timeout the suite builds types with.
pub const TIMEOUT: Duration = Duration::from_secs(2);

/// How long the suite waits for deliveries to arrive, or for a restarted receiver.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// One message as the receiver got it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arrival {
    /// The event id the receiver can read (a header, AMQP's `message_id`, `Nats-Msg-Id`).
    pub event_id: String,
    /// The topic, as the type carries it.
    pub topic: String,
    /// The message body: the event's payload bytes as delivered.
    pub payload: Vec<u8>,
    /// Headers (or AMQP header fields), names in lower case.
    pub headers: BTreeMap<String, String>,
}

/// A destination type's receiver, as the suite needs to see it.
#[async_trait]
pub trait Harness: Send + Sync {
    /// The type under test, delivering with `timeout`.
    fn destination(&self, timeout: Duration) -> Arc<dyn DestinationType>;

    /// A new place on the receiver that deliveries reach (a URL path, a queue bound to an
    /// exchange, a stream's subject), as the `config` of a destination.
    async fn target(&self) -> anyhow::Result<Value>;

    /// What reached `config`'s place so far, waiting up to `within` for at least `count`.
    async fn arrivals(
        &self,
        config: &Value,
        count: usize,
        within: Duration,
    ) -> anyhow::Result<Vec<Arrival>>;

    /// The `config` of a destination of this type at `address`, where no receiver of the type
    /// listens (a closed port, or [`SilentServer`]).
    fn config_at(&self, address: SocketAddr) -> Value;

    /// A place whose receiver refuses deliveries in a way worth retrying, and the wait it asks
    /// for, if the type's receivers can be made to (`None`: the type has no such answer).
    async fn refusing_target(&self) -> anyhow::Result<Option<(Value, Option<Duration>)>>;

    /// A `config` that passes validation but whose deliveries fail for good (`None`: the type
    /// has no failure that retrying cannot mend).
    async fn permanent_target(&self) -> anyhow::Result<Option<Value>>;

    /// Stops the receiver: every target becomes unreachable.
    async fn stop_receiver(&self) -> anyhow::Result<()>;

    /// Starts it again at the same address, keeping what was set up on it.
    async fn start_receiver(&self) -> anyhow::Result<()>;

    /// Configs the type must refuse, each with the field its error names.
    fn invalid_configs(&self) -> Vec<(Value, &'static str)>;
}

/// Everything needed to build [`Message`]s in the cases.
struct Sample {
    tenant: TenantId,
    destination: DestinationId,
    secret: Secret,
    headers: BTreeMap<String, String>,
    trace: Vec<(String, String)>,
}

impl Sample {
    fn new() -> Self {
        Sample {
            tenant: TenantId::new("conformance").expect("a valid tenant id"),
            destination: DestinationId::generate(),
            secret: crate::generate_secret(),
            headers: BTreeMap::from([("x-conformance".to_owned(), "yes".to_owned())]),
            trace: vec![(
                "traceparent".to_owned(),
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".to_owned(),
            )],
        }
    }

    fn payload(i: usize) -> Vec<u8> {
        format!(r#"{{"n":{i},"note":"caf\u00e9 ☕"}}"#).into_bytes()
    }

    async fn deliver(
        &self,
        kind: &dyn DestinationType,
        config: &Value,
        id: &EventId,
        payload: &[u8],
    ) -> Report {
        let secrets = [&self.secret];
        let message = Message {
            tenant_id: &self.tenant,
            destination_id: self.destination,
            event_id: id,
            topic: "order.created",
            timestamp: Timestamp::now(),
            payload,
            headers: &self.headers,
            trace: &self.trace,
            secrets: &secrets,
            attempt: 1,
        };
        kind.deliver(config, &message).await
    }
}

fn event_id(case: &str, i: usize) -> EventId {
    let nonce: u32 = rand::random();
    EventId::new(format!("evt_{case}_{nonce:08x}_{i}")).expect("a valid event id")
}

async fn validated(kind: &dyn DestinationType, config: Value) -> Value {
    match kind.validate(&config).await {
        Ok(v) => v,
        Err(err) => panic!(
            "{}: the harness's config {config} is refused: {err}",
            kind.name()
        ),
    }
}

/// Every case, one after the other.
pub async fn run_all(harness: &dyn Harness) {
    configs_are_validated(harness).await;
    a_delivery_arrives_with_its_metadata(harness).await;
    concurrent_deliveries_each_arrive_once(harness).await;
    a_refusing_receiver_is_retried(harness).await;
    a_permanent_failure_is_permanent(harness).await;
    nobody_listening_is_retryable(harness).await;
    a_silent_receiver_times_out(harness).await;
    a_receiver_that_comes_back_is_delivered_to(harness).await;
}

/// The harness's invalid configs are refused naming their field; its targets validate, and
/// validating what validation returned gives it back unchanged.
pub async fn configs_are_validated(harness: &dyn Harness) {
    let kind = harness.destination(TIMEOUT);
    let invalid = harness.invalid_configs();
    assert!(!invalid.is_empty(), "the harness lists no invalid configs");
    for (config, field) in invalid {
        match kind.validate(&config).await {
            Ok(v) => panic!("{}: {config} was accepted as {v}", kind.name()),
            Err(err) => {
                assert_eq!(err.field, field, "{}: {config}: {err}", kind.name());
                let prefix = if field.is_empty() {
                    "config:".to_owned()
                } else {
                    format!("config.{field}:")
                };
                assert!(err.to_string().starts_with(&prefix), "{err}");
            }
        }
    }
    let config = validated(&*kind, harness.target().await.expect("a target")).await;
    assert_eq!(validated(&*kind, config.clone()).await, config);
    assert!(!kind.name().is_empty());
    assert!(
        kind.config_schema().is_object(),
        "config_schema must be a JSON Schema object"
    );
}

/// Three deliveries arrive, in order, each with its event id, topic, exact payload and the
/// destination's custom headers.
pub async fn a_delivery_arrives_with_its_metadata(harness: &dyn Harness) {
    let kind = harness.destination(TIMEOUT);
    let sample = Sample::new();
    let config = validated(&*kind, harness.target().await.expect("a target")).await;
    let ids: Vec<EventId> = (0..3).map(|i| event_id("metadata", i)).collect();
    for (i, id) in ids.iter().enumerate() {
        let report = sample
            .deliver(&*kind, &config, id, &Sample::payload(i))
            .await;
        assert_eq!(report.verdict, Verdict::Delivered, "{report:?}");
        assert!(report.error.is_none(), "{report:?}");
    }
    let got = harness
        .arrivals(&config, 3, PATIENCE)
        .await
        .expect("arrivals");
    assert_eq!(got.len(), 3, "{got:?}");
    for (i, (arrival, id)) in got.iter().zip(&ids).enumerate() {
        assert_eq!(arrival.event_id, id.as_str());
        assert_eq!(arrival.topic, "order.created");
        assert_eq!(arrival.payload, Sample::payload(i));
        assert_eq!(
            arrival.headers.get("x-conformance").map(String::as_str),
            Some("yes"),
            "custom headers are carried: {:?}",
            arrival.headers
        );
    }
}

/// Fifty deliveries at once to one destination: all succeed and each arrives exactly once (what
/// a type keeps per destination must hold under concurrency).
pub async fn concurrent_deliveries_each_arrive_once(harness: &dyn Harness) {
    let kind = harness.destination(TIMEOUT);
    let sample = Sample::new();
    let config = validated(&*kind, harness.target().await.expect("a target")).await;
    let ids: Vec<EventId> = (0..50).map(|i| event_id("concurrent", i)).collect();
    let payload = Sample::payload(0);
    let reports = futures::future::join_all(
        ids.iter()
            .map(|id| sample.deliver(&*kind, &config, id, &payload)),
    )
    .await;
    for report in &reports {
        assert_eq!(report.verdict, Verdict::Delivered, "{report:?}");
    }
    let got = harness
        .arrivals(&config, 50, PATIENCE)
        .await
        .expect("arrivals");
    let mut seen: Vec<&str> = got.iter().map(|a| a.event_id.as_str()).collect();
    seen.sort_unstable();
    let mut want: Vec<&str> = ids.iter().map(EventId::as_str).collect();
    want.sort_unstable();
    assert_eq!(seen, want, "every delivery arrives once");
}

/// A receiver that refuses is a retryable (or throttled) failure with the wait it asked for.
pub async fn a_refusing_receiver_is_retried(harness: &dyn Harness) {
    let Some((config, after)) = harness.refusing_target().await.expect("a refusing target") else {
        return;
    };
    let kind = harness.destination(TIMEOUT);
    let config = validated(&*kind, config).await;
    let report = Sample::new()
        .deliver(&*kind, &config, &event_id("refused", 0), b"{}")
        .await;
    assert!(
        report.verdict == Verdict::Retry { after }
            || report.verdict == Verdict::Throttled { after },
        "a refusal asking for {after:?}: {report:?}"
    );
    assert!(
        report.error.is_some() || report.code.is_some(),
        "{report:?}"
    );
}

/// A failure the harness says cannot be mended is [`Verdict::Permanent`], with a reason.
pub async fn a_permanent_failure_is_permanent(harness: &dyn Harness) {
    let Some(config) = harness
        .permanent_target()
        .await
        .expect("a permanent target")
    else {
        return;
    };
    let kind = harness.destination(TIMEOUT);
    let config = validated(&*kind, config).await;
    let report = Sample::new()
        .deliver(&*kind, &config, &event_id("permanent", 0), b"{}")
        .await;
    assert_eq!(report.verdict, Verdict::Permanent, "{report:?}");
    assert!(report.error.is_some(), "{report:?}");
}

/// A port nobody listens on: a retryable failure that says so, quickly.
pub async fn nobody_listening_is_retryable(harness: &dyn Harness) {
    let address = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        listener.local_addr().expect("its address")
    };
    let kind = harness.destination(TIMEOUT);
    let config = validated(&*kind, harness.config_at(address)).await;
    let started = Instant::now();
    let report = Sample::new()
        .deliver(&*kind, &config, &event_id("closed", 0), b"{}")
        .await;
    assert!(
        matches!(report.verdict, Verdict::Retry { .. }),
        "{report:?}"
    );
    assert!(report.error.is_some(), "{report:?}");
    assert!(
        started.elapsed() < TIMEOUT * 3,
        "a refused connection took {:?}",
        started.elapsed()
    );
}

/// A receiver that accepts the connection and never answers: a retryable failure within the
/// timeout (and scheduling slack), not a hang.
pub async fn a_silent_receiver_times_out(harness: &dyn Harness) {
    let silent = SilentServer::start().await.expect("a silent server");
    let kind = harness.destination(TIMEOUT);
    let config = validated(&*kind, harness.config_at(silent.address())).await;
    let started = Instant::now();
    let report = Sample::new()
        .deliver(&*kind, &config, &event_id("silent", 0), b"{}")
        .await;
    let took = started.elapsed();
    assert!(
        matches!(report.verdict, Verdict::Retry { .. }),
        "{report:?}"
    );
    assert!(report.error.is_some(), "{report:?}");
    assert!(
        took < TIMEOUT * 2 + Duration::from_secs(2),
        "the timeout is {TIMEOUT:?}, the delivery took {took:?}"
    );
    assert!(silent.connections() >= 1, "the type never connected");
}

/// Delivered, then the receiver stops: a retryable failure, not a hang; it starts again at the
/// same address: deliveries succeed again within [`PATIENCE`] (kept connections are replaced),
/// and the ones that succeeded arrive.
pub async fn a_receiver_that_comes_back_is_delivered_to(harness: &dyn Harness) {
    let kind = harness.destination(TIMEOUT);
    let sample = Sample::new();
    let config = validated(&*kind, harness.target().await.expect("a target")).await;
    let first = event_id("restart", 0);
    let report = sample.deliver(&*kind, &config, &first, b"{}").await;
    assert_eq!(report.verdict, Verdict::Delivered, "{report:?}");

    harness.stop_receiver().await.expect("stop the receiver");
    let started = Instant::now();
    let report = sample
        .deliver(&*kind, &config, &event_id("restart", 1), b"{}")
        .await;
    assert!(
        matches!(report.verdict, Verdict::Retry { .. }),
        "a stopped receiver: {report:?}"
    );
    assert!(
        started.elapsed() < TIMEOUT * 2 + Duration::from_secs(2),
        "took {:?}",
        started.elapsed()
    );

    harness.start_receiver().await.expect("start the receiver");
    let deadline = Instant::now() + PATIENCE;
    let second = event_id("restart", 2);
    loop {
        let report = sample.deliver(&*kind, &config, &second, b"{}").await;
        if report.succeeded() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not delivered {PATIENCE:?} after the receiver came back: {report:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let got = harness
        .arrivals(&config, 2, PATIENCE)
        .await
        .expect("arrivals");
    let ids: Vec<&str> = got.iter().map(|a| a.event_id.as_str()).collect();
    assert!(ids.contains(&first.as_str()), "{ids:?}");
    assert!(ids.contains(&second.as_str()), "{ids:?}");
}
