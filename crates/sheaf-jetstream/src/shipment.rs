//! A shipment of the outbox in the bucket: records taken for the log store, held from this
//! process's other shipments until committed (removed from the bucket) or dropped (given back).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use parking_lot::Mutex;
use sheaf_store::{Attempt, Event, Result, Shipment};

use crate::view::View;
use crate::write::{Write, Writer};

/// Records taken for the log store; see [`Shipment`].
pub(crate) struct JetStreamShipment {
    pub(crate) writer: Arc<Writer>,
    pub(crate) view: Arc<View>,
    pub(crate) held: Arc<Mutex<HashSet<u64>>>,
    pub(crate) cache: Arc<Mutex<HashMap<String, Bytes>>>,
    /// Sequence and key of every record taken.
    pub(crate) records: Vec<(u64, String)>,
    pub(crate) events: Vec<Event>,
    pub(crate) attempts: Vec<Attempt>,
}

#[async_trait]
impl Shipment for JetStreamShipment {
    fn events(&self) -> &[Event] {
        &self.events
    }

    fn attempts(&self) -> &[Attempt] {
        &self.attempts
    }

    fn take_records(&mut self) -> (Vec<Event>, Vec<Attempt>) {
        (
            std::mem::take(&mut self.events),
            std::mem::take(&mut self.attempts),
        )
    }

    async fn commit(self: Box<Self>) -> Result<()> {
        // Each record is deleted at the revision read: one rewritten or shipped by another
        // queue meanwhile is left to it.
        let writes: Vec<Write> = self
            .records
            .iter()
            .map(|(sequence, key)| Write::delete(key.clone()).expecting(*sequence))
            .collect();
        self.writer.write(&writes, &self.view).await?;
        let mut cache = self.cache.lock();
        for (_, key) in &self.records {
            cache.remove(key);
        }
        Ok(())
    }
}

impl Drop for JetStreamShipment {
    fn drop(&mut self) {
        let mut held = self.held.lock();
        for (sequence, _) in &self.records {
            held.remove(sequence);
        }
    }
}
