//! OpenTelemetry traces from the real binary, received by an OTLP/HTTP collector in the test
//! (protobuf decoded with `opentelemetry-proto`): one trace from a publish's `traceparent` to
//! its deliveries, the coalesced write and lookup spans linked with their callers, the
//! `traceparent` on webhooks, a retry by another process joining the publish's trace through
//! the context stored with the event, and no exporter without `SHEAF_OTLP_ENDPOINT`.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;
use serde_json::json;
use sheaf_testenv::receiver::{Failing, Receiver};

use crate::support::{Client, spawn_sheaf, stop_clean};

/// An OTLP/HTTP trace collector on loopback: every span of every export it was sent.
struct Collector {
    addr: SocketAddr,
    spans: Arc<Mutex<Vec<Span>>>,
    exports: Arc<Mutex<usize>>,
}

impl Collector {
    async fn start() -> Self {
        type Seen = (Arc<Mutex<Vec<Span>>>, Arc<Mutex<usize>>);
        async fn export(State((spans, exports)): State<Seen>, body: Bytes) -> Vec<u8> {
            let request = ExportTraceServiceRequest::decode(body).expect("an OTLP protobuf body");
            *exports.lock().unwrap() += 1;
            let mut spans = spans.lock().unwrap();
            for resource in request.resource_spans {
                for scope in resource.scope_spans {
                    spans.extend(scope.spans);
                }
            }
            // An empty ExportTraceServiceResponse.
            Vec::new()
        }
        let spans = Arc::new(Mutex::new(Vec::new()));
        let exports = Arc::new(Mutex::new(0));
        let app = axum::Router::new()
            .route("/v1/traces", post(export))
            .with_state((Arc::clone(&spans), Arc::clone(&exports)));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Collector {
            addr,
            spans,
            exports,
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn spans(&self) -> Vec<Span> {
        self.spans.lock().unwrap().clone()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The names of the exported spans `span` links to.
fn linked_names<'a>(span: &Span, by_id: &HashMap<String, &'a Span>) -> Vec<&'a str> {
    span.links
        .iter()
        .filter_map(|l| by_id.get(&hex(&l.span_id)))
        .map(|s| s.name.as_str())
        .collect()
}

fn attribute(span: &Span, key: &str) -> Option<String> {
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    let value = span
        .attributes
        .iter()
        .find(|kv| kv.key == key)?
        .value
        .as_ref()?;
    match value.value.as_ref()? {
        Value::StringValue(s) => Some(s.clone()),
        Value::IntValue(i) => Some(i.to_string()),
        other => Some(format!("{other:?}")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_runs_from_a_publish_to_its_deliveries_and_batches_are_linked() {
    let collector = Collector::start().await;
    // Every first attempt fails (503 for the first 1.5 s), so each event is retried once: its
    // retry's latest-attempt lookup goes through the coalescer.
    let receiver = Receiver::builder()
        .failing(Failing::ForAfterFirst(Duration::from_millis(1_500)))
        .start()
        .await
        .unwrap();
    let sheaf = spawn_sheaf(&[
        ("SHEAF_OTLP_ENDPOINT", collector.url().as_str()),
        ("SHEAF_RETRY_SCHEDULE", "2s"),
        ("SHEAF_RETRY_JITTER_PERCENT", "0"),
        ("SHEAF_ALLOW_PRIVATE_DESTINATIONS", "true"),
    ])
    .await;
    let client = Client::new(sheaf.addr);
    client
        .tenant_with_destination("acme", &receiver.url())
        .await;

    // 50 events, each in a trace of its own that the publisher started.
    let http = reqwest::Client::new();
    let mut trace_of = HashMap::new();
    for i in 0..50u32 {
        let trace_id = format!(
            "{:032x}",
            0x5eaf_0000_0000_0000_0000_0000_0000_0000u128 + u128::from(i)
        );
        let parent = format!("{:016x}", 0xfeed_0000_0000_0000u64 + u64::from(i));
        let id = format!("traced-{i}");
        let answer = http
            .post(sheaf.url("/api/v1/publish"))
            .header("traceparent", format!("00-{trace_id}-{parent}-01"))
            .header("content-type", "application/json")
            .body(
                json!({"tenant_id": "acme", "topic": "order.created", "id": id, "data": {"n": i}})
                    .to_string(),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 202, "{}", answer.text().await.unwrap());
        trace_of.insert(id, (trace_id, parent));
    }
    let ids: Vec<String> = trace_of.keys().cloned().collect();
    assert!(
        receiver.delivers_all(&ids, Duration::from_secs(60)).await,
        "every event is delivered"
    );
    // The last spans leave with the graceful stop.
    stop_clean(sheaf).await;
    let spans = collector.spans();
    let by_id: HashMap<String, &Span> = spans.iter().map(|s| (hex(&s.span_id), s)).collect();
    let named = |name: &str, trace: &str| -> Vec<&Span> {
        spans
            .iter()
            .filter(|s| s.name == name && hex(&s.trace_id) == trace)
            .collect()
    };

    let mut retries = 0;
    for (id, (trace, parent)) in &trace_of {
        let requests = named("request", trace);
        assert_eq!(requests.len(), 1, "{id}: one request span in trace {trace}");
        assert_eq!(
            hex(&requests[0].parent_span_id),
            *parent,
            "{id}: continues the caller's span"
        );
        let publishes = named("publish", trace);
        assert_eq!(publishes.len(), 1, "{id}: one publish span");
        assert_eq!(
            publishes[0].parent_span_id, requests[0].span_id,
            "{id}: publish is the request's child"
        );
        // The log write that carried it is one span, linked from the publish.
        let write_links = linked_names(publishes[0], &by_id);
        assert!(
            write_links.contains(&"coalesced_write"),
            "{id}: the publish links to its coalesced write: {write_links:?}"
        );
        let deliveries = named("deliver", trace);
        assert!(
            !deliveries.is_empty(),
            "{id}: its deliveries are in its trace"
        );
        for deliver in &deliveries {
            assert_eq!(
                deliver.parent_span_id, publishes[0].span_id,
                "{id}: deliver is the publish's child"
            );
            assert_eq!(attribute(deliver, "event_id").as_deref(), Some(id.as_str()));
            if attribute(deliver, "attempt").as_deref() != Some("1") {
                retries += 1;
                let linked = linked_names(deliver, &by_id);
                assert!(
                    linked.contains(&"coalesced_lookup"),
                    "{id}: a retry links to the batch lookup that answered it: {linked:?}"
                );
            }
        }
        assert!(
            deliveries
                .iter()
                .any(|d| attribute(d, "http.response.status_code").as_deref() == Some("200")),
            "{id}: the successful attempt's span has its status code"
        );
    }
    assert!(
        retries >= 25,
        "most events were retried once ({retries} retries)"
    );

    // Each webhook carries the traceparent of its attempt's span.
    let deliver_spans: HashSet<(String, String)> = spans
        .iter()
        .filter(|s| s.name == "deliver")
        .map(|s| (hex(&s.trace_id), hex(&s.span_id)))
        .collect();
    for delivery in receiver.deliveries() {
        let traceparent = delivery.header("traceparent");
        let parts: Vec<&str> = traceparent.split('-').collect();
        assert_eq!(
            parts.len(),
            4,
            "{}: traceparent {traceparent:?}",
            delivery.id
        );
        assert_eq!(parts[0], "00");
        assert_eq!(
            trace_of[&delivery.id].0, parts[1],
            "{}: the event's trace",
            delivery.id
        );
        assert!(
            deliver_spans.contains(&(parts[1].to_owned(), parts[2].to_owned())),
            "{}: the header names an exported attempt span",
            delivery.id
        );
    }

    // And a batch span names the callers it served.
    let lookups: Vec<&Span> = spans
        .iter()
        .filter(|s| s.name == "coalesced_lookup")
        .collect();
    assert!(!lookups.is_empty());
    assert!(
        lookups.iter().all(|s| !s.links.is_empty()),
        "every batch lookup links to its callers"
    );
}

/// Process A takes a traced publish on the Postgres queue and fails its first delivery (the
/// receiver is down), then stops; process B, which never saw the publish, delivers the retry.
/// B's attempt span joins the publish's trace as the publish span's child, through the context
/// stored with the event and carried in its attempt. `log_store` picks where the log lives:
/// Postgres (the log tables are the outbox) or ClickHouse (the shipper carries the context).
async fn a_retry_in_another_process_joins_the_publish_trace(log_store: &[(&str, &str)]) {
    let collector = Collector::start().await;
    // Down for the first attempt only.
    let receiver = Receiver::builder()
        .failing(Failing::ForAfterFirst(Duration::from_millis(500)))
        .start()
        .await
        .unwrap();
    let endpoint = collector.url();
    let mut env = vec![
        ("SHEAF_OTLP_ENDPOINT", endpoint.as_str()),
        ("SHEAF_QUEUE", "postgres"),
        ("SHEAF_RETRY_SCHEDULE", "3s"),
        ("SHEAF_RETRY_JITTER_PERCENT", "0"),
        ("SHEAF_ALLOW_PRIVATE_DESTINATIONS", "true"),
        ("SHEAF_QUEUE_POLL_INTERVAL", "50ms"),
        ("SHEAF_LOG_SHIP_INTERVAL", "100ms"),
    ];
    env.extend_from_slice(log_store);

    let a = spawn_sheaf(&env).await;
    Client::new(a.addr)
        .tenant_with_destination("acme", &receiver.url())
        .await;
    let trace = "5eaf00000000000000000000000000b0";
    let answer = reqwest::Client::new()
        .post(a.url("/api/v1/publish"))
        .header("traceparent", format!("00-{trace}-feed0000000000b0-01"))
        .header("content-type", "application/json")
        .body(
            json!({"tenant_id": "acme", "topic": "order.created", "id": "elsewhere", "data": {}})
                .to_string(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 202, "{}", answer.text().await.unwrap());
    let deadline = Instant::now() + Duration::from_secs(30);
    while receiver.deliveries().is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(receiver.requests(), (1, 1), "A's first attempt was refused");
    // The graceful stop settles the failed attempt and its retry; the retry is not due yet.
    stop_clean(a).await;

    let b = spawn_sheaf(&env).await;
    assert!(
        receiver
            .delivers_all(&["elsewhere".to_owned()], Duration::from_secs(30))
            .await,
        "B delivers the retry"
    );
    // The event API shows the stored context (the log store may receive the event a ship
    // interval late).
    let client = Client::new(b.addr);
    let mut event = client.get("/api/v1/tenants/acme/events/elsewhere").await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while event.status != 200 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        event = client.get("/api/v1/tenants/acme/events/elsewhere").await;
    }
    assert_eq!(event.status, 200, "{:?}", event.body);
    stop_clean(b).await;

    let spans = collector.spans();
    let in_trace = |name: &str| -> Vec<&Span> {
        spans
            .iter()
            .filter(|s| s.name == name && hex(&s.trace_id) == trace)
            .collect()
    };
    let publishes = in_trace("publish");
    assert_eq!(publishes.len(), 1, "one publish span in the trace");
    let deliveries = in_trace("deliver");
    let attempt = |n: &str| {
        deliveries
            .iter()
            .find(|d| attribute(d, "attempt").as_deref() == Some(n))
            .unwrap_or_else(|| panic!("attempt {n}'s span is in the publish's trace: {spans:#?}"))
    };
    for n in ["1", "2"] {
        assert_eq!(
            attempt(n).parent_span_id,
            publishes[0].span_id,
            "attempt {n}'s span is the publish's child"
        );
    }
    assert_eq!(
        attribute(attempt("2"), "http.response.status_code").as_deref(),
        Some("200"),
        "the retry is B's successful attempt"
    );
    // And the retry's webhook names B's attempt span.
    assert_eq!(
        event.body["trace"],
        json!({"traceparent": format!("00-{trace}-{}-01", hex(&publishes[0].span_id))}),
        "the event keeps its publish span's context"
    );
    let retry = receiver.deliveries().pop().expect("the retry's request");
    assert_eq!(
        retry.header("traceparent"),
        format!("00-{trace}-{}-01", hex(&attempt("2").span_id))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_in_another_process_joins_the_publish_trace_with_the_postgres_log() {
    let postgres = sheaf_testenv::require_postgres!("retry_elsewhere_joins_the_trace_pg");
    let schema = sheaf_testenv::unique_name("trc");
    a_retry_in_another_process_joins_the_publish_trace(&[
        ("SHEAF_LOG_STORE", "postgres"),
        ("SHEAF_POSTGRES_URL", postgres.as_str()),
        ("SHEAF_POSTGRES_SCHEMA", schema.as_str()),
    ])
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_in_another_process_joins_the_publish_trace_with_the_clickhouse_log() {
    let postgres = sheaf_testenv::require_postgres!("retry_elsewhere_joins_the_trace_ch");
    let clickhouse = sheaf_testenv::require_clickhouse!("retry_elsewhere_joins_the_trace_ch");
    let schema = sheaf_testenv::unique_name("trc");
    let database = sheaf_testenv::unique_name("trc");
    a_retry_in_another_process_joins_the_publish_trace(&[
        ("SHEAF_LOG_STORE", "clickhouse"),
        ("SHEAF_POSTGRES_URL", postgres.as_str()),
        ("SHEAF_POSTGRES_SCHEMA", schema.as_str()),
        ("SHEAF_CLICKHOUSE_URL", clickhouse.as_str()),
        ("SHEAF_CLICKHOUSE_DATABASE", database.as_str()),
    ])
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_endpoint_nothing_is_exported_and_webhooks_carry_no_traceparent() {
    let collector = Collector::start().await;
    let receiver = Receiver::start().await.unwrap();
    // OpenTelemetry's own variable names the collector; Sheaf reads only its own setting.
    let sheaf = sheaf_testenv::process::SheafCommand::new(env!("CARGO_BIN_EXE_sheaf"))
        .env("SHEAF_LOG", "info")
        .env("SHEAF_ALLOW_PRIVATE_DESTINATIONS", "true")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", collector.url())
        .start_timeout(Duration::from_secs(60))
        .start()
        .await
        .expect("sheaf starts");
    let client = Client::new(sheaf.addr);
    client
        .tenant_with_destination("acme", &receiver.url())
        .await;
    let answer = reqwest::Client::new()
        .post(sheaf.url("/api/v1/publish"))
        .header(
            "traceparent",
            "00-5eaf0000000000000000000000000001-feed000000000001-01",
        )
        .header("content-type", "application/json")
        .body(
            json!({"tenant_id": "acme", "topic": "order.created", "id": "untraced", "data": {}})
                .to_string(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 202);
    assert!(
        receiver
            .delivers_all(&["untraced".to_owned()], Duration::from_secs(30))
            .await
    );
    let event = client.get("/api/v1/tenants/acme/events/untraced").await;
    assert_eq!(event.status, 200, "{:?}", event.body);
    assert!(
        event.body.get("trace").is_none(),
        "no context is stored without tracing: {:?}",
        event.body
    );
    let started = Instant::now();
    stop_clean(sheaf).await;
    // A batch processor would have sent by now: at the stop at the latest.
    tokio::time::sleep(Duration::from_millis(500).saturating_sub(started.elapsed())).await;
    assert_eq!(
        *collector.exports.lock().unwrap(),
        0,
        "nothing was exported"
    );
    for delivery in receiver.deliveries() {
        assert_eq!(
            delivery.header("traceparent"),
            "",
            "no trace context without tracing"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_log_lines_of_a_traced_request_carry_its_trace_id() {
    let collector = Collector::start().await;
    let sheaf = spawn_sheaf(&[
        ("SHEAF_OTLP_ENDPOINT", collector.url().as_str()),
        ("SHEAF_LOG_FORMAT", "json"),
        ("SHEAF_LOG", "info,tower_http=debug"),
    ])
    .await;
    let trace = "5eaf00000000000000000000000000aa";
    let answer = reqwest::Client::new()
        .get(sheaf.url("/healthz"))
        .header("traceparent", format!("00-{trace}-feed0000000000aa-01"))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !sheaf.log().contains(trace) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let log = sheaf.log();
    stop_clean(sheaf).await;
    let traced: Vec<serde_json::Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|l| l["span"]["trace_id"] == trace)
        .collect();
    assert!(
        !traced.is_empty(),
        "no JSON line carries the trace id:\n{log}"
    );
    assert!(traced.iter().all(|l| l["span"]["path"] == "/healthz"));
    assert!(
        traced.iter().all(|l| l["span"]["span_id"]
            .as_str()
            .is_some_and(|id| id.len() == 16 && id != "0000000000000000")),
        "the lines carry the request span's id: {traced:?}"
    );
    // And the request's span went to the collector under that trace.
    assert!(
        collector
            .spans()
            .iter()
            .any(|s| s.name == "request" && hex(&s.trace_id) == trace),
        "the request span was exported"
    );
}
