//! Coalesces many small lookups into one query and many small writes into one write.
#![doc = include_str!("../README.md")]

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
