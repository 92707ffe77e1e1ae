//! `cargo xtask services up|down|status`: the real servers the suites run against.
//!
//! `up` is idempotent: it starts only what is not running, and remembers in
//! `target/xtask/` what it started (with the PID), so that `down` stops exactly
//! that and nothing a developer started by hand.
//!
//! For the TLS suites it also keeps test certificates (`tls.rs`), serves TLS from the shared
//! Postgres with them, runs a second Postgres cluster with TLS off, and puts an HTTPS front
//! (`clickhouse_https.rs`) before the shared ClickHouse; the paths and URLs go into the same
//! env file.

pub mod clickhouse;
pub use clickhouse::venv_python;
pub mod clickhouse_https;
pub mod postgres;
pub mod tls;

use crate::process::state_dir;
use anyhow::Context;
use std::path::{Path, PathBuf};

/// The variables the test suites read.
pub const POSTGRES_URL_VAR: &str = "SHEAF_TEST_POSTGRES_URL";
pub const CLICKHOUSE_URL_VAR: &str = "SHEAF_TEST_CLICKHOUSE_URL";
/// The shared Postgres with `sslmode=verify-full` against the test CA.
pub const POSTGRES_TLS_URL_VAR: &str = "SHEAF_TEST_POSTGRES_TLS_URL";
/// A Postgres with TLS off (plain URL), for the tests that require TLS and must be refused.
pub const POSTGRES_NOTLS_URL_VAR: &str = "SHEAF_TEST_POSTGRES_NOTLS_URL";
/// The HTTPS URL of the shared ClickHouse (the same server as the HTTP one).
pub const CLICKHOUSE_HTTPS_URL_VAR: &str = "SHEAF_TEST_CLICKHOUSE_HTTPS_URL";
/// The test CA, an unrelated CA, and the server certificate and key the CA signed (PEM files).
pub const TLS_CA_FILE_VAR: &str = "SHEAF_TEST_TLS_CA_FILE";
pub const TLS_OTHER_CA_FILE_VAR: &str = "SHEAF_TEST_TLS_OTHER_CA_FILE";
pub const TLS_CERT_FILE_VAR: &str = "SHEAF_TEST_TLS_CERT_FILE";
pub const TLS_KEY_FILE_VAR: &str = "SHEAF_TEST_TLS_KEY_FILE";

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
    /// The cluster with TLS off.
    pub postgres_notls: bool,
    pub clickhouse: bool,
    /// The HTTPS front of the shared ClickHouse.
    pub clickhouse_https: bool,
}

impl Started {
    fn any(self) -> bool {
        self.postgres || self.postgres_notls || self.clickhouse || self.clickhouse_https
    }
}

impl ServicesEnv {
    pub fn print(&self) {
        println!("xtask: services are up; wrote {}", env_file().display());
        print!("{}", self.env_text());
    }

    /// `NAME=value` lines that a shell can source (`set -a; . target/xtask/services.env`):
    /// a value with a character the shell would read (the TLS URL's `&` and `?`) is quoted.
    fn env_text(&self) -> String {
        self.vars
            .iter()
            .map(|(name, value)| format!("{name}={}\n", shell_quoted(value)))
            .collect()
    }
}

fn shell_quoted(value: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "@%+=:,./-_".contains(c);
    if !value.is_empty() && value.chars().all(plain) {
        value.to_owned()
    } else {
        format!("'{}'", value.replace('\'', r"'\''"))
    }
}

pub fn env_file() -> PathBuf {
    state_dir().join("services.env")
}

/// Starts whatever is not running yet and writes the env file.
pub fn up() -> anyhow::Result<ServicesEnv> {
    std::fs::create_dir_all(state_dir()).context("cannot create target/xtask")?;
    let tls = tls::ensure().context("test certificates")?;
    let pg = postgres::up(&tls).context("postgres")?;
    let pg_notls = postgres::up_notls().context("postgres with TLS off")?;
    // Every up, not only when ClickHouse starts: the suites also need the environment's other
    // packages, and a pin added while a server kept running must still be installed.
    clickhouse::ensure_venv().context("python environment")?;
    let ch = clickhouse::up().context("clickhouse")?;
    let ch_https = clickhouse_https::up(ch.port, &tls).context("clickhouse over https")?;
    let path = |p: &Path| p.display().to_string();
    let vars = vec![
        (POSTGRES_URL_VAR, pg.url.clone()),
        (POSTGRES_TLS_URL_VAR, postgres::tls_url(&pg.url, &tls.ca)),
        (POSTGRES_NOTLS_URL_VAR, pg_notls.url),
        (CLICKHOUSE_URL_VAR, ch.url),
        (CLICKHOUSE_HTTPS_URL_VAR, ch_https.url),
        (TLS_CA_FILE_VAR, path(&tls.ca)),
        (TLS_OTHER_CA_FILE_VAR, path(&tls.other_ca)),
        (TLS_CERT_FILE_VAR, path(&tls.cert)),
        (TLS_KEY_FILE_VAR, path(&tls.key)),
    ];
    let env = ServicesEnv {
        vars,
        started: Started {
            postgres: pg.started,
            postgres_notls: pg_notls.started,
            clickhouse: ch.started,
            clickhouse_https: ch_https.started,
        },
    };
    std::fs::write(env_file(), env.env_text()).context("cannot write the env file")?;
    Ok(env)
}

/// Stops everything xtask started.
pub fn down() -> anyhow::Result<()> {
    stop(Started {
        postgres: true,
        postgres_notls: true,
        clickhouse: true,
        clickhouse_https: true,
    })
}

/// Stops the chosen services, if (and only if) xtask started them.
pub fn stop(which: Started) -> anyhow::Result<()> {
    // Stop all even if one fails, then report the first failure. The front goes before the
    // server behind it.
    type Stop = fn() -> anyhow::Result<()>;
    let steps: [(bool, &str, Stop); 4] = [
        (
            which.clickhouse_https,
            "clickhouse's https front",
            clickhouse_https::down,
        ),
        (which.clickhouse, "clickhouse", clickhouse::down),
        (
            which.postgres_notls,
            "postgres with TLS off",
            postgres::down_notls,
        ),
        (which.postgres, "postgres", postgres::down),
    ];
    let results: Vec<anyhow::Result<()>> = steps
        .into_iter()
        .filter(|(chosen, _, _)| *chosen)
        .map(|(_, what, stop)| stop().context(what))
        .collect();
    // The env file describes running servers: it goes once one of them may be gone,
    // and stays when nothing was stopped (another session still uses it).
    if which.any() {
        let _ = std::fs::remove_file(env_file());
    }
    results.into_iter().collect()
}

pub fn status() -> anyhow::Result<()> {
    tls::status()?;
    postgres::status()?;
    clickhouse::status()?;
    clickhouse_https::status()?;
    Ok(())
}
