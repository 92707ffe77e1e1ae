//! Postgres 15 from Debian packages, with `wal_level = logical` for the CDC suites.
//!
//! Administrative SQL runs as the `postgres` OS user (peer authentication); the
//! suites log in over TCP as the `sheaf` role (scram password, `LOGIN REPLICATION`),
//! which Debian's default `pg_hba.conf` accepts from 127.0.0.1 for both normal and
//! replication connections.

use crate::process::{apt_install, as_root, on_path, output_of, run_captured, state_dir};
use anyhow::{Context, bail};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

pub const VERSION: &str = "15";
pub const ROLE: &str = "sheaf";
// A throwaway credential for a loopback-only test role, not a secret.
pub const PASSWORD: &str = "sheaf";
const DATABASE: &str = "sheaf_test";

pub struct Up {
    pub url: String,
    pub started: bool,
}

/// One row of `pg_lsclusters`.
#[derive(Debug)]
pub struct Cluster {
    pub version: String,
    pub name: String,
    pub port: u16,
    pub online: bool,
    pub data_dir: PathBuf,
}

impl Cluster {
    pub fn ctl(&self, action: &str) -> Command {
        let mut cmd = as_root("pg_ctlcluster");
        cmd.args([self.version.as_str(), self.name.as_str(), action]);
        cmd
    }

    /// The postmaster's PID, from its pid file (first line).
    pub fn postmaster_pid(&self) -> Option<u32> {
        let text = std::fs::read_to_string(self.data_dir.join("postmaster.pid")).ok()?;
        text.lines().next()?.trim().parse().ok()
    }

    /// Runs SQL as the `postgres` superuser and returns its unaligned, tuples-only output.
    pub fn psql(&self, database: &str, sql: &str) -> anyhow::Result<String> {
        let mut cmd = as_root("runuser");
        cmd.args(["-u", "postgres", "--", "psql", "-X", "-q", "-t", "-A"])
            .args(["-v", "ON_ERROR_STOP=1", "-p"])
            .arg(self.port.to_string())
            .args(["-d", database, "-c", sql]);
        Ok(run_captured(&mut cmd)?.trim().to_owned())
    }

    pub fn wait_ready(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let ready = output_of(
                Command::new("pg_isready")
                    .args(["-q", "-h", "127.0.0.1", "-p"])
                    .arg(self.port.to_string()),
            )
            .is_ok_and(|out| out.status.success());
            if ready {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "postgres {}/{} did not accept connections on 127.0.0.1:{} within 60 s; see /var/log/postgresql/postgresql-{}-{}.log",
                    self.version,
                    self.name,
                    self.port,
                    self.version,
                    self.name
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Creates the `sheaf` role (`LOGIN REPLICATION`) and `database` owned by it, unless they exist.
    pub fn ensure_role_and_database(&self, database: &str) -> anyhow::Result<()> {
        self.psql(
            "postgres",
            &format!(
                "DO $$ BEGIN
                   IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{ROLE}') THEN
                     CREATE ROLE {ROLE} LOGIN REPLICATION PASSWORD '{PASSWORD}';
                   END IF;
                 END $$"
            ),
        )?;
        let exists = self.psql(
            "postgres",
            &format!("SELECT 1 FROM pg_database WHERE datname = '{database}'"),
        )?;
        if exists.is_empty() {
            self.psql(
                "postgres",
                &format!("CREATE DATABASE {database} OWNER {ROLE}"),
            )?;
        }
        Ok(())
    }
}

fn marker() -> PathBuf {
    state_dir().join("postgres.started")
}

pub fn clusters() -> anyhow::Result<Vec<Cluster>> {
    let text = run_captured(Command::new("pg_lsclusters").arg("--no-header"))?;
    let mut out = Vec::new();
    for line in text.lines() {
        let cols: Vec<&str> = line.split_whitespace().collect();
        if cols.len() < 6 {
            continue;
        }
        out.push(Cluster {
            version: cols[0].to_owned(),
            name: cols[1].to_owned(),
            port: cols[2]
                .parse()
                .context("pg_lsclusters printed a non-numeric port")?,
            online: cols[3].starts_with("online"),
            data_dir: PathBuf::from(cols[5]),
        });
    }
    Ok(out)
}

/// The cluster the suites use: `15/main` when it exists, else the first 15 cluster that is
/// not the fault suite's own (`cargo xtask chaos` stops and restarts that one).
fn find_cluster() -> anyhow::Result<Option<Cluster>> {
    let mut all: Vec<Cluster> = clusters()?
        .into_iter()
        .filter(|c| c.version == VERSION && c.name != crate::chaos::POSTGRES_CLUSTER)
        .collect();
    let main = all.iter().position(|c| c.name == "main");
    Ok(match main {
        Some(i) => Some(all.swap_remove(i)),
        None => all.into_iter().next(),
    })
}

pub fn ensure_installed() -> anyhow::Result<()> {
    let server = PathBuf::from(format!("/usr/lib/postgresql/{VERSION}/bin/postgres"));
    if on_path("pg_lsclusters") && server.is_file() && on_path("pg_isready") {
        return Ok(());
    }
    apt_install(&[
        &format!("postgresql-{VERSION}"),
        &format!("postgresql-client-{VERSION}"),
    ])
    .context("postgres 15 is not installed and installing it failed")
}

pub fn up() -> anyhow::Result<Up> {
    ensure_installed()?;
    let cluster = match find_cluster()? {
        Some(c) => c,
        None => {
            println!("xtask: creating postgres cluster {VERSION}/main");
            run_captured(as_root("pg_createcluster").args([VERSION, "main"]))?;
            find_cluster()?.context("pg_createcluster ran but no cluster is listed")?
        }
    };

    let mut started = false;
    if !cluster.online {
        println!(
            "xtask: starting postgres {}/{}",
            cluster.version, cluster.name
        );
        run_captured(&mut cluster.ctl("start")).context(
            "pg_ctlcluster could not start the cluster; is the port in use? see /var/log/postgresql/",
        )?;
        started = true;
    }
    cluster.wait_ready()?;

    // Logical replication needs wal_level = logical, which only a restart applies.
    // pg_stat_statements is preloaded too so benchmarks can read per-statement cost.
    let mut restart = false;
    if cluster.psql("postgres", "SHOW wal_level")? != "logical" {
        cluster.psql("postgres", "ALTER SYSTEM SET wal_level = logical")?;
        restart = true;
    }
    let preload = cluster.psql("postgres", "SHOW shared_preload_libraries")?;
    let stat_statements = PathBuf::from(format!(
        "/usr/lib/postgresql/{VERSION}/lib/pg_stat_statements.so"
    ));
    if stat_statements.is_file() && !preload.split(',').any(|l| l.trim() == "pg_stat_statements") {
        let list = if preload.trim().is_empty() {
            "pg_stat_statements".to_owned()
        } else {
            format!("{preload},pg_stat_statements")
        };
        cluster.psql(
            "postgres",
            &format!("ALTER SYSTEM SET shared_preload_libraries = '{list}'"),
        )?;
        restart = true;
    }
    if restart {
        println!("xtask: restarting postgres to apply wal_level = logical");
        run_captured(&mut cluster.ctl("restart"))?;
        cluster.wait_ready()?;
        if cluster.psql("postgres", "SHOW wal_level")? != "logical" {
            bail!("wal_level is still not logical after a restart");
        }
    }

    cluster.ensure_role_and_database(DATABASE)?;
    cluster.psql(
        DATABASE,
        "CREATE EXTENSION IF NOT EXISTS pg_stat_statements",
    )?;

    // Remember the postmaster we are responsible for, so `down` stops that process
    // and nothing else. A second `up` keeps the first one's record.
    if started || (restart && marker().exists()) {
        let pid = cluster
            .postmaster_pid()
            .context("no postmaster.pid after start")?;
        std::fs::write(marker(), pid.to_string())?;
    }

    Ok(Up {
        url: format!(
            "postgres://{ROLE}:{PASSWORD}@127.0.0.1:{}/{DATABASE}",
            cluster.port
        ),
        started,
    })
}

pub fn down() -> anyhow::Result<()> {
    let Ok(recorded) = std::fs::read_to_string(marker()) else {
        return Ok(()); // xtask did not start Postgres: leave it alone.
    };
    let recorded: u32 = recorded.trim().parse().unwrap_or(0);
    let cluster = find_cluster()?;
    if let Some(cluster) = cluster.filter(|c| c.online) {
        if cluster.postmaster_pid() == Some(recorded) {
            println!(
                "xtask: stopping postgres {}/{} (pid {recorded})",
                cluster.version, cluster.name
            );
            run_captured(cluster.ctl("stop").args(["--", "-m", "fast"]))?;
        } else {
            println!(
                "xtask: postgres was restarted by someone else since `up` (pid {recorded} is gone); leaving it running"
            );
        }
    }
    std::fs::remove_file(marker())?;
    Ok(())
}

pub fn status() -> anyhow::Result<()> {
    if !on_path("pg_lsclusters") {
        println!("postgres:   not installed");
        return Ok(());
    }
    let ours = std::fs::read_to_string(marker()).ok();
    match find_cluster()? {
        Some(c) if c.online => println!(
            "postgres:   {}/{} online on 127.0.0.1:{} (pid {}), {}",
            c.version,
            c.name,
            c.port,
            c.postmaster_pid().map_or("?".into(), |p| p.to_string()),
            if ours.is_some() {
                "started by xtask"
            } else {
                "not started by xtask"
            }
        ),
        Some(c) => println!("postgres:   {}/{} down", c.version, c.name),
        None => println!("postgres:   no {VERSION} cluster"),
    }
    Ok(())
}
