//! What the delivery engine tells the rest of the process about each finished turn, for
//! destination health and operator events: which destination, whether an attempt succeeded, and
//! whether the delivery was dead-lettered.
//!
//! The completer sends one batch of [`TurnReport`]s per flush, after the flush's outcomes are
//! written, on a bounded channel ([`TurnReports`]); the destination health task (`health.rs` at
//! the crate's root) turns them into one entity-store call and the operator events. The channel
//! exists only when something consumes it: `SHEAF_DESTINATION_DISABLE_AFTER_FAILURES` above 0 or
//! `SHEAF_OPERATOR_WEBHOOK_URL` set; otherwise the engine builds no reports at all.

use std::sync::Mutex;

use sheaf_store::{DestinationId, EventId, TenantId};
use tokio::sync::mpsc;

/// Batches waiting for the health task. A full channel makes the completer wait: reports are
/// not dropped (a dead letter's operator event must not be lost to a burst).
const CHANNEL_BATCHES: usize = 256;

/// The tenant operator events are published to. Its name starts with `_`, which no tenant made
/// through the API uses by convention; its own deliveries are never counted or reported.
pub const OPERATOR_TENANT: &str = "_sheaf";

/// One finished delivery turn.
#[derive(Debug, Clone)]
pub struct TurnReport {
    /// The delivery's tenant.
    pub tenant_id: TenantId,
    /// Its destination.
    pub destination_id: DestinationId,
    /// Its event.
    pub event_id: EventId,
    /// The attempt made in this turn: `Ok` on success, else what it got, in words. `None` when
    /// no attempt was made (the destination was disabled, the event was gone, …).
    pub attempt: Option<Result<(), String>>,
    /// The attempt's number (the first delivery is 1).
    pub attempt_number: u32,
    /// Why the delivery was dead-lettered in this turn, if it was.
    pub dead_lettered: Option<String>,
}

/// The completer's end of the channel, and the health task's end until it takes it.
#[derive(Debug)]
pub struct TurnReports {
    sender: mpsc::Sender<Vec<TurnReport>>,
    receiver: Mutex<Option<mpsc::Receiver<Vec<TurnReport>>>>,
}

impl TurnReports {
    /// A new channel.
    pub fn new() -> Self {
        let (sender, receiver) = mpsc::channel(CHANNEL_BATCHES);
        TurnReports {
            sender,
            receiver: Mutex::new(Some(receiver)),
        }
    }

    /// Sends a batch, waiting while the channel is full; a batch sent after the health task
    /// stopped (at shutdown) is dropped.
    pub async fn send(&self, reports: Vec<TurnReport>) {
        if !reports.is_empty() {
            let _ = self.sender.send(reports).await;
        }
    }

    /// The receiving end, once.
    pub fn take_receiver(&self) -> Option<mpsc::Receiver<Vec<TurnReport>>> {
        self.receiver
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }
}

impl Default for TurnReports {
    fn default() -> Self {
        Self::new()
    }
}
