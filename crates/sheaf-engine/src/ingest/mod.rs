//! The ways events and jobs come in: [`publish`] (HTTP publishes and the CDC source's batches,
//! one path), [`retry`] (a manual retry), [`replay`] (many manual deliveries at once, in pages),
//! [`cdc`] (committed changes of the application's
//! Postgres become events), [`shipper`] (the outbox's events and attempts reach the log store).
//! [`body`] parses the publish body as a pure function.
//!
//! Every failure here is a [`PublishError`]; only `http` turns it into a status code.

pub(crate) mod body;
#[cfg(feature = "cdc")]
pub(crate) mod cdc;
pub(crate) mod order;
pub(crate) mod publish;
pub(crate) mod replay;
pub(crate) mod retry;
pub(crate) mod shipper;

pub use publish::{PublishError, Published, ValidPublish, publish};
