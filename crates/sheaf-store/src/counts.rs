//! Attempts counted per time bucket: the [`Buckets`] a count is asked for, and the
//! [`AttemptCounts`] of each (what `LogStore::count_attempts` answers, and the portal charts).

use serde::Serialize;

use crate::{AttemptStatus, Error, Result, Timestamp};

/// The time buckets [`crate::LogStore::count_attempts`] counts in: `count` buckets of `width` each,
/// the first starting at `since`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Buckets {
    /// The start of the first bucket.
    pub since: Timestamp,
    /// How long each bucket is (at least a second).
    pub width: std::time::Duration,
    /// How many buckets (1 to [`Buckets::MAX`]).
    pub count: u32,
}

impl Buckets {
    /// The most buckets one call counts.
    pub const MAX: u32 = 10_000;

    /// The buckets, checked: a width of at least a second, 1 to [`Buckets::MAX`] of them.
    pub fn new(since: Timestamp, width: std::time::Duration, count: u32) -> Result<Self> {
        if width < std::time::Duration::from_secs(1) {
            return Err(Error::invalid_input("a bucket is at least 1 s wide"));
        }
        if !(1..=Self::MAX).contains(&count) {
            return Err(Error::invalid_input(format!(
                "1 to {} buckets, got {count}",
                Self::MAX
            )));
        }
        Ok(Buckets {
            since,
            width,
            count,
        })
    }

    /// The end of the last bucket (exclusive).
    pub fn until(&self) -> Timestamp {
        self.since.saturating_add(self.width * self.count)
    }

    /// Which bucket `time` falls in, if any.
    pub fn index(&self, time: Timestamp) -> Option<usize> {
        if time < self.since || time >= self.until() {
            return None;
        }
        let offset = time.as_micros() - self.since.as_micros();
        Some((offset / self.width.as_micros() as i64) as usize)
    }

    /// Every bucket, counted zero.
    pub fn empty(&self) -> Vec<AttemptCounts> {
        (0..self.count)
            .map(|i| AttemptCounts {
                start: self.since.saturating_add(self.width * i),
                success: 0,
                failed: 0,
                filtered: 0,
            })
            .collect()
    }
}

/// How many attempts succeeded, failed and were filtered in one time bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct AttemptCounts {
    /// The start of the bucket.
    pub start: Timestamp,
    /// Attempts with status `success`.
    pub success: u64,
    /// Attempts with status `failed`.
    pub failed: u64,
    /// Attempts with status `filtered`.
    pub filtered: u64,
}

impl AttemptCounts {
    /// Counts one attempt of `status`.
    pub fn add(&mut self, status: AttemptStatus) {
        match status {
            AttemptStatus::Success => self.success += 1,
            AttemptStatus::Failed => self.failed += 1,
            AttemptStatus::Filtered => self.filtered += 1,
        }
    }
}
