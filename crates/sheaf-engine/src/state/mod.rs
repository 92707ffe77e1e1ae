//! What one `sheaf` process shares between its API, its ingest paths and its delivery engine,
//! built once at start ([`Core`]).
//!
//! - [`stores`]: connecting the stores the configuration names (see `crate::backends`), and their readiness.
//! - [`admission`]: the pending-work bound: publishes refused at the door, never accepted work
//!   dropped.
//! - [`intake`]: the group commit of publishes into the outbox (with the Postgres queue).
//! - [`handoff`]: the workers' channel of claimed jobs, which the group commit fills directly
//!   with jobs it leased in the accept.
//! - [`log_access`]: every path to the log store, coalesced: the write coalescer, the event
//!   reads and the retries' latest-attempt lookups.
//! - [`entities`]: tenants and destinations, cached per tenant.
//! - [`recent`]: the fresh-event and accepted-ids caches, oldest out first.
//! - [`secrets`]: destination credentials sealed at rest, at the entity store's boundary;
//!   [`reseal`]: the pass that re-seals them under a new `SHEAF_SECRETS_KEY`;
//!   [`url_password`]: the password in a destination's `config.url`, found, sealed, redacted.
//! - [`turns`]: the completer's reports of finished turns, for destination health and
//!   operator events.
//! - [`jobs`]: how delivery job ids are derived, and how a manual retry's job is told apart.
//! - [`metrics`]: the counters and the Prometheus page.
//! - [`pacer`]: when a delivery to a destination may start (its rate limit's share, pauses).
//! - [`replays`]: the bulk replays this process ran, for reading their progress back.
//! - [`backoff`]: the one rule for waiting between tries of a failed call.
//! - [`trace`]: W3C trace context in and out, and the publishes' contexts kept for their
//!   deliveries (with `SHEAF_OTLP_ENDPOINT`).

pub(crate) mod admission;
pub(crate) mod backoff;
pub(crate) mod entities;
pub(crate) mod handoff;
pub(crate) mod intake;
pub(crate) mod jobs;
pub(crate) mod log_access;
pub(crate) mod metrics;
pub(crate) mod pacer;
pub(crate) mod recent;
pub(crate) mod replays;
pub(crate) mod reseal;
pub(crate) mod secrets;
mod shared;
pub(crate) mod stores;
pub(crate) mod trace;
pub(crate) mod turns;
pub(crate) mod url_password;

pub use shared::Core;
