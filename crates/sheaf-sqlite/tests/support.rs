//! A store in a file of its own, removed when the test ends.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

use sheaf_sqlite::{SqliteOptions, SqliteStore};

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
