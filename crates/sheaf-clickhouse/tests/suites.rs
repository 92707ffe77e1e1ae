//! The shared log-store conformance cases and the parity property, run as every backend runs
//! them.

use std::sync::Arc;
use std::time::Duration;

use sheaf_store::LogStore;
use sheaf_store::testkit::{conformance, parity};
use sheaf_testenv::require_clickhouse;

use crate::support::TestDb;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_of_the_log_store() {
    let url = require_clickhouse!("conformance_of_the_log_store");
    let db = TestDb::new(&url);
    // A short wait window, so the cases also run through the coalescer's gathering step.
    let mut config = db.config();
    config.write.max_wait = Duration::from_millis(5);
    let store = db.store_with(config).await;
    conformance::run_log_store(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parity_of_the_log_store() {
    let url = require_clickhouse!("parity_of_the_log_store");
    let db = TestDb::new(&url);
    let store: Arc<dyn LogStore> = Arc::new(db.store().await);
    parity::run(store, &parity::ParityConfig::from_env(), &[]).await;
}
