//! Postgres logical replication for Sheaf: pgoutput decoder, per-transaction batcher, exact acknowledgement tracking.
#![doc = include_str!("../README.md")]

mod ack;
pub mod change;
mod config;
pub mod encode;
mod error;
mod lsn;
pub mod pgoutput;
pub mod reader;
#[cfg(feature = "postgres")]
mod source;
#[cfg(feature = "postgres")]
mod tls;

pub use ack::AckToken;
pub use change::{
    Cell, Change, ChangeDecoder, ChangeId, Column, Op, Relation, RelationCache, Tuple,
};
pub use config::{CdcConfig, ConnectionConfig, ConnectionSecurity, PublicationTables, TlsSession};
pub use error::{Error, Result};
pub use lsn::Lsn;
pub use reader::{
    BatchingPolicy, BufferBound, CdcMessage, CdcStream, RowFilter, StreamOptions, StreamReader,
    TransactionBatcher, WalEvent, stream_pair,
};
#[cfg(feature = "postgres")]
pub use source::{CdcSource, HEARTBEAT_PREFIX};
