//! WAL positions.

use std::fmt;
use std::str::FromStr;

use crate::Error;

/// A Postgres log sequence number: a byte position in the write-ahead log, shown as
/// `X/Y` (high and low 32 bits in upper-case hex), as `pg_replication_slots` shows it.
///
/// Sheaf's own type, so the public API does not change with the replication transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Lsn(pub u64);

impl Lsn {
    /// 0/0: "no position". Starting a stream at 0/0 resumes from the slot's
    /// `confirmed_flush_lsn`; it is never acknowledged.
    pub const ZERO: Lsn = Lsn(0);

    /// Whether this is 0/0.
    pub fn is_zero(self) -> bool {
        self.0 == 0
    }
}

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 & 0xFFFF_FFFF)
    }
}

impl FromStr for Lsn {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        let bad = || Error::Protocol(format!("not an LSN: {s:?}"));
        let (hi, lo) = s.split_once('/').ok_or_else(bad)?;
        let hi = u32::from_str_radix(hi, 16).map_err(|_| bad())?;
        let lo = u32::from_str_radix(lo, 16).map_err(|_| bad())?;
        Ok(Lsn((u64::from(hi) << 32) | u64::from(lo)))
    }
}

impl From<u64> for Lsn {
    fn from(value: u64) -> Self {
        Lsn(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_and_parse_round_trip() {
        let lsn = Lsn(0x16_B374_D848);
        assert_eq!(lsn.to_string(), "16/B374D848");
        assert_eq!("16/B374D848".parse::<Lsn>().unwrap(), lsn);
        assert_eq!("0/0".parse::<Lsn>().unwrap(), Lsn::ZERO);
        assert!("16B374D848".parse::<Lsn>().is_err());
        assert!("1/2/3".parse::<Lsn>().is_err());
    }
}
