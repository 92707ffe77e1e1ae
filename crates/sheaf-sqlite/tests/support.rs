//! A store in a file of its own, removed when the test ends, and a flood that fills it.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

use sheaf_sqlite::{SqliteOptions, SqliteStore};
use sheaf_store::testkit::fixtures::event;
use sheaf_store::{Event, LogStore, Payload, TenantId, Timestamp};

/// A fresh database file in a directory of its own under the system's temporary directory.
pub struct TestDb {
    pub dir: PathBuf,
    pub store: SqliteStore,
}

impl TestDb {
    pub async fn new(name: &str) -> Self {
        Self::with_options(name, SqliteOptions::default()).await
    }

    pub async fn with_options(name: &str, options: SqliteOptions) -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "sheaf-sqlite-{name}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("creating the test directory");
        let store = SqliteStore::open(dir.join("sheaf.db"), options)
            .await
            .expect("opening the test database");
        TestDb { dir, store }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Inserts batches of `per_batch` events of `tenant`, each with a `payload_bytes` blob, at most
/// `batches` of them, until the store refuses one; returns what was written, oldest first, and
/// the refusal (`None` when every batch went in).
pub async fn fill_until_refused(
    log: &dyn LogStore,
    tenant: &TenantId,
    payload_bytes: usize,
    per_batch: usize,
    batches: usize,
) -> (Vec<Event>, Option<sheaf_store::Error>) {
    let payload = Payload::new(serde_json::json!({ "blob": "x".repeat(payload_bytes) }));
    let mut written = Vec::new();
    for batch in 0..batches {
        let events: Vec<_> = (0..per_batch)
            .map(|i| {
                let mut e = event(tenant, &format!("b{batch}-{i}"), "t", Timestamp::now());
                e.data = payload.clone();
                e
            })
            .collect();
        match log.insert_many(&events, &[]).await {
            Ok(()) => written.extend(events),
            Err(e) => return (written, Some(e)),
        }
    }
    (written, None)
}
