//! [`Space`]: the size cap (`SqliteOptions::max_size_bytes`) kept as a door, not a wall.
//!
//! SQLite enforces a cap by failing the write that would pass it, whatever that write is. Left
//! at that, a flood during a receiver outage fills the file with events waiting for delivery,
//! and then the writes that would empty it fail too: recording the attempts once the receiver
//! is back, removing the delivered jobs, even retention's deletes need a page now and then. So
//! the store keeps the last eighth of the cap as a reserve:
//!
//! - **the door**: once the pages in use reach the cap less the reserve, new events (accepting,
//!   inserting, enqueueing) are refused as `Unavailable`, which the service answers with a 503,
//!   while deliveries, their attempt records and retention go on writing into the reserve;
//! - **pressure**: once the pages in use pass the cap less twice the reserve, retention drops
//!   the oldest records no delivery waits for, beyond what its count and age bounds ask, until
//!   the file is back under that mark, and then the failed attempts of waiting deliveries that
//!   a later attempt supersedes (a retry reads only the latest). A log that fills its cap with
//!   delivered history makes room by itself; only events still waiting for delivery can keep
//!   the door shut, and they leave as they are delivered.
//!
//! The reserve must hold what deliveries write between two retention passes (seconds apart):
//! an attempt record per delivery tried. A limit of a few MiB with thousands of waiting events
//! retried every second can outrun it; writes then fail at the limit itself and are retried
//! until retention catches up, which it does as long as some attempt is superseded.
//!
//! The pages in use (the file's pages less its free list) are measured after every flush that
//! committed, by the writer, so the door lags the file by at most one flush, which the reserve
//! absorbs.

use std::sync::atomic::{AtomicI64, Ordering};

use sheaf_store::{Error, Result};
use sqlx::SqliteConnection;

use crate::error::from_sqlx;

/// SQLite's default page size, which this crate never changes.
pub(crate) const PAGE_BYTES: u64 = 4096;

/// The cap, its door and the pages in use, shared by the writer (which measures) and the stores
/// (which ask).
#[derive(Debug)]
pub(crate) struct Space {
    max_pages: i64,
    reserve_pages: i64,
    used_pages: AtomicI64,
}

impl Space {
    /// The door over a cap of `max_bytes`.
    pub(crate) fn new(max_bytes: u64) -> Self {
        let max_pages = i64::try_from(max_bytes / PAGE_BYTES).unwrap_or(i64::MAX);
        Space {
            max_pages,
            reserve_pages: (max_pages / 8).max(1),
            used_pages: AtomicI64::new(0),
        }
    }

    /// Reads the pages in use on `connection` (the writer, outside a transaction or inside one:
    /// both see the file as the last commit left it).
    pub(crate) async fn measure(&self, connection: &mut SqliteConnection) -> Result<()> {
        let used: i64 = sqlx::query_scalar(
            "SELECT (SELECT page_count FROM pragma_page_count())
                  - (SELECT freelist_count FROM pragma_freelist_count())",
        )
        .fetch_one(&mut *connection)
        .await
        .map_err(|e| from_sqlx("measuring the database's size", e))?;
        self.used_pages.store(used, Ordering::Relaxed);
        Ok(())
    }

    fn used(&self) -> i64 {
        self.used_pages.load(Ordering::Relaxed)
    }

    /// `Ok` while new events fit in front of the reserve; otherwise `Unavailable`, saying how
    /// full the file is and why it refuses (`doing`: what was refused, lower case).
    pub(crate) fn admit(&self, doing: &str) -> Result<()> {
        let used = self.used();
        if used < self.max_pages - self.reserve_pages {
            return Ok(());
        }
        Err(Error::Unavailable {
            message: format!(
                "{doing}: the sqlite database is full: {} of its {} size limit in use, and the \
                 last {} are kept for deliveries and retention; new events are refused until \
                 deliveries and retention free space",
                mib(used),
                mib(self.max_pages),
                mib(self.reserve_pages),
            ),
            source: None,
        })
    }

    /// How many pages retention should free beyond its bounds (see the module docs): those in
    /// use past the pressure mark, and one more; 0 below it.
    pub(crate) fn pressure(&self) -> i64 {
        (self.used() - (self.max_pages - 2 * self.reserve_pages) + 1).max(0)
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
    fn the_door_shuts_at_the_reserve_and_pressure_starts_one_reserve_earlier() {
        let space = Space::new(8 * 1024 * 1024); // 2048 pages, a reserve of 256
        space.used_pages.store(1535, Ordering::Relaxed);
        assert_eq!(space.pressure(), 0);
        assert!(space.admit("accepting").is_ok());
        space.used_pages.store(1536, Ordering::Relaxed);
        assert_eq!(space.pressure(), 1);
        assert!(space.admit("accepting").is_ok());
        space.used_pages.store(1792, Ordering::Relaxed);
        let refusal = space.admit("accepting").expect_err("at the door");
        assert_eq!(refusal.kind(), sheaf_store::ErrorKind::Unavailable);
        let message = refusal.to_string();
        assert!(
            message.contains("accepting: the sqlite database is full: 7.0 MiB of its 8.0 MiB"),
            "{message}"
        );
    }
}
