//! Starting and stopping one `sheaf` process: its stores, the engine over them, and the HTTP
//! server in front.

use std::net::SocketAddr;

use anyhow::Context as _;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use sheaf_engine::{Engine, Migrate, Stores, Tasks};

use crate::http::extract::{App, AppState};
use crate::settings::Config;

/// A running service.
#[derive(Debug)]
pub struct Running {
    /// Where the HTTP API listens (the real port when `SHEAF_LISTEN` asked for port 0).
    pub addr: SocketAddr,
    /// The engine's handle, for tests that look at what it counts.
    pub engine: Engine,
    stop_http: CancellationToken,
    http: JoinHandle<std::io::Result<()>>,
    tasks: Tasks,
}

/// Connects the configured stores (migrating database schemas) and starts the service.
pub async fn start(config: Config) -> anyhow::Result<Running> {
    let stores = Box::pin(Stores::connect(&config.engine, Migrate::Yes)).await?;
    start_with(config, stores).await
}

/// Starts the service on the given stores.
pub async fn start_with(config: Config, stores: Stores) -> anyhow::Result<Running> {
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {} (SHEAF_LISTEN)", config.listen))?;
    let addr = listener.local_addr()?;
    // Boxed: the engine's start is a large future (stores, caches, every task it spawns), and
    // every caller would otherwise carry it inline.
    let (engine, tasks) = Box::pin(sheaf_engine::start(config.engine.clone(), stores)).await?;
    // A runner named in the settings is checked now, while a mistake can still stop start-up;
    // this binary's own runner is the one it is.
    if let sheaf_engine::TransformRunner::Command(command) = &config.engine.transforms.runner
        && let Err(e) = engine.probe_transform_runner().await
    {
        tasks.shutdown(async {}).await;
        anyhow::bail!(
            "SHEAF_TRANSFORM_RUNNER: {} does not run as a transformation runner: {e}",
            command.program.display()
        );
    }
    let router = crate::http::router(AppState::new(App {
        engine: engine.clone(),
        config,
    }));
    let stop_http = CancellationToken::new();
    let http = tokio::spawn(
        axum::serve(listener, router)
            .with_graceful_shutdown(stop_http.clone().cancelled_owned())
            .into_future(),
    );
    Ok(Running {
        addr,
        engine,
        stop_http,
        http,
        tasks,
    })
}

impl Running {
    /// Stops gracefully: the HTTP server stops accepting and finishes its requests (so every
    /// accepted publish is durable) while the engine stops its sources; then the engine stops
    /// in order ([`Tasks::shutdown`]).
    pub async fn shutdown(self) {
        let deadline = self.engine.config().shutdown_timeout;
        self.stop_http.cancel();
        let http = self.http;
        let front_door = async move {
            match tokio::time::timeout(deadline, http).await {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(err))) => {
                    tracing::warn!(error = %err, "http server stopped with an error")
                }
                Ok(Err(err)) => tracing::warn!(error = %err, "http server task failed"),
                Err(_) => tracing::warn!("http requests did not finish within {deadline:?}"),
            }
        };
        self.tasks.shutdown(front_door).await;
    }
}
