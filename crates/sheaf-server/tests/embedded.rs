//! The SQLite store through the real binary: what it keeps across a clean restart and across
//! kill -9, the lock that refuses a second process on the same data directory, and `sheaf
//! backup` beside a running process.

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::json;
use sheaf_testenv::receiver::Receiver;

use crate::support::{Client, kill, publish_many, spawn_sheaf, stop_clean};

/// A data directory of its own under the system's temporary directory, removed when dropped.
struct DataDir(PathBuf);

impl DataDir {
    fn new() -> Self {
        Self(std::env::temp_dir().join(sheaf_testenv::unique_name("sheaf-data")))
    }

    fn path(&self) -> String {
        self.0.display().to_string()
    }
}

impl Drop for DataDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The settings of a `sheaf` on the SQLite store in `dir`, retrying quickly.
fn sqlite_env(dir: &str) -> Vec<(&'static str, String)> {
    vec![
        ("SHEAF_LOG_STORE", "sqlite".to_owned()),
        ("SHEAF_QUEUE", "sqlite".to_owned()),
        ("SHEAF_DATA_DIR", dir.to_owned()),
        ("SHEAF_ALLOW_PRIVATE_DESTINATIONS", "true".to_owned()),
        ("SHEAF_QUEUE_POLL_INTERVAL", "50ms".to_owned()),
        ("SHEAF_RETRY_SCHEDULE", "1s".to_owned()),
        ("SHEAF_RETRY_MAX_ATTEMPTS", "50".to_owned()),
        // Jobs leased when a process is killed wait for their lease to end: keep it short.
        ("SHEAF_DELIVERY_TIMEOUT", "2s".to_owned()),
        ("SHEAF_QUEUE_LEASE", "5s".to_owned()),
    ]
}

async fn spawn_on(env: &[(&'static str, String)]) -> sheaf_testenv::process::SheafProcess {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    spawn_sheaf(&env).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sqlite_store_keeps_everything_across_a_restart() {
    let dir = DataDir::new();
    let env = sqlite_env(&dir.path());
    let receiver = Receiver::start().await.expect("the receiver binds");

    let first = spawn_on(&env).await;
    let client = Client::new(first.addr);
    let destination = client
        .tenant_with_destination("kept", &receiver.url())
        .await;
    let ids = publish_many(&client, "kept", "kept", 50, 8).await;
    assert!(receiver.delivers_all(&ids, Duration::from_secs(60)).await);
    let attempts_before = client.attempts_of("kept", "kept-7").await;
    assert_eq!(attempts_before.len(), 1, "{attempts_before:?}");
    stop_clean(first).await;

    let second = spawn_on(&env).await;
    let client = Client::new(second.addr);
    // The destination, the events and their attempts are still there.
    let listed = client.get("/api/v1/tenants/kept/destinations").await;
    assert_eq!(listed.status, 200, "{listed:?}");
    let ids_listed: Vec<&str> = listed.body["items"]
        .as_array()
        .expect("a list of destinations")
        .iter()
        .filter_map(|d| d["id"].as_str())
        .collect();
    assert_eq!(ids_listed, [destination["id"].as_str().unwrap()]);
    assert_eq!(client.attempts_of("kept", "kept-7").await, attempts_before);
    let events = client
        .every_item("/api/v1/tenants/kept/events?limit=20")
        .await;
    assert_eq!(events.len(), 50);
    // Idempotency outlives the process too: the same id is a duplicate, and not delivered again.
    let again = client.publish("kept", "kept-7", json!({ "n": 7 })).await;
    assert_eq!(again.status, 202, "{again:?}");
    assert_eq!(again.body["duplicate"], json!(true), "{again:?}");
    stop_clean(second).await;
    assert_eq!(receiver.duplicates(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepted_events_survive_kill_9_and_are_delivered_after_the_restart() {
    let dir = DataDir::new();
    let env = sqlite_env(&dir.path());
    let receiver = Receiver::start().await.expect("the receiver binds");
    // Every delivery fails while the first process runs, so every event waits in the queue.
    receiver.set_failing(true);

    let first = spawn_on(&env).await;
    let client = Client::new(first.addr);
    client
        .tenant_with_destination("crash", &receiver.url())
        .await;
    let ids: HashSet<String> = publish_many(&client, "crash", "crash", 200, 16).await;
    // Wait (bounded) until the first failed attempts are recorded, so the crash comes with
    // retries pending as well as first deliveries.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while client.attempts_of("crash", "crash-0").await.is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "crash-0 was attempted"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    kill(first);

    receiver.set_failing(false);
    let second = spawn_on(&env).await;
    assert!(
        receiver.delivers_all(&ids, Duration::from_secs(90)).await,
        "every event accepted before kill -9 is delivered after the restart"
    );
    // The failed attempts made before the crash were committed with their outcomes.
    let client = Client::new(second.addr);
    let attempts = client.attempts_of("crash", "crash-0").await;
    assert!(
        attempts.iter().any(|a| a["status"] == "failed"),
        "an attempt from before the crash is kept: {attempts:?}"
    );
    stop_clean(second).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_process_on_the_same_data_directory_is_refused_by_name() {
    let dir = DataDir::new();
    let env = sqlite_env(&dir.path());
    let first = spawn_on(&env).await;
    let mut second = sheaf_testenv::sheaf_command(env!("CARGO_BIN_EXE_sheaf"));
    second
        .arg("serve")
        .env("SHEAF_LISTEN", "127.0.0.1:0")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())));
    let output = second.output().expect("sheaf runs");
    assert!(!output.status.success(), "a second process must not start");
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("the second process said: {stderr}");
    assert!(
        stderr.contains("SHEAF_DATA_DIR") && stderr.contains(&dir.path()),
        "the refusal names the setting and the directory: {stderr}"
    );
    // The first process was not disturbed.
    let client = Client::new(first.addr);
    assert_eq!(client.get("/readyz").await.status, 200);
    stop_clean(first).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_taken_while_serving_restores_every_event() {
    let dir = DataDir::new();
    let env = sqlite_env(&dir.path());
    let receiver = Receiver::start().await.expect("the receiver binds");
    let serving = spawn_on(&env).await;
    let client = Client::new(serving.addr);
    client
        .tenant_with_destination("copy", &receiver.url())
        .await;
    let ids = publish_many(&client, "copy", "copy", 100, 8).await;
    assert!(receiver.delivers_all(&ids, Duration::from_secs(60)).await);

    // `sheaf backup` beside the running process, into the data directory of a new one.
    let restored = DataDir::new();
    std::fs::create_dir_all(&restored.0).unwrap();
    let copy = restored.0.join("sheaf.db");
    let output = sheaf_testenv::sheaf_command(env!("CARGO_BIN_EXE_sheaf"))
        .arg("backup")
        .arg(&copy)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .expect("sheaf runs");
    assert!(
        output.status.success(),
        "sheaf backup: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    // A second copy to the same path is refused, naming it, rather than overwriting it.
    let again = sheaf_testenv::sheaf_command(env!("CARGO_BIN_EXE_sheaf"))
        .arg("backup")
        .arg(&copy)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .expect("sheaf runs");
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("exists already"));
    // The serving process carried on.
    let after = client.publish("copy", "after-backup", json!({})).await;
    assert_eq!(after.status, 202, "{after:?}");
    stop_clean(serving).await;

    let restored_env = sqlite_env(&restored.path());
    let from_copy = spawn_on(&restored_env).await;
    let client = Client::new(from_copy.addr);
    let events = client.every_item("/api/v1/tenants/copy/events").await;
    assert_eq!(
        events.len(),
        100,
        "the copy holds every event accepted before it"
    );
    assert_eq!(client.attempts_of("copy", "copy-42").await.len(), 1);
    stop_clean(from_copy).await;
}
