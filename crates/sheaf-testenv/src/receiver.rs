//! The webhook receiver every delivery test, benchmark and fault scenario delivers to: an HTTP
//! server on `127.0.0.1` that answers every path and records each request it answered (its
//! `webhook-id`, headers and body, when it arrived, when it was answered, and the status it
//! got).
//!
//! What it answers is scripted by the caller: 200 by default; 503 (or 429 with `Retry-After`)
//! while [`Failing`] says so (always, until an instant, for a window after its first request,
//! or switched at run time with [`Receiver::set_failing`] and [`Receiver::fail_until`]); each
//! answer after a fixed
//! delay, so deliveries stay in flight; or a redirect, to prove one is not followed. The
//! figures the callers read (ids answered 200, duplicates, first successes, pauses) are kept up
//! to date as requests are answered, so a benchmark polling them at thousands of deliveries a
//! second costs the machine nothing that grows with the run. [`Delivery::verifies`] checks a
//! delivery's Standard Webhooks signature.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{Hmac, Mac as _};
use sha2::Sha256;
use tokio::sync::oneshot;

pub use axum::http::HeaderMap;

/// How far a signed timestamp may be from now, either way, for [`Delivery::verifies`]: the
/// tolerance the Standard Webhooks libraries apply.
pub const TIMESTAMP_TOLERANCE: Duration = Duration::from_secs(5 * 60);

/// When the receiver answers 503 instead of 200. Decided when a request is answered, after the
/// receiver's delay.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Failing {
    /// Never: every request is answered 200.
    #[default]
    Never,
    /// Every request is answered 503.
    Always,
    /// Requests answered before this instant get 503.
    Until(Instant),
    /// For this long after the receiver answered its first request (`Duration::ZERO`: never).
    ForAfterFirst(Duration),
    /// Every `n`th request (the `n`th, the `2n`th, …) is answered 503.
    EveryNth(u32),
}

/// One request the receiver answered.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The `webhook-id` header: the event id (empty when the request had none).
    pub id: String,
    /// Every header of the request.
    pub headers: HeaderMap,
    /// The body: the event's data.
    pub body: Bytes,
    /// When the request arrived.
    pub arrived: Instant,
    /// When it was answered.
    pub answered: Instant,
    /// What it was answered.
    pub status: u16,
}

impl Delivery {
    /// The value of header `name`, or `""` when the request had none (or one that is not text).
    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }

    /// Whether the delivery carries a Standard Webhooks signature by `secret` (`whsec_…`) over
    /// its id, timestamp and body, with a timestamp within [`TIMESTAMP_TOLERANCE`] of now.
    pub fn verifies(&self, secret: &str) -> bool {
        let timestamp = self.header("webhook-timestamp");
        let Ok(seconds) = timestamp.parse::<u64>() else {
            return false;
        };
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        if now.abs_diff(seconds) > TIMESTAMP_TOLERANCE.as_secs() {
            return false;
        }
        signature_verifies(
            secret,
            self.header("webhook-id"),
            timestamp,
            &self.body,
            self.header("webhook-signature"),
        )
    }
}

/// Whether `signatures` (a `webhook-signature` header: space-separated `v1,<base64>`) holds an
/// HMAC-SHA256 by `secret` (`whsec_<base64 key>`) of `{id}.{timestamp}.{body}`, as the Standard
/// Webhooks specification defines it. The timestamp's age is not checked here (see
/// [`Delivery::verifies`]); the comparison takes the same time whatever the bytes.
pub fn signature_verifies(
    secret: &str,
    id: &str,
    timestamp: &str,
    body: &[u8],
    signatures: &str,
) -> bool {
    let Ok(key) = BASE64.decode(secret.strip_prefix("whsec_").unwrap_or(secret)) else {
        return false;
    };
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(&key) else {
        return false;
    };
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.as_bytes());
    mac.update(b".");
    mac.update(body);
    signatures.split(' ').any(|candidate| {
        candidate
            .strip_prefix("v1,")
            .and_then(|sig| BASE64.decode(sig).ok())
            .is_some_and(|sig| mac.clone().verify_slice(&sig).is_ok())
    })
}

/// What the receiver knows, behind one lock that no await ever holds.
#[derive(Debug, Default)]
struct Record {
    failing: Failing,
    /// When the first request was answered (for [`Failing::ForAfterFirst`]).
    first_request: Option<Instant>,
    /// Every request answered, in the order they were answered.
    log: Vec<Delivery>,
    /// Per id answered 200: when it first was.
    first_success: HashMap<String, Instant>,
    /// Requests answered 200.
    successes: usize,
}

#[derive(Debug)]
struct Shared {
    delay: Duration,
    redirect_to: Option<HeaderValue>,
    /// While failing: 429 with this `Retry-After` instead of 503.
    retry_after: Option<u64>,
    /// Requests arrived and not answered yet.
    open: AtomicUsize,
    state: Mutex<Record>,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, Record> {
        // A panic while holding the lock only ever interrupts a push; the log stays usable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// How a receiver answers; [`Builder::start`] starts it.
#[derive(Debug, Clone, Default)]
pub struct Builder {
    delay: Duration,
    failing: Failing,
    redirect_to: Option<String>,
    retry_after: Option<u64>,
}

impl Builder {
    /// Answers each request after `delay` (it counts as open meanwhile).
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// Answers 503 as `failing` says, 200 otherwise.
    pub fn failing(mut self, failing: Failing) -> Self {
        self.failing = failing;
        self
    }

    /// While failing, answers `429 Too Many Requests` with `Retry-After: seconds` instead of 503.
    pub fn busy_with_retry_after(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds);
        self
    }

    /// Answers `307 Temporary Redirect` to `location` instead of 200.
    pub fn redirect_to(mut self, location: impl Into<String>) -> Self {
        self.redirect_to = Some(location.into());
        self
    }

    /// Binds an ephemeral port on `127.0.0.1` and serves until the receiver is dropped.
    pub async fn start(self) -> std::io::Result<Receiver> {
        let redirect_to = self
            .redirect_to
            .map(|location| {
                HeaderValue::from_str(&location)
                    .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))
            })
            .transpose()?;
        let shared = Arc::new(Shared {
            delay: self.delay,
            redirect_to,
            retry_after: self.retry_after,
            open: AtomicUsize::new(0),
            state: Mutex::new(Record {
                failing: self.failing,
                ..Record::default()
            }),
        });
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
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
        Ok(Receiver {
            addr,
            shared,
            stop: Some(stop),
        })
    }
}

async fn receive(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    let arrived = Instant::now();
    shared.open.fetch_add(1, Ordering::Relaxed);
    if !shared.delay.is_zero() {
        tokio::time::sleep(shared.delay).await;
    }
    shared.open.fetch_sub(1, Ordering::Relaxed);
    let id = headers
        .get("webhook-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    // The server hands over the body and the header values as slices of its read buffer; the
    // log keeps copies, so a long run does not keep a whole buffer alive per request.
    let headers = owned(&headers);
    let body = Bytes::copy_from_slice(&body);
    let mut state = shared.state();
    let now = Instant::now();
    let first = *state.first_request.get_or_insert(now);
    let failing = match state.failing {
        Failing::Never => false,
        Failing::Always => true,
        Failing::Until(until) => now < until,
        Failing::ForAfterFirst(window) => now.duration_since(first) < window,
        Failing::EveryNth(n) => (state.log.len() + 1) % (n.max(1) as usize) == 0,
    };
    let status = match (&shared.redirect_to, failing) {
        (_, true) if shared.retry_after.is_some() => StatusCode::TOO_MANY_REQUESTS,
        (_, true) => StatusCode::SERVICE_UNAVAILABLE,
        (Some(_), false) => StatusCode::TEMPORARY_REDIRECT,
        (None, false) => StatusCode::OK,
    };
    if status == StatusCode::OK {
        state.successes += 1;
        state.first_success.entry(id.clone()).or_insert(now);
    }
    state.log.push(Delivery {
        id,
        headers,
        body,
        arrived,
        answered: now,
        status: status.as_u16(),
    });
    drop(state);
    match (&shared.redirect_to, status) {
        (Some(location), StatusCode::TEMPORARY_REDIRECT) => {
            (status, [(header::LOCATION, location.clone())]).into_response()
        }
        (_, StatusCode::TOO_MANY_REQUESTS) => {
            let seconds = shared.retry_after.unwrap_or(1).to_string();
            (status, [(header::RETRY_AFTER, seconds)]).into_response()
        }
        _ => status.into_response(),
    }
}

/// A copy of `headers` that shares no memory with the request.
fn owned(headers: &HeaderMap) -> HeaderMap {
    let mut copy = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        if let Ok(value) = HeaderValue::from_bytes(value.as_bytes()) {
            copy.append(name.clone(), value);
        }
    }
    copy
}

/// A recording webhook receiver on `127.0.0.1`; stops when dropped.
#[derive(Debug)]
pub struct Receiver {
    /// Where it listens.
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
}

impl Receiver {
    /// A receiver scripted by the returned [`Builder`].
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// A receiver that answers every request 200 at once.
    pub async fn start() -> std::io::Result<Self> {
        Builder::default().start().await
    }

    /// The destination URL (`http://127.0.0.1:<port>/hook`).
    pub fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }

    /// While `true`, every request is answered 503 (whatever the receiver was started with).
    pub fn set_failing(&self, failing: bool) {
        self.shared.state().failing = if failing {
            Failing::Always
        } else {
            Failing::Never
        };
    }

    /// Answers 503 until `until`, 200 after.
    pub fn fail_until(&self, until: Instant) {
        self.shared.state().failing = Failing::Until(until);
    }

    /// Requests that arrived and are not answered yet.
    pub fn open_requests(&self) -> usize {
        self.shared.open.load(Ordering::Relaxed)
    }

    /// Every request answered so far, in the order they were answered.
    pub fn deliveries(&self) -> Vec<Delivery> {
        self.shared.state().log.clone()
    }

    /// Requests answered so far, and how many of them with 503.
    pub fn requests(&self) -> (usize, usize) {
        let state = self.shared.state();
        let refused = state
            .log
            .iter()
            .filter(|d| d.status == StatusCode::SERVICE_UNAVAILABLE.as_u16())
            .count();
        (state.log.len(), refused)
    }

    /// Ids answered 200 at least once.
    pub fn delivered_ids(&self) -> HashSet<String> {
        self.shared.state().first_success.keys().cloned().collect()
    }

    /// How many ids were answered 200 at least once.
    pub fn delivered_count(&self) -> usize {
        self.shared.state().first_success.len()
    }

    /// When each id was first answered 200.
    pub fn first_successes(&self) -> HashMap<String, Instant> {
        self.shared.state().first_success.clone()
    }

    /// Requests answered 200 beyond the first for their id, added up.
    pub fn duplicates(&self) -> usize {
        let state = self.shared.state();
        state.successes - state.first_success.len()
    }

    /// The longest stretch after `from` with no request answered 200: (last before, first after).
    pub fn longest_pause(&self, from: Instant) -> Option<(Instant, Instant)> {
        let mut times: Vec<Instant> = self
            .shared
            .state()
            .log
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

    /// Forgets every request answered so far (between the phases of a benchmark); the failure
    /// script stays as it is.
    pub fn reset(&self) {
        let mut state = self.shared.state();
        state.log.clear();
        state.first_success.clear();
        state.successes = 0;
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
            let missing: Vec<String> = {
                let state = self.shared.state();
                ids.clone()
                    .into_iter()
                    .filter(|id| !state.first_success.contains_key(*id))
                    .cloned()
                    .collect()
            };
            if missing.is_empty() || Instant::now() >= deadline {
                return missing;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until every id in `ids` was answered 200, at most `timeout`; returns whether they
    /// were, after printing how many were not.
    pub async fn delivers_all<'a>(
        &self,
        ids: impl IntoIterator<Item = &'a String> + Clone,
        timeout: Duration,
    ) -> bool {
        let missing = self.wait_for(ids.clone(), timeout).await;
        if !missing.is_empty() {
            eprintln!(
                "{} of {} ids still undelivered after {timeout:?}",
                missing.len(),
                ids.into_iter().count()
            );
        }
        missing.is_empty()
    }

    /// Waits until `n` ids were answered 200, or `timeout` passes; returns whether they were.
    pub async fn wait_for_count(&self, n: usize, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.delivered_count() >= n {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.delivered_count() >= n
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example of the Standard Webhooks specification's test suite.
    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    const TIMESTAMP: &str = "1614265330";
    const BODY: &[u8] = br#"{"test": 2432232314}"#;
    const SIGNATURE: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

    #[test]
    fn the_specification_example_verifies_and_any_change_does_not() {
        assert!(signature_verifies(SECRET, ID, TIMESTAMP, BODY, SIGNATURE));
        let among_others = format!("v1,AAAA v2,{} {SIGNATURE}", &SIGNATURE[3..]);
        assert!(signature_verifies(
            SECRET,
            ID,
            TIMESTAMP,
            BODY,
            &among_others
        ));
        let other_secret = "whsec_bGVnYWN5LXNlY3JldC1rZXktMDEyMzQ1Njc4OWFi";
        assert!(!signature_verifies(
            other_secret,
            ID,
            TIMESTAMP,
            BODY,
            SIGNATURE
        ));
        assert!(!signature_verifies(
            SECRET,
            "msg_other",
            TIMESTAMP,
            BODY,
            SIGNATURE
        ));
        assert!(!signature_verifies(
            SECRET,
            ID,
            "1614265331",
            BODY,
            SIGNATURE
        ));
        assert!(!signature_verifies(SECRET, ID, TIMESTAMP, b"{}", SIGNATURE));
        assert!(!signature_verifies(SECRET, ID, TIMESTAMP, BODY, ""));
        assert!(!signature_verifies(
            SECRET,
            ID,
            TIMESTAMP,
            BODY,
            &SIGNATURE.replacen("v1,", "v2,", 1)
        ));
        assert!(!signature_verifies(
            "whsec_not base64",
            ID,
            TIMESTAMP,
            BODY,
            SIGNATURE
        ));
    }

    #[test]
    fn an_old_timestamp_does_not_verify_even_with_the_right_signature() {
        let mut headers = HeaderMap::new();
        headers.insert("webhook-id", HeaderValue::from_static(ID));
        headers.insert("webhook-timestamp", HeaderValue::from_static(TIMESTAMP));
        headers.insert("webhook-signature", HeaderValue::from_static(SIGNATURE));
        let now = Instant::now();
        let delivery = Delivery {
            id: ID.to_owned(),
            headers,
            body: Bytes::from_static(BODY),
            arrived: now,
            answered: now,
            status: 200,
        };
        assert_eq!(delivery.header("webhook-id"), ID);
        assert_eq!(delivery.header("no-such-header"), "");
        assert!(!delivery.verifies(SECRET), "the example is from 2021");
    }
}
