//! Test support: a recording webhook receiver on loopback, a service started in-process, the
//! real `sheaf` binary as a child process, and a small JSON client.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead as _, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use serde_json::{Value, json};
use sheaf_server::{Config, Running};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// One request the receiver got.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub headers: BTreeMap<String, String>,
    pub body: Bytes,
    pub status: u16,
}

impl Delivery {
    pub fn id(&self) -> &str {
        self.headers.get("webhook-id").map_or("", String::as_str)
    }
}

#[derive(Default)]
struct ReceiverState {
    deliveries: Vec<Delivery>,
    first_request: Option<Instant>,
}

struct Shared {
    state: Mutex<ReceiverState>,
    /// Answer 503 for this long after the first request; `None`: always 503.
    fail_for: Option<Duration>,
    /// How long each answer takes.
    delay: Duration,
}

/// A webhook receiver on 127.0.0.1 that records every request with its headers and body and
/// answers 503 for a configured time after its first request, 200 after.
pub struct Receiver {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    stop: CancellationToken,
}

async fn receive(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> StatusCode {
    if !shared.delay.is_zero() {
        tokio::time::sleep(shared.delay).await;
    }
    let mut state = shared.state.lock().unwrap();
    let now = Instant::now();
    let first = *state.first_request.get_or_insert(now);
    let failing = match shared.fail_for {
        Some(window) => now.duration_since(first) < window,
        None => true,
    };
    let status = if failing {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    };
    let headers = headers
        .iter()
        .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
        .collect();
    state.deliveries.push(Delivery {
        headers,
        body,
        status: status.as_u16(),
    });
    status
}

impl Receiver {
    /// A receiver that fails for `fail_for` after its first request (`Duration::ZERO`: never).
    pub async fn start(fail_for: Duration) -> Self {
        Self::start_with(Some(fail_for), Duration::ZERO).await
    }

    /// A receiver that always answers 503.
    pub async fn always_failing() -> Self {
        Self::start_with(None, Duration::ZERO).await
    }

    /// A receiver that answers 200, each answer after `delay`.
    pub async fn slow(delay: Duration) -> Self {
        Self::start_with(Some(Duration::ZERO), delay).await
    }

    async fn start_with(fail_for: Option<Duration>, delay: Duration) -> Self {
        let shared = Arc::new(Shared {
            state: Mutex::new(ReceiverState::default()),
            fail_for,
            delay,
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = Router::new()
            .fallback(receive)
            .with_state(Arc::clone(&shared));
        let stop = CancellationToken::new();
        let token = stop.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(token.cancelled_owned())
                .await;
        });
        Self { addr, shared, stop }
    }

    pub fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }

    pub fn deliveries(&self) -> Vec<Delivery> {
        self.shared.state.lock().unwrap().deliveries.clone()
    }

    /// Ids answered 200 at least once.
    pub fn delivered_ids(&self) -> HashSet<String> {
        self.shared
            .state
            .lock()
            .unwrap()
            .deliveries
            .iter()
            .filter(|d| d.status == 200)
            .map(|d| d.id().to_owned())
            .collect()
    }

    /// Successful deliveries beyond the first, per id, added up.
    pub fn duplicate_successes(&self) -> usize {
        let mut counts: HashMap<String, usize> = HashMap::new();
        for d in self.deliveries().iter().filter(|d| d.status == 200) {
            *counts.entry(d.id().to_owned()).or_default() += 1;
        }
        counts.values().map(|n| n - 1).sum()
    }

    /// Waits (bounded) until every id in `ids` was answered 200; returns whether they were.
    pub async fn wait_for(&self, ids: &HashSet<String>, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            let delivered = self.delivered_ids();
            if ids.iter().all(|id| delivered.contains(id)) {
                return true;
            }
            if Instant::now() >= deadline {
                let missing = ids.iter().filter(|id| !delivered.contains(*id)).count();
                eprintln!(
                    "{missing} of {} ids still undelivered after {timeout:?}",
                    ids.len()
                );
                return false;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Settings every in-process test server gets: an ephemeral loopback port, loopback receivers
/// allowed, quick polling.
pub fn base_env() -> HashMap<String, String> {
    [
        ("SHEAF_LISTEN", "127.0.0.1:0"),
        ("SHEAF_ALLOW_PRIVATE_DESTINATIONS", "true"),
        ("SHEAF_QUEUE_POLL_INTERVAL", "50ms"),
        ("SHEAF_LOG", "warn"),
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

/// A JSON client for one server.
#[derive(Clone)]
pub struct Client {
    pub base: String,
    http: reqwest::Client,
    key: Option<String>,
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
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .unwrap(),
            key: None,
        }
    }

    pub fn with_key(mut self, key: &str) -> Self {
        self.key = Some(key.to_owned());
        self
    }

    pub async fn send(&self, method: &str, path: &str, body: Option<Value>) -> Answer {
        let raw = body.map(|b| serde_json::to_vec(&b).unwrap());
        self.send_raw(method, path, raw).await
    }

    pub async fn send_raw(&self, method: &str, path: &str, body: Option<Vec<u8>>) -> Answer {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(key) = &self.key {
            request = request.bearer_auth(key);
        }
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body);
        }
        let response = request.send().await.expect("request reaches the server");
        let status = response.status().as_u16();
        let bytes = response.bytes().await.unwrap_or_default();
        let body = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        Answer { status, body }
    }

    pub async fn get(&self, path: &str) -> Answer {
        self.send("GET", path, None).await
    }

    pub async fn text(&self, path: &str) -> String {
        match self.get(path).await.body {
            Value::String(s) => s,
            other => other.to_string(),
        }
    }

    /// Creates the tenant and a webhook destination for every topic; returns the destination.
    pub async fn tenant_with_destination(&self, tenant: &str, url: &str) -> Value {
        let put = self
            .send("PUT", &format!("/api/v1/tenants/{tenant}"), None)
            .await;
        assert!(put.status == 201 || put.status == 200, "{put:?}");
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
        self.send(
            "POST",
            "/api/v1/publish",
            Some(json!({ "tenant_id": tenant, "topic": "order.created", "data": data, "id": id })),
        )
        .await
    }

    /// Every attempt of one event, following `next` cursors.
    pub async fn attempts_of(&self, tenant: &str, event: &str) -> Vec<Value> {
        let mut items = Vec::new();
        let mut next: Option<String> = None;
        for _ in 0..100 {
            let mut path = format!("/api/v1/tenants/{tenant}/attempts?event_id={event}&limit=2");
            if let Some(cursor) = &next {
                path.push_str(&format!("&next={cursor}"));
            }
            let page = self.get(&path).await;
            assert_eq!(page.status, 200, "{page:?}");
            items.extend(page.body["items"].as_array().cloned().unwrap_or_default());
            match page.body["next"].as_str() {
                Some(cursor) => next = Some(cursor.to_owned()),
                None => break,
            }
        }
        items
    }

    /// A sample from `/metrics`.
    pub async fn metric(&self, name: &str) -> f64 {
        let page = self.text("/metrics").await;
        sheaf_server::state::metrics::sample_value(&page, name).unwrap_or(0.0)
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

/// A `sheaf serve` child process; killed (by its PID) when dropped if it is still running.
pub struct Sheaf {
    child: Child,
    pub addr: SocketAddr,
    log: Arc<Mutex<String>>,
}

impl Sheaf {
    /// Starts the real binary with only `env` as its `SHEAF_*` settings (plus an ephemeral
    /// loopback port, and `info` logs unless `env` sets `SHEAF_LOG`), and waits (at most 60 s)
    /// until it listens.
    pub fn spawn(env: &[(&str, &str)]) -> Self {
        let mut command = Command::new(env!("CARGO_BIN_EXE_sheaf"));
        for (name, _) in std::env::vars() {
            if name.starts_with("SHEAF_") {
                command.env_remove(name);
            }
        }
        command
            .arg("serve")
            .env("SHEAF_LOG", "info")
            .envs(env.iter().copied())
            .env("SHEAF_LISTEN", "127.0.0.1:0")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = command.spawn().expect("sheaf starts");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel();
        let sink = Arc::clone(&log);
        // Drains stderr for the life of the child, and reports the address it listens on.
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.split("is listening on http://").nth(1) {
                    let addr: String = rest.chars().take_while(|c| !c.is_whitespace()).collect();
                    let _ = tx.send(addr);
                }
                let mut log = sink.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        let addr = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(addr) => addr.parse().expect("a socket address"),
            Err(_) => {
                let _ = child.kill();
                panic!("sheaf did not start: {}", log.lock().unwrap());
            }
        };
        Self { child, addr, log }
    }

    /// Everything the process wrote to stderr so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// SIGTERM, then waits (bounded) for a clean exit.
    pub fn stop(mut self) {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        for _ in 0..300 {
            if let Ok(Some(status)) = self.child.try_wait() {
                assert!(
                    status.success(),
                    "sheaf exited with {status}: {}",
                    self.log.lock().unwrap()
                );
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("sheaf did not stop within 30 s after SIGTERM");
    }

    /// SIGKILL (`Child::kill` signals this child's PID), then reaps it: no graceful stop, no
    /// last acknowledgement, connections cut as by a crash.
    pub fn kill(mut self) {
        self.child.kill().expect("SIGKILL the sheaf child");
        let status = self.child.wait().expect("reap the sheaf child");
        assert!(!status.success(), "a killed process does not exit cleanly");
    }
}

impl Drop for Sheaf {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
