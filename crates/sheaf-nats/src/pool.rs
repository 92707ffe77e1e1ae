//! One NATS connection per destination, shared by its concurrent deliveries.
//!
//! An async-nats [`Client`] multiplexes any number of requests over one connection and is
//! cheap to clone, so a destination needs exactly one. It is kept with the `config` it was
//! opened for; a delivery with another `config` (the destination was changed) replaces it, and
//! [`Pool::forget`] drops it.
//!
//! A kept connection is used only while async-nats reports it connected. async-nats buffers
//! what is published while it is disconnected and reconnects in the background; left to
//! itself, a delivery to a stopped server would wait in that buffer. Instead, a delivery that
//! finds the connection down drops it and opens a new one (through the guard, so a name that
//! now resolves elsewhere is checked again), and the background reconnects are capped
//! ([`RECONNECT_ATTEMPTS`]) so a dropped client's task ends soon after. Connecting is done by
//! one delivery at a time per destination: the others wait for its connection instead of
//! opening fifty of their own, and every wait is inside the caller's delivery timeout.

use std::collections::HashMap;
use std::str::FromStr as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_nats::connection::State;
use async_nats::jetstream::{self, context::ContextBuilder};
use async_nats::{Client, ConnectErrorKind, ConnectOptions, ServerAddr};
use serde_json::Value;
use sheaf_destination::guard;
use sheaf_store::DestinationId;

use crate::NatsSettings;
use crate::config::{Credentials, Target};
use crate::publish::Failure;

/// How often async-nats may try to bring a lost connection back by itself before giving up.
/// Few: a delivery that finds the connection down opens a new one anyway, so these attempts
/// only help a connection that drops and returns between two deliveries; and once the pool has
/// dropped a client, its background task ends only when they run out.
const RECONNECT_ATTEMPTS: usize = 3;

/// How often a connection pings the server. Two unanswered pings close it, so a connection
/// whose server vanished without closing it (a host gone, a dropped route) is found dead in
/// about half a minute rather than the two minutes of async-nats's default.
const PING_INTERVAL: Duration = Duration::from_secs(10);

/// A destination's connection: the client and the JetStream context publishing through it.
#[derive(Debug, Clone)]
pub(crate) struct Connection {
    pub client: Client,
    pub jetstream: jetstream::Context,
}

/// The kept connections, by destination.
#[derive(Debug, Default)]
pub(crate) struct Pool {
    slots: Mutex<HashMap<DestinationId, Arc<Slot>>>,
    opened: AtomicUsize,
}

/// One destination's place in the pool: the config its connection is for, and the connection
/// once opened. The async mutex makes connecting single-flight.
#[derive(Debug)]
struct Slot {
    config: Value,
    connection: tokio::sync::Mutex<Option<Connection>>,
}

impl Pool {
    /// The destination's connection, opened now if there is none for `config` or the kept one
    /// is down.
    pub(crate) async fn connection(
        &self,
        destination: DestinationId,
        config: &Value,
        target: &Target,
        settings: &NatsSettings,
        roots: &Arc<rustls::RootCertStore>,
    ) -> Result<Connection, Failure> {
        let slot = self.slot(destination, config);
        let mut kept = slot.connection.lock().await;
        if let Some(connection) = kept.as_ref() {
            match connection.client.connection_state() {
                State::Connected => return Ok(connection.clone()),
                state => {
                    tracing::debug!(%destination, url = %target.shown, ?state, "the kept NATS connection is down; opening a new one");
                    *kept = None;
                }
            }
        }
        let connection = open(target, settings, roots).await?;
        self.opened.fetch_add(1, Ordering::Relaxed);
        *kept = Some(connection.clone());
        Ok(connection)
    }

    /// The destination's slot for `config`, a new one if it had none or one for another config.
    fn slot(&self, destination: DestinationId, config: &Value) -> Arc<Slot> {
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        match slots.get(&destination) {
            Some(slot) if slot.config == *config => slot.clone(),
            _ => {
                let slot = Arc::new(Slot {
                    config: config.clone(),
                    connection: tokio::sync::Mutex::new(None),
                });
                slots.insert(destination, slot.clone());
                slot
            }
        }
    }

    /// Drops the destination's connection (deliveries still using it finish on their clones).
    pub(crate) fn forget(&self, destination: DestinationId) {
        self.slots
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&destination);
    }

    /// How many connections were opened so far.
    pub(crate) fn opened(&self) -> usize {
        self.opened.load(Ordering::Relaxed)
    }
}

/// Opens a connection to the target: to the addresses the guard approved, never to a name
/// async-nats would resolve itself, nor to servers a cluster advertises.
async fn open(
    target: &Target,
    settings: &NatsSettings,
    roots: &Arc<rustls::RootCertStore>,
) -> Result<Connection, Failure> {
    let shown = &target.shown;
    let addresses = guard::resolve_public(&target.host, target.port, settings.allow_private)
        .await
        .map_err(|refused| Failure::retry(format!("not connecting to {shown}: {}", refused.0)))?;
    let scheme = if target.tls { "tls" } else { "nats" };
    let servers = addresses
        .iter()
        .map(|address| ServerAddr::from_str(&format!("{scheme}://{address}")))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Failure::permanent(format!("{shown}: {e}")))?;

    let mut options = ConnectOptions::new()
        .name("sheaf")
        .connection_timeout(settings.timeout)
        .request_timeout(Some(settings.timeout))
        .ignore_discovered_servers()
        .max_reconnects(RECONNECT_ATTEMPTS)
        .reconnect_delay_callback(reconnect_delay)
        .ping_interval(PING_INTERVAL)
        .require_tls(target.tls);
    // Always given, not only for tls://: a nats:// server may require TLS, and the client then
    // upgrades with this configuration, so the certificate is checked for the configured host.
    match crate::tls::client_config(&target.host, roots) {
        Ok(tls) => options = options.tls_client_config(tls),
        Err(e) if target.tls => return Err(Failure::permanent(format!("{shown}: {e}"))),
        Err(_) => {}
    }
    options = match &target.credentials {
        Credentials::None => options,
        Credentials::Token(token) => options.token(token.clone()),
        Credentials::UserPassword { user, password } => {
            options.user_and_password(user.clone(), password.clone())
        }
    };

    let client = options
        .connect(servers)
        .await
        .map_err(|e| connect_failure(target, &e, settings.timeout))?;
    let jetstream = ContextBuilder::new()
        .timeout(settings.timeout)
        // Acks of deliveries that timed out are not waited for longer than a delivery would.
        .ack_timeout(settings.timeout)
        .build(client.clone());
    Ok(Connection { client, jetstream })
}

/// The wait before connect attempt `attempt` (from 1). async-nats waits this before the first
/// connect of a delivery too, so that one must be immediate; the background reconnects of a
/// lost connection then wait 100 ms more each time (0, 100, 200 ms).
fn reconnect_delay(attempt: usize) -> Duration {
    let waits = u32::try_from(attempt.saturating_sub(1)).unwrap_or(u32::MAX);
    Duration::from_millis(100).saturating_mul(waits)
}

/// Words for a failed connect. All are retryable: a server that is down, slow, presenting a
/// certificate about to be renewed, or briefly refusing credentials that are being rotated can
/// each be fine on the next attempt, and the retry schedule dead-letters the event if not.
fn connect_failure(
    target: &Target,
    error: &async_nats::ConnectError,
    timeout: Duration,
) -> Failure {
    let shown = &target.shown;
    let cause = std::error::Error::source(error)
        .map(ToString::to_string)
        .unwrap_or_else(|| error.to_string());
    // A failed handshake comes back as an I/O error wrapping rustls's: look for it first.
    if let Some(why) = sheaf_tls::tls_cause(error) {
        return Failure::retry(format!("TLS with {shown} failed: {why}"));
    }
    Failure::retry(match error.kind() {
        ConnectErrorKind::TimedOut => {
            format!("connecting to {shown} timed out after {timeout:?} (no NATS server answered)")
        }
        ConnectErrorKind::Tls => format!("TLS with {shown} failed: {cause}"),
        ConnectErrorKind::Authentication | ConnectErrorKind::AuthorizationViolation => {
            format!("{shown} refused the connection's credentials: {error}")
        }
        _ => format!("cannot connect to {shown}: {cause}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_failures_say_what_failed_without_the_password() {
        let target =
            Target::parse(&serde_json::json!({"url": "tls://u:hunter2@h:1", "subject": "a"}))
                .unwrap();
        let handshake = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
        );
        let error = async_nats::ConnectError::with_source(ConnectErrorKind::Io, handshake);
        let report =
            connect_failure(&target, &error, Duration::from_secs(2)).report(Duration::ZERO);
        assert_eq!(
            report.error.as_deref(),
            Some(
                "TLS with tls://u@h:1 failed: the server's certificate is not signed by a trusted CA"
            )
        );
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let error = async_nats::ConnectError::with_source(ConnectErrorKind::Io, refused);
        let report =
            connect_failure(&target, &error, Duration::from_secs(2)).report(Duration::ZERO);
        let text = report.error.unwrap();
        assert!(
            text.starts_with("cannot connect to tls://u@h:1: "),
            "{text}"
        );
        assert!(!text.contains("hunter2"), "{text}");
    }

    #[test]
    fn the_first_connect_does_not_wait() {
        assert_eq!(reconnect_delay(0), Duration::ZERO);
        assert_eq!(reconnect_delay(1), Duration::ZERO);
        assert_eq!(reconnect_delay(2), Duration::from_millis(100));
        assert_eq!(reconnect_delay(3), Duration::from_millis(200));
    }
}
