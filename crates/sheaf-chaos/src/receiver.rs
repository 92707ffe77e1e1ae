//! The webhook receiver every scenario delivers to: a loopback HTTP server that records each
//! request (its `webhook-id`, body, when it arrived and when it was answered, and the status
//! it got), answers after a configurable delay, and answers 503 while told to fail.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use tokio::sync::oneshot;

/// One request the receiver answered.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The `webhook-id` header: the event id.
    pub id: String,
    /// The body: the event's data.
    pub body: Bytes,
    /// When the request arrived.
    pub arrived: Instant,
    /// When it was answered.
    pub answered: Instant,
    /// What it was answered.
    pub status: u16,
}

#[derive(Debug)]
struct Shared {
    delay: Duration,
    failing: AtomicBool,
    /// Requests arrived and not answered yet.
    open: AtomicUsize,
    log: Mutex<Vec<Delivery>>,
}

/// A recording receiver on 127.0.0.1; stops when dropped.
#[derive(Debug)]
pub struct Receiver {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
}

async fn receive(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let arrived = Instant::now();
    shared.open.fetch_add(1, Ordering::Relaxed);
    if !shared.delay.is_zero() {
        tokio::time::sleep(shared.delay).await;
    }
    shared.open.fetch_sub(1, Ordering::Relaxed);
    let status = if shared.failing.load(Ordering::Relaxed) {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    };
    let id = headers
        .get("webhook-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    shared
        .log
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(Delivery {
            id,
            body,
            arrived,
            answered: Instant::now(),
            status: status.as_u16(),
        });
    status
}

impl Receiver {
    /// Starts a receiver that answers 200 after `delay`.
    pub async fn start(delay: Duration) -> anyhow::Result<Self> {
        let shared = Arc::new(Shared {
            delay,
            failing: AtomicBool::new(false),
            open: AtomicUsize::new(0),
            log: Mutex::new(Vec::new()),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let app = Router::new()
            .fallback(receive)
            .with_state(Arc::clone(&shared));
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stopped.await;
                })
                .await;
        });
        Ok(Self {
            addr,
            shared,
            stop: Some(stop),
        })
    }

    /// The destination URL.
    pub fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }

    /// While `true`, every request is answered 503.
    pub fn set_failing(&self, failing: bool) {
        self.shared.failing.store(failing, Ordering::Relaxed);
    }

    /// Requests that arrived and are not answered yet.
    pub fn open_requests(&self) -> usize {
        self.shared.open.load(Ordering::Relaxed)
    }

    /// Every request answered so far.
    pub fn deliveries(&self) -> Vec<Delivery> {
        self.shared
            .log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// When each id was first answered 200.
    pub fn first_successes(&self) -> HashMap<String, Instant> {
        let mut first = HashMap::new();
        for d in self.deliveries().into_iter().filter(|d| d.status == 200) {
            first
                .entry(d.id)
                .and_modify(|t: &mut Instant| *t = (*t).min(d.answered))
                .or_insert(d.answered);
        }
        first
    }

    /// The longest stretch after `from` with no request answered 200: (last before, first after).
    pub fn longest_pause(&self, from: Instant) -> Option<(Instant, Instant)> {
        let mut times: Vec<Instant> = self
            .deliveries()
            .iter()
            .filter(|d| d.status == 200 && d.answered >= from)
            .map(|d| d.answered)
            .collect();
        times.sort();
        times
            .windows(2)
            .map(|w| (w[0], w[1]))
            .max_by_key(|(a, b)| b.saturating_duration_since(*a))
    }

    /// Ids answered 200 at least once.
    pub fn delivered_ids(&self) -> HashSet<String> {
        self.deliveries()
            .into_iter()
            .filter(|d| d.status == 200)
            .map(|d| d.id)
            .collect()
    }

    /// Requests answered 200 beyond the first for their id, added up.
    pub fn duplicates(&self) -> usize {
        let deliveries = self.deliveries();
        let successes = deliveries.iter().filter(|d| d.status == 200).count();
        let distinct: HashSet<&str> = deliveries
            .iter()
            .filter(|d| d.status == 200)
            .map(|d| d.id.as_str())
            .collect();
        successes - distinct.len()
    }

    /// Waits until every id in `ids` was answered 200, at most `timeout`; returns the ids
    /// still missing (empty when all arrived).
    pub async fn wait_for<'a>(
        &self,
        ids: impl IntoIterator<Item = &'a String> + Clone,
        timeout: Duration,
    ) -> Vec<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let delivered = self.delivered_ids();
            let missing: Vec<String> = ids
                .clone()
                .into_iter()
                .filter(|id| !delivered.contains(*id))
                .cloned()
                .collect();
            if missing.is_empty() || Instant::now() >= deadline {
                return missing;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}
