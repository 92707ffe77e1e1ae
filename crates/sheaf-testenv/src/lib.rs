//! What Sheaf's test suites, benchmarks and fault suite share, so each piece exists once.
//!
//! Always here, with no dependency but `rand`: where the suites find their real servers and
//! what happens when one is missing. `cargo xtask test` starts Postgres and ClickHouse and
//! passes their URLs in `SHEAF_TEST_POSTGRES_URL` and `SHEAF_TEST_CLICKHOUSE_URL`, and the
//! Python of its virtual environment in `SHEAF_TEST_PYTHON`. A test that needs one asks here
//! first (`require_postgres!`, `require_clickhouse!`, `require_python!`). Outside CI a missing
//! variable skips the test with a printed line, so `cargo test` works on a laptop without
//! servers; under `CI` it is a failure, because a suite that silently passes without its
//! server has proved nothing. [`unique_name`] gives every run its own schema or database, and
//! [`without_sheaf_env`] keeps the caller's own `SHEAF_*` settings away from a `sheaf` it starts.
//!
//! Behind features, so a suite compiles only what it uses (a module's name is its feature's,
//! but for `cdc`):
//! - `receiver`: `receiver::Receiver`, the loopback webhook receiver every delivery test,
//!   benchmark and fault scenario delivers to, with Standard Webhooks signature checks;
//! - `process`: `process::SheafProcess`, a `sheaf serve` child process, and readings of its
//!   memory and `/metrics`;
//! - `postgres`: `postgres::drop_replication_slot`, for every test that creates a slot;
//! - `clickhouse`: `clickhouse::time_ordered`, the attempts table Sheaf's layout is measured
//!   against, and dropping a scratch database from a destructor;
//! - `cdc`: `pgoutput`, `Relation` messages for the decoder and the reader.

use std::ffi::OsStr;
use std::fmt::Write as _;
use std::process::Command;

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

/// The variable that carries the Postgres URL (a `LOGIN REPLICATION` role, `wal_level = logical`).
pub const POSTGRES_URL_VAR: &str = "SHEAF_TEST_POSTGRES_URL";
/// The variable that carries the ClickHouse HTTP URL.
pub const CLICKHOUSE_URL_VAR: &str = "SHEAF_TEST_CLICKHOUSE_URL";
/// The Python interpreter of xtask's virtual environment (has `standardwebhooks`).
pub const PYTHON_VAR: &str = "SHEAF_TEST_PYTHON";

/// The prefix of every variable the `sheaf` binary reads.
pub const SHEAF_ENV_PREFIX: &str = "SHEAF_";

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

/// The Python of xtask's virtual environment (with `standardwebhooks` and `schemathesis`), or
/// `None` (skip) outside CI; under CI a missing interpreter panics, as a missing server does.
pub fn python(test: &str) -> Option<String> {
    required_var(PYTHON_VAR, "xtask's Python", test)
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

/// A name no other run uses, for a schema, database or table prefix: `prefix_` and
/// 12 random lower-case letters and digits, valid unquoted in Postgres and ClickHouse.
pub fn unique_name(prefix: &str) -> String {
    use rand::Rng;
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    let mut name = String::with_capacity(prefix.len() + 13);
    let _ = write!(name, "{prefix}_");
    for _ in 0..12 {
        name.push(ALPHABET[rng.random_range(0..ALPHABET.len())] as char);
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
