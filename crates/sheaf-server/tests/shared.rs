//! The shared-store configurations on the real servers: Postgres queue with the ClickHouse log
//! (one server, and a cluster), Postgres for both, the JetStream queue (one server, and three
//! `sheaf` processes on a 3-node cluster), and two `sheaf` processes (the real binary) sharing
//! Postgres and ClickHouse.

use std::collections::HashSet;
use std::time::Duration;

use sheaf_testenv::receiver::{Failing, Receiver};

use crate::delivery::{OUTAGE_SETTINGS, outage_run};
use crate::support::{Client, env_with, publish_many, spawn_sheaf, stop_clean};

fn check_report(label: &str, report: &crate::delivery::Report) {
    report.print(label);
    assert!(report.retries > 0.0, "the outage caused retries");
    assert!(
        report.lookup_queries * 2.0 < report.retries,
        "lookup queries ({}) are well below retries ({})",
        report.lookup_queries,
        report.retries
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_queue_and_clickhouse_log_deliver_every_event_through_an_outage() {
    let postgres = sheaf_testenv::require_postgres!("postgres_queue_and_clickhouse_log");
    let clickhouse = sheaf_testenv::require_clickhouse!("postgres_queue_and_clickhouse_log");
    let schema = sheaf_testenv::unique_name("srv");
    let database = sheaf_testenv::unique_name("srv");
    let mut env = env_with(&OUTAGE_SETTINGS);
    for (k, v) in [
        ("SHEAF_QUEUE", "postgres"),
        ("SHEAF_LOG_STORE", "clickhouse"),
        ("SHEAF_POSTGRES_URL", postgres.as_str()),
        ("SHEAF_POSTGRES_SCHEMA", schema.as_str()),
        ("SHEAF_CLICKHOUSE_URL", clickhouse.as_str()),
        ("SHEAF_CLICKHOUSE_DATABASE", database.as_str()),
    ] {
        env.insert(k.to_owned(), v.to_owned());
    }
    let report = outage_run(env, "pgch", 2_000).await;
    check_report("postgres queue + clickhouse log", &report);
}

/// The same run with the log on a ClickHouse cluster of 2 shards × 2 replicas (`cargo xtask
/// services up --cluster`), queried through its first node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_queue_and_a_clickhouse_cluster_deliver_every_event_through_an_outage() {
    let postgres = sheaf_testenv::require_postgres!("postgres_queue_and_a_clickhouse_cluster");
    let cluster =
        sheaf_testenv::require_clickhouse_cluster!("postgres_queue_and_a_clickhouse_cluster");
    let schema = sheaf_testenv::unique_name("srv");
    let database = sheaf_testenv::unique_name("srv");
    let nodes = cluster.nodes.join(",");
    let mut env = env_with(&OUTAGE_SETTINGS);
    for (k, v) in [
        ("SHEAF_QUEUE", "postgres"),
        ("SHEAF_LOG_STORE", "clickhouse"),
        ("SHEAF_POSTGRES_URL", postgres.as_str()),
        ("SHEAF_POSTGRES_SCHEMA", schema.as_str()),
        ("SHEAF_CLICKHOUSE_URL", cluster.nodes[0].as_str()),
        ("SHEAF_CLICKHOUSE_DATABASE", database.as_str()),
        ("SHEAF_CLICKHOUSE_CLUSTER", cluster.name.as_str()),
        ("SHEAF_CLICKHOUSE_CLUSTER_NODES", nodes.as_str()),
    ] {
        env.insert(k.to_owned(), v.to_owned());
    }
    let report = outage_run(env, "pgchc", 2_000).await;
    check_report("postgres queue + clickhouse cluster log", &report);
}

/// The JetStream queue on the shared NATS server (one replica; Debian's nats-server, before
/// 2.12, so without the bucket's outbox: publishes write to ClickHouse first) with the
/// ClickHouse log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jetstream_queue_and_clickhouse_log_deliver_every_event_through_an_outage() {
    let postgres = sheaf_testenv::require_postgres!("jetstream_queue_and_clickhouse_log");
    let clickhouse = sheaf_testenv::require_clickhouse!("jetstream_queue_and_clickhouse_log");
    let nats = sheaf_testenv::require_nats!("jetstream_queue_and_clickhouse_log");
    jetstream_and_clickhouse_through_an_outage(&postgres, &clickhouse, &nats, "1", "jsch").await;
}

/// The same on the 3-node JetStream cluster with 3 replicas, whose servers (2.12 and later)
/// keep the outbox in the bucket: publishes and attempts reach ClickHouse through shipments.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jetstream_outbox_and_clickhouse_log_deliver_every_event_through_an_outage() {
    let postgres = sheaf_testenv::require_postgres!("jetstream_outbox_and_clickhouse_log");
    let clickhouse = sheaf_testenv::require_clickhouse!("jetstream_outbox_and_clickhouse_log");
    let nats = sheaf_testenv::require_nats_cluster!("jetstream_outbox_and_clickhouse_log");
    let urls = nats.join(",");
    jetstream_and_clickhouse_through_an_outage(&postgres, &clickhouse, &urls, "3", "jsob").await;
}

async fn jetstream_and_clickhouse_through_an_outage(
    postgres: &str,
    clickhouse: &str,
    nats: &str,
    replicas: &str,
    label: &str,
) {
    let schema = sheaf_testenv::unique_name("srv");
    let database = sheaf_testenv::unique_name("srv");
    let bucket = sheaf_testenv::unique_name("jobs");
    let mut env = env_with(&OUTAGE_SETTINGS);
    for (k, v) in [
        ("SHEAF_QUEUE", "jetstream"),
        ("SHEAF_LOG_STORE", "clickhouse"),
        ("SHEAF_POSTGRES_URL", postgres),
        ("SHEAF_POSTGRES_SCHEMA", schema.as_str()),
        ("SHEAF_CLICKHOUSE_URL", clickhouse),
        ("SHEAF_CLICKHOUSE_DATABASE", database.as_str()),
        ("SHEAF_JETSTREAM_URLS", nats),
        ("SHEAF_JETSTREAM_BUCKET", bucket.as_str()),
        ("SHEAF_JETSTREAM_REPLICAS", replicas),
    ] {
        env.insert(k.to_owned(), v.to_owned());
    }
    let report = outage_run(env, label, 2_000).await;
    check_report(
        &format!("jetstream queue ({label}) + clickhouse log"),
        &report,
    );
}

/// Three processes share a JetStream queue kept on 3 servers (`cargo xtask services up
/// --cluster`), with the log in Postgres, through a receiver outage: every event is delivered
/// once, and each process delivers some. A second success for an event would mean two processes
/// held one job at once (a server that does not serialize compare-and-set writes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_on_a_jetstream_cluster_deliver_every_event() {
    let postgres = sheaf_testenv::require_postgres!("three_processes_on_a_jetstream_cluster");
    let nats = sheaf_testenv::require_nats_cluster!("three_processes_on_a_jetstream_cluster");
    let schema = sheaf_testenv::unique_name("srv");
    let bucket = sheaf_testenv::unique_name("jobs");
    let urls = nats.join(",");
    let env = [
        ("SHEAF_QUEUE", "jetstream"),
        ("SHEAF_LOG_STORE", "postgres"),
        ("SHEAF_POSTGRES_URL", postgres.as_str()),
        ("SHEAF_POSTGRES_SCHEMA", schema.as_str()),
        ("SHEAF_JETSTREAM_URLS", urls.as_str()),
        ("SHEAF_JETSTREAM_BUCKET", bucket.as_str()),
        ("SHEAF_JETSTREAM_REPLICAS", "3"),
        ("SHEAF_ALLOW_PRIVATE_DESTINATIONS", "true"),
        ("SHEAF_RETRY_SCHEDULE", "1s,1s,2s"),
        ("SHEAF_RETRY_MAX_ATTEMPTS", "12"),
        ("SHEAF_QUEUE_POLL_INTERVAL", "50ms"),
        ("SHEAF_DELIVERY_WORKERS", "16"),
    ];
    let mut processes = Vec::new();
    for _ in 0..3 {
        processes.push(spawn_sheaf(&env).await);
    }
    let receiver = Receiver::builder()
        .failing(Failing::ForAfterFirst(Duration::from_secs(2)))
        .start()
        .await
        .expect("the receiver binds");
    let clients: Vec<Client> = processes.iter().map(|p| Client::new(p.addr)).collect();
    clients[0]
        .tenant_with_destination("shared", &receiver.url())
        .await;

    let (a, b, c) = tokio::join!(
        publish_many(&clients[0], "shared", "a", 400, 8),
        publish_many(&clients[1], "shared", "b", 400, 8),
        publish_many(&clients[2], "shared", "c", 400, 8)
    );
    let ids: HashSet<String> = a.union(&b).chain(c.iter()).cloned().collect();
    assert_eq!(ids.len(), 1_200);
    if !receiver.delivers_all(&ids, Duration::from_secs(90)).await {
        // What the processes said is the first thing to read.
        for process in processes {
            let exited = process.stop(Duration::from_secs(30)).await.expect("stop");
            for line in exited
                .log
                .lines()
                .filter(|l| l.contains("WARN") || l.contains("ERROR"))
            {
                println!("{line}");
            }
        }
        panic!("every event is delivered");
    }
    let mut claimed = Vec::new();
    for client in &clients {
        claimed.push(client.metric("sheaf_jobs_claimed_total").await);
    }
    println!(
        "three processes on a jetstream cluster: 1200 events, {} webhook requests, {} duplicate deliveries, jobs claimed {claimed:?}",
        receiver.deliveries().len(),
        receiver.duplicates(),
    );
    assert!(
        claimed.iter().all(|&n| n > 0.0),
        "every process delivered: {claimed:?}"
    );
    assert_eq!(receiver.duplicates(), 0, "no event is delivered twice");
    for process in processes {
        stop_clean(process).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_for_queue_and_log_delivers_every_event_through_an_outage() {
    let postgres = sheaf_testenv::require_postgres!("postgres_for_queue_and_log");
    let schema = sheaf_testenv::unique_name("srv");
    let mut env = env_with(&OUTAGE_SETTINGS);
    for (k, v) in [
        ("SHEAF_QUEUE", "postgres"),
        ("SHEAF_LOG_STORE", "postgres"),
        ("SHEAF_POSTGRES_URL", postgres.as_str()),
        ("SHEAF_POSTGRES_SCHEMA", schema.as_str()),
    ] {
        env.insert(k.to_owned(), v.to_owned());
    }
    let report = outage_run(env, "pgpg", 2_000).await;
    check_report("postgres queue + postgres log", &report);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_on_shared_postgres_and_clickhouse_lose_nothing() {
    let postgres = sheaf_testenv::require_postgres!("two_processes_on_shared_stores");
    let clickhouse = sheaf_testenv::require_clickhouse!("two_processes_on_shared_stores");
    let schema = sheaf_testenv::unique_name("srv");
    let database = sheaf_testenv::unique_name("srv");
    let env = [
        ("SHEAF_QUEUE", "postgres"),
        ("SHEAF_LOG_STORE", "clickhouse"),
        ("SHEAF_POSTGRES_URL", postgres.as_str()),
        ("SHEAF_POSTGRES_SCHEMA", schema.as_str()),
        ("SHEAF_CLICKHOUSE_URL", clickhouse.as_str()),
        ("SHEAF_CLICKHOUSE_DATABASE", database.as_str()),
        ("SHEAF_ALLOW_PRIVATE_DESTINATIONS", "true"),
        ("SHEAF_RETRY_SCHEDULE", "1s,1s,2s"),
        ("SHEAF_RETRY_MAX_ATTEMPTS", "12"),
        ("SHEAF_RETRY_LOOKUP_BATCH_SIZE", "50"),
        ("SHEAF_QUEUE_POLL_INTERVAL", "50ms"),
        ("SHEAF_DELIVERY_WORKERS", "16"),
    ];
    // One after the other: the second starts once the first listens, so it migrates a schema
    // and a database the first has already brought up to date.
    let first = spawn_sheaf(&env).await;
    let second = spawn_sheaf(&env).await;
    let receiver = Receiver::builder()
        .failing(Failing::ForAfterFirst(Duration::from_secs(2)))
        .start()
        .await
        .expect("the receiver binds");
    let a = Client::new(first.addr);
    let b = Client::new(second.addr);
    a.tenant_with_destination("shared", &receiver.url()).await;

    // Publish through both processes at once.
    let (ids_a, ids_b) = tokio::join!(
        publish_many(&a, "shared", "a", 500, 16),
        publish_many(&b, "shared", "b", 500, 16)
    );
    let ids: HashSet<String> = ids_a.union(&ids_b).cloned().collect();
    assert_eq!(ids.len(), 1_000);
    assert!(
        receiver.delivers_all(&ids, Duration::from_secs(60)).await,
        "every event is delivered"
    );
    let claimed_a = a.metric("sheaf_jobs_claimed_total").await;
    let claimed_b = b.metric("sheaf_jobs_claimed_total").await;
    println!(
        "two processes: 1000 events, {} webhook requests, {} duplicate deliveries, jobs claimed {claimed_a} + {claimed_b}",
        receiver.deliveries().len(),
        receiver.duplicates(),
    );
    assert!(
        claimed_a > 0.0 && claimed_b > 0.0,
        "both processes delivered"
    );
    stop_clean(first).await;
    stop_clean(second).await;
}
