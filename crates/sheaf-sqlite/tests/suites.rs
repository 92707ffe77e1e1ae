//! The shared conformance and parity suites, run as every backend runs them, each on a file of
//! its own.

use std::sync::Arc;

use sheaf_store::LogStore;
use sheaf_store::testkit::{conformance, parity};

use crate::support::TestDb;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_of_the_log_store() {
    let db = TestDb::new("log").await;
    conformance::run_log_store(&*db.store.log_store()).await;
    db.store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parity_of_the_sqlite_log_store() {
    let db = TestDb::new("parity").await;
    let store: Arc<dyn LogStore> = db.store.log_store();
    parity::run(store, &parity::ParityConfig::from_env(), &[]).await;
    db.store.close().await;
}

/// Each key of a batched latest-attempt lookup is one probe of `attempts_latest`, not a scan.
#[tokio::test]
async fn the_latest_attempt_lookup_probes_the_index() {
    let db = TestDb::new("plan").await;
    let plan = db
        .store
        .sqlite_log_store()
        .explain_latest_attempts()
        .await
        .expect("explain");
    let text = plan.join("\n");
    assert!(
        text.contains("USING INDEX attempts_latest")
            || text.contains("USING COVERING INDEX attempts_latest"),
        "{text}"
    );
    assert!(
        !text.contains("SCAN a\n") && !text.contains("SCAN l"),
        "{text}"
    );
    db.store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_of_the_entity_store() {
    let db = TestDb::new("entity").await;
    conformance::run_entity_store(&*db.store.entity_store()).await;
    db.store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_of_the_job_queue() {
    let db = TestDb::new("queue").await;
    conformance::run_job_queue(&*db.store.job_queue()).await;
    db.store.close().await;
}

/// The three suites in one run, as `run_all` runs them on every backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_run_all() {
    let db = TestDb::new("all").await;
    let store = &db.store;
    conformance::run_all(
        &*store.log_store(),
        &*store.job_queue(),
        &*store.entity_store(),
    )
    .await;
    store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_of_the_outbox() {
    let db = TestDb::new("outbox").await;
    let store = &db.store;
    let (outbox, queue, log) = (store.outbox(), store.job_queue(), store.log_store());
    conformance::run_outbox(conformance::outbox::Stores {
        outbox: &*outbox,
        queue: &*queue,
        log: &*log,
    })
    .await;
    store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_of_the_replay_store() {
    let db = TestDb::new("replay").await;
    conformance::run_replay_store(&*db.store.replay_store()).await;
    // A fresh file: the page cases need an idle queue.
    let paged = TestDb::new("replay-pages").await;
    conformance::run_replay_pages(conformance::replay_pages::PageStores {
        replays: &*paged.store.replay_store(),
        queue: &*paged.store.job_queue(),
    })
    .await;
    db.store.close().await;
    paged.store.close().await;
}
