//! `sheaf`: the binary. `sheaf serve` runs the service, `sheaf migrate` prepares the database
//! schemas, `sheaf secrets reseal` re-seals stored credentials under the current
//! `SHEAF_SECRETS_KEY`, `sheaf backup PATH` copies the SQLite file while it serves, `--help`
//! lists every setting, `--version` prints the version. `sheaf transform-runner` is not for
//! people: the service starts it to run destinations' transformations in a process of their own.

use std::process::ExitCode;

use anyhow::Context as _;
use sheaf_engine::reseal::{MAX_BATCH, ResealOptions, reseal_configured};
use sheaf_server::settings::settings_help;
use sheaf_server::{Config, Migrate, Stores};

fn usage() -> String {
    format!(
        "sheaf {version}: event delivery with signed webhooks and coalesced database work\n\n\
         Usage: sheaf <command>\n\n\
         Commands:\n  \
         serve       run the service (the SQLite file in ./sheaf-data and loopback by default)\n  \
         migrate     create or upgrade the schemas of the stores the settings name (the SQLite\n              \
         file, Postgres, ClickHouse), then exit\n  \
         secrets reseal [--check] [--batch N]\n              \
         re-seal every stored destination credential under SHEAF_SECRETS_KEY, N per page\n              \
         (default 500), while servers keep running (on Postgres; the SQLite file's server\n              \
         must be stopped first); --check only counts what is left under another key and\n              \
         exits non-zero if any is\n  \
         backup PATH write a consistent copy of the SQLite file (SHEAF_DATA_DIR) to PATH, also\n              \
         while a server runs on it; restore by stopping the server and putting the copy in\n              \
         place of sheaf.db (without the old sheaf.db-wal and sheaf.db-shm)\n  \
         transform-runner\n              \
         run destinations' transformations for a server over standard input and output\n              \
         (the server starts it itself)\n  \
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
    let (command, rest) = match args.split_first() {
        None => {
            print!("{}", usage());
            anyhow::bail!("no command given: use `sheaf serve`");
        }
        Some((command, rest)) => (command.as_str(), rest),
    };
    if command != "secrets" && command != "backup" && !rest.is_empty() {
        anyhow::bail!("expected one command, got {args:?}; see `sheaf --help`");
    }
    match command {
        "--help" | "-h" | "help" => {
            print!("{}", usage());
            Ok(())
        }
        "--version" | "-V" | "version" => {
            println!("sheaf {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
        "transform-runner" => sheaf_transform::runner::serve_stdio()
            .context("the transformation runner stopped on a broken request"),
        "backup" => {
            let [destination] = rest else {
                anyhow::bail!("`sheaf backup` takes one argument, the path of the copy to write");
            };
            let config = Config::from_env()?;
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("cannot start the tokio runtime")?;
            let copied = runtime.block_on(sheaf_engine::backup(
                &config.engine.stores,
                std::path::Path::new(destination),
            ))?;
            println!(
                "sheaf: wrote a copy of {} to {destination}",
                copied.display()
            );
            Ok(())
        }
        "serve" | "migrate" | "secrets" => {
            // Checked before the settings, so a mistyped command is named as such.
            let reseal = if command == "secrets" {
                Some(reseal_options(rest)?)
            } else {
                None
            };
            let config = Config::from_env()?;
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .context("cannot start the tokio runtime")?;
            let telemetry = sheaf_server::telemetry::init(&config, runtime.handle().clone())?;
            // Read before tracing ran (the settings configure it), logged now that it does.
            for warning in sheaf_server::settings::deprecation_warnings(std::env::vars().collect())
            {
                tracing::warn!("{warning}");
            }
            let result = match reseal {
                Some(options) => runtime.block_on(reseal_secrets(config, options)),
                None if command == "serve" => runtime.block_on(serve(config)),
                None => runtime.block_on(migrate(config)),
            };
            telemetry.shutdown();
            result
        }
        other => anyhow::bail!("unknown command {other:?}; see `sheaf --help`"),
    }
}

/// `secrets reseal [--check] [--batch N]`.
fn reseal_options(args: &[String]) -> anyhow::Result<ResealOptions> {
    let Some((sub, flags)) = args.split_first() else {
        anyhow::bail!(
            "`sheaf secrets` needs a subcommand: `sheaf secrets reseal [--check] [--batch N]`"
        );
    };
    if sub != "reseal" {
        anyhow::bail!("unknown subcommand `sheaf secrets {sub}`; the only one is `reseal`");
    }
    let mut options = ResealOptions {
        batch: 500,
        check_only: false,
    };
    let mut flags = flags.iter();
    while let Some(flag) = flags.next() {
        match flag.as_str() {
            "--check" => options.check_only = true,
            "--batch" => {
                let raw = flags.next().context("--batch needs a number")?;
                options.batch = raw
                    .parse()
                    .ok()
                    .filter(|n| (1..=MAX_BATCH).contains(n))
                    .with_context(|| format!("--batch must be 1 to {MAX_BATCH}, got {raw:?}"))?;
            }
            other => anyhow::bail!(
                "unknown option {other:?} of `sheaf secrets reseal`; it takes --check and --batch N"
            ),
        }
    }
    Ok(options)
}

/// Re-seals (or with `--check` counts) and prints what it did; fails when anything is left
/// under another key, so a script can wait for a clean `--check`.
async fn reseal_secrets(config: Config, options: ResealOptions) -> anyhow::Result<()> {
    let Some(report) = reseal_configured(&config.engine, options).await? else {
        println!(
            "the entity store is in this process's memory (neither SHEAF_QUEUE nor SHEAF_LOG_STORE is postgres): nothing is stored across processes, so there is nothing to re-seal (every write is sealed with SHEAF_SECRETS_KEY)"
        );
        return Ok(());
    };
    for error in &report.errors {
        eprintln!("sheaf: {error}");
    }
    if options.check_only {
        println!(
            "{} destinations examined, {} hold a credential not sealed under key {} (SHEAF_SECRETS_KEY)",
            report.examined, report.remaining, report.key_id
        );
    } else {
        println!(
            "{} destinations examined, {} re-sealed under key {} (SHEAF_SECRETS_KEY), {} remain under another key or unsealed",
            report.examined, report.resealed, report.key_id, report.remaining
        );
    }
    if report.remaining > 0 {
        anyhow::bail!(
            "{} destinations still hold a credential not sealed under key {}",
            report.remaining,
            report.key_id
        );
    }
    Ok(())
}

async fn migrate(config: Config) -> anyhow::Result<()> {
    Stores::connect(&config.engine, Migrate::Yes).await?;
    tracing::info!(
        log_store = config.engine.stores.log.word(),
        queue = config.engine.stores.queue.word(),
        "schemas are up to date"
    );
    Ok(())
}

async fn serve(config: Config) -> anyhow::Result<()> {
    let open_admin = config.api_key.is_none();
    // Where secrets would be written as they are: nowhere when they stay in memory.
    let plaintext_secrets_in = match config.engine.secrets_key {
        Some(_) => None,
        None => config.engine.stores.entity_home().describe(),
    };
    // A queue only this process takes jobs from, and no worker to take them.
    let nothing_delivers =
        config.engine.delivery_workers == 0 && !config.engine.stores.queue.is_shared();
    let running = sheaf_server::start(config.clone()).await?;
    tracing::info!(
        addr = %running.addr,
        log_store = config.engine.stores.log.word(),
        queue = config.engine.stores.queue.word(),
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
    if let Some(store) = plaintext_secrets_in {
        tracing::warn!(
            "SHEAF_SECRETS_KEY is not set: destination signing secrets and config.url passwords are stored in {store} as they are; set it to encrypt them at rest"
        );
    }
    if let Some(key) = &config.engine.secrets_key {
        tracing::info!(
            key_id = key.id(),
            previous_key_id = key.previous_id(),
            "destination credentials are sealed under key {}{}",
            key.id(),
            key.previous_id()
                .map(|p| format!("; values under key {p} (SHEAF_SECRETS_KEY_PREVIOUS) still open: run `sheaf secrets reseal` once every process runs key {}", key.id()))
                .unwrap_or_default()
        );
    }
    if nothing_delivers {
        tracing::warn!(
            "SHEAF_DELIVERY_WORKERS is 0 and no other process takes jobs from SHEAF_QUEUE={}: events are accepted and queued, and nothing delivers them",
            config.engine.stores.queue.word()
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
