//! Figures for this machine, printed as tables (run with `--nocapture` to read them); nothing
//! about speed is asserted, because they depend on the machine and on what else it runs.
//!
//! - The queue's claim+complete throughput with 1, 4 and 16 workers, and the share of HOT updates
//!   it made. The shape matches the hand measurement's column "lease claim + one batched
//!   completion" (docs/benchmarks.md, "`queue`", earlier measurements): each worker claims 10 due
//!   no-op jobs in one statement and completes them in one statement, against a queue of its own.
//! - The latest-attempt lookup over 200,000 attempts: one key per statement against 100 keys per
//!   statement, wall time per key at the client (docs/benchmarks.md, "`lookup`", earlier
//!   measurements, by hand on this machine).

use std::sync::Arc;
use std::time::{Duration, Instant};

use sheaf_store::testkit::fixtures::{job, shift, unique_tenant};
use sheaf_store::{Job, Lease, QueueDepth, Timestamp};
use sheaf_testenv::require_postgres;

use crate::support::{Gate, TestSchema, fill_attempts, job_update_stats};

const JOBS: usize = 10_000;
const CLAIM_BATCH: usize = 10;

struct Run {
    workers: usize,
    elapsed: Duration,
    claims: usize,
    updates: i64,
    hot: i64,
}

async fn run(url: &str, workers: usize) -> Run {
    let config = sheaf_postgres::PostgresConfig {
        max_connections: u32::try_from(workers).expect("small"),
        ..TestSchema::config(url)
    };
    let test = TestSchema::with_config(config).await;
    let queue = test.stores.job_queue();
    let tenant = unique_tenant("pg-measure");
    let now = Timestamp::now();
    let jobs: Vec<Job> = (0..JOBS)
        .map(|i| job(&tenant, shift(now, -(i as i64) * 100)))
        .collect();
    for chunk in jobs.chunks(2_000) {
        queue.enqueue(chunk).await.expect("enqueue");
    }
    // Open every connection before the clock starts: connecting is not what is measured.
    let warm = futures::future::join_all((0..workers).map(|_| test.stores.pool().acquire())).await;
    drop(warm);

    let started = Instant::now();
    let tasks: Vec<_> = (0..workers)
        .map(|_| {
            let queue = Arc::clone(&queue);
            tokio::spawn(async move {
                let mut claims = 0;
                loop {
                    let batch = queue
                        .claim(CLAIM_BATCH, Duration::from_secs(60))
                        .await
                        .expect("claim");
                    if batch.is_empty() {
                        return claims;
                    }
                    claims += 1;
                    let leases: Vec<Lease> = batch.iter().map(|c| c.lease).collect();
                    assert!(queue.complete(&leases).await.expect("complete").is_empty());
                }
            })
        })
        .collect();
    let mut claims = 0;
    for task in tasks {
        claims += task.await.expect("worker panicked");
    }
    let elapsed = started.elapsed();
    assert_eq!(queue.depth().await.expect("depth"), QueueDepth::default());
    test.stores.close().await;
    let (updates, hot) = job_update_stats(&test, JOBS as i64).await;
    Run {
        workers,
        elapsed,
        claims,
        updates,
        hot,
    }
}

/// Microseconds per key of `passes` rounds of single lookups and of `passes` batched lookups of
/// the same 100 keys, after one warm-up round of each (plans prepared, pages cached).
async fn lookups(url: &str, passes: u32) -> (f64, f64) {
    let test = TestSchema::new(url).await;
    let keys = fill_attempts(&test).await;
    let log = test.stores.log_store();
    for key in &keys {
        log.latest_attempt(key).await.expect("latest_attempt");
    }
    log.latest_attempts(&keys).await.expect("latest_attempts");
    let lookups = f64::from(passes) * keys.len() as f64;
    let started = Instant::now();
    for _ in 0..passes {
        for key in &keys {
            log.latest_attempt(key).await.expect("latest_attempt");
        }
    }
    let single = started.elapsed().as_secs_f64() * 1e6 / lookups;
    let started = Instant::now();
    for _ in 0..passes {
        log.latest_attempts(&keys).await.expect("latest_attempts");
    }
    let batched = started.elapsed().as_secs_f64() * 1e6 / lookups;
    (single, batched)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_throughput_and_lookup_cost() {
    let url = require_postgres!("queue_throughput_and_lookup_cost");
    // Alone: the other tests of this binary would share the two cores with it.
    let _gate = Gate::exclusive(&url).await;
    let mut runs = Vec::new();
    for workers in [1, 4, 16] {
        runs.push(run(&url, workers).await);
    }
    println!();
    println!(
        "claim+complete, {JOBS} no-op jobs per run, claims of {CLAIM_BATCH}, one completion \
         statement per claim"
    );
    println!("| workers | jobs/s | claim statements | job-table updates | HOT |");
    println!("|---|---|---|---|---|");
    for r in &runs {
        println!(
            "| {} | {:.0} | {} | {} | {:.1} % |",
            r.workers,
            JOBS as f64 / r.elapsed.as_secs_f64(),
            r.claims,
            r.updates,
            100.0 * r.hot as f64 / r.updates as f64
        );
    }

    let (single, batched) = lookups(&url, 20).await;
    println!();
    println!("latest-attempt lookup over 200,000 attempts, 2,000 lookups each way, one client");
    println!("| statement | µs per key | keys/s |");
    println!("|---|---|---|");
    println!("| one key | {single:.1} | {:.0} |", 1e6 / single);
    println!(
        "| 100 keys (LATERAL unnest) | {batched:.1} | {:.0} |",
        1e6 / batched
    );
}
