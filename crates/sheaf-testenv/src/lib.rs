//! What Sheaf's test suites, benchmarks and fault suite share, so each piece exists once.
//!
//! Always here, with no dependency at all (xtask uses it too, and builds on std alone): where the suites find their real servers and
//! what happens when one is missing. `cargo xtask test` starts Postgres and ClickHouse and
//! passes their URLs in `SHEAF_TEST_POSTGRES_URL` and `SHEAF_TEST_CLICKHOUSE_URL`, and the
//! Python of its virtual environment in `SHEAF_TEST_PYTHON`. A test that needs one asks here
//! first (`require_postgres!`, `require_clickhouse!`, `require_python!`). Outside CI a missing
//! variable skips the test with a printed line, so `cargo test` works on a laptop without
//! servers; under `CI` it is a failure, because a suite that silently passes without its
//! server has proved nothing. [`unique_name`] gives every run its own schema or database, and
//! [`without_sheaf_env`] keeps the caller's own `SHEAF_*` settings away from a `sheaf` it starts.
//!
//! For the TLS suites, `services up` also passes the test certificates it keeps in
//! `~/.cache/sheaf/tls/` (the CA, an unrelated CA, and a server certificate and key for
//! `127.0.0.1` and `localhost`: [`tls_files`]), the shared Postgres with
//! `sslmode=verify-full` against that CA ([`postgres_tls_url`]), a Postgres with TLS off
//! ([`postgres_notls_url`]), and ClickHouse over HTTPS ([`clickhouse_https_url`]); a missing
//! one skips outside CI and fails under it, like the plain URLs.
//!
//! For the suites that deliver to message brokers, `services up` runs a RabbitMQ node and a
//! NATS server with JetStream on loopback ([`rabbitmq_url`], [`nats_url`]), shared like the
//! databases, and with `--cluster` (always for `cargo xtask test`) a NATS JetStream cluster of 3
//! nodes ([`nats_cluster`], `require_nats_cluster!`). A test that must stop or restart a broker
//! starts one of its own instead (`brokers`, below).
//!
//! Also always here: the names of the variables xtask hands the benchmarks and the fault
//! suite (`SHEAF_BENCH_*`, `SHEAF_CHAOS_*`), and [`scenarios`], the one list of benchmark and
//! fault scenarios that xtask checks a name against and the binaries run.
//!
//! Behind features, so a suite compiles only what it uses (a module's name is its feature's,
//! but for `cdc`, and with `_` for `-`):
//! - `receiver`: `receiver::Receiver`, the loopback webhook receiver every delivery test,
//!   benchmark and fault scenario delivers to, with Standard Webhooks signature checks;
//! - `process`: `process::SheafProcess`, a `sheaf serve` child process, and readings of its
//!   memory and `/metrics`;
//! - `postgres`: `postgres::drop_replication_slot`, for every test that creates a slot;
//! - `clickhouse`: `clickhouse::time_ordered`, the attempts table Sheaf's layout is measured
//!   against, and dropping a scratch database from a destructor;
//! - `cdc`: `pgoutput`, `Relation` messages for the decoder and the reader;
//! - `brokers`: `brokers::NatsServer` and `brokers::RabbitServer`, a test's own broker
//!   process that it can stop, kill and start again on the same port with the same data, and
//!   `brokers::launch`, how every broker is launched (xtask's shared ones too);
//! - `api`: `api::Api`, the client for Sheaf's HTTP API every harness drives a `sheaf` with;
//! - `broker-clients`: `broker_clients`, the exchange, queue and stream a harness declares on
//!   the brokers Sheaf publishes to, and reading back what a stream stored.

use std::ffi::OsStr;
use std::fmt::Write as _;
use std::process::Command;

#[cfg(feature = "api")]
pub mod api;
#[cfg(feature = "broker-clients")]
pub mod broker_clients;
#[cfg(feature = "brokers")]
pub mod brokers;
#[cfg(feature = "clickhouse")]
pub mod clickhouse;
#[cfg(feature = "cdc")]
pub mod pgoutput;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "process")]
pub mod process;
#[cfg(feature = "receiver")]
pub mod receiver;
pub mod scenarios;

/// The variable that carries the Postgres URL (a `LOGIN REPLICATION` role, `wal_level = logical`).
pub const POSTGRES_URL_VAR: &str = "SHEAF_TEST_POSTGRES_URL";
/// The variable that carries the ClickHouse HTTP URL.
pub const CLICKHOUSE_URL_VAR: &str = "SHEAF_TEST_CLICKHOUSE_URL";
/// The test ClickHouse cluster's name in its nodes' `remote_servers`.
pub const CLICKHOUSE_CLUSTER_VAR: &str = "SHEAF_TEST_CLICKHOUSE_CLUSTER";
/// Every node of that cluster, as comma-separated HTTP URLs, shard by shard.
pub const CLICKHOUSE_CLUSTER_NODES_VAR: &str = "SHEAF_TEST_CLICKHOUSE_CLUSTER_NODES";
/// The shared Postgres with `?sslmode=verify-full&sslrootcert=<the test CA>`, on 127.0.0.1.
pub const POSTGRES_TLS_URL_VAR: &str = "SHEAF_TEST_POSTGRES_TLS_URL";
/// A Postgres with `ssl = off` (a plain URL): a client that requires TLS must be refused.
pub const POSTGRES_NOTLS_URL_VAR: &str = "SHEAF_TEST_POSTGRES_NOTLS_URL";
/// The shared ClickHouse over HTTPS (`https://127.0.0.1:PORT`), certified by the test CA.
pub const CLICKHOUSE_HTTPS_URL_VAR: &str = "SHEAF_TEST_CLICKHOUSE_HTTPS_URL";
/// The test CA's certificate (PEM), which signed the test servers' certificate.
pub const TLS_CA_FILE_VAR: &str = "SHEAF_TEST_TLS_CA_FILE";
/// A CA certificate (PEM) unrelated to the test servers, for "signed by a CA we do not trust".
pub const TLS_OTHER_CA_FILE_VAR: &str = "SHEAF_TEST_TLS_OTHER_CA_FILE";
/// The test server certificate (PEM, for `IP:127.0.0.1` and `DNS:localhost`, signed by the test
/// CA), for a test's own HTTPS server.
pub const TLS_CERT_FILE_VAR: &str = "SHEAF_TEST_TLS_CERT_FILE";
/// The test server certificate's private key (PEM, EC P-256, unencrypted).
pub const TLS_KEY_FILE_VAR: &str = "SHEAF_TEST_TLS_KEY_FILE";
/// The shared RabbitMQ node: `amqp://guest:guest@127.0.0.1:PORT/%2f` (the default vhost).
pub const RABBITMQ_URL_VAR: &str = "SHEAF_TEST_RABBITMQ_URL";
/// The shared NATS server, with JetStream on: `nats://127.0.0.1:PORT`.
pub const NATS_URL_VAR: &str = "SHEAF_TEST_NATS_URL";
/// The test NATS JetStream cluster (3 nodes, cluster `sheaf`): every node's client URL,
/// comma-separated, `n1` first (`nats://127.0.0.1:P1,nats://127.0.0.1:P2,nats://127.0.0.1:P3`).
pub const NATS_CLUSTER_URLS_VAR: &str = "SHEAF_TEST_NATS_CLUSTER_URLS";
/// The Python interpreter of xtask's virtual environment (has `standardwebhooks`).
pub const PYTHON_VAR: &str = "SHEAF_TEST_PYTHON";
/// Debian's Chromium (`/usr/bin/chromium`), for the portal's browser tests.
pub const CHROMIUM_VAR: &str = "SHEAF_TEST_CHROMIUM";
/// Node.js, with the portal tests' npm packages installed by xtask.
pub const NODE_VAR: &str = "SHEAF_TEST_NODE";

/// The `sheaf` binary `sheaf-bench` starts for the scenarios that spawn one (set by xtask).
pub const BENCH_SHEAF_BIN_VAR: &str = "SHEAF_BENCH_SHEAF_BIN";
/// The `sheaf` binary the fault suite starts: xtask's copy, which no rebuild can swap mid-run.
pub const CHAOS_SHEAF_BIN_VAR: &str = "SHEAF_CHAOS_SHEAF_BIN";
/// The fault suite's own Postgres (a cluster the scenarios stop and restart).
pub const CHAOS_POSTGRES_URL_VAR: &str = "SHEAF_CHAOS_POSTGRES_URL";
/// The fault suite's own ClickHouse.
pub const CHAOS_CLICKHOUSE_URL_VAR: &str = "SHEAF_CHAOS_CLICKHOUSE_URL";
/// The fault suite's own ClickHouse cluster's name in its nodes' `remote_servers`.
pub const CHAOS_CLICKHOUSE_CLUSTER_VAR: &str = "SHEAF_CHAOS_CLICKHOUSE_CLUSTER";
/// Every node of that cluster (2 shards × 2 replicas), as comma-separated HTTP URLs, shard by
/// shard. The nodes run only while a scenario has started them (`chaos-ctl clickhouse-cluster`).
pub const CHAOS_CLICKHOUSE_CLUSTER_NODES_VAR: &str = "SHEAF_CHAOS_CLICKHOUSE_CLUSTER_NODES";
/// The fault suite's own NATS JetStream cluster (3 nodes, cluster `sheaf_chaos`): every node's
/// client URL, comma-separated, `n1` first. The nodes run only while a scenario has started them
/// (`chaos-ctl nats-cluster`).
pub const CHAOS_NATS_CLUSTER_URLS_VAR: &str = "SHEAF_CHAOS_NATS_CLUSTER_URLS";
/// The xtask binary the fault suite runs as `chaos-ctl …` to stop and start its servers.
pub const CHAOS_CTL_VAR: &str = "SHEAF_CHAOS_CTL";
/// The fault suite's work directory (logs, the PIDs of the `sheaf` processes it spawned).
pub const CHAOS_DIR_VAR: &str = "SHEAF_CHAOS_DIR";

/// The prefix of every variable the `sheaf` binary reads.
pub const SHEAF_ENV_PREFIX: &str = "SHEAF_";

/// Sends SIGTERM to `pid` with the `kill` utility and returns at once: how every child a
/// harness started (a broker, a `sheaf` process) is asked to stop gracefully.
#[cfg(any(feature = "brokers", feature = "process"))]
pub(crate) fn sigterm(pid: u32) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let status = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .context("cannot run kill")?;
    anyhow::ensure!(status.success(), "kill -TERM {pid} failed ({status})");
    Ok(())
}

/// Whether we run under CI, where every server must be present.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "0" && !v.eq_ignore_ascii_case("false"))
}

/// The value of `var`, or `None` after printing why the caller skips. `needs` says what the
/// variable points at, for the messages.
///
/// # Panics
/// Under CI, when the variable is missing: the test fails instead of passing without what it
/// needs.
fn required_var(var: &str, needs: &str, test: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(value) if !value.trim().is_empty() => Some(value),
        _ if in_ci() => panic!(
            "{test}: {var} is not set, and under CI a test that needs {needs} must not skip; run the suites with `cargo xtask test`"
        ),
        _ => {
            println!(
                "skipping {test}: {var} is not set (run `cargo xtask test`, or `cargo xtask services up` and export the variables it prints)"
            );
            None
        }
    }
}

/// The value of a server variable, or `None` after printing why the caller skips.
///
/// # Panics
/// Under CI, when the variable is missing: the test fails instead of passing
/// without its server.
pub fn server_url(var: &str, test: &str) -> Option<String> {
    required_var(var, "its server", test)
}

/// The Postgres URL, or `None` (skip) outside CI. See [`server_url`].
pub fn postgres_url(test: &str) -> Option<String> {
    server_url(POSTGRES_URL_VAR, test)
}

/// The ClickHouse URL, or `None` (skip) outside CI. See [`server_url`].
pub fn clickhouse_url(test: &str) -> Option<String> {
    server_url(CLICKHOUSE_URL_VAR, test)
}

/// A ClickHouse cluster of several nodes.
#[derive(Debug, Clone)]
pub struct ClickHouseClusterEnv {
    /// Its name in the nodes' `remote_servers`.
    pub name: String,
    /// Every node's HTTP URL, shard by shard.
    pub nodes: Vec<String>,
}

/// The test ClickHouse cluster (`cargo xtask services up --cluster`, and `cargo xtask test`), or
/// `None` (skip) outside CI. See [`server_url`].
pub fn clickhouse_cluster(test: &str) -> Option<ClickHouseClusterEnv> {
    let name = required_var(CLICKHOUSE_CLUSTER_VAR, "the ClickHouse cluster", test)?;
    let nodes = required_var(CLICKHOUSE_CLUSTER_NODES_VAR, "the ClickHouse cluster", test)?;
    Some(ClickHouseClusterEnv {
        name,
        nodes: nodes.split(',').map(str::trim).map(str::to_owned).collect(),
    })
}

/// The shared Postgres over verified TLS, or `None` (skip) outside CI. See [`server_url`].
pub fn postgres_tls_url(test: &str) -> Option<String> {
    server_url(POSTGRES_TLS_URL_VAR, test)
}

/// The Postgres with TLS off, or `None` (skip) outside CI. See [`server_url`].
pub fn postgres_notls_url(test: &str) -> Option<String> {
    server_url(POSTGRES_NOTLS_URL_VAR, test)
}

/// The ClickHouse HTTPS URL, or `None` (skip) outside CI. See [`server_url`].
pub fn clickhouse_https_url(test: &str) -> Option<String> {
    server_url(CLICKHOUSE_HTTPS_URL_VAR, test)
}

/// The shared RabbitMQ's AMQP URL, or `None` (skip) outside CI. See [`server_url`].
pub fn rabbitmq_url(test: &str) -> Option<String> {
    server_url(RABBITMQ_URL_VAR, test)
}

/// The shared NATS server's URL, or `None` (skip) outside CI. See [`server_url`].
pub fn nats_url(test: &str) -> Option<String> {
    server_url(NATS_URL_VAR, test)
}

/// Every client URL of the test NATS JetStream cluster (`cargo xtask services up --cluster`, and
/// `cargo xtask test`), `n1` first, or `None` (skip) outside CI. See [`server_url`].
pub fn nats_cluster(test: &str) -> Option<Vec<String>> {
    let urls = required_var(NATS_CLUSTER_URLS_VAR, "the NATS JetStream cluster", test)?;
    Some(split_urls(&urls))
}

/// The URLs of a comma-separated list, trimmed, without empty entries.
fn split_urls(urls: &str) -> Vec<String> {
    urls.split(',')
        .map(str::trim)
        .filter(|url| !url.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The test CA's PEM file, or `None` (skip) outside CI.
///
/// # Panics
/// Under CI, when the variable is missing.
pub fn tls_ca_file(test: &str) -> Option<String> {
    required_var(TLS_CA_FILE_VAR, "the test certificates", test)
}

/// The unrelated CA's PEM file, or `None` (skip) outside CI. See [`tls_ca_file`].
pub fn tls_other_ca_file(test: &str) -> Option<String> {
    required_var(TLS_OTHER_CA_FILE_VAR, "the test certificates", test)
}

/// The test server certificate's PEM file, or `None` (skip) outside CI. See [`tls_ca_file`].
pub fn tls_cert_file(test: &str) -> Option<String> {
    required_var(TLS_CERT_FILE_VAR, "the test certificates", test)
}

/// The test server key's PEM file, or `None` (skip) outside CI. See [`tls_ca_file`].
pub fn tls_key_file(test: &str) -> Option<String> {
    required_var(TLS_KEY_FILE_VAR, "the test certificates", test)
}

/// The paths of the test certificates, all four together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The test CA (PEM), which signed `cert`.
    pub ca: String,
    /// An unrelated CA (PEM).
    pub other_ca: String,
    /// The server certificate (PEM) for `127.0.0.1` and `localhost`.
    pub cert: String,
    /// Its private key (PEM).
    pub key: String,
}

/// All four test certificate files, or `None` (skip, with a printed line for each missing
/// variable) outside CI. See [`tls_ca_file`].
pub fn tls_files(test: &str) -> Option<TlsFiles> {
    let (ca, other_ca, cert, key) = (
        tls_ca_file(test),
        tls_other_ca_file(test),
        tls_cert_file(test),
        tls_key_file(test),
    );
    Some(TlsFiles {
        ca: ca?,
        other_ca: other_ca?,
        cert: cert?,
        key: key?,
    })
}

/// The Python of xtask's virtual environment (with `standardwebhooks` and `schemathesis`), or
/// `None` (skip) outside CI; under CI a missing interpreter panics, as a missing server does.
pub fn python(test: &str) -> Option<String> {
    required_var(PYTHON_VAR, "xtask's Python", test)
}

/// What a browser test drives: Node.js (running Playwright) and Chromium.
#[derive(Debug, Clone)]
pub struct Browser {
    /// The `node` binary.
    pub node: String,
    /// The Chromium binary Playwright launches.
    pub chromium: String,
}

/// Node.js and Chromium as xtask set them up, or `None` (skip) outside CI. See [`server_url`].
pub fn browser(test: &str) -> Option<Browser> {
    Some(Browser {
        node: required_var(NODE_VAR, "Node.js with the portal tests' packages", test)?,
        chromium: required_var(CHROMIUM_VAR, "Debian's Chromium", test)?,
    })
}

/// Returns from the calling test with a printed line when Postgres is not configured
/// (outside CI), and evaluates to the URL otherwise.
#[macro_export]
macro_rules! require_postgres {
    ($test:expr) => {
        match $crate::postgres_url($test) {
            Some(url) => url,
            None => return,
        }
    };
}

/// Returns from the calling test with a printed line when ClickHouse is not configured
/// (outside CI), and evaluates to the URL otherwise.
#[macro_export]
macro_rules! require_clickhouse {
    ($test:expr) => {
        match $crate::clickhouse_url($test) {
            Some(url) => url,
            None => return,
        }
    };
}

/// Returns from the calling test with a printed line when the ClickHouse cluster is not
/// configured (outside CI), and evaluates to its [`ClickHouseClusterEnv`] otherwise.
#[macro_export]
macro_rules! require_clickhouse_cluster {
    ($test:expr) => {
        match $crate::clickhouse_cluster($test) {
            Some(cluster) => cluster,
            None => return,
        }
    };
}

/// Returns from the calling test with a printed line when RabbitMQ is not configured
/// (outside CI), and evaluates to the URL otherwise.
#[macro_export]
macro_rules! require_rabbitmq {
    ($test:expr) => {
        match $crate::rabbitmq_url($test) {
            Some(url) => url,
            None => return,
        }
    };
}

/// Returns from the calling test with a printed line when NATS is not configured
/// (outside CI), and evaluates to the URL otherwise.
#[macro_export]
macro_rules! require_nats {
    ($test:expr) => {
        match $crate::nats_url($test) {
            Some(url) => url,
            None => return,
        }
    };
}

/// Returns from the calling test with a printed line when the NATS JetStream cluster is not
/// configured (outside CI), and evaluates to its nodes' client URLs (a `Vec<String>`, `n1`
/// first) otherwise.
#[macro_export]
macro_rules! require_nats_cluster {
    ($test:expr) => {
        match $crate::nats_cluster($test) {
            Some(urls) => urls,
            None => return,
        }
    };
}

/// Returns from the calling test with a printed line when the browser is not configured
/// (outside CI), and evaluates to the [`Browser`] otherwise.
#[macro_export]
macro_rules! require_browser {
    ($test:expr) => {
        match $crate::browser($test) {
            Some(browser) => browser,
            None => return,
        }
    };
}

/// Returns from the calling test with a printed line when xtask's Python is not configured
/// (outside CI), and evaluates to the interpreter's path otherwise.
#[macro_export]
macro_rules! require_python {
    ($test:expr) => {
        match $crate::python($test) {
            Some(python) => python,
            None => return,
        }
    };
}

/// `url` with its query parameter `key` set to `value`, in place of any it had: the TLS
/// tests' variations of one server's URL (`sslmode`, `sslrootcert`).
pub fn with_query_param(url: &str, key: &str, value: &str) -> String {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let prefix = format!("{key}=");
    let mut pairs: Vec<&str> = query
        .split('&')
        .filter(|p| !p.is_empty() && !p.starts_with(&prefix))
        .collect();
    let set = format!("{key}={value}");
    pairs.push(&set);
    format!("{base}?{}", pairs.join("&"))
}

/// A name no other run uses, for a schema, database or table prefix: `prefix_` and
/// 12 random lower-case letters and digits, valid unquoted in Postgres and ClickHouse.
///
/// The randomness is std's: a [`RandomState`](std::collections::hash_map::RandomState) is
/// keyed from the operating system's random source, and hashing a process-wide counter, the
/// PID and the time with it gives 64 unpredictable bits, enough for the 62 the name holds.
/// That keeps this crate free of dependencies, so xtask can use it and still build on std only.
pub fn unique_name(prefix: &str) -> String {
    use std::hash::{BuildHasher as _, Hasher as _};
    use std::sync::atomic::{AtomicU64, Ordering};
    static CALLS: AtomicU64 = AtomicU64::new(0);
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(CALLS.fetch_add(1, Ordering::Relaxed));
    hasher.write_u32(std::process::id());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    hasher.write_u128(now.as_nanos());
    let mut bits = hasher.finish();
    let mut name = String::with_capacity(prefix.len() + 13);
    let _ = write!(name, "{prefix}_");
    for _ in 0..12 {
        name.push(ALPHABET[(bits % ALPHABET.len() as u64) as usize] as char);
        bits /= ALPHABET.len() as u64;
    }
    name
}

/// Removes from `command` every `SHEAF_*` variable this process inherited, so the `sheaf` it
/// starts sees only the settings the caller gives it: a developer's exported `SHEAF_API_KEY`,
/// or xtask's `SHEAF_TEST_*` and `SHEAF_CHAOS_*`, must never change what a test or a benchmark
/// runs. The rest of the environment (`PATH`, `HOME`, …) is inherited as usual.
pub fn without_sheaf_env(command: &mut Command) -> &mut Command {
    for (name, _) in std::env::vars_os() {
        if name
            .as_encoded_bytes()
            .starts_with(SHEAF_ENV_PREFIX.as_bytes())
        {
            command.env_remove(name);
        }
    }
    command
}

/// A [`Command`] for `program` with no inherited `SHEAF_*` variable (see [`without_sheaf_env`]).
pub fn sheaf_command(program: impl AsRef<OsStr>) -> Command {
    let mut command = Command::new(program);
    without_sheaf_env(&mut command);
    command
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_s_urls_are_split_at_commas_and_trimmed() {
        assert_eq!(
            split_urls("nats://127.0.0.1:1, nats://127.0.0.1:2,nats://127.0.0.1:3,"),
            [
                "nats://127.0.0.1:1",
                "nats://127.0.0.1:2",
                "nats://127.0.0.1:3"
            ]
        );
    }

    #[test]
    fn unique_names_differ_and_are_identifiers() {
        let a = unique_name("sheaf");
        let b = unique_name("sheaf");
        assert_ne!(a, b);
        assert!(a.starts_with("sheaf_"));
        assert!(
            a.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        );
    }

    #[test]
    fn a_sheaf_command_removes_every_inherited_sheaf_variable_and_nothing_else() {
        let command = sheaf_command("sheaf");
        let removed: Vec<&OsStr> = command
            .get_envs()
            .filter(|(_, value)| value.is_none())
            .map(|(name, _)| name)
            .collect();
        let inherited: Vec<std::ffi::OsString> = std::env::vars_os()
            .map(|(name, _)| name)
            .filter(|name| name.as_encoded_bytes().starts_with(b"SHEAF_"))
            .collect();
        assert_eq!(removed.len(), inherited.len(), "{removed:?}");
        for name in &inherited {
            assert!(removed.contains(&name.as_os_str()), "{name:?} is inherited");
        }
        assert!(
            command.get_envs().all(|(_, value)| value.is_none()),
            "nothing is set, only removed"
        );
    }
}
