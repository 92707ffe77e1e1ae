//! Destination controls through the API, on every backend: payload filters decide at publish
//! which destinations get a job, and a filter the service cannot use is refused naming its path;
//! a destination that keeps failing is disabled with operator events (`health`); a rate limit
//! holds across processes (`limits`); dead letters are replayed in bulk (`replay`), and a replay
//! outlives the process that started it, killed or shut down (`replay_takeover`); at the
//! pending-work bound publishes are refused and nothing accepted is lost (`backpressure`); an
//! ordered destination gets each key's events in publish order through retries (`ordering`).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use futures::StreamExt as _;
use serde_json::{Value, json};
use sheaf_testenv::receiver::Receiver;

use crate::support::{Client, env_with, start_server};

/// The configurations a filter must behave the same on: the memory backends (entities in
/// memory, the direct publish path), the SQLite file (entities, queue and log in one file, the
/// outbox's group commit on its single writer), and Postgres entities with the Postgres queue
/// (the outbox's group commit) under either log store.
pub(super) fn backends(test: &str) -> Vec<(&'static str, HashMap<String, String>)> {
    // Cargo's scratch directory for integration tests: removed with the target directory.
    let data_dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(sheaf_testenv::unique_name("sheaf-data"))
        .display()
        .to_string();
    let mut all = vec![
        ("memory", env_with(&[])),
        (
            "sqlite",
            env_with(&[
                ("SHEAF_QUEUE", "sqlite"),
                ("SHEAF_LOG_STORE", "sqlite"),
                ("SHEAF_DATA_DIR", data_dir.as_str()),
            ]),
        ),
    ];
    if let Some(postgres) = sheaf_testenv::postgres_url(test) {
        let schema = sheaf_testenv::unique_name("ctl");
        all.push((
            "postgres",
            env_with(&[
                ("SHEAF_QUEUE", "postgres"),
                ("SHEAF_LOG_STORE", "postgres"),
                ("SHEAF_POSTGRES_URL", postgres.as_str()),
                ("SHEAF_POSTGRES_SCHEMA", schema.as_str()),
            ]),
        ));
        if let Some(clickhouse) = sheaf_testenv::clickhouse_url(test) {
            let schema = sheaf_testenv::unique_name("ctl");
            let database = sheaf_testenv::unique_name("ctl");
            all.push((
                "postgres + clickhouse",
                env_with(&[
                    ("SHEAF_QUEUE", "postgres"),
                    ("SHEAF_LOG_STORE", "clickhouse"),
                    ("SHEAF_POSTGRES_URL", postgres.as_str()),
                    ("SHEAF_POSTGRES_SCHEMA", schema.as_str()),
                    ("SHEAF_CLICKHOUSE_URL", clickhouse.as_str()),
                    ("SHEAF_CLICKHOUSE_DATABASE", database.as_str()),
                ]),
            ));
        }
    }
    all
}

/// One generated event: its id, topic and data.
struct Mixed {
    id: String,
    topic: &'static str,
    data: Value,
}

/// 1,000 events over three topics with varied payloads: a kind, a total (integer or fractional),
/// a region that is sometimes missing, and tags that are sometimes an array.
fn mixed_events() -> Vec<Mixed> {
    const TOPICS: [&str; 3] = ["order.created", "order.paid", "invoice.sent"];
    const KINDS: [&str; 4] = ["retail", "wholesale", "test", "refund"];
    const REGIONS: [&str; 4] = ["eu", "us", "apac", "latam"];
    (0..1_000)
        .map(|i: usize| {
            let mut data = json!({
                "kind": KINDS[i % 4],
                "total": if i.is_multiple_of(2) { json!(i % 250) } else { json!((i % 250) as f64 + 0.5) },
            });
            if !i.is_multiple_of(5) {
                data["region"] = json!(REGIONS[(i / 5) % 4]);
            }
            if i.is_multiple_of(3) {
                data["tags"] = if i.is_multiple_of(6) {
                    json!(["new", "vip"])
                } else {
                    json!(["new"])
                };
            }
            Mixed {
                id: format!("mixed-{i}"),
                topic: TOPICS[(i / 7) % 3],
                data,
            }
        })
        .collect()
}

/// A destination's filter and, written out by hand, what it means.
struct Case {
    name: &'static str,
    topics: Value,
    filter: Value,
    wants: fn(&Mixed) -> bool,
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "paid retail orders of 100 or more",
            topics: json!(["*"]),
            filter: json!({ "topic": "order.paid", "data": { "kind": "retail", "total": { "$gte": 100 } } }),
            wants: |e| {
                e.topic == "order.paid"
                    && e.data["kind"] == "retail"
                    && e.data["total"].as_f64().unwrap() >= 100.0
            },
        },
        Case {
            name: "vip-tagged or invoices, among two topics",
            topics: json!(["order.created", "invoice.sent"]),
            filter: json!({ "$or": [{ "topic": "invoice.sent" }, { "data": { "tags": "vip" } }] }),
            wants: |e| {
                let vip = e.data["tags"]
                    .as_array()
                    .is_some_and(|tags| tags.iter().any(|t| t == "vip"));
                e.topic == "invoice.sent" || (e.topic == "order.created" && vip)
            },
        },
        Case {
            name: "outside eu and us, not tests, under 50",
            topics: json!(["*"]),
            filter: json!({ "data": {
                "region": { "$exists": true, "$nin": ["eu", "us"] },
                "kind": { "$neq": "test" },
                "total": { "$lt": 50 },
            } }),
            wants: |e| {
                e.data.get("region").is_some_and(|r| r != "eu" && r != "us")
                    && e.data["kind"] != "test"
                    && e.data["total"].as_f64().unwrap() < 50.0
            },
        },
    ]
}

async fn create_destination(client: &Client, tenant: &str, body: Value) -> Value {
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

pub(super) async fn publish(client: &Client, tenant: &str, id: &str, topic: &str, data: &Value) {
    let answer = client
        .send(
            "POST",
            "/api/v1/publish",
            Some(json!({ "tenant_id": tenant, "id": id, "topic": topic, "data": data })),
        )
        .await;
    assert_eq!(answer.status, 202, "publish {id}: {answer:?}");
}

async fn filters_deliver_exactly_the_matching_events(label: &str, env: HashMap<String, String>) {
    let server = start_server(env).await;
    let client = Client::new(server.addr);
    let tenant = "filters";
    let put = client
        .send("PUT", &format!("/api/v1/tenants/{tenant}"), None)
        .await;
    assert_eq!(put.status, 201, "{put:?}");
    let cases = cases();
    let mut receivers = Vec::new();
    let mut destinations = Vec::new();
    for case in &cases {
        let receiver = Receiver::start().await.expect("the receiver binds");
        let created = create_destination(
            &client,
            tenant,
            json!({ "type": "webhook", "topics": case.topics, "filter": case.filter,
                    "config": { "url": receiver.url() } }),
        )
        .await;
        assert_eq!(
            created["filter"], case.filter,
            "{label}: the filter as given"
        );
        destinations.push(created["id"].as_str().unwrap().to_owned());
        receivers.push(receiver);
    }

    let events = mixed_events();
    futures::stream::iter(&events)
        .map(|e| publish(&client, tenant, &e.id, e.topic, &e.data))
        .buffer_unordered(16)
        .collect::<Vec<()>>()
        .await;
    let mut expected_jobs = 0;
    for (case, receiver) in cases.iter().zip(&receivers) {
        let expected: HashSet<String> = events
            .iter()
            .filter(|e| (case.wants)(e))
            .map(|e| e.id.clone())
            .collect();
        assert!(
            !expected.is_empty() && expected.len() < events.len() / 2,
            "{}: the workload exercises the filter (it wants {})",
            case.name,
            expected.len()
        );
        expected_jobs += expected.len() as u64;
        assert!(
            receiver
                .delivers_all(&expected, Duration::from_secs(60))
                .await,
            "{label}: {}: every matching event delivered",
            case.name
        );
        assert_eq!(
            receiver.delivered_ids(),
            expected,
            "{label}: {}: exactly the matching events",
            case.name
        );
    }
    // Every job is enqueued at publish: with this count right, nothing else is on its way.
    assert_eq!(
        client.metric("sheaf_jobs_enqueued_total").await,
        expected_jobs as f64,
        "{label}: one job per matching (event, destination), none for the others"
    );

    // Clearing the first destination's filter: an event it refused before is now delivered.
    let path = format!("/api/v1/tenants/{tenant}/destinations/{}", destinations[0]);
    let cleared = client
        .send("PATCH", &path, Some(json!({ "filter": null })))
        .await;
    assert_eq!(cleared.status, 200, "{cleared:?}");
    assert_eq!(cleared.body["filter"], Value::Null);
    assert_eq!(cleared.body["topics"], json!(["*"]), "other fields stay");
    publish(
        &client,
        tenant,
        "after-clear",
        "order.created",
        &json!({ "kind": "test" }),
    )
    .await;
    let after: HashSet<String> = ["after-clear".to_owned()].into();
    assert!(
        receivers[0]
            .delivers_all(&after, Duration::from_secs(30))
            .await
    );
    // A patch that does not name the filter keeps it; one that names it replaces it.
    let path = format!("/api/v1/tenants/{tenant}/destinations/{}", destinations[2]);
    let kept = client
        .send(
            "PATCH",
            &path,
            Some(json!({ "headers": { "x-kept": "1" } })),
        )
        .await;
    assert_eq!(kept.body["filter"], cases[2].filter, "{label}: kept");
    let replaced = client
        .send(
            "PATCH",
            &path,
            Some(json!({ "filter": { "data": { "kind": "wholesale" } } })),
        )
        .await;
    assert_eq!(replaced.status, 200, "{replaced:?}");
    assert_eq!(
        replaced.body["filter"],
        json!({ "data": { "kind": "wholesale" } })
    );
    let read = client.get(&path).await;
    assert_eq!(
        read.body["filter"],
        json!({ "data": { "kind": "wholesale" } })
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payload_filters_deliver_exactly_the_matching_events_on_every_backend() {
    for (label, env) in backends("payload filters") {
        filters_deliver_exactly_the_matching_events(label, env).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filter_the_service_cannot_use_is_refused_naming_its_path() {
    let server = start_server(env_with(&[])).await;
    let client = Client::new(server.addr);
    let tenant = "bad-filters";
    client
        .send("PUT", &format!("/api/v1/tenants/{tenant}"), None)
        .await;
    let refused = [
        (
            json!({ "data": { "total": { "$gte": [1] } } }),
            "filter.data.total.$gte",
        ),
        (json!({ "data": { "kind": { "$regex": "^a" } } }), "$regex"),
        (
            json!({ "data": { "kind": { "$in": "retail" } } }),
            "filter.data.kind.$in",
        ),
        (
            json!({ "data": { "x": { "$exists": 1 } } }),
            "filter.data.x.$exists",
        ),
        (json!({ "$or": [] }), "filter.$or"),
        (
            json!({ "$or": [{ "data": { "a": 1 } }, { "data": { "b": { "$lt": {} } } }] }),
            "filter.$or[1].data.b.$lt",
        ),
        (json!({ "payload": { "a": 1 } }), "payload"),
        (json!({}), "filter"),
        (json!("order.paid"), "filter"),
        (
            json!({ "data": { "a": { "$eq": 1, "b": 2 } } }),
            "filter.data.a",
        ),
    ];
    for (filter, path) in refused {
        let created = client
            .send(
                "POST",
                &format!("/api/v1/tenants/{tenant}/destinations"),
                Some(
                    json!({ "type": "webhook", "topics": ["*"], "filter": filter,
                             "config": { "url": "http://127.0.0.1:9/hook" } }),
                ),
            )
            .await;
        assert_eq!(created.status, 400, "{filter} is refused: {created:?}");
        assert_eq!(created.error_code(), "invalid_filter", "{filter}");
        let message = created.body["error"]["message"].as_str().unwrap();
        assert!(message.contains(path), "{filter}: {message:?} names {path}");
    }
    // A patch is checked the same way, and changes nothing when refused.
    let created = create_destination(
        &client,
        tenant,
        json!({ "type": "webhook", "topics": ["*"], "filter": { "data": { "kind": "retail" } },
                "config": { "url": "http://127.0.0.1:9/hook" } }),
    )
    .await;
    let path = format!(
        "/api/v1/tenants/{tenant}/destinations/{}",
        created["id"].as_str().unwrap()
    );
    let patched = client
        .send(
            "PATCH",
            &path,
            Some(json!({ "filter": { "data": { "kind": { "$like": "r%" } } } })),
        )
        .await;
    assert_eq!(patched.status, 400, "{patched:?}");
    assert!(
        patched.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("$like")
    );
    let read = client.get(&path).await;
    assert_eq!(read.body["filter"], json!({ "data": { "kind": "retail" } }));
    server.shutdown().await;
}

mod backpressure;
mod health;
mod limits;
mod ordering;
mod replay;
mod replay_takeover;
