//! [`Timestamp`]: a UTC instant with microsecond precision, the only time type the stores see.

use std::fmt;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::{Error, Result};

/// A UTC instant truncated to whole microseconds.
///
/// Postgres `timestamptz` and ClickHouse `DateTime64(6)` keep microseconds. A nanosecond-precise
/// time written to either would come back different, and a latest-attempt lookup whose carried
/// time is a few hundred nanoseconds later than the stored attempt would miss it. Truncating once,
/// when the value is made, makes every round trip compare equal. Truncation rounds toward the
/// past (floor), so a truncated time is never later than the instant it stands for.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(DateTime<Utc>);

/// `dt` truncated (floored) to whole microseconds.
pub fn truncate_to_micros(dt: DateTime<Utc>) -> DateTime<Utc> {
    // `timestamp_micros` floors: the sub-second part of a `DateTime` is never negative.
    DateTime::from_timestamp_micros(dt.timestamp_micros()).unwrap_or(dt)
}

impl Timestamp {
    /// The Unix epoch.
    pub const UNIX_EPOCH: Timestamp = Timestamp(DateTime::UNIX_EPOCH);

    /// The current time of this process's clock.
    pub fn now() -> Self {
        Self::from_datetime(Utc::now())
    }

    /// `dt` truncated to whole microseconds.
    pub fn from_datetime(dt: DateTime<Utc>) -> Self {
        Timestamp(truncate_to_micros(dt))
    }

    /// The instant `micros` microseconds after the Unix epoch (negative: before it).
    pub fn from_micros(micros: i64) -> Result<Self> {
        DateTime::from_timestamp_micros(micros)
            .map(Timestamp)
            .ok_or_else(|| Error::invalid_input(format!("timestamp out of range: {micros} µs")))
    }

    /// Microseconds since the Unix epoch: what ClickHouse `DateTime64(6)` stores.
    pub fn as_micros(self) -> i64 {
        self.0.timestamp_micros()
    }

    /// The same instant as a chrono value (for drivers that bind `DateTime<Utc>`).
    pub fn as_datetime(self) -> DateTime<Utc> {
        self.0
    }

    /// `self + duration`, or `None` past the representable range. Sub-microsecond parts of
    /// `duration` are dropped.
    pub fn checked_add(self, duration: Duration) -> Option<Self> {
        let micros = i64::try_from(duration.as_micros()).ok()?;
        Self::from_micros(self.as_micros().checked_add(micros)?).ok()
    }

    /// `self - duration`, or `None` past the representable range. Sub-microsecond parts of
    /// `duration` are dropped.
    pub fn checked_sub(self, duration: Duration) -> Option<Self> {
        let micros = i64::try_from(duration.as_micros()).ok()?;
        Self::from_micros(self.as_micros().checked_sub(micros)?).ok()
    }

    /// `self + duration`, clamped to the latest representable instant.
    pub fn saturating_add(self, duration: Duration) -> Self {
        self.checked_add(duration)
            .unwrap_or_else(|| Self::from_datetime(DateTime::<Utc>::MAX_UTC))
    }

    /// `self - duration`, clamped to the earliest representable instant.
    pub fn saturating_sub(self, duration: Duration) -> Self {
        self.checked_sub(duration)
            .unwrap_or_else(|| Self::from_datetime(DateTime::<Utc>::MIN_UTC))
    }

    /// How long after `earlier` this instant is; zero when it is not after it.
    pub fn saturating_duration_since(self, earlier: Timestamp) -> Duration {
        let micros = self.as_micros().saturating_sub(earlier.as_micros());
        Duration::from_micros(u64::try_from(micros).unwrap_or(0))
    }
}

impl From<DateTime<Utc>> for Timestamp {
    fn from(dt: DateTime<Utc>) -> Self {
        Self::from_datetime(dt)
    }
}

impl From<Timestamp> for DateTime<Utc> {
    fn from(ts: Timestamp) -> Self {
        ts.0
    }
}

impl fmt::Display for Timestamp {
    /// RFC 3339 with exactly six fractional digits and a `Z`, e.g. `2025-01-02T03:04:05.000006Z`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.to_rfc3339_opts(SecondsFormat::Micros, true))
    }
}

impl fmt::Debug for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl std::str::FromStr for Timestamp {
    type Err = Error;

    /// Parses RFC 3339 (any offset, any precision) and truncates to microseconds.
    fn from_str(s: &str) -> Result<Self> {
        DateTime::parse_from_rfc3339(s)
            .map(|dt| Self::from_datetime(dt.with_timezone(&Utc)))
            .map_err(|e| Error::invalid_input(format!("timestamp {s:?} is not RFC 3339: {e}")))
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let dt = DateTime::<Utc>::deserialize(deserializer)?;
        Ok(Self::from_datetime(dt))
    }
}
