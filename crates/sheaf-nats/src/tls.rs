//! TLS for NATS connections: rustls on ring (`sheaf-tls`), and a certificate checked against
//! the host the tenant wrote, not the address the client dialled.
//!
//! The pool connects to the IP addresses the private-address guard approved (so a name cannot
//! be re-pointed at an internal address between check and connect), which means async-nats only
//! ever sees an IP and would verify the server's certificate for that IP. [`PinnedName`] checks
//! it for the configured host name instead, with the ordinary WebPKI rules. The cost: with an IP
//! to dial, rustls sends no SNI, so a server that picks its certificate by SNI answers with its
//! default one.

use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

/// A client configuration that trusts `roots` (the bundled webpki roots, plus an operator's CA
/// file when one was given) and verifies certificates for `host` (a name, or an IP literal
/// without brackets).
pub(crate) fn client_config(
    host: &str,
    roots: &Arc<RootCertStore>,
) -> Result<ClientConfig, String> {
    let name = ServerName::try_from(host.to_owned())
        .map_err(|e| format!("{host:?} cannot be checked against a TLS certificate: {e}"))?;
    let provider = sheaf_tls::provider();
    let inner = WebPkiServerVerifier::builder_with_provider(Arc::clone(roots), provider.clone())
        .build()
        .map_err(|e| format!("the TLS verifier cannot be built: {e}"))?;
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("ring refuses the default TLS versions: {e}"))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(PinnedName { name, inner }))
        .with_no_client_auth();
    Ok(config)
}

/// WebPKI verification for one fixed name, whatever name the connection was opened with.
#[derive(Debug)]
struct PinnedName {
    name: ServerName<'static>,
    inner: Arc<WebPkiServerVerifier>,
}

impl ServerCertVerifier for PinnedName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _dialled: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.inner
            .verify_server_cert(end_entity, intermediates, &self.name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configs_build_for_names_and_ip_literals() {
        let roots = Arc::new(sheaf_tls::roots(None).unwrap());
        assert!(client_config("broker.example", &roots).is_ok());
        assert!(client_config("127.0.0.1", &roots).is_ok());
        assert!(client_config("::1", &roots).is_ok());
        assert!(client_config("bad name!", &roots).is_err());
    }

    #[test]
    fn a_ca_file_that_does_not_load_names_the_file() {
        let path = std::env::temp_dir().join("sheaf-nats-no-such-ca.pem");
        let nats = crate::Nats::new(crate::NatsSettings {
            timeout: std::time::Duration::from_secs(1),
            allow_private: true,
        });
        let err = nats.with_ca_file(&path).unwrap_err();
        assert!(
            err.to_string().contains("sheaf-nats-no-such-ca.pem"),
            "{err}"
        );
    }
}
