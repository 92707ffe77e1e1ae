//! The JetStream queue against real `nats-server -js` processes: the shared `JobQueue`
//! conformance suite on one server of the test's own (`sheaf-testenv`'s `NatsServer`) and on the
//! 3-node cluster, then what only a queue shared through a bucket has to show (`queue`):
//! processes that each claim from their own view, a restart that finds every job, and deletion
//! markers removed from the stream; and the outbox in the bucket (`outbox`): its suite, events
//! found by any process before and after their shipment, and a stopped process's records
//! shipped by another.
//!
//! Without `nats-server` the tests print why and pass, except under `CI`, where they fail.

mod outbox;
mod queue;

use sheaf_jetstream::{JetStreamConfig, JetStreamQueue};
use sheaf_testenv::brokers::{NatsServer, nats_server_binary};

/// A NATS server of the test's own, or `None` (skip, with a printed line) when `nats-server`
/// is not installed outside CI.
fn server(test: &str) -> Option<NatsServer> {
    if let Err(missing) = nats_server_binary() {
        assert!(
            !sheaf_testenv::in_ci(),
            "{test}: under CI nats-server must be installed: {missing:#}"
        );
        println!("skipping {test}: {missing:#}");
        return None;
    }
    Some(NatsServer::start().unwrap_or_else(|e| panic!("{test}: {e:#}")))
}

fn config(urls: Vec<String>, replicas: usize) -> JetStreamConfig {
    JetStreamConfig {
        urls,
        bucket: format!("sheaf_test_{}", uuid::Uuid::now_v7().simple()),
        replicas,
    }
}

async fn open(config: &JetStreamConfig) -> JetStreamQueue {
    JetStreamQueue::connect(config.clone())
        .await
        .expect("connect the queue")
}
