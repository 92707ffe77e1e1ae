//! [`Space`]: the size cap (`SqliteOptions::max_size_bytes`) kept as a door, not a wall.
//!
//! SQLite enforces a cap by failing the write that would pass it, whatever that write is. Left
//! at that, a flood during a receiver outage fills the file with events waiting for delivery,
//! and then the writes that would empty it fail too: recording the attempts once the receiver
//! is back, rescheduling the jobs, removing the delivered ones. So the store keeps room for
//! them, and counts it as taken:
//!
//! - **what is committed**: the pages in use (the file's pages less its free list) and, for
//!   every job in the queue, an allowance for its next two attempt records (an attempt with its
//!   indexes takes under a kilobyte; two, because the older of a job's attempts goes only at
//!   retention's next pass, seconds later);
//! - **the door**: once what is committed reaches the cap less a reserve of an eighth (for
//!   what moves between two measurements: rescheduled jobs, index pages, retention's own
//!   writes), new events (accepting, inserting, enqueueing) are refused as `Unavailable`, which
//!   the service answers with a 503, while deliveries and retention write on;
//! - **pressure**: once what is committed passes the cap less twice the reserve, retention drops
//!   the oldest records no delivery waits for, beyond what its count and age bounds ask, until
//!   it is back under that mark, and then the failed attempts of waiting deliveries that a later
//!   attempt supersedes (a retry reads only the latest). A log that fills its cap with
//!   delivered history makes room by itself; only events still waiting for delivery keep the
//!   door shut, and they leave as they are delivered.
//!
//! The writer reads the pages in use after every committed flush (a read of the file's header)
//! and counts the queue at most every [`MEASURE_EVERY`] (that reads an index), so the door lags
//! the file by one flush and the queue by a few milliseconds of writes, which the reserve
//! absorbs; each retention pass ends with a full measurement, so a door shut while nothing else
//! is written opens within a pass of retention freeing space.

use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use rusqlite::Connection;
use sheaf_store::{Error, Result};

use crate::error::Doing;

/// SQLite's default page size, which this crate never changes.
pub(crate) const PAGE_BYTES: u64 = 4096;

/// The room kept for each queued job's next attempt records (see the module docs).
const JOB_ALLOWANCE_BYTES: i64 = 2048;

/// How often the writer counts the queue, at most (the pages in use it reads after every
/// flush: a read of the file's header).
const MEASURE_EVERY: Duration = Duration::from_millis(20);

/// The cap, its door and what is committed, shared by the writer (which measures) and the
/// stores (which ask).
#[derive(Debug)]
pub(crate) struct Space {
    max_pages: i64,
    reserve_pages: i64,
    used_pages: AtomicI64,
    jobs: AtomicI64,
    counted: Mutex<Option<Instant>>,
}

impl Space {
    /// The door over a cap of `max_bytes`.
    pub(crate) fn new(max_bytes: u64) -> Self {
        let max_pages = i64::try_from(max_bytes / PAGE_BYTES).unwrap_or(i64::MAX);
        Space {
            max_pages,
            reserve_pages: (max_pages / 8).max(1),
            used_pages: AtomicI64::new(0),
            jobs: AtomicI64::new(0),
            counted: Mutex::new(None),
        }
    }

    /// Reads the pages in use on `connection` (the writer: it sees the file as its last
    /// statement left it), and the queued jobs too unless it counted them less than
    /// [`MEASURE_EVERY`] ago and `always` is false. Retention's passes measure always, so the
    /// count is never further behind the queue than one pass (seconds), even when no other
    /// write follows.
    pub(crate) fn measure(&self, connection: &Connection, always: bool) -> Result<()> {
        let count_jobs = {
            let mut counted = self.counted.lock().unwrap_or_else(|e| e.into_inner());
            let due = always || counted.is_none_or(|at| at.elapsed() >= MEASURE_EVERY);
            if due {
                *counted = Some(Instant::now());
            }
            due
        };
        let doing = "measuring the database's size";
        let used: i64 = connection
            .prepare_cached(
                "SELECT (SELECT page_count FROM pragma_page_count())
                      - (SELECT freelist_count FROM pragma_freelist_count())",
            )
            .and_then(|mut statement| statement.query_row([], |row| row.get(0)))
            .doing(doing)?;
        self.used_pages.store(used, Ordering::Relaxed);
        if count_jobs {
            let jobs: i64 = connection
                .prepare_cached("SELECT count(*) FROM jobs")
                .and_then(|mut statement| statement.query_row([], |row| row.get(0)))
                .doing(doing)?;
            self.jobs.store(jobs, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Pages in use plus the queued jobs' allowance.
    fn committed(&self) -> i64 {
        let allowance = self.jobs.load(Ordering::Relaxed) * JOB_ALLOWANCE_BYTES / PAGE_BYTES as i64;
        self.used_pages.load(Ordering::Relaxed) + allowance
    }

    /// `Ok` while new events fit in front of the reserve; otherwise `Unavailable`, saying how
    /// full the file is and why it refuses (`doing`: what was refused, lower case).
    pub(crate) fn admit(&self, doing: &str) -> Result<()> {
        let committed = self.committed();
        if committed < self.max_pages - self.reserve_pages {
            return Ok(());
        }
        let used = self.used_pages.load(Ordering::Relaxed);
        Err(Error::Unavailable {
            message: format!(
                "{doing}: the sqlite database is full: {} of its {} size limit in use and {} \
                 kept for the attempts of {} waiting deliveries, past the last {} kept for \
                 writes in flight; new events are refused until deliveries and retention free \
                 space",
                mib(used),
                mib(self.max_pages),
                mib(committed - used),
                self.jobs.load(Ordering::Relaxed),
                mib(self.reserve_pages),
            ),
            source: None,
        })
    }

    /// How many pages retention should free beyond its bounds (see the module docs): those
    /// committed past the pressure mark, and one more; 0 below it.
    pub(crate) fn pressure(&self) -> i64 {
        (self.committed() - (self.max_pages - 2 * self.reserve_pages) + 1).max(0)
    }
}

fn mib(pages: i64) -> String {
    format!(
        "{:.1} MiB",
        pages as f64 * PAGE_BYTES as f64 / (1024.0 * 1024.0)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_door_counts_room_for_waiting_deliveries() {
        let space = Space::new(8 * 1024 * 1024); // 2048 pages, a reserve of 256
        space.used_pages.store(1535, Ordering::Relaxed);
        assert_eq!(space.pressure(), 0);
        assert!(space.admit("accepting").is_ok());
        space.used_pages.store(1536, Ordering::Relaxed);
        assert_eq!(space.pressure(), 1);
        assert!(space.admit("accepting").is_ok());
        // 512 waiting jobs keep 1 MiB (256 pages) for their attempts: the door shuts.
        space.jobs.store(512, Ordering::Relaxed);
        let refusal = space.admit("accepting").expect_err("at the door");
        assert_eq!(refusal.kind(), sheaf_store::ErrorKind::Unavailable);
        let message = refusal.to_string();
        assert!(
            message.contains(
                "accepting: the sqlite database is full: 6.0 MiB of its 8.0 MiB size limit in use \
                 and 1.0 MiB kept for the attempts of 512 waiting deliveries"
            ),
            "{message}"
        );
        assert_eq!(space.pressure(), 257);
    }
}
