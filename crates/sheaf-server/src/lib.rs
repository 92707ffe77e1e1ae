//! The `sheaf` service: HTTP API, signed webhook delivery, coalesced retries, one claimer per
//! process.
//!
//! The crate is in layers, each folder naming only the folders below it (a tidy test in
//! `xtask/tests/tidy.rs` enforces it):
//!
//! ```text
//!  settings  ←  state  ←  ingest    ←  http  ←  server.rs, telemetry.rs, main.rs
//!                      ←  delivery  ←
//! ```
//!
//! - [`settings`]: every `SHEAF_*` setting, from one typed table, into one [`Config`].
//! - [`state`]: what one process shares: the stores, the caches, the coalesced paths to the log
//!   store, sealed secrets, metrics, the backoff rule.
//! - [`ingest`]: the ways events and jobs come in: publish, manual retry, the CDC source.
//! - [`delivery`]: the way they go out: dispatcher, workers, completer, webhooks, the guard.
//! - [`http`]: the API: routes, authentication, handlers, the OpenAPI document, the mapping of
//!   every error to a status code.
//! - [`server`]: start and graceful stop, used by the binary and by the tests.
//! - [`telemetry`]: where log lines and, with `SHEAF_OTLP_ENDPOINT`, trace spans go.

pub mod delivery;
pub mod destinations;
mod health;
pub mod http;
pub mod ingest;
pub mod server;
pub mod settings;
pub mod state;
pub mod telemetry;

pub use server::{Running, start, start_with};
pub use settings::{Config, ConfigError, SETTINGS};
pub use state::{Migrate, Stores};
