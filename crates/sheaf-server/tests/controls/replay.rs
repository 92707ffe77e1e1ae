//! Bulk replay: dead letters delivered once more in a few queries, and the dead-letter list
//! emptied; a replay resumed by another process when the one that started it is killed, each
//! event still delivered once.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::StreamExt as _;
use serde_json::{Value, json};
use sheaf_server::{Config, Migrate, Stores};
use sheaf_store::{
    NewReplay, Replay, ReplayLease, ReplayPage, ReplayProgress, ReplaySaved, ReplayStep,
    ReplayStore, TenantId,
};
use sheaf_testenv::receiver::{Failing, Receiver};
use uuid::Uuid;

use super::{backends, publish};
use crate::support::{Client, env_with, publish_many, start_server};

/// Every dead letter of the tenant.
async fn dead_letters(client: &Client, tenant: &str) -> Vec<Value> {
    client
        .every_item(&format!("/api/v1/tenants/{tenant}/dead-letters?limit=1000"))
        .await
}

/// Every successful attempt of the tenant.
async fn successful_attempts(client: &Client, tenant: &str) -> Vec<Value> {
    client
        .every_item(&format!(
            "/api/v1/tenants/{tenant}/attempts?status=success&limit=1000"
        ))
        .await
}

/// Starts a replay and waits (at most 60 s) for it to complete; returns its final progress.
async fn replay(client: &Client, tenant: &str, body: Value) -> Value {
    let started = client
        .send(
            "POST",
            &format!("/api/v1/tenants/{tenant}/replay"),
            Some(body),
        )
        .await;
    assert_eq!(started.status, 202, "{started:?}");
    let id = started.body["replay_id"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let progress = client
            .get(&format!("/api/v1/tenants/{tenant}/replays/{id}"))
            .await;
        assert_eq!(progress.status, 200, "{progress:?}");
        if progress.body["state"] != "running" {
            return progress.body;
        }
        assert!(
            Instant::now() < deadline,
            "the replay still runs: {progress:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn a_replay_delivers_dead_letters_once_more(label: &str, mut env: HashMap<String, String>) {
    let receiver = Receiver::builder()
        .failing(Failing::Always)
        .start()
        .await
        .expect("the receiver binds");
    // One attempt each: every first failure is a dead letter at once.
    env.insert("SHEAF_RETRY_MAX_ATTEMPTS".to_owned(), "1".to_owned());
    let server = start_server(env).await;
    let client = Client::new(server.addr);
    let tenant = "replays";
    let destination = client
        .tenant_with_destination(tenant, &receiver.url())
        .await;
    let window_start = chrono::Utc::now() - chrono::Duration::minutes(5);
    let ids: Vec<String> = (0..500).map(|i| format!("dead-{i}")).collect();
    futures::stream::iter(&ids)
        .map(|id| {
            let client = &client;
            async move {
                publish(client, tenant, id, "order.created", &json!({ "id": id })).await;
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<()>>()
        .await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while dead_letters(&client, tenant).await.len() < ids.len() {
        assert!(
            Instant::now() < deadline,
            "{label}: 500 dead letters within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    receiver.set_failing(false);
    let window = json!({
        "since": window_start.to_rfc3339(),
        "until": (chrono::Utc::now() + chrono::Duration::minutes(1)).to_rfc3339(),
    });

    let mut body = json!({ "status": "dead_lettered", "destination_id": destination["id"] });
    body["since"] = window["since"].clone();
    body["until"] = window["until"].clone();
    let done = replay(&client, tenant, body).await;
    assert_eq!(done["state"], "completed", "{label}: {done}");
    assert_eq!(done["jobs"], 500, "{label}: {done}");
    assert_eq!(done["dead_letters_removed"], 500, "{label}: {done}");
    let queries =
        done["log_store_queries"].as_u64().unwrap() + done["queue_queries"].as_u64().unwrap();
    println!(
        "{label}: replay of 500 dead letters: {} pages, {} log-store and {} queue queries",
        done["pages"], done["log_store_queries"], done["queue_queries"]
    );
    assert!(
        queries < 500 / 50,
        "{label}: {queries} store queries for 500 dead letters"
    );
    let wanted: HashSet<String> = ids.iter().cloned().collect();
    assert!(
        receiver
            .delivers_all(&wanted, Duration::from_secs(60))
            .await,
        "{label}: every replayed delivery arrives"
    );
    assert!(
        dead_letters(&client, tenant).await.is_empty(),
        "{label}: the dead-letter list is empty"
    );
    // The log has every replayed success (with a log shipper, once it shipped them), each a
    // manual attempt.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let successes = successful_attempts(&client, tenant).await;
        if successes.len() >= 500 {
            assert!(
                successes.iter().all(|a| a["trigger"] == "manual"),
                "{label}: the replayed attempts are manual"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{label}: {} successful attempts logged after 30 s",
            successes.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Replaying what failed in the same window now finds nothing: each pair's latest attempt is
    // the replay's success.
    let mut body = json!({ "status": "failed" });
    body["since"] = window["since"].clone();
    body["until"] = window["until"].clone();
    let again = replay(&client, tenant, body).await;
    assert_eq!(again["state"], "completed", "{label}: {again}");
    assert_eq!(again["jobs"], 0, "{label}: nothing failed is left: {again}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let successes = receiver
        .deliveries()
        .iter()
        .filter(|d| d.status == 200)
        .count();
    assert_eq!(
        successes, 500,
        "{label}: each delivered once more, not twice"
    );

    // A window the service refuses, naming what is wrong.
    let refused = client
        .send(
            "POST",
            &format!("/api/v1/tenants/{tenant}/replay"),
            Some(json!({ "status": "any", "since": "2026-01-01T00:00:00Z", "until": "2026-02-01T00:00:00Z" })),
        )
        .await;
    assert_eq!(refused.status, 400, "{refused:?}");
    assert!(
        refused.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("7 days")
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_of_dead_letters_delivers_each_once_more_in_a_few_queries_on_every_backend() {
    for (label, env) in backends("replay") {
        a_replay_delivers_dead_letters_once_more(label, env).await;
    }
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
                let mut stores = Stores::connect(&config, Migrate::Yes)
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
    const EVENTS: usize = 2_500;
    let postgres = sheaf_testenv::require_postgres!("a_replay_survives_the_process");
    let schema = sheaf_testenv::unique_name("rpl");
    let shared = [
        ("SHEAF_QUEUE", "postgres"),
        ("SHEAF_LOG_STORE", "postgres"),
        ("SHEAF_POSTGRES_URL", postgres.as_str()),
        ("SHEAF_POSTGRES_SCHEMA", schema.as_str()),
        // One failed attempt each: every event fails once, then is a dead letter.
        ("SHEAF_RETRY_MAX_ATTEMPTS", "1"),
        // A replay's lease is the queue's: short, so B takes over within seconds.
        ("SHEAF_QUEUE_LEASE", "3s"),
        ("SHEAF_DELIVERY_TIMEOUT", "1s"),
    ];
    let receiver = Receiver::builder()
        .failing(Failing::Always)
        .start()
        .await
        .expect("the receiver binds");
    let b = start_server(env_with(&shared)).await;
    let client_b = Client::new(b.addr);
    let tenant = "survivor";
    client_b
        .tenant_with_destination(tenant, &receiver.url())
        .await;
    let window_start = chrono::Utc::now() - chrono::Duration::minutes(5);
    let ids = publish_many(&client_b, tenant, "survive", EVENTS, 16).await;
    let deadline = Instant::now() + Duration::from_secs(120);
    while dead_letters(&client_b, tenant).await.len() < EVENTS {
        assert!(
            Instant::now() < deadline,
            "{EVENTS} failed deliveries within 120 s"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    receiver.set_failing(false);
    receiver.reset();

    // A: the API only (no workers, so killing it interrupts no delivery), and a replay store
    // that takes the first page's save and hangs on the second's.
    let mut env_a = env_with(&shared);
    env_a.insert("SHEAF_DELIVERY_WORKERS".to_owned(), "0".to_owned());
    let frozen = Arc::new(Frozen::default());
    let a = Doomed::start(env_a, 1, Arc::clone(&frozen)).await;
    let client_a = Client::new(a.addr);
    let body = json!({
        "status": "failed",
        "since": window_start.to_rfc3339(),
        "until": (chrono::Utc::now() + chrono::Duration::minutes(1)).to_rfc3339(),
    });
    // A answers after 5 s; by then its lease may have run out, so the test does not wait.
    let post = tokio::spawn(async move {
        client_a
            .send(
                "POST",
                &format!("/api/v1/tenants/{tenant}/replay"),
                Some(body),
            )
            .await
    });
    tokio::time::timeout(Duration::from_secs(30), frozen.notify.notified())
        .await
        .expect("A reaches its second page's save");
    let id = frozen
        .replay
        .lock()
        .unwrap()
        .expect("the frozen save names its replay");
    let path = format!("/api/v1/tenants/{tenant}/replays/{id}");

    // B answers for A's replay: the first page as stored.
    let seen_by_b = client_b.get(&path).await;
    assert_eq!(seen_by_b.status, 200, "{seen_by_b:?}");
    assert_eq!(seen_by_b.body["state"], "running", "{seen_by_b:?}");
    assert_eq!(seen_by_b.body["pages"], 1, "{seen_by_b:?}");
    assert_eq!(seen_by_b.body["jobs"], 1_000, "{seen_by_b:?}");
    assert_eq!(seen_by_b.body["takeovers"], 0, "{seen_by_b:?}");

    post.abort();
    a.kill();
    let killed_at = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(60);
    let done = loop {
        let progress = client_b.get(&path).await;
        assert_eq!(progress.status, 200, "{progress:?}");
        if progress.body["state"] != "running" {
            break progress.body;
        }
        assert!(
            Instant::now() < deadline,
            "B did not finish the replay: {progress:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    println!(
        "replay resumed by B and finished {:.1} s after A was killed: {done}",
        killed_at.elapsed().as_secs_f64()
    );
    assert_eq!(done["state"], "completed", "{done}");
    assert_eq!(done["takeovers"], 1, "{done}");
    assert_eq!(
        done["jobs"], EVENTS,
        "each failed pair counted once: {done}"
    );
    assert_eq!(
        done["pages"], 3,
        "the page in flight is read again, and counted once: {done}"
    );

    assert!(
        receiver.delivers_all(&ids, Duration::from_secs(60)).await,
        "every replayed delivery arrives"
    );
    // Longer than a lease and two keeper rounds: a duplicate would have shown up by now.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(receiver.delivered_count(), EVENTS);
    assert_eq!(
        receiver.duplicates(),
        0,
        "no event reached the receiver twice"
    );
    b.shutdown().await;
}
