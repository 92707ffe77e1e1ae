//! Query settings that make a query cheaper but not different, and the fallback for servers
//! that refuse them.
//!
//! A server may refuse a setting in a query's `SETTINGS` clause: an older version does not know
//! it (code 115), a `readonly` user may not change settings (164), or the user's profile
//! constrains it (452). The answer is the same without the setting, only dearer, so the store
//! sends the query again without it and remembers the refusal (one flag per group of settings),
//! so that later queries do not pay for a rejected attempt first.

use std::sync::atomic::{AtomicBool, Ordering};

use clickhouse::query::Query;
use clickhouse::{RowOwned, RowRead};
use sheaf_store::Result;

use crate::error::{from_driver, rejects_setting};
use crate::store::ClickHouseLogStore;

/// A group of optional settings sent together, and whether the server has refused them.
#[derive(Debug)]
pub(crate) struct OptionalSettings {
    /// What the settings are for, for the log line.
    purpose: &'static str,
    /// The settings' names, as the server names them in a refusal.
    names: &'static [&'static str],
    rejected: AtomicBool,
}

impl OptionalSettings {
    pub const fn new(purpose: &'static str, names: &'static [&'static str]) -> Self {
        OptionalSettings {
            purpose,
            names,
            rejected: AtomicBool::new(false),
        }
    }

    /// Whether the server has refused them, so queries go without.
    pub fn rejected(&self) -> bool {
        self.rejected.load(Ordering::Relaxed)
    }
}

impl ClickHouseLogStore {
    /// Fetches the rows of `query(true)` (the query with the settings), or of `query(false)`
    /// when the server refuses the settings, now or before.
    pub(crate) async fn fetch_all_tuned<T>(
        &self,
        what: &str,
        settings: &OptionalSettings,
        query: impl Fn(bool) -> Query,
    ) -> Result<Vec<T>>
    where
        T: RowOwned + RowRead,
    {
        if !settings.rejected() {
            match self.timed_raw(what, query(true).fetch_all()).await? {
                Ok(rows) => return Ok(rows),
                Err(err) if rejects_setting(&err, settings.names) => {
                    if !settings.rejected.swap(true, Ordering::Relaxed) {
                        tracing::warn!(
                            error = %err,
                            settings = ?settings.names,
                            "the clickhouse server refuses the settings for {}; those queries run without them from now on (they read more)",
                            settings.purpose
                        );
                    }
                }
                Err(err) => return Err(from_driver(what, err)),
            }
        }
        self.timed(what, query(false).fetch_all()).await
    }
}
