//! The Postgres stores: every trait over one pool and one schema.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use sheaf_postgres::{OutboxLayout, PostgresConfig, PostgresStores as Stores};
use sheaf_store::{EntityStore, JobQueue, LogStore, Outbox, ReplayStore};
use sheaf_tls::SslMode;

use super::PostgresSettings;

pub(super) struct PostgresStores {
    log: Arc<dyn LogStore>,
    queue: Arc<dyn JobQueue>,
    entities: Arc<dyn EntityStore>,
    stores: Stores,
}

impl PostgresStores {
    pub(super) fn log(&self) -> Arc<dyn LogStore> {
        Arc::clone(&self.log)
    }

    pub(super) fn queue(&self) -> Arc<dyn JobQueue> {
        Arc::clone(&self.queue)
    }

    pub(super) fn entities(&self) -> Arc<dyn EntityStore> {
        Arc::clone(&self.entities)
    }

    pub(super) fn replays(&self) -> Arc<dyn ReplayStore> {
        self.stores.replay_store()
    }

    /// The outbox: the log tables themselves when the log store is Postgres too, outbox
    /// tables shipped to the log store otherwise.
    pub(super) fn outbox(&self, in_the_log: bool) -> Arc<dyn Outbox> {
        self.stores.outbox(if in_the_log {
            OutboxLayout::InTheLog
        } else {
            OutboxLayout::Shipped
        })
    }
}

pub(super) async fn connect(
    settings: &PostgresSettings,
    ca_file: Option<&Path>,
    migrate: bool,
) -> anyhow::Result<PostgresStores> {
    let url = settings
        .url
        .as_deref()
        .context("SHEAF_POSTGRES_URL is required")?;
    let schema = settings.schema.as_str();
    let mut config = PostgresConfig::new(url).with_schema(schema);
    config.ca_file = ca_file.map(Path::to_owned);
    let tls = config
        .tls()
        .context("invalid SHEAF_POSTGRES_URL or SHEAF_TLS_CA_FILE")?;
    let stores =
        Stores::new(config).context("invalid SHEAF_POSTGRES_URL or SHEAF_POSTGRES_SCHEMA")?;
    if migrate {
        let applied = stores
            .migrate()
            .await
            .context("cannot migrate the postgres schema (SHEAF_POSTGRES_URL)")?;
        if !applied.is_empty() {
            tracing::info!(?applied, schema, "postgres migrations applied");
        }
    }
    report_encryption(&stores, tls.mode).await;
    Ok(PostgresStores {
        log: stores.log_store(),
        queue: stores.job_queue(),
        entities: stores.entity_store(),
        stores,
    })
}

/// Says in the log whether the pool's connections are encrypted: `sslmode=prefer` (the
/// default) quietly settles for plaintext when the server offers no TLS, and an operator
/// should not have to guess which happened.
async fn report_encryption(stores: &Stores, mode: SslMode) {
    let verified = match mode {
        SslMode::VerifyFull => "chain and host name",
        SslMode::VerifyCa => "chain only",
        _ => "not verified",
    };
    match stores.encryption().await {
        Ok(Some((version, cipher))) => tracing::info!(
            sslmode = %mode,
            version,
            cipher,
            certificate = verified,
            "postgres connection encrypted"
        ),
        Ok(None) if mode == SslMode::Disable => {
            tracing::info!(sslmode = %mode, "postgres connection not encrypted");
        }
        Ok(None) => tracing::warn!(
            sslmode = %mode,
            "postgres connection is NOT encrypted: the server offers no TLS and sslmode=prefer \
             accepts that; set sslmode=verify-full in SHEAF_POSTGRES_URL to insist"
        ),
        Err(e) => tracing::warn!(
            error = %e,
            "could not tell whether the postgres connection is encrypted"
        ),
    }
}
