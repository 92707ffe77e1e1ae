//! Postgres over TLS against the suites' own server, which `cargo xtask services up` serves with
//! a certificate from a test CA (`SHEAF_TEST_POSTGRES_TLS_URL` is its URL with
//! `sslmode=verify-full` and that CA as `sslrootcert`), beside a second cluster with TLS off.

use sheaf_postgres::{PostgresConfig, PostgresStores};
use sheaf_store::testkit::conformance;

use crate::support::{Gate, TestSchema};

const TLS_URL_VAR: &str = "SHEAF_TEST_POSTGRES_TLS_URL";
const NOTLS_URL_VAR: &str = "SHEAF_TEST_POSTGRES_NOTLS_URL";
const OTHER_CA_VAR: &str = "SHEAF_TEST_TLS_OTHER_CA_FILE";

/// `url` with its `sslrootcert` replaced by `ca`.
fn with_root_cert(url: &str, ca: &str) -> String {
    sheaf_testenv::with_query_param(url, "sslrootcert", ca)
}

/// The error a fresh pool meets on its first statement, as text.
async fn first_error(config: PostgresConfig) -> String {
    let stores = PostgresStores::new(config).expect("the configuration is valid");
    let err = stores.migrate().await.expect_err("connecting must fail");
    format!("{err:#}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_over_verify_full() {
    let Some(url) = sheaf_testenv::server_url(TLS_URL_VAR, "conformance_over_verify_full") else {
        return;
    };
    assert!(url.contains("sslmode=verify-full"), "{url}");
    let _gate = Gate::shared(&url).await;
    let test = TestSchema::new(&url).await;
    let (version, cipher) = test
        .stores
        .encryption()
        .await
        .unwrap()
        .expect("the server sees an encrypted connection");
    println!("encrypted: {version} {cipher}");
    let stores = &test.stores;
    conformance::run_all(
        &*stores.log_store(),
        &*stores.job_queue(),
        &*stores.entity_store(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_from_another_ca_is_refused_in_words() {
    let test = "a_certificate_from_another_ca_is_refused_in_words";
    let (Some(url), Some(other)) = (
        sheaf_testenv::server_url(TLS_URL_VAR, test),
        sheaf_testenv::server_url(OTHER_CA_VAR, test),
    ) else {
        return;
    };
    let message = first_error(TestSchema::config(&with_root_cert(&url, &other))).await;
    println!("{message}");
    assert!(message.contains("TLS"), "{message}");
    assert!(message.contains("not signed by a trusted CA"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_ca_file_is_trusted_when_the_url_names_none() {
    let test = "the_operator_ca_file_is_trusted_when_the_url_names_none";
    let (Some(url), Some(other)) = (
        sheaf_testenv::server_url(TLS_URL_VAR, test),
        sheaf_testenv::server_url(OTHER_CA_VAR, test),
    ) else {
        return;
    };
    let (base, query) = url.split_once('?').unwrap();
    let ca = query
        .split('&')
        .find_map(|p| p.strip_prefix("sslrootcert="))
        .expect("the TLS URL names its CA")
        .to_owned();
    let bare = format!("{base}?sslmode=verify-full");
    // Without any CA, the bundled public roots do not know the test CA.
    let message = first_error(TestSchema::config(&bare)).await;
    assert!(message.contains("not signed by a trusted CA"), "{message}");
    // The operator's CA file is enough.
    let mut config = TestSchema::config(&bare);
    config.ca_file = Some(ca.clone().into());
    let test_schema = TestSchema::with_config(config).await;
    assert!(test_schema.stores.encryption().await.unwrap().is_some());
    // The URL's own sslrootcert wins over the operator's file.
    let mut config = TestSchema::config(&with_root_cert(&bare, &other));
    config.ca_file = Some(ca.into());
    let message = first_error(config).await;
    assert!(message.contains("not signed by a trusted CA"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_against_a_server_without_tls_fails_in_words() {
    let Some(url) = sheaf_testenv::server_url(
        NOTLS_URL_VAR,
        "require_against_a_server_without_tls_fails_in_words",
    ) else {
        return;
    };
    let required = sheaf_testenv::with_query_param(&url, "sslmode", "require");
    let message = first_error(TestSchema::config(&required)).await;
    println!("{message}");
    assert!(message.contains("server does not support TLS"), "{message}");
    // `prefer` settles for plaintext there, and says so when asked.
    let preferred = sheaf_testenv::with_query_param(&url, "sslmode", "prefer");
    let stores = PostgresStores::new(TestSchema::config(&preferred)).unwrap();
    assert_eq!(stores.encryption().await.unwrap(), None);
}

#[test]
fn a_bad_sslmode_or_ca_file_is_named_before_connecting() {
    let bad_mode = PostgresConfig::new("postgres://u:secret@127.0.0.1/db?sslmode=verify_full");
    let err = bad_mode.validate().unwrap_err().to_string();
    assert!(err.contains("sslmode \"verify_full\""), "{err}");
    assert!(!err.contains("secret"), "the password stays out: {err}");
    let bad_file = PostgresConfig::new(
        "postgres://u@127.0.0.1/db?sslmode=verify-full&sslrootcert=/nonexistent.pem",
    );
    let err = bad_file.validate().unwrap_err().to_string();
    assert!(
        err.contains("CA file /nonexistent.pem: cannot be read"),
        "{err}"
    );
    let mut bad_operator_file = PostgresConfig::new("postgres://u@127.0.0.1/db");
    bad_operator_file.ca_file = Some("/nonexistent-too.pem".into());
    let err = bad_operator_file.validate().unwrap_err().to_string();
    assert!(err.contains("/nonexistent-too.pem"), "{err}");
}
