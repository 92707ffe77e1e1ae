//! Starting and stopping one `sheaf` process: stores, core, HTTP server, delivery engine, the
//! log shipper when an outbox feeds the log store, and, when configured, the CDC source.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::delivery::Engine;
use crate::health::{HealthTask, ensure_operator_destination};
use crate::ingest::cdc::CdcRunner;
use crate::ingest::replay::ReplayKeeper;
use crate::ingest::shipper::Shipper;
use crate::settings::Config;
use crate::state::{Core, Migrate, Stores};

/// A running service.
#[derive(Debug)]
pub struct Running {
    /// Where the HTTP API listens (the real port when `SHEAF_LISTEN` asked for port 0).
    pub addr: SocketAddr,
    /// The shared state, for tests that look inside.
    pub core: Arc<Core>,
    stop_http: CancellationToken,
    http: JoinHandle<std::io::Result<()>>,
    /// `None` with `SHEAF_DELIVERY_WORKERS=0`: this process only serves the API.
    engine: Option<Engine>,
    cdc: Option<CdcRunner>,
    /// `None` unless the queue is in Postgres and the log store elsewhere.
    shipper: Option<Shipper>,
    /// `None` without automatic disabling and operator events.
    health: Option<HealthTask>,
    /// Resumes replays other processes stopped running; stops this process's replays.
    replays: ReplayKeeper,
}

/// Connects the configured stores (migrating database schemas) and starts the service.
pub async fn start(config: Config) -> anyhow::Result<Running> {
    let stores = Stores::connect(&config, Migrate::Yes).await?;
    start_with(config, stores).await
}

/// Starts the service on the given stores.
pub async fn start_with(config: Config, stores: Stores) -> anyhow::Result<Running> {
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {} (SHEAF_LISTEN)", config.listen))?;
    let addr = listener.local_addr()?;
    if let Some(webhook) = &config.operator_webhook {
        sheaf_webhook::check_url(webhook.url.as_str(), config.allow_private_destinations)
            .await
            .map_err(|e| anyhow::anyhow!("invalid SHEAF_OPERATOR_WEBHOOK_URL: {}", e.0))?;
    }
    let destinations = crate::destinations::installed(&config)?;
    let core = Core::new(config, stores, destinations)?;
    if let Some(webhook) = &core.config.operator_webhook {
        ensure_operator_destination(&core, webhook).await?;
    }
    let health = HealthTask::start(&core);
    let engine = if core.config.delivery_workers > 0 {
        Some(Engine::start(Arc::clone(&core))?)
    } else {
        None
    };
    let shipper = Shipper::start(&core);
    let replays = ReplayKeeper::start(&core);
    let cdc = core
        .config
        .cdc
        .clone()
        .map(|settings| CdcRunner::start(Arc::clone(&core), settings));
    let router = crate::http::router(Arc::clone(&core));
    let stop_http = CancellationToken::new();
    let http = tokio::spawn(
        axum::serve(listener, router)
            .with_graceful_shutdown(stop_http.clone().cancelled_owned())
            .into_future(),
    );
    Ok(Running {
        addr,
        core,
        stop_http,
        http,
        engine,
        cdc,
        shipper,
        health,
        replays,
    })
}

impl Running {
    /// Stops gracefully: the HTTP server stops accepting and finishes its requests (so every
    /// accepted publish is durable) while the CDC source stops reading, finishes the publishes
    /// under way, acknowledges them and reports its position; then the engine stops claiming,
    /// finishes in-flight deliveries up to `SHEAF_SHUTDOWN_TIMEOUT` and releases unstarted
    /// claims, then the completer, the log shipper and the write coalescer flush. Bulk replays,
    /// from the start, stop at their next page boundary and are released for another process to
    /// resume.
    pub async fn shutdown(self) {
        let deadline = self.core.config.shutdown_timeout;
        self.stop_http.cancel();
        // Both publish through the write coalescer, which closes last.
        let cdc = self.cdc;
        let stop_cdc = async move {
            if let Some(cdc) = cdc {
                cdc.shutdown(deadline).await;
            }
        };
        // Replays stop at their next page boundary and are released at once, so another
        // process resumes them within its keeper's round, and a `POST …/replay` still waiting
        // for its replay answers then instead of holding the HTTP server's shutdown.
        let replays = self.replays;
        let (http, (), ()) = tokio::join!(
            tokio::time::timeout(deadline, self.http),
            stop_cdc,
            replays.shutdown(deadline)
        );
        match http {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(err))) => tracing::warn!(error = %err, "http server stopped with an error"),
            Ok(Err(err)) => tracing::warn!(error = %err, "http server task failed"),
            Err(_) => tracing::warn!("http requests did not finish within {deadline:?}"),
        }
        if let Some(engine) = self.engine {
            engine.shutdown(deadline).await;
        }
        // The engine's last reports may publish operator events: before the shipper stops.
        if let Some(health) = self.health {
            health.shutdown(deadline).await;
        }
        // Last: every publish and settlement is in the outbox by now.
        if let Some(shipper) = self.shipper {
            shipper.shutdown(deadline).await;
        }
        self.core.close().await;
    }
}
