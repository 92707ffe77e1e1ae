//! The crate's one error type.

use std::sync::Arc;

/// Everything that can go wrong in `sheaf-cdc`: malformed pgoutput bytes, a stream that
/// breaks the protocol's order, a bad configuration, a missing slot or publication, and
/// failures of the replication transport (its TLS included) or the heartbeat connection.
///
/// `Clone` so the reader can hand the error that stopped it to the consumer and still
/// log it; sources behind `Arc`.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The bytes are not a well-formed pgoutput message: truncated, a length that runs
    /// past the end, a bad marker byte, bytes left over, text that is not UTF-8.
    #[error("malformed pgoutput {what} at byte {offset}")]
    Malformed {
        /// What was being read when the bytes ran out or made no sense.
        what: &'static str,
        /// Offset into the message where it went wrong.
        offset: usize,
    },
    /// The first byte is not a pgoutput message tag this decoder knows (protocol
    /// version 1; the streaming and two-phase tags of later versions are not requested).
    #[error("unknown pgoutput message tag {tag:#04x}")]
    UnknownTag {
        /// The offending first byte.
        tag: u8,
    },
    /// Well-formed messages in an order the protocol does not allow: a change outside a
    /// transaction, a row for a relation never described, a tuple whose column count
    /// does not match its relation.
    #[error("pgoutput stream out of order: {0}")]
    Protocol(String),
    /// A configuration that cannot work; the message names the field(s).
    #[error("invalid CDC configuration: {0}")]
    Config(String),
    /// The replication slot does not exist and the configuration did not ask to create it.
    #[error("replication slot {slot:?} does not exist (create it, or set `create_missing`)")]
    SlotMissing {
        /// The slot's name.
        slot: String,
    },
    /// The publication does not exist and the configuration did not ask to create it.
    #[error("publication {publication:?} does not exist (create it, or set `create_missing`)")]
    PublicationMissing {
        /// The publication's name.
        publication: String,
    },
    /// The slot exists but cannot serve this reader (another plugin, another database).
    #[error("replication slot {slot:?} cannot be used: {reason}")]
    SlotUnusable {
        /// The slot's name.
        slot: String,
        /// Why not.
        reason: String,
    },
    /// The replication connection failed or the server refused a command.
    #[error("replication transport: {0}")]
    Transport(Arc<dyn std::error::Error + Send + Sync>),
    /// The replication connection's TLS could not be set up: the server refused TLS that
    /// `sslmode` requires, or the handshake failed (an untrusted certificate, a name
    /// mismatch, …). Reported when connecting, with the server and the problem in words.
    #[error("TLS with the server at {server}: {problem}")]
    Tls {
        /// `host:port`.
        server: String,
        /// What went wrong, in words an operator can act on.
        problem: String,
    },
    /// The normal (non-replication) connection used for heartbeats failed.
    #[error("heartbeat connection: {0}")]
    Heartbeat(Arc<dyn std::error::Error + Send + Sync>),
    /// A network step did not finish in its time budget.
    #[error("{0} timed out")]
    Timeout(&'static str),
    /// The reader is gone (stopped, or its task ended); nothing more will arrive.
    #[error("the replication reader has stopped")]
    Closed,
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn malformed(what: &'static str, offset: usize) -> Self {
        Error::Malformed { what, offset }
    }
}
