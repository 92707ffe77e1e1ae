//! ClickHouse over `https://`, against the suites' server as `cargo xtask services up` serves it
//! with a certificate from a test CA (`SHEAF_TEST_CLICKHOUSE_HTTPS_URL`,
//! `SHEAF_TEST_TLS_CA_FILE`). The test database is created and dropped over the plain URL.

use std::path::PathBuf;
use std::time::Duration;

use sheaf_clickhouse::{ClickHouseConfig, ClickHouseLogStore};
use sheaf_store::testkit::conformance;
use sheaf_testenv::require_clickhouse;

use crate::support::TestDb;

const HTTPS_URL_VAR: &str = "SHEAF_TEST_CLICKHOUSE_HTTPS_URL";
const CA_VAR: &str = "SHEAF_TEST_TLS_CA_FILE";
const OTHER_CA_VAR: &str = "SHEAF_TEST_TLS_OTHER_CA_FILE";

/// The HTTPS URL and the two CA files, or `None` (skip) outside CI.
fn tls_env(test: &str) -> Option<(String, PathBuf, PathBuf)> {
    Some((
        sheaf_testenv::server_url(HTTPS_URL_VAR, test)?,
        sheaf_testenv::server_url(CA_VAR, test)?.into(),
        sheaf_testenv::server_url(OTHER_CA_VAR, test)?.into(),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_over_https() {
    let url = require_clickhouse!("conformance_over_https");
    let Some((https, ca, _)) = tls_env("conformance_over_https") else {
        return;
    };
    assert!(https.starts_with("https://"), "{https}");
    let db = TestDb::new(&url);
    let mut config = db.config();
    config.url = https;
    config.ca_file = Some(ca);
    config.write.max_wait = Duration::from_millis(5);
    let store = db.store_with(config).await;
    conformance::run_log_store(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_certificate_is_refused_in_words() {
    let url = require_clickhouse!("an_untrusted_certificate_is_refused_in_words");
    let Some((https, _, other)) = tls_env("an_untrusted_certificate_is_refused_in_words") else {
        return;
    };
    let db = TestDb::new(&url);
    // Only the bundled public roots, then only an unrelated CA: neither knows the server's.
    for ca_file in [None, Some(other)] {
        let mut config = db.config();
        config.url.clone_from(&https);
        config.ca_file = ca_file;
        let store = ClickHouseLogStore::connect(config).expect("the configuration is valid");
        let err = store.migrate().await.expect_err("the handshake must fail");
        let message = err.to_string();
        println!("{message} / {err:?}");
        assert!(
            message.contains("TLS: the server's certificate is not signed by a trusted CA"),
            "{message}"
        );
    }
}

#[test]
fn a_ca_file_that_cannot_be_used_is_named() {
    let mut config = ClickHouseConfig::new("https://127.0.0.1:1", "unused");
    config.ca_file = Some("/nonexistent/ca.pem".into());
    let err = config.validate().unwrap_err().to_string();
    assert!(
        err.contains("CA file /nonexistent/ca.pem: cannot be read"),
        "{err}"
    );
}
