//! Errors the coalescers hand back to their callers.
//!
//! One failed batch query or write answers many callers, so both errors are
//! `Clone`: the backend's error sits behind an `Arc` and is shared, not copied.

use std::sync::Arc;

/// Why a [`LookupCoalescer::lookup`](crate::LookupCoalescer::lookup) returned no answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LookupError<E> {
    /// The backend's query failed. When it was a batch query, every caller whose key
    /// was in it receives this same error.
    #[error("lookup query failed: {0}")]
    Backend(#[source] Arc<E>),
    /// The coalescer was closed before this lookup was accepted.
    #[error("lookup coalescer is closed: no new lookups are accepted")]
    Closed,
    /// The worker or the task running the query stopped (it panicked or its runtime
    /// shut down) before it answered.
    #[error("lookup coalescer worker stopped before answering")]
    WorkerGone,
}

impl<E> LookupError<E> {
    /// The backend's error, when that is what failed.
    pub fn backend(&self) -> Option<&E> {
        match self {
            Self::Backend(err) => Some(err),
            _ => None,
        }
    }
}

// A derived `Clone` would demand `E: Clone`; the `Arc` makes that unnecessary.
impl<E> Clone for LookupError<E> {
    fn clone(&self) -> Self {
        match self {
            Self::Backend(err) => Self::Backend(Arc::clone(err)),
            Self::Closed => Self::Closed,
            Self::WorkerGone => Self::WorkerGone,
        }
    }
}

/// Why a batch handed to a [`WriteCoalescer`](crate::WriteCoalescer) was not written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WriteError<E> {
    /// The write that carried this batch failed; every batch in that write receives
    /// this same error, and batches in other writes are unaffected.
    #[error("coalesced write failed: {0}")]
    Backend(#[source] Arc<E>),
    /// The coalescer was closed before this batch was handed off.
    #[error("write coalescer is closed: no new batches are accepted")]
    Closed,
    /// The worker stopped (it panicked or its runtime shut down) before it reported
    /// on this batch; whether the batch was written is unknown.
    #[error("write coalescer worker stopped before reporting the write")]
    WorkerGone,
}

impl<E> WriteError<E> {
    /// The writer's error, when that is what failed.
    pub fn backend(&self) -> Option<&E> {
        match self {
            Self::Backend(err) => Some(err),
            _ => None,
        }
    }
}

impl<E> Clone for WriteError<E> {
    fn clone(&self) -> Self {
        match self {
            Self::Backend(err) => Self::Backend(Arc::clone(err)),
            Self::Closed => Self::Closed,
            Self::WorkerGone => Self::WorkerGone,
        }
    }
}
