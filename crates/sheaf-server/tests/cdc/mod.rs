//! The CDC source against the real Postgres. Each test has its own application schema and
//! table, and a unique slot and publication, all dropped at the end, also when the test fails
//! (an abandoned slot would retain WAL forever).
//!
//! - In process, on the memory stores: inserts, updates, deletes and a truncate reach a
//!   webhook receiver as events with the right topics, ids and data, one row per message and
//!   one transaction per message; a graceful stop acknowledges and reports its position, so a
//!   restart on the same slot replays nothing; a change whose tenant does not exist yet waits
//!   unacknowledged (retried, never skipped) and is delivered once the tenant exists; a second
//!   process given the same slot waits and takes over when the first stops; a replication
//!   connection the server ends is restarted and loses nothing.
//! - End to end, the real binary on a Postgres queue and a ClickHouse log: the application
//!   writes 2,000 inserts plus updates and deletes; `sheaf` is SIGKILLed mid-stream and
//!   started again on the same slot; every change arrives and none becomes two events.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use sheaf_engine::metrics::CdcState;
use sheaf_testenv::receiver::Receiver;
use tokio::time::Instant;

use crate::support::{Client, base_env, kill, start_server, stop_clean};

mod fixture;

use fixture::{
    App, Store, all_events_once_shipped, body_json, change_key, delivered_changes, key, lsn,
    run_transaction, spawn_with, wait_metric, wait_streaming, with_app, workload,
};

/// Waits (bounded) until `$done` holds; panics with `$what` otherwise. A macro rather than a
/// function taking a closure: a closure borrowing test state, held across awaits inside a
/// spawned task, trips rustc's higher-ranked `Send` check.
macro_rules! wait_until {
    ($what:expr, $timeout:expr, $done:expr) => {{
        let timeout: Duration = $timeout;
        let deadline = Instant::now() + timeout;
        while !$done {
            assert!(
                Instant::now() < deadline,
                "{}: not within {timeout:?}",
                $what
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }};
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_reach_a_receiver_one_row_per_message() {
    let url = sheaf_testenv::require_postgres!("changes_reach_a_receiver_one_row_per_message");
    changes_reach_a_receiver(&url, false, Store::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_reach_a_receiver_one_transaction_per_message() {
    let url =
        sheaf_testenv::require_postgres!("changes_reach_a_receiver_one_transaction_per_message");
    changes_reach_a_receiver(&url, true, Store::Memory).await;
}

/// The same on the SQLite store: a transaction's events are committed in the file with their
/// jobs before the slot is acknowledged past it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_reach_a_receiver_on_the_sqlite_store() {
    let url = sheaf_testenv::require_postgres!("changes_reach_a_receiver_on_the_sqlite_store");
    changes_reach_a_receiver(&url, true, Store::Sqlite).await;
}

/// Inserts (one transaction of three rows), an update, a delete and a truncate reach the
/// receiver as six events; the slot is acknowledged past them; a graceful stop and a restart
/// on the same slot (on fresh stores, which would deliver any replay again) deliver only the
/// next change.
async fn changes_reach_a_receiver(url: &str, batch_transactions: bool, store: Store) {
    let app = App::new(url).await;
    with_app(app, move |app| async move {
        let tenant = "shop";
        let receiver = Receiver::start().await.expect("the receiver binds");
        let mut env = store.fresh();
        env.extend(app.cdc_env(tenant));
        env.insert(
            "SHEAF_CDC_BATCH_TRANSACTIONS".into(),
            batch_transactions.to_string(),
        );
        let server = start_server(env.clone()).await;
        let client = Client::new(server.addr);
        client
            .tenant_with_destination(tenant, &receiver.url())
            .await;
        wait_streaming(&server).await;

        let t = app.table();
        app.exec(&format!(
            "INSERT INTO {t} VALUES (1, 1, 'one'), (2, 1, 'two'), (3, 1, 'three')"
        ))
        .await;
        app.exec(&format!(
            "UPDATE {t} SET version = 2, note = 'uno' WHERE id = 1"
        ))
        .await;
        app.exec(&format!("DELETE FROM {t} WHERE id = 2")).await;
        app.exec(&format!("TRUNCATE {t}")).await;

        wait_until!("six events delivered", Duration::from_secs(30), {
            receiver.delivered_ids().len() >= 6
        });
        let deliveries = receiver.deliveries();
        let mut by_key: BTreeMap<(String, i64, i64), (String, Value)> = BTreeMap::new();
        for d in deliveries.iter().filter(|d| d.status == 200) {
            let body = body_json(&d.body);
            by_key.insert(change_key(&body), (d.id.clone(), body));
        }
        let keys: Vec<(String, i64, i64)> = by_key.keys().cloned().collect();
        assert_eq!(
            keys,
            [
                key("delete", 2, 0),
                key("insert", 1, 1),
                key("insert", 2, 1),
                key("insert", 3, 1),
                key("truncate", -1, 0),
                key("update", 1, 2),
            ],
            "exactly the six changes"
        );
        let prefix = format!("cdc-{}-", app.slot);
        for (id, body) in by_key.values() {
            assert!(
                id.starts_with(&prefix),
                "event id {id} starts with {prefix}"
            );
            assert_eq!(body["schema"], app.schema.as_str());
            assert_eq!(body["table"], "items");
        }
        let (_, insert) = &by_key[&key("insert", 3, 1)];
        assert_eq!(
            insert["new"],
            json!({"id": 3, "version": 1, "note": "three"})
        );
        let (_, update) = &by_key[&key("update", 1, 2)];
        assert_eq!(update["new"], json!({"id": 1, "version": 2, "note": "uno"}));
        let (_, delete) = &by_key[&key("delete", 2, 0)];
        assert_eq!(delete["old"]["id"], 2);
        assert_eq!(delete["old_kind"], "key");
        let (_, truncate) = &by_key[&key("truncate", -1, 0)];
        assert_eq!(
            (&truncate["new"], &truncate["old"]),
            (&Value::Null, &Value::Null)
        );
        // The three inserts share their transaction's commit, each at its own position.
        let inserts: Vec<&Value> = (1..=3).map(|i| &by_key[&key("insert", i, 1)].1).collect();
        assert!(
            inserts
                .iter()
                .all(|b| b["commit_lsn"] == inserts[0]["commit_lsn"])
        );
        assert_eq!(
            inserts
                .iter()
                .map(|b| b["position"].as_u64().unwrap())
                .collect::<Vec<_>>(),
            [0, 1, 2]
        );

        // The log store holds the same six events, with topic <schema>.<table>.<op>.
        let events = all_events_once_shipped(&client, tenant, 6).await;
        assert_eq!(events.len(), 6);
        for event in &events {
            let data = &event["data"];
            assert_eq!(
                event["topic"].as_str().unwrap(),
                format!("{}.items.{}", app.schema, data["op"].as_str().unwrap())
            );
            let (id, _) = &by_key[&change_key(data)];
            assert_eq!(event["id"].as_str().unwrap(), id);
        }

        // Publishers cannot choose an id in the CDC source's namespace.
        let refused = client
            .publish(
                tenant,
                &format!("{prefix}0000000000000000-00000000"),
                json!({}),
            )
            .await;
        assert_eq!(
            (refused.status, refused.error_code()),
            (400, "invalid_request")
        );

        // One acknowledgement per row, or per transaction with batch_transactions.
        let acks = if batch_transactions { 4 } else { 6 };
        let metrics = &server.engine.cdc();
        wait_until!("every message acknowledged", Duration::from_secs(10), {
            metrics.acks.load(Ordering::Relaxed) == acks
        });
        assert_eq!(metrics.changes.load(Ordering::Relaxed), 6);
        assert_eq!(metrics.events_published.load(Ordering::Relaxed), 6);
        assert_eq!(metrics.publish_failures.load(Ordering::Relaxed), 0);
        // The slot moved past the truncate's commit (its last row is stamped with the
        // commit's end), reported within the status interval.
        app.wait_confirmed_past(lsn(truncate["commit_lsn"].as_str().unwrap()))
            .await;
        let ready = client.get("/readyz").await;
        assert_eq!(ready.body["cdc"]["state"], "streaming", "{ready:?}");
        assert_eq!(client.metric("sheaf_cdc_events_published_total").await, 6.0);
        assert_eq!(client.metric("sheaf_cdc_streaming").await, 1.0);
        server.shutdown().await;

        // A restart on the same slot, on new stores: anything re-read would be a new event
        // there and be delivered a second time.
        let mut env_again = store.fresh();
        env_again.extend(env.into_iter().filter(|(k, _)| k.starts_with("SHEAF_CDC_")));
        let server = start_server(env_again).await;
        let client = Client::new(server.addr);
        client
            .tenant_with_destination(tenant, &receiver.url())
            .await;
        wait_streaming(&server).await;
        app.exec(&format!("INSERT INTO {t} VALUES (10, 1, 'ten')"))
            .await;
        wait_until!("the next change delivered", Duration::from_secs(30), {
            receiver.delivered_ids().len() >= 7
        });
        // Anything replayed would precede the new row in the stream; give stragglers a moment.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let after: Vec<(String, i64, i64)> = receiver
            .deliveries()
            .iter()
            .filter(|d| d.status == 200)
            .map(|d| change_key(&body_json(&d.body)))
            .filter(|key| !by_key.contains_key(key))
            .collect();
        assert_eq!(after, [key("insert", 10, 1)], "only the new change");
        assert_eq!(receiver.duplicates(), 0, "nothing was replayed");
        assert_eq!(
            server.engine.cdc().changes.load(Ordering::Relaxed),
            1,
            "the restarted source read one change"
        );
        server.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_for_a_missing_tenant_waits_unacknowledged_then_is_delivered() {
    let url = sheaf_testenv::require_postgres!(
        "a_change_for_a_missing_tenant_waits_unacknowledged_then_is_delivered"
    );
    let app = App::new(&url).await;
    with_app(app, |app| async move {
        let tenant = "late";
        let receiver = Receiver::start().await.expect("the receiver binds");
        let mut env = base_env();
        env.extend(app.cdc_env(tenant));
        let server = start_server(env).await;
        wait_streaming(&server).await;
        app.exec(&format!("INSERT INTO {} VALUES (1, 1, 'early')", app.table()))
            .await;

        // The tenant does not exist: every publish fails, the message is retried in place
        // (no restart), and nothing is acknowledged.
        let metrics = &server.engine.cdc();
        wait_until!("publish retried", Duration::from_secs(15), {
            metrics.publish_failures.load(Ordering::Relaxed) >= 3
        });
        let blocked_at = app.confirmed_flush_lsn().await;
        assert_eq!(metrics.acks.load(Ordering::Relaxed), 0);
        assert_eq!(metrics.restarts.load(Ordering::Relaxed), 0);

        let client = Client::new(server.addr);
        client.tenant_with_destination(tenant, &receiver.url()).await;
        wait_until!("delivered once the tenant exists", Duration::from_secs(20), {
            receiver.delivered_ids().len() == 1
        });
        let body = body_json(&receiver.deliveries()[0].body);
        assert_eq!(body["new"]["note"], "early");
        let commit = lsn(body["commit_lsn"].as_str().unwrap());
        assert!(
            blocked_at < commit,
            "while the publish failed the slot stayed before the change ({blocked_at:#x} < {commit:#x})"
        );
        app.wait_confirmed_past(commit).await;
        assert_eq!(metrics.acks.load(Ordering::Relaxed), 1);
        server.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_process_on_the_same_slot_waits_and_takes_over() {
    let url =
        sheaf_testenv::require_postgres!("a_second_process_on_the_same_slot_waits_and_takes_over");
    let app = App::new(&url).await;
    with_app(app, |app| async move {
        let tenant = "shop";
        let receiver = Receiver::start().await.expect("the receiver binds");
        let mut env = base_env();
        env.extend(app.cdc_env(tenant));
        let active = start_server(env.clone()).await;
        wait_streaming(&active).await;
        // Postgres lets one connection read a slot: the standby's starts fail and are retried.
        let standby = start_server(env).await;
        let cdc = &standby.engine.cdc();
        wait_until!("the standby retries", Duration::from_secs(20), {
            cdc.restarts.load(Ordering::Relaxed) >= 1
        });
        assert_ne!(cdc.state(), CdcState::Streaming);
        let refused = cdc.last_error().unwrap_or_default();
        assert!(refused.contains("active"), "{refused}");
        active.shutdown().await;

        wait_streaming(&standby).await;
        let client = Client::new(standby.addr);
        client
            .tenant_with_destination(tenant, &receiver.url())
            .await;
        app.exec(&format!(
            "INSERT INTO {} VALUES (1, 1, 'after')",
            app.table()
        ))
        .await;
        wait_until!("delivered by the standby", Duration::from_secs(20), {
            receiver.delivered_ids().len() == 1
        });
        standby.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_stream_restarts_and_loses_nothing() {
    let url = sheaf_testenv::require_postgres!("a_broken_stream_restarts_and_loses_nothing");
    let app = App::new(&url).await;
    with_app(app, |app| async move {
        let tenant = "shop";
        let receiver = Receiver::start().await.expect("the receiver binds");
        let mut env = base_env();
        env.extend(app.cdc_env(tenant));
        let server = start_server(env).await;
        let client = Client::new(server.addr);
        client.tenant_with_destination(tenant, &receiver.url()).await;
        wait_streaming(&server).await;
        let t = app.table();
        app.exec(&format!(
            "INSERT INTO {t} SELECT g, 1, 'a' FROM generate_series(1, 50) g"
        ))
        .await;
        wait_until!("the first 50 delivered", Duration::from_secs(30), {
            receiver.delivered_ids().len() == 50
        });

        // The server ends the replication connection under the reader's feet.
        let terminated: Vec<bool> = sqlx::query_scalar(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active",
        )
        .bind(&app.slot)
        .fetch_all(&app.pool)
        .await
        .expect("terminate the walsender");
        assert_eq!(terminated, [true]);
        app.exec(&format!(
            "INSERT INTO {t} SELECT g, 1, 'b' FROM generate_series(51, 100) g"
        ))
        .await;
        let metrics = &server.engine.cdc();
        wait_until!("the stream restarted", Duration::from_secs(20), {
            metrics.restarts.load(Ordering::Relaxed) >= 1
        });
        wait_until!("all 100 delivered", Duration::from_secs(30), {
            receiver.delivered_ids().len() == 100
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(delivered_changes(&receiver).len(), 100);
        assert_eq!(receiver.duplicates(), 0, "nothing delivered twice");
        assert_eq!(all_events_once_shipped(&client, tenant, 100).await.len(), 100);
        assert_eq!(metrics.state(), CdcState::Streaming);
        server.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkilled_mid_stream_and_restarted_no_change_is_missing_or_two_events() {
    const TEST: &str = "sigkilled_mid_stream_and_restarted_no_change_is_missing_or_two_events";
    let postgres = sheaf_testenv::require_postgres!(TEST);
    let clickhouse = sheaf_testenv::require_clickhouse!(TEST);
    let mut app = App::new(&postgres).await;
    let store_schema = sheaf_testenv::unique_name("srv");
    let database = sheaf_testenv::unique_name("srv");
    app.store_schema = Some(store_schema.clone());
    app.clickhouse = Some((clickhouse.clone(), database.clone()));
    with_app(app, move |app| async move {
        let tenant = "app";
        let receiver = Receiver::start().await.expect("the receiver binds");
        let mut env: Vec<(String, String)> = [
            ("SHEAF_QUEUE", "postgres"),
            ("SHEAF_LOG_STORE", "clickhouse"),
            ("SHEAF_POSTGRES_URL", postgres.as_str()),
            ("SHEAF_POSTGRES_SCHEMA", store_schema.as_str()),
            ("SHEAF_CLICKHOUSE_URL", clickhouse.as_str()),
            ("SHEAF_CLICKHOUSE_DATABASE", database.as_str()),
            ("SHEAF_ALLOW_PRIVATE_DESTINATIONS", "true"),
            ("SHEAF_QUEUE_POLL_INTERVAL", "50ms"),
            ("SHEAF_DELIVERY_WORKERS", "16"),
            // Jobs the killed process held come back after the lease, not 30 s later.
            ("SHEAF_DELIVERY_TIMEOUT", "2s"),
            ("SHEAF_QUEUE_LEASE", "5s"),
            ("SHEAF_RETRY_SCHEDULE", "1s"),
            ("SHEAF_RETRY_MAX_ATTEMPTS", "20"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        env.extend(app.cdc_env(tenant));
        // The first process publishes one row per message, the second whole transactions:
        // event ids come from WAL positions, not from how rows were batched, so a change
        // re-read in the other shape is still recognised. Row by row, the first process
        // takes long enough over the workload's first large transaction for the kill to
        // land inside it.
        let first = spawn_with(&env).await;
        let client = Client::new(first.addr);
        client
            .tenant_with_destination(tenant, &receiver.url())
            .await;
        wait_metric(
            &client,
            "sheaf_cdc_streaming",
            Duration::from_secs(60),
            |v| v == 1.0,
        )
        .await;

        let transactions = workload();
        let expected: BTreeSet<(String, i64, i64)> =
            transactions.iter().flatten().map(|op| op.key()).collect();
        let changes_written = transactions.iter().map(Vec::len).sum::<usize>();
        assert_eq!(expected.len(), changes_written, "every change is distinct");
        let committed = Arc::new(AtomicUsize::new(0));
        let writer = {
            let (pool, table, committed) = (app.pool.clone(), app.table(), Arc::clone(&committed));
            let transactions = transactions.clone();
            tokio::spawn(async move {
                for (i, ops) in transactions.iter().enumerate() {
                    run_transaction(&pool, &table, ops).await;
                    committed.store(i + 1, Ordering::Relaxed);
                    // Paced so the stream is still being written when the kill comes.
                    tokio::time::sleep(Duration::from_millis(60)).await;
                }
            })
        };

        // Mid-stream and mid-transaction: a quarter of the first large transaction published.
        // Postgres sends a transaction again, whole, to a reader that restarts before the
        // slot passed its commit, so the restarted process must read that quarter again and
        // recognise it as published.
        let (large, large_rows) = transactions
            .iter()
            .enumerate()
            .find(|(_, ops)| ops.len() >= 500)
            .map(|(i, ops)| (i, ops.len()))
            .expect("the workload has a large transaction");
        let before_large = transactions[..large].iter().map(Vec::len).sum::<usize>() as f64;
        let published_at_kill = wait_metric(
            &client,
            "sheaf_cdc_events_published_total",
            Duration::from_secs(90),
            |v| v >= before_large + large_rows as f64 / 4.0,
        )
        .await;
        let committed_at_kill = committed.load(Ordering::Relaxed);
        let delivered_at_kill = receiver.delivered_ids().len();
        kill(first);
        let killed = Instant::now();
        let killed_inside_large = published_at_kill < before_large + large_rows as f64;

        let mut second_env = env.clone();
        second_env.push(("SHEAF_CDC_BATCH_TRANSACTIONS".into(), "true".into()));
        let second = spawn_with(&second_env).await;
        let listening = killed.elapsed();
        let client = Client::new(second.addr);
        wait_metric(
            &client,
            "sheaf_cdc_streaming",
            Duration::from_secs(60),
            |v| v == 1.0,
        )
        .await;
        let streaming = killed.elapsed();
        wait_metric(
            &client,
            "sheaf_cdc_changes_total",
            Duration::from_secs(60),
            |v| v > 0.0,
        )
        .await;
        let first_change = killed.elapsed();

        tokio::time::timeout(Duration::from_secs(120), writer)
            .await
            .expect("the writer finishes within 120 s")
            .expect("the writer succeeds");
        let deadline = Instant::now() + Duration::from_secs(180);
        while !delivered_changes(&receiver).is_superset(&expected) {
            assert!(
                Instant::now() < deadline,
                "{} of {} changes still undelivered after 180 s; second process log:\n{}",
                expected.difference(&delivered_changes(&receiver)).count(),
                expected.len(),
                second.log()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let all_delivered = killed.elapsed();

        // No change became two events: one id per change, at the receiver and in the log.
        let deliveries = receiver.deliveries();
        let mut ids_per_change: HashMap<(String, i64, i64), BTreeSet<String>> = HashMap::new();
        for d in &deliveries {
            ids_per_change
                .entry(change_key(&body_json(&d.body)))
                .or_default()
                .insert(d.id.clone());
        }
        let split: Vec<_> = ids_per_change
            .iter()
            .filter(|(_, ids)| ids.len() > 1)
            .collect();
        assert!(
            split.is_empty(),
            "changes delivered under two event ids: {split:?}"
        );
        assert_eq!(
            delivered_changes(&receiver),
            expected,
            "exactly the changes written"
        );

        let events = all_events_once_shipped(&client, tenant, changes_written).await;
        let prefix = format!("cdc-{}-", app.slot);
        let event_ids: BTreeSet<&str> = events.iter().map(|e| e["id"].as_str().unwrap()).collect();
        let event_changes: BTreeSet<(String, i64, i64)> =
            events.iter().map(|e| change_key(&e["data"])).collect();
        assert!(event_ids.iter().all(|id| id.starts_with(&prefix)));
        assert_eq!(event_ids.len(), events.len(), "event ids are distinct");
        assert_eq!(
            events.len(),
            changes_written,
            "one event per change in the log"
        );
        assert_eq!(event_changes, expected);

        // The kill left changes read but not confirmed: the restarted process read them again
        // and found their events published (that is what the ids are for).
        let repeats_recognised = client.metric("sheaf_cdc_event_repeats_total").await;
        assert!(
            repeats_recognised > 0.0,
            "the restart re-read changes published before the kill ({published_at_kill} \
             published at the kill, the large transaction being changes {before_large}..{}: \
             {})",
            before_large + large_rows as f64,
            if killed_inside_large {
                "the kill landed inside it"
            } else {
                "the kill came after it"
            }
        );
        let requests = deliveries.len();
        let repeated = receiver.duplicates();
        println!(
            "cdc end to end (postgres queue + clickhouse log, SIGKILL mid-stream): \
             {changes_written} changes written in {} transactions (writer at {committed_at_kill} \
             when killed, {published_at_kill} events published and {delivered_at_kill} delivered \
             by then); {} events in the log; \
             {requests} webhook deliveries, {repeated} repeated (at-least-once, same webhook-id); \
             {repeats_recognised} changes re-read after the restart and recognised as published; \
             recovery after SIGKILL: listening {} ms, streaming {} ms, first change {} ms, \
             everything delivered {} ms",
            transactions.len(),
            events.len(),
            listening.as_millis(),
            streaming.as_millis(),
            first_change.as_millis(),
            all_delivered.as_millis(),
        );
        stop_clean(second).await;
    })
    .await;
}
