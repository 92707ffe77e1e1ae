//! The HTTP client under the `clickhouse` crate's [`Client`].
//!
//! The crate's own default client only knows its bundled roots; this one is the same shape
//! (a pooled hyper client, TCP keepalive, idle connections closed before the server's
//! keep-alive timeout closes them) with a TLS configuration from `sheaf-tls`: rustls on ring,
//! the bundled webpki roots plus the operator's CA file, and full verification (chain and host
//! name) for every `https://` URL. `http://` URLs go through the same connector in plaintext.

use std::path::Path;
use std::time::Duration;

use clickhouse::Client;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use sheaf_store::{Error, Result};
use sheaf_tls::SslMode;

/// Idle keepalive probes on pooled sockets, so a half-open connection is found.
const TCP_KEEPALIVE: Duration = Duration::from_secs(60);

/// Pooled connections idle longer are closed by the client. ClickHouse closes idle HTTP
/// connections after 3 s by default (`keep_alive_timeout`, 10 s in recent versions); closing
/// first means a request never races the server's close on a reused socket.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(2);

/// A `clickhouse` client on Sheaf's connector, trusting `ca_file` besides the bundled roots.
///
/// # Errors
/// [`Error::InvalidInput`] naming the CA file when it cannot be used.
pub(crate) fn client(ca_file: Option<&Path>) -> Result<Client> {
    // The connector sets ALPN itself (HTTP/1.1 only: all the `clickhouse` crate speaks).
    let tls = sheaf_tls::client_config(SslMode::VerifyFull, ca_file)
        .map_err(|e| Error::invalid_input(format!("clickhouse {e}")))?;
    let mut tcp = HttpConnector::new();
    tcp.set_keepalive(Some(TCP_KEEPALIVE));
    tcp.set_nodelay(true);
    // The URL's scheme decides, not the connector.
    tcp.enforce_http(false);
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(tcp);
    let http = HyperClient::builder(TokioExecutor::new())
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .build(connector);
    Ok(Client::with_http_client(http))
}
