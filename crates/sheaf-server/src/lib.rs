//! The `sheaf` service: Sheaf's engine behind an HTTP API, configured by `SHEAF_*` settings.
#![doc = include_str!("../README.md")]

pub mod http;
#[cfg(test)]
mod runbook;
pub mod server;
pub mod settings;
pub mod telemetry;

pub use server::{Running, start, start_with};
pub use settings::{Config, ConfigError, SETTINGS};
pub use sheaf_engine::{Migrate, Stores};
