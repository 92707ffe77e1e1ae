//! The job queue on NATS JetStream.

use std::sync::Arc;

use anyhow::Context as _;
use sheaf_jetstream::{JetStreamConfig, JetStreamQueue};
use sheaf_store::{JobQueue, Outbox};

use super::JetStreamSettings;

/// Connects to the servers and opens (or creates) the bucket; the error names the setting to
/// look at when the cluster cannot keep as many replicas as asked. The outbox is the bucket's
/// too when the servers store atomic batches (nats-server 2.12 and later); on older ones there
/// is none, and publishes write to the log store before they enqueue.
pub(super) async fn connect(
    settings: &JetStreamSettings,
) -> anyhow::Result<(Arc<dyn JobQueue>, Option<Arc<dyn Outbox>>)> {
    let config = JetStreamConfig {
        urls: settings.urls.clone(),
        bucket: settings.bucket.clone(),
        replicas: settings.replicas,
    };
    let queue = JetStreamQueue::connect(config).await.with_context(|| {
        format!(
            "opening the JetStream queue (SHEAF_JETSTREAM_URLS, bucket {:?} from SHEAF_JETSTREAM_BUCKET, {} replicas from SHEAF_JETSTREAM_REPLICAS: a new bucket needs that many JetStream servers)",
            settings.bucket, settings.replicas
        )
    })?;
    let queue = Arc::new(queue);
    let outbox = queue
        .has_outbox()
        .then(|| Arc::clone(&queue) as Arc<dyn Outbox>);
    if outbox.is_none() {
        tracing::warn!(
            "the NATS servers store no atomic batches (before 2.12): without an outbox in the bucket, every publish waits for the log store"
        );
    }
    tracing::info!(
        bucket = %settings.bucket,
        replicas = settings.replicas,
        outbox = outbox.is_some(),
        "the job queue is on NATS JetStream"
    );
    Ok((queue, outbox))
}
