//! A webhook receiver on loopback for the service scenarios: answers 503 while told to fail and
//! 200 after, and records when each event (by the `seq` in its JSON body) first got a 2xx, on
//! the bench process's clock, so publish-to-delivery latency needs no clock but one.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use std::sync::Mutex;

#[derive(Debug)]
struct Shared {
    base: Instant,
    fail_until: Mutex<Option<Instant>>,
    /// `seq` → microseconds after `base` of its first 2xx.
    delivered: Mutex<HashMap<u64, u64>>,
    requests: AtomicU64,
    refused: AtomicU64,
}

/// A running receiver; stops when dropped.
#[derive(Debug)]
pub struct Receiver {
    shared: Arc<Shared>,
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Receiver {
    /// Binds `127.0.0.1:0` and serves `POST /hook`. `base` is the clock the caller measures from.
    pub async fn start(base: Instant) -> anyhow::Result<Self> {
        let shared = Arc::new(Shared {
            base,
            fail_until: Mutex::new(None),
            delivered: Mutex::new(HashMap::new()),
            requests: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        });
        let app = Router::new()
            .route("/hook", post(hook))
            .with_state(Arc::clone(&shared));
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .context("bind the receiver")?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Receiver { shared, addr, task })
    }

    /// The URL a destination points at.
    pub fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }

    /// Answers 503 until `until`, 200 after.
    pub fn fail_until(&self, until: Instant) {
        *lock(&self.shared.fail_until) = Some(until);
    }

    /// Events that got a 2xx.
    pub fn delivered(&self) -> usize {
        lock(&self.shared.delivered).len()
    }

    /// Requests answered, and how many of them with 503.
    pub fn requests(&self) -> (u64, u64) {
        (
            self.shared.requests.load(Ordering::Relaxed),
            self.shared.refused.load(Ordering::Relaxed),
        )
    }

    /// When each `seq` first got a 2xx, in microseconds after the base.
    pub fn delivered_at(&self) -> HashMap<u64, u64> {
        lock(&self.shared.delivered).clone()
    }

    /// Forgets what was delivered (between phases).
    pub fn reset(&self) {
        lock(&self.shared.delivered).clear();
        self.shared.requests.store(0, Ordering::Relaxed);
        self.shared.refused.store(0, Ordering::Relaxed);
    }

    /// Waits until `n` events got a 2xx, or `limit` passes; returns whether they did.
    pub async fn wait_for(&self, n: usize, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if self.delivered() >= n {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.delivered() >= n
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding it only ever interrupts an insert; the data stays usable.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

async fn hook(State(shared): State<Arc<Shared>>, body: Bytes) -> StatusCode {
    shared.requests.fetch_add(1, Ordering::Relaxed);
    let now = Instant::now();
    if lock(&shared.fail_until).is_some_and(|until| now < until) {
        shared.refused.fetch_add(1, Ordering::Relaxed);
        return StatusCode::SERVICE_UNAVAILABLE;
    }
    let seq = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v.get("seq").and_then(serde_json::Value::as_u64));
    if let Some(seq) = seq {
        let micros = now.duration_since(shared.base).as_micros() as u64;
        lock(&shared.delivered).entry(seq).or_insert(micros);
    }
    StatusCode::OK
}
