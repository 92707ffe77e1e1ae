//! Sheaf's in-memory LogStore, JobQueue and EntityStore: the embedded default.
#![doc = include_str!("../README.md")]

mod entity;
mod log;
mod queue;
mod replay;

pub use entity::MemoryEntityStore;
pub use log::{LogRetention, MemoryLogStore, PendingWork};
pub use queue::{MemoryJobQueue, QueueLimits};
pub use replay::MemoryReplayStore;
