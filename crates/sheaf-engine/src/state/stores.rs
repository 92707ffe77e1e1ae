//! Connecting the stores the configuration names, and the readiness probe over them. Which
//! backends those are, and how each is opened, is decided in [`crate::backends`], the one place
//! that names them.

use crate::backends::{Around, Migrate, Stores};
use crate::config::EngineConfig;

/// Connecting reads the engine's configuration, which the backends do not know: this is where
/// the two meet (the type and the opening itself are [`crate::backends`]'s).
impl Stores {
    /// Connects the stores `config` names (see [`crate::backends`]). With [`Migrate::Yes`],
    /// each database store creates or upgrades its schema first (`sheaf serve` and
    /// `sheaf migrate` both do).
    pub async fn connect(config: &EngineConfig, migrate: Migrate) -> anyhow::Result<Self> {
        let around = Around {
            retention: &config.memory_log_retention,
            tls_ca_file: config.tls_ca_file.as_deref(),
            log_write: config.log_write,
        };
        crate::backends::open(&config.stores, &around, migrate).await
    }
}

/// What a readiness probe found: each store's ping, each bounded by a second.
#[derive(Debug)]
pub struct Readiness {
    /// The log store's ping.
    pub log: sheaf_store::Result<()>,
    /// The queue's ping.
    pub queue: sheaf_store::Result<()>,
    /// The entity store's ping.
    pub entities: sheaf_store::Result<()>,
    /// An outbox ships to the log store: its outage delays searches, not publishes and
    /// deliveries, so it is reported rather than a reason to take the process out.
    pub log_behind_outbox: bool,
}

/// How long a readiness probe waits for each store's ping before calling it unreachable.
const READY_PING_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// A store's ping, bounded by [`READY_PING_TIMEOUT`].
async fn bounded(
    ping: impl std::future::Future<Output = sheaf_store::Result<()>>,
) -> sheaf_store::Result<()> {
    tokio::time::timeout(READY_PING_TIMEOUT, ping)
        .await
        .unwrap_or_else(|_| {
            Err(sheaf_store::Error::Unavailable {
                message: format!("no answer within {READY_PING_TIMEOUT:?}"),
                source: None,
            })
        })
}

/// Pings the three stores at once. A store that is down may make a ping wait for its pool's
/// acquire timeout; a probe must get its answer sooner than that (the fault suite saw 8 of 9
/// probes time out during a Postgres outage), so each ping has its own bound.
pub(crate) async fn readiness(stores: &Stores) -> Readiness {
    let (log, queue, entities) = tokio::join!(
        bounded(stores.log.ping()),
        bounded(stores.queue.ping()),
        bounded(stores.entities.ping()),
    );
    Readiness {
        log,
        queue,
        entities,
        log_behind_outbox: stores.outbox.as_ref().is_some_and(|o| !o.is_log()),
    }
}
