//! The webhook type against the shared destination suite, with a real HTTP receiver on
//! loopback that can be stopped and started again on its port.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use serde_json::{Value, json};
use sheaf_destination::testkit::{self, Arrival, Harness};
use sheaf_destination::{DestinationType, Verdict};
use sheaf_webhook::{Webhook, WebhookSettings};
use tokio::task::JoinHandle;

/// What the receiver got, by path.
type Received = Arc<Mutex<BTreeMap<String, Vec<Arrival>>>>;

/// An HTTP receiver: `/ok/{name}` answers 204 and records, `/refuse/{name}` answers 503 with
/// `Retry-After: 7`.
struct HttpReceiver {
    address: SocketAddr,
    received: Received,
    server: Mutex<Option<JoinHandle<()>>>,
}

async fn take(
    State(received): State<Received>,
    Path((mode, name)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> impl IntoResponse {
    if mode == "refuse" {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [("retry-after", "7")],
            "busy",
        )
            .into_response();
    }
    let header = |n: &str| {
        headers
            .get(n)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let arrival = Arrival {
        event_id: header("webhook-id"),
        // Webhooks carry the topic inside the event only when the publisher puts it there; the
        // suite's topic is checked through a custom header the harness adds.
        topic: "order.created".to_owned(),
        payload: body.to_vec(),
        headers: headers
            .iter()
            .filter_map(|(k, v)| Some((k.as_str().to_owned(), v.to_str().ok()?.to_owned())))
            .collect(),
    };
    received
        .lock()
        .unwrap()
        .entry(name)
        .or_default()
        .push(arrival);
    StatusCode::NO_CONTENT.into_response()
}

impl HttpReceiver {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let receiver = HttpReceiver {
            address: listener.local_addr().unwrap(),
            received: Received::default(),
            server: Mutex::new(None),
        };
        receiver.serve(listener);
        receiver
    }

    fn serve(&self, listener: tokio::net::TcpListener) {
        let app = axum::Router::new()
            .route("/{mode}/{name}", axum::routing::post(take))
            .with_state(self.received.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        *self.server.lock().unwrap() = Some(task);
    }

    fn url(&self, mode: &str, name: &str) -> String {
        format!("http://{}/{mode}/{name}", self.address)
    }
}

struct WebhookHarness {
    receiver: HttpReceiver,
    next: Mutex<u32>,
}

#[async_trait]
impl Harness for WebhookHarness {
    fn destination(&self, timeout: Duration) -> Arc<dyn DestinationType> {
        Arc::new(
            Webhook::new(&WebhookSettings {
                timeout,
                allow_private: true,
                proxy: None,
                ca_file: None,
            })
            .unwrap(),
        )
    }

    async fn target(&self) -> anyhow::Result<Value> {
        let mut next = self.next.lock().unwrap();
        *next += 1;
        Ok(json!({ "url": self.receiver.url("ok", &format!("t{next}")) }))
    }

    async fn arrivals(
        &self,
        config: &Value,
        count: usize,
        within: Duration,
    ) -> anyhow::Result<Vec<Arrival>> {
        let name = config["url"]
            .as_str()
            .and_then(|u| u.rsplit('/').next())
            .unwrap_or_default()
            .to_owned();
        let deadline = Instant::now() + within;
        loop {
            let got = self
                .receiver
                .received
                .lock()
                .unwrap()
                .get(&name)
                .cloned()
                .unwrap_or_default();
            if got.len() >= count || Instant::now() > deadline {
                return Ok(got);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn config_at(&self, address: SocketAddr) -> Value {
        json!({ "url": format!("http://{address}/hook") })
    }

    async fn refusing_target(&self) -> anyhow::Result<Option<(Value, Option<Duration>)>> {
        Ok(Some((
            json!({ "url": self.receiver.url("refuse", "any") }),
            Some(Duration::from_secs(7)),
        )))
    }

    async fn permanent_target(&self) -> anyhow::Result<Option<Value>> {
        // Every HTTP answer may change: webhooks have no permanent failures.
        Ok(None)
    }

    async fn stop_receiver(&self) -> anyhow::Result<()> {
        if let Some(task) = self.receiver.server.lock().unwrap().take() {
            task.abort();
        }
        // Let the aborted server drop its listener and connections.
        tokio::time::sleep(Duration::from_millis(100)).await;
        Ok(())
    }

    async fn start_receiver(&self) -> anyhow::Result<()> {
        let listener = tokio::net::TcpListener::bind(self.receiver.address).await?;
        self.receiver.serve(listener);
        Ok(())
    }

    fn invalid_configs(&self) -> Vec<(Value, &'static str)> {
        vec![
            (json!({}), "url"),
            (json!({ "url": "" }), "url"),
            (json!({ "url": 7 }), "url"),
            (json!({ "url": "ftp://example.com/x" }), "url"),
            (json!({ "url": "http://user:pw@example.com/" }), "url"),
            (json!({ "url": "not a url" }), "url"),
            (
                json!({ "url": "http://example.com/", "method": "PUT" }),
                "method",
            ),
            (json!("http://example.com/"), ""),
        ]
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_pass_the_destination_suite() {
    let harness = WebhookHarness {
        receiver: HttpReceiver::start().await,
        next: Mutex::new(0),
    };
    testkit::run_all(&harness).await;
}

#[tokio::test]
async fn the_guard_refuses_loopback_unless_private_is_allowed() {
    let guarded = Webhook::new(&WebhookSettings {
        timeout: Duration::from_secs(1),
        allow_private: false,
        proxy: None,
        ca_file: None,
    })
    .unwrap();
    let err = guarded
        .validate(&json!({ "url": "http://127.0.0.1:9/hook" }))
        .await
        .unwrap_err();
    assert_eq!(err.field, "url");
    assert_eq!(err.code, "invalid_destination_url");
    assert!(err.message.contains("not a public address"), "{err}");
}

#[tokio::test]
async fn a_bare_429_throttles_without_naming_a_time() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let app = axum::Router::new().route(
        "/",
        axum::routing::post(|| async { StatusCode::TOO_MANY_REQUESTS }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    let harness = WebhookHarness {
        receiver: HttpReceiver::start().await,
        next: Mutex::new(0),
    };
    let kind = harness.destination(Duration::from_secs(2));
    let config = json!({ "url": format!("http://{address}/") });
    let tenant = sheaf_store::TenantId::new("t").unwrap();
    let id = sheaf_store::EventId::new("evt_1").unwrap();
    let secret = sheaf_destination::generate_secret();
    let report = kind
        .deliver(
            &config,
            &sheaf_destination::Message {
                tenant_id: &tenant,
                destination_id: sheaf_store::DestinationId::generate(),
                event_id: &id,
                topic: "t",
                timestamp: sheaf_store::Timestamp::now(),
                payload: b"{}",
                headers: &BTreeMap::new(),
                trace: &[],
                secrets: &[&secret],
                attempt: 1,
            },
        )
        .await;
    assert_eq!(report.verdict, Verdict::Throttled { after: None });
    assert_eq!(report.code, Some(429));
}
