//! The map store against the suites every Sheaf backend runs: the log store's conformance cases
//! and the parity property (batched latest-attempt lookups equal the single ones and the
//! reference model, directly and through a `LookupCoalescer`).

use std::sync::Arc;

use sheaf_example_maplog::MapLogStore;
use sheaf_store::LogStore;
use sheaf_store::testkit::{conformance, parity};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_of_the_log_store() {
    conformance::run_log_store(&MapLogStore::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parity_of_the_log_store() {
    let store: Arc<dyn LogStore> = Arc::new(MapLogStore::new());
    parity::run(store, &parity::ParityConfig::from_env(), &[]).await;
}
