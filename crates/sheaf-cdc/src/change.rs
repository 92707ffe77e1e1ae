//! Decoded row changes: the relation cache, the stateful [`ChangeDecoder`], and the
//! [`Change`] each row becomes, with its replay-stable identity and its JSON form.
//!
//! Values stay zero-copy: a [`Cell`] holds a slice of the `XLogData` buffer (`Bytes`,
//! reference-counted), so a decoded row costs one small allocation for its cell list
//! however wide it is. JSON is made when the consumer asks ([`Change::to_json`]), on
//! the consumer's side of the channel.
//!
//! Longer than 600 lines because the relation cache, the decoder's transaction state and the
//! change it produces are one flow from message to event, read best together.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use serde_json::{Map, Number, Value};

use crate::pgoutput::{self, PgOutputMessage, PgTimestamp, TupleData, TupleValue};
use crate::{Error, Lsn, Result};

/// Type OIDs with a JSON form other than a string (`pg_type.oid`, fixed since Postgres 7).
pub mod type_oid {
    /// `bool`.
    pub const BOOL: u32 = 16;
    /// `int8`.
    pub const INT8: u32 = 20;
    /// `int2`.
    pub const INT2: u32 = 21;
    /// `int4`.
    pub const INT4: u32 = 23;
    /// `oid`.
    pub const OID: u32 = 26;
    /// `json`.
    pub const JSON: u32 = 114;
    /// `float4`.
    pub const FLOAT4: u32 = 700;
    /// `float8`.
    pub const FLOAT8: u32 = 701;
    /// `numeric`.
    pub const NUMERIC: u32 = 1700;
    /// `jsonb`.
    pub const JSONB: u32 = 3802;
    /// `text`.
    pub const TEXT: u32 = 25;
}

/// A table as its latest `Relation` message describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relation {
    /// The relation's OID.
    pub id: u32,
    /// Schema name (`pg_catalog` when the message left it empty).
    pub schema: String,
    /// Table name.
    pub table: String,
    /// `REPLICA IDENTITY`: `d`efault, `n`othing, `f`ull or `i`ndex.
    pub replica_identity: u8,
    /// Published columns, in table order; tuples have exactly these.
    pub columns: Vec<Column>,
}

/// One column of a [`Relation`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    /// Column name.
    pub name: String,
    /// OID of its type; decides its JSON form.
    pub type_oid: u32,
    /// Type modifier (`atttypmod`).
    pub type_modifier: i32,
    /// Part of the replica identity key.
    pub key: bool,
}

/// What happened to a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// `INSERT`.
    Insert,
    /// `UPDATE`.
    Update,
    /// `DELETE`.
    Delete,
    /// `TRUNCATE` (one change per truncated relation, without tuples).
    Truncate,
}

impl Op {
    /// Lower-case name, the last part of an event topic.
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Insert => "insert",
            Op::Update => "update",
            Op::Delete => "delete",
            Op::Truncate => "truncate",
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One column value, still in its pgoutput form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cell {
    /// SQL NULL.
    Null,
    /// A TOASTed value the update did not change: Postgres does not send it, so its
    /// value is unknown here. In JSON the column is left out of `new` and named in the
    /// payload's `unchanged_toast` list (never `null`, which would claim the value is NULL).
    UnchangedToast,
    /// Text output of the type (UTF-8, checked when used: [`Cell::as_str`], [`Cell::to_json`]).
    Text(Bytes),
    /// Binary output of the type (only with the `binary` protocol option, which Sheaf does
    /// not request); a `\x`-prefixed hex string in JSON.
    Binary(Bytes),
}

impl Cell {
    /// The text value, if this is one and it is UTF-8.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Cell::Text(bytes) => std::str::from_utf8(bytes).ok(),
            _ => None,
        }
    }

    /// This value as JSON for a column of type `type_oid`; `Ok(None)` for an unchanged
    /// TOAST value, which has no value to show.
    ///
    /// NULL is `null`. `bool` is a boolean. `int2`, `int4`, `int8` and `oid` are integers.
    /// `float4` and `float8` are numbers, except `NaN` and the infinities, which JSON
    /// cannot carry and stay strings. `numeric` is a number when that is exact: an integer
    /// that fits 64 bits, or at most 15 significant digits (what an `f64` round-trips);
    /// otherwise, like `NaN` and the infinities, the exact string. `json` and `jsonb` are
    /// parsed. Every other type is its text output as a string.
    ///
    /// # Errors
    /// [`Error::Malformed`] when a text value is not UTF-8.
    pub fn to_json(&self, type_oid: u32) -> Result<Option<Value>> {
        Ok(match self {
            Cell::Null => Some(Value::Null),
            Cell::UnchangedToast => None,
            Cell::Binary(bytes) => {
                let mut s = String::with_capacity(2 + bytes.len() * 2);
                s.push_str("\\x");
                for b in bytes.iter() {
                    s.push_str(&format!("{b:02x}"));
                }
                Some(Value::String(s))
            }
            Cell::Text(bytes) => {
                let text = std::str::from_utf8(bytes)
                    .map_err(|e| Error::malformed("text value (not UTF-8)", e.valid_up_to()))?;
                Some(text_to_json(text, type_oid))
            }
        })
    }
}

fn text_to_json(text: &str, type_oid: u32) -> Value {
    let as_string = || Value::String(text.to_owned());
    match type_oid {
        type_oid::BOOL => match text {
            "t" => Value::Bool(true),
            "f" => Value::Bool(false),
            _ => as_string(),
        },
        type_oid::INT2 | type_oid::INT4 | type_oid::INT8 | type_oid::OID => text
            .parse::<i64>()
            .map(Value::from)
            .unwrap_or_else(|_| as_string()),
        type_oid::FLOAT4 | type_oid::FLOAT8 => text
            .parse::<f64>()
            .ok()
            .and_then(Number::from_f64)
            .map(Value::Number)
            .unwrap_or_else(as_string),
        type_oid::NUMERIC => numeric_to_json(text).unwrap_or_else(as_string),
        type_oid::JSON | type_oid::JSONB => {
            serde_json::from_str(text).unwrap_or_else(|_| as_string())
        }
        _ => as_string(),
    }
}

/// A `numeric` as a JSON number when no precision is lost.
fn numeric_to_json(text: &str) -> Option<Value> {
    if let Ok(i) = text.parse::<i64>() {
        return Some(Value::from(i));
    }
    let unsigned = text.strip_prefix('-').unwrap_or(text);
    let (int, frac) = unsigned.split_once('.').unwrap_or((unsigned, ""));
    if int.is_empty()
        || !int.bytes().all(|b| b.is_ascii_digit())
        || !frac.bytes().all(|b| b.is_ascii_digit())
    {
        return None; // NaN, Infinity, or something unexpected: keep the exact text.
    }
    let digits: String = [int, frac].concat();
    let significant = digits.trim_start_matches('0').trim_end_matches('0').len();
    // 15 decimal digits always survive a trip through an f64 (DBL_DIG).
    if significant > 15 {
        return None;
    }
    text.parse::<f64>()
        .ok()
        .and_then(Number::from_f64)
        .map(Value::Number)
}

/// The values of one row, aligned with its relation's columns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tuple {
    cells: Vec<Cell>,
}

impl Tuple {
    /// The cells, in column order.
    pub fn cells(&self) -> &[Cell] {
        &self.cells
    }

    /// The cell of the column called `name`.
    pub fn get<'a>(&'a self, relation: &Relation, name: &str) -> Option<&'a Cell> {
        let index = relation.columns.iter().position(|c| c.name == name)?;
        self.cells.get(index)
    }

    /// A JSON object of column name to value (see [`Cell::to_json`]); unchanged TOAST
    /// columns are left out and pushed onto `unchanged`.
    ///
    /// # Errors
    /// [`Error::Malformed`] when a text value is not UTF-8.
    pub fn to_json(
        &self,
        relation: &Relation,
        unchanged: &mut Vec<Value>,
    ) -> Result<Map<String, Value>> {
        let mut map = Map::new();
        for (column, cell) in relation.columns.iter().zip(&self.cells) {
            match cell.to_json(column.type_oid)? {
                Some(value) => {
                    map.insert(column.name.clone(), value);
                }
                None => unchanged.push(Value::String(column.name.clone())),
            }
        }
        Ok(map)
    }
}

/// Which old values an update or delete carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OldKind {
    /// The replica identity key columns only; the other cells are NULL placeholders.
    Key,
    /// The whole old row (`REPLICA IDENTITY FULL`).
    Full,
}

/// The identity of a change that survives a replay: the commit LSN of its transaction
/// and its position among the transaction's changes (0-based, counted before any filter,
/// so a filter cannot shift it). Postgres decodes a transaction the same way every time
/// it sends it, so a change re-read after a restart gets the same id, and a store that
/// keys events by it deduplicates the replay.
///
/// A change's position in the WAL, not an event's id: a consumer builds its own event id
/// from it (Sheaf's is `cdc-<slot>-<this>`, a `sheaf_store::EventId`), so this crate needs no
/// store and an id names the slot it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ChangeId {
    /// LSN of the transaction's commit record.
    pub commit_lsn: Lsn,
    /// Position of the change in its transaction.
    pub position: u32,
}

impl fmt::Display for ChangeId {
    /// `<commit LSN as 16 hex digits>-<position as 8 hex digits>`: fixed width, so ids
    /// sort in commit order as strings, and free of `/` for use in URLs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}-{:08x}", self.commit_lsn.0, self.position)
    }
}

/// One row change, decoded.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    /// The table, as described by its latest `Relation` message.
    pub relation: Arc<Relation>,
    /// What happened.
    pub op: Op,
    /// WAL position of this change (the `XLogData` start of its message).
    pub lsn: Lsn,
    /// LSN of the transaction's commit record.
    pub commit_lsn: Lsn,
    /// Position among the transaction's changes, from 0.
    pub position: u32,
    /// Transaction id.
    pub xid: u32,
    /// Commit time, microseconds since 2000-01-01 UTC.
    pub commit_time: PgTimestamp,
    /// Origin of the transaction, when it was replicated from elsewhere.
    pub origin: Option<Arc<str>>,
    /// The new row (inserts and updates).
    pub new: Option<Tuple>,
    /// The old key or old row (updates that changed the key or use `FULL`, deletes).
    pub old: Option<(OldKind, Tuple)>,
    /// Size of the change's pgoutput message, the unit of the batcher's byte cap.
    pub wal_bytes: usize,
    /// Position to acknowledge for this change; see [`Change::ack_lsn`].
    pub(crate) ack_lsn: Lsn,
}

impl Change {
    /// `<schema>.<table>.<op>`, the topic of the event this change becomes.
    pub fn topic(&self) -> String {
        format!(
            "{}.{}.{}",
            self.relation.schema, self.relation.table, self.op
        )
    }

    /// The replay-stable identity of this change; see [`ChangeId`].
    pub fn id(&self) -> ChangeId {
        ChangeId {
            commit_lsn: self.commit_lsn,
            position: self.position,
        }
    }

    /// The position to acknowledge once this change is durably handled: its own LSN,
    /// or the commit's end LSN when it is the last row of a transaction that closed in
    /// the reader batch it travelled in.
    pub fn ack_lsn(&self) -> Lsn {
        self.ack_lsn
    }

    /// The event payload:
    ///
    /// ```json
    /// {"schema": "public", "table": "orders", "op": "update",
    ///  "commit_lsn": "0/1A2B3C4", "position": 3, "xid": 741, "commit_time": 811296000000000,
    ///  "new": {"id": 1, "note": "x"}, "old": {"id": 1}, "old_kind": "key",
    ///  "unchanged_toast": ["big_column"]}
    /// ```
    ///
    /// `new`, `old` and `old_kind` are `null` when the change has no such tuple. Values
    /// follow [`Cell::to_json`]; columns whose TOASTed value did not change are absent
    /// from `new` and listed in `unchanged_toast` (empty when there are none).
    ///
    /// # Errors
    /// [`Error::Malformed`] when a text value is not UTF-8 (the server sends UTF-8 on
    /// Sheaf's connections, so this means corrupted bytes).
    pub fn to_json(&self) -> Result<Value> {
        let mut unchanged = Vec::new();
        let new = match &self.new {
            Some(t) => Some(Value::Object(t.to_json(&self.relation, &mut unchanged)?)),
            None => None,
        };
        let mut ignored = Vec::new();
        let old = match &self.old {
            Some((_, t)) => Some(Value::Object(t.to_json(&self.relation, &mut ignored)?)),
            None => None,
        };
        let old_kind = self.old.as_ref().map(|(kind, _)| match kind {
            OldKind::Key => "key",
            OldKind::Full => "full",
        });
        Ok(serde_json::json!({
            "schema": self.relation.schema,
            "table": self.relation.table,
            "op": self.op.as_str(),
            "commit_lsn": self.commit_lsn.to_string(),
            "position": self.position,
            "xid": self.xid,
            "commit_time": self.commit_time,
            "new": new,
            "old": old,
            "old_kind": old_kind,
            "unchanged_toast": unchanged,
        }))
    }
}

/// Relations and type names seen on the stream, by OID.
#[derive(Debug, Default, Clone)]
pub struct RelationCache {
    relations: HashMap<u32, Arc<Relation>>,
    types: HashMap<u32, (String, String)>,
}

impl RelationCache {
    /// The relation with this OID, if its `Relation` message has been seen.
    pub fn get(&self, id: u32) -> Option<&Arc<Relation>> {
        self.relations.get(&id)
    }

    /// Schema and name of a non-built-in type announced by a `Type` message.
    pub fn type_name(&self, oid: u32) -> Option<(&str, &str)> {
        self.types.get(&oid).map(|(s, n)| (s.as_str(), n.as_str()))
    }

    /// Every known relation, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Relation>> {
        self.relations.values()
    }

    /// How many relations are known.
    pub fn len(&self) -> usize {
        self.relations.len()
    }

    /// Whether no relation is known.
    pub fn is_empty(&self) -> bool {
        self.relations.is_empty()
    }

    fn apply(&mut self, message: &pgoutput::RelationMessage<'_>) -> Arc<Relation> {
        let schema = if message.namespace.is_empty() {
            "pg_catalog"
        } else {
            message.namespace
        };
        let relation = Arc::new(Relation {
            id: message.relation_id,
            schema: schema.to_owned(),
            table: message.name.to_owned(),
            replica_identity: message.replica_identity,
            columns: message
                .columns
                .iter()
                .map(|c| Column {
                    name: c.name.to_owned(),
                    type_oid: c.type_oid,
                    type_modifier: c.type_modifier,
                    key: c.flags & 1 == 1,
                })
                .collect(),
        });
        self.relations
            .insert(message.relation_id, Arc::clone(&relation));
        relation
    }
}

/// What one message did to the decoder.
#[derive(Debug, Clone, PartialEq)]
pub enum Decoded {
    /// A transaction began.
    Begin(pgoutput::Begin),
    /// The open transaction committed.
    Commit(pgoutput::Commit),
    /// This many changes were appended to the output (1, or one per truncated relation).
    Changes(usize),
    /// The relation cache was updated.
    Relation(Arc<Relation>),
    /// A type name was recorded.
    Type,
    /// The open transaction's origin was recorded.
    Origin,
    /// A logical decoding message.
    Message {
        /// Emitted inside a transaction.
        transactional: bool,
        /// Its LSN.
        lsn: Lsn,
        /// Its prefix.
        prefix: String,
        /// Its content.
        content: Bytes,
    },
}

#[derive(Debug, Clone)]
struct OpenTransaction {
    begin: pgoutput::Begin,
    next_position: u32,
    origin: Option<Arc<str>>,
}

/// The stateful part of decoding: a relation cache and the open transaction, turning
/// pgoutput messages into [`Change`]s that carry their relation and replay-stable identity.
#[derive(Debug, Default)]
pub struct ChangeDecoder {
    relations: RelationCache,
    open: Option<OpenTransaction>,
    /// The relation of the previous row (replaced whenever a `Relation` message arrives).
    last: Option<Arc<Relation>>,
}

impl ChangeDecoder {
    /// An empty decoder. A stream is self-describing (a `Relation` message precedes each
    /// table's first row on every connection), so a new stream needs a new decoder or none.
    pub fn new() -> Self {
        Self::default()
    }

    /// The relations seen so far.
    pub fn relations(&self) -> &RelationCache {
        &self.relations
    }

    /// Whether a transaction is open (begun, not committed).
    pub fn in_transaction(&self) -> bool {
        self.open.is_some()
    }

    /// A transaction begins (for transports that parse `Begin` themselves).
    ///
    /// # Errors
    /// [`Error::Protocol`] when one is already open.
    pub fn begin(&mut self, begin: pgoutput::Begin) -> Result<()> {
        if let Some(open) = &self.open {
            return Err(Error::Protocol(format!(
                "begin of xid {} while xid {} is open",
                begin.xid, open.begin.xid
            )));
        }
        self.open = Some(OpenTransaction {
            begin,
            next_position: 0,
            origin: None,
        });
        Ok(())
    }

    /// The open transaction commits (for transports that parse `Commit` themselves).
    ///
    /// # Errors
    /// [`Error::Protocol`] without an open transaction, or when the commit LSN is not the
    /// one its `Begin` announced.
    pub fn commit(&mut self, commit: pgoutput::Commit) -> Result<()> {
        let open = self
            .open
            .take()
            .ok_or_else(|| Error::Protocol("commit outside a transaction".into()))?;
        if open.begin.final_lsn != commit.commit_lsn {
            return Err(Error::Protocol(format!(
                "commit at {} but the transaction began for {}",
                commit.commit_lsn, open.begin.final_lsn
            )));
        }
        Ok(())
    }

    /// Decodes one pgoutput message that started at WAL position `lsn`, appending the
    /// changes it carries to `out`.
    ///
    /// # Errors
    /// Malformed bytes, and messages out of order (see [`Error::Protocol`]). The decoder
    /// is unchanged by a message that fails.
    pub fn decode(&mut self, lsn: Lsn, data: &Bytes, out: &mut Vec<Change>) -> Result<Decoded> {
        let wal_bytes = data.len();
        match pgoutput::decode(data)? {
            PgOutputMessage::Begin(begin) => {
                self.begin(begin)?;
                Ok(Decoded::Begin(begin))
            }
            PgOutputMessage::Commit(commit) => {
                self.commit(commit)?;
                Ok(Decoded::Commit(commit))
            }
            PgOutputMessage::Origin(origin) => {
                let open = self.open_mut("origin")?;
                open.origin = Some(Arc::from(origin.name));
                Ok(Decoded::Origin)
            }
            PgOutputMessage::Relation(message) => {
                self.last = None;
                Ok(Decoded::Relation(self.relations.apply(&message)))
            }
            PgOutputMessage::Type(message) => {
                let schema = if message.namespace.is_empty() {
                    "pg_catalog"
                } else {
                    message.namespace
                };
                self.relations.types.insert(
                    message.type_oid,
                    (schema.to_owned(), message.name.to_owned()),
                );
                Ok(Decoded::Type)
            }
            PgOutputMessage::Insert(insert) => {
                let relation = self.relation(insert.relation_id)?;
                let new = tuple(data, &relation, insert.new)?;
                self.push(out, relation, Op::Insert, lsn, wal_bytes, Some(new), None)?;
                Ok(Decoded::Changes(1))
            }
            PgOutputMessage::Update(update) => {
                let relation = self.relation(update.relation_id)?;
                let old = match update.old {
                    Some(old) => Some(old_tuple(data, &relation, old)?),
                    None => None,
                };
                let new = tuple(data, &relation, update.new)?;
                self.push(out, relation, Op::Update, lsn, wal_bytes, Some(new), old)?;
                Ok(Decoded::Changes(1))
            }
            PgOutputMessage::Delete(delete) => {
                let relation = self.relation(delete.relation_id)?;
                let old = old_tuple(data, &relation, delete.old)?;
                self.push(out, relation, Op::Delete, lsn, wal_bytes, None, Some(old))?;
                Ok(Decoded::Changes(1))
            }
            PgOutputMessage::Truncate(truncate) => {
                let mut relations = Vec::with_capacity(truncate.len().min(64));
                for id in truncate.relation_ids() {
                    relations.push(self.relation(id)?);
                }
                self.open_mut("truncate")?;
                let share = wal_bytes / relations.len().max(1);
                let count = relations.len();
                for relation in relations {
                    self.push(out, relation, Op::Truncate, lsn, share, None, None)?;
                }
                Ok(Decoded::Changes(count))
            }
            PgOutputMessage::Message(message) => Ok(Decoded::Message {
                transactional: message.transactional,
                lsn: message.lsn,
                prefix: message.prefix.to_owned(),
                content: data.slice_ref(message.content),
            }),
        }
    }

    fn relation(&mut self, id: u32) -> Result<Arc<Relation>> {
        // Rows of one table usually come in runs: skip the map for a repeat.
        if let Some(last) = &self.last
            && last.id == id
        {
            return Ok(Arc::clone(last));
        }
        let relation = self.relations.get(id).cloned().ok_or_else(|| {
            Error::Protocol(format!("row for relation {id} before its Relation message"))
        })?;
        self.last = Some(Arc::clone(&relation));
        Ok(relation)
    }

    fn open_mut(&mut self, what: &str) -> Result<&mut OpenTransaction> {
        self.open
            .as_mut()
            .ok_or_else(|| Error::Protocol(format!("{what} outside a transaction")))
    }

    #[allow(clippy::too_many_arguments)]
    fn push(
        &mut self,
        out: &mut Vec<Change>,
        relation: Arc<Relation>,
        op: Op,
        lsn: Lsn,
        wal_bytes: usize,
        new: Option<Tuple>,
        old: Option<(OldKind, Tuple)>,
    ) -> Result<()> {
        let open = self.open_mut(op.as_str())?;
        let position = open.next_position;
        open.next_position = position.saturating_add(1);
        out.push(Change {
            relation,
            op,
            lsn,
            commit_lsn: open.begin.final_lsn,
            position,
            xid: open.begin.xid,
            commit_time: open.begin.commit_time,
            origin: open.origin.clone(),
            new,
            old,
            wal_bytes,
            ack_lsn: lsn,
        });
        Ok(())
    }
}

fn old_tuple(
    data: &Bytes,
    relation: &Relation,
    old: pgoutput::OldTuple<'_>,
) -> Result<(OldKind, Tuple)> {
    let kind = match old {
        pgoutput::OldTuple::Key(_) => OldKind::Key,
        pgoutput::OldTuple::Full(_) => OldKind::Full,
    };
    Ok((kind, tuple(data, relation, old.tuple())?))
}

fn tuple(data: &Bytes, relation: &Relation, values: TupleData<'_>) -> Result<Tuple> {
    if values.len() != relation.columns.len() {
        return Err(Error::Protocol(format!(
            "tuple of {} columns for {}.{} which has {}",
            values.len(),
            relation.schema,
            relation.table,
            relation.columns.len()
        )));
    }
    let cells = values
        .iter()
        .map(|value| match value {
            TupleValue::Null => Cell::Null,
            TupleValue::UnchangedToast => Cell::UnchangedToast,
            // Both slices point into `data` (decode borrows it), so this is a cheap
            // reference-counted view, not a copy.
            TupleValue::Text(s) => Cell::Text(data.slice_ref(s)),
            TupleValue::Binary(b) => Cell::Binary(data.slice_ref(b)),
        })
        .collect();
    Ok(Tuple { cells })
}
