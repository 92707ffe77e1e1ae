//! The queue: the conformance suite on one server and on the cluster, several processes
//! sharing one bucket, a restart, and the removal of deletion markers.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use sheaf_jetstream::{JetStreamConfig, JetStreamQueue};
use sheaf_store::testkit::conformance;
use sheaf_store::testkit::fixtures::{job, shift, unique_tenant};
use sheaf_store::{ClaimedJob, Job, JobId, JobQueue, Lease, QueueDepth, Timestamp};

use crate::{config, open, server};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_on_one_server() {
    let Some(server) = server("conformance_on_one_server") else {
        return;
    };
    let queue = open(&config(vec![server.url()], 1)).await;
    conformance::run_job_queue(&queue).await;
    queue.delete_bucket().await.expect("delete the bucket");
}

/// Enqueues `n` jobs of one tenant, due over the last few seconds.
async fn enqueue_due(queue: &dyn JobQueue, n: usize) -> Vec<Job> {
    let tenant = unique_tenant("js-queue");
    let now = Timestamp::now();
    let jobs: Vec<Job> = (0..n)
        .map(|i| job(&tenant, shift(now, -((i % 5_000) as i64) * 1_000)))
        .collect();
    for chunk in jobs.chunks(2_000) {
        queue.enqueue(chunk).await.expect("enqueue");
    }
    jobs
}

/// Three processes (three connections, three views) claim and complete 6,000 jobs as fast as
/// they can, four claimers each: every job is claimed exactly once, although each view learns
/// of the others' claims only after they are made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_complete_each_job_exactly_once() {
    let Some(server) = server("three_processes_complete_each_job_exactly_once") else {
        return;
    };
    three_processes_complete(config(vec![server.url()], 1)).await;
}

/// The same on the 3-node cluster, the bucket on all three.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_on_a_cluster_complete_each_job_exactly_once() {
    let urls = sheaf_testenv::require_nats_cluster!("three_processes_on_a_cluster");
    three_processes_complete(config(urls, 3)).await;
}

async fn three_processes_complete(config: JetStreamConfig) {
    let mut processes = Vec::new();
    for _ in 0..3 {
        processes.push(Arc::new(open(&config).await));
    }
    let jobs = enqueue_due(&*processes[0], 6_000).await;

    let mut claimers = Vec::new();
    for process in &processes {
        for _ in 0..4 {
            let queue = Arc::clone(process);
            claimers.push(tokio::spawn(async move {
                let mut mine: Vec<ClaimedJob> = Vec::new();
                let mut idle = 0;
                while idle < 20 {
                    let batch = queue
                        .claim(25, Duration::from_secs(300))
                        .await
                        .expect("claim");
                    if batch.is_empty() {
                        idle += 1;
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                    idle = 0;
                    let leases: Vec<Lease> = batch.iter().map(|c| c.lease).collect();
                    let lost = queue.complete(&leases).await.expect("complete");
                    assert!(lost.is_empty(), "a fresh lease was lost: {lost:?}");
                    mine.extend(batch);
                }
                mine
            }));
        }
    }
    let mut claims: HashMap<JobId, usize> = HashMap::new();
    let mut per_process = vec![0usize; processes.len()];
    for (i, claimer) in claimers.into_iter().enumerate() {
        let mine = claimer.await.expect("claimer");
        per_process[i / 4] += mine.len();
        for claimed in mine {
            *claims.entry(claimed.job.id).or_default() += 1;
        }
    }
    let twice: Vec<_> = claims.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "jobs claimed more than once: {twice:?}");
    assert_eq!(claims.len(), jobs.len(), "every job is claimed");
    assert!(
        per_process.iter().all(|&n| n > 0),
        "every process took a share: {per_process:?}"
    );
    for process in &processes {
        assert_eq!(process.depth().await.expect("depth"), QueueDepth::default());
    }
    let processes: Vec<JetStreamQueue> = processes
        .into_iter()
        .map(|p| Arc::try_unwrap(p).expect("claimers are done"))
        .collect();
    for (i, process) in processes.into_iter().enumerate() {
        if i == 0 {
            process.delete_bucket().await.expect("delete the bucket");
        }
    }
}

/// A process that opens the bucket later (a restart) finds every waiting job, its lease and
/// its dead letters; a lease taken before the restart still settles its job after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_finds_every_job_and_lease() {
    let Some(server) = server("a_restart_finds_every_job_and_lease") else {
        return;
    };
    let config = config(vec![server.url()], 1);
    let before = open(&config).await;
    let jobs = enqueue_due(&before, 300).await;
    let claimed = before
        .claim(10, Duration::from_secs(300))
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 10);
    let depth = before.depth().await.expect("depth");
    drop(before);

    let after = open(&config).await;
    assert_eq!(after.depth().await.expect("depth"), depth);
    assert_eq!(depth.claimed, 10);
    assert_eq!(depth.due, jobs.len() as u64 - 10);
    let lost = after
        .complete(&claimed.iter().map(|c| c.lease).collect::<Vec<_>>())
        .await
        .expect("complete");
    assert!(
        lost.is_empty(),
        "leases taken before the restart hold: {lost:?}"
    );
    assert_eq!(after.depth().await.expect("depth").claimed, 0);
    after.delete_bucket().await.expect("delete the bucket");
}

/// The stream's message count, and whether the server still has the given sequence.
async fn stream_messages(url: &str, config: &JetStreamConfig) -> u64 {
    let client = async_nats::connect(url).await.expect("connect");
    let context = async_nats::jetstream::new(client);
    let stream = context
        .get_stream(format!("KV_{}", config.bucket))
        .await
        .expect("the bucket's stream");
    stream.get_info().await.expect("stream info").state.messages
}

/// Finished jobs leave deletion markers that `maintain` removes once they are old enough, all
/// but the stream's last message; a process that opens the bucket afterwards sees an empty
/// queue, and a finished job's id can be enqueued again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maintain_removes_the_markers_of_finished_jobs() {
    let Some(server) = server("maintain_removes_the_markers_of_finished_jobs") else {
        return;
    };
    let config = config(vec![server.url()], 1);
    let mut queue = open(&config).await;
    let jobs = enqueue_due(&queue, 50).await;
    let claimed = queue
        .claim(50, Duration::from_secs(300))
        .await
        .expect("claim");
    let leases: Vec<Lease> = claimed.iter().map(|c| c.lease).collect();
    assert!(queue.complete(&leases).await.expect("complete").is_empty());
    assert_eq!(
        stream_messages(&server.url(), &config).await,
        50,
        "one marker per job"
    );

    assert!(
        !queue.maintain().await.expect("maintain"),
        "markers younger than the age kept stay"
    );
    queue.keep_markers_for(Duration::ZERO);
    assert!(queue.maintain().await.expect("maintain"));
    assert_eq!(
        stream_messages(&server.url(), &config).await,
        1,
        "every marker but the stream's last message is gone"
    );

    let later = open(&config).await;
    assert_eq!(later.depth().await.expect("depth"), QueueDepth::default());
    later.enqueue(&jobs[..1]).await.expect("enqueue again");
    assert_eq!(later.depth().await.expect("depth").due, 1);
    drop(later);
    queue.delete_bucket().await.expect("delete the bucket");
}

/// The suite again on the 3-node cluster (`cargo xtask services up --cluster`), the bucket kept
/// on all three: every write is acknowledged by a majority.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_on_a_three_node_cluster() {
    let urls = sheaf_testenv::require_nats_cluster!("conformance_on_a_three_node_cluster");
    let queue = open(&config(urls, 3)).await;
    conformance::run_job_queue(&queue).await;
    queue.delete_bucket().await.expect("delete the bucket");
}
