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
//!
//! For the suites that deliver to message brokers it runs a RabbitMQ node (`rabbitmq.rs`) and a
//! NATS server with JetStream (`nats.rs`), both from Debian packages, as its own processes on
//! loopback ports of their own with their data in `target/xtask/`. Installing those packages
//! must not start the system-wide brokers they ship ([`install_without_starting`]).
//!
//! With `--cluster` (and always for `cargo xtask test`) it also runs a ClickHouse cluster of 2
//! shards × 2 replicas (`clickhouse_cluster.rs`) for the log store's cluster mode, and a NATS
//! JetStream cluster of 3 nodes (`nats_cluster.rs`, from the same `nats-server` package) for the
//! suites that need JetStream replicated.
//!
//! For the portal's browser tests it installs Debian's Chromium (in the same apt run as the
//! brokers) and the tests' npm packages (`browser.rs`); nothing of those runs in the background.

pub mod browser;
pub mod clickhouse;
pub use clickhouse::venv_python;
pub mod clickhouse_cluster;
pub mod clickhouse_https;
pub mod nats;
pub mod nats_cluster;
pub mod postgres;
pub mod rabbitmq;
pub mod tls;

use crate::process::{apt_install, as_root, output_of, run_captured, state_dir};
use anyhow::{Context, bail};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// The variables the test suites read: named once, in `sheaf-testenv`, which reads them.
use sheaf_testenv::{
    CLICKHOUSE_CLUSTER_NODES_VAR, CLICKHOUSE_CLUSTER_VAR, CLICKHOUSE_HTTPS_URL_VAR,
    CLICKHOUSE_URL_VAR, NATS_CLUSTER_URLS_VAR, NATS_URL_VAR, POSTGRES_NOTLS_URL_VAR,
    POSTGRES_TLS_URL_VAR, POSTGRES_URL_VAR, RABBITMQ_URL_VAR, TLS_CA_FILE_VAR, TLS_CERT_FILE_VAR,
    TLS_KEY_FILE_VAR, TLS_OTHER_CA_FILE_VAR,
};

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
    /// The RabbitMQ node (with the `epmd` it registers with).
    pub rabbitmq: bool,
    /// The NATS server with JetStream.
    pub nats: bool,
    /// The ClickHouse cluster's four nodes.
    pub clickhouse_cluster: bool,
    /// The NATS JetStream cluster's three nodes.
    pub nats_cluster: bool,
}

impl Started {
    fn any(self) -> bool {
        self.postgres
            || self.postgres_notls
            || self.clickhouse
            || self.clickhouse_https
            || self.rabbitmq
            || self.nats
            || self.clickhouse_cluster
            || self.nats_cluster
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

/// Starts whatever is not running yet (the ClickHouse and NATS clusters too when `cluster`) and
/// writes the env file.
pub fn up(cluster: bool) -> anyhow::Result<ServicesEnv> {
    std::fs::create_dir_all(state_dir()).context("cannot create target/xtask")?;
    let tls = tls::ensure().context("test certificates")?;
    let pg = postgres::up(&tls).context("postgres")?;
    let pg_notls = postgres::up_notls().context("postgres with TLS off")?;
    // Every up, not only when ClickHouse starts: the suites also need the environment's other
    // packages, and a pin added while a server kept running must still be installed.
    clickhouse::ensure_venv().context("python environment")?;
    let ch = clickhouse::up().context("clickhouse")?;
    let ch_https = clickhouse_https::up(ch.port, &tls).context("clickhouse over https")?;
    let ch_cluster = if cluster {
        Some(clickhouse_cluster::up().context("the clickhouse cluster")?)
    } else {
        None
    };
    ensure_brokers_installed().context("the message brokers' packages")?;
    let rabbit = rabbitmq::up().context("rabbitmq")?;
    let nats = nats::up().context("nats")?;
    // After the install above: the cluster's nodes are the same `nats-server`.
    let nats_cluster = if cluster {
        Some(nats_cluster::up().context("the nats cluster")?)
    } else {
        None
    };
    let browser = browser::up().context("the portal's browser tests")?;
    let path = |p: &Path| p.display().to_string();
    let mut vars = vec![
        (POSTGRES_URL_VAR, pg.url.clone()),
        (POSTGRES_TLS_URL_VAR, postgres::tls_url(&pg.url, &tls.ca)),
        (POSTGRES_NOTLS_URL_VAR, pg_notls.url),
        (CLICKHOUSE_URL_VAR, ch.url),
        (CLICKHOUSE_HTTPS_URL_VAR, ch_https.url),
        (TLS_CA_FILE_VAR, path(&tls.ca)),
        (TLS_OTHER_CA_FILE_VAR, path(&tls.other_ca)),
        (TLS_CERT_FILE_VAR, path(&tls.cert)),
        (TLS_KEY_FILE_VAR, path(&tls.key)),
        (RABBITMQ_URL_VAR, rabbit.url),
        (NATS_URL_VAR, nats.url),
    ];
    if let Some(up) = &ch_cluster {
        vars.push((
            CLICKHOUSE_CLUSTER_VAR,
            clickhouse_cluster::CLUSTER.to_owned(),
        ));
        vars.push((CLICKHOUSE_CLUSTER_NODES_VAR, up.nodes.join(",")));
    }
    if let Some(up) = &nats_cluster {
        vars.push((NATS_CLUSTER_URLS_VAR, up.urls.join(",")));
    }
    vars.extend(browser);
    let env = ServicesEnv {
        vars,
        started: Started {
            postgres: pg.started,
            postgres_notls: pg_notls.started,
            clickhouse: ch.started,
            clickhouse_https: ch_https.started,
            rabbitmq: rabbit.started,
            nats: nats.started,
            clickhouse_cluster: ch_cluster.is_some_and(|up| up.started),
            nats_cluster: nats_cluster.is_some_and(|up| up.started),
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
        rabbitmq: true,
        nats: true,
        clickhouse_cluster: true,
        nats_cluster: true,
    })
}

/// Stops the chosen services, if (and only if) xtask started them.
pub fn stop(which: Started) -> anyhow::Result<()> {
    // Stop all even if one fails, then report the first failure: in the reverse order of `up`,
    // so the front goes before the server behind it.
    type Stop = fn() -> anyhow::Result<()>;
    let steps: [(bool, &str, Stop); 8] = [
        (which.nats_cluster, "the nats cluster", nats_cluster::down),
        (
            which.clickhouse_cluster,
            "the clickhouse cluster",
            clickhouse_cluster::down,
        ),
        (which.nats, "nats", nats::down),
        (which.rabbitmq, "rabbitmq", rabbitmq::down),
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
    clickhouse_cluster::status()?;
    rabbitmq::status()?;
    nats::status()?;
    nats_cluster::status()?;
    browser::status()?;
    if left_policy() {
        println!(
            "apt:        {POLICY_RC_D} of an interrupted install is still there and keeps every service from starting; the next `up` that installs a package removes it"
        );
    }
    Ok(())
}

/// Installs whichever broker and browser packages are missing, in one apt run (one `apt-get update` on a
/// fresh machine, not two), and prints how long it took.
fn ensure_brokers_installed() -> anyhow::Result<()> {
    let mut missing: Vec<&str> = [rabbitmq::missing_package(), nats::missing_package()]
        .into_iter()
        .flatten()
        .collect();
    missing.extend(browser::missing_packages());
    if missing.is_empty() {
        return Ok(());
    }
    let started_at = Instant::now();
    install_without_starting(&missing)?;
    println!(
        "xtask: installed {} in {:.1} s",
        missing.join(" "),
        started_at.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Where Debian's `invoke-rc.d` and `deb-systemd-invoke` ask whether a maintainer script may
/// start a service; exit status 101 means "forbidden by policy".
const POLICY_RC_D: &str = "/usr/sbin/policy-rc.d";
/// The whole policy xtask writes: a file with exactly this text is one of ours.
const OUR_POLICY: &str = "#!/bin/sh
# Written by `cargo xtask services up` for the length of one apt install, then removed:
# no package may start its service meanwhile (101: forbidden by policy).
exit 101
";

/// Whether a policy of ours outlived the install it was written for (xtask was killed).
fn left_policy() -> bool {
    std::fs::read_to_string(POLICY_RC_D).is_ok_and(|text| text == OUR_POLICY)
}

/// Installs Debian packages without letting them start their services.
///
/// `rabbitmq-server`'s maintainer script starts a system-wide broker (`invoke-rc.d
/// rabbitmq-server start`, as the `rabbitmq` user on 5672 on every interface, with its own
/// cookie and data in `/var/lib/rabbitmq`), and on a systemd machine `nats-server` and
/// `erlang-base` (`epmd`) start theirs too. The suites need none of them: they use the nodes
/// xtask runs itself. Denying the start up front, with a `policy-rc.d` that exits 101 for the
/// length of the install, means no such broker ever runs, not even for the seconds between
/// the install and a stop; stopping it afterwards instead would race with a start-up that
/// outlives the maintainer script, and would stop a service by its name rather than by what
/// we know we started. A `policy-rc.d` the machine already has (Docker images ship one that
/// denies everything) is left alone when it denies the start, and is never replaced: one that
/// allows it is someone's decision, so the install stops with a message instead.
///
/// The policy does not keep systemd from starting the units the packages enabled at the next
/// boot, so on a systemd machine the installed packages' units are disabled afterwards.
/// (`erlang-base`'s `epmd.socket` stays enabled: a name server, not a broker.)
pub fn install_without_starting(packages: &[&str]) -> anyhow::Result<()> {
    let ours = if left_policy() {
        println!("xtask: reusing the {POLICY_RC_D} an interrupted install left behind");
        true
    } else if Path::new(POLICY_RC_D).exists() {
        let verdict = output_of(Command::new(POLICY_RC_D).args(["rabbitmq-server", "start"]))?;
        if verdict.status.code() != Some(101) {
            bail!(
                "{POLICY_RC_D} exists and allows services to start ({}), so installing {} would start a system-wide broker; install them by hand, stop their services, and run `cargo xtask services up` again",
                verdict.status,
                packages.join(" ")
            );
        }
        false
    } else {
        let draft = state_dir().join("policy-rc.d");
        std::fs::write(&draft, OUR_POLICY)?;
        run_captured(
            as_root("install")
                .args(["-m", "0755"])
                .arg(&draft)
                .arg(POLICY_RC_D),
        )
        .context("cannot write a policy-rc.d that keeps the install from starting brokers")?;
        let _ = std::fs::remove_file(draft);
        true
    };
    let installed = apt_install(packages);
    // Removed whether the install worked or not, and only while it is still ours.
    if ours && left_policy() {
        run_captured(as_root("rm").args(["-f", POLICY_RC_D]))
            .with_context(|| format!("cannot remove {POLICY_RC_D}; remove it by hand"))?;
    }
    installed?;
    if Path::new("/run/systemd/system").is_dir() {
        // Only the units of the packages this call installed: a broker the machine had before
        // is its owner's. Both brokers' units are named after their packages.
        for package in packages {
            let unit = format!("{package}.service");
            // Quietly: a package without a unit is no failure.
            let _ = output_of(as_root("systemctl").args(["disable", "--quiet", &unit]));
        }
    }
    Ok(())
}
