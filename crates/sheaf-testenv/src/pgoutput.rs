//! pgoutput fixtures: `Relation` messages, which every decoder and reader test sends before the
//! rows that refer to them, written once in terms of named columns instead of a
//! `ColumnSpec` literal per column.

use sheaf_cdc::encode::{self, ColumnSpec};

/// The OIDs of the column types the fixtures use (`pg_type.oid`).
pub mod type_oid {
    /// `int4`.
    pub const INT4: u32 = 23;
    /// `int8`.
    pub const INT8: u32 = 20;
    /// `text`.
    pub const TEXT: u32 = 25;
    /// `numeric`.
    pub const NUMERIC: u32 = 1700;
    /// `jsonb`.
    pub const JSONB: u32 = 3802;
}

/// One column of a relation fixture, without a type modifier (`-1`), as most columns are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Column {
    /// Its name.
    pub name: &'static str,
    /// Its type's OID (see [`type_oid`]).
    pub type_oid: u32,
    /// Whether it is part of the replica identity (the key an update or delete carries).
    pub key: bool,
}

impl Column {
    /// A column of the replica identity.
    pub const fn key(name: &'static str, type_oid: u32) -> Self {
        Self {
            name,
            type_oid,
            key: true,
        }
    }

    /// A column outside the replica identity.
    pub const fn value(name: &'static str, type_oid: u32) -> Self {
        Self {
            name,
            type_oid,
            key: false,
        }
    }
}

/// The `Relation` message of relation `relation_id`, `namespace.name` with `columns` and the
/// replica identity setting `replica_identity` (`b'd'` default, `b'f'` full, `b'n'` nothing).
pub fn relation(
    relation_id: u32,
    namespace: &str,
    name: &str,
    replica_identity: u8,
    columns: &[Column],
) -> Vec<u8> {
    let specs: Vec<ColumnSpec<'_>> = columns
        .iter()
        .map(|c| ColumnSpec {
            key: c.key,
            name: c.name,
            type_oid: c.type_oid,
            type_modifier: -1,
        })
        .collect();
    encode::relation(relation_id, namespace, name, replica_identity, &specs)
}

/// The relation id of [`items_relation`].
pub const ITEMS: u32 = 16_384;

/// The `Relation` message of [`ITEMS`]: `public.items(id int8 key, payload text)`, the table
/// of the synthetic streams.
pub fn items_relation() -> Vec<u8> {
    relation(
        ITEMS,
        "public",
        "items",
        b'd',
        &[
            Column::key("id", type_oid::INT8),
            Column::value("payload", type_oid::TEXT),
        ],
    )
}
