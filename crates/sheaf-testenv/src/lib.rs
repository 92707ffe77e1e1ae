//! Where the suites find their real servers, and what happens when one is missing.
//!
//! `cargo xtask test` starts Postgres and ClickHouse and passes their URLs in
//! `SHEAF_TEST_POSTGRES_URL` and `SHEAF_TEST_CLICKHOUSE_URL`. A test that needs a
//! server asks here first. Outside CI a missing URL skips the test with a printed
//! line, so `cargo test` works on a laptop without servers; under `CI` a missing URL
//! is a failure, because a suite that silently passes without its server has
//! proved nothing.

use std::fmt::Write as _;

/// The variable that carries the Postgres URL (a `LOGIN REPLICATION` role, `wal_level = logical`).
pub const POSTGRES_URL_VAR: &str = "SHEAF_TEST_POSTGRES_URL";
/// The variable that carries the ClickHouse HTTP URL.
pub const CLICKHOUSE_URL_VAR: &str = "SHEAF_TEST_CLICKHOUSE_URL";
/// The Python interpreter of xtask's virtual environment (has `standardwebhooks`).
pub const PYTHON_VAR: &str = "SHEAF_TEST_PYTHON";

/// Whether we run under CI, where every server must be present.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "0" && !v.eq_ignore_ascii_case("false"))
}

/// The value of a server variable, or `None` after printing why the caller skips.
///
/// # Panics
/// Under CI, when the variable is missing: the test fails instead of passing
/// without its server.
pub fn server_url(var: &str, test: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(url) if !url.trim().is_empty() => Some(url),
        _ if in_ci() => panic!(
            "{test}: {var} is not set, and under CI a test that needs its server must not skip; run the suites with `cargo xtask test`"
        ),
        _ => {
            println!(
                "skipping {test}: {var} is not set (run `cargo xtask test`, or `cargo xtask services up` and export the variables it prints)"
            );
            None
        }
    }
}

/// The Postgres URL, or `None` (skip) outside CI. See [`server_url`].
pub fn postgres_url(test: &str) -> Option<String> {
    server_url(POSTGRES_URL_VAR, test)
}

/// The ClickHouse URL, or `None` (skip) outside CI. See [`server_url`].
pub fn clickhouse_url(test: &str) -> Option<String> {
    server_url(CLICKHOUSE_URL_VAR, test)
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
}
