//! Postgres 15 from Debian packages, with `wal_level = logical` for the CDC suites.
//!
//! Administrative SQL runs as the `postgres` OS user (peer authentication); the
//! suites log in over TCP as the `sheaf` role (scram password, `LOGIN REPLICATION`),
//! which Debian's default `pg_hba.conf` accepts from 127.0.0.1 for both normal and
//! replication connections. Its lines are of type `host`, which matches connections with
//! and without TLS (only `hostssl` and `hostnossl` lines choose), so the same rules serve
//! plain URLs and `sslmode=verify-full` ones; nothing is added to it.
//!
//! Two clusters: the shared one (`15/main`) serves TLS with the test server certificate
//! (`tls.rs`) beside plain connections; `15/sheaf_notls`, small and created once, has
//! `ssl = off`, so the suites can see a client that requires TLS refused by a server without it.

use super::tls;
use crate::process::{
    apt_install, as_root, on_path, output_of, port_in_use, run_captured, state_dir,
};
use anyhow::{Context, bail};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

pub const VERSION: &str = "15";
pub const ROLE: &str = "sheaf";
// A throwaway credential for a loopback-only test role, not a secret.
pub const PASSWORD: &str = "sheaf";
const DATABASE: &str = "sheaf_test";

/// The cluster with TLS off, and the port tried first when it is created.
pub const NOTLS_CLUSTER: &str = "sheaf_notls";
const NOTLS_PREFERRED_PORT: u16 = 15434;

/// The shared cluster's copies of the test server certificate and key, in its data directory
/// (which only the `postgres` OS user can read).
const TLS_CERT_NAME: &str = "sheaf-test-server.pem";
const TLS_KEY_NAME: &str = "sheaf-test-server.key";

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

    /// Starts the cluster unless it is online; `Ok(true)` when this call started it.
    pub fn start_if_down(&self) -> anyhow::Result<bool> {
        let started = !self.online;
        if started {
            println!("xtask: starting postgres {}/{}", self.version, self.name);
            run_captured(&mut self.ctl("start")).with_context(|| {
                format!(
                    "pg_ctlcluster could not start {}/{}; is port {} in use? see /var/log/postgresql/",
                    self.version, self.name, self.port
                )
            })?;
        }
        self.wait_ready()?;
        Ok(started)
    }

    /// The URL the suites log in with, as the `sheaf` role over loopback TCP.
    pub fn url(&self, database: &str) -> String {
        format!(
            "postgres://{ROLE}:{PASSWORD}@127.0.0.1:{}/{database}",
            self.port
        )
    }

    /// Creates the `sheaf` role (`LOGIN REPLICATION`, and a member of `pg_read_all_stats` so
    /// the benchmarks see every backend's activity and wait events, the checkpointer's and
    /// autovacuum's included) and `database` owned by it, unless they exist.
    pub fn ensure_role_and_database(&self, database: &str) -> anyhow::Result<()> {
        self.psql(
            "postgres",
            &format!(
                "DO $$ BEGIN
                   IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{ROLE}') THEN
                     CREATE ROLE {ROLE} LOGIN REPLICATION PASSWORD '{PASSWORD}';
                   END IF;
                   IF NOT pg_has_role('{ROLE}', 'pg_read_all_stats', 'MEMBER') THEN
                     GRANT pg_read_all_stats TO {ROLE};
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

/// Marker files: the PID of a postmaster `up` started, so `down` stops that one and nothing else.
fn marker() -> PathBuf {
    state_dir().join("postgres.started")
}

fn notls_marker() -> PathBuf {
    state_dir().join("postgres-notls.started")
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
/// none of xtask's own (`cargo xtask chaos` stops and restarts its one; the other has TLS off).
fn find_cluster() -> anyhow::Result<Option<Cluster>> {
    let own = [crate::chaos::POSTGRES_CLUSTER, NOTLS_CLUSTER];
    let mut all: Vec<Cluster> = clusters()?
        .into_iter()
        .filter(|c| c.version == VERSION && !own.contains(&c.name.as_str()))
        .collect();
    let main = all.iter().position(|c| c.name == "main");
    Ok(match main {
        Some(i) => Some(all.swap_remove(i)),
        None => all.into_iter().next(),
    })
}

/// The version-15 cluster called `name`, if it exists.
pub fn named_cluster(name: &str) -> anyhow::Result<Option<Cluster>> {
    Ok(clusters()?
        .into_iter()
        .find(|c| c.version == VERSION && c.name == name))
}

/// One of xtask's own clusters beside the shared one (the fault suite's, the TLS-off one):
/// found by name, else created once with `pg_createcluster` on a port no other cluster has,
/// with `options` (`guc=value`) in its `postgresql.conf`. `start.conf` is `manual`: nothing but
/// xtask starts it (not the machine's boot, not `pg_ctlcluster --all`), and [`find_cluster`]
/// never takes it for the shared one.
pub fn own_cluster(name: &str, preferred_port: u16, options: &[&str]) -> anyhow::Result<Cluster> {
    if let Some(cluster) = named_cluster(name)? {
        return Ok(cluster);
    }
    // A stopped cluster does not listen, but its port is still its own.
    let configured: Vec<u16> = clusters()?.iter().map(|c| c.port).collect();
    let mut port = preferred_port;
    while configured.contains(&port) || port_in_use(port) {
        port = port
            .checked_add(1)
            .context("no free port for a postgres cluster")?;
    }
    println!("xtask: creating postgres cluster {VERSION}/{name} on port {port}");
    let mut create = as_root("pg_createcluster");
    create.args([
        VERSION,
        name,
        "--port",
        &port.to_string(),
        "--start-conf",
        "manual",
    ]);
    for option in options {
        create.args(["--pgoption", option]);
    }
    run_captured(&mut create)?;
    named_cluster(name)?.context("pg_createcluster ran but the cluster is not listed")
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

/// Starts the shared cluster unless it runs, with `wal_level = logical` and TLS on.
pub fn up(tls: &tls::Files) -> anyhow::Result<Up> {
    ensure_installed()?;
    let cluster = match find_cluster()? {
        Some(c) => c,
        None => {
            println!("xtask: creating postgres cluster {VERSION}/main");
            run_captured(as_root("pg_createcluster").args([VERSION, "main"]))?;
            find_cluster()?.context("pg_createcluster ran but no cluster is listed")?
        }
    };

    let started = cluster.start_if_down()?;

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
        record_postmaster(&cluster, &marker())?;
    }
    let url = cluster.url(DATABASE);
    serve_tls(&cluster, tls, &url).context("cannot turn on TLS")?;
    Ok(Up { url, started })
}

/// The shared cluster's URL that requires TLS and checks the server's certificate against the
/// test CA and its name (`127.0.0.1`, which the certificate lists).
pub fn tls_url(url: &str, ca: &Path) -> String {
    let mut ca_param = String::new();
    for &byte in ca.as_os_str().as_encoded_bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b'/' => {
                ca_param.push(char::from(byte));
            }
            _ => {
                let _ = write!(ca_param, "%{byte:02X}");
            }
        }
    }
    format!("{url}?sslmode=verify-full&sslrootcert={ca_param}")
}

/// Serves TLS with the test server certificate, on every `up`: the certificate may have been
/// made again since the last one, and the `ssl*` settings and the files they name are read
/// again on a reload, without a restart (plain connections are unaffected). Then checks that a
/// client verifying against the test CA gets a TLS session.
fn serve_tls(cluster: &Cluster, tls: &tls::Files, url: &str) -> anyhow::Result<()> {
    let cert = cluster.data_dir.join(TLS_CERT_NAME);
    let key = cluster.data_dir.join(TLS_KEY_NAME);
    // Postgres refuses a key that its group or others may read; `install` sets owner and mode
    // as it copies.
    for (from, to, mode) in [(&tls.cert, &cert, "0644"), (&tls.key, &key, "0600")] {
        run_captured(
            as_root("install")
                .args(["-o", "postgres", "-g", "postgres", "-m", mode])
                .arg(from)
                .arg(to),
        )?;
    }
    let (cert, key) = (cert.to_string_lossy(), key.to_string_lossy());
    for (name, value) in [
        ("ssl", "on"),
        ("ssl_cert_file", &cert),
        ("ssl_key_file", &key),
    ] {
        if cluster.psql("postgres", &format!("SHOW {name}"))? != value {
            cluster.psql("postgres", &format!("ALTER SYSTEM SET {name} = '{value}'"))?;
        }
    }
    cluster.psql("postgres", "SELECT pg_reload_conf()")?;

    // The reload happens in the postmaster a moment later; until then a new connection may
    // still be served the old certificate, which verify-full rejects.
    let tls_url = tls_url(url, &tls.ca);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let answer = run_captured(
            Command::new("psql")
                .args(["-X", "-q", "-t", "-A"])
                .arg(&tls_url)
                .args([
                    "-c",
                    "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
                ]),
        );
        match answer {
            Ok(ssl) if ssl.trim() == "t" => return Ok(()),
            Ok(other) if Instant::now() > deadline => {
                bail!("a verify-full connection is not encrypted: pg_stat_ssl says {other:?}")
            }
            Err(err) if Instant::now() > deadline => {
                return Err(err.context(format!(
                    "postgres does not serve the test certificate 10 s after a reload; see /var/log/postgresql/postgresql-{}-{}.log",
                    cluster.version, cluster.name
                )));
            }
            _ => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

/// Starts the TLS-off cluster unless it runs (creating it the first time).
pub fn up_notls() -> anyhow::Result<Up> {
    ensure_installed()?;
    // Small: it only has to refuse TLS and accept a plain login.
    let options = ["ssl=off", "shared_buffers=16MB", "max_connections=20"];
    let cluster = own_cluster(NOTLS_CLUSTER, NOTLS_PREFERRED_PORT, &options)?;
    let started = cluster.start_if_down()?;
    if cluster.psql("postgres", "SHOW ssl")? != "off" {
        cluster.psql("postgres", "ALTER SYSTEM SET ssl = off")?;
        cluster.psql("postgres", "SELECT pg_reload_conf()")?;
    }
    cluster.ensure_role_and_database(DATABASE)?;
    if started {
        record_postmaster(&cluster, &notls_marker())?;
    }
    Ok(Up {
        url: cluster.url(DATABASE),
        started,
    })
}

fn record_postmaster(cluster: &Cluster, marker: &Path) -> anyhow::Result<()> {
    let pid = cluster
        .postmaster_pid()
        .context("no postmaster.pid after start")?;
    std::fs::write(marker, pid.to_string())?;
    Ok(())
}

pub fn down() -> anyhow::Result<()> {
    stop_if_ours(find_cluster()?, &marker())
}

pub fn down_notls() -> anyhow::Result<()> {
    stop_if_ours(named_cluster(NOTLS_CLUSTER)?, &notls_marker())
}

/// Stops `cluster` if its postmaster is the one `marker` recorded.
fn stop_if_ours(cluster: Option<Cluster>, marker: &Path) -> anyhow::Result<()> {
    let Ok(recorded) = std::fs::read_to_string(marker) else {
        return Ok(()); // xtask did not start it: leave it alone.
    };
    let recorded: u32 = recorded.trim().parse().unwrap_or(0);
    if let Some(cluster) = cluster.filter(|c| c.online) {
        if cluster.postmaster_pid() == Some(recorded) {
            println!(
                "xtask: stopping postgres {}/{} (pid {recorded})",
                cluster.version, cluster.name
            );
            run_captured(cluster.ctl("stop").args(["--", "-m", "fast"]))?;
        } else {
            println!(
                "xtask: postgres {}/{} was restarted by someone else since `up` (pid {recorded} is gone); leaving it running",
                cluster.version, cluster.name
            );
        }
    }
    std::fs::remove_file(marker)?;
    Ok(())
}

pub fn status() -> anyhow::Result<()> {
    if !on_path("pg_lsclusters") {
        println!("postgres:   not installed");
        return Ok(());
    }
    match find_cluster()? {
        Some(c) if c.online => {
            let tls = match c.psql("postgres", "SHOW ssl_cert_file") {
                Ok(file) if file.ends_with(TLS_CERT_NAME) => "TLS with the test certificate",
                _ => "no TLS with the test certificate (run `cargo xtask services up`)",
            };
            println!("postgres:   {}, {tls}", describe_online(&c, &marker()));
        }
        Some(c) => println!("postgres:   {}/{} down", c.version, c.name),
        None => println!("postgres:   no {VERSION} cluster"),
    }
    match named_cluster(NOTLS_CLUSTER)? {
        Some(c) if c.online => println!(
            "postgres:   {}, TLS off",
            describe_online(&c, &notls_marker())
        ),
        Some(c) => println!("postgres:   {}/{} (TLS off) down", c.version, c.name),
        None => println!("postgres:   no {VERSION}/{NOTLS_CLUSTER} cluster (TLS off) yet"),
    }
    Ok(())
}

fn describe_online(c: &Cluster, marker: &Path) -> String {
    format!(
        "{}/{} online on 127.0.0.1:{} (pid {}), {}",
        c.version,
        c.name,
        c.port,
        c.postmaster_pid().map_or("?".into(), |p| p.to_string()),
        if marker.exists() {
            "started by xtask"
        } else {
            "not started by xtask"
        }
    )
}
