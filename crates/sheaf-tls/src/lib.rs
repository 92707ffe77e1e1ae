//! Sheaf's client-side TLS: rustls on ring, one root store, and Postgres's sslmode verifiers.
#![doc = include_str!("../README.md")]

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};

/// The crypto provider of every Sheaf connection: ring.
///
/// rustls 0.23.48 deprecates its ring provider because ring offers no post-quantum key
/// exchange; its other provider, aws-lc-rs, needs a C and assembler toolchain to build. Sheaf
/// keeps ring (one TLS stack, built from Rust alone on any machine) and allows the deprecation
/// here, in the one place that picks the provider; moving to a post-quantum key exchange is a
/// decision of its own, not a side effect of an update.
#[allow(deprecated)]
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// How a Postgres connection uses TLS: the `sslmode` URL parameter, with libpq's meanings.
/// `allow` is read as `prefer`, which tries TLS first instead of last.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SslMode {
    /// Plaintext only.
    Disable,
    /// TLS when the server offers it, plaintext when it refuses (libpq's default). The server
    /// is not verified.
    #[default]
    Prefer,
    /// TLS or nothing; the server's certificate is not checked.
    Require,
    /// TLS, and the certificate must chain to a trusted root; its name is not checked.
    VerifyCa,
    /// TLS, a trusted chain, and a certificate issued for the host connected to.
    VerifyFull,
}

impl SslMode {
    /// Parses a `sslmode` value.
    ///
    /// # Errors
    /// The accepted spellings, when `value` is none of them.
    pub fn parse(value: &str) -> Result<Self, String> {
        Ok(match value {
            "disable" => SslMode::Disable,
            "allow" | "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            other => {
                return Err(format!(
                    "sslmode {other:?} is not one of disable, allow, prefer, require, verify-ca, verify-full"
                ));
            }
        })
    }

    /// Whether a server that refuses TLS is an error rather than a plaintext connection.
    pub fn requires_tls(self) -> bool {
        matches!(
            self,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull
        )
    }

    /// The spelling libpq uses.
    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

impl fmt::Display for SslMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A CA file that cannot be used, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("CA file {}: {problem}", path.display())]
pub struct CaFileError {
    /// The file as configured.
    pub path: PathBuf,
    /// What is wrong with it, in words.
    pub problem: String,
}

/// The certificates of a PEM file: one or more `BEGIN CERTIFICATE` blocks (a bundle).
///
/// # Errors
/// [`CaFileError`] when the file cannot be read, holds a block that does not parse, or holds no
/// certificate at all.
pub fn load_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, CaFileError> {
    let problem = |problem: String| CaFileError {
        path: path.to_owned(),
        problem,
    };
    let pem = std::fs::read(path).map_err(|e| problem(format!("cannot be read: {e}")))?;
    let mut certificates = Vec::new();
    for (i, item) in CertificateDer::pem_slice_iter(&pem).enumerate() {
        certificates.push(
            item.map_err(|e| problem(format!("certificate {} is not valid PEM: {e}", i + 1)))?,
        );
    }
    if certificates.is_empty() {
        return Err(problem(
            "holds no PEM certificate (expected -----BEGIN CERTIFICATE----- blocks)".to_owned(),
        ));
    }
    Ok(certificates)
}

/// The bundled webpki roots plus the certificates of `extra_ca`, if given.
///
/// A bundle may hold certificates webpki cannot use as trust anchors (a system bundle often
/// has a few very old ones); those are skipped, as a TLS library loading a system store does.
/// A file none of whose certificates is usable is refused.
///
/// # Errors
/// [`CaFileError`] when the file cannot be loaded or holds no usable CA certificate.
pub fn roots(extra_ca: Option<&Path>) -> Result<RootCertStore, CaFileError> {
    let mut store = RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    if let Some(path) = extra_ca {
        let certificates = load_certificates(path)?;
        let (added, _skipped) = store.add_parsable_certificates(certificates);
        if added == 0 {
            return Err(CaFileError {
                path: path.to_owned(),
                problem: "holds no certificate usable as a CA".to_owned(),
            });
        }
    }
    Ok(store)
}

/// A client configuration for `mode` (which must not be [`SslMode::Disable`]), trusting
/// [`roots`]`(extra_ca)`. No ALPN: callers that speak HTTP add theirs.
///
/// # Errors
/// [`CaFileError`] from [`roots`].
pub fn client_config(mode: SslMode, extra_ca: Option<&Path>) -> Result<ClientConfig, CaFileError> {
    let provider = provider();
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions");
    let config = match mode {
        SslMode::VerifyFull => builder.with_root_certificates(roots(extra_ca)?),
        SslMode::VerifyCa => {
            let full =
                WebPkiServerVerifier::builder_with_provider(Arc::new(roots(extra_ca)?), provider)
                    .build()
                    .expect("a non-empty root store builds a verifier");
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(ChainOnly(full)))
        }
        SslMode::Disable | SslMode::Prefer | SslMode::Require => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Unverified(provider))),
    };
    Ok(config.with_no_client_auth())
}

/// Short words for a TLS failure, for logs and start-up errors: rustls's own errors say what
/// happened but not what an operator should look at.
pub fn explain(error: &rustls::Error) -> String {
    match error {
        rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer) => {
            "the server's certificate is not signed by a trusted CA".to_owned()
        }
        rustls::Error::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        ) => "the server's certificate was not issued for this host name".to_owned(),
        rustls::Error::InvalidCertificate(
            CertificateError::Expired | CertificateError::ExpiredContext { .. },
        ) => "the server's certificate has expired".to_owned(),
        other => other.to_string(),
    }
}

/// [`explain`] for the first TLS error in `error`'s chain of sources, looking inside
/// `io::Error`s too (TLS streams report handshake failures as I/O errors wrapping rustls's).
/// `None` when the failure had nothing to do with TLS.
pub fn tls_cause(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut next = Some(error);
    while let Some(current) = next {
        if let Some(tls) = current.downcast_ref::<rustls::Error>() {
            return Some(explain(tls));
        }
        // An `io::Error`'s `source()` skips the error it wraps (and TLS connectors wrap one
        // `io::Error` in another): step into the wrapped error itself.
        next = match current
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => current.source(),
        };
    }
    None
}

/// `verify-ca`: the chain must be trusted; a name mismatch is accepted.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// `require` (and `prefer`): encrypted, but whoever answers is accepted. The handshake's
/// signatures are still checked, so the session keys belong to the certificate presented.
#[derive(Debug)]
struct Unverified(Arc<CryptoProvider>);

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Why [`roots`] refuses a CA file holding `contents` (written to a temporary file `name`).
    fn refusal(name: &str, contents: &str) -> String {
        let path = std::env::temp_dir().join(format!("sheaf-tls-{}-{name}", std::process::id()));
        std::fs::write(&path, contents).unwrap();
        let err = roots(Some(&path)).expect_err("the file must be refused");
        std::fs::remove_file(path).unwrap();
        err.problem
    }

    #[test]
    fn sslmode_parses_libpq_spellings_and_names_the_bad_one() {
        assert_eq!(SslMode::parse("verify-full"), Ok(SslMode::VerifyFull));
        assert_eq!(SslMode::parse("allow"), Ok(SslMode::Prefer));
        assert!(SslMode::Require.requires_tls());
        assert!(!SslMode::Prefer.requires_tls());
        let err = SslMode::parse("verify_full").unwrap_err();
        assert!(err.contains("\"verify_full\""), "{err}");
    }

    #[test]
    fn a_missing_ca_file_names_the_file() {
        let err = roots(Some(Path::new("/nonexistent/ca.pem"))).unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with("CA file /nonexistent/ca.pem: cannot be read"),
            "{text}"
        );
    }

    #[test]
    fn a_file_without_certificates_is_refused() {
        let problem = refusal("empty.pem", "this is not a certificate\n");
        assert!(problem.contains("holds no PEM certificate"), "{problem}");
    }

    #[test]
    fn a_garbled_certificate_is_refused_not_skipped() {
        let problem = refusal(
            "garbled.pem",
            "-----BEGIN CERTIFICATE-----\nnot base64 at all!\n-----END CERTIFICATE-----\n",
        );
        assert!(
            problem.contains("certificate 1 is not valid PEM"),
            "{problem}"
        );
    }

    #[test]
    fn a_tls_error_is_found_inside_an_io_error() {
        let io = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer),
        );
        let cause = tls_cause(&io).unwrap();
        assert!(cause.contains("not signed by a trusted CA"), "{cause}");
        // As a TLS connector reports it: one I/O error inside another.
        let nested = std::io::Error::other(io);
        assert_eq!(tls_cause(&nested), Some(cause));
        assert_eq!(tls_cause(&std::io::Error::other("refused")), None);
    }

    #[test]
    fn a_certificate_that_is_not_a_ca_is_refused() {
        // Well-formed PEM, but the DER inside is no certificate.
        let problem = refusal(
            "not-a-ca.pem",
            "-----BEGIN CERTIFICATE-----\nAAECAwQFBgcICQ==\n-----END CERTIFICATE-----\n",
        );
        assert!(
            problem.contains("no certificate usable as a CA"),
            "{problem}"
        );
    }

    #[test]
    fn every_mode_builds_a_config_on_ring() {
        for mode in [SslMode::Require, SslMode::VerifyCa, SslMode::VerifyFull] {
            let config = client_config(mode, None).unwrap();
            assert!(config.alpn_protocols.is_empty());
        }
    }
}
