//! The ways events and jobs come in: [`publish`] (HTTP publishes and the CDC source's batches,
//! one path), [`retry`] (a manual retry), [`replay`] (many manual deliveries at once, in pages),
//! [`cdc`] (committed changes of the application's
//! Postgres become events), [`shipper`] (the outbox's events and attempts reach the log store).
//! [`body`] parses the publish body as a pure function.
//!
//! Every failure here is a [`PublishError`]; only `http` turns it into a status code.

pub mod body;
pub mod cdc;
pub mod publish;
pub mod replay;
pub mod retry;
pub mod shipper;

pub use publish::{NewEvent, PublishError, Published, publish, publish_events};
