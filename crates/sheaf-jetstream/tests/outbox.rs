//! The outbox in the bucket: its suite on the cluster, a server without atomic batches, and
//! events read by any process while they wait, after their shipment, and after a stopped
//! process's records are adopted.

use std::sync::Arc;
use std::time::Duration;

use sheaf_jetstream::JetStreamQueue;
use sheaf_store::testkit::conformance;
use sheaf_store::testkit::fixtures::{job, unique_tenant};
use sheaf_store::{Job, JobQueue, Timestamp};

use crate::{config, open, server};

/// The outbox suite on the cluster, with the memory log store as the shipments' destination:
/// with the bucket on all three servers and on one of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_conformance_on_a_three_node_cluster() {
    let urls = sheaf_testenv::require_nats_cluster!("outbox_conformance_on_a_three_node_cluster");
    for replicas in [3, 1] {
        eprintln!("outbox on {replicas} replica(s)");
        let queue = open(&config(urls.clone(), replicas)).await;
        assert!(
            queue.has_outbox(),
            "the cluster's servers store atomic batches"
        );
        let log = sheaf_memory::MemoryLogStore::default();
        conformance::run_outbox(conformance::outbox::Stores {
            outbox: &queue,
            queue: &queue,
            log: &log,
        })
        .await;
        queue.delete_bucket().await.expect("delete the bucket");
    }
}

/// A server before 2.12 cannot store an atomic batch: the queue works, without an outbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_atomic_batches_has_no_outbox() {
    let Some(server) = server("a_server_without_atomic_batches_has_no_outbox") else {
        return;
    };
    let queue = open(&config(vec![server.url()], 1)).await;
    let version = async_nats::connect(server.url())
        .await
        .expect("connect")
        .server_info()
        .version;
    let old =
        version.starts_with("2.9.") || version.starts_with("2.10.") || version.starts_with("2.11.");
    assert_eq!(queue.has_outbox(), !old, "nats-server {version}");
    if old {
        let refused = sheaf_store::Outbox::backlog(&queue).await;
        assert!(
            refused.is_err_and(|e| e.to_string().contains("2.12")),
            "the outbox says which server it needs"
        );
    }
    queue.delete_bucket().await.expect("delete the bucket");
}

/// The event `queue`'s outbox answers for `key`, if any.
async fn read_event(
    queue: &JetStreamQueue,
    key: &sheaf_store::EventKey,
) -> Option<sheaf_store::Event> {
    use sheaf_store::Outbox;
    let mut found = queue
        .get_events(std::slice::from_ref(key))
        .await
        .expect("read");
    found.remove(key)
}

/// A process delivering a job another process accepted finds the event in the bucket while it
/// waits, and in its view's memory of recent events once shipped, without the log store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_process_finds_an_event_before_and_after_its_shipment() {
    use sheaf_store::{Event, EventId, Intake, Outbox, Payload};
    let urls = sheaf_testenv::require_nats_cluster!("another_process_finds_an_event");
    let config = config(urls, 3);
    let (a, b) = (open(&config).await, open(&config).await);
    let tenant = unique_tenant("outbox-recent");
    let event = Event {
        tenant_id: tenant.clone(),
        id: EventId::new("evt-elsewhere").expect("id"),
        topic: "order.created".into(),
        time: Timestamp::now(),
        data: Payload::new(serde_json::json!({ "n": 1 })),
        trace: None,
    };
    let intake = Intake {
        event: event.clone(),
        jobs: vec![job(&tenant, Timestamp::now())]
            .into_iter()
            .map(|j| Job {
                event_id: event.id.clone(),
                ..j
            })
            .collect(),
    };
    assert_eq!(a.accept(&[intake]).await.expect("accept"), vec![true]);
    // b's view follows the stream a little behind a's write, and a claim looks only at the
    // view, so b polls as its workers would; once it claims, its view holds a's batch.
    let mut claimed = Vec::new();
    for _ in 0..100 {
        claimed = b.claim(1, Duration::from_secs(30)).await.expect("claim");
        if !claimed.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(claimed.len(), 1, "b claims the job a accepted within 2 s");
    let key = event.key();
    assert_eq!(
        read_event(&b, &key).await,
        Some(event.clone()),
        "waiting: found in the bucket"
    );
    let shipment = a
        .take(10)
        .await
        .expect("take")
        .expect("a ships its own event");
    assert_eq!(shipment.events(), std::slice::from_ref(&event));
    shipment.commit().await.expect("commit");
    assert_eq!(
        read_event(&a, &key).await,
        None,
        "shipped: gone from a's outbox"
    );
    assert_eq!(
        read_event(&b, &key).await,
        Some(event),
        "shipped: still in b's memory"
    );
    b.complete(&[claimed[0].lease]).await.expect("complete");
    drop(b);
    a.delete_bucket().await.expect("delete the bucket");
}

/// A publisher may reuse an event id once the idempotency window has passed. The process that
/// accepts it again answers with the new event, never with the old one it kept in memory from
/// another process, while it waits and once it is shipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_accepted_again_after_its_window_is_read_as_the_new_event() {
    use sheaf_store::{Event, EventId, Intake, Outbox, Payload};
    let urls = sheaf_testenv::require_nats_cluster!("an_id_accepted_again_after_its_window");
    let config = config(urls, 3);
    let (a, b) = (open(&config).await, open(&config).await);
    let tenant = unique_tenant("outbox-reused");
    let event = |n: u32| Event {
        tenant_id: tenant.clone(),
        id: EventId::new("evt-reused").expect("id"),
        topic: "order.created".into(),
        time: Timestamp::now(),
        data: Payload::new(serde_json::json!({ "n": n })),
        trace: None,
    };
    let (old, new) = (event(1), event(2));
    let key = old.key();
    let intake = |event: &Event| Intake {
        event: event.clone(),
        jobs: vec![],
    };
    assert_eq!(b.accept(&[intake(&old)]).await.expect("accept"), vec![true]);
    // a's view keeps b's event once it has read it.
    let mut seen = None;
    for _ in 0..100 {
        seen = read_event(&a, &key).await;
        if seen.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(seen.as_ref(), Some(&old), "a reads b's event");
    let shipment = b.take(10).await.expect("take").expect("b ships its event");
    shipment.commit().await.expect("commit");
    // The window passes: every key written so far is pruned.
    let later = Timestamp::now().saturating_add(Duration::from_secs(1));
    b.prune_keys(later, 1_000).await.expect("prune");
    assert_eq!(
        a.accept(&[intake(&new)]).await.expect("accept again"),
        vec![true],
        "the id is new again once its key is pruned"
    );
    assert_eq!(
        read_event(&a, &key).await,
        Some(new),
        "waiting: the new event"
    );
    let shipment = a.take(10).await.expect("take").expect("a ships its event");
    shipment.commit().await.expect("commit");
    assert_eq!(
        read_event(&a, &key).await,
        None,
        "shipped: the log store has it, not an older copy in a's memory"
    );
    drop(b);
    a.delete_bucket().await.expect("delete the bucket");
}

/// Three processes each accept events, ship their outbox to one log store, and deliver jobs of
/// any process's events, reading each event as the service does (the outbox, then the log
/// store): every event is found, whether it waits in the bucket or was shipped meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn events_are_found_by_any_process_while_they_are_shipped() {
    use sheaf_store::{Event, EventId, Intake, LogStore, Outbox, Payload, Settlement};
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let urls = sheaf_testenv::require_nats_cluster!("events_are_found_by_any_process");
    let config = config(urls, 3);
    let processes = [
        open(&config).await,
        open(&config).await,
        open(&config).await,
    ]
    .map(Arc::new);
    let log = Arc::new(sheaf_memory::MemoryLogStore::default());
    let tenant = unique_tenant("outbox-race");
    const PER_PROCESS: usize = 2_000;
    let stop = Arc::new(AtomicBool::new(false));
    let (done, missing) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut tasks = Vec::new();
    for (p, queue) in processes.iter().enumerate() {
        // The shipper.
        let (queue_s, log_s, stop_s) = (Arc::clone(queue), Arc::clone(&log), Arc::clone(&stop));
        tasks.push(tokio::spawn(async move {
            while !stop_s.load(Ordering::Relaxed) {
                if let Some(shipment) = queue_s.take(300).await.expect("take") {
                    log_s
                        .insert_many(shipment.events(), shipment.attempts())
                        .await
                        .expect("log write");
                    shipment.commit().await.expect("commit");
                } else {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        }));
        // The workers.
        for _ in 0..2 {
            let (queue_w, log_w, stop_w) = (Arc::clone(queue), Arc::clone(&log), Arc::clone(&stop));
            let (done_w, missing_w) = (Arc::clone(&done), Arc::clone(&missing));
            tasks.push(tokio::spawn(async move {
                while !stop_w.load(Ordering::Relaxed) {
                    let claimed = queue_w
                        .claim(20, Duration::from_secs(30))
                        .await
                        .expect("claim");
                    if claimed.is_empty() {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        continue;
                    }
                    let keys: Vec<_> = claimed
                        .iter()
                        .map(|c| sheaf_store::EventKey {
                            tenant_id: c.job.tenant_id.clone(),
                            event_id: c.job.event_id.clone(),
                        })
                        .collect();
                    let mut found = queue_w.get_events(&keys).await.expect("outbox read");
                    let rest: Vec<_> = keys
                        .iter()
                        .filter(|k| !found.contains_key(k))
                        .cloned()
                        .collect();
                    found.extend(log_w.get_events(&rest).await.expect("log read"));
                    for key in &keys {
                        if !found.contains_key(key) {
                            eprintln!("process {p}: event {} found nowhere", key.event_id.as_str());
                            missing_w.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    let lost = queue_w
                        .settle(&Settlement {
                            complete: claimed.iter().map(|c| c.lease).collect(),
                            ..Settlement::default()
                        })
                        .await
                        .expect("settle");
                    assert!(lost.is_empty(), "no lease lost");
                    done_w.fetch_add(claimed.len(), Ordering::Relaxed);
                }
            }));
        }
    }
    // The publishers: each process accepts its own events, 10 at a time from 4 tasks.
    let mut publishers = Vec::new();
    for (p, queue) in processes.iter().enumerate() {
        for t in 0..4 {
            let (queue, tenant) = (Arc::clone(queue), tenant.clone());
            let done_p = Arc::clone(&done);
            publishers.push(tokio::spawn(async move {
                for batch in 0..PER_PROCESS / 200 {
                    let intakes: Vec<Intake> = (0..50)
                        .map(|i| {
                            let event = Event {
                                tenant_id: tenant.clone(),
                                id: EventId::new(format!("evt-{p}-{t}-{batch}-{i}")).expect("id"),
                                topic: "order.created".into(),
                                time: Timestamp::now(),
                                data: Payload::new(serde_json::json!({ "p": p, "i": i })),
                                trace: None,
                            };
                            let job = Job {
                                event_id: event.id.clone(),
                                ..job(&tenant, Timestamp::now())
                            };
                            Intake {
                                event,
                                jobs: vec![job],
                            }
                        })
                        .collect();
                    let offer = sheaf_store::LeaseOffer {
                        max_jobs: 5,
                        lease: Duration::from_secs(30),
                    };
                    let accepted = queue.accept_leasing(&intakes, offer).await.expect("accept");
                    assert!(accepted.new.iter().all(|&n| n), "every event is new");
                    // What a process leases at intake it delivers from the event it has.
                    let lost = queue
                        .settle(&Settlement {
                            complete: accepted.leased.iter().map(|c| c.lease).collect(),
                            ..Settlement::default()
                        })
                        .await
                        .expect("settle");
                    assert!(lost.is_empty());
                    done_p.fetch_add(accepted.leased.len(), Ordering::Relaxed);
                }
            }));
        }
    }
    for publisher in publishers {
        publisher.await.expect("publisher");
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while done.load(Ordering::Relaxed) < 3 * PER_PROCESS && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.expect("task");
    }
    assert_eq!(missing.load(Ordering::Relaxed), 0, "every event is found");
    assert_eq!(
        done.load(Ordering::Relaxed),
        3 * PER_PROCESS,
        "every job is done"
    );
    for queue in processes {
        drop(queue);
    }
}

/// The records of a process that stopped before shipping them are shipped by a living one,
/// once its heartbeat is old enough, and not before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_process_records_are_shipped_by_another() {
    use sheaf_store::{Intake, Outbox};
    let urls = sheaf_testenv::require_nats_cluster!("a_stopped_process_records_are_shipped");
    let config = config(urls, 3);
    let gone = open(&config).await;
    let mut survivor = open(&config).await;
    survivor.adopt_records_after(Duration::from_secs(1));
    let tenant = unique_tenant("outbox-adopt");
    let intakes: Vec<Intake> = (0..3)
        .map(|i| Intake {
            event: sheaf_store::testkit::fixtures::event(
                &tenant,
                &format!("evt-{i}"),
                "t",
                Timestamp::now(),
            ),
            jobs: vec![],
        })
        .collect();
    gone.heartbeat(uuid::Uuid::now_v7(), Duration::from_secs(10))
        .await
        .expect("beat");
    gone.accept(&intakes).await.expect("accept");
    let survivor_process = uuid::Uuid::now_v7();
    survivor
        .heartbeat(survivor_process, Duration::from_secs(10))
        .await
        .expect("beat");
    assert!(
        survivor.take(10).await.expect("take").is_none(),
        "a living process's records are its own to ship"
    );
    drop(gone);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    survivor
        .heartbeat(survivor_process, Duration::from_secs(10))
        .await
        .expect("beat");
    let shipment = survivor
        .take(10)
        .await
        .expect("take")
        .expect("adopted records");
    let mut ids: Vec<&str> = shipment.events().iter().map(|e| e.id.as_str()).collect();
    ids.sort();
    assert_eq!(
        ids,
        ["evt-0", "evt-1", "evt-2"],
        "the stopped process's events"
    );
    shipment.commit().await.expect("commit");
    assert_eq!(
        survivor.backlog().await.expect("backlog"),
        sheaf_store::OutboxBacklog::default(),
        "nothing waits"
    );
    survivor.delete_bucket().await.expect("delete the bucket");
}
