//! The job queue on NATS JetStream.

use std::sync::Arc;

use anyhow::Context as _;
use sheaf_jetstream::{JetStreamConfig, JetStreamQueue};
use sheaf_store::JobQueue;

use super::JetStreamSettings;

/// Connects to the servers and opens (or creates) the bucket; the error names the setting to
/// look at when the cluster cannot keep as many replicas as asked.
pub(super) async fn connect(settings: &JetStreamSettings) -> anyhow::Result<Arc<dyn JobQueue>> {
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
    tracing::info!(
        bucket = %settings.bucket,
        replicas = settings.replicas,
        "the job queue is on NATS JetStream"
    );
    Ok(Arc::new(queue))
}
