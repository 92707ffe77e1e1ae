//! Coalescing of database work: many small lookups become one query, many small
//! writes become one write.
//!
//! - [`LookupCoalescer`] sits in front of a [`BatchLookup`] backend. Callers look keys
//!   up one at a time and each gets its own answer; a worker gathers concurrent keys
//!   and sends them as batch queries (for example, retries that come due together share
//!   one "latest attempt" query). It can gather for a fixed time or adaptively:
//!   only while a query is in flight, or like the fixed mode except after a quiet spell.
//! - [`WriteCoalescer`] sits in front of a [`BatchWriter`]. Writers hand off batches of
//!   records; a worker writes everything queued as one bounded write and can wait a
//!   bounded time for more, so a store that makes one part or statement per write
//!   makes one per wait window, not one per hand-off.
//! - [`Observer`] receives what both do; [`CoalesceMetrics`] counts it.
//! - Each backend query runs in a `coalesced_lookup` span and each write in a
//!   `coalesced_write` span (debug level), linked both ways (`follows_from`) with the span
//!   every caller was in when it asked: a trace shows which query answered a caller and
//!   whom one query answered. Without a subscriber that records them they cost nothing.
//!
//! Architecture invariant: this crate knows nothing about storage. Backends implement
//! the two traits; the crate depends on Tokio, thiserror and tracing only.

mod config;
mod error;
mod lookup;
mod metrics;
mod split;
mod write;

pub use config::{ConfigError, LookupConfig, WriteConfig};
pub use error::{LookupError, WriteError};
pub use lookup::{BatchLookup, LookupCoalescer, LookupCoalescerBuilder};
pub use metrics::{
    BATCH_SIZE_BUCKETS, CoalesceMetrics, FlushReason, LookupFlush, LookupQuery, MetricsSnapshot,
    NoopObserver, Observer, QueryPath, WriteFlush,
};
pub use split::{NoSplit, SpanPoint, SpanSplit, SplitRule};
pub use write::{BatchWriter, WriteCoalescer, WriteCompletion};
