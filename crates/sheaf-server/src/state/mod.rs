//! What one `sheaf` process shares between its API, its ingest paths and its delivery engine,
//! built once at start ([`Core`]).
//!
//! - [`stores`]: which backends run (memory by default; Postgres, ClickHouse by configuration).
//! - [`admission`]: the pending-work bound: publishes refused at the door, never accepted work
//!   dropped.
//! - [`intake`]: the group commit of publishes into the outbox (with the Postgres queue).
//! - [`handoff`]: the workers' channel of claimed jobs, which the group commit fills directly
//!   with jobs it leased in the accept.
//! - [`log_access`]: every path to the log store, coalesced: the write coalescer, the event
//!   reads and the retries' latest-attempt lookups.
//! - [`entities`]: tenants and destinations, cached per tenant.
//! - [`secrets`]: destination credentials sealed at rest, at the entity store's boundary;
//!   [`reseal`]: the pass that re-seals them under a new `SHEAF_SECRETS_KEY`;
//!   [`url_password`]: the password in a destination's `config.url`, found, sealed, redacted.
//! - [`health`]: the completer's reports of finished turns, for destination health and
//!   operator events.
//! - [`jobs`]: how delivery job ids are derived, and how a manual retry's job is told apart.
//! - [`metrics`]: the counters and the Prometheus page.
//! - [`pacer`]: when a delivery to a destination may start (its rate limit's share, pauses).
//! - [`replays`]: the bulk replays this process ran, for reading their progress back.
//! - [`backoff`]: the one rule for waiting between tries of a failed call.
//! - [`trace`]: W3C trace context in and out, and the publishes' contexts kept for their
//!   deliveries (with `SHEAF_OTLP_ENDPOINT`).

pub mod admission;
pub mod backoff;
pub mod entities;
pub mod handoff;
pub mod health;
pub mod intake;
pub mod jobs;
pub mod log_access;
pub mod metrics;
pub mod pacer;
pub mod replays;
pub mod reseal;
pub mod secrets;
mod shared;
pub mod stores;
pub mod trace;
pub mod url_password;

pub use shared::Core;
pub use stores::{Migrate, Stores};
