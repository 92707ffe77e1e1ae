//! The channel of claimed jobs into this process's workers, and the hand-off that lets a publish
//! fill it without a claim.
//!
//! The channel holds at most as many jobs as there are workers. Two senders fill it: the
//! dispatcher, with what it claims from the queue, and the group commit of publishes
//! ([`crate::state::intake`]). Before each accept, the group commit reserves the slots that are
//! free, and offers the outbox that many leases: the new jobs commit already leased to this
//! process and go straight to the workers, so a delivery of an event this process accepted
//! costs no claim statement (and no second version of its job row). What does not fit waits in
//! the queue for the dispatcher, here or in another process. A handed-over job is an ordinary
//! claimed job from then on: if the process dies, its lease runs out and any claim takes it.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use sheaf_store::ClaimedJob;
use tokio::sync::mpsc;
use tokio::sync::mpsc::PermitIterator;
use tokio::time::Instant;

/// A claimed job on its way to a worker, with when it was claimed (the lease's age is
/// measured on this process's clock, so clock skew with the database does not matter).
#[derive(Debug)]
pub struct Dispatched {
    /// The job and its lease.
    pub claimed: ClaimedJob,
    /// When the claim (or the accept that leased it) started: never later than the lease's
    /// start on the queue's clock.
    pub claimed_at: Instant,
}

/// The workers' channel: see the module docs.
#[derive(Debug)]
pub struct JobChannel {
    tx: mpsc::Sender<Dispatched>,
    rx: Mutex<Option<mpsc::Receiver<Dispatched>>>,
    /// Set once the delivery engine took the receiver: before that nobody would run a job
    /// handed over.
    open: AtomicBool,
}

impl JobChannel {
    /// A channel of `capacity` slots (one per worker).
    pub fn new(capacity: usize) -> Self {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        Self {
            tx,
            rx: Mutex::new(Some(rx)),
            open: AtomicBool::new(false),
        }
    }

    /// The receiving end, for the delivery engine: `None` after the first call.
    pub fn take_receiver(&self) -> Option<mpsc::Receiver<Dispatched>> {
        let rx = self.rx.lock().ok()?.take();
        if rx.is_some() {
            self.open.store(true, Ordering::Release);
        }
        rx
    }

    /// A sending end, for the dispatcher.
    pub fn sender(&self) -> mpsc::Sender<Dispatched> {
        self.tx.clone()
    }

    /// Reserves up to `wanted` free slots for jobs a publish is about to lease; none while no
    /// engine runs, after it closed the channel, or when every slot is taken.
    pub fn reserve(&self, wanted: usize) -> Option<PermitIterator<'_, Dispatched>> {
        if wanted == 0 || !self.open.load(Ordering::Acquire) {
            return None;
        }
        // The dispatcher may take slots between the two calls: then try once more with less.
        for _ in 0..2 {
            let n = wanted.min(self.tx.capacity());
            if n == 0 {
                return None;
            }
            if let Ok(permits) = self.tx.try_reserve_many(n) {
                return Some(permits);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_is_reserved_before_the_engine_takes_the_receiver() {
        let channel = JobChannel::new(4);
        assert!(channel.reserve(2).is_none());
        let rx = channel.take_receiver().expect("the receiver");
        assert!(channel.take_receiver().is_none(), "only once");
        assert_eq!(
            channel.reserve(9).map(|p| p.len()),
            Some(4),
            "at most the free slots"
        );
        drop(rx);
        assert!(
            channel.reserve(1).is_none(),
            "a closed channel takes nothing"
        );
    }
}
