//! Figures for this machine, printed (run with `--nocapture` to read them); nothing about speed
//! is asserted, because they depend on the machine, on what else it runs and on the build (a
//! debug build compiles the bundled SQLite without optimizations).
//!
//! The publish path as the service drives it: 32 closed-loop publishers, each accepting one
//! event (~2 KB of JSON) with one job through the outbox and waiting for its commit before the
//! next, with `synchronous=NORMAL` and `FULL`: events per second, the median and 99th
//! percentile of an accept, and how many accepts each flush (one transaction) carried.

use std::time::{Duration, Instant};

use sheaf_sqlite::{SqliteOptions, Synchronous};
use sheaf_store::testkit::fixtures::{event, job, unique_tenant};
use sheaf_store::{Intake, Payload, Timestamp};

use crate::support::TestDb;

const PUBLISHERS: usize = 32;
const PER_PUBLISHER: usize = 100;

async fn publish_run(synchronous: Synchronous) {
    let options = SqliteOptions {
        synchronous,
        ..SqliteOptions::default()
    };
    let db = TestDb::with_options("measure", options).await;
    let outbox = db.store.outbox();
    let tenant = unique_tenant("measure");
    let payload = Payload::new(serde_json::json!({ "blob": "x".repeat(2000) }));
    let started = Instant::now();
    let publishers: Vec<_> = (0..PUBLISHERS)
        .map(|p| {
            let (outbox, tenant, payload) = (outbox.clone(), tenant.clone(), payload.clone());
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(PER_PUBLISHER);
                for i in 0..PER_PUBLISHER {
                    let mut e = event(&tenant, &format!("p{p}-{i}"), "t", Timestamp::now());
                    e.data = payload.clone();
                    let mut j = job(&tenant, Timestamp::now());
                    j.event_id = e.id.clone();
                    let asked = Instant::now();
                    let new = outbox
                        .accept(&[Intake {
                            event: e,
                            jobs: vec![j],
                        }])
                        .await
                        .expect("accept");
                    latencies.push(asked.elapsed());
                    assert_eq!(new, vec![true]);
                }
                latencies
            })
        })
        .collect();
    let mut latencies: Vec<Duration> = Vec::new();
    for publisher in publishers {
        latencies.extend(publisher.await.expect("publisher"));
    }
    let elapsed = started.elapsed();
    latencies.sort();
    let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q) as usize];
    let metrics = db.store.write_metrics();
    eprintln!(
        "synchronous={synchronous:?}: {} accepts in {elapsed:.2?}: {:.0} events/s, p50 {:.2?}, \
         p99 {:.2?}; {} flushes, {:.1} accepts per flush",
        latencies.len(),
        latencies.len() as f64 / elapsed.as_secs_f64(),
        at(0.5),
        at(0.99),
        metrics.writes,
        metrics.records_written as f64 / metrics.writes.max(1) as f64,
    );
    db.store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_throughput_with_normal_and_full_sync() {
    publish_run(Synchronous::Normal).await;
    publish_run(Synchronous::Full).await;
}
