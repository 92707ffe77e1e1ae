//! A bulk replay outlives the process that started it, on shared Postgres: killed mid-replay,
//! its replay is taken over once the lease runs out; shut down mid-replay, its replay is handed
//! over at once. Either way the other process finishes it, serves its progress, and each event
//! reaches the receiver exactly once.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde_json::{Value, json};
use sheaf_server::{Config, Migrate, Running, Stores};
use sheaf_store::{
    NewReplay, Replay, ReplayLease, ReplayPage, ReplayProgress, ReplaySaved, ReplayStep,
    ReplayStore, TenantId,
};
use sheaf_testenv::receiver::{Failing, Receiver};
use uuid::Uuid;

use super::replay::dead_letters;
use crate::support::{Client, env_with, publish_many, start_server};

/// The tenant of every test here (each runs in a schema of its own).
const TENANT: &str = "survivor";

/// Process B with `events` failed deliveries of the tenant (one attempt each, then a dead
/// letter), its receiver now answering 200, and what process A needs to join it.
struct Failed {
    receiver: Receiver,
    b: Running,
    client_b: Client,
    ids: HashSet<String>,
    /// The settings every process of the test shares.
    env: HashMap<String, String>,
    /// A `POST …/replay` body for the failed deliveries.
    body: Value,
}

/// Sets up [`Failed`] on a schema of its own, with `SHEAF_QUEUE_LEASE` `lease`; `None` (skip)
/// without Postgres outside CI.
async fn failed_deliveries(test: &str, events: usize, lease: &str) -> Option<Failed> {
    let postgres = sheaf_testenv::postgres_url(test)?;
    let schema = sheaf_testenv::unique_name("rpl");
    let env = env_with(&[
        ("SHEAF_QUEUE", "postgres"),
        ("SHEAF_LOG_STORE", "postgres"),
        ("SHEAF_POSTGRES_URL", postgres.as_str()),
        ("SHEAF_POSTGRES_SCHEMA", schema.as_str()),
        // One failed attempt each: every event fails once, then is a dead letter.
        ("SHEAF_RETRY_MAX_ATTEMPTS", "1"),
        // A replay's lease is the queue's.
        ("SHEAF_QUEUE_LEASE", lease),
        ("SHEAF_DELIVERY_TIMEOUT", "1s"),
    ]);
    let receiver = Receiver::builder()
        .failing(Failing::Always)
        .start()
        .await
        .expect("the receiver binds");
    let b = start_server(env.clone()).await;
    let client_b = Client::new(b.addr);
    client_b
        .tenant_with_destination(TENANT, &receiver.url())
        .await;
    let window_start = chrono::Utc::now() - chrono::Duration::minutes(5);
    let ids = publish_many(&client_b, TENANT, "survive", events, 16).await;
    let deadline = Instant::now() + Duration::from_secs(120);
    while dead_letters(&client_b, TENANT).await.len() < events {
        assert!(
            Instant::now() < deadline,
            "{events} failed deliveries within 120 s"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    receiver.set_failing(false);
    receiver.reset();
    let body = json!({
        "status": "failed",
        "since": window_start.to_rfc3339(),
        "until": (chrono::Utc::now() + chrono::Duration::minutes(1)).to_rfc3339(),
    });
    Some(Failed {
        receiver,
        b,
        client_b,
        ids,
        env,
        body,
    })
}

/// `env` for process A: the API only (no workers, so stopping it interrupts no delivery).
fn api_only(env: &HashMap<String, String>) -> HashMap<String, String> {
    let mut env = env.clone();
    env.insert("SHEAF_DELIVERY_WORKERS".to_owned(), "0".to_owned());
    env
}

/// Starts the replay on `client` in a task of its own (the answer may never come).
fn start_replay(client: Client, body: Value) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let _ = client
            .send(
                "POST",
                &format!("/api/v1/tenants/{TENANT}/replay"),
                Some(body),
            )
            .await;
    })
}

/// Polls B until the replay is no longer running (at most 60 s); returns its progress.
async fn finished_on(client: &Client, path: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let progress = client.get(path).await;
        assert_eq!(progress.status, 200, "{progress:?}");
        if progress.body["state"] != "running" {
            return progress.body;
        }
        assert!(
            Instant::now() < deadline,
            "B did not finish the replay: {progress:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every id reached the receiver, and none twice (after a wait longer than a lease and two
/// keeper rounds, by which a duplicate would have shown).
async fn delivered_exactly_once(setup: &Failed, wait: Duration) {
    assert!(
        setup
            .receiver
            .delivers_all(&setup.ids, Duration::from_secs(60))
            .await,
        "every replayed delivery arrives"
    );
    tokio::time::sleep(wait).await;
    assert_eq!(setup.receiver.delivered_count(), setup.ids.len());
    assert_eq!(
        setup.receiver.duplicates(),
        0,
        "no event reached the receiver twice"
    );
}

/// Where [`FreezingAfter`] tells that it froze, and on which replay.
#[derive(Debug, Default)]
struct Frozen {
    notify: tokio::sync::Notify,
    replay: std::sync::Mutex<Option<Uuid>>,
}

/// A replay store that lets its first `saves` progress writes through, then freezes: that save
/// and every later save or takeover never return, as in a process that hung, and `frozen` is
/// told. Reads still answer. The process it belongs to is then killed with its runtime.
#[derive(Debug)]
struct FreezingAfter {
    inner: Arc<dyn ReplayStore>,
    saves: usize,
    seen: AtomicUsize,
    frozen: Arc<Frozen>,
}

impl FreezingAfter {
    async fn freeze_if_due(&self, saving: Option<Uuid>) {
        let seen = match saving {
            Some(_) => self.seen.fetch_add(1, Ordering::SeqCst) + 1,
            None => self.seen.load(Ordering::SeqCst),
        };
        if seen > self.saves {
            if let Some(replay) = saving {
                *self.frozen.replay.lock().unwrap() = Some(replay);
                self.frozen.notify.notify_one();
            }
            std::future::pending::<()>().await;
        }
    }
}

#[async_trait]
impl ReplayStore for FreezingAfter {
    async fn create_replay(
        &self,
        replay: &NewReplay,
        owner: Uuid,
        lease: Duration,
    ) -> sheaf_store::Result<(Replay, ReplayLease)> {
        self.inner.create_replay(replay, owner, lease).await
    }

    async fn get_replay(&self, tenant: &TenantId, id: Uuid) -> sheaf_store::Result<Option<Replay>> {
        self.inner.get_replay(tenant, id).await
    }

    async fn save_replay(
        &self,
        lease: &ReplayLease,
        progress: &ReplayProgress,
        step: &ReplayStep,
    ) -> sheaf_store::Result<ReplaySaved> {
        self.freeze_if_due(Some(lease.replay_id)).await;
        self.inner.save_replay(lease, progress, step).await
    }

    fn commits_queue_work(&self) -> bool {
        self.inner.commits_queue_work()
    }

    async fn save_replay_page(
        &self,
        lease: &ReplayLease,
        progress: &ReplayProgress,
        step: &ReplayStep,
        page: &ReplayPage,
    ) -> sheaf_store::Result<(ReplaySaved, u64)> {
        self.freeze_if_due(Some(lease.replay_id)).await;
        self.inner
            .save_replay_page(lease, progress, step, page)
            .await
    }

    async fn take_over_replays(
        &self,
        owner: Uuid,
        lease: Duration,
        max: usize,
    ) -> sheaf_store::Result<Vec<(Replay, ReplayLease)>> {
        self.freeze_if_due(None).await;
        self.inner.take_over_replays(owner, lease, max).await
    }

    async fn delete_finished_replays(
        &self,
        before: sheaf_store::Timestamp,
        max: usize,
    ) -> sheaf_store::Result<u64> {
        self.inner.delete_finished_replays(before, max).await
    }
}

/// Process A, on a runtime of its own on its own thread, so that killing it drops every task it
/// runs mid-await, with nothing released or flushed: a crash, as far as the stores can tell.
struct Doomed {
    addr: SocketAddr,
    kill: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Doomed {
    /// Starts a `sheaf` process on `env` whose replay store freezes after `saves` saves.
    async fn start(env: HashMap<String, String>, saves: usize, frozen: Arc<Frozen>) -> Self {
        let (addr_tx, addr_rx) = tokio::sync::oneshot::channel();
        let (kill, killed) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .expect("a runtime for process A");
            runtime.block_on(async move {
                let config = Config::load(env).expect("test configuration is valid");
                let mut stores = Stores::connect(&config.engine, Migrate::Yes)
                    .await
                    .expect("process A connects");
                stores.replays = Arc::new(FreezingAfter {
                    inner: stores.replays,
                    saves,
                    seen: AtomicUsize::new(0),
                    frozen,
                });
                let running = sheaf_server::start_with(config, stores)
                    .await
                    .expect("process A starts");
                let _ = addr_tx.send(running.addr);
                let _ = killed.await;
                // Not shut down: dropped with the runtime below, mid-whatever it was doing.
                std::mem::forget(running);
            });
            runtime.shutdown_background();
        });
        let addr = addr_rx.await.expect("process A reports its address");
        Doomed {
            addr,
            kill: Some(kill),
            thread: Some(thread),
        }
    }

    /// Kills it: every task of its runtime is dropped where it stands.
    fn kill(mut self) {
        if let Some(kill) = self.kill.take() {
            let _ = kill.send(());
        }
        if let Some(thread) = self.thread.take() {
            thread.join().expect("process A's thread ends");
        }
    }
}

/// Process A starts a replay of 2,500 failed deliveries (three pages), stores its first page
/// and hangs while storing its second (with the Postgres queue, a page's jobs commit with its
/// progress: the second page enqueued nothing); B serves the replay's progress from the shared
/// store meanwhile. A is killed; B takes the replay over once A's lease runs out, reads the
/// page in flight again and finishes. Every event reaches the receiver exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_survives_the_process_that_started_it() {
    // A short lease, so B takes over within seconds.
    let Some(setup) = failed_deliveries("a_replay_survives_the_process", 2_500, "3s").await else {
        return;
    };
    // A's replay store takes the first page's save and hangs on the second's.
    let frozen = Arc::new(Frozen::default());
    let a = Doomed::start(api_only(&setup.env), 1, Arc::clone(&frozen)).await;
    // A answers after 5 s; by then its lease may have run out, so the test does not wait.
    let post = start_replay(Client::new(a.addr), setup.body.clone());
    tokio::time::timeout(Duration::from_secs(30), frozen.notify.notified())
        .await
        .expect("A reaches its second page's save");
    let id = frozen
        .replay
        .lock()
        .unwrap()
        .expect("the frozen save names its replay");
    let path = format!("/api/v1/tenants/{TENANT}/replays/{id}");

    // B answers for A's replay: the first page as stored.
    let seen_by_b = setup.client_b.get(&path).await;
    assert_eq!(seen_by_b.status, 200, "{seen_by_b:?}");
    assert_eq!(seen_by_b.body["state"], "running", "{seen_by_b:?}");
    assert_eq!(seen_by_b.body["pages"], 1, "{seen_by_b:?}");
    assert_eq!(seen_by_b.body["jobs"], 1_000, "{seen_by_b:?}");
    assert_eq!(seen_by_b.body["takeovers"], 0, "{seen_by_b:?}");

    post.abort();
    a.kill();
    let killed_at = Instant::now();
    let done = finished_on(&setup.client_b, &path).await;
    println!(
        "replay resumed by B and finished {:.1} s after A was killed: {done}",
        killed_at.elapsed().as_secs_f64()
    );
    assert_eq!(done["state"], "completed", "{done}");
    assert_eq!(done["takeovers"], 1, "{done}");
    assert_eq!(done["jobs"], 2_500, "each failed pair counted once: {done}");
    assert_eq!(
        done["pages"], 3,
        "the page in flight is read again, and counted once: {done}"
    );
    delivered_exactly_once(&setup, Duration::from_secs(5)).await;
    setup.b.shutdown().await;
}

/// Process A starts a replay of 1,500 failed deliveries (two pages) with its saves slowed, and
/// shuts down gracefully after the first: it stops at the page boundary and releases the
/// replay, and B resumes it at its next round, long before the 30 s lease would have run out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_is_handed_over_when_its_process_shuts_down() {
    let Some(setup) = failed_deliveries("a_replay_is_handed_over", 1_500, "30s").await else {
        return;
    };
    let config = Config::load(api_only(&setup.env)).expect("test configuration is valid");
    let mut stores = Stores::connect(&config.engine, Migrate::Yes)
        .await
        .expect("process A connects");
    let saved = Arc::new(Frozen::default());
    stores.replays = Arc::new(SlowSaves {
        inner: stores.replays,
        delay: Duration::from_secs(1),
        saved: Arc::clone(&saved),
    });
    let a = sheaf_server::start_with(config, stores)
        .await
        .expect("process A starts");
    let post = start_replay(Client::new(a.addr), setup.body.clone());
    tokio::time::timeout(Duration::from_secs(30), saved.notify.notified())
        .await
        .expect("A saves its first page");
    let id = saved
        .replay
        .lock()
        .unwrap()
        .expect("the save names its replay");
    let path = format!("/api/v1/tenants/{TENANT}/replays/{id}");
    let stopping = Instant::now();
    a.shutdown().await;
    let _ = post.await;
    let released = setup.client_b.get(&path).await;
    assert_eq!(
        released.body["state"], "running",
        "A released it: {released:?}"
    );
    assert_eq!(
        released.body["pages"], 1,
        "A stopped after its first page: {released:?}"
    );
    let done = finished_on(&setup.client_b, &path).await;
    let took = stopping.elapsed();
    println!(
        "replay handed over by A's shutdown, finished by B {:.1} s after A began to stop: {done}",
        took.as_secs_f64()
    );
    assert_eq!(done["state"], "completed", "{done}");
    assert_eq!(done["takeovers"], 1, "{done}");
    assert_eq!(done["jobs"], 1_500, "{done}");
    assert!(
        took < Duration::from_secs(15),
        "B resumed a released replay without waiting for its 30 s lease: {took:?}"
    );
    delivered_exactly_once(&setup, Duration::from_secs(3)).await;
    setup.b.shutdown().await;
}

/// A replay store whose saves each wait `delay` first, telling `saved` at the first, so a test
/// can stop the process while a replay is mid-way.
#[derive(Debug)]
struct SlowSaves {
    inner: Arc<dyn ReplayStore>,
    delay: Duration,
    saved: Arc<Frozen>,
}

impl SlowSaves {
    async fn wait(&self, replay: Uuid) {
        let first = self.saved.replay.lock().unwrap().replace(replay).is_none();
        if first {
            self.saved.notify.notify_one();
        }
        tokio::time::sleep(self.delay).await;
    }
}

#[async_trait]
impl ReplayStore for SlowSaves {
    async fn create_replay(
        &self,
        replay: &NewReplay,
        owner: Uuid,
        lease: Duration,
    ) -> sheaf_store::Result<(Replay, ReplayLease)> {
        self.inner.create_replay(replay, owner, lease).await
    }

    async fn get_replay(&self, tenant: &TenantId, id: Uuid) -> sheaf_store::Result<Option<Replay>> {
        self.inner.get_replay(tenant, id).await
    }

    async fn save_replay(
        &self,
        lease: &ReplayLease,
        progress: &ReplayProgress,
        step: &ReplayStep,
    ) -> sheaf_store::Result<ReplaySaved> {
        self.wait(lease.replay_id).await;
        self.inner.save_replay(lease, progress, step).await
    }

    fn commits_queue_work(&self) -> bool {
        self.inner.commits_queue_work()
    }

    async fn save_replay_page(
        &self,
        lease: &ReplayLease,
        progress: &ReplayProgress,
        step: &ReplayStep,
        page: &ReplayPage,
    ) -> sheaf_store::Result<(ReplaySaved, u64)> {
        self.wait(lease.replay_id).await;
        self.inner
            .save_replay_page(lease, progress, step, page)
            .await
    }

    async fn take_over_replays(
        &self,
        owner: Uuid,
        lease: Duration,
        max: usize,
    ) -> sheaf_store::Result<Vec<(Replay, ReplayLease)>> {
        self.inner.take_over_replays(owner, lease, max).await
    }

    async fn delete_finished_replays(
        &self,
        before: sheaf_store::Timestamp,
        max: usize,
    ) -> sheaf_store::Result<u64> {
        self.inner.delete_finished_replays(before, max).await
    }
}
