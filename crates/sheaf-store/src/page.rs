//! Keyset pagination shared by every listing: [`PageRequest`], [`Page`] and the opaque [`Cursor`].
//!
//! Every listing is ordered newest first by `(time, id)` descending, where `id` compares bytewise
//! (see [`crate::ids`]). A cursor holds the `(time, id)` of the last item of a page; the next page
//! holds the items strictly after it in that order. Because the position is a key, not an offset,
//! items inserted while a caller pages never make it skip or repeat one: items newer than the
//! cursor land on pages already read (and are not seen), older ones on pages still to come.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::{Error, Result, Timestamp};

/// The largest page a listing returns.
pub const MAX_PAGE_LIMIT: u32 = 1000;

/// Which page of a listing to return.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PageRequest {
    /// How many items at most: 1 to [`MAX_PAGE_LIMIT`].
    pub limit: u32,
    /// Where the previous page ended; `None` for the first page.
    pub cursor: Option<Cursor>,
}

impl PageRequest {
    /// The first page of at most `limit` items.
    pub fn first(limit: u32) -> Self {
        PageRequest {
            limit,
            cursor: None,
        }
    }

    /// The page of at most `limit` items after `cursor`.
    pub fn after(limit: u32, cursor: Cursor) -> Self {
        PageRequest {
            limit,
            cursor: Some(cursor),
        }
    }

    /// [`Error::InvalidInput`] unless `limit` is within 1..=[`MAX_PAGE_LIMIT`]. Backends call it
    /// first so that every backend rejects the same requests.
    pub fn validate(&self) -> Result<()> {
        if self.limit == 0 || self.limit > MAX_PAGE_LIMIT {
            return Err(Error::invalid_input(format!(
                "page limit {} is outside 1..={MAX_PAGE_LIMIT}",
                self.limit
            )));
        }
        Ok(())
    }

    /// `limit` as a `usize`, for slicing.
    pub fn limit_usize(&self) -> usize {
        usize::try_from(self.limit).unwrap_or(usize::MAX)
    }

    /// The cursor's `(time, id)` with the id parsed as the listing's id type (a cursor whose id
    /// does not parse is [`Error::InvalidInput`], as `parse` reports it); `None` on a first page.
    pub fn cursor_position<I>(
        &self,
        parse: impl FnOnce(&str) -> Result<I>,
    ) -> Result<Option<(Timestamp, I)>> {
        self.cursor
            .as_ref()
            .map(|cursor| Ok((cursor.time(), parse(cursor.id())?)))
            .transpose()
    }
}

/// One page of a listing.
#[derive(Debug, Clone, PartialEq)]
pub struct Page<T> {
    /// At most `limit` items, newest first.
    pub items: Vec<T>,
    /// Where the next page starts: `Some` exactly when more items matched when this page was
    /// read (backends read `limit + 1` rows to know), `None` on the last page.
    pub next: Option<Cursor>,
}

impl<T> Page<T> {
    /// Cuts the `limit + 1` items a backend read, newest first, into a page: the extra item only
    /// says that a next page exists, whose cursor is the `position` of this page's last item.
    pub fn from_overfetch(
        mut items: Vec<T>,
        limit: usize,
        position: impl Fn(&T) -> Cursor,
    ) -> Self {
        let next = if items.len() > limit {
            items.truncate(limit);
            items.last().map(position)
        } else {
            None
        };
        Page { items, next }
    }

    /// A page with no items and no next page.
    pub fn empty() -> Self {
        Page {
            items: Vec::new(),
            next: None,
        }
    }
}

/// A position in a listing: the `(time, id)` of the last item of the previous page.
///
/// Its string form (`Display` / `FromStr`, serde) is opaque to API clients: URL-safe base64 of
/// `<micros>/<id>`. Backends read [`Cursor::time`] and [`Cursor::id`] to build their query and
/// make the next one with [`Cursor::new`] from the last item they return.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Cursor {
    time: Timestamp,
    id: String,
}

impl Cursor {
    /// The position just after an item with this time and id. `id` is the item's id in its
    /// `Display` form.
    pub fn new(time: Timestamp, id: impl Into<String>) -> Self {
        Cursor {
            time,
            id: id.into(),
        }
    }

    /// The time of the last item of the previous page.
    pub fn time(&self) -> Timestamp {
        self.time
    }

    /// The id of the last item of the previous page, in its `Display` form. Parse it with the id
    /// type's `FromStr`; a parse error there is an [`Error::InvalidInput`] like any bad cursor.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The opaque string form.
    pub fn encode(&self) -> String {
        base64url_encode(format!("{}/{}", self.time.as_micros(), self.id).as_bytes())
    }

    /// Parses the opaque string form; anything else is [`Error::InvalidInput`].
    pub fn decode(s: &str) -> Result<Self> {
        let bad = || Error::invalid_input(format!("{s:?} is not a cursor"));
        let raw = base64url_decode(s).ok_or_else(bad)?;
        let raw = String::from_utf8(raw).map_err(|_| bad())?;
        let (micros, id) = raw.split_once('/').ok_or_else(bad)?;
        let micros: i64 = micros.parse().map_err(|_| bad())?;
        if id.is_empty() {
            return Err(bad());
        }
        Ok(Cursor {
            time: Timestamp::from_micros(micros).map_err(|_| bad())?,
            id: id.to_owned(),
        })
    }
}

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.encode())
    }
}

impl fmt::Debug for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Cursor({}, {:?})", self.time, self.id)
    }
}

impl FromStr for Cursor {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Self::decode(s)
    }
}

impl Serialize for Cursor {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.encode())
    }
}

impl<'de> Deserialize<'de> for Cursor {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        Cursor::decode(&s).map_err(serde::de::Error::custom)
    }
}

// A cursor is a few dozen bytes; a hand-written codec saves a dependency.
const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

fn base64url_encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        let symbols = chunk.len() + 1;
        for i in 0..symbols {
            let index = (n >> (18 - 6 * i)) & 0x3f;
            out.push(char::from(ALPHABET[index as usize]));
        }
    }
    out
}

fn base64url_decode(s: &str) -> Option<Vec<u8>> {
    let value = |c: u8| ALPHABET.iter().position(|&a| a == c).map(|p| p as u32);
    let bytes = s.as_bytes();
    if bytes.is_empty() || bytes.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let mut n = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            n |= value(c)? << (18 - 6 * i);
        }
        let produced = chunk.len() - 1;
        for i in 0..produced {
            out.push((n >> (16 - 8 * i)) as u8);
        }
        // Bits below the last full byte must be zero, so every cursor has one spelling.
        let used_bits = 8 * produced;
        if n & ((1 << (24 - used_bits)) - 1) != 0 {
            return None;
        }
    }
    Some(out)
}
