//! The source over TLS against the suites' own servers: `cargo xtask services up` serves the
//! shared cluster with a certificate from a test CA, for `localhost` and `127.0.0.1`
//! (`SHEAF_TEST_POSTGRES_TLS_URL` is its URL with `sslmode=verify-full` and that CA as
//! `sslrootcert`), beside a second cluster with TLS off (`SHEAF_TEST_POSTGRES_NOTLS_URL`).
//! Skipped without them, failing under CI.

use std::path::PathBuf;
use std::time::Duration;

use sheaf_cdc::{CdcConfig, CdcSource, ConnectionConfig, Error};

use crate::postgres::{Pg, id, recv, with_pg};

const TLS_URL_VAR: &str = "SHEAF_TEST_POSTGRES_TLS_URL";
const NOTLS_URL_VAR: &str = "SHEAF_TEST_POSTGRES_NOTLS_URL";
const CA_VAR: &str = "SHEAF_TEST_TLS_CA_FILE";
const OTHER_CA_VAR: &str = "SHEAF_TEST_TLS_OTHER_CA_FILE";

/// `url` with `sslmode=mode` in place of any it had.
fn with_ssl_mode(url: &str, mode: &str) -> String {
    sheaf_testenv::with_query_param(url, "sslmode", mode)
}

/// A configuration that fails before it reaches the slot: nothing to clean up.
fn unreachable_slot(connection: ConnectionConfig) -> CdcConfig {
    let mut config = CdcConfig::new(connection, "sheaf_tls_never_created", "sheaf_tls_never");
    config.connect_timeout = Duration::from_secs(15);
    config
}

/// Whether the server sees the test's connection of `backend_type` (`walsender`: the
/// replication session; `client backend`: the heartbeat's) as encrypted, found by its
/// `application_name` (the slot's name); `None` while it is not there.
async fn server_sees_ssl(pg: &Pg, backend_type: &str) -> Option<bool> {
    let sql = if backend_type == "walsender" {
        "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_replication r USING (pid) \
         WHERE r.application_name = $1"
    } else {
        "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
         WHERE a.application_name = $1 AND a.backend_type = 'client backend'"
    };
    sqlx::query_scalar(sql)
        .bind(&pg.slot)
        .fetch_optional(&pg.pool)
        .await
        .unwrap()
}

/// Polls [`server_sees_ssl`] for at most 15 s until the connection shows up.
async fn wait_server_sees_ssl(pg: &Pg, backend_type: &str) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(ssl) = server_sees_ssl(pg, backend_type).await {
            return ssl;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no {backend_type} connection named {} in 15 s",
            pg.slot
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_streams_over_verify_full_and_the_server_sees_it_encrypted() {
    let test = "a_transaction_streams_over_verify_full_and_the_server_sees_it_encrypted";
    let Some(url) = sheaf_testenv::server_url(TLS_URL_VAR, test) else {
        return;
    };
    assert!(url.contains("sslmode=verify-full"), "{url}");
    with_pg(url, |pg| async move {
        let mut config = pg.config();
        // The heartbeat's own connection must carry the same sslmode and CA.
        config.heartbeat_interval = Some(Duration::from_millis(200));
        let mut stream = CdcSource::start(config)
            .await
            .expect("start over verify-full");
        let security = stream.replication_security().expect("a source").clone();
        println!("replication connection {security}");
        assert!(security.is_encrypted(), "{security}");
        assert_eq!(security.ssl_mode, "verify-full");

        pg.insert(1, 3).await;
        let mut ids = Vec::new();
        let mut last = None;
        while ids.len() < 3 {
            let message = recv(&mut stream).await;
            ids.extend(message.changes().iter().map(id));
            last = Some(message.ack_lsn());
            message.ack();
        }
        assert_eq!(ids, [1, 2, 3]);
        pg.wait_confirmed(last.unwrap()).await;

        assert!(
            wait_server_sees_ssl(&pg, "walsender").await,
            "pg_stat_ssl: the replication session is not encrypted"
        );
        assert!(
            wait_server_sees_ssl(&pg, "client backend").await,
            "pg_stat_ssl: the heartbeat connection is not encrypted"
        );
        stream.shutdown().await.expect("shutdown");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_from_another_ca_fails_start_in_words() {
    let test = "a_certificate_from_another_ca_fails_start_in_words";
    let (Some(url), Some(other)) = (
        sheaf_testenv::server_url(TLS_URL_VAR, test),
        sheaf_testenv::server_url(OTHER_CA_VAR, test),
    ) else {
        return;
    };
    let mut connection = ConnectionConfig::from_url(&url).expect("url");
    connection.ssl_root_cert = Some(PathBuf::from(&other));
    let server = connection.server();
    let err = CdcSource::start(unreachable_slot(connection))
        .await
        .expect_err("an untrusted certificate must fail the start");
    let text = err.to_string();
    println!("{text}");
    assert!(
        matches!(&err, Error::Tls { server: s, .. } if *s == server),
        "{err:?}"
    );
    assert!(text.contains("not signed by a trusted CA"), "{text}");
    assert!(text.contains(&server), "{text}");
    assert!(
        text.contains(&other),
        "names the CA file it trusted: {text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_against_a_server_without_tls_is_refused_in_words() {
    let test = "require_against_a_server_without_tls_is_refused_in_words";
    let Some(url) = sheaf_testenv::server_url(NOTLS_URL_VAR, test) else {
        return;
    };
    let connection = ConnectionConfig::from_url(&with_ssl_mode(&url, "require")).expect("url");
    let server = connection.server();
    let err = CdcSource::start(unreachable_slot(connection))
        .await
        .expect_err("require must not fall back to plaintext");
    let text = err.to_string();
    println!("{text}");
    assert!(matches!(err, Error::Tls { .. }), "{err:?}");
    assert!(text.contains("refuses TLS"), "{text}");
    assert!(text.contains("sslmode=require"), "{text}");
    assert!(text.contains(&server), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefer_against_a_server_without_tls_goes_on_in_plaintext() {
    let test = "prefer_against_a_server_without_tls_goes_on_in_plaintext";
    let Some(url) = sheaf_testenv::server_url(NOTLS_URL_VAR, test) else {
        return;
    };
    let connection = ConnectionConfig::from_url(&with_ssl_mode(&url, "prefer")).expect("url");
    // That cluster has no logical WAL, so no slot: reaching the publication check shows the
    // session started and authenticated in plaintext through the bridge.
    let err = CdcSource::start(unreachable_slot(connection))
        .await
        .expect_err("the publication does not exist");
    assert!(
        matches!(&err, Error::PublicationMissing { publication } if publication == "sheaf_tls_never"),
        "{err:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_accepts_the_host_name_too_and_trusts_the_operator_ca_file() {
    let test = "verify_full_accepts_the_host_name_too_and_trusts_the_operator_ca_file";
    let (Some(url), Some(ca)) = (
        sheaf_testenv::server_url(TLS_URL_VAR, test),
        sheaf_testenv::server_url(CA_VAR, test),
    ) else {
        return;
    };
    with_pg(url, |pg| async move {
        let mut config = pg.config();
        assert_eq!(config.connection.host, "127.0.0.1");
        // The same server by name (the certificate names both), trusting the CA through
        // the operator's file instead of the URL.
        config.connection.host = "localhost".into();
        config.connection.ssl_root_cert = None;
        config.connection.ca_file = Some(PathBuf::from(ca));
        let mut stream = CdcSource::start(config).await.expect("start as localhost");
        let security = stream.replication_security().expect("a source").clone();
        assert!(security.is_encrypted(), "{security}");
        assert!(security.server.starts_with("localhost:"), "{security:?}");
        pg.insert(7, 7).await;
        let message = recv(&mut stream).await;
        assert_eq!(message.changes().iter().map(id).collect::<Vec<_>>(), [7]);
        message.ack();
        stream.shutdown().await.expect("shutdown");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disable_connects_directly_in_plaintext_even_to_a_server_with_tls() {
    let test = "disable_connects_directly_in_plaintext_even_to_a_server_with_tls";
    let Some(url) = sheaf_testenv::postgres_url(test) else {
        return;
    };
    with_pg(with_ssl_mode(&url, "disable"), |pg| async move {
        let mut stream = CdcSource::start(pg.config()).await.expect("start");
        let security = stream.replication_security().expect("a source").clone();
        assert_eq!(security.to_string(), "NOT encrypted (sslmode=disable)");
        pg.insert(1, 1).await;
        let message = recv(&mut stream).await;
        assert_eq!(message.changes().iter().map(id).collect::<Vec<_>>(), [1]);
        message.ack();
        assert!(
            !wait_server_sees_ssl(&pg, "walsender").await,
            "pg_stat_ssl: sslmode=disable must not encrypt"
        );
        stream.shutdown().await.expect("shutdown");
    })
    .await;
}
