//! Acknowledgement tracking: which WAL position the slot may be advanced to.
//!
//! Every row the reader hands to the consumer is tracked, in hand-off order, with its
//! stamped position ([`crate::Change::ack_lsn`]) and its WAL size (what
//! [`crate::CdcStream::wal_bytes_in_flight`] reports against
//! [`crate::StreamOptions::buffer_bound`]). Acknowledgements may arrive in any
//! order (a consumer may publish rows concurrently), but the confirmed position only
//! moves over the longest fully acknowledged prefix, so the slot never passes a row
//! that is still being handled: acknowledgements advance the slot only in order.
//!
//! A flush whose rows were all dropped by the filter (or a transaction without rows,
//! such as a heartbeat) is tracked as a row-less checkpoint: born acknowledged, resolved
//! as soon as everything before it is, so a filter-only stretch cannot park
//! `confirmed_flush_lsn` (and with it the WAL the server must retain).
//!
//! At most `checkpoint_limit` rows are handed off and not yet confirmed; the reader
//! waits for room before handing off more, except that a batch is always admitted when
//! nothing is pending. Alone, that rule would let one batch larger than the limit pass it;
//! the reader's row cap (half the limit, at least 1) is never larger than the limit, so
//! in-flight rows never exceed it.

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{Notify, watch};

use crate::Lsn;

#[derive(Debug, Clone, Copy)]
struct Entry {
    lsn: Lsn,
    acked: bool,
    /// A row handed to the consumer (counts against the limit), or a row-less checkpoint.
    row: bool,
    /// The row's WAL size ([`crate::Change::wal_bytes`]); 0 for a checkpoint.
    wal_bytes: usize,
}

#[derive(Debug)]
struct State {
    /// Sequence number of `entries[0]`.
    base: u64,
    entries: VecDeque<Entry>,
    /// Rows in `entries` (handed off, not yet confirmed).
    rows_pending: usize,
    /// Their WAL bytes, summed.
    wal_bytes_pending: usize,
    confirmed: Lsn,
    /// The consumer is gone: nobody will acknowledge, waiting for room is pointless.
    closed: bool,
}

/// Shared between the reader (tracks, waits for room) and the consumer's [`AckToken`]s.
pub(crate) struct AckTracker {
    state: Mutex<State>,
    room: Notify,
    confirmed: watch::Sender<Lsn>,
    limit: usize,
}

impl fmt::Debug for AckTracker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AckTracker")
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

impl AckTracker {
    pub(crate) fn new(limit: usize) -> Arc<Self> {
        Arc::new(AckTracker {
            state: Mutex::new(State {
                base: 0,
                entries: VecDeque::new(),
                rows_pending: 0,
                wal_bytes_pending: 0,
                confirmed: Lsn::ZERO,
                closed: false,
            }),
            room: Notify::new(),
            confirmed: watch::Sender::new(Lsn::ZERO),
            limit: limit.max(1),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave the queue half-updated in a way
        // that matters more than losing the whole reader, so a poisoned lock is used as is.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until `rows` more rows fit under the limit (always true with nothing
    /// pending). Returns `false` when the consumer is gone.
    pub(crate) async fn reserve(&self, rows: usize) -> bool {
        loop {
            let notified = self.room.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let state = self.lock();
                if state.closed {
                    return false;
                }
                if state.rows_pending == 0 || state.rows_pending + rows <= self.limit {
                    return true;
                }
            }
            notified.await;
        }
    }

    /// Tracks rows handed to the consumer, each with its stamped position and WAL size;
    /// returns the sequence number of the first.
    pub(crate) fn track(&self, rows: impl Iterator<Item = (Lsn, usize)>) -> u64 {
        let mut state = self.lock();
        let first = state.base + state.entries.len() as u64;
        for (lsn, wal_bytes) in rows {
            state.entries.push_back(Entry {
                lsn,
                acked: false,
                row: true,
                wal_bytes,
            });
            state.rows_pending += 1;
            state.wal_bytes_pending += wal_bytes;
        }
        first
    }

    /// A row-less checkpoint at `lsn`, confirmed once everything before it is.
    pub(crate) fn checkpoint(&self, lsn: Lsn) {
        if lsn.is_zero() {
            return;
        }
        let mut state = self.lock();
        match state.entries.back_mut() {
            // Two checkpoints in a row: the later one covers the earlier, and keeping one
            // bounds the queue while a stuck row holds everything behind it.
            Some(back) if !back.row => back.lsn = back.lsn.max(lsn),
            _ => state.entries.push_back(Entry {
                lsn,
                acked: true,
                row: false,
                wal_bytes: 0,
            }),
        }
        self.resolve(&mut state);
    }

    /// Acknowledges sequence numbers `first..end`.
    fn ack(&self, first: u64, end: u64) {
        let mut state = self.lock();
        let from = first.max(state.base);
        for seq in from..end {
            let index = (seq - state.base) as usize;
            if let Some(entry) = state.entries.get_mut(index) {
                entry.acked = true;
            }
        }
        self.resolve(&mut state);
    }

    fn resolve(&self, state: &mut State) {
        let before = state.confirmed;
        let mut freed = false;
        while let Some(front) = state.entries.front().copied() {
            if !front.acked {
                break;
            }
            state.entries.pop_front();
            state.base += 1;
            if front.row {
                state.rows_pending -= 1;
                state.wal_bytes_pending -= front.wal_bytes;
                freed = true;
            }
            state.confirmed = state.confirmed.max(front.lsn);
        }
        if state.confirmed != before {
            let confirmed = state.confirmed;
            self.confirmed.send_if_modified(|current| {
                let changed = *current != confirmed;
                *current = confirmed;
                changed
            });
        }
        if freed {
            self.room.notify_waiters();
        }
    }

    /// The confirmed position: everything up to it is handled.
    pub(crate) fn confirmed(&self) -> Lsn {
        self.lock().confirmed
    }

    /// Wakes when the confirmed position moves.
    pub(crate) fn subscribe(&self) -> watch::Receiver<Lsn> {
        self.confirmed.subscribe()
    }

    /// Rows handed off and not yet confirmed.
    pub(crate) fn rows_pending(&self) -> usize {
        self.lock().rows_pending
    }

    /// WAL bytes of the rows handed off and not yet confirmed.
    pub(crate) fn wal_bytes_pending(&self) -> usize {
        self.lock().wal_bytes_pending
    }

    /// The consumer is gone; wake a reader waiting for room.
    pub(crate) fn close(&self) {
        self.lock().closed = true;
        self.room.notify_waiters();
    }
}

/// The acknowledgement of one [`crate::CdcMessage`]: call [`AckToken::ack`] once its
/// changes are durably handled (for Sheaf: once the events are durably published).
///
/// Dropping a token without acknowledging is allowed and loses nothing: the slot then
/// never moves past these rows in this session, so they are re-read after a restart.
/// A consumer that cannot handle a message should therefore stop the stream and start
/// it again (at-least-once), not skip it.
#[must_use = "an unacknowledged message holds the slot back; call `ack` once it is durably handled"]
pub struct AckToken {
    tracker: Arc<AckTracker>,
    first: u64,
    end: u64,
    lsn: Lsn,
}

impl fmt::Debug for AckToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AckToken")
            .field("rows", &(self.first..self.end))
            .field("lsn", &self.lsn)
            .finish()
    }
}

impl AckToken {
    pub(crate) fn new(tracker: Arc<AckTracker>, first: u64, end: u64, lsn: Lsn) -> Self {
        AckToken {
            tracker,
            first,
            end,
            lsn,
        }
    }

    /// The position this acknowledgement confirms, once everything before it is confirmed too.
    pub fn lsn(&self) -> Lsn {
        self.lsn
    }

    /// Marks the message handled. The slot advances when every earlier message is
    /// acknowledged too.
    pub fn ack(self) {
        self.tracker.ack(self.first, self.end);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(tracker: &Arc<AckTracker>, first: u64, n: u64, lsn: u64) -> AckToken {
        AckToken::new(Arc::clone(tracker), first, first + n, Lsn(lsn))
    }

    #[test]
    fn out_of_order_acks_confirm_only_the_acknowledged_prefix() {
        let tracker = AckTracker::new(100);
        let first = tracker.track([(Lsn(10), 1), (Lsn(20), 1), (Lsn(30), 1)].into_iter());
        assert_eq!(first, 0);
        token(&tracker, 1, 1, 20).ack();
        token(&tracker, 2, 1, 30).ack();
        assert_eq!(tracker.confirmed(), Lsn::ZERO, "row 0 is still out");
        token(&tracker, 0, 1, 10).ack();
        assert_eq!(tracker.confirmed(), Lsn(30));
        assert_eq!(tracker.rows_pending(), 0);
    }

    #[test]
    fn rowless_checkpoints_wait_behind_rows_and_coalesce() {
        let tracker = AckTracker::new(100);
        tracker.track([(Lsn(10), 1)].into_iter());
        tracker.checkpoint(Lsn(50));
        tracker.checkpoint(Lsn(60));
        tracker.checkpoint(Lsn::ZERO);
        assert_eq!(tracker.confirmed(), Lsn::ZERO);
        token(&tracker, 0, 1, 10).ack();
        assert_eq!(tracker.confirmed(), Lsn(60));
        tracker.checkpoint(Lsn(70));
        assert_eq!(
            tracker.confirmed(),
            Lsn(70),
            "nothing pending: confirmed at once"
        );
    }

    #[test]
    fn confirmed_never_moves_backwards() {
        let tracker = AckTracker::new(100);
        tracker.checkpoint(Lsn(100));
        // A row of an interleaved transaction can have an LSN below an earlier commit.
        tracker.track([(Lsn(40), 1)].into_iter());
        token(&tracker, 1, 1, 40).ack();
        assert_eq!(tracker.confirmed(), Lsn(100));
    }

    #[tokio::test(start_paused = true)]
    async fn reserve_waits_for_room_and_admits_a_batch_when_nothing_is_pending() {
        let tracker = AckTracker::new(4);
        assert!(
            tracker.reserve(10).await,
            "nothing pending: any batch is admitted"
        );
        tracker.track((0..3).map(|n| (Lsn(n), 1)));
        assert!(tracker.reserve(1).await);
        tracker.track([(Lsn(3), 1)].into_iter());
        let waiter = {
            let tracker = Arc::clone(&tracker);
            tokio::spawn(async move { tracker.reserve(2).await })
        };
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "4 pending + 2 > 4");
        token(&tracker, 0, 2, 1).ack();
        assert!(waiter.await.unwrap());
        tracker.close();
        tracker.track((0..10).map(|n| (Lsn(n), 1)));
        assert!(
            !tracker.reserve(1).await,
            "closed: the reader stops waiting"
        );
    }
}
