//! The one error type of every store operation, with the kinds callers and the suites branch on.

use std::sync::Arc;

/// A driver error kept as the source of an [`Error`].
///
/// It sits behind an `Arc` so that [`Error`] is `Clone`: a failed batched lookup hands the same error
/// to every caller that waited on it.
pub type SharedSource = Arc<dyn std::error::Error + Send + Sync + 'static>;

/// What went wrong in a store operation.
///
/// Backends convert their driver errors into these kinds in one place. The kinds are what the
/// conformance suite asserts on and what the service maps to HTTP statuses, so a backend must pick
/// the kind by what happened, not by where: a lost connection is [`Error::Unavailable`] whether it
/// happened in a read or a write.
#[non_exhaustive]
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// The entity an operation names does not exist (or belongs to another tenant, which callers
    /// must not be able to tell apart from not existing).
    #[error("not found: {0}")]
    NotFound(String),
    /// The operation clashes with what is stored, e.g. creating a destination whose id is taken.
    #[error("conflict: {0}")]
    Conflict(String),
    /// The caller passed something no backend could accept: a malformed id, a page limit out of
    /// range, a cursor that was not produced by a store, a zero lease.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// The store could not be reached or did not answer in time. The operation may or may not have
    /// happened; callers retry with backoff (every write is idempotent for that reason).
    #[error("store unavailable: {message}")]
    Unavailable {
        /// What was being attempted, in lower case.
        message: String,
        /// The driver's error, when there is one.
        #[source]
        source: Option<SharedSource>,
    },
    /// The store answered with something unexpected: a failed query, a row that does not decode.
    /// Retrying is unlikely to help.
    #[error("store failed: {message}")]
    Backend {
        /// What was being attempted, in lower case.
        message: String,
        /// The driver's error, when there is one.
        #[source]
        source: Option<SharedSource>,
    },
}

/// The kind of an [`Error`], without its message: what callers and tests match on.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// See [`Error::NotFound`].
    NotFound,
    /// See [`Error::Conflict`].
    Conflict,
    /// See [`Error::InvalidInput`].
    InvalidInput,
    /// See [`Error::Unavailable`].
    Unavailable,
    /// See [`Error::Backend`].
    Backend,
}

impl Error {
    /// The kind of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::NotFound(_) => ErrorKind::NotFound,
            Error::Conflict(_) => ErrorKind::Conflict,
            Error::InvalidInput(_) => ErrorKind::InvalidInput,
            Error::Unavailable { .. } => ErrorKind::Unavailable,
            Error::Backend { .. } => ErrorKind::Backend,
        }
    }

    /// A [`Error::NotFound`] with the given description of what is missing.
    pub fn not_found(what: impl Into<String>) -> Self {
        Error::NotFound(what.into())
    }

    /// A [`Error::Conflict`] with the given description.
    pub fn conflict(what: impl Into<String>) -> Self {
        Error::Conflict(what.into())
    }

    /// An [`Error::InvalidInput`] with the given description.
    pub fn invalid_input(what: impl Into<String>) -> Self {
        Error::InvalidInput(what.into())
    }

    /// An [`Error::Unavailable`] wrapping a driver error.
    pub fn unavailable(
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Error::Unavailable {
            message: message.into(),
            source: Some(Arc::new(source)),
        }
    }

    /// An [`Error::Backend`] wrapping a driver error.
    pub fn backend(
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Error::Backend {
            message: message.into(),
            source: Some(Arc::new(source)),
        }
    }
}

/// The result of every store operation.
pub type Result<T, E = Error> = std::result::Result<T, E>;
