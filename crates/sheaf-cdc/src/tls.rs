//! The replication stream's TLS, which Sheaf terminates itself.
//!
//! The transport crate speaks the replication protocol over a TCP or a Unix socket it opens
//! on its own, and its TLS support would bring a second crypto provider. So for any
//! `sslmode` but `disable`, [`open`] does the secure part first and hands the transport a
//! socket that is already past it:
//!
//! 1. open TCP to the server, send Postgres's TLS request, read its one-byte answer;
//! 2. `S`: run the rustls handshake (ring, `sheaf_tls`'s verifier for the mode), with the
//!    URL's host as the name the certificate must carry; `N`: fail if the mode requires TLS,
//!    otherwise (`prefer`) keep the plaintext socket and warn. A handshake that fails is an
//!    error in every mode, `prefer` included: plaintext is used only when the server itself
//!    says it has no TLS, never because a handshake went wrong;
//! 3. only then create a private directory (mode 0700) holding a Unix listener named as a
//!    Postgres socket (`.s.PGSQL.<port>`), and spawn a task that accepts exactly one
//!    connection, removes the socket and the directory, and copies bytes both ways between
//!    that connection and the established stream until either side closes.
//!
//! The transport is then pointed at the directory, so it runs its startup, authentication
//! and streaming through the bridge without knowing TLS is there. Every refusal and
//! certificate problem is found in step 2 and returned from `connect` in words, never seen
//! later as a socket the transport finds closed. After the handshake the bridge is a copy
//! task and nothing else. Each connect builds its own bridge; the directory is removed on
//! every path, by a guard the task owns.

use std::io;
use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
#[cfg(test)]
use std::time::Duration;

use sheaf_tls::SslMode;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpStream, UnixListener};
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::config::{ConnectionConfig, ConnectionSecurity, TlsSession};
use crate::{Error, Result};

/// Postgres's TLS request: length 8, then the request code 1234.5679 (80877103).
const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];

/// The bridge's buffer for the server's bytes. The stream is almost all server to client
/// (WAL), so a larger buffer here means fewer, larger writes into the Unix socket; the
/// other way only carries status updates and the few setup commands.
const SERVER_TO_CLIENT_BUFFER: usize = 64 * 1024;
const CLIENT_TO_SERVER_BUFFER: usize = 8 * 1024;

/// The connection the transport is to use, decided and secured before it starts.
pub(crate) struct Link {
    /// What the transport connects to: the server's host (`disable`), or the bridge's
    /// directory (any other mode), which it reads as a Unix socket directory.
    pub(crate) host: String,
    /// Whether the connection is encrypted, for the caller to report.
    pub(crate) security: ConnectionSecurity,
    /// Ends a bridge still waiting for its one connection (closing the server connection
    /// and removing the directory) when dropped before [`Link::established`].
    pending: Option<DropGuard>,
}

impl Link {
    /// The transport has connected through the bridge: from now on the bridge lives as long
    /// as the transport's connection does.
    pub(crate) fn established(mut self) {
        if let Some(guard) = self.pending.take() {
            guard.disarm();
        }
    }
}

/// The established connection to the server the bridge copies to.
enum ServerStream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

/// Opens (and for any mode but `disable`, secures) the replication connection's way to the
/// server. See the module documentation.
///
/// # Errors
/// [`Error::Tls`] when the server refuses TLS that the mode requires or the handshake
/// fails; [`Error::Transport`] when the server cannot be reached or the bridge cannot be
/// created; [`Error::Config`] when the CA file cannot be loaded.
pub(crate) async fn open(c: &ConnectionConfig) -> Result<Link> {
    let server = c.server();
    let mode = c.ssl_mode;
    if mode == SslMode::Disable {
        tracing::info!(%server, sslmode = %mode, "replication connection not encrypted");
        return Ok(Link {
            host: c.host.clone(),
            security: ConnectionSecurity {
                server,
                ssl_mode: mode.as_str(),
                tls: None,
            },
            pending: None,
        });
    }
    let io_error = |doing: &str, e: io::Error| {
        Error::Transport(Arc::new(io::Error::new(
            e.kind(),
            format!("{doing} {server}: {e}"),
        )))
    };
    let tls_error = |problem: String| Error::Tls {
        server: server.clone(),
        problem,
    };

    let mut tcp = TcpStream::connect((c.host.as_str(), c.port))
        .await
        .map_err(|e| io_error("connecting to", e))?;
    tcp.set_nodelay(true)
        .map_err(|e| io_error("setting TCP_NODELAY on the connection to", e))?;
    tcp.write_all(&SSL_REQUEST)
        .await
        .map_err(|e| io_error("asking for TLS at", e))?;
    // Exactly one byte, read unbuffered: anything the server (or a party in between) sent
    // after it belongs to the TLS handshake, and rustls rejects it if it is not TLS.
    let answer = tcp
        .read_u8()
        .await
        .map_err(|e| io_error("reading the answer to the TLS request from", e))?;

    let (stream, tls) = match answer {
        b'S' => {
            let (stream, session) = handshake(c, tcp, &tls_error).await?;
            tracing::info!(
                %server,
                sslmode = %mode,
                protocol = %session.protocol,
                cipher_suite = %session.cipher_suite,
                "replication connection encrypted"
            );
            (ServerStream::Tls(Box::new(stream)), Some(session))
        }
        b'N' if mode.requires_tls() => {
            return Err(tls_error(format!(
                "the server refuses TLS, but sslmode={mode} asks for it"
            )));
        }
        b'N' => {
            tracing::warn!(
                %server,
                sslmode = %mode,
                "the server refuses TLS: the replication connection is NOT encrypted"
            );
            (ServerStream::Plain(tcp), None)
        }
        other => {
            return Err(tls_error(format!(
                "the server answered the TLS request with byte {other:#04x}, not S or N \
                 (is it a Postgres server?)"
            )));
        }
    };

    let (dir, listener) = bind_bridge(c.port).map_err(|e| {
        Error::Transport(Arc::new(io::Error::new(
            e.kind(),
            format!("creating the local socket for the replication connection to {server}: {e}"),
        )))
    })?;
    let host = dir
        .dir
        .to_str()
        .ok_or_else(|| {
            Error::Transport(Arc::new(io::Error::other(format!(
                "the temporary directory {} is not valid UTF-8",
                dir.dir.display()
            ))))
        })?
        .to_owned();
    let cancel = CancellationToken::new();
    tokio::spawn(bridge(
        listener,
        dir,
        stream,
        cancel.clone(),
        server.clone(),
    ));
    Ok(Link {
        host,
        security: ConnectionSecurity {
            server,
            ssl_mode: mode.as_str(),
            tls,
        },
        pending: Some(cancel.drop_guard()),
    })
}

/// The rustls handshake on `tcp` for the connection's mode and CA file.
async fn handshake(
    c: &ConnectionConfig,
    tcp: TcpStream,
    tls_error: &impl Fn(String) -> Error,
) -> Result<(TlsStream<TcpStream>, TlsSession)> {
    let mode = c.ssl_mode;
    let ca_file = c.trusted_ca_file();
    let config = sheaf_tls::client_config(mode, ca_file)
        .map_err(|e| Error::Config(format!("replication connection: {e}")))?;
    // An address parses as an IP name (checked against the certificate's IP SANs), anything
    // else as a DNS name.
    let name = ServerName::try_from(c.host.clone()).map_err(|_| {
        tls_error(format!(
            "the host {:?} is neither an IP address nor a valid DNS name for TLS",
            c.host
        ))
    })?;
    let stream = TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| {
            let cause = sheaf_tls::tls_cause(&e)
                .unwrap_or_else(|| format!("the TLS handshake failed: {e}"));
            tls_error(format!(
                "{cause} (sslmode={mode}{})",
                trusting(mode, ca_file)
            ))
        })?;
    let (_, connection) = stream.get_ref();
    let protocol = connection
        .protocol_version()
        .map(|v| v.as_str().map_or_else(|| format!("{v:?}"), str::to_owned))
        .unwrap_or_default();
    let cipher_suite = connection
        .negotiated_cipher_suite()
        .map(|s| {
            let suite = s.suite();
            suite
                .as_str()
                .map_or_else(|| format!("{suite:?}"), str::to_owned)
        })
        .unwrap_or_default();
    Ok((
        stream,
        TlsSession {
            protocol,
            cipher_suite,
        },
    ))
}

/// What a verifying mode trusted, for a handshake error: which CA file, if any, joined the
/// bundled roots is the first thing an operator checks.
fn trusting(mode: SslMode, ca_file: Option<&Path>) -> String {
    match (mode, ca_file) {
        (SslMode::VerifyCa | SslMode::VerifyFull, Some(file)) => {
            format!(", trusting the bundled roots and {}", file.display())
        }
        (SslMode::VerifyCa | SslMode::VerifyFull, None) => {
            ", trusting the bundled roots only (set sslrootcert or a CA file for a private CA)"
                .to_owned()
        }
        _ => String::new(),
    }
}

/// The bridge's private directory and its socket, removed when dropped.
struct BridgeDir {
    dir: PathBuf,
    socket: PathBuf,
}

impl Drop for BridgeDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.socket);
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Creates a new directory only this user can enter, and a listener in it named as the
/// transport expects a Postgres socket for `port` to be named.
fn bind_bridge(port: u16) -> io::Result<(BridgeDir, UnixListener)> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    // The transport reads a host starting with `/` as a socket directory.
    let base = std::path::absolute(std::env::temp_dir())?;
    let mut attempts = 0;
    let dir = loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = base.join(format!("sheaf-cdc-{}-{n}", std::process::id()));
        // `create`, not `create_all`: it fails on a directory that exists, so a directory
        // someone else prepared is never used.
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => break dir,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && attempts < 64 => attempts += 1,
            Err(e) => return Err(e),
        }
    };
    let socket = dir.join(format!(".s.PGSQL.{port}"));
    let guard = BridgeDir { dir, socket };
    let listener = UnixListener::bind(&guard.socket)?;
    Ok((guard, listener))
}

/// Accepts the transport's one connection, removes the socket and its directory, and
/// copies bytes both ways until either side closes. Stops, closing the server connection,
/// when `cancel` fires before the transport connects.
async fn bridge(
    listener: UnixListener,
    dir: BridgeDir,
    server_stream: ServerStream,
    cancel: CancellationToken,
    server: String,
) {
    let accepted = tokio::select! {
        accepted = listener.accept() => Some(accepted),
        () = cancel.cancelled() => None,
    };
    // Nobody else can connect from here on; the directory goes before the server
    // connection does, whatever happened.
    drop(listener);
    drop(dir);
    let mut local = match accepted {
        Some(Ok((local, _))) => local,
        None => return,
        Some(Err(e)) => {
            tracing::warn!(%server, error = %e, "the replication bridge could not accept the transport's connection");
            return;
        }
    };
    let copied = match server_stream {
        ServerStream::Plain(mut tcp) => {
            tokio::io::copy_bidirectional_with_sizes(
                &mut local,
                &mut tcp,
                CLIENT_TO_SERVER_BUFFER,
                SERVER_TO_CLIENT_BUFFER,
            )
            .await
        }
        ServerStream::Tls(mut tls) => {
            tokio::io::copy_bidirectional_with_sizes(
                &mut local,
                &mut *tls,
                CLIENT_TO_SERVER_BUFFER,
                SERVER_TO_CLIENT_BUFFER,
            )
            .await
        }
    };
    match copied {
        Ok((sent, received)) => {
            tracing::debug!(%server, sent, received, "replication connection closed");
        }
        // The transport sees the same failure as a closed socket and reports it.
        Err(e) => tracing::debug!(%server, error = %e, "replication connection ended"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server on loopback that reads the TLS request, answers `answer`, then echoes
    /// what arrives after it, upper-cased, until the client closes.
    async fn fake_server(answer: u8) -> (ConnectionConfig, tokio::task::JoinHandle<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut request = [0; 8];
            socket.read_exact(&mut request).await.unwrap();
            assert_eq!(request, SSL_REQUEST);
            socket.write_all(&[answer]).await.unwrap();
            let mut buffer = [0; 64];
            loop {
                let n = socket.read(&mut buffer).await.unwrap_or(0);
                if n == 0 {
                    break;
                }
                buffer[..n].make_ascii_uppercase();
                socket.write_all(&buffer[..n]).await.unwrap();
            }
        });
        let config =
            ConnectionConfig::from_url(&format!("postgres://u@127.0.0.1:{port}/d")).unwrap();
        (config, task)
    }

    #[tokio::test]
    async fn a_refusal_is_an_error_when_the_mode_requires_tls() {
        let (mut config, _server) = fake_server(b'N').await;
        config.ssl_mode = SslMode::VerifyFull;
        let Err(err) = open(&config).await else {
            panic!("verify-full must not go on in plaintext");
        };
        assert_eq!(
            err.to_string(),
            format!(
                "TLS with the server at {}: the server refuses TLS, but sslmode=verify-full asks for it",
                config.server()
            )
        );
    }

    #[tokio::test]
    async fn an_answer_that_is_not_postgres_is_named() {
        let (mut config, _server) = fake_server(b'H').await;
        config.ssl_mode = SslMode::Require;
        let Err(err) = open(&config).await else {
            panic!("an unknown answer must fail");
        };
        assert!(err.to_string().contains("byte 0x48"), "{err}");
    }

    #[tokio::test]
    async fn prefer_bridges_the_plaintext_socket_once_and_removes_it() {
        let (config, server) = fake_server(b'N').await;
        assert_eq!(config.ssl_mode, SslMode::Prefer);
        let link = open(&config).await.unwrap();
        assert!(!link.security.is_encrypted());
        assert!(link.host.starts_with('/'), "{}", link.host);
        let dir = PathBuf::from(&link.host);
        let socket = dir.join(format!(".s.PGSQL.{}", config.port));
        let mut local = tokio::net::UnixStream::connect(&socket).await.unwrap();
        link.established();
        local.write_all(b"hello").await.unwrap();
        let mut echoed = [0; 5];
        local.read_exact(&mut echoed).await.unwrap();
        assert_eq!(&echoed, b"HELLO");
        assert!(
            !dir.exists(),
            "the directory goes once the one connection is accepted"
        );
        drop(local);
        // The server sees the close through the bridge.
        tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .unwrap()
            .unwrap();
    }

    #[tokio::test]
    async fn a_link_dropped_before_the_transport_connects_removes_its_directory() {
        let (config, server) = fake_server(b'N').await;
        let link = open(&config).await.unwrap();
        let dir = PathBuf::from(&link.host);
        assert!(dir.exists());
        drop(link);
        tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .unwrap()
            .unwrap();
        assert!(!dir.exists());
    }

    #[tokio::test]
    async fn the_bridge_directory_is_private_and_removed() {
        use std::os::unix::fs::PermissionsExt as _;
        let (dir, listener) = bind_bridge(5432).unwrap();
        let mode = std::fs::metadata(&dir.dir).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        assert!(dir.socket.ends_with(".s.PGSQL.5432"));
        assert!(dir.socket.exists());
        let path = dir.dir.clone();
        drop(listener);
        drop(dir);
        assert!(!path.exists());
    }
}
