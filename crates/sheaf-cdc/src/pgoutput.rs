//! Sheaf's pgoutput decoder: one logical replication message, borrowed from its bytes.
//!
//! [`decode`] reads the body of one `XLogData` frame (the bytes after the 25-byte
//! replication header) as written by Postgres' `pgoutput` plugin, protocol version 1
//! (<https://www.postgresql.org/docs/current/protocol-logicalrep-message-formats.html>).
//! Nothing is copied: names, tuple values and message contents are slices of the input.
//! Tuples and column lists are checked completely when the message is decoded (every
//! length, every marker byte, UTF-8 of every name), then walked again lazily by
//! their iterators, so a decoded message never fails later and never allocates.
//!
//! Value bytes are not read at all, only skipped by their lengths: UTF-8 is checked where
//! a value is used, which is also where it is copied.
//!
//! Every read is bounds-checked and every failure is an [`Error`] value: the decoder is
//! fed bytes from the network and is fuzzed (`fuzz/`, target `pgoutput_decode`).
//!
//! Longer than 600 lines because each message type and the code that checks its bytes follow the
//! protocol's message formats one for one, and read best side by side.

use crate::{Error, Lsn, Result};

/// Microseconds since 2000-01-01 00:00:00 UTC, Postgres' timestamp epoch.
pub type PgTimestamp = i64;

/// One decoded pgoutput message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PgOutputMessage<'a> {
    /// `B`: a transaction starts.
    Begin(Begin),
    /// `C`: the transaction commits.
    Commit(Commit),
    /// `O`: the transaction was replicated from another origin.
    Origin(Origin<'a>),
    /// `R`: a relation's schema; precedes its first row and follows every schema change.
    Relation(RelationMessage<'a>),
    /// `Y`: a non-built-in type's name.
    Type(TypeMessage<'a>),
    /// `I`: a row inserted.
    Insert(Insert<'a>),
    /// `U`: a row updated.
    Update(Update<'a>),
    /// `D`: a row deleted.
    Delete(Delete<'a>),
    /// `T`: relations truncated.
    Truncate(Truncate<'a>),
    /// `M`: a logical decoding message (`pg_logical_emit_message`).
    Message(LogicalMessage<'a>),
}

/// A `Begin` message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Begin {
    /// LSN of the transaction's commit record (equals the commit's `commit_lsn`).
    pub final_lsn: Lsn,
    /// Commit time.
    pub commit_time: PgTimestamp,
    /// Transaction id.
    pub xid: u32,
}

/// A `Commit` message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Commit {
    /// Flags (unused by Postgres so far, always 0).
    pub flags: u8,
    /// LSN of the commit record.
    pub commit_lsn: Lsn,
    /// End of the commit record: the position to acknowledge once the transaction is done.
    pub end_lsn: Lsn,
    /// Commit time.
    pub commit_time: PgTimestamp,
}

/// An `Origin` message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Origin<'a> {
    /// The commit LSN on the origin server.
    pub commit_lsn: Lsn,
    /// The origin's name.
    pub name: &'a str,
}

/// A `Relation` message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RelationMessage<'a> {
    /// The relation's OID, used by row messages to refer to it.
    pub relation_id: u32,
    /// Schema name; empty means `pg_catalog`.
    pub namespace: &'a str,
    /// Table name.
    pub name: &'a str,
    /// `REPLICA IDENTITY` setting: `d`efault, `n`othing, `f`ull or `i`ndex.
    pub replica_identity: u8,
    /// The columns, in table order.
    pub columns: Columns<'a>,
}

/// One column of a `Relation` message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ColumnMessage<'a> {
    /// Flags; bit 1 marks a column of the replica identity key.
    pub flags: u8,
    /// Column name.
    pub name: &'a str,
    /// OID of the column's type.
    pub type_oid: u32,
    /// Type modifier (`atttypmod`).
    pub type_modifier: i32,
}

/// The validated column list of a [`RelationMessage`]; iterate it for [`ColumnMessage`]s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Columns<'a> {
    count: u16,
    raw: &'a [u8],
}

/// A `Type` message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TypeMessage<'a> {
    /// The type's OID.
    pub type_oid: u32,
    /// Schema name; empty means `pg_catalog`.
    pub namespace: &'a str,
    /// Type name.
    pub name: &'a str,
}

/// An `Insert` message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Insert<'a> {
    /// The relation the row belongs to.
    pub relation_id: u32,
    /// The new row.
    pub new: TupleData<'a>,
}

/// Which old values an `Update` or `Delete` carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OldTuple<'a> {
    /// `K`: the replica identity key columns only (others are NULL placeholders).
    Key(TupleData<'a>),
    /// `O`: the whole old row (`REPLICA IDENTITY FULL`).
    Full(TupleData<'a>),
}

impl<'a> OldTuple<'a> {
    /// The tuple, whichever kind.
    pub fn tuple(&self) -> TupleData<'a> {
        match *self {
            OldTuple::Key(t) | OldTuple::Full(t) => t,
        }
    }
}

/// An `Update` message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Update<'a> {
    /// The relation the row belongs to.
    pub relation_id: u32,
    /// Old key or old row; absent when the key did not change and identity is not `FULL`.
    pub old: Option<OldTuple<'a>>,
    /// The new row (unchanged TOASTed values are marked, not sent).
    pub new: TupleData<'a>,
}

/// A `Delete` message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delete<'a> {
    /// The relation the row belonged to.
    pub relation_id: u32,
    /// Old key or old row.
    pub old: OldTuple<'a>,
}

/// A `Truncate` message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Truncate<'a> {
    /// Bit 1: `CASCADE`; bit 2: `RESTART IDENTITY`.
    pub options: u8,
    count: u32,
    raw: &'a [u8],
}

impl<'a> Truncate<'a> {
    /// How many relations were truncated.
    pub fn len(&self) -> usize {
        self.count as usize
    }

    /// Whether the message names no relation.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The truncated relations' OIDs.
    pub fn relation_ids(&self) -> impl Iterator<Item = u32> + 'a {
        self.raw
            .chunks_exact(4)
            .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]))
    }
}

/// A `Message` message: the payload of `pg_logical_emit_message`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogicalMessage<'a> {
    /// Whether it was emitted inside a transaction (then it arrives between Begin and Commit).
    pub transactional: bool,
    /// LSN of the message.
    pub lsn: Lsn,
    /// The application's prefix.
    pub prefix: &'a str,
    /// The content, raw.
    pub content: &'a [u8],
}

/// One column value of a tuple.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TupleValue<'a> {
    /// `n`: SQL NULL.
    Null,
    /// `u`: a TOASTed value that did not change; Postgres does not send it.
    UnchangedToast,
    /// `t`: the value in the type's text output format. The server sends it in the
    /// session's `client_encoding`, UTF-8 for Sheaf's connections; the decoder does not
    /// read value bytes at all (that is what keeps it fast), so UTF-8 is checked where
    /// the value is used ([`TupleValue::as_str`], [`crate::Cell::to_json`]).
    Text(&'a [u8]),
    /// `b`: the value in the type's binary format (only when `binary` was requested).
    Binary(&'a [u8]),
}

impl<'a> TupleValue<'a> {
    /// A text value as `&str`.
    ///
    /// # Errors
    /// [`Error::Malformed`] when the bytes are not UTF-8 (offset into the value), and
    /// for values that are not text.
    pub fn as_str(&self) -> Result<&'a str> {
        match *self {
            TupleValue::Text(bytes) => std::str::from_utf8(bytes)
                .map_err(|e| Error::malformed("text value (not UTF-8)", e.valid_up_to())),
            _ => Err(Error::malformed("text value (not text)", 0)),
        }
    }
}

/// The validated values of one row; iterate it for [`TupleValue`]s in column order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TupleData<'a> {
    count: u16,
    raw: &'a [u8],
}

impl<'a> TupleData<'a> {
    /// Number of columns.
    pub fn len(&self) -> usize {
        usize::from(self.count)
    }

    /// Whether the tuple has no columns.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The values, in column order.
    pub fn iter(&self) -> TupleIter<'a> {
        TupleIter {
            cursor: Cursor::new(self.raw),
            left: self.count,
        }
    }
}

impl<'a> IntoIterator for TupleData<'a> {
    type Item = TupleValue<'a>;
    type IntoIter = TupleIter<'a>;

    fn into_iter(self) -> TupleIter<'a> {
        self.iter()
    }
}

/// Iterator over a [`TupleData`].
#[derive(Debug, Clone)]
pub struct TupleIter<'a> {
    cursor: Cursor<'a>,
    left: u16,
}

impl<'a> Iterator for TupleIter<'a> {
    type Item = TupleValue<'a>;

    fn next(&mut self) -> Option<TupleValue<'a>> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        // Validated when the tuple was decoded, so this cannot fail; a failure would
        // end the iteration early rather than panic.
        read_value(&mut self.cursor).ok()
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (usize::from(self.left), Some(usize::from(self.left)))
    }
}

impl<'a> Columns<'a> {
    /// Number of columns.
    pub fn len(&self) -> usize {
        usize::from(self.count)
    }

    /// Whether the relation has no columns.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The columns, in table order.
    pub fn iter(&self) -> ColumnsIter<'a> {
        ColumnsIter {
            cursor: Cursor::new(self.raw),
            left: self.count,
        }
    }
}

/// Iterator over [`Columns`].
#[derive(Debug, Clone)]
pub struct ColumnsIter<'a> {
    cursor: Cursor<'a>,
    left: u16,
}

impl<'a> Iterator for ColumnsIter<'a> {
    type Item = ColumnMessage<'a>;

    fn next(&mut self) -> Option<ColumnMessage<'a>> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        read_column(&mut self.cursor).ok()
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (usize::from(self.left), Some(usize::from(self.left)))
    }
}

/// Decodes one pgoutput message (protocol version 1).
///
/// # Errors
/// [`Error::Malformed`] for truncated or inconsistent bytes (including bytes left over
/// after the message), [`Error::UnknownTag`] for a first byte that is no message tag.
pub fn decode(buf: &[u8]) -> Result<PgOutputMessage<'_>> {
    decode_inner(buf).map_err(|e| match e {
        Fault::Bad(bad) => bad.into(),
        Fault::Tag(tag) => Error::UnknownTag { tag },
    })
}

enum Fault {
    Bad(Bad),
    Tag(u8),
}

impl From<Bad> for Fault {
    fn from(bad: Bad) -> Fault {
        Fault::Bad(bad)
    }
}

fn decode_inner(buf: &[u8]) -> std::result::Result<PgOutputMessage<'_>, Fault> {
    let mut c = Cursor::new(buf);
    let tag = c.u8("message tag")?;
    let message = match tag {
        b'B' => PgOutputMessage::Begin(Begin {
            final_lsn: Lsn(c.u64("begin final LSN")?),
            commit_time: c.i64("begin commit time")?,
            xid: c.u32("begin xid")?,
        }),
        b'C' => PgOutputMessage::Commit(Commit {
            flags: c.u8("commit flags")?,
            commit_lsn: Lsn(c.u64("commit LSN")?),
            end_lsn: Lsn(c.u64("commit end LSN")?),
            commit_time: c.i64("commit time")?,
        }),
        b'O' => PgOutputMessage::Origin(Origin {
            commit_lsn: Lsn(c.u64("origin LSN")?),
            name: c.cstr("origin name")?,
        }),
        b'R' => {
            let relation_id = c.u32("relation id")?;
            let namespace = c.cstr("relation namespace")?;
            let name = c.cstr("relation name")?;
            let replica_identity = c.u8("replica identity")?;
            let count = c.u16("column count")?;
            let start = c.pos;
            for _ in 0..count {
                read_column(&mut c)?;
            }
            let raw = c.buf.get(start..c.pos).unwrap_or_default();
            PgOutputMessage::Relation(RelationMessage {
                relation_id,
                namespace,
                name,
                replica_identity,
                columns: Columns { count, raw },
            })
        }
        b'Y' => PgOutputMessage::Type(TypeMessage {
            type_oid: c.u32("type oid")?,
            namespace: c.cstr("type namespace")?,
            name: c.cstr("type name")?,
        }),
        b'I' => {
            let relation_id = c.u32("insert relation id")?;
            c.expect(b'N', "insert new-tuple marker")?;
            PgOutputMessage::Insert(Insert {
                relation_id,
                new: read_tuple(&mut c)?,
            })
        }
        b'U' => {
            let relation_id = c.u32("update relation id")?;
            let old = match c.u8("update tuple marker")? {
                b'K' => Some(OldTuple::Key(read_tuple(&mut c)?)),
                b'O' => Some(OldTuple::Full(read_tuple(&mut c)?)),
                b'N' => None,
                _ => {
                    return Err(Bad {
                        what: "update tuple marker",
                        offset: c.pos - 1,
                    }
                    .into());
                }
            };
            if old.is_some() {
                c.expect(b'N', "update new-tuple marker")?;
            }
            PgOutputMessage::Update(Update {
                relation_id,
                old,
                new: read_tuple(&mut c)?,
            })
        }
        b'D' => {
            let relation_id = c.u32("delete relation id")?;
            let old = match c.u8("delete tuple marker")? {
                b'K' => OldTuple::Key(read_tuple(&mut c)?),
                b'O' => OldTuple::Full(read_tuple(&mut c)?),
                _ => {
                    return Err(Bad {
                        what: "delete tuple marker",
                        offset: c.pos - 1,
                    }
                    .into());
                }
            };
            PgOutputMessage::Delete(Delete { relation_id, old })
        }
        b'T' => {
            let count = c.u32("truncate relation count")?;
            let options = c.u8("truncate options")?;
            let len = usize::try_from(count)
                .ok()
                .and_then(|n| n.checked_mul(4))
                .ok_or(Bad {
                    what: "truncate relation count",
                    offset: c.pos,
                })?;
            let raw = c.bytes(len, "truncate relation ids")?;
            PgOutputMessage::Truncate(Truncate {
                options,
                count,
                raw,
            })
        }
        b'M' => {
            let flags = c.u8("message flags")?;
            let lsn = Lsn(c.u64("message LSN")?);
            let prefix = c.cstr("message prefix")?;
            let len = c.u32("message length")?;
            let len = usize::try_from(len).map_err(|_| Bad {
                what: "message length",
                offset: c.pos,
            })?;
            let content = c.bytes(len, "message content")?;
            PgOutputMessage::Message(LogicalMessage {
                transactional: flags & 1 == 1,
                lsn,
                prefix,
                content,
            })
        }
        other => return Err(Fault::Tag(other)),
    };
    if c.pos != buf.len() {
        return Err(Bad {
            what: "end of message (bytes left over)",
            offset: c.pos,
        }
        .into());
    }
    Ok(message)
}

fn read_column<'a>(c: &mut Cursor<'a>) -> Read<ColumnMessage<'a>> {
    Ok(ColumnMessage {
        flags: c.u8("column flags")?,
        name: c.cstr("column name")?,
        type_oid: c.u32("column type oid")?,
        type_modifier: c.i32("column type modifier")?,
    })
}

fn read_tuple<'a>(c: &mut Cursor<'a>) -> Read<TupleData<'a>> {
    let count = c.u16("tuple column count")?;
    let start = c.pos;
    for _ in 0..count {
        read_value(c)?;
    }
    Ok(TupleData {
        count,
        raw: c.buf.get(start..c.pos).unwrap_or_default(),
    })
}

fn read_value<'a>(c: &mut Cursor<'a>) -> Read<TupleValue<'a>> {
    match c.u8("tuple value kind")? {
        b'n' => Ok(TupleValue::Null),
        b'u' => Ok(TupleValue::UnchangedToast),
        b't' => Ok(TupleValue::Text(c.sized("text value")?)),
        b'b' => Ok(TupleValue::Binary(c.sized("binary value")?)),
        _ => Err(Bad {
            what: "tuple value kind",
            offset: c.pos - 1,
        }),
    }
}

/// Where a read failed: kept to two words so the hot path's `Result`s stay small (the
/// public [`Error`] is several times larger); converted once, at the API boundary.
#[derive(Debug, Clone, Copy)]
struct Bad {
    what: &'static str,
    offset: usize,
}

impl From<Bad> for Error {
    fn from(bad: Bad) -> Error {
        Error::malformed(bad.what, bad.offset)
    }
}

type Read<T> = std::result::Result<T, Bad>;

/// A bounds-checked reader over big-endian protocol fields.
#[derive(Debug, Clone)]
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Cursor { buf, pos: 0 }
    }

    fn bytes(&mut self, len: usize, what: &'static str) -> Read<&'a [u8]> {
        let end = self.pos.checked_add(len).ok_or(Bad {
            what,
            offset: self.pos,
        })?;
        let out = self.buf.get(self.pos..end).ok_or(Bad {
            what,
            offset: self.pos,
        })?;
        self.pos = end;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Read<[u8; N]> {
        let bytes = self.bytes(N, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    fn u8(&mut self, what: &'static str) -> Read<u8> {
        Ok(self.array::<1>(what)?[0])
    }

    fn u16(&mut self, what: &'static str) -> Read<u16> {
        Ok(u16::from_be_bytes(self.array(what)?))
    }

    fn u32(&mut self, what: &'static str) -> Read<u32> {
        Ok(u32::from_be_bytes(self.array(what)?))
    }

    fn i32(&mut self, what: &'static str) -> Read<i32> {
        Ok(i32::from_be_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &'static str) -> Read<u64> {
        Ok(u64::from_be_bytes(self.array(what)?))
    }

    fn i64(&mut self, what: &'static str) -> Read<i64> {
        Ok(i64::from_be_bytes(self.array(what)?))
    }

    fn expect(&mut self, byte: u8, what: &'static str) -> Read<()> {
        if self.u8(what)? == byte {
            Ok(())
        } else {
            Err(Bad {
                what,
                offset: self.pos - 1,
            })
        }
    }

    /// An Int32 length (negative is malformed: pgoutput marks NULL with `n`, not -1),
    /// then that many bytes.
    fn sized(&mut self, what: &'static str) -> Read<&'a [u8]> {
        let at = self.pos;
        let len = self.i32(what)?;
        let len = usize::try_from(len).map_err(|_| Bad { what, offset: at })?;
        self.bytes(len, what)
    }

    /// A NUL-terminated UTF-8 string.
    fn cstr(&mut self, what: &'static str) -> Read<&'a str> {
        let rest = self.buf.get(self.pos..).unwrap_or_default();
        let nul = rest.iter().position(|&b| b == 0).ok_or(Bad {
            what,
            offset: self.pos,
        })?;
        let bytes = rest.get(..nul).unwrap_or_default();
        let s = std::str::from_utf8(bytes).map_err(|_| Bad {
            what,
            offset: self.pos,
        })?;
        self.pos += nul + 1;
        Ok(s)
    }
}
