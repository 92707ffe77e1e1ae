//! Postgres logical replication for Sheaf: changes read from a slot with
//! `pgwire-replication`, decoded by Sheaf's own pgoutput decoder, grouped per
//! transaction, handed to a consumer over a buffered channel, and acknowledged exactly,
//! so a restart re-reads what was not acknowledged and nothing that was.
//!
//! # Using it (the service's CDC source)
//!
//! ```no_run
//! # async fn example() -> sheaf_cdc::Result<()> {
//! use sheaf_cdc::{CdcConfig, CdcSource, ConnectionConfig, PublicationTables};
//!
//! let mut connection = ConnectionConfig::from_url(
//!     "postgres://sheaf:sheaf@db.internal:5432/app?sslmode=verify-full",
//! )?;
//! connection.ca_file = Some("/etc/sheaf/ca.pem".into()); // the operator's CA, if private
//! let mut config = CdcConfig::new(connection, "sheaf_slot", "sheaf_pub");
//! config.create_missing = Some(PublicationTables::Tables(vec!["public.orders".into()]));
//! config.heartbeat_interval = Some(std::time::Duration::from_secs(30));
//! let mut stream = CdcSource::start(config).await?;
//! if let Some(security) = stream.replication_security() {
//!     // "encrypted (TLSv1_3, TLS13_AES_256_GCM_SHA384, sslmode=verify-full)"
//!     println!("replication connection to {}: {security}", security.server);
//! }
//! while let Some(message) = stream.recv().await? {
//!     let (changes, ack) = message.into_parts();
//!     for change in &changes {
//!         let topic = change.topic();                 // "public.orders.insert"
//!         let id = change.id().to_string();           // stable across replays
//!         let payload = change.to_json()?;
//!         # let _ = (topic, id, payload);
//!         // publish durably, keyed by `id` so a replay deduplicates
//!     }
//!     ack.ack(); // only after the publish is durable
//! }
//! # Ok(()) }
//! ```
//!
//! - **Messages**: one [`Change`] per [`CdcMessage`] by default;
//!   [`StreamOptions::batch_transactions`] makes it one transaction per message (read its
//!   documentation: it changes the unit of failure); [`StreamOptions::batching`] groups
//!   rows by count and time instead. The two cannot be combined.
//! - **Change identity**: [`Change::id`] ([`ChangeId`]) is the commit LSN plus the change's
//!   position in its transaction, the same on every replay, from which a consumer builds
//!   its event ids; topic
//!   `<schema>.<table>.<op>` from [`Change::topic`].
//! - **Acknowledgement**: [`CdcMessage::ack`] (or the [`AckToken`] from
//!   [`CdcMessage::into_parts`]). Acknowledgements may come in any order; the slot
//!   advances over the acknowledged prefix only, to each message's stamped position
//!   ([`Change::ack_lsn`]). At most `checkpoint_limit` rows are unacknowledged at once.
//! - **Buffering**: a consumer that stops receiving leaves at most
//!   [`StreamOptions::buffer_bound`] handed over and unacknowledged: channel depth + 1
//!   reader batches with `batch_transactions` (one more otherwise), each below 4 MiB of
//!   WAL plus one row.
//! - **Restart**: the stream starts at 0/0, which resumes from the slot's
//!   `confirmed_flush_lsn`: at-least-once, never lost, nothing re-sent from before the
//!   last reported acknowledgement. Transactions are re-sent whole, so a transaction
//!   split across batches and acknowledged in part is read again from its first row;
//!   event ids deduplicate it.
//!
//! # Connections and TLS
//! The source opens two connections to the server: the replication session (the stream)
//! and, with a heartbeat, a normal one. Both follow the URL's `sslmode` with libpq's
//! meanings (`prefer` when the URL has none) and trust the bundled public roots plus one CA
//! file: the URL's `sslrootcert`, else [`ConnectionConfig::ca_file`]
//! ([`ConnectionConfig::trusted_ca_file`]). [`CdcConfig::validate`] loads that file, so a
//! bad one is an [`Error::Config`] naming it.
//!
//! The transport has no TLS of its own here: for any mode but `disable`, Sheaf opens the
//! TCP connection, asks for TLS and runs the handshake itself (rustls on ring), then hands
//! the transport a private local socket bridged to that session. A server that refuses TLS
//! a mode requires, or a certificate that is not accepted, fails [`CdcSource::start`] with
//! an [`Error::Tls`] naming the server and the problem; `prefer` against a server without
//! TLS goes on in plaintext with a warning. Whether the stream is encrypted is logged at
//! connect (`replication connection encrypted`, with protocol and cipher suite) and kept in
//! [`CdcStream::replication_security`]. The heartbeat uses sqlx's TLS with the same mode
//! and CA file.
//!
//! # Layers
//! - [`pgoutput`]: decodes one message, borrowed from its bytes; [`encode`] is its inverse.
//! - [`change`]: the relation cache and [`ChangeDecoder`], rows as [`Change`]s, values
//!   as JSON by type.
//! - [`reader`]: [`TransactionBatcher`], [`StreamReader`] and [`CdcStream`], independent
//!   of the transport (driven by [`WalEvent`]s).
//! - `source` (feature `postgres`, default): [`CdcSource`], the transport and heartbeat;
//!   `tls`, the replication stream's TLS and its local bridge.

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
