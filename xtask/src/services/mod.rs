//! `cargo xtask services up|down|status`: the real servers the suites run against.
//!
//! `up` is idempotent: it starts only what is not running, and remembers in
//! `target/xtask/` what it started (with the PID), so that `down` stops exactly
//! that and nothing a developer started by hand.

pub mod clickhouse;
pub use clickhouse::venv_python;
pub mod postgres;

use crate::process::state_dir;
use anyhow::Context;
use std::path::PathBuf;

/// The variables the test suites read.
pub const POSTGRES_URL_VAR: &str = "SHEAF_TEST_POSTGRES_URL";
pub const CLICKHOUSE_URL_VAR: &str = "SHEAF_TEST_CLICKHOUSE_URL";

/// What `up` found or started.
#[derive(Debug)]
pub struct ServicesEnv {
    pub vars: Vec<(&'static str, String)>,
    /// Services this call started (as opposed to found running).
    pub started: Started,
}

#[derive(Debug, Default, Clone, Copy)]
pub struct Started {
    pub postgres: bool,
    pub clickhouse: bool,
}

impl ServicesEnv {
    pub fn print(&self) {
        println!("xtask: services are up; wrote {}", env_file().display());
        for (name, value) in &self.vars {
            println!("{name}={value}");
        }
    }
}

pub fn env_file() -> PathBuf {
    state_dir().join("services.env")
}

/// Starts whatever is not running yet and writes the env file.
pub fn up() -> anyhow::Result<ServicesEnv> {
    std::fs::create_dir_all(state_dir()).context("cannot create target/xtask")?;
    let pg = postgres::up().context("postgres")?;
    // Every up, not only when ClickHouse starts: the suites also need the environment's other
    // packages, and a pin added while a server kept running must still be installed.
    clickhouse::ensure_venv().context("python environment")?;
    let ch = clickhouse::up().context("clickhouse")?;
    let vars = vec![(POSTGRES_URL_VAR, pg.url), (CLICKHOUSE_URL_VAR, ch.url)];
    let text: String = vars.iter().map(|(k, v)| format!("{k}={v}\n")).collect();
    std::fs::write(env_file(), text).context("cannot write the env file")?;
    Ok(ServicesEnv {
        vars,
        started: Started {
            postgres: pg.started,
            clickhouse: ch.started,
        },
    })
}

/// Stops everything xtask started.
pub fn down() -> anyhow::Result<()> {
    stop(Started {
        postgres: true,
        clickhouse: true,
    })
}

/// Stops the chosen services, if (and only if) xtask started them.
pub fn stop(which: Started) -> anyhow::Result<()> {
    // Stop both even if the first fails, then report the first failure.
    let ch = if which.clickhouse {
        clickhouse::down()
    } else {
        Ok(())
    };
    let pg = if which.postgres {
        postgres::down()
    } else {
        Ok(())
    };
    // The env file describes running servers: it goes once one of them may be gone,
    // and stays when nothing was stopped (another session still uses it).
    if which.clickhouse || which.postgres {
        let _ = std::fs::remove_file(env_file());
    }
    ch.context("clickhouse")?;
    pg.context("postgres")?;
    Ok(())
}

pub fn status() -> anyhow::Result<()> {
    postgres::status()?;
    clickhouse::status()?;
    Ok(())
}
