//! Test support: a service started in-process, the real `sheaf` binary as a child process (the
//! shared [`SheafProcess`] with these tests' defaults), and the shared API client pinned to one
//! server. The webhook receiver the tests deliver to is `sheaf_testenv::receiver::Receiver`.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{Value, json};
use sheaf_server::{Config, Running};
use sheaf_testenv::api::Api;
use sheaf_testenv::process::{SheafCommand, SheafProcess};

/// Settings every in-process test server gets: the memory stores (a test that wants the
/// SQLite file names it, with a directory of its own), an ephemeral loopback port, loopback
/// receivers allowed, quick polling.
pub fn base_env() -> HashMap<String, String> {
    [
        ("SHEAF_LOG_STORE", "memory"),
        ("SHEAF_LISTEN", "127.0.0.1:0"),
        ("SHEAF_ALLOW_PRIVATE_DESTINATIONS", "true"),
        ("SHEAF_QUEUE_POLL_INTERVAL", "50ms"),
        ("SHEAF_LOG", "warn"),
        // The service runs in this test binary: its transformation runner is the real `sheaf`.
        (
            "SHEAF_TRANSFORM_RUNNER",
            concat!(env!("CARGO_BIN_EXE_sheaf"), " transform-runner"),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

/// `base_env` with `overrides` on top.
pub fn env_with(overrides: &[(&str, &str)]) -> HashMap<String, String> {
    let mut env = base_env();
    for (k, v) in overrides {
        env.insert((*k).to_owned(), (*v).to_owned());
    }
    env
}

/// Starts the service in this process on the stores `env` names.
pub async fn start_server(env: HashMap<String, String>) -> Running {
    let config = Config::load(env).expect("test configuration is valid");
    sheaf_server::start(config).await.expect("server starts")
}

/// The shared API client (`sheaf_testenv::api::Api`) pinned to one server, with the panics a
/// test wants: a request that gets no answer fails the test, naming the request.
#[derive(Clone)]
pub struct Client {
    pub base: String,
    api: Api,
}

/// A response: status and body (JSON when it parses, else a string).
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub body: Value,
}

impl Answer {
    pub fn error_code(&self) -> &str {
        self.body["error"]["code"].as_str().unwrap_or("")
    }
}

impl Client {
    pub fn new(addr: SocketAddr) -> Self {
        Self {
            base: format!("http://{addr}"),
            api: Api::new(Duration::from_secs(30)).expect("an HTTP client"),
        }
    }

    pub fn with_key(mut self, key: &str) -> Self {
        self.api = self.api.with_key(key);
        self
    }

    fn method(method: &str) -> reqwest::Method {
        reqwest::Method::from_bytes(method.as_bytes()).expect("an HTTP method")
    }

    pub async fn send(&self, method: &str, path: &str, body: Option<Value>) -> Answer {
        let (status, body) = self
            .api
            .call(Self::method(method), &self.base, path, body.as_ref())
            .await
            .unwrap_or_else(|e| panic!("{method} {path} got no answer: {e:#}"));
        Answer { status, body }
    }

    pub async fn send_raw(&self, method: &str, path: &str, body: Option<Vec<u8>>) -> Answer {
        let (status, body) = self
            .api
            .call_raw(Self::method(method), &self.base, path, body)
            .await
            .unwrap_or_else(|e| panic!("{method} {path} got no answer: {e:#}"));
        Answer { status, body }
    }

    pub async fn get(&self, path: &str) -> Answer {
        self.send("GET", path, None).await
    }

    /// Creates the tenant and a webhook destination for every topic; returns the destination.
    pub async fn tenant_with_destination(&self, tenant: &str, url: &str) -> Value {
        self.api
            .tenant(&self.base, tenant)
            .await
            .unwrap_or_else(|e| panic!("{e:#}"));
        let created = self
            .send(
                "POST",
                &format!("/api/v1/tenants/{tenant}/destinations"),
                Some(json!({ "type": "webhook", "topics": ["*"], "config": { "url": url } })),
            )
            .await;
        assert_eq!(created.status, 201, "{created:?}");
        created.body
    }

    pub async fn publish(&self, tenant: &str, id: &str, data: Value) -> Answer {
        let (status, body) = self
            .api
            .publish(&self.base, tenant, "order.created", id, &data)
            .await
            .unwrap_or_else(|e| panic!("publish of {id} got no answer: {e:#}"));
        Answer { status, body }
    }

    /// Every attempt of one event, following `next` cursors over pages of two.
    pub async fn attempts_of(&self, tenant: &str, event: &str) -> Vec<Value> {
        self.every_item(&format!(
            "/api/v1/tenants/{tenant}/attempts?event_id={event}&limit=2"
        ))
        .await
    }

    /// Every item of a listing (`path` with its query), following `next` cursors.
    pub async fn every_item(&self, path: &str) -> Vec<Value> {
        self.api
            .list_all(&self.base, path)
            .await
            .unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// A sample from `/metrics` (0 when the page has none of that name).
    pub async fn metric(&self, name: &str) -> f64 {
        let page = self
            .api
            .metrics(&self.base)
            .await
            .unwrap_or_else(|e| panic!("{e:#}"));
        sheaf_engine::metrics::sample_value(&page, name).unwrap_or(0.0)
    }
}

/// Publishes `count` events `{prefix}-{i}` with up to `parallel` requests at a time.
pub async fn publish_many(
    client: &Client,
    tenant: &str,
    prefix: &str,
    count: usize,
    parallel: usize,
) -> HashSet<String> {
    use futures::StreamExt as _;
    let ids: Vec<String> = (0..count).map(|i| format!("{prefix}-{i}")).collect();
    let results: Vec<(String, u16)> = futures::stream::iter(ids.clone())
        .map(|id| {
            let client = client.clone();
            let tenant = tenant.to_owned();
            async move {
                let answer = client.publish(&tenant, &id, json!({ "n": id })).await;
                (id, answer.status)
            }
        })
        .buffer_unordered(parallel)
        .collect()
        .await;
    for (id, status) in &results {
        assert_eq!(*status, 202, "publish of {id} answered {status}");
    }
    ids.into_iter().collect()
}

/// Starts the real binary with only `env` as its `SHEAF_*` settings (plus an ephemeral loopback
/// port, and `info` logs unless `env` sets `SHEAF_LOG`: the start-up line it is awaited by is
/// logged at `info`), and waits (at most 60 s) until it listens.
pub async fn spawn_sheaf(env: &[(&str, &str)]) -> SheafProcess {
    SheafCommand::new(env!("CARGO_BIN_EXE_sheaf"))
        .env("SHEAF_LOG", "info")
        .envs(env.iter().copied())
        .start_timeout(Duration::from_secs(60))
        .start()
        .await
        .expect("sheaf starts")
}

/// SIGTERM, then waits (at most 30 s) for a clean exit.
pub async fn stop_clean(sheaf: SheafProcess) {
    let exited = sheaf
        .stop(Duration::from_secs(30))
        .await
        .expect("sheaf stops within 30 s after SIGTERM");
    assert!(
        exited.status.success(),
        "sheaf exited with {}: {}",
        exited.status,
        exited.log
    );
}

/// SIGKILL, then reaps it: no graceful stop, no last acknowledgement, connections cut as by a
/// crash.
pub fn kill(sheaf: SheafProcess) {
    let status = sheaf.kill().expect("SIGKILL the sheaf child");
    assert!(!status.success(), "a killed process does not exit cleanly");
}
