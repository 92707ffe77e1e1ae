//! The TLS servers `cargo xtask services up` runs are what the TLS suites rely on, checked with
//! rustls (through sqlx and reqwest), the stack Sheaf itself uses: Postgres and ClickHouse's
//! HTTPS URL present a certificate that verifies against the test CA for `127.0.0.1` and
//! fails against the unrelated CA, and the TLS-off Postgres refuses `sslmode=require`.

use sheaf_testenv::{clickhouse_https_url, postgres_notls_url, postgres_tls_url, tls_files};

/// `url` with its `sslrootcert` pointing at `ca` instead.
fn with_root(url: &str, ca: &str) -> String {
    let (base, _) = url.split_once('?').expect("the TLS URL has parameters");
    format!("{base}?sslmode=verify-full&sslrootcert={ca}")
}

#[tokio::test]
async fn postgres_serves_tls_with_the_test_certificate() {
    let test = "postgres_serves_tls_with_the_test_certificate";
    let (Some(url), Some(files)) = (postgres_tls_url(test), tls_files(test)) else {
        return;
    };
    let pool = sqlx::PgPool::connect(&url)
        .await
        .expect("connect with verify-full against the test CA");
    let encrypted: bool =
        sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
            .fetch_one(&pool)
            .await
            .expect("read pg_stat_ssl");
    assert!(encrypted, "a verify-full session must be encrypted");

    let refused = sqlx::PgPool::connect(&with_root(&url, &files.other_ca)).await;
    assert!(
        refused.is_err(),
        "a certificate signed by the test CA must not verify against the unrelated CA"
    );
}

#[tokio::test]
async fn postgres_without_tls_refuses_sslmode_require() {
    let Some(url) = postgres_notls_url("postgres_without_tls_refuses_sslmode_require") else {
        return;
    };
    let pool = sqlx::PgPool::connect(&url)
        .await
        .expect("a plain connection to the TLS-off cluster");
    let ssl: String = sqlx::query_scalar("SHOW ssl")
        .fetch_one(&pool)
        .await
        .expect("SHOW ssl");
    assert_eq!(ssl, "off");
    let refused = sqlx::PgPool::connect(&format!("{url}?sslmode=require")).await;
    assert!(refused.is_err(), "sslmode=require must fail without TLS");
}

#[tokio::test]
async fn clickhouse_serves_https_with_the_test_certificate() {
    let test = "clickhouse_serves_https_with_the_test_certificate";
    let (Some(url), Some(files)) = (clickhouse_https_url(test), tls_files(test)) else {
        return;
    };
    let trusting = |ca: &str| {
        let pem = std::fs::read(ca).expect("read a CA file");
        reqwest::Client::builder()
            .tls_built_in_root_certs(false)
            .add_root_certificate(reqwest::Certificate::from_pem(&pem).expect("a PEM CA"))
            .build()
            .expect("an HTTPS client")
    };
    let body = trusting(&files.ca)
        .get(format!("{url}/ping"))
        .send()
        .await
        .expect("GET /ping over HTTPS with the test CA")
        .text()
        .await
        .expect("the body");
    assert_eq!(body.trim(), "Ok.");

    let refused = trusting(&files.other_ca)
        .get(format!("{url}/ping"))
        .send()
        .await;
    assert!(
        refused.is_err(),
        "the test certificate must not verify against the unrelated CA"
    );
}
