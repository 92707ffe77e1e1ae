//! Opening one AMQP connection to a checked address.
//!
//! lapin would resolve the URL's host itself, after the guard looked at it, and a name can
//! resolve to something else the second time (DNS rebinding). So the TCP connection (and TLS,
//! for `amqps`) is made here, to an address [`guard::resolve_public`] returned, and lapin is
//! handed the finished stream through [`Connection::connector`]: it never resolves anything.
//!
//! lapin drives each connection from an I/O thread of its own that lives as long as the
//! socket. A handshake given up on (the delivery timed out against a broker that accepted the
//! connection and never answered) would leave that thread waiting on a silent peer, so until
//! the handshake completes the socket is shut down if the attempt is dropped.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use lapin::tcp::RustlsConnector;
use lapin::{AsyncTcpStream, Connection, ConnectionProperties};
use sheaf_destination::guard;
use sheaf_tls::SslMode;

use crate::config::Target;
use crate::error::{Failure, Phase};
use crate::pool::PhaseCell;

/// Opens connections, and counts them.
#[derive(Debug)]
pub(crate) struct Connector {
    allow_private: bool,
    /// The client configuration of `amqps` connections, when the operator gave a CA file;
    /// `None`: the bundled roots alone, built when first needed.
    tls: Option<Arc<rustls::ClientConfig>>,
    opened: AtomicUsize,
}

impl Connector {
    pub(crate) fn new(allow_private: bool, tls: Option<Arc<rustls::ClientConfig>>) -> Self {
        Connector {
            allow_private,
            tls,
            opened: AtomicUsize::new(0),
        }
    }

    /// How many connections were opened so far (handshake completed).
    pub(crate) fn opened(&self) -> usize {
        self.opened.load(Ordering::Relaxed)
    }

    /// A connection to `target`'s broker, logged in and ready for channels.
    pub(crate) async fn open(
        &self,
        target: &Target,
        phase: &PhaseCell,
    ) -> Result<Connection, Failure> {
        phase.set(Phase::Resolving);
        let addresses = guard::resolve_public(&target.host, target.port, self.allow_private)
            .await
            .map_err(|refused| Failure::Refused(refused.0))?;
        let runtime = lapin::runtime::default_runtime().map_err(|error| Failure::Amqp {
            error,
            phase: Phase::Connecting,
        })?;

        phase.set(Phase::Connecting);
        let mut last_error = None;
        let mut connected = None;
        for address in &addresses {
            match AsyncTcpStream::connect(&runtime, *address).await {
                Ok(stream) => {
                    connected = Some(stream);
                    break;
                }
                Err(error) => last_error = Some(format!("{address}: {error}")),
            }
        }
        let Some(stream) = connected else {
            return Err(Failure::Connect {
                address: target.address(),
                error: last_error.unwrap_or_else(|| "no address to connect to".to_owned()),
            });
        };
        // lapin's tokio runtime connects a tokio socket behind a futures-io adapter.
        let shutdown = ShutdownOnDrop(match &stream {
            AsyncTcpStream::Plain(socket) => duplicate(socket.get_ref()),
            _ => None,
        });

        let stream = if target.tls {
            let config = match &self.tls {
                Some(config) => config.clone(),
                None => Arc::new(sheaf_tls::client_config(SslMode::VerifyFull, None).map_err(
                    |e| Failure::Tls {
                        address: target.address(),
                        error: e.to_string(),
                    },
                )?),
            };
            let connector = RustlsConnector::from(config);
            stream
                .into_rustls(&connector, target.server_name())
                .await
                .map_err(|error| Failure::Tls {
                    address: target.address(),
                    error: sheaf_tls::tls_cause(&error).unwrap_or_else(|| error.to_string()),
                })?
        } else {
            stream
        };

        phase.set(Phase::Handshake);
        // lapin asks for the stream through a closure it may call again to reconnect; it
        // does not here (recovery is off: the pool replaces a dead connection itself), and a
        // second call is refused so a reconnect can never bypass the guard.
        let handed = Arc::new(parking_lot::Mutex::new(Some(stream)));
        let connect = async move |_uri, _runtime| -> lapin::Result<_> {
            handed.lock().take().ok_or_else(|| {
                std::io::Error::other("a Sheaf connection is never reopened by lapin").into()
            })
        };
        let properties = ConnectionProperties::default().with_connection_name("sheaf".into());
        let connection = Connection::connector(target.uri.clone(), runtime, connect, properties)
            .await
            .map_err(|error| Failure::Amqp {
                error,
                phase: Phase::Handshake,
            })?;
        shutdown.disarm();
        self.opened.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(broker = %target.address(), "opened an AMQP connection");
        Ok(connection)
    }
}

/// Shuts a socket down when dropped, unless disarmed: the end of a handshake given up on.
struct ShutdownOnDrop(Option<std::net::TcpStream>);

impl ShutdownOnDrop {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for ShutdownOnDrop {
    fn drop(&mut self) {
        if let Some(socket) = self.0.take() {
            let _ = socket.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// A second handle on `socket` (a duplicated descriptor); without one, a handshake given up on
/// ends only when the peer closes.
#[cfg(unix)]
fn duplicate(socket: &tokio::net::TcpStream) -> Option<std::net::TcpStream> {
    use std::os::fd::AsFd as _;
    let owned = socket.as_fd().try_clone_to_owned().ok()?;
    Some(std::net::TcpStream::from(owned))
}

#[cfg(not(unix))]
fn duplicate(_socket: &tokio::net::TcpStream) -> Option<std::net::TcpStream> {
    None
}
