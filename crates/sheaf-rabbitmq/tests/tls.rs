//! `amqps://`: the broker's certificate is verified (bundled roots plus the operator's CA
//! file), and a verified connection delivers.
//!
//! The test's node speaks plain AMQP, so a TLS front of the test's own (rustls on ring, the
//! test certificate for `localhost` and `127.0.0.1`) forwards to it, as a TLS-terminating load
//! balancer would. The certificates are those `cargo xtask services up` makes; without them the
//! case skips outside CI.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::json;
use sheaf_destination::Verdict;
use sheaf_destination::testkit::{self, Harness as _};
use tokio::net::{TcpListener, TcpStream};

use super::amqp::Delivery;
use super::{RabbitHarness, rabbitmq};

/// Accepts TLS on a loopback port and forwards each connection to `upstream`, until dropped.
struct TlsFront {
    port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl TlsFront {
    async fn start(cert: &str, key: &str, upstream: u16) -> anyhow::Result<TlsFront> {
        let certs = CertificateDer::pem_file_iter(cert)?.collect::<Result<Vec<_>, _>>()?;
        let key = PrivateKeyDer::from_pem_file(key)?;
        let config = rustls::ServerConfig::builder_with_provider(sheaf_tls::provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(certs, key)?;
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let task = tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    // A client that refuses the certificate ends here, as it should.
                    let Ok(mut tls) = acceptor.accept(socket).await else {
                        return;
                    };
                    let Ok(mut broker) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut broker).await;
                });
            }
        });
        Ok(TlsFront { port, task })
    }
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub(crate) async fn amqps_is_verified_and_delivers(harness: &RabbitHarness) {
    let Some(files) = sheaf_testenv::tls_files("amqps_is_verified_and_delivers") else {
        return;
    };
    let front = TlsFront::start(&files.cert, &files.key, harness.port)
        .await
        .expect("a TLS front");
    let target = harness.target().await.expect("a target");
    let config = json!({
        "url": format!("amqps://guest:guest@localhost:{}/%2f", front.port),
        "exchange": target["exchange"],
    });
    let delivery = Delivery::new();

    // The bundled roots alone do not know the test CA.
    let untrusting = rabbitmq(testkit::TIMEOUT);
    let report = delivery
        .send(&untrusting, &config, "evt_tls_untrusted")
        .await;
    assert!(
        matches!(report.verdict, Verdict::Retry { .. }),
        "{report:?}"
    );
    let error = report.error.unwrap_or_default();
    assert!(error.contains("not signed by a trusted CA"), "{error}");

    // Another CA is not the one that signed the broker's certificate.
    let wrong_ca = rabbitmq(testkit::TIMEOUT)
        .with_ca_file(Path::new(&files.other_ca))
        .expect("the other CA loads");
    let report = delivery.send(&wrong_ca, &config, "evt_tls_wrong_ca").await;
    assert!(
        matches!(report.verdict, Verdict::Retry { .. }),
        "{report:?}"
    );

    let trusting = rabbitmq(testkit::TIMEOUT)
        .with_ca_file(Path::new(&files.ca))
        .expect("the test CA loads");
    let report = delivery.send(&trusting, &config, "evt_tls_ok").await;
    assert_eq!(report.verdict, Verdict::Delivered, "{report:?}");
    let got = harness
        .arrivals(&target, 1, testkit::PATIENCE)
        .await
        .expect("arrivals");
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].event_id, "evt_tls_ok");

    let missing = rabbitmq(testkit::TIMEOUT).with_ca_file(Path::new("/nonexistent/ca.pem"));
    let err = missing.expect_err("a missing CA file is refused");
    assert!(err.to_string().contains("/nonexistent/ca.pem"), "{err}");
}
