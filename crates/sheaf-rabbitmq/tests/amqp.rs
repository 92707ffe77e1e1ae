//! What only AMQP has: returned messages, kept connections, a configured routing key, a
//! refused login.

use std::collections::BTreeMap;

use lapin::ExchangeKind;
use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use serde_json::{Value, json};
use sheaf_destination::testkit::{self, Harness as _};
use sheaf_destination::{DestinationType as _, Message, Report, Verdict};
use sheaf_rabbitmq::RabbitMq;
use sheaf_store::{DestinationId, EventId, TenantId, Timestamp};

use super::{RabbitHarness, broker, rabbitmq};

/// A message to one destination, as the engine would build it.
pub(crate) struct Delivery {
    tenant: TenantId,
    destination: DestinationId,
    headers: BTreeMap<String, String>,
}

impl Delivery {
    pub(crate) fn new() -> Self {
        Delivery {
            tenant: TenantId::new("acme").expect("a tenant id"),
            destination: DestinationId::generate(),
            headers: BTreeMap::new(),
        }
    }

    pub(crate) async fn send(&self, kind: &RabbitMq, config: &Value, id: &str) -> Report {
        let event_id = EventId::new(id).expect("an event id");
        let message = Message {
            tenant_id: &self.tenant,
            destination_id: self.destination,
            event_id: &event_id,
            topic: "invoice.paid",
            timestamp: Timestamp::now(),
            payload: br#"{"total":12}"#,
            headers: &self.headers,
            trace: &[],
            secrets: &[],
            attempt: 1,
        };
        kind.deliver(config, &message).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_only_amqp_has() {
    let Some(server) = broker("what_only_amqp_has").await else {
        return;
    };
    let harness = RabbitHarness::new(server);
    one_connection_serves_a_destination(&harness).await;
    an_unbound_routing_key_is_returned(&harness).await;
    refusals_say_why(&harness).await;
    a_routing_key_in_the_config_replaces_the_topic(&harness).await;
    a_refused_login_is_retried_without_the_password(&harness).await;
    super::tls::amqps_is_verified_and_delivers(&harness).await;
}

/// Twenty deliveries in a row go over one connection; a changed config, and `forget`, each
/// open a new one.
async fn one_connection_serves_a_destination(harness: &RabbitHarness) {
    let kind = rabbitmq(testkit::TIMEOUT);
    let delivery = Delivery::new();
    let config = harness.target().await.expect("a target");
    for i in 0..20 {
        let report = delivery.send(&kind, &config, &format!("evt_seq_{i}")).await;
        assert_eq!(report.verdict, Verdict::Delivered, "{report:?}");
    }
    assert_eq!(
        kind.connections_opened(),
        1,
        "one connection for 20 deliveries"
    );
    let got = harness
        .arrivals(&config, 20, testkit::PATIENCE)
        .await
        .expect("arrivals");
    assert_eq!(got.len(), 20);

    let other = harness.target().await.expect("a second target");
    let report = delivery.send(&kind, &other, "evt_seq_other").await;
    assert!(report.succeeded(), "{report:?}");
    assert_eq!(
        kind.connections_opened(),
        2,
        "a changed config opens a new connection"
    );
    kind.forget(delivery.destination);
    let report = delivery.send(&kind, &other, "evt_seq_forgotten").await;
    assert!(report.succeeded(), "{report:?}");
    assert_eq!(
        kind.connections_opened(),
        3,
        "a forgotten destination reconnects"
    );
}

/// A message no queue is bound to receive comes back: retried, with code 312.
async fn an_unbound_routing_key_is_returned(harness: &RabbitHarness) {
    let kind = rabbitmq(testkit::TIMEOUT);
    let exchange = harness.lonely_exchange().await.expect("an exchange");
    let report = Delivery::new()
        .send(&kind, &harness.config(&exchange), "evt_unrouted")
        .await;
    assert_eq!(report.verdict, Verdict::Retry { after: None }, "{report:?}");
    assert_eq!(report.code, Some(312), "{report:?}");
    let error = report.error.unwrap_or_default();
    assert!(error.contains("no queue is bound"), "{error}");
    assert!(
        error.contains("invoice.paid"),
        "the routing key is named: {error}"
    );
}

/// A nack and a missing exchange are reported as what they are (the suite checks only the
/// verdicts).
async fn refusals_say_why(harness: &RabbitHarness) {
    let kind = rabbitmq(testkit::TIMEOUT);
    let delivery = Delivery::new();
    let (refusing, _) = harness
        .refusing_target()
        .await
        .expect("a refusing target")
        .expect("RabbitMQ can refuse");
    let report = delivery.send(&kind, &refusing, "evt_nacked").await;
    assert_eq!(report.verdict, Verdict::Retry { after: None }, "{report:?}");
    assert!(report.error.unwrap_or_default().contains("basic.nack"));

    let missing = harness
        .permanent_target()
        .await
        .expect("a permanent target")
        .expect("RabbitMQ has permanent failures");
    let report = delivery.send(&kind, &missing, "evt_no_exchange").await;
    assert_eq!(report.verdict, Verdict::Permanent, "{report:?}");
    assert_eq!(report.code, Some(404), "{report:?}");
    let exchange = missing["exchange"].as_str().unwrap_or_default();
    assert!(report.error.unwrap_or_default().contains(exchange));
    assert!(report.response.unwrap_or_default().contains("NOT_FOUND"));

    // The channel the broker closed is not reused: the same delivery again, on the same
    // connection, gets the broker's answer again, not a closed channel's error.
    let report = delivery
        .send(&kind, &missing, "evt_no_exchange_again")
        .await;
    assert_eq!(report.verdict, Verdict::Permanent, "{report:?}");
    assert_eq!(
        kind.connections_opened(),
        2,
        "one connection per config, kept across the 404s"
    );
}

/// `routing_key` in the config is the routing key of every message: a direct exchange routes
/// on it, not on the topic.
async fn a_routing_key_in_the_config_replaces_the_topic(harness: &RabbitHarness) {
    let channel = harness.channel().await.expect("a channel");
    let exchange = sheaf_testenv::unique_name("sheaf_direct");
    let queue = sheaf_testenv::unique_name("sheaf_direct_q");
    channel
        .exchange_declare(
            exchange.as_str().into(),
            ExchangeKind::Direct,
            ExchangeDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("a direct exchange");
    channel
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("a queue");
    channel
        .queue_bind(
            queue.as_str().into(),
            exchange.as_str().into(),
            "billing".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("a binding");
    harness
        .queues
        .lock()
        .expect("the queue map")
        .insert(exchange.clone(), queue);
    let config = json!({ "url": harness.url, "exchange": exchange, "routing_key": "billing" });
    let kind = rabbitmq(testkit::TIMEOUT);
    assert_eq!(kind.validate(&config).await.expect("valid"), config);
    let report = Delivery::new().send(&kind, &config, "evt_keyed").await;
    assert!(report.succeeded(), "{report:?}");
    let got = harness
        .arrivals(&config, 1, testkit::PATIENCE)
        .await
        .expect("arrivals");
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].event_id, "evt_keyed");
    assert_eq!(
        got[0].topic, "invoice.paid",
        "the topic is still carried as a header"
    );
}

/// A wrong password: retryable, and neither the report nor anything in it shows the password.
async fn a_refused_login_is_retried_without_the_password(harness: &RabbitHarness) {
    const PASSWORD: &str = "not-the-password-4711";
    let exchange = harness.lonely_exchange().await.expect("an exchange");
    let url = harness
        .url
        .replace("guest:guest@", &format!("guest:{PASSWORD}@"));
    let config = json!({ "url": url, "exchange": exchange });
    let kind = rabbitmq(testkit::TIMEOUT);
    let report = Delivery::new()
        .send(&kind, &config, "evt_refused_login")
        .await;
    assert!(
        matches!(report.verdict, Verdict::Retry { .. }),
        "{report:?}"
    );
    assert!(!format!("{report:?}").contains(PASSWORD), "{report:?}");
    let error = report.error.unwrap_or_default();
    assert!(error.contains("guest"), "the user is named: {error}");
}
