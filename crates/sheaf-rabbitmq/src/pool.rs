//! What is kept between deliveries: per destination, one connection and a few channels on it.
//!
//! - A [`Link`] per destination id remembers the `config` it was made for; a delivery with a
//!   different `config` replaces it (the old connection closes once its last delivery ends).
//! - A link holds at most one [`Session`] (an open connection) at a time. Deliveries that find
//!   none wait while one of them connects, so a burst opens one connection, not fifty.
//! - A session keeps up to [`MAX_CHANNELS`] channels, each in confirm mode. A delivery leases
//!   one ([`Lease`]) and gives it back if it is still open; a channel the broker closed (a 404)
//!   is dropped and a fresh one opened next time. Publishes on one channel are confirmed in
//!   order, so separate channels let concurrent deliveries wait for their confirms side by side.
//! - A session whose connection died (the broker restarted) is dropped when a delivery notices,
//!   and the next delivery connects again.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use lapin::options::ConfirmSelectOptions;
use lapin::{Channel, Connection};
use serde_json::Value;
use sheaf_store::DestinationId;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::{self, Target};
use crate::connect::Connector;
use crate::error::{Failure, Phase};

/// Channels per connection, and so deliveries in flight per destination. A delivery holds its
/// channel until the broker confirms a persistent message, which waits for the broker's disk,
/// so the channels bound the rate: with 8, one process delivered 2,130 events/s to a local
/// broker, with 32 (the default worker count, so every worker can have one) 4,000/s
/// (docs/benchmarks.md, `destinations`). Channels are cheap for a broker (its default limit is
/// 2,047 per connection).
pub(crate) const MAX_CHANNELS: usize = 32;

/// What a delivery is doing, readable after a timeout dropped it.
#[derive(Debug, Default)]
pub(crate) struct PhaseCell(AtomicU8);

impl PhaseCell {
    pub(crate) fn set(&self, phase: Phase) {
        self.0.store(phase as u8, Ordering::Relaxed);
    }

    pub(crate) fn get(&self) -> Phase {
        Phase::from_u8(self.0.load(Ordering::Relaxed))
    }
}

/// Every destination's link, by id.
#[derive(Debug, Default)]
pub(crate) struct Pool {
    links: parking_lot::Mutex<HashMap<DestinationId, Arc<Link>>>,
}

impl Pool {
    /// The link of `destination` for `config`: the kept one if it was made for the same
    /// `config`, otherwise a new one in its place.
    pub(crate) fn link(
        &self,
        destination: DestinationId,
        config: &Value,
    ) -> Result<Arc<Link>, Failure> {
        if let Some(link) = self.links.lock().get(&destination)
            && link.config == *config
        {
            return Ok(link.clone());
        }
        // Parsed outside the lock; cheap, and only when the config is new or changed.
        let (target, _) = config::parse(config).map_err(|e| Failure::Config(e.to_string()))?;
        let mut links = self.links.lock();
        match links.get(&destination) {
            // Another delivery of the same new config got here first.
            Some(link) if link.config == *config => Ok(link.clone()),
            _ => {
                let link = Arc::new(Link::new(config.clone(), target));
                if links.insert(destination, link.clone()).is_some() {
                    tracing::debug!(%destination, "the destination's config changed: replacing its connection");
                }
                Ok(link)
            }
        }
    }

    /// Drops what is kept for `destination`.
    pub(crate) fn forget(&self, destination: DestinationId) {
        let removed = self.links.lock().remove(&destination);
        // Dropped outside the lock: the connection's close is sent from here.
        drop(removed);
    }
}

/// One destination's connection, for the `config` it was opened with.
#[derive(Debug)]
pub(crate) struct Link {
    config: Value,
    pub(crate) target: Target,
    channels: Arc<Semaphore>,
    session: tokio::sync::Mutex<Option<Arc<Session>>>,
}

impl Link {
    fn new(config: Value, target: Target) -> Self {
        Link {
            config,
            target,
            channels: Arc::new(Semaphore::new(MAX_CHANNELS)),
            session: tokio::sync::Mutex::new(None),
        }
    }

    /// A channel to publish on, connecting first if there is no open connection.
    pub(crate) async fn lease(
        &self,
        connector: &Connector,
        phase: &PhaseCell,
    ) -> Result<Lease, Failure> {
        phase.set(Phase::WaitingForChannel);
        let permit = self
            .channels
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| Failure::Amqp {
                error: lapin::ErrorKind::ChannelsLimitReached.into(),
                phase: Phase::WaitingForChannel,
            })?;
        let session = self.session(connector, phase).await?;
        if let Some(channel) = session.idle_channel() {
            return Ok(Lease {
                session,
                channel,
                _permit: permit,
            });
        }
        phase.set(Phase::OpeningChannel);
        let channel = session
            .open_channel()
            .await
            .inspect_err(|_| session.poison())?;
        Ok(Lease {
            session,
            channel,
            _permit: permit,
        })
    }

    async fn session(
        &self,
        connector: &Connector,
        phase: &PhaseCell,
    ) -> Result<Arc<Session>, Failure> {
        let mut slot = self.session.lock().await;
        if let Some(session) = slot.as_ref() {
            if session.is_open() {
                return Ok(session.clone());
            }
            tracing::debug!(broker = %self.target.address(), "the AMQP connection is closed: reconnecting");
            *slot = None;
        }
        let connection = connector.open(&self.target, phase).await?;
        let session = Arc::new(Session::new(connection));
        *slot = Some(session.clone());
        Ok(session)
    }
}

/// An open connection and its idle channels.
pub(crate) struct Session {
    connection: Connection,
    idle: parking_lot::Mutex<Vec<Channel>>,
    /// Set when a delivery saw the connection fail or stop answering; the next delivery
    /// replaces it even if lapin still calls it open.
    poisoned: AtomicBool,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("connected", &self.connection.status().connected())
            .field("idle", &self.idle.lock().len())
            .finish_non_exhaustive()
    }
}

impl Session {
    fn new(connection: Connection) -> Self {
        Session {
            connection,
            idle: parking_lot::Mutex::new(Vec::with_capacity(MAX_CHANNELS)),
            poisoned: AtomicBool::new(false),
        }
    }

    fn is_open(&self) -> bool {
        !self.poisoned.load(Ordering::Relaxed) && self.connection.status().connected()
    }

    /// Marks the connection as not to be used again.
    pub(crate) fn poison(&self) {
        self.poisoned.store(true, Ordering::Relaxed);
    }

    fn idle_channel(&self) -> Option<Channel> {
        let mut idle = self.idle.lock();
        while let Some(channel) = idle.pop() {
            if channel.status().connected() {
                return Some(channel);
            }
        }
        None
    }

    async fn open_channel(&self) -> Result<Channel, Failure> {
        let failed = |error| Failure::Amqp {
            error,
            phase: Phase::OpeningChannel,
        };
        let channel = self.connection.create_channel().await.map_err(failed)?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(failed)?;
        Ok(channel)
    }
}

/// A channel lent to one delivery. Dropped without [`Lease::give_back`] (the delivery failed
/// or timed out on it), the channel is closed instead of reused.
#[derive(Debug)]
pub(crate) struct Lease {
    pub(crate) session: Arc<Session>,
    pub(crate) channel: Channel,
    _permit: OwnedSemaphorePermit,
}

impl Lease {
    /// Returns the channel for the next delivery, if it is still open.
    pub(crate) fn give_back(self) {
        let Lease {
            session,
            channel,
            _permit,
        } = self;
        if channel.status().connected() {
            session.idle.lock().push(channel);
        }
    }
}
