//! How the fault suite starts a `sheaf serve`: the shared child process of
//! `sheaf_testenv::process`, with exactly the settings a scenario gives it, its log in memory
//! and in `target/xtask/chaos/logs/<scenario>-<name>.log`, and its PID appended to `sheaf.pids`
//! as soon as it is spawned, from which xtask stops any survivor should this binary itself
//! die. It is stopped by its PID only (SIGTERM for a graceful stop, SIGKILL for a crash) and
//! killed when dropped, so a scenario that fails half-way never leaves one running.

use std::time::Duration;

use sheaf_testenv::process::{SheafCommand, SheafProcess};

use crate::env::Ctx;

/// How long a `sheaf` may take to listen: migrations on a cold ClickHouse take seconds.
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// How long a graceful stop may take before the process is killed and the scenario fails.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(60);

/// Starts `sheaf serve` as `name` of `scenario` with `settings` as its only `SHEAF_*`
/// variables (plus an ephemeral loopback port), and waits until it listens.
pub async fn spawn(
    ctx: &Ctx,
    scenario: &str,
    name: &str,
    settings: &[(String, String)],
) -> anyhow::Result<SheafProcess> {
    let log_path = ctx.dir.join("logs").join(format!("{scenario}-{name}.log"));
    let sheaf = SheafCommand::new(&ctx.sheaf_bin)
        .name(format!("sheaf {name}"))
        .envs(settings.iter().cloned())
        .log_file(&log_path)
        .pid_file(ctx.dir.join("sheaf.pids"))
        .start_timeout(START_TIMEOUT)
        .start()
        .await?;
    println!(
        "  sheaf {name} (pid {}) listens on {}; log in {}",
        sheaf.pid(),
        sheaf.addr,
        log_path.display()
    );
    Ok(sheaf)
}
