//! pgoutput bytes built by the protocol specification.
//!
//! The inverse of [`crate::pgoutput::decode`], for tests, benchmarks and fuzz seeds:
//! each function returns the body of one `XLogData` frame. Postgres writes the same
//! layout (`src/backend/replication/logical/proto.c`).

use crate::Lsn;
use crate::pgoutput::{PgTimestamp, TupleValue};

/// One column of a [`relation`] message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ColumnSpec<'a> {
    /// Part of the replica identity key.
    pub key: bool,
    /// Column name.
    pub name: &'a str,
    /// OID of the column's type.
    pub type_oid: u32,
    /// Type modifier, -1 for none.
    pub type_modifier: i32,
}

/// Which old values an update or delete carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OldKind {
    /// `K`: key columns.
    Key,
    /// `O`: the full old row.
    Full,
}

/// `B`.
pub fn begin(final_lsn: Lsn, commit_time: PgTimestamp, xid: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(21);
    out.push(b'B');
    out.extend_from_slice(&final_lsn.0.to_be_bytes());
    out.extend_from_slice(&commit_time.to_be_bytes());
    out.extend_from_slice(&xid.to_be_bytes());
    out
}

/// `C`.
pub fn commit(commit_lsn: Lsn, end_lsn: Lsn, commit_time: PgTimestamp) -> Vec<u8> {
    let mut out = Vec::with_capacity(26);
    out.push(b'C');
    out.push(0);
    out.extend_from_slice(&commit_lsn.0.to_be_bytes());
    out.extend_from_slice(&end_lsn.0.to_be_bytes());
    out.extend_from_slice(&commit_time.to_be_bytes());
    out
}

/// `O`.
pub fn origin(commit_lsn: Lsn, name: &str) -> Vec<u8> {
    let mut out = vec![b'O'];
    out.extend_from_slice(&commit_lsn.0.to_be_bytes());
    cstr(&mut out, name);
    out
}

/// `R`.
pub fn relation(
    relation_id: u32,
    namespace: &str,
    name: &str,
    replica_identity: u8,
    columns: &[ColumnSpec<'_>],
) -> Vec<u8> {
    let mut out = vec![b'R'];
    out.extend_from_slice(&relation_id.to_be_bytes());
    cstr(&mut out, namespace);
    cstr(&mut out, name);
    out.push(replica_identity);
    out.extend_from_slice(&count16(columns.len()).to_be_bytes());
    for column in columns {
        out.push(u8::from(column.key));
        cstr(&mut out, column.name);
        out.extend_from_slice(&column.type_oid.to_be_bytes());
        out.extend_from_slice(&column.type_modifier.to_be_bytes());
    }
    out
}

/// `Y`.
pub fn type_message(type_oid: u32, namespace: &str, name: &str) -> Vec<u8> {
    let mut out = vec![b'Y'];
    out.extend_from_slice(&type_oid.to_be_bytes());
    cstr(&mut out, namespace);
    cstr(&mut out, name);
    out
}

/// `I`.
pub fn insert(relation_id: u32, new: &[TupleValue<'_>]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + new.len() * 5 + payload_len(new));
    out.push(b'I');
    out.extend_from_slice(&relation_id.to_be_bytes());
    out.push(b'N');
    tuple(&mut out, new);
    out
}

/// `U`, with an optional old key or old row.
pub fn update(
    relation_id: u32,
    old: Option<(OldKind, &[TupleValue<'_>])>,
    new: &[TupleValue<'_>],
) -> Vec<u8> {
    let mut out = vec![b'U'];
    out.extend_from_slice(&relation_id.to_be_bytes());
    if let Some((kind, values)) = old {
        out.push(old_marker(kind));
        tuple(&mut out, values);
    }
    out.push(b'N');
    tuple(&mut out, new);
    out
}

/// `D`.
pub fn delete(relation_id: u32, kind: OldKind, old: &[TupleValue<'_>]) -> Vec<u8> {
    let mut out = vec![b'D'];
    out.extend_from_slice(&relation_id.to_be_bytes());
    out.push(old_marker(kind));
    tuple(&mut out, old);
    out
}

/// `T`.
pub fn truncate(options: u8, relation_ids: &[u32]) -> Vec<u8> {
    let mut out = vec![b'T'];
    let count = u32::try_from(relation_ids.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&count.to_be_bytes());
    out.push(options);
    for id in relation_ids {
        out.extend_from_slice(&id.to_be_bytes());
    }
    out
}

/// `M`.
pub fn message(transactional: bool, lsn: Lsn, prefix: &str, content: &[u8]) -> Vec<u8> {
    let mut out = vec![b'M', u8::from(transactional)];
    out.extend_from_slice(&lsn.0.to_be_bytes());
    cstr(&mut out, prefix);
    let len = u32::try_from(content.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(content);
    out
}

fn old_marker(kind: OldKind) -> u8 {
    match kind {
        OldKind::Key => b'K',
        OldKind::Full => b'O',
    }
}

fn payload_len(values: &[TupleValue<'_>]) -> usize {
    values
        .iter()
        .map(|v| match v {
            TupleValue::Text(s) => s.len(),
            TupleValue::Binary(b) => b.len(),
            _ => 0,
        })
        .sum()
}

fn tuple(out: &mut Vec<u8>, values: &[TupleValue<'_>]) {
    out.extend_from_slice(&count16(values.len()).to_be_bytes());
    for value in values {
        match value {
            TupleValue::Null => out.push(b'n'),
            TupleValue::UnchangedToast => out.push(b'u'),
            TupleValue::Text(s) => sized(out, b't', s),
            TupleValue::Binary(b) => sized(out, b'b', b),
        }
    }
}

fn sized(out: &mut Vec<u8>, kind: u8, bytes: &[u8]) {
    out.push(kind);
    let len = i32::try_from(bytes.len()).unwrap_or(i32::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(bytes);
}

fn cstr(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(s.as_bytes());
    out.push(0);
}

fn count16(n: usize) -> u16 {
    u16::try_from(n).unwrap_or(u16::MAX)
}
