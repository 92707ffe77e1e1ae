//! The shared conformance and parity suites, run as every backend runs them, each in a schema of
//! its own (the queue cases need a queue nobody else uses).

use std::sync::Arc;

use sheaf_postgres::OutboxLayout;
use sheaf_store::LogStore;
use sheaf_store::testkit::{conformance, parity};
use sheaf_testenv::require_postgres;

use crate::support::{Gate, TestSchema};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_run_all() {
    let url = require_postgres!("conformance_run_all");
    let _gate = Gate::shared(&url).await;
    let test = TestSchema::new(&url).await;
    let stores = &test.stores;
    conformance::run_all(
        &*stores.log_store(),
        &*stores.job_queue(),
        &*stores.entity_store(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_of_the_replay_store() {
    let url = require_postgres!("conformance_of_the_replay_store");
    let _gate = Gate::shared(&url).await;
    let test = TestSchema::new(&url).await;
    conformance::run_replay_store(&*test.stores.replay_store()).await;
    // A fresh schema: the page cases need an idle queue.
    let paged = TestSchema::new(&url).await;
    conformance::run_replay_pages(conformance::replay_pages::PageStores {
        replays: &*paged.stores.replay_store(),
        queue: &*paged.stores.job_queue(),
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parity_of_the_postgres_log_store() {
    let url = require_postgres!("parity_of_the_postgres_log_store");
    let _gate = Gate::shared(&url).await;
    let test = TestSchema::new(&url).await;
    let store: Arc<dyn LogStore> = test.stores.log_store();
    parity::run(store, &parity::ParityConfig::from_env(), &[]).await;
}

/// The outbox suite in both layouts, each over a queue of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_of_the_outbox() {
    let url = require_postgres!("conformance_of_the_outbox");
    let _gate = Gate::shared(&url).await;
    for layout in [OutboxLayout::Shipped, OutboxLayout::InTheLog] {
        eprintln!("outbox layout: {layout:?}");
        let test = TestSchema::new(&url).await;
        let stores = &test.stores;
        let (outbox, queue, log) = (
            stores.outbox(layout),
            stores.job_queue(),
            stores.log_store(),
        );
        conformance::run_outbox(conformance::outbox::Stores {
            outbox: &*outbox,
            queue: &*queue,
            log: &*log,
        })
        .await;
    }
}
