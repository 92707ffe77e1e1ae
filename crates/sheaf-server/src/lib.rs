//! The `sheaf` service: HTTP API, signed webhook delivery, coalesced retries, one claimer per
//! process.
//!
//! - [`config`]: every `SHEAF_*` setting, from one table.
//! - [`stores`]: which backends run (memory by default; Postgres, ClickHouse by configuration).
//! - [`core`]: the state shared by the API and the engine: caches and coalescers.
//! - [`publish`]: publish and manual retry, the two ways jobs enter the queue.
//! - [`engine`]: dispatcher, workers and completer.
//! - [`cdc`]: the CDC source: changes of the application's Postgres become events.
//! - [`webhook`]: Standard Webhooks signing and the POST.
//! - [`api`], [`handlers`], [`openapi`], [`error`]: the HTTP API; [`body`]: request bodies
//!   parsed and checked as pure functions (the publish body is fuzzed).
//! - [`tokens`]: tenant-scoped API tokens; [`secrets`]: destination secrets sealed at rest;
//!   [`guard`]: private destinations refused at creation and at connect time.
//! - [`metrics`]: the Prometheus page.
//! - [`server`]: start and graceful stop, used by the binary and by the tests.

pub mod api;
pub mod body;
pub mod cdc;
pub mod config;
pub mod core;
pub mod engine;
pub mod entities;
pub mod error;
pub mod guard;
mod handlers;
pub mod logio;
pub mod metrics;
pub mod openapi;
pub mod publish;
pub mod secrets;
pub mod server;
pub mod stores;
pub mod tokens;
pub mod webhook;

pub use config::{Config, ConfigError, SETTINGS};
pub use server::{Running, start, start_with};
pub use stores::Stores;
