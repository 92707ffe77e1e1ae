//! What the Postgres queue promises beyond the shared suite: exclusive claims under real
//! concurrency, a vanished claimer's jobs coming back on the server's clock, HOT claims and
//! renewals.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use sheaf_postgres::PostgresStores;
use sheaf_store::testkit::fixtures::{job, shift, unique_tenant};
use sheaf_store::{ClaimedJob, Job, JobId, JobQueue, Lease, QueueDepth, Timestamp};
use sheaf_testenv::require_postgres;

use crate::support::{Gate, TestSchema, job_update_stats};

/// Enqueues `n` jobs of one tenant, due over the last few seconds, in statements of 2,000.
async fn enqueue_due(queue: &dyn JobQueue, n: usize) -> Vec<Job> {
    let tenant = unique_tenant("pg-queue");
    let now = Timestamp::now();
    let jobs: Vec<Job> = (0..n)
        .map(|i| job(&tenant, shift(now, -((i % 5_000) as i64) * 1_000)))
        .collect();
    for chunk in jobs.chunks(2_000) {
        queue.enqueue(chunk).await.expect("enqueue");
    }
    jobs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_claimers_complete_20000_jobs_exactly_once() {
    let url = require_postgres!("eight_claimers_complete_20000_jobs_exactly_once");
    let _gate = Gate::shared(&url).await;
    let test = TestSchema::new(&url).await;
    let queue = test.stores.job_queue();
    let jobs = enqueue_due(&*queue, 20_000).await;

    // Each claimer claims 10 at a time and completes each batch in one statement, as fast as it
    // can: the most contention the claim sees. The lease outlives the test, so every claim a
    // claimer holds is still valid when another claimer's claim runs.
    let claimers: Vec<_> = (0..8)
        .map(|_| {
            let queue = Arc::clone(&queue);
            tokio::spawn(async move {
                let mut mine: Vec<ClaimedJob> = Vec::new();
                loop {
                    let batch = queue
                        .claim(10, Duration::from_secs(300))
                        .await
                        .expect("claim");
                    if batch.is_empty() {
                        return mine;
                    }
                    let leases: Vec<Lease> = batch.iter().map(|c| c.lease).collect();
                    let lost = queue.complete(&leases).await.expect("complete");
                    assert!(lost.is_empty(), "a fresh lease was lost: {lost:?}");
                    mine.extend(batch);
                }
            })
        })
        .collect();

    let mut claims: HashMap<JobId, usize> = HashMap::new();
    let mut per_claimer = Vec::new();
    for claimer in claimers {
        let mine = claimer.await.expect("a claimer panicked");
        per_claimer.push(mine.len());
        for claimed in mine {
            *claims.entry(claimed.job.id).or_default() += 1;
        }
    }
    let twice: Vec<_> = claims.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "jobs claimed twice while their lease held: {twice:?}"
    );
    assert_eq!(claims.len(), jobs.len(), "every job was claimed (once)");
    for j in &jobs {
        assert!(claims.contains_key(&j.id), "job {} was never claimed", j.id);
    }
    assert_eq!(
        queue.depth().await.expect("depth"),
        QueueDepth::default(),
        "every job was completed"
    );
    println!("jobs per claimer: {per_claimer:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vanished_claimers_jobs_return_after_the_lease_and_not_before() {
    let url = require_postgres!("a_vanished_claimers_jobs_return_after_the_lease_and_not_before");
    let _gate = Gate::shared(&url).await;
    let test = TestSchema::new(&url).await;
    let queue = test.stores.job_queue();
    let jobs = enqueue_due(&*queue, 40).await;

    // Another process: its own pool over the same schema. It claims everything, then vanishes
    // (its pool is closed and dropped) without completing or releasing anything.
    let lease = Duration::from_secs(2);
    let other = PostgresStores::new(TestSchema::config(&url).with_schema(test.schema.clone()))
        .expect("config");
    let taken = other.job_queue().claim(100, lease).await.expect("claim");
    assert_eq!(taken.len(), jobs.len());
    other.close().await;
    drop(other);
    let old: HashMap<JobId, Lease> = taken.iter().map(|c| (c.job.id, c.lease)).collect();

    // Poll until every job has come back. Each claim that returns a job proves, on the server's
    // clock, that it came after the old lease ran out: a claim's `claimed_until` is its `now()`
    // plus the lease asked for, and that `now()` must be past the old `claimed_until`.
    let new_lease = Duration::from_secs(60);
    let started = tokio::time::Instant::now();
    let mut empty_polls = 0;
    let mut back: Vec<ClaimedJob> = Vec::new();
    while back.len() < jobs.len() {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "only {} of {} jobs came back within 20 s of a {lease:?} lease",
            back.len(),
            jobs.len()
        );
        let batch = queue.claim(100, new_lease).await.expect("claim");
        if batch.is_empty() {
            empty_polls += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        for claimed in &batch {
            let before = old[&claimed.job.id];
            let claimed_at = claimed
                .lease
                .claimed_until
                .checked_sub(new_lease)
                .expect("in range");
            assert!(
                claimed_at > before.claimed_until,
                "job {} was claimed again at {claimed_at}, before its lease ran out at {}",
                claimed.job.id,
                before.claimed_until
            );
        }
        back.extend(batch);
    }
    assert!(
        empty_polls > 0,
        "no claim was tried while the lease held (the machine stalled for {lease:?})"
    );
    println!(
        "jobs came back after {:?} ({empty_polls} empty polls during the lease)",
        started.elapsed()
    );

    // The vanished claimer's leases are lost for good; the new owner's hold.
    let old_leases: Vec<Lease> = old.values().copied().collect();
    assert_eq!(
        queue.complete(&old_leases).await.expect("complete").len(),
        jobs.len(),
        "the vanished claimer's leases are lost"
    );
    let new_leases: Vec<Lease> = back.iter().map(|c| c.lease).collect();
    assert!(
        queue
            .complete(&new_leases)
            .await
            .expect("complete")
            .is_empty()
    );
    assert_eq!(queue.depth().await.expect("depth"), QueueDepth::default());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_and_renewals_are_hot_updates() {
    let url = require_postgres!("claims_and_renewals_are_hot_updates");
    // Alone: a HOT update needs room on its page, which pruning makes by removing versions no
    // snapshot can see any more, and a long statement of another test in the same database
    // (the log suite's 200,000-attempt insert, the measurement) holds a snapshot that keeps
    // them. Beside those, the share fell to 83 % although no update here changed.
    let _gate = Gate::exclusive(&url).await;
    let test = TestSchema::new(&url).await;
    let queue = test.stores.job_queue();
    enqueue_due(&*queue, 1_000).await;

    // 10,000 claims and renewals (and 5,000 releases, so the jobs can be claimed again): every
    // one of them writes only `claimed_until`.
    let lease = Duration::from_secs(60);
    let mut claims_and_renewals = 0;
    let mut releases = 0;
    while claims_and_renewals < 10_000 {
        let claimed = queue.claim(100, lease).await.expect("claim");
        assert_eq!(claimed.len(), 100, "released jobs are claimable at once");
        let leases: Vec<Lease> = claimed.iter().map(|c| c.lease).collect();
        let renewed = queue.renew(&leases, lease).await.expect("renew");
        assert!(renewed.lost.is_empty());
        let lost = queue.release(&renewed.leases).await.expect("release");
        assert!(lost.is_empty());
        claims_and_renewals += claimed.len() + renewed.leases.len();
        releases += renewed.leases.len();
    }
    // Closing the pool ends its backends, which flush their statistics as they exit.
    test.stores.close().await;
    let expected = i64::try_from(claims_and_renewals + releases).expect("small");
    let (updates, hot) = job_update_stats(&test, expected).await;
    let ratio = hot as f64 / updates as f64;
    println!(
        "job table: {updates} updates, {hot} HOT ({:.1} %)",
        ratio * 100.0
    );
    assert!(
        ratio >= 0.9,
        "only {hot} of {updates} updates of the job table were HOT ({:.1} %)",
        ratio * 100.0
    );
}

/// The generic plan of the claim after an `ANALYZE` of `jobs`: the plan's root and every node.
async fn analyzed_generic_claim_plan(
    test: &TestSchema,
) -> (serde_json::Value, Vec<serde_json::Value>) {
    sqlx::raw_sql(&format!("ANALYZE \"{}\".jobs", test.schema))
        .execute(test.stores.pool())
        .await
        .expect("analyze");
    let explained = test
        .stores
        .postgres_job_queue()
        .explain_generic_claim()
        .await
        .expect("explain");
    let root = explained[0].clone();
    let mut nodes = Vec::new();
    plan_nodes(&root["Plan"], &mut nodes);
    (root, nodes)
}

/// Every node of an `EXPLAIN (FORMAT JSON)` plan, depth first.
fn plan_nodes(node: &serde_json::Value, out: &mut Vec<serde_json::Value>) {
    out.push(node.clone());
    if let Some(children) = node.get("Plans").and_then(|p| p.as_array()) {
        for child in children {
            plan_nodes(child, out);
        }
    }
}

/// A prepared claim is soon run on a generic plan, made without knowing how many jobs it asks
/// for. That plan must still find the jobs through the indexes: a sequential scan of the jobs
/// table reads every live and dead row on every claim, and under a backlog that made each claim
/// take seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_generic_claim_plan_never_scans_the_whole_table() {
    let url = require_postgres!("the_generic_claim_plan_never_scans_the_whole_table");
    let _gate = Gate::shared(&url).await;
    let test = TestSchema::new(&url).await;
    enqueue_due(&*test.stores.job_queue(), 20_000).await;
    let (root, nodes) = analyzed_generic_claim_plan(&test).await;
    let on_jobs: Vec<&serde_json::Value> = nodes
        .iter()
        .filter(|n| n["Relation Name"] == "jobs")
        .collect();
    assert!(!on_jobs.is_empty(), "the plan never reads jobs: {root:#}");
    for node in on_jobs {
        assert_ne!(
            node["Node Type"], "Seq Scan",
            "the claim reads the whole jobs table: {root:#}"
        );
    }
}

/// Per-key ordering is in the claim itself: an ordered row is claimable only when no earlier
/// row of its (destination, order key) is queued, which the claim asks of the partial index
/// `jobs_by_order`, one probe per ordered row it considers; unordered rows skip the probe. The
/// generic plan reads `jobs` by index only, and takes no lock beyond the rows it claims.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_claim_asks_the_order_index_for_a_key_s_earlier_jobs() {
    let url = require_postgres!("the_claim_asks_the_order_index_for_a_key_s_earlier_jobs");
    let _gate = Gate::shared(&url).await;
    let test = TestSchema::new(&url).await;
    let queue = test.stores.job_queue();
    enqueue_due(&*queue, 20_000).await;
    let tenant = unique_tenant("pg-queue-ordered");
    let destination = sheaf_store::DestinationId::generate();
    let now = Timestamp::now();
    let ordered: Vec<Job> = (0..2_000)
        .map(|i| Job {
            destination_id: destination,
            order_key: Some(format!("key-{}", i % 100)),
            ..job(&tenant, shift(now, -(i as i64) * 1_000))
        })
        .collect();
    for chunk in ordered.chunks(500) {
        queue.enqueue(chunk).await.expect("enqueue");
    }
    let (root, nodes) = analyzed_generic_claim_plan(&test).await;
    println!("{root:#}");
    for node in nodes.iter().filter(|n| n["Relation Name"] == "jobs") {
        assert_ne!(node["Node Type"], "Seq Scan", "a scan of jobs: {root:#}");
    }
    assert!(
        nodes.iter().any(|n| n["Index Name"] == "jobs_by_order"),
        "the earlier jobs of a key are looked up in jobs_by_order: {root:#}"
    );
    // The 100 keys' first jobs, and never two of one key, among everything due.
    let claimed = queue
        .claim(30_000, Duration::from_secs(300))
        .await
        .expect("claim");
    let keyed: Vec<&ClaimedJob> = claimed
        .iter()
        .filter(|c| c.job.order_key.is_some())
        .collect();
    assert_eq!(keyed.len(), 100, "one job per key");
    assert_eq!(claimed.len(), 20_100);
    let firsts: std::collections::HashSet<JobId> = ordered[..100].iter().map(|j| j.id).collect();
    assert!(
        keyed.iter().all(|c| firsts.contains(&c.job.id)),
        "each key's first job"
    );
}

/// Calls of this schema's completion statement and the shared buffers they touched, from
/// `pg_stat_statements` (updated as each statement ends).
async fn completion_cost(test: &TestSchema) -> (i64, i64) {
    let mut conn = test.connect().await;
    sqlx::query_as::<_, (i64, i64)>(
        "SELECT coalesce(sum(calls), 0)::bigint,
                coalesce(sum(shared_blks_hit + shared_blks_read), 0)::bigint
         FROM pg_stat_statements WHERE query LIKE $1",
    )
    .bind(format!(
        "%DELETE FROM \"{}\".jobs AS j USING unnest%",
        test.schema
    ))
    .fetch_one(&mut conn)
    .await
    .expect("read pg_stat_statements")
}

/// A completion run many times while `jobs` was empty still finds its rows by primary key once
/// the table holds a backlog. Postgres keeps a prepared statement's generic plan, costed on the
/// statistics of the moment, until the next ANALYZE; made on an empty table it is a hash join
/// over a sequential scan, and under a backlog every completion then read the whole table
/// (1.3–1.7 s per batch in `bench delivery`). The queue's statements over `jobs` are planned at
/// each execution; with them prepared, this test fails (a batch reads every page of the table).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outcome_plans_follow_the_table_as_it_grows() {
    let url = require_postgres!("outcome_plans_follow_the_table_as_it_grows");
    let _gate = Gate::shared(&url).await;
    let test = TestSchema::new(&url).await;
    sqlx::raw_sql(&format!("ANALYZE \"{}\".jobs", test.schema))
        .execute(test.stores.pool())
        .await
        .expect("analyze the empty table");
    let queue = test.stores.job_queue();
    // Enough runs on every connection of the pool for Postgres to settle on a generic plan.
    let nobody = Lease {
        job_id: JobId::generate(),
        claimed_until: Timestamp::now(),
    };
    for _ in 0..60 {
        queue
            .complete(&[nobody])
            .await
            .expect("complete on the empty table");
    }
    enqueue_due(&*queue, 20_000).await;
    let claimed = queue
        .claim(10, Duration::from_secs(300))
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 10);
    let (calls_before, blocks_before) = completion_cost(&test).await;
    let leases: Vec<Lease> = claimed.iter().map(|c| c.lease).collect();
    assert!(queue.complete(&leases).await.expect("complete").is_empty());
    let (calls, blocks) = completion_cost(&test).await;
    assert_eq!(calls, calls_before + 1, "one completion statement ran");
    // By primary key: a few index pages and a heap page per job. A sequential scan reads the
    // table's ~350 pages.
    let read = blocks - blocks_before;
    assert!(
        read < 150,
        "completing 10 of 20,000 jobs touched {read} buffers: the plan scans the table"
    );
}

/// How often the test schema's jobs table was vacuumed by hand (not by autovacuum).
async fn manual_vacuums(test: &TestSchema) -> i64 {
    let mut conn = test.connect().await;
    sqlx::query_scalar::<_, i64>(
        "SELECT vacuum_count FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = 'jobs'",
    )
    .bind(&test.schema)
    .fetch_one(&mut conn)
    .await
    .expect("read pg_stat_user_tables")
}

/// Claims and completes `n` jobs, 500 per statement.
async fn complete_jobs(queue: &dyn JobQueue, n: usize) {
    let mut done = 0;
    while done < n {
        let batch = queue
            .claim(500.min(n - done), Duration::from_secs(300))
            .await
            .expect("claim");
        assert!(!batch.is_empty(), "jobs left to claim");
        let leases: Vec<Lease> = batch.iter().map(|c| c.lease).collect();
        assert!(queue.complete(&leases).await.expect("complete").is_empty());
        done += batch.len();
    }
}

/// The queue vacuums its jobs table once `VACUUM_AFTER_DEAD_ROWS` outcomes left dead rows, and
/// not before: the claim then never walks through more dead index entries than that, whatever
/// autovacuum's schedule.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maintain_vacuums_the_jobs_table_after_enough_dead_rows() {
    let url = require_postgres!("maintain_vacuums_the_jobs_table_after_enough_dead_rows");
    let _gate = Gate::shared(&url).await;
    let test = TestSchema::new(&url).await;
    let queue = test.stores.job_queue();
    let threshold = sheaf_postgres::VACUUM_AFTER_DEAD_ROWS as usize;
    enqueue_due(&*queue, threshold + 500).await;
    let before = manual_vacuums(&test).await;

    complete_jobs(&*queue, threshold - 500).await;
    assert!(
        !queue.maintain().await.expect("maintain"),
        "fewer dead rows than the threshold: nothing to do"
    );
    assert_eq!(manual_vacuums(&test).await, before, "no vacuum yet");

    complete_jobs(&*queue, 500).await;
    assert!(
        queue.maintain().await.expect("maintain"),
        "the threshold is reached"
    );
    assert_eq!(
        manual_vacuums(&test).await,
        before + 1,
        "one vacuum of jobs"
    );
    assert!(
        !queue.maintain().await.expect("maintain"),
        "the count starts again after a vacuum"
    );
}
