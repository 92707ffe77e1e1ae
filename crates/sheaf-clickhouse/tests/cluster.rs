//! The log on a ClickHouse cluster of 2 shards × 2 replicas (`cargo xtask services up --cluster`,
//! and `cargo xtask test`): the shared suites through the `Distributed` tables, and where the rows
//! land on the nodes.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use sheaf_store::testkit::fixtures::{attempt, event, unique_tenant};
use sheaf_store::testkit::{conformance, parity};
use sheaf_store::{AttemptKey, DestinationId, Event, LogStore, Timestamp};
use sheaf_testenv::require_clickhouse_cluster;

use crate::support::TestDb;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_of_the_log_store_on_a_cluster() {
    let cluster = require_clickhouse_cluster!("conformance_of_the_log_store_on_a_cluster");
    let db = TestDb::on_cluster(cluster);
    let mut config = db.config();
    config.write.max_wait = Duration::from_millis(5);
    let store = db.store_with(config).await;
    conformance::run_log_store(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parity_of_the_log_store_on_a_cluster() {
    let cluster = require_clickhouse_cluster!("parity_of_the_log_store_on_a_cluster");
    let db = TestDb::on_cluster(cluster);
    let store: Arc<dyn LogStore> = Arc::new(db.store().await);
    parity::run(store, &parity::ParityConfig::from_env(), &[]).await;
}

/// Every node is migrated, and each event lives, with all its attempts, on both replicas of
/// exactly one shard; the events spread over both shards. A batched latest-attempt lookup is
/// one query to the Distributed table and one per shard at most (`system.query_log`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_and_its_attempts_live_on_every_replica_of_one_shard() {
    let cluster =
        require_clickhouse_cluster!("an_event_and_its_attempts_live_on_every_replica_of_one_shard");
    let nodes = cluster.nodes.len();
    let db = TestDb::on_cluster(cluster);
    let store = db.store().await;
    // Migrating again changes nothing (the distributed tables already match).
    store.migrate().await.expect("migrate again");

    let tenant = unique_tenant("cluster");
    let now = Timestamp::now();
    let events: Vec<_> = (0..40)
        .map(|i| event(&tenant, &format!("evt-{i}"), "orders", now))
        .collect();
    let destination = DestinationId::generate();
    let attempts: Vec<_> = events
        .iter()
        .flat_map(|e| [attempt(e, destination, now), attempt(e, destination, now)])
        .collect();
    store.insert_many(&events, &attempts).await.expect("insert");

    // Node by node: the migrations it recorded, and the event ids in each local table.
    let mut holders: BTreeMap<String, BTreeSet<usize>> = BTreeMap::new();
    for node in 0..nodes {
        let client = db.node_client(node);
        let versions: Vec<u32> = client
            .query("SELECT DISTINCT version FROM schema_migrations ORDER BY version")
            .fetch_all()
            .await
            .expect("versions");
        assert_eq!(versions, vec![1, 2, 3, 4], "node {node} is migrated");
        let in_events: BTreeSet<String> = client
            .query("SELECT event_id FROM events_local WHERE tenant_id = ?")
            .bind(tenant.as_str())
            .fetch_all::<String>()
            .await
            .expect("local events")
            .into_iter()
            .collect();
        let in_attempts: Vec<String> = client
            .query("SELECT event_id FROM attempts_local WHERE tenant_id = ?")
            .bind(tenant.as_str())
            .fetch_all()
            .await
            .expect("local attempts");
        for id in &in_attempts {
            assert!(
                in_events.contains(id),
                "node {node} holds an attempt of {id} but not the event"
            );
        }
        assert_eq!(
            in_attempts.len(),
            2 * in_events.len(),
            "node {node}: both attempts of each event it holds"
        );
        for id in in_events {
            holders.entry(id).or_default().insert(node);
        }
    }
    assert_eq!(holders.len(), events.len(), "every event is somewhere");
    let shards: BTreeSet<BTreeSet<usize>> = holders.values().cloned().collect();
    for held_by in &shards {
        assert_eq!(
            held_by.len(),
            2,
            "an event is on the two replicas of its shard"
        );
        let shard = held_by.iter().map(|n| n / 2).collect::<BTreeSet<_>>();
        assert_eq!(shard.len(), 1, "and on no other shard: {held_by:?}");
    }
    assert_eq!(shards.len(), 2, "40 events spread over both shards");

    // Read back through the distributed tables, as the store reads: one batched lookup, tagged so
    // each node's query log can say who ran what for it.
    let tag = sheaf_testenv::unique_name("cluster_lookup");
    let mut config = db.config();
    config.settings = vec![("log_comment".to_owned(), tag.clone())];
    let tagged = sheaf_clickhouse::ClickHouseLogStore::connect(config).expect("connect");
    let keys: Vec<_> = events
        .iter()
        .map(|e| attempts_key(e, destination, now))
        .collect();
    let latest = tagged.latest_attempts(&keys).await.expect("lookup");
    assert_eq!(latest.len(), events.len(), "every event's latest attempt");

    // One query to the Distributed table, and one per shard at most: the batch is not split by
    // shard or by key. A node logs a query once it has finished, which can come after its
    // client has the answer, so the log is read until both queries are in it (10 s at most).
    let (mut initial, mut per_shard) = (0, [0u64; 2]);
    for _ in 0..50 {
        (initial, per_shard) = (0, [0u64; 2]);
        for node in 0..nodes {
            let (first, secondary) = queries_logged(&db, node, &tag).await;
            initial += first;
            per_shard[node / 2] += secondary;
        }
        if initial > 0 && per_shard[1] > 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    println!(
        "lookup of {} keys: {initial} initial query, secondary queries per shard {per_shard:?}",
        keys.len()
    );
    assert_eq!(initial, 1, "one query per batch");
    assert!(
        per_shard.iter().all(|&n| n <= 1),
        "at most one query per shard: {per_shard:?}"
    );
    // The queried node holds shard 1 and answers it in its own query; shard 2 is asked once.
    assert_eq!(per_shard[1], 1, "the other shard is asked: {per_shard:?}");
}

/// The finished queries tagged `tag` in node `node`'s query log, after flushing it: those sent
/// by a client, and those another node sent it for a query of its own.
async fn queries_logged(db: &TestDb, node: usize, tag: &str) -> (u64, u64) {
    let client = db.node_client(node);
    client
        .query("SYSTEM FLUSH LOGS")
        .execute()
        .await
        .expect("flush");
    client
        .query(
            "SELECT countIf(is_initial_query), countIf(NOT is_initial_query) \
             FROM system.query_log WHERE type = 'QueryFinish' AND log_comment = ?",
        )
        .bind(tag)
        .fetch_one()
        .await
        .expect("query log")
}

fn attempts_key(event: &Event, destination: DestinationId, since: Timestamp) -> AttemptKey {
    AttemptKey {
        tenant_id: event.tenant_id.clone(),
        event_id: event.id.clone(),
        destination_id: destination,
        attempt_time: since,
    }
}
