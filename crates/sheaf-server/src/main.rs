//! `sheaf`: the binary. `sheaf serve` runs the service, `sheaf migrate` prepares the database
//! schemas, `--help` lists every setting, `--version` prints the version.

use std::process::ExitCode;

use anyhow::Context as _;
use sheaf_server::settings::{LogStoreKind, QueueKind, settings_help};
use sheaf_server::{Config, Migrate, Stores};

fn usage() -> String {
    format!(
        "sheaf {version}: event delivery with signed webhooks and coalesced database work\n\n\
         Usage: sheaf <command>\n\n\
         Commands:\n  \
         serve       run the service (memory backends and loopback by default)\n  \
         migrate     create or upgrade the Postgres and ClickHouse schemas the settings name, then exit\n  \
         --version   print the version\n  \
         --help      print this help\n\n\
         Settings (environment variables; SHEAF_CONFIG_FILE may name a TOML file with the same\n\
         settings, lower-case without SHEAF_; the environment wins):\n\n{settings}",
        version = env!("CARGO_PKG_VERSION"),
        settings = settings_help()
    )
}

fn main() -> ExitCode {
    match try_main() {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("sheaf: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn try_main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let command = match args.as_slice() {
        [] => {
            print!("{}", usage());
            anyhow::bail!("no command given: use `sheaf serve`");
        }
        [one] => one.as_str(),
        _ => anyhow::bail!("expected one command, got {args:?}; see `sheaf --help`"),
    };
    match command {
        "--help" | "-h" | "help" => {
            print!("{}", usage());
            Ok(())
        }
        "--version" | "-V" | "version" => {
            println!("sheaf {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
        "serve" | "migrate" => {
            let config = Config::from_env()?;
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .context("cannot start the tokio runtime")?;
            let telemetry = sheaf_server::telemetry::init(&config, runtime.handle().clone())?;
            let result = if command == "serve" {
                runtime.block_on(serve(config))
            } else {
                runtime.block_on(migrate(config))
            };
            telemetry.shutdown();
            result
        }
        other => anyhow::bail!("unknown command {other:?}; see `sheaf --help`"),
    }
}

async fn migrate(config: Config) -> anyhow::Result<()> {
    Stores::connect(&config, Migrate::Yes).await?;
    tracing::info!(
        log_store = ?config.log_store,
        queue = ?config.queue,
        "schemas are up to date"
    );
    Ok(())
}

async fn serve(config: Config) -> anyhow::Result<()> {
    let open_admin = config.api_key.is_none();
    let plaintext_secrets_in_postgres = config.secrets_key.is_none()
        && (config.log_store == LogStoreKind::Postgres || config.queue == QueueKind::Postgres);
    let nothing_delivers = config.delivery_workers == 0 && config.queue == QueueKind::Memory;
    let running = sheaf_server::start(config.clone()).await?;
    tracing::info!(
        addr = %running.addr,
        log_store = ?config.log_store,
        queue = ?config.queue,
        "sheaf {} is listening on http://{}",
        env!("CARGO_PKG_VERSION"),
        running.addr
    );
    if open_admin {
        tracing::warn!(
            "SHEAF_API_KEY is not set: the admin API accepts requests without a key, which is allowed only because it listens on loopback ({}); set SHEAF_API_KEY to require `Authorization: Bearer <key>`",
            running.addr
        );
    }
    if plaintext_secrets_in_postgres {
        tracing::warn!(
            "SHEAF_SECRETS_KEY is not set: destination signing secrets are stored in Postgres as they are; set it to encrypt them at rest"
        );
    }
    if nothing_delivers {
        tracing::warn!(
            "SHEAF_DELIVERY_WORKERS is 0 with the memory queue: events are accepted and queued, and nothing delivers them"
        );
    }
    wait_for_signal().await?;
    tracing::info!("stopping: no new claims, finishing in-flight deliveries");
    running.shutdown().await;
    tracing::info!("stopped");
    Ok(())
}

async fn wait_for_signal() -> anyhow::Result<()> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("cannot listen for SIGTERM")?;
    tokio::select! {
        result = tokio::signal::ctrl_c() => result.context("cannot listen for ctrl-c")?,
        _ = terminate.recv() => {}
    }
    Ok(())
}
