//! Sheaf's stores in process memory: the embedded default `sheaf serve` runs on with no
//! configuration.
//!
//! - [`MemoryLogStore`]: events and attempts, bounded by [`LogRetention`] (age and count).
//! - [`MemoryJobQueue`]: the delivery queue with leases, dead letters bounded by [`QueueLimits`].
//!   Built with [`MemoryJobQueue::holding_events_in`], it keeps the events of its jobs in the
//!   log out of retention's reach ([`PendingWork`]): nothing a delivery is owed ages out.
//! - [`MemoryEntityStore`]: tenants and destinations.
//! - [`MemoryReplayStore`]: bulk replays' progress and leases.
//!
//! Each is one lock (`parking_lot`) around plain maps and ordered indexes. Every method takes the
//! lock, does its work without awaiting anything, and lets go: a lock is never held across an
//! await, so the stores are safe to share between any number of tasks and threads, and a
//! cancelled call never leaves half an operation behind. The stores are products, not test
//! doubles: they pass the same conformance and parity suites as the database backends.
//!
//! Nothing here survives a restart. That is the trade of the embedded default; a deployment that
//! must not lose its queue or its log uses the Postgres (and ClickHouse) backends.

mod entity;
mod log;
mod queue;
mod replay;

pub use entity::MemoryEntityStore;
pub use log::{LogRetention, MemoryLogStore, PendingWork};
pub use queue::{MemoryJobQueue, QueueLimits};
pub use replay::MemoryReplayStore;
