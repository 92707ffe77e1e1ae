//! The `sheaf` service: the engine ([`sheaf_engine`]) behind an HTTP API, configured by
//! `SHEAF_*` settings.
//!
//! The crate is in three parts, each naming only the ones before it:
//!
//! ```text
//!  settings  ←  http  ←  server.rs, telemetry.rs, main.rs
//! ```
//!
//! - [`settings`]: every `SHEAF_*` setting, from one typed table, into one [`Config`] (the
//!   engine's part of it is a [`sheaf_engine::EngineConfig`]).
//! - [`http`]: the API: routes, authentication, handlers, the OpenAPI document, the mapping of
//!   every error to a status code. It reaches the engine only through its façade
//!   ([`sheaf_engine::Engine`]); the crate boundary is what enforces that.
//! - [`server`]: start and graceful stop, used by the binary and by the tests.
//! - [`telemetry`]: where log lines and, with `SHEAF_OTLP_ENDPOINT`, trace spans go.

pub mod http;
#[cfg(test)]
mod runbook;
pub mod server;
pub mod settings;
pub mod telemetry;

pub use server::{Running, start, start_with};
pub use settings::{Config, ConfigError, SETTINGS};
pub use sheaf_engine::{Migrate, Stores};
