//! The map store against the suites every Sheaf backend runs: all of `run_all` (the log store's
//! cases on the map store; the queue's and the entity store's on `sheaf-memory`'s, since this
//! backend brings a log store only) and the parity property (batched latest-attempt lookups
//! equal the single ones and the reference model, directly and through a `LookupCoalescer`).

use std::sync::Arc;

use sheaf_example_maplog::MapLogStore;
use sheaf_memory::{MemoryEntityStore, MemoryJobQueue};
use sheaf_store::LogStore;
use sheaf_store::testkit::{conformance, parity};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_run_all() {
    let (log, queue, entities) = (
        MapLogStore::new(),
        MemoryJobQueue::default(),
        MemoryEntityStore::new(),
    );
    conformance::run_all(&log, &queue, &entities).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parity_of_the_log_store() {
    let store: Arc<dyn LogStore> = Arc::new(MapLogStore::new());
    parity::run(store, &parity::ParityConfig::from_env(), &[]).await;
}
